//! A process's stdin: `process/write` and `process/closeStdin` (with their
//! byte budget and writeIds), and the writer task that hands the bytes to
//! the child, parking at an upgrade with what the child has not taken.

use super::{handover, lock, Process};
use crate::error::{ExecError, ExecResult};
use exec_server_protocol::types::WriteStatus;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

/// Stdin bytes accepted but not yet taken by the child, per process: 8 MiB. A
/// write beyond it waits (backpressure, as the reference) up to
/// [`STDIN_WRITE_TIMEOUT`].
pub const MAX_PENDING_STDIN_BYTES: usize = 8 * 1024 * 1024;
/// How long `process/write` waits for room in a full stdin buffer: 30 s.
pub const STDIN_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) enum StdinOp {
    Write(Vec<u8>, tokio::sync::OwnedSemaphorePermit),
    Close,
}

impl Process {
    /// `process/write`. Errors ([`ErrorKind::Failed`](crate::error::ErrorKind::Failed)):
    /// stdin broken or the process exited, or no room for the bytes within
    /// [`STDIN_WRITE_TIMEOUT`].
    pub async fn write(&self, data: Vec<u8>, write_id: String) -> ExecResult<WriteStatus> {
        if let Some(status) = self.write_precheck(&write_id)? {
            return Ok(status);
        }
        let permit = if data.is_empty() {
            None
        } else {
            let n = data.len().min(MAX_PENDING_STDIN_BYTES) as u32;
            let budget = self.stdin_budget.clone();
            match tokio::time::timeout(STDIN_WRITE_TIMEOUT, budget.acquire_many_owned(n)).await {
                Ok(Ok(p)) => Some(p),
                Ok(Err(_)) => return Err(stdin_failed()),
                Err(_) => {
                    return Err(ExecError::failed(format!(
                        "failed to write to process stdin: the process has not read its input for {} s ({} bytes pending)",
                        STDIN_WRITE_TIMEOUT.as_secs(),
                        MAX_PENDING_STDIN_BYTES - self.stdin_budget.available_permits()
                    )))
                }
            }
        };
        // The state may have changed while waiting for room.
        if let Some(status) = self.write_precheck(&write_id)? {
            return Ok(status);
        }
        let mut st = lock(&self.state);
        if st.frozen {
            // Not remembered: the same writeId, retried on the new binary,
            // is applied there once.
            return Err(handover::frozen_error());
        }
        if let Some(permit) = permit {
            let sent = st
                .stdin
                .as_ref()
                .is_some_and(|tx| tx.send(StdinOp::Write(data, permit)).is_ok());
            if !sent {
                return Err(stdin_failed());
            }
        }
        st.write_ids.remember(write_id);
        Ok(WriteStatus::Accepted)
    }

    /// The answer to a write that needs no bytes moved, if any.
    fn write_precheck(&self, write_id: &str) -> ExecResult<Option<WriteStatus>> {
        let st = lock(&self.state);
        if st.write_ids.contains(write_id) {
            return Ok(Some(WriteStatus::Accepted));
        }
        if st.frozen {
            return Err(handover::frozen_error());
        }
        if !st.has_stdin {
            return Ok(Some(WriteStatus::StdinClosed));
        }
        if st.stdin_broken || st.log.exit_code().is_some() {
            return Err(stdin_failed());
        }
        if st.stdin.is_none() {
            return Ok(Some(WriteStatus::StdinClosed));
        }
        Ok(None)
    }

    /// `process/closeStdin`: end of file after the writes already accepted. On a PTY
    /// this sends the terminal's end-of-file character (^D).
    pub fn close_stdin(&self) -> WriteStatus {
        let mut st = lock(&self.state);
        if st.frozen {
            // The next binary keeps stdin open; the client's retry closes it.
            return WriteStatus::Accepted;
        }
        match st.stdin.take() {
            Some(tx) => {
                let _ = tx.send(StdinOp::Close);
                WriteStatus::Accepted
            }
            None => WriteStatus::StdinClosed,
        }
    }
}

/// Writes `data` whole, counting in `done` what the child has taken (so a
/// write cut short by an upgrade knows where to go on).
async fn write_all(
    fd: &AsyncFd<OwnedFd>,
    mut data: &[u8],
    done: &std::sync::atomic::AtomicUsize,
) -> std::io::Result<()> {
    while !data.is_empty() {
        let mut guard = fd.writable().await?;
        match guard
            .try_io(|inner| nix::unistd::write(inner.get_ref(), data).map_err(std::io::Error::from))
        {
            Ok(Ok(n)) => {
                data = &data[n..];
                done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

pub(super) async fn stdin_writer(
    proc: Arc<Process>,
    mut rx: mpsc::UnboundedReceiver<StdinOp>,
    fd: Arc<AsyncFd<OwnedFd>>,
) {
    let is_pty = proc.tty.is_some();
    let mut parking = proc.park.signal();
    loop {
        let op = tokio::select! {
            op = rx.recv() => op,
            _ = handover::asked(&mut parking) => {
                proc.park.stdin_parked(rx, fd, Vec::new());
                return;
            }
        };
        let Some(op) = op else { break };
        // Bytes the child took so far: an upgrade hands over the rest.
        let done = std::sync::atomic::AtomicUsize::new(0);
        // The permit is released once the child has taken the bytes. A
        // terminal's end of file is its ^D character.
        let (data, _permit) = match op {
            StdinOp::Write(data, permit) => (data, Some(permit)),
            StdinOp::Close if is_pty => (b"\x04".to_vec(), None),
            StdinOp::Close => break,
        };
        let result = tokio::select! {
            r = write_all(&fd, &data, &done) => r,
            _ = handover::asked(&mut parking) => {
                let rest = data[done.load(std::sync::atomic::Ordering::Relaxed)..].to_vec();
                proc.park.stdin_parked(rx, fd, rest);
                return;
            }
        };
        if result.is_err() {
            lock(&proc.state).stdin_broken = true;
            break;
        }
    }
    proc.park.stdin_ended();
    // Writers waiting for room fail at once instead of timing out.
    proc.stdin_budget.close();
    // Dropping our clone closes a stdin pipe (EOF for the child). For a PTY the
    // master stays open through the pump's clone.
}

fn stdin_failed() -> ExecError {
    ExecError::failed("failed to write to process stdin")
}
