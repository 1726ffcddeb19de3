//! The relay's per-stream queues, end to end in process: our registry, our
//! executor whose streams flood their harness, and harnesses that read or
//! do not.

use crate::executor::{self, StreamHandler};
use crate::harness;
use crate::keys::Identity;
use crate::random::OsRandom;
use crate::registry_client::RegistryClient;
use crate::stream::Channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes a windowed stream may have unacknowledged: 8 MiB, the output
/// window an acknowledging exec-server client gives a process.
const WINDOW: usize = 8 << 20;
/// One acknowledgement grants this many bytes: 1 MiB.
const ACK_BYTES: usize = 1 << 20;
const CHUNK: usize = 64 << 10;

/// Each stream sends 64 KiB messages for as long as it lasts, once its
/// harness says `go` (windowed: at most [`WINDOW`] unacknowledged, each
/// `more` grants [`ACK_BYTES`], as the server's output window does) or
/// `flood` (no window: a producer only the relay's budget stops).
fn flood_handler() -> StreamHandler {
    Arc::new(|mut ch: Channel| {
        tokio::spawn(async move {
            let Some(mode) = ch.inbound.recv().await else {
                return;
            };
            let windowed = mode[..] == b"go"[..];
            let chunk = vec![7u8; CHUNK];
            let mut credit = WINDOW;
            loop {
                while windowed && credit < CHUNK {
                    match ch.inbound.recv().await {
                        Some(_) => credit += ACK_BYTES,
                        None => return,
                    }
                }
                if ch.outbound.send(chunk.clone().into()).await.is_err() {
                    return;
                }
                credit = credit.saturating_sub(CHUNK);
            }
        });
    })
}

async fn harness_stream(client: &RegistryClient, env: &str) -> Channel {
    let me = Identity::generate(&mut OsRandom);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match harness::connect(client, env, &me).await {
            Ok(ch) => return ch,
            Err(e) => assert!(Instant::now() < deadline, "executor never attached: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two streams on one executor, one harness stops reading while its
/// producer floods: the relay resets that stream alone once it holds its
/// budget, and the other stream keeps flowing all along (the relay's
/// executor reader used to wait on the stalled harness's queue, stalling
/// every stream). Asserted by bytes, not by rate: the reading stream must
/// receive several budgets' worth while the other is stalled and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_harness_does_not_hold_the_executors_other_streams() {
    let base = crate::testing::memory_registry().await;
    let config = executor::Config {
        registry: RegistryClient::new(&base, "exec", None, true).unwrap(),
        environment_id: "flood".into(),
        keepalive: executor::KEEPALIVE,
        pong_timeout: executor::PONG_TIMEOUT,
        observer: Arc::new(executor::NoObserver),
        transport_cipher: crate::noise::TransportCipher::preferred(),
    };
    let exec = tokio::spawn(executor::run(config, flood_handler()));
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    let mut reader = harness_stream(&client, "flood").await;
    reader.outbound.send(b"go".to_vec().into()).await.unwrap();
    // Read (and acknowledge) all along, also while the other stream opens.
    let (counter, mut read) = tokio::sync::watch::channel(0usize);
    let reading = tokio::spawn(async move {
        let mut unacked = 0;
        while let Some(m) = reader.inbound.recv().await {
            counter.send_modify(|n| *n += m.len());
            unacked += m.len();
            while unacked >= ACK_BYTES {
                unacked -= ACK_BYTES;
                if reader.outbound.send(b"more".to_vec().into()).await.is_err() {
                    return;
                }
            }
        }
    });
    let mut stalled = harness_stream(&client, "flood").await;
    stalled
        .outbound
        .send(b"flood".to_vec().into())
        .await
        .unwrap();
    let since_stall = *read.borrow();
    // `stalled` is not read until the relay has reset it: its socket closes,
    // so its messages end after at most the budget (plus what the sockets
    // and the harness's queue hold).
    // Wait until the reading stream has had four budgets' worth (the stalled
    // one fills its budget long before): proof that it flowed while the
    // other was stalled.
    let flowed = matches!(
        tokio::time::timeout(
            Duration::from_secs(60),
            read.wait_for(|n| n - since_stall >= 4 * super::STREAM_BUFFER_BYTES),
        )
        .await,
        Ok(Ok(_))
    );
    let got = *read.borrow() - since_stall;
    assert!(
        flowed,
        "beside a stalled stream, the reading stream got {got} B and then stopped or ended"
    );
    // Then drain the stalled one: it must end (it was reset).
    let mut stalled_bytes = 0usize;
    let reset = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(m) = stalled.inbound.recv().await {
            stalled_bytes += m.len();
        }
    })
    .await;
    assert!(
        reset.is_ok(),
        "the stalled stream was not reset ({stalled_bytes} B so far)"
    );
    assert!(
        stalled_bytes <= 2 * super::STREAM_BUFFER_BYTES,
        "the stalled stream delivered {stalled_bytes} B, over its budget"
    );
    // And the reading stream still flows after the reset.
    let after = *read.borrow();
    let flowing = matches!(
        tokio::time::timeout(
            Duration::from_secs(30),
            read.wait_for(|n| n - after >= super::STREAM_BUFFER_BYTES),
        )
        .await,
        Ok(Ok(_))
    );
    assert!(flowing, "the reading stream stopped after the reset");
    reading.abort();
    exec.abort();
}

/// A harness that does not read, sent a flood of tiny frames: its budget
/// runs out by what the frames hold in memory, not by their payload alone
/// (15-byte frames counted by payload would let 2.2 million of them queue).
#[test]
fn tiny_frames_use_up_a_stream_budget_by_what_they_hold() {
    let unbounded = || super::Pool::new(usize::MAX);
    let queue = super::HarnessQueue::new(unbounded(), unbounded());
    let frame = bytes::Bytes::from_static(&[7u8; 15]);
    let mut accepted = 0usize;
    while queue.send(frame.clone()).is_ok() {
        accepted += 1;
        assert!(accepted <= super::STREAM_BUFFER_BYTES / 15, "never refused");
    }
    // Each queued frame really holds at least 100 bytes (its allocation,
    // its handle, its queue slot): the budget must not let more queue than
    // that many bytes' worth.
    assert!(
        accepted <= super::STREAM_BUFFER_BYTES / 100,
        "{accepted} tiny frames queued"
    );
    assert!(accepted > 0);
}

/// Claims stream `id` on a harness socket's write half (`Resume`), then
/// sends `msg1` as its handshake, if any.
async fn claim(
    w: &mut tokio::io::WriteHalf<tokio::io::DuplexStream>,
    id: &str,
    msg1: Option<Vec<u8>>,
) {
    use crate::frame::Frame;
    use tokio::io::AsyncWriteExt;
    w.write_all(&client_frame(&Frame::resume(id).encode(), false))
        .await
        .unwrap();
    if let Some(msg1) = msg1 {
        w.write_all(&client_frame(&Frame::handshake(id, msg1).encode(), false))
            .await
            .unwrap();
    }
}

/// A hub with an executor attached for `env` as registration `reg`.
async fn hub_with_executor() -> (super::Hub, super::ExecutorAttachment) {
    let hub = super::Hub::new(super::EXECUTOR_SILENCE_TIMEOUT);
    let attached = hub
        .attach_executor::<(), _>("env", "reg", || async { Ok(()) })
        .await
        .unwrap();
    (hub, attached)
}

/// Whether the executor was sent a `Reset` for `stream` (reading what it
/// was sent so far).
fn told_reset(attached: &mut super::ExecutorAttachment, stream: &str) -> bool {
    use crate::frame::{Body, Frame};
    let mut reset = false;
    while let Ok(frame) = attached.rx.try_recv() {
        let f = Frame::decode(&frame).unwrap();
        reset |= f.stream_id == stream && matches!(f.body, Some(Body::Reset { .. }));
    }
    reset
}

/// A stream reset while the executor's queue is full is still told to the
/// executor once it reads again (the reset was dropped: the executor kept
/// the stream, and the session on it stayed attached).
#[tokio::test]
async fn a_reset_behind_a_full_executor_queue_is_not_lost() {
    let (hub, mut attached) = hub_with_executor().await;
    let _stream = open_stream(&hub, "env", "s1");
    let executor = hub.lock()["env"].executor.as_ref().unwrap().tx.clone();
    let filler = crate::frame::Frame::data("other", 0, vec![1; 16]).encode();
    while executor.try_send(filler.clone().into()).is_ok() {}
    hub.reset_stream("env", "s1", super::Scope::Stream);
    let told = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(frame) = attached.rx.recv().await {
            let f = crate::frame::Frame::decode(&frame).unwrap();
            if f.stream_id == "s1" && matches!(f.body, Some(crate::frame::Body::Reset { .. })) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(told, Ok(true), "the executor was never told of the reset");
}

/// A harness socket served by `hub` for `env`/`registration` over an
/// in-memory connection: the node's task, and the harness's reader and raw
/// write half.
fn harness_socket<'a>(
    hub: &'a super::Hub,
    registration: &str,
) -> (
    impl std::future::Future<Output = ()> + 'a,
    crate::socket::Reader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
    tokio::io::WriteHalf<tokio::io::DuplexStream>,
) {
    use crate::socket::{Reader, Role, Writer};
    let (node, harness) = tokio::io::duplex(1 << 16);
    let (r, w) = tokio::io::split(node);
    let serving = hub.serve_harness(
        (
            Reader::new(r, Role::Server, 1 << 20),
            Writer::new(w, Role::Server),
        ),
        ("env".into(), registration.into()),
        None,
    );
    let (hr, hw) = tokio::io::split(harness);
    (serving, Reader::new(hr, Role::Client, 1 << 20), hw)
}

/// `payload` as one masked binary frame (a zero mask), RSV1 set when `rsv1`.
fn client_frame(payload: &[u8], rsv1: bool) -> Vec<u8> {
    assert!(payload.len() < 126);
    let first = if rsv1 { 0xC2 } else { 0x82 };
    let mut f = vec![first, 0x80 | payload.len() as u8, 0, 0, 0, 0];
    f.extend_from_slice(payload);
    f
}

#[tokio::test]
async fn a_harness_the_node_drops_is_told_why_in_the_close_frame() {
    use crate::frame::Frame;
    use crate::socket::Message;
    use tokio::io::AsyncWriteExt;
    let hub = super::Hub::new(super::EXECUTOR_SILENCE_TIMEOUT);
    // A first message that claims no stream: 1008.
    let (serving, mut reader, mut w) = harness_socket(&hub, "reg");
    let harness = async {
        w.write_all(&client_frame(b"not a relay frame", false))
            .await
            .unwrap();
        reader.next().await.unwrap()
    };
    let ((), got) = tokio::join!(serving, harness);
    assert_eq!(got, Some(Message::Close(Some(1008))));
    // A claim for a registration that is not attached: 1013, try again
    // later (its executor may be reconnecting).
    let resume = Frame::resume("s1").encode();
    let (serving, mut reader, mut w) = harness_socket(&hub, "reg");
    let harness = async {
        w.write_all(&client_frame(&resume, false)).await.unwrap();
        reader.next().await.unwrap()
    };
    let ((), got) = tokio::join!(serving, harness);
    assert_eq!(got, Some(Message::Close(Some(1013))));
    // Claimed, then a frame with a reserved bit set: 1002.
    let attached = hub
        .attach_executor::<(), _>("env", "reg", || async { Ok(()) })
        .await
        .unwrap();
    let (serving, mut reader, mut w) = harness_socket(&hub, "reg");
    let harness = async {
        w.write_all(&client_frame(&resume, false)).await.unwrap();
        w.write_all(&client_frame(b"x", true)).await.unwrap();
        reader.next().await.unwrap()
    };
    let ((), got) = tokio::join!(serving, harness);
    assert_eq!(got, Some(Message::Close(Some(1002))));
    drop(attached);
}

#[tokio::test(start_paused = true)]
async fn a_harness_that_answers_no_pings_is_dropped_and_one_that_does_is_not() {
    use crate::socket::{Message, Outgoing, Role, Writer};
    use tokio::time::Instant;
    let (hub, mut attached) = hub_with_executor().await;
    // Claims, sends its handshake, then answers every Ping for ten
    // minutes: still connected.
    let (serving, mut reader, mut w) = harness_socket(&hub, "reg");
    claim(&mut w, "s1", Some(vec![1; 32])).await;
    let mut writer = Writer::new(w, Role::Client);
    let answering = async {
        executor_answers(&hub, "s1").await;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(600) {
            match reader.next().await.unwrap() {
                Some(Message::Ping(p)) => writer.send(&mut vec![Outgoing::Pong(p)]).await.unwrap(),
                Some(Message::Binary(_)) => continue, // msg2
                other => return Some(other),
            }
        }
        None
    };
    tokio::select! {
        () = serving => panic!("the node ended the socket of a harness that answers"),
        got = answering => assert_eq!(got, None, "an answering harness was dropped"),
    }
    // Answers nothing: dropped after the silence timeout, told why, and its
    // stream reset towards the executor.
    let (serving, mut reader, mut w) = harness_socket(&hub, "reg");
    claim(&mut w, "s2", Some(vec![1; 32])).await;
    let t0 = Instant::now();
    let silent = async {
        executor_answers(&hub, "s2").await;
        loop {
            match reader.next().await.unwrap() {
                Some(Message::Ping(_) | Message::Binary(_)) => continue,
                other => return other,
            }
        }
    };
    let bound = 3 * super::HARNESS_SILENCE_TIMEOUT;
    let (_, got) = tokio::time::timeout(bound, async { tokio::join!(serving, silent) })
        .await
        .expect("a silent harness was never dropped");
    assert_eq!(got, Some(Message::Close(Some(1008))));
    let waited = t0.elapsed();
    assert!(
        waited >= super::HARNESS_SILENCE_TIMEOUT
            && waited < super::HARNESS_SILENCE_TIMEOUT + Duration::from_secs(5),
        "dropped after {waited:?}"
    );
    assert!(
        told_reset(&mut attached, "s2"),
        "the executor was not told the stream ended"
    );
}

/// Once a harness has claimed `id` on `env`, the executor answers it with
/// its handshake (msg2), as a real one answers a valid msg1.
async fn executor_answers(hub: &super::Hub, id: &str) {
    let claimed = || {
        hub.lock()
            .get("env")
            .is_some_and(|r| r.streams.contains_key(id))
    };
    until("the stream is claimed", claimed).await;
    let msg2 = crate::frame::Frame::handshake(id, vec![2; 32]).encode();
    hub.route_to_harness("env", id, msg2.into(), super::Kind::Handshake);
}

/// Opens stream `id` of `env` on `hub` as a claimed harness would, with no
/// writer taking its frames (a harness that never reads).
fn open_stream(hub: &super::Hub, env: &str, id: &str) -> super::StreamLink {
    let mut routes = hub.lock();
    let route = routes.entry(env.to_string()).or_default();
    let stream = super::StreamLink {
        queue: super::HarnessQueue::new(route.buffered.clone(), hub.buffered.clone()),
        stop: Default::default(),
        close: Default::default(),
        established: Default::default(),
    };
    route.streams.insert(id.to_string(), stream.clone());
    stream
}

/// Many stalled streams in two environments, fed 250 KiB frames: neither
/// environment ever holds more than its budget nor the node more than its
/// own, the streams reset are the stalled ones (freed at once: what is
/// counted is what the open streams hold), and a stream whose harness reads
/// gets every frame and is never reset. Before the environment and node
/// budgets, 40 such streams took a node to 1.1 GB.
#[test]
fn stalled_streams_are_bounded_by_their_environment_and_the_node() {
    let node_limit = 96 << 20;
    let hub = super::Hub::with_buffer(super::EXECUTOR_SILENCE_TIMEOUT, node_limit);
    let stalled: Vec<(String, String, super::StreamLink)> = ["a", "b"]
        .iter()
        .flat_map(|env| (0..8).map(move |i| (env.to_string(), format!("s{i}"))))
        .map(|(env, id)| {
            let link = open_stream(&hub, &env, &id);
            (env, id, link)
        })
        .collect();
    let reader = open_stream(&hub, "b", "reading");
    let frame = bytes::Bytes::from(vec![7u8; 250 << 10]);
    let mut read = 0;
    for _ in 0..40 {
        for (env, id, _) in &stalled {
            hub.route_to_harness(env, id, frame.clone(), super::Kind::Other);
            let env_held = hub.lock()[env.as_str()].buffered.held();
            assert!(
                env_held <= super::ENVIRONMENT_BUFFER_BYTES,
                "{env} holds {env_held}"
            );
            assert!(
                hub.buffered_bytes() <= node_limit,
                "node holds {}",
                hub.buffered_bytes()
            );
        }
        hub.route_to_harness("b", "reading", frame.clone(), super::Kind::Other);
        while let Some(f) = reader.queue.try_recv() {
            reader.queue.release(crate::registry::queue::charge(&f));
            read += 1;
        }
    }
    assert_eq!(read, 40, "the reading stream lost frames");
    assert!(!reader.stop.is_cancelled(), "the reading stream was reset");
    for env in ["a", "b"] {
        let reset = stalled
            .iter()
            .filter(|(e, _, l)| e == env && l.stop.is_cancelled())
            .count();
        assert!(reset > 0, "no stalled stream of {env} was reset");
    }
    let open_held: usize = {
        let routes = hub.lock();
        routes
            .values()
            .flat_map(|r| r.streams.values())
            .map(|s| s.queue.held())
            .sum()
    };
    assert_eq!(
        hub.buffered_bytes(),
        open_held,
        "bytes counted are not bytes held"
    );
    for (_, _, link) in &stalled {
        if link.stop.is_cancelled() {
            assert_eq!(link.queue.held(), 0, "a reset stream still holds frames");
        }
    }
}

/// A harness that claims a stream and answers pings, with a handshake the
/// executor ignores (an empty one), is dropped once the claim timeout
/// passes (it held a connection slot forever before), told why, and its
/// stream reset.
#[tokio::test(start_paused = true)]
async fn a_claim_the_executor_never_answers_is_dropped() {
    use crate::socket::{Message, Outgoing, Role, Writer};
    use tokio::time::Instant;
    let (hub, mut attached) = hub_with_executor().await;
    let (serving, mut reader, mut w) = harness_socket(&hub, "reg");
    claim(&mut w, "s1", Some(Vec::new())).await;
    let mut writer = Writer::new(w, Role::Client);
    let t0 = Instant::now();
    let answering = async {
        loop {
            match reader.next().await.unwrap() {
                Some(Message::Ping(p)) => writer.send(&mut vec![Outgoing::Pong(p)]).await.unwrap(),
                other => return other,
            }
        }
    };
    let (_, got) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(serving, answering)
    })
    .await
    .expect("a claim without a handshake was kept");
    assert!(matches!(got, Some(Message::Close(Some(1008)))), "{got:?}");
    let waited = t0.elapsed();
    assert!(
        waited >= super::CLAIM_TIMEOUT && waited < super::CLAIM_TIMEOUT + Duration::from_secs(2),
        "dropped after {waited:?}"
    );
    assert!(
        told_reset(&mut attached, "s1"),
        "the executor was not told the stream ended"
    );
}

/// Until `done` holds, yields to the node's tasks (bounded: 5 s).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A harness writer that took a batch and is blocked writing it to a
/// socket nobody reads: the batch still counts against the budgets (it
/// stopped counting once taken, so 256 such sockets held 1.5 GB past a
/// 512 MiB budget), and a reset makes the writer let go of it at once.
#[tokio::test]
async fn frames_a_blocked_writer_holds_count_until_a_reset_frees_them() {
    let (hub, _attached) = hub_with_executor().await;
    let (serving, _reader, mut w) = harness_socket(&hub, "reg");
    claim(&mut w, "s1", Some(vec![1; 32])).await;
    let stream = || {
        hub.lock()
            .get("env")
            .and_then(|r| r.streams.get("s1").cloned())
    };
    let test = async {
        until("the stream is claimed", || stream().is_some()).await;
        let frame = bytes::Bytes::from(vec![7u8; 200 << 10]);
        for _ in 0..8 {
            hub.route_to_harness("env", "s1", frame.clone(), super::Kind::Other);
        }
        let queue = stream().unwrap().queue;
        until("the writer takes the frames", || queue.queued_frames() == 0).await;
        // The first frame went through as far as the socket's 64 KiB took
        // it (its 10-byte header and the start of its payload): the node
        // holds the rest of it, and all of the seven behind it.
        let charged = 8 * crate::registry::queue::charge(&frame) - (1 << 16) + 10;
        assert_eq!(
            hub.buffered_bytes(),
            charged,
            "taken frames stopped counting"
        );
        hub.reset_stream("env", "s1", super::Scope::Stream);
        until("the reset frees the writer's batch", || {
            hub.buffered_bytes() == 0
        })
        .await;
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(serving, test)
    })
    .await
    .expect("the reset socket's task ended");
}

/// An executor that resets a stream ends it at the node too: the harness
/// gets the Reset, then its socket is closed (a harness that ignored the
/// Reset kept its socket and slot).
#[tokio::test]
async fn an_executor_reset_closes_the_harness_socket_after_it() {
    use crate::frame::{Body, Frame};
    use crate::socket::Message;
    use tokio::io::AsyncWriteExt;
    let (hub, _attached) = hub_with_executor().await;
    let (serving, mut reader, mut w) = harness_socket(&hub, "reg");
    w.write_all(&client_frame(&Frame::resume("s1").encode(), false))
        .await
        .unwrap();
    let harness = async {
        executor_answers(&hub, "s1").await;
        let reset = Frame::reset("s1", "noise_relay_protocol_error").encode();
        hub.route_to_harness("env", "s1", reset.into(), super::Kind::Reset);
        let mut got = Vec::new();
        while let Some(m) = reader.next().await.unwrap() {
            got.push(m);
        }
        got
    };
    let ((), got) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(serving, harness)
    })
    .await
    .expect("the harness socket was not closed after the reset");
    let bodies: Vec<_> = got
        .iter()
        .map(|m| match m {
            Message::Binary(b) => Frame::decode(b).ok().and_then(|f| f.body).map(|b| match b {
                Body::Handshake { .. } => "handshake",
                Body::Reset { .. } => "reset",
                _ => "other",
            }),
            Message::Close(_) => Some("close"),
            _ => None,
        })
        .collect();
    assert_eq!(
        bodies,
        [Some("handshake"), Some("reset"), Some("close")],
        "{got:?}"
    );
    assert!(!hub.lock()["env"].streams.contains_key("s1"));
}

/// Answers with the cipher its end of the stream uses, then echoes.
fn cipher_echo_handler() -> StreamHandler {
    Arc::new(|mut ch: Channel| {
        tokio::spawn(async move {
            let mine = format!("{:?}", ch.transport_cipher).into_bytes();
            if ch.outbound.send(mine.into()).await.is_err() {
                return;
            }
            while let Some(m) = ch.inbound.recv().await {
                if ch.outbound.send(m.into()).await.is_err() {
                    return;
                }
            }
        });
    })
}

/// Our harness and our executor seal with AEGIS-256X2 when the harness
/// offers it and the executor takes it; either end keeping AES-GCM keeps
/// the reference's records. Both ends report the same cipher, and a
/// 100 kB message (two records) comes back exact every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_ends_agree_on_aegis_unless_either_keeps_aes_gcm() {
    use crate::noise::TransportCipher::{Aegis256X2, AesGcm};
    let base = crate::testing::memory_registry().await;
    let client = RegistryClient::new(&base, "harness", None, true).unwrap();
    let me = Identity::generate(&mut OsRandom);
    let message: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    for (n, (takes, offer, agreed)) in [
        (Aegis256X2, Aegis256X2, Aegis256X2),
        (Aegis256X2, AesGcm, AesGcm),
        (AesGcm, Aegis256X2, AesGcm),
    ]
    .into_iter()
    .enumerate()
    {
        let env = format!("cipher-{n}");
        let config = executor::Config {
            registry: RegistryClient::new(&base, "exec", None, true).unwrap(),
            environment_id: env.clone(),
            keepalive: executor::KEEPALIVE,
            pong_timeout: executor::PONG_TIMEOUT,
            observer: Arc::new(executor::NoObserver),
            transport_cipher: takes,
        };
        let exec = tokio::spawn(executor::run(config, cipher_echo_handler()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut ch = loop {
            match harness::connect_offering(&client, &env, &me, offer).await {
                Ok(ch) => break ch,
                Err(e) => assert!(Instant::now() < deadline, "executor never attached: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(ch.transport_cipher, agreed, "harness, case {n}");
        let theirs = ch.inbound.recv().await.unwrap();
        assert_eq!(
            theirs,
            format!("{agreed:?}").as_bytes(),
            "executor, case {n}"
        );
        ch.outbound.send(message.clone().into()).await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(10), ch.inbound.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(back == message, "echo differs, case {n}");
        exec.abort();
    }
}
