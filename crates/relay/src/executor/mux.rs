//! One physical relay socket of an executor: up to [`MAX_ACTIVE_STREAMS`]
//! streams, each admitted by a Noise handshake plus a registry `/validate`
//! (asked while the harness already sends; see [`Mux::handshake`]), and
//! each handed to the program as a [`Channel`]. Every frame rule of the
//! reference (REMOTE.md (g)) is applied here.

use super::shared_writer::SharedWriter;
use super::{Ctx, Disconnect, Observer};
use crate::api::ValidateRequest;
use crate::buffers::BufferPool;
use crate::frame::{Body, Frame, RESET_EXECUTOR_BUSY, RESET_PROTOCOL_ERROR};
use crate::keys::prologue;
use crate::noise::{PendingResponder, Transport, TransportCipher};
use crate::random::OsRandom;
use crate::socket::{ClientSocket, Message, Outgoing};
use crate::stream::{halves, Channel, RecvHalf, StreamSender};
use crate::stream_send::FrameRoute;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Streams served at once on one socket: 128.
pub const MAX_ACTIVE_STREAMS: usize = 128;
/// Registry validations in flight at once: 32.
pub const MAX_PENDING_VALIDATIONS: usize = 32;
/// Failed handshakes before new ones are paused: 8.
pub const MAX_FAILED_HANDSHAKES: u32 = 8;
/// How long new handshakes are refused after too many failures: 10 s.
pub const HANDSHAKE_COOLDOWN: Duration = Duration::from_secs(10);
/// Largest harness authorization: 4096 bytes.
pub const MAX_AUTHORIZATION_BYTES: usize = 4096;
/// Time the registry has to answer `/validate`: 10 s.
pub const VALIDATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Control frames (pongs, resets) queued for the socket; past it they are
/// dropped (a socket that far behind is stuck, and the watchdog ends it).
const CONTROL_QUEUE: usize = 256;
/// Messages queued towards one stream's program.
const STREAM_QUEUE: usize = 64;
/// Bytes a harness may send on a stream the registry has not admitted yet:
/// 256 KiB (its first requests are a few KB). Past it the stream is reset,
/// so an unadmitted harness cannot make an executor hold more.
pub const MAX_HELD_BYTES: usize = 256 * 1024;

struct Active {
    id: u64,
    recv: RecvHalf,
    inbound: mpsc::Sender<bytes::Bytes>,
    /// Tells the observer the stream closed when the entry goes, whichever
    /// of the several removal paths takes it.
    _counted: OpenStream,
    /// Cancelled when the entry goes (a reset, an error), so the program's
    /// sends on it fail instead of being sealed and sent for a stream the
    /// relay no longer routes.
    stopped: CancellationToken,
    /// Waits for the program to drop its sending end.
    watcher: tokio::task::AbortHandle,
}

impl Drop for Active {
    fn drop(&mut self) {
        self.stopped.cancel();
        self.watcher.abort();
    }
}

struct OpenStream(Arc<dyn Observer>);

impl OpenStream {
    fn new(observer: Arc<dyn Observer>) -> OpenStream {
        observer.stream_opened();
        OpenStream(observer)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.stream_closed();
    }
}

enum Event {
    Validated {
        stream_id: String,
        id: u64,
        admitted: bool,
    },
    Ended {
        stream_id: String,
        id: u64,
    },
}

/// A stream the registry has not admitted yet.
struct Held {
    /// Its routing entry's id, to match the registry's answer.
    id: u64,
    /// The program's end, given at admission.
    channel: Channel,
    /// Bytes its harness has sent meanwhile.
    sent: usize,
}

struct Mux<'a> {
    ctx: &'a Arc<Ctx>,
    out: mpsc::Sender<Outgoing>,
    /// Frame buffers the socket's writer hands back to the streams' sealers.
    buffers: BufferPool,
    /// The socket's write half, which the streams write to themselves.
    socket: SharedWriter,
    events: mpsc::Sender<Event>,
    active: HashMap<String, Active>,
    /// Streams awaiting the registry's `/validate` (held).
    held: HashMap<String, Held>,
    next_id: u64,
    failures: u32,
    paused_until: Option<Instant>,
}

impl Mux<'_> {
    fn reset(&self, stream_id: &str) {
        self.reset_because(stream_id, RESET_PROTOCOL_ERROR);
    }

    fn reset_because(&self, stream_id: &str, reason: &str) {
        let f = Frame::reset(stream_id, reason).encode();
        // A full queue means the socket is stuck; the watchdog will end it.
        let _ = self.out.try_send(Outgoing::Binary(f.into()));
    }

    /// Stops routing `stream_id`, held or admitted.
    fn forget(&mut self, stream_id: &str) {
        self.active.remove(stream_id);
        self.held.remove(stream_id);
    }

    fn charge(&mut self) {
        self.ctx.observer.handshake_failed();
        self.failures += 1;
        if self.failures >= MAX_FAILED_HANDSHAKES {
            self.failures = 0;
            self.paused_until = Some(Instant::now() + HANDSHAKE_COOLDOWN);
            tracing::warn!("pausing Noise relay handshakes after repeated failures");
        }
    }

    /// Answers msg1 at once and asks the registry meanwhile: the stream is
    /// *held* (its messages queued, no program sees them) until `/validate`
    /// says yes. Why: a harness may then send its first requests while the
    /// registry is asked instead of after, which saves a round trip to the
    /// registry on every new connection. Safe: msg2 proves this executor's
    /// key to the harness and gives it session keys, nothing more; nothing
    /// the harness sends is acted on, and nothing is sent to it, before the
    /// registry has agreed, and a refusal resets the stream.
    /// msg1 on `stream_id`, its frame offering `offered` (see
    /// [`TransportCipher`]).
    fn handshake(&mut self, stream_id: String, msg1: Vec<u8>, offered: Option<String>) {
        if self.held.contains_key(&stream_id) {
            // A second msg1 while the first is judged: neither goes on.
            self.forget(&stream_id);
            self.reset(&stream_id);
            return self.charge();
        }
        if self.active.contains_key(&stream_id) {
            return self.reset(&stream_id);
        }
        if self.paused_until.is_some_and(|t| Instant::now() < t)
            || self.active.len() >= MAX_ACTIVE_STREAMS
            || self.held.len() >= MAX_PENDING_VALIDATIONS
        {
            return self.reset_because(&stream_id, RESET_EXECUTOR_BUSY);
        }
        let p = prologue(
            &self.ctx.environment_id,
            &self.ctx.registration_id,
            &stream_id,
        );
        let pending = match PendingResponder::read_request(&self.ctx.identity, &p, &msg1) {
            Ok(p) => p,
            Err(_) => {
                self.reset(&stream_id);
                return self.charge();
            }
        };
        let authorization = match std::str::from_utf8(pending.payload()) {
            Ok(a) if a.len() <= MAX_AUTHORIZATION_BYTES => a.to_string(),
            _ => {
                self.reset(&stream_id);
                return self.charge();
            }
        };
        let req = ValidateRequest {
            executor_registration_id: self.ctx.registration_id.clone(),
            harness_public_key: pending.initiator_key().to_wire(),
            harness_key_authorization: authorization,
        };
        // The offer is unauthenticated: a node that drops it gets AES-GCM
        // (the reference's records); one that forges it gets records the
        // harness cannot open, which it could cause anyway.
        let cipher = match TransportCipher::from_wire(offered.as_deref()) {
            TransportCipher::Aegis256X2
                if self.ctx.transport_cipher == TransportCipher::Aegis256X2 =>
            {
                TransportCipher::Aegis256X2
            }
            _ => TransportCipher::AesGcm,
        };
        let Ok((transport, msg2)) = pending.complete(&mut OsRandom, cipher) else {
            self.reset(&stream_id);
            return self.charge();
        };
        let f = Frame::handshake(&stream_id, msg2)
            .with_transport_cipher(cipher.wire())
            .encode();
        if self.out.try_send(Outgoing::Binary(f.into())).is_err() {
            // The socket is stuck; the watchdog will end it.
            return;
        }
        self.next_id += 1;
        let id = self.next_id;
        let (active, channel) = self.open(&stream_id, id, transport);
        self.active.insert(stream_id.clone(), active);
        self.held.insert(
            stream_id.clone(),
            Held {
                id,
                channel,
                sent: 0,
            },
        );
        let ctx = self.ctx.clone();
        let events = self.events.clone();
        tokio::spawn(async move {
            let valid = tokio::time::timeout(
                VALIDATION_TIMEOUT,
                ctx.registry.validate(&ctx.environment_id, &stream_id, &req),
            )
            .await;
            let admitted = match valid {
                Ok(Ok(true)) => true,
                Ok(Ok(false)) => {
                    tracing::info!("environment registry rejected Noise relay harness key");
                    false
                }
                Ok(Err(e)) => {
                    tracing::warn!("harness key validation failed: {e}");
                    false
                }
                Err(_) => {
                    tracing::warn!("harness key validation timed out");
                    false
                }
            };
            let _ = events
                .send(Event::Validated {
                    stream_id,
                    id,
                    admitted,
                })
                .await;
        });
    }

    /// A stream's routing entry and the program's end of it, whose sends
    /// seal and queue their frames themselves.
    fn open(&self, stream_id: &str, id: u64, transport: Transport) -> (Active, Channel) {
        let cipher = transport.cipher();
        let (send, recv) = halves(stream_id, transport);
        let (in_tx, in_rx) = mpsc::channel(STREAM_QUEUE);
        let stopped = CancellationToken::new();
        let (outbound, done) = StreamSender::new(
            send.with_pool(self.buffers.clone()),
            FrameRoute::Socket(self.socket.clone()),
            stopped.clone(),
        );
        let events = self.events.clone();
        let sid = stream_id.to_string();
        // Wakes once: when the program drops its sending end (or a send
        // fails and the program lets go), the entry goes.
        let watcher = tokio::spawn(async move {
            let _ = done.await;
            let _ = events.send(Event::Ended { stream_id: sid, id }).await;
        });
        let active = Active {
            id,
            recv,
            inbound: in_tx,
            _counted: OpenStream::new(self.ctx.observer.clone()),
            stopped,
            watcher: watcher.abort_handle(),
        };
        let channel = Channel {
            inbound: in_rx,
            outbound,
            peer: format!("relay stream {stream_id}"),
            transport_cipher: cipher,
        };
        (active, channel)
    }

    /// The registry's answer for held stream `stream_id` (entry `id`): the
    /// program gets the stream, with what arrived meanwhile, or it is reset.
    fn validated(&mut self, stream_id: String, id: u64, admitted: bool) {
        let held = match self.held.entry(stream_id.clone()) {
            Entry::Occupied(e) if e.get().id == id => e.remove(),
            _ => return, // reset or replaced meanwhile
        };
        if admitted {
            (self.ctx.handler)(held.channel);
        } else {
            self.active.remove(&stream_id);
            self.reset(&stream_id);
            self.charge();
        }
    }

    async fn data(&mut self, stream_id: String, seq: u32, payload: bytes::Bytes) {
        let Some(a) = self.active.get_mut(&stream_id) else {
            return self.reset(&stream_id);
        };
        let held = self.held.get_mut(&stream_id).map(|h| {
            h.sent += payload.len();
            h.sent
        });
        match a.recv.open(seq, payload) {
            Ok(msgs) if held.is_some() => {
                // Nobody reads a held stream yet: more than its budget or its
                // queue before the registry answers is a harness not worth
                // waiting for.
                let over = held.is_some_and(|sent| sent > MAX_HELD_BYTES)
                    || msgs.into_iter().any(|m| a.inbound.try_send(m).is_err());
                if over {
                    tracing::debug!("relay stream sent too much before admission");
                    self.forget(&stream_id);
                    self.reset(&stream_id);
                }
            }
            Ok(msgs) => {
                for m in msgs {
                    if a.inbound.send(m).await.is_err() {
                        break;
                    }
                }
            }
            Err(e) => {
                tracing::debug!("relay stream error: {e}");
                self.active.remove(&stream_id);
                self.reset(&stream_id);
            }
        }
    }

    /// Decodes and checks a message; a data payload shares its buffer.
    /// A valid frame's stream id, body and transport cipher field.
    fn frame(&mut self, bytes: &bytes::Bytes) -> Option<(String, Body, Option<String>)> {
        let f = match Frame::decode_shared(bytes) {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!("dropping an undecodable relay frame: {e}");
                return None;
            }
        };
        if let Err(e) = f.validate() {
            tracing::warn!("dropping an invalid relay frame: {e}");
            return None;
        }
        Some((f.stream_id, f.body?, f.transport_cipher))
    }
}

/// Serves one socket until it fails; returns why it ended.
pub(super) async fn serve((mut source, sink): ClientSocket, ctx: &Arc<Ctx>) -> Disconnect {
    let buffers = BufferPool::new();
    let socket = SharedWriter::new(sink.with_pool(buffers.clone()));
    // Streams write their messages themselves; this task writes the rest
    // (pongs, resets, pings).
    let (out_tx, mut out_rx) = mpsc::channel::<Outgoing>(CONTROL_QUEUE);
    let (ev_tx, mut ev_rx) = mpsc::channel::<Event>(64);
    let keepalive = ctx.keepalive;
    let control = socket.clone();
    let writer = tokio::spawn(async move {
        let mut ping = tokio::time::interval(keepalive);
        ping.tick().await;
        let mut batch = Vec::with_capacity(crate::MAX_FRAMES_PER_FLUSH);
        let never = CancellationToken::new();
        loop {
            let m = tokio::select! {
                m = out_rx.recv() => match m { Some(m) => m, None => return },
                _ = ping.tick() => Outgoing::Ping(bytes::Bytes::new()),
            };
            crate::socket::gather(&mut batch, m, || out_rx.try_recv().ok());
            if control.send(&mut batch, &never).await.is_err() {
                return;
            }
        }
    });
    let mut mux = Mux {
        ctx,
        out: out_tx,
        buffers,
        socket: socket.clone(),
        events: ev_tx,
        active: HashMap::new(),
        held: HashMap::new(),
        next_id: 0,
        failures: 0,
        paused_until: None,
    };
    let mut last_seen = Instant::now();
    let mut watchdog = tokio::time::interval(Duration::from_millis(500).min(keepalive));
    let reason = loop {
        tokio::select! {
            // Cancel-safe: a frame half read when another branch wins stays
            // in the reader for the next call.
            m = source.next() => {
                last_seen = Instant::now();
                let bytes = match m {
                    Ok(Some(Message::Binary(b))) => b,
                    Ok(Some(Message::Close(code))) => {
                        if let Some(code) = code {
                            tracing::info!(status = code, "the relay node closed the executor socket");
                        }
                        break Disconnect::PeerClose;
                    }
                    Ok(None) => break Disconnect::PeerClose,
                    Err(_) => break Disconnect::ReadError,
                    Ok(Some(Message::Ping(p))) => {
                        // A full queue means frames are flowing, which tells
                        // the node the socket lives as well as a pong would.
                        let _ = mux.out.try_send(Outgoing::Pong(p));
                        continue;
                    }
                    Ok(Some(Message::Text(_))) => {
                        tracing::warn!("dropping a text message on the relay socket");
                        continue;
                    }
                    Ok(Some(Message::Pong)) => continue,
                };
                let Some((stream_id, body, cipher)) = mux.frame(&bytes) else { continue };
                // The payload is then its buffer's only handle: opened in place.
                drop(bytes);
                match body {
                    Body::Handshake { payload } => mux.handshake(stream_id, payload, cipher),
                    Body::Data { seq, payload, .. } => mux.data(stream_id, seq, payload).await,
                    Body::Reset { .. } => {
                        // The reason is unauthenticated: never logged.
                        mux.forget(&stream_id);
                    }
                    Body::Resume { .. } | Body::Ack | Body::Heartbeat => {}
                }
            }
            Some(ev) = ev_rx.recv() => match ev {
                Event::Validated { stream_id, id, admitted } => mux.validated(stream_id, id, admitted),
                Event::Ended { stream_id, id } => {
                    if mux.active.get(&stream_id).is_some_and(|a| a.id == id) {
                        mux.forget(&stream_id);
                        mux.reset(&stream_id);
                    }
                }
            },
            _ = watchdog.tick() => {
                if last_seen.elapsed() > keepalive + ctx.pong_timeout {
                    break Disconnect::PongTimeout;
                }
                if socket.failed().is_cancelled() {
                    break Disconnect::WriteError;
                }
            }
        }
    };
    writer.abort();
    socket.close();
    reason
}
