//! An instance's log: what `cmd` writes to stdout and stderr goes to the start command's
//! log in the guest ([`lizard_node::START_LOG`], appended to by the app), read back with a
//! short exec as root. The reconciler keeps it under [`MAX_LOG_BYTES`] ([`trim`]): past
//! it, the older half is dropped (output written while the trim runs may be lost).

use crate::error::{ApiResult, AppError};
use crate::placement;
use crate::state::AppState;
use lizard_api::services::{InstanceState, ServiceLogLine, MAX_LOG_BYTES};
use lizard_api::ExecRequest;

/// The tail a log read gives by default.
pub const DEFAULT_TAIL_BYTES: u64 = 64 << 10;
/// Most bytes one read of a followed log returns.
const FOLLOW_CHUNK_BYTES: u64 = 256 << 10;

/// Run `script` (`sh -c`, with `args`) as root in the instance; its stdout.
async fn run(state: &AppState, sandbox_id: &str, script: &str, args: &[String]) -> ApiResult<String> {
    let node = placement::sandbox_node(state, sandbox_id).await?;
    let mut argv = vec!["sh".to_owned(), "-c".to_owned(), script.to_owned(), "log".to_owned()];
    argv.extend(args.iter().cloned());
    let req =
        ExecRequest { argv: Some(argv), user: Some("root".into()), timeout_ms: Some(10_000), ..Default::default() };
    let out = node.exec(sandbox_id, req).await?;
    if out.exit_code != 0 {
        return Err(AppError::new(
            lizard_api::ErrorCode::Unavailable,
            format!("cannot read the log of instance {sandbox_id}: {}", out.stderr.trim()),
        ));
    }
    Ok(out.stdout)
}

/// The last `bytes` of the instance's log.
pub async fn read_tail(state: &AppState, sandbox_id: &str, bytes: u64) -> ApiResult<String> {
    run(
        state,
        sandbox_id,
        "tail -c \"$2\" \"$1\" 2>/dev/null || true",
        &[lizard_node::START_LOG.into(), bytes.to_string()],
    )
    .await
}

/// What the log holds from byte `offset` on (from 0 when it was trimmed below it), and
/// the offset to read from next.
pub async fn read_from(state: &AppState, sandbox_id: &str, offset: u64) -> ApiResult<(u64, String)> {
    let script = "s=$(stat -c %s \"$1\" 2>/dev/null || echo 0); o=$2; [ \"$s\" -lt \"$o\" ] && o=0; \
                  echo \"$o\"; tail -c +$((o + 1)) \"$1\" 2>/dev/null | head -c \"$3\"";
    let args = [lizard_node::START_LOG.into(), offset.to_string(), FOLLOW_CHUNK_BYTES.to_string()];
    let out = run(state, sandbox_id, script, &args).await?;
    let (from, data) = out.split_once('\n').unwrap_or((out.as_str(), ""));
    let from: u64 = from.trim().parse().unwrap_or(0);
    Ok((from + data.len() as u64, data.to_owned()))
}

/// Keep the log under [`MAX_LOG_BYTES`]: past it, only its newer half stays.
pub async fn trim(state: &AppState, sandbox_id: &str) -> ApiResult<()> {
    let script = "[ \"$(stat -c %s \"$1\" 2>/dev/null || echo 0)\" -gt \"$2\" ] || exit 0; \
                  tail -c \"$3\" \"$1\" > \"$1.keep\" && cat \"$1.keep\" > \"$1\"; rm -f \"$1.keep\"";
    let args = [lizard_node::START_LOG.into(), MAX_LOG_BYTES.to_string(), (MAX_LOG_BYTES / 2).to_string()];
    run(state, sandbox_id, script, &args).await.map(drop)
}

/// The instances whose logs can be read now (paused ones cannot: their VM is saved).
fn readable(service: &lizard_store::ServiceRecord) -> Vec<(String, u32)> {
    service
        .body
        .instances
        .iter()
        .filter(|i| i.state != InstanceState::Paused)
        .map(|i| (i.sandbox_id.clone(), i.version))
        .collect()
}

/// The last `tail` bytes of every running instance's log.
pub async fn tails(state: &AppState, service: &lizard_store::ServiceRecord, tail: u64) -> Vec<ServiceLogLine> {
    let mut out = Vec::new();
    for (sandbox_id, version) in readable(service) {
        match read_tail(state, &sandbox_id, tail).await {
            Ok(data) if !data.is_empty() => out.push(ServiceLogLine { sandbox_id, version, data }),
            Ok(_) => {}
            Err(e) => tracing::debug!(sandbox = %sandbox_id, "log read: {}", e.0.message),
        }
    }
    out
}

/// Follow the logs of `name`'s instances: every second, what each wrote since the last
/// read (instances that start later are followed from their first byte). Ends when the
/// service is deleted.
pub fn follow(
    state: AppState,
    name: String,
    service_id: String,
    start: Vec<(String, u64)>,
) -> impl futures_util::Stream<Item = ServiceLogLine> {
    use std::collections::{HashMap, VecDeque};
    struct Follow {
        state: AppState,
        name: String,
        service_id: String,
        offsets: HashMap<String, u64>,
        ready: VecDeque<ServiceLogLine>,
        first: bool,
    }
    let f =
        Follow { state, name, service_id, offsets: start.into_iter().collect(), ready: VecDeque::new(), first: true };
    futures_util::stream::unfold(f, |mut f| async move {
        loop {
            if let Some(line) = f.ready.pop_front() {
                return Some((line, f));
            }
            if !f.first {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            f.first = false;
            let service = match f.state.server.store.service_by_name(&f.name).await {
                Ok(Some(s)) if s.id == f.service_id => s,
                Ok(_) => return None,
                Err(_) => continue,
            };
            for (sandbox_id, version) in readable(&service) {
                let from = f.offsets.get(&sandbox_id).copied().unwrap_or(0);
                if let Ok((next, data)) = read_from(&f.state, &sandbox_id, from).await {
                    f.offsets.insert(sandbox_id.clone(), next);
                    if !data.is_empty() {
                        f.ready.push_back(ServiceLogLine { sandbox_id, version, data });
                    }
                }
            }
        }
    })
}

/// Where each running instance's log ends now (a follow after a tail starts there).
pub async fn ends(state: &AppState, service: &lizard_store::ServiceRecord) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (sandbox_id, _) in readable(service) {
        let size = run(state, &sandbox_id, "stat -c %s \"$1\" 2>/dev/null || echo 0", &[lizard_node::START_LOG.into()])
            .await
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        out.push((sandbox_id, size));
    }
    out
}
