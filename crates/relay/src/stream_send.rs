//! A stream's sending end for its program ([`StreamSender`]): each message is
//! sealed into its frames and queued for the socket (a harness's), or
//! written to it (an executor's, shared by its streams), in the sender's
//! own task.
//!
//! Why no task of its own: a stream's messages used to pass through one (a
//! channel to it, then the socket's queue), one more hand-over between tasks
//! per message on a path that already has several (the process's pump, the
//! connection's writer, the socket's writer). On a multi-threaded runtime
//! each hand-over may wake another worker to run the next step, and the
//! message's buffers move to that worker's cache with it.

use crate::executor::shared_writer::SharedWriter;
use crate::socket::Outgoing;
use crate::stream::{OutMessage, SendHalf};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Frames a stream writes to a shared socket in one turn: 32 (about 2 MiB).
/// A message of up to 1 MiB (an output chunk) goes in one write; a longer
/// one lets the other streams' messages through between its turns, so a
/// large reply does not hold an interactive stream up for all its length.
pub const FRAMES_PER_TURN: usize = 32;

/// The stream can carry no more messages: the relay no longer routes it,
/// its socket is gone, or sealing failed (its counters ran out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the relay stream is closed")]
pub struct StreamClosed;

/// Sends messages on one relay stream: [`StreamSender::send`] seals a message
/// into its data frames and queues them on the socket, in order, from the
/// calling task. Cheap to clone; clones share the stream (one message's
/// frames are queued before another's are sealed). Dropping every clone
/// tells the stream's owner the program is done sending.
#[derive(Clone)]
pub struct StreamSender {
    shared: Arc<Shared>,
}

struct Shared {
    state: tokio::sync::Mutex<State>,
    /// Where the frames go.
    route: FrameRoute,
    /// Cancelled when the stream may carry no more: sends fail from then.
    stopped: CancellationToken,
    /// Dropped with the last clone: its receiver learns the program is done.
    _done: oneshot::Sender<()>,
}

struct State {
    half: SendHalf,
    /// A message's frames on their way to the socket (kept to reuse the
    /// allocation).
    batch: Vec<Outgoing>,
}

/// Where a stream's sealed frames go.
pub(crate) enum FrameRoute {
    /// Into the queue a writer task drains (a harness's socket, which has
    /// pings and pongs to send beside).
    Queue(mpsc::Sender<Outgoing>),
    /// Straight onto a socket shared with other streams, in turns of at
    /// most [`FRAMES_PER_TURN`] frames, each turn one write (an executor's).
    Socket(SharedWriter),
}

impl StreamSender {
    /// A sender sealing with `half` and sending the frames along `route`,
    /// failing once `stopped` is cancelled; the receiver completes (with an
    /// error) when the last clone is dropped.
    pub(crate) fn new(
        half: SendHalf,
        route: FrameRoute,
        stopped: CancellationToken,
    ) -> (StreamSender, oneshot::Receiver<()>) {
        let (done, done_rx) = oneshot::channel();
        let shared = Shared {
            state: tokio::sync::Mutex::new(State {
                half,
                batch: Vec::new(),
            }),
            route,
            stopped,
            _done: done,
        };
        (
            StreamSender {
                shared: Arc::new(shared),
            },
            done_rx,
        )
    }

    /// Seals `message` and sends its frames, waiting while the socket's
    /// queue is full or another message is being written. Errors:
    /// [`StreamClosed`]. A send dropped before it finishes (its frames
    /// partly queued) stops the stream, since the peer would wait forever
    /// for the frames it never got.
    pub async fn send(&self, message: OutMessage) -> Result<(), StreamClosed> {
        let s = &self.shared;
        if s.stopped.is_cancelled() {
            return Err(StreamClosed);
        }
        let mut state = s.state.lock().await;
        let State { half, batch } = &mut *state;
        let frames = match half.seal_message(&message) {
            Ok(frames) => frames,
            Err(e) => {
                tracing::debug!("relay stream cannot seal: {e}");
                s.stopped.cancel();
                return Err(StreamClosed);
            }
        };
        // Sealed frames are numbered: unless all of them go, the stream
        // stops (the guard fires on every early return and on a drop).
        let unfinished = s.stopped.clone().drop_guard();
        match &s.route {
            FrameRoute::Queue(queue) => {
                for f in frames {
                    tokio::select! {
                        sent = queue.send(Outgoing::Binary(f.into())) => {
                            if sent.is_err() {
                                return Err(StreamClosed);
                            }
                        }
                        _ = s.stopped.cancelled() => return Err(StreamClosed),
                    }
                }
            }
            FrameRoute::Socket(socket) => {
                let mut frames = frames.into_iter();
                loop {
                    let turn = frames.by_ref().take(FRAMES_PER_TURN);
                    batch.extend(turn.map(|f| Outgoing::Binary(f.into())));
                    if batch.is_empty() {
                        break;
                    }
                    if socket.send(batch, &s.stopped).await.is_err() {
                        batch.clear();
                        return Err(StreamClosed);
                    }
                }
            }
        }
        unfinished.disarm();
        Ok(())
    }

    /// Whether sends fail from now on.
    pub fn is_closed(&self) -> bool {
        let gone = match &self.shared.route {
            FrameRoute::Queue(queue) => queue.is_closed(),
            FrameRoute::Socket(socket) => socket.failed().is_cancelled(),
        };
        self.shared.stopped.is_cancelled() || gone
    }
}

impl std::fmt::Debug for StreamSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSender")
            .field("closed", &self.is_closed())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::Transport;
    use crate::stream::halves;
    use std::future::Future;

    fn sender(queue: usize) -> (StreamSender, mpsc::Receiver<Outgoing>, CancellationToken) {
        let (half, _) = halves("s1", Transport::from_keys(&[1; 32], &[2; 32]));
        let (tx, rx) = mpsc::channel(queue);
        let stopped = CancellationToken::new();
        let (s, _done) = StreamSender::new(half, FrameRoute::Queue(tx), stopped.clone());
        (s, rx, stopped)
    }

    #[tokio::test]
    async fn a_message_becomes_its_frames_in_order_then_sends_fail_once_stopped() {
        let (s, mut rx, stopped) = sender(64);
        let r = crate::records::RECORD_PLAINTEXT_LEN;
        s.send(vec![7u8; 2 * r].into()).await.unwrap();
        let mut seqs = Vec::new();
        while let Ok(Outgoing::Binary(f)) = rx.try_recv() {
            match crate::frame::Frame::decode(&f).unwrap().body {
                Some(crate::frame::Body::Data { seq, .. }) => seqs.push(seq),
                other => panic!("not a data frame: {other:?}"),
            }
        }
        assert_eq!(seqs, vec![0, 1, 2], "three records, in order");
        stopped.cancel();
        assert_eq!(s.send(b"late".to_vec().into()).await, Err(StreamClosed));
        assert!(rx.try_recv().is_err(), "nothing queued after the stop");
    }

    #[tokio::test]
    async fn a_send_dropped_half_way_stops_the_stream() {
        // Room for one frame: the second waits, and the send is dropped there.
        let (s, mut rx, stopped) = sender(1);
        let r = crate::records::RECORD_PLAINTEXT_LEN;
        let mut send = Box::pin(s.send(vec![1u8; 2 * r].into()));
        let pending =
            std::future::poll_fn(|cx| std::task::Poll::Ready(send.as_mut().poll(cx).is_pending()))
                .await;
        assert!(pending, "the queue is full after the first frame");
        assert!(!stopped.is_cancelled());
        drop(send);
        assert!(
            stopped.is_cancelled(),
            "a half-sent message stops the stream"
        );
        assert!(rx.try_recv().is_ok(), "the first frame was queued");
        assert_eq!(s.send(b"x".to_vec().into()).await, Err(StreamClosed));
    }

    #[tokio::test]
    async fn dropping_the_last_clone_tells_the_owner() {
        let (half, _) = halves("s1", Transport::from_keys(&[1; 32], &[2; 32]));
        let (tx, _rx) = mpsc::channel(4);
        let (s, mut done) =
            StreamSender::new(half, FrameRoute::Queue(tx), CancellationToken::new());
        let clone = s.clone();
        drop(s);
        assert_eq!(done.try_recv(), Err(oneshot::error::TryRecvError::Empty));
        drop(clone);
        assert!(done.await.is_err(), "the owner learns the program is done");
    }

    #[tokio::test]
    async fn a_long_message_lets_another_streams_message_through_between_its_turns() {
        use crate::socket::{Io, Message, Reader, Role, Writer};
        let (near, far) = tokio::io::duplex(64 * 1024);
        let (_, w) = tokio::io::split(Box::new(near) as Box<dyn Io>);
        let socket = SharedWriter::new(Writer::new(w, Role::Client));
        let on_socket = |id: &str, key: u8| {
            let (half, _) = halves(id, Transport::from_keys(&[key; 32], &[key + 1; 32]));
            let route = FrameRoute::Socket(socket.clone());
            StreamSender::new(half, route, CancellationToken::new()).0
        };
        let (long, short) = (on_socket("long", 1), on_socket("short", 3));
        // Three turns' worth of records (the length prefix takes 4 bytes).
        let records = 3 * FRAMES_PER_TURN;
        let len = records * crate::records::RECORD_PLAINTEXT_LEN - 4;
        let long_send = tokio::spawn(async move { long.send(vec![1u8; len].into()).await });
        // Its first turn holds the socket: nobody reads the pipe yet.
        while !socket.is_busy() {
            tokio::task::yield_now().await;
        }
        let mut short_send = Box::pin(short.send(b"hi".to_vec().into()));
        let pending = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(short_send.as_mut().poll(cx).is_pending())
        })
        .await;
        assert!(pending, "the short message waits for its turn");
        let reader = tokio::spawn(async move {
            let mut r = Reader::new(far, Role::Server, crate::frame::MAX_FRAME_BYTES);
            let mut order = Vec::new();
            while order.len() < records + 1 {
                let Ok(Some(Message::Binary(b))) = r.next().await else {
                    break;
                };
                order.push(crate::frame::Frame::decode(&b).unwrap().stream_id);
            }
            order
        });
        assert_eq!(short_send.await, Ok(()));
        assert_eq!(long_send.await.unwrap(), Ok(()));
        let order = reader.await.unwrap();
        assert_eq!(order.len(), records + 1);
        let at = order.iter().position(|id| id == "short");
        assert_eq!(
            at,
            Some(FRAMES_PER_TURN),
            "right after the long one's first turn"
        );
    }
}
