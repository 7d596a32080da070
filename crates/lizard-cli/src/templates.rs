//! `lizard push` and `lizard template …`: templates as code, against a Lizard server.
//!
//! A push reads the directory's recipe (`lizard.template.toml`, else a `Dockerfile`, or
//! `--file`), checks it here first (the server checks it again), lists the directory with
//! content hashes, asks the server which contents it lacks, uploads only those (with a
//! progress bar), starts the build, and follows the build's event stream: the step
//! (n/total, cached or not), the elapsed time, and the step's output (a spinner with its
//! last line; every line with `--verbose`). A failed build prints its code, step and
//! output tail, and the command exits non-zero.

use crate::client::{empty, json_body, ApiClient, Body, Call};
use crate::output::{print_fields, print_json, Table};
use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use clap::{Args, Subcommand};
use futures_util::TryStreamExt;
use http_body_util::{BodyExt, StreamBody};
use indicatif::{ProgressBar, ProgressStyle};
use lizard_api::routes;
use lizard_api::templates::{
    BuildEvent, BuildFailure, BuildStatus, ContextEntry, ContextEntryKind, MissingBlobs, MissingBlobsRequest,
    OutputStream, PushTemplateRequest, RecipeFormat, TemplateBuildInfo, TemplateInfo,
};
use lizard_recipe::{Context, ContextLimits, EntryKind, Recipe};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Lines of a step's output kept to show when it fails (the server sends its own tail too).
const TAIL_LINES: usize = 10;

/// Which workspace a template command is about.
#[derive(Args, Debug, Clone, Default)]
pub struct WorkspaceArgs {
    /// Workspace id, slug or name [default: the key's only workspace]
    #[arg(long)]
    pub workspace: Option<String>,
    /// A project (id, slug or name) whose workspace to use [default: $LIZARD_PROJECT]
    #[arg(long)]
    pub project: Option<String>,
}

impl WorkspaceArgs {
    /// `--workspace`, else `--project`, else `$LIZARD_PROJECT`.
    fn resolved(&self) -> (Option<String>, Option<String>) {
        if self.workspace.is_some() {
            return (self.workspace.clone(), None);
        }
        let project = self
            .project
            .clone()
            .or_else(|| std::env::var(crate::sandbox::PROJECT_ENV).ok())
            .filter(|p| !p.trim().is_empty());
        (None, project)
    }

    fn apply(&self, call: Call) -> Call {
        let (workspace, project) = self.resolved();
        call.param_opt("workspace", workspace).param_opt("project", project)
    }
}

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

#[derive(Subcommand, Debug)]
pub enum TemplateCmd {
    /// The built-in templates and your workspaces' own.
    List {
        #[command(flatten)]
        workspace: WorkspaceArgs,
    },
    /// Show a template.
    Get {
        name: String,
        #[command(flatten)]
        workspace: WorkspaceArgs,
    },
    /// A build's status, steps and output (the template's newest build by default).
    Logs {
        name: String,
        /// The build [default: the newest]
        #[arg(long)]
        build: Option<String>,
        /// Follow the build until it ends
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        workspace: WorkspaceArgs,
    },
    /// Delete a pushed template. Refused while sandboxes use it.
    Delete {
        name: String,
        #[command(flatten)]
        workspace: WorkspaceArgs,
    },
    /// Cancel a queued or running build (the template's newest by default).
    Cancel {
        name: String,
        /// The build [default: the newest]
        #[arg(long)]
        build: Option<String>,
        #[command(flatten)]
        workspace: WorkspaceArgs,
    },
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

/// A scanned entry on the wire.
fn wire_entry(e: &lizard_recipe::Entry) -> ContextEntry {
    let (kind, sha256, size, target) = match &e.kind {
        EntryKind::File { sha256, size } => (ContextEntryKind::File, Some(sha256.clone()), Some(*size), None),
        EntryKind::Dir => (ContextEntryKind::Dir, None, None, None),
        EntryKind::Symlink { target, .. } => (ContextEntryKind::Symlink, None, None, Some(target.clone())),
    };
    ContextEntry { path: e.path.clone(), mode: e.mode, kind, sha256, size, target }
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {prefix} {wide_msg} {elapsed}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// Upload the contents the server lacks, with a progress bar over their bytes.
async fn upload_missing(api: &ApiClient, ws: &WorkspaceArgs, dir: &Path, context: &Context) -> Result<()> {
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
        files: context.entries.iter().map(wire_entry).collect(),
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
    follow(api, &args.workspace, &build.template, &build.build_id, args.verbose, json).await
}

/// Shows a build's events as they come.
struct Display {
    verbose: bool,
    json: bool,
    started: Instant,
    spinner: Option<ProgressBar>,
    tail: VecDeque<String>,
    partial: String,
}

impl Display {
    fn new(verbose: bool, json: bool) -> Display {
        Display { verbose, json, started: Instant::now(), spinner: None, tail: VecDeque::new(), partial: String::new() }
    }

    fn println(&self, line: &str) {
        match &self.spinner {
            Some(s) if !s.is_hidden() => s.println(line),
            _ => eprintln!("{line}"),
        }
    }

    fn end_step(&mut self) {
        if let Some(s) = self.spinner.take() {
            s.finish_and_clear();
        }
    }

    /// Show one event; `Some(status, error)` once the build ended.
    fn show(&mut self, event: BuildEvent) -> Option<(BuildStatus, Option<BuildFailure>)> {
        if self.json {
            if let Ok(line) = serde_json::to_string(&event) {
                println!("{line}");
            }
        }
        match event {
            BuildEvent::Step { index, total, description, cached } => {
                self.end_step();
                self.tail.clear();
                let head = format!("[{index}/{total}]");
                if cached {
                    if !self.json {
                        eprintln!("{head} {description} (cached)");
                    }
                } else {
                    if !self.json {
                        eprintln!("{head} {description}");
                    }
                    let s = ProgressBar::new_spinner().with_style(spinner_style()).with_prefix(head);
                    if self.json {
                        s.set_draw_target(indicatif::ProgressDrawTarget::hidden());
                    }
                    s.enable_steady_tick(Duration::from_millis(120));
                    self.spinner = Some(s);
                }
            }
            BuildEvent::Output { data, stream } => {
                self.partial.push_str(&data);
                while let Some(at) = self.partial.find('\n') {
                    let line: String = self.partial.drain(..=at).collect();
                    let line = line.trim_end().to_owned();
                    if self.verbose && !self.json {
                        let mark = if stream == OutputStream::Stderr { "! " } else { "  " };
                        self.println(&format!("{mark}{line}"));
                    }
                    if let Some(s) = &self.spinner {
                        s.set_message(line.clone());
                    }
                    self.tail.push_back(line);
                    if self.tail.len() > TAIL_LINES {
                        self.tail.pop_front();
                    }
                }
            }
            BuildEvent::StepDone { index, duration_ms } => {
                self.end_step();
                if !self.json {
                    eprintln!("  step {index} done in {:.1}s", Duration::from_millis(duration_ms).as_secs_f64());
                }
            }
            BuildEvent::Phase { message } => {
                self.end_step();
                if !self.json {
                    eprintln!("… {message}");
                }
            }
            BuildEvent::Done { status, error } => {
                self.end_step();
                return Some((status, error));
            }
        }
        None
    }
}

/// Follow a build's events to its end; the exit status is 0 when it is ready.
async fn follow(
    api: &ApiClient,
    ws: &WorkspaceArgs,
    name: &str,
    build_id: &str,
    verbose: bool,
    json: bool,
) -> Result<i32> {
    let call = ws.apply(Call::new(&routes::TEMPLATE_BUILD_EVENTS, &[name, build_id]));
    let mut body = api.send(&call, empty()).await?.into_body();
    let mut display = Display::new(verbose, json);
    let mut buf = Vec::new();
    let mut end = None;
    'read: while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else { continue };
        buf.extend_from_slice(&data);
        while let Some(at) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=at).collect();
            let event: BuildEvent = match serde_json::from_slice(&line) {
                Ok(e) => e,
                Err(e) => {
                    tracing::debug!("skipping an event line this CLI does not know: {e}");
                    continue;
                }
            };
            if let Some(done) = display.show(event) {
                end = Some(done);
                break 'read;
            }
        }
    }
    let elapsed = display.started.elapsed().as_secs_f64();
    let Some((status, error)) = end else {
        bail!("the event stream of build {build_id} ended before the build did; see `lizard template logs {name}`")
    };
    if json {
        return Ok(if status == BuildStatus::Ready { 0 } else { 1 });
    }
    match (status, error) {
        (BuildStatus::Ready, _) => {
            eprintln!("template {name} is ready (build {build_id}, {elapsed:.1}s)");
            println!("{name}");
            Ok(0)
        }
        (status, error) => {
            let what = format!("{status:?}").to_lowercase();
            eprintln!("build {build_id} of {name} {what} after {elapsed:.1}s");
            if let Some(f) = error {
                print_failure(&f, &display.tail);
            }
            Ok(1)
        }
    }
}

fn print_failure(f: &BuildFailure, local_tail: &VecDeque<String>) {
    match f.step {
        Some(step) => eprintln!("{}: step {step}: {}", f.code, f.message),
        None => eprintln!("{}: {}", f.code, f.message),
    }
    let tail: Vec<String> = match &f.output_tail {
        Some(t) => t.lines().map(str::to_owned).collect(),
        None => local_tail.iter().cloned().collect(),
    };
    if !tail.is_empty() {
        eprintln!("output (last lines):");
        for line in tail {
            eprintln!("  {line}");
        }
    }
}

fn template_fields(t: &TemplateInfo) -> Vec<(&'static str, String)> {
    vec![
        ("name", t.name.clone()),
        ("description", t.description.clone()),
        ("builtin", t.builtin.to_string()),
        ("workspace", t.workspace_id.clone().unwrap_or_default()),
        ("from", t.from.clone().unwrap_or_default()),
        ("ready", t.ready.to_string()),
        ("build", t.build_id.clone().unwrap_or_default()),
        ("latest build", t.latest_build_id.clone().unwrap_or_default()),
        ("start", t.start_cmd.clone().unwrap_or_default()),
        ("size", t.size_bytes.map(|b| indicatif::HumanBytes(b).to_string()).unwrap_or_default()),
        ("created", t.created_at.clone().unwrap_or_default()),
        ("updated", t.updated_at.clone().unwrap_or_default()),
    ]
}

/// The build `build`, else the template's newest.
async fn build_or_latest(api: &ApiClient, ws: &WorkspaceArgs, name: &str, build: Option<String>) -> Result<String> {
    if let Some(b) = build {
        return Ok(b);
    }
    let t: TemplateInfo = api.json(&ws.apply(Call::new(&routes::GET_TEMPLATE, &[name])), empty()).await?;
    t.latest_build_id.ok_or_else(|| anyhow!("template {name} has no builds"))
}

fn print_build(b: &TemplateBuildInfo) {
    print_fields(&[
        ("build", b.build_id.clone()),
        ("template", b.template.clone()),
        ("status", format!("{:?}", b.status).to_lowercase()),
        ("created", b.created_at.clone()),
        ("finished", b.finished_at.clone().unwrap_or_default()),
    ]);
    for s in &b.steps {
        let cached = if s.cached { " (cached)" } else { "" };
        let took = s.duration_ms.map(|ms| format!(" {:.1}s", ms as f64 / 1000.0)).unwrap_or_default();
        println!("  [{}] {:?} {}{cached}{took}", s.index, s.status, s.description);
    }
    if let Some(f) = &b.error {
        print_failure(f, &VecDeque::new());
    }
    if !b.log.is_empty() {
        println!("--- output ---");
        print!("{}", b.log);
    }
}

/// `lizard template …`: returns the exit status.
pub async fn run(api: &ApiClient, cmd: TemplateCmd, json: bool) -> Result<i32> {
    match cmd {
        TemplateCmd::List { workspace } => {
            let list: Vec<TemplateInfo> =
                api.json(&workspace.apply(Call::new(&routes::LIST_TEMPLATES, &[])), empty()).await?;
            if json {
                print_json(&list)?;
                return Ok(0);
            }
            let mut t = Table::new(&["NAME", "WORKSPACE", "READY", "FROM", "SIZE", "DESCRIPTION"]);
            for x in list {
                let owner = if x.builtin { "(built-in)".into() } else { x.workspace_id.unwrap_or_default() };
                let size = x.size_bytes.map(|b| indicatif::HumanBytes(b).to_string()).unwrap_or_else(|| "-".into());
                t.row(vec![
                    x.name,
                    owner,
                    x.ready.to_string(),
                    x.from.unwrap_or_else(|| "-".into()),
                    size,
                    x.description,
                ]);
            }
            t.print();
        }
        TemplateCmd::Get { name, workspace } => {
            let t: TemplateInfo =
                api.json(&workspace.apply(Call::new(&routes::GET_TEMPLATE, &[&name])), empty()).await?;
            if json {
                print_json(&t)?;
            } else {
                print_fields(&template_fields(&t));
            }
        }
        TemplateCmd::Logs { name, build, follow: true, workspace } => {
            let build = build_or_latest(api, &workspace, &name, build).await?;
            return follow(api, &workspace, &name, &build, true, json).await;
        }
        TemplateCmd::Logs { name, build, follow: false, workspace } => {
            let build = build_or_latest(api, &workspace, &name, build).await?;
            let call = workspace.apply(Call::new(&routes::GET_TEMPLATE_BUILD, &[&name, &build]));
            let b: TemplateBuildInfo = api.json(&call, empty()).await?;
            if json {
                print_json(&b)?;
            } else {
                print_build(&b);
            }
        }
        TemplateCmd::Delete { name, workspace } => {
            api.send(&workspace.apply(Call::new(&routes::DELETE_TEMPLATE, &[&name])), empty()).await?;
            eprintln!("deleted template {name}");
        }
        TemplateCmd::Cancel { name, build, workspace } => {
            let build = build_or_latest(api, &workspace, &name, build).await?;
            api.send(&workspace.apply(Call::new(&routes::CANCEL_TEMPLATE_BUILD, &[&name, &build])), empty()).await?;
            eprintln!("cancelling build {build} of {name}");
        }
    }
    Ok(0)
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

    #[test]
    fn events_fold_into_steps_and_a_tail() {
        let mut d = Display::new(false, false);
        d.spinner = None;
        assert!(d.show(BuildEvent::Step { index: 1, total: 1, description: "run x".into(), cached: true }).is_none());
        for chunk in ["a\nb", "\nc\n"] {
            d.show(BuildEvent::Output { stream: OutputStream::Stdout, data: chunk.into() });
        }
        assert_eq!(d.tail, ["a", "b", "c"]);
        let end = d.show(BuildEvent::Done { status: BuildStatus::Failed, error: None });
        assert_eq!(end, Some((BuildStatus::Failed, None)));
    }
}
