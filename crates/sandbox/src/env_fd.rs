//! A confined command's environment, handed to the inner stage through a
//! descriptor instead of through bubblewrap's (or the inner stage's own)
//! environment.
//!
//! Why: everything between the server and the command's `execve` runs on
//! the host or before the seccomp filter and the Landlock domain are in
//! place: bubblewrap (unconfined, on the host) and the inner stage (inside
//! the namespaces, not yet filtered). Both are started with an empty
//! environment, so no variable of the request can steer them: `LD_PRELOAD`,
//! `LD_LIBRARY_PATH`, `LD_AUDIT` or `GCONV_PATH` would have a dynamically
//! linked bubblewrap or inner stage load a library of the client's choosing
//! first, code that then runs unconfined. The command's environment travels
//! as data in an anonymous file (`memfd`) and reaches only the command's own
//! `execve`.
//!
//! The format is that of the kernel's environment block: every entry
//! `NAME=VALUE`, each terminated by a NUL byte.

use std::ffi::CString;
use std::io::{Read, Seek, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The inner stage's `<pwd>` argument prefix naming the descriptor that
/// holds the command's environment: `env:FD`.
pub const ENV_PREFIX: &str = "env:";

/// Largest environment read back: 64 MiB, far above what `execve` takes
/// (`ARG_MAX`), so a descriptor that never ends cannot hold the stage.
const MAX_ENV_BYTES: u64 = 64 * 1024 * 1024;

/// Writes `env` into a new anonymous file (close-on-exec, read position at
/// its start) for [`read`]. Errors: `InvalidInput` for an entry holding a NUL
/// byte (no `execve` could take it; the unconfined path refuses it too), and
/// the OS's.
pub fn write<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>) -> std::io::Result<OwnedFd> {
    let mut block = Vec::with_capacity(4096);
    for (name, value) in env {
        if name.contains('\0') || value.contains('\0') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "environment variable `{}` holds a NUL byte",
                    name.escape_debug()
                ),
            ));
        }
        block.extend_from_slice(name.as_bytes());
        block.push(b'=');
        block.extend_from_slice(value.as_bytes());
        block.push(0);
    }
    // SAFETY: memfd_create with a static NUL-terminated name; the result is
    // a new descriptor owned here alone.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_memfd_create,
            c"exec-server-env".as_ptr(),
            libc::MFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    file.write_all(&block)?;
    file.rewind()?;
    Ok(file.into())
}

/// Reads the environment [`write`] made from the inheritable descriptor `fd`
/// to its end, then closes it. Errors: the read's, and `InvalidData` for a
/// block whose last entry is not terminated.
pub fn read(fd: RawFd) -> std::io::Result<Vec<CString>> {
    // SAFETY: the server passed this descriptor for this stage alone.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut block = Vec::new();
    file.take(MAX_ENV_BYTES).read_to_end(&mut block)?;
    parse(&block)
}

fn parse(block: &[u8]) -> std::io::Result<Vec<CString>> {
    let Some(body) = block.strip_suffix(&[0]) else {
        if block.is_empty() {
            return Ok(Vec::new());
        }
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "unterminated environment block",
        ));
    };
    body.split(|b| *b == 0)
        .map(|entry| {
            CString::new(entry).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })
        .collect()
}

/// The descriptor named by an `env:FD` argument; `None` when `arg` is not
/// one or names a standard stream.
pub fn parse_arg(arg: &[u8]) -> Option<Option<RawFd>> {
    let rest = arg.strip_prefix(ENV_PREFIX.as_bytes())?;
    Some(
        std::str::from_utf8(rest)
            .ok()
            .and_then(|s| s.parse::<RawFd>().ok())
            .filter(|fd| *fd > 2),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn an_environment_crosses_exactly() {
        let env = [
            ("PATH", "/usr/bin:/bin"),
            ("EMPTY", ""),
            ("B", "x=y"),
            ("U", "ü €"),
        ];
        let fd = write(env).unwrap();
        // What the inner stage gets: an inheritable duplicate.
        // SAFETY: dup of a descriptor owned by this test.
        let dup = unsafe { libc::dup(fd.as_raw_fd()) };
        assert!(dup > 2);
        let got = read(dup).unwrap();
        let want: Vec<CString> = env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")).unwrap())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn an_empty_environment_is_empty_and_nul_bytes_are_refused() {
        let fd = write([]).unwrap();
        // SAFETY: as above.
        let dup = unsafe { libc::dup(fd.as_raw_fd()) };
        assert_eq!(read(dup).unwrap(), Vec::<CString>::new());
        let e = write([("A", "x\0y")]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(
            parse(b"A=1\0B").unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn only_an_env_argument_names_a_descriptor() {
        assert_eq!(parse_arg(b"env:7"), Some(Some(7)));
        assert_eq!(parse_arg(b"env:2"), Some(None));
        assert_eq!(parse_arg(b"env:x"), Some(None));
        assert_eq!(parse_arg(b"warm:3:4"), None);
    }
}
