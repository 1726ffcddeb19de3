//! A harness socket's writer task: writes what the executor's reader could
//! not write through itself ([`HarnessQueue::send`]), the pongs the harness
//! is owed and the node's pings; ends with a close frame.

use super::close::{send_close, CloseWith};
use super::queue::{HarnessQueue, HarnessWriter, Lead, Splicing, Turn};
use crate::socket::splice::splice_out;
use crate::socket::{Outgoing, Remainder};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Longest a turn's write may block before the harness counts as gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest the close frame (and the rest of a frame before it) may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `queue`'s socket (whose writer it holds, [`HarnessQueue::attach`])
/// until the queue is closed and written out, or `stop` fires, or a write
/// fails; then sends a close frame (with the status `close` holds by then),
/// unless a write was cut short (it would land inside a frame). What it
/// leaves in the queue is freed.
pub(super) fn spawn(
    queue: HarnessQueue,
    mut pongs: mpsc::Receiver<Bytes>,
    (stop, close): (CancellationToken, CloseWith),
    ping_every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ping = tokio::time::interval(ping_every);
        ping.tick().await;
        let mut batch = Vec::with_capacity(crate::MAX_FRAMES_PER_FLUSH);
        // Whether the last turn wrote: the queue may hold more at once.
        let mut more = false;
        let mut usable = true;
        loop {
            batch.clear();
            tokio::select! {
                () = queue.ready(), if !more => {}
                () = std::future::ready(()), if more => {}
                Some(p) = pongs.recv() => batch.push(Outgoing::Pong(p)),
                _ = ping.tick() => batch.push(Outgoing::Ping(Bytes::new())),
                _ = stop.cancelled() => break,
            }
            let (mut writer, owed, charge, lead, piped) = match queue.take_turn(&mut batch) {
                Turn::Write {
                    writer,
                    owed,
                    charge,
                    lead,
                    piped,
                } => (writer, owed, charge, lead, piped),
                Turn::Idle => {
                    more = false;
                    continue;
                }
                Turn::End => break,
                Turn::Broken => {
                    usable = false;
                    break;
                }
            };
            let written = tokio::select! {
                // A write that can finish finishes; only a blocked one is
                // abandoned.
                biased;
                r = tokio::time::timeout(WRITE_TIMEOUT, write_turn(&mut writer, owed, lead, &mut batch, piped)) => {
                    matches!(r, Ok(Ok(())))
                }
                _ = stop.cancelled() => false,
            };
            queue.end_turn(written.then_some(writer), charge);
            if !written {
                usable = false;
                break;
            }
            more = true;
        }
        // A socket that cannot be written to is dead, whatever it sends: its
        // reader stops too.
        let rest = queue.finish();
        stop.cancel();
        if let Some((writer, owed)) = rest.filter(|_| usable) {
            close_after(writer, owed, &close).await;
        }
    })
}

/// The rest of a frame written through in part, or the rest of a piped
/// one, then the batch, then the piped bytes (spliced to the socket the
/// writer writes to).
async fn write_turn(
    writer: &mut HarnessWriter,
    owed: Option<Remainder>,
    lead: Option<Lead>,
    batch: &mut Vec<Outgoing>,
    piped: Option<(Arc<Splicing>, usize)>,
) -> std::io::Result<()> {
    if let Some(rest) = owed {
        writer.finish(rest).await?;
    }
    match lead {
        Some(Lead::Raw(b)) => writer.send(&mut vec![Outgoing::Raw(b)]).await?,
        Some(Lead::Piped(splicing, len)) => spliced(&splicing, len).await?,
        None => {}
    }
    if !batch.is_empty() {
        writer.send(batch).await?;
    }
    if let Some((splicing, len)) = piped {
        spliced(&splicing, len).await?;
    }
    Ok(())
}

/// `len` bytes from `splicing`'s pipe to its socket.
async fn spliced(splicing: &Splicing, len: usize) -> std::io::Result<()> {
    let Some(pipe) = splicing.pipe() else {
        return Err(std::io::ErrorKind::BrokenPipe.into());
    };
    splice_out(pipe, splicing.tcp.tcp(), len).await
}

/// The rest of a frame, if one is owed, then the close frame, within
/// [`CLOSE_TIMEOUT`] in all.
async fn close_after(mut writer: HarnessWriter, owed: Option<Remainder>, close: &CloseWith) {
    if let Some(rest) = owed {
        match tokio::time::timeout(CLOSE_TIMEOUT, writer.finish(rest)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
    send_close(writer, close.get()).await;
}
