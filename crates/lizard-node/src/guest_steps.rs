//! What a build step does inside the build VM, through its agent: run a command (its
//! output streamed as build events, its tail kept for a failure) and copy files of the
//! pushed directory in.

use crate::error::BuildError;
use crate::{NodeError, Result};
use futures_util::StreamExt;
use lizard_agent_client::{AgentClient, ClientError, ExecEvent, NoStdin};
use lizard_agent_proto::types::ExecRequest;
use lizard_api::templates::{BuildEvent, OutputStream};
use lizard_recipe::{Command, Context, Copy, EntryKind};
use std::collections::VecDeque;
use std::path::Path;
use tokio::sync::mpsc::UnboundedSender;

/// Lines of output a failed step shows.
const TAIL_LINES: usize = 50;
/// Bytes of output kept to find them in.
const TAIL_BYTES: usize = 16 << 10;
/// Paths per `chmod`/`chown` command (well under the guest's argument limit).
const PATHS_PER_EXEC: usize = 500;

/// The step being run, for its events and errors.
pub(crate) struct StepRef<'a> {
    pub index: u32,
    pub description: &'a str,
    pub events: &'a UnboundedSender<BuildEvent>,
}

impl StepRef<'_> {
    fn failed(&self, reason: String, output_tail: String) -> NodeError {
        BuildError::StepFailed { step: self.index, description: self.description.to_owned(), reason, output_tail }
            .into()
    }

    /// An agent failure: the command could not run (its reason is the step's), or the
    /// channel broke (the node's).
    fn agent_failed(&self, e: ClientError, tail: String) -> NodeError {
        match e {
            ClientError::Agent(a) => self.failed(a.message, tail),
            other => NodeError::AgentUnavailable(other),
        }
    }
}

/// The end of a command's output, both streams in the order they came.
#[derive(Default)]
struct Tail(VecDeque<u8>);

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.0.extend(bytes);
        let excess = self.0.len().saturating_sub(TAIL_BYTES);
        self.0.drain(..excess);
    }

    fn lines(&self) -> String {
        let (a, b) = self.0.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
    }
}

/// Turns one stream's chunks into text without splitting a character: the bytes of a
/// multi-byte character cut off at a chunk's end wait for the next chunk. Bytes that are
/// not UTF-8 at all become U+FFFD.
#[derive(Default)]
struct Utf8Chunks(Vec<u8>);

impl Utf8Chunks {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.0.extend_from_slice(bytes);
        let complete = match std::str::from_utf8(&self.0) {
            Ok(_) => self.0.len(),
            // `error_len() == None`: the input ends inside a character.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.0.len(),
        };
        let rest = self.0.split_off(complete);
        let text = String::from_utf8_lossy(&self.0).into_owned();
        self.0 = rest;
        text
    }

    /// What is left when the stream ends (an incomplete character, as U+FFFD).
    fn finish(&mut self) -> Option<String> {
        (!self.0.is_empty()).then(|| String::from_utf8_lossy(&std::mem::take(&mut self.0)).into_owned())
    }
}

/// Run `cmd` to its end, streaming its output as `Output` events; non-zero is the
/// step's failure.
pub(crate) async fn exec(agent: &AgentClient, step: &StepRef<'_>, cmd: &Command) -> Result<()> {
    let req = ExecRequest {
        argv: Some(cmd.argv.clone()),
        env: cmd.env.clone(),
        cwd: Some(cmd.cwd.clone()),
        user: Some(cmd.user.clone()),
        ..Default::default()
    };
    let mut stream = agent.exec(req, None::<NoStdin>).await.map_err(|e| step.agent_failed(e, String::new()))?;
    let mut tail = Tail::default();
    let (mut stdout, mut stderr) = (Utf8Chunks::default(), Utf8Chunks::default());
    let send = |stream, data: String| {
        if !data.is_empty() {
            let _ = step.events.send(BuildEvent::Output { stream, data });
        }
    };
    while let Some(event) = stream.next().await {
        let (stream, text, bytes) = match event {
            ExecEvent::Stdout(b) => (OutputStream::Stdout, &mut stdout, b),
            ExecEvent::Stderr(b) => (OutputStream::Stderr, &mut stderr, b),
        };
        tail.push(&bytes);
        send(stream, text.push(&bytes));
    }
    for (stream, text) in [(OutputStream::Stdout, &mut stdout), (OutputStream::Stderr, &mut stderr)] {
        if let Some(rest) = text.finish() {
            send(stream, rest);
        }
    }
    let status = stream.wait().await.map_err(|e| step.agent_failed(e, tail.lines()))?;
    if status.exit_code != 0 {
        return Err(step.failed(format!("exit code {}", status.exit_code), tail.lines()));
    }
    Ok(())
}

/// Run a helper command as root; its failure is the step's.
async fn helper(agent: &AgentClient, step: &StepRef<'_>, argv: Vec<String>) -> Result<()> {
    let req = ExecRequest { argv: Some(argv), ..Default::default() };
    let out = agent.exec_collect(req).await.map_err(|e| step.agent_failed(e, String::new()))?;
    if out.status.exit_code != 0 {
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        return Err(step.failed(format!("exit code {}", out.status.exit_code), text));
    }
    Ok(())
}

/// Where each copied path goes: a directory's content lands in `dest`; a single file
/// lands at `dest`, or in it when `dest` ends with `/`.
fn destination(src: &str, own_is_dir: bool, dest: &str, path: &str) -> String {
    let dest_dir = dest.trim_end_matches('/');
    if own_is_dir {
        let below = if src.is_empty() { path } else { path.strip_prefix(src).unwrap_or(path).trim_start_matches('/') };
        if below.is_empty() {
            return if dest_dir.is_empty() { "/".into() } else { dest_dir.to_owned() };
        }
        return format!("{dest_dir}/{below}");
    }
    if dest.ends_with('/') {
        let name = path.rsplit('/').next().unwrap_or(path);
        format!("{dest_dir}/{name}")
    } else {
        dest.to_owned()
    }
}

/// Copy what `copy` takes from the context into the guest: files (their content from
/// `blobs/<sha256>`, their mode), directories (made, then given their mode), symlinks
/// (recreated; ones pointing out were refused by the plan), then the owner.
pub(crate) async fn copy(
    agent: &AgentClient,
    step: &StepRef<'_>,
    copy: &Copy,
    context: &Context,
    blobs: &Path,
) -> Result<()> {
    let refused = |e: lizard_recipe::ContextError| -> NodeError {
        BuildError::CopyRefused { step: step.index, description: step.description.to_owned(), reason: e.to_string() }
            .into()
    };
    let src = lizard_recipe::context::normalize(&copy.src).map_err(refused)?;
    let entries = context.select(&copy.src).map_err(refused)?;
    let own_is_dir = src.is_empty() || entries.first().is_some_and(|e| matches!(e.kind, EntryKind::Dir));
    let mut dirs: Vec<(u32, String)> = Vec::new();
    let mut copied: Vec<String> = Vec::new();
    if own_is_dir && src.is_empty() {
        let root = destination(&src, true, &copy.dest, "");
        agent.make_dir(&root, None).await.map_err(|e| step.agent_failed(e, String::new()))?;
        copied.push(root);
    }
    for entry in entries {
        let target = destination(&src, own_is_dir, &copy.dest, &entry.path);
        match &entry.kind {
            EntryKind::Dir => {
                agent.make_dir(&target, None).await.map_err(|e| step.agent_failed(e, String::new()))?;
                dirs.push((entry.mode, target.clone()));
            }
            EntryKind::File { sha256, .. } => {
                let blob = blobs.join(sha256);
                let file = tokio::fs::File::open(&blob)
                    .await
                    .map_err(|e| NodeError::io(format!("open context file {}", blob.display()), e))?;
                let body = tokio_util::io::ReaderStream::new(file);
                agent
                    .write_file(&target, &lizard_agent_client::WriteOptions::mode(Some(entry.mode)), body)
                    .await
                    .map_err(|e| step.agent_failed(e, String::new()))?;
            }
            EntryKind::Symlink { target: link, .. } => {
                let argv = ["ln", "-sfn", "--", link, &target].map(String::from).to_vec();
                helper(agent, step, argv).await?;
            }
        }
        copied.push(target);
    }
    // Modes of directories last: a read-only one would refuse the files put in it.
    for chunk in dirs.chunks(PATHS_PER_EXEC) {
        let mut argv: Vec<String> =
            ["sh", "-c", "while [ $# -gt 1 ]; do chmod \"$1\" \"$2\" || exit 1; shift 2; done", "chmod"]
                .map(String::from)
                .to_vec();
        for (mode, path) in chunk {
            argv.push(format!("{mode:o}"));
            argv.push(path.clone());
        }
        helper(agent, step, argv).await?;
    }
    if let Some(owner) = &copy.owner {
        for chunk in copied.chunks(PATHS_PER_EXEC) {
            let mut argv: Vec<String> = ["chown", "-h", owner.as_str(), "--"].map(String::from).to_vec();
            argv.extend(chunk.iter().cloned());
            helper(agent, step, argv).await?;
        }
    }
    Ok(())
}

/// Make `dir` (a `workdir` step: later steps and sandboxes start there).
pub(crate) async fn make_workdir(agent: &AgentClient, step: &StepRef<'_>, dir: &str) -> Result<()> {
    agent.make_dir(dir, None).await.map_err(|e| step.agent_failed(e, String::new()))
}

/// Have the guest write its caches to the disk (before a layer is frozen), and hand back
/// the blocks of files the step deleted (apt lists, package caches): the disk discards
/// them, so the layer does not keep what the guest no longer has. A guest or disk
/// without discard support only skips that part.
pub(crate) async fn sync(agent: &AgentClient, step: &StepRef<'_>) -> Result<()> {
    let argv = ["sh", "-c", "sync && { fstrim / 2>/dev/null; sync; }"].map(String::from).to_vec();
    helper(agent, step, argv).await
}

#[cfg(test)]
mod tests {

    #[test]
    fn characters_split_between_chunks_stay_whole() {
        let mut t = super::Utf8Chunks::default();
        let word = "größe ✓".as_bytes();
        // Cut inside "ö" (2 bytes) and inside "✓" (3 bytes).
        let (a, rest) = word.split_at(3);
        let (b, c) = rest.split_at(rest.len() - 1);
        let text = [t.push(a), t.push(b), t.push(c)].concat();
        assert_eq!(text, "größe ✓");
        assert_eq!(t.finish(), None);
        // Bytes that are no UTF-8 become U+FFFD and do not hold back what follows.
        assert_eq!(t.push(b"a\xffb"), "a\u{fffd}b");
        // A stream that ends inside a character says so.
        assert_eq!(t.push(&"✓".as_bytes()[..2]), "");
        assert_eq!(t.finish().as_deref(), Some("\u{fffd}"));
    }

    use super::*;

    #[test]
    fn directories_land_in_dest_and_files_at_or_in_it() {
        assert_eq!(destination("tools", true, "/opt/tools/", "tools"), "/opt/tools");
        assert_eq!(destination("tools", true, "/opt/tools/", "tools/bin/run.sh"), "/opt/tools/bin/run.sh");
        assert_eq!(destination("tools", true, "/opt/tools", "tools/a"), "/opt/tools/a");
        assert_eq!(destination("", true, "/srv", "a/b"), "/srv/a/b");
        assert_eq!(destination("", true, "/", ""), "/");
        assert_eq!(destination("a/setup.sh", false, "/usr/local/bin/", "a/setup.sh"), "/usr/local/bin/setup.sh");
        assert_eq!(destination("a/setup.sh", false, "/usr/local/bin/setup", "a/setup.sh"), "/usr/local/bin/setup");
    }

    #[test]
    fn the_tail_is_the_last_lines() {
        let mut tail = Tail::default();
        for i in 0..200 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        let lines = tail.lines();
        assert!(lines.starts_with("line 150\n") && lines.ends_with("line 199"), "{lines}");
        let mut big = Tail::default();
        big.push(&vec![b'x'; 3 * TAIL_BYTES]);
        assert_eq!(big.0.len(), TAIL_BYTES);
    }
}
