//! `lizard`: the command-line face of Lizard.
//!
//! Without a server, `lizard sandbox …` talks to the local node daemon on
//! `<data-dir>/node.sock`, starting it (`lizard node run`) when it is not running, so
//! sandboxes outlive the CLI invocation that created them.

mod client;
mod local;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use client::{empty, json_body, path_query, ApiClient};
use futures_util::StreamExt;
use http::Method;
use http_body_util::BodyExt;
use lizard_api::{paths, CreateSandboxRequest, ExecRequest, FileEntry, SandboxInfo, WriteResult};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "lizard", version, about = "Lizard: microVM sandboxes for AI agents")]
struct Cli {
    /// Where images and sandboxes live [default: /var/lib/lizard as root, else $XDG_DATA_HOME/lizard]
    #[arg(long, global = true, env = "LIZARD_DATA_DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run sandboxes on this machine.
    #[command(subcommand)]
    Node(NodeCmd),
    /// Guest images: kernel, initramfs, template disks.
    #[command(subcommand)]
    Images(ImagesCmd),
    /// Create and drive sandboxes.
    #[command(subcommand)]
    Sandbox(SandboxCmd),
}

#[derive(Subcommand)]
enum NodeCmd {
    /// Serve the node API on <data-dir>/node.sock until SIGTERM/SIGINT (kills its sandboxes on exit).
    Run(local::RunArgs),
}

#[derive(Subcommand)]
enum ImagesCmd {
    /// Build (or verify the cache of) the kernel, initramfs and template images ahead of time.
    Build {
        /// Templates to build [default: all]
        templates: Vec<String>,
    },
    /// List the templates this build knows.
    List,
}

#[derive(Subcommand)]
enum SandboxCmd {
    /// Boot a new sandbox from a template and print its id.
    Create {
        template: String,
        #[arg(long)]
        vcpus: Option<u32>,
        #[arg(long)]
        memory_mib: Option<u32>,
        /// KEY=VALUE environment for every process in the sandbox (repeatable).
        #[arg(long = "env", value_parser = parse_kv)]
        env: Vec<(String, String)>,
        /// KEY=VALUE metadata (repeatable).
        #[arg(long = "metadata", value_parser = parse_kv)]
        metadata: Vec<(String, String)>,
    },
    /// List running sandboxes.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show one sandbox as JSON.
    Get { id: String },
    /// Run a command; prints its output and exits with its exit code (125: Lizard error).
    Exec(ExecArgs),
    /// Stop a sandbox and delete everything in it.
    Kill { id: String },
    /// Files inside a sandbox.
    #[command(subcommand)]
    Fs(FsCmd),
}

#[derive(Args)]
struct ExecArgs {
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
    #[arg(long)]
    timeout: Option<f64>,
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

#[derive(Subcommand)]
enum FsCmd {
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
        #[arg(long)]
        json: bool,
    },
    /// Remove a file or a directory (recursively).
    Rm { id: String, path: String },
    /// Create a directory and its parents.
    Mkdir { id: String, path: String },
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LIZARD_LOG").unwrap_or_else(|_| "warn,lizard=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let data_dir = cli.data_dir.clone().unwrap_or_else(lizard_node::default_data_dir);
    match rt.block_on(run(cli.command, data_dir)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

async fn run(command: Command, data_dir: PathBuf) -> Result<i32> {
    match command {
        Command::Node(NodeCmd::Run(args)) => local::run_node(data_dir, args).await.map(|_| 0),
        Command::Images(ImagesCmd::List) => {
            for t in lizard_image::ImageStore::template_names() {
                println!("{t}");
            }
            Ok(0)
        }
        Command::Images(ImagesCmd::Build { templates }) => local::build_images(data_dir, templates).await.map(|_| 0),
        Command::Sandbox(cmd) => {
            let api = local::connect(&data_dir).await?;
            sandbox(&api, cmd).await
        }
    }
}

async fn sandbox(api: &ApiClient, cmd: SandboxCmd) -> Result<i32> {
    match cmd {
        SandboxCmd::Create { template, vcpus, memory_mib, env, metadata } => {
            let req = CreateSandboxRequest {
                template,
                vcpus,
                memory_mib,
                env: env.into_iter().collect(),
                metadata: metadata.into_iter().collect(),
            };
            let s: SandboxInfo = api.json(Method::POST, paths::SANDBOXES, json_body(&req)).await?;
            println!("{}", s.sandbox_id);
        }
        SandboxCmd::List { json } => {
            let list: Vec<SandboxInfo> = api.json(Method::GET, paths::SANDBOXES, empty()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<22} {:<20} {:<8} {:>5} {:>7}  STARTED", "ID", "TEMPLATE", "STATE", "VCPUS", "MEM_MIB");
                for s in list {
                    let state = serde_json::to_value(s.state)?;
                    println!(
                        "{:<22} {:<20} {:<8} {:>5} {:>7}  {}",
                        s.sandbox_id,
                        s.template,
                        state.as_str().unwrap_or(""),
                        s.vcpus,
                        s.memory_mib,
                        s.started_at
                    );
                }
            }
        }
        SandboxCmd::Get { id } => {
            let s: SandboxInfo = api.json(Method::GET, &paths::sandbox(&id), empty()).await?;
            println!("{}", serde_json::to_string_pretty(&s)?);
        }
        SandboxCmd::Kill { id } => {
            api.send(Method::DELETE, &paths::sandbox(&id), empty()).await?;
        }
        SandboxCmd::Exec(args) => {
            return match exec(api, args).await {
                Ok(code) => Ok(code),
                Err(e) => {
                    eprintln!("error: {e:#}");
                    Ok(125)
                }
            }
        }
        SandboxCmd::Fs(cmd) => fs(api, cmd).await?,
    }
    Ok(0)
}

async fn exec(api: &ApiClient, a: ExecArgs) -> Result<i32> {
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
        timeout_ms: a.timeout.map(|s| (s * 1000.0) as u64),
        stdin,
    };
    let resp = api.send(Method::POST, &format!("{}?stream=true", paths::exec(&a.id)), json_body(&req)).await?;
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

async fn fs(api: &ApiClient, cmd: FsCmd) -> Result<()> {
    match cmd {
        FsCmd::Write { id, path, from } => {
            let body: client::Body = match from {
                Some(p) => {
                    let f = tokio::fs::File::open(&p).await.with_context(|| format!("open {}", p.display()))?;
                    stream_body(f)
                }
                None => stream_body(tokio::io::stdin()),
            };
            let uri = format!("{}?{}", paths::files(&id), path_query(&path));
            let r: WriteResult = api.json(Method::PUT, &uri, body).await?;
            eprintln!("wrote {} bytes to {}", r.bytes_written, r.path);
        }
        FsCmd::Read { id, path, to } => {
            let uri = format!("{}?{}", paths::files(&id), path_query(&path));
            let resp = api.send(Method::GET, &uri, empty()).await?;
            let mut body = resp.into_body();
            let mut out: Box<dyn Write> = match to {
                Some(p) => Box::new(std::fs::File::create(&p).with_context(|| format!("create {}", p.display()))?),
                None => Box::new(std::io::stdout().lock()),
            };
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame?.into_data() {
                    out.write_all(&data)?;
                }
            }
            out.flush()?;
        }
        FsCmd::Ls { id, path, json } => {
            let uri = format!("{}?{}", paths::files_list(&id), path_query(&path));
            let entries: Vec<FileEntry> = api.json(Method::GET, &uri, empty()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else {
                for e in entries {
                    let kind = serde_json::to_value(e.file_type)?;
                    println!("{:<8} {:>12} {:o} {}", kind.as_str().unwrap_or(""), e.size, e.mode, e.name);
                }
            }
        }
        FsCmd::Rm { id, path } => {
            api.send(Method::DELETE, &format!("{}?{}", paths::files(&id), path_query(&path)), empty()).await?;
        }
        FsCmd::Mkdir { id, path } => {
            api.send(Method::POST, &format!("{}?{}", paths::files_mkdir(&id), path_query(&path)), empty()).await?;
        }
    }
    Ok(())
}

/// Stream a reader as a request body without holding it in memory.
fn stream_body<R: tokio::io::AsyncRead + Send + Sync + 'static>(r: R) -> client::Body {
    let stream = tokio_util::io::ReaderStream::with_capacity(r, 256 * 1024).map(|r| r.map(hyper::body::Frame::data));
    BodyExt::boxed(http_body_util::StreamBody::new(stream))
}
