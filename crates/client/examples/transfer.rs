//! Upload and download files of any size with progress reports.

use exec_server_client::{Environments, ExecServerClient, PathUri};

/// Uploads `size` bytes to `remote` (an absolute path on the server's host),
/// downloads them back, and returns the bytes that came back and the number of
/// progress reports seen.
pub async fn run(
    client: &ExecServerClient,
    remote: &std::path::Path,
    size: usize,
) -> Result<(Vec<u8>, usize), Box<dyn std::error::Error>> {
    let path = PathUri::from_path(remote).ok_or("the remote path must be absolute")?;
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let mut reports = 0;
    let sent = client
        .upload_with_progress(&mut &data[..], &path, |done| {
            reports += 1;
            println!("uploaded {done} of {size} bytes");
        })
        .await?;
    let mut back = Vec::new();
    let got = client
        .download_with_progress(&path, &mut back, |done| {
            reports += 1;
            println!("downloaded {done} bytes");
        })
        .await?;
    println!("sent {sent}, received {got}");
    client.remove(&path, false, true).await?;
    Ok((back, reports))
}

#[allow(dead_code)] // a test includes this file and calls `run` itself
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let envs = Environments::from_env()?;
    let env = envs
        .default_environment()
        .ok_or("no environment configured")?;
    let remote = std::path::PathBuf::from(format!("/tmp/transfer-example-{}", std::process::id()));
    run(&env.client, &remote, 5 << 20).await?;
    Ok(())
}
