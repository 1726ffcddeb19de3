//! Starting a process again in the next image from its [`ProcessDoc`].

use super::{Park, ProcessDoc, Source};
use crate::link::Link;
use crate::process::output_log::{Chunk, LogParts};
use crate::process::pump::{self, Held};
use crate::process::spool::{SegmentParts, Spool, SpoolParts};
use crate::process::{
    nonblocking, stdin_writer, OutputLog, Process, RetireHook, Sources, State, StdinOp, WriteIds,
    EXITED_PROCESS_RETENTION, MAX_PENDING_STDIN_BYTES,
};
use crate::reaper::Exit;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot, watch};

/// What an adopted process needs from its server and session.
pub struct AdoptContext<'a> {
    /// Its session's link.
    pub link: Arc<Link>,
    /// Removes its record from the session once retired.
    pub on_retire: RetireHook,
    /// The server's spool, where enabled.
    pub spool: Option<Arc<crate::process::spool::SpoolConfig>>,
    /// The session's share of it.
    pub spool_share: Arc<crate::process::spool::SessionShare>,
    /// The server's cgroups and handover signal.
    pub host: &'a crate::process::Host,
    /// The server's sandbox support (its live sandboxes).
    pub sandbox: &'a crate::sandbox::Support,
    /// The running counts it takes a place in (session, server).
    pub live: [&'a crate::process::live::LiveCount; 2],
    /// How it ends, from the reaper ([`crate::reaper::adopt`]), while it runs.
    pub exit: Option<oneshot::Receiver<Exit>>,
}

/// Starts again, in this image, the process `doc` wrote down in the
/// previous one: its pump reads on from where it parked, its stdin writer
/// writes what was pending, its record keeps its seqs and writeIds.
/// Errors: a descriptor or blob range the document names is missing.
pub fn adopt(
    doc: ProcessDoc,
    source: &mut dyn Source,
    cx: AdoptContext<'_>,
) -> std::io::Result<Arc<Process>> {
    let async_fd =
        |source: &mut dyn Source, n: Option<i32>| -> std::io::Result<Option<AsyncFd<OwnedFd>>> {
            n.map(|n| source.fd(n).and_then(nonblocking)).transpose()
        };
    let tty = async_fd(source, doc.pty)?.map(Arc::new);
    let sources = match &tty {
        Some(m) => Sources::Pty(m.clone()),
        None => Sources::Pipes(async_fd(source, doc.stdout)?, async_fd(source, doc.stderr)?),
    };
    let stdin_fd = match &tty {
        Some(m) => Some(m.clone()),
        None => async_fd(source, doc.stdin)?.map(Arc::new),
    };
    let mut chunks = Vec::with_capacity(doc.chunks.len());
    for c in &doc.chunks {
        chunks.push(Chunk {
            seq: c.seq,
            stream: c.stream,
            data: source.bytes(c.data)?,
        });
    }
    let spool = match (doc.spool, &cx.spool) {
        (Some((segments, failed)), Some(config)) => {
            let mut parts = SpoolParts {
                segments: Vec::with_capacity(segments.len()),
                failed,
            };
            for s in segments {
                parts.segments.push(SegmentParts {
                    file: Arc::new(std::fs::File::from(source.fd(s.fd)?)),
                    len: s.len,
                    first_seq: s.first_seq,
                    last_seq: s.last_seq,
                    index: s.index,
                });
            }
            Some(Spool::from_parts(
                config.clone(),
                cx.spool_share.clone(),
                parts,
            ))
        }
        // The spool is off in this image: spooled output is gone, which a
        // reader sees as a seq jump, as for any spool cap.
        (_, None) => None,
        (None, Some(config)) => Some(Spool::new(config.clone(), cx.spool_share.clone())),
    };
    let log = OutputLog::from_parts(LogParts {
        chunks,
        next_seq: doc.next_seq,
        delivered_seq: doc.delivered_seq,
        ack_mode: doc.ack_mode,
        window: doc
            .window
            .unwrap_or(crate::process::output_log::default_window(doc.ack_mode)),
        exited: doc.exited,
        closed_seq: doc.closed_seq,
        spool,
    });
    let mut write_ids = WriteIds::default();
    for id in doc.write_ids {
        write_ids.remember(id);
    }
    let stdin_budget = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_STDIN_BYTES));
    let writer = match &stdin_fd {
        Some(fd) if doc.stdin_open || !doc.stdin_pending.is_empty() || doc.stdin_close_pending => {
            let (tx, rx) = mpsc::unbounded_channel();
            for blob in &doc.stdin_pending {
                let data = source.bytes(*blob)?.to_vec();
                let n = (data.len().min(MAX_PENDING_STDIN_BYTES) as u32).max(1);
                let permit = stdin_budget
                    .clone()
                    .try_acquire_many_owned(n)
                    .map_err(|_| std::io::Error::other("pending stdin exceeds its budget"))?;
                let _ = tx.send(StdinOp::Write(data, permit));
            }
            if doc.stdin_close_pending {
                let _ = tx.send(StdinOp::Close);
            }
            Some((tx, rx, fd.clone()))
        }
        _ => None,
    };
    let cgroup = doc
        .cgroup
        .map(|p| Arc::new(cx.host.cgroups.adopt_process(p)));
    let age = std::time::Duration::from_millis(doc.age_ms);
    let (changed, _) = watch::channel(0);
    let proc = Arc::new(Process {
        id: doc.id.clone(),
        pid: doc.pid,
        cgroup: Mutex::new(cgroup),
        tty,
        state: Mutex::new(State {
            log,
            write_ids,
            stdin: writer
                .as_ref()
                .filter(|_| doc.stdin_open)
                .map(|(tx, _, _)| tx.clone()),
            stdin_broken: doc.stdin_broken,
            has_stdin: doc.has_stdin,
            sandbox_denied: doc.sandbox_denied,
            limit: doc.limit,
            signal: doc
                .signal
                .and_then(|s| nix::sys::signal::Signal::try_from(s).ok()),
            frozen: false,
        }),
        changed,
        resume: tokio::sync::Notify::new(),
        stdin_budget,
        sandboxed: doc.sandboxed,
        started: std::time::Instant::now()
            .checked_sub(age)
            .unwrap_or_else(std::time::Instant::now),
        discarded: tokio::sync::Notify::new(),
        kept: Mutex::new((!doc.closed).then(Vec::new)),
        started_with: doc.started_with,
        output_bytes: std::sync::atomic::AtomicU64::new(doc.output_bytes),
        park: Park::new(&cx.host.handover),
    });
    if let Some((_, rx, fd)) = writer {
        proc.park.stdin_started();
        tokio::spawn(stdin_writer(proc.clone(), rx, fd));
    }
    if doc.closed {
        tokio::spawn(pump::retain(
            proc.clone(),
            cx.on_retire,
            EXITED_PROCESS_RETENTION,
        ));
        return Ok(proc);
    }
    let exit = match (doc.exit_code, doc.pending_exit, cx.exit) {
        // Recorded: the pump never waits for it again.
        (Some(_), _, _) => oneshot::channel().1,
        (None, Some((code, signal)), _) => {
            let (tx, rx) = oneshot::channel();
            let signal = signal.and_then(|s| nix::sys::signal::Signal::try_from(s).ok());
            let _ = tx.send(Exit { code, signal });
            rx
        }
        (None, None, Some(rx)) => rx,
        (None, None, None) => {
            return Err(std::io::Error::other(format!(
                "process {} (pid {}) runs but nothing waits for it",
                doc.id, doc.pid
            )))
        }
    };
    let confinement = (doc.confined || !doc.placeholders.is_empty()).then(|| {
        crate::sandbox::Confinement::adopt(cx.sandbox, &doc.placeholders, doc.pid, doc.confined)
    });
    let limits = match &doc.limits {
        Some(p) => crate::process::limits::Watch::from_parts(p, tokio::time::Instant::now()),
        None => crate::process::limits::Watch::new(
            None,
            tokio::time::Instant::now(),
            Default::default(),
        ),
    };
    let live = doc
        .live
        .then(|| {
            crate::process::live::LiveSlot::take(&[(cx.live[0], None), (cx.live[1], None)]).ok()
        })
        .flatten();
    let span = tracing::info_span!(
        "process",
        process_id = %doc.id,
        pid = doc.pid,
        tty = proc.tty.is_some(),
        sandboxed = doc.sandboxed,
        exit_code = tracing::field::Empty,
    );
    // Its start was answered in the previous image: nothing to wait for.
    let gate = oneshot::channel().1;
    tokio::spawn(pump::pump(
        proc.clone(),
        sources,
        exit,
        cx.link,
        gate,
        cx.on_retire,
        pump::From::Resume {
            exit_code: doc.exit_code,
        },
        Held {
            confinement,
            span,
            limits,
            live,
            sinks: [None, None],
        },
    ));
    Ok(proc)
}
