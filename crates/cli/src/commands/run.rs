//! `run`: a command on the server with its output streamed, stdin forwarded,
//! Ctrl-C turned into an interrupt, and the command's exit code as ours.

use super::local_out::LocalOut;
use super::terminal::{terminal_size, RawMode};
use super::{explain, fail, remote_path, server_cwd, ConnectArgs};
use clap::Args;
use exec_server_client::{ExecServerClient, ProcessEvent, ProcessHandle};
use exec_server_protocol::types::{
    EnvInherit, EnvPolicy, ExecParams, LimitReason, OutputStream, ProcessLimits, ProcessSignal,
};
use exec_server_protocol::PathUri;
use std::collections::BTreeMap;
use std::io::Write;

/// `run` flags.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// Run on a pseudo-terminal (stderr merged into stdout; local terminal in raw mode).
    #[arg(long, short = 't')]
    pub tty: bool,
    /// Working directory on the server (relative paths are taken from the server's cwd).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Set a variable for the command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Start from an empty environment instead of the server's (minus names
    /// matching *KEY*, *SECRET*, *TOKEN*).
    #[arg(long)]
    pub clean_env: bool,
    /// Route the command's network traffic through a managed proxy on the
    /// server that allows HOST (repeatable; every other host is denied).
    /// Enforced when the server confines the command; advisory otherwise.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_host: Vec<String>,
    /// Route the command's traffic through a managed proxy; with no
    /// `--allow-host` and a terminal on stdin, ask there about each new host.
    #[arg(long)]
    pub network_proxy: bool,
    /// Limits: --timeout, --idle-timeout, --max-output, --memory,
    /// --max-tasks, --cpus.
    #[command(flatten)]
    pub limits: super::limits::LimitArgs,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// What to run, shared by `run` and `shell`.
pub struct Spec {
    /// Its `processId` ([`process_id`]).
    pub process_id: String,
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: Vec<String>,
    pub clean_env: bool,
    pub tty: bool,
    /// The managed network launch, when asked for.
    pub network: Option<exec_server_protocol::types::RemoteNetworkProxyLaunchConfig>,
    /// `limits`, when any was asked for.
    pub limits: Option<ProcessLimits>,
}

/// Exit code of a program that does not exist (as a shell answers).
const EXIT_NOT_FOUND: i32 = 127;
/// Exit code of a program that cannot be executed (as a shell answers).
const EXIT_NOT_EXECUTABLE: i32 = 126;

/// Runs `run`; returns the remote exit code (128+N for signal N).
pub async fn run(args: RunArgs) -> i32 {
    let policy = (args.network_proxy || !args.allow_host.is_empty())
        .then(|| super::network::CliPolicy::new(&args.allow_host));
    let network = policy.as_ref().map(|p| p.launch());
    let shared = policy.map(|p| std::sync::Arc::new(p) as _);
    let process_id = process_id();
    // Embedded, output bound for a pipe is spliced there by the server
    // instead of sent to us and written again (on a terminal, raw mode and
    // window size come first; elsewhere, writes as before).
    let sinks = (args.conn.is_embedded() && !args.tty)
        .then(|| super::local_out::pipe_sinks(&process_id))
        .flatten();
    let client = match args.conn.client_with("exec-server run", shared, sinks) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let spec = Spec {
        process_id,
        argv: args.command,
        cwd: args.cwd,
        env: args.env,
        clean_env: args.clean_env,
        tty: args.tty,
        network,
        limits: args.limits.to_limits(),
    };
    // The root of this command's trace when spans are exported
    // (--otlp-endpoint): the server's request and process spans join it.
    let span = tracing::info_span!(
        "exec-server run",
        otel.kind = "client",
        program = spec.argv.first().map(String::as_str).unwrap_or(""),
    );
    tracing::Instrument::instrument(execute(client, spec), span).await
}

/// Starts `spec` on the server and relays it until it closes; returns its exit code.
pub async fn execute(client: ExecServerClient, spec: Spec) -> i32 {
    let params = match exec_params(&client, &spec).await {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    // Taken before the start: a signal that comes once the command runs
    // must reach it, not end this process by its default action.
    let mut signals = Signals::take();
    let started = match signals.as_mut() {
        // Ctrl-C or SIGTERM while the start is on its way ends `run` (a
        // start that reached the server ends with the session).
        Some(s) => tokio::select! {
            started = start(&client, params) => started,
            code = s.stop() => {
                client.close().await;
                return code;
            }
        },
        None => start(&client, params).await,
    };
    let mut proc = match started {
        Ok(p) => p,
        Err(code) => return code,
    };
    let raw = if spec.tty {
        RawMode::enter()
    } else {
        RawMode::none()
    };
    let stdin_task = tokio::spawn(forward_stdin(client.clone(), proc.id.clone()));
    let mut signal_task = tokio::spawn(forward_signals(
        client.clone(),
        proc.id.clone(),
        spec.tty,
        signals,
    ));
    // `Err`: the code `run` leaves with before the command's end.
    let outcome = tokio::select! {
        outcome = relay_output(&mut proc) => Ok(outcome),
        gave_up = &mut signal_task => Err(gave_up.unwrap_or(1)),
    };
    stdin_task.abort();
    signal_task.abort();
    drop(raw);
    let code = match outcome {
        Err(code) => {
            eprintln!(
                "exec-server: leaving without the command's end: it was killed, and the \
                 server has not reported its end"
            );
            code
        }
        Ok(Ok((Some(code), Some(limit)))) => {
            eprintln!("exec-server: {}", super::limits::describe(limit));
            super::limits::exit_code(limit, code)
        }
        Ok(Ok((code, _))) => code.unwrap_or(1),
        Ok(Err(why)) => {
            let _ = proc.terminate().await;
            fail(why)
        }
    };
    // Closed for good before the runtime shuts down: an embedded server's
    // end would otherwise look like a lost connection, and the client's
    // recovery would log "resuming the session" into the command's stderr.
    client.close().await;
    code
}

/// The `process/start` params for `spec`: cwd, environment, terminal.
async fn exec_params(client: &ExecServerClient, spec: &Spec) -> Result<ExecParams, String> {
    let cwd = match &spec.cwd {
        Some(c) => remote_path(client, c).await?,
        None => {
            PathUri::from_path(&server_cwd(client).await?).ok_or("server cwd is not absolute")?
        }
    };
    let mut set = BTreeMap::new();
    for kv in &spec.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--env takes K=V, got `{kv}`"))?;
        set.insert(k.to_string(), v.to_string());
    }
    if spec.tty && !set.contains_key("TERM") {
        set.insert(
            "TERM".into(),
            std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into()),
        );
    }
    let mut params = ExecParams::new(spec.process_id.clone(), spec.argv.clone(), cwd, set);
    params.tty = spec.tty;
    params.pipe_stdin = true;
    params.env_policy = (!spec.clean_env).then(|| EnvPolicy {
        inherit: EnvInherit::All,
        ignore_default_excludes: false,
        exclude: vec![],
        set: BTreeMap::new(),
        include_only: vec![],
    });
    params.pty_size = if spec.tty { terminal_size() } else { None };
    params.network_proxy = spec.network.clone();
    if let Some(limits) = &spec.limits {
        // A server that does not know `limits` (or cannot hold one of them)
        // would ignore it: refuse rather than run the command unbounded.
        let info = client.environment_info().await.map_err(|e| explain(&e))?;
        super::limits::check_capabilities(limits, &info.capabilities)?;
        params.limits = Some(limits.clone());
    }
    Ok(params)
}

/// A process id unique to this invocation.
pub fn process_id() -> String {
    format!(
        "run-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0)
    )
}

/// Starts the process; on failure prints why and returns the exit code to use
/// (127 / 126 when the program is missing / not executable, as a shell does).
async fn start(client: &ExecServerClient, params: ExecParams) -> Result<ProcessHandle, i32> {
    let program = params.argv[0].clone();
    let cwd_text = params
        .cwd
        .to_path()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let e = match client.start_process(params).await {
        Ok(p) => return Ok(p),
        Err(e) => e,
    };
    let message = e
        .server_error()
        .map(|s| s.message.clone())
        .unwrap_or_default();
    Err(match e.os_error() {
        Some(libc::ENOENT) => {
            eprintln!("exec-server: cannot start `{program}` in {cwd_text}: {message} (is the program on PATH, and does the directory exist?)");
            EXIT_NOT_FOUND
        }
        Some(libc::EACCES) => {
            eprintln!("exec-server: cannot start `{program}`: {message}");
            EXIT_NOT_EXECUTABLE
        }
        _ => fail(explain(&e)),
    })
}

/// Local stdin → remote stdin, then end of file.
async fn forward_stdin(client: ExecServerClient, id: String) {
    use tokio::io::AsyncReadExt;
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if client.write_process(&id, buf[..n].to_vec()).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = client.close_stdin(&id).await;
}

/// The signals `run` forwards to its command, caught from [`Signals::take`] on.
struct Signals {
    int: tokio::signal::unix::Signal,
    winch: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// The exit code for the next SIGINT (130) or SIGTERM (143).
    async fn stop(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => 128 + libc::SIGINT,
            _ = self.term.recv() => 128 + libc::SIGTERM,
        }
    }

    /// SIGINT, SIGWINCH and SIGTERM caught; `None` if the runtime cannot.
    fn take() -> Option<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Some(Signals {
            int: signal(SignalKind::interrupt()).ok()?,
            winch: signal(SignalKind::window_change()).ok()?,
            term: signal(SignalKind::terminate()).ok()?,
        })
    }
}

/// Ctrl-C → interrupt (a second one kills); SIGTERM → kill; window size
/// changes → resize (on a terminal). A Ctrl-C or SIGTERM after the kill was
/// asked for gives up waiting for the command's end (a server that does
/// not report it): returns the exit code for that signal (130, 143).
async fn forward_signals(
    client: ExecServerClient,
    id: String,
    tty: bool,
    signals: Option<Signals>,
) -> i32 {
    let Some(Signals {
        mut int,
        mut winch,
        mut term,
    }) = signals
    else {
        return std::future::pending().await;
    };
    let mut interrupts = 0;
    let mut killed = false;
    // Sent on tasks of their own: a server that does not answer must not
    // keep the next signal from being seen.
    let send = |kill: bool| {
        let (client, id) = (client.clone(), id.clone());
        tokio::spawn(async move {
            let _ = match kill {
                true => client.terminate(&id).await.map(|_| ()),
                false => client.signal(&id, ProcessSignal::Interrupt).await,
            };
        });
    };
    loop {
        tokio::select! {
            _ = int.recv() => {
                if killed {
                    return 128 + libc::SIGINT;
                }
                interrupts += 1;
                killed = interrupts > 1;
                send(killed);
            }
            _ = term.recv() => {
                if killed {
                    return 128 + libc::SIGTERM;
                }
                killed = true;
                send(true);
            }
            _ = winch.recv() => {
                if let Some(s) = terminal_size().filter(|_| tty) {
                    let _ = client.resize(&id, s.cols, s.rows).await;
                }
            }
        }
    }
}

/// Writes the process's output to stdout / stderr until it closes. Returns its
/// exit code (if it reported one) and the limit that ended it, or why its
/// events stopped.
async fn relay_output(
    proc: &mut ProcessHandle,
) -> Result<(Option<i32>, Option<LimitReason>), String> {
    use std::os::fd::AsFd;
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    // Chunks go to descriptors 1 and 2 as they are, never blocking this
    // runtime's thread on a stalled reader (`LocalOut`): the standard
    // handle is line buffered, and scanning every chunk for a line end cost
    // more than the copy (each chunk is flushed at once anyway).
    let mut out = LocalOut::new(stdout.as_fd()).ok();
    let mut err = LocalOut::new(stderr.as_fd()).ok();
    if let Some(o) = &out {
        // A pipe as large as an output chunk (up to 1 MiB with binary
        // frames) takes each chunk in one write instead of several with a
        // wake-up of the reader between them. Refused for anything but a
        // pipe, or past the system's pipe-max-size; harmless then.
        let _ = nix::fcntl::fcntl(o.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(1024 * 1024));
    }
    let mut code = None;
    let mut limit = None;
    while let Some(ev) = proc.next_event().await {
        match ev {
            ProcessEvent::Output { stream, data, .. } => {
                let dest = match stream {
                    OutputStream::Stderr => &mut err,
                    _ => &mut out,
                };
                let r = match dest {
                    Some(d) => d.write_all(&data).await,
                    // No duplicate of the descriptor (out of descriptors):
                    // the standard handle, blocking.
                    None if stream == OutputStream::Stderr => stderr.lock().write_all(&data),
                    None => {
                        let mut o = stdout.lock();
                        o.write_all(&data).and_then(|_| o.flush())
                    }
                };
                if r.is_err() {
                    // Local stdout closed (e.g. `| head`): stop the remote command.
                    let _ = proc.terminate().await;
                }
            }
            ProcessEvent::Exited {
                code: c, limit: l, ..
            } => {
                code = Some(c);
                limit = l;
            }
            ProcessEvent::Closed { .. } => break,
            ProcessEvent::Failed(why) => {
                let _ = stdout.lock().flush();
                return Err(why.to_string());
            }
        }
    }
    let _ = stdout.lock().flush();
    Ok((code, limit))
}
