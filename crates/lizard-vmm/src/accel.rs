//! Choosing the accelerator by a real probe.
//!
//! `/dev/kvm` existing proves little: on our nested, paravirtual hosts KVM either stops
//! with "emulation failure" or takes minutes on a stock kernel (DESIGN.md). So a tiny
//! guest — the real kernel and initramfs with `lizard.mode=probe`, where the agent prints
//! a line and powers off — must boot under KVM within a deadline; otherwise we use TCG.
//! The verdict is cached per host (kernel release, QEMU binary, guest kernel).

use crate::{Backend, VmConfig};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::{Duration, Instant};

/// The accelerator QEMU runs guests with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualization.
    Kvm,
    /// Software emulation: works everywhere, ~10x slower for CPU-bound guests.
    Tcg,
}

/// A cached probe verdict.
#[derive(Debug, Serialize, Deserialize)]
struct Verdict {
    key: String,
    accel: Accel,
    detail: String,
}

/// How long a probe guest under KVM may take to say it runs. A real KVM boots it in well
/// under a second.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(8);

/// Decide the accelerator, using `cache` (a JSON file) when its key still matches.
///
/// `probe_config` must describe a VM that boots the agent in probe mode; its `accel`
/// field is ignored.
pub async fn choose(backend: &dyn Backend, probe_config: &VmConfig, cache: &Path) -> Accel {
    let key = cache_key(&backend.version(), &probe_config.kernel);
    if let Ok(text) = std::fs::read_to_string(cache) {
        if let Ok(v) = serde_json::from_str::<Verdict>(&text) {
            if v.key == key {
                tracing::info!(accel = ?v.accel, "accelerator (cached probe: {})", v.detail);
                return v.accel;
            }
        }
    }
    let (accel, detail) = probe(backend, probe_config).await;
    tracing::info!(?accel, "accelerator chosen by probe: {detail}");
    let v = Verdict { key, accel, detail };
    let tmp = cache.with_extension("tmp");
    if std::fs::write(&tmp, serde_json::to_vec_pretty(&v).expect("serializes")).is_ok() {
        let _ = std::fs::rename(&tmp, cache);
    }
    accel
}

/// What a verdict holds for: the host's kernel, the guest's and the VMM's version.
fn cache_key(vmm: &str, kernel: &Path) -> String {
    let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    let kernel_meta = std::fs::metadata(kernel).map(|m| m.len()).unwrap_or(0);
    format!("host={release};guest-kernel={}:{kernel_meta};vmm={vmm}", kernel.display())
}

async fn probe(backend: &dyn Backend, base: &VmConfig) -> (Accel, String) {
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        return (Accel::Tcg, format!("/dev/kvm unusable: {e}"));
    }
    let mut config = base.clone();
    config.accel = Accel::Kvm;
    config.memory_mib = 128;
    config.vcpus = 1;
    let start = Instant::now();
    let vm = match backend.boot(&config).await {
        Ok(vm) => vm,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&config.run_dir);
            return (Accel::Tcg, format!("KVM guest did not start: {e}"));
        }
    };
    let console = config.console_log();
    let verdict = loop {
        if crate::tail_of(&console, 4096).contains(lizard_agent_proto::PROBE_OK) {
            break (Accel::Kvm, format!("probe guest ran under KVM in {:?}", start.elapsed()));
        }
        if !vm.is_running() {
            break (
                Accel::Tcg,
                format!(
                    "KVM guest exited without running: {}",
                    crate::tail_of(&config.run_dir.join("qemu.stderr"), 300).trim()
                ),
            );
        }
        if start.elapsed() > PROBE_DEADLINE {
            break (Accel::Tcg, format!("KVM guest did not run within {PROBE_DEADLINE:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = vm.kill().await;
    let _ = std::fs::remove_dir_all(&config.run_dir);
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_holds_for_one_vmm_version() {
        let kernel = Path::new("/nonexistent/vmlinux");
        let (a, b) =
            (cache_key("QEMU emulator version 7.2.22", kernel), cache_key("QEMU emulator version 10.0.2", kernel));
        assert_ne!(a, b);
        assert!(b.ends_with(";vmm=QEMU emulator version 10.0.2"), "{b}");
    }
}
