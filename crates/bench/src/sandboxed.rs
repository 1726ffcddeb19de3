//! `spawn-sandboxed`: `true` under the Codex CLI's workspace-write sandbox
//! (root readable, a scratch workspace writable, network restricted), from
//! `process/start` to `process/closed`. The local figure is bare bubblewrap
//! with the same namespaces and no mounts beyond `/`, `/dev` and `/proc`: the
//! floor any bubblewrap-based sandbox pays on this machine.
//!
//! `spawn-sandboxed-paced` is the same with [`PACE`] between one start's
//! close and the next start (outside the timed part), as a coding agent
//! starts commands between model turns: what a start costs when the server
//! is not still busy with the one before.

use crate::wire::{start_params, wait_closed, Conn};
use serde_json::json;
use std::time::Instant;

/// The pause between two starts of `spawn-sandboxed-paced`: 50 ms.
pub const PACE: std::time::Duration = std::time::Duration::from_millis(50);

/// Latencies in ms of `n` sandboxed starts of `true`, `pause` between one's
/// close and the next start.
pub async fn spawn_latencies(
    c: &Conn,
    n: usize,
    pause: Option<std::time::Duration>,
) -> Result<Vec<f64>, String> {
    let ws = std::env::temp_dir().join(format!("es-bench-sandbox-{}", std::process::id()));
    std::fs::create_dir_all(&ws).map_err(|e| e.to_string())?;
    let ws_uri = format!("file://{}", ws.display());
    let sandbox = json!({"windowsSandboxLevel": "disabled", "cwd": ws_uri, "workspaceRoots": [ws_uri],
        "permissions": {"type": "managed", "network": "restricted", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"}]}}});
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let id = format!("s{i}");
        let mut p = start_params(&id, &["true"]);
        p["cwd"] = json!(ws_uri);
        p["sandbox"] = sandbox.clone();
        let t0 = Instant::now();
        c.call("process/start", p).await?;
        let (_, exit) = wait_closed(c, &id).await?;
        if exit != Some(0) {
            return Err(format!("{id}: exit {exit:?}"));
        }
        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
        c.call("process/terminate", json!({"processId": id}))
            .await?;
    }
    let _ = std::fs::remove_dir_all(&ws);
    Ok(lat)
}

/// Latencies in ms of `n` bare bubblewrap runs of `true` (user, PID, IPC and
/// network namespaces, read-only root, /dev, /proc), `pause` before each.
pub fn bwrap_latencies_local(
    n: usize,
    pause: Option<std::time::Duration>,
) -> Result<Vec<f64>, String> {
    (0..n)
        .map(|_| {
            if let Some(pause) = pause {
                std::thread::sleep(pause);
            }
            let t0 = Instant::now();
            let st = std::process::Command::new("bwrap")
                .args([
                    "--unshare-user",
                    "--unshare-pid",
                    "--unshare-ipc",
                    "--unshare-net",
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "--",
                    "true",
                ])
                .status()
                .map_err(|e| format!("bwrap: {e}"))?;
            if !st.success() {
                return Err("bwrap true failed".into());
            }
            Ok(t0.elapsed().as_secs_f64() * 1000.0)
        })
        .collect()
}
