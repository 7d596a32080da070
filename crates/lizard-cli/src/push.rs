//! `lizard push`: read the directory's recipe (`lizard.template.toml`, else a
//! `Dockerfile`, or `--file`) and check it here first (the server checks it again), list
//! the directory with content hashes, ask the server which contents it lacks, upload only
//! those (with a progress bar), start the build, and follow it ([`crate::follow`]).

use crate::client::{json_body, ApiClient, Body, Call};
use crate::follow::follow;
use crate::output::print_json;
use crate::workspace_args::WorkspaceArgs;
use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use clap::Args;
use futures_util::TryStreamExt;
use http_body_util::{BodyExt, StreamBody};
use indicatif::{ProgressBar, ProgressStyle};
use lizard_api::routes;
use lizard_api::templates::{
    ContextEntry, MissingBlobs, MissingBlobsRequest, PushTemplateRequest, RecipeFormat, TemplateBuildInfo,
};
use lizard_recipe::{Context, ContextLimits, EntryKind, Recipe};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// `lizard push`.
#[derive(Args, Debug)]
pub struct PushArgs {
    /// The directory to push [default: .]
    pub dir: Option<PathBuf>,
    /// The template's name (overrides the recipe's; required for a Dockerfile)
    #[arg(long)]
    pub name: Option<String>,
    /// The recipe file, relative to DIR [default: lizard.template.toml, else Dockerfile]
    #[arg(long, short = 'f')]
    pub file: Option<PathBuf>,
    /// Print the build id and return without following the build
    #[arg(long)]
    pub detach: bool,
    /// Show every line of the steps' output
    #[arg(long, short = 'v')]
    pub verbose: bool,
    #[command(flatten)]
    pub workspace: WorkspaceArgs,
}

/// A directory's recipe: its text, its format and the template's name.
#[derive(Debug)]
struct LocalRecipe {
    text: String,
    format: RecipeFormat,
    name: String,
}

/// Read and check the recipe of `dir` (or `file` in it).
fn read_recipe(dir: &Path, file: Option<&Path>, name: Option<&str>) -> Result<LocalRecipe> {
    let path = match file {
        Some(f) => dir.join(f),
        None if dir.join(lizard_recipe::RECIPE_FILE).is_file() => dir.join(lizard_recipe::RECIPE_FILE),
        None if dir.join(lizard_recipe::DOCKERFILE).is_file() => dir.join(lizard_recipe::DOCKERFILE),
        None => bail!(
            "{} has neither {} nor {}; write one, or pass --file",
            dir.display(),
            lizard_recipe::RECIPE_FILE,
            lizard_recipe::DOCKERFILE
        ),
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let dockerfile = file_name == lizard_recipe::DOCKERFILE || file_name.ends_with(".Dockerfile");
    let shown = path.display();
    let recipe: Recipe = if dockerfile {
        let name = name.ok_or_else(|| anyhow!("{shown}: a template built from a Dockerfile needs --name"))?;
        lizard_recipe::dockerfile::parse(&text, name).with_context(|| format!("{shown}"))?
    } else {
        let mut recipe = Recipe::from_toml(&text).with_context(|| format!("{shown}"))?;
        if let Some(name) = name {
            recipe.name = name.to_owned();
            recipe.validate().with_context(|| format!("{shown}"))?;
        }
        recipe
    };
    let format = if dockerfile { RecipeFormat::Dockerfile } else { RecipeFormat::Toml };
    Ok(LocalRecipe { text, format, name: recipe.name })
}

/// Upload the contents the server lacks, with a progress bar over their bytes.
pub(crate) async fn upload_missing(api: &ApiClient, ws: &WorkspaceArgs, dir: &Path, context: &Context) -> Result<()> {
    let hashes: Vec<String> = context.hashes().into_iter().map(str::to_owned).collect();
    if hashes.is_empty() {
        return Ok(());
    }
    let call = ws.apply(Call::new(&routes::MISSING_TEMPLATE_BLOBS, &[]));
    let missing: MissingBlobs = api.json(&call, json_body(&MissingBlobsRequest { sha256: hashes.clone() })).await?;
    let files: Vec<(&str, &str, u64)> = missing
        .missing
        .iter()
        .filter_map(|h| {
            context.entries.iter().find_map(|e| match &e.kind {
                EntryKind::File { sha256, size } if sha256 == h => Some((sha256.as_str(), e.path.as_str(), *size)),
                _ => None,
            })
        })
        .collect();
    let total: u64 = files.iter().map(|f| f.2).sum();
    eprintln!(
        "uploading {} of {} file(s) ({}); the server has the rest",
        files.len(),
        hashes.len(),
        indicatif::HumanBytes(total)
    );
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {bytes_per_sec} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    for (sha256, path, _) in files {
        bar.set_message(path.to_owned());
        let file = tokio::fs::File::open(dir.join(path)).await.with_context(|| format!("open {path}"))?;
        let counter = bar.clone();
        let stream =
            tokio_util::io::ReaderStream::new(file).inspect_ok(move |chunk: &Bytes| counter.inc(chunk.len() as u64));
        let body: Body = StreamBody::new(stream.map_ok(hyper::body::Frame::data)).boxed();
        let call = ws.apply(Call::new(&routes::UPLOAD_TEMPLATE_BLOB, &[sha256]));
        api.send(&call, body).await.with_context(|| format!("upload {path}"))?;
    }
    bar.finish_and_clear();
    Ok(())
}

/// `lizard push`: returns the exit status (non-zero when the build failed).
pub async fn push(api: &ApiClient, args: PushArgs, json: bool) -> Result<i32> {
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let recipe = read_recipe(&dir, args.file.as_deref(), args.name.as_deref())?;
    let scanning = Instant::now();
    let context = Context::scan(&dir, ContextLimits::default()).with_context(|| format!("scan {}", dir.display()))?;
    eprintln!(
        "pushing {} from {} ({} entries, {}, listed in {:.1}s)",
        recipe.name,
        dir.display(),
        context.entries.len(),
        indicatif::HumanBytes(context.size()),
        scanning.elapsed().as_secs_f64()
    );
    upload_missing(api, &args.workspace, &dir, &context).await?;
    let (workspace, project) = args.workspace.resolved();
    let req = PushTemplateRequest {
        recipe: recipe.text,
        format: recipe.format,
        name: args.name.clone(),
        files: context.entries.iter().map(ContextEntry::from).collect(),
        workspace,
        project,
    };
    let build: TemplateBuildInfo = api.json(&Call::new(&routes::PUSH_TEMPLATE, &[]), json_body(&req)).await?;
    if args.detach {
        if json {
            print_json(&build)?;
        } else {
            println!("{}", build.build_id);
        }
        return Ok(0);
    }
    eprintln!("build {} of {} started", build.build_id, build.template);
    follow(api, &args.workspace, &build.template, &build.build_id, args.verbose, json, true).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_recipe_is_read_and_checked_here_first() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_recipe(dir.path(), None, None).unwrap_err().to_string().contains("neither"));
        std::fs::write(dir.path().join("Dockerfile"), "FROM base\nRUN true\n").unwrap();
        assert!(read_recipe(dir.path(), None, None).unwrap_err().to_string().contains("--name"));
        let r = read_recipe(dir.path(), None, Some("from-docker")).unwrap();
        assert_eq!((r.name.as_str(), r.format), ("from-docker", RecipeFormat::Dockerfile));
        std::fs::write(dir.path().join(lizard_recipe::RECIPE_FILE), "name = \"t\"\nfrom = \"base\"\n").unwrap();
        let r = read_recipe(dir.path(), None, None).unwrap();
        assert_eq!((r.name.as_str(), r.format), ("t", RecipeFormat::Toml));
        assert!(read_recipe(dir.path(), None, Some("Bad_Name")).is_err());
        let r = read_recipe(dir.path(), Some(Path::new("Dockerfile")), Some("d")).unwrap();
        assert_eq!(r.format, RecipeFormat::Dockerfile);
    }
}
