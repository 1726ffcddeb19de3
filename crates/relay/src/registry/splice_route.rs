//! An executor socket's data frames moved to their harness without being
//! copied through the node (`splice(2)` through the harness queue's pipe).
//!
//! A frame qualifies when the node can tell from its first bytes
//! ([`PEEK_BYTES`], read without taking them) that it is a whole binary
//! frame of at least [`SPLICE_MIN_BYTES`], whose data field runs to its end
//! ([`crate::frame::data_stream_id`]), for a stream whose harness agreed to
//! masked frames and whose budgets have room for it. It is then passed on
//! exactly as the executor masked it (the harness unmasks it), header and
//! all, so the node never touches its payload. Every other frame is read
//! by the socket's [`Reader`] as before; reads are capped at the end of the
//! frame the peek shows, so a frame read never swallows the start of the
//! next one, which may qualify.
//!
//! What moves this way is what [`Hub::route_to_harness`] would have queued
//! for a data frame; a frame that would pass a budget is read and routed as
//! usual, so the budgets' resets work the same either way.

use super::hub::{Hub, MESSAGE_TIMEOUT};
use super::queue::{HarnessQueue, Item, Reserved, Splicing, QUEUED_FRAME_OVERHEAD};
use crate::frame::{data_stream_id, MAX_FRAME_BYTES};
use crate::socket::splice::{read_exact, splice_in, SharedTcp, SplicedIn};
use crate::socket::{Message, Reader, WsError};
use exec_server_wsframe::frame::{parse_header, OpCode};
use exec_server_wsframe::mask::apply_mask;
use std::sync::Arc;
use tokio::io::AsyncRead;

/// Bytes looked at before a frame is read or spliced: a frame header (at
/// most 14 bytes) and a data frame's fields before its data (a version, a
/// stream id of up to 100-odd bytes, acknowledgements).
pub const PEEK_BYTES: usize = 256;

/// Smallest frame payload moved by splicing: 8 KiB. Below it the two
/// splices cost more than the copies they save.
pub const SPLICE_MIN_BYTES: u64 = 8 * 1024;

/// What [`Hub::next_from_executor`] did.
pub(super) enum FromExecutor {
    /// Read this (as [`Reader::next`] does).
    Read(Result<Option<Message>, WsError>),
    /// Moved a data frame to its harness.
    Spliced,
}

impl Hub {
    /// The next frame from the executor socket of `env`: read by `reader`,
    /// or, when `tcp` is its socket and the frame qualifies, spliced to its
    /// harness. Not cancel-safe half way through a splice: the caller drops
    /// the socket when it drops this call.
    pub(super) async fn next_from_executor<R: AsyncRead + Unpin>(
        &self,
        env: &str,
        reader: &mut Reader<R>,
        tcp: Option<&SharedTcp>,
    ) -> FromExecutor {
        if let Some(tcp) = tcp.filter(|_| reader.between_frames()) {
            match self.try_splice(env, reader, tcp).await {
                Ok(true) => return FromExecutor::Spliced,
                Ok(false) => {}
                Err(e) => return FromExecutor::Read(Err(e)),
            }
        }
        FromExecutor::Read(reader.next().await)
    }

    /// Splices the next frame if it qualifies (`true`); else caps `reader`'s
    /// next read at the end of what the peek shows of whole frames.
    async fn try_splice<R: AsyncRead + Unpin>(
        &self,
        env: &str,
        reader: &mut Reader<R>,
        tcp: &SharedTcp,
    ) -> Result<bool, WsError> {
        let mut peeked = [0u8; PEEK_BYTES];
        let n = tcp.tcp().peek(&mut peeked).await?;
        let seen = &mut peeked[..n];
        // A header the reader will refuse, or one not all here: the reader
        // reads it (and says why, or waits for the rest).
        let Ok(Some(header)) = parse_header(seen) else {
            return Ok(false);
        };
        let (Some(key), true, true) = (
            header.mask,
            header.opcode == OpCode::Binary && header.fin,
            (SPLICE_MIN_BYTES..=MAX_FRAME_BYTES as u64).contains(&header.len),
        ) else {
            reader.cap_next_read(whole_frames(seen));
            return Ok(false);
        };
        // Both fit: the payload is at most MAX_FRAME_BYTES.
        let payload_len = header.len as usize;
        let total = header.header_len + payload_len;
        // The fields in front of the data, unmasked where they lie (the
        // peeked copy is ours; the socket keeps the frame as it came).
        let fields = &mut seen[header.header_len..];
        apply_mask(fields, key, 0);
        let Some((queue, splicing, reserved)) =
            data_stream_id(fields, payload_len).and_then(|id| self.splice_target(env, id, total))
        else {
            reader.cap_next_read(total);
            return Ok(false);
        };
        let Some(pipe) = splicing.pipe() else {
            // Not so: `splice_target` made it.
            reader.cap_next_read(total);
            return Ok(false);
        };
        let deadline = tokio::time::Instant::now() + MESSAGE_TIMEOUT;
        let mut moved = 0;
        let mut rest = None;
        while moved < total {
            let step = tokio::time::timeout_at(deadline, splice_in(tcp.tcp(), pipe, total - moved));
            match step.await.map_err(|_| WsError::Stalled)?? {
                SplicedIn::Moved(k) => moved += k,
                SplicedIn::Closed => {
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into())
                }
                // A harness that stopped reading: the rest of the frame is
                // read instead (it never blocks the executor's socket).
                SplicedIn::PipeFull => {
                    let read = read_exact(tcp.tcp(), total - moved);
                    let read = tokio::time::timeout_at(deadline, read).await;
                    rest = Some(read.map_err(|_| WsError::Stalled)??.freeze());
                    break;
                }
            }
        }
        self.counters.to_harness.inc_by(total as u64);
        self.counters.spliced.inc_by(moved as u64);
        self.counters.splice_fallback.inc_by((total - moved) as u64);
        let mut items = Vec::with_capacity(2);
        if moved > 0 {
            items.push(Item::Piped(moved));
        }
        items.extend(rest.map(Item::Raw));
        // A stream reset meanwhile has the frame dropped with it.
        let _ = queue.send_reserved(items, reserved);
        Ok(true)
    }
}

impl Hub {
    /// The queue of `stream_id`'s harness if that harness takes spliced
    /// frames and its pipe can be had, with its splicing and the budget for
    /// a frame of `total` bytes, taken last (nothing to give back when
    /// another check fails).
    fn splice_target(
        &self,
        env: &str,
        stream_id: &str,
        total: usize,
    ) -> Option<(HarnessQueue, Arc<Splicing>, Reserved)> {
        let queue = self.stream_queue(env, stream_id)?;
        let splicing = queue.splicing()?.clone();
        // Made now if need be; none (past the node's budget): read as usual.
        splicing.pipe()?;
        let reserved = queue.reserve(total + QUEUED_FRAME_OVERHEAD).ok()?;
        Some((queue, splicing, reserved))
    }
}

/// The bytes at the start of `seen` that whole frames take (at least 1:
/// a read capped there still makes progress).
fn whole_frames(seen: &[u8]) -> usize {
    let mut at = 0;
    while let Ok(Some(h)) = parse_header(&seen[at..]) {
        let end = (at + h.header_len).saturating_add(usize::try_from(h.len).unwrap_or(usize::MAX));
        if end > seen.len() {
            // This frame goes beyond the peek: read to its end.
            return if at == 0 { end } else { at };
        }
        at = end;
    }
    at.max(1)
}
