//! The local terminal: its size, and raw mode for `run -t` and `shell`.

use exec_server_protocol::types::PtySize;
use std::os::fd::AsFd;

/// The size of the terminal on stdout, if it is one.
pub fn terminal_size() -> Option<PtySize> {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills a winsize that lives for the call.
    let r = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0).then_some(PtySize {
        cols: ws.ws_col,
        rows: ws.ws_row,
    })
}

/// Puts the local terminal in raw mode and restores it on drop.
pub struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    /// Raw mode if stdin is a terminal; otherwise nothing to restore.
    pub fn enter() -> RawMode {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        if !nix::unistd::isatty(stdin.as_fd()).unwrap_or(false) {
            return RawMode(None);
        }
        let Ok(saved) = tcgetattr(stdin.as_fd()) else {
            return RawMode(None);
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        if tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).is_err() {
            return RawMode(None);
        }
        RawMode(Some(saved))
    }

    /// Leaves the terminal as it is.
    pub fn none() -> RawMode {
        RawMode(None)
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin().as_fd(),
                nix::sys::termios::SetArg::TCSANOW,
                saved,
            );
        }
    }
}
