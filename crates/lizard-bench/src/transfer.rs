//! File transfer rows through the HTTP API: 64 MiB written into a sandbox restored from
//! the template snapshot and read back, as an SDK's `files.write` / `files.read` do it
//! (one streamed PUT, one streamed GET on loopback). The node rows of the same transfer
//! stay beside them, so the API's own cost is visible.

use crate::api::Bench;
use anyhow::{ensure, Result};
use lizard_api::routes;
use lizard_node::WriteOptions;

const SIZE: usize = 64 << 20;

/// Write and read rates in MiB/s, `n` of each, in one sandbox of `template`.
pub async fn api_transfers(bench: &Bench, template: &str, n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let id = bench.create(template).await?;
    let (client, base, key) = bench.http();
    let uri = format!("{base}{}?path=/root/bench-api.bin", routes::WRITE_FILE.uri(&[&id]));
    let data = bytes::Bytes::from((0..SIZE).map(|i| (i % 251).to_le_bytes()[0]).collect::<Vec<u8>>());
    let (mut write, mut read) = (vec![], vec![]);
    for i in 0..n {
        let t = std::time::Instant::now();
        let resp = client.put(&uri).header("x-api-key", key).body(data.clone()).send().await?;
        let status = resp.status();
        let text = resp.text().await?;
        ensure!(status.is_success(), "write: {status} {text}");
        write.push(SIZE as f64 / 1048576.0 / t.elapsed().as_secs_f64());

        let t = std::time::Instant::now();
        let mut resp = client.get(&uri).header("x-api-key", key).send().await?;
        ensure!(resp.status().is_success(), "read: {}", resp.status());
        let mut got = 0usize;
        while let Some(chunk) = resp.chunk().await? {
            got += chunk.len();
        }
        ensure!(got == SIZE, "read {got} bytes of {SIZE}");
        read.push(SIZE as f64 / 1048576.0 / t.elapsed().as_secs_f64());
        eprintln!("API transfer {}/{n}: write {:.0} MiB/s, read {:.0} MiB/s", i + 1, write[i], read[i]);
    }
    bench.kill(&id).await?;
    Ok((write, read))
}

/// Node level, the same 64 MiB over the agent channel alone (the path transfers took
/// before the staging disk, and still take where it cannot be used): the baseline the
/// staged node rows are compared with, measured in the same run.
pub async fn channel_transfers(sbx: &lizard_node::Sandbox, n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    use futures_util::StreamExt;
    let agent = sbx.live()?.agent();
    let chunk = bytes::Bytes::from(vec![0x5au8; 1 << 20]);
    let (mut write, mut read) = (vec![], vec![]);
    for _ in 0..n {
        let c = chunk.clone();
        let body = futures_util::stream::iter(0..SIZE / c.len()).map(move |_| Ok::<_, std::io::Error>(c.clone()));
        let t = std::time::Instant::now();
        agent.write_file("/root/bench-channel.bin", &WriteOptions::default(), body).await?;
        write.push(SIZE as f64 / 1048576.0 / t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        let mut file = agent.read_file("/root/bench-channel.bin").await?;
        let mut got = 0usize;
        while let Some(c) = file.next().await {
            got += c?.len();
        }
        ensure!(got == SIZE, "read {got} bytes of {SIZE}");
        read.push(SIZE as f64 / 1048576.0 / t.elapsed().as_secs_f64());
    }
    Ok((write, read))
}
