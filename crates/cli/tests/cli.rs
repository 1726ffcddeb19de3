//! The `exec-server` command line, driven as a user would.

use crate::common;
use common::*;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn run(args: &[&str], stdin: &[u8]) -> (i32, Vec<u8>, Vec<u8>) {
    let mut child = crate::common::server_command(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), out.stdout, out.stderr)
}

#[test]
fn run_embedded_exit_codes_and_streams() {
    let (code, out, err) = run(
        &["run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"],
        b"",
    );
    assert_eq!(
        (code, out.as_slice(), err.as_slice()),
        (7, &b"out\n"[..], &b"err\n"[..])
    );
    let (code, _, _) = run(&["run", "--", "sh", "-c", "kill -TERM $$"], b"");
    assert_eq!(code, 143);
    let (code, _, err) = run(&["run", "--", "/nonexistent/program"], b"");
    assert_eq!(code, 127);
    assert!(
        String::from_utf8_lossy(&err).contains("cannot start `/nonexistent/program`"),
        "{}",
        String::from_utf8_lossy(&err)
    );
}

#[test]
fn run_forwards_stdin_and_its_end() {
    let (code, out, _) = run(&["run", "--", "wc", "-c"], b"hello world");
    assert_eq!((code, String::from_utf8_lossy(&out).trim()), (0, "11"));
    let input: Vec<u8> = (0..200_000u32).map(|i| (i % 256) as u8).collect();
    let (code, out, _) = run(&["run", "--", "cat"], &input);
    assert_eq!(code, 0);
    assert!(out == input, "binary stdin/stdout round trip differs");
}

#[test]
fn run_output_is_binary_safe() {
    let d = tmpdir("bin");
    let all: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    std::fs::write(d.join("all"), &all).unwrap();
    let path = d.join("all").display().to_string();
    let (code, out, _) = run(&["run", "--", "cat", &path], b"");
    assert_eq!(code, 0);
    assert!(out == all);
}

#[tokio::test]
async fn run_and_fs_against_a_server() {
    let s = Server::start(&[]);
    let d = tmpdir("clifs");
    let url = s.url.clone();
    let (code, out, _) = run(
        &[
            "run",
            "--connect",
            &url,
            "--cwd",
            &d.display().to_string(),
            "--",
            "pwd",
        ],
        b"",
    );
    assert_eq!(
        (code, String::from_utf8_lossy(&out).trim()),
        (0, d.display().to_string().as_str())
    );
    let local = d.join("local.bin");
    let data: Vec<u8> = (0..2_500_000u32).map(|i| (i * 31 % 253) as u8).collect();
    std::fs::write(&local, &data).unwrap();
    let remote = d.join("remote.bin").display().to_string();
    let (code, _, err) = run(
        &[
            "fs",
            "--connect",
            &url,
            "put",
            &local.display().to_string(),
            &remote,
        ],
        b"",
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let back = d.join("back.bin");
    let (code, _, _) = run(
        &[
            "fs",
            "get",
            "--connect",
            &url,
            &remote,
            &back.display().to_string(),
        ],
        b"",
    );
    assert_eq!(code, 0);
    assert!(std::fs::read(&back).unwrap() == data);
    // A source that is not a regular file (a pipe) is read in order, not
    // by position.
    let piped = d.join("piped.bin");
    let (code, _, err) = run(
        &[
            "fs",
            "--connect",
            &url,
            "put",
            "/dev/stdin",
            &piped.display().to_string(),
        ],
        &data,
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    assert!(std::fs::read(&piped).unwrap() == data);
    // A failed download leaves an existing local file untouched.
    let (code, _, _) = run(
        &[
            "fs",
            "--connect",
            &url,
            "get",
            "/nonexistent/x",
            &back.display().to_string(),
        ],
        b"",
    );
    assert_eq!(code, 1);
    assert!(std::fs::read(&back).unwrap() == data);
    let (code, out, _) = run(
        &["fs", "--connect", &url, "ls", &d.display().to_string()],
        b"",
    );
    assert_eq!(code, 0);
    let listing = String::from_utf8_lossy(&out);
    assert!(
        listing.contains("remote.bin") && listing.contains("local.bin"),
        "{listing}"
    );
    let (code, _, err) = run(
        &[
            "fs",
            "--connect",
            &url,
            "mkdir",
            &d.join("a/b/c").display().to_string(),
        ],
        b"",
    );
    assert_eq!(code, 1);
    assert!(String::from_utf8_lossy(&err).contains("use -p"));
    let (code, out, _) = run(&["info", "--connect", &url], b"");
    assert_eq!(code, 0);
    let info: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(info["capabilities"]["processCloseStdin"], true);
}

#[test]
fn token_auth_hint() {
    let d = tmpdir("tok");
    let tf = d.join("token");
    std::fs::write(&tf, "s3cret-token\n").unwrap();
    let s = Server::start(&[
        "--ws-auth",
        "capability-token",
        "--ws-token-file",
        &tf.display().to_string(),
    ]);
    let (code, _, err) = run(&["info", "--connect", &s.url], b"");
    assert_eq!(code, 1);
    assert!(
        String::from_utf8_lossy(&err).contains("--token-file"),
        "{}",
        String::from_utf8_lossy(&err)
    );
    let (code, _, _) = run(
        &[
            "info",
            "--connect",
            &s.url,
            "--token-file",
            &tf.display().to_string(),
        ],
        b"",
    );
    assert_eq!(code, 0);
}

/// `run -t` and `shell` under a real pseudo-terminal: raw mode, the remote PTY,
/// and the local terminal restored afterwards.
#[test]
fn tty_under_a_pseudo_terminal() {
    let pty = nix::pty::openpty(None, None).unwrap();
    let before = nix::sys::termios::tcgetattr(&pty.slave).unwrap();
    let mut child = crate::common::server_command(BIN)
        .args(["shell"])
        .env("SHELL", "/bin/sh")
        .stdin(Stdio::from(pty.slave.try_clone().unwrap()))
        .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
        .stderr(Stdio::from(pty.slave.try_clone().unwrap()))
        .spawn()
        .unwrap();
    let mut master = std::fs::File::from(pty.master);
    let fd = master.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        )
    };
    master
        .write_all(b"tty; echo marker-$((40+2)); exit 3\n")
        .unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut exited = false;
    // The shell's last output can reach the master after the CLI exits (a
    // terminal's buffer is pushed to the master asynchronously): read on
    // until both are seen.
    loop {
        let mut buf = [0u8; 4096];
        match master.read(&mut buf) {
            Ok(n) if n > 0 => seen.extend_from_slice(&buf[..n]),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
        exited = exited || child.try_wait().unwrap().is_some();
        if exited && String::from_utf8_lossy(&seen).contains("marker-42") {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "shell exited: {exited}; saw {:?}",
                String::from_utf8_lossy(&seen)
            );
        }
    }
    // Reaped already: the status kept by `try_wait`.
    let status = child.wait().unwrap();
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("marker-42"), "{text}");
    assert!(text.contains("/dev/pts/"), "{text}");
    assert_eq!(status.code(), Some(3));
    let after = nix::sys::termios::tcgetattr(&pty.slave).unwrap();
    assert_eq!(before.local_flags, after.local_flags, "terminal restored");
    assert_eq!(before.input_flags, after.input_flags, "terminal restored");
}

#[test]
fn signed_bearer_token_auth() {
    use jsonwebtoken::{encode, EncodingKey, Header};
    let d = tmpdir("jwt");
    let secret = "0123456789abcdef0123456789abcdef-secret";
    let sf = d.join("secret");
    std::fs::write(&sf, secret).unwrap();
    let s = Server::start(&[
        "--ws-auth",
        "signed-bearer-token",
        "--ws-shared-secret-file",
        &sf.display().to_string(),
        "--ws-audience",
        "exec",
    ]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let make = |exp: u64, aud: &str| {
        encode(
            &Header::default(),
            &serde_json::json!({"exp": exp, "aud": aud}),
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    };
    let tf = d.join("token");
    std::fs::write(&tf, make(now + 300, "exec")).unwrap();
    let (code, _, err) = run(
        &[
            "info",
            "--connect",
            &s.url,
            "--token-file",
            &tf.display().to_string(),
        ],
        b"",
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    std::fs::write(&tf, make(now - 3600, "exec")).unwrap();
    let (code, _, _) = run(
        &[
            "info",
            "--connect",
            &s.url,
            "--token-file",
            &tf.display().to_string(),
        ],
        b"",
    );
    assert_eq!(code, 1, "expired token refused");
    std::fs::write(&tf, make(now + 300, "other")).unwrap();
    let (code, _, _) = run(
        &[
            "info",
            "--connect",
            &s.url,
            "--token-file",
            &tf.display().to_string(),
        ],
        b"",
    );
    assert_eq!(code, 1, "wrong audience refused");
    // Flag misuse is a start-up error.
    let out = crate::common::server_command(BIN)
        .args([
            "--ws-auth",
            "signed-bearer-token",
            "--ws-shared-secret-file",
            "relative",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// `exec-server run … | head -c 4` with stdin still open: when the reader of
/// its stdout goes away, `run` ends at once (without waiting for stdin's end
/// or for the command) and stops the command on the server.
#[tokio::test]
async fn run_ends_when_its_stdout_reader_goes_away_even_with_stdin_open() {
    let marker = format!("stdout-gone-{}", std::process::id());
    let mut child = crate::common::server_command(BIN)
        .args(["run", "--", "sh", "-c"])
        // Well over the 1 MiB stdout pipe `run` asks for: the reader leaves
        // while output is still pending.
        .arg(format!("head -c 4000000 /dev/zero; sleep 30; : {marker}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 4];
    out.read_exact(&mut first).unwrap();
    assert_eq!(first, [0u8; 4]);
    drop(out);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(stdin);
    assert!(
        status.is_some(),
        "run still running 10 s after its reader left"
    );
    assert!(
        eventually(Duration::from_secs(5), || pids_matching(&marker).is_empty()).await,
        "the command was left running"
    );
}

/// Embedded `run` with its stdout and stderr on pipes has the server splice
/// the command's output straight into them (`exec_server::OutputSinks`):
/// every byte arrives, each stream on its own descriptor, and the exit code
/// after.
#[test]
fn run_output_spliced_into_pipes_arrives_whole_on_each_stream() {
    let (code, out, err) = run(
        &[
            "run",
            "--",
            "sh",
            "-c",
            "seq 1 400000; seq 400001 500000 >&2; seq 500001 500010; exit 5",
        ],
        b"",
    );
    let lines = |r: std::ops::RangeInclusive<u32>| r.map(|i| format!("{i}\n")).collect::<String>();
    let want_out = lines(1..=400_000) + &lines(500_001..=500_010);
    assert_eq!(code, 5);
    assert!(
        out == want_out.as_bytes(),
        "stdout differs ({} bytes)",
        out.len()
    );
    assert!(
        err == lines(400_001..=500_000).as_bytes(),
        "stderr differs ({} bytes)",
        err.len()
    );
}

/// Nobody reads `run`'s stdout: the pipe fills, and the command's deadline
/// still ends it (the server waits for room in the pipe with its limits
/// going on). `run` itself stays until its output is read, as before.
#[test]
fn run_deadline_fires_while_nobody_reads_its_stdout() {
    let d = tmpdir("unread");
    let pid_file = d.join("pid");
    let mut child = crate::common::server_command(BIN)
        .args(["run", "--timeout", "1s", "--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec yes", pid_file.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let unread = child.stdout.take().unwrap();
    let started = Instant::now();
    let mut pid = None;
    let mut ended = false;
    while started.elapsed() < Duration::from_secs(10) {
        if pid.is_none() {
            pid = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok());
        }
        if let Some(p) = pid {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // Gone, or a zombie about to be collected.
            if stat.is_empty() || stat.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')) {
                ended = true;
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(unread);
    assert!(pid.is_some(), "the command never started");
    assert!(ended, "`yes` still ran 10 s after its 1 s deadline");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "ended before its deadline"
    );
}

/// A command printing a line at a time, with `run`'s stdout read only after
/// its stderr says `done`: the lines wait in the stdout pipe as they would
/// if the command wrote there itself (spliced one by one, each would take
/// one of the pipe's 256 buffer slots, and the 257th would hold `done` up).
#[test]
fn lines_wait_in_runs_stdout_pipe_while_its_stderr_is_read() {
    let mut child = crate::common::server_command(BIN)
        .args(["run", "--", "sh", "-c"])
        .arg("i=0; while [ $i -lt 400 ]; do echo $i; i=$((i+1)); sleep 0.002; done; echo done >&2")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        let _ = tx.send(err);
    });
    let err = rx.recv_timeout(Duration::from_secs(20));
    if err.is_err() {
        let _ = child.kill();
    }
    let mut out = String::new();
    stdout.read_to_string(&mut out).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        err.as_deref().map(str::trim),
        Ok("done"),
        "stderr held up behind unread stdout"
    );
    assert_eq!(status.code(), Some(0));
    let want: String = (0..400).map(|i| format!("{i}\n")).collect();
    assert!(out == want, "stdout differs: {} bytes", out.len());
}

/// `run --max-output` into a pipe that is full when the command writes:
/// the bytes within the cap, read while the pipe had no room, still reach
/// the reader once it reads; nothing past the cap does. (The pipe is read
/// once the command is gone; the server reads its output as it comes.)
#[test]
fn output_within_the_cap_reaches_a_pipe_that_was_full() {
    const FILL: usize = 1024 * 1024;
    let d = tmpdir("capfull");
    let pid_file = d.join("pid");
    let (r, w) = nix::unistd::pipe().unwrap();
    // As large as `run` asks for, and full before it starts.
    nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(FILL as i32)).unwrap();
    let mut writer = std::fs::File::from(w.try_clone().unwrap());
    writer.write_all(&vec![b'f'; FILL]).unwrap();
    let mut child = crate::common::server_command(BIN)
        .args(["run", "--max-output", "5000", "--", "sh", "-c"])
        .arg(format!(
            "echo $$ > {}; exec head -c 8000 /dev/zero",
            pid_file.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::from(w))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(writer);
    let started = Instant::now();
    let gone = loop {
        let pid = std::fs::read_to_string(&pid_file).unwrap_or_default();
        let pid = pid.trim();
        if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            break true;
        }
        if started.elapsed() > Duration::from_secs(10) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut reader = std::fs::File::from(r);
    let mut filler = vec![0u8; FILL];
    reader.read_exact(&mut filler).unwrap();
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(gone, "the command never ended");
    assert_eq!(status.code(), Some(124), "ended by the cap");
    assert_eq!(rest.len(), 5000, "bytes within the cap after the filler");
    assert!(rest.iter().all(|b| *b == 0));
}
