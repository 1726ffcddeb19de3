//! Upgrading the server without stopping what it runs.
//!
//! The running server `execve`s the new binary **in place**: the pid stays,
//! so every command stays its child (its exit status can still be waited
//! for), and every descriptor whose close-on-exec flag is cleared stays
//! open: the listener, each process's pipes or PTY master, the spool
//! files, the runtime directory's lock. Everything else (sessions, output
//! logs with their seqs, writeIds, pending stdin, limits and their
//! deadlines, cgroups, sandbox placeholders) goes as a versioned document
//! ([`image`]) in a memfd. Connections close with the old image; clients
//! resume their sessions on the new one and read on by seq.
//!
//! Safe failure, in three layers:
//! 1. **Before anything stops** ([`preflight`]): the new binary must run
//!    and list this document's version (`--handover-version`); a process
//!    behind a managed network proxy (held in this image's memory) refuses
//!    the upgrade. A refusal leaves the server exactly as it was.
//! 2. **After the `execve`**: a new image that cannot read the document
//!    gives it back to the previous binary (kept open as a descriptor of
//!    `/proc/self/exe`), which takes everything over again and tells the
//!    `exec-server upgrade` caller why.
//! 3. If `execve` itself fails, the same fallback runs from here.
//!
//! Connections do not cross: their sockets close at the `execve`, which is
//! what a client already survives (resume by session id).

pub mod image;
pub mod restore;

use crate::process::handover::Parked;
use crate::ServerState;
use image::{ListenerDoc, SessionDoc, StateDoc};
use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long the new binary has to answer `--handover-version`: 10 s.
pub const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(10);

/// The flag the new binary answers with the state versions it reads.
pub const VERSION_FLAG: &str = "--handover-version";

/// What an upgrade is asked to do.
pub struct Request {
    /// The binary to run.
    pub binary: PathBuf,
    /// Its arguments, `argv[0]` first (this process's own: same flags).
    pub argv: Vec<OsString>,
    /// The listener to hand over: its descriptor, `ws` or `unix`, its URL.
    pub listener: Option<(RawFd, &'static str, String)>,
    /// The `exec-server upgrade` connection that waits for the outcome.
    pub reply: Option<RawFd>,
    /// A remote executor's registration credential and whether registry
    /// error bodies may be shown: read from stdin once, by the first binary.
    pub remote_credential: Option<(String, bool)>,
}

/// Why an upgrade did not happen (the server goes on as it was).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The new binary cannot run, or refused.
    #[error("{binary}: {why}")]
    Binary {
        /// The binary.
        binary: PathBuf,
        /// Why.
        why: String,
    },
    /// Something running cannot be handed over yet.
    #[error("{0}")]
    Unsupported(String),
    /// The document could not be prepared.
    #[error("cannot prepare the state document: {0}")]
    Io(#[from] std::io::Error),
}

/// The line `--handover-version` prints: `exec-server <version>
/// handover-state <v>[,<v>…]`.
pub fn version_line() -> String {
    let versions: Vec<String> = image::READS_VERSIONS
        .iter()
        .map(|v| v.to_string())
        .collect();
    format!(
        "exec-server {} handover-state {}",
        env!("CARGO_PKG_VERSION"),
        versions.join(",")
    )
}

/// Checks, with nothing stopped, that `binary` runs and reads this
/// server's state version. Returns its version line.
pub async fn preflight(binary: &Path) -> Result<String, Refusal> {
    let refuse = |why: String| Refusal::Binary {
        binary: binary.to_path_buf(),
        why,
    };
    let mut cmd = std::process::Command::new(binary);
    cmd.arg(VERSION_FLAG)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    // Through the reaper, which waits for every child of this server.
    let (mut child, exit) = crate::reaper::spawn_command(&mut cmd)
        .map_err(|e| refuse(format!("cannot run it: {e}")))?;
    let pid = child.id();
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let output = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let read = |r: Option<Box<dyn Read>>| {
            let mut text = Vec::new();
            if let Some(r) = r {
                let _ = r.take(64 * 1024).read_to_end(&mut text);
            }
            text
        };
        (
            read(stdout.map(|s| Box::new(s) as Box<dyn Read>)),
            read(stderr.map(|s| Box::new(s) as Box<dyn Read>)),
        )
    });
    let status = match tokio::time::timeout(PREFLIGHT_TIMEOUT, exit).await {
        Ok(Ok(exit)) => exit.code,
        Ok(Err(_)) => -1,
        Err(_) => {
            crate::process::kill::kill_tree(pid);
            return Err(refuse(format!(
                "it did not answer {VERSION_FLAG} within {} s",
                PREFLIGHT_TIMEOUT.as_secs()
            )));
        }
    };
    let (stdout, stderr) = output.await.unwrap_or_default();
    let text = String::from_utf8_lossy(&stdout).trim().to_string();
    let versions = text
        .split_once(" handover-state ")
        .map(|(_, v)| v.trim())
        .filter(|_| status == 0);
    let Some(versions) = versions else {
        let err = String::from_utf8_lossy(&stderr);
        let err = err.lines().next().unwrap_or("").trim();
        return Err(refuse(format!(
            "it does not take over a running server ({VERSION_FLAG} exited {} {err:?}): an \
             exec-server binary older than this feature, or not exec-server at all",
            status
        )));
    };
    let reads: Vec<u32> = versions
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    if !reads.contains(&image::STATE_VERSION) {
        return Err(refuse(format!(
            "it reads state versions {reads:?} and this server writes version {}: a downgrade \
             to a binary that does not understand the running state is refused",
            image::STATE_VERSION
        )));
    }
    Ok(text)
}

/// The flag the new binary answers by reading a state document (its
/// descriptor number follows) without taking anything over.
pub const CHECK_FLAG: &str = "--handover-check";

/// Runs `binary --handover-check <memfd>` and waits up to
/// [`PREFLIGHT_TIMEOUT`]: the new binary must read this very document
/// before it replaces this image. Called with the reaper frozen, so the
/// child is waited for here, not through it. Errors: why not.
fn check_state(binary: &Path, memfd: &std::fs::File, nonce: &str) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new(binary)
        .arg(CHECK_FLAG)
        .arg(memfd.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // A group of its own: a check that hangs is killed with whatever
        // it started.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run it: {e}"))?;
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let deadline = std::time::Instant::now() + PREFLIGHT_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Ok(None) => {
                let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                return Err(format!(
                    "it did not read the state within {} s",
                    PREFLIGHT_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for it: {e}")),
        }
    };
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        use std::io::Read;
        let _ = (&mut o).take(4096).read_to_string(&mut out);
    }
    // The document's nonce proves the check read this very document.
    if status.success() && out.split_whitespace().any(|w| w == nonce) {
        return Ok(());
    }
    if status.success() {
        return Err("it answered without reading the state (no nonce in its answer)".into());
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = (&mut e).take(4096).read_to_string(&mut err);
    }
    Err(format!(
        "it cannot read the state ({status}): {}",
        err.lines().last().unwrap_or("").trim()
    ))
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl ServerState {
    /// Hands every session, process and the listener to `request.binary`,
    /// which replaces this image (same pid). Returns only if the upgrade
    /// was refused before anything stopped: the server goes on as before.
    /// Past that point it never returns: the new binary, or the previous
    /// one again, serves.
    pub async fn upgrade(self: &Arc<Self>, request: Request) -> Refusal {
        match self.hand_over(request).await {
            Ok(never) => match never {},
            Err(refusal) => refusal,
        }
    }

    async fn hand_over(
        self: &Arc<Self>,
        request: Request,
    ) -> Result<std::convert::Infallible, Refusal> {
        let began_ms = now_ms();
        preflight(&request.binary).await?;
        for session in self.sessions.all() {
            if let Some(p) = session.processes().iter().find(|p| p.holds_unmovable()) {
                return Err(Refusal::Unsupported(format!(
                    "process {:?} (pid {}) runs behind a managed network proxy, which cannot be \
                     handed over yet: upgrade once it has exited",
                    p.id, p.pid
                )));
            }
        }
        let memfd = image::memfd()?;
        let previous = std::fs::File::open("/proc/self/exe")?;
        let binary = CString::new(request.binary.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::other("the binary's path holds a NUL byte"))?;
        // The point of no return: every process parks, none starts.
        tracing::info!(binary = %request.binary.display(), "upgrade: handing over");
        self.host.handover.raise();
        self.sessions.freeze();
        // Not commands: nothing of them is handed over.
        self.host.warm.drain().await;
        let mut writer = image::Writer::default();
        let mut parked: Vec<Parked> = Vec::new();
        let mut parked_of: Vec<(Arc<crate::session::Session>, usize)> = Vec::new();
        for session in self.sessions.all() {
            let before = parked.len();
            for p in session.processes() {
                if let Some(one) = p.park().await {
                    parked.push(one);
                }
            }
            parked_of.push((session, parked.len() - before));
        }
        // Every exit is now either delivered to a parked receiver or still
        // waitable: no wait collects a child until the `execve`.
        let frozen_reaper = crate::reaper::freeze()?;
        let mut sessions = Vec::with_capacity(parked_of.len());
        let mut rest = parked.iter_mut();
        for (session, n) in &parked_of {
            let processes = rest
                .by_ref()
                .take(*n)
                .map(|p| p.write(&mut writer))
                .collect();
            sessions.push(SessionDoc {
                id: session.id.clone(),
                processes,
                leftovers: session.leftovers().iter().map(|g| g.parts()).collect(),
                watches: session.watches.docs(),
            });
        }
        let doc = StateDoc {
            nonce: crate::rundir::short_id(),
            written_by: env!("CARGO_PKG_VERSION").to_string(),
            began_ms,
            listener: request
                .listener
                .as_ref()
                .map(|(fd, kind, url)| ListenerDoc {
                    fd: writer.keep(*fd),
                    kind: kind.to_string(),
                    url: url.clone(),
                }),
            control: request.reply.map(|r| writer.keep(r)),
            previous_exe: Some(writer.keep(previous.as_raw_fd())),
            rundir: self
                .runtime_dir
                .as_ref()
                .ok()
                .map(|d| (d.path().to_path_buf(), writer.keep(d.lock_fd()))),
            cgroups: self.host.cgroups.parts(),
            sessions,
            remote_credential: request.remote_credential.clone(),
        };
        if let Err(e) = writer.finish(&doc, &memfd) {
            // Nothing can resume the parked processes in this image.
            tracing::error!("upgrade: cannot write the state document: {e}; exiting");
            std::process::exit(70);
        }
        let argv = request.argv.clone();
        let (memfd_fd, previous_fd) = (memfd.as_raw_fd(), previous.as_raw_fd());
        if let Err(why) = check_state(&request.binary, &memfd, &doc.nonce) {
            tracing::error!("upgrade: {}: {why}", request.binary.display());
            let why = format!("{}: {why}", request.binary.display());
            let err = exec_fd(previous_fd, argv, memfd_fd, why);
            tracing::error!("upgrade: cannot execute the previous binary again: {err}; exiting");
            std::process::exit(70);
        }
        let err = {
            let argv = argv.clone();
            crate::launcher::run(move || exec(&binary, &argv, memfd_fd, previous_fd))
        };
        tracing::error!(
            "upgrade: cannot execute {}: {err}",
            request.binary.display()
        );
        let why = format!("cannot execute the new binary: {err}");
        let err = exec_fd(previous_fd, argv, memfd_fd, why);
        tracing::error!("upgrade: cannot execute the previous binary again either: {err}; exiting");
        drop((frozen_reaper, parked, request));
        std::process::exit(70);
    }
}

/// The environment of the next image: this one's, with the document's
/// descriptor named and `refused` (why the state comes back) when set.
fn next_env(memfd: RawFd, previous: Option<RawFd>, refused: Option<&str>) -> Vec<CString> {
    let ours = [
        image::STATE_FD_ENV,
        image::REFUSED_ENV,
        restore::PREVIOUS_FD_ENV,
    ];
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| !ours.iter().any(|o| k == o))
        .filter_map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect();
    env.extend(CString::new(format!("{}={memfd}", image::STATE_FD_ENV)).ok());
    if let Some(fd) = previous {
        env.extend(CString::new(format!("{}={fd}", restore::PREVIOUS_FD_ENV)).ok());
    }
    if let Some(why) = refused {
        let why = why.replace('\0', " ");
        env.extend(CString::new(format!("{}={why}", image::REFUSED_ENV)).ok());
    }
    env
}

fn c_args(argv: &[OsString]) -> Vec<CString> {
    argv.iter()
        .filter_map(|a| CString::new(a.as_bytes()).ok())
        .collect()
}

/// `execve(binary)`; returns only its error. Run on the launcher thread
/// ([`crate::launcher`]): every sandbox's parent thread lives on in the
/// new image.
fn exec(binary: &CString, argv: &[OsString], memfd: RawFd, previous: RawFd) -> nix::Error {
    let env = next_env(memfd, Some(previous), None);
    match nix::unistd::execve(binary, &c_args(argv), &env) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

/// `fexecve(previous)` on the launcher thread: the previous binary takes
/// the state back, told `why`. Returns only its error.
pub(crate) fn exec_fd(
    previous: RawFd,
    argv: Vec<OsString>,
    memfd: RawFd,
    why: String,
) -> nix::Error {
    crate::launcher::run(move || {
        let env = next_env(memfd, None, Some(&why));
        // SAFETY: `previous` is an open descriptor of an executable file,
        // kept open by the caller while this runs.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(previous) };
        match nix::unistd::fexecve(fd, &c_args(&argv), &env) {
            Ok(never) => match never {},
            Err(e) => e,
        }
    })
}
