//! The relay's per-stream queues, end to end in process: our registry, our
//! executor whose streams flood their harness, and harnesses that read or
//! do not.

use crate::executor::{self, StreamHandler};
use crate::harness;
use crate::keys::Identity;
use crate::noise::OsRandom;
use crate::registry::store::MemoryStore;
use crate::registry::{Config, Registry};
use crate::registry_client::RegistryClient;
use crate::stream::Channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Each stream, once its harness says anything, sends 64 KiB messages for
/// as long as the stream lasts.
fn flood_handler() -> StreamHandler {
    Arc::new(|mut ch: Channel| {
        tokio::spawn(async move {
            if ch.inbound.recv().await.is_none() {
                return;
            }
            let chunk = vec![7u8; 64 << 10];
            while ch.outbound.send(chunk.clone()).await.is_ok() {}
        });
    })
}

async fn harness_stream(client: &RegistryClient, env: &str) -> Channel {
    let me = Identity::generate(&mut OsRandom);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match harness::connect(client, env, &me).await {
            Ok(ch) => return ch,
            Err(e) => assert!(Instant::now() < deadline, "executor never attached: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two streams on one executor, one harness stops reading: the other keeps
/// at least half the throughput it had alone (the relay's executor reader
/// used to wait on the stalled harness's queue, stalling every stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_harness_does_not_hold_the_executors_other_streams() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let reg = Registry::new(
        Config::default(),
        Arc::new(MemoryStore::default()),
        format!("ws://{addr}"),
    )
    .await
    .unwrap();
    tokio::spawn(reg.serve(l));
    let base = format!("http://{addr}");
    let config = executor::Config {
        registry: RegistryClient::new(&base, "exec", None, true).unwrap(),
        environment_id: "flood".into(),
        keepalive: executor::KEEPALIVE,
        pong_timeout: executor::PONG_TIMEOUT,
        observer: Arc::new(executor::NoObserver),
    };
    let exec = tokio::spawn(executor::run(config, flood_handler()));
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    let mut reader = harness_stream(&client, "flood").await;
    reader.outbound.send(b"go".to_vec()).await.unwrap();
    // Read all along, also while the other stream is being opened.
    let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = read.clone();
    let reading = tokio::spawn(async move {
        while let Some(m) = reader.inbound.recv().await {
            counter.fetch_add(m.len(), std::sync::atomic::Ordering::Relaxed);
        }
    });
    let bytes_in = |span: Duration| {
        let read = read.clone();
        async move {
            let before = read.load(std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(span).await;
            read.load(std::sync::atomic::Ordering::Relaxed) - before
        }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let alone = bytes_in(Duration::from_secs(1)).await;
    let stalled = harness_stream(&client, "flood").await;
    stalled.outbound.send(b"go".to_vec()).await.unwrap();
    // `stalled` is never read from here on: its queue fills and the relay
    // resets it (its client would resume on a new stream).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let shared = bytes_in(Duration::from_secs(2)).await / 2;
    eprintln!("alone {alone} B/s, beside a stalled stream {shared} B/s");
    assert!(
        shared * 2 >= alone,
        "alone {alone} B/s, beside a stalled stream {shared} B/s"
    );
    reading.abort();
    drop(stalled);
    exec.abort();
}
