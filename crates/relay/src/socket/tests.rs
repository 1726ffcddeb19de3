use super::*;
use bytes::{Bytes, BytesMut};
use exec_server_wsframe::frame::{header, OpCode};
use exec_server_wsframe::mask::apply_mask;
use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::protocol::Role as TRole;
use tokio_tungstenite::tungstenite::Message as TMessage;
use tokio_tungstenite::WebSocketStream;

const SIZES: [usize; 8] = [0, 1, 125, 126, 65_535, 65_536, 300_000, 17];

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// One binary message of each of [`SIZES`], message `i` seeded with `i`.
fn sized_batch() -> Vec<Outgoing> {
    SIZES
        .iter()
        .enumerate()
        .map(|(i, n)| Outgoing::Binary(payload(*n, i as u8).into()))
        .collect()
}

async fn tungstenite_peer(
    io: tokio::io::DuplexStream,
    role: TRole,
) -> WebSocketStream<tokio::io::DuplexStream> {
    WebSocketStream::from_raw_socket(io, role, None).await
}

#[tokio::test]
async fn a_server_reads_what_a_tungstenite_client_sends() {
    let (a, b) = tokio::io::duplex(1 << 16);
    let (r, _w) = tokio::io::split(a);
    let mut reader = Reader::new(r, Role::Server, 1 << 20);
    let sender = tokio::spawn(async move {
        let mut ws = tungstenite_peer(b, TRole::Client).await;
        for (i, n) in SIZES.iter().enumerate() {
            ws.send(TMessage::Binary(payload(*n, i as u8).into()))
                .await
                .unwrap();
        }
        ws.send(TMessage::Ping(Bytes::from_static(b"hi")))
            .await
            .unwrap();
        ws.send(TMessage::Text("words".into())).await.unwrap();
        ws.send(TMessage::Close(None)).await.unwrap();
        ws
    });
    for (i, n) in SIZES.iter().enumerate() {
        let m = reader.next().await.unwrap().unwrap();
        assert_eq!(
            m,
            Message::Binary(payload(*n, i as u8).into()),
            "message {i}"
        );
    }
    assert_eq!(
        reader.next().await.unwrap(),
        Some(Message::Ping(Bytes::from_static(b"hi")))
    );
    assert_eq!(
        reader.next().await.unwrap(),
        Some(Message::Text(Bytes::from_static(b"words")))
    );
    assert_eq!(reader.next().await.unwrap(), Some(Message::Close(None)));
    drop(sender.await.unwrap());
}

#[tokio::test]
async fn a_tungstenite_client_reads_what_a_server_writes() {
    let (a, b) = tokio::io::duplex(1 << 16);
    let (_r, w) = tokio::io::split(a);
    let mut writer = Writer::new(w, Role::Server);
    let reading = tokio::spawn(async move {
        let mut ws = tungstenite_peer(b, TRole::Client).await;
        let mut got = Vec::new();
        while let Some(Ok(m)) = ws.next().await {
            let end = matches!(m, TMessage::Close(_));
            got.push(m);
            if end {
                break;
            }
        }
        got
    });
    let mut batch = sized_batch();
    writer.send(&mut batch).await.unwrap();
    writer
        .send(&mut vec![Outgoing::Ping(Bytes::from_static(b"p"))])
        .await
        .unwrap();
    writer.close(None).await.unwrap();
    let got = reading.await.unwrap();
    assert_eq!(got.len(), SIZES.len() + 2);
    for (i, n) in SIZES.iter().enumerate() {
        assert_eq!(
            got[i],
            TMessage::Binary(payload(*n, i as u8).into()),
            "message {i}"
        );
    }
    assert_eq!(got[SIZES.len()], TMessage::Ping(Bytes::from_static(b"p")));
    assert!(matches!(got[SIZES.len() + 1], TMessage::Close(_)));
}

#[tokio::test]
async fn a_client_round_trips_with_a_tungstenite_server() {
    let (a, b) = tokio::io::duplex(1 << 16);
    let (r, w) = tokio::io::split(a);
    let mut reader = Reader::new(r, Role::Client, 1 << 20);
    let mut writer = Writer::new(w, Role::Client);
    // The server echoes each binary message; tungstenite refuses unmasked
    // frames from a client, so this also proves the masking.
    let echo = tokio::spawn(async move {
        let mut ws = tungstenite_peer(b, TRole::Server).await;
        while let Some(Ok(m)) = ws.next().await {
            match m {
                TMessage::Binary(b) => ws.send(TMessage::Binary(b)).await.unwrap(),
                TMessage::Close(_) => break,
                _ => {}
            }
        }
    });
    let mut batch = sized_batch();
    // Written while the echoes are read: neither side can fill the pipe
    // and wait for the other.
    let sending = tokio::spawn(async move {
        writer.send(&mut batch).await.unwrap();
        writer
    });
    let read_all = async {
        for (i, n) in SIZES.iter().enumerate() {
            let m = reader.next().await.unwrap().unwrap();
            assert_eq!(
                m,
                Message::Binary(payload(*n, i as u8).into()),
                "message {i}"
            );
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), read_all)
        .await
        .expect("every echo within 20 s");
    let mut writer = sending.await.unwrap();
    writer.close(None).await.unwrap();
    echo.await.unwrap();
}

/// A masked frame as a client would send it, `fin` and `opcode` as given.
fn masked_frame(fin: bool, opcode: OpCode, body: &[u8]) -> Vec<u8> {
    let key = [0x12, 0x34, 0x56, 0x78];
    let mut out = header(fin, opcode, body.len(), Some(key))
        .as_slice()
        .to_vec();
    let at = out.len();
    out.extend_from_slice(body);
    apply_mask(&mut out[at..], key, 0);
    out
}

async fn server_reads(bytes: Vec<u8>, limit: usize) -> Vec<Result<Option<Message>, String>> {
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let (r, _w) = tokio::io::split(a);
    let mut reader = Reader::new(r, Role::Server, limit);
    b.write_all(&bytes).await.unwrap();
    drop(b);
    let mut out = Vec::new();
    for _ in 0..8 {
        let m = reader.next().await.map_err(|e| e.to_string());
        let end = !matches!(m, Ok(Some(_)));
        out.push(m);
        if end {
            break;
        }
    }
    out
}

#[tokio::test]
async fn fragments_are_reassembled_around_a_ping() {
    let mut wire = masked_frame(false, OpCode::Binary, b"abc");
    wire.extend(masked_frame(true, OpCode::Ping, b"x"));
    wire.extend(masked_frame(false, OpCode::Continue, b"def"));
    wire.extend(masked_frame(true, OpCode::Continue, b"g"));
    let got = server_reads(wire, 1 << 10).await;
    assert_eq!(
        got,
        vec![
            Ok(Some(Message::Ping(Bytes::from_static(b"x")))),
            Ok(Some(Message::Binary(Bytes::from_static(b"abcdefg")))),
            Ok(None),
        ]
    );
}

#[tokio::test]
async fn protocol_violations_are_refused() {
    let unmasked = header(true, OpCode::Binary, 0, None);
    let mut reserved = masked_frame(true, OpCode::Binary, b"a");
    reserved[0] |= 0x40;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unmasked", unmasked.as_slice().to_vec()),
        ("reserved", reserved),
        ("opcode", {
            let mut w = masked_frame(true, OpCode::Binary, b"");
            w[0] = 0x83;
            w
        }),
        ("long ping", masked_frame(true, OpCode::Ping, &[0u8; 126])),
        ("fragmented ping", masked_frame(false, OpCode::Ping, b"")),
        (
            "stray continuation",
            masked_frame(true, OpCode::Continue, b"a"),
        ),
        ("nested message", {
            let mut w = masked_frame(false, OpCode::Binary, b"a");
            w.extend(masked_frame(true, OpCode::Binary, b"b"));
            w
        }),
    ];
    for (name, wire) in cases {
        let got = server_reads(wire, 1 << 10).await;
        let last = got.last().unwrap();
        assert!(
            matches!(last, Err(e) if e.contains("protocol error")),
            "{name}: {got:?}"
        );
    }
}

#[tokio::test]
async fn an_oversized_message_is_refused_before_its_payload_arrives() {
    // Only the header of a 1 MiB frame is sent: the reader must not wait
    // for (or allocate) the payload.
    let h = header(true, OpCode::Binary, 1 << 20, Some([1, 2, 3, 4]));
    let (a, mut b) = tokio::io::duplex(1 << 10);
    let (r, _w) = tokio::io::split(a);
    let mut reader = Reader::new(r, Role::Server, 1 << 16);
    b.write_all(h.as_slice()).await.unwrap();
    let err = tokio::time::timeout(std::time::Duration::from_secs(5), reader.next())
        .await
        .expect("refused at once")
        .unwrap_err();
    assert!(matches!(err, WsError::TooLong { len, limit } if len == 1 << 20 && limit == 1 << 16));
    // Fragments count together.
    let mut wire = masked_frame(false, OpCode::Binary, &[0u8; 600]);
    wire.extend(masked_frame(true, OpCode::Continue, &[0u8; 600]));
    let got = server_reads(wire, 1000).await;
    assert!(
        matches!(got.last(), Some(Err(e)) if e.contains("exceeds")),
        "{got:?}"
    );
}

#[tokio::test]
async fn a_connection_cut_inside_a_frame_is_an_error_and_between_frames_an_end() {
    let whole = masked_frame(true, OpCode::Binary, &[7u8; 20_000]);
    let got = server_reads(whole[..10_000].to_vec(), 1 << 20).await;
    assert!(
        matches!(got.last(), Some(Err(e)) if e.contains("read failed")),
        "{got:?}"
    );
    let got = server_reads(whole, 1 << 20).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[1], Ok(None));
}

/// Reads the one frame `wire` holds, fed in 1 KB pieces, with a tick after
/// each piece winning a (biased) select, so that most reads are dropped
/// mid-frame: with `target`, by `next_appending` into it, else by `next`.
/// Returns what was read and how many reads were dropped.
async fn read_interrupted(wire: Vec<u8>, mut target: Option<&mut BytesMut>) -> (Next, u32) {
    let (a, mut b) = tokio::io::duplex(1 << 10);
    let (r, _w) = tokio::io::split(a);
    let mut reader = Reader::new(r, Role::Server, 1 << 20);
    let (tick_tx, mut tick_rx) = tokio::sync::mpsc::channel::<()>(1);
    let feeding = tokio::spawn(async move {
        for piece in wire.chunks(1024) {
            b.write_all(piece).await.unwrap();
            tick_tx.send(()).await.unwrap();
        }
        b
    });
    let mut cancelled = 0u32;
    let got = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            let read = async {
                match target.as_deref_mut() {
                    Some(t) => reader.next_appending(t).await,
                    None => reader.next().await.map(|m| m.map(Next::Message)),
                }
            };
            tokio::select! {
                biased;
                Some(()) = tick_rx.recv() => cancelled += 1,
                m = read => break m.unwrap().unwrap(),
            }
        }
    })
    .await
    .expect("the frame within 20 s");
    drop(feeding.await.unwrap());
    (got, cancelled)
}

#[tokio::test]
async fn a_read_cancelled_mid_frame_loses_nothing() {
    // A 200 KB frame arrives in 1 KB pieces, and after each piece a tick
    // wins the (biased) select: every dropped `next()` must leave its bytes
    // for the next one.
    let body = payload(200_000, 3);
    let wire = masked_frame(true, OpCode::Binary, &body);
    let pieces = wire.len().div_ceil(1024) as u32;
    let (got, cancelled) = read_interrupted(wire, None).await;
    assert_eq!(got, Next::Message(Message::Binary(body.into())));
    assert!(
        cancelled >= pieces / 2,
        "interrupted only {cancelled} times of {pieces}"
    );
}

#[tokio::test]
async fn a_client_never_masks_a_payload_someone_else_holds() {
    let (a, b) = tokio::io::duplex(1 << 20);
    let (_r, w) = tokio::io::split(a);
    let mut writer = Writer::new(w, Role::Client);
    let kept = Bytes::from(payload(70_000, 5));
    let alone = Bytes::from(payload(70_000, 6));
    writer
        .send(&mut vec![
            Outgoing::Binary(kept.clone()),
            Outgoing::Binary(alone),
        ])
        .await
        .unwrap();
    // The shared buffer is as it was; the peer unmasks both correctly.
    assert_eq!(kept, Bytes::from(payload(70_000, 5)));
    let mut ws = tungstenite_peer(b, TRole::Server).await;
    for seed in [5u8, 6] {
        let m = ws.next().await.unwrap().unwrap();
        assert_eq!(m, TMessage::Binary(payload(70_000, seed).into()));
    }
}

#[tokio::test]
async fn a_ping_between_fragments_does_not_count_against_the_message() {
    // 1000 bytes in two fragments, the limit exactly, with a 100-byte ping
    // between them: a control frame is not part of the message.
    let mut wire = masked_frame(false, OpCode::Binary, &[1u8; 999]);
    wire.extend(masked_frame(true, OpCode::Ping, &[2u8; 100]));
    wire.extend(masked_frame(true, OpCode::Continue, &[1u8; 1]));
    let got = server_reads(wire, 1000).await;
    assert_eq!(
        got,
        vec![
            Ok(Some(Message::Ping(Bytes::from(vec![2u8; 100])))),
            Ok(Some(Message::Binary(Bytes::from(vec![1u8; 1000])))),
            Ok(None),
        ]
    );
}

#[tokio::test]
async fn a_small_frame_holds_only_its_own_bytes() {
    // Many tiny frames read in one go: each payload must be a buffer of its
    // own, not a slice pinning the reader's read-ahead (a queued flood of
    // them would otherwise hold kilobytes each).
    let mut wire = Vec::new();
    for i in 0..200u8 {
        wire.extend(masked_frame(true, OpCode::Binary, &[i; 15]));
    }
    let (a, mut b) = tokio::io::duplex(1 << 16);
    let (r, _w) = tokio::io::split(a);
    let mut reader = Reader::new(r, Role::Server, 1 << 10);
    b.write_all(&wire).await.unwrap();
    for i in 0..200 {
        let m = reader.next().await;
        let Ok(Some(Message::Binary(b))) = m else {
            panic!("frame {i}: {m:?}");
        };
        let own = b
            .try_into_mut()
            .unwrap_or_else(|_| panic!("frame {i} shares its buffer"));
        assert_eq!(&own[..], &[i as u8; 15][..]);
        assert!(
            own.capacity() < 64,
            "frame {i} holds {} bytes",
            own.capacity()
        );
    }
}

#[tokio::test]
async fn appending_puts_whole_binary_frames_at_the_end_of_the_target() {
    // Large and small binary frames go to the target's end; a ping, a text
    // message and a fragmented binary message come as messages of their own
    // and leave the target as it was.
    let big = payload(300_000, 1);
    let mut wire = masked_frame(true, OpCode::Binary, &big);
    wire.extend(masked_frame(true, OpCode::Ping, b"p"));
    wire.extend(masked_frame(false, OpCode::Binary, b"frag"));
    wire.extend(masked_frame(true, OpCode::Continue, b"ment"));
    wire.extend(masked_frame(true, OpCode::Text, b"words"));
    wire.extend(masked_frame(true, OpCode::Binary, b"tiny"));
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let (r, _w) = tokio::io::split(a);
    let mut reader = Reader::new(r, Role::Server, 1 << 20);
    let feeding = tokio::spawn(async move {
        b.write_all(&wire).await.unwrap();
        b
    });
    let mut target = BytesMut::from(&b"kept"[..]);
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(reader.next_appending(&mut target).await.unwrap().unwrap());
    }
    assert_eq!(
        got,
        vec![
            Next::Appended(4),
            Next::Message(Message::Ping(Bytes::from_static(b"p"))),
            Next::Message(Message::Binary(Bytes::from_static(b"fragment"))),
            Next::Message(Message::Text(Bytes::from_static(b"words"))),
            Next::Appended(4 + big.len()),
        ]
    );
    let mut want = b"kept".to_vec();
    want.extend(&big);
    want.extend(b"tiny");
    assert!(
        target[..] == want[..],
        "the target holds both payloads, unmasked"
    );
    drop(feeding.await.unwrap());
}

#[tokio::test]
async fn an_appending_read_cancelled_mid_frame_loses_nothing() {
    // As `a_read_cancelled_mid_frame_loses_nothing`, reading into a target.
    let body = payload(200_000, 4);
    let wire = masked_frame(true, OpCode::Binary, &body);
    let mut target = BytesMut::from(&b"head"[..]);
    let (got, cancelled) = read_interrupted(wire, Some(&mut target)).await;
    assert_eq!(got, Next::Appended(4));
    assert!(target[4..] == body[..] && &target[..4] == b"head");
    assert!(cancelled >= 50, "interrupted only {cancelled} times");
}

/// What a server reader with a 60 s message timeout makes of `wire`,
/// written at once and then left open, on a paused clock (the runtime
/// skips ahead whenever everything waits).
async fn read_with_timeout(wire: Vec<u8>) -> Result<Option<Message>, WsError> {
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let (r, _w) = tokio::io::split(a);
    let mut reader = Reader::new(r, Role::Server, 1 << 20)
        .with_message_timeout(std::time::Duration::from_secs(60));
    b.write_all(&wire).await.unwrap();
    let outer = std::time::Duration::from_secs(3600);
    let got = tokio::time::timeout(outer, reader.next()).await;
    drop(b);
    got.unwrap_or(Ok(None))
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_stalls_inside_a_message_is_dropped_and_a_quiet_one_is_not() {
    let whole = masked_frame(true, OpCode::Binary, &payload(100_000, 1));
    // Half a frame, then nothing: stalled.
    let t = tokio::time::Instant::now();
    let got = read_with_timeout(whole[..50_000].to_vec()).await;
    assert!(matches!(got, Err(WsError::Stalled)), "{got:?}");
    assert_eq!(t.elapsed().as_secs(), 60);
    // One byte of a header: stalled too.
    let got = read_with_timeout(whole[..1].to_vec()).await;
    assert!(matches!(got, Err(WsError::Stalled)), "{got:?}");
    // The first fragment of a message, then nothing: stalled.
    let got = read_with_timeout(masked_frame(false, OpCode::Binary, b"frag")).await;
    assert!(matches!(got, Err(WsError::Stalled)), "{got:?}");
    // A whole message, then silence for an hour: the message, no error.
    let t = tokio::time::Instant::now();
    let got = read_with_timeout(whole.clone()).await;
    assert_eq!(
        got.unwrap(),
        Some(Message::Binary(payload(100_000, 1).into()))
    );
    assert_eq!(t.elapsed().as_secs(), 0);
    // Nothing at all for an hour: no error (the outer bound ends the wait).
    let got = read_with_timeout(Vec::new()).await;
    assert!(matches!(got, Ok(None)), "{got:?}");
}

#[tokio::test(start_paused = true)]
async fn a_message_trickling_past_the_timeout_is_dropped_and_the_clock_restarts_per_message() {
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let (r, _w) = tokio::io::split(a);
    let mut reader = Reader::new(r, Role::Server, 1 << 20)
        .with_message_timeout(std::time::Duration::from_secs(60));
    let first = masked_frame(true, OpCode::Binary, b"one");
    let slow = masked_frame(true, OpCode::Binary, &payload(1000, 2));
    let feeding = tokio::spawn(async move {
        // The first message whole; 50 s later the second, a piece every 10 s.
        b.write_all(&first).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(50)).await;
        for piece in slow.chunks(100) {
            b.write_all(piece).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        }
        b
    });
    assert_eq!(
        reader.next().await.unwrap(),
        Some(Message::Binary(Bytes::from_static(b"one")))
    );
    let t = tokio::time::Instant::now();
    let got = reader.next().await;
    assert!(matches!(got, Err(WsError::Stalled)), "{got:?}");
    // 50 s of quiet between messages did not count; 60 s inside one did.
    assert_eq!(t.elapsed().as_secs(), 110);
    feeding.abort();
}

#[tokio::test]
async fn a_close_status_reaches_a_tungstenite_client_and_our_reader() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let status = CloseStatus::protocol_error("reserved bits set");
    // A tungstenite client sees the code and the reason.
    let (a, b) = tokio::io::duplex(1 << 12);
    let (_r, w) = tokio::io::split(a);
    let mut writer = Writer::new(w, Role::Server);
    let reading = tokio::spawn(async move {
        let mut ws = tungstenite_peer(b, TRole::Client).await;
        ws.next().await
    });
    writer.close(Some(status)).await.unwrap();
    match reading.await.unwrap() {
        Some(Ok(TMessage::Close(Some(frame)))) => {
            assert_eq!(frame.code, CloseCode::Protocol);
            assert_eq!(frame.reason.as_str(), "reserved bits set");
        }
        other => panic!("{other:?}"),
    }
    // Our own client reads the code.
    let (a, b) = tokio::io::duplex(1 << 12);
    let (_r, w) = tokio::io::split(a);
    let mut writer = Writer::new(w, Role::Server);
    writer.close(Some(CloseStatus::TOO_BIG)).await.unwrap();
    let mut reader = Reader::new(b, Role::Client, 1 << 10);
    assert_eq!(
        reader.next().await.unwrap(),
        Some(Message::Close(Some(1009)))
    );
}

#[test]
fn a_close_reason_is_cut_to_fit_the_frame_at_a_character_boundary() {
    let long: &'static str = Box::leak("é".repeat(100).into_boxed_str());
    let p = CloseStatus::policy(long).payload();
    assert_eq!(&p[..2], &1008u16.to_be_bytes());
    assert_eq!(p.len(), 2 + 122);
    assert!(std::str::from_utf8(&p[2..]).is_ok());
}
