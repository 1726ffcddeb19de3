//! Every example in `examples/` runs here, against this server embedded in the
//! test process. The examples are included as modules (each exposes `run`)
//! rather than executed as built binaries: `cargo test --test examples` then
//! needs no prior `cargo build --examples`, the run takes milliseconds instead
//! of a process and a server per example, and each outcome is asserted on the
//! values `run` returns, not on printed text.
#![cfg(feature = "embedded")]

#[path = "../examples/errors.rs"]
mod errors;
#[path = "../examples/many_at_once.rs"]
mod many_at_once;
#[path = "../examples/pty.rs"]
mod pty;
#[path = "../examples/recovery.rs"]
mod recovery;
#[path = "../examples/run_command.rs"]
mod run_command;
#[path = "../examples/stdin_eof.rs"]
mod stdin_eof;
#[path = "../examples/transfer.rs"]
mod transfer;

use exec_server_client::{ConnectionEvent, Environment, ErrorKind, ExecServerClient};
use std::path::PathBuf;

fn client() -> ExecServerClient {
    Environment::local().expect("local environment").client
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("esc-example-{name}-{}", std::process::id()))
}

#[tokio::test]
async fn run_command() {
    let out = run_command::run(&client()).await.unwrap();
    assert_eq!(
        (out.code, &out.stdout[..], &out.stderr[..]),
        (3, &b"to stdout\n"[..], &b"to stderr\n"[..])
    );
}

#[tokio::test]
async fn pty() {
    let seen = pty::run(&client()).await.unwrap();
    assert!(
        seen.contains("30 100") && seen.contains("40 120"),
        "{seen:?}"
    );
}

#[tokio::test]
async fn stdin_eof() {
    assert_eq!(
        stdin_eof::run(&client()).await.unwrap(),
        b"apple\nfig\npear\n"
    );
}

#[tokio::test]
async fn many_at_once() {
    let outs = many_at_once::run(&client(), 20).await.unwrap();
    let want: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    assert_eq!(outs, want);
}

#[tokio::test]
async fn transfer() {
    let size = 3 * 1024 * 1024 + 17;
    let path = scratch("transfer");
    let (back, reports) = transfer::run(&client(), &path, size).await.unwrap();
    assert_eq!(back.len(), size);
    assert!(back.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    assert_eq!(reports, 8, "4 upload blocks and 4 download blocks");
    assert!(!path.exists(), "the example removes its file");
}

#[tokio::test]
async fn recovery() {
    let (echoed, events) = recovery::run(&client()).await.unwrap();
    assert_eq!(echoed, b"before\nafter\n");
    assert!(
        matches!(
            events.as_slice(),
            [ConnectionEvent::Lost, ConnectionEvent::Recovered { .. }]
        ),
        "{events:?}"
    );
}

#[tokio::test]
async fn errors() {
    let file = scratch("errors");
    std::fs::write(&file, "not a program").unwrap();
    let kinds = errors::run(&client(), &file).await;
    std::fs::remove_file(&file).unwrap();
    assert_eq!(
        kinds.unwrap(),
        [
            ErrorKind::ProgramNotFound,
            ErrorKind::CwdNotFound,
            ErrorKind::NotExecutable
        ]
    );
}
