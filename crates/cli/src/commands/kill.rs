//! `kill`: stops a process of any session on a server (the operator's
//! `process/operatorSignal`), found by its id as `exec-server ps` shows it.

use super::ps::operator_token;
use super::{explain, fail, ConnectArgs};
use clap::Args;
use exec_server_protocol::types::{OperatorSignalParams, ProcessSignal, TerminateResponse};
use std::path::PathBuf;

/// `kill` flags.
#[derive(Args, Debug)]
pub struct KillArgs {
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// File holding the server's operator credential (its
    /// `--operator-token-file`); or set EXEC_SERVER_OPERATOR_TOKEN.
    #[arg(long, value_name = "PATH")]
    pub operator_token_file: Option<PathBuf>,
    /// The process's session, or the start of its id (as `ps` shows it);
    /// needed when several sessions have a process of that id.
    #[arg(long, value_name = "SESSION")]
    pub session: Option<String>,
    /// Send this signal to its process group (interrupt, terminate, kill,
    /// hangup, quit, user1, user2, continue, stop) instead of ending the
    /// whole tree (SIGKILL to the group and its cgroup).
    #[arg(long, value_name = "NAME", value_parser = parse_signal)]
    pub signal: Option<ProcessSignal>,
    /// The process id (PROCESS in `ps`).
    #[arg(value_name = "PROCESS")]
    pub process: String,
}

fn parse_signal(name: &str) -> Result<ProcessSignal, String> {
    let name = name.trim().to_ascii_lowercase();
    let name = name.strip_prefix("sig").unwrap_or(&name);
    let wire = match name {
        "int" => "interrupt",
        "term" => "terminate",
        "hup" => "hangup",
        "usr1" => "user1",
        "usr2" => "user2",
        "cont" => "continue",
        other => other,
    };
    serde_json::from_value(serde_json::Value::String(wire.to_string()))
        .map_err(|_| format!("`{name}` is not a signal this server sends (interrupt, terminate, kill, hangup, quit, user1, user2, continue, stop)"))
}

/// Runs `kill`; returns the exit code (1 when no single process matched).
pub async fn kill(args: KillArgs) -> i32 {
    let token = match operator_token(args.operator_token_file.as_deref()) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let client = match args.conn.client("exec-server kill") {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let code = kill_with(&client, &args, token).await;
    client.close().await;
    code
}

async fn kill_with(
    client: &exec_server_client::ExecServerClient,
    args: &KillArgs,
    token: String,
) -> i32 {
    let list = match super::ps::list_all(client, token.clone()).await {
        Ok(l) => l,
        Err(e) => return fail(explain(&e)),
    };
    let matches: Vec<String> = list
        .processes
        .iter()
        .filter(|p| p.process_id == args.process)
        .filter_map(|p| p.session_id.clone())
        .filter(|s| {
            args.session
                .as_deref()
                .is_none_or(|want| s.starts_with(want))
        })
        .collect();
    let session_id = match matches.as_slice() {
        [one] => one.clone(),
        [] => return fail(format!("no process {} on the server", args.process)),
        many => {
            return fail(format!(
                "{} sessions have a process {}; pick one with --session ({})",
                many.len(),
                args.process,
                many.join(", ")
            ))
        }
    };
    let r: Result<TerminateResponse, _> = client
        .call(
            "process/operatorSignal",
            &OperatorSignalParams {
                session_id,
                process_id: args.process.clone(),
                signal: args.signal,
                operator_token: token,
            },
            false,
        )
        .await;
    match r {
        Ok(r) if r.running => 0,
        Ok(_) => {
            eprintln!("exec-server: process {} had already exited", args.process);
            0
        }
        Err(e) => fail(explain(&e)),
    }
}
