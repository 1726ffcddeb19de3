//! The harness side: one attempt = a fresh `/connect`, a fresh WebSocket to the
//! returned URL, a fresh UUID v4 stream, `Resume` then `Handshake{msg1}`
//! (written right behind the upgrade request); once
//! msg2 arrives the stream is a [`Channel`] of messages. Reconnecting means
//! calling [`connect`] again (the session layer above resumes its session).

use crate::api::MASKED_FRAMES_HEADER;
use crate::frame::{Body, Frame, MAX_FRAME_BYTES};
use crate::keys::{prologue, Identity, PublicKey};
use crate::noise::{Initiator, TransportCipher};
use crate::random::OsRandom;
use crate::registry_client::{RegistryClient, RegistryError};
use crate::socket::{ClientReader as Source, ClientWriter as Sink, Message, Next, Outgoing};
use crate::stream::{halves, Arrived, Channel, RecvHalf, StreamError, StreamSender};
use crate::stream_send::FrameRoute;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Time for the executor's msg2 after msg1 (it asks the registry first): 20 s.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// Messages queued per direction before senders wait.
const QUEUE: usize = 64;

/// Why an attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The registry refused or failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The relay socket could not be opened.
    #[error("cannot reach the relay: {0}")]
    Relay(String),
    /// The executor reset the stream during the handshake (not authorized,
    /// or busy: see [`crate::frame::RESET_EXECUTOR_BUSY`]); with its reason.
    #[error("the executor refused the connection ({})", refusal(.0))]
    Refused(String),
    /// msg2 did not authenticate: not the executor the registry named.
    #[error("the executor failed to authenticate")]
    Authentication,
    /// Anything else the protocol forbids (data before the handshake, timeout).
    #[error("relay protocol error: {0}")]
    Protocol(String),
}

impl HarnessError {
    /// Whether another attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            HarnessError::Registry(e) => e.is_retryable(),
            HarnessError::Relay(_) | HarnessError::Refused(_) | HarnessError::Protocol(_) => true,
            HarnessError::Authentication => false,
        }
    }
}

/// What a reset's reason means, for [`HarnessError::Refused`].
fn refusal(reason: &str) -> String {
    match reason {
        crate::frame::RESET_EXECUTOR_BUSY => format!(
            "busy: it serves at most {} streams at once and judges at most {} handshakes at a time",
            crate::executor::mux::MAX_ACTIVE_STREAMS,
            crate::executor::mux::MAX_PENDING_VALIDATIONS
        ),
        "" => "no reason given".into(),
        other => format!("reset: {other}"),
    }
}

/// Opens one stream to `environment_id`'s executor through the registry,
/// offering the transport cipher of [`TransportCipher::preferred`].
pub async fn connect(
    registry: &RegistryClient,
    environment_id: &str,
    identity: &Identity,
) -> Result<Channel, HarnessError> {
    connect_offering(
        registry,
        environment_id,
        identity,
        TransportCipher::preferred(),
    )
    .await
}

/// [`connect`] offering `offer` beside msg1 ([`TransportCipher::AesGcm`]:
/// no offer, the reference's frames). The executor's msg2 frame says what
/// the records use; one naming a cipher not offered fails the attempt.
pub async fn connect_offering(
    registry: &RegistryClient,
    environment_id: &str,
    identity: &Identity,
    offer: TransportCipher,
) -> Result<Channel, HarnessError> {
    let bundle = registry
        .connect(environment_id, &identity.public_key())
        .await?;
    let executor_key = PublicKey::from_wire(&bundle.executor_public_key)
        .map_err(|e| HarnessError::Protocol(format!("executor key: {e}")))?;
    let stream_id = uuid::Uuid::new_v4().to_string();
    let p = prologue(environment_id, &bundle.executor_registration_id, &stream_id);
    let (init, msg1) = Initiator::start(
        identity,
        &executor_key,
        &p,
        bundle.harness_key_authorization.as_bytes(),
        &mut OsRandom,
    )
    .map_err(|e| HarnessError::Protocol(e.to_string()))?;
    // Written behind the upgrade request, not after its answer: one round
    // trip fewer. A refused upgrade loses them with the socket, and the
    // next attempt makes a fresh stream and handshake anyway.
    let mut opening = vec![
        Outgoing::Binary(Frame::resume(&stream_id).encode().into()),
        Outgoing::Binary(
            Frame::handshake(&stream_id, msg1)
                .with_transport_cipher(offer.wire())
                .encode()
                .into(),
        ),
    ];
    // Frames as the executor masked them, which a node of ours passes on
    // without copying them.
    let masked = [(MASKED_FRAMES_HEADER, "1".to_string())];
    let (mut source, sink) =
        crate::socket::connect_sending(bundle.url.as_str(), &masked, MAX_FRAME_BYTES, &mut opening)
            .await
            .map_err(|e| HarnessError::Relay(e.to_string()))?;
    let (msg2, taken) =
        tokio::time::timeout(HANDSHAKE_TIMEOUT, await_msg2(&mut source, &stream_id))
            .await
            .map_err(|_| HarnessError::Protocol("handshake timed out".into()))??;
    let cipher = TransportCipher::from_wire(taken.as_deref());
    if cipher != TransportCipher::AesGcm && cipher != offer {
        return Err(HarnessError::Protocol(format!(
            "the executor chose the transport cipher {} that was not offered",
            taken.as_deref().unwrap_or_default()
        )));
    }
    let transport = init
        .finish(&msg2, cipher)
        .map_err(|_| HarnessError::Authentication)?;
    Ok(run_stream(sink, source, stream_id, transport))
}

/// The executor's handshake answer (msg2) on `stream_id`, with the
/// transport cipher its frame names; frames of other streams and
/// undecodable ones are skipped. Errors: a reset (refused), data before
/// the handshake, the socket closing.
async fn await_msg2(
    source: &mut Source,
    stream_id: &str,
) -> Result<(Vec<u8>, Option<String>), HarnessError> {
    // Pings this early go unanswered: the relay's come every 30 s, and the
    // handshake is bounded well below that.
    while let Ok(Some(m)) = source.next().await {
        let bytes = match m {
            Message::Binary(b) => b,
            Message::Close(code) => {
                log_close(code);
                if code == Some(crate::registry::NO_EXECUTOR.code) {
                    return Err(HarnessError::Relay(
                        "no executor of this environment is attached to the relay node \
                         (it may be reconnecting)"
                            .into(),
                    ));
                }
                break;
            }
            _ => continue,
        };
        let Ok(f) = Frame::decode(&bytes) else {
            continue;
        };
        if f.validate().is_err() || f.stream_id != stream_id {
            continue;
        }
        match f.body {
            Some(Body::Handshake { payload }) => return Ok((payload, f.transport_cipher)),
            Some(Body::Reset { reason }) => return Err(HarnessError::Refused(reason)),
            Some(Body::Data { .. }) => {
                return Err(HarnessError::Protocol(
                    "received data before handshake completion".into(),
                ))
            }
            _ => continue,
        }
    }
    Err(HarnessError::Relay(
        "relay closed during the handshake".into(),
    ))
}

/// Runs an established stream: a writer (sealed frames and pings onto the
/// socket) and a reader (frames opened into messages); the [`Channel`] is
/// the program's end, whose sends seal their messages into frames. Dropping its receiver
/// ends the stream and the socket.
fn run_stream(
    mut sink: Sink,
    mut source: Source,
    stream_id: String,
    transport: crate::noise::Transport,
) -> Channel {
    let cipher = transport.cipher();
    let (send, mut recv) = halves(&stream_id, transport);
    let (in_tx, in_rx) = mpsc::channel::<bytes::Bytes>(QUEUE);
    let (frame_tx, mut frame_rx) = mpsc::channel::<Outgoing>(QUEUE);
    let stopped = CancellationToken::new();
    // Nobody waits for the program to stop sending: the stream lasts until
    // it drops its receiver.
    let (outbound, _done) =
        StreamSender::new(send, FrameRoute::Queue(frame_tx.clone()), stopped.clone());
    // Writer: sealed frames, pongs and pings onto the socket.
    let writer = tokio::spawn(async move {
        let mut ping = tokio::time::interval(Duration::from_secs(30));
        ping.tick().await;
        let mut batch = Vec::with_capacity(crate::MAX_FRAMES_PER_FLUSH);
        loop {
            let m = tokio::select! {
                m = frame_rx.recv() => match m { Some(m) => m, None => break },
                _ = ping.tick() => Outgoing::Ping(bytes::Bytes::new()),
            };
            crate::socket::gather(&mut batch, m, || frame_rx.try_recv().ok());
            if sink.send(&mut batch).await.is_err() {
                break;
            }
        }
        let _ = sink.close(None).await;
    });
    let sid = stream_id.clone();
    let pongs = frame_tx.clone();
    tokio::spawn(async move {
        loop {
            // The user dropping its receiver ends the stream (and the socket);
            // the reader is not needed after that, so a frame half read then
            // is not lost to anyone.
            let m = tokio::select! {
                m = source.next_appending(recv.tail()) => m,
                _ = in_tx.closed() => Ok(None),
            };
            let arrived = match m {
                // A record read to where its message is being assembled.
                Ok(Some(Next::Appended(start))) => recv.open_appended(start, &sid),
                Ok(Some(Next::Message(Message::Binary(bytes)))) => {
                    open_message(&mut recv, bytes, &sid)
                }
                Ok(Some(Next::Message(Message::Ping(p)))) => {
                    // Behind the frames already queued; the writer never
                    // waits for this reader, so this cannot deadlock.
                    if pongs.send(Outgoing::Pong(p)).await.is_err() {
                        break;
                    }
                    continue;
                }
                Ok(Some(Next::Message(Message::Close(code)))) => {
                    log_close(code);
                    break;
                }
                Ok(None) | Err(_) => break,
                Ok(Some(Next::Message(_))) => continue,
            };
            match arrived {
                Ok(Arrived::Messages(msgs)) => {
                    for m in msgs {
                        if in_tx.send(m).await.is_err() {
                            break;
                        }
                    }
                }
                Ok(Arrived::Other(Body::Reset { .. })) => break,
                Ok(Arrived::Other(_)) | Ok(Arrived::Skipped) => {}
                Err(StreamError::Noise(crate::NoiseError::Decrypt)) => {
                    // The client then only sees its connection close: say
                    // here what a failed record means.
                    tracing::warn!(
                        stream = %sid,
                        cipher = ?cipher,
                        "a record from the executor failed to authenticate: frames were \
                         altered on the way, or the two ends disagree on the transport cipher \
                         (EXEC_SERVER_RELAY_CIPHER); the stream is closed"
                    );
                    break;
                }
                Err(e) => {
                    tracing::debug!("relay stream failed: {e}");
                    break;
                }
            }
        }
        // The stream is over: stop writing too, so the socket closes.
        stopped.cancel();
        drop(frame_tx);
        writer.abort();
    });
    Channel {
        inbound: in_rx,
        outbound,
        peer: format!("relay stream {stream_id}"),
        transport_cipher: cipher,
    }
}

/// A frame that came as a message of its own (fragmented on the wire).
fn open_message(
    recv: &mut RecvHalf,
    bytes: bytes::Bytes,
    stream_id: &str,
) -> Result<Arrived, StreamError> {
    let Ok(f) = Frame::decode_shared(&bytes) else {
        return Ok(Arrived::Skipped);
    };
    // The payload is then the buffer's only handle: opened in place.
    drop(bytes);
    if f.validate().is_err() || f.stream_id != stream_id {
        return Ok(Arrived::Skipped);
    }
    match f.body {
        Some(Body::Data { seq, payload, .. }) => Ok(Arrived::Messages(recv.open(seq, payload)?)),
        Some(other) => Ok(Arrived::Other(other)),
        None => Ok(Arrived::Skipped),
    }
}

/// Says why the node closed a harness socket, when its close frame gave a
/// status (1002: we broke the protocol; 1008: a relay rule, such as a stream
/// reset for not reading; 1009: a message too long).
fn log_close(code: Option<u16>) {
    if let Some(code) = code {
        tracing::info!(status = code, "the relay node closed the stream's socket");
    }
}
