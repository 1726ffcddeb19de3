//! `exec-server serve` (the default command).

use clap::{Args, ValueEnum};
use exec_server::listen::{self, ListenAddr};
use exec_server::{ServerConfig, ServerState};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Authentication modes for the WebSocket listener.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AuthMode {
    /// `Authorization: Bearer <token>` must match --ws-token-file or --ws-token-sha256.
    CapabilityToken,
    /// `Authorization: Bearer <JWT>`: HS256, signed with --ws-shared-secret-file,
    /// `exp` required, `nbf`/`iss`/`aud` checked when present or configured.
    SignedBearerToken,
}

/// `--process-cgroups`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProcessCgroups {
    /// Use a cgroup per process where the OS allows it.
    Auto,
    /// Never: process-group kill only.
    Off,
}

/// Flags of `serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Where to listen: ws://IP:PORT (port 0 picks a free port), stdio (one client
    /// on stdin/stdout, one JSON message per line) or unix:///path/to.sock (mode 0600).
    /// The URL is printed as the only line on stdout once listening.
    #[arg(long, default_value = "ws://127.0.0.1:0", value_name = "URL")]
    pub listen: String,

    /// Requests of one connection that may run at once. Above 1, file system
    /// requests run concurrently; process requests always keep their order and a
    /// long-polling process/read never blocks other requests.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub concurrent_requests: usize,

    /// Exit (killing every process) when stdin reaches end of file: ties the
    /// server's life to its parent's.
    #[arg(long)]
    pub exit_on_stdin_close: bool,

    /// Seconds a session whose connection dropped is kept (with its processes)
    /// for the client to resume it.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub detached_session_ttl: u64,

    /// Largest WebSocket message accepted, in bytes; a larger one closes its
    /// connection with status 1009 (message too big). The session detaches.
    #[arg(long, default_value_t = exec_server::MAX_MESSAGE_BYTES, value_name = "BYTES")]
    pub max_message_bytes: usize,

    /// Largest response body of a buffered http/request (one without
    /// streamResponse), in bytes; a larger body is refused with an error naming
    /// streamResponse and is never held in memory past this size.
    #[arg(long, default_value_t = exec_server::http::DEFAULT_MAX_BUFFERED_HTTP_BODY_BYTES, value_name = "BYTES")]
    pub max_http_body_bytes: usize,

    /// Where a request's `sandbox` cannot be enforced on this host (bubblewrap
    /// not installed), run it unconfined and report `sandboxType: "none"`
    /// instead of refusing it. Without effect where enforcement is possible:
    /// sandboxes are then always enforced.
    #[arg(long)]
    pub allow_unsandboxed: bool,

    /// Route managed Linux sandbox TCP through the SOCKS proxy. In a sandbox
    /// whose network is managed (`enforceManagedNetwork` with a
    /// `networkProxy`), a program that ignores the proxy variables and
    /// connects straight to an IP address (`curl --noproxy '*'`, a database
    /// client, `socket.create_connection`) is carried through the process's
    /// proxy, which allows, denies or asks the client about the address as
    /// for any SOCKS5 request; a refused connect fails with "connection
    /// refused". Without this flag only requests that say
    /// `proxy.transparentTcp: true` get it; a request's explicit `false` wins.
    #[arg(long)]
    pub linux_sandbox_transparent_tcp: bool,

    /// Require this HTTP CONNECT proxy for raw TCP from the managed SOCKS
    /// listener: every SOCKS5 CONNECT a managed proxy allows (transparent or
    /// explicit) is opened as `CONNECT host:port` through HOST:PORT, never
    /// directly; if that proxy refuses or cannot be reached the connection
    /// fails. HTTP and HTTPS requests through the HTTP listener are unaffected.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_host_port)]
    pub tcp_upstream_proxy: Option<String>,

    /// Put each started process in a cgroup of its own (where a writable cgroup2
    /// exists, e.g. as root), so process/terminate and session expiry also kill
    /// daemons it double-forked. Joining costs the kernel's global cgroup
    /// migration lock: `off` trades that for ~4x more concurrent starts (see
    /// BENCHMARKS.md); daemons are then killed only at server exit.
    #[arg(long, value_enum, default_value = "auto", value_name = "MODE")]
    pub process_cgroups: ProcessCgroups,

    /// Most sandboxes kept prepared ahead: after a sandboxed start, the next
    /// ones with the same policy, cwd and stdin mode (two, up to four while
    /// starts come back to back) are made at once and wait (at most 30 s)
    /// for their command, so that start skips bubblewrap's set-up. Each
    /// serves one command: no two commands share namespaces. 0 turns this
    /// off.
    #[arg(long, default_value_t = exec_server::DEFAULT_WARM_SANDBOXES, value_name = "N")]
    pub warm_sandboxes: usize,

    /// Most concurrent connections; more are refused with HTTP 503.
    #[arg(long, default_value_t = exec_server::DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    pub max_connections: usize,

    /// A directory of tools the client puts in front of PATH for the commands
    /// it runs here (reported as `prependPathDirs`; repeat for several). The
    /// Codex CLI relies on ripgrep: point this at a directory holding `rg`
    /// on hosts without a system ripgrep. Default: the first of `tools/` beside
    /// this binary, `$CARGO_HOME/bin`, `~/.cargo/bin` that holds an `rg`.
    #[arg(long, value_name = "DIR")]
    pub prepend_path: Vec<PathBuf>,

    /// A PEM file of CA certificates the managed network proxy also trusts
    /// for upstream TLS when it intercepts for credential masking (besides
    /// the Mozilla roots; repeat for several). For tests whose fake upstream
    /// has a test CA; not needed in production.
    #[arg(long, value_name = "PEM")]
    pub netproxy_upstream_root: Vec<PathBuf>,

    /// Directory for the output spool: each process's output beyond the 1 MiB
    /// memory window goes to unnamed files here, so a client that resumes or
    /// pages with process/read late still gets every byte (up to
    /// --output-spool-bytes). Created with mode 0700; an existing one must be
    /// yours and closed to others. Default: exec-server-spool-<uid> in $TMPDIR
    /// (or /tmp); if that cannot be used the spool is off, with a warning.
    #[arg(long, value_name = "DIR")]
    pub output_spool_dir: Option<PathBuf>,

    /// Most bytes spooled per process: output plus a 13-byte header a chunk
    /// (oldest dropped first, seen by a reader as a seq jump). The file of
    /// the last dropped segment (a quarter of this) is kept for reuse while
    /// the server's budget has room. 0 turns the spool off.
    #[arg(long, default_value_t = exec_server::process::spool::DEFAULT_SPOOL_BYTES_PER_PROCESS, value_name = "BYTES")]
    pub output_spool_bytes: u64,

    /// Most bytes spooled across all processes (headers and kept files
    /// included); a process over the budget drops its own oldest spooled
    /// output first.
    #[arg(long, default_value_t = exec_server::process::spool::DEFAULT_SPOOL_TOTAL_BYTES, value_name = "BYTES")]
    pub output_spool_total_bytes: u64,

    /// Most bytes spooled across one session's processes (its share of the
    /// server's budget): a session past it drops its own oldest spooled
    /// output, never another session's.
    #[arg(long, default_value_t = exec_server::process::spool::DEFAULT_SPOOL_SESSION_BYTES, value_name = "BYTES")]
    pub output_spool_session_bytes: u64,

    /// Require a bearer token on WebSocket upgrades.
    #[arg(long, value_enum, value_name = "MODE")]
    pub ws_auth: Option<AuthMode>,

    /// File holding the token (absolute path; read once, trimmed).
    #[arg(
        long,
        value_name = "ABS_PATH",
        requires = "ws_auth",
        conflicts_with = "ws_token_sha256"
    )]
    pub ws_token_file: Option<PathBuf>,

    /// When a limit of a process fires (`run --timeout` and the like), how
    /// long it has between SIGTERM and SIGKILL: 500ms, 2s, 1m.
    #[arg(long, value_name = "DURATION", default_value = "2s",
          value_parser = crate::commands::parse_duration)]
    pub limit_grace: Duration,

    /// Limits every process runs with unless its request sets them
    /// (comma-separated KEY=VALUE: timeout=10m, idle-timeout=2m,
    /// max-output=1G, memory=2G, max-tasks=512, cpus=2). Default: none.
    #[arg(long, value_name = "LIST", value_parser = crate::commands::parse_limit_list)]
    pub default_limits: Option<exec_server_protocol::types::ProcessLimits>,

    /// Ceilings (same syntax): a process whose request gives no value for
    /// one runs with the ceiling; a request may lower it, and one above it
    /// is refused (-32602 naming the member). Default: none.
    #[arg(long, value_name = "LIST", value_parser = crate::commands::parse_limit_list)]
    pub max_limits: Option<exec_server_protocol::types::ProcessLimits>,

    /// Most processes running at once across every session; a start past it
    /// is refused with a clear error (the server and its other processes are
    /// unaffected). Default: no cap.
    #[arg(long, value_name = "N")]
    pub max_processes: Option<usize>,

    /// Most processes one session runs at once (same refusal).
    #[arg(long, value_name = "N")]
    pub max_session_processes: Option<usize>,

    /// File holding the operator credential (absolute path; read once,
    /// trimmed): a client that presents it may list every session's
    /// processes (`process/list` with `allSessions`; `exec-server ps`).
    /// Without it nobody sees another session's processes.
    #[arg(long, value_name = "ABS_PATH")]
    pub operator_token_file: Option<PathBuf>,

    /// SHA-256 of the token, 64 hex digits.
    #[arg(long, value_name = "HEX", requires = "ws_auth")]
    pub ws_token_sha256: Option<String>,

    /// File holding the HS256 secret for signed bearer tokens (absolute path,
    /// trimmed, at least 32 bytes).
    #[arg(long, value_name = "ABS_PATH", requires = "ws_auth")]
    pub ws_shared_secret_file: Option<PathBuf>,

    /// Required `iss` claim of signed bearer tokens.
    #[arg(long, value_name = "ISSUER", requires = "ws_shared_secret_file")]
    pub ws_issuer: Option<String>,

    /// Required `aud` claim (one of) of signed bearer tokens.
    #[arg(long, value_name = "AUDIENCE", requires = "ws_shared_secret_file")]
    pub ws_audience: Option<String>,

    /// Clock difference tolerated for `exp` and `nbf`, in seconds.
    #[arg(long, value_name = "SECONDS", requires = "ws_shared_secret_file")]
    pub ws_max_clock_skew_seconds: Option<u64>,

    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464; port
    /// 0 picks one, logged at info level as "metrics on http://…/metrics"). Off
    /// by default. A listener of its own, without authentication: keep it on
    /// loopback or a private network.
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    #[command(flatten)]
    pub remote: crate::executor::RemoteArgs,
}

/// `--default-limits` and `--max-limits` can hold here (each cap's
/// controller is available), and no default is above its ceiling.
fn server_limits_hold(
    defaults: &exec_server_protocol::types::ProcessLimits,
    ceilings: &exec_server_protocol::types::ProcessLimits,
    places: &exec_server::process::resources::Places,
) -> Result<(), String> {
    use exec_server::process::limits;
    for (flag, l) in [("--default-limits", defaults), ("--max-limits", ceilings)] {
        limits::validate(l, places).map_err(|e| format!("{flag}: {e}"))?;
    }
    limits::effective(Some(defaults), defaults, ceilings)
        .map(|_| ())
        .map_err(|e| format!("--default-limits: {e}"))
}

/// Runs the server until SIGTERM/SIGINT (or stdin EOF with --exit-on-stdin-close,
/// or the end of the single stdio connection). Returns the process exit code.
pub async fn run(args: ServeArgs) -> i32 {
    // SIGHUP would end the process by default. There is nothing to reload or
    // reopen (logs go to stderr, which journald or the parent owns; settings are
    // flags), so it is logged and otherwise ignored. Installed before the URL is
    // printed: a signal sent once a caller has read it must not kill the server.
    if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: ignored (nothing to reload)");
            }
        });
    }
    // SIGUSR2 asks for an upgrade; caught from the start, so it never ends
    // the server (its default action) where an upgrade cannot be done.
    let mut usr2 =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2()).ok();
    // The state a previous image of this process handed over (an upgrade):
    // its children are waited for again before anything else can reap them.
    let mut inherited = match exec_server::handover::restore::take() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("exec-server: cannot take over from the previous binary: {e}");
            return 1;
        }
    };
    if let Some(i) = inherited.as_mut() {
        if let Err(e) = i.adopt_children() {
            eprintln!("exec-server: cannot wait for the previous binary's processes: {e}");
            return 1;
        }
    }
    // This binary's path as started: `exec-server upgrade` and SIGUSR2
    // re-read it from disk.
    let own_path = std::env::current_exe().unwrap_or_default();
    let addr: ListenAddr = match args.listen.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("exec-server: {e}");
            return 2;
        }
    };
    if args.linux_sandbox_transparent_tcp
        && !exec_server::network::TransparentTcpConfig::supported()
    {
        eprintln!(
            "exec-server: --linux-sandbox-transparent-tcp needs Linux 5.9 or later (seccomp user \
             notification); every managed sandbox would fail to start here"
        );
        return 2;
    }
    let (default_limits, max_limits) = (
        args.default_limits.clone().unwrap_or_default(),
        args.max_limits.clone().unwrap_or_default(),
    );
    let operator_token =
        match crate::credentials::operator_token_from(args.operator_token_file.as_deref()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("exec-server: {e}");
                return 2;
            }
        };
    let auth = match crate::credentials::auth_from(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("exec-server: {e}");
            return 2;
        }
    };

    let mut netproxy_upstream_roots = Vec::new();
    for p in &args.netproxy_upstream_root {
        match std::fs::read_to_string(p).map(|t| exec_server::netproxy_pem_certificates(&t)) {
            Ok(certs) if !certs.is_empty() => netproxy_upstream_roots.extend(certs),
            Ok(_) => {
                eprintln!("exec-server: {}: no PEM certificate", p.display());
                return 2;
            }
            Err(e) => {
                eprintln!("exec-server: {}: {e}", p.display());
                return 2;
            }
        }
    }
    // Not dumpable: a command of the same user (say one under a full-write
    // policy, which runs without namespaces) must not read this server's
    // environment or memory (masked secrets live there) through /proc.
    // Children are dumpable again after their exec.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // Bound before the state, so the proxies it starts know this server's
    // own ports (never reachable through them).
    let metrics = match args.metrics_listen {
        Some(addr) => match exec_server::metrics::MetricsListener::bind(addr).await {
            Ok(l) => Some((l, addr)),
            Err(e) => {
                eprintln!("exec-server: cannot listen for metrics on {addr}: {e}");
                return 1;
            }
        },
        None => None,
    };
    let handed = inherited.as_mut().and_then(|i| i.take_listener());
    let listener = if args.remote.remote.is_some() {
        None
    } else if let Some((fd, kind, url)) = handed {
        match listen::Listener::inherited(fd, &kind, &url) {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("exec-server: {e}");
                return 1;
            }
        }
    } else {
        match listen::bind(&addr).await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("exec-server: cannot listen on {}: {e}", args.listen);
                return 1;
            }
        }
    };
    let reserved_ports = listener
        .iter()
        .filter_map(|l| l.tcp_port())
        .chain(
            metrics
                .iter()
                .filter_map(|(l, _)| l.local_addr().ok().map(|a| a.port())),
        )
        .collect();
    let mut inherited_url = false;
    let mut remote_credential = None;
    let config = ServerConfig {
        concurrent_requests: args.concurrent_requests.max(1),
        detached_session_ttl: Duration::from_secs(args.detached_session_ttl),
        auth,
        operator_token,
        limit_grace: args.limit_grace,
        max_processes: args.max_processes,
        max_session_processes: args.max_session_processes,
        default_limits,
        max_limits,
        process_cgroups: args.process_cgroups != ProcessCgroups::Off,
        warm_sandboxes: args.warm_sandboxes,
        max_connections: args.max_connections.max(1),
        max_message_bytes: args.max_message_bytes.max(1024),
        max_http_body_bytes: args.max_http_body_bytes,
        allow_unsandboxed: args.allow_unsandboxed,
        transparent_tcp: exec_server::network::TransparentTcpConfig {
            default_on: args.linux_sandbox_transparent_tcp,
            upstream_proxy: args.tcp_upstream_proxy.clone(),
        },
        sandbox_helper: std::env::current_exe().ok(),
        prepend_path: args.prepend_path.clone(),
        netproxy_upstream_roots,
        output_spool: Some(exec_server::OutputSpoolConfig {
            dir: args.output_spool_dir.clone(),
            per_process_bytes: args.output_spool_bytes,
            total_bytes: args.output_spool_total_bytes,
            per_session_bytes: args.output_spool_session_bytes,
        }),
        reap_orphans: true,
        output_sinks: None,
        reserved_ports,
        hidden_paths: match &addr {
            ListenAddr::Unix(p) => vec![p.clone()],
            _ => Vec::new(),
        },
    };
    let state = match ServerState::new_inherited(config.clone(), inherited.as_mut()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("exec-server: cannot start: {e}");
            return 1;
        }
    };
    // A cap's availability is known once the server's cgroups are made.
    if let Err(e) = server_limits_hold(
        &state.config.default_limits,
        &state.config.max_limits,
        state.host.cgroups.places(),
    ) {
        eprintln!("exec-server: {e}");
        state.shutdown();
        return 2;
    }
    if let Some(mut i) = inherited.take() {
        let control = i.take_control();
        let (began, refused) = (i.began_ms(), i.refused().map(str::to_string));
        tracing::info!(
            from = i.written_by(),
            "taking over from the previous binary"
        );
        remote_credential = i.take_remote_credential();
        let adopted = state.adopt(i).await;
        crate::upgrade::report(control, began, refused.as_deref(), &adopted);
        inherited_url = true;
    }
    if let Some((listener, addr)) = metrics {
        let url = format!("http://{}/metrics", listener.local_addr().unwrap_or(addr));
        tracing::info!("metrics on {url}");
        warn_unless_loopback(
            addr.ip(),
            &format!("serving metrics on {url}"),
            "without authentication",
            "read them",
        );
        tokio::spawn(exec_server::metrics::serve(listener, state.clone()));
    }
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("exec-server: cannot handle SIGTERM: {e}");
            return 1;
        }
    };
    let unix_path = match &addr {
        ListenAddr::Unix(p) => Some(p.clone()),
        _ => None,
    };
    // What serves (the listener, or the remote executor), and what an
    // upgrade hands over of it.
    let mut target = crate::upgrade::Target::default();
    let serving: std::pin::Pin<Box<dyn std::future::Future<Output = i32> + Send>> = match listener {
        Some(listener) => {
            announce(&listener, &addr, config.auth.is_none(), inherited_url);
            target.listener = listener.handover();
            let state = state.clone();
            Box::pin(async move {
                listen::serve(listener, state).await;
                tracing::info!("connection ended");
                0
            })
        }
        None => match crate::executor::prepare(&args.remote, state.clone(), remote_credential) {
            Ok((running, credential)) => {
                target.remote_credential = Some(credential);
                Box::pin(running)
            }
            Err(code) => {
                state.shutdown();
                return code;
            }
        },
    };
    let stdin_closed = async {
        let listening = args.remote.remote.is_none() && !matches!(addr, ListenAddr::Stdio);
        if args.exit_on_stdin_close && listening {
            use tokio::io::AsyncReadExt;
            let mut stdin = tokio::io::stdin();
            let mut buf = [0u8; 1024];
            while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        } else {
            std::future::pending::<()>().await;
        }
    };
    let control = target
        .upgradable()
        .then(crate::upgrade::Control::bind)
        .flatten();
    tokio::pin!(stdin_closed);
    let mut serving = serving;
    let code = loop {
        let (binary, reply) = tokio::select! {
            code = &mut serving => break code,
            _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); break 0 }
            _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT: shutting down"); break 0 }
            _ = &mut stdin_closed => { tracing::info!("stdin closed: shutting down"); break 0 }
            Some(()) = crate::upgrade::recv_opt(&mut usr2) => (None, None),
            (binary, reply) = crate::upgrade::accept_opt(control.as_ref(), &state) => (binary, Some(reply)),
        };
        if !target.upgradable() {
            tracing::warn!(
                "upgrade asked for, but a stdio server's one connection cannot be handed over"
            );
            continue;
        }
        tracing::info!("upgrade asked for");
        crate::upgrade::perform(&state, binary, &own_path, &target, reply).await;
    };
    drop(control);
    state.shutdown();
    if let Some(p) = unix_path {
        let _ = std::fs::remove_file(p);
    }
    code
}

/// Prints the URL (the only stdout line; not again after an upgrade) and
/// warns about a listener others can reach without authentication.
fn announce(listener: &listen::Listener, addr: &ListenAddr, no_auth: bool, inherited: bool) {
    if !matches!(addr, ListenAddr::Stdio) && !inherited {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", listener.url());
        let _ = out.flush();
    }
    tracing::info!("listening on {}", listener.url());
    if let (ListenAddr::WebSocket(a), true) = (addr, no_auth) {
        warn_unless_loopback(
            a.ip(),
            &format!("listening on {}", listener.url()),
            "without --ws-auth",
            "run commands as this user",
        );
    }
}

/// Warns (at `warn`, so on stderr with the default filter) that `what`, a
/// listener on `ip` with no authentication (`unguarded` says which is
/// missing), lets anyone who can reach it `can`, unless `ip` is a loopback
/// address, which only this machine reaches. One text for every listener
/// (`--listen`, `--metrics-listen`), so operators find them alike.
fn warn_unless_loopback(ip: std::net::IpAddr, what: &str, unguarded: &str, can: &str) {
    if !ip.is_loopback() {
        tracing::warn!("{what} {unguarded}: anyone who can reach it can {can}");
    }
}

/// `--tcp-upstream-proxy`: `HOST:PORT` with a nonzero port (IPv6 in brackets).
fn parse_host_port(s: &str) -> Result<String, String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not HOST:PORT"))?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 && !host.is_empty() => Ok(s.to_string()),
        _ => Err(format!(
            "{s:?} is not HOST:PORT with a port from 1 to 65535"
        )),
    }
}
