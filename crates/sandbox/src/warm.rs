//! A sandbox prepared ahead ("warm"): bubblewrap has built the namespaces
//! and the view, the inner stage has installed the seccomp filter and
//! entered the Landlock domain, and it waits on a pipe for the one command
//! it is to run. Nothing of a command is in the sandbox before that message:
//! a warm sandbox serves exactly one command, so each command still gets
//! namespaces (PID, mount, `/tmp`) no other command has used.
//!
//! The message, written once by the server and read to end of file:
//! NUL-terminated fields: the number of `argv` entries in decimal, the
//! program's absolute path, the `argv` entries (`argv[0]` first), then every
//! environment entry as `NAME=VALUE`. An empty message (the server closed
//! the pipe without writing) means "not needed": the inner stage exits 0.
//!
//! A waiting sandbox can go stale: removing or replacing a path on the host
//! detaches every mount on it in every namespace, so a protected `.git` or a
//! hidden path recreated meanwhile would be open in it. When the command
//! comes, the inner stage checks its `/proc/self/mountinfo`: every mount
//! point the plan made (bubblewrap's arguments after the warm descriptors,
//! [`all_mounted`]) is still there, and nothing changed since it started to
//! wait. Then it replies [`INTACT`] and executes, else replies [`STALE`] and
//! exits without running anything. The mount points are checked, not only
//! the change: a path replaced between bubblewrap's bind and the stage's
//! first reading would leave both readings alike and the sandbox open.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;

/// The inner stage's `<pwd>` argument prefix selecting the warm mode:
/// `warm:MSG:REPLY`, `MSG` the message pipe's read end, `REPLY` the reply
/// pipe's write end.
pub const WARM_PREFIX: &str = "warm:";

/// Reply: set up and waiting for the command (sent once, first).
pub const READY: u8 = b'r';
/// Reply: the sandbox's mounts are as they were made; the command's
/// `execve` follows at once.
pub const INTACT: u8 = b'+';
/// Reply: a mount of the sandbox is gone since it was made (a protected or
/// hidden path removed or replaced on the host detaches its mount in every
/// namespace); the command never runs here and the start takes the cold way.
pub const STALE: u8 = b'-';

/// Largest message the server sends: beyond it a start takes the cold way
/// (the pipe is made this large, so one write never blocks).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// One command for a warm sandbox.
#[derive(Debug, PartialEq, Eq)]
pub struct Message {
    /// Absolute path of the program.
    pub program: CString,
    /// `argv`, `argv[0]` first.
    pub argv: Vec<CString>,
    /// The environment, `NAME=VALUE` each: exactly the command's.
    pub env: Vec<CString>,
}

/// Longest single argument or environment entry `execve` takes
/// (`MAX_ARG_STRLEN`, 32 pages): a longer one takes the cold way, which
/// reports the error as a failed start.
const MAX_FIELD_BYTES: usize = 32 * 4096;

/// Encodes a command; `None` when a field holds a NUL byte or is over
/// `MAX_ARG_STRLEN` (no exec could take it: the cold path reports that) or
/// the message would exceed [`MAX_MESSAGE_BYTES`].
pub fn encode<'a>(
    program: &OsStr,
    argv: impl ExactSizeIterator<Item = &'a str>,
    env: impl Iterator<Item = (&'a str, &'a str)>,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(1024);
    let field = |out: &mut Vec<u8>, parts: &[&[u8]]| -> Option<()> {
        let start = out.len();
        for p in parts {
            if p.contains(&0) {
                return None;
            }
            out.extend_from_slice(p);
        }
        out.push(0);
        if out.len() - start > MAX_FIELD_BYTES {
            return None;
        }
        (out.len() <= MAX_MESSAGE_BYTES).then_some(())
    };
    field(&mut out, &[argv.len().to_string().as_bytes()])?;
    field(&mut out, &[program.as_bytes()])?;
    for a in argv {
        field(&mut out, &[a.as_bytes()])?;
    }
    for (k, v) in env {
        field(&mut out, &[k.as_bytes(), b"=", v.as_bytes()])?;
    }
    Some(out)
}

/// Decodes a message; `None` when malformed (the inner stage then fails
/// the start rather than guess).
pub fn decode(bytes: &[u8]) -> Option<Message> {
    let body = bytes.strip_suffix(&[0])?;
    let mut fields = body.split(|b| *b == 0);
    let count: usize = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    let program = CString::new(fields.next()?).ok()?;
    let mut argv = Vec::with_capacity(count.min(4096));
    for _ in 0..count {
        argv.push(CString::new(fields.next()?).ok()?);
    }
    let env = fields
        .map(CString::new)
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    Some(Message { program, argv, env })
}

/// Reads the whole message from `fd` (to end of file) and closes it.
/// Errors: the read's.
pub fn read_message(fd: std::os::fd::OwnedFd) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Whether every path of `targets` (absolute, as the sandbox sees it) is
/// a mount point in `mountinfo`, the text of `/proc/<pid>/mountinfo`
/// (its fifth field, with the kernel's `\NNN` octal escapes undone).
/// Unreadable lines count as no mount.
pub fn all_mounted(mountinfo: &[u8], targets: &[std::ffi::OsString]) -> bool {
    let points: std::collections::HashSet<Vec<u8>> = mountinfo
        .split(|b| *b == b'\n')
        .filter_map(|line| line.split(|b| *b == b' ').nth(4))
        .map(unescape)
        .collect();
    targets.iter().all(|t| points.contains(t.as_bytes()))
}

/// Undoes mountinfo's escapes: `\` then three octal digits is one byte.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_found_with_their_escapes_undone() {
        let info = b"22 1 0:21 / / ro,nosuid - tmpfs tmpfs rw\n\
            30 22 8:1 /w /work/my\\040dir rw - ext4 /dev/vda rw\n\
            31 30 8:1 /w/.git /work/my\\040dir/.git ro - ext4 /dev/vda rw\n";
        let t = |v: &[&str]| -> Vec<std::ffi::OsString> { v.iter().map(|s| s.into()).collect() };
        assert!(all_mounted(
            info,
            &t(&["/", "/work/my dir", "/work/my dir/.git"])
        ));
        assert!(all_mounted(info, &[]));
        assert!(!all_mounted(info, &t(&["/work/my dir/.codex"])));
        assert!(!all_mounted(info, &t(&["/work/my\\040dir"])));
        assert!(!all_mounted(b"", &t(&["/"])));
    }

    #[test]
    fn a_command_survives_the_round_trip() {
        let env = [("PATH", "/usr/bin"), ("EMPTY", ""), ("EQ", "a=b")];
        let bytes = encode(
            OsStr::new("/bin/echo"),
            ["echo", "", "two words"].into_iter(),
            env.into_iter(),
        )
        .expect("encodable");
        let m = decode(&bytes).expect("decodable");
        let s = |v: &[CString]| -> Vec<String> {
            v.iter().map(|c| c.to_string_lossy().into_owned()).collect()
        };
        assert_eq!(m.program.to_bytes(), b"/bin/echo");
        assert_eq!(s(&m.argv), ["echo", "", "two words"]);
        assert_eq!(s(&m.env), ["PATH=/usr/bin", "EMPTY=", "EQ=a=b"]);
    }

    #[test]
    fn a_nul_or_an_oversized_command_takes_the_cold_way() {
        let none = std::iter::empty::<(&str, &str)>();
        assert!(encode(OsStr::new("/bin/x"), ["a\0b"].into_iter(), none).is_none());
        let big = "x".repeat(MAX_MESSAGE_BYTES);
        let none = std::iter::empty::<(&str, &str)>();
        assert!(encode(OsStr::new("/bin/x"), [big.as_str()].into_iter(), none).is_none());
        let long = "y".repeat(MAX_FIELD_BYTES);
        let env = [("LONG", long.as_str())].into_iter();
        assert!(encode(OsStr::new("/bin/x"), ["x"].into_iter(), env).is_none());
    }

    #[test]
    fn malformed_messages_are_refused() {
        for bad in [
            &b""[..],
            b"1\0/bin/x\0",
            b"x\0/bin/x\0a\0",
            b"1\0/bin/x\0a",
            b"3\0/bin/x\0a\0",
        ] {
            assert!(decode(bad).is_none(), "{bad:?}");
        }
        assert!(decode(b"0\0/bin/x\0").is_some());
    }
}
