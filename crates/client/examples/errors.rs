//! Branch on what went wrong, never on message text.

use exec_server_client::{Command, Environments, ErrorKind, ExecServerClient};

/// Tries a missing program, a missing working directory and a file that is
/// not executable (`not_executable`, on the server's host); returns the kinds.
pub async fn run(
    client: &ExecServerClient,
    not_executable: &std::path::Path,
) -> Result<Vec<ErrorKind>, Box<dyn std::error::Error>> {
    let attempts = [
        Command::new("no-such-tool"),
        Command::new("true").cwd("/no/such/dir"),
        Command::new(not_executable.to_string_lossy()),
    ];
    let mut kinds = Vec::new();
    for cmd in attempts {
        let Err(e) = cmd.spawn(client).await else {
            return Err("expected the start to fail".into());
        };
        match e.kind() {
            ErrorKind::ProgramNotFound => println!("install it first: {e}"),
            ErrorKind::CwdNotFound => println!("create {:?} first", e.path()),
            ErrorKind::NotExecutable => println!("chmod +x {:?}", e.path()),
            // The reference server sends no structured data: only the code is known.
            other => println!("{other:?}: {e}"),
        }
        kinds.push(e.kind());
    }
    Ok(kinds)
}

#[allow(dead_code)] // a test includes this file and calls `run` itself
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let envs = Environments::from_env()?;
    let env = envs
        .default_environment()
        .ok_or("no environment configured")?;
    // A file that is certainly not executable (on the local machine: pass
    // one of the server's host to `run` for a remote environment).
    let not_executable =
        std::env::temp_dir().join(format!("errors-example-{}", std::process::id()));
    std::fs::write(&not_executable, "not a program")?;
    let result = run(&env.client, &not_executable).await;
    std::fs::remove_file(&not_executable)?;
    result?;
    Ok(())
}
