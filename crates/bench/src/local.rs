//! The local limit: each scenario's work done directly on this machine, without
//! a server, so a server's numbers can be read as a fraction of what is possible.

use crate::scenarios::{pattern, pct, scratch, Outcome, Scenario, FILE_BYTES, STREAM_BYTES};
use std::time::Instant;

/// The same work without a server: what the machine allows.
pub async fn local(sc: Scenario) -> Result<Outcome, String> {
    tokio::task::spawn_blocking(move || local_blocking(sc))
        .await
        .map_err(|e| e.to_string())?
}

fn spawn_true_local() -> Result<f64, String> {
    let t0 = Instant::now();
    let st = std::process::Command::new("true")
        .status()
        .map_err(|e| e.to_string())?;
    if !st.success() {
        return Err("true failed".into());
    }
    Ok(t0.elapsed().as_secs_f64() * 1000.0)
}

fn local_blocking(sc: Scenario) -> Result<Outcome, String> {
    use std::io::Read;
    match sc {
        Scenario::Connect | Scenario::IdleConns => Err("no local equivalent".into()),
        Scenario::ShellSnapshot => {
            let (plain, login) = crate::snapshot::latencies_local()?;
            Ok(Outcome::of(vec![plain, login]))
        }
        Scenario::SpawnSandboxed => {
            let lat = crate::sandboxed::bwrap_latencies_local(300, None)?;
            Ok(Outcome::of(vec![pct(lat.clone(), 0.5), pct(lat, 0.99)]))
        }
        Scenario::SpawnSandboxedPaced => {
            let pause = Some(crate::sandboxed::PACE);
            let lat = crate::sandboxed::bwrap_latencies_local(100, pause)?;
            Ok(Outcome::of(vec![pct(lat.clone(), 0.5), pct(lat, 0.99)]))
        }
        Scenario::Spawn | Scenario::SpawnLimited => {
            let lat: Vec<f64> = (0..300)
                .map(|_| spawn_true_local())
                .collect::<Result<_, _>>()?;
            Ok(Outcome::of(vec![pct(lat.clone(), 0.5), pct(lat, 0.99)]))
        }
        Scenario::SpawnConcurrent | Scenario::SpawnPipelined => {
            let t0 = Instant::now();
            let threads: Vec<_> = (0..64)
                .map(|_| {
                    std::thread::spawn(|| (0..20).try_for_each(|_| spawn_true_local().map(|_| ())))
                })
                .collect();
            for t in threads {
                t.join().map_err(|_| "thread panicked")??;
            }
            Ok(Outcome::of(vec![1280.0 / t0.elapsed().as_secs_f64()]))
        }
        Scenario::Stream => {
            let t0 = Instant::now();
            let mut child = std::process::Command::new("head")
                .args(["-c", &STREAM_BYTES.to_string(), "/dev/zero"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())?;
            let mut out = child.stdout.take().ok_or("no stdout")?;
            let mut buf = vec![0u8; 64 * 1024];
            let mut n = 0;
            loop {
                let k = out.read(&mut buf).map_err(|e| e.to_string())?;
                if k == 0 {
                    break;
                }
                n += k;
            }
            child.wait().map_err(|e| e.to_string())?;
            if n != STREAM_BYTES {
                return Err(format!("{n} bytes"));
            }
            Ok(Outcome::of(vec![
                n as f64 / 1048576.0 / t0.elapsed().as_secs_f64(),
                f64::NAN,
            ]))
        }
        Scenario::FsRead | Scenario::FsReadBlocks => {
            let d = scratch("lread");
            let f = d.join("in");
            let data = pattern(FILE_BYTES);
            std::fs::write(&f, &data).map_err(|e| e.to_string())?;
            // Into memory already touched, as the remote readers decode into.
            let mut got = vec![1u8; FILE_BYTES];
            let t0 = Instant::now();
            std::io::Read::read_exact(
                &mut std::fs::File::open(&f).map_err(|e| e.to_string())?,
                &mut got,
            )
            .map_err(|e| e.to_string())?;
            let secs = t0.elapsed().as_secs_f64();
            let _ = std::fs::remove_dir_all(&d);
            if got != data {
                return Err("content differs".into());
            }
            Ok(Outcome::of(vec![
                FILE_BYTES as f64 / 1048576.0 / secs,
                f64::NAN,
            ]))
        }
        Scenario::FsWrite | Scenario::FsWriteBlocks => {
            let d = scratch("lwrite");
            let f = d.join("out");
            let data = pattern(FILE_BYTES);
            let t0 = Instant::now();
            std::fs::write(&f, &data).map_err(|e| e.to_string())?;
            let secs = t0.elapsed().as_secs_f64();
            let _ = std::fs::remove_dir_all(&d);
            Ok(Outcome::of(vec![
                FILE_BYTES as f64 / 1048576.0 / secs,
                f64::NAN,
            ]))
        }
        Scenario::ManyProcs => {
            let t0 = Instant::now();
            let mut kids = Vec::new();
            for _ in 0..500 {
                kids.push(
                    std::process::Command::new("sleep")
                        .arg("1")
                        .spawn()
                        .map_err(|e| e.to_string())?,
                );
            }
            for mut k in kids {
                k.wait().map_err(|e| e.to_string())?;
            }
            Ok(Outcome::of(vec![
                t0.elapsed().as_secs_f64() * 1000.0,
                f64::NAN,
            ]))
        }
    }
}
