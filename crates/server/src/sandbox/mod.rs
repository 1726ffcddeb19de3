//! Server side of the `sandbox` member (SANDBOX.md): converting the wire's
//! [`FileSystemSandboxContext`] into the sandbox crate's [`Policy`], deciding
//! per request whether and how to confine, and the file-system helper
//! ([`fs_helper`]). The confinement itself lives in `exec-server-sandbox`.
//!
//! `--allow-unsandboxed` now means only this: where enforcement is impossible
//! on this host (no `bwrap` for a policy that needs namespaces, or no helper
//! executable configured), run the request unconfined and say so
//! (`sandboxType: "none"`) instead of refusing it. Where enforcement is
//! possible it has no effect: a sandbox is always enforced, and a sandbox that
//! fails at run time (e.g. user namespaces disabled) never falls back.

pub mod fs_helper;
pub mod peers;

use crate::error::{ExecError, ExecResult};
use exec_server_protocol::types::{
    ExecPermissionProfile, FileSystemAccess, FileSystemPermissions, FileSystemSandboxContext,
    NetworkAccess, PermissionPath, SpecialPath,
};
use exec_server_protocol::PathUri;
pub use exec_server_sandbox::inner::{run as run_inner_stage, INNER_FLAG};
use exec_server_sandbox::{
    Access, FileSystem, Guard, Plan, Policy, Prepared, Profile, ProxyRoute, Rule, Runtime, Target,
    Warm,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `sandboxType` of a confined start (the reference's value for any sandbox object).
pub const SANDBOX_TYPE_LINUX: &str = "linuxSeccomp";
/// `sandboxType` of an unconfined start.
pub const SANDBOX_TYPE_NONE: &str = "none";

/// What this server can enforce, decided once at start.
#[derive(Debug, Clone)]
pub struct Support {
    /// The programs confinement needs; `None` when no helper executable was
    /// configured (the server embedded in another program).
    runtime: Option<Runtime>,
    /// The operator's opt-out for hosts where enforcement is impossible.
    allow_unsandboxed: bool,
    /// The live sandboxes, to refuse connections from inside them.
    pids: Arc<peers::SandboxPids>,
}

/// The inner stage's executable for a server whose own is `server`: the
/// faster program beside it when it is of the same build, else `server`.
fn inner_stage(server: &Path) -> PathBuf {
    use exec_server_sandbox::inner_program::{beside, Beside};
    match beside(server) {
        Beside::Usable(program) => program,
        Beside::Foreign { program, id } => {
            tracing::warn!(
                "{} was built from other sandbox sources (id {id}, this server's {}): not used; sandboxed starts re-execute this server instead, about 1.5 ms slower",
                program.display(),
                exec_server_sandbox::inner_program::SOURCE_ID
            );
            server.to_path_buf()
        }
        Beside::Absent => server.to_path_buf(),
    }
}

impl Support {
    /// `helper` is this server's executable (it must handle [`INNER_FLAG`] and
    /// [`fs_helper::FLAG`] first thing in `main`); `hidden` are this server's
    /// own paths no sandbox may see ([`Runtime::hidden`]).
    pub fn new(helper: Option<PathBuf>, allow_unsandboxed: bool, mut hidden: Vec<PathBuf>) -> Self {
        if helper.is_some() && !exec_server_sandbox::domain::supported() {
            tracing::warn!(
                "this kernel has no Landlock (ABI 2+): a sandboxed command's seccomp filter does \
                 not keep it from writing into the memory of unfiltered processes of its user \
                 (bubblewrap's init, the network bridge, this server); use Linux 5.19+ with \
                 Landlock enabled"
            );
        }
        if helper.is_some() {
            // Hidden like the server's other state: a sandbox that could
            // edit it would undo what it records.
            hidden.extend(keep_writable_journal());
        }
        Support {
            runtime: helper.map(|h| Runtime {
                inner: inner_stage(&h),
                hidden: hidden.clone(),
                ..Runtime::locate(h)
            }),
            allow_unsandboxed,
            pids: Arc::default(),
        }
    }

    /// The live sandboxes' first processes ([`peers`]).
    pub fn pids(&self) -> &peers::SandboxPids {
        &self.pids
    }

    /// True when every policy can be enforced here (helper and bubblewrap found).
    pub fn enforced(&self) -> bool {
        self.runtime.as_ref().is_some_and(|r| r.bwrap.is_some())
    }

    /// The runtime for `policy`, or the refusal (or `None` = run unconfined,
    /// with the operator's consent) when it cannot be enforced here.
    /// The confinement that enforces `policy` here: `Ok(None)` runs
    /// unconfined (the operator's opt-out where enforcement is impossible);
    /// refused ([`ErrorKind::PermissionDenied`](crate::error::ErrorKind))
    /// where it cannot be enforced.
    pub fn confine(&self, policy: Policy) -> ExecResult<Option<Confine>> {
        Ok(self.runtime_for(&policy)?.map(|r| Confine {
            policy,
            runtime: r.clone(),
        }))
    }

    fn runtime_for(&self, policy: &Policy) -> ExecResult<Option<&Runtime>> {
        let needs_bwrap = !policy.writes_everything();
        match &self.runtime {
            Some(r) if r.bwrap.is_some() || !needs_bwrap => Ok(Some(r)),
            _ if self.allow_unsandboxed => Ok(None),
            Some(_) => Err(ExecError::permission_denied(
                exec_server_sandbox::Error::BwrapMissing.to_string(),
            )),
            None => Err(ExecError::permission_denied(
                "sandbox runtime paths are not configured: this exec-server cannot confine commands \
                 (refused rather than run unconfined)",
            )),
        }
    }
}

/// Where the directories sandboxes were made able to write are kept
/// (`exec_server_sandbox::links`): `$XDG_STATE_HOME/exec-server/
/// sandbox-writable-dirs`, else `$HOME/.local/state/exec-server/…`. Without
/// either, or when it cannot be read, each server remembers only its own.
/// Returns its directory, to hide from every view.
fn keep_writable_journal() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".local/state"))
        });
    let Some(path) = state.map(|s| s.join("exec-server/sandbox-writable-dirs")) else {
        tracing::warn!(
            "neither XDG_STATE_HOME nor HOME is set: the directories sandboxes could write are \
             remembered only while this server runs"
        );
        return None;
    };
    if let Err(e) = exec_server_sandbox::links::keep_in(&path) {
        tracing::warn!(
            "cannot keep {}: the directories sandboxes could write are remembered only while \
             this server runs ({e})",
            path.display()
        );
    }
    path.parent().map(Path::to_path_buf)
}

/// A path of the policy: [`ErrorKind::InvalidInput`](crate::error::ErrorKind)
/// for a URI naming no path here (`InvalidInput`, as the reference).
fn policy_path(uri: &PathUri) -> ExecResult<PathBuf> {
    uri.to_path().map_err(|_| {
        ExecError::invalid_input(format!(
            "invalid sandbox permission path URI: '{uri}' is invalid on 'linux'"
        ))
    })
}

/// Converts the wire context. `cwd` is the policy cwd to use when the context
/// gives none.
pub fn to_policy(ctx: &FileSystemSandboxContext, cwd: &Path) -> ExecResult<Policy> {
    let net = |n: &NetworkAccess| *n == NetworkAccess::Restricted;
    let profile = match &ctx.permissions {
        ExecPermissionProfile::Disabled => Profile::Disabled,
        ExecPermissionProfile::External { network } => Profile::External {
            network_restricted: net(network),
        },
        ExecPermissionProfile::Managed {
            file_system,
            network,
        } => Profile::Managed {
            fs: match file_system {
                FileSystemPermissions::Unrestricted => FileSystem::Unrestricted,
                FileSystemPermissions::Restricted { entries } => FileSystem::Restricted(
                    entries
                        .iter()
                        .map(|e| {
                            Ok(Rule {
                                target: target(&e.path)?,
                                access: match e.access {
                                    FileSystemAccess::Read => Access::Read,
                                    FileSystemAccess::Write => Access::Write,
                                    FileSystemAccess::Deny | FileSystemAccess::None => Access::Deny,
                                },
                            })
                        })
                        .collect::<ExecResult<_>>()?,
                ),
            },
            network_restricted: net(network),
        },
    };
    let cwd = match ctx.policy_cwd() {
        Some(u) => policy_path(u)?,
        None => cwd.to_path_buf(),
    };
    Ok(Policy {
        profile,
        legacy_landlock: ctx.use_legacy_landlock,
        cwd,
        workspace_roots: ctx
            .roots()
            .iter()
            .map(policy_path)
            .collect::<Result<_, _>>()?,
        tmpdir: None,
    })
}

fn target(p: &PermissionPath) -> ExecResult<Target> {
    Ok(match p {
        PermissionPath::Path { path } => Target::Path(policy_path(path)?),
        PermissionPath::GlobPattern { pattern } => Target::Glob(pattern.clone()),
        PermissionPath::Special { value } => match value {
            SpecialPath::Root => Target::Root,
            SpecialPath::Minimal => Target::Minimal,
            // A reference quirk: the cwd kind means the workspace roots.
            SpecialPath::CurrentWorkingDirectory => Target::WorkspaceRoots { subpath: None },
            SpecialPath::ProjectRoots { subpath } => Target::WorkspaceRoots {
                subpath: subpath.as_ref().map(PathBuf::from),
            },
            SpecialPath::Tmpdir => Target::Tmpdir,
            SpecialPath::SlashTmp => Target::SlashTmp,
            SpecialPath::Unknown { .. } => Target::Ignored,
        },
    })
}

/// A decided confinement: the policy and the runtime that enforces it.
/// What a sandboxed `process/start` and a sandboxed `fs/*` call both run
/// under (the latter in the confined helper).
#[derive(Debug, Clone)]
pub struct Confine {
    /// What the command may see and change.
    pub policy: Policy,
    /// bubblewrap, the helper executable and the hidden paths.
    pub runtime: Runtime,
}

/// The confinement of one `process/start`: a [`Confine`] and its network
/// route.
#[derive(Debug, Clone)]
pub struct StartSandbox {
    confine: Confine,
    /// The start has a `networkProxy`: the command's network namespace
    /// reaches only that proxy (SANDBOX.md §3.3).
    routed: bool,
    /// Where the proxy listens for the sandbox, once started.
    route: Option<ProxyRoute>,
    pids: Arc<peers::SandboxPids>,
}

/// Decides a `process/start`: `Ok(None)` runs unconfined (no `sandbox`, or
/// the operator's opt-out where enforcement is impossible); errors are the
/// refusals ([`ErrorKind::PermissionDenied`](crate::error::ErrorKind)) and the
/// policy's path errors (`InvalidInput`).
///
/// With `network_proxy` (the start has a `networkProxy`) the sandbox is
/// routed: its own network namespace, whose only exit is that proxy; this
/// needs bubblewrap whatever the file-system policy, and is never run
/// unconfined. `enforce_managed_network` without a proxy is refused (the
/// reference fails closed too: nothing to route through).
pub fn for_start(
    sandbox: Option<&FileSystemSandboxContext>,
    enforce_managed_network: bool,
    network_proxy: bool,
    cwd: &Path,
    support: &Support,
) -> ExecResult<Option<StartSandbox>> {
    let Some(ctx) = sandbox else {
        return Ok(None);
    };
    if enforce_managed_network && !network_proxy {
        return Err(ExecError::permission_denied(
            "sandbox refused: enforceManagedNetwork needs a managed network proxy \
             (networkProxy) to route through; the command was not started",
        ));
    }
    let policy = to_policy(ctx, cwd)?;
    if policy.legacy_landlock && !policy.writes_everything() {
        return Err(ExecError::permission_denied(
            exec_server_sandbox::Error::LegacyLandlock.to_string(),
        ));
    }
    if network_proxy {
        return match &support.runtime {
            Some(r) if r.bwrap.is_some() => Ok(Some(StartSandbox {
                confine: Confine {
                    policy,
                    runtime: r.clone(),
                },
                routed: true,
                route: None,
                pids: support.pids.clone(),
            })),
            _ => Err(ExecError::permission_denied(
                "sandbox refused: routing a sandboxed command through the network proxy needs \
                 bubblewrap and the helper executable; the command was not started",
            )),
        };
    }
    Ok(support.confine(policy)?.map(|confine| StartSandbox {
        confine,
        routed: false,
        route: None,
        pids: support.pids.clone(),
    }))
}

/// The `sandboxType` of a start decided by [`for_start`].
pub fn sandbox_type(s: Option<&StartSandbox>) -> &'static str {
    if s.is_some() {
        SANDBOX_TYPE_LINUX
    } else {
        SANDBOX_TYPE_NONE
    }
}

impl StartSandbox {
    /// True when the command must reach the network only through its proxy.
    pub fn routed(&self) -> bool {
        self.routed
    }

    /// Where the proxy listens for this sandbox (set once it started).
    pub fn set_route(&mut self, route: ProxyRoute) {
        self.route = Some(route);
    }

    /// The plan for a command with the environment `env` (its `TMPDIR` is
    /// what `tmpdir` entries name). Errors are the sandbox crate's
    /// refusals, as I/O errors for the spawn path.
    pub fn plan(&self, env: &BTreeMap<String, String>) -> std::io::Result<Plan> {
        let runtime = &self.confine.runtime;
        let mut policy = self.confine.policy.clone();
        // A relative TMPDIR names no directory the server can resolve (the
        // command reads it from its cwd): no `tmpdir` root then.
        policy.tmpdir = env
            .get("TMPDIR")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute());
        let plan = exec_server_sandbox::resolve(&policy, std::slice::from_ref(&runtime.inner))
            .map_err(std::io::Error::other)?;
        if !self.routed {
            return Ok(plan);
        }
        // Fail closed: a routed start without its route never runs.
        let route = self.route.clone().ok_or_else(|| {
            std::io::Error::other("sandbox refused: the network proxy route is missing")
        })?;
        Ok(exec_server_sandbox::route_through_proxy(plan, route))
    }

    /// The command that runs `program` confined under `plan` (from
    /// [`Self::plan`]) for the child environment `env`. Errors are the
    /// sandbox crate's refusals, as I/O errors for the spawn path.
    pub fn prepare(
        &self,
        plan: Plan,
        env: &BTreeMap<String, String>,
        program: &Path,
        arg0: &str,
        args: &[String],
        cwd: &Path,
    ) -> std::io::Result<Prepared> {
        exec_server_sandbox::prepare(
            &self.confine.runtime,
            plan,
            &exec_server_sandbox::Command {
                program,
                arg0,
                args,
                cwd,
                env,
            },
        )
        .map_err(std::io::Error::other)
    }

    /// A sandbox for `plan` prepared ahead, its command to come
    /// ([`exec_server_sandbox::warm`]); `Ok(None)` for a plan without
    /// namespaces. Errors: as [`Self::prepare`].
    pub fn prepare_warm(&self, plan: Plan, cwd: &Path) -> std::io::Result<Option<Warm>> {
        exec_server_sandbox::prepare_warm(&self.confine.runtime, plan, cwd)
            .map_err(std::io::Error::other)
    }
}

/// Kept by a running confined process; dropped at its exit: its
/// placeholders, and its entry among the live sandboxes.
#[derive(Debug)]
pub struct Confinement {
    _guard: Guard,
    _registration: Option<peers::Registration>,
}

impl Confinement {
    /// The host paths of its placeholders (see [`Confinement::adopt`]).
    pub fn placeholder_paths(&self) -> Vec<PathBuf> {
        self._guard.placeholder_paths()
    }

    /// True when its process is registered among the live sandboxes.
    pub fn confined(&self) -> bool {
        self._registration.is_some()
    }

    /// What a previous image of this server held for its sandboxed process
    /// `pid`, taken over after an upgrade: the placeholders at `paths`
    /// counted again and, when `confined`, `pid` registered again among
    /// `support`'s live sandboxes (peers inside it stay refused).
    pub fn adopt(support: &Support, paths: &[PathBuf], pid: u32, confined: bool) -> Confinement {
        Confinement {
            _guard: Guard::adopt(paths),
            _registration: confined.then(|| support.pids.register(pid)),
        }
    }
}

impl StartSandbox {
    /// What the process `pid`, started from `prepared` with its `guard`,
    /// keeps until it exits. A command that runs confined (`confined`) is
    /// registered among the live sandboxes.
    pub fn confinement(&self, guard: Guard, pid: u32, confined: bool) -> Confinement {
        Confinement {
            _guard: guard,
            _registration: confined.then(|| self.pids.register(pid)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use serde_json::json;

    fn ctx(v: serde_json::Value) -> FileSystemSandboxContext {
        serde_json::from_value(v).unwrap()
    }

    fn ro() -> FileSystemSandboxContext {
        ctx(
            json!({"windowsSandboxLevel": "disabled", "permissions": {"type": "managed", "network": "restricted",
            "file_system": {"type": "restricted", "entries": [{"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}]}}}),
        )
    }

    #[test]
    fn conversion_keeps_the_wire_quirks() {
        let c = ctx(
            json!({"windowsSandboxLevel": "disabled", "workspaceRoots": ["file:///w"],
            "permissions": {"type": "managed", "network": "enabled", "file_system": {"type": "restricted", "entries": [
                {"path": {"type": "special", "value": {"kind": "current_working_directory"}}, "access": "write"},
                {"path": {"type": "path", "path": "file:///w/s"}, "access": "none"}]}}}),
        );
        let p = to_policy(&c, Path::new("/c")).unwrap();
        assert_eq!(p.cwd, Path::new("/c"));
        assert_eq!(p.workspace_roots, [PathBuf::from("/w")]);
        let Profile::Managed {
            fs: FileSystem::Restricted(rules),
            network_restricted: false,
        } = p.profile
        else {
            panic!("managed");
        };
        assert_eq!(rules[0].target, Target::WorkspaceRoots { subpath: None });
        assert_eq!(rules[1].access, Access::Deny);
        let bad = ctx(
            json!({"windowsSandboxLevel": "disabled", "permissions": {"type": "managed", "network": "enabled",
            "file_system": {"type": "restricted", "entries": [{"path": {"type": "path", "path": "file://host/tmp"}, "access": "read"}]}}}),
        );
        let e = to_policy(&bad, Path::new("/")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            e.message(),
            "invalid sandbox permission path URI: 'file://host/tmp' is invalid on 'linux'"
        );
    }

    #[test]
    fn fails_closed_without_bubblewrap_unless_the_operator_opts_out() {
        let no_bwrap = |allow| Support {
            runtime: Some(Runtime {
                bwrap: None,
                helper: PathBuf::from("/x"),
                inner: PathBuf::from("/x"),
                hidden: Vec::new(),
            }),
            allow_unsandboxed: allow,
            pids: Arc::default(),
        };
        let e = for_start(Some(&ro()), false, false, Path::new("/"), &no_bwrap(false)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(e.message().contains("bubblewrap"), "{e}");
        assert!(
            for_start(Some(&ro()), false, false, Path::new("/"), &no_bwrap(true))
                .unwrap()
                .is_none()
        );
        // A profile needing no namespaces still runs confined by seccomp alone.
        let full = ctx(
            json!({"windowsSandboxLevel": "disabled", "permissions": {"type": "external", "network": "restricted"}}),
        );
        assert!(
            for_start(Some(&full), false, false, Path::new("/"), &no_bwrap(false))
                .unwrap()
                .is_some()
        );
        let none = Support {
            runtime: None,
            allow_unsandboxed: false,
            pids: Arc::default(),
        };
        assert_eq!(
            for_start(Some(&ro()), false, false, Path::new("/"), &none)
                .unwrap_err()
                .kind(),
            ErrorKind::PermissionDenied
        );
        assert!(for_start(None, false, false, Path::new("/"), &none)
            .unwrap()
            .is_none());
        assert!(!no_bwrap(false).enforced());
    }
}
