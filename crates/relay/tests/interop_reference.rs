//! Our registry, relay and harness against the real Codex executor
//! (`codex-ref exec-server --remote …`): proves our Noise hybridIK, frames and
//! records are byte-compatible with the reference. Skipped (passes with a
//! note) when `codex-ref` is not installed.

use exec_server_relay::harness;
use exec_server_relay::keys::Identity;
use exec_server_relay::random::OsRandom;
use exec_server_relay::registry_client::RegistryClient;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn reference() -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", "command -v codex-ref"])
        .output()
        .ok()?;
    let p = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!p.is_empty()).then_some(p)
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = nix_kill(self.0.id());
        let _ = self.0.wait();
    }
}
fn nix_kill(pid: u32) -> std::io::Result<()> {
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .map(|_| ())
}

async fn roundtrip(
    ch: &mut exec_server_relay::stream::Channel,
    msg: serde_json::Value,
) -> serde_json::Value {
    let id = msg["id"].clone();
    ch.outbound
        .send(serde_json::to_vec(&msg).unwrap().into())
        .await
        .unwrap();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(20), ch.inbound.recv())
            .await
            .expect("answer in time")
            .expect("stream open");
        let v: serde_json::Value = serde_json::from_slice(&m).unwrap();
        if v["id"] == id {
            return v;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_executor_through_our_registry_to_our_harness() {
    let Some(codex) = reference() else {
        eprintln!("codex-ref not installed; skipping");
        return;
    };
    let base = exec_server_relay::testing::memory_registry().await;
    let mut child = Command::new(codex)
        .args([
            "exec-server",
            "--remote",
            &base,
            "--environment-id",
            "interop-env",
            "--registration-bearer-stdin",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"executor-token\n")
        .unwrap();
    let _guard = Kill(child);

    let client = RegistryClient::new(&base, "harness-token", None, true).unwrap();
    let me = Identity::generate(&mut OsRandom);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ch = loop {
        // Offering AEGIS-256X2 as our harness does by default: the reference
        // skips the unknown field and the records stay AES-256-GCM.
        match harness::connect_offering(
            &client,
            "interop-env",
            &me,
            exec_server_relay::TransportCipher::Aegis256X2,
        )
        .await
        {
            Ok(ch) => break ch,
            Err(e) => {
                assert!(Instant::now() < deadline, "no connection in 30 s: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(
        ch.transport_cipher,
        exec_server_relay::TransportCipher::AesGcm
    );
    let init = roundtrip(
        &mut ch,
        serde_json::json!({"id": 1, "method": "initialize", "params": {"clientName": "interop"}}),
    )
    .await;
    assert!(init["result"]["sessionId"].is_string(), "{init}");
    ch.outbound
        .send(br#"{"method":"initialized"}"#.to_vec().into())
        .await
        .unwrap();
    // A 100 kB request: two records, as the reference cuts them.
    let big = "x".repeat(100_000);
    let path = std::env::temp_dir().join(format!("interop-{}", std::process::id()));
    let b64 = base64_encode(big.as_bytes());
    let w = roundtrip(
        &mut ch,
        serde_json::json!({"id": 2, "method": "fs/writeFile", "params": {"path": format!("file://{}", path.display()), "dataBase64": b64}}),
    )
    .await;
    assert!(w.get("result").is_some(), "{w}");
    assert_eq!(std::fs::read(&path).unwrap().len(), 100_000);
    let _ = std::fs::remove_file(&path);
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}
