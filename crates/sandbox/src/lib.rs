//! `exec-server-sandbox`: confines one child process on Linux from a resolved
//! sandbox policy. It knows nothing of JSON-RPC; the server converts the wire's
//! `FileSystemSandboxContext` into a [`Policy`], asks [`resolve`] for a [`Plan`]
//! and [`prepare`]s the command to spawn.
//!
//! # How (and why this way)
//!
//! Debian's **bubblewrap** (`bwrap`, package `bubblewrap`) builds the namespaces
//! and the mounts: it is small, audited, runs unprivileged as well as as root,
//! and is what the reference drives too (it ships its own copy). Writing the
//! namespace and mount dance ourselves would add a privileged-looking code path
//! for no gain. bubblewrap missing is an error ([`Error::BwrapMissing`]), never
//! a silent downgrade. The last step before the command is our own binary
//! re-executed as an inner stage ([`inner`]): it restores the signal
//! dispositions (bubblewrap's monitor is started with job-control signals
//! ignored, because it does not forward them), sets `PR_SET_NO_NEW_PRIVS`,
//! installs the seccomp filter (built with `seccompiler`, [`seccomp`]) and
//! `execv`s the command with its `argv[0]`.
//!
//! Which mechanism a policy gets ([`resolve`], SANDBOX.md §2.3):
//!
//! | profile | namespaces + mounts | seccomp |
//! |---|---|---|
//! | file system restricted, network restricted | yes, incl. a private network namespace | `Restricted` |
//! | file system restricted, network enabled | yes, host network | `VmSocket` |
//! | full write (unrestricted, root:write, `external`), network restricted | no | `Restricted` |
//! | full write, network enabled; `disabled` | no (plain exec) | no |
//! | any of the above routed through a managed proxy ([`route_through_proxy`]) | yes, incl. a private network namespace with the [`bridge`] | `ProxyRouted` (+ the [`transparent`] `connect()` notifier with transparent TCP) |
//!
//! # What a confined child gets
//!
//! - **Own user, PID and IPC namespaces** (`--unshare-user --unshare-pid
//!   --unshare-ipc`): it sees and can signal or trace only its own processes;
//!   `/proc` is a fresh mount of its PID namespace, so `/proc/<host pid>` and
//!   `/proc/*/root` of outside processes do not exist. uid 0 outside maps to 0
//!   inside with **every capability dropped** (`--cap-drop ALL`).
//! - **File system**: the host root bound read-only (or, when the root is not
//!   readable, an empty tmpfs holding only the readable roots); each writable
//!   root bound writable; each denied path masked by an empty mode-000
//!   read-only tmpfs (directory) or file; the protected names `.git`, `.codex`,
//!   `.agents`, `.aws` read-only under every writable root **and in nested
//!   repositories** below it, absent ones blocked by a placeholder that is
//!   removed from the host when the last child using it exits ([`protect`]).
//!   All decisions are made on canonical paths when the view is built; bind
//!   mounts pin the real directories, so symlinks, `..`, renames and hard links
//!   inside cannot reach beyond them (a hard link needs both ends on the same
//!   writable mount).
//! - `/proc/sys`, `/proc/sysrq-trigger`, `/proc/irq`, `/proc/bus` are
//!   read-only (bubblewrap covers them), so even a server running as root
//!   cannot have a sandboxed command change the host's kernel settings.
//! - `/dev` is a private minimal tmpfs (null, zero, random, tty, pts, shm).
//! - **Network restricted**: a private network namespace (only its own
//!   loopback) and seccomp: inet sockets and socket calls fail with `EPERM`,
//!   `AF_UNIX` works; `ptrace`, `process_vm_*`, `io_uring_*` fail too.
//! - `TIOCSTI`/`TIOCLINUX` fail (no typing into a terminal it can open).
//! - **A Landlock domain** ([`domain`]) around the command: `ptrace`-class
//!   access (`/proc/PID/mem`, `pidfd_getfd`) reaches only its own
//!   descendants, never bubblewrap's init, the bridge or the server, none of
//!   which runs under the seccomp filter.
//! - No `AF_UNIX` datagram sockets where the network is restricted or
//!   managed (a datagram can be addressed to any host socket by path); no
//!   descriptor of the server's beyond stdio.
//! - `--die-with-parent`: the sandbox dies with the server.
//!
//! # What is not isolated
//!
//! - Reading: everything readable on the host stays readable under a
//!   full-read profile (the reference's `read-only` and `workspace-write`
//!   presets), including other users' world-readable files.
//! - With network `enabled` (no managed proxy), Unix sockets reachable through
//!   the read-only view (e.g. a daemon's socket under `/run`) can still be
//!   connected to, as the reference allows: a socket needs no write access to
//!   the file system to be used. Restricted network denies `connect()`
//!   outright; a managed network denies `socket(AF_UNIX)` (unless
//!   `dangerouslyAllowAllUnixSockets`). The server's own sockets and
//!   directories ([`Runtime::hidden`]) are masked in every view.
//! - Without Landlock (ABI 2, Linux 5.19+) a command could write into the
//!   memory of an unfiltered process of its user through `/proc/PID/mem`
//!   ([`domain`]); the server warns at start on such a kernel.
//! - UTS, cgroup and time namespaces are shared; resource limits (CPU, memory,
//!   process count) are not set here.
//! - With network `enabled` the host network is fully reachable.
//! - Full-write profiles get no namespaces at all (as the reference).
//! - A nested repository deeper than [`MAX_SCAN_DEPTH`] levels, or beyond the
//!   first [`MAX_SCAN_ENTRIES`] entries of a writable root, is not protected.
//! - Globs are expanded once, when the view is built: a file matching a deny
//!   glob created afterwards is not hidden.
//! - Placeholders are counted per server process: two servers confining
//!   commands in the same workspace at once may remove each other's
//!   placeholder early (the other sandbox could then create that name). A
//!   server killed with SIGKILL leaves its empty placeholders behind (a clean
//!   shutdown removes them).

pub mod anchors;
pub mod bridge;
pub mod bwrap;
pub mod carry;
pub mod denied;
pub mod domain;
pub mod env_fd;
pub mod glob;
pub mod inner;
pub mod inner_program;
pub mod links;
pub mod pinned;
pub mod plan;
pub mod policy;
pub mod protect;
pub mod seccomp;
pub mod transparent;
pub mod warm;

pub use bwrap::{prepare, prepare_warm, Guard, Hooks, Prepared, Runtime, Target as Command, Warm};
pub use denied::is_likely_denied;
pub use plan::{
    resolve, route_through_proxy, Mount, Plan, PlanKey, ProxyRoute, View, PROXY_DIR_INSIDE,
};
pub use policy::{Access, FileSystem, Policy, Profile, Rule, Target};
pub use seccomp::SeccompMode;

use std::path::PathBuf;

/// Names kept read-only under every writable root.
pub const PROTECTED_NAMES: [&str; 4] = [".git", ".codex", ".agents", ".aws"];

/// What `minimal` makes readable.
pub const MINIMAL_ROOTS: [&str; 8] = [
    "/bin", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/sbin", "/usr",
];

/// Most matches one glob entry grants or hides: 10 000.
pub const MAX_GLOB_MATCHES: usize = 10_000;
/// Deepest level searched for nested protected names below a writable root: 8.
pub const MAX_SCAN_DEPTH: usize = 8;
/// Most directory entries read per writable root when searching for nested
/// protected names: 20 000 (bounds the cost of a start in a huge tree).
pub const MAX_SCAN_ENTRIES: usize = 20_000;
/// Most nested protected names bound read-only in one sandbox: 256. Each
/// bind costs bubblewrap a pass over its mount table, so a start's set-up
/// grows with their square (measured: 100 nested names add 70 ms, 256 add
/// 0.3 s, 1 000 add 2.9 s), and bubblewrap takes at most 9 000 arguments (3
/// each: a command that made 3 000 nested `.git` directories failed every
/// later start in its workspace). Those found past it are not protected,
/// like a nested repository past [`MAX_SCAN_ENTRIES`].
pub const MAX_NESTED_PROTECTED: usize = 256;

/// Why a child cannot be confined. Each is a refusal: nothing runs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The policy needs namespaces and `bwrap` is not installed.
    #[error(
        "bubblewrap (bwrap) is not installed, so this exec-server cannot confine a command to a \
         restricted file system; install the `bubblewrap` package (it refuses rather than run the \
         command unconfined)"
    )]
    BwrapMissing,
    /// `useLegacyLandlock` with a restricted file system (as the reference).
    #[error(
        "sandbox refused: useLegacyLandlock is not supported with a restricted file system \
         (filesystem-restricted execution requires bubblewrap)"
    )]
    LegacyLandlock,
    /// An absent protected name could not be blocked.
    #[error("sandbox refused: cannot create the placeholder {0}: {1}")]
    Placeholder(PathBuf, std::io::Error),
    /// A glob entry whose matches could not all be found (the walk was cut
    /// short or a directory could not be listed). A partial expansion would
    /// leave a `deny` match readable or a `read` match writable, so the
    /// start is refused instead.
    #[error(
        "sandbox refused: the glob {0:?} cannot be enforced: {1}; narrow the pattern (refused \
         rather than apply part of it)"
    )]
    Glob(String, glob::Incomplete),
    /// A path entry that may exist but cannot be resolved to what it names
    /// on disk (longer than PATH_MAX, a symlink loop, a component that cannot
    /// be searched): refused rather than dropped.
    #[error("sandbox refused: the path {0} cannot be resolved: {1} (refused rather than dropped)")]
    Unresolvable(PathBuf, std::io::Error),
    /// A path of the policy whose resolution passes through a symlink a
    /// sandboxed command could have made ([`links`]).
    #[error("sandbox refused: the path {0} cannot be trusted: {1}")]
    Untrusted(PathBuf, links::Untrusted),
    /// A path of the view named something else when it was bound (a
    /// component was replaced, e.g. by a symlink, after the plan was
    /// resolved).
    #[error("sandbox refused: {0} changed while the sandbox was prepared (it now leads to {1})")]
    Moved(PathBuf, PathBuf),
    /// An OS call failed while preparing.
    #[error("sandbox refused: {0}")]
    Io(#[from] std::io::Error),
}
