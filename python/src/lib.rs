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

/// Called at interpreter exit (`atexit`): lets the runtime's threads finish
/// waking the event loop. A Tokio thread that completed an awaitable may
/// still be inside the loop's wake-up call, waiting for the GIL; were the
/// interpreter finalized first, CPython would end that thread with
/// `pthread_exit` through Rust frames, which aborts the process. Releasing
/// the GIL for a moment here lets it leave first.
#[pyfunction]
fn quiesce(py: Python<'_>) {
    py.detach(|| std::thread::sleep(std::time::Duration::from_millis(20)));
}

/// Runs `f` inside the shared Tokio runtime's context (what the client
/// library needs to spawn its tasks), from a Python thread.
pub(crate) fn in_runtime<T>(f: impl FnOnce() -> T) -> T {
    let _entered = pyo3_async_runtimes::tokio::get_runtime().enter();
    f()
}
