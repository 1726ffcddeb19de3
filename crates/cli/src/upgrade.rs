//! Upgrading a running server in place: the `exec-server upgrade` command,
//! and the server's side of it (its control socket, `SIGUSR2`, and the
//! report of the image that took over). The procedure itself is
//! `exec_server::handover`.
//!
//! The control socket is `control-<pid>.sock` in this user's runtime base
//! (`$TMPDIR/exec-server-run-<uid>`, mode 0700), hidden from every sandbox.
//! One JSON line each way: the request `{"binary": PATH|null}`, then the
//! [`Outcome`], written by whichever image serves at the end (the new one,
//! or the old one again after a refusal).

use clap::Args;
use exec_server::handover::{self, restore::Adopted};
use exec_server::ServerState;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// How long the server waits for a request line on its control socket: 5 s.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// `exec-server upgrade`.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  exec-server upgrade                                  the only server of this user, to its own path
  exec-server upgrade --pid 4242 --binary /opt/exec-server-1.2/exec-server
  kill -USR2 4242                                      the same as the first, without a report

Sessions, processes (same pids), terminals, output (every byte by seq) and the
listener go to the new binary; clients see their connection drop and resume.
A binary that cannot take over is refused and the server goes on unchanged.")]
pub struct UpgradeArgs {
    /// The server's pid. Default: the only running server of this user
    /// with a control socket.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// The binary to run instead. Default: the server's own path, read
    /// from disk again (a package upgrade replaced it there).
    #[arg(long, value_name = "PATH")]
    pub binary: Option<PathBuf>,
    /// How long to wait for the outcome.
    #[arg(long, value_name = "DURATION", default_value = "60s",
          value_parser = crate::commands::parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Serialize, Deserialize)]
struct UpgradeRequest {
    binary: Option<PathBuf>,
}

/// The answer on the control socket.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// The new binary serves.
    pub ok: bool,
    /// The server's pid (unchanged).
    pub pid: u32,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The version that serves now.
    #[serde(default)]
    pub version: String,
    /// From the request to the new image serving, in milliseconds.
    #[serde(default)]
    pub ms: u64,
    /// Sessions and processes taken over.
    #[serde(default)]
    pub sessions: usize,
    /// Processes taken over.
    #[serde(default)]
    pub processes: usize,
    /// Processes that could not be taken over (killed), with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
}

/// Runs `exec-server upgrade`: exit code 0 when the new binary serves.
pub async fn run(args: UpgradeArgs) -> i32 {
    let base = exec_server::rundir::RuntimeDir::base();
    let socket = match args.pid {
        Some(pid) => exec_server::rundir::control_socket(&base, pid),
        None => {
            let found = exec_server::rundir::control_sockets(&base);
            match found.as_slice() {
                [(_, path)] => path.clone(),
                [] => {
                    eprintln!(
                        "exec-server upgrade: no running server of this user has a control socket \
                         in {} (a server with --listen stdio or --remote has none)",
                        base.display()
                    );
                    return 1;
                }
                many => {
                    let pids: Vec<String> = many.iter().map(|(p, _)| p.to_string()).collect();
                    eprintln!(
                        "exec-server upgrade: several servers run ({}): name one with --pid",
                        pids.join(", ")
                    );
                    return 2;
                }
            }
        }
    };
    let binary = match args.binary.map(std::path::absolute).transpose() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("exec-server upgrade: --binary: {e}");
            return 2;
        }
    };
    let outcome = tokio::time::timeout(args.timeout, ask(&socket, binary)).await;
    match outcome {
        Ok(Ok(o)) if o.ok => {
            println!(
                "upgraded server {} to {} in {} ms: {} sessions, {} processes taken over",
                o.pid, o.version, o.ms, o.sessions, o.processes
            );
            for f in &o.failed {
                eprintln!("exec-server upgrade: not taken over (killed): {f}");
            }
            0
        }
        Ok(Ok(o)) => {
            eprintln!(
                "exec-server upgrade: refused; server {} goes on unchanged: {}",
                o.pid,
                o.error.unwrap_or_default()
            );
            1
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            eprintln!(
                "exec-server upgrade: {}: the server dropped this request; another upgrade was \
                 under way (run this one again once it has finished)",
                socket.display()
            );
            1
        }
        Ok(Err(e)) => {
            eprintln!("exec-server upgrade: {}: {e}", socket.display());
            1
        }
        Err(_) => {
            eprintln!(
                "exec-server upgrade: no outcome within {} s",
                args.timeout.as_secs_f64()
            );
            1
        }
    }
}

async fn ask(socket: &Path, binary: Option<PathBuf>) -> std::io::Result<Outcome> {
    let mut stream = tokio::net::UnixStream::connect(socket).await?;
    let mut line = serde_json::to_vec(&UpgradeRequest { binary }).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line).await?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).await?;
    if reply.trim().is_empty() {
        return Err(std::io::Error::other(
            "the server closed the connection without an outcome (see its log)",
        ));
    }
    serde_json::from_str(&reply).map_err(std::io::Error::other)
}

/// The server's control socket; removed when dropped.
pub struct Control {
    listener: tokio::net::UnixListener,
    path: PathBuf,
}

impl Control {
    /// Binds `control-<pid>.sock` (mode 0600) in this user's runtime base.
    /// `None`, with a warning, where it cannot be made: upgrades then go
    /// through `SIGUSR2` only.
    pub fn bind() -> Option<Control> {
        let base = exec_server::rundir::RuntimeDir::base();
        let path = exec_server::rundir::control_socket(&base, std::process::id());
        let _ = std::fs::remove_file(&path);
        // SAFETY: umask only swaps the process's file mode mask.
        let old = unsafe { libc::umask(0o177) };
        let bound = tokio::net::UnixListener::bind(&path);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        match bound {
            Ok(listener) => Some(Control { listener, path }),
            Err(e) => {
                tracing::warn!(
                    "no upgrade control socket at {} ({e}): `exec-server upgrade` cannot reach \
                     this server; SIGUSR2 still upgrades it",
                    path.display()
                );
                None
            }
        }
    }

    /// The next upgrade request: the binary asked for, and the connection
    /// to answer on. Connections from inside a sandbox, or that send no
    /// request in time, are dropped.
    pub async fn accept(
        &self,
        state: &ServerState,
    ) -> (Option<PathBuf>, std::os::unix::net::UnixStream) {
        loop {
            let Ok((stream, _)) = self.listener.accept().await else {
                continue;
            };
            let verdict = state.sandbox.pids().judge(stream.as_raw_fd());
            if verdict != exec_server::sandbox::peers::Verdict::Outside {
                tracing::warn!("refused an upgrade request from inside a sandbox");
                continue;
            }
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            let read = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await;
            if !matches!(read, Ok(Ok(n)) if n > 0) {
                continue;
            }
            let Ok(request) = serde_json::from_str::<UpgradeRequest>(&line) else {
                continue;
            };
            let Ok(stream) = reader.into_inner().into_std() else {
                continue;
            };
            // Blocking from here on: the answer is one short line.
            let _ = stream.set_nonblocking(false);
            return (request.binary, stream);
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The next signal of `sig`; never when it could not be installed.
pub async fn recv_opt(sig: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match sig {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// The next upgrade request on `control`; never without one.
pub async fn accept_opt(
    control: Option<&Control>,
    state: &ServerState,
) -> (Option<PathBuf>, std::os::unix::net::UnixStream) {
    match control {
        Some(c) => c.accept(state).await,
        None => std::future::pending().await,
    }
}

/// Writes `outcome` as one line on `reply` (best effort: the caller may
/// have given up).
fn answer(mut reply: impl Write, outcome: &Outcome) {
    if let Ok(mut line) = serde_json::to_vec(outcome) {
        line.push(b'\n');
        let _ = reply.write_all(&line);
    }
}

/// What an upgrade hands over of what serves: the listener, or a remote
/// executor's credential. Neither (a stdio server): it cannot upgrade.
#[derive(Default)]
pub struct Target {
    /// The listener's descriptor, kind and URL.
    pub listener: Option<(RawFd, &'static str, String)>,
    /// The remote executor's registration credential.
    pub remote_credential: Option<crate::executor::Credential>,
}

impl Target {
    /// True when an upgrade can hand over what serves.
    pub fn upgradable(&self) -> bool {
        self.listener.is_some() || self.remote_credential.is_some()
    }
}

/// Upgrades to `binary` (default: `own_path`, this server's path as it was
/// started). Returns only when refused, after answering `reply` and logging.
pub async fn perform(
    state: &Arc<ServerState>,
    binary: Option<PathBuf>,
    own_path: &Path,
    target: &Target,
    reply: Option<std::os::unix::net::UnixStream>,
) {
    let request = handover::Request {
        binary: binary.unwrap_or_else(|| own_path.to_path_buf()),
        argv: std::env::args_os().collect(),
        listener: target.listener.clone(),
        reply: reply.as_ref().map(|r| r.as_raw_fd()),
        remote_credential: target.remote_credential.clone(),
    };
    let refusal = state.upgrade(request).await;
    tracing::warn!("upgrade refused; serving on: {refusal}");
    if let Some(reply) = reply {
        answer(
            reply,
            &Outcome {
                ok: false,
                pid: std::process::id(),
                error: Some(refusal.to_string()),
                version: env!("CARGO_PKG_VERSION").into(),
                ..Default::default()
            },
        );
    }
}

/// Tells the `exec-server upgrade` caller (if any) what this image took
/// over, or, when it is the previous binary again, why the new one refused.
pub fn report(control: Option<OwnedFd>, began_ms: u64, refused: Option<&str>, adopted: &Adopted) {
    let ms = handover::now_ms().saturating_sub(began_ms);
    match refused {
        Some(why) => tracing::warn!("upgrade refused by the new binary ({why}); serving on"),
        None => tracing::info!(
            ms,
            sessions = adopted.sessions,
            processes = adopted.processes,
            "upgrade: serving"
        ),
    }
    let Some(fd) = control else { return };
    let outcome = Outcome {
        ok: refused.is_none(),
        pid: std::process::id(),
        error: refused.map(str::to_string),
        version: env!("CARGO_PKG_VERSION").into(),
        ms,
        sessions: adopted.sessions,
        processes: adopted.processes,
        failed: adopted.failed.clone(),
    };
    answer(std::fs::File::from(fd), &outcome);
}

/// `exec-server --handover-check FD`: reads the state document at
/// descriptor `FD` without taking anything over; exit code 0 when this
/// binary can take it over.
pub fn check_state(fd: Option<&std::ffi::OsString>) -> i32 {
    use std::os::fd::FromRawFd;
    let Some(fd) = fd
        .and_then(|f| f.to_str()?.parse::<i32>().ok())
        .filter(|f| *f > 2)
    else {
        eprintln!(
            "exec-server: {} needs a descriptor number",
            handover::CHECK_FLAG
        );
        return 2;
    };
    // SAFETY: the upgrading server passed this descriptor to us; only this
    // short-lived process reads it. `ManuallyDrop`: it stays open for the
    // server (a shared open file description).
    let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    match handover::image::Reader::check(&file) {
        Ok((nonce, sessions, processes)) => {
            println!("ok {nonce} sessions={sessions} processes={processes}");
            0
        }
        Err(e) => {
            eprintln!("exec-server: {e}");
            1
        }
    }
}
