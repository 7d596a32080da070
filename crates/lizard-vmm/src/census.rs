//! The QEMU processes of this host, as the kernel sees them (`/proc`), apart from any
//! record: what a test or a leak check compares with what the node says it runs.

/// Pids of live QEMU processes (zombies left out) whose command line mentions `needle`
/// (a sandbox id, a run or data directory).
pub fn live_vmms(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return vec![] };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
            let cmdline = String::from_utf8_lossy(&cmdline);
            let program = cmdline.split('\0').next().unwrap_or_default();
            program.contains("qemu-system") && cmdline.contains(needle) && !is_zombie(*pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether `pid` has ended and waits for its parent (or is gone).
fn is_zombie(pid: u32) -> bool {
    // The state follows the command name's closing parenthesis (the name may hold any).
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_is_no_qemu_is_not_counted() {
        // This test's own process mentions its name on its command line, yet is no QEMU.
        let me = std::env::args().next().unwrap_or_default();
        assert!(!live_vmms(&me).contains(&std::process::id()));
        assert!(!is_zombie(std::process::id()));
        assert!(is_zombie(u32::MAX), "a pid that does not exist counts as ended");
    }
}
