//! `exec-server-inner`: the sandbox's inner stage as a program of its own
//! (see `exec_server_sandbox::inner_program`). exec-server starts it inside
//! each sandbox in place of re-executing itself when it finds it next to
//! its own executable, built from the same sources; it is not meant to be
//! run by hand.

use exec_server_sandbox::inner::{run, INNER_FLAG};
use exec_server_sandbox::inner_program::{ID_FLAG, SOURCE_ID};

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match args.get(1) {
        Some(flag) if flag == INNER_FLAG => run(&args[2..]),
        Some(flag) if flag == ID_FLAG => println!("{SOURCE_ID}"),
        _ => {
            eprintln!(
                "exec-server-inner: the inner stage of exec-server's sandbox; exec-server starts it itself (sandbox sources {SOURCE_ID})"
            );
            std::process::exit(2);
        }
    }
}
