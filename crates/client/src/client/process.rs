//! Processes: start (with the retry after a dropped connection), stdin,
//! signals, and the [`ProcessHandle`] a caller reads ordered events from.

use super::{lock, ClientError, ExecServerClient, ProcEntry};
use crate::events::{
    event_queue, EventReceiver, FailureReason, OrderedEvents, ProcessEvent, StreamFailure,
};
use exec_server_protocol::types::*;
use exec_server_protocol::{methods as m, ErrorObject};
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A started process: its id and its ordered events.
///
/// # Exited and Closed
///
/// A process's stream ends with two events: [`ProcessEvent::Exited`] when the
/// process itself exits (its status is known), then [`ProcessEvent::Closed`]
/// when every output stream has reached end of file and all output was
/// delivered. They differ when the process leaves a child behind that keeps
/// its stdout or stderr open: `sh -c 'sleep 600 & echo started'` exits at
/// once, but `Closed` only comes when `sleep` ends (or is killed). So:
///
/// * [`wait`](Self::wait) returns at `Exited` (the status), never waiting for
///   leftovers;
/// * [`wait_with_output`](Self::wait_with_output) and a loop over
///   [`next_event`](Self::next_event) until `Closed` see every byte, and wait
///   for the leftovers too;
/// * [`Command::kill_leftovers_after`](crate::Command::kill_leftovers_after)
///   kills what is left of the group a grace period after `Exited`, so
///   `Closed` follows;
/// * [`terminate`](Self::terminate) kills the process or, after its exit, its
///   leftovers, and says which ([`TerminateOutcome`]).
///
/// Dropping a handle leaves the process running unless it was started with
/// [`Command::kill_on_drop`](crate::Command::kill_on_drop)`(true)`.
///
/// # Flow control
///
/// Events wait in a queue of at most
/// [`MAX_QUEUED_OUTPUT_BYTES`](crate::MAX_QUEUED_OUTPUT_BYTES) of
/// output (or the output window asked of the server plus 1 MiB, when that
/// is more: [`ClientOptions::output_window_bytes`](crate::ClientOptions));
/// output is acknowledged to the server (`process/ack`, when it
/// supports it) as [`next_event`](Self::next_event) hands it over, so a slow
/// consumer slows the process rather than growing memory.
pub struct ProcessHandle {
    /// The process id.
    pub id: String,
    pub(super) client: ExecServerClient,
    pub(super) events: EventReceiver,
    /// True when the server takes `process/ack`.
    acks: bool,
    /// Output bytes handed over since the last acknowledgement.
    consumed: usize,
    /// Output chunks handed over since the last acknowledgement.
    consumed_chunks: usize,
    /// The OS pid, when the server reports it.
    pid: Option<u32>,
    /// The exit code, once `Exited` was handed over.
    exit_code: Option<i32>,
    /// True once `Closed` or `Failed` was handed over.
    finished: bool,
    pub(crate) kill_on_drop: bool,
    pub(crate) kill_leftovers_after: Option<Duration>,
}

/// What [`ProcessHandle::terminate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminateOutcome {
    /// The process was running and has been killed, with its group.
    KilledRunning,
    /// The process had exited; what it left running (holding its output open,
    /// or in its cgroup) has been killed. Only this server tells (wire
    /// `killedLeftovers`); against the reference this is reported as
    /// [`NothingToDo`](Self::NothingToDo).
    KilledLeftovers,
    /// The process had exited and nothing of it was left (or the id is unknown).
    NothingToDo,
}

/// The collected output of a process ([`ProcessHandle::wait_with_output`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    /// Exit code: the status, or 128+N for signal N.
    pub code: i32,
    /// Standard output (a PTY process's output, stderr merged, lands here).
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// True if output beyond the size cap was dropped.
    pub truncated: bool,
}

impl ExecServerClient {
    /// `process/start`. `ackOutput` is set when the server supports it, so no
    /// output is dropped across connection losses.
    pub async fn start_process(
        &self,
        mut params: ExecParams,
    ) -> Result<ProcessHandle, ClientError> {
        self.peer_early().await?;
        // Behind a pipelined `initialize` the capabilities are not known
        // yet: `ackOutput` is asked for anyway (a server without it ignores
        // an unknown member, the reference too) and acknowledgements are
        // sent only if the answer says the server takes them.
        params.ack_output = !self.init_settled() || self.supports("processOutputAck");
        if params.ack_output && params.output_window_bytes.is_none() {
            params.output_window_bytes = self.inner.opts.output_window_bytes;
        }
        if !params.ack_output {
            // A window without acknowledgements is refused.
            params.output_window_bytes = None;
        }
        let (tx, rx) = event_queue(params.output_window_bytes);
        let id = params.process_id.clone();
        {
            let mut procs = lock(&self.inner.procs);
            if procs.get(&id).is_some_and(|e| !e.events.is_finished()) {
                return Err(ClientError::Server(ErrorObject::invalid_request(format!(
                    "process {id} already exists"
                ))));
            }
            procs.insert(
                id.clone(),
                ProcEntry {
                    events: OrderedEvents::new(tx),
                    confirmed: false,
                    catching_up: 0,
                },
            );
        }
        let mut outcome = self
            .call_maybe_early::<_, ExecResponse>(m::PROCESS_START, &params, false, true)
            .await
            .map(Some);
        if let Err(e) = self.initialized().await {
            // The start failed too, or will be lost with the connection:
            // `initialize`'s refusal is the one that explains it.
            lock(&self.inner.procs).remove(&id);
            return Err(e);
        }
        let mut pid = None;
        let mut retries = 0;
        while matches!(&outcome, Err(ClientError::Connection(_)))
            && retries < super::RETRIES_AFTER_DROP
        {
            retries += 1;
            // The request may or may not have reached the server before the drop.
            // Retry; if the server refuses the retry, ask it whether the
            // process exists (an earlier attempt started it) rather than guess
            // from the refusal's text. A live duplicate in this session was
            // refused locally above.
            outcome = match self
                .call::<_, ExecResponse>(m::PROCESS_START, &params, false)
                .await
            {
                Err(ClientError::Server(e))
                    if e.code == exec_server_protocol::error::INVALID_REQUEST =>
                {
                    match self.started_before(&id).await {
                        true => Ok(None),
                        false => Err(ClientError::Server(e)),
                    }
                }
                other => other.map(Some),
            };
        }
        if let Ok(Some(r)) = &outcome {
            pid = r.pid;
        }
        if outcome.is_ok() {
            if let Some(e) = lock(&self.inner.procs).get_mut(&id) {
                e.confirmed = true;
            }
        }
        let acks = params.ack_output && self.supports("processOutputAck");
        if !acks {
            // Asked for speculatively, before the capabilities were known.
            rx.without_server_window();
        }
        match outcome {
            Ok(_) => Ok(ProcessHandle {
                id,
                client: self.clone(),
                events: rx,
                acks,
                consumed: 0,
                consumed_chunks: 0,
                pid,
                exit_code: None,
                finished: false,
                kill_on_drop: false,
                kill_leftovers_after: None,
            }),
            Err(e) => {
                lock(&self.inner.procs).remove(&id);
                Err(e)
            }
        }
    }

    /// True if the server holds process `id`, whose events it then feeds to the
    /// process's stream from the last one released (`process/read`s that wait
    /// for nothing).
    async fn started_before(&self, id: &str) -> bool {
        match self.peer().await {
            Ok(peer) => {
                super::connection::catch_up(&self.inner, &peer, id).await
                    == super::connection::CatchUp::Done
            }
            Err(_) => false,
        }
    }

    /// `process/read`.
    pub async fn read_process(&self, params: &ReadParams) -> Result<ReadResponse, ClientError> {
        self.call(m::PROCESS_READ, params, true).await
    }

    /// `process/write` with a fresh writeId (retried with the same id after a drop).
    pub async fn write_process(
        &self,
        process_id: &str,
        data: Vec<u8>,
    ) -> Result<WriteStatus, ClientError> {
        let n = self.inner.next_write.fetch_add(1, Ordering::Relaxed);
        let params = WriteParams {
            process_id: process_id.into(),
            chunk: exec_server_protocol::ByteChunk::default(),
            write_id: format!("{}-{n}", self.inner.write_prefix),
        };
        let params = super::without_chunk(m::PROCESS_WRITE, &params)?;
        let (v, _) = self
            .call_chunked(m::PROCESS_WRITE, params, Some(data.into()), true)
            .await?;
        let r: WriteResponse =
            serde_json::from_value(v).map_err(|e| ClientError::protocol(m::PROCESS_WRITE, e))?;
        Ok(r.status)
    }

    /// `process/closeStdin` (ours; the reference answers -32601).
    pub async fn close_stdin(&self, process_id: &str) -> Result<WriteStatus, ClientError> {
        let r: WriteResponse = self
            .call(
                m::PROCESS_CLOSE_STDIN,
                &ProcessIdParams {
                    process_id: process_id.into(),
                },
                true,
            )
            .await?;
        Ok(r.status)
    }

    /// `process/signal`.
    pub async fn signal(&self, process_id: &str, signal: ProcessSignal) -> Result<(), ClientError> {
        let _: Value = self
            .call(
                m::PROCESS_SIGNAL,
                &SignalParams {
                    process_id: process_id.into(),
                    signal,
                },
                false,
            )
            .await?;
        Ok(())
    }

    /// `process/terminate`: kills the process tree, or what an exited process
    /// left running, and says which.
    pub async fn terminate(&self, process_id: &str) -> Result<TerminateOutcome, ClientError> {
        let r: TerminateResponse = self
            .call(
                m::PROCESS_TERMINATE,
                &ProcessIdParams {
                    process_id: process_id.into(),
                },
                true,
            )
            .await?;
        Ok(match (r.running, r.killed_leftovers) {
            (true, _) => TerminateOutcome::KilledRunning,
            (false, Some(true)) => TerminateOutcome::KilledLeftovers,
            (false, _) => TerminateOutcome::NothingToDo,
        })
    }

    /// `process/list` (ours, `processList` capability): this session's
    /// processes, oldest first, with their state, CPU time, memory, output
    /// bytes and limits. Errors: a server without the method (the
    /// reference) answers -32601 ([`ErrorKind::Other`](crate::ErrorKind::Other)).
    pub async fn list_processes(
        &self,
    ) -> Result<Vec<exec_server_protocol::types::ProcessInfo>, ClientError> {
        let r: exec_server_protocol::types::ProcessListResponse = self
            .call(
                m::PROCESS_LIST,
                &exec_server_protocol::types::Empty {},
                true,
            )
            .await?;
        Ok(r.processes)
    }

    /// `process/resize` (ours).
    pub async fn resize(&self, process_id: &str, cols: u16, rows: u16) -> Result<(), ClientError> {
        let _: Value = self
            .call(
                m::PROCESS_RESIZE,
                &ResizeParams {
                    process_id: process_id.into(),
                    cols,
                    rows,
                },
                true,
            )
            .await?;
        Ok(())
    }
}

impl ProcessHandle {
    /// The next event in seq order; `None` after `Closed`/`Failed` was taken.
    pub async fn next_event(&mut self) -> Option<ProcessEvent> {
        let ev = self.events.recv().await;
        match &ev {
            Some(ProcessEvent::Closed { .. } | ProcessEvent::Failed(_)) => {
                self.finished = true;
                lock(&self.client.inner.procs).remove(&self.id);
            }
            Some(ProcessEvent::Exited { code, .. }) => {
                self.exit_code = Some(*code);
                if let Some(grace) = self.kill_leftovers_after {
                    self.kill_leftovers_later(grace);
                }
            }
            Some(ProcessEvent::Output { seq, data, .. }) if self.acks => {
                self.consumed += data.len();
                self.consumed_chunks += 1;
                if self.consumed >= super::ACK_EVERY_BYTES
                    || self.consumed_chunks >= super::ACK_EVERY_CHUNKS
                {
                    self.consumed = 0;
                    self.consumed_chunks = 0;
                    self.acknowledge(*seq);
                }
            }
            _ => {}
        }
        ev
    }

    /// Waits for the process to exit and returns its code (the status, or
    /// 128+N for signal N), discarding output not yet taken. Returns at
    /// [`ProcessEvent::Exited`], even if a child it left keeps its output open
    /// (see [Exited and Closed](Self#exited-and-closed)); called again, returns
    /// the same code. Errors: [`ClientError::Stream`] when the stream failed
    /// first ([`ErrorKind::EventsLost`](crate::ErrorKind::EventsLost),
    /// [`ErrorKind::RecoveryFailed`](crate::ErrorKind::RecoveryFailed)).
    pub async fn wait(&mut self) -> Result<i32, ClientError> {
        loop {
            if let Some(code) = self.exit_code {
                return Ok(code);
            }
            match self.next_event().await {
                Some(ProcessEvent::Failed(f)) => return Err(f.into()),
                Some(_) => {}
                None => return Err(self.ended_early()),
            }
        }
    }

    /// Collects the rest of the output and the exit code, until
    /// [`ProcessEvent::Closed`]: keeps at most `max_bytes` of output (stdout
    /// and stderr together; more is dropped and
    /// [`Output::truncated`] set, while the process still runs to its end).
    /// Waits for leftovers holding the output open, unless the command set
    /// [`kill_leftovers_after`](crate::Command::kill_leftovers_after).
    /// Errors as [`wait`](Self::wait).
    pub async fn wait_with_output(&mut self, max_bytes: usize) -> Result<Output, ClientError> {
        let mut out = Output::default();
        let mut room = max_bytes;
        loop {
            match self.next_event().await {
                Some(ProcessEvent::Output { stream, data, .. }) => {
                    let keep = data.len().min(room);
                    out.truncated |= keep < data.len();
                    room -= keep;
                    let sink = match stream {
                        OutputStream::Stderr => &mut out.stderr,
                        _ => &mut out.stdout,
                    };
                    sink.extend_from_slice(&data[..keep]);
                }
                Some(ProcessEvent::Exited { .. }) => {}
                Some(ProcessEvent::Closed { .. }) => break,
                Some(ProcessEvent::Failed(f)) => return Err(f.into()),
                None => return Err(self.ended_early()),
            }
        }
        out.code = self.exit_code.ok_or_else(|| self.ended_early())?;
        Ok(out)
    }

    /// The events as a [`Stream`](futures_util::Stream), ending after
    /// [`ProcessEvent::Closed`] or [`ProcessEvent::Failed`]. The stream owns the
    /// handle (and its drop behaviour).
    pub fn output_stream(self) -> impl futures_util::Stream<Item = ProcessEvent> + Send {
        futures_util::stream::unfold(self, |mut h| async move {
            let ev = h.next_event().await?;
            Some((ev, h))
        })
    }

    /// The child's OS pid on the server's host, when the server reports it
    /// (this one does; the reference does not).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The exit code, once [`ProcessEvent::Exited`] was handed over.
    pub fn exit_code(&self) -> Option<i32> {
        self.exit_code
    }

    fn ended_early(&self) -> ClientError {
        ClientError::Stream(StreamFailure::new(
            FailureReason::Protocol,
            format!("the events of process {} were already taken", self.id),
        ))
    }

    /// After `grace`, terminates what is left unless the stream closed.
    fn kill_leftovers_later(&self, grace: Duration) {
        let client = self.client.clone();
        let id = self.id.clone();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            tokio::time::sleep(grace).await;
            let closed = lock(&client.inner.procs)
                .get(&id)
                .is_some_and(|e| e.events.is_finished());
            if !closed {
                let _ = client.terminate(&id).await;
            }
        });
    }

    /// Output bytes released to this handle and not yet taken by
    /// [`next_event`](Self::next_event) (at most
    /// [`MAX_QUEUED_OUTPUT_BYTES`](crate::events::MAX_QUEUED_OUTPUT_BYTES),
    /// or the output window asked for plus 1 MiB when that is more).
    pub fn queued_output_bytes(&self) -> usize {
        self.events.queued_output_bytes()
    }

    /// Tells the server that events through `seq` were consumed, without
    /// waiting for its answer (a lost acknowledgement is repeated by the next).
    fn acknowledge(&self, seq: u64) {
        let client = self.client.clone();
        let params = AckParams {
            process_id: self.id.clone(),
            seq,
        };
        tokio::spawn(async move {
            let _: Result<Value, _> = client.call(m::PROCESS_ACK, &params, false).await;
        });
    }

    /// Writes to stdin.
    pub async fn write(&self, data: Vec<u8>) -> Result<WriteStatus, ClientError> {
        self.client.write_process(&self.id, data).await
    }

    /// Sends end of file on stdin.
    pub async fn close_stdin(&self) -> Result<WriteStatus, ClientError> {
        self.client.close_stdin(&self.id).await
    }

    /// Sends a signal to the process group.
    pub async fn signal(&self, s: ProcessSignal) -> Result<(), ClientError> {
        self.client.signal(&self.id, s).await
    }

    /// Kills the process tree, or what is left of it after exit, and says which.
    pub async fn terminate(&self) -> Result<TerminateOutcome, ClientError> {
        self.client.terminate(&self.id).await
    }

    /// Resizes the PTY.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), ClientError> {
        self.client.resize(&self.id, cols, rows).await
    }

    /// The client this process belongs to.
    pub fn client(&self) -> &ExecServerClient {
        &self.client
    }
}

impl Drop for ProcessHandle {
    fn drop(&mut self) {
        lock(&self.client.inner.procs).remove(&self.id);
        if self.kill_on_drop && !self.finished {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let client = self.client.clone();
                let id = std::mem::take(&mut self.id);
                rt.spawn(async move {
                    let _ = client.terminate(&id).await;
                });
            }
        }
    }
}
