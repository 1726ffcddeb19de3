//! The fourth adversarial pass: a confined command on pipes must not reach
//! the terminal the server runs on (its controlling terminal, inherited
//! through bubblewrap): from there it could take the foreground
//! (`tcsetpgrp`) and read what the operator types, or print fake prompts.

use crate::common::sandbox::*;
use crate::common::*;
use std::os::fd::{AsRawFd, OwnedFd};

/// A server whose controlling terminal is a new PTY (as when it runs in a
/// shell); returns it with the PTY's master, which must stay open.
fn server_on_a_terminal() -> (Server, OwnedFd) {
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let slave = pty.slave.as_raw_fd();
    let mut cmd = server_command(BIN);
    cmd.args(["--listen", "ws://127.0.0.1:0"]);
    // SAFETY: setsid and ioctl on a descriptor inherited by the child, between
    // fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if libc::setsid() < 0 || libc::ioctl(slave, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let server = Server::spawn(cmd);
    drop(pty.slave);
    (server, pty.master)
}

const TRY_TTY: &str =
    "if ( : <>/dev/tty ) 2>/dev/null; then echo TTY-REACHED; else echo no-terminal; fi";

#[tokio::test]
async fn a_confined_command_on_pipes_has_no_controlling_terminal() {
    let (s, _master) = server_on_a_terminal();
    let mut c = Conn::open(&s.url, None).await;
    let f = fixture("sbx-tty");
    // The fixture holds: an unconfined command inherits the terminal.
    let plain = run(&mut c, "plain", &f.ws, TRY_TTY, None).await;
    assert!(plain.out.contains("TTY-REACHED"), "fixture: {plain:?}");
    // Confined, cold and then (same policy) from a sandbox prepared ahead,
    // and read-only: no terminal at all.
    for (id, policy) in [("cold", ww(&f.ws)), ("warm", ww(&f.ws)), ("ro", ro(&f.ws))] {
        let r = run(&mut c, id, &f.ws, TRY_TTY, Some(policy)).await;
        assert_eq!(r.exit, 0, "{id}: {r:?}");
        assert!(r.out.contains("no-terminal"), "{id}: {r:?}");
        assert!(!r.out.contains("TTY-REACHED"), "{id}: {r:?}");
    }
}
