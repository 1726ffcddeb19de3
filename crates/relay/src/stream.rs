//! One established stream's two directions: messages become encrypted, numbered
//! data frames ([`SendHalf`]), and numbered frames become messages again
//! ([`RecvHalf`]), whatever order the relay delivers them in (within the window).

use crate::frame::Frame;
use crate::noise::{NoiseError, Opener, Sealer, Transport};
use crate::ordered::{Ordered, OutOfWindow, SendSeq};
use crate::records::{self, BadLength, Reassembler};

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
}

/// Receives messages on one stream.
pub struct RecvHalf {
    opener: Opener,
    ordered: Ordered,
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
        },
        RecvHalf {
            opener,
            ordered: Ordered::default(),
            reassembler: Reassembler::default(),
        },
    )
}

impl SendHalf {
    /// The encoded data frames carrying `message` (one per record).
    pub fn seal(&mut self, message: &[u8]) -> Result<Vec<Vec<u8>>, StreamError> {
        let mut out = Vec::new();
        for record in records::split(message)? {
            let c = self.sealer.encrypt(&record)?;
            out.push(Frame::data(&self.stream_id, self.seq.take()?, c).encode());
        }
        Ok(out)
    }
}

impl RecvHalf {
    /// Accepts the data frame at `seq`; returns the messages now complete.
    pub fn open(&mut self, seq: u32, payload: Vec<u8>) -> Result<Vec<Vec<u8>>, StreamError> {
        let mut out = Vec::new();
        for c in self.ordered.push(seq, payload)? {
            let record = self.opener.decrypt(&c)?;
            out.extend(self.reassembler.push(&record)?);
        }
        Ok(out)
    }
}

/// A stream's messages as channels, what the program on each end uses: read
/// `inbound` until `None` (the stream ended), send on `outbound` (fails once
/// the stream is gone). Dropping both ends the stream.
pub struct Channel {
    /// Messages from the peer.
    pub inbound: tokio::sync::mpsc::Receiver<Vec<u8>>,
    /// Messages to the peer.
    pub outbound: tokio::sync::mpsc::Sender<Vec<u8>>,
    /// Description, e.g. `relay stream 1b4e…`.
    pub peer: String,
}
