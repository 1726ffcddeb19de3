//! `shell-snapshot`: `bash -lc true` for a user whose `.bash_profile` does what
//! developer profiles commonly do (a few command substitutions, as
//! `pyenv init` or `brew --prefix` do, and a hundred functions, as a version
//! manager defines), from `process/start` to `process/closed`. First with a
//! `shellSnapshot` (one scope: captured once, then restored), then as a plain
//! login shell. Locally: `bash -c true` and `bash -lc true`.

use crate::wire::{start_params, wait_closed, Conn};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;

const PROFILE: &str = r#"for i in 1 2 3 4 5 6; do v=$(/bin/true); done
for i in $(seq 100); do eval "tool_$i() { echo $i; }"; done
export PATH="$HOME/.local/bin:$PATH"
export EDITOR=vi
"#;
/// Commands per measurement.
const RUNS: usize = 100;

/// A scratch HOME holding the profile.
fn home() -> Result<PathBuf, String> {
    let h = std::env::temp_dir().join(format!("es-bench-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&h).map_err(|e| e.to_string())?;
    std::fs::write(h.join(".bash_profile"), PROFILE).map_err(|e| e.to_string())?;
    Ok(h)
}

fn params(id: &str, home: &Path, snapshot: bool) -> Value {
    let mut p = start_params(id, &["/bin/bash", "-lc", "tool_7 >/dev/null"]);
    p["env"]["HOME"] = json!(home.display().to_string());
    if snapshot {
        p["shellSnapshot"] =
            json!({"scopeId": "bench", "shell": {"name": "bash", "path": "/bin/bash"}});
    }
    p
}

/// p50 latencies in ms: (with a snapshot, as a plain login shell).
pub async fn latencies(c: &Conn) -> Result<(f64, f64), String> {
    let home = home()?;
    let mut out = [0.0; 2];
    for (slot, snapshot) in [(0, true), (1, false)] {
        let mut lat = Vec::with_capacity(RUNS);
        for i in 0..RUNS {
            let id = format!("snap{slot}-{i}");
            let t0 = Instant::now();
            c.call("process/start", params(&id, &home, snapshot))
                .await?;
            let (_, exit) = wait_closed(c, &id).await?;
            if exit != Some(0) {
                return Err(format!(
                    "{id}: exit {exit:?} (the profile's function is missing?)"
                ));
            }
            lat.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
        out[slot] = crate::scenarios::pct(lat, 0.5);
    }
    let _ = std::fs::remove_dir_all(&home);
    Ok((out[0], out[1]))
}

/// The same commands run locally: `bash -c true` (no startup files, the
/// floor) and `bash -lc true` (the profile every time).
pub fn latencies_local() -> Result<(f64, f64), String> {
    let home = home()?;
    let mut out = [0.0; 2];
    for (slot, flag) in [(0, "-c"), (1, "-lc")] {
        let script = if flag == "-c" {
            "true"
        } else {
            "tool_7 >/dev/null"
        };
        let mut lat = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let t0 = Instant::now();
            let st = std::process::Command::new("/bin/bash")
                .args([flag, script])
                .env_clear()
                .env("HOME", &home)
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .status()
                .map_err(|e| e.to_string())?;
            if !st.success() {
                return Err(format!("bash {flag} failed"));
            }
            lat.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
        out[slot] = crate::scenarios::pct(lat, 0.5);
    }
    let _ = std::fs::remove_dir_all(&home);
    Ok((out[0], out[1]))
}
