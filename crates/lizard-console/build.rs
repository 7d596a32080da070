//! Builds the console's static files from `web/` and embeds them: the sources are copied
//! into `OUT_DIR/web`, their npm dependencies installed there with `npm ci` from the
//! committed lockfile (again only when the lockfile changed; install scripts are not run),
//! bundled by `web/build.mjs` (esbuild), and listed in `OUT_DIR/assets.rs` as
//! `include_bytes!` entries. Nothing built is committed; building this crate needs Node.js
//! and npm (`scripts/deps.sh` installs them) and, the first time, the npm registry.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What is copied from `web/` (never `node_modules`, `dist` or the tests).
const SOURCES: [&str; 5] = ["package.json", "package-lock.json", "build.mjs", "src", "static"];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let web = manifest.join("web");
    for s in SOURCES {
        println!("cargo:rerun-if-changed=web/{s}");
    }
    let work = out.join("web");
    for s in ["src", "static"] {
        let _ = std::fs::remove_dir_all(work.join(s));
    }
    for s in SOURCES {
        copy(&web.join(s), &work.join(s));
    }
    let lock = std::fs::read(web.join("package-lock.json")).expect("web/package-lock.json");
    let stamp = work.join("node_modules/.lizard-installed-lock");
    if std::fs::read(&stamp).ok().as_deref() != Some(lock.as_slice()) {
        run(&work, "npm", &["ci", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]);
        std::fs::write(&stamp, &lock).expect("write the install stamp");
    }
    let dist = out.join("dist");
    let _ = std::fs::remove_dir_all(&dist);
    run(&work, "node", &["build.mjs", dist.to_str().expect("a UTF-8 OUT_DIR")]);
    let mut assets = String::from(
        "/// The console's files: (name, content type, bytes).\npub static ASSETS: &[(&str, &str, &[u8])] = &[\n",
    );
    let mut names: Vec<_> = std::fs::read_dir(&dist)
        .expect("the bundle")
        .map(|e| e.expect("a bundle entry").file_name().into_string().expect("a UTF-8 name"))
        .collect();
    names.sort();
    for name in names {
        let path = dist.join(&name);
        let _ = writeln!(assets, "    ({name:?}, {:?}, include_bytes!({:?})),", content_type(&name), path.display());
    }
    assets.push_str("];\n");
    std::fs::write(out.join("assets.rs"), assets).expect("write assets.rs");
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

fn copy(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("create a directory in OUT_DIR");
        for entry in std::fs::read_dir(from).expect("read web/") {
            let entry = entry.expect("a web/ entry");
            copy(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).expect("create a directory in OUT_DIR");
        }
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

fn run(dir: &Path, program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).current_dir(dir).status().unwrap_or_else(|e| {
        panic!(
            "the web console is built with Node.js and npm, and `{program}` could not be started ({e}): \
             run scripts/deps.sh (or install nodejs and npm)"
        )
    });
    assert!(status.success(), "`{program} {}` failed ({status}) building the web console", args.join(" "));
}
