//! `fs/*` with a `sandbox` (SANDBOX.md §2.7).
//!
//! Operations the policy allows anyway (reads under a full-read policy,
//! everything under a full-write one) run in-process. The others run in a
//! **confined helper**: this binary re-executed inside the same bubblewrap view
//! a process would get ([`FLAG`]), with an empty environment and `/` as cwd;
//! one JSON request on stdin, one JSON response on stdout.
//!
//! Why a helper rather than path checks in the server: the kernel then makes
//! every decision on the real, fully resolved path at the moment of the
//! operation (bind mounts pin the view), so a symlink swapped in by a
//! concurrently running sandboxed command cannot redirect a write, and the
//! file-system code and its error texts are exactly those of the unsandboxed
//! path. Cost: one confined start per operation (a few milliseconds).
//!
//! Errors inside the helper are re-kinded as the reference's (see
//! [`helper_error`]) and cross the pipe as kind, message and OS error number;
//! a helper that fails is [`ErrorKind::Failed`] `fs sandbox helper failed with
//! status …`.

use super::{to_policy, Confine, Support};
use crate::error::{ErrorKind, ExecError, ExecResult};
use crate::fs;
use crate::reaper;
use exec_server_protocol::methods as m;
use exec_server_protocol::types::*;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The hidden command-line flag that makes the binary serve one request.
pub const FLAG: &str = "--sandbox-fs-helper";

/// Largest helper response read: 512 MiB (a 256 MiB file in base64, and more).
pub const MAX_RESPONSE_BYTES: u64 = 512 * 1024 * 1024;

/// What an operation needs from the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Only reading.
    Read,
    /// Changing something.
    Write,
}

/// Where an `fs/*` request runs.
pub enum Route {
    /// In the server, unconfined (no sandbox, or the policy allows it anyway,
    /// or the operator's opt-out where enforcement is impossible).
    InProcess,
    /// In the confined helper.
    Helper(Box<Helper>),
}

/// Where [`route`] sends a request: a [`Route`], or in the server provided
/// it follows no symlink at all (the helper otherwise).
pub enum Routed {
    /// As decided.
    Route(Route),
    /// In the server if the request can refuse every symlink on its way
    /// (`followSymlinks: false`: one swapped in since the check then fails
    /// the request), else in this helper.
    WithoutSymlinks(Box<Helper>),
}

impl Routed {
    /// The route for a request that can (`true`) or cannot refuse symlinks.
    pub fn refusing_symlinks(self, can: bool) -> Route {
        match self {
            Routed::Route(r) => r,
            Routed::WithoutSymlinks(_) if can => Route::InProcess,
            Routed::WithoutSymlinks(h) => Route::Helper(h),
        }
    }
}

/// A confined helper run for one request.
pub struct Helper {
    confine: Confine,
}

/// Decides where a request on `path` runs. [`ErrorKind::InvalidParams`] `file system
/// sandbox context with dynamic permissions requires cwd` when the policy
/// needs a cwd it lacks; the refusals of [`Support`] where it cannot be enforced.
///
/// A read the policy allows everywhere runs in the server only where the
/// server reads what the command's view shows
/// ([`exec_server_sandbox::links::Resolver::read_outside_a_view`]): a
/// symlink a confined command planted (or swaps in while the server reads)
/// could otherwise point the server at its own `/proc/self` (its
/// environment, its descriptors), at another session's `/proc/PID`, or at
/// its masked runtime directory. In a directory a sandbox may write, the
/// read runs in the server only refusing every symlink
/// ([`Routed::WithoutSymlinks`]): it then sees what the view shows, with
/// the server's own permissions (as the reference). A read without a path
/// to check (`None`) goes to the helper.
pub fn route(
    sandbox: Option<&FileSystemSandboxContext>,
    need: Need,
    path: Option<&Path>,
    support: &Support,
) -> ExecResult<Routed> {
    let Some(ctx) = sandbox else {
        return Ok(Routed::Route(Route::InProcess));
    };
    if ctx.is_dynamic() && ctx.policy_cwd().is_none() {
        return Err(ExecError::invalid_params(
            "file system sandbox context with dynamic permissions requires cwd",
        ));
    }
    let server_cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let policy = to_policy(ctx, &server_cwd)?;
    if policy.writes_everything() {
        // No view at all (nothing masked): a command under it sees the host.
        return Ok(Routed::Route(Route::InProcess));
    }
    if need == Need::Read && policy.reads_everything() {
        // Where no sandbox can be made, none made the path either.
        let Ok(Some(confine)) = support.confine(policy) else {
            return Ok(Routed::Route(Route::InProcess));
        };
        use exec_server_sandbox::links::{OutsideAView, Resolver};
        let helper = Box::new(Helper { confine });
        let outside = path.map_or(OutsideAView::Differs, |p| {
            Resolver::new().read_outside_a_view(p, &helper.confine.runtime.hidden)
        });
        return Ok(match outside {
            OutsideAView::Same => Routed::Route(Route::InProcess),
            OutsideAView::SameWithoutSymlinks => Routed::WithoutSymlinks(helper),
            OutsideAView::Differs => Routed::Route(Route::Helper(helper)),
        });
    }
    Ok(Routed::Route(match support.confine(policy)? {
        Some(confine) => Route::Helper(Box::new(Helper { confine })),
        None => Route::InProcess,
    }))
}

fn helper_failed(msg: impl std::fmt::Display) -> ExecError {
    ExecError::failed(format!("fs sandbox helper failed with status {msg}"))
}

impl Helper {
    /// Runs `operation` with `params` (their `sandbox` is dropped) in the
    /// helper, on the blocking pool; decodes the result as `T`.
    pub async fn call<P: Serialize, T: DeserializeOwned + Send + 'static>(
        self,
        operation: &'static str,
        params: &P,
    ) -> ExecResult<T> {
        let (value, _) = self.exchange(operation, params).await?;
        serde_json::from_value(value).map_err(|e| helper_failed(format!("0: bad response: {e}")))
    }

    /// `fs/open` in the helper: the file is opened inside the sandbox's view
    /// and its descriptor passed back; reads and writes on the handle then use
    /// it directly (`sandboxedFileStreaming`).
    pub async fn open(self, params: &OpenParams) -> ExecResult<fs::handles::Handle> {
        let (value, fds) = self.exchange(m::FS_OPEN, params).await?;
        let mut fds = fds.into_iter();
        let file = fds
            .next()
            .map(std::fs::File::from)
            .ok_or_else(|| helper_failed("0: no descriptor"))?;
        // A replace comes with its directory and names: the rename over the
        // target happens here at fs/close, as for an unsandboxed upload.
        let replace =
            match (fds.next(), value["temp"].as_str(), value["target"].as_str()) {
                (Some(dir), Some(temp), Some(target)) => Some(
                    fs::write::PendingReplace::from_parts(dir, temp.into(), target.into()),
                ),
                _ => None,
            };
        Ok(fs::handles::Handle::from_parts(file, replace))
    }

    /// One request (params without their `sandbox`) and its response, with
    /// any descriptors passed back.
    async fn exchange<P: Serialize>(
        self,
        operation: &'static str,
        params: &P,
    ) -> ExecResult<(Value, Vec<OwnedFd>)> {
        let mut params = serde_json::to_value(params)
            .map_err(|e| ExecError::failed(format!("fs sandbox request: {e}")))?;
        if let Some(o) = params.as_object_mut() {
            o.remove("sandbox");
        }
        let request = json!({"operation": operation, "params": params}).to_string();
        tokio::task::spawn_blocking(move || self.run(request))
            .await
            .unwrap_or_else(|e| Err(ExecError::failed(format!("fs sandbox task failed: {e}"))))
    }

    fn run(&self, request: String) -> ExecResult<(Value, Vec<OwnedFd>)> {
        let runtime = &self.confine.runtime;
        let mut extra: Vec<PathBuf> = vec![runtime.helper.clone(), runtime.inner.clone()];
        extra.extend(exec_server_sandbox::MINIMAL_ROOTS.iter().map(PathBuf::from));
        let plan = exec_server_sandbox::resolve(&self.confine.policy, &extra)
            .map_err(|e| ExecError::permission_denied(e.to_string()).with_source(e))?;
        let helper = self.confine.runtime.helper.clone();
        let prepared = exec_server_sandbox::prepare(
            &self.confine.runtime,
            plan,
            &exec_server_sandbox::Command {
                program: &helper,
                arg0: "exec-server",
                args: &[FLAG.to_string()],
                cwd: Path::new("/"),
                env: &std::collections::BTreeMap::new(),
            },
        )
        .map_err(|e| ExecError::permission_denied(e.to_string()).with_source(e))?;
        let exec_server_sandbox::Prepared {
            mut command,
            guard,
            fds,
            ..
        } = prepared;
        // stdout is a socket, so the helper can pass a descriptor back.
        let (ours, theirs) = exec_server_sysio::fd_pass::socket_pair().map_err(cannot_start)?;
        command
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::from(theirs))
            .stderr(Stdio::piped());
        let (mut child, exit) = reaper::spawn_command(&mut command).map_err(cannot_start)?;
        // Our copies of the child's ends, so its exit is seen as end of file.
        drop(command);
        drop(fds);
        let mut err = Vec::new();
        if let Some(mut stdin) = child.stdin.take() {
            // A helper that died early closes its end: its status tells why.
            let _ = stdin.write_all(request.as_bytes());
        }
        let (out, passed) =
            exec_server_sysio::fd_pass::recv_all(&ours, MAX_RESPONSE_BYTES).unwrap_or_default();
        if let Some(stderr) = child.stderr.take() {
            let _ = stderr.take(64 * 1024).read_to_end(&mut err);
        }
        let code = exit.blocking_recv().map(|e| e.code).unwrap_or(-1);
        drop(guard);
        let response: Option<Response> = serde_json::from_slice(&out).ok();
        match response {
            Some(Response::Ok(payload)) if code == 0 => Ok((payload, passed)),
            Some(Response::Error(e)) if code == 0 => Err(e.into_error()),
            _ => Err(helper_failed(format!(
                "exit status: {code}: {}",
                String::from_utf8_lossy(&err).trim_end()
            ))),
        }
    }
}

fn cannot_start(e: std::io::Error) -> ExecError {
    ExecError::failed(format!("cannot start the fs sandbox helper: {e}")).with_source(e)
}

/// Re-kinds an error made inside the helper as the reference's helper does:
/// not found → not found; permission denied and invalid argument → invalid
/// input; other OS errors → I/O (e.g. `Read-only file system
/// (os error 30)` for a write outside the writable roots).
fn helper_error(e: ExecError) -> ExecError {
    let Some(os) = e.io_error().and_then(std::io::Error::raw_os_error) else {
        return e;
    };
    let kind = match os {
        libc::ENOENT => ErrorKind::NotFound,
        libc::EACCES | libc::EPERM | libc::EINVAL => ErrorKind::InvalidInput,
        _ => ErrorKind::Io,
    };
    let message = e.message().to_string();
    ExecError::new(kind, message).with_source(std::io::Error::from_raw_os_error(os))
}

/// What the helper writes on its stdout: `{"status": "ok", "payload": …}`
/// or `{"status": "error", "payload": {"kind", "message", "osError"?}}`.
#[derive(Serialize, Deserialize)]
#[serde(tag = "status", content = "payload", rename_all = "camelCase")]
enum Response {
    Ok(Value),
    Error(HelperError),
}

/// A domain error as it crosses the helper's pipe.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HelperError {
    kind: ErrorKind,
    message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    os_error: Option<i32>,
}

impl HelperError {
    fn of(e: &ExecError) -> HelperError {
        HelperError {
            kind: e.kind(),
            message: e.message().to_string(),
            os_error: e.io_error().and_then(std::io::Error::raw_os_error),
        }
    }

    fn into_error(self) -> ExecError {
        let e = ExecError::new(self.kind, self.message);
        match self.os_error {
            Some(os) => e.with_source(std::io::Error::from_raw_os_error(os)),
            None => e,
        }
    }
}

fn bad_request(e: serde_json::Error) -> ExecError {
    ExecError::invalid_params(e.to_string())
}

fn op<P: DeserializeOwned, T: Serialize>(
    params: Value,
    f: impl FnOnce(P) -> ExecResult<T>,
) -> ExecResult<Value> {
    let p: P = serde_json::from_value(params).map_err(bad_request)?;
    let r = f(p)?;
    serde_json::to_value(r).map_err(|e| ExecError::failed(e.to_string()))
}

/// `fs/open` inside the helper: the response and the descriptors to pass
/// (the file; for a replace also its directory, the names in the response).
fn open_here(params: Value) -> ExecResult<(Value, Vec<OwnedFd>)> {
    let p: OpenParams = serde_json::from_value(params).map_err(bad_request)?;
    let table = fs::handles::HandleTable::default();
    fs::open(&p, &table)?;
    let handle = table
        .take(&p.handle_id)
        .ok_or_else(|| ExecError::failed("fs/open left no handle"))?;
    let (file, replace) = handle.into_parts();
    let file = file.try_clone().map_err(ExecError::io)?;
    let mut fds = vec![OwnedFd::from(file)];
    let mut v = json!({"handleId": p.handle_id});
    if let Some(pending) = replace {
        let (dir, temp, target) = pending.into_parts();
        fds.push(dir);
        v["temp"] = json!(temp.to_string_lossy());
        v["target"] = json!(target.to_string_lossy());
    }
    Ok((v, fds))
}

fn dispatch(operation: &str, params: Value) -> ExecResult<Value> {
    match operation {
        m::FS_READ_FILE => op(params, |p: ReadFileParams| fs::read_file(&p)),
        m::FS_WRITE_FILE => op(params, fs::write_file),
        m::FS_CREATE_DIRECTORY => op(params, |p: CreateDirectoryParams| fs::create_directory(&p)),
        m::FS_GET_METADATA => op(params, |p: PathParams| fs::get_metadata(&p)),
        m::FS_CANONICALIZE => op(params, |p: PathParams| fs::canonicalize(&p)),
        m::FS_READ_DIRECTORY => op(params, |p: PathParams| fs::read_directory(&p)),
        m::FS_REMOVE => op(params, |p: RemoveParams| fs::remove(&p)),
        m::FS_COPY => op(params, |p: CopyParams| fs::copy(&p)),
        m::CAPABILITY_ROOTS_DISCOVER_V1 => op(params, |p: RootsDiscoverParams| {
            crate::discovery::roots_discover_v1(&p)
        }),
        m::FS_WALK => op(params, |p: WalkParams| {
            let root = fs::native(&p.path)?;
            fs::walk::walk(&root, &p.options)
        }),
        other => Err(ExecError::invalid_input(format!(
            "fs sandbox helper: unsupported operation {other}"
        ))),
    }
}

/// The helper's `main`: one request from stdin, one response on stdout.
/// Returns the process exit status (0 whenever a response was written).
pub fn serve() -> i32 {
    let mut input = Vec::new();
    if std::io::stdin().read_to_end(&mut input).is_err() {
        return 1;
    }
    let mut passed: Vec<OwnedFd> = Vec::new();
    let result = match serde_json::from_slice::<Value>(&input) {
        Ok(req) => {
            let operation = req["operation"].as_str().unwrap_or("").to_string();
            let params = req["params"].clone();
            if operation == m::FS_OPEN {
                open_here(params).map(|(v, fds)| {
                    passed = fds;
                    v
                })
            } else {
                dispatch(&operation, params)
            }
            .map_err(helper_error)
        }
        Err(e) => Err(ExecError::invalid_input(format!("bad helper request: {e}"))),
    };
    let response = match result {
        Ok(payload) => Response::Ok(payload),
        Err(e) => Response::Error(HelperError::of(&e)),
    };
    let bytes = serde_json::to_vec(&response).unwrap_or_default();
    let mut sent = 0;
    if !passed.is_empty() {
        use std::os::fd::AsRawFd;
        let raw: Vec<i32> = passed.iter().map(|f| f.as_raw_fd()).collect();
        // stdout is the server's socket: the descriptors ride on the first bytes.
        match exec_server_sysio::fd_pass::send_with_fds(1, &bytes, &raw) {
            Ok(n) => sent = n,
            Err(_) => return 1,
        }
    }
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(&bytes[sent..])
        .and_then(|_| stdout.flush())
        .is_err()
    {
        return 1;
    }
    0
}
