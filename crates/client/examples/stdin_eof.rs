//! Feed a process's stdin and send end of file.

use exec_server_client::{Command, Environments, ExecServerClient, WriteStatus};

/// Sorts three lines with `sort`, which prints only after end of file.
pub async fn run(client: &ExecServerClient) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    // Without `stdin_piped()` stdin is /dev/null and writes answer `StdinClosed`.
    let mut p = Command::new("sort").stdin_piped().spawn(client).await?;
    for line in ["pear\n", "apple\n", "fig\n"] {
        let status = p.write(line.as_bytes().to_vec()).await?;
        if status != WriteStatus::Accepted {
            return Err(format!("stdin refused the write: {status:?}").into());
        }
    }
    p.close_stdin().await?;
    let out = p.wait_with_output(64 * 1024).await?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    Ok(out.stdout)
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
