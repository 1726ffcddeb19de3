//! The scenarios. Each checks its own result (byte counts, content, exit codes),
//! so a fast wrong answer fails instead of winning.

pub use crate::local::local;
use crate::server::Running;
use crate::wire::{request_ending_in_base64, start_params, wait_closed, Conn, Response};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) const STREAM_BYTES: usize = 256 * 1024 * 1024;
pub(crate) const FILE_BYTES: usize = 64 * 1024 * 1024;
const BLOCK: usize = 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Connect,
    Spawn,
    /// `spawn` with every `limits` member set (none fires): their cost.
    SpawnLimited,
    SpawnConcurrent,
    SpawnPipelined,
    Stream,
    FsRead,
    FsWrite,
    FsReadBlocks,
    FsWriteBlocks,
    ManyProcs,
    IdleConns,
    SpawnSandboxed,
    SpawnSandboxedPaced,
    ShellSnapshot,
}

impl Scenario {
    pub const ALL: [Scenario; 15] = [
        Scenario::Connect,
        Scenario::Spawn,
        Scenario::SpawnLimited,
        Scenario::SpawnConcurrent,
        Scenario::SpawnPipelined,
        Scenario::Stream,
        Scenario::FsRead,
        Scenario::FsWrite,
        Scenario::FsReadBlocks,
        Scenario::FsWriteBlocks,
        Scenario::ManyProcs,
        Scenario::IdleConns,
        Scenario::SpawnSandboxed,
        Scenario::SpawnSandboxedPaced,
        Scenario::ShellSnapshot,
    ];

    pub fn parse(s: &str) -> Result<Scenario, String> {
        Scenario::ALL
            .iter()
            .copied()
            .find(|x| x.name() == s)
            .ok_or(format!("unknown scenario `{s}`"))
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Connect => "connect",
            Scenario::Spawn => "spawn",
            Scenario::SpawnLimited => "spawn-limited",
            Scenario::SpawnConcurrent => "spawn-concurrent",
            Scenario::SpawnPipelined => "spawn-pipelined",
            Scenario::Stream => "stream",
            Scenario::FsRead => "fsread",
            Scenario::FsWrite => "fswrite",
            Scenario::FsReadBlocks => "fsread-blocks",
            Scenario::FsWriteBlocks => "fswrite-blocks",
            Scenario::ManyProcs => "many-procs",
            Scenario::IdleConns => "idle-conns",
            Scenario::SpawnSandboxed => "spawn-sandboxed",
            Scenario::SpawnSandboxedPaced => "spawn-sandboxed-paced",
            Scenario::ShellSnapshot => "shell-snapshot",
        }
    }

    pub fn metrics(self) -> &'static [&'static str] {
        match self {
            Scenario::Connect
            | Scenario::Spawn
            | Scenario::SpawnLimited
            | Scenario::SpawnSandboxed
            | Scenario::SpawnSandboxedPaced => &["p50 ms", "p99 ms"],
            Scenario::SpawnConcurrent | Scenario::SpawnPipelined => &["ops/s"],
            Scenario::Stream
            | Scenario::FsRead
            | Scenario::FsWrite
            | Scenario::FsReadBlocks
            | Scenario::FsWriteBlocks => &["MiB/s", "server peak RSS MiB", "server CPU ms"],
            Scenario::ManyProcs => &["wall ms", "server peak RSS MiB", "server CPU ms"],
            Scenario::IdleConns => &["KiB RSS / connection"],
            Scenario::ShellSnapshot => &["snapshot p50 ms", "login shell p50 ms"],
        }
    }
}

/// One run's figures, in the order of `metrics()`.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub values: Vec<f64>,
    pub error: Option<String>,
}

impl Outcome {
    pub(crate) fn of(values: Vec<f64>) -> Outcome {
        Outcome {
            values,
            error: None,
        }
    }
    pub fn failed(e: String) -> Outcome {
        Outcome {
            values: vec![],
            error: Some(e),
        }
    }
    pub fn describe(&self) -> String {
        self.values
            .iter()
            .map(|v| format!("{v:.2}"))
            .collect::<Vec<_>>()
            .join(" / ")
    }
}

pub(crate) fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

/// What a server used while a scenario's timed part ran.
struct Usage {
    /// Peak resident memory, MiB (sampled every 5 ms).
    peak_rss_mib: f64,
    /// CPU time of all its threads, ms (NaN where it cannot be read).
    cpu_ms: f64,
}

/// Runs `f` while sampling the server's RSS every 5 ms; returns f's result
/// and what the server used meanwhile.
async fn with_usage<T>(srv: &Running, f: impl std::future::Future<Output = T>) -> (T, Usage) {
    let pid = srv.pid();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let sampler = tokio::spawn(async move {
        let mut peak = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(r) = pid.and_then(|p| crate::server::status_field(p, "VmRSS:")) {
                peak = peak.max(r);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        peak
    });
    let cpu_before = pid.and_then(crate::server::cpu_ns);
    let out = f.await;
    let cpu_ms = match (cpu_before, pid.and_then(crate::server::cpu_ns)) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e6,
        _ => f64::NAN,
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.await.unwrap_or(0);
    let usage = Usage {
        peak_rss_mib: peak as f64 / 1024.0,
        cpu_ms,
    };
    (out, usage)
}

async fn spawn_true(c: &Conn, id: &str) -> Result<f64, String> {
    spawn_true_with(c, id, None).await
}

/// [`spawn_true`] with `limits` in its params.
async fn spawn_true_with(c: &Conn, id: &str, limits: Option<Value>) -> Result<f64, String> {
    let mut params = start_params(id, &["true"]);
    if let Some(l) = limits {
        params["limits"] = l;
    }
    let t0 = Instant::now();
    c.call("process/start", params).await?;
    let (_, exit) = wait_closed(c, id).await?;
    if exit != Some(0) {
        return Err(format!("{id}: exit {exit:?}"));
    }
    Ok(t0.elapsed().as_secs_f64() * 1000.0)
}

pub(crate) fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("es-bench-{tag}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

pub(crate) fn pattern(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1])
        .collect()
}

pub async fn run(sc: Scenario, srv: &Running) -> Result<Outcome, String> {
    let url = srv.url.clone();
    match sc {
        Scenario::ShellSnapshot => {
            let c = Conn::open(&url).await?;
            let (snapshot, login) = crate::snapshot::latencies(&c).await?;
            Ok(Outcome::of(vec![snapshot, login]))
        }
        Scenario::SpawnSandboxed => {
            let c = Conn::open(&url).await?;
            let lat = crate::sandboxed::spawn_latencies(&c, 300, None).await?;
            Ok(Outcome::of(vec![pct(lat.clone(), 0.5), pct(lat, 0.99)]))
        }
        Scenario::SpawnSandboxedPaced => {
            let c = Conn::open(&url).await?;
            let pause = Some(crate::sandboxed::PACE);
            let lat = crate::sandboxed::spawn_latencies(&c, 100, pause).await?;
            Ok(Outcome::of(vec![pct(lat.clone(), 0.5), pct(lat, 0.99)]))
        }
        Scenario::Connect => {
            let mut lat = Vec::new();
            for _ in 0..200 {
                let t0 = Instant::now();
                let c = Conn::open(&url).await?;
                lat.push(t0.elapsed().as_secs_f64() * 1000.0);
                drop(c);
            }
            Ok(Outcome::of(vec![pct(lat.clone(), 0.5), pct(lat, 0.99)]))
        }
        Scenario::Spawn | Scenario::SpawnLimited => {
            let c = Conn::open(&url).await?;
            let limits = (sc == Scenario::SpawnLimited).then(|| {
                json!({
                    "timeoutMs": 600_000,
                    "idleTimeoutMs": 600_000,
                    "maxOutputBytes": 1u64 << 30,
                    "memoryBytes": 2u64 << 30,
                    "maxTasks": 512,
                    "cpuPercent": 200,
                })
            });
            let mut lat = Vec::new();
            for i in 0..300 {
                let id = format!("t{i}");
                lat.push(spawn_true_with(&c, &id, limits.clone()).await?);
                // The reference keeps finished processes; terminate as the Codex CLI does.
                c.call("process/terminate", json!({"processId": id}))
                    .await?;
            }
            Ok(Outcome::of(vec![pct(lat.clone(), 0.5), pct(lat, 0.99)]))
        }
        Scenario::SpawnConcurrent => {
            let t0 = Instant::now();
            let mut tasks = Vec::new();
            for k in 0..64 {
                let url = url.clone();
                tasks.push(tokio::spawn(async move {
                    let c = Conn::open(&url).await?;
                    for i in 0..20 {
                        spawn_true(&c, &format!("c{k}-{i}")).await?;
                    }
                    Ok::<_, String>(())
                }));
            }
            for t in tasks {
                t.await.map_err(|e| e.to_string())??;
            }
            Ok(Outcome::of(vec![64.0 * 20.0 / t0.elapsed().as_secs_f64()]))
        }
        Scenario::SpawnPipelined => {
            let c = Conn::open(&url).await?;
            let total = 640;
            let t0 = Instant::now();
            let mut notes = c.notes.lock().await;
            let mut started = 0;
            let mut closed = 0;
            let mut pending = Vec::new();
            while started < 64 {
                pending.push(
                    c.send(
                        "process/start",
                        start_params(&format!("q{started}"), &["true"]),
                    )
                    .await?,
                );
                started += 1;
            }
            while closed < total {
                let n = tokio::time::timeout(Duration::from_secs(60), notes.recv())
                    .await
                    .map_err(|_| "timeout")?
                    .ok_or("closed")?;
                if n.method == "process/exited" && n.exit_code != Some(0) {
                    return Err(format!("bad exit: {n:?}"));
                }
                if n.method == "process/closed" {
                    closed += 1;
                    if started < total {
                        pending.push(
                            c.send(
                                "process/start",
                                start_params(&format!("q{started}"), &["true"]),
                            )
                            .await?,
                        );
                        started += 1;
                    }
                }
            }
            for p in pending {
                let r = p.await.map_err(|_| "closed")?;
                r.result_text()?;
            }
            Ok(Outcome::of(vec![total as f64 / t0.elapsed().as_secs_f64()]))
        }
        Scenario::Stream => {
            let c = Conn::open(&url).await?;
            let (r, usage) = with_usage(srv, async {
                let t0 = Instant::now();
                c.call(
                    "process/start",
                    start_params("s", &["head", "-c", &STREAM_BYTES.to_string(), "/dev/zero"]),
                )
                .await?;
                let (bytes, exit) = wait_closed(&c, "s").await?;
                if exit != Some(0) {
                    return Err(format!("exit {exit:?}"));
                }
                Ok::<_, String>((bytes, t0.elapsed().as_secs_f64()))
            })
            .await;
            let (bytes, secs) = r?;
            if bytes != STREAM_BYTES {
                return Err(format!("received {bytes} of {STREAM_BYTES} bytes"));
            }
            Ok(Outcome::of(vec![
                bytes as f64 / 1048576.0 / secs,
                usage.peak_rss_mib,
                usage.cpu_ms,
            ]))
        }
        Scenario::FsRead | Scenario::FsReadBlocks => {
            let d = scratch("read");
            let f = d.join("in");
            let data = pattern(FILE_BYTES);
            std::fs::write(&f, &data).map_err(|e| e.to_string())?;
            let uri = format!("file://{}", f.display());
            let c = Conn::open(&url).await?;
            // Decoded into memory touched before the clock starts: the figure
            // is the transfer's, not the first touch of 64 MiB by the client
            // (as long as the transfer itself on this machine), and the same
            // for every server. (+ 3: a decoder wants room for padding.)
            let mut sink = vec![1u8; FILE_BYTES + 3];
            let (got, usage) = with_usage(srv, async {
                let t0 = Instant::now();
                let n = if sc == Scenario::FsRead {
                    let r = c.call_raw("fs/readFile", json!({"path": uri})).await?;
                    r.result_text()?;
                    let text = r
                        .result_member("dataBase64")
                        .and_then(exec_server_fastpath::skim::plain_string)
                        .ok_or("readFile: result without a plain string `dataBase64`")?;
                    exec_server_base64::decode(text.as_bytes(), &mut sink)
                        .ok_or("readFile: dataBase64 is not base64, or longer than the file")?
                } else {
                    read_blocks(&c, &uri, &mut sink).await?
                };
                Ok::<_, String>((n, t0.elapsed().as_secs_f64()))
            })
            .await;
            let (n, secs) = got?;
            let _ = std::fs::remove_dir_all(&d);
            if sink[..n] != data[..] {
                return Err(format!("content differs ({n} bytes read)"));
            }
            Ok(Outcome::of(vec![
                FILE_BYTES as f64 / 1048576.0 / secs,
                usage.peak_rss_mib,
                usage.cpu_ms,
            ]))
        }
        Scenario::FsWrite | Scenario::FsWriteBlocks => {
            let d = scratch("write");
            let f = d.join("out");
            let _ = std::fs::remove_file(&f);
            let data = pattern(FILE_BYTES);
            let uri = format!("file://{}", f.display());
            let c = Conn::open(&url).await?;
            let (r, usage) = with_usage(srv, async {
                let t0 = Instant::now();
                if sc == Scenario::FsWrite {
                    let path = json!(uri).to_string();
                    let rx = c
                        .send_with(|id| {
                            request_ending_in_base64(
                                &format!(
                                    "{{\"id\":{id},\"method\":\"fs/writeFile\",\"params\":{{\"path\":{path},\"dataBase64\":\""
                                ),
                                &data,
                            )
                        })
                        .await?;
                    rx.await.map_err(|_| "closed")?.result_text()?;
                } else {
                    write_blocks(&c, &uri, &data).await?;
                }
                Ok::<_, String>(t0.elapsed().as_secs_f64())
            })
            .await;
            let secs = r?;
            let written = std::fs::read(&f).map_err(|e| e.to_string())?;
            let _ = std::fs::remove_dir_all(&d);
            if written != data {
                return Err(format!("file differs ({} bytes on disk)", written.len()));
            }
            Ok(Outcome::of(vec![
                FILE_BYTES as f64 / 1048576.0 / secs,
                usage.peak_rss_mib,
                usage.cpu_ms,
            ]))
        }
        Scenario::ManyProcs => {
            let (r, usage) = with_usage(srv, async {
                let t0 = Instant::now();
                let mut tasks = Vec::new();
                for k in 0..10 {
                    let url = url.clone();
                    tasks.push(tokio::spawn(async move {
                        let c = Conn::open(&url).await?;
                        let mut notes = c.notes.lock().await;
                        for i in 0..50 {
                            c.call(
                                "process/start",
                                start_params(&format!("m{k}-{i}"), &["sleep", "1"]),
                            )
                            .await?;
                        }
                        let mut closed = 0;
                        while closed < 50 {
                            let n = tokio::time::timeout(Duration::from_secs(60), notes.recv())
                                .await
                                .map_err(|_| "timeout")?
                                .ok_or("closed")?;
                            if n.method == "process/exited" && n.exit_code != Some(0) {
                                return Err(format!("bad exit {n:?}"));
                            }
                            if n.method == "process/closed" {
                                closed += 1;
                            }
                        }
                        Ok::<_, String>(())
                    }));
                }
                for t in tasks {
                    t.await.map_err(|e| e.to_string())??;
                }
                Ok::<_, String>(t0.elapsed().as_secs_f64() * 1000.0)
            })
            .await;
            Ok(Outcome::of(vec![r?, usage.peak_rss_mib, usage.cpu_ms]))
        }
        Scenario::IdleConns => {
            let before = srv
                .rss_kib()
                .ok_or("server RSS unavailable (needs a started server)")?;
            let mut conns = Vec::new();
            for _ in 0..1000 {
                conns.push(Conn::open(&url).await?);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let after = srv.rss_kib().ok_or("server RSS unavailable")?;
            let status = conns[999].call("environment/status", Value::Null).await?;
            if status["status"] != "ready" {
                return Err(format!("status {status}"));
            }
            drop(conns);
            Ok(Outcome::of(vec![
                (after.saturating_sub(before)) as f64 / 1000.0,
            ]))
        }
    }
}

async fn read_blocks(c: &Conn, uri: &str, out: &mut [u8]) -> Result<usize, String> {
    c.call("fs/open", json!({"handleId": "b", "path": uri}))
        .await?;
    let mut filled = 0usize;
    let mut offset = 0usize;
    let mut queue = std::collections::VecDeque::new();
    for _ in 0..4 {
        queue.push_back(
            c.send(
                "fs/readBlock",
                json!({"handleId": "b", "offset": offset, "len": BLOCK}),
            )
            .await?,
        );
        offset += BLOCK;
    }
    while let Some(rx) = queue.pop_front() {
        let r = rx.await.map_err(|_| "closed")?;
        r.result_text()?;
        let chunk = r
            .result_member("chunk")
            .and_then(exec_server_fastpath::skim::plain_string)
            .ok_or("readBlock: result without a plain string `chunk`")?;
        filled += exec_server_base64::decode(
            chunk.as_bytes(),
            out.get_mut(filled..)
                .ok_or("readBlock: more bytes than the file")?,
        )
        .ok_or("readBlock: chunk is not base64, or more bytes than the file")?;
        if r.result_member("eof") == Some("true") {
            break;
        }
        queue.push_back(
            c.send(
                "fs/readBlock",
                json!({"handleId": "b", "offset": offset, "len": BLOCK}),
            )
            .await?,
        );
        offset += BLOCK;
    }
    for rx in queue {
        let _ = rx.await;
    }
    c.call("fs/close", json!({"handleId": "b"})).await?;
    Ok(filled)
}

async fn write_blocks(c: &Conn, uri: &str, data: &[u8]) -> Result<(), String> {
    c.call(
        "fs/open",
        json!({"handleId": "w", "path": uri, "mode": "replace"}),
    )
    .await?;
    let mut queue: std::collections::VecDeque<tokio::sync::oneshot::Receiver<Response>> =
        std::collections::VecDeque::new();
    for (i, block) in data.chunks(BLOCK).enumerate() {
        if queue.len() == 4 {
            let Some(rx) = queue.pop_front() else { break };
            rx.await.map_err(|_| "closed")?.result_text()?;
        }
        queue.push_back(
            c.send_with(|id| {
                request_ending_in_base64(
                    &format!(
                        "{{\"id\":{id},\"method\":\"fs/writeBlock\",\"params\":{{\"handleId\":\"w\",\"offset\":{},\"chunk\":\"",
                        i * BLOCK
                    ),
                    block,
                )
            })
            .await?,
        );
    }
    for rx in queue {
        rx.await.map_err(|_| "closed")?.result_text()?;
    }
    c.call("fs/close", json!({"handleId": "w"})).await?;
    Ok(())
}

/// One point of the scaling plot.
pub struct Point {
    pub procs: usize,
    pub spawn_ms: f64,
    pub rss_mib: f64,
}

/// Spawn latency and server memory with N concurrent `sleep` processes alive.
pub async fn scaling(
    servers: &[crate::server::Target],
) -> Result<Vec<(String, Vec<Point>)>, String> {
    let mut out = Vec::new();
    for t in servers {
        let srv = t.start().await?;
        let mut pts = Vec::new();
        let conns: Vec<Conn> = {
            let mut v = Vec::new();
            for _ in 0..10 {
                v.push(Conn::open(&srv.url).await?);
            }
            v
        };
        let probe = Conn::open(&srv.url).await?;
        let mut alive = 0usize;
        for target in [1usize, 10, 100, 250, 500, 1000] {
            while alive < target {
                conns[alive % 10]
                    .call(
                        "process/start",
                        start_params(&format!("z{alive}"), &["sleep", "60"]),
                    )
                    .await?;
                alive += 1;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut lat = Vec::new();
            for i in 0..20 {
                let id = format!("probe{target}-{i}");
                lat.push(spawn_true(&probe, &id).await?);
                probe
                    .call("process/terminate", json!({"processId": id}))
                    .await?;
            }
            let rss = srv.rss_kib().unwrap_or(0) as f64 / 1024.0;
            pts.push(Point {
                procs: target,
                spawn_ms: pct(lat, 0.5),
                rss_mib: rss,
            });
        }
        srv.stop();
        out.push((t.name.clone(), pts));
    }
    Ok(out)
}
