//! The registry's state in PostgreSQL (`exec-server registry --db postgres://…`),
//! so that several registry nodes can share it: tokio-postgres behind a
//! deadpool pool, versioned migrations applied at start under an advisory
//! lock (nodes starting together apply each migration once), TLS (rustls,
//! the Mozilla roots) when the URL says `sslmode=require`.
//!
//! Atomicity across nodes comes from the database: a registration is one
//! upsert, an authorization is taken with one `DELETE … RETURNING` (so two
//! nodes can never both hand out the same one), and the signing key is
//! created with `INSERT … ON CONFLICT DO NOTHING` and then read, so every
//! node signs with the same key.

use super::store::{Attachment, Authorization, Registration, Store, StoreError};
use crate::causes::chain;
use crate::keys::WirePublicKey;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::config::SslMode;

/// Connections kept open per node: 16.
pub const POOL_SIZE: usize = 16;
/// How long a call waits for a pooled connection (or a new one): 10 s.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Arbitrary, fixed: the advisory lock key migrations run under.
const MIGRATION_LOCK: i64 = 0x6578_6563_7376_7231;

/// The migrations, in order; each runs once, in a transaction, and is
/// recorded in `exec_server_schema`. Never edit one that shipped: add one.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE registrations (
         environment_id  TEXT PRIMARY KEY,
         registration_id TEXT NOT NULL,
         executor_key    TEXT NOT NULL,
         updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
     );
     CREATE TABLE authorizations (
         token           TEXT PRIMARY KEY,
         environment_id  TEXT NOT NULL,
         registration_id TEXT NOT NULL,
         harness_key     TEXT NOT NULL,
         expires_unix    BIGINT NOT NULL
     );
     CREATE INDEX authorizations_expiry ON authorizations (expires_unix);
     CREATE TABLE signing_keys (
         id         INTEGER PRIMARY KEY,
         key        BYTEA NOT NULL,
         created_at TIMESTAMPTZ NOT NULL DEFAULT now()
     );",
    ),
    (
        2,
        "CREATE TABLE nodes (
         node_id TEXT PRIMARY KEY,
         ws_base TEXT NOT NULL,
         seen_at TIMESTAMPTZ NOT NULL DEFAULT now()
     );
     CREATE TABLE attachments (
         environment_id  TEXT PRIMARY KEY,
         registration_id TEXT NOT NULL,
         node_id         TEXT NOT NULL,
         attach_id       TEXT NOT NULL,
         attached_at     TIMESTAMPTZ NOT NULL DEFAULT now()
     );
     CREATE INDEX attachments_node ON attachments (node_id);",
    ),
    (
        3,
        // Since when each node's heartbeats have landed without a gap: a
        // node's silence proves it gone only while another's heartbeats
        // prove the database was there to hear it.
        "ALTER TABLE nodes ADD COLUMN up_since TIMESTAMPTZ NOT NULL DEFAULT now();",
    ),
];

/// A pause between two heartbeats of a node longer than this starts its
/// `up_since` again: 3 heartbeats.
const HEARTBEAT_GAP_SECS: f64 = 3.0 * super::fleet::HEARTBEAT.as_secs_f64();

/// How long a store call keeps retrying while the database is unreachable
/// (a restart, a failover) before it fails: 8 s, so a request that gives up
/// is answered (`500 store_failed`, naming the node) within the 10 s our
/// clients wait. Calls made meanwhile wait; established relay streams never
/// touch the database.
pub const UNREACHABLE_WINDOW: std::time::Duration = std::time::Duration::from_secs(8);

/// Whether `e` means the database could not be reached or went away (worth
/// retrying on a new connection), rather than refusing the statement.
fn unreachable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        // Class 08: connection exception; 57P01-03: admin or crash shutdown,
        // cannot connect now (starting up or shutting down).
        Some(code) => code.code().starts_with("08") || code.code().starts_with("57P"),
        // No SQLSTATE: the socket failed (refused, reset, no such socket file).
        None => std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::new(format!("PostgreSQL {what}: {e}"))
}

/// [`err`] with `e`'s causes too ([`chain`]).
fn db_err(what: &str, e: impl std::error::Error + 'static) -> StoreError {
    err(what, chain(&e))
}

/// A store shared by every node on the same database.
pub struct PostgresStore {
    pool: Pool,
    /// Authorizations this node put, for [`super::store::sweeps`].
    puts: std::sync::atomic::AtomicUsize,
}

/// Whether `db` names a PostgreSQL database (`postgres://` or `postgresql://`)
/// rather than a SQLite file.
pub fn is_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

impl PostgresStore {
    /// Connects to `url` (libpq URL syntax, e.g.
    /// `postgres://user:pw@host:5432/db?sslmode=require`, or a Unix socket
    /// directory as `postgresql:///db?host=/run/postgresql`) and applies the
    /// migrations this build knows.
    ///
    /// Errors: an unparsable URL, an `sslmode` this build does not offer
    /// (`disable`, `prefer` and `require` are), the database unreachable,
    /// or a migration failing (each names the step).
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| db_err("URL", e))?;
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match config.get_ssl_mode() {
            SslMode::Require => Manager::from_config(config, tls_connector()?, manager_config),
            SslMode::Disable | SslMode::Prefer => {
                Manager::from_config(config, tokio_postgres::NoTls, manager_config)
            }
            other => return Err(err("URL", format!("unsupported sslmode {other:?}"))),
        };
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| db_err("pool", e))?;
        let store = PostgresStore {
            pool,
            puts: Default::default(),
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| db_err("connection", e))
    }

    /// Runs `op` on a pooled connection. While the database is unreachable
    /// (down, restarting, failing over: no connection, a closed one, or a
    /// shutdown or connection error from the server) it retries, 50 ms
    /// apart at first and then up to 1 s, for [`UNREACHABLE_WINDOW`], then
    /// fails naming the last failure. Any other error fails at once.
    async fn with_client<T, F, Fut>(&self, what: &str, op: F) -> Result<T, StoreError>
    where
        F: Fn(deadpool_postgres::Object) -> Fut,
        Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        self.retrying(UNREACHABLE_WINDOW, what, op).await
    }

    /// [`Self::with_client`] retrying for `window` (zero: one attempt).
    async fn retrying<T, F, Fut>(
        &self,
        window: std::time::Duration,
        what: &str,
        op: F,
    ) -> Result<T, StoreError>
    where
        F: Fn(deadpool_postgres::Object) -> Fut,
        Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let deadline = tokio::time::Instant::now() + window;
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            let failure = match self.pool.get().await {
                Ok(c) => match op(c).await {
                    Ok(v) => return Ok(v),
                    Err(e) if unreachable(&e) => chain(&e),
                    Err(e) => return Err(db_err(what, e)),
                },
                Err(deadpool_postgres::PoolError::Backend(e)) if !unreachable(&e) => {
                    return Err(db_err("connection", e))
                }
                Err(e) => chain(&e),
            };
            if tokio::time::Instant::now() + pause > deadline {
                return Err(StoreError::unreachable(format!(
                    "PostgreSQL {what}: the database is unreachable (retried for {} s): {failure}",
                    window.as_secs()
                )));
            }
            tracing::debug!("PostgreSQL {what}: unreachable ({failure}); retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(1));
        }
    }

    /// Applies the migrations not yet recorded, one transaction each, under
    /// an advisory lock; the table recording them is created under it too
    /// (`CREATE TABLE IF NOT EXISTS` is not safe against itself: nodes
    /// started together on an empty database failed with a duplicate key
    /// in `pg_type`).
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut c = self.client().await?;
        let tx = c
            .transaction()
            .await
            .map_err(|e| db_err("migration table", e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(|e| db_err("migration lock", e))?;
        let exists: bool = tx
            .query_one("SELECT to_regclass('exec_server_schema') IS NOT NULL", &[])
            .await
            .map_err(|e| db_err("migration table", e))?
            .get(0);
        if !exists {
            tx.batch_execute(
                "CREATE TABLE exec_server_schema (
                     version    INTEGER PRIMARY KEY,
                     applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
                 )",
            )
            .await
            .map_err(|e| db_err("migration table", e))?;
        }
        tx.commit()
            .await
            .map_err(|e| db_err("migration table", e))?;
        for (version, sql) in MIGRATIONS {
            let tx = c.transaction().await.map_err(|e| db_err("migration", e))?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await
                .map_err(|e| db_err("migration lock", e))?;
            let done = tx
                .query_opt(
                    "SELECT 1 FROM exec_server_schema WHERE version = $1",
                    &[version],
                )
                .await
                .map_err(|e| db_err("migration", e))?
                .is_some();
            if !done {
                tx.batch_execute(sql)
                    .await
                    .map_err(|e| db_err(&format!("migration {version}"), e))?;
                tx.execute(
                    "INSERT INTO exec_server_schema (version) VALUES ($1)",
                    &[version],
                )
                .await
                .map_err(|e| db_err(&format!("migration {version}"), e))?;
            }
            tx.commit()
                .await
                .map_err(|e| db_err(&format!("migration {version}"), e))?;
        }
        Ok(())
    }

    /// The schema version applied (the highest migration recorded).
    pub async fn schema_version(&self) -> Result<i32, StoreError> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT COALESCE(MAX(version), 0) FROM exec_server_schema",
                &[],
            )
            .await
            .map_err(|e| db_err("schema version", e))?;
        Ok(row.get(0))
    }
}

fn tls_connector() -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| db_err("TLS", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

fn key_json(k: &WirePublicKey) -> Result<String, StoreError> {
    serde_json::to_string(k).map_err(|e| db_err("key", e))
}

fn key_from(text: &str) -> Result<WirePublicKey, StoreError> {
    serde_json::from_str(text).map_err(|e| db_err("stored key", e))
}

fn unix(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn put_registration(&self, r: Registration) -> Result<(), StoreError> {
        let key = key_json(&r.executor_key)?;
        let (env, reg, key) = (&r.environment_id, &r.registration_id, &key);
        self.with_client("registration", |c| async move {
            c.execute(
                "INSERT INTO registrations (environment_id, registration_id, executor_key)
                 VALUES ($1, $2, $3)
                 ON CONFLICT (environment_id) DO UPDATE
                 SET registration_id = EXCLUDED.registration_id,
                     executor_key = EXCLUDED.executor_key,
                     updated_at = now()",
                &[env, reg, key],
            )
            .await
        })
        .await?;
        Ok(())
    }

    async fn registration(&self, environment_id: &str) -> Result<Option<Registration>, StoreError> {
        let row = self
            .with_client("registration", |c| async move {
                c.query_opt(
                    "SELECT registration_id, executor_key FROM registrations WHERE environment_id = $1",
                    &[&environment_id],
                )
                .await
            })
            .await?;
        row.map(|row| {
            Ok(Registration {
                environment_id: environment_id.to_string(),
                registration_id: row.get(0),
                executor_key: key_from(row.get(1))?,
            })
        })
        .transpose()
    }

    async fn put_authorization(&self, token: &str, a: Authorization) -> Result<(), StoreError> {
        let key = key_json(&a.harness_key)?;
        let (a, key, expires) = (&a, &key, unix(a.expires_unix));
        let sweep = super::store::sweeps(&self.puts).then(|| unix(super::now_unix()));
        self.with_client("authorization", |c| async move {
            if let Some(now) = sweep {
                c.execute(
                    "DELETE FROM authorizations WHERE expires_unix < $1",
                    &[&now],
                )
                .await?;
            }
            c.execute(
                "INSERT INTO authorizations
                     (token, environment_id, registration_id, harness_key, expires_unix)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (token) DO NOTHING",
                &[&token, &a.environment_id, &a.registration_id, key, &expires],
            )
            .await
        })
        .await?;
        Ok(())
    }

    async fn take_authorization(
        &self,
        token: &str,
        now_unix: u64,
    ) -> Result<Option<Authorization>, StoreError> {
        let now = unix(now_unix);
        let row = self
            .with_client("authorization", |c| async move {
                c.execute(
                    "DELETE FROM authorizations WHERE expires_unix < $1",
                    &[&now],
                )
                .await?;
                c.query_opt(
                    "DELETE FROM authorizations WHERE token = $1 AND expires_unix >= $2
                     RETURNING environment_id, registration_id, harness_key, expires_unix",
                    &[&token, &now],
                )
                .await
            })
            .await?;
        row.map(|row| {
            Ok(Authorization {
                environment_id: row.get(0),
                registration_id: row.get(1),
                harness_key: key_from(row.get(2))?,
                expires_unix: u64::try_from(row.get::<_, i64>(3)).unwrap_or(0),
            })
        })
        .transpose()
    }

    async fn signing_key(&self) -> Result<[u8; 32], StoreError> {
        let mut fresh = [0u8; 32];
        crate::random::Randomness::fill(&mut crate::random::OsRandom, &mut fresh);
        let fresh = &fresh[..];
        let row = self
            .with_client("signing key", |c| async move {
                c.execute(
                    "INSERT INTO signing_keys (id, key) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
                    &[&fresh],
                )
                .await?;
                c.query_one("SELECT key FROM signing_keys WHERE id = 1", &[])
                    .await
            })
            .await?;
        let key: Vec<u8> = row.get(0);
        key.try_into()
            .map_err(|_| err("signing key", "the stored key is not 32 bytes"))
    }

    async fn node_heartbeat(&self, node_id: &str, ws_base: &str) -> Result<(), StoreError> {
        // One attempt: a missed heartbeat is what tells `/readyz` (and the
        // other nodes) that this node cannot reach the database.
        self.retrying(
            std::time::Duration::ZERO,
            "node heartbeat",
            |c| async move {
                c.execute(
                    "INSERT INTO nodes (node_id, ws_base) VALUES ($1, $2)
                 ON CONFLICT (node_id) DO UPDATE SET ws_base = EXCLUDED.ws_base, seen_at = now(),
                     up_since = CASE WHEN nodes.seen_at < now() - make_interval(secs => $3)
                                     THEN now() ELSE nodes.up_since END",
                    &[&node_id, &ws_base, &HEARTBEAT_GAP_SECS],
                )
                .await
            },
        )
        .await?;
        Ok(())
    }

    async fn node_gone(&self, node_id: &str) -> Result<(), StoreError> {
        self.with_client("node", |c| async move {
            c.execute("DELETE FROM attachments WHERE node_id = $1", &[&node_id])
                .await?;
            c.execute("DELETE FROM nodes WHERE node_id = $1", &[&node_id])
                .await
        })
        .await?;
        Ok(())
    }

    async fn attach(&self, a: &Attachment) -> Result<(), StoreError> {
        self.with_client("attachment", |c| async move {
            c.execute(
                "INSERT INTO attachments (environment_id, registration_id, node_id, attach_id)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (environment_id) DO UPDATE
                 SET registration_id = EXCLUDED.registration_id, node_id = EXCLUDED.node_id,
                     attach_id = EXCLUDED.attach_id, attached_at = now()",
                &[
                    &a.environment_id,
                    &a.registration_id,
                    &a.node_id,
                    &a.attach_id,
                ],
            )
            .await
        })
        .await?;
        Ok(())
    }

    async fn detach(&self, environment_id: &str, attach_id: &str) -> Result<(), StoreError> {
        self.with_client("attachment", |c| async move {
            c.execute(
                "DELETE FROM attachments WHERE environment_id = $1 AND attach_id = $2",
                &[&environment_id, &attach_id],
            )
            .await
        })
        .await?;
        Ok(())
    }

    async fn attachment(
        &self,
        environment_id: &str,
        fresh: std::time::Duration,
    ) -> Result<Option<Attachment>, StoreError> {
        let fresh = fresh.as_secs_f64();
        let row = self
            .with_client("attachment", |c| async move {
                // The node is heard from within `fresh`, or nothing proves
                // it gone: no node has been heard from without a gap for
                // all of that time (the database was away, every heartbeat
                // with it; right after, every node would look dead).
                c.query_opt(
                    "SELECT a.registration_id, a.node_id, n.ws_base, a.attach_id
                     FROM attachments a JOIN nodes n ON n.node_id = a.node_id
                     WHERE a.environment_id = $1
                       AND (n.seen_at > now() - make_interval(secs => $2)
                            OR NOT EXISTS (
                                SELECT 1 FROM nodes m
                                WHERE m.up_since <= now() - make_interval(secs => $2)
                                  AND m.seen_at > now() - make_interval(secs => $3)))",
                    &[&environment_id, &fresh, &HEARTBEAT_GAP_SECS],
                )
                .await
            })
            .await?;
        Ok(row.map(|row| Attachment {
            environment_id: environment_id.to_string(),
            registration_id: row.get(0),
            node_id: row.get(1),
            ws_base: row.get(2),
            attach_id: row.get(3),
        }))
    }
}

#[cfg(test)]
#[path = "postgres_tests.rs"]
mod tests;
