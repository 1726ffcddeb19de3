//! A connection over a pair of message channels: how a relay stream (our
//! client's or our executor's) becomes an ordinary JSON-RPC connection,
//! without this crate knowing anything of the relay, and how an embedded
//! server and its client in one process talk ([`channel_pair`]).

use super::{binary_channel, Closed, Inbound};
use crate::{Connection, Outgoing};
use exec_server_protocol::binary;
use tokio::sync::mpsc;

/// Makes a pair of message channels (a relay stream's, whose transport
/// keeps message boundaries) an ordinary connection named `peer`. Messages
/// are JSON text (a message that is not UTF-8 is passed on as undecodable)
/// unless both ends agree on binary frames in `initialize`: only ours do,
/// so a reference peer at the other end keeps JSON, while ours get the
/// binary fast path (raw bytes instead of base64). Closing the connection
/// ends both directions. `inbound` carries whole messages, owned
/// (`Vec<u8>`) or shared (`Bytes`); `outbound` gets each message as a head
/// and a body (`O::from((head, body))`, either may be empty) that the far
/// end must receive as one message, head first: a binary frame's header
/// and the payload it frames stay apart, so a sender that can take them as
/// they are (a relay stream seals both into its records) never joins them.
/// `outbound` is any [`MessageSink`]: a channel, or a sender that seals and
/// queues each message itself, in the connection's writing task.
pub fn byte_channels<M, S>(
    peer: String,
    mut inbound: mpsc::Receiver<M>,
    mut outbound: S,
) -> Connection
where
    M: Into<bytes::Bytes> + Send + 'static,
    S: MessageSink,
{
    let (conn, mut end) = binary_channel(peer);
    let closer = end.closer.clone();
    let in_tx = end.inbound;
    // JSON text never starts with a binary frame's kind byte; whether binary
    // frames were agreed is checked by the connection's reader.
    let inbound_pump = tokio::spawn(async move {
        loop {
            let m = tokio::select! {
                m = inbound.recv() => m,
                _ = in_tx.closed() => None,
            };
            let Some(m) = m else { break };
            let m: bytes::Bytes = m.into();
            let item = if binary::looks_binary(&m) {
                Inbound::Binary(m)
            } else {
                // No copy for a message this process made (`Vec`-backed).
                match String::from_utf8(Vec::from(m)) {
                    Ok(s) => Inbound::Message(s),
                    Err(_) => Inbound::Invalid("message is not valid UTF-8".into()),
                }
            };
            if in_tx.send(item).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        loop {
            let m = tokio::select! {
                m = end.outbound.recv() => m,
                _ = closer.notified() => None,
            };
            let (head, body) = match m {
                None => break,
                Some(Outgoing::Text(m)) => {
                    (bytes::Bytes::from(m.into_bytes()), bytes::Bytes::new())
                }
                // Shared, not copied: the output log keeps the same bytes.
                Some(Outgoing::Binary(frame)) => (frame, bytes::Bytes::new()),
                Some(Outgoing::BinaryParts(head, payload)) => (head, payload),
                // Never queued: a channel does not stream text.
                Some(Outgoing::Stream(_)) => break,
            };
            if outbound.send_message(head, body).await.is_err() {
                break;
            }
        }
        // Closing ends both directions, so the stream (and its socket) goes away.
        inbound_pump.abort();
    });
    conn
}

/// Where [`byte_channels`] sends a connection's messages, each as a head and
/// a body (either may be empty) that the far end receives as one message.
pub trait MessageSink: Send + 'static {
    /// Sends one message, waiting while the sink is full. Errors:
    /// [`Closed`] once the far end is gone (nothing more is sent).
    fn send_message(
        &mut self,
        head: bytes::Bytes,
        body: bytes::Bytes,
    ) -> impl std::future::Future<Output = Result<(), Closed>> + Send;
}

/// A channel is a sink of anything made from a head and a body.
impl<O> MessageSink for mpsc::Sender<O>
where
    O: From<(bytes::Bytes, bytes::Bytes)> + Send + 'static,
{
    async fn send_message(&mut self, head: bytes::Bytes, body: bytes::Bytes) -> Result<(), Closed> {
        self.send(O::from((head, body))).await.map_err(|_| Closed)
    }
}

/// Messages queued each way between an embedded server and its client.
const PAIR_QUEUE: usize = 64;

/// A message between the two ends of a [`channel_pair`]: the receiving end
/// reads one buffer, so a head and a body are joined (copied) here.
struct Joined(bytes::Bytes);

impl From<(bytes::Bytes, bytes::Bytes)> for Joined {
    fn from((head, body): (bytes::Bytes, bytes::Bytes)) -> Joined {
        if body.is_empty() {
            return Joined(head);
        }
        let mut whole = Vec::with_capacity(head.len() + body.len());
        whole.extend_from_slice(&head);
        whole.extend_from_slice(&body);
        Joined(whole.into())
    }
}

impl From<Joined> for bytes::Bytes {
    fn from(j: Joined) -> bytes::Bytes {
        j.0
    }
}

/// Two connected ends in one process, `a` and `b` named by their peers:
/// messages cross as shared bytes, binary frames included, so an embedded
/// server's output reaches its client without being encoded, copied or
/// parsed as text.
pub fn channel_pair(a_peer: String, b_peer: String) -> (Connection, Connection) {
    let (a_tx, a_rx) = mpsc::channel::<Joined>(PAIR_QUEUE);
    let (b_tx, b_rx) = mpsc::channel::<Joined>(PAIR_QUEUE);
    (
        byte_channels(a_peer, b_rx, a_tx),
        byte_channels(b_peer, a_rx, b_tx),
    )
}
