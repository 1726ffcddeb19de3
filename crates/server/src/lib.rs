//! The exec-server: runs processes, file operations and HTTP requests for a
//! remote client over the JSON-RPC dialect of the Codex CLI's `exec-server`
//! (0.169.0), on WebSocket, stdio or a Unix socket.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use exec_server::{listen, ServerConfig, ServerState};
//! let state = ServerState::new(ServerConfig::default())?;
//! let listener = listen::bind(&"ws://127.0.0.1:0".parse().unwrap()).await?;
//! println!("{}", listener.url()); // ws://127.0.0.1:PORT
//! listen::serve(listener, state).await;
//! # Ok(()) }
//! ```
//!
//! Layers: [`listen`] accepts connections (and checks `Origin` and bearer tokens),
//! [`connection`] runs one connection's handshake and dispatch, [`handlers`] maps
//! methods to the [`session`], [`process`], [`fs`], [`http`] and [`discovery`]
//! modules that do the work.
#![deny(missing_docs)]

pub mod auth;
pub mod connection;
pub mod discovery;
pub mod env_info;
pub mod error;
pub mod fs;
pub mod handlers;
pub mod handover;
pub mod http;
pub mod launcher;
pub mod link;
pub mod listen;
pub mod metrics;
pub mod network;
pub mod process;
pub mod reaper;
pub mod rundir;
pub mod sandbox;
pub mod session;

use exec_server_protocol::types::EnvironmentInfo;
use exec_server_rpc::router::{Mode, Router};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use network::masking::pem_certificates as netproxy_pem_certificates;

/// Default for `--max-connections`: 4096 concurrent connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default for `--warm-sandboxes`: 8 sandboxes prepared ahead (2 for each of 4 policies).
pub const DEFAULT_WARM_SANDBOXES: usize = 8;
pub use exec_server_protocol::MAX_MESSAGE_BYTES;
pub use process::sink::OutputSinks;

/// Server settings.
#[derive(Clone)]
pub struct ServerConfig {
    /// `--concurrent-requests`: above 1, file system requests of one connection
    /// run concurrently. Process requests keep arrival order at any setting, and
    /// long-polls never block other requests.
    pub concurrent_requests: usize,
    /// How long a detached session is kept ([`session::DETACHED_SESSION_TTL`]).
    pub detached_session_ttl: Duration,
    /// WebSocket upgrade authentication.
    pub auth: Option<auth::WsAuth>,
    /// Most concurrent connections; more are refused with HTTP 503.
    pub max_connections: usize,
    /// Largest WebSocket message in bytes.
    pub max_message_bytes: usize,
    /// Largest buffered `http/request` response body in bytes
    /// ([`http::DEFAULT_MAX_BUFFERED_HTTP_BODY_BYTES`]); streamed bodies are not capped.
    pub max_http_body_bytes: usize,
    /// Where a `sandbox` cannot be enforced on this host (no `bwrap`, no
    /// helper), run the request unconfined with `sandboxType: "none"` instead
    /// of refusing it. No effect where enforcement is possible.
    pub allow_unsandboxed: bool,
    /// This server's executable, re-executed as the sandbox's inner stage and
    /// file-system helper; `None` (the default, e.g. an embedded server):
    /// sandboxed requests are refused unless `allow_unsandboxed`.
    pub sandbox_helper: Option<std::path::PathBuf>,
    /// `--prepend-path`: directories reported as `prependPathDirs` (see
    /// [`env_info::prepend_path_dirs`]; empty: found automatically).
    pub prepend_path: Vec<std::path::PathBuf>,
    /// The disk spool for output beyond the memory window; `None` disables it
    /// (output past [`process::output_log::RETAINED_OUTPUT_BYTES_PER_PROCESS`]
    /// is then dropped once delivered, as in the reference).
    pub output_spool: Option<OutputSpoolConfig>,
    /// `--netproxy-upstream-root PEM`: certificates (DER) the managed network
    /// proxy trusts for upstream TLS besides the Mozilla roots, when it
    /// intercepts for credential masking. For tests whose fake upstream has
    /// a test CA; empty in production.
    pub netproxy_upstream_roots: Vec<Vec<u8>>,
    /// The managed network's transparent TCP (`--linux-sandbox-transparent-tcp`,
    /// `--tcp-upstream-proxy`).
    pub transparent_tcp: network::TransparentTcpConfig,
    /// This server's own paths that no sandbox may see or reach, besides
    /// the ones it knows itself (its spool and runtime directories): the
    /// CLI adds its `unix://` listen socket. Default: none.
    pub hidden_paths: Vec<std::path::PathBuf>,
    /// Make this process a child subreaper that reaps every orphan and, at
    /// shutdown, kills every descendant (the `exec-server` binary, which owns
    /// all of them). Off (the default) for a server embedded in another
    /// program: it then waits for the children it started, nothing else, and
    /// its host keeps its own children's exit statuses. Process-wide: once a
    /// server turned it on, it stays on.
    pub reap_orphans: bool,
    /// This server's own TCP listen ports (WebSocket, metrics; the CLI sets
    /// them once bound): a managed proxy refuses a local destination on one
    /// of them even where local binding is allowed, so no command reaches
    /// this server through its proxy. Default: none.
    pub reserved_ports: Vec<u16>,
    /// `--operator-token-file`: the credential that lets `process/list`
    /// show every session's processes (`allSessions`). `None` (the
    /// default): nobody sees another session's processes.
    pub operator_token: Option<String>,
    /// `--limit-grace`: how long a process a limit ended has between SIGTERM
    /// and SIGKILL ([`process::limits::DEFAULT_KILL_GRACE`]).
    pub limit_grace: Duration,
    /// `--max-processes`: most processes running at once across every
    /// session; a start past it is refused (`limitReached`). `None`: no cap.
    pub max_processes: Option<usize>,
    /// `--max-session-processes`: most processes one session runs at once.
    pub max_session_processes: Option<usize>,
    /// `--default-limits`: the `limits` a start runs with for each member
    /// it does not give. Default: none.
    pub default_limits: exec_server_protocol::types::ProcessLimits,
    /// `--process-cgroups`: a cgroup per process where the OS allows
    /// (tree kill that takes double-forked daemons along; memory, task and
    /// CPU caps). Default: on.
    pub process_cgroups: bool,
    /// `--warm-sandboxes`: most sandboxes kept prepared ahead for the next
    /// sandboxed starts ([`process::warm`]); 0 turns them off. Default:
    /// [`DEFAULT_WARM_SANDBOXES`].
    pub warm_sandboxes: usize,
    /// `--max-limits`: the most each member of `limits` may be; a start
    /// that gives none runs with the ceiling, one above it is refused.
    /// Default: none.
    pub max_limits: exec_server_protocol::types::ProcessLimits,
    /// Output sinks an embedder in this process offers for its own starts
    /// ([`process::sink`]): their pipe output is spliced into its pipes
    /// instead of sent. Default: none.
    pub output_sinks: Option<Arc<process::sink::OutputSinks>>,
}

/// Settings of the output spool (see [`process::spool`]).
#[derive(Clone, Debug)]
pub struct OutputSpoolConfig {
    /// `--output-spool-dir`; `None`: [`process::spool::SpoolConfig::default_dir`],
    /// and a default directory that cannot be used only disables the spool
    /// (with a warning) where an explicit one stops the server from starting.
    pub dir: Option<std::path::PathBuf>,
    /// `--output-spool-bytes`: most output bytes spooled per process.
    pub per_process_bytes: u64,
    /// `--output-spool-total-bytes`: most output bytes spooled across the server.
    pub total_bytes: u64,
    /// `--output-spool-session-bytes`: most output bytes spooled across one
    /// session's processes.
    pub per_session_bytes: u64,
}

impl Default for OutputSpoolConfig {
    fn default() -> Self {
        OutputSpoolConfig {
            dir: None,
            per_process_bytes: process::spool::DEFAULT_SPOOL_BYTES_PER_PROCESS,
            total_bytes: process::spool::DEFAULT_SPOOL_TOTAL_BYTES,
            per_session_bytes: process::spool::DEFAULT_SPOOL_SESSION_BYTES,
        }
    }
}

impl OutputSpoolConfig {
    /// Opens the spool directory. Errors only for an explicit directory.
    fn open(&self) -> std::io::Result<Option<Arc<process::spool::SpoolConfig>>> {
        if self.per_process_bytes == 0 || self.total_bytes == 0 {
            return Ok(None);
        }
        let dir = self
            .dir
            .clone()
            .unwrap_or_else(process::spool::SpoolConfig::default_dir);
        match process::spool::SpoolConfig::new(
            &dir,
            self.per_process_bytes,
            self.per_session_bytes,
            self.total_bytes,
        ) {
            Ok(c) => Ok(Some(c)),
            Err(e) if self.dir.is_none() => {
                tracing::warn!("output spool disabled: {e}");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            concurrent_requests: 1,
            detached_session_ttl: session::DETACHED_SESSION_TTL,
            auth: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_message_bytes: MAX_MESSAGE_BYTES,
            max_http_body_bytes: http::DEFAULT_MAX_BUFFERED_HTTP_BODY_BYTES,
            allow_unsandboxed: false,
            sandbox_helper: None,
            prepend_path: Vec::new(),
            output_spool: Some(OutputSpoolConfig::default()),
            netproxy_upstream_roots: Vec::new(),
            transparent_tcp: network::TransparentTcpConfig::default(),
            hidden_paths: Vec::new(),
            reap_orphans: false,
            reserved_ports: Vec::new(),
            operator_token: None,
            limit_grace: process::limits::DEFAULT_KILL_GRACE,
            max_processes: None,
            max_session_processes: None,
            default_limits: Default::default(),
            process_cgroups: true,
            warm_sandboxes: DEFAULT_WARM_SANDBOXES,
            max_limits: Default::default(),
            output_sinks: None,
        }
    }
}

/// Everything connections share.
pub struct ServerState {
    /// Settings.
    pub config: ServerConfig,
    /// Sessions.
    pub sessions: Arc<session::SessionRegistry>,
    /// `environment/info`, computed once.
    pub env_info: EnvironmentInfo,
    /// The same, encoded as JSON once.
    pub env_info_json: String,
    /// Method table.
    pub router: Router<connection::Ctx>,
    /// HTTP clients for `http/request`.
    pub http: http::HttpClients,
    /// What sandboxes this server can enforce.
    pub sandbox: sandbox::Support,
    /// The output spool, when enabled.
    pub spool: Option<Arc<process::spool::SpoolConfig>>,
    /// This server's runtime directory (the managed proxy's per-process
    /// sockets), made at start; the error says why it could not be.
    runtime_dir: Result<rundir::RuntimeDir, String>,
    next_connection: AtomicU64,
    /// Processes that have not exited, across sessions (`--max-processes`).
    pub(crate) live_processes: process::live::LiveCount,
    /// What its processes share: tool directories and cgroups.
    pub host: process::Host,
}

impl ServerState {
    /// Builds the state and starts the child reaper. Must run inside a Tokio runtime.
    pub fn new(config: ServerConfig) -> std::io::Result<Arc<Self>> {
        Self::new_inherited(config, None)
    }

    /// [`ServerState::new`] for the image an upgrade started: it keeps the
    /// previous image's runtime directory and cgroups (its processes stay
    /// in them). Call [`handover::restore::Inherited::adopt_children`]
    /// first, then [`ServerState::adopt`].
    pub fn new_inherited(
        config: ServerConfig,
        mut inherited: Option<&mut handover::restore::Inherited>,
    ) -> std::io::Result<Arc<Self>> {
        reaper::install(config.reap_orphans)?;
        let spool = match &config.output_spool {
            Some(c) => c.open()?,
            None => None,
        };
        let run_base = rundir::RuntimeDir::base();
        let kept_dir = inherited.as_mut().and_then(|i| i.take_runtime_dir());
        let runtime_dir = match kept_dir {
            Some(d) => Ok(d),
            None => rundir::RuntimeDir::create(&run_base).map_err(|e| {
                tracing::warn!("no runtime directory: {e}");
                format!("{}: {e}", run_base.display())
            }),
        };
        let mut hidden = config.hidden_paths.clone();
        hidden.push(run_base);
        hidden.extend(spool.as_ref().map(|s| s.dir().to_path_buf()));
        let sandbox = sandbox::Support::new(
            config.sandbox_helper.clone(),
            config.allow_unsandboxed,
            hidden,
        );
        let cgroups = process::cgroup::Cgroups::adopt(
            config.process_cgroups,
            inherited.as_ref().and_then(|i| i.cgroups()),
        );
        let env_info =
            env_info::environment_info(sandbox.enforced(), cgroups.places(), &config.prepend_path);
        let host = process::Host {
            tool_dirs: env_info
                .prepend_path_dirs
                .iter()
                .filter_map(|d| d.to_path().ok())
                .collect(),
            cgroups,
            handover: Default::default(),
            warm: process::warm::Pool::new(config.warm_sandboxes),
            output_sinks: config.output_sinks.clone(),
        };
        let fs_mode = if config.concurrent_requests > 1 {
            Mode::Detached
        } else {
            Mode::Inline
        };
        Ok(Arc::new(ServerState {
            spool,
            runtime_dir,
            sessions: Arc::new(session::SessionRegistry::new(config.detached_session_ttl)),
            env_info_json: serde_json::to_string(&env_info).map_err(std::io::Error::other)?,
            env_info,
            router: handlers::router(fs_mode),
            http: http::HttpClients::new(config.max_http_body_bytes)
                .map_err(std::io::Error::other)?,
            next_connection: AtomicU64::new(1),
            live_processes: Default::default(),
            host,
            sandbox,
            config,
        }))
    }

    /// This server's runtime directory. Errors: why it could not be made
    /// at start (a routed sandbox then cannot start).
    pub fn runtime_dir(&self) -> std::io::Result<&std::path::Path> {
        match &self.runtime_dir {
            Ok(d) => Ok(d.path()),
            Err(e) => Err(std::io::Error::other(format!(
                "this server has no runtime directory ({e})"
            ))),
        }
    }

    /// A fresh connection id.
    pub fn next_connection_id(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }

    /// Kills every process tree of every session, and every other descendant of
    /// this process (orphans re-parented to it). Used at shutdown.
    pub fn shutdown(&self) {
        self.sessions.shutdown_all();
        if reaper::reaping_orphans() {
            // Only where this process owns every descendant (the binary):
            // an embedding program's own children are not ours to kill.
            process::kill::kill_all_descendants();
        }
        self.host.warm.close();
        self.host.cgroups.kill_all_and_remove();
        exec_server_sandbox::protect::release_all();
    }
}
