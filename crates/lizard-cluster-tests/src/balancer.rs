//! The load balancer an operator puts in front of the replicas, as small as a test needs:
//! each TCP connection goes to the first replica that accepts it, so node agents and guests
//! keep reaching the API when one replica dies.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// How long one replica may take to accept before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A listening balancer; it stops when dropped.
pub struct Balancer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Balancer {
    /// Listen on a free loopback port and forward to `upstreams`, in order of preference.
    pub async fn start(upstreams: Vec<SocketAddr>) -> Balancer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the balancer");
        let addr = listener.local_addr().expect("bound");
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstreams = upstreams.clone();
                tokio::spawn(async move {
                    let Some(mut upstream) = first_reachable(&upstreams).await else { return };
                    let mut client = client;
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
            }
        });
        Balancer { addr, task }
    }
}

async fn first_reachable(upstreams: &[SocketAddr]) -> Option<TcpStream> {
    for addr in upstreams {
        if let Ok(Ok(stream)) = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            return Some(stream);
        }
    }
    None
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
