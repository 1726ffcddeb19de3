//! The `exec-server` binary: the server (default), and client commands.

mod alloc;
mod commands;
mod credentials;
mod environment_id;
mod executor;
mod forward;
mod generate;
mod registry;
mod serve;
mod upgrade;

use clap::{Parser, Subcommand};

/// exec-server: the hands of a coding agent on another machine.
///
/// Without a subcommand it serves (the flags below). With one, it is a client.
#[derive(Parser, Debug)]
#[command(
    name = "exec-server",
    version = VERSION,
    args_conflicts_with_subcommands = true,
    after_help = "Examples:
  exec-server --listen ws://127.0.0.1:8765              serve on loopback (prints the URL)
  exec-server run -- uname -a                           run here, through an embedded server
  exec-server run --connect ws://127.0.0.1:8765 -- ls   run on a server, exit with its code
  exec-server shell --connect ws://127.0.0.1:8765       interactive shell (like ssh -t)
  exec-server fs --connect URL get /var/log/syslog ./syslog
  exec-server info --connect URL                        what the server is"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// How stderr logs are written: `text` (one human-readable line per event,
    /// the default) or `json` (one JSON object per line, with the fields of the
    /// event's spans, for journald/Loki/Elasticsearch). Verbosity: RUST_LOG
    /// (default `warn`).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        value_name = "FORMAT"
    )]
    log_format: LogFormat,
    /// Export spans (requests, processes, and a client command's own span)
    /// to this OpenTelemetry collector, over OTLP/HTTP protobuf; `/v1/traces`
    /// is appended. Off by default. The standard variables work too:
    /// OTEL_EXPORTER_OTLP_ENDPOINT (a base URL, like this flag),
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the full URL), OTEL_BSP_* (batching),
    /// OTEL_SDK_DISABLED=true (off). A request's `trace` member (W3C trace
    /// context) makes its span a child of the caller's.
    #[arg(long, global = true, value_name = "URL")]
    otlp_endpoint: Option<String>,
    #[command(flatten)]
    serve: serve::ServeArgs,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the exec-server protocol (the default).
    Serve(Box<serve::ServeArgs>),
    /// Run a command on the server; stream its output; exit with its exit code.
    Run(commands::run::RunArgs),
    /// Open an interactive shell on the server on a PTY.
    Shell(commands::shell::ShellArgs),
    /// Files on the server: ls, cat, put, get, stat, rm, mkdir, cp.
    Fs(commands::fs::FsArgs),
    /// Print the server's environment info as JSON.
    Info(commands::ConnectArgs),
    /// List every session's processes on the server (needs its operator
    /// credential, `serve --operator-token-file`).
    Ps(commands::ps::PsArgs),
    /// Stop a process of any session on the server (needs its operator
    /// credential): the whole tree, or one signal with --signal.
    Kill(commands::kill::KillArgs),
    /// Run an environment registry and rendezvous relay (remote mode).
    Registry(registry::RegistryArgs),
    /// Bridge a listening exec-server into a registry, stream by stream
    /// (needs --connect, --remote and --environment-id).
    Forward(forward::ForwardArgs),
    /// Upgrade a running server to a new binary without stopping what it
    /// runs: sessions, processes, terminals and output are handed over.
    Upgrade(upgrade::UpgradeArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(generate::CompletionsArgs),
    /// Print the man page (roff), e.g. `exec-server man > exec-server.1`.
    Man,
}

/// `--version`: this build, and the protocol it speaks (the Codex CLI
/// exec-server release whose JSON-RPC dialect it implements, also reported as
/// `executorVersion` in `environment/info`).
/// (A literal, as `concat!` needs; a test holds it equal to
/// `exec_server::env_info::EXECUTOR_VERSION`.)
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (protocol: Codex exec-server 0.169.0)"
);

/// Installs the stderr log subscriber and, when an OTLP endpoint is set, the
/// span exporter (whose guard must live until exit so the last spans are
/// sent). Secrets (tokens, header values from `valueEnvVar`) are never put in
/// events or span fields, in either format.
fn init_logging(
    format: LogFormat,
    otlp_flag: Option<&str>,
) -> Option<exec_server_telemetry::otlp::OtlpGuard> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).boxed(),
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
    };
    let mut guard = None;
    // The log filter (RUST_LOG, default `warn`) must not hide the info-level
    // request and process spans from the exporter: each layer filters alone.
    let otel = exec_server_telemetry::otlp::traces_endpoint(otlp_flag).and_then(|endpoint| {
        match exec_server_telemetry::otlp::layer(&endpoint, "exec-server") {
            Ok((layer, g)) => {
                guard = Some(g);
                Some(layer.with_filter(tracing_subscriber::filter::LevelFilter::INFO))
            }
            Err(e) => {
                eprintln!("exec-server: spans are not exported to {endpoint}: {e}");
                None
            }
        }
    });
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .init();
    guard
}

fn main() {
    // Hidden stages of the sandbox, before anything else starts (no threads,
    // no logging): the inner stage that execs a confined command, and the
    // confined file-system helper.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .get(1)
        .is_some_and(|a| a == exec_server::sandbox::INNER_FLAG)
    {
        exec_server::sandbox::run_inner_stage(&args[2..]);
    }
    if args
        .get(1)
        .is_some_and(|a| a == exec_server::sandbox::fs_helper::FLAG)
    {
        std::process::exit(exec_server::sandbox::fs_helper::serve());
    }
    // The question an upgrading server asks its successor first.
    if args
        .get(1)
        .is_some_and(|a| a == exec_server::handover::VERSION_FLAG)
    {
        println!("{}", exec_server::handover::version_line());
        std::process::exit(0);
    }
    if args
        .get(1)
        .is_some_and(|a| a == exec_server::handover::CHECK_FLAG)
    {
        std::process::exit(upgrade::check_state(args.get(2)));
    }
    exec_server_sysio::malloc::tune();
    let cli = Cli::parse();
    let otlp = init_logging(cli.log_format, cli.otlp_endpoint.as_deref());
    // `run` and `shell` relay one command's output: on one thread, its
    // chunks pass from the (embedded) server to stdout without a wake-up
    // of another thread each (1 GiB into `wc -c` took 0.89-1.09 s against
    // 1.09-1.26 s on the default runtime, BENCHMARKS.md); their writes
    // never block that thread (`commands::local_out`). Servers and the rest keep a worker
    // per core.
    let mut builder = match cli.command {
        Some(Command::Run(_) | Command::Shell(_)) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("exec-server: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let serve_args = match cli.command {
        None => Some(cli.serve),
        Some(Command::Serve(ref args)) => Some((**args).clone()),
        _ => None,
    };
    if let Some(args) = serve_args {
        alloc::spawn_trimmer();
        // The server runs on a thread of its own: this main thread forks
        // the sandboxes and makes an upgrade's execve (see the launcher).
        let code = exec_server::launcher::run_here(move || {
            let code = runtime.block_on(serve::run(args));
            runtime.shutdown_timeout(std::time::Duration::from_millis(200));
            code
        });
        drop(otlp);
        std::process::exit(code);
    }
    let code = runtime.block_on(async move {
        match cli.command {
            None | Some(Command::Serve(_)) => 0,
            Some(Command::Run(args)) => commands::run::run(args).await,
            Some(Command::Shell(args)) => commands::shell::shell(args).await,
            Some(Command::Fs(args)) => commands::fs::fs(args).await,
            Some(Command::Info(args)) => commands::info::info(args).await,
            Some(Command::Ps(args)) => commands::ps::ps(args).await,
            Some(Command::Kill(args)) => commands::kill::kill(args).await,
            Some(Command::Registry(args)) => {
                // A node forwards bursts of frames for many sockets; what
                // they freed goes back to the kernel, as for `serve`.
                alloc::spawn_trimmer();
                registry::run(args).await
            }
            Some(Command::Forward(args)) => forward::run(args).await,
            Some(Command::Upgrade(args)) => upgrade::run(args).await,
            Some(Command::Completions(args)) => generate::completions(args),
            Some(Command::Man) => generate::man(),
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    // Flushes the last batch of spans (outside the runtime: the exporter's
    // HTTP client is a blocking one).
    drop(otlp);
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_names_the_protocol_version_we_report() {
        let protocol = format!(
            "protocol: Codex exec-server {})",
            exec_server::env_info::EXECUTOR_VERSION
        );
        assert!(super::VERSION.ends_with(&protocol), "{}", super::VERSION);
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
