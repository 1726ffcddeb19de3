//! A dropped connection loses nothing: the client resumes the session and the
//! process stream goes on where it stopped.

use exec_server_client::{Command, ConnectionEvent, Environments, ExecServerClient, ProcessEvent};

/// Starts `cat`, cuts the connection between two lines, and returns what `cat`
/// echoed and the connection events seen.
pub async fn run(
    client: &ExecServerClient,
) -> Result<(Vec<u8>, Vec<ConnectionEvent>), Box<dyn std::error::Error>> {
    let mut events = client.connection_events();
    let mut p = Command::new("cat").stdin_piped().spawn(client).await?;
    p.write(b"before\n".to_vec()).await?;
    let mut echoed = Vec::new();
    while echoed.len() < 7 {
        match p.next_event().await {
            Some(ProcessEvent::Output { data, .. }) => echoed.extend(data),
            other => return Err(format!("unexpected {other:?}").into()),
        }
    }
    // As a network failure would (a test hook); the next call resumes.
    client.drop_connection().await;
    p.write(b"after\n".to_vec()).await?;
    p.close_stdin().await?;
    let rest = p.wait_with_output(1024).await?;
    echoed.extend(rest.stdout);
    let mut seen = Vec::new();
    while let Ok(ev) = events.try_recv() {
        seen.push(ev);
    }
    println!("{} after {seen:?}", String::from_utf8_lossy(&echoed));
    Ok((echoed, seen))
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
