//! An E2B template's instructions as a Lizard recipe, built by Lizard's own builder (its
//! layer cache included).
//!
//! - The base: `fromTemplate` names a Lizard template (E2B's names mapped as creates map
//!   them: E2B's `base` is, by default, Lizard's `code-interpreter-v1`); `fromImage` may
//!   be E2B's own base image, which is what E2B's `base` maps to, or `debian:<suite>`
//!   (`from_debian_image`): a Debian root the node makes from Debian's archive
//!   ([`DebianBase::for_push`]), given E2B's account `user` first. Any other image needs a
//!   registry this server does not pull from: refused, saying what is.
//! - The steps start as E2B's do, as `user` in `/home/user`. `RUN [cmd, user]` runs as that
//!   user alone; `COPY [src, dest, user, mode]` copies the step's uploaded files (kept in
//!   the build's context under the step's files hash) owned by `user` (the current user
//!   without one) and then sets `mode`; `ENV`, `WORKDIR` and `USER` are the recipe's own.
//! - `force` on a step (and on the whole template) rebuilds it and everything after it, as
//!   E2B's `skip_cache` does: a step whose text is new misses the cache, and so does
//!   every later one (each layer's key covers its parent's).
//! - `startCmd` with `readyCmd` (a shell command that exits 0 once ready) is the recipe's
//!   `start`.

use lizard_e2b::templates::{BuildStart, BuildStep};
use lizard_recipe::recipe::{Base, Copy, DebianBase, Ready, Recipe, SandboxSize, Start, Step};
use std::collections::BTreeMap;

/// E2B's own base image, which E2B's template `base` stands for.
const E2B_BASE_IMAGE: &str = "e2bdev/base";
/// The user and directory E2B's builds start in.
const E2B_USER: &str = "user";
const E2B_HOME: &str = "/home/user";
/// What a Debian root runs first: E2B's account, as Lizard's built-ins have it (uid 1000,
/// sudo without a password).
const CREATE_E2B_USER: &str = "useradd --create-home --uid 1000 --user-group --shell /bin/bash user \
    && printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\\n' > /etc/sudoers.d/user && chmod 0440 /etc/sudoers.d/user";

/// A recipe, and for each of its steps the E2B instruction it came from (1-based; 0 for
/// what the build starts with), for a failure's `step`.
#[derive(Debug)]
pub struct Translated {
    pub recipe: Recipe,
    pub origins: Vec<u32>,
}

/// The directory of the build's context that holds a `COPY` step's files.
pub fn files_dir(files_hash: &str) -> String {
    format!("e2b-{files_hash}")
}

/// The recipe for template `name`, sized `size`, from `start`; `base_of` maps an E2B
/// template name onto a Lizard template's. The error says what cannot be built.
pub fn recipe(
    name: &str,
    size: SandboxSize,
    start: &BuildStart,
    base_of: impl Fn(&str) -> String,
    nonce: &str,
) -> Result<Translated, String> {
    let from = match (&start.from_template, &start.from_image, &start.from_image_registry) {
        (_, _, Some(_)) => return Err(refused_image("a private registry's image")),
        (Some(t), _, _) => Base::Template(base_of(t)),
        (None, Some(image), None) if image.split(':').next() == Some(E2B_BASE_IMAGE) => Base::Template(base_of("base")),
        (None, Some(image), None) => match debian_image(image) {
            Some(debian) => Base::Debian(debian),
            None => return Err(refused_image(&format!("image {image:?}"))),
        },
        (None, None, None) => Base::Template(base_of("base")),
    };
    let mut out = Steps { steps: Vec::new(), origins: Vec::new(), user: E2B_USER.to_owned(), forced: false, nonce };
    if matches!(from, Base::Debian(_)) {
        out.push(0, Step::Run(CREATE_E2B_USER.into()));
    }
    out.push(0, Step::User(E2B_USER.into()));
    out.push(0, Step::Workdir(E2B_HOME.into()));
    if start.force == Some(true) {
        out.force(0);
    }
    for (i, step) in start.steps.iter().enumerate() {
        let origin = u32::try_from(i + 1).unwrap_or(u32::MAX);
        if step.force == Some(true) {
            out.force(origin);
        }
        out.instruction(origin, step).map_err(|e| format!("step {origin} ({}): {e}", step.kind))?;
    }
    let start_spec = match (&start.start_cmd, &start.ready_cmd) {
        (Some(cmd), ready) => Some(Start {
            cmd: cmd.clone(),
            ready: ready.clone().map_or(Ready::default(), Ready::Cmd),
            ready_timeout_s: 120,
        }),
        (None, Some(_)) => return Err("a ready command needs a start command (set_start_cmd)".into()),
        (None, None) => None,
    };
    let recipe = Recipe {
        name: name.to_owned(),
        description: String::new(),
        from,
        build: Default::default(),
        sandbox: size,
        steps: out.steps,
        env: BTreeMap::new(),
        start: start_spec,
    };
    Ok(Translated { recipe, origins: out.origins })
}

/// `debian:<suite>` (`-slim` or not; a release number or `stable`, `testing`, `unstable`
/// for the suite it names today) as the Debian root a pushed template may start from.
fn debian_image(image: &str) -> Option<DebianBase> {
    let tag = image.strip_prefix("debian:")?;
    let suite = tag.strip_suffix("-slim").unwrap_or(tag);
    let suite = match suite {
        "12" => "bookworm",
        "13" | "stable" => "trixie",
        "14" | "testing" => "forky",
        "unstable" => "sid",
        other => other,
    };
    DebianBase::for_push(suite)
}

fn refused_image(what: &str) -> String {
    format!(
        "{what} cannot be a base here: Lizard builds on its own templates (from_template(\"base\"), a built-in or \
         one of yours), on E2B's base image ({E2B_BASE_IMAGE}) and on Debian's (from_debian_image: {}), and pulls \
         from no image registry",
        DebianBase::PUSH_SUITES.join(", ")
    )
}

struct Steps<'a> {
    steps: Vec<Step>,
    origins: Vec<u32>,
    /// The user the steps run as now.
    user: String,
    /// A `force` was met: everything after it is rebuilt anyway.
    forced: bool,
    nonce: &'a str,
}

impl Steps<'_> {
    fn push(&mut self, origin: u32, step: Step) {
        self.steps.push(step);
        self.origins.push(origin);
    }

    /// Rebuild from here on: a step never cached before.
    fn force(&mut self, origin: u32) {
        if !self.forced {
            self.forced = true;
            let nonce = self.nonce;
            self.push(origin, Step::Run(format!(": rebuilt from here on ({nonce})")));
        }
    }

    /// Run `step` as `user`, then go on as the current user.
    fn as_user(&mut self, origin: u32, user: &str, step: Step) {
        let current = self.user.clone();
        if user == current {
            return self.push(origin, step);
        }
        self.push(origin, Step::User(user.to_owned()));
        self.push(origin, step);
        self.push(origin, Step::User(current));
    }

    fn instruction(&mut self, origin: u32, step: &BuildStep) -> Result<(), String> {
        let arg = |i: usize| step.args.get(i).map(String::as_str).filter(|a| !a.is_empty());
        match step.kind.as_str() {
            "RUN" => {
                let cmd = arg(0).ok_or("no command")?.to_owned();
                match arg(1) {
                    Some(user) => self.as_user(origin, user, Step::Run(cmd)),
                    None => self.push(origin, Step::Run(cmd)),
                }
            }
            "COPY" => {
                let (src, dest) = (arg(0).ok_or("no source")?, arg(1).ok_or("no destination")?);
                if src.contains(['*', '?', '[']) {
                    return Err(format!("{src:?}: a pattern as a source is not served; copy a file or a directory"));
                }
                let hash = step.files_hash.as_deref().ok_or("no filesHash")?;
                let src = src.trim_start_matches("./").trim_end_matches('/');
                let owner = arg(2).map(str::to_owned).or_else(|| Some(self.user.clone()));
                let dir = files_dir(hash);
                let copied = if src.is_empty() || src == "." { dir } else { format!("{dir}/{src}") };
                self.push(origin, Step::Copy(Copy { src: copied, dest: dest.to_owned(), owner }));
                if let Some(mode) = arg(3) {
                    if !mode.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
                        return Err(format!("mode {mode:?} is not octal"));
                    }
                    let name = src.rsplit('/').next().unwrap_or(src);
                    let target = if dest.ends_with('/') { format!("{dest}{name}") } else { dest.to_owned() };
                    let chmod = format!("chmod -R {mode} '{}'", target.replace('\'', r"'\''"));
                    self.as_user(origin, "root", Step::Run(chmod));
                }
            }
            "ENV" => {
                if !step.args.len().is_multiple_of(2) {
                    return Err("names and values come in pairs".into());
                }
                let env = step.args.chunks(2).map(|kv| (kv[0].clone(), kv[1].clone())).collect();
                self.push(origin, Step::Env(env));
            }
            "WORKDIR" => self.push(origin, Step::Workdir(arg(0).ok_or("no directory")?.to_owned())),
            "USER" => {
                let user = arg(0).ok_or("no user")?.to_owned();
                self.user.clone_from(&user);
                self.push(origin, Step::User(user));
            }
            other => return Err(format!("{other:?} is not an instruction Lizard builds")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: &str, args: &[&str]) -> BuildStep {
        BuildStep { kind: kind.into(), args: args.iter().map(|a| (*a).to_owned()).collect(), ..Default::default() }
    }

    fn base(t: &str) -> String {
        if t == "code-interpreter-v1" {
            "interpreter".into()
        } else {
            t.into()
        }
    }

    #[test]
    fn instructions_become_the_recipes_steps() {
        let start = BuildStart {
            from_template: Some("code-interpreter-v1".into()),
            steps: vec![
                step("RUN", &["apt-get update", "root"]),
                BuildStep { files_hash: Some("ab".into()), ..step("COPY", &["./app/", "/app", "", "0755"]) },
                step("ENV", &["A", "1", "B", "2"]),
                BuildStep { force: Some(true), ..step("WORKDIR", &["/app"]) },
                step("USER", &["root"]),
                step("RUN", &["make"]),
            ],
            start_cmd: Some("python -m http.server 8000".into()),
            ready_cmd: Some("test -e /tmp/ok".into()),
            ..Default::default()
        };
        let t = recipe("t", SandboxSize { vcpus: Some(2), memory_mib: None }, &start, base, "n1").unwrap();
        assert_eq!(t.recipe.from, Base::Template("interpreter".into()));
        let want = vec![
            Step::User("user".into()),
            Step::Workdir("/home/user".into()),
            Step::User("root".into()),
            Step::Run("apt-get update".into()),
            Step::User("user".into()),
            Step::Copy(Copy { src: "e2b-ab/app".into(), dest: "/app".into(), owner: Some("user".into()) }),
            Step::User("root".into()),
            Step::Run("chmod -R 0755 '/app'".into()),
            Step::User("user".into()),
            Step::Env([("A".to_string(), "1".to_string()), ("B".to_string(), "2".to_string())].into()),
            Step::Run(": rebuilt from here on (n1)".into()),
            Step::Workdir("/app".into()),
            Step::User("root".into()),
            Step::Run("make".into()),
        ];
        assert_eq!(t.recipe.steps, want);
        assert_eq!(t.origins, [0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 4, 4, 5, 6]);
        let start = t.recipe.start.unwrap();
        assert_eq!(start.ready, Ready::Cmd("test -e /tmp/ok".into()));
        assert_eq!(t.recipe.sandbox.vcpus, Some(2));
    }

    #[test]
    fn what_cannot_be_built_is_refused_by_name() {
        let with = |start: BuildStart| recipe("t", SandboxSize::default(), &start, base, "n").unwrap_err();
        let image = |i: &str| BuildStart { from_image: Some(i.into()), ..Default::default() };
        assert!(with(image("ubuntu:22.04")).contains("\"ubuntu:22.04\" cannot be a base"), "{}", with(image("ubuntu")));
        assert!(recipe("t", SandboxSize::default(), &image("e2bdev/base:latest"), base, "n").is_ok());
        assert!(with(image("debian:jessie")).contains("from_debian_image: bookworm, trixie, forky, sid"));
        let debian = recipe("t", SandboxSize::default(), &image("debian:bookworm-slim"), base, "n").unwrap().recipe;
        assert_eq!(debian.from, Base::Debian(DebianBase::for_push("bookworm").unwrap()));
        assert_eq!(debian.steps[..2], [Step::Run(CREATE_E2B_USER.into()), Step::User("user".into())]);
        let stable = recipe("t", SandboxSize::default(), &image("debian:stable"), base, "n").unwrap().recipe;
        assert_eq!(stable.from, Base::Debian(DebianBase::for_push("trixie").unwrap()));
        let registry = BuildStart { from_image_registry: Some(serde_json::json!({"type": "registry"})), ..image("x") };
        assert!(with(registry).contains("private registry"));
        let steps = |s: BuildStep| BuildStart { steps: vec![s], ..Default::default() };
        assert!(with(steps(step("HEALTHCHECK", &["x"]))).contains("step 1 (HEALTHCHECK)"));
        assert!(with(steps(step("ENV", &["A"]))).contains("pairs"));
        assert!(with(steps(step("COPY", &["*.py", "/app/"]))).contains("pattern"));
        assert!(with(steps(step("COPY", &["a", "/b"]))).contains("filesHash"));
        let ready_alone = BuildStart { ready_cmd: Some("true".into()), ..Default::default() };
        assert!(with(ready_alone).contains("start command"));
    }
}
