//! `info`: prints the server's `environment/info` as JSON.

use super::{explain, fail, ConnectArgs};

/// Runs `info`; returns the exit code.
pub async fn info(conn: ConnectArgs) -> i32 {
    let client = match conn.client("exec-server info") {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let info = client.environment_info().await;
    // As `run`: closed for good, so the runtime's end is no lost connection.
    client.close().await;
    match info {
        Ok(i) => {
            println!("{}", serde_json::to_string_pretty(&i).unwrap_or_default());
            0
        }
        Err(e) => fail(explain(&e)),
    }
}
