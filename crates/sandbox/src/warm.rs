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

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;

/// The inner stage's `<pwd>` argument prefix selecting the warm mode:
/// `warm:FD`, `FD` the pipe's read end.
pub const WARM_PREFIX: &str = "warm:";

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

/// Encodes a command; `None` when a field holds a NUL byte (no exec could
/// take it: the cold path reports that) or the message would exceed
/// [`MAX_MESSAGE_BYTES`].
pub fn encode<'a>(
    program: &OsStr,
    argv: impl ExactSizeIterator<Item = &'a str>,
    env: impl Iterator<Item = (&'a str, &'a str)>,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(1024);
    let field = |out: &mut Vec<u8>, parts: &[&[u8]]| -> Option<()> {
        for p in parts {
            if p.contains(&0) {
                return None;
            }
            out.extend_from_slice(p);
        }
        out.push(0);
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

#[cfg(test)]
mod tests {
    use super::*;

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
