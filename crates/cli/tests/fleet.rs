//! Remote mode on a fleet (issue 31): several `exec-server registry` nodes
//! on one PostgreSQL (started by the test), our executor given every node's
//! URL, clients reaching it through any node, and the loss of the node that
//! carries the executor's relay socket.

use crate::remote_mode::{
    codex_harness_runs_a_command, run_cli, start_executor, start_registry, wait_ready,
};
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

/// `seq 1 2000000` through the fleet is byte-identical at the client when
/// the node carrying the stream is killed (`kill -9`) a quarter of the way:
/// the executor moves to a survivor, the client resumes its session there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seq_2000000_survives_the_carrying_nodes_kill() {
    use exec_server_client::relay::RelaySource;
    use exec_server_client::{ClientOptions, ExecServerClient, ProcessEvent, Source};
    use std::time::{Duration, Instant};
    let db = TestPostgres::start();
    let mut nodes: Vec<_> = (0..3)
        .map(|_| start_registry(&["--listen", "127.0.0.1:0", "--db", &db.url()]))
        .collect();
    let urls = nodes
        .iter()
        .map(|(_, u)| u.clone())
        .collect::<Vec<_>>()
        .join(",");
    let _executor = start_executor(&urls, "fleet-seq", "exec-token");
    let source = RelaySource::new(&urls, "fleet-seq", "harness-token", None).unwrap();
    let mut opts = ClientOptions::new(Source::relay(source));
    opts.connect_timeout = Duration::from_secs(10);
    opts.recovery_timeout = Duration::from_secs(60);
    let c = ExecServerClient::new(opts);
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.connect().await.is_err() {
        assert!(Instant::now() < deadline, "executor never reachable");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let want = crate::common::expected_seq(2_000_000);
    let mut p = c
        .start_process(crate::common::exec_params("big", &["seq", "1", "2000000"]))
        .await
        .unwrap();
    let mut bytes = Vec::with_capacity(want.len());
    let mut exit = None;
    let mut killed = false;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(60), p.next_event())
            .await
            .expect("event within 60 s");
        match ev {
            Some(ProcessEvent::Output { data, .. }) => {
                bytes.extend_from_slice(&data);
                if !killed && bytes.len() * 4 >= want.len() {
                    killed = true;
                    // The executor registered with the first node.
                    let (first, _) = &mut nodes[0];
                    let _ = first.0.kill();
                    let _ = first.0.wait();
                }
            }
            Some(ProcessEvent::Exited { code, .. }) => exit = Some(code),
            Some(ProcessEvent::Closed { .. }) | None => break,
            Some(ProcessEvent::Failed(why)) => panic!("stream failed: {why}"),
        }
    }
    assert!(killed);
    assert_eq!(exit, Some(0));
    assert!(
        bytes == want,
        "output differs from seq 1 2000000 ({} of {} bytes)",
        bytes.len(),
        want.len()
    );
    assert!(c.recoveries() >= 1, "recoveries: {}", c.recoveries());
}

/// A node stopped with SIGTERM leaves the fleet first: its executor
/// registers with another node at once (no wait for its heartbeat to
/// expire), where clients find it.
#[test]
fn a_node_stopped_with_sigterm_hands_its_executor_over() {
    let db = TestPostgres::start();
    let nodes: Vec<_> = (0..2)
        .map(|_| start_registry(&["--listen", "127.0.0.1:0", "--db", &db.url()]))
        .collect();
    let urls: Vec<String> = nodes.iter().map(|(_, u)| u.clone()).collect();
    let _executor = start_executor(&urls.join(","), "fleet-term", "exec-token");
    wait_ready(&urls[1], "fleet-term", "harness-token");
    let mut nodes = nodes.into_iter();
    let (mut first, _) = nodes.next().unwrap();
    let pid = nix::unistd::Pid::from_raw(first.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = first.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a clean stop");
    let started = std::time::Instant::now();
    wait_ready(&urls[1], "fleet-term", "harness-token");
    let out = run_cli(&urls[1], "fleet-term", "harness-token", &["echo", "moved"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "moved\n");
    eprintln!("executor moved in {:?}", started.elapsed());
}

/// The real Codex harness, given one node, reaches our executor attached to
/// another (skipped without `codex-ref`, as in `remote_mode`).
#[test]
fn the_real_codex_harness_reaches_an_executor_on_another_node() {
    let db = TestPostgres::start();
    let nodes: Vec<_> = (0..2)
        .map(|_| start_registry(&["--listen", "127.0.0.1:0", "--db", &db.url()]))
        .collect();
    let _executor = start_executor(&nodes[0].1, "fleet-codex", "exec-token");
    wait_ready(&nodes[0].1, "fleet-codex", "harness-token");
    codex_harness_runs_a_command(&nodes[1].1, "fleet-codex", "harness-token");
}

/// One executor outlives three nodes, stopped one after another: each time
/// it is found on a survivor within seconds. Its reconnect backoff used to
/// double with every loss and never start again: the third loss cost
/// 30 s and more, past the clients' 25 s session recovery.
#[test]
fn an_executor_outlives_three_node_losses_without_growing_waits() {
    use std::time::{Duration, Instant};
    let db = TestPostgres::start();
    let nodes: Vec<_> = (0..4)
        .map(|_| start_registry(&["--listen", "127.0.0.1:0", "--db", &db.url()]))
        .collect();
    let urls: Vec<String> = nodes.iter().map(|(_, u)| u.clone()).collect();
    // Registers with the first node that answers, then the next, in order.
    let _executor = start_executor(&urls.join(","), "fleet-roll", "exec-token");
    wait_ready(&urls[0], "fleet-roll", "harness-token");
    let mut waits = Vec::new();
    for (i, (mut node, _)) in nodes.into_iter().take(3).enumerate() {
        // Connected for longer than a flapping relay would be.
        std::thread::sleep(Duration::from_secs(6));
        let pid = nix::unistd::Pid::from_raw(node.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let _ = node.0.wait();
        let started = Instant::now();
        let survivors = urls[i + 1..].join(",");
        loop {
            let out = run_cli(&survivors, "fleet-roll", "harness-token", &["true"]);
            if out.status.success() {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(40),
                "loss {}: not found again in 40 s",
                i + 1
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        waits.push(started.elapsed());
    }
    eprintln!("found again after {waits:?}");
    assert!(
        waits.iter().all(|w| *w < Duration::from_secs(6)),
        "found again after {waits:?}"
    );
}

/// An executor started before its registry (a machine behind NAT that
/// boots before the network or the registry is up) waits for it, saying
/// why on stderr, instead of exiting at the first refused connection; then
/// clients reach it.
#[test]
fn an_executor_started_before_its_registry_waits_for_it() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::Duration;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let args = ["--remote", &url, "--environment-id", "early"];
    let mut child = crate::remote_mode::spawn_with_bearer(&args, "exec-token", Stdio::piped());
    let pipe = child.stderr.take().unwrap();
    let _executor = crate::remote_mode::Proc(child);
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let said = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .expect("the executor said nothing about the absent registry");
        if line.contains("cannot register yet") {
            break line;
        }
    };
    assert!(said.contains("Connection refused"), "{said}");
    let (_registry, url) = start_registry(&["--listen", &format!("127.0.0.1:{port}")]);
    wait_ready(&url, "early", "harness-token");
    let out = run_cli(&url, "early", "harness-token", &["echo", "late registry"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "late registry\n");
}
