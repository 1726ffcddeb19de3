//! `exec-server completions <shell>` and `exec-server man`: shell completion
//! scripts and a roff man page, both generated from the CLI definition so they
//! never drift from the flags.

use clap::{Args, CommandFactory};
use std::io::Write;

/// Flags of `completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to write a completion script for (to stdout).
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Writes the completion script for `args.shell` to stdout. Returns the exit code.
pub fn completions(args: CompletionsArgs) -> i32 {
    let mut cmd = crate::Cli::command();
    // Into memory first: the generator panics on a write error (e.g. a closed
    // pipe), and a write error here should be an exit code.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "exec-server", &mut script);
    let mut out = std::io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("exec-server: cannot write the completion script: {e}");
            1
        }
    }
}

/// Writes the man page (`exec-server(1)`, roff) to stdout. Returns the exit code.
pub fn man() -> i32 {
    let page = clap_mangen::Man::new(crate::Cli::command());
    let mut out = std::io::stdout().lock();
    match page.render(&mut out).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("exec-server: cannot write the man page: {e}");
            1
        }
    }
}
