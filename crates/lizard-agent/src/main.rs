//! `lizard-agent`: PID 1 of a Lizard guest, or (`serve`) the same service on a Unix
//! socket on the host, for development and tests.

mod app;
mod archive;
mod direct;
mod exec;
mod files;
mod forward;
mod identity;
mod init;
mod metadata;
mod net;
mod ports;
mod processes;
mod pty;
mod quiet;
mod reaper;
mod server;
mod staged;
mod staging_disk;
mod transport;
mod tunnel;
mod users;
mod volume;
mod watch;

use clap::{Parser, Subcommand};
use lizard_agent_proto::handshake::Secret;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

#[derive(Parser)]
#[command(version, about = "The Lizard guest agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve on a Unix socket without touching the system (no mounts, no PID-1 duties).
    Serve {
        /// Socket path to listen on (replaced if it exists).
        #[arg(long)]
        unix: PathBuf,
        /// File holding the session secret in hex.
        #[arg(long)]
        secret_file: PathBuf,
        /// Accept forwarded connections (guest → host) on this address, as a guest's agent
        /// does on 127.0.0.1:49171.
        #[arg(long, value_name = "ADDR")]
        forward_listen: Option<String>,
        /// Use this file as the staging disk of staged file transfers (in a guest, the
        /// disk is found by its header).
        #[arg(long, value_name = "FILE")]
        staging: Option<PathBuf>,
    },
}

/// Why dev mode could not run.
#[derive(Debug, thiserror::Error)]
enum DevError {
    /// The secret file is unreadable or not a hex secret.
    #[error("secret file {path}: {reason}")]
    Secret { path: PathBuf, reason: String },
    /// The runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Reaper(#[from] reaper::ReaperError),
    #[error(transparent)]
    Transport(#[from] transport::TransportError),
    #[error(transparent)]
    Forward(#[from] forward::ForwardError),
}

fn main() {
    if nix::unistd::getpid().as_raw() == 1 {
        init::run();
    }
    let Command::Serve { unix, secret_file, forward_listen, staging } = Cli::parse().command;
    if let Some(file) = staging {
        staging_disk::use_file(file);
    }
    if let Err(e) = serve(unix, secret_file, forward_listen) {
        eprintln!("lizard-agent: {e}");
        std::process::exit(1);
    }
}

fn serve(socket: PathBuf, secret_file: PathBuf, forward_listen: Option<String>) -> Result<(), DevError> {
    let secret = std::fs::read_to_string(&secret_file)
        .map_err(|e| e.to_string())
        .and_then(|s| Secret::from_hex(&s).map_err(|e| e.to_string()))
        .map_err(|reason| DevError::Secret { path: secret_file, reason })?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(DevError::Runtime)?;
    rt.block_on(async {
        // Orphans of our commands come to us, as they would to PID 1.
        reaper::start(true)?;
        if let Some(addr) = &forward_listen {
            forward::start(addr)?;
        }
        let state = app::AppState { secret: Arc::new(RwLock::new(secret)), pid1: false };
        match transport::serve_unix(&socket, state).await? {}
    })
}
