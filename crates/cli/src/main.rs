//! The `exec-server` binary: the server (default), and client commands.

mod serve;

use clap::{Parser, Subcommand};

/// exec-server: the hands of a coding agent on another machine.
///
/// Without a subcommand it serves: `exec-server --listen ws://127.0.0.1:8765`.
#[derive(Parser, Debug)]
#[command(name = "exec-server", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: serve::ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the exec-server protocol (the default).
    Serve(serve::ServeArgs),
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("exec-server: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            None => serve::run(cli.serve).await,
            Some(Command::Serve(args)) => serve::run(args).await,
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    std::process::exit(code);
}
