//! Run a command and collect its output and exit code.
//!
//! `cargo run -p exec-server-client --example run_command` runs it on this
//! machine; with `EXEC_SERVER_URL=ws://HOST:PORT` on that server.

use exec_server_client::{Command, Environments, ExecServerClient, Output};

/// Runs `uname -s` and a failing shell command; returns the second's output.
pub async fn run(client: &ExecServerClient) -> Result<Output, Box<dyn std::error::Error>> {
    let uname = Command::new("uname")
        .arg("-s")
        .spawn(client)
        .await?
        .wait_with_output(64 * 1024)
        .await?;
    println!("uname: {}", String::from_utf8_lossy(&uname.stdout).trim());

    let out = Command::new("sh")
        .args(["-c", "echo to stdout; echo to stderr >&2; exit 3"])
        .cwd("/tmp")
        .env("GREETING", "hello")
        .spawn(client)
        .await?
        .wait_with_output(64 * 1024)
        .await?;
    println!(
        "exit {} stdout {:?} stderr {:?}",
        out.code, out.stdout, out.stderr
    );
    Ok(out)
}

#[allow(dead_code)] // a test includes this file and calls `run` itself
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let envs = Environments::from_env()?;
    let env = envs
        .default_environment()
        .ok_or("no environment configured")?;
    run(&env.client).await?;
    Ok(())
}
