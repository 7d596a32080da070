//! Template builds in flight: each one's cancel token and its event hub, by build id.
//!
//! A hub keeps what a follower joining late needs (every event from the first, with the
//! output bounded) and broadcasts new events to followers already there. Both happen
//! under one lock, so a follower that takes the replay and subscribes in one call misses
//! nothing and sees nothing twice. The hub also folds the events into the build's status
//! as it goes (the steps so far, the output's tail), which is what the store records.
//! Once a build ended its record in the store has the same events; the registry forgets it.

use lizard_api::templates::{BuildEvent, BuildStatus, BuildStepInfo};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// Output kept for a build's `log`: its last 64 KiB.
pub const LOG_TAIL_BYTES: usize = 64 << 10;
/// Output kept in a build's replayable event stream (later output is in the log only).
pub const REPLAY_OUTPUT_BYTES: usize = 1 << 20;
/// Events a slow follower may fall behind by before it skips some output.
const FOLLOWER_BUFFER: usize = 4096;

/// What the events of a build add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    pub steps: Vec<BuildStepInfo>,
    /// The output's tail, at most [`LOG_TAIL_BYTES`].
    pub log: String,
}

impl Progress {
    /// Fold one event in.
    pub fn apply(&mut self, event: &BuildEvent) {
        match event {
            BuildEvent::Step { index, description, cached, .. } => {
                let status = if *cached { BuildStatus::Ready } else { BuildStatus::Running };
                let step = BuildStepInfo {
                    index: *index,
                    description: description.clone(),
                    cached: *cached,
                    status,
                    duration_ms: None,
                };
                match self.steps.iter_mut().find(|s| s.index == *index) {
                    Some(s) => *s = step,
                    None => self.steps.push(step),
                }
            }
            BuildEvent::StepDone { index, duration_ms } => {
                if let Some(s) = self.steps.iter_mut().find(|s| s.index == *index) {
                    s.status = BuildStatus::Ready;
                    s.duration_ms = Some(*duration_ms);
                }
            }
            BuildEvent::Output { data, .. } => {
                self.log.push_str(data);
                if self.log.len() > LOG_TAIL_BYTES {
                    let mut cut = self.log.len() - LOG_TAIL_BYTES;
                    while !self.log.is_char_boundary(cut) {
                        cut += 1;
                    }
                    self.log.drain(..cut);
                }
            }
            BuildEvent::Done { status, error } => {
                let failed_step = error.as_ref().and_then(|e| e.step);
                for s in self.steps.iter_mut().filter(|s| s.status == BuildStatus::Running) {
                    s.status = if failed_step == Some(s.index) { BuildStatus::Failed } else { *status };
                }
            }
            BuildEvent::Phase { .. } => {}
        }
    }
}

struct HubState {
    replay: Vec<BuildEvent>,
    replay_output: usize,
    truncated: bool,
    progress: Progress,
    done: bool,
}

/// The events of one build in flight.
pub struct BuildHub {
    state: Mutex<HubState>,
    live: broadcast::Sender<BuildEvent>,
}

impl Default for BuildHub {
    fn default() -> Self {
        BuildHub {
            state: Mutex::new(HubState {
                replay: Vec::new(),
                replay_output: 0,
                truncated: false,
                progress: Progress::default(),
                done: false,
            }),
            live: broadcast::channel(FOLLOWER_BUFFER).0,
        }
    }
}

impl BuildHub {
    /// Record and broadcast an event. Nothing is taken after `Done`.
    pub fn push(&self, event: BuildEvent) {
        let mut s = self.state.lock().expect("build hub lock");
        if s.done {
            return;
        }
        s.progress.apply(&event);
        s.done = matches!(event, BuildEvent::Done { .. });
        match &event {
            BuildEvent::Output { data, .. } if s.replay_output + data.len() > REPLAY_OUTPUT_BYTES => {
                if !s.truncated {
                    s.truncated = true;
                    s.replay.push(BuildEvent::Phase {
                        message: "(more output than a replay keeps; the build's log has its tail)".into(),
                    });
                }
            }
            BuildEvent::Output { data, .. } => {
                s.replay_output += data.len();
                s.replay.push(event.clone());
            }
            _ => s.replay.push(event.clone()),
        }
        // No follower is not an error.
        let _ = self.live.send(event);
    }

    /// Every event so far and, unless the build is done, a receiver of those to come.
    pub fn follow(&self) -> (Vec<BuildEvent>, Option<broadcast::Receiver<BuildEvent>>) {
        let s = self.state.lock().expect("build hub lock");
        let rx = (!s.done).then(|| self.live.subscribe());
        (s.replay.clone(), rx)
    }

    /// The steps and output tail so far.
    pub fn progress(&self) -> Progress {
        self.state.lock().expect("build hub lock").progress.clone()
    }

    /// The replayable events as NDJSON (what the store keeps once the build ended).
    pub fn ndjson(&self) -> String {
        let s = self.state.lock().expect("build hub lock");
        to_ndjson(&s.replay)
    }
}

/// Events as NDJSON, one per line.
pub fn to_ndjson<T: serde::Serialize>(events: &[T]) -> String {
    let mut out = String::new();
    for e in events {
        if let Ok(line) = serde_json::to_string(e) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Events back from NDJSON (lines that do not parse are skipped).
pub fn from_ndjson(text: &str) -> Vec<BuildEvent> {
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// A build in flight.
#[derive(Clone)]
pub struct RunningBuild {
    pub hub: Arc<BuildHub>,
    pub cancel: CancellationToken,
}

/// The builds in flight in this process, by build id.
#[derive(Default)]
pub struct Builds {
    running: Mutex<HashMap<String, RunningBuild>>,
}

impl Builds {
    /// Register a new build.
    pub fn start(&self, build_id: &str) -> RunningBuild {
        let build = RunningBuild { hub: Arc::new(BuildHub::default()), cancel: CancellationToken::new() };
        self.running.lock().expect("builds lock").insert(build_id.to_owned(), build.clone());
        build
    }

    pub fn get(&self, build_id: &str) -> Option<RunningBuild> {
        self.running.lock().expect("builds lock").get(build_id).cloned()
    }

    /// Forget a build that ended (its record has its events).
    pub fn finish(&self, build_id: &str) {
        self.running.lock().expect("builds lock").remove(build_id);
    }

    /// Cancel every build in flight (the server is stopping).
    pub fn cancel_all(&self) {
        for b in self.running.lock().expect("builds lock").values() {
            b.cancel.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lizard_api::templates::{BuildFailure, OutputStream};

    fn out(data: &str) -> BuildEvent {
        BuildEvent::Output { stream: OutputStream::Stdout, data: data.into() }
    }

    fn step(index: u32, cached: bool) -> BuildEvent {
        BuildEvent::Step { index, total: 3, description: format!("run {index}"), cached }
    }

    #[test]
    fn progress_follows_steps_and_marks_the_failed_one() {
        let mut p = Progress::default();
        for e in [step(1, true), step(2, false), BuildEvent::StepDone { index: 2, duration_ms: 7 }, step(3, false)] {
            p.apply(&e);
        }
        assert_eq!(
            p.steps.iter().map(|s| s.status).collect::<Vec<_>>(),
            [BuildStatus::Ready; 2].iter().copied().chain([BuildStatus::Running]).collect::<Vec<_>>()
        );
        assert_eq!((p.steps[0].cached, p.steps[1].duration_ms), (true, Some(7)));
        let failure =
            BuildFailure { code: "STEP_FAILED".into(), message: "m".into(), step: Some(3), output_tail: None };
        p.apply(&BuildEvent::Done { status: BuildStatus::Failed, error: Some(failure) });
        assert_eq!(p.steps[2].status, BuildStatus::Failed);
    }

    #[test]
    fn the_log_keeps_a_bounded_tail() {
        let mut p = Progress::default();
        let chunk = "é".repeat(1000);
        for _ in 0..100 {
            p.apply(&out(&chunk));
        }
        assert!(p.log.len() <= LOG_TAIL_BYTES && p.log.len() > LOG_TAIL_BYTES - 4);
        assert!(p.log.chars().all(|c| c == 'é'));
    }

    #[tokio::test]
    async fn a_late_follower_gets_everything_once_and_the_end() {
        let hub = BuildHub::default();
        hub.push(step(1, false));
        hub.push(out("a"));
        let (replay, rx) = hub.follow();
        assert_eq!(replay.len(), 2);
        let mut rx = rx.expect("still running");
        hub.push(out("b"));
        hub.push(BuildEvent::Done { status: BuildStatus::Ready, error: None });
        hub.push(out("after the end"));
        assert_eq!(rx.recv().await.unwrap(), out("b"));
        assert!(matches!(rx.recv().await.unwrap(), BuildEvent::Done { .. }));
        let (replay, rx) = hub.follow();
        assert!(rx.is_none(), "done: nothing more to follow");
        assert_eq!(from_ndjson(&to_ndjson(&replay)), replay);
        assert_eq!(replay.len(), 4);
    }

    #[test]
    fn replayed_output_is_bounded() {
        let hub = BuildHub::default();
        let big = "x".repeat(REPLAY_OUTPUT_BYTES / 2 + 1);
        for _ in 0..4 {
            hub.push(out(&big));
        }
        let (replay, _) = hub.follow();
        assert_eq!(replay.len(), 2, "one output and the truncation note: {}", replay.len());
    }
}
