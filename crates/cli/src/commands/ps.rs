//! `ps`: every session's processes on a server (the operator view of
//! `process/list`), one line each.

use super::{explain, fail, ConnectArgs};
use clap::Args;
use exec_server_protocol::types::{
    ProcessInfo, ProcessListParams, ProcessListResponse, ProcessState,
};
use std::path::PathBuf;

/// `ps` flags.
#[derive(Args, Debug)]
pub struct PsArgs {
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// File holding the server's operator credential (its
    /// `--operator-token-file`); or set EXEC_SERVER_OPERATOR_TOKEN.
    #[arg(long, value_name = "PATH")]
    pub operator_token_file: Option<PathBuf>,
    /// Print the list as JSON (`process/list`'s answer) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The operator credential from `path`, else EXEC_SERVER_OPERATOR_TOKEN.
/// Errors: neither given, or the file unreadable.
pub(super) fn operator_token(path: Option<&std::path::Path>) -> Result<String, String> {
    match (path, std::env::var("EXEC_SERVER_OPERATOR_TOKEN")) {
        (Some(path), _) => std::fs::read_to_string(path)
            .map(|t| t.trim().to_string())
            .map_err(|e| format!("cannot read {}: {e}", path.display())),
        (None, Ok(t)) => Ok(t.trim().to_string()),
        (None, Err(_)) => Err(
            "this reaches every session's processes and needs the server's operator \
             credential: --operator-token-file PATH or EXEC_SERVER_OPERATOR_TOKEN"
                .to_string(),
        ),
    }
}

/// Every session's processes (`process/list` with `allSessions`).
pub(super) async fn list_all(
    client: &exec_server_client::ExecServerClient,
    token: String,
) -> Result<ProcessListResponse, exec_server_client::ClientError> {
    let params = ProcessListParams {
        all_sessions: true,
        operator_token: Some(token),
    };
    client.call("process/list", &params, true).await
}

/// Runs `ps`; returns the exit code.
pub async fn ps(args: PsArgs) -> i32 {
    let token = match operator_token(args.operator_token_file.as_deref()) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let client = match args.conn.client("exec-server ps") {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let r = list_all(&client, token).await;
    client.close().await;
    let list = match r {
        Ok(l) => l,
        Err(e) => return fail(explain(&e)),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&list).unwrap_or_default()
        );
        return 0;
    }
    println!(
        "{:<8} {:<16} {:>7} {:<8} {:>8} {:>9} {:>10}  COMMAND",
        "SESSION", "PROCESS", "PID", "STATE", "CPU", "RSS", "OUTPUT"
    );
    for p in &list.processes {
        println!("{}", line(p));
    }
    0
}

fn line(p: &ProcessInfo) -> String {
    let session: String = p
        .session_id
        .as_deref()
        .unwrap_or("-")
        .chars()
        .take(8)
        .collect();
    let state = match (p.state, p.limit) {
        (_, Some(limit)) => limit.as_str().to_string(),
        (ProcessState::Running, _) => "running".into(),
        (ProcessState::Exited, _) => format!("exit {}", p.exit_code.unwrap_or(-1)),
        (ProcessState::Closed, _) => format!("done {}", p.exit_code.unwrap_or(-1)),
    };
    let cpu = p
        .cpu_time_ms
        .map(|ms| format!("{}.{:02}s", ms / 1000, ms % 1000 / 10))
        .unwrap_or_else(|| "-".into());
    let rss = p
        .memory_bytes
        .map(|b| format!("{}K", b / 1024))
        .unwrap_or_else(|| "-".into());
    format!(
        "{:<8} {:<16} {:>7} {:<8} {:>8} {:>9} {:>10}  {}",
        session,
        p.process_id,
        p.pid,
        state,
        cpu,
        rss,
        p.output_bytes,
        p.argv.join(" ")
    )
}
