//! The method table: one handler per method, each a thin adapter from typed
//! params to the session, process, fs, http or discovery module that does the
//! work. This is the only module that knows JSON-RPC codes: the modules below
//! return an [`ExecError`], and [`wire_error`] maps its kind to a code.
//!
//! One file per method group; [`router`] assembles the table.

mod discovery;
mod fs;
mod http;
mod process;
mod process_start;
mod session;

use crate::connection::Ctx;
use crate::error::{ErrorKind, ExecError};
use crate::sandbox::fs_helper::{Need, Route, Routed};
use crate::session::Session;
use exec_server_protocol::ErrorObject;
use exec_server_rpc::router::{Mode, Reply, Router};
use std::sync::Arc;

/// Builds the router. `fs_mode` is `Detached` when `--concurrent-requests` > 1.
pub fn router(fs_mode: Mode) -> Router<Ctx> {
    let mut r = Router::new().gate(session::gate);
    session::register(&mut r);
    process::register(&mut r);
    fs::register(&mut r, fs_mode);
    discovery::register(&mut r, fs_mode);
    http::register(&mut r);
    r
}

/// The JSON-RPC error for a domain error, with its message unchanged: the
/// code of its kind ([`ErrorKind::code`]: not found → -32004; an unknown
/// id, a taken id, input that does not apply and a reached limit → -32600;
/// malformed params → -32602; a session attached elsewhere → -32010;
/// refusals, OS failures, spawn and other failures → -32603).
///
/// Ours, additive (the reference sends no `data`): a structured `data` member
/// `{"kind": …, "errno": N, "path": "…"}` a client can branch on — `kind` as
/// [`wire_kind`] names it, `errno` when an OS error is behind it, `path` when
/// the failure is about one (a program, a working directory).
pub fn wire_error(e: &ExecError) -> ErrorObject {
    let errno = e.io_error().and_then(std::io::Error::raw_os_error);
    let mut data = serde_json::Map::new();
    data.insert("kind".into(), wire_kind(e.kind(), errno).as_str().into());
    if let Some(n) = errno {
        data.insert("errno".into(), n.into());
    }
    if let Some(p) = e.path() {
        data.insert("path".into(), p.to_string_lossy().into_owned().into());
    }
    let mut obj = ErrorObject::new(e.kind().code(), e.message());
    obj.data = Some(serde_json::Value::Object(data));
    obj
}

/// The `data.kind` of an error: its kind, except that an OS failure of
/// EACCES or EPERM is `permissionDenied` (its code stays that of `io`).
pub fn wire_kind(kind: ErrorKind, errno: Option<i32>) -> ErrorKind {
    match kind {
        ErrorKind::Io if matches!(errno, Some(libc::EACCES | libc::EPERM)) => {
            ErrorKind::PermissionDenied
        }
        k => k,
    }
}

impl From<ExecError> for ErrorObject {
    fn from(e: ExecError) -> Self {
        wire_error(&e)
    }
}

/// The answer to a message that does not decode (sent with id -1).
pub fn undecodable(parse_context: &str, why: &str) -> ErrorObject {
    ErrorObject::invalid_request(format!("failed to parse {parse_context}: {why}"))
}

/// The answer to a spawned request beyond the per-connection limit.
pub fn too_many_in_flight(limit: usize) -> ErrorObject {
    ErrorObject::invalid_request(format!(
        "too many requests in flight on this connection (limit {limit}); wait for some to finish"
    ))
}

/// The connection's session, once `initialize` succeeded.
fn session_of(ctx: &Ctx) -> Result<Arc<Session>, ErrorObject> {
    ctx.session()
        .ok_or_else(|| ErrorObject::invalid_request("client must call initialize first"))
}

/// Runs blocking file system work on Tokio's blocking pool.
async fn blocking<T: Send + 'static, E: Into<ErrorObject> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, ErrorObject> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Into::into),
        Err(e) => Err(ErrorObject::internal(format!(
            "file system task failed: {e}"
        ))),
    }
}

/// Spare capacity a large result reserves so that the connection can wrap it in
/// its response envelope (`{"id":…,"result":` and `}`) in place, without a
/// second buffer of the reply's size.
const REPLY_ENVELOPE_SPARE: usize = 64;

/// A result holding bytes, built in one allocation: base64 never needs JSON
/// escaping, so the usual serializer's per-byte escape scan and the extra copies
/// are skipped (the hot path of file transfers; benchmarked).
fn raw_bytes_reply(head: &str, data: &[u8], tail: &str) -> Reply {
    use exec_server_protocol::bytes;
    let mut s = String::with_capacity(
        head.len() + bytes::encoded_len(data.len()) + tail.len() + REPLY_ENVELOPE_SPARE,
    );
    s.push_str(head);
    bytes::encode_into(data, &mut s);
    s.push_str(tail);
    Reply::json(s)
}

/// Params that carry a `sandbox`, and what the method needs from it.
trait Sandboxed {
    fn sandbox(&self) -> Option<&FileSystemSandboxContext>;
    /// [`Need::Write`] if the request changes anything; [`Need::Read`] for a
    /// pure read.
    fn need(&self) -> Need;
    /// The path a read would read, to check before reading it in-process
    /// (`None`: no path that can be checked so).
    fn read_path(&self) -> Option<std::path::PathBuf>;
    /// Makes the request refuse every symlink on its way
    /// (`followSymlinks: false`); false when it cannot be so made.
    fn refuse_symlinks(&mut self) -> bool;
}

/// Where a file request runs under its `sandbox` (see
/// [`crate::sandbox::fs_helper::route`]).
fn fs_route(ctx: &Ctx, p: &mut impl Sandboxed) -> Result<Route, ErrorObject> {
    let routed = crate::sandbox::fs_helper::route(
        p.sandbox(),
        p.need(),
        p.read_path().as_deref(),
        &ctx.server.sandbox,
    )?;
    let can = matches!(routed, Routed::WithoutSymlinks(_)) && p.refuse_symlinks();
    Ok(routed.refusing_symlinks(can))
}

macro_rules! sandboxed {
    ($($t:ty => $need:expr, $path:expr, $refuse:expr);* $(;)?) => {$(
        impl Sandboxed for $t {
            fn sandbox(&self) -> Option<&FileSystemSandboxContext> {
                self.sandbox.as_ref()
            }
            fn need(&self) -> Need {
                let f: fn(&$t) -> Need = $need;
                f(self)
            }
            fn read_path(&self) -> Option<std::path::PathBuf> {
                let f: fn(&$t) -> Option<&exec_server_protocol::PathUri> = $path;
                f(self).and_then(|u| u.to_path().ok())
            }
            fn refuse_symlinks(&mut self) -> bool {
                let f: fn(&mut $t) -> bool = $refuse;
                f(self)
            }
        }
    )*};
}

use exec_server_protocol::types::*;
sandboxed! {
    ReadFileParams => |_| Need::Read, |p| Some(&p.path), |p| {
        p.follow_symlinks = Some(false);
        true
    };
    WriteFileParams => |_| Need::Write, |_| None, |_| false;
    CreateDirectoryParams => |_| Need::Write, |_| None, |_| false;
    // Shared by readDirectory, which follows its entries' links whatever
    // the flag says: it cannot refuse them.
    PathParams => |_| Need::Read, |p| Some(&p.path), |_| false;
    // A walk that follows directory symlinks may leave its root for
    // anywhere: only its root can be checked when it does not.
    WalkParams => |_| Need::Read,
        |p| (!p.options.follow_directory_symlinks).then_some(&p.path), |_| false;
    RemoveParams => |_| Need::Write, |_| None, |_| false;
    CopyParams => |_| Need::Write, |_| None, |_| false;
    OpenParams => |p| if p.mode == OpenMode::Replace { Need::Write } else { Need::Read },
        |p| Some(&p.path), |_| false;
}
