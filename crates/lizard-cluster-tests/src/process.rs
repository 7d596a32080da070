//! One `lizard` process of the fleet (a replica or a node agent): started with none of the
//! caller's LIZARD_* variables (its log at info), its stderr appended to `<name>.log` in its directory, and
//! SIGKILLed, restarted or stopped as a test says.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// This crate's `lizard-in-cluster` binary: Cargo builds a package's binaries before its
/// integration tests, one level above the tests' executables (`target/<profile>/deps/…`).
fn binary() -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test's executable");
    test_exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").join("lizard-in-cluster")
}

/// `lizard-in-cluster` with none of the caller's LIZARD_* variables (the test's own
/// settings must not leak into the processes it starts).
pub fn command() -> Command {
    let mut cmd = Command::new(binary());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("LIZARD_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A `lizard` process and how to start it again.
pub struct Process {
    name: String,
    dir: PathBuf,
    args: Vec<OsString>,
    child: Option<Child>,
}

impl Process {
    /// Start `lizard <args>`; its log goes to `<dir>/<name>.log`.
    pub fn start(name: &str, dir: &Path, args: Vec<OsString>) -> Process {
        let mut process = Process { name: name.into(), dir: dir.into(), args, child: None };
        process.spawn();
        process
    }

    fn spawn(&mut self) {
        let mut cmd = command();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the process's log");
        // Everything at info: the logs are what a failed test shows.
        cmd.env("LIZARD_LOG", "info");
        let child = cmd.args(&self.args).stdout(Stdio::piped()).stderr(log).spawn().expect("start lizard-in-cluster");
        self.child = Some(child);
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("{}.log", self.name))
    }

    /// Its standard output (once; `None` after).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.as_mut().and_then(|c| c.stdout.take())
    }

    /// What it wrote to stderr so far (its operator log).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// How it ended, if it did (`None` while it runs or when it was never started).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL, as a crash or a pulled plug would end it (its VMMs run on in their own
    /// process groups).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again with the same arguments (SIGKILL first if it runs).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// SIGTERM, then SIGKILL after 30 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}
