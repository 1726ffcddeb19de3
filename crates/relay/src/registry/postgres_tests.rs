//! The PostgreSQL store against a real PostgreSQL ([`crate::testing`]: each
//! test starts its own server and stops it by PID).

use super::*;
use crate::registry::store::tests::{contract, key};
use crate::registry::store::Attachment;
use crate::testing::TestPostgres as TestDb;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connects a store (the test server accepts connections once started).
async fn store(db: &TestDb) -> PostgresStore {
    match PostgresStore::connect(&db.url()).await {
        Ok(s) => s,
        Err(e) => panic!("{e}; server log: {}", db.log()),
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

/// Nodes started together on an empty database all come up: the table
/// recording migrations is created under the migrations' lock (before, two
/// of three nodes started at once failed with "migration table: db error").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_started_together_on_an_empty_database_all_migrate() {
    let db = TestDb::start();
    let url = db.url();
    let starts = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { PostgresStore::connect(&url).await })
    });
    for start in starts.collect::<Vec<_>>() {
        match start.await.unwrap() {
            Ok(s) => assert_eq!(s.schema_version().await.unwrap(), MIGRATIONS.len() as i32),
            Err(e) => panic!("{e}"),
        }
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
    // Why, not only that: the server's own words, the socket's failure.
    assert!(e.to_string().contains("No such file or directory"), "{e}");
    let db = TestDb::start();
    let url = db.url().replace("///postgres?", "///nosuchdb?");
    let e = PostgresStore::connect(&url).await.err().unwrap();
    assert!(
        e.to_string()
            .contains(r#"database "nosuchdb" does not exist"#),
        "{e}"
    );
}

/// An executor socket's record whose socket is never served (its upgrade
/// failed after the admission wrote it) is taken out again: it stayed, and
/// sent every node's harnesses to a socket nobody served.
#[tokio::test]
async fn an_executor_record_nobody_serves_is_taken_out() {
    let db = TestDb::start();
    let s: Arc<dyn Store> = Arc::new(store(&db).await);
    let fresh = Duration::from_secs(5);
    s.node_heartbeat("n1", "ws://n1").await.unwrap();
    let record = Attachment {
        environment_id: "env".into(),
        registration_id: "reg".into(),
        node_id: "n1".into(),
        ws_base: "ws://n1".into(),
        attach_id: "n1-1".into(),
    };
    s.attach(&record).await.unwrap();
    assert!(s.attachment("env", fresh).await.unwrap().is_some());
    drop(crate::registry::Recorded {
        store: s.clone(),
        node_id: "n1".into(),
        record: Some(record.clone()),
        write: None,
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.attachment("env", fresh).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the record stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Abandoned while its write is still on its way: taken out after the
    // write lands, not before (the write would then leave it for good).
    let store = s.clone();
    let rec = record.clone();
    let (landed, written) = tokio::sync::oneshot::channel();
    drop(crate::registry::Recorded {
        store: s.clone(),
        node_id: "n1".into(),
        record: Some(record),
        // A slow write: the guard is dropped well before it lands.
        write: Some(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let r = store.attach(&rec).await;
            let _ = landed.send(());
            r
        })),
    });
    written.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.attachment("env", fresh).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the record stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Which node holds an environment's executor: seen only while that node
/// is heard from; a newer attachment wins over an older one's detach; a node
/// leaving takes its attachments with it.
#[tokio::test]
async fn attachments_follow_live_nodes() {
    let db = TestDb::start();
    let s = store(&db).await;
    let fresh = Duration::from_secs(5);
    let att = |node: &str, id: &str| Attachment {
        environment_id: "env".into(),
        registration_id: "reg".into(),
        node_id: node.into(),
        ws_base: format!("ws://{node}"),
        attach_id: id.into(),
    };
    s.attach(&att("a", "a-1")).await.unwrap();
    assert_eq!(
        s.attachment("env", fresh).await.unwrap(),
        None,
        "node a never heard from"
    );
    s.node_heartbeat("a", "ws://a").await.unwrap();
    assert_eq!(
        s.attachment("env", fresh).await.unwrap(),
        Some(att("a", "a-1"))
    );
    // Node b takes the executor over; a's late detach of its old socket is a no-op.
    s.node_heartbeat("b", "ws://b").await.unwrap();
    s.attach(&att("b", "b-7")).await.unwrap();
    s.detach("env", "a-1").await.unwrap();
    assert_eq!(
        s.attachment("env", fresh).await.unwrap(),
        Some(att("b", "b-7"))
    );
    // A node not heard from for longer than `fresh` no longer counts.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        s.attachment("env", Duration::from_secs(1)).await.unwrap(),
        None
    );
    assert!(s.attachment("env", fresh).await.unwrap().is_some());
    s.node_gone("b").await.unwrap();
    assert_eq!(
        s.attachment("env", fresh).await.unwrap(),
        None,
        "left with its node"
    );
    s.node_heartbeat("b", "ws://b").await.unwrap();
    assert_eq!(
        s.attachment("env", fresh).await.unwrap(),
        None,
        "not re-created"
    );
}

/// After the database was away, no node's silence proves it gone until
/// another node has been heard from without a gap for the whole of `fresh`:
/// right after an outage every heartbeat is old, and the node that heard
/// first had sent harnesses to its own relay, and let a second executor
/// take the environment, while the node holding it was alive.
#[tokio::test]
async fn an_outage_makes_no_live_node_look_gone() {
    let db = TestDb::start();
    let s = store(&db).await;
    let fresh = Duration::from_secs(1);
    let held = Attachment {
        environment_id: "env".into(),
        registration_id: "reg".into(),
        node_id: "b".into(),
        ws_base: "ws://b".into(),
        attach_id: "b-1".into(),
    };
    s.node_heartbeat("a", "ws://a").await.unwrap();
    s.node_heartbeat("b", "ws://b").await.unwrap();
    s.attach(&held).await.unwrap();
    // Ten seconds without the database: every heartbeat stopped.
    s.client()
        .await
        .unwrap()
        .execute(
            "UPDATE nodes SET seen_at = seen_at - interval '10 s', up_since = up_since - interval '10 s'",
            &[],
        )
        .await
        .unwrap();
    // Node a is heard from first, b not yet: b still holds the executor.
    s.node_heartbeat("a", "ws://a").await.unwrap();
    assert_eq!(
        s.attachment("env", fresh).await.unwrap(),
        Some(held.clone())
    );
    // a heard from without a gap for longer than `fresh`, b silent: gone.
    tokio::time::sleep(Duration::from_millis(600)).await;
    s.node_heartbeat("a", "ws://a").await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    s.node_heartbeat("a", "ws://a").await.unwrap();
    assert_eq!(s.attachment("env", fresh).await.unwrap(), None);
    // b back: it holds the executor again.
    s.node_heartbeat("b", "ws://b").await.unwrap();
    assert_eq!(s.attachment("env", fresh).await.unwrap(), Some(held));
}

/// `/readyz` follows the store: 200 once a heartbeat got through, 503
/// naming the node once the database is gone; `/livez` stays 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_database() {
    let db = TestDb::start();
    let s: Arc<dyn Store> = Arc::new(store(&db).await);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let reg = crate::registry::Registry::new(
        crate::registry::Config::default(),
        s,
        format!("ws://{addr}"),
    )
    .await
    .unwrap();
    let node = reg.node_id().to_string();
    tokio::spawn(reg.serve(l));
    let get = |path: &'static str| async move {
        let r = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    let wait_for = |path: &'static str, want: u16| async move {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (status, body) = get(path).await;
            if status == want {
                return body;
            }
            assert!(Instant::now() < deadline, "{path}: {status} {body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    wait_for("/readyz", 200).await;
    drop(db);
    let body = wait_for("/readyz", 503).await;
    assert!(body.contains("not_ready") && body.contains(&node), "{body}");
    assert_eq!(get("/livez").await.0, 200);
}

/// A database restart under traffic: an established stream keeps flowing
/// while the database is down (its frames never touch it), and a harness
/// that connects meanwhile waits and gets its stream once the database is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_breaks_no_stream_and_new_connections_wait() {
    use crate::executor;
    use crate::harness;
    use crate::keys::Identity;
    use crate::random::OsRandom;
    use crate::registry_client::RegistryClient;
    use crate::stream::Channel;
    let mut db = TestDb::start();
    let s: Arc<dyn Store> = Arc::new(store(&db).await);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let reg = crate::registry::Registry::new(
        crate::registry::Config::default(),
        s,
        format!("ws://{addr}"),
    )
    .await
    .unwrap();
    tokio::spawn(reg.serve(l));
    let base = format!("http://{addr}");
    let echo = crate::testing::echo_handler();
    let exec = tokio::spawn(executor::run(
        executor::Config {
            registry: RegistryClient::new(&base, "exec", None, true).unwrap(),
            environment_id: "pg".into(),
            keepalive: executor::KEEPALIVE,
            pong_timeout: executor::PONG_TIMEOUT,
            observer: Arc::new(executor::NoObserver),
            transport_cipher: crate::noise::TransportCipher::preferred(),
        },
        echo,
    ));
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    let me = Identity::generate(&mut OsRandom);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut ch = loop {
        match harness::connect(&client, "pg", &me).await {
            Ok(ch) => break ch,
            Err(e) => assert!(Instant::now() < deadline, "never attached: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    async fn round_trip(ch: &mut Channel, msg: &[u8]) {
        ch.outbound.send(msg.to_vec().into()).await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(10), ch.inbound.recv())
            .await
            .expect("an echo within 10 s")
            .expect("the stream is open");
        assert_eq!(back, msg);
    }
    round_trip(&mut ch, b"before").await;
    tokio::task::block_in_place(|| db.stop());
    for i in 0..20u8 {
        round_trip(&mut ch, &[i; 1000]).await;
    }
    let pending = {
        let client = client.clone();
        tokio::spawn(async move {
            let me = Identity::generate(&mut OsRandom);
            harness::connect(&client, "pg", &me).await
        })
    };
    // The database stays down for a second while that connection waits.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !pending.is_finished(),
        "a connect failed while the database was down"
    );
    round_trip(&mut ch, b"still down").await;
    tokio::task::block_in_place(|| db.start_again());
    let mut late = tokio::time::timeout(Duration::from_secs(20), pending)
        .await
        .expect("the waiting connect finishes once the database is back")
        .unwrap()
        .unwrap_or_else(|e| panic!("the waiting connect failed: {e}; log: {}", db.log()));
    round_trip(&mut late, b"late").await;
    round_trip(&mut ch, b"after").await;
    exec.abort();
}
