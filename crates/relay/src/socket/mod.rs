//! Relay sockets after the HTTP upgrade: a [`Reader`] and a [`Writer`] of
//! WebSocket frames (headers and masking from `exec-server-wsframe`) over
//! the two halves of the upgraded connection, and [`connect`] for clients.
//!
//! Why not tungstenite here: a relay node only moves binary messages from
//! one socket to another, and tungstenite's general-purpose path cost a
//! streaming node about a third of its CPU in work that forwarding does not
//! need: it zero-fills its read buffer before every read, copies each
//! payload out of that buffer, and copies it again into its write buffer.
//! [`Reader`] reads a large payload straight into the buffer that is handed
//! on (one copy, the kernel's), and [`Writer`] sends a frame's header and
//! its shared payload with one vectored write (no copy). The upgrade
//! handshake is hyper's on a node and one hand-written request on a client
//! ([`connect`]); every socket that is not a relay socket stays on
//! tungstenite.
//!
//! What is supported: binary, text, ping, pong and close frames; messages
//! fragmented into continuation frames (reassembled); payload lengths in all
//! three encodings. What is refused with [`WsError`]: reserved bits set (no
//! extension is ever negotiated), unknown opcodes, control frames that are
//! fragmented or longer than 125 bytes, frames masked the wrong way for the
//! role (a server requires masked frames, a client unmasked ones), and
//! messages longer than the reader's limit (checked before anything is
//! allocated for them).

mod connect;
mod read;
pub mod splice;
mod write;

pub use connect::{
    connect, connect_sending, ClientReader, ClientSocket, ClientWriter, ConnectError, Io,
    UpgradedRead,
};
pub use read::Reader;
pub use write::{gather, Outgoing, Remainder, Writer, WrittenNow};

/// Whether header values `values` (every line of one header) list `token`
/// as one of their comma-separated elements, ignoring case and spaces
/// (`Connection: keep-alive, Upgrade` lists `upgrade`).
pub(crate) fn lists_token<'a>(values: impl IntoIterator<Item = &'a [u8]>, token: &str) -> bool {
    values.into_iter().any(|v| {
        v.split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

/// Which end of the connection this is: a server reads masked frames and
/// writes unmasked ones; a client the other way round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Accepted the upgrade (a relay node).
    Server,
    /// Asked for the upgrade (an executor, a harness).
    Client,
}

/// A message read from a socket.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    /// A binary message (opcode 2), reassembled if it was fragmented.
    Binary(bytes::Bytes),
    /// A text message (opcode 1); its bytes are not checked for UTF-8 since
    /// relay sockets carry none and callers drop them.
    Text(bytes::Bytes),
    /// A ping (opcode 9) with its payload (at most 125 bytes); the caller
    /// owes a pong with the same payload.
    Ping(bytes::Bytes),
    /// A pong (opcode 10).
    Pong,
    /// A close frame (opcode 8): the peer is done. With the status code it
    /// gave, if any (RFC 6455 §7.4; see [`CloseStatus`]).
    Close(Option<u16>),
}

/// The status and reason a node puts in the close frame of a relay socket
/// it ends (RFC 6455 §7.4), so the peer can say why it was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CloseStatus {
    /// The status code: 1002, 1008 or 1009 here.
    pub code: u16,
    /// A short reason (at most 123 bytes, UTF-8).
    pub reason: &'static str,
}

impl CloseStatus {
    /// 1002: the peer broke the WebSocket protocol; `reason` says how.
    pub const fn protocol_error(reason: &'static str) -> CloseStatus {
        CloseStatus { code: 1002, reason }
    }

    /// 1008: the peer broke a rule of the relay; `reason` says which.
    pub const fn policy(reason: &'static str) -> CloseStatus {
        CloseStatus { code: 1008, reason }
    }

    /// 1009: a message longer than the node accepts.
    pub const TOO_BIG: CloseStatus = CloseStatus {
        code: 1009,
        reason: "message too long",
    };

    /// The close frame's payload: the code (big-endian), then the reason,
    /// cut to 123 bytes at a character boundary.
    pub fn payload(&self) -> bytes::Bytes {
        let mut end = self.reason.len().min(123);
        while !self.reason.is_char_boundary(end) {
            end -= 1;
        }
        let mut p = Vec::with_capacity(2 + end);
        p.extend_from_slice(&self.code.to_be_bytes());
        p.extend_from_slice(&self.reason.as_bytes()[..end]);
        p.into()
    }

    /// The status for a read that failed with `e`; `None` for a broken
    /// connection, where no close frame can help.
    pub fn for_error(e: &WsError) -> Option<CloseStatus> {
        match e {
            WsError::Io(_) => None,
            WsError::Protocol(how) => Some(CloseStatus::protocol_error(how)),
            WsError::Stalled => Some(CloseStatus::policy("message not finished in time")),
            WsError::TooLong { .. } => Some(CloseStatus::TOO_BIG),
        }
    }
}

/// What [`Reader::next_appending`] read.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A message, as [`Reader::next`] gives it.
    Message(Message),
    /// A binary message, appended to the caller's buffer from this offset
    /// to its end.
    Appended(usize),
}

/// Why a socket cannot be read any more.
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    /// The connection failed or closed in the middle of a frame.
    #[error("relay socket read failed: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke RFC 6455; the text says how.
    #[error("WebSocket protocol error from the peer: {0}")]
    Protocol(&'static str),
    /// The peer started a message and did not finish it within the
    /// reader's message timeout ([`Reader::with_message_timeout`]).
    #[error("the peer stalled in the middle of a WebSocket message")]
    Stalled,
    /// A message longer than the reader's limit (bytes).
    #[error("WebSocket message of {len} bytes exceeds the limit of {limit}")]
    TooLong {
        /// Its length as far as it was announced.
        len: u64,
        /// The reader's limit.
        limit: usize,
    },
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
