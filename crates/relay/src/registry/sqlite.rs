//! The registry's durable store: one SQLite file (`--db PATH`) in WAL mode, so
//! a restart keeps registrations, pending authorizations and the key that
//! signs relay URLs (relay URLs issued before the restart stay valid).
//!
//! One connection behind a mutex: the registry's writes are tiny and rare next
//! to the relay's traffic, which never touches the store.

use super::store::{Authorization, Registration, Store, StoreError};
use crate::keys::WirePublicKey;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::Mutex;

/// Registrations and authorizations in SQLite.
pub struct SqliteStore {
    conn: Mutex<Connection>,
    /// Authorizations put, for [`super::store::sweeps`].
    puts: std::sync::atomic::AtomicUsize,
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError::new(e.to_string())
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS registrations (
    environment_id  TEXT PRIMARY KEY,
    registration_id TEXT NOT NULL,
    executor_key    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS authorizations (
    token           TEXT PRIMARY KEY,
    environment_id  TEXT NOT NULL,
    registration_id TEXT NOT NULL,
    harness_key     TEXT NOT NULL,
    expires_unix    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS authorizations_expiry ON authorizations (expires_unix);
";

impl SqliteStore {
    /// Opens (or creates, mode 0600) the database at `path`, switches it to
    /// WAL and creates the tables. Errors: the file cannot be opened or is not
    /// a database of this schema.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        {
            use std::os::unix::fs::OpenOptionsExt;
            // Created here first so that the file (it holds the signing key) is
            // never readable by others, whatever the umask.
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| StoreError::new(format!("cannot open {}: {e}", path.display())))?;
        }
        let conn = Connection::open(path)
            .map_err(|e| StoreError::new(format!("cannot open {}: {e}", path.display())))?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(|e| {
                StoreError::new(format!("{} is not a usable database: {e}", path.display()))
            })?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::new(format!(
                "{}: cannot switch to WAL mode (got {mode})",
                path.display()
            )));
        }
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            puts: Default::default(),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c).map_err(err)
    }

    /// The journal mode in effect (`wal` once opened).
    pub fn journal_mode(&self) -> Result<String, StoreError> {
        self.with(|c| c.query_row("PRAGMA journal_mode", [], |r| r.get(0)))
    }
}

fn key_json(k: &WirePublicKey) -> String {
    serde_json::to_string(k).unwrap_or_default()
}

fn key_from(text: String) -> rusqlite::Result<WirePublicKey> {
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn put_registration(&self, r: Registration) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO registrations (environment_id, registration_id, executor_key)
                 VALUES (?1, ?2, ?3)
                 ON CONFLICT (environment_id) DO UPDATE
                 SET registration_id = excluded.registration_id,
                     executor_key = excluded.executor_key",
                params![
                    r.environment_id,
                    r.registration_id,
                    key_json(&r.executor_key)
                ],
            )
            .map(|_| ())
        })
    }

    async fn registration(&self, environment_id: &str) -> Result<Option<Registration>, StoreError> {
        self.with(|c| {
            c.query_row(
                "SELECT registration_id, executor_key FROM registrations WHERE environment_id = ?1",
                params![environment_id],
                |row| {
                    Ok(Registration {
                        environment_id: environment_id.to_string(),
                        registration_id: row.get(0)?,
                        executor_key: key_from(row.get(1)?)?,
                    })
                },
            )
            .optional()
        })
    }

    async fn put_authorization(&self, token: &str, a: Authorization) -> Result<(), StoreError> {
        let sweep = super::store::sweeps(&self.puts).then(|| super::now_unix() as i64);
        self.with(|c| {
            if let Some(now) = sweep {
                c.execute(
                    "DELETE FROM authorizations WHERE expires_unix < ?1",
                    params![now],
                )?;
            }
            c.execute(
                "INSERT OR REPLACE INTO authorizations
                 (token, environment_id, registration_id, harness_key, expires_unix)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    token,
                    a.environment_id,
                    a.registration_id,
                    key_json(&a.harness_key),
                    a.expires_unix as i64
                ],
            )
            .map(|_| ())
        })
    }

    async fn take_authorization(
        &self,
        token: &str,
        now_unix: u64,
    ) -> Result<Option<Authorization>, StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "DELETE FROM authorizations WHERE expires_unix < ?1",
                params![now_unix as i64],
            )?;
            let a = tx
                .query_row(
                    "DELETE FROM authorizations WHERE token = ?1
                     RETURNING environment_id, registration_id, harness_key, expires_unix",
                    params![token],
                    |row| {
                        Ok(Authorization {
                            environment_id: row.get(0)?,
                            registration_id: row.get(1)?,
                            harness_key: key_from(row.get(2)?)?,
                            expires_unix: row.get::<_, i64>(3)?.max(0) as u64,
                        })
                    },
                )
                .optional()?;
            tx.commit()?;
            Ok(a)
        })
    }

    async fn signing_key(&self) -> Result<[u8; 32], StoreError> {
        let mut fresh = [0u8; 32];
        crate::random::Randomness::fill(&mut crate::random::OsRandom, &mut fresh);
        let stored: Vec<u8> = self.with(|c| {
            // Only the first node to get here sets the key; every later call
            // (and every restart) reads that one back.
            c.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('signing_key', ?1)",
                params![fresh.to_vec()],
            )?;
            c.query_row(
                "SELECT value FROM meta WHERE key = 'signing_key'",
                [],
                |r| r.get(0),
            )
        })?;
        stored
            .try_into()
            .map_err(|_| StoreError::new("stored signing key is not 32 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::store::tests::{contract, key};

    /// Authorizations nobody takes do not pile up: every 256th put deletes
    /// the expired ones (they were deleted only when one was taken).
    #[tokio::test]
    async fn expired_authorizations_go_as_more_are_put() {
        let dir = std::env::temp_dir().join(format!("relay-sqlite-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = SqliteStore::open(&dir.join("registry.db")).unwrap();
        let expired = Authorization {
            environment_id: "e".into(),
            registration_id: "r".into(),
            harness_key: key(),
            expires_unix: 1,
        };
        let rows = |s: &SqliteStore| {
            s.with(|c| {
                c.query_row("SELECT count(*) FROM authorizations", [], |r| {
                    r.get::<_, i64>(0)
                })
            })
            .unwrap()
        };
        for i in 0..3 * super::super::store::SWEEP_EVERY_PUTS {
            s.put_authorization(&format!("t{i}"), expired.clone())
                .await
                .unwrap();
            assert!(
                rows(&s) <= super::super::store::SWEEP_EVERY_PUTS as i64,
                "{i}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn sqlite_store_contract_wal_and_restart() {
        let dir = std::env::temp_dir().join(format!("relay-sqlite-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("registry.db");
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(s.journal_mode().unwrap(), "wal");
        contract(&s).await;
        let k = s.signing_key().await.unwrap();
        let a = Authorization {
            environment_id: "e".into(),
            registration_id: "r".into(),
            harness_key: key(),
            expires_unix: 1000,
        };
        s.put_authorization("kept", a.clone()).await.unwrap();
        drop(s);
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{mode:o}");
        }
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(s.signing_key().await.unwrap(), k);
        assert_eq!(
            s.registration("e").await.unwrap().unwrap().registration_id,
            "r"
        );
        assert_eq!(s.take_authorization("kept", 10).await.unwrap(), Some(a));
        drop(s);
        std::fs::write(dir.join("junk.db"), b"this is not sqlite, not at all....").unwrap();
        assert!(SqliteStore::open(&dir.join("junk.db")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
