//! A template's start command in a guest: launched detached (its own session, output to
//! [`START_LOG`] in the guest), then watched until its `ready` check holds.
//!
//! The template snapshot is taken with it running, so every sandbox restored from it has
//! the process up without an exec; a cold-booted sandbox of such a template runs this
//! right after boot.

use crate::error::StartError;
use crate::templates::StartSpec;
use lizard_agent_client::AgentClient;
use lizard_agent_proto::types::ExecRequest;
use lizard_recipe::Ready;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where the start command's output goes, in the guest.
pub const START_LOG: &str = "/var/log/lizard-start.log";

/// How often a `ready` check is tried.
const POLL: Duration = Duration::from_millis(250);

/// Bytes of the start log a failure shows.
const TAIL_BYTES: u32 = 4000;

/// Launch `spec` in the guest behind `agent` and wait until it is ready.
pub(crate) async fn start(agent: &AgentClient, spec: &StartSpec) -> Result<(), StartError> {
    launch(agent, spec).await?;
    let limit = Duration::from_secs(spec.ready_timeout_s.into());
    let begun = Instant::now();
    if let Ready::DelayS(s) = spec.ready {
        tokio::time::sleep(Duration::from_secs(s.into())).await;
        return Ok(());
    }
    loop {
        if is_ready(agent, &spec.ready).await? {
            tracing::debug!(ms = begun.elapsed().as_millis(), "start command ready");
            return Ok(());
        }
        if begun.elapsed() >= limit {
            return Err(StartError::NotReady {
                ready: describe(&spec.ready),
                timeout_s: spec.ready_timeout_s,
                output_tail: log_tail(agent).await,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The log file (owned by the command's user), then the command in a session of its
/// own: the shell sets up the redirections before `setsid` forks, so the detached
/// process never holds the exec's pipes and the exec returns at once.
async fn launch(agent: &AgentClient, spec: &StartSpec) -> Result<(), StartError> {
    let cmd = &spec.command;
    let prepare = as_root(&[
        "sh",
        "-c",
        ": >\"$1\" && chown \"$2\" \"$1\" && chmod 0640 \"$1\"",
        "prepare",
        START_LOG,
        &cmd.user,
    ]);
    run_checked(agent, prepare).await?;
    let mut argv: Vec<String> =
        ["sh", "-c", "exec setsid -f \"$@\" >>\"$0\" 2>&1 </dev/null", START_LOG].map(String::from).to_vec();
    argv.extend(cmd.argv.iter().cloned());
    let req = ExecRequest {
        argv: Some(argv),
        env: cmd.env.clone(),
        cwd: Some(cmd.cwd.clone()),
        user: Some(cmd.user.clone()),
        ..Default::default()
    };
    run_checked(agent, req).await
}

async fn run_checked(agent: &AgentClient, req: ExecRequest) -> Result<(), StartError> {
    let out = agent.exec_collect(req).await.map_err(StartError::Agent)?;
    if out.status.exit_code == 0 {
        return Ok(());
    }
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    Err(StartError::Launch { exit_code: out.status.exit_code, output })
}

fn as_root(argv: &[&str]) -> ExecRequest {
    ExecRequest { argv: Some(argv.iter().map(|s| (*s).to_owned()).collect()), ..Default::default() }
}

/// Whether `ready` holds now.
async fn is_ready(agent: &AgentClient, ready: &Ready) -> Result<bool, StartError> {
    Ok(match ready {
        Ready::Port(port) => agent.connect_tcp(*port).await.is_ok(),
        Ready::Url(url) => url_answers(agent, url).await,
        Ready::File(path) => exits_zero(agent, &["test", "-e", path]).await?,
        Ready::Process(pattern) => exits_zero(agent, &["pgrep", "-f", "--", pattern]).await?,
        Ready::Cmd(cmd) => exits_zero(agent, &["sh", "-c", cmd]).await?,
        Ready::DelayS(_) => true,
    })
}

async fn exits_zero(agent: &AgentClient, argv: &[&str]) -> Result<bool, StartError> {
    let out = agent.exec_collect(as_root(argv)).await.map_err(StartError::Agent)?;
    Ok(out.status.exit_code == 0)
}

/// A GET of `url` (`http://127.0.0.1[:port]/path`, as the recipe checked) through a
/// tunnel to the guest port answers 2xx or 3xx.
async fn url_answers(agent: &AgentClient, url: &str) -> bool {
    let Some((port, path)) = split_url(url) else { return false };
    let Ok(mut tunnel) = agent.connect_tcp(port).await else { return false };
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if tunnel.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    let read = tokio::time::timeout(Duration::from_secs(5), tunnel.read_exact(&mut head)).await;
    matches!(read, Ok(Ok(_))) && head.starts_with(b"HTTP/1.") && matches!(head[9], b'2' | b'3')
}

/// `(port, path)` of an `http://host[:port][/path]` URL.
fn split_url(url: &str) -> Option<(u16, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_owned()),
        None => (rest, "/".to_owned()),
    };
    let port = match authority.rsplit_once(':') {
        Some((_, p)) => p.parse().ok()?,
        None => 80,
    };
    Some((port, path))
}

fn describe(ready: &Ready) -> String {
    match ready {
        Ready::Port(p) => format!("port {p} accepting connections"),
        Ready::Url(u) => format!("{u} answering"),
        Ready::File(f) => format!("{f} existing"),
        Ready::Process(p) => format!("a process matching {p:?}"),
        Ready::DelayS(s) => format!("{s} s passed"),
        Ready::Cmd(c) => format!("{c:?} exiting 0"),
    }
}

/// The end of the start log, for a failure's message (empty if it cannot be read).
async fn log_tail(agent: &AgentClient) -> String {
    let argv = ["tail", "-c", &TAIL_BYTES.to_string(), START_LOG];
    match agent.exec_collect(as_root(&argv)).await {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => {
            tracing::debug!("start log: {e}");
            String::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_port_and_path() {
        assert_eq!(split_url("http://127.0.0.1:8080/health?x=1"), Some((8080, "/health?x=1".into())));
        assert_eq!(split_url("http://localhost"), Some((80, "/".into())));
        assert_eq!(split_url("http://127.0.0.1:99999/"), None);
        assert_eq!(split_url("https://127.0.0.1/"), None);
    }
}
