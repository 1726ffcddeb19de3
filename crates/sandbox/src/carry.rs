//! Copying a proxied connection both ways: the bridge's (a TCP port inside
//! the sandbox to the proxy's Unix socket) and the transparent-TCP
//! supervisor's (a command's intercepted connection to the SOCKS socket).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;

/// Copies both ways until both directions ended.
pub fn carry(tcp: TcpStream, unix: UnixStream) {
    let (Ok(tcp2), Ok(unix2)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let _ = tcp.set_nodelay(true);
    let up = std::thread::spawn(move || {
        pipe(&tcp2, &unix2);
        let _ = unix2.shutdown(Shutdown::Write);
    });
    pipe(&unix, &tcp);
    let _ = tcp.shutdown(Shutdown::Write);
    let _ = up.join();
}

fn pipe(mut from: impl Read, mut to: impl Write) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}
