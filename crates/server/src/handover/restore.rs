//! The next image's side of an upgrade: read the document, wait for the
//! children again, and rebuild every session and process from it.
//!
//! Order matters: [`Inherited::adopt_children`] must run before the
//! server's state is built ([`crate::ServerState::new_inherited`]), whose
//! orphan reaper would otherwise collect an adopted child's exit first.

use super::image::{self, ReadError, Reader};
use crate::process::cgroup::CgroupsParts;
use crate::process::handover::{adopt, AdoptContext};
use crate::reaper::Exit;
use crate::rundir::RuntimeDir;
use crate::ServerState;
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use tokio::sync::oneshot;

/// Names the previous binary's descriptor in the next image's environment.
pub const PREVIOUS_FD_ENV: &str = "EXEC_SERVER_HANDOVER_PREVIOUS_FD";

/// The state a previous image of this process handed over.
pub struct Inherited {
    reader: Reader,
    exits: HashMap<u32, oneshot::Receiver<Exit>>,
    refused: Option<String>,
}

/// Why the handed-over state cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    /// The environment names a descriptor that is not a number.
    #[error("{} is not a descriptor number", image::STATE_FD_ENV)]
    BadVariable,
    /// The document cannot be read, and cannot be given back.
    #[error("{0}")]
    Read(#[from] ReadError),
}

/// Reads the state a previous image handed over, when the environment
/// names one (the variables are removed, so no child inherits them).
/// A document this binary cannot read is given back to the previous binary
/// (this call then does not return); `Err` only when that is impossible.
pub fn take() -> Result<Option<Inherited>, TakeError> {
    let Some(raw) = std::env::var_os(image::STATE_FD_ENV) else {
        return Ok(None);
    };
    let previous = std::env::var_os(PREVIOUS_FD_ENV);
    let refused = std::env::var(image::REFUSED_ENV).ok();
    std::env::remove_var(image::STATE_FD_ENV);
    std::env::remove_var(PREVIOUS_FD_ENV);
    std::env::remove_var(image::REFUSED_ENV);
    let fd: i32 = raw
        .to_str()
        .and_then(|s| s.parse().ok())
        .filter(|fd| *fd > 2)
        .ok_or(TakeError::BadVariable)?;
    // SAFETY: the previous image of this process left `fd` open for us and
    // named it; nothing else in this image owns it.
    let memfd = unsafe { std::fs::File::from_raw_fd(fd) };
    match Reader::read(memfd) {
        Ok(reader) => Ok(Some(Inherited {
            reader,
            exits: HashMap::new(),
            refused,
        })),
        Err((err, memfd)) => {
            let previous: Option<i32> = previous.and_then(|p| p.to_str()?.parse().ok());
            match previous.filter(|_| refused.is_none()) {
                Some(prev) => {
                    // SAFETY: named by the previous image, which kept it open.
                    let prev = unsafe { OwnedFd::from_raw_fd(prev) };
                    let argv: Vec<OsString> = std::env::args_os().collect();
                    let _ = image::inheritable(memfd.as_raw_fd(), true);
                    let why = format!("the new binary cannot read the state: {err}");
                    eprintln!("exec-server: upgrade: {why}; giving it back to the previous binary");
                    let e = super::exec_fd(prev.as_raw_fd(), argv, memfd.as_raw_fd(), why);
                    eprintln!("exec-server: cannot execute the previous binary: {e}");
                    Err(TakeError::Read(err))
                }
                None => Err(TakeError::Read(err)),
            }
        }
    }
}

/// What [`ServerState::adopt`] took over.
#[derive(Debug, Default)]
pub struct Adopted {
    /// Sessions.
    pub sessions: usize,
    /// Processes (running or still readable).
    pub processes: usize,
    /// Processes that could not be taken over, each killed, with why.
    pub failed: Vec<String>,
}

impl Inherited {
    /// Why the new binary gave the state back, when this image is the
    /// previous binary again.
    pub fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// When the upgrade began, in milliseconds since the Unix epoch.
    pub fn began_ms(&self) -> u64 {
        self.reader.doc.began_ms
    }

    /// The version of the binary that wrote the state.
    pub fn written_by(&self) -> &str {
        &self.reader.doc.written_by
    }

    /// Waits again for every child that still runs. Call before the
    /// server's state is built. Errors: the reaper cannot start.
    pub fn adopt_children(&mut self) -> std::io::Result<()> {
        for s in &self.reader.doc.sessions {
            for p in s.processes.iter().filter(|p| p.running()) {
                self.exits.insert(p.pid(), crate::reaper::adopt(p.pid())?);
            }
        }
        Ok(())
    }

    /// The listener: its descriptor, `ws` or `unix`, its URL.
    pub fn take_listener(&mut self) -> Option<(OwnedFd, String, String)> {
        let l = self.reader.doc.listener.clone()?;
        let fd = self.reader.take_fd(l.fd).ok()?;
        Some((fd, l.kind, l.url))
    }

    /// The `exec-server upgrade` connection waiting for the outcome.
    pub fn take_control(&mut self) -> Option<OwnedFd> {
        let n = self.reader.doc.control?;
        self.reader.take_fd(n).ok()
    }

    /// The runtime directory, still locked.
    pub fn take_runtime_dir(&mut self) -> Option<RuntimeDir> {
        let (path, n) = self.reader.doc.rundir.clone()?;
        let lock = self.reader.take_fd(n).ok()?;
        Some(RuntimeDir::adopt(path, std::fs::File::from(lock)))
    }

    /// A remote executor's registration credential.
    pub fn take_remote_credential(&mut self) -> Option<(String, bool)> {
        self.reader.doc.remote_credential.take()
    }

    /// The per-process cgroups' directory.
    pub fn cgroups(&self) -> Option<CgroupsParts> {
        self.reader.doc.cgroups.clone()
    }
}

impl ServerState {
    /// Takes over every session and process of `inherited`: sessions come
    /// back detached (each expires a TTL from now unless resumed), processes
    /// with their pids, output, seqs and writeIds. A process that cannot be
    /// taken over is killed and named in [`Adopted::failed`].
    pub async fn adopt(self: &Arc<Self>, mut inherited: Inherited) -> Adopted {
        let mut adopted = Adopted::default();
        let sessions = std::mem::take(&mut inherited.reader.doc.sessions);
        for s in sessions {
            let session = self.sessions.adopt(s.id);
            adopted.sessions += 1;
            for group in s.leftovers {
                session.adopt_leftover(self.host.cgroups.adopt_process(group));
            }
            for watch in s.watches {
                session.watches.adopt(watch, session.link.clone());
            }
            for mut doc in s.processes {
                let (id, pid) = (doc.id().to_string(), doc.pid());
                let proxy = doc.take_proxy();
                let weak = Arc::downgrade(&session);
                let cx = AdoptContext {
                    link: session.link.clone(),
                    on_retire: Box::new(move |proc| {
                        if let Some(s) = weak.upgrade() {
                            s.retire(proc);
                        }
                    }),
                    spool: self.spool.clone(),
                    spool_share: session.spool_share.clone(),
                    host: &self.host,
                    sandbox: &self.sandbox,
                    live: [&session.live, &self.live_processes],
                    exit: inherited.exits.remove(&pid),
                };
                let taken = adopt(doc, &mut inherited.reader, cx);
                let taken = match (taken, proxy) {
                    (Ok(p), Some(proxy)) => {
                        let link = session.link.clone();
                        let reader = &mut inherited.reader;
                        match crate::network::handover::adopt(proxy, reader, link, &self.config)
                            .await
                        {
                            Ok(running) => {
                                p.hold_until_closed(Box::new(running));
                                Ok(p)
                            }
                            // Never a process whose proxy does not serve.
                            Err(e) => {
                                p.terminate();
                                Err(std::io::Error::other(format!("its network proxy: {e}")))
                            }
                        }
                    }
                    (taken, _) => taken,
                };
                match taken {
                    Ok(p) => {
                        session.adopt_process(p);
                        adopted.processes += 1;
                    }
                    Err(e) => {
                        tracing::error!(process = %id, pid, "upgrade: cannot take over: {e}; killing it");
                        crate::process::kill::kill_tree(pid);
                        adopted.failed.push(format!("{id} (pid {pid}): {e}"));
                    }
                }
            }
        }
        adopted
    }
}
