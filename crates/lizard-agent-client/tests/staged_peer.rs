//! The host's end of staged transfers against a fake agent that answers what each test
//! wants: an agent without staged routes (fallback), and agents that lie in their notices
//! (windows outside the slot, more bytes than announced, a wrong total), which must fail
//! the transfer instead of reading outside the staging file's slot.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a panic is the failure report

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use lizard_agent_client::WriteOptions;
use lizard_agent_client::{AgentClient, ClientError, Secret, StagingFile, TransferPath};
use lizard_agent_proto::staging::{encode, AgentMsg};

/// A client connected to a fake agent whose every answer is `answer(request)`.
async fn fake_agent(answer: fn(&Request<Incoming>) -> Response<Full<Bytes>>) -> AgentClient {
    let secret = Secret::generate();
    let (host, mut guest) = tokio::io::duplex(1 << 20);
    let s2 = secret.clone();
    tokio::spawn(async move {
        lizard_agent_proto::handshake::agent_accept(&mut guest, &s2, |_| Err::<(), &str>("no identity expected"))
            .await
            .unwrap();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| async move {
            Ok::<_, std::convert::Infallible>(answer(&req))
        });
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(guest), service)
            .await;
    });
    AgentClient::connect(host, &secret).await.unwrap()
}

/// A staged read answer carrying `notices`, or the plain read's bytes `plain`.
fn notices(req: &Request<Incoming>, notices: &[AgentMsg], length: Option<u64>) -> Response<Full<Bytes>> {
    if !req.uri().path().contains("/staged/") {
        return Response::new(Full::new(Bytes::from_static(b"plain")));
    }
    let body: Vec<u8> = notices.iter().flat_map(|m| encode(m).to_vec()).collect();
    let mut resp = Response::builder().header("x-lizard-staged", "1");
    if let Some(n) = length {
        resp = resp.header(lizard_agent_proto::staging::LENGTH_HEADER, n);
    }
    resp.body(Full::new(Bytes::from(body))).unwrap()
}

async fn read_all(client: &AgentClient, staging: &StagingFile) -> (Result<Vec<u8>, ClientError>, TransferPath) {
    let (mut file, how) = client.read_file_via(Some(staging), "/f").await.unwrap();
    let mut all = vec![];
    while let Some(c) = file.next().await {
        match c {
            Ok(c) => all.extend_from_slice(&c),
            Err(e) => return (Err(e), how),
        }
    }
    (Ok(all), how)
}

fn staging() -> (tempfile::TempDir, StagingFile) {
    let dir = tempfile::tempdir().unwrap();
    let file = StagingFile::create(&dir.path().join("staging.img")).unwrap();
    (dir, file)
}

#[tokio::test]
async fn an_agent_without_staged_routes_gets_the_plain_transfer() {
    let client = fake_agent(|req| {
        if req.uri().path().contains("/staged/") {
            // An older agent: a 404 without the staged marker.
            let e = br#"{"code":"NOT_FOUND","message":"no such route"}"#;
            return Response::builder().status(404).body(Full::new(Bytes::from_static(e))).unwrap();
        }
        Response::new(Full::new(Bytes::from_static(b"plain")))
    })
    .await;
    let (_dir, staging) = staging();
    let (got, how) = read_all(&client, &staging).await;
    assert_eq!((got.unwrap(), how), (b"plain".to_vec(), TransferPath::Channel));
}

#[tokio::test]
async fn a_staged_error_answer_is_the_transfers_error() {
    let client = fake_agent(|_| {
        let e = br#"{"code":"NOT_FOUND","message":"/f: gone"}"#;
        Response::builder().status(404).header("x-lizard-staged", "1").body(Full::new(Bytes::from_static(e))).unwrap()
    })
    .await;
    let (_dir, staging) = staging();
    let r = client.read_file_via(Some(&staging), "/f").await;
    assert!(matches!(r, Err(ClientError::Agent(ref e)) if e.message == "/f: gone"));
}

#[tokio::test]
async fn lying_notices_fail_the_read() {
    let (_dir, staging) = staging();
    // A window outside the slot.
    let client = fake_agent(|r| notices(r, &[AgentMsg::Chunk { window: 7, len: 1 }], None)).await;
    assert!(matches!(read_all(&client, &staging).await.0, Err(ClientError::Protocol(_))));
    // A chunk longer than a window.
    let client = fake_agent(|r| notices(r, &[AgentMsg::Chunk { window: 0, len: 5 << 20 }], None)).await;
    assert!(matches!(read_all(&client, &staging).await.0, Err(ClientError::Protocol(_))));
    // More than the announced length.
    let client = fake_agent(|r| notices(r, &[AgentMsg::Chunk { window: 0, len: 10 }], Some(4))).await;
    assert!(matches!(read_all(&client, &staging).await.0, Err(ClientError::Protocol(_))));
    // An end that does not match what was sent.
    let client =
        fake_agent(|r| notices(r, &[AgentMsg::Chunk { window: 0, len: 3 }, AgentMsg::End { bytes: 9 }], None)).await;
    assert!(matches!(read_all(&client, &staging).await.0, Err(ClientError::Protocol(_))));
    // A body that stops without an end.
    let client = fake_agent(|r| notices(r, &[AgentMsg::Chunk { window: 0, len: 3 }], None)).await;
    assert!(read_all(&client, &staging).await.0.is_err());
    // Garbage instead of a notice.
    let client = fake_agent(|r| {
        let mut resp = notices(r, &[], None);
        *resp.body_mut() = Full::new(Bytes::from_static(b"{\"nonsense\":1}\n"));
        resp
    })
    .await;
    assert!(matches!(read_all(&client, &staging).await.0, Err(ClientError::Protocol(_))));
    // An honest one, for contrast: three zero bytes (the window is still empty).
    let client =
        fake_agent(|r| notices(r, &[AgentMsg::Chunk { window: 1, len: 3 }, AgentMsg::End { bytes: 3 }], Some(3))).await;
    let (got, how) = read_all(&client, &staging).await;
    assert_eq!((got.unwrap(), how), (vec![0u8; 3], TransferPath::Staged));
}

#[tokio::test]
async fn a_write_answered_out_of_turn_fails() {
    let (_dir, staging) = staging();
    // The agent claims the write is done before the host sent its end.
    let client = fake_agent(|r| notices(r, &[AgentMsg::Chunk { window: 0, len: 1 }], None)).await;
    let body = futures_util::stream::iter([Ok(Bytes::from_static(b"data"))]);
    let r = client.write_file_via(Some(&staging), "/f", &WriteOptions::default(), body).await;
    assert!(matches!(r, Err(ClientError::Protocol(_))), "{:?}", r.map(|(w, _)| w));
}
