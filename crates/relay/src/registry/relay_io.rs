//! A relay socket's plumbing on a node: what its reader's reads mean
//! ([`classify`]) and an executor socket's writer task ([`spawn_writer`]),
//! which takes the frames harnesses send it from a bounded queue (a
//! harness's socket has its own, [`super::harness_writer`]).

use super::close::{send_close, CloseWith};
use crate::socket::{gather, CloseStatus, Message, Outgoing, Writer, WsError};
use bytes::Bytes;
use std::time::Duration;
use tokio::io::AsyncWrite;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Pongs owed to a socket's peer, queued by its reader for its writer.
pub(super) const PONG_QUEUE: usize = 4;

/// What a node does with one read from a relay socket.
pub(super) enum Read {
    /// Route this relay frame.
    Frame(Bytes),
    /// Nothing to route (a ping, now owed a pong; a pong; a text message).
    Skip,
    /// The socket closed, failed or broke the protocol; the status of the
    /// close frame to answer with.
    End(Option<CloseStatus>),
}

pub(super) fn classify(
    read: Result<Option<Message>, WsError>,
    pongs: &mpsc::Sender<Bytes>,
) -> Read {
    match read {
        Ok(Some(Message::Binary(b))) => Read::Frame(b),
        Ok(Some(Message::Ping(p))) => {
            // A full queue means pongs are already owed; one is enough.
            let _ = pongs.try_send(p);
            Read::Skip
        }
        Ok(Some(Message::Close(_))) | Ok(None) => Read::End(None),
        Err(e) => Read::End(CloseStatus::for_error(&e)),
        Ok(Some(_)) => Read::Skip,
    }
}

/// A relay socket's writer: writes queued frames, pongs its reader owes and
/// pings; ends when the queue closes or `stop` fires, with a close frame
/// (with the status `close` holds by then). Frames it has taken count
/// against their budgets until written; a write blocked when `stop` fires
/// is abandoned, its frames freed and the socket dropped without a close
/// frame (it would land inside a frame half written).
pub(super) fn spawn_writer<W>(
    mut writer: Writer<W>,
    mut rx: mpsc::Receiver<Bytes>,
    mut pongs: mpsc::Receiver<Bytes>,
    (stop, close): (CancellationToken, CloseWith),
    ping_every: Duration,
) -> tokio::task::JoinHandle<()>
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut ping = tokio::time::interval(ping_every);
        ping.tick().await;
        let mut batch = Vec::with_capacity(crate::MAX_FRAMES_PER_FLUSH);
        let mut abandoned = false;
        loop {
            let first = tokio::select! {
                m = rx.recv() => match m { Some(b) => Outgoing::Binary(b), None => break },
                Some(p) = pongs.recv() => Outgoing::Pong(p),
                _ = ping.tick() => Outgoing::Ping(Bytes::new()),
                _ = stop.cancelled() => break,
            };
            // What is queued behind it goes out with it: one vectored write,
            // fewer and larger socket writes while a stream runs.
            gather(&mut batch, first, || {
                rx.try_recv().ok().map(Outgoing::Binary)
            });
            let written = tokio::select! {
                // A write that can finish finishes; only a blocked one is
                // abandoned.
                biased;
                r = tokio::time::timeout(Duration::from_secs(30), writer.send(&mut batch)) => {
                    matches!(r, Ok(Ok(_)))
                }
                _ = stop.cancelled() => {
                    abandoned = true;
                    false
                }
            };
            batch.clear();
            if !written {
                break;
            }
        }
        // A socket that cannot be written to is dead, whatever it sends: its
        // reader stops too, and its environment is free again.
        stop.cancel();
        if !abandoned {
            send_close(writer, close.get()).await;
        }
    })
}
