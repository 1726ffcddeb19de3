//! Client subcommands: `run`, `shell`, `fs`, `info`.

use clap::{Args, Subcommand};
use exec_server_client::{ClientOptions, ExecServerClient, ProcessEvent, Source};
use exec_server_protocol::types::{
    EnvInherit, EnvPolicy, ExecParams, OutputStream, ProcessSignal, PtySize,
};
use exec_server_protocol::PathUri;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// How to reach a server (shared by client subcommands).
#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Server URL: ws://HOST:PORT, wss://…, or unix:///path. Without it, an
    /// embedded server runs in this process (this machine, full protocol, no socket).
    #[arg(long, env = "EXEC_SERVER_URL", value_name = "URL", global = true)]
    pub connect: Option<String>,
    /// File holding a bearer token for --ws-auth servers (or set EXEC_SERVER_TOKEN);
    /// with --registry, the registry token (or set CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN).
    #[arg(long, value_name = "PATH", global = true)]
    pub token_file: Option<PathBuf>,
    /// Reach an environment through this registry and relay (remote mode).
    #[arg(
        long,
        value_name = "URL",
        global = true,
        requires = "environment",
        conflicts_with = "connect"
    )]
    pub registry: Option<String>,
    /// The environment id to reach with --registry.
    #[arg(long, value_name = "ID", global = true, requires = "registry")]
    pub environment: Option<String>,
}

impl ConnectArgs {
    fn client(&self, name: &str) -> Result<ExecServerClient, String> {
        let token = match &self.token_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))?
                    .trim()
                    .to_string(),
            ),
            None => std::env::var("EXEC_SERVER_TOKEN").ok(),
        };
        let source = match (&self.registry, &self.connect) {
            (Some(registry), _) => crate::executor::relay_source(
                registry,
                self.environment.as_deref(),
                &self.token_file,
            )?,
            (None, Some(url)) => Source::from_url(url, token)?,
            (None, None) => {
                Source::embedded().map_err(|e| format!("cannot start the embedded server: {e}"))?
            }
        };
        let mut opts = ClientOptions::new(source);
        opts.client_name = name.into();
        Ok(ExecServerClient::new(opts))
    }
}

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
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `shell` flags.
#[derive(Args, Debug)]
pub struct ShellArgs {
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// Working directory on the server.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
}

/// `fs` subcommands. Remote paths are absolute, file: URIs, or relative to the
/// server's working directory.
#[derive(Subcommand, Debug)]
pub enum FsCommand {
    /// List a directory (directories end with /).
    Ls { path: String },
    /// Print a file to stdout (streamed in 1 MiB blocks).
    Cat { path: String },
    /// Upload a local file (streamed).
    Put { local: PathBuf, remote: String },
    /// Download a remote file (streamed; `-` writes to stdout; an existing local
    /// file is replaced only once the download succeeded).
    Get { remote: String, local: PathBuf },
    /// Show metadata as JSON.
    Stat { path: String },
    /// Remove a file or directory (directories need -r).
    Rm {
        /// Remove directories and their content.
        #[arg(short, long)]
        recursive: bool,
        /// A missing path is not an error.
        #[arg(short, long)]
        force: bool,
        path: String,
    },
    /// Create a directory (-p: with parents, existing is fine).
    Mkdir {
        #[arg(short, long)]
        parents: bool,
        path: String,
    },
    /// Copy on the server (-r for directories).
    Cp {
        #[arg(short, long)]
        recursive: bool,
        from: String,
        to: String,
    },
}

/// `fs` flags.
#[derive(Args, Debug)]
pub struct FsArgs {
    #[command(flatten)]
    pub conn: ConnectArgs,
    #[command(subcommand)]
    pub command: FsCommand,
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("exec-server: {msg}");
    1
}

/// Adds what to do next to errors a user can fix.
fn explain(e: &exec_server_client::ClientError) -> String {
    let text = e.to_string();
    if text.contains("401") {
        return format!("{text}\n  the server requires a bearer token: pass --token-file PATH or set EXEC_SERVER_TOKEN (or the token given is wrong)");
    }
    if text.contains("TLS") {
        return format!("{text}\n  use ws:// for a plain server, or check the wss:// certificate");
    }
    if text.contains("Connection refused") {
        return format!("{text}\n  is a server running there? start one with: exec-server --listen ws://127.0.0.1:PORT");
    }
    text
}

async fn server_cwd(client: &ExecServerClient) -> Result<PathBuf, String> {
    let info = client.environment_info().await.map_err(|e| e.to_string())?;
    info.cwd
        .and_then(|c| c.to_path().ok())
        .ok_or_else(|| "the server did not report its working directory".to_string())
}

async fn remote_path(client: &ExecServerClient, p: &str) -> Result<PathUri, String> {
    if p.starts_with("file:") {
        return PathUri::parse(p);
    }
    let path = Path::new(p);
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        server_cwd(client).await?.join(path)
    };
    PathUri::from_path(&abs).ok_or_else(|| format!("`{p}` is not a valid path"))
}

fn terminal_size() -> Option<PtySize> {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills a winsize that lives for the call.
    let r = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0).then_some(PtySize {
        cols: ws.ws_col,
        rows: ws.ws_row,
    })
}

/// Puts the local terminal in raw mode and restores it on drop.
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enter() -> RawMode {
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

struct Spec {
    argv: Vec<String>,
    cwd: Option<String>,
    env: Vec<String>,
    clean_env: bool,
    tty: bool,
}

/// `run`: returns the remote exit code (128+N for signal N).
pub async fn run(args: RunArgs) -> i32 {
    let client = match args.conn.client("exec-server run") {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let spec = Spec {
        argv: args.command,
        cwd: args.cwd,
        env: args.env,
        clean_env: args.clean_env,
        tty: args.tty,
    };
    execute(client, spec).await
}

/// `shell`: an interactive login shell on a PTY, like `ssh -t`.
pub async fn shell(args: ShellArgs) -> i32 {
    let client = match args.conn.client("exec-server shell") {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let shell = match client.environment_info().await {
        Ok(i) => i.shell.path,
        Err(e) => return fail(explain(&e)),
    };
    let spec = Spec {
        argv: vec![shell, "-l".into()],
        cwd: args.cwd,
        env: vec![],
        clean_env: false,
        tty: true,
    };
    execute(client, spec).await
}

async fn execute(client: ExecServerClient, spec: Spec) -> i32 {
    let cwd = match &spec.cwd {
        Some(c) => match remote_path(&client, c).await {
            Ok(u) => u,
            Err(e) => return fail(e),
        },
        None => match server_cwd(&client).await.map(|p| PathUri::from_path(&p)) {
            Ok(Some(u)) => u,
            Ok(None) => return fail("server cwd is not absolute"),
            Err(e) => return fail(e),
        },
    };
    let mut set = BTreeMap::new();
    for kv in &spec.env {
        match kv.split_once('=') {
            Some((k, v)) => {
                set.insert(k.to_string(), v.to_string());
            }
            None => return fail(format!("--env takes K=V, got `{kv}`")),
        }
    }
    if spec.tty && !set.contains_key("TERM") {
        set.insert(
            "TERM".into(),
            std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into()),
        );
    }
    let env_policy = (!spec.clean_env).then(|| EnvPolicy {
        inherit: EnvInherit::All,
        ignore_default_excludes: false,
        exclude: vec![],
        set: BTreeMap::new(),
        include_only: vec![],
    });
    let process_id = format!(
        "run-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0)
    );
    let mut params = ExecParams::new(process_id, spec.argv, cwd, set);
    params.tty = spec.tty;
    params.pipe_stdin = true;
    params.env_policy = env_policy;
    params.pty_size = if spec.tty { terminal_size() } else { None };
    let program = params.argv[0].clone();
    let cwd_text = params
        .cwd
        .to_path()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut proc = match client.start_process(params).await {
        Ok(p) => p,
        Err(exec_server_client::ClientError::Server(e)) if e.message.contains("os error 2") => {
            eprintln!("exec-server: cannot start `{program}` in {cwd_text}: {} (is the program on PATH, and does the directory exist?)", e.message);
            return 127;
        }
        Err(exec_server_client::ClientError::Server(e)) if e.message.contains("os error 13") => {
            eprintln!("exec-server: cannot start `{program}`: {}", e.message);
            return 126;
        }
        Err(e) => return fail(explain(&e)),
    };
    let raw = if spec.tty {
        RawMode::enter()
    } else {
        RawMode(None)
    };

    // Local stdin → remote stdin, then end of file.
    let stdin_client = client.clone();
    let stdin_id = proc.id.clone();
    let stdin_task = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if stdin_client
                        .write_process(&stdin_id, buf[..n].to_vec())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        let _ = stdin_client.close_stdin(&stdin_id).await;
    });

    // Ctrl-C → interrupt (a second one kills); window size changes → resize.
    let sig_client = client.clone();
    let sig_id = proc.id.clone();
    let tty = spec.tty;
    let signal_task = tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut winch), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::window_change()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        let mut interrupts = 0;
        loop {
            tokio::select! {
                _ = int.recv() => {
                    interrupts += 1;
                    if interrupts == 1 {
                        let _ = sig_client.signal(&sig_id, ProcessSignal::Interrupt).await;
                    } else {
                        let _ = sig_client.terminate(&sig_id).await;
                    }
                }
                _ = term.recv() => { let _ = sig_client.terminate(&sig_id).await; }
                _ = winch.recv() => {
                    if tty {
                        if let Some(s) = terminal_size() {
                            let _ = sig_client.resize(&sig_id, s.cols, s.rows).await;
                        }
                    }
                }
            }
        }
    });

    let mut code = None;
    let mut failure = None;
    {
        let stdout = std::io::stdout();
        let stderr = std::io::stderr();
        while let Some(ev) = proc.next_event().await {
            match ev {
                ProcessEvent::Output { stream, data, .. } => {
                    let r = match stream {
                        OutputStream::Stderr => stderr.lock().write_all(&data),
                        _ => {
                            let mut out = stdout.lock();
                            out.write_all(&data).and_then(|_| out.flush())
                        }
                    };
                    if r.is_err() {
                        // Local stdout closed (e.g. `| head`): stop the remote command.
                        let _ = proc.terminate().await;
                    }
                }
                ProcessEvent::Exited { code: c, .. } => code = Some(c),
                ProcessEvent::Closed { .. } => break,
                ProcessEvent::Failed(why) => {
                    failure = Some(why);
                    break;
                }
            }
        }
        let _ = stdout.lock().flush();
    }
    stdin_task.abort();
    signal_task.abort();
    drop(raw);
    if let Some(why) = failure {
        let _ = proc.terminate().await;
        return fail(why);
    }
    code.unwrap_or(1)
}

/// `info`: prints `environment/info` as JSON.
pub async fn info(conn: ConnectArgs) -> i32 {
    let client = match conn.client("exec-server info") {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    match client.environment_info().await {
        Ok(i) => {
            println!("{}", serde_json::to_string_pretty(&i).unwrap_or_default());
            0
        }
        Err(e) => fail(explain(&e)),
    }
}

/// `fs …`.
pub async fn fs(args: FsArgs) -> i32 {
    let client = match args.conn.client("exec-server fs") {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    match fs_inner(&client, args.command).await {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

async fn fs_inner(c: &ExecServerClient, cmd: FsCommand) -> Result<(), String> {
    let s = |e: exec_server_client::ClientError| explain(&e);
    match cmd {
        FsCommand::Ls { path } => {
            let p = remote_path(c, &path).await?;
            let mut entries = c.read_directory(&p).await.map_err(s)?;
            entries.sort_by(|a, b| a.file_name.cmp(&b.file_name));
            let mut out = std::io::stdout().lock();
            for e in entries {
                let _ = writeln!(
                    out,
                    "{}{}",
                    e.file_name,
                    if e.is_directory { "/" } else { "" }
                );
            }
        }
        FsCommand::Cat { path } => {
            let p = remote_path(c, &path).await?;
            let mut out = tokio::io::stdout();
            c.download(&p, &mut out).await.map_err(s)?;
        }
        FsCommand::Get { remote, local } => {
            let p = remote_path(c, &remote).await?;
            if local.as_os_str() == "-" {
                let mut out = tokio::io::stdout();
                c.download(&p, &mut out).await.map_err(s)?;
                return Ok(());
            }
            // Write beside the target and rename on success, so a failed download
            // never truncates an existing file.
            let name = local
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "download".into());
            let partial = local.with_file_name(format!(".{name}.partial-{}", std::process::id()));
            let mut f = tokio::fs::File::create(&partial)
                .await
                .map_err(|e| format!("{}: {e}", partial.display()))?;
            match c.download(&p, &mut f).await {
                Ok(n) => {
                    drop(f);
                    std::fs::rename(&partial, &local)
                        .map_err(|e| format!("{}: {e}", local.display()))?;
                    eprintln!("{n} bytes");
                }
                Err(e) => {
                    drop(f);
                    let _ = std::fs::remove_file(&partial);
                    return Err(s(e));
                }
            }
        }
        FsCommand::Put { local, remote } => {
            let p = remote_path(c, &remote).await?;
            let mut f = tokio::fs::File::open(&local)
                .await
                .map_err(|e| format!("{}: {e}", local.display()))?;
            let n = c.upload(&mut f, &p).await.map_err(s)?;
            eprintln!("{n} bytes");
        }
        FsCommand::Stat { path } => {
            let p = remote_path(c, &path).await?;
            let m = c.metadata(&p).await.map_err(s)?;
            println!("{}", serde_json::to_string_pretty(&m).unwrap_or_default());
        }
        FsCommand::Rm {
            recursive,
            force,
            path,
        } => {
            let p = remote_path(c, &path).await?;
            if !recursive {
                if let Ok(m) = c.metadata(&p).await {
                    if m.is_directory && !m.is_symlink {
                        return Err(format!("{path} is a directory (use -r)"));
                    }
                }
            }
            c.remove(&p, recursive, force).await.map_err(s)?;
        }
        FsCommand::Mkdir { parents, path } => {
            let p = remote_path(c, &path).await?;
            c.create_directory(&p, parents)
                .await
                .map_err(|e| match &e {
                    exec_server_client::ClientError::Server(err) if err.code == -32004 => {
                        format!(
                            "{path}: a parent directory does not exist (use -p to create parents)"
                        )
                    }
                    _ => s(e),
                })?;
        }
        FsCommand::Cp {
            recursive,
            from,
            to,
        } => {
            let (f, t) = (remote_path(c, &from).await?, remote_path(c, &to).await?);
            if !recursive
                && c.metadata(&f)
                    .await
                    .is_ok_and(|m| m.is_directory && !m.is_symlink)
            {
                return Err(format!("{from} is a directory (use -r)"));
            }
            c.copy(&f, &t, recursive).await.map_err(s)?;
        }
    }
    Ok(())
}
