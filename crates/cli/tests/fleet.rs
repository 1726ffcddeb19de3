//! Remote mode on a fleet (issue 31): several `exec-server registry` nodes
//! on one PostgreSQL (started by the test), our executor given every node's
//! URL, clients reaching it through any node, and the loss of the node that
//! carries the executor's relay socket.

use crate::remote_mode::{run_cli, start_executor, start_registry, wait_ready};
use exec_server_relay::testing::TestPostgres;

/// Three nodes: a client through any node reaches the executor (attached
/// to one of them); `kill -9` of that node, and the executor registers
/// with a survivor, where clients then find it.
#[test]
fn three_nodes_on_postgres_survive_the_carrying_nodes_loss() {
    let db = TestPostgres::start();
    let nodes: Vec<_> = (0..3)
        .map(|_| start_registry(&["--listen", "127.0.0.1:0", "--db", &db.url()]))
        .collect();
    let urls: Vec<String> = nodes.iter().map(|(_, u)| u.clone()).collect();
    // Registers with the first node that answers: nodes[0].
    let _executor = start_executor(&urls.join(","), "fleet", "exec-token");
    for via in &urls {
        wait_ready(via, "fleet", "harness-token");
        let out = run_cli(via, "fleet", "harness-token", &["echo", "through a node"]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "through a node\n",
            "via {via}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut nodes = nodes.into_iter();
    let (mut first, _) = nodes.next().unwrap();
    let _ = first.0.kill();
    let _ = first.0.wait();
    let survivors = urls[1..].join(",");
    // The executor notices, registers with a survivor once the dead node's
    // attachment has expired (5 s), and clients given the survivors find it.
    wait_ready(&survivors, "fleet", "harness-token");
    let out = run_cli(
        &survivors,
        "fleet",
        "harness-token",
        &["echo", "after the loss"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "after the loss\n");
    assert!(out.status.success());
}
