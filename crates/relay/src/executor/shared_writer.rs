//! An executor's relay socket, written by whichever task has frames for it:
//! a stream's sender writes its sealed message itself, in turn with the
//! others, instead of queueing the frames for a writer task (one hand-over
//! between tasks fewer per message, and each message goes out in one
//! vectored write).

use crate::socket::{ClientWriter, Outgoing};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Time one write to the relay socket may take: 30 s. A socket that cannot
/// take a batch in that long is treated as dead.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a batch was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotWritten {
    /// The socket failed (now or before): the executor reconnects.
    Failed,
    /// The caller's `unless` token was cancelled while it waited its turn.
    Cancelled,
}

/// The write half of an executor's relay socket, shared by its streams and
/// its control frames. Cheap to clone (shared).
#[derive(Clone)]
pub(crate) struct SharedWriter {
    writer: Arc<tokio::sync::Mutex<Option<ClientWriter>>>,
    failed: CancellationToken,
}

impl SharedWriter {
    pub(crate) fn new(writer: ClientWriter) -> SharedWriter {
        SharedWriter {
            writer: Arc::new(tokio::sync::Mutex::new(Some(writer))),
            failed: CancellationToken::new(),
        }
    }

    /// Writes `batch` (left empty) once no other write is in progress,
    /// unless `unless` is cancelled first. A write is never abandoned half
    /// way by choice: only [`WRITE_TIMEOUT`], or the call being dropped
    /// while it writes, does that, and either marks the socket failed (a
    /// frame may be cut short, so nothing may follow it).
    pub(crate) async fn send(
        &self,
        batch: &mut Vec<Outgoing>,
        unless: &CancellationToken,
    ) -> Result<(), NotWritten> {
        let mut slot = tokio::select! {
            slot = self.writer.lock() => slot,
            _ = self.failed.cancelled() => return Err(NotWritten::Failed),
            _ = unless.cancelled() => return Err(NotWritten::Cancelled),
        };
        if self.failed.is_cancelled() {
            // Closed or failed meanwhile: the write half goes now.
            *slot = None;
            batch.clear();
            return Err(NotWritten::Failed);
        }
        let Some(writer) = slot.as_mut() else {
            return Err(NotWritten::Failed);
        };
        let cut_short = self.failed.clone().drop_guard();
        let written = tokio::time::timeout(WRITE_TIMEOUT, writer.send(batch)).await;
        batch.clear();
        match written {
            Ok(Ok(())) => {
                cut_short.disarm();
                if self.failed.is_cancelled() {
                    // Closed while this write ran.
                    *slot = None;
                }
                Ok(())
            }
            // The guard marks the socket failed.
            _ => {
                *slot = None;
                Err(NotWritten::Failed)
            }
        }
    }

    /// Whether a write is in progress now.
    #[cfg(test)]
    pub(crate) fn is_busy(&self) -> bool {
        self.writer.try_lock().is_err()
    }

    /// Cancelled once a write failed.
    pub(crate) fn failed(&self) -> &CancellationToken {
        &self.failed
    }

    /// No more writes: the socket's write half is dropped now, or by the
    /// write in progress when it ends.
    pub(crate) fn close(&self) {
        self.failed.cancel();
        if let Ok(mut slot) = self.writer.try_lock() {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::socket::{Io, Role, Writer};
    use std::future::Future;
    use tokio::io::{AsyncReadExt, DuplexStream};

    /// A shared writer over an in-memory pipe holding `room` bytes, and the
    /// pipe's far end (nobody reads it unless the test does).
    fn shared(room: usize) -> (SharedWriter, DuplexStream) {
        let (near, far) = tokio::io::duplex(room);
        let (_, w) = tokio::io::split(Box::new(near) as Box<dyn Io>);
        (SharedWriter::new(Writer::new(w, Role::Client)), far)
    }

    fn big_frame() -> Vec<Outgoing> {
        vec![Outgoing::Binary(vec![7u8; 64 * 1024].into())]
    }

    #[tokio::test]
    async fn a_write_dropped_half_way_fails_the_socket() {
        let (socket, _far) = shared(1024);
        let never = CancellationToken::new();
        let mut batch = big_frame();
        let mut write = Box::pin(socket.send(&mut batch, &never));
        let pending =
            std::future::poll_fn(|cx| std::task::Poll::Ready(write.as_mut().poll(cx).is_pending()))
                .await;
        assert!(pending, "the pipe is full part way into the frame");
        assert!(!socket.failed().is_cancelled());
        drop(write);
        assert!(socket.failed().is_cancelled(), "a frame was cut short");
        let mut next = big_frame();
        assert_eq!(
            socket.send(&mut next, &never).await,
            Err(NotWritten::Failed)
        );
    }

    #[tokio::test]
    async fn a_send_waiting_its_turn_is_cancelled_by_its_token_and_writes_nothing() {
        let (socket, mut far) = shared(1024);
        let never = CancellationToken::new();
        let busy = socket.clone();
        // Holds the socket: its frame does not fit until the far end reads.
        let first = tokio::spawn(async move {
            let mut batch = big_frame();
            busy.send(&mut batch, &never).await
        });
        while !socket.is_busy() {
            tokio::task::yield_now().await;
        }
        let stopped = CancellationToken::new();
        stopped.cancel();
        let mut second = vec![Outgoing::Binary(b"not sent".to_vec().into())];
        assert_eq!(
            socket.send(&mut second, &stopped).await,
            Err(NotWritten::Cancelled)
        );
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            far.read_to_end(&mut got).await.map(|_| got)
        });
        assert_eq!(first.await.unwrap(), Ok(()));
        assert!(!socket.failed().is_cancelled());
        socket.close();
        let got = reader.await.unwrap().unwrap();
        // Header (2 + 8 length + 4 mask) and the frame: nothing of the second.
        assert_eq!(got.len(), 14 + 64 * 1024);
    }

    #[tokio::test]
    async fn close_drops_the_write_half() {
        let (socket, mut far) = shared(1024);
        socket.close();
        let mut buf = [0u8; 16];
        assert_eq!(far.read(&mut buf).await.unwrap(), 0, "end of stream");
        let mut batch = big_frame();
        let never = CancellationToken::new();
        assert_eq!(
            socket.send(&mut batch, &never).await,
            Err(NotWritten::Failed)
        );
    }
}
