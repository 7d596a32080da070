//! `lizard up` and `lizard services …`: deploy the directory as a persistent service, and
//! list, inspect, read the logs of, roll back and take down services.
//!
//! `lizard up` reads `lizard.toml` (writing it on the first run from the flags, or from
//! questions when stdin is a terminal and flags are missing), uploads the directory by
//! content hash exactly as `lizard push` does (honouring `.gitignore` and
//! `.lizardignore`), creates the service or deploys a new version of it, follows the
//! build's steps, then waits until the version is live (its URL printed) or failed (the
//! reason and the app's last output printed, exit status 1).

use crate::client::{empty, json_body, ApiClient, Call};
use crate::follow::follow;
use crate::output::{print_fields, print_json, Table};
use crate::push::upload_missing;
use crate::workspace_args::WorkspaceArgs;
use anyhow::{anyhow, bail, Context as _, Result};
use clap::{Args, Subcommand};
use http_body_util::BodyExt;
use lizard_api::routes;
use lizard_api::services::{
    CreateServiceRequest, DeployServiceRequest, HealthSpec, IdlePolicy, RollbackRequest, ScaleSpec, ServiceError,
    ServiceInfo, ServiceLogLine, ServiceSpec, VersionStatus,
};
use lizard_api::templates::ContextEntry;
use lizard_api::{ApiError, ErrorCode};
use lizard_recipe::{Context, ContextLimits};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The file `lizard up` reads and writes in the app directory.
pub const CONFIG_FILE: &str = "lizard.toml";

/// How long `lizard up` waits for a version to go live once built.
const LIVE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// `lizard up`.
#[derive(Args, Debug, Default)]
pub struct UpArgs {
    /// The app directory [default: .]
    pub dir: Option<PathBuf>,
    /// The service's name (its URL's first label)
    #[arg(long)]
    pub name: Option<String>,
    /// The template the app runs on [default: base]
    #[arg(long)]
    pub template: Option<String>,
    /// Run once per deploy, inside the build VM (e.g. "npm ci")
    #[arg(long)]
    pub build: Option<String>,
    /// The app's command (e.g. "node server.js")
    #[arg(long)]
    pub cmd: Option<String>,
    /// The port the app listens on
    #[arg(long)]
    pub port: Option<u16>,
    /// The health check's path [default: /]
    #[arg(long)]
    pub health_path: Option<String>,
    /// Instances kept running when idle [default: 0]
    #[arg(long)]
    pub min: Option<u32>,
    /// Instances [default: 1]
    #[arg(long)]
    pub max: Option<u32>,
    /// What idle instances become: pause or keep [default: pause]
    #[arg(long)]
    pub idle: Option<String>,
    /// No request for this long makes an instance idle (e.g. 5m) [default: 5m]
    #[arg(long)]
    pub idle_after: Option<String>,
    /// Return once the deploy started, without following it
    #[arg(long)]
    pub detach: bool,
    /// Show every line of the build's output
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// The project (id, slug or name) [default: lizard.toml's, else $LIZARD_PROJECT]
    #[arg(long)]
    pub project: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum ServicesCmd {
    /// The services the key reaches.
    List {
        #[arg(long)]
        project: Option<String>,
    },
    /// A service: URL, status, versions, instances.
    Status { name: String },
    /// The instances' output (cmd's stdout and stderr).
    Logs {
        name: String,
        /// Keep following new output
        #[arg(long, short = 'f')]
        follow: bool,
        /// Bytes of each instance's log to start with
        #[arg(long)]
        tail: Option<u64>,
    },
    /// Go back to an earlier version (default: the one live before).
    Rollback {
        name: String,
        #[arg(long)]
        version: Option<u32>,
    },
    /// Stop every instance, delete every version's layer, free the name.
    Down { name: String },
}

// --- lizard.toml ---------------------------------------------------------------------------

/// `lizard.toml`, as written (durations as text: "5s", "5m").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub service: ServiceSection,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleSection>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSection {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default = "base")]
    pub template: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    pub cmd: String,
    pub port: u16,
}

fn base() -> String {
    "base".into()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_after: Option<String>,
}

fn millis(field: &str, text: &Option<String>, default: u64) -> Result<u64> {
    match text {
        None => Ok(default),
        Some(t) => {
            let d = humantime::parse_duration(t.trim())
                .map_err(|e| anyhow!("{field}: {t:?} is not a duration like \"5s\" or \"5m\": {e}"))?;
            u64::try_from(d.as_millis()).map_err(|_| anyhow!("{field}: {t:?} is too long"))
        }
    }
}

impl ConfigFile {
    /// The API's spec, every field checked.
    pub fn spec(&self) -> Result<ServiceSpec> {
        let s = &self.service;
        let h = self.health.clone().unwrap_or_default();
        let d = HealthSpec::default();
        let sc = self.scale.clone().unwrap_or_default();
        let ds = ScaleSpec::default();
        let idle = match sc.idle.as_deref() {
            None | Some("pause") => IdlePolicy::Pause,
            Some("keep") | Some("none") => IdlePolicy::Keep,
            Some(other) => bail!("scale.idle: {other:?} is not \"pause\" or \"keep\""),
        };
        let spec = ServiceSpec {
            template: s.template.clone(),
            build: s.build.clone(),
            cmd: s.cmd.clone(),
            port: s.port,
            env: self.env.clone(),
            health: HealthSpec {
                path: h.path.unwrap_or(d.path),
                interval_ms: millis("health.interval", &h.interval, d.interval_ms)?,
                timeout_ms: millis("health.timeout", &h.timeout, d.timeout_ms)?,
                grace_ms: millis("health.grace", &h.grace, d.grace_ms)?,
            },
            scale: ScaleSpec {
                min: sc.min.unwrap_or(ds.min),
                max: sc.max.unwrap_or(ds.max),
                idle,
                idle_after_ms: millis("scale.idle_after", &sc.idle_after, ds.idle_after_ms)?,
            },
        };
        spec.validate().map_err(|e| anyhow!("{CONFIG_FILE}: {e}"))?;
        if !lizard_api::services::is_service_name(&s.name) {
            bail!(
                "{CONFIG_FILE}: service.name: {:?} is not a service name ([a-z0-9-], starting with a letter)",
                s.name
            );
        }
        Ok(spec)
    }

    /// The flags given override the file's fields.
    fn apply(&mut self, a: &UpArgs) {
        let s = &mut self.service;
        if let Some(v) = &a.name {
            s.name = v.clone();
        }
        if let Some(v) = &a.template {
            s.template = v.clone();
        }
        if let Some(v) = &a.build {
            s.build = Some(v.clone());
        }
        if let Some(v) = &a.cmd {
            s.cmd = v.clone();
        }
        if let Some(v) = a.port {
            s.port = v;
        }
        if let Some(v) = &a.project {
            s.project = Some(v.clone());
        }
        if let Some(v) = &a.health_path {
            self.health.get_or_insert_with(Default::default).path = Some(v.clone());
        }
        if a.min.is_some() || a.max.is_some() || a.idle.is_some() || a.idle_after.is_some() {
            let sc = self.scale.get_or_insert_with(Default::default);
            sc.min = a.min.or(sc.min);
            sc.max = a.max.or(sc.max);
            sc.idle = a.idle.clone().or(sc.idle.take());
            sc.idle_after = a.idle_after.clone().or(sc.idle_after.take());
        }
    }
}

/// Ask for what the flags left out (stdin a terminal), else say which flag is missing.
fn complete(config: &mut ConfigFile, dir: &Path) -> Result<()> {
    let interactive = std::io::stdin().is_terminal();
    let ask = |question: &str, default: Option<String>| -> Result<String> {
        if !interactive {
            return default
                .ok_or_else(|| anyhow!("no {question}: pass it as a flag (no {CONFIG_FILE} in {})", dir.display()));
        }
        match &default {
            Some(d) => eprint!("{question} [{d}]: "),
            None => eprint!("{question}: "),
        }
        std::io::stderr().flush()?;
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        let line = line.trim().to_owned();
        match (line.is_empty(), default) {
            (true, Some(d)) => Ok(d),
            (true, None) => bail!("{question} is required"),
            (false, _) => Ok(line),
        }
    };
    let s = &mut config.service;
    if s.name.is_empty() {
        let guess = dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()))
            .filter(|n| lizard_api::services::is_service_name(n));
        s.name = ask("--name (the service's name)", guess)?;
    }
    if s.cmd.is_empty() {
        s.cmd = ask("--cmd (the command that starts the app, e.g. \"node server.js\")", None)?;
    }
    if s.port == 0 {
        let port = ask("--port (the port the app listens on)", None)?;
        s.port = port.parse().map_err(|_| anyhow!("--port: {port:?} is not a port"))?;
    }
    if s.template.is_empty() {
        s.template = base();
    }
    Ok(())
}

/// Read `lizard.toml` with the flags applied, or make it from the flags (and questions);
/// whether it was new.
fn load_config(dir: &Path, args: &UpArgs) -> Result<(ConfigFile, bool)> {
    let path = dir.join(CONFIG_FILE);
    let (mut config, new) = match std::fs::read_to_string(&path) {
        Ok(text) => (toml::from_str(&text).with_context(|| format!("{}", path.display()))?, false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (ConfigFile::default(), true),
        Err(e) => return Err(anyhow!("read {}: {e}", path.display())),
    };
    config.apply(args);
    if new {
        complete(&mut config, dir)?;
    }
    config.spec()?;
    Ok((config, new))
}

// --- lizard up -----------------------------------------------------------------------------

fn api_error(e: &anyhow::Error) -> Option<&ApiError> {
    e.downcast_ref::<ApiError>()
}

/// `lizard up`: the exit status (1 when the version failed).
pub async fn up(api: &ApiClient, args: UpArgs, json: bool) -> Result<i32> {
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let (config, new) = load_config(&dir, &args)?;
    let spec = config.spec()?;
    let name = config.service.name.clone();
    let project = config
        .service
        .project
        .clone()
        .or_else(|| std::env::var(crate::sandbox::PROJECT_ENV).ok().filter(|p| !p.trim().is_empty()));
    let context =
        Context::scan_app(&dir, ContextLimits::default()).with_context(|| format!("scan {}", dir.display()))?;
    eprintln!(
        "deploying {name} from {} ({} entries, {})",
        dir.display(),
        context.entries.len(),
        indicatif::HumanBytes(context.size())
    );
    let ws = WorkspaceArgs { workspace: None, project: project.clone() };
    upload_missing(api, &ws, &dir, &context).await?;
    let files: Vec<ContextEntry> = context.entries.iter().map(ContextEntry::from).collect();
    let existing = if new {
        None
    } else {
        match api.json::<ServiceInfo>(&Call::new(&routes::GET_SERVICE, &[&name]), empty()).await {
            Ok(s) => Some(s),
            Err(e) if api_error(&e).is_some_and(|a| a.code == ErrorCode::NotFound) => None,
            Err(e) => return Err(e),
        }
    };
    let info: ServiceInfo = match existing {
        Some(_) => {
            let req = DeployServiceRequest { spec, files };
            api.json(&Call::new(&routes::DEPLOY_SERVICE, &[&name]), json_body(&req)).await?
        }
        None => {
            let req = CreateServiceRequest { name: name.clone(), project, project_id: None, spec, files };
            api.json(&Call::new(&routes::CREATE_SERVICE, &[]), json_body(&req)).await?
        }
    };
    if new {
        let text = toml::to_string(&config)?;
        std::fs::write(dir.join(CONFIG_FILE), text).with_context(|| format!("write {CONFIG_FILE}"))?;
        eprintln!("wrote {}", dir.join(CONFIG_FILE).display());
    }
    let version = info.latest().map(|v| v.version).ok_or_else(|| anyhow!("the server answered no version"))?;
    if args.detach {
        return finish(&info, json).map(|_| 0);
    }
    if let Some(build) = info.version(version).and_then(|v| v.build_id.clone()) {
        let template = format!("svc-{name}-v{version}");
        // The build's steps as they run; its failure shows below as the version's.
        let _ = follow(api, &ws, &template, &build, args.verbose, false, false).await;
    }
    let info = wait_settled(api, &name, version).await?;
    let status = info.version(version).map(|v| v.status);
    finish(&info, json)?;
    match status {
        Some(VersionStatus::Live) => Ok(0),
        _ => Ok(1),
    }
}

/// Poll the service until `version` is live or failed.
async fn wait_settled(api: &ApiClient, name: &str, version: u32) -> Result<ServiceInfo> {
    let begun = Instant::now();
    let mut shown = None;
    loop {
        let info: ServiceInfo = api.json(&Call::new(&routes::GET_SERVICE, &[name]), empty()).await?;
        let status = info.version(version).map(|v| v.status);
        if status != shown {
            if let Some(s) = status {
                eprintln!("version {version}: {}", version_status(s));
            }
            shown = status;
        }
        match status {
            Some(VersionStatus::Building | VersionStatus::Starting) if begun.elapsed() < LIVE_TIMEOUT => {
                tokio::time::sleep(Duration::from_millis(500)).await
            }
            Some(VersionStatus::Building | VersionStatus::Starting) => {
                bail!("version {version} of {name} is still deploying after {} s", LIVE_TIMEOUT.as_secs())
            }
            _ => return Ok(info),
        }
    }
}

fn version_status(s: VersionStatus) -> &'static str {
    match s {
        VersionStatus::Building => "building",
        VersionStatus::Starting => "starting",
        VersionStatus::Live => "live",
        VersionStatus::Failed => "failed",
        VersionStatus::Retired => "retired",
    }
}

fn print_error(e: &ServiceError) {
    eprintln!("{}: {}", e.code, e.message);
    if let Some(tail) = &e.log_tail {
        eprintln!("--- the app's last output ---\n{}", tail.trim_end());
    }
}

/// Print the outcome: the URL when live, the reason when failed.
fn finish(info: &ServiceInfo, json: bool) -> Result<()> {
    if json {
        return print_json(info);
    }
    match info.latest() {
        Some(v) if v.status == VersionStatus::Failed => {
            eprintln!("version {} of {} failed", v.version, info.name);
            if let Some(e) = &v.error {
                print_error(e);
            }
            if let Some(live) = info.live_version {
                eprintln!("version {live} is still serving at {}", info.url);
            }
        }
        _ => println!("{}", info.url),
    }
    Ok(())
}

// --- lizard services ------------------------------------------------------------------------

pub async fn run(api: &ApiClient, cmd: ServicesCmd, json: bool) -> Result<i32> {
    match cmd {
        ServicesCmd::List { project } => {
            let call = Call::new(&routes::LIST_SERVICES, &[]).param_opt("project", project);
            let list: Vec<ServiceInfo> = api.json(&call, empty()).await?;
            if json {
                print_json(&list)?;
            } else {
                let mut t = Table::new(&["NAME", "STATUS", "LIVE", "INSTANCES", "URL"]);
                for s in &list {
                    t.row(vec![
                        s.name.clone(),
                        serde_json::to_value(s.status)?.as_str().unwrap_or_default().to_owned(),
                        s.live_version.map(|v| format!("v{v}")).unwrap_or_default(),
                        s.instances.len().to_string(),
                        s.url.clone(),
                    ]);
                }
                t.print();
            }
        }
        ServicesCmd::Status { name } => {
            let s: ServiceInfo = api.json(&Call::new(&routes::GET_SERVICE, &[&name]), empty()).await?;
            if json {
                print_json(&s)?;
            } else {
                print_status(&s)?;
            }
        }
        ServicesCmd::Logs { name, follow, tail } => {
            let call = Call::new(&routes::SERVICE_LOGS, &[&name])
                .param_opt("tail", tail)
                .param_opt("follow", follow.then_some(true));
            let resp = api.send(&call, empty()).await?;
            let mut body = resp.into_body();
            let mut partial = Vec::new();
            while let Some(frame) = body.frame().await {
                let Ok(data) = frame?.into_data() else { continue };
                partial.extend_from_slice(&data);
                while let Some(end) = partial.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = partial.drain(..=end).collect();
                    if json {
                        print!("{}", String::from_utf8_lossy(&line));
                        continue;
                    }
                    let l: ServiceLogLine = serde_json::from_slice(&line)?;
                    for text in l.data.lines() {
                        println!("[{} v{}] {text}", l.sandbox_id, l.version);
                    }
                }
            }
        }
        ServicesCmd::Rollback { name, version } => {
            let call = Call::new(&routes::ROLLBACK_SERVICE, &[&name]);
            let s: ServiceInfo = api.json(&call, json_body(&RollbackRequest { version })).await?;
            let target = s.versions.iter().find(|v| v.status == VersionStatus::Starting).map(|v| v.version);
            let Some(target) = target else { return finish(&s, json).map(|_| 0) };
            eprintln!("rolling {name} back to version {target}");
            let s = wait_settled(api, &name, target).await?;
            let ok = s.live_version == Some(target);
            if !ok {
                if let Some(e) = s.version(target).and_then(|v| v.error.as_ref()) {
                    print_error(e);
                }
            }
            finish(&s, json)?;
            return Ok(if ok { 0 } else { 1 });
        }
        ServicesCmd::Down { name } => {
            api.send(&Call::new(&routes::DELETE_SERVICE, &[&name]), empty()).await?;
            if !json {
                eprintln!("{name}: every instance stopped, its layers deleted");
            }
        }
    }
    Ok(0)
}

fn print_status(s: &ServiceInfo) -> Result<()> {
    let name = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    print_fields(&[
        ("name", s.name.clone()),
        ("url", s.url.clone()),
        ("status", name(&serde_json::to_value(s.status)?)),
        ("live version", s.live_version.map(|v| v.to_string()).unwrap_or_default()),
        ("project", s.project_id.clone()),
    ]);
    if let Some(e) = &s.error {
        print_error(e);
    }
    let mut t = Table::new(&["VERSION", "STATUS", "CREATED", "ERROR"]);
    for v in &s.versions {
        let error = v.error.as_ref().map(|e| format!("{}: {}", e.code, e.message)).unwrap_or_default();
        t.row(vec![format!("v{}", v.version), version_status(v.status).into(), v.created_at.clone(), error]);
    }
    t.print();
    let mut t = Table::new(&["INSTANCE", "VERSION", "STATE", "RESTARTS"]);
    for i in &s.instances {
        t.row(vec![
            i.sandbox_id.clone(),
            format!("v{}", i.version),
            name(&serde_json::to_value(i.state)?),
            i.restarts.to_string(),
        ]);
    }
    t.print();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lizard_toml_reads_durations_and_flags_win() {
        let text = r#"
[service]
name = "my-app"
cmd = "node server.js"
port = 3000
build = "npm ci"
[health]
path = "/healthz"
interval = "5s"
timeout = "2s"
grace = "10s"
[scale]
min = 0
max = 3
idle = "pause"
idle_after = "5m"
"#;
        let mut c: ConfigFile = toml::from_str(text).unwrap();
        let s = c.spec().unwrap();
        assert_eq!(
            (s.template.as_str(), s.port, s.health.interval_ms, s.scale.idle_after_ms),
            ("base", 3000, 5000, 300_000)
        );
        assert_eq!((s.scale.max, s.health.path.as_str()), (3, "/healthz"));
        c.apply(&UpArgs { port: Some(8080), max: Some(1), ..Default::default() });
        let s = c.spec().unwrap();
        assert_eq!((s.port, s.scale.max), (8080, 1));
        // Written back, it reads the same.
        let again: ConfigFile = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(again, c);
        c.health.as_mut().unwrap().interval = Some("often".into());
        assert!(c.spec().unwrap_err().to_string().contains("health.interval"));
    }

    #[test]
    fn without_a_file_the_flags_must_say_what_runs() {
        let dir = tempfile::tempdir().unwrap();
        // stdin is not a terminal under the test runner: no questions, a clear error.
        let e = load_config(dir.path(), &UpArgs { name: Some("app".into()), ..Default::default() }).unwrap_err();
        assert!(e.to_string().contains("--cmd"), "{e}");
        let e =
            load_config(dir.path(), &UpArgs { name: Some("app".into()), cmd: Some("x".into()), ..Default::default() })
                .unwrap_err();
        assert!(e.to_string().contains("--port"), "{e}");
        let args = UpArgs { name: Some("app".into()), cmd: Some("x".into()), port: Some(8000), ..Default::default() };
        let (c, new) = load_config(dir.path(), &args).unwrap();
        assert!(new);
        assert_eq!((c.service.template.as_str(), c.service.port), ("base", 8000));
    }
}
