//! `shell`: an interactive login shell on a PTY, like `ssh -t`.

use super::run::{execute, Spec};
use super::{explain, fail, ConnectArgs};
use clap::Args;

/// `shell` flags.
#[derive(Args, Debug)]
pub struct ShellArgs {
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// Working directory on the server.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
}

/// Runs the server's shell (`environment/info`'s `shell.path -l`); returns its
/// exit code.
pub async fn shell(args: ShellArgs) -> i32 {
    let client = match args.conn.client("exec-server shell") {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let shell = match client.environment_info().await {
        Ok(i) => i.shell.path,
        Err(e) => return fail(explain(&e)),
    };
    let spec = Spec {
        process_id: super::run::process_id(),
        argv: vec![shell, "-l".into()],
        cwd: args.cwd,
        env: vec![],
        clean_env: false,
        tty: true,
        network: None,
        limits: None,
    };
    execute(client, spec).await
}
