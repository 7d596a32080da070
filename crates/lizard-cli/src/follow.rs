//! Following a build: its event stream (NDJSON) shown as it comes — the step (n/total,
//! cached or not), the elapsed time, and the step's output (a spinner with its last line;
//! every line when verbose). A failed build prints its code, step and output tail.

use crate::client::{empty, ApiClient, Call};
use crate::workspace_args::WorkspaceArgs;
use anyhow::{bail, Result};
use http_body_util::BodyExt;
use indicatif::{ProgressBar, ProgressStyle};
use lizard_api::routes;
use lizard_api::templates::{BuildEvent, BuildFailure, BuildStatus, OutputStream};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Lines of a step's output kept to show when it fails (the server sends its own tail too).
const TAIL_LINES: usize = 10;

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {prefix} {wide_msg} {elapsed}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// Shows a build's events as they come (a pushed template's, or a built-in's in
/// `lizard images build`).
pub(crate) struct Display {
    verbose: bool,
    json: bool,
    started: Instant,
    spinner: Option<ProgressBar>,
    tail: VecDeque<String>,
    partial: String,
}

impl Display {
    pub(crate) fn new(verbose: bool, json: bool) -> Display {
        Display { verbose, json, started: Instant::now(), spinner: None, tail: VecDeque::new(), partial: String::new() }
    }

    fn println(&self, line: &str) {
        match &self.spinner {
            Some(s) if !s.is_hidden() => s.println(line),
            _ => eprintln!("{line}"),
        }
    }

    fn end_step(&mut self) {
        if let Some(s) = self.spinner.take() {
            s.finish_and_clear();
        }
    }

    /// Show one event; `Some(status, error)` once the build ended.
    pub(crate) fn show(&mut self, event: BuildEvent) -> Option<(BuildStatus, Option<BuildFailure>)> {
        if self.json {
            if let Ok(line) = serde_json::to_string(&event) {
                println!("{line}");
            }
        }
        match event {
            BuildEvent::Step { index, total, description, cached } => {
                self.end_step();
                self.tail.clear();
                let head = format!("[{index}/{total}]");
                if cached {
                    if !self.json {
                        eprintln!("{head} {description} (cached)");
                    }
                } else {
                    if !self.json {
                        eprintln!("{head} {description}");
                    }
                    let s = ProgressBar::new_spinner().with_style(spinner_style()).with_prefix(head);
                    if self.json {
                        s.set_draw_target(indicatif::ProgressDrawTarget::hidden());
                    }
                    s.enable_steady_tick(Duration::from_millis(120));
                    self.spinner = Some(s);
                }
            }
            BuildEvent::Output { data, stream } => {
                self.partial.push_str(&data);
                while let Some(at) = self.partial.find('\n') {
                    let line: String = self.partial.drain(..=at).collect();
                    let line = line.trim_end().to_owned();
                    if self.verbose && !self.json {
                        let mark = if stream == OutputStream::Stderr { "! " } else { "  " };
                        self.println(&format!("{mark}{line}"));
                    }
                    if let Some(s) = &self.spinner {
                        s.set_message(line.clone());
                    }
                    self.tail.push_back(line);
                    if self.tail.len() > TAIL_LINES {
                        self.tail.pop_front();
                    }
                }
            }
            BuildEvent::StepDone { index, duration_ms } => {
                self.end_step();
                if !self.json {
                    eprintln!("  step {index} done in {:.1}s", Duration::from_millis(duration_ms).as_secs_f64());
                }
            }
            BuildEvent::Phase { message } => {
                self.end_step();
                if !self.json {
                    eprintln!("… {message}");
                }
            }
            BuildEvent::Done { status, error } => {
                self.end_step();
                return Some((status, error));
            }
        }
        None
    }
}

/// Follow a build's events to its end; the exit status is 0 when it is ready. With
/// `stdout`, the template's name goes there once ready (or with `json` the events); a
/// build inside another command (`lizard up`) leaves stdout to that command's answer.
pub(crate) async fn follow(
    api: &ApiClient,
    ws: &WorkspaceArgs,
    name: &str,
    build_id: &str,
    verbose: bool,
    json: bool,
    stdout: bool,
) -> Result<i32> {
    let call = ws.apply(Call::new(&routes::TEMPLATE_BUILD_EVENTS, &[name, build_id]));
    let mut body = api.send(&call, empty()).await?.into_body();
    let mut display = Display::new(verbose, json);
    let mut buf = Vec::new();
    let mut end = None;
    'read: while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else { continue };
        buf.extend_from_slice(&data);
        while let Some(at) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=at).collect();
            let event: BuildEvent = match serde_json::from_slice(&line) {
                Ok(e) => e,
                Err(e) => {
                    tracing::debug!("skipping an event line this CLI does not know: {e}");
                    continue;
                }
            };
            if let Some(done) = display.show(event) {
                end = Some(done);
                break 'read;
            }
        }
    }
    let elapsed = display.started.elapsed().as_secs_f64();
    let Some((status, error)) = end else {
        bail!("the event stream of build {build_id} ended before the build did; see `lizard template logs {name}`")
    };
    if json {
        return Ok(if status == BuildStatus::Ready { 0 } else { 1 });
    }
    match (status, error) {
        (BuildStatus::Ready, _) => {
            eprintln!("template {name} is ready (build {build_id}, {elapsed:.1}s)");
            if stdout {
                println!("{name}");
            }
            Ok(0)
        }
        (status, error) => {
            let what = format!("{status:?}").to_lowercase();
            eprintln!("build {build_id} of {name} {what} after {elapsed:.1}s");
            if let Some(f) = error {
                print_failure(&f, &display.tail);
            }
            Ok(1)
        }
    }
}

pub(crate) fn print_failure(f: &BuildFailure, local_tail: &VecDeque<String>) {
    match f.step {
        Some(step) => eprintln!("{}: step {step}: {}", f.code, f.message),
        None => eprintln!("{}: {}", f.code, f.message),
    }
    let tail: Vec<String> = match &f.output_tail {
        Some(t) => t.lines().map(str::to_owned).collect(),
        None => local_tail.iter().cloned().collect(),
    };
    if !tail.is_empty() {
        eprintln!("output (last lines):");
        for line in tail {
            eprintln!("  {line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_fold_into_steps_and_a_tail() {
        let mut d = Display::new(false, false);
        d.spinner = None;
        assert!(d.show(BuildEvent::Step { index: 1, total: 1, description: "run x".into(), cached: true }).is_none());
        for chunk in ["a\nb", "\nc\n"] {
            d.show(BuildEvent::Output { stream: OutputStream::Stdout, data: chunk.into() });
        }
        assert_eq!(d.tail, ["a", "b", "c"]);
        let end = d.show(BuildEvent::Done { status: BuildStatus::Failed, error: None });
        assert_eq!(end, Some((BuildStatus::Failed, None)));
    }
}
