//! Processes: start (with the retry after a dropped connection), stdin,
//! signals, and the [`ProcessHandle`] a caller reads ordered events from.

use super::{lock, ClientError, ExecServerClient, ProcEntry};
use crate::events::{event_queue, EventReceiver, OrderedEvents, ProcessEvent};
use exec_server_protocol::types::*;
use exec_server_protocol::{methods as m, ErrorObject};
use serde_json::Value;
use std::sync::atomic::Ordering;

/// A started process: its id and its ordered events.
///
/// Events wait in a queue of at most
/// [`MAX_QUEUED_OUTPUT_BYTES`](crate::events::MAX_QUEUED_OUTPUT_BYTES) of
/// output; output is acknowledged to the server (`process/ack`, when it
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
}

impl ExecServerClient {
    /// `process/start`. `ackOutput` is set when the server supports it, so no
    /// output is dropped across connection losses.
    pub async fn start_process(
        &self,
        mut params: ExecParams,
    ) -> Result<ProcessHandle, ClientError> {
        self.peer().await?;
        params.ack_output = self.supports("processOutputAck");
        let (tx, rx) = event_queue();
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
                },
            );
        }
        let mut outcome = self
            .call::<_, ExecResponse>(m::PROCESS_START, &params, false)
            .await
            .map(Some);
        if matches!(&outcome, Err(ClientError::Connection(_))) {
            // The request may or may not have reached the server before the drop.
            // Retry once; if the server refuses the retry, ask it whether the
            // process exists (the first attempt started it) rather than guess
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
        match outcome {
            Ok(_) => Ok(ProcessHandle {
                id,
                client: self.clone(),
                events: rx,
                acks: params.ack_output,
                consumed: 0,
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
            Ok(peer) => super::catch_up(&self.inner, &peer, id).await,
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
            chunk: exec_server_protocol::ByteChunk(data),
            write_id: format!("{}-{n}", self.inner.write_prefix),
        };
        let r: WriteResponse = self.call(m::PROCESS_WRITE, &params, true).await?;
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

    /// `process/terminate`: true if it was running.
    pub async fn terminate(&self, process_id: &str) -> Result<bool, ClientError> {
        let r: TerminateResponse = self
            .call(
                m::PROCESS_TERMINATE,
                &ProcessIdParams {
                    process_id: process_id.into(),
                },
                true,
            )
            .await?;
        Ok(r.running)
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
                lock(&self.client.inner.procs).remove(&self.id);
            }
            Some(ProcessEvent::Output { seq, data, .. }) if self.acks => {
                self.consumed += data.len();
                if self.consumed >= super::ACK_EVERY_BYTES {
                    self.consumed = 0;
                    self.acknowledge(*seq);
                }
            }
            _ => {}
        }
        ev
    }

    /// Output bytes released to this handle and not yet taken by
    /// [`next_event`](Self::next_event) (at most
    /// [`MAX_QUEUED_OUTPUT_BYTES`](crate::events::MAX_QUEUED_OUTPUT_BYTES)).
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

    /// Kills the process tree; true if it was running.
    pub async fn terminate(&self) -> Result<bool, ClientError> {
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
