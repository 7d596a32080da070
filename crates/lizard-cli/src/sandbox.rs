//! `lizard sandbox …`: the same commands against the local node or a Lizard server.
//!
//! The routes are the same on both (`/v1/sandboxes…`); what differs is creation (a server
//! needs a project and keeps a timeout) and `set-timeout` (server only).

use crate::client::{self, empty, json_body, ApiClient, Call};
use crate::output::{self, print_json, Table};
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use lizard_api::routes;
use lizard_api::{CreateSandboxRequest, ExecRequest, FileEntry, WriteResult};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum SandboxCmd {
    /// Boot a new sandbox from a template and print its id.
    Create(CreateArgs),
    /// List running sandboxes.
    List,
    /// Show one sandbox.
    Get { id: String },
    /// Run a command; prints its output and exits with its exit code (124: timed out, 125: Lizard error).
    Exec(ExecArgs),
    /// An interactive terminal in the sandbox (exits with the shell's exit code; 125: Lizard error).
    Shell(crate::shell::ShellArgs),
    /// Wait until something listens on TCP PORT in the sandbox (exit 1 with TIMED_OUT if
    /// nothing did in time).
    WaitPort {
        id: String,
        port: u16,
        /// How long to wait, in milliseconds (at most 600000).
        #[arg(long, default_value_t = lizard_api::processes::DEFAULT_PORT_WAIT_MS)]
        timeout_ms: u64,
    },
    /// Stop a sandbox and delete everything in it.
    Kill { id: String },
    /// Pause a sandbox: its processes, memory and files wait on disk, its VM uses no CPU (and,
    /// once the server's --keep-paused-vm has passed, no memory).
    Pause { id: String },
    /// Resume a paused sandbox where it stopped.
    Resume { id: String },
    /// Make COUNT copies of a running sandbox, processes included; prints their ids.
    Fork {
        id: String,
        /// How many copies.
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// Change when the server kills a sandbox: MS milliseconds from now (server mode).
    SetTimeout {
        id: String,
        /// New lifetime in milliseconds, counted from now.
        ms: u64,
    },
    /// Files inside a sandbox.
    #[command(subcommand)]
    Fs(FsCmd),
}

#[derive(Args, Debug, Clone, Default)]
pub struct CreateArgs {
    pub template: String,
    #[arg(long)]
    pub vcpus: Option<u32>,
    #[arg(long)]
    pub memory_mib: Option<u32>,
    /// KEY=VALUE environment for every process in the sandbox (repeatable).
    #[arg(long = "env", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// KEY=VALUE metadata (repeatable).
    #[arg(long = "metadata", value_parser = parse_kv)]
    pub metadata: Vec<(String, String)>,
    /// Server mode: the project to run (and bill) the sandbox in, by id, slug or name
    /// [default: $LIZARD_PROJECT]
    #[arg(long)]
    pub project: Option<String>,
    /// Server mode: milliseconds until the server kills the sandbox [default: the server's, 5 minutes]
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Server mode: what the timeout does: kill (default) or pause
    #[arg(long, value_name = "kill|pause")]
    pub on_timeout: Option<String>,
    /// Server mode: an API key placed in the sandbox as LIZARD_API_KEY, so the CLI inside
    /// acts as that key (give it a scoped key: whatever runs in the sandbox can read it)
    #[arg(long, value_name = "KEY")]
    pub lizard_token: Option<String>,
    /// No outbound internet access: only `--allow-out` destinations are reachable
    #[arg(long)]
    pub no_internet: bool,
    /// CIDR reachable even with --no-internet (repeatable; never private or host ranges)
    #[arg(long, value_name = "CIDR")]
    pub allow_out: Vec<String>,
    /// CIDR never reachable (repeatable; wins over --allow-out)
    #[arg(long, value_name = "CIDR")]
    pub deny_out: Vec<String>,
    /// Server mode: a volume of the project (name or id) to mount at /workspace; the
    /// sandbox runs where the volume lives
    #[arg(long, value_name = "NAME")]
    pub volume: Option<String>,
}

/// The env var `sandbox create` falls back to for `--project`.
pub const PROJECT_ENV: &str = "LIZARD_PROJECT";

/// `POST /v1/sandboxes` on a Lizard server: `{template, project, timeoutMs, env,
/// metadata, …}`. `env_project` is `$LIZARD_PROJECT`; `--project` wins over it.
pub fn server_create_body(a: &CreateArgs, env_project: Option<&str>) -> Result<Value> {
    let project = a.project.as_deref().or(env_project).map(str::trim).filter(|p| !p.is_empty()).ok_or_else(|| {
        anyhow!("a project is required in server mode: pass --project <idOrSlugOrName> or set {PROJECT_ENV}")
    })?;
    let mut body = json!({ "template": a.template, "project": project });
    if let Some(t) = a.timeout_ms {
        body["timeoutMs"] = t.into();
    }
    if !a.env.is_empty() {
        body["env"] = json!(a.env.iter().cloned().collect::<BTreeMap<_, _>>());
    }
    if !a.metadata.is_empty() {
        body["metadata"] = json!(a.metadata.iter().cloned().collect::<BTreeMap<_, _>>());
    }
    if let Some(v) = a.vcpus {
        body["vcpus"] = v.into();
    }
    if let Some(m) = a.memory_mib {
        body["memoryMib"] = m.into();
    }
    if let Some(t) = &a.lizard_token {
        body["lizardToken"] = t.clone().into();
    }
    if let Some(v) = &a.volume {
        body["volumeName"] = v.clone().into();
    }
    if let Some(o) = &a.on_timeout {
        body["onTimeout"] = o.clone().into();
    }
    if a.no_internet {
        body["allowInternetAccess"] = false.into();
    }
    if !a.allow_out.is_empty() {
        body["allowOut"] = json!(a.allow_out);
    }
    if !a.deny_out.is_empty() {
        body["denyOut"] = json!(a.deny_out);
    }
    Ok(body)
}

/// `POST /v1/sandboxes` on the local node, which has no projects, timeouts or tokens.
pub fn local_create_request(a: &CreateArgs) -> Result<CreateSandboxRequest> {
    for (given, flag) in [
        (a.project.is_some(), "--project"),
        (a.timeout_ms.is_some(), "--timeout-ms"),
        (a.lizard_token.is_some(), "--lizard-token"),
        (a.volume.is_some(), "--volume"),
        (a.on_timeout.is_some(), "--on-timeout"),
    ] {
        if given {
            bail!("{flag} applies to server mode only (set LIZARD_API_URL); local sandboxes live until killed or until the node stops");
        }
    }
    Ok(CreateSandboxRequest {
        template: a.template.clone(),
        vcpus: a.vcpus,
        memory_mib: a.memory_mib,
        env: a.env.iter().cloned().collect(),
        metadata: a.metadata.iter().cloned().collect(),
        allow_internet_access: a.no_internet.then_some(false),
        allow_out: a.allow_out.clone(),
        deny_out: a.deny_out.clone(),
        volume: None,
        snapshot: None,
    })
}

/// Refuse server-only requests in local mode before the local node is started for them.
pub fn check_local(cmd: &SandboxCmd) -> Result<()> {
    match cmd {
        SandboxCmd::Create(a) => local_create_request(a).map(|_| ()),
        SandboxCmd::SetTimeout { .. } => bail!(
            "set-timeout applies to server mode only (set LIZARD_API_URL); local sandboxes have no \
             timeout: they live until killed or until the node stops"
        ),
        _ => Ok(()),
    }
}

#[derive(Args, Debug)]
pub struct ExecArgs {
    id: String,
    /// Working directory in the guest.
    #[arg(long)]
    cwd: Option<String>,
    /// KEY=VALUE (repeatable).
    #[arg(long = "env", value_parser = parse_kv)]
    env: Vec<(String, String)>,
    /// Guest user to run as.
    #[arg(long)]
    user: Option<String>,
    /// Kill the command after this many seconds (exit code 124).
    #[arg(long, value_parser = parse_seconds)]
    timeout: Option<std::time::Duration>,
    /// Pass this CLI's stdin to the command.
    #[arg(long)]
    stdin: bool,
    /// Run a shell string with /bin/sh -c instead of an argv.
    #[arg(short = 'c', long = "shell", conflicts_with = "argv")]
    shell: Option<String>,
    /// The program and its arguments.
    #[arg(last = true)]
    argv: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum FsCmd {
    /// Write a file from a local file or stdin (parents are created).
    Write {
        id: String,
        path: String,
        /// Local file to upload [default: stdin]
        #[arg(long)]
        from: Option<PathBuf>,
    },
    /// Print a file (or save it with --to).
    Read {
        id: String,
        path: String,
        #[arg(long)]
        to: Option<PathBuf>,
    },
    /// List a directory.
    Ls {
        id: String,
        #[arg(default_value = "/")]
        path: String,
    },
    /// Remove a file or a directory (recursively).
    Rm { id: String, path: String },
    /// Create a directory and its parents.
    Mkdir { id: String, path: String },
    /// What is at a path: type, size, mode, owner, mtime, a link's target.
    Stat { id: String, path: String },
    /// Move a file or directory (a file at the target is replaced).
    Mv { id: String, from: String, to: String },
    /// Print a directory's changes (one JSON event per line) until interrupted; the watch
    /// ends when the sandbox pauses.
    Watch {
        id: String,
        path: String,
        /// Watch every directory under it too.
        #[arg(long, short)]
        recursive: bool,
    },
    /// Unpack a tar archive (a local file or stdin) into a directory, many files at once:
    /// `tar -C dir -c . | lizard sandbox fs upload ID /app`.
    Upload {
        id: String,
        path: String,
        /// Local tar archive [default: stdin]
        #[arg(long)]
        from: Option<PathBuf>,
    },
    /// A directory as a tar archive, to stdout or --to: `lizard sandbox fs download ID /app | tar -x`.
    Download {
        id: String,
        path: String,
        #[arg(long)]
        to: Option<PathBuf>,
    },
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

/// Every subcommand but `exec` (see [`exec`]).
pub async fn run(api: &ApiClient, cmd: SandboxCmd, json: bool) -> Result<()> {
    match cmd {
        SandboxCmd::Create(a) => {
            let body = if api.is_server() {
                let env_project = std::env::var(PROJECT_ENV).ok();
                json_body(&server_create_body(&a, env_project.as_deref())?)
            } else {
                json_body(&local_create_request(&a)?)
            };
            let s: Value = api.json(&Call::new(&routes::CREATE_SANDBOX, &[]), body).await?;
            if json {
                print_json(&s)?;
            } else {
                println!("{}", output::text(&s, "sandboxId"));
            }
        }
        SandboxCmd::List => {
            let list: Vec<Value> = api.json(&Call::new(&routes::LIST_SANDBOXES, &[]), empty()).await?;
            if json {
                print_json(&list)?;
            } else {
                print!("{}", render_list(&list));
            }
        }
        SandboxCmd::Get { id } => {
            let s: Value = api.json(&Call::new(&routes::GET_SANDBOX, &[&id]), empty()).await?;
            if json {
                print_json(&s)?;
            } else {
                output::print_fields(&sandbox_fields(&s));
            }
        }
        SandboxCmd::Kill { id } => {
            api.send(&Call::new(&routes::KILL_SANDBOX, &[&id]), empty()).await?;
        }
        SandboxCmd::Pause { id } => transition(api, &id, &routes::PAUSE, json).await?,
        SandboxCmd::Resume { id } => transition(api, &id, &routes::RESUME, json).await?,
        SandboxCmd::Fork { id, count } => {
            let copies: Vec<Value> =
                api.json(&Call::new(&routes::FORK, &[&id]), json_body(&json!({ "count": count }))).await?;
            if json {
                print_json(&copies)?;
            } else {
                for c in &copies {
                    println!("{}", output::text(c, "sandboxId"));
                }
            }
        }
        SandboxCmd::SetTimeout { id, ms } => {
            if !api.is_server() {
                check_local(&SandboxCmd::SetTimeout { id, ms })?;
                unreachable!("check_local refuses set-timeout");
            }
            let call = Call::new(&routes::SET_TIMEOUT, &[&id]);
            let resp = api.send(&call, json_body(&json!({ "timeoutMs": ms }))).await?;
            let bytes = resp.into_body().collect().await?.to_bytes();
            let s: Option<Value> = serde_json::from_slice(&bytes).ok();
            match (json, s) {
                (true, Some(s)) => print_json(&s)?,
                (false, Some(s)) if s.get("endAt").is_some() => {
                    eprintln!("sandbox {id} now ends at {}", output::text(&s, "endAt"))
                }
                _ => {}
            }
        }
        SandboxCmd::WaitPort { id, port, timeout_ms } => {
            let call = Call::new(&routes::WAIT_FOR_PORT, &[&id, &port.to_string()]).param("timeoutMs", timeout_ms);
            api.send(&call, empty()).await?;
        }
        SandboxCmd::Exec(_) | SandboxCmd::Shell(_) => unreachable!("exec and shell are run by their own functions"),
        SandboxCmd::Fs(cmd) => fs(api, cmd, json).await?,
    }
    Ok(())
}

/// Pause or resume (`path`) and say the state the sandbox is in now.
async fn transition(api: &ApiClient, id: &str, route: &routes::Route, json: bool) -> Result<()> {
    let s: Value = api.json(&Call::new(route, &[id]), json_body(&json!({}))).await?;
    if json {
        print_json(&s)?;
    } else {
        eprintln!("sandbox {id} {}", output::text(&s, "state"));
    }
    Ok(())
}

/// The list as a table: PROJECT and ENDS columns when the server fills them.
pub fn render_list(list: &[Value]) -> String {
    let has = |f: &str| list.iter().any(|s| s.get(f).is_some_and(|v| !v.is_null()));
    let (project, ends) = (has("projectId"), has("endAt"));
    let mut headers = vec!["ID", "TEMPLATE", "STATE", "VCPUS", "MEM_MIB", "STARTED"];
    if project {
        headers.push("PROJECT");
    }
    if ends {
        headers.push("ENDS");
    }
    let mut t = Table::new(&headers);
    for s in list {
        let mut row: Vec<String> = ["sandboxId", "template", "state", "vcpus", "memoryMib", "startedAt"]
            .iter()
            .map(|f| output::text(s, f))
            .collect();
        if project {
            row.push(output::text(s, "projectId"));
        }
        if ends {
            row.push(output::text(s, "endAt"));
        }
        t.row(row);
    }
    t.render()
}

fn sandbox_fields(s: &Value) -> Vec<(&'static str, String)> {
    let mut f: Vec<(&'static str, String)> = [
        ("id", "sandboxId"),
        ("template", "template"),
        ("state", "state"),
        ("vcpus", "vcpus"),
        ("memory_mib", "memoryMib"),
        ("started", "startedAt"),
        ("ends", "endAt"),
        ("project", "projectId"),
        ("domain", "domain"),
    ]
    .iter()
    .map(|(label, field)| (*label, output::text(s, field)))
    .collect();
    if let Some(Value::Object(m)) = s.get("metadata") {
        let kv: Vec<String> = m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(&v.to_string()))).collect();
        f.push(("metadata", kv.join(" ")));
    }
    f
}

/// `--timeout SECONDS` (fractions allowed) as a duration; negative or not a number is refused.
fn parse_seconds(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    std::time::Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is not a non-negative number of seconds"))
}

/// `lizard sandbox exec`: stream the command's output; `Ok(exit code)`.
pub async fn exec(api: &ApiClient, a: ExecArgs) -> Result<i32> {
    if a.shell.is_none() && a.argv.is_empty() {
        bail!("nothing to run: pass `-- PROGRAM ARGS…` or `--shell 'COMMAND'`");
    }
    let stdin = if a.stdin {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("read stdin")?;
        Some(s)
    } else {
        None
    };
    let req = ExecRequest {
        cmd: a.shell,
        argv: (!a.argv.is_empty()).then_some(a.argv),
        cwd: a.cwd,
        env: a.env.into_iter().collect::<BTreeMap<_, _>>(),
        user: a.user,
        timeout_ms: a.timeout.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        stdin,
    };
    let resp = api.send(&Call::new(&routes::EXEC, &[&a.id]).param("stream", true), json_body(&req)).await?;
    let body = resp.into_body().into_data_stream().map(|r| r.map_err(std::io::Error::other));
    let reader = tokio_util::io::StreamReader::new(body);
    let mut frames = tokio_util::codec::FramedRead::new(reader, lizard_agent_proto::frame::FrameCodec);
    use lizard_agent_proto::frame::FrameKind;
    while let Some(frame) = frames.next().await {
        let frame = frame?;
        match frame.kind {
            FrameKind::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(&frame.data)?;
                out.flush()?;
            }
            FrameKind::Stderr => {
                let mut err = std::io::stderr().lock();
                err.write_all(&frame.data)?;
                err.flush()?;
            }
            FrameKind::Exit => {
                let st: lizard_api::ExitStatus = serde_json::from_slice(&frame.data)?;
                if st.timed_out {
                    eprintln!("lizard: command timed out and was killed");
                }
                return Ok(st.exit_code);
            }
            FrameKind::Error => {
                let e: lizard_api::ApiError = serde_json::from_slice(&frame.data)?;
                bail!(e);
            }
            other => bail!("unexpected frame {other:?} in exec output"),
        }
    }
    bail!("the exec stream ended without an exit status")
}

async fn fs(api: &ApiClient, cmd: FsCmd, json: bool) -> Result<()> {
    match cmd {
        FsCmd::Write { id, path, from } => {
            let body = local_or_stdin(from).await?;
            let call = Call::new(&routes::WRITE_FILE, &[&id]).param("path", &path);
            let r: WriteResult = api.json(&call, body).await?;
            if json {
                print_json(&r)?;
            } else {
                eprintln!("wrote {} bytes to {}", r.bytes_written, r.path);
            }
        }
        FsCmd::Read { id, path, to } => {
            save(api, Call::new(&routes::READ_FILE, &[&id]).param("path", &path), to).await?;
        }
        FsCmd::Download { id, path, to } => {
            save(api, Call::new(&routes::READ_ARCHIVE, &[&id]).param("path", &path), to).await?;
        }
        FsCmd::Upload { id, path, from } => {
            let body = local_or_stdin(from).await?;
            let call = Call::new(&routes::WRITE_ARCHIVE, &[&id]).param("path", &path);
            let r: lizard_api::ArchiveResult = api.json(&call, body).await?;
            if json {
                print_json(&r)?;
            } else {
                eprintln!("unpacked {} entries ({} bytes) into {}", r.entries, r.bytes_written, r.path);
            }
        }
        FsCmd::Stat { id, path } => {
            let info: lizard_api::FileInfo =
                api.json(&Call::new(&routes::FILE_INFO, &[&id]).param("path", &path), empty()).await?;
            print_info(&info, json)?;
        }
        FsCmd::Mv { id, from, to } => {
            let call = Call::new(&routes::RENAME_FILE, &[&id]).param("path", &from).param("to", &to);
            let info: lizard_api::FileInfo = api.json(&call, empty()).await?;
            print_info(&info, json)?;
        }
        FsCmd::Watch { id, path, recursive } => {
            let call = Call::new(&routes::WATCH_DIR, &[&id]).param("path", &path).param("recursive", recursive);
            let mut body = api.send(&call, empty()).await?.into_body();
            let mut out = std::io::stdout().lock();
            // The server's lines as they come (blank heartbeat lines left out).
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.context("the watch broke off")?.into_data() {
                    for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                        out.write_all(line)?;
                        out.write_all(b"\n")?;
                    }
                    out.flush()?;
                }
            }
            bail!("the watch of {path} ended (the sandbox paused or went away)");
        }
        FsCmd::Ls { id, path } => {
            let call = Call::new(&routes::LIST_DIR, &[&id]).param("path", &path);
            let entries: Vec<FileEntry> = api.json(&call, empty()).await?;
            if json {
                print_json(&entries)?;
            } else {
                for e in entries {
                    let kind = serde_json::to_value(e.file_type)?;
                    println!("{:<8} {:>12} {:o} {}", kind.as_str().unwrap_or(""), e.size, e.mode, e.name);
                }
            }
        }
        FsCmd::Rm { id, path } => {
            api.send(&Call::new(&routes::REMOVE_FILE, &[&id]).param("path", &path), empty()).await?;
        }
        FsCmd::Mkdir { id, path } => {
            api.send(&Call::new(&routes::MAKE_DIR, &[&id]).param("path", &path), empty()).await?;
        }
    }
    Ok(())
}

/// A local file's or stdin's bytes as a streamed request body.
async fn local_or_stdin(from: Option<PathBuf>) -> Result<client::Body> {
    Ok(match from {
        Some(p) => stream_body(tokio::fs::File::open(&p).await.with_context(|| format!("open {}", p.display()))?),
        None => stream_body(tokio::io::stdin()),
    })
}

/// Write a streamed answer's body to `to` (a local file) or stdout.
async fn save(api: &ApiClient, call: Call, to: Option<PathBuf>) -> Result<()> {
    let mut body = api.send(&call, empty()).await?.into_body();
    let mut out: Box<dyn Write> = match to {
        Some(p) => Box::new(std::fs::File::create(&p).with_context(|| format!("create {}", p.display()))?),
        None => Box::new(std::io::stdout().lock()),
    };
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            out.write_all(&data)?;
        }
    }
    Ok(out.flush()?)
}

fn print_info(info: &lizard_api::FileInfo, json: bool) -> Result<()> {
    if json {
        return print_json(info);
    }
    let kind = serde_json::to_value(info.file_type)?;
    let link = info.symlink_target.as_deref().map(|t| format!(" -> {t}")).unwrap_or_default();
    println!(
        "{:<8} {:>12} {:o} {}:{} {}{link}",
        kind.as_str().unwrap_or(""),
        info.size,
        info.mode,
        info.owner,
        info.group,
        info.path
    );
    Ok(())
}

/// Stream a reader as a request body without holding it in memory.
fn stream_body<R: tokio::io::AsyncRead + Send + Sync + 'static>(r: R) -> client::Body {
    let stream = tokio_util::io::ReaderStream::with_capacity(r, 256 * 1024).map(|r| r.map(hyper::body::Frame::data));
    BodyExt::boxed(http_body_util::StreamBody::new(stream))
}
