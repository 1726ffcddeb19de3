use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A connected loopback pair: (the end we write to, the end we read from).
async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    (a, b)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_spliced_through_a_pipe_arrive_exactly() {
    let (mut src_peer, src) = pair().await;
    let (dst, mut dst_peer) = pair().await;
    let pipe = Pipe::new().unwrap();
    let data = pattern(300_000);
    let sent = data.clone();
    let writer = tokio::spawn(async move { src_peer.write_all(&sent).await.unwrap() });
    let reader = tokio::spawn(async move {
        let mut got = vec![0u8; 300_000];
        dst_peer.read_exact(&mut got).await.unwrap();
        got
    });
    // In frame-sized pieces, as a node moves them.
    let mut left = data.len();
    while left > 0 {
        let want = left.min(70_000);
        let mut moved = 0;
        while moved < want {
            match splice_in(&src, &pipe, want - moved).await.unwrap() {
                SplicedIn::Moved(n) => moved += n,
                other => panic!("{other:?}"),
            }
        }
        let now = splice_out_now(&pipe, &dst, want).unwrap();
        splice_out(&pipe, &dst, want - now).await.unwrap();
        left -= want;
    }
    writer.await.unwrap();
    assert_eq!(reader.await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pipe_is_told_apart_from_an_empty_socket() {
    let (mut peer, src) = pair().await;
    let pipe = Pipe::new().unwrap();
    // Nothing sent yet: the splice waits (and a dropped wait moved nothing).
    let waited = tokio::time::timeout(
        std::time::Duration::from_millis(100),
        splice_in(&src, &pipe, 1000),
    )
    .await;
    assert!(waited.is_err(), "{waited:?}");
    // More than any pipe holds, never drained: the pipe fills while the
    // socket still has bytes. (A pipe counts slots, not bytes: one slot
    // refers to as much of a received segment as it holds, so a pipe asked
    // for 1 MiB may take several MiB from a socket.)
    const SENT: usize = 64 << 20;
    let data = pattern(SENT);
    let writer = tokio::spawn(async move {
        let _ = peer.write_all(&data).await;
        peer
    });
    let mut moved = 0;
    let full = loop {
        match tokio::time::timeout(
            std::time::Duration::from_secs(10),
            splice_in(&src, &pipe, 1 << 20),
        )
        .await
        .expect("a splice into a full pipe must not wait")
        .unwrap()
        {
            SplicedIn::Moved(n) => moved += n,
            other => break other,
        }
        assert!(moved < SENT, "the pipe took everything");
    };
    assert_eq!(full, SplicedIn::PipeFull);
    assert!(moved > 0, "{moved}");
    // The rest is read, exactly as sent after what the pipe took.
    let rest = read_exact(&src, 1000).await.unwrap();
    assert_eq!(&rest[..], &pattern(SENT)[moved..moved + 1000]);
    writer.abort();
}

#[tokio::test]
async fn a_closed_peer_ends_a_splice_and_a_read() {
    let (peer, src) = pair().await;
    let pipe = Pipe::new().unwrap();
    drop(peer);
    assert_eq!(
        splice_in(&src, &pipe, 100).await.unwrap(),
        SplicedIn::Closed
    );
    let err = read_exact(&src, 10).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
}
