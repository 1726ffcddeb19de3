//! `Process`: one started process: its events in seq order (batched, each
//! output chunk one `bytes`), its stdin, signals and size.

use crate::{errors, in_runtime};
use exec_server_client::{
    ClientError, ExecServerClient, ProcessEvent, ProcessHandle, ProcessSignal, TerminateOutcome,
};
use futures_util::FutureExt;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use std::sync::Arc;

/// The event half of a process. Dropped inside the runtime, so a
/// `kill_on_drop` process is still killed when Python collects it.
struct Events {
    handle: Option<ProcessHandle>,
    /// A failure met after other events of a batch: raised by the next call.
    failed: Option<exec_server_client::StreamFailure>,
}

impl Drop for Events {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            in_runtime(|| drop(handle));
        }
    }
}

/// A started process.
#[pyclass(module = "exec_server._native", frozen)]
pub struct Process {
    id: String,
    pid: Option<u32>,
    client: ExecServerClient,
    events: Arc<tokio::sync::Mutex<Events>>,
}

impl Process {
    pub(crate) fn new(handle: ProcessHandle) -> Process {
        Process {
            id: handle.id.clone(),
            pid: handle.pid(),
            client: handle.client().clone(),
            events: Arc::new(tokio::sync::Mutex::new(Events {
                handle: Some(handle),
                failed: None,
            })),
        }
    }
}

/// Wire name of a serde enum value (`stdout`, `wallTimeout`, …).
fn wire_name<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

/// One event as the Python side reads it: `("output", stream, bytes)`,
/// `("exited", code, signal, limit)` or `("closed",)`.
fn to_python<'py>(py: Python<'py>, ev: &ProcessEvent) -> PyResult<Bound<'py, PyTuple>> {
    match ev {
        ProcessEvent::Output { stream, data, .. } => PyTuple::new(
            py,
            [
                "output".into_pyobject(py)?.into_any(),
                wire_name(stream).into_pyobject(py)?.into_any(),
                PyBytes::new(py, data).into_any(),
            ],
        ),
        ProcessEvent::Exited {
            code,
            limit,
            signal,
            ..
        } => PyTuple::new(
            py,
            [
                "exited".into_pyobject(py)?.into_any(),
                code.into_pyobject(py)?.into_any(),
                signal.clone().into_pyobject(py)?.into_any(),
                limit.as_ref().map(wire_name).into_pyobject(py)?.into_any(),
            ],
        ),
        // A failure never reaches here: it is raised.
        ProcessEvent::Closed { .. } | ProcessEvent::Failed(_) => PyTuple::new(py, ["closed"]),
    }
}

#[pymethods]
impl Process {
    /// The process id (unique in its session).
    #[getter]
    fn id(&self) -> String {
        self.id.clone()
    }

    /// The OS pid, when the server reports it.
    #[getter]
    fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The next events, in seq order: waits for one, then takes what is
    /// already queued up to about `max_bytes` of output. Resolves to a list
    /// of tuples (see `to_python`); an empty list once the stream ended.
    /// A stream that failed (events lost, session not recovered) raises.
    fn next_events<'py>(&self, py: Python<'py>, max_bytes: usize) -> PyResult<Bound<'py, PyAny>> {
        let events = self.events.clone();
        crate::awaitable(py, async move {
            let mut guard = events.lock().await;
            if let Some(f) = guard.failed.take() {
                return Err(errors::client(ClientError::Stream(f)));
            }
            let Some(handle) = guard.handle.as_mut() else {
                return crate::attach(|py| Ok(PyList::empty(py).into_any().unbind())).await;
            };
            let mut batch = Vec::new();
            let mut bytes = 0;
            match handle.next_event().await {
                Some(ev) => batch.push(ev),
                None => return crate::attach(|py| Ok(PyList::empty(py).into_any().unbind())).await,
            }
            loop {
                if let Some(ProcessEvent::Output { data, .. }) = batch.last() {
                    bytes += data.len();
                }
                if bytes >= max_bytes
                    || matches!(
                        batch.last(),
                        Some(ProcessEvent::Closed { .. } | ProcessEvent::Failed(_))
                    )
                {
                    break;
                }
                match handle.next_event().now_or_never() {
                    Some(Some(ev)) => batch.push(ev),
                    _ => break,
                }
            }
            // A failure ends the stream: what came before it is delivered
            // now, the failure raised by the next call.
            if let Some(ProcessEvent::Failed(f)) = batch.last() {
                let f = f.clone();
                batch.pop();
                if batch.is_empty() {
                    return Err(errors::client(ClientError::Stream(f)));
                }
                guard.failed = Some(f);
            }
            drop(guard);
            crate::attach(|py| {
                let list = PyList::empty(py);
                for ev in &batch {
                    list.append(to_python(py, ev)?)?;
                }
                Ok(list.into_any().unbind())
            })
            .await
        })
    }

    /// Writes `data` to stdin (retried with the same write id after a
    /// dropped connection, up to 5 times, applied once). Resolves to the status's wire name
    /// (`accepted`, `stdinClosed`, `unknownProcess`, `starting`).
    fn write<'py>(&self, py: Python<'py>, data: Vec<u8>) -> PyResult<Bound<'py, PyAny>> {
        let (client, id) = (self.client.clone(), self.id.clone());
        crate::awaitable(py, async move {
            let status = client
                .write_process(&id, data)
                .await
                .map_err(errors::client)?;
            Ok(wire_name(&status))
        })
    }

    /// Closes stdin (end of file for the process).
    fn close_stdin<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (client, id) = (self.client.clone(), self.id.clone());
        crate::awaitable(py, async move {
            let status = client.close_stdin(&id).await.map_err(errors::client)?;
            Ok(wire_name(&status))
        })
    }

    /// Sends a signal by wire name (`interrupt`, `terminate`, `kill`,
    /// `hangup`, …) to the process's group.
    fn signal<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let signal: ProcessSignal = serde_json::from_value(serde_json::Value::from(name))
            .map_err(|_| errors::value(format!("unknown signal {name:?}")))?;
        let (client, id) = (self.client.clone(), self.id.clone());
        crate::awaitable(py, async move {
            client.signal(&id, signal).await.map_err(errors::client)
        })
    }

    /// Kills the process and its tree. Resolves to `killedRunning`,
    /// `killedLeftovers` or `nothingToDo`.
    fn terminate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (client, id) = (self.client.clone(), self.id.clone());
        crate::awaitable(py, async move {
            let outcome = client.terminate(&id).await.map_err(errors::client)?;
            Ok(match outcome {
                TerminateOutcome::KilledRunning => "killedRunning",
                TerminateOutcome::KilledLeftovers => "killedLeftovers",
                TerminateOutcome::NothingToDo => "nothingToDo",
            })
        })
    }

    /// Resizes the PTY to `rows` × `cols`.
    fn resize<'py>(&self, py: Python<'py>, rows: u16, cols: u16) -> PyResult<Bound<'py, PyAny>> {
        let (client, id) = (self.client.clone(), self.id.clone());
        crate::awaitable(py, async move {
            client.resize(&id, cols, rows).await.map_err(errors::client)
        })
    }
}

/// A response body read as it arrives (`http_request(..., stream=True)`).
#[pyclass(module = "exec_server._native", frozen)]
pub struct HttpBody {
    deltas: Arc<
        tokio::sync::Mutex<
            tokio::sync::mpsc::UnboundedReceiver<exec_server_client::protocol::HttpBodyDelta>,
        >,
    >,
}

impl HttpBody {
    pub(crate) fn new(
        rx: tokio::sync::mpsc::UnboundedReceiver<exec_server_client::protocol::HttpBodyDelta>,
    ) -> HttpBody {
        HttpBody {
            deltas: Arc::new(tokio::sync::Mutex::new(rx)),
        }
    }
}

#[pymethods]
impl HttpBody {
    /// The next piece of the body; `None` at its end. A body the server
    /// could not finish raises `ConnectionFailed` with its reason.
    fn next_chunk<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let deltas = self.deltas.clone();
        crate::awaitable(py, async move {
            let mut rx = deltas.lock().await;
            loop {
                let Some(delta) = rx.recv().await else {
                    return Ok(None);
                };
                if let Some(error) = delta.error {
                    return Err(errors::stream_failed(error));
                }
                if delta.delta_base64.0.is_empty() && delta.done {
                    return Ok(None);
                }
                if delta.done {
                    // The last piece: the next call ends the body.
                    rx.close();
                }
                if delta.delta_base64.0.is_empty() {
                    continue;
                }
                let data = delta.delta_base64.0;
                return Ok(Some(
                    crate::attach(|py| PyBytes::new(py, &data).unbind()).await,
                ));
            }
        })
    }
}

/// A watch on a path (`fs/watch`): its events in order.
#[pyclass(module = "exec_server._native", frozen)]
pub struct FileWatch {
    watch: Arc<tokio::sync::Mutex<Option<exec_server_client::Watch>>>,
}

impl FileWatch {
    pub(crate) fn new(watch: exec_server_client::Watch) -> FileWatch {
        FileWatch {
            watch: Arc::new(tokio::sync::Mutex::new(Some(watch))),
        }
    }
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        // The watch is removed on the server from inside the runtime.
        if let Ok(mut slot) = self.watch.try_lock() {
            if let Some(w) = slot.take() {
                in_runtime(|| drop(w));
            }
        }
    }
}

/// A path as Python shows it: the native path of a `file://` URI.
fn native_path(p: &exec_server_client::PathUri) -> String {
    p.to_path()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| p.as_str().to_string())
}

#[pymethods]
impl FileWatch {
    /// The next event: `("changed", kind, [paths])` or `("ended", reason)`;
    /// `None` after the end (or once closed).
    fn next_event<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let watch = self.watch.clone();
        crate::awaitable(py, async move {
            let mut slot = watch.lock().await;
            let Some(w) = slot.as_mut() else {
                return Ok(None);
            };
            let event = w.next().await;
            crate::attach(|py| {
                Ok(match event {
                    Some(exec_server_client::WatchEvent::Changed { kind, paths }) => {
                        let paths: Vec<String> = paths.iter().map(native_path).collect();
                        Some(
                            ("changed", kind, paths)
                                .into_pyobject(py)?
                                .into_any()
                                .unbind(),
                        )
                    }
                    Some(exec_server_client::WatchEvent::Ended { reason }) => {
                        Some(("ended", reason).into_pyobject(py)?.into_any().unbind())
                    }
                    None => None,
                })
            })
            .await
        })
    }

    /// Removes the watch on the server.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let watch = self.watch.clone();
        crate::awaitable(py, async move {
            drop(watch.lock().await.take());
            Ok(())
        })
    }
}
