//! Processes: start (with the retry after a dropped connection), stdin,
//! signals, and the [`ProcessHandle`] a caller reads ordered events from.

use super::{lock, ClientError, ExecServerClient, ProcEntry};
use crate::events::{OrderedEvents, ProcessEvent};
use exec_server_protocol::types::*;
use exec_server_protocol::{methods as m, ErrorObject};
use serde_json::Value;
use std::sync::atomic::Ordering;
use tokio::sync::mpsc;

/// A started process: its id and its ordered events.
pub struct ProcessHandle {
    /// The process id.
    pub id: String,
    pub(super) client: ExecServerClient,
    pub(super) events: mpsc::UnboundedReceiver<ProcessEvent>,
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
        let (tx, rx) = mpsc::unbounded_channel();
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
                    unacked_bytes: 0,
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
            }),
            Err(e) => {
                lock(&self.inner.procs).remove(&id);
                Err(e)
            }
        }
    }

    /// True if the server holds process `id`, whose events it then feeds to the
    /// process's stream from the last one released (a `process/read` that
    /// waits for nothing).
    async fn started_before(&self, id: &str) -> bool {
        let Some(after) = lock(&self.inner.procs)
            .get(id)
            .map(|e| e.events.last_published())
        else {
            return false;
        };
        let params = ReadParams {
            process_id: id.to_string(),
            after_seq: Some(after),
            max_bytes: None,
            wait_ms: Some(0),
        };
        let Ok(page) = self.read_process(&params).await else {
            return false;
        };
        if let Some(e) = lock(&self.inner.procs).get_mut(id) {
            e.unacked_bytes += e.events.recover(page);
        }
        true
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
        if matches!(
            ev,
            Some(ProcessEvent::Closed { .. } | ProcessEvent::Failed(_))
        ) {
            lock(&self.client.inner.procs).remove(&self.id);
        }
        ev
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
