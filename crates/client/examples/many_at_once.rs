//! Run many commands at once over one client (one connection).

use exec_server_client::{Command, Environments, ExecServerClient};

/// Runs `n` shells concurrently, each printing its index; returns their
/// outputs in index order.
pub async fn run(
    client: &ExecServerClient,
    n: usize,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let runs = (0..n).map(|i| async move {
        let out = Command::new("sh")
            .args(["-c", "sleep 0.1; echo $0"])
            .arg(i.to_string())
            .spawn(client)
            .await?
            .wait_with_output(1024)
            .await?;
        Ok::<_, exec_server_client::ClientError>(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    });
    let outputs = futures_util::future::try_join_all(runs).await?;
    println!("{outputs:?}");
    Ok(outputs)
}

#[allow(dead_code)] // a test includes this file and calls `run` itself
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let envs = Environments::from_env()?;
    let env = envs
        .default_environment()
        .ok_or("no environment configured")?;
    run(&env.client, 20).await?;
    Ok(())
}
