use super::*;

#[test]
fn each_budget_refuses_with_its_scope_and_gives_the_frame_back() {
    let frame = Bytes::from(vec![1u8; 1000]);
    let cost = charge(&frame);
    // Room for two frames in the environment, three on the node.
    let environment = Pool::new(2 * cost);
    let node = Pool::new(3 * cost);
    let a = HarnessQueue::new(environment.clone(), node.clone());
    let b = HarnessQueue::new(Pool::new(usize::MAX), node.clone());
    assert!(a.send(frame.clone()).is_ok() && a.send(frame.clone()).is_ok());
    match a.send(frame.clone()) {
        Err(Refused::Over(Scope::Environment, back)) => assert_eq!(back, frame),
        other => panic!("{other:?}"),
    }
    assert!(b.send(frame.clone()).is_ok());
    assert!(matches!(
        b.send(frame.clone()),
        Err(Refused::Over(Scope::Node, _))
    ));
    // A refusal takes nothing.
    assert_eq!((environment.held(), node.held()), (2 * cost, 3 * cost));
    let big = Bytes::from(vec![0u8; STREAM_BUFFER_BYTES]);
    let c = HarnessQueue::new(Pool::new(usize::MAX), Pool::new(usize::MAX));
    assert!(matches!(c.send(big), Err(Refused::Over(Scope::Stream, _))));
}

#[tokio::test]
async fn taking_a_frame_or_forfeiting_frees_it_everywhere() {
    let frame = Bytes::from(vec![1u8; 4096]);
    let (environment, node) = (Pool::new(1 << 20), Pool::new(1 << 20));
    let q = HarnessQueue::new(environment.clone(), node.clone());
    for _ in 0..3 {
        q.send(frame.clone()).unwrap();
    }
    assert_eq!(q.try_recv(), Some(frame.clone()));
    // Taken but not yet written: still counted.
    assert_eq!(q.held(), 3 * charge(&frame));
    q.release(charge(&frame));
    assert_eq!(q.held(), 2 * charge(&frame));
    assert_eq!((environment.held(), node.held()), (q.held(), q.held()));
    assert_eq!(q.forfeit(), 2 * charge(&frame));
    assert_eq!((q.held(), environment.held(), node.held()), (0, 0, 0));
    assert!(matches!(q.send(frame), Err(Refused::Gone)));
    assert_eq!(q.try_recv(), None, "a forfeited queue gives nothing more");
}

/// A queue whose harness socket is one end of an in-memory pipe of
/// `capacity` bytes; the other end read as the harness would.
fn attached(capacity: usize) -> (HarnessQueue, crate::socket::Reader<tokio::io::DuplexStream>) {
    let (node, harness) = tokio::io::duplex(capacity);
    let q = HarnessQueue::new(Pool::new(1 << 20), Pool::new(1 << 20));
    q.attach(Writer::new(Box::new(node), crate::socket::Role::Server));
    let peer = crate::socket::Reader::new(harness, crate::socket::Role::Client, 1 << 20);
    (q, peer)
}

/// Starts `q`'s writer task; the stop token it watches.
fn writer_task(
    q: &HarnessQueue,
) -> (
    tokio::task::JoinHandle<()>,
    tokio_util::sync::CancellationToken,
) {
    let stop = tokio_util::sync::CancellationToken::new();
    let (_pong_tx, pongs) = tokio::sync::mpsc::channel(1);
    let task = super::super::harness_writer::spawn(
        q.clone(),
        pongs,
        (stop.clone(), Default::default()),
        std::time::Duration::from_secs(3600),
    );
    (task, stop)
}

async fn next_binary(peer: &mut crate::socket::Reader<tokio::io::DuplexStream>) -> Bytes {
    match peer.next().await {
        Ok(Some(crate::socket::Message::Binary(b))) => b,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn frames_are_written_through_in_order_while_the_writer_is_idle() {
    let (q, mut peer) = attached(1 << 20);
    q.send(Bytes::from_static(b"a")).unwrap();
    assert_eq!((q.queued_frames(), q.held()), (0, 0), "written through");
    // While a turn holds the writer, frames queue (charged); once it is
    // idle again, the next send writes them first, then its own.
    let mut batch = vec![Outgoing::Ping(Bytes::new())];
    let Turn::Write {
        writer,
        owed: None,
        charge: 0,
        lead: None,
        piped: None,
    } = q.take_turn(&mut batch)
    else {
        panic!("a turn for the ping");
    };
    q.send(Bytes::from_static(b"b")).unwrap();
    q.send(Bytes::from_static(b"c")).unwrap();
    assert_eq!(q.queued_frames(), 2);
    assert_eq!(q.held(), 2 * charge(&Bytes::from_static(b"b")));
    q.end_turn(Some(writer), 0);
    q.send(Bytes::from_static(b"d")).unwrap();
    assert_eq!((q.queued_frames(), q.held(), q.node.held()), (0, 0, 0));
    let (task, _stop) = writer_task(&q);
    q.close();
    for want in [&b"a"[..], b"b", b"c", b"d"] {
        assert_eq!(next_binary(&mut peer).await, want);
    }
    assert!(matches!(
        peer.next().await,
        Ok(Some(crate::socket::Message::Close(_)))
    ));
    task.await.unwrap();
}

#[tokio::test]
async fn the_rest_of_a_frame_written_through_in_part_goes_before_anything_else() {
    // The pipe takes 1000 bytes: a 5000-byte frame goes through in part,
    // its rest is charged, and the frame after it waits for that rest.
    let (q, mut peer) = attached(1000);
    let big = Bytes::from((0..5000u32).map(|i| i as u8).collect::<Vec<u8>>());
    q.send(big.clone()).unwrap();
    let rest = big.len() + 4 - 1000;
    assert_eq!(q.held(), rest + QUEUED_FRAME_OVERHEAD);
    assert_eq!(q.environment.held(), q.held());
    q.send(Bytes::from_static(b"after")).unwrap();
    assert_eq!(q.queued_frames(), 1, "queued behind the rest");
    let (task, _stop) = writer_task(&q);
    q.close();
    assert_eq!(next_binary(&mut peer).await, big);
    assert_eq!(next_binary(&mut peer).await, &b"after"[..]);
    assert!(matches!(
        peer.next().await,
        Ok(Some(crate::socket::Message::Close(_)))
    ));
    task.await.unwrap();
    assert_eq!((q.held(), q.environment.held(), q.node.held()), (0, 0, 0));
}

#[tokio::test]
async fn a_stream_reset_with_a_frame_half_written_frees_its_rest() {
    let (q, _peer) = attached(1000);
    q.send(Bytes::from(vec![9u8; 5000])).unwrap();
    assert!(q.held() > 0);
    let (writer, owed) = q.finish().expect("the writer is idle");
    assert!(owed.is_some_and(|r| r.len() == 5004 - 1000));
    assert_eq!((q.held(), q.environment.held(), q.node.held()), (0, 0, 0));
    drop(writer);
    assert!(matches!(
        q.send(Bytes::from_static(b"x")),
        Err(Refused::Gone)
    ));
}

/// A socket whose every write fails.
struct Broken;

impl tokio::io::AsyncWrite for Broken {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_failed_write_through_ends_the_writer_without_a_close_frame() {
    let q = HarnessQueue::new(Pool::new(1 << 20), Pool::new(1 << 20));
    q.attach(Writer::new(Box::new(Broken), crate::socket::Role::Server));
    assert!(matches!(
        q.send(Bytes::from_static(b"x")),
        Err(Refused::Gone)
    ));
    // Nothing more goes to that socket, and the task ends (its stop fired,
    // so the harness's reader ends too).
    let (task, stop) = writer_task(&q);
    tokio::time::timeout(std::time::Duration::from_secs(10), task)
        .await
        .expect("the writer ends")
        .unwrap();
    assert!(stop.is_cancelled());
    assert!(q.finish().is_none(), "a broken writer is not handed out");
}

/// `payload` as one binary frame masked with `key`, as an executor sends it.
fn masked_frame(payload: &[u8], key: [u8; 4]) -> Vec<u8> {
    let head = exec_server_wsframe::frame::header(
        true,
        exec_server_wsframe::frame::OpCode::Binary,
        payload.len(),
        Some(key),
    );
    let mut frame = head.as_slice().to_vec();
    let at = frame.len();
    frame.extend_from_slice(payload);
    exec_server_wsframe::mask::apply_mask(&mut frame[at..], key, 0);
    frame
}

#[tokio::test]
async fn frames_passed_on_as_sent_reach_a_harness_that_takes_masked_frames() {
    let (node, harness) = tokio::io::duplex(1 << 20);
    let q = HarnessQueue::new(Pool::new(1 << 20), Pool::new(1 << 20));
    q.attach(Writer::new(Box::new(node), crate::socket::Role::Server));
    let mut peer =
        crate::socket::Reader::new(harness, crate::socket::Role::Client, 1 << 20).accept_masked();
    // A frame as the executor masked it, in two raw pieces (as when the
    // pipe filled part way), between two frames the node framed itself.
    let payload: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
    let raw = masked_frame(&payload, [9, 8, 7, 6]);
    q.send(Bytes::from_static(b"before")).unwrap();
    let n = raw.len() + QUEUED_FRAME_OVERHEAD;
    let reserved = q.reserve(n).unwrap();
    assert_eq!(q.held(), n);
    let items = vec![
        Item::Raw(Bytes::copy_from_slice(&raw[..1000])),
        Item::Raw(Bytes::copy_from_slice(&raw[1000..])),
    ];
    q.send_reserved(items, reserved).unwrap();
    // Raw bytes wait for the writer task, charged as they are (the second
    // piece's overhead on top of the reservation).
    assert_eq!(q.held(), raw.len() + 2 * QUEUED_FRAME_OVERHEAD);
    q.send(Bytes::from_static(b"after")).unwrap();
    let (task, _stop) = writer_task(&q);
    q.close();
    assert_eq!(next_binary(&mut peer).await, &b"before"[..]);
    assert_eq!(next_binary(&mut peer).await, payload);
    assert_eq!(next_binary(&mut peer).await, &b"after"[..]);
    task.await.unwrap();
    assert_eq!((q.held(), q.environment.held(), q.node.held()), (0, 0, 0));
}

#[test]
fn a_reservation_not_used_is_given_back() {
    let (environment, node) = (Pool::new(1 << 20), Pool::new(1 << 20));
    let q = HarnessQueue::new(environment.clone(), node.clone());
    let reserved = q.reserve(5000).unwrap();
    assert_eq!(
        (q.held(), environment.held(), node.held()),
        (5000, 5000, 5000)
    );
    drop(reserved);
    assert_eq!((q.held(), environment.held(), node.held()), (0, 0, 0));
    // Past a budget: refused with its scope, nothing taken.
    assert_eq!(
        q.reserve(STREAM_BUFFER_BYTES + 1).err(),
        Some(Scope::Stream)
    );
    assert_eq!(
        HarnessQueue::new(Pool::new(10), node.clone())
            .reserve(11)
            .err(),
        Some(Scope::Environment)
    );
    assert_eq!(node.held(), 0);
    // A queue closed meanwhile takes nothing and keeps nothing.
    let reserved = q.reserve(5000).unwrap();
    q.forfeit();
    assert!(matches!(
        q.send_reserved(vec![Item::Raw(Bytes::from_static(b"x"))], reserved),
        Err(Refused::Gone)
    ));
    assert_eq!((q.held(), environment.held(), node.held()), (0, 0, 0));
}

#[tokio::test]
async fn pipes_are_made_within_the_nodes_budget_and_given_back_with_their_stream() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp = || async {
        let s = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        crate::socket::splice::SharedTcp::new(s)
    };
    let budget = Arc::new(PipeBudget::new(1));
    let a = Splicing::new(tcp().await, budget.clone());
    let b = Splicing::new(tcp().await, budget.clone());
    assert_eq!(budget.open(), 0, "no pipe before one is needed");
    assert!(a.pipe().is_some() && a.pipe().is_some());
    assert_eq!(budget.open(), 1);
    assert!(b.pipe().is_none(), "past the budget: read as usual");
    drop(a);
    assert_eq!(budget.open(), 0);
    assert!(b.pipe().is_some(), "a stream that ended gave its pipe back");
    assert_eq!(budget.open(), 1);
}

/// A connected loopback pair.
async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = tokio::net::TcpStream::connect(l.local_addr().unwrap())
        .await
        .unwrap();
    (a, l.accept().await.unwrap().0)
}

/// A queue splicing to a loopback socket (its other end returned) that
/// holds the rest of a frame, read, after the frame's start went through
/// its pipe (as when the pipe filled half way); the frame's payload.
async fn half_piped_frame(round: u8) -> (HarnessQueue, tokio::net::TcpStream, Vec<u8>) {
    use crate::socket::splice::{read_exact, splice_in, SharedTcp, SplicedIn};
    use tokio::io::AsyncWriteExt;
    let (node_end, harness_end) = tcp_pair().await;
    let (mut executor, executor_end) = tcp_pair().await;
    let node_end = SharedTcp::new(node_end);
    let splicing = Splicing::new(node_end.clone(), Arc::new(PipeBudget::new(1)));
    let q = HarnessQueue::new(Pool::new(1 << 20), Pool::new(1 << 20)).with_splicing(splicing);
    q.attach(Writer::new(Box::new(node_end), crate::socket::Role::Server));
    let payload: Vec<u8> = (0..20_000u32).map(|i| (i as u8) ^ round).collect();
    let frame = masked_frame(&payload, [1, 2, 3, round]);
    executor.write_all(&frame).await.unwrap();
    let splicing = q.splicing().unwrap().clone();
    let pipe = splicing.pipe().unwrap();
    let mut moved = 0;
    while moved < 5000 {
        match splice_in(&executor_end, pipe, 5000 - moved).await.unwrap() {
            SplicedIn::Moved(n) => moved += n,
            other => panic!("{other:?}"),
        }
    }
    let rest = read_exact(&executor_end, frame.len() - moved)
        .await
        .unwrap();
    let reserved = q.reserve(frame.len() + QUEUED_FRAME_OVERHEAD).unwrap();
    // The piped start is written through at once; the rest waits.
    q.send_reserved(vec![Item::Piped(moved), Item::Raw(rest.freeze())], reserved)
        .unwrap();
    (q, harness_end, payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pong_never_lands_inside_a_frame_whose_rest_was_read() {
    use crate::socket::{Message, Reader, Role};
    // The writer task may take the pong or the frame's rest first (its
    // select is not biased): many rounds, so a pong written between the
    // two parts of the frame would show.
    for round in 0..20u8 {
        let (q, harness_end, payload) = half_piped_frame(round).await;
        let (pong_tx, pongs) = tokio::sync::mpsc::channel(1);
        pong_tx.send(Bytes::from_static(b"P")).await.unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let task = super::super::harness_writer::spawn(
            q.clone(),
            pongs,
            (stop.clone(), Default::default()),
            std::time::Duration::from_secs(3600),
        );
        let mut harness = Reader::new(harness_end, Role::Client, 1 << 20).accept_masked();
        let mut got = Vec::new();
        while got.len() < 2 {
            match tokio::time::timeout(std::time::Duration::from_secs(10), harness.next())
                .await
                .unwrap()
            {
                Ok(Some(Message::Binary(b))) => got.push(Some(b)),
                Ok(Some(Message::Pong)) => got.push(None),
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert!(
            got.contains(&Some(Bytes::from(payload))) && got.contains(&None),
            "round {round}: the frame whole and the pong"
        );
        stop.cancel();
        let _ = task.await;
    }
}

#[tokio::test]
async fn a_stream_ended_inside_a_frame_gets_no_close_frame() {
    let (q, _harness_end, _) = half_piped_frame(0).await;
    // Reset with the frame's rest unwritten: a close frame would land
    // inside the frame, so the writer gets no socket to send one on.
    assert!(q.finish().is_none());
    assert_eq!((q.held(), q.environment.held(), q.node.held()), (0, 0, 0));
}
