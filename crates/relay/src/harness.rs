//! The harness side: one attempt = a fresh `/connect`, a fresh WebSocket to the
//! returned URL, a fresh UUID v4 stream, `Resume` then `Handshake{msg1}`; once
//! msg2 arrives the stream is a [`Channel`] of messages. Reconnecting means
//! calling [`connect`] again (the session layer above resumes its session).

use crate::frame::{Body, Frame, MAX_FRAME_BYTES};
use crate::keys::{prologue, Identity, PublicKey};
use crate::noise::Initiator;
use crate::random::OsRandom;
use crate::registry_client::{RegistryClient, RegistryError};
use crate::stream::{halves, Channel};
use futures_util::{SinkExt, StreamExt};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

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
    /// The executor reset the stream during the handshake (e.g. not authorized).
    #[error("the executor refused the connection")]
    Refused,
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
            HarnessError::Relay(_) | HarnessError::Refused | HarnessError::Protocol(_) => true,
            HarnessError::Authentication => false,
        }
    }
}

/// Opens one stream to `environment_id`'s executor through the registry.
pub async fn connect(
    registry: &RegistryClient,
    environment_id: &str,
    identity: &Identity,
) -> Result<Channel, HarnessError> {
    let bundle = registry
        .connect(environment_id, &identity.public_key())
        .await?;
    let executor_key = PublicKey::from_wire(&bundle.executor_public_key)
        .map_err(|e| HarnessError::Protocol(format!("executor key: {e}")))?;
    let mut cfg = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
    cfg.max_message_size = Some(MAX_FRAME_BYTES);
    cfg.max_frame_size = Some(MAX_FRAME_BYTES);
    let ws = crate::tls::connect_websocket(bundle.url.as_str(), cfg)
        .await
        .map_err(|e| HarnessError::Relay(e.to_string()))?;
    let (mut sink, mut source) = ws.split();
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
    for f in [
        Frame::resume(&stream_id),
        Frame::handshake(&stream_id, msg1),
    ] {
        sink.send(Message::Binary(f.encode().into()))
            .await
            .map_err(|e| HarnessError::Relay(e.to_string()))?;
    }
    let msg2 = tokio::time::timeout(HANDSHAKE_TIMEOUT, await_msg2(&mut source, &stream_id))
        .await
        .map_err(|_| HarnessError::Protocol("handshake timed out".into()))??;
    let transport = init
        .finish(&msg2)
        .map_err(|_| HarnessError::Authentication)?;
    Ok(run_stream(sink, source, stream_id, transport))
}

/// The relay socket (plain or TLS) and its two halves.
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;
type Sink = futures_util::stream::SplitSink<Socket, Message>;
type Source = futures_util::stream::SplitStream<Socket>;

/// The executor's handshake answer (msg2) on `stream_id`; frames of other
/// streams and undecodable ones are skipped. Errors: a reset (refused),
/// data before the handshake, the socket closing.
async fn await_msg2(source: &mut Source, stream_id: &str) -> Result<Vec<u8>, HarnessError> {
    while let Some(m) = source.next().await {
        let bytes = match m {
            Ok(Message::Binary(b)) => b,
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        let Ok(f) = Frame::decode(&bytes) else {
            continue;
        };
        if f.validate().is_err() || f.stream_id != stream_id {
            continue;
        }
        match f.body {
            Some(Body::Handshake { payload }) => return Ok(payload),
            Some(Body::Reset { .. }) => return Err(HarnessError::Refused),
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
/// socket), a sealer (messages into frames) and a reader (frames opened into
/// messages); the [`Channel`] is the program's end. Dropping its receiver
/// ends the stream and the socket.
fn run_stream(
    mut sink: Sink,
    mut source: Source,
    stream_id: String,
    transport: crate::noise::Transport,
) -> Channel {
    let (mut send, mut recv) = halves(&stream_id, transport);
    let (in_tx, in_rx) = mpsc::channel::<Vec<u8>>(QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<bytes::Bytes>(QUEUE);
    let (frame_tx, mut frame_rx) = mpsc::channel::<Message>(QUEUE);
    // Writer: frames from the sealer and pings onto the socket.
    let writer = tokio::spawn(async move {
        let mut ping = tokio::time::interval(Duration::from_secs(30));
        ping.tick().await;
        loop {
            let m = tokio::select! {
                m = frame_rx.recv() => match m { Some(m) => m, None => break },
                _ = ping.tick() => Message::Ping(Vec::new().into()),
            };
            if sink.send(m).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let sid = stream_id.clone();
    let sealer_frames = frame_tx.clone();
    tokio::spawn(async move {
        while let Some(msg) = out_rx.recv().await {
            let Ok(frames) = send.seal(&msg) else { break };
            for f in frames {
                if sealer_frames.send(Message::Binary(f.into())).await.is_err() {
                    return;
                }
            }
        }
    });
    tokio::spawn(async move {
        loop {
            // The user dropping its receiver ends the stream (and the socket).
            let m = tokio::select! {
                m = source.next() => m,
                _ = in_tx.closed() => None,
            };
            let bytes = match m {
                Some(Ok(Message::Binary(b))) => b,
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => continue,
            };
            let Ok(f) = Frame::decode(&bytes) else {
                continue;
            };
            if f.validate().is_err() || f.stream_id != sid {
                continue;
            }
            match f.body {
                Some(Body::Data { seq, payload, .. }) => match recv.open(seq, payload) {
                    Ok(msgs) => {
                        for m in msgs {
                            if in_tx.send(m).await.is_err() {
                                break;
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!("relay stream failed: {e}");
                        break;
                    }
                },
                Some(Body::Reset { .. }) => break,
                _ => {}
            }
        }
        // The stream is over: stop writing too, so the socket closes.
        drop(frame_tx);
        writer.abort();
    });
    Channel {
        inbound: in_rx,
        outbound: out_tx,
        peer: format!("relay stream {stream_id}"),
    }
}
