//! The seccomp filter (SANDBOX.md §2.4), built with `seccompiler`: default
//! allow, listed calls fail with `EPERM` (a clear error, not a kill); a call
//! from another architecture's ABI (e.g. 32-bit `int 0x80` on x86_64) kills
//! the process, so the filter cannot be sidestepped through it. Installed with
//! `PR_SET_NO_NEW_PRIVS`, it is inherited by every descendant and cannot be
//! removed.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// Which calls the filter denies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeccompMode {
    /// Network restricted: inet sockets and socket calls, `ptrace`,
    /// `process_vm_*`, `io_uring_*`; `socket`/`socketpair` only for `AF_UNIX`
    /// of the stream and seqpacket types (a datagram could be sent to a host
    /// socket).
    Restricted,
    /// Network enabled: only `AF_VSOCK` sockets and `io_uring_*`.
    VmSocket,
    /// Managed network (the namespace holds only a loopback and the bridge
    /// to the proxy): sockets other than `AF_INET`, `AF_INET6` (so
    /// `socket(AF_UNIX)` too: a Unix socket would reach the host's daemons,
    /// or this server, past the proxy), `ptrace`, `process_vm_*`,
    /// `io_uring_*`. `socketpair(AF_UNIX)` stays allowed: a connected pair
    /// reaches nothing outside.
    ProxyRouted,
    /// [`SeccompMode::ProxyRouted`] with `socket(AF_UNIX)` allowed
    /// (`dangerouslyAllowAllUnixSockets`).
    ProxyRoutedAllUnix,
}

impl SeccompMode {
    /// The name used on the inner stage's command line.
    pub fn as_str(self) -> &'static str {
        match self {
            SeccompMode::Restricted => "restricted",
            SeccompMode::VmSocket => "vmsocket",
            SeccompMode::ProxyRouted => "proxyrouted",
            SeccompMode::ProxyRoutedAllUnix => "proxyrouted-all-unix",
        }
    }

    /// Parses [`SeccompMode::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "restricted" => Some(SeccompMode::Restricted),
            "vmsocket" => Some(SeccompMode::VmSocket),
            "proxyrouted" => Some(SeccompMode::ProxyRouted),
            "proxyrouted-all-unix" => Some(SeccompMode::ProxyRoutedAllUnix),
            _ => None,
        }
    }
}

const X32_SYSCALL_BIT: i64 = 0x4000_0000;
/// The socket type's bits of `socket`'s second argument (the rest are
/// `SOCK_NONBLOCK`, `SOCK_CLOEXEC`).
const SOCK_TYPE_MASK: u64 = 0xf;

/// `ioctl` requests the filter refuses, as the kernel numbers them on every
/// architecture we build for (asm-generic). Spelled out because the `libc`
/// crate types them by the C library (`c_ulong` for glibc, `c_int` for
/// musl, where the inner stage is built too).
const TIOCSTI: u64 = 0x5412;
/// See [`TIOCSTI`].
const TIOCLINUX: u64 = 0x541C;

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("{e:?}"))
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conds).map_err(|e| e.to_string())
}

/// Compiles the filter for `mode`. Errors are seccompiler's, as text.
pub fn build(mode: SeccompMode) -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    // Writing into the terminal's input queue would let a child type commands
    // into whatever terminal it can open (the operator's, in pipe mode).
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, SeccompCmpOp::Eq, TIOCSTI)?])?,
            rule(vec![cond(1, SeccompCmpOp::Eq, TIOCLINUX)?])?,
        ],
    );
    for call in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        // Another process's descriptors (Landlock bounds it too).
        libc::SYS_pidfd_getfd,
    ] {
        rules.insert(call, vec![]);
    }
    // An AF_UNIX datagram socket can address any host datagram socket it
    // can see by path (`sendmsg` carries the address, which seccomp cannot
    // read): where the network is restricted or managed, only stream and
    // seqpacket types are allowed (a `SOCK_RAW` one is a datagram socket
    // too), so every other type value is refused.
    let unix_dgram = || -> Result<Vec<SeccompRule>, String> {
        (0..=SOCK_TYPE_MASK)
            .filter(|t| ![libc::SOCK_STREAM as u64, libc::SOCK_SEQPACKET as u64].contains(t))
            .map(|t| {
                rule(vec![
                    cond(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64)?,
                    cond(1, SeccompCmpOp::MaskedEq(SOCK_TYPE_MASK), t)?,
                ])
            })
            .collect()
    };
    match mode {
        SeccompMode::Restricted => {
            for call in [
                libc::SYS_connect,
                libc::SYS_accept,
                libc::SYS_accept4,
                libc::SYS_bind,
                libc::SYS_listen,
                libc::SYS_getpeername,
                libc::SYS_getsockname,
                libc::SYS_shutdown,
                libc::SYS_sendto,
                libc::SYS_sendmmsg,
                libc::SYS_recvmmsg,
                libc::SYS_getsockopt,
                libc::SYS_setsockopt,
                libc::SYS_ptrace,
                libc::SYS_process_vm_readv,
                libc::SYS_process_vm_writev,
            ] {
                rules.insert(call, vec![]);
            }
            let not_unix = || -> Result<Vec<SeccompRule>, String> {
                Ok(vec![rule(vec![cond(
                    0,
                    SeccompCmpOp::Ne,
                    libc::AF_UNIX as u64,
                )?])?])
            };
            let mut socket = not_unix()?;
            socket.extend(unix_dgram()?);
            rules.insert(libc::SYS_socket, socket.clone());
            rules.insert(libc::SYS_socketpair, socket);
        }
        SeccompMode::ProxyRouted | SeccompMode::ProxyRoutedAllUnix => {
            for call in [
                libc::SYS_ptrace,
                libc::SYS_process_vm_readv,
                libc::SYS_process_vm_writev,
            ] {
                rules.insert(call, vec![]);
            }
            // One rule, all conditions: the family is none of those allowed.
            let mut allowed = vec![
                cond(0, SeccompCmpOp::Ne, libc::AF_INET as u64)?,
                cond(0, SeccompCmpOp::Ne, libc::AF_INET6 as u64)?,
            ];
            if mode == SeccompMode::ProxyRoutedAllUnix {
                allowed.push(cond(0, SeccompCmpOp::Ne, libc::AF_UNIX as u64)?);
            }
            let mut socket = vec![rule(allowed)?];
            let mut pair = vec![rule(vec![cond(
                0,
                SeccompCmpOp::Ne,
                libc::AF_UNIX as u64,
            )?])?];
            if mode == SeccompMode::ProxyRouted {
                socket.extend(unix_dgram()?);
                pair.extend(unix_dgram()?);
            }
            rules.insert(libc::SYS_socket, socket);
            rules.insert(libc::SYS_socketpair, pair);
        }
        SeccompMode::VmSocket => {
            rules.insert(
                libc::SYS_socket,
                vec![rule(vec![cond(
                    0,
                    SeccompCmpOp::Eq,
                    libc::AF_VSOCK as u64,
                )?])?],
            );
        }
    }
    if cfg!(target_arch = "x86_64") {
        // The x32 ABI shares the x86_64 audit arch with its own call numbers
        // (bit 30 set): deny those too where the kernel enables x32.
        let x32: Vec<(i64, Vec<SeccompRule>)> = rules
            .iter()
            .map(|(nr, r)| (nr | X32_SYSCALL_BIT, r.clone()))
            .collect();
        rules.extend(x32);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(|e| e.to_string())?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())
}

/// Sets `PR_SET_NO_NEW_PRIVS` and installs the filter for `mode` on the
/// calling thread (the inner stage is single-threaded).
pub fn install(mode: SeccompMode) -> Result<(), String> {
    let prog = build(mode)?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "PR_SET_NO_NEW_PRIVS: {}",
            std::io::Error::last_os_error()
        ));
    }
    seccompiler::apply_filter(&prog).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    fn the_refused_ioctl_numbers_are_the_c_librarys() {
        assert_eq!(super::TIOCSTI, libc::TIOCSTI as u64);
        assert_eq!(super::TIOCLINUX, libc::TIOCLINUX as u64);
    }
}
