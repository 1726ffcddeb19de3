//! What the tests against a scripted server share: a Unix socket in a fresh
//! directory, a client of it, and the process they start.

use exec_server_client::{ClientOptions, ExecServerClient, Source};
use exec_server_protocol::types::ExecParams;
use exec_server_protocol::PathUri;
use std::path::PathBuf;
use tokio::net::UnixListener;

/// A fresh directory (the caller removes it), a listener on a socket in
/// it, and a client of that socket.
pub fn socket(tag: &str) -> (PathBuf, UnixListener, ExecServerClient) {
    let dir = std::env::temp_dir().join(format!("esc-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("server.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let url = format!("unix://{}", path.display());
    let client = ExecServerClient::new(ClientOptions::new(Source::from_url(&url, None).unwrap()));
    (dir, listener, client)
}

/// `process/start` of `true` as process `p1` (the script answers it).
pub fn p1() -> ExecParams {
    ExecParams::new(
        "p1",
        vec!["true".into()],
        PathUri::parse("file:///").unwrap(),
        Default::default(),
    )
}

/// The process's next event, within 10 s (else the test fails, naming
/// what came before: `so_far`).
pub async fn next_event(
    p: &mut exec_server_client::ProcessHandle,
    so_far: &impl std::fmt::Debug,
) -> Option<exec_server_client::ProcessEvent> {
    tokio::time::timeout(std::time::Duration::from_secs(10), p.next_event())
        .await
        .unwrap_or_else(|_| panic!("stalled after {so_far:?}"))
}

/// Closes `client`, then waits up to 10 s for the script `server` to see
/// its connections end, and returns what it recorded; removes `dir`.
pub async fn finish<T>(
    client: ExecServerClient,
    server: tokio::task::JoinHandle<T>,
    dir: PathBuf,
) -> T {
    client.close().await;
    let recorded = tokio::time::timeout(std::time::Duration::from_secs(10), server)
        .await
        .expect("the server's connections ended")
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    recorded
}
