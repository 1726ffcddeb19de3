//! One established stream's two directions: messages become encrypted, numbered
//! data frames ([`SendHalf`]), and numbered frames become messages again
//! ([`RecvHalf`]), whatever order the relay delivers them in (within the window).

use crate::buffers::BufferPool;
use crate::frame::{Body, Frame};
use crate::noise::{NoiseError, Opener, Sealer, Transport, TAG_LEN};
use crate::ordered::{Ordered, OutOfWindow, SendSeq};
use crate::records::{self, BadLength, Reassembler};
pub use crate::stream_send::{StreamClosed, StreamSender};
use bytes::BytesMut;

/// Why a stream must be torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// A record failed to decrypt, or a counter ran out.
    #[error(transparent)]
    Noise(#[from] NoiseError),
    /// Frames beyond the reorder window, or seq exhausted.
    #[error(transparent)]
    Order(#[from] OutOfWindow),
    /// A message length prefix was invalid.
    #[error(transparent)]
    Length(#[from] BadLength),
}

/// Sends messages on one stream.
pub struct SendHalf {
    stream_id: String,
    sealer: Sealer,
    seq: SendSeq,
    /// Where frame buffers come from, if recycled.
    pool: Option<BufferPool>,
    /// A record's frame head and the pieces copied before its bulk, built
    /// here before they go to the frame (kept to reuse the allocation).
    staged: Vec<u8>,
}

/// Receives messages on one stream.
pub struct RecvHalf {
    opener: Opener,
    ordered: Ordered<bytes::BytesMut>,
    reassembler: Reassembler,
}

/// Splits an established transport for `stream_id` into its halves.
pub fn halves(stream_id: &str, t: Transport) -> (SendHalf, RecvHalf) {
    let (sealer, opener) = t.split();
    (
        SendHalf {
            stream_id: stream_id.to_string(),
            sealer,
            seq: SendSeq::default(),
            pool: None,
            staged: Vec::new(),
        },
        RecvHalf {
            opener,
            ordered: Ordered::default(),
            reassembler: Reassembler::default(),
        },
    )
}

impl SendHalf {
    /// Seals frames into buffers taken from `pool` (which the socket's
    /// writer fills with the frames it has sent).
    pub fn with_pool(mut self, pool: BufferPool) -> SendHalf {
        self.pool = Some(pool);
        self
    }

    /// The encoded data frames carrying `message` (one per record).
    pub fn seal(&mut self, message: &[u8]) -> Result<Vec<BytesMut>, StreamError> {
        self.seal_parts(&[message])
    }

    /// The data frames carrying `message` (its head and body as one
    /// message; see [`SendHalf::seal_parts`]).
    pub fn seal_message(&mut self, message: &OutMessage) -> Result<Vec<BytesMut>, StreamError> {
        self.seal_parts(&[&message.head, &message.body])
    }

    /// The data frames carrying `parts` joined as one message, without
    /// joining them first: each record's bulk (the piece that ends it) is
    /// sealed from where it lies straight into its frame, and only the
    /// pieces before it in the record (the length prefix, a message's
    /// header) are copied there first (see [`records`] for the layout).
    /// Each frame's buffer is written in full (head, copied pieces, then
    /// ciphertext and tag), so a recycled one needs no clearing first.
    pub fn seal_parts(&mut self, parts: &[&[u8]]) -> Result<Vec<BytesMut>, StreamError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len == 0 || len > records::MAX_MESSAGE_LEN {
            return Err(BadLength.into());
        }
        let prefix = (len as u32).to_be_bytes();
        let mut pieces = std::iter::once(&prefix[..]).chain(parts.iter().copied());
        let mut current: &[u8] = &[];
        let mut left = 4 + len;
        let mut frames = Vec::with_capacity(left.div_ceil(records::RECORD_PLAINTEXT_LEN));
        while left > 0 {
            let n = left.min(records::RECORD_PLAINTEXT_LEN);
            self.staged.clear();
            Frame::put_data_head(
                &mut self.staged,
                &self.stream_id,
                self.seq.take()?,
                n + TAG_LEN,
            );
            let start = self.staged.len();
            let mut need = n;
            let tail = loop {
                if current.is_empty() {
                    match pieces.next() {
                        Some(p) => current = p,
                        // The lengths were summed above: never reached.
                        None => break &[][..],
                    }
                }
                let (now, rest) = current.split_at(need.min(current.len()));
                current = rest;
                need -= now.len();
                if need == 0 {
                    break now;
                }
                self.staged.extend_from_slice(now);
            };
            let staged = self.staged.len();
            let total = staged + tail.len() + TAG_LEN;
            let mut frame = match &self.pool {
                Some(pool) => pool.take_filled(total),
                None => BytesMut::zeroed(total),
            };
            frame[..staged].copy_from_slice(&self.staged);
            self.sealer.seal_into(&mut frame, start, tail)?;
            frames.push(frame);
            left -= n;
        }
        Ok(frames)
    }
}

/// One message for [`Channel::outbound`]: its bytes are `head` then `body`
/// (either may be empty), sealed as one message. A program that frames a
/// payload it keeps elsewhere (a header before an output log's chunk)
/// passes both, and they are never joined into a buffer of their own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutMessage {
    /// The message's first bytes.
    pub head: bytes::Bytes,
    /// The bytes after `head`.
    pub body: bytes::Bytes,
}

impl From<bytes::Bytes> for OutMessage {
    fn from(whole: bytes::Bytes) -> OutMessage {
        OutMessage {
            head: whole,
            body: bytes::Bytes::new(),
        }
    }
}

impl From<Vec<u8>> for OutMessage {
    fn from(whole: Vec<u8>) -> OutMessage {
        bytes::Bytes::from(whole).into()
    }
}

impl From<(bytes::Bytes, bytes::Bytes)> for OutMessage {
    fn from((head, body): (bytes::Bytes, bytes::Bytes)) -> OutMessage {
        OutMessage { head, body }
    }
}

/// What a frame appended to [`RecvHalf::tail`] turned out to be.
#[derive(Debug)]
pub enum Arrived {
    /// A data frame of this stream: the messages it completed (often none).
    Messages(Vec<bytes::Bytes>),
    /// Another valid frame of this stream: its body (a reset, say).
    Other(Body),
    /// Undecodable, invalid or another stream's: dropped.
    Skipped,
}

impl RecvHalf {
    /// Accepts the data frame at `seq`; returns the messages now complete.
    /// The record is opened where it lies when `payload` is its buffer's
    /// only handle (a frame decoded by [`Frame::decode_shared`] and dropped).
    pub fn open(
        &mut self,
        seq: u32,
        payload: bytes::Bytes,
    ) -> Result<Vec<bytes::Bytes>, StreamError> {
        let payload = payload
            .try_into_mut()
            .unwrap_or_else(|shared| bytes::BytesMut::from(&shared[..]));
        self.open_owned(seq, payload)
    }

    /// Where the socket may append the next frame (see
    /// `socket::Reader::next_appending`): the end of the message being
    /// assembled, so that its record is decrypted where it belongs.
    pub fn tail(&mut self) -> &mut bytes::BytesMut {
        self.reassembler.tail()
    }

    /// Takes the frame appended to [`RecvHalf::tail`] from `start`, for the
    /// stream `stream_id`. A data frame in order is opened where it lies: its
    /// plaintext moves down over the frame's head while it is decrypted, so
    /// each byte of a long message is copied once, by the kernel. Errors:
    /// [`StreamError`]; the stream must then be torn down.
    pub fn open_appended(&mut self, start: usize, stream_id: &str) -> Result<Arrived, StreamError> {
        let tail = self.reassembler.tail();
        let Some(frame) = tail.get(start..) else {
            return Ok(Arrived::Skipped);
        };
        let (f, at) = match Frame::decode_located(frame) {
            Ok(located) => located,
            Err(_) => {
                tail.truncate(start);
                return Ok(Arrived::Skipped);
            }
        };
        if f.validate_located(at.len()).is_err() || f.stream_id != stream_id {
            tail.truncate(start);
            return Ok(Arrived::Skipped);
        }
        let seq = match f.body {
            Some(Body::Data { seq, .. }) => seq,
            Some(other) => {
                tail.truncate(start);
                return Ok(Arrived::Other(other));
            }
            None => {
                tail.truncate(start);
                return Ok(Arrived::Skipped);
            }
        };
        if !self.ordered.is_next(seq) {
            // Early, late or a duplicate: the ordinary path keeps it.
            let payload = bytes::BytesMut::from(&tail[start + at.start..start + at.end]);
            tail.truncate(start);
            return Ok(Arrived::Messages(self.open_owned(seq, payload)?));
        }
        let opened = self
            .opener
            .decrypt_within(&mut tail[start..start + at.end], at.start);
        let n = match opened {
            Ok(n) => n,
            Err(e) => {
                tail.truncate(start);
                return Err(e.into());
            }
        };
        tail.truncate(start + n);
        self.ordered.advance()?;
        Ok(Arrived::Messages(self.reassembler.appended()?))
    }

    fn open_owned(
        &mut self,
        seq: u32,
        payload: bytes::BytesMut,
    ) -> Result<Vec<bytes::Bytes>, StreamError> {
        let mut out = Vec::new();
        for mut record in self.ordered.push(seq, payload)? {
            self.opener.decrypt_in_place(&mut record)?;
            out.extend(self.reassembler.push(record)?);
        }
        Ok(out)
    }
}

/// A stream's messages as channels, what the program on each end uses: read
/// `inbound` until `None` (the stream ended), send on `outbound` (fails once
/// the stream is gone). Dropping both ends the stream.
pub struct Channel {
    /// Messages from the peer (a long one's buffer is the one its records
    /// were read into).
    pub inbound: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    /// Messages to the peer, sealed in the sending task: shared bytes, so a
    /// payload the program also keeps (an output log's chunk) is sealed
    /// from where it lies.
    pub outbound: StreamSender,
    /// Description, e.g. `relay stream 1b4e…`.
    pub peer: String,
    /// The cipher of the stream's records (AES-256-GCM with the reference,
    /// AEGIS-256X2 when both ends are ours, see
    /// [`crate::noise::TransportCipher`]).
    pub transport_cipher: crate::noise::TransportCipher,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sealing in place gives the very frames the plain layout gives
    /// (`records::split`, then `encrypt`, then `Frame::data`), whatever the
    /// parts; and they open back into the message.
    #[test]
    fn sealed_parts_are_the_plain_layouts_frames_and_open_back() {
        // Without a pool, and with one whose buffers hold stale bytes (of
        // 0xAA, and of the frames sent before): every byte of each frame
        // is written, so the frames are the same.
        for pooled in [false, true] {
            seal_parts_against_the_plain_layout(pooled.then(BufferPool::new));
        }
    }

    fn seal_parts_against_the_plain_layout(pool: Option<BufferPool>) {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let (fast, _) = halves("s1", Transport::from_keys(&a, &b));
        let mut fast = match &pool {
            Some(pool) => fast.with_pool(pool.clone()),
            None => fast,
        };
        let (mut plain, _) = Transport::from_keys(&a, &b).split();
        let (_, mut rx) = halves("s1", Transport::from_keys(&b, &a));
        let mut seq = 0u32;
        let r = records::RECORD_PLAINTEXT_LEN;
        for len in [1usize, 5, r - 4, r - 3, r, 100_000, 3 * r + 17] {
            let msg: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            for cut in [0, len / 3, len] {
                if let Some(pool) = &pool {
                    for stale in [20_000, r, r + 100, r + 200] {
                        pool.give(BytesMut::from(&vec![0xAA; stale][..]).freeze());
                    }
                }
                let held = pool.as_ref().map(BufferPool::held);
                let (p1, p2) = msg.split_at(cut);
                let frames = fast.seal_parts(&[p1, &[], p2]).unwrap();
                if let (Some(pool), Some(held)) = (&pool, held) {
                    // Large records are sealed into the stale buffers.
                    assert!(len < 20_000 || pool.held() < held, "{len}: pool unused");
                }
                let want: Vec<Vec<u8>> = records::split(&msg)
                    .unwrap()
                    .iter()
                    .map(|rec| {
                        let f = Frame::data("s1", seq, plain.encrypt(rec).unwrap()).encode();
                        seq += 1;
                        f
                    })
                    .collect();
                assert_eq!(frames, want, "{len} bytes cut at {cut}");
                let mut got = Vec::new();
                for f in frames {
                    let Some(crate::frame::Body::Data { seq, payload, .. }) =
                        Frame::decode(&f).unwrap().body
                    else {
                        panic!("not a data frame");
                    };
                    got.extend(rx.open(seq, payload).unwrap());
                    if let Some(pool) = &pool {
                        pool.give(f.freeze());
                    }
                }
                assert_eq!(got, vec![msg.clone()], "{len} bytes back");
            }
        }
        assert!(fast.seal_parts(&[&[], &[]]).is_err(), "an empty message");
    }

    /// Feeds `frame` as the harness's socket does: appended to the tail.
    fn arrive(rx: &mut RecvHalf, frame: &[u8]) -> Result<Arrived, StreamError> {
        let start = rx.tail().len();
        rx.tail().extend_from_slice(frame);
        rx.open_appended(start, "s1")
    }

    fn messages(a: Result<Arrived, StreamError>) -> Vec<bytes::Bytes> {
        match a {
            Ok(Arrived::Messages(m)) => m,
            other => panic!("not messages: {other:?}"),
        }
    }

    #[test]
    fn records_read_where_their_message_is_assembled_open_to_it() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let (mut tx, _) = halves("s1", Transport::from_keys(&a, &b));
        let (_, mut rx) = halves("s1", Transport::from_keys(&b, &a));
        let (mut other, _) = halves("s2", Transport::from_keys(&a, &b));
        let r = records::RECORD_PLAINTEXT_LEN;
        for len in [1usize, r - 4, r - 3, 100_000, 3 * r + 17] {
            let msg: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let frames = tx.seal(&msg).unwrap();
            let mut got = Vec::new();
            let mut first_place = None;
            for (i, f) in frames.iter().enumerate() {
                // Another stream's frame between records is dropped.
                let stray = &other.seal(b"not yours").unwrap()[0];
                assert!(matches!(arrive(&mut rx, stray), Ok(Arrived::Skipped)));
                got.extend(messages(arrive(&mut rx, f)));
                if i == 0 {
                    first_place = Some(rx.tail().as_ptr() as usize);
                }
            }
            assert_eq!(got, vec![msg.clone()], "{len} bytes");
            if frames.len() > 1 {
                // Every record was decrypted into the buffer reserved when
                // the first one told the length: nothing was moved after.
                assert_eq!(
                    Some(got[0].as_ptr() as usize - 4),
                    first_place,
                    "{len} bytes assembled where they were read"
                );
            }
            assert!(rx.tail().is_empty(), "nothing left behind");
        }
        let reset = Frame::reset("s1", "bye").encode();
        assert!(matches!(
            arrive(&mut rx, &reset),
            Ok(Arrived::Other(Body::Reset { .. }))
        ));
    }

    #[test]
    fn appended_records_out_of_order_or_forged_take_the_ordinary_path_or_fail() {
        let (a, b) = ([3u8; 32], [4u8; 32]);
        let (mut tx, _) = halves("s1", Transport::from_keys(&a, &b));
        let (_, mut rx) = halves("s1", Transport::from_keys(&b, &a));
        let msg: Vec<u8> = (0..200_000).map(|i| (i % 241) as u8).collect();
        let mut frames = tx.seal(&msg).unwrap();
        frames.swap(1, 2);
        let mut got = Vec::new();
        for f in &frames {
            got.extend(messages(arrive(&mut rx, f)));
        }
        assert_eq!(got, vec![msg.clone()], "reordered records");
        // A duplicate is dropped; a forged record tears the stream down.
        assert!(messages(arrive(&mut rx, &frames[0])).is_empty());
        let mut forged = tx.seal(b"hello").unwrap().remove(0);
        let last = forged.len() - 1;
        forged[last] ^= 1;
        assert!(matches!(
            arrive(&mut rx, &forged),
            Err(StreamError::Noise(_))
        ));
    }
}
