//! Run a command on a pseudo-terminal of a chosen size and resize it.

use exec_server_client::{Command, Environments, ExecServerClient};

/// Runs a shell on a 100×30 (cols × rows) PTY that prints its terminal size, then again
/// after a resize to 120×40; returns everything it printed.
pub async fn run(client: &ExecServerClient) -> Result<String, Box<dyn std::error::Error>> {
    let mut p = Command::new("sh")
        // `read` waits for our line, so the resize happens before the second `stty`.
        .args(["-c", "stty size; read _; stty size"])
        .pty(100, 30)
        .spawn(client)
        .await?;
    let mut seen = String::new();
    // Wait for the first size (the PTY echoes and uses \r\n).
    while !seen.contains("30 100") {
        match p.next_event().await {
            Some(exec_server_client::ProcessEvent::Output { data, .. }) => {
                seen.push_str(&String::from_utf8_lossy(&data))
            }
            other => return Err(format!("unexpected {other:?}").into()),
        }
    }
    p.resize(120, 40).await?;
    p.write(b"go\n".to_vec()).await?;
    let out = p.wait_with_output(64 * 1024).await?;
    seen.push_str(&String::from_utf8_lossy(&out.stdout));
    println!("{seen}");
    Ok(seen)
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
