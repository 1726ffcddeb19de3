//! Resolving a [`Policy`] into a [`Plan`]: which mechanism (SANDBOX.md §2.3) and,
//! for a confined child, the mounts of its view, all on canonical paths.
//!
//! Every path is canonicalised when the view is built: bind mounts then pin the
//! real directories, so a symlink, `..` or a later rename inside the sandbox
//! cannot reach outside what was granted. Paths that do not exist are skipped
//! (nothing to grant or to hide); a path that cannot be resolved for any other
//! reason, or a glob whose walk could not finish, refuses the plan (dropping
//! a `deny` would expose what it hides).

use crate::links;
use crate::policy::{Access, FileSystem, Policy, Profile, Rule, Target};
use crate::protect::{self, Placeholder};
use crate::seccomp::SeccompMode;
use crate::{Error, MINIMAL_ROOTS};
use std::path::{Path, PathBuf};

/// One mount of the view, applied in order (later mounts cover earlier ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// Bound read-only.
    ReadOnly(PathBuf),
    /// Bound writable.
    Writable(PathBuf),
    /// A protected name that exists: re-bound read-only over its writable parent.
    Protect(PathBuf),
    /// A protected name in a nested directory: the same, skipped if it
    /// vanished since the scan (best effort, like the scan itself; a strict
    /// bind would let anyone who deletes a nested `.git` fail the start).
    ProtectNested(PathBuf),
    /// A directory to hide: an empty mode-000 read-only tmpfs.
    DenyDir(PathBuf),
    /// A file to hide: an empty mode-000 read-only file.
    DenyFile(PathBuf),
    /// In a view without the host root: a symlink recreated at `.0` pointing
    /// to `.1` (e.g. `/bin` → `usr/bin` on a merged-/usr system), so paths
    /// through it (the ELF interpreter's `/lib64/…`) keep working.
    Symlink(PathBuf, PathBuf),
}

impl Mount {
    /// The host path this mount is made on; a recreated symlink has none
    /// (it lies in the sandbox's own tmpfs).
    pub fn point(&self) -> Option<&Path> {
        match self {
            Mount::ReadOnly(p)
            | Mount::Writable(p)
            | Mount::Protect(p)
            | Mount::ProtectNested(p)
            | Mount::DenyDir(p)
            | Mount::DenyFile(p) => Some(p),
            Mount::Symlink(..) => None,
        }
    }
}

/// The file-system view of a confined child.
#[derive(Debug, Default)]
pub struct View {
    /// True: the host root is bound read-only first; false: an empty tmpfs root.
    pub full_read: bool,
    /// The mounts, in order.
    pub mounts: Vec<Mount>,
    /// Empty read-only directories standing for absent protected names; they
    /// exist on the host only while a child uses them.
    pub placeholders: Vec<Placeholder>,
}

impl View {
    /// Whether `path` (absolute, canonical) is visible in this view: the host
    /// root is readable, or a bound mount holds it.
    pub fn shows(&self, path: &Path) -> bool {
        self.full_read
            || self.mounts.iter().any(|m| match m {
                Mount::ReadOnly(r) | Mount::Writable(r) => path.starts_with(r),
                _ => false,
            })
    }
}

/// How one child is started.
#[derive(Debug)]
pub enum Plan {
    /// Plain exec: nothing to restrict (`disabled`, or full write with network).
    Direct,
    /// No namespaces, only no_new_privs and the seccomp filter (full write,
    /// network restricted).
    Seccomp(SeccompMode),
    /// bubblewrap namespaces and mounts, then the seccomp filter.
    Confined {
        /// The file-system view.
        view: View,
        /// The filter installed before the command runs.
        seccomp: SeccompMode,
        /// A private network namespace (network restricted).
        unshare_net: bool,
        /// Managed network: the only way out of the namespace is this proxy.
        proxy: Option<ProxyRoute>,
    },
}

/// What decides the sandbox a [`Plan`] starts, placeholders named by
/// their paths: two plans with equal keys start identical sandboxes (the
/// same bubblewrap arguments but for descriptor numbers), so a sandbox
/// prepared ahead for one may serve the other ([`crate::warm`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanKey {
    /// [`Plan::Direct`].
    Direct,
    /// [`Plan::Seccomp`].
    Seccomp(SeccompMode),
    /// [`Plan::Confined`].
    Confined {
        /// [`View::full_read`].
        full_read: bool,
        /// [`View::mounts`].
        mounts: Vec<Mount>,
        /// The host paths of [`View::placeholders`].
        placeholders: Vec<PathBuf>,
        /// The seccomp mode.
        seccomp: SeccompMode,
        /// A private network namespace.
        unshare_net: bool,
        /// The proxy route.
        proxy: Option<ProxyRoute>,
    },
}

impl Plan {
    /// This plan's [`PlanKey`].
    pub fn key(&self) -> PlanKey {
        match self {
            Plan::Direct => PlanKey::Direct,
            Plan::Seccomp(mode) => PlanKey::Seccomp(*mode),
            Plan::Confined {
                view,
                seccomp,
                unshare_net,
                proxy,
            } => PlanKey::Confined {
                full_read: view.full_read,
                mounts: view.mounts.clone(),
                placeholders: view
                    .placeholders
                    .iter()
                    .map(|p| p.path().to_path_buf())
                    .collect(),
                seccomp: *seccomp,
                unshare_net: *unshare_net,
                proxy: proxy.clone(),
            },
        }
    }
}

/// Where a proxy-routed sandbox's traffic goes (`enforceManagedNetwork`): the
/// executor's proxy listens on Unix sockets in `host_dir`; inside the
/// sandbox's own network namespace a bridge listens on `127.0.0.1:PORT` for
/// each `(PORT, socket file name)` and forwards each connection to that
/// socket. Nothing else leaves the namespace (it has only a loopback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyRoute {
    /// Host directory holding the proxy's sockets (bound read-only into the
    /// sandbox at [`PROXY_DIR_INSIDE`]).
    pub host_dir: PathBuf,
    /// Loopback port inside → socket file name in `host_dir`.
    pub ports: Vec<(u16, String)>,
    /// Transparent TCP ([`crate::transparent`]): raw TCP connects to
    /// non-loopback addresses go through the SOCKS5 socket
    /// [`crate::transparent::SOCKET`] in `host_dir`.
    pub transparent: bool,
    /// `dangerouslyAllowAllUnixSockets`: the command may create `AF_UNIX`
    /// sockets (and so reach any Unix socket it can see). Off, only
    /// `socketpair` works ([`SeccompMode::ProxyRouted`]).
    pub allow_all_unix_sockets: bool,
}

/// Where [`ProxyRoute::host_dir`] appears inside the sandbox.
pub const PROXY_DIR_INSIDE: &str = "/dev/exec-server-netproxy";

/// Routes `plan` through `route`: a private network namespace whose only
/// exit is the bridge, and the [`SeccompMode::ProxyRouted`] filter (inet
/// sockets allowed: only loopback exists). A plan without namespaces (full
/// write, or `disabled`) gets them, with the whole host writable as before.
pub fn route_through_proxy(plan: Plan, route: ProxyRoute) -> Plan {
    let view = match plan {
        Plan::Confined { view, .. } => view,
        Plan::Direct | Plan::Seccomp(_) => View {
            full_read: true,
            mounts: vec![Mount::Writable(PathBuf::from("/"))],
            placeholders: Vec::new(),
        },
    };
    Plan::Confined {
        view,
        seccomp: SeccompMode::ProxyRouted,
        unshare_net: true,
        proxy: Some(route),
    }
}

/// Resolves `policy`. `extra_readable` are paths the child needs whatever the
/// policy says (the helper executable), made readable when the root is not.
///
/// Errors: [`Error::LegacyLandlock`] for `useLegacyLandlock` with a restricted
/// file system; [`Error::Io`] when a placeholder cannot be created.
pub fn resolve(policy: &Policy, extra_readable: &[PathBuf]) -> Result<Plan, Error> {
    let net = policy.network_restricted();
    let rules = match &policy.profile {
        Profile::Disabled => return Ok(Plan::Direct),
        Profile::External { .. }
        | Profile::Managed {
            fs: FileSystem::Unrestricted,
            ..
        } => {
            return Ok(seccomp_only(net));
        }
        Profile::Managed {
            fs: FileSystem::Restricted(rules),
            ..
        } => rules,
    };
    if policy.writes_everything() {
        return Ok(seccomp_only(net));
    }
    if policy.legacy_landlock {
        return Err(Error::LegacyLandlock);
    }
    let view = build_view(policy, rules, extra_readable)?;
    Ok(Plan::Confined {
        view,
        seccomp: if net {
            SeccompMode::Restricted
        } else {
            SeccompMode::VmSocket
        },
        unshare_net: net,
        proxy: None,
    })
}

fn seccomp_only(network_restricted: bool) -> Plan {
    if network_restricted {
        Plan::Seccomp(SeccompMode::Restricted)
    } else {
        Plan::Direct
    }
}

/// The root's access and the concrete (path, access) pairs the rules name,
/// before canonicalisation. Errors: [`Error::Glob`] for a glob whose walk
/// could not finish.
type Expanded = (Option<Access>, Vec<(PathBuf, Access)>);

fn expand(policy: &Policy, rules: &[Rule]) -> Result<Expanded, Error> {
    let mut root = None;
    let mut out = Vec::new();
    for rule in rules {
        match &rule.target {
            Target::Root => {
                // The most permissive root entry wins (`read` then `write`);
                // `deny` on the root only means "not readable".
                root = match (root, rule.access) {
                    (Some(Access::Write), _) | (_, Access::Write) => Some(Access::Write),
                    (Some(Access::Read), _) | (_, Access::Read) => Some(Access::Read),
                    _ => Some(Access::Deny),
                };
            }
            Target::Path(p) => out.push((p.clone(), rule.access)),
            Target::Glob(pattern) => {
                let full = if pattern.starts_with('/') {
                    pattern.clone()
                } else {
                    format!("{}/{}", policy.cwd.display(), pattern)
                };
                let found = crate::glob::expand(&full);
                if let Some(why) = found.incomplete {
                    return Err(Error::Glob(full, why));
                }
                out.extend(found.paths.into_iter().map(|p| (p, rule.access)));
            }
            Target::Minimal => {
                for m in MINIMAL_ROOTS {
                    out.push((PathBuf::from(m), rule.access));
                }
            }
            Target::WorkspaceRoots { subpath } => {
                for r in &policy.workspace_roots {
                    let p = match subpath {
                        Some(s) => r.join(s),
                        None => r.clone(),
                    };
                    out.push((p, rule.access));
                }
            }
            Target::Tmpdir => {
                if let Some(t) = &policy.tmpdir {
                    out.push((t.clone(), rule.access));
                }
            }
            Target::SlashTmp => out.push((PathBuf::from("/tmp"), rule.access)),
            Target::Ignored => {}
        }
    }
    Ok((root, out))
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

fn build_view(policy: &Policy, rules: &[Rule], extra_readable: &[PathBuf]) -> Result<View, Error> {
    let (root, entries) = expand(policy, rules)?;
    let full_read = matches!(root, Some(Access::Read | Access::Write));
    let resolver = links::Resolver::new();
    // Each path resolved once; what is not there grants or hides nothing.
    let mut found: Vec<(PathBuf, links::Resolved, Option<Access>)> = Vec::new();
    for (p, a) in entries {
        if let Some(r) = resolve_entry(&p)? {
            found.push((p, r, Some(a)));
        }
    }
    for p in extra_readable {
        if let Some(r) = resolve_entry(p)? {
            found.push((p.clone(), r, None));
        }
    }
    // A symlink inside the policy's own writable roots is as untrusted as
    // one inside a root another view made writable.
    let own: Vec<PathBuf> = found
        .iter()
        .filter(|(_, _, a)| *a == Some(Access::Write))
        .map(|(_, r, _)| r.canonical.clone())
        .collect();
    let mut symlinks: Vec<Mount> = Vec::new();
    let mut entries: Vec<(PathBuf, Access)> = Vec::with_capacity(found.len());
    let mut extra = Vec::new();
    for (p, r, access) in found {
        resolver
            .check(&r, &own)
            .map_err(|e| Error::Untrusted(p.clone(), e))?;
        if !full_read && r.canonical != p {
            if let Ok(target) = std::fs::read_link(&p) {
                let m = Mount::Symlink(p, target);
                if !symlinks.contains(&m) {
                    symlinks.push(m);
                }
            }
        }
        match access {
            Some(a) => entries.push((r.canonical, a)),
            None => extra.push(r.canonical),
        }
    }
    let mut view = View {
        full_read,
        ..View::default()
    };
    if root == Some(Access::Write) {
        // Whole disk writable but something denied: bind the root writable
        // and mask (resolve() only gets here when a deny entry exists).
        view.mounts.push(Mount::Writable(PathBuf::from("/")));
    }
    if !full_read {
        view.mounts.extend(extra.into_iter().map(Mount::ReadOnly));
    }
    // Shallow first, so a deeper entry refines a shallower one; at equal depth
    // deny comes last and wins.
    entries.sort_by_key(|(p, a)| (depth(p), *a == Access::Deny));
    entries.dedup();
    let mut writable: Vec<PathBuf> = Vec::new();
    let mut denies: Vec<Mount> = Vec::new();
    for (path, access) in &entries {
        match access {
            Access::Read => {
                // Under a full-read view a read entry matters only inside a
                // writable root (it makes that subtree read-only again).
                if !full_read || writable.iter().any(|w| path.starts_with(w)) {
                    view.mounts.push(Mount::ReadOnly(path.clone()));
                }
            }
            Access::Write => {
                view.mounts.push(Mount::Writable(path.clone()));
                writable.push(path.clone());
            }
            Access::Deny => {
                if view.shows(path) {
                    denies.push(if path.is_dir() {
                        Mount::DenyDir(path.clone())
                    } else {
                        Mount::DenyFile(path.clone())
                    });
                }
            }
        }
    }
    // Protected names cover their writable roots; the deny masks come last of
    // all, so nothing granted later re-exposes a denied path.
    let mut nested_left = crate::MAX_NESTED_PROTECTED;
    for w in &writable {
        // A writable file holds no protected names.
        if !w.is_dir() {
            continue;
        }
        let found = protect::scan(w)?;
        // A protected name that is a symlink is protected where it leads,
        // and only if the view shows that already: re-binding it read-only
        // must never make visible what the policy hid (a `.git` pointed at
        // `../..` exposed the host under `minimal`).
        let shown: Vec<Mount> = found
            .existing
            .into_iter()
            // Nor may a symlinked name that leads to (or above) a writable
            // root make that root read-only (`.git` -> `.`).
            .filter(|p| view.shows(p) && !writable.iter().any(|w| w.starts_with(p)))
            .map(Mount::Protect)
            .collect();
        view.mounts.extend(shown);
        let nested = &found.nested[..found.nested.len().min(nested_left)];
        nested_left -= nested.len();
        view.mounts
            .extend(nested.iter().cloned().map(Mount::ProtectNested));
        for ph in found.placeholders {
            view.mounts.push(Mount::Protect(ph.path().to_path_buf()));
            view.placeholders.push(ph);
        }
    }
    view.mounts.extend(denies);
    view.mounts.extend(symlinks);
    links::record(writable.iter().map(PathBuf::as_path));
    Ok(view)
}

/// `p` resolved with the symlinks it passes through, or `None` when nothing
/// is there (nothing to grant or to hide). Errors: [`Error::Unresolvable`]
/// for any other failure: dropping the entry would grant less for `write`
/// but more for `deny` (and for a `read` inside a writable root).
fn resolve_entry(p: &Path) -> Result<Option<links::Resolved>, Error> {
    match links::resolve(p) {
        Ok(r) => Ok(Some(r)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(Error::Unresolvable(p.to_path_buf(), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(profile: Profile, ws: &Path) -> Policy {
        Policy {
            profile,
            legacy_landlock: false,
            cwd: ws.to_path_buf(),
            workspace_roots: vec![ws.to_path_buf()],
            tmpdir: None,
        }
    }

    fn managed(rules: Vec<Rule>, network_restricted: bool) -> Profile {
        Profile::Managed {
            fs: FileSystem::Restricted(rules),
            network_restricted,
        }
    }

    fn rule(target: Target, access: Access) -> Rule {
        Rule { target, access }
    }

    #[test]
    fn decision_table() {
        let ws = Path::new("/");
        let kind = |p: Profile| match resolve(&policy(p, ws), &[]) {
            Ok(Plan::Direct) => "direct",
            Ok(Plan::Seccomp(SeccompMode::Restricted)) => "seccomp",
            Ok(Plan::Confined { .. }) => "confined",
            _ => "other",
        };
        assert_eq!(kind(Profile::Disabled), "direct");
        assert_eq!(
            kind(Profile::External {
                network_restricted: true
            }),
            "seccomp"
        );
        assert_eq!(
            kind(Profile::External {
                network_restricted: false
            }),
            "direct"
        );
        let unrestricted = |n| Profile::Managed {
            fs: FileSystem::Unrestricted,
            network_restricted: n,
        };
        assert_eq!(kind(unrestricted(true)), "seccomp");
        assert_eq!(kind(unrestricted(false)), "direct");
        assert_eq!(
            kind(managed(vec![rule(Target::Root, Access::Write)], false)),
            "direct"
        );
        assert_eq!(
            kind(managed(vec![rule(Target::Root, Access::Read)], false)),
            "confined"
        );
        let mut legacy = policy(managed(vec![rule(Target::Root, Access::Read)], true), ws);
        legacy.legacy_landlock = true;
        assert!(matches!(resolve(&legacy, &[]), Err(Error::LegacyLandlock)));
    }

    #[test]
    fn workspace_write_view() {
        let ws = std::env::temp_dir().join(format!("sbx-plan-{}", std::process::id()));
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        std::fs::create_dir_all(ws.join("sub/.git")).unwrap();
        std::fs::write(ws.join("secret"), "s").unwrap();
        let ws = std::fs::canonicalize(&ws).unwrap();
        let p = policy(
            managed(
                vec![
                    rule(Target::Root, Access::Read),
                    rule(Target::Path(ws.join("secret")), Access::Deny),
                    rule(Target::WorkspaceRoots { subpath: None }, Access::Write),
                ],
                true,
            ),
            &ws,
        );
        let Ok(Plan::Confined {
            view,
            seccomp,
            unshare_net,
            ..
        }) = resolve(&p, &[])
        else {
            panic!("confined");
        };
        assert_eq!((seccomp, unshare_net), (SeccompMode::Restricted, true));
        assert!(view.full_read);
        let pos = |m: &Mount| view.mounts.iter().position(|x| x == m).unwrap();
        let w = pos(&Mount::Writable(ws.clone()));
        assert!(w < pos(&Mount::Protect(ws.join(".git"))));
        assert!(
            w < pos(&Mount::ProtectNested(ws.join("sub/.git"))),
            "nested repository"
        );
        assert_eq!(
            view.mounts.last(),
            Some(&Mount::DenyFile(ws.join("secret"))),
            "deny last"
        );
        // Absent names get placeholders that exist only while the view lives.
        assert_eq!(view.placeholders.len(), 3);
        assert!(ws.join(".codex").is_dir());
        drop(view);
        assert!(!ws.join(".codex").exists() && !ws.join(".aws").exists());
        std::fs::remove_dir_all(&ws).unwrap();
    }

    #[test]
    fn an_entry_that_cannot_be_resolved_refuses_the_plan() {
        let ws = std::env::temp_dir().join(format!("sbx-plan-unres-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&ws);
        std::fs::create_dir_all(&ws).unwrap();
        std::os::unix::fs::symlink(ws.join("b"), ws.join("a")).unwrap();
        std::os::unix::fs::symlink(ws.join("a"), ws.join("b")).unwrap();
        // An existing path longer than PATH_MAX (4096), made a step at a
        // time relative to the directory before.
        let step = "d".repeat(100);
        let mut dir = std::fs::File::open(&ws).unwrap();
        for _ in 0..45 {
            use std::os::fd::AsRawFd;
            let name = std::ffi::CString::new(step.clone()).unwrap();
            // SAFETY: a valid directory descriptor and a NUL-terminated name.
            let fd = unsafe {
                assert_eq!(libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755), 0);
                libc::openat(
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            assert!(fd >= 0);
            // SAFETY: `fd` was just opened and is owned here alone.
            dir = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        }
        let long = ws.join(format!("{step}/").repeat(45));
        let with = |target: Target| {
            policy(
                managed(
                    vec![
                        rule(Target::Root, Access::Read),
                        rule(Target::WorkspaceRoots { subpath: None }, Access::Write),
                        rule(target, Access::Deny),
                    ],
                    true,
                ),
                &ws,
            )
        };
        for target in [Target::Path(ws.join("a")), Target::Path(long)] {
            let r = resolve(&with(target.clone()), &[]);
            assert!(
                matches!(r, Err(Error::Unresolvable(..))),
                "{target:?}: {r:?}"
            );
        }
        // Absent paths, or paths under a file, hide nothing and refuse nothing.
        std::fs::write(ws.join("f"), "").unwrap();
        for absent in [ws.join("none"), ws.join("f/x")] {
            assert!(resolve(&with(Target::Path(absent)), &[]).is_ok());
        }
        let r = resolve(&with(Target::Glob("[f]".into())), &[]);
        let Ok(Plan::Confined { view, .. }) = r else {
            panic!("{r:?}");
        };
        let f = std::fs::canonicalize(ws.join("f")).unwrap();
        assert_eq!(view.mounts.last(), Some(&Mount::DenyFile(f)));
        drop(view);
        std::fs::remove_dir_all(&ws).unwrap();
    }
}
