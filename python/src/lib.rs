//! The native half of the Python package `exec_server`: the Rust client
//! library (`exec-server-client`) behind awaitables that asyncio drives.
//!
//! Everything Pythonic (the `Command` builder, `run`, the exception classes,
//! the blocking twin, stream demultiplexing) lives in the pure-Python
//! package; this module exposes two classes, [`environment::Environment`]
//! and [`process::Process`], whose async methods return asyncio awaitables
//! running on one Tokio runtime shared by the process
//! (`pyo3-async-runtimes`). Errors are raised as the package's own
//! exception classes (`exec_server.errors`), chosen by the client's
//! `ErrorKind`.

mod environment;
mod errors;
mod network;
mod process;

use pyo3::prelude::*;
use pyo3::BoundObject;
use std::sync::atomic::{AtomicBool, Ordering};

/// The module `exec_server._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<environment::Environment>()?;
    m.add_class::<process::Process>()?;
    m.add_class::<process::HttpBody>()?;
    m.add_class::<process::FileWatch>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(quiesce, m)?)?;
    Ok(())
}

/// Set at interpreter exit: from then on no awaitable of this module
/// touches Python again.
pub(crate) static EXITING: AtomicBool = AtomicBool::new(false);

/// Called at interpreter exit (`atexit`). A Tokio thread that enters Python
/// while the interpreter is finalized is ended by CPython with
/// `pthread_exit` through Rust frames, which aborts the process; and
/// awaitables still running (a read of a process that never ends, shielded
/// from cancellation) finish at any time. So: no awaitable enters Python
/// after this ([`EXITING`]), and the GIL is released for a moment so a
/// thread already on its way in gets out first.
#[pyfunction]
fn quiesce(py: Python<'_>) {
    EXITING.store(true, Ordering::Release);
    py.detach(|| std::thread::sleep(std::time::Duration::from_millis(20)));
}

/// `Python::attach` for the runtime's tasks: never returns once the
/// interpreter is exiting (the task then waits forever, touching nothing).
pub(crate) async fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    if EXITING.load(Ordering::Acquire) {
        std::future::pending::<()>().await;
    }
    Python::attach(f)
}

/// An asyncio future for `fut`, run on the shared runtime. Cancelling the
/// future aborts the task. Its result is delivered under one hold of the
/// GIL that first checks the event loop is still open, so nothing is ever
/// handed to a loop that `asyncio.run` has closed (nor to an exiting
/// interpreter, see [`attach`]).
pub(crate) fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: std::future::Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let future = event_loop.call_method0("create_future")?;
    let (loop_ref, future_ref) = (event_loop.unbind(), future.clone().unbind());
    let task = pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
        let out = fut.await;
        attach(|py| deliver(py, &loop_ref, &future_ref, out)).await;
    });
    let abort = task.abort_handle();
    let on_done = pyo3::types::PyCFunction::new_closure(
        py,
        None,
        None,
        move |args: &Bound<'_, pyo3::types::PyTuple>,
              _: Option<&Bound<'_, pyo3::types::PyDict>>|
              -> PyResult<()> {
            if args
                .get_item(0)?
                .call_method0("cancelled")?
                .extract::<bool>()?
            {
                abort.abort();
            }
            Ok(())
        },
    )?;
    future.call_method1("add_done_callback", (on_done,))?;
    Ok(future)
}

/// Hands `out` to `future` on its loop, unless the loop has closed.
fn deliver<T>(py: Python<'_>, event_loop: &Py<PyAny>, future: &Py<PyAny>, out: PyResult<T>)
where
    T: for<'a> IntoPyObject<'a>,
{
    let event_loop = event_loop.bind(py);
    let closed = event_loop
        .call_method0("is_closed")
        .and_then(|v| v.extract::<bool>())
        .unwrap_or(true);
    if closed {
        return;
    }
    let (ok, value): (bool, Py<PyAny>) = match out.and_then(|v| {
        v.into_pyobject(py)
            .map(|o| o.into_any().unbind())
            .map_err(Into::into)
    }) {
        Ok(v) => (true, v),
        Err(e) => (false, e.into_value(py).into_any()),
    };
    let delivered = py
        .import("exec_server._bridge")
        .and_then(|m| m.getattr("deliver"))
        .and_then(|d| {
            event_loop.call_method1("call_soon_threadsafe", (d, future.bind(py), ok, value))
        });
    if let Err(e) = delivered {
        // Only a loop closing between the check and here; nothing waits.
        drop(e);
    }
}

/// Runs `f` inside the shared Tokio runtime's context (what the client
/// library needs to spawn its tasks), from a Python thread.
pub(crate) fn in_runtime<T>(f: impl FnOnce() -> T) -> T {
    let _entered = pyo3_async_runtimes::tokio::get_runtime().enter();
    f()
}
