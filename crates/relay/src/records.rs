//! How one stream's messages travel as Noise records: each message gets a
//! 4-byte big-endian length prefix, and the bytes are cut into plaintext records
//! of at most [`RECORD_PLAINTEXT_LEN`]; a message always starts a new record.
//! The receiver appends decrypted records and takes out every whole message.

use bytes::{Buf, Bytes, BytesMut};

/// Largest plaintext per record: 61 440 bytes (`NOISE_RECORD_PLAINTEXT_LEN`).
pub const RECORD_PLAINTEXT_LEN: usize = 60 * 1024;
/// Largest message: 64 MiB (`MAX_NOISE_JSONRPC_MESSAGE_LEN`).
pub const MAX_MESSAGE_LEN: usize = 64 * 1024 * 1024;

/// A length prefix of 0 or above [`MAX_MESSAGE_LEN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid message length in the relay stream")]
pub struct BadLength;

/// Splits one message into plaintext records: the layout above, written
/// plainly; the tests' oracle for `SendHalf::seal_parts`, which writes the
/// same records straight into their frames. Errors: [`BadLength`] for an
/// empty message or one above [`MAX_MESSAGE_LEN`].
#[cfg(test)]
pub(crate) fn split(message: &[u8]) -> Result<Vec<Vec<u8>>, BadLength> {
    if message.is_empty() || message.len() > MAX_MESSAGE_LEN {
        return Err(BadLength);
    }
    let mut framed = Vec::with_capacity(4 + message.len());
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    Ok(framed
        .chunks(RECORD_PLAINTEXT_LEN)
        .map(|c| c.to_vec())
        .collect())
}

/// Capacity reserved for a message when its length prefix arrives, at most:
/// 4 MiB (a longer one grows as its records come, so a prefix alone cannot
/// make the receiver reserve 64 MiB).
const RESERVE_BYTES: usize = 4 << 20;

/// Room reserved past a message's last byte: a data frame's head and tag
/// (1 KiB covers a 128-byte stream id and a trace context), so the frame
/// carrying the last record can be read where the record belongs.
pub const FRAME_SLACK: usize = 1024;

/// Reassembles messages from decrypted records, wherever the records cut
/// them. Holds at most one partial message (≤ 64 MiB, its length prefix
/// first). A message in one record is that record's buffer; the records of
/// a longer one are either copied to their place ([`Reassembler::push`]) or
/// decrypted there by the caller ([`Reassembler::tail`], then
/// [`Reassembler::appended`]).
#[derive(Default)]
pub struct Reassembler {
    /// Plaintext of the message in progress, from its length prefix on.
    body: BytesMut,
    /// Bytes the message takes with its prefix, once the prefix is whole.
    want: Option<usize>,
}

impl Reassembler {
    /// Appends one record and returns every message now complete. Errors:
    /// [`BadLength`]; the stream must then be torn down.
    pub fn push(&mut self, record: BytesMut) -> Result<Vec<Bytes>, BadLength> {
        if self.body.is_empty() {
            self.body = record;
        } else {
            self.body.extend_from_slice(&record);
        }
        self.complete()
    }

    /// The buffer the next record may be decrypted at the end of (with
    /// room reserved for the rest of the message once its length is known).
    pub fn tail(&mut self) -> &mut BytesMut {
        &mut self.body
    }

    /// Takes the record the caller left at the end of [`Reassembler::tail`]
    /// (plaintext only) and returns every message now complete. Errors as
    /// [`Reassembler::push`].
    pub fn appended(&mut self) -> Result<Vec<Bytes>, BadLength> {
        self.complete()
    }

    fn complete(&mut self) -> Result<Vec<Bytes>, BadLength> {
        let mut out = Vec::new();
        loop {
            let want = match self.want {
                Some(w) => w,
                None => {
                    let Some(prefix) = self.body.first_chunk::<4>() else {
                        break;
                    };
                    let len = u32::from_be_bytes(*prefix) as usize;
                    if len == 0 || len > MAX_MESSAGE_LEN {
                        return Err(BadLength);
                    }
                    let want = 4 + len;
                    let room = want.min(RESERVE_BYTES) + FRAME_SLACK;
                    if self.body.len() < want && self.body.capacity() < room {
                        self.body.reserve(room - self.body.len());
                    }
                    self.want = Some(want);
                    want
                }
            };
            if self.body.len() < want {
                break;
            }
            let mut message = if self.body.len() == want {
                std::mem::take(&mut self.body)
            } else {
                self.body.split_to(want)
            };
            message.advance(4);
            out.push(message.freeze());
            self.want = None;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_100_kb_message_goes_as_two_records_and_comes_back() {
        let msg = vec![b'x'; 100_000];
        let records = split(&msg).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].len(), RECORD_PLAINTEXT_LEN);
        assert_eq!(records[1].len(), 100_004 - RECORD_PLAINTEXT_LEN);
        let mut r = Reassembler::default();
        assert!(r.push(records[0][..].into()).unwrap().is_empty());
        assert_eq!(r.push(records[1][..].into()).unwrap(), vec![msg]);
    }

    #[test]
    fn several_messages_in_one_record_and_bad_lengths() {
        let mut rec = split(b"one").unwrap().remove(0);
        rec.extend(split(b"two").unwrap().remove(0));
        rec.extend_from_slice(&[0, 0]);
        let mut r = Reassembler::default();
        assert_eq!(
            r.push(rec[..].into()).unwrap(),
            vec![&b"one"[..], &b"two"[..]]
        );
        assert_eq!(r.push(b"\0\x03ab"[..].into()).unwrap(), Vec::<Bytes>::new());
        assert_eq!(r.push(b"c"[..].into()).unwrap(), vec![&b"abc"[..]]);
        assert_eq!(
            Reassembler::default().push(b"\0\0\0\0"[..].into()),
            Err(BadLength)
        );
        assert_eq!(
            Reassembler::default().push(b"\xff\0\0\0"[..].into()),
            Err(BadLength)
        );
        assert_eq!(split(b""), Err(BadLength));
    }
}
