//! `POST /v1/volume/mount` and `POST /v1/volume/sync`: the sandbox's volume at
//! `/workspace`.
//!
//! Every guest has a second virtio-blk disk, `/dev/vdb`: the volume when the sandbox has
//! one, an empty placeholder otherwise. The host asks for the mount after the agent
//! answers (cold boot) or after the identity (restore). A restored guest still believes
//! the disk has the template's placeholder size until the host's resize notification
//! lands, so the mount waits for the size the host announces, then drops whatever the
//! kernel cached of the placeholder's blocks before mounting.
//!
//! Sync is what the node calls before it kills or pauses a sandbox with a volume:
//! `syncfs` on `/workspace` returns once ext4 has written and flushed (virtio-blk FLUSH →
//! `fdatasync` on the host) everything the guest cached.

use crate::app::{AppError, AppState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use lizard_agent_proto::routes::{VOLUME_DEVICE, WORKSPACE};
use lizard_agent_proto::types::{AgentError, ErrorCode, VolumeMount};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How long the mount waits for the kernel to report the volume's real size.
const SIZE_WAIT: Duration = Duration::from_secs(10);

pub async fn mount(State(state): State<AppState>, Json(req): Json<VolumeMount>) -> Result<StatusCode, AppError> {
    if !state.pid1 {
        return Err(AgentError::new(ErrorCode::InvalidArgument, "volumes are mounted only by a guest's PID 1").into());
    }
    tokio::task::spawn_blocking(move || mount_now(req.size_bytes))
        .await
        .map_err(|e| AgentError::new(ErrorCode::Internal, e.to_string()))??;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn sync(State(state): State<AppState>) -> Result<StatusCode, AppError> {
    if state.pid1 {
        tokio::task::spawn_blocking(sync_now)
            .await
            .map_err(|e| AgentError::new(ErrorCode::Internal, e.to_string()))??;
    }
    Ok(StatusCode::NO_CONTENT)
}

fn internal(what: &str, e: impl std::fmt::Display) -> AgentError {
    AgentError::new(ErrorCode::Internal, format!("{what}: {e}"))
}

/// The size of `/dev/vdb` as the kernel sees it now, in bytes.
fn device_size() -> std::io::Result<u64> {
    let name = VOLUME_DEVICE.trim_start_matches("/dev/");
    let sectors: u64 =
        std::fs::read_to_string(format!("/sys/block/{name}/size"))?.trim().parse().map_err(std::io::Error::other)?;
    Ok(sectors * 512)
}

fn is_mounted() -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .map(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(WORKSPACE)))
        .unwrap_or(false)
}

// `BLKFLSBUF`: `_IO(0x12, 97)`; writes back and drops the block device's page cache.
nix::ioctl_none!(blkflsbuf, 0x12, 97);

fn mount_now(size_bytes: u64) -> Result<(), AgentError> {
    if is_mounted() {
        return Err(AgentError::new(ErrorCode::AlreadyExists, format!("a volume is already mounted at {WORKSPACE}")));
    }
    let deadline = Instant::now() + SIZE_WAIT;
    loop {
        match device_size() {
            Ok(n) if n == size_bytes => break,
            Ok(n) if Instant::now() >= deadline => {
                return Err(internal("volume disk", format!("{VOLUME_DEVICE} has {n} bytes, expected {size_bytes}")))
            }
            Err(e) if Instant::now() >= deadline => return Err(internal(VOLUME_DEVICE, e)),
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    let dev = std::fs::File::open(VOLUME_DEVICE).map_err(|e| internal(VOLUME_DEVICE, e))?;
    // SAFETY: BLKFLSBUF takes no argument; the fd is an open block device.
    unsafe { blkflsbuf(dev.as_raw_fd()) }.map_err(|e| internal("BLKFLSBUF", e))?;
    drop(dev);
    std::fs::create_dir_all(WORKSPACE).map_err(|e| internal(WORKSPACE, e))?;
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some(VOLUME_DEVICE),
        WORKSPACE,
        Some("ext4"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME,
        Some("data=ordered,errors=remount-ro"),
    )
    .map_err(|e| internal(&format!("mount {VOLUME_DEVICE} on {WORKSPACE}"), e))
}

fn sync_now() -> Result<(), AgentError> {
    if !is_mounted() {
        return Ok(());
    }
    let dir = std::fs::File::open(WORKSPACE).map_err(|e| internal(WORKSPACE, e))?;
    nix::unistd::syncfs(dir.as_raw_fd()).map_err(|e| internal("syncfs /workspace", e))
}

#[cfg(test)]
mod tests {
    use crate::server::tests::{call, test_router};
    use axum::body::Body;
    use axum::http::StatusCode;
    use http_body_util::BodyExt;
    use lizard_agent_proto::routes;
    use lizard_agent_proto::types::{AgentError, ErrorCode};
    use tower::ServiceExt;

    #[tokio::test]
    async fn only_a_guest_mounts_and_sync_without_a_volume_is_a_no_op() {
        // Dev mode (not PID 1): the host's own block devices are never touched.
        let req = http::Request::post(routes::VOLUME_MOUNT)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"sizeBytes":1073741824}"#))
            .unwrap();
        let resp = test_router().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let e: AgentError = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        let (status, _) = call("POST", routes::VOLUME_SYNC, Body::empty()).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
}
