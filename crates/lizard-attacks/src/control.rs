//! The control plane under faults: a client that vanishes mid-request, a server killed
//! with SIGKILL and started again on its data directory, a VMM killed under a sandbox,
//! and the bookkeeping checks after them (what runs is what is recorded and billed; the
//! balance is the sum of the ledger).

use crate::system::System;
use reqwest::Method;
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Send `request` (a whole HTTP/1.1 request) to the API, then close the connection
/// after `after` without reading the answer: a client that gives up mid-request.
pub async fn send_and_vanish(system: &System, request: &str, after: Duration) {
    let addr = system.api.strip_prefix("http://").expect("an http API address");
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect to the API");
    conn.write_all(request.as_bytes()).await.expect("send the request");
    tokio::time::sleep(after).await;
    drop(conn);
}

/// A `POST /v1/sandboxes` of `template` in the harness's project, as raw HTTP.
pub fn raw_create(system: &System, template: &str) -> String {
    let body = serde_json::json!({"template": template, "projectId": system.project}).to_string();
    format!(
        "POST /v1/sandboxes HTTP/1.1\r\nHost: lizard\r\nX-API-Key: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        system.key,
        body.len()
    )
}

/// Ids of the sandboxes the API lists.
pub async fn listed(system: &System) -> Vec<String> {
    let (status, list) = system.call(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, 200, "{list}");
    ids_of(&list)
}

/// Ids of the sandboxes billing meters now (`/v1/billing/live`).
pub async fn billed(system: &System) -> Vec<String> {
    let (status, live) = system.call(Method::GET, "/v1/billing/live", None).await;
    assert_eq!(status, 200, "{live}");
    ids_of(&live["sandboxes"])
}

fn ids_of(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> = list
        .as_array()
        .map(|a| a.iter().filter_map(|s| s["sandboxId"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

/// The account's balance, in nano-dollars.
pub async fn balance(system: &System) -> i64 {
    let (status, b) = system.call(Method::GET, "/v1/billing/balance", None).await;
    assert_eq!(status, 200, "{b}");
    b["balanceNanos"].as_i64().expect("balanceNanos")
}

/// The sum of every ledger entry the API lists (following cursors, bounded).
pub async fn ledger_sum(system: &System) -> i64 {
    let mut sum = 0i64;
    let mut cursor: Option<String> = None;
    for _ in 0..1_000 {
        let mut uri = "/v1/billing/transactions?includeUsage=true&limit=1000".to_string();
        if let Some(c) = &cursor {
            uri.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = system.call(Method::GET, &uri, None).await;
        assert_eq!(status, 200, "{page}");
        sum += page["items"].as_array().expect("items").iter().filter_map(|t| t["amountNanos"].as_i64()).sum::<i64>();
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return sum,
        }
    }
    panic!("the ledger's pages did not end");
}

/// Assert that the balance is the sum of the ledger (read until metering holds still
/// between the reads).
pub async fn assert_balance_is_ledger_sum(system: &System) {
    for _ in 0..20 {
        let before = balance(system).await;
        let sum = ledger_sum(system).await;
        if balance(system).await == before {
            assert_eq!(before, sum, "the balance is the sum of the ledger");
            return;
        }
    }
    panic!("the balance never held still");
}

/// The pid of the QEMU that runs sandbox `id`.
pub fn vmm_pid_of(system: &System, id: &str) -> Option<u32> {
    crate::leftovers::vmm_pids(system.data_dir()).into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(id))
    })
}

/// Wait until `done` holds (polled every 100 ms) or `limit` passes; whether it held.
pub async fn eventually<F, Fut>(limit: Duration, mut done: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if done().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
