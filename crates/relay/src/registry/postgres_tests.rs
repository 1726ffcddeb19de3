//! The PostgreSQL store against a real PostgreSQL (Debian's `postgresql`
//! package, which `.ci/run` installs): each test starts its own server as the
//! `postgres` system user in a temporary directory, on a Unix socket there
//! only (no TCP), and stops it by PID.

use super::*;
use crate::registry::store::tests::{contract, key};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PORT: u16 = 5432;

/// A PostgreSQL server of the test's own, stopped (SIGINT: fast shutdown)
/// and removed when dropped.
struct TestDb {
    child: Child,
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
    // SAFETY: getpwnam returns a pointer into static storage or null.
    let pw = unsafe { libc::getpwnam(c"postgres".as_ptr()) };
    assert!(
        !pw.is_null(),
        "no postgres system user (the postgresql package makes it)"
    );
    // SAFETY: non-null, as checked.
    unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
}

impl TestDb {
    fn start() -> TestDb {
        let bin = bin_dir();
        let (uid, gid) = postgres_user();
        let dir = std::env::temp_dir().join(format!("relay-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: chown of a directory this test made.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), uid, gid) }, 0);
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
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let mut server = Command::new(bin.join("postgres"));
        server
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&dir)
            .args([
                "-c",
                "listen_addresses=",
                "-c",
                "fsync=off",
                "-p",
                &PORT.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(log);
        as_postgres(&mut server);
        let child = server.spawn().expect("start postgres");
        let db = TestDb { child, dir };
        let socket = db.dir.join(format!(".s.PGSQL.{PORT}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "postgres did not start: {}",
                db.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        db
    }

    fn url(&self) -> String {
        format!(
            "postgresql:///postgres?host={}&port={PORT}&user=postgres",
            self.dir.display()
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // SAFETY: a signal to the server this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits for the server to accept connections (its socket appears a moment
/// before it does), then connects a store.
async fn store(db: &TestDb) -> PostgresStore {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match PostgresStore::connect(&db.url()).await {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline && e.0.contains("connection") => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}; server log: {}", db.log()),
        }
    }
}

#[tokio::test]
async fn postgres_store_contract() {
    let db = TestDb::start();
    let s = store(&db).await;
    contract(&s).await;
    assert_eq!(s.schema_version().await.unwrap(), MIGRATIONS.len() as i32);
}

/// Two nodes on one database: migrations applied once, one signing key,
/// each sees the other's registrations, and an authorization is handed out
/// once however many nodes race for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_one_state() {
    let db = TestDb::start();
    let url = db.url();
    let a = store(&db).await;
    let (b, c) = tokio::join!(PostgresStore::connect(&url), PostgresStore::connect(&url));
    let (b, c) = (Arc::new(b.unwrap()), c.unwrap());
    assert_eq!(c.schema_version().await.unwrap(), MIGRATIONS.len() as i32);
    let key_a = a.signing_key().await.unwrap();
    assert_eq!(
        b.signing_key().await.unwrap(),
        key_a,
        "one key for every node"
    );
    a.put_registration(Registration {
        environment_id: "env".into(),
        registration_id: "reg_1".into(),
        executor_key: key(),
    })
    .await
    .unwrap();
    let seen = b.registration("env").await.unwrap().unwrap();
    assert_eq!(seen.registration_id, "reg_1");
    for round in 0..20 {
        let token = format!("hka_{round}");
        a.put_authorization(
            &token,
            Authorization {
                environment_id: "env".into(),
                registration_id: "reg_1".into(),
                harness_key: key(),
                expires_unix: 1_000,
            },
        )
        .await
        .unwrap();
        let b2 = b.clone();
        let t2 = token.clone();
        let other = tokio::spawn(async move { b2.take_authorization(&t2, 10).await.unwrap() });
        let mine = c.take_authorization(&token, 10).await.unwrap();
        let theirs = other.await.unwrap();
        assert!(
            mine.is_some() != theirs.is_some(),
            "round {round}: exactly one node gets it ({mine:?}, {theirs:?})"
        );
    }
}

#[tokio::test]
async fn a_bad_url_or_an_absent_server_is_a_clear_error() {
    let e = PostgresStore::connect("postgres://x:y@host:notaport/db")
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("PostgreSQL URL"), "{e}");
    let dir = Path::new("/nonexistent-relay-pg");
    let url = format!("postgresql:///postgres?host={}&port=1", dir.display());
    let e = PostgresStore::connect(&url).await.err().unwrap();
    assert!(e.to_string().contains("PostgreSQL connection"), "{e}");
}
