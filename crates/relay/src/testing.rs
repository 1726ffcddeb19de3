//! Test support, not part of the API: a throwaway PostgreSQL for the
//! registry's database tests (here and in the CLI's integration tests), and
//! an echoing stream handler.
//! Debian's `postgresql` package provides it (`.ci/run` installs it); the
//! server runs as the `postgres` system user (it refuses root) in a new
//! temporary directory, on a Unix socket there only (no TCP), and is stopped
//! by PID and removed when dropped.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PORT: u16 = 5432;

/// A PostgreSQL server of the test's own, stopped (SIGINT: fast shutdown)
/// and removed when dropped.
pub struct TestPostgres {
    child: Child,
    /// The child is running (not yet stopped and waited for): only then is
    /// its PID ours to signal.
    running: bool,
    dir: PathBuf,
}

fn bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .filter(|b| b.join("postgres").exists())
        .expect("PostgreSQL is not installed: apt-get install postgresql (.ci/run does)")
}

fn postgres_user() -> (u32, u32) {
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .expect("no postgres system user (the postgresql package makes it)");
    (user.uid.as_raw(), user.gid.as_raw())
}

/// Starts `postgres` on the data in `dir`, its socket there, its log
/// appended to `dir/server.log`.
fn spawn_server(bin: &std::path::Path, dir: &std::path::Path, uid: u32, gid: u32) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .unwrap();
    let mut server = Command::new(bin.join("postgres"));
    server
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-k")
        .arg(dir)
        .args([
            "-c",
            "listen_addresses=",
            "-c",
            "fsync=off",
            "-p",
            &PORT.to_string(),
        ])
        .uid(uid)
        .gid(gid)
        .env("LC_ALL", "C")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(log);
    server.spawn().expect("start postgres")
}

impl TestPostgres {
    /// Starts a fresh server (initdb into a new temporary directory).
    ///
    /// Panics (it is for tests) when PostgreSQL is not installed or does
    /// not start within 30 s, with its log.
    pub fn start() -> TestPostgres {
        let bin = bin_dir();
        let (uid, gid) = postgres_user();
        let dir = std::env::temp_dir().join(format!("relay-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        let data = dir.join("data");
        let as_postgres = |cmd: &mut Command| {
            cmd.uid(uid).gid(gid).env("LC_ALL", "C").current_dir(&dir);
        };
        let mut init = Command::new(bin.join("initdb"));
        init.args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data)
            .stdout(Stdio::null());
        as_postgres(&mut init);
        let out = init.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let child = spawn_server(&bin, &dir, uid, gid);
        let db = TestPostgres {
            child,
            running: true,
            dir,
        };
        db.wait_ready();
        db
    }

    /// Stops the server (fast shutdown) and waits for it to exit; its data
    /// stays, for [`TestPostgres::start_again`].
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        // The server this test started and has not reaped yet.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        let _ = self.child.wait();
        self.running = false;
    }

    /// Starts the stopped server again on the same data and socket, and
    /// waits until it accepts connections.
    pub fn start_again(&mut self) {
        let (uid, gid) = postgres_user();
        self.stop();
        self.child = spawn_server(&bin_dir(), &self.dir, uid, gid);
        self.running = true;
        self.wait_ready();
    }

    /// Waits (at most 30 s, else panics with the log) until the server
    /// accepts connections.
    fn wait_ready(&self) {
        let socket = self.dir.join(format!(".s.PGSQL.{PORT}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "postgres did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The socket exists a moment before connections are accepted.
        let ready = || {
            Command::new(bin_dir().join("pg_isready"))
                .arg("-q")
                .arg("-h")
                .arg(&self.dir)
                .args(["-p", &PORT.to_string()])
                .status()
                .is_ok_and(|s| s.success())
        };
        while !ready() {
            assert!(
                Instant::now() < deadline,
                "postgres not ready: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A libpq URL for it (`postgresql:///postgres?host=DIR&port=…`).
    pub fn url(&self) -> String {
        format!(
            "postgresql:///postgres?host={}&port={PORT}&user=postgres",
            self.dir.display()
        )
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A stream handler that echoes every message back on its stream, until
/// either side ends it.
pub fn echo_handler() -> crate::executor::StreamHandler {
    std::sync::Arc::new(|mut ch: crate::stream::Channel| {
        tokio::spawn(async move {
            while let Some(m) = ch.inbound.recv().await {
                if ch.outbound.send(m.into()).await.is_err() {
                    break;
                }
            }
        });
    })
}

/// A registry node on an in-memory store with the default config, served
/// on a loopback port for the rest of the test's runtime; its base URL
/// (`http://127.0.0.1:PORT`).
pub async fn memory_registry() -> String {
    use crate::registry::{store::MemoryStore, Config, Registry};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = l.local_addr().expect("bound address");
    let reg = Registry::new(
        Config::default(),
        std::sync::Arc::new(MemoryStore::default()),
        format!("ws://{addr}"),
    )
    .await
    .expect("in-memory registry");
    tokio::spawn(reg.serve(l));
    format!("http://{addr}")
}
