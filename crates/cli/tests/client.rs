//! The client library against the real server: recovery without loss or
//! duplication, ordered events, files, and the embedded (local) environment.

use crate::common::*;
use exec_server_client::{ClientOptions, ExecServerClient, ProcessEvent, Source};
use exec_server_protocol::types::OutputStream;
use exec_server_protocol::PathUri;
use std::time::Duration;

/// Output bytes and exit code of a process, up to its close.
pub(crate) async fn drain(h: &mut exec_server_client::ProcessHandle) -> (Vec<u8>, Option<i32>) {
    let mut out = Vec::new();
    let mut code = None;
    while let Some(ev) = h.next_event().await {
        match ev {
            ProcessEvent::Output { data, .. } => out.extend(data),
            ProcessEvent::Exited { code: c, .. } => code = Some(c),
            ProcessEvent::Closed { .. } => break,
            ProcessEvent::Failed(w) => panic!("{w}"),
        }
    }
    (out, code)
}

pub(crate) fn client(url: &str) -> ExecServerClient {
    ExecServerClient::new(ClientOptions::new(Source::from_url(url, None).unwrap()))
}

/// Drops the connection `drops` times during `seq 1 n`; returns (bytes, exit).
async fn run_with_drops(
    c: &ExecServerClient,
    id: &str,
    n: u64,
    drops: usize,
) -> (Vec<u8>, Option<i32>) {
    let n_s = n.to_string();
    let mut p = c
        .start_process(exec_params(id, &["seq", "1", &n_s]))
        .await
        .unwrap();
    let mut bytes = Vec::new();
    let mut exit = None;
    let total = expected_seq(n).len();
    let mut next_drop = 1;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(30), p.next_event())
            .await
            .expect("event within 30 s");
        match ev {
            Some(ProcessEvent::Output { stream, data, .. }) => {
                assert_eq!(stream, OutputStream::Stdout);
                bytes.extend_from_slice(&data);
                if next_drop <= drops && bytes.len() * (drops + 1) >= total * next_drop {
                    next_drop += 1;
                    c.drop_connection().await;
                }
            }
            Some(ProcessEvent::Exited { code, .. }) => exit = Some(code),
            Some(ProcessEvent::Closed { .. }) | None => break,
            Some(ProcessEvent::Failed(why)) => panic!("stream failed: {why}"),
        }
    }
    (bytes, exit)
}

/// Killing the connection in the middle of `seq 1 2000000` loses and duplicates nothing.
#[tokio::test]
async fn drop_during_seq_2000000_loses_nothing() {
    let s = Server::start(&[]);
    let c = client(&s.url);
    let (bytes, exit) = run_with_drops(&c, "big", 2_000_000, 3).await;
    assert_eq!(exit, Some(0));
    assert!(
        bytes == expected_seq(2_000_000),
        "output differs from seq 1 2000000 ({} bytes)",
        bytes.len()
    );
    assert!(
        c.recoveries() >= 1,
        "the connection was really dropped and resumed"
    );
}

/// Many drops during one fast stream, bounded in count and time.
#[tokio::test]
async fn repeated_drops_during_a_fast_stream() {
    let s = Server::start(&[]);
    let c = client(&s.url);
    for round in 0..3 {
        let (bytes, exit) = run_with_drops(&c, &format!("r{round}"), 300_000, 10).await;
        assert_eq!(exit, Some(0));
        assert!(
            bytes == expected_seq(300_000),
            "round {round}: {} bytes",
            bytes.len()
        );
    }
    assert!(c.recoveries() >= 3, "at least one resume per round");
}

#[tokio::test]
async fn stdin_write_close_and_files() {
    let s = Server::start(&[]);
    let c = client(&s.url);
    let mut p = exec_params("wc", &["wc", "-c"]);
    p.pipe_stdin = true;
    let mut h = c.start_process(p).await.unwrap();
    h.write(b"hello".to_vec()).await.unwrap();
    h.close_stdin().await.unwrap();
    let (out, code) = drain(&mut h).await;
    assert_eq!((String::from_utf8_lossy(&out).trim(), code), ("5", Some(0)));

    let d = tmpdir("client-fs");
    let f = PathUri::from_path(&d.join("blob")).unwrap();
    let data: Vec<u8> = (0..3_500_000u32).map(|i| (i * 7 % 251) as u8).collect();
    c.upload(&mut &data[..], &f).await.unwrap();
    let mut back = Vec::new();
    assert_eq!(c.download(&f, &mut back).await.unwrap(), data.len() as u64);
    assert!(back == data);
    assert_eq!(c.read_file(&f).await.unwrap().len(), data.len());
    let meta = c.metadata(&f).await.unwrap();
    assert_eq!((meta.is_file, meta.size), (true, data.len() as u64));
    let missing = PathUri::from_path(&d.join("nope")).unwrap();
    match c.read_file(&missing).await {
        Err(exec_server_client::ClientError::Server(e)) => assert_eq!(e.code, -32004),
        other => panic!("{other:?}"),
    }
}

/// A terminal sends a chunk per line: 200 000 short lines are 200 000
/// chunks in 1.3 MB, four times the server's 49 999-chunk window while far
/// under its 8 MiB. The client acknowledges by count as well as by bytes, so
/// the stream never waits on an acknowledgement that only bytes would send
/// (it stalled at about 430 KB before).
#[tokio::test]
async fn a_terminal_printing_many_short_lines_is_not_held_by_the_window() {
    let s = Server::start(&[]);
    let c = client(&s.url);
    let mut p = exec_params("lines", &["seq", "1", "200000"]);
    p.tty = true;
    let mut h = c.start_process(p).await.unwrap();
    let (out, code) = tokio::time::timeout(Duration::from_secs(60), drain(&mut h))
        .await
        .expect("the whole output within 60 s");
    // The terminal turns each newline into CR LF.
    let want: Vec<u8> = expected_seq(200_000)
        .split_inclusive(|b| *b == b'\n')
        .flat_map(|line| [&line[..line.len() - 1], b"\r\n"].concat())
        .collect();
    assert_eq!(code, Some(0));
    assert_eq!(
        out.len(),
        want.len(),
        "first difference at {:?}",
        first_difference(&out, &want)
    );
    assert!(out == want);
}

/// The local environment runs the same protocol in-process.
#[tokio::test]
async fn local_environment_runs_in_process() {
    let env = exec_server_client::environment::Environment::local().unwrap();
    assert!(env.is_local());
    let mut h = env
        .client
        .start_process(exec_params("l", &["sh", "-c", "echo local; exit 4"]))
        .await
        .unwrap();
    let (out, code) = drain(&mut h).await;
    assert_eq!((out.as_slice(), code), (&b"local\n"[..], Some(4)));
    // In-process messages cross as shared bytes: output is never base64.
    assert!(env.client.binary_frames().await);
    let mut h = env
        .client
        .start_process(exec_params("l2", &["seq", "1", "300000"]))
        .await
        .unwrap();
    let (out, code) = drain(&mut h).await;
    assert_eq!(code, Some(0));
    assert!(out == expected_seq(300_000));
}

/// A file uploads byte for byte whether its blocks travel as binary frames
/// (WebSocket: each sent from the buffer it was read into, masked there)
/// or as base64 in JSON text (a Unix socket carries no binary frames).
#[tokio::test]
async fn a_file_uploads_exactly_as_binary_frames_and_as_base64() {
    let d = tmpdir("client-upload");
    let src = d.join("src");
    // Five and a half blocks: the last one short.
    let data: Vec<u8> = (0..5_767_169u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let ws = Server::start(&[]);
    let sock = d.join("s.sock");
    let unix_url = format!("unix://{}", sock.display());
    let mut unix = crate::common::server_command(BIN)
        .args(["--listen", &unix_url])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(first_stdout_line(&mut unix), unix_url);
    for (name, url) in [("ws", ws.url.as_str()), ("unix", unix_url.as_str())] {
        let c = client(url);
        let dst = d.join(format!("dst-{name}"));
        let sent = c
            .upload_from_file(
                std::fs::File::open(&src).unwrap(),
                &PathUri::from_path(&dst).unwrap(),
                |_| {},
            )
            .await
            .unwrap();
        assert_eq!(sent, data.len() as u64, "{name}");
        assert!(
            std::fs::read(&dst).unwrap() == data,
            "{name}: contents differ"
        );
    }
    let _ = unix.kill();
    let _ = unix.wait();
    std::fs::remove_dir_all(&d).unwrap();
}

/// Two embedded servers in one process, configured apart, each keep their
/// own configuration: tool directories on their children's PATH, and
/// per-process cgroups (with the caps they hold) on for one and off for
/// the other. Once, the first server's tool directories won process-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_embedded_servers_keep_their_own_configuration() {
    use exec_server_client::{Command, ServerConfig};
    let dirs = [tmpdir("embed-a"), tmpdir("embed-b")];
    let mut clients = Vec::new();
    for (dir, cgroups) in dirs.iter().zip([true, false]) {
        let config = ServerConfig {
            prepend_path: vec![dir.clone()],
            process_cgroups: cgroups,
            ..ServerConfig::default()
        };
        let source = Source::embedded_with(config).unwrap();
        clients.push(ExecServerClient::new(ClientOptions::new(source)));
    }
    for (c, dir) in clients.iter().zip(&dirs) {
        let out = Command::new("sh")
            .args(["-c", "echo $PATH"])
            .inherit_env()
            .spawn(c)
            .await
            .unwrap()
            .wait_with_output(1 << 16)
            .await
            .unwrap();
        let path = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            path.starts_with(&format!("{}:", dir.display())),
            "PATH led by this server's own tool directory {}: {path}",
            dir.display()
        );
    }
    let caps: Vec<_> = futures_util::future::join_all(clients.iter().map(|c| c.environment_info()))
        .await
        .into_iter()
        .map(|i| i.unwrap().capabilities["processTasksLimit"])
        .collect();
    assert_eq!(caps, [true, false], "cgroups on for one server only");
    let capped = Command::new("true").max_tasks(16);
    let ok = capped
        .spawn(&clients[0])
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(ok, 0);
    let Err(refused) = capped.spawn(&clients[1]).await else {
        panic!("a task cap was accepted by a server without cgroups");
    };
    assert_eq!(refused.code(), Some(-32602), "{refused}");
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// `fs/watch` through the library: a created file is reported, a dropped
/// connection is recovered with a "look again", and removing the watched
/// directory's parent ends the watch.
#[tokio::test]
async fn a_watch_reports_changes_recovery_and_its_end() {
    use exec_server_client::WatchEvent;
    let s = Server::start(&[]);
    let c = client(&s.url);
    let parent = tmpdir("client-watch");
    let d = parent.join("watched");
    std::fs::create_dir(&d).unwrap();
    let uri = PathUri::from_path(&d).unwrap();
    let mut w = c.watch(&uri, false).await.unwrap();
    std::fs::write(d.join("new.txt"), b"x").unwrap();
    let created = loop {
        match next_event(&mut w).await {
            Some(WatchEvent::Changed { kind, paths }) if kind == "create" => break paths,
            Some(_) => continue,
            None => panic!("the watch ended"),
        }
    };
    assert!(
        created.iter().any(|p| p.as_str().ends_with("/new.txt")),
        "{created:?}"
    );
    c.drop_connection().await;
    c.connect().await.unwrap();
    // Events of the write before the drop may come first; then the
    // recovered watch's "look again".
    let look_again = WatchEvent::Changed {
        kind: "other".into(),
        paths: vec![uri.clone()],
    };
    loop {
        match next_event(&mut w).await {
            Some(e) if e == look_again => break,
            Some(WatchEvent::Changed { .. }) => continue,
            other => panic!("{other:?}"),
        }
    }
    std::fs::remove_dir_all(&parent).unwrap();
    let ended = loop {
        match next_event(&mut w).await {
            Some(WatchEvent::Ended { reason }) => break reason,
            Some(_) => continue,
            None => panic!("no end event"),
        }
    };
    assert!(!ended.is_empty());
    assert_eq!(next_event(&mut w).await, None);
}

async fn next_event(w: &mut exec_server_client::Watch) -> Option<exec_server_client::WatchEvent> {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("a watch event within 10 s")
}
