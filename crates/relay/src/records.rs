//! How one stream's messages travel as Noise records: each message gets a
//! 4-byte big-endian length prefix, and the bytes are cut into plaintext records
//! of at most [`RECORD_PLAINTEXT_LEN`]; a message always starts a new record.
//! The receiver appends decrypted records and takes out every whole message.

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

/// Reassembles messages from decrypted records, wherever the records cut
/// them. Holds at most one partial message (≤ 64 MiB), each byte copied once
/// into the message it belongs to.
#[derive(Default)]
pub struct Reassembler {
    prefix: [u8; 4],
    prefix_len: usize,
    body: Vec<u8>,
    /// Bytes of `body` still missing, once the prefix is whole.
    need: usize,
}

impl Reassembler {
    /// Appends one record and returns every message now complete. Errors:
    /// [`BadLength`]; the stream must then be torn down.
    pub fn push(&mut self, mut record: &[u8]) -> Result<Vec<Vec<u8>>, BadLength> {
        let mut out = Vec::new();
        while !record.is_empty() {
            if self.prefix_len < 4 {
                let k = (4 - self.prefix_len).min(record.len());
                self.prefix[self.prefix_len..self.prefix_len + k].copy_from_slice(&record[..k]);
                self.prefix_len += k;
                record = &record[k..];
                if self.prefix_len < 4 {
                    break;
                }
                let len = u32::from_be_bytes(self.prefix) as usize;
                if len == 0 || len > MAX_MESSAGE_LEN {
                    return Err(BadLength);
                }
                self.body = Vec::with_capacity(len.min(RESERVE_BYTES));
                self.need = len;
                continue;
            }
            let k = self.need.min(record.len());
            self.body.extend_from_slice(&record[..k]);
            record = &record[k..];
            self.need -= k;
            if self.need == 0 {
                out.push(std::mem::take(&mut self.body));
                self.prefix_len = 0;
            }
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
        assert!(r.push(&records[0]).unwrap().is_empty());
        assert_eq!(r.push(&records[1]).unwrap(), vec![msg]);
    }

    #[test]
    fn several_messages_in_one_record_and_bad_lengths() {
        let mut rec = split(b"one").unwrap().remove(0);
        rec.extend(split(b"two").unwrap().remove(0));
        rec.extend_from_slice(&[0, 0]);
        let mut r = Reassembler::default();
        assert_eq!(
            r.push(&rec).unwrap(),
            vec![b"one".to_vec(), b"two".to_vec()]
        );
        assert_eq!(r.push(&[0, 3, b'a', b'b']).unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(r.push(b"c").unwrap(), vec![b"abc".to_vec()]);
        assert_eq!(Reassembler::default().push(&[0, 0, 0, 0]), Err(BadLength));
        assert_eq!(
            Reassembler::default().push(&[0xff, 0, 0, 0]),
            Err(BadLength)
        );
        assert_eq!(split(b""), Err(BadLength));
    }
}
