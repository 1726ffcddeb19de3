//! RFC 6455 frame headers: parsing what arrives, building what leaves, and
//! the masking a client applies to every frame it sends.
//!
//! The handshake stays with tungstenite; after it, frames are ours so that a
//! payload is read straight into the message's buffer and written straight
//! from the sender's (vectored writes, no staging copy).

/// Largest frame header: 2 bytes, 8 of extended length, 4 of mask key.
pub const MAX_HEADER_BYTES: usize = 14;

/// Largest payload of a control frame (RFC 6455 §5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// A frame's opcode (RFC 6455 §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpCode {
    /// `0x0`: the next part of a fragmented message.
    Continue,
    /// `0x1`: the first frame of a text message.
    Text,
    /// `0x2`: the first frame of a binary message.
    Binary,
    /// `0x8`: the closing handshake.
    Close,
    /// `0x9`: a ping, answered by a pong with the same payload.
    Ping,
    /// `0xA`: a pong.
    Pong,
}

impl OpCode {
    fn from_bits(bits: u8) -> Option<OpCode> {
        Some(match bits {
            0x0 => OpCode::Continue,
            0x1 => OpCode::Text,
            0x2 => OpCode::Binary,
            0x8 => OpCode::Close,
            0x9 => OpCode::Ping,
            0xA => OpCode::Pong,
            _ => return None,
        })
    }
    fn bits(self) -> u8 {
        match self {
            OpCode::Continue => 0x0,
            OpCode::Text => 0x1,
            OpCode::Binary => 0x2,
            OpCode::Close => 0x8,
            OpCode::Ping => 0x9,
            OpCode::Pong => 0xA,
        }
    }
    /// Close, ping and pong: never fragmented, at most 125 bytes.
    pub fn is_control(self) -> bool {
        matches!(self, OpCode::Close | OpCode::Ping | OpCode::Pong)
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The last frame of its message.
    pub fin: bool,
    /// What the frame is.
    pub opcode: OpCode,
    /// The client's masking key; `None` for an unmasked (server) frame.
    pub mask: Option<[u8; 4]>,
    /// Payload length in bytes.
    pub len: u64,
    /// Bytes the header itself took.
    pub header_len: usize,
}

/// A header that breaks RFC 6455; the text names the fault (sent as the
/// reason of a 1002 close).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolViolation(pub &'static str);

/// Parses the header at the start of `buf`: `Ok(None)` when more bytes are
/// needed.
///
/// # Errors
/// Reserved bits set (no extension is ever negotiated), an unknown opcode, a
/// fragmented or over-long control frame, or a non-minimal length encoding's
/// top bit set.
pub fn parse_header(buf: &[u8]) -> Result<Option<Header>, ProtocolViolation> {
    let [b0, b1, ..] = *buf else { return Ok(None) };
    if b0 & 0x70 != 0 {
        return Err(ProtocolViolation("reserved bits set"));
    }
    let fin = b0 & 0x80 != 0;
    let opcode = OpCode::from_bits(b0 & 0x0F).ok_or(ProtocolViolation("unknown opcode"))?;
    let masked = b1 & 0x80 != 0;
    let (len, mut at) = match b1 & 0x7F {
        126 => match buf.get(2..4) {
            Some(b) => {
                let len = u64::from(u16::from_be_bytes([b[0], b[1]]));
                if len < 126 {
                    return Err(ProtocolViolation("payload length not minimally encoded"));
                }
                (len, 4)
            }
            None => return Ok(None),
        },
        127 => match buf.get(2..10) {
            Some(b) => {
                let mut n = [0u8; 8];
                n.copy_from_slice(b);
                let len = u64::from_be_bytes(n);
                if len >> 63 != 0 {
                    return Err(ProtocolViolation("payload length's top bit set"));
                }
                if len <= u64::from(u16::MAX) {
                    return Err(ProtocolViolation("payload length not minimally encoded"));
                }
                (len, 10)
            }
            None => return Ok(None),
        },
        n => (u64::from(n), 2),
    };
    if opcode.is_control() && (!fin || len > MAX_CONTROL_PAYLOAD as u64) {
        return Err(ProtocolViolation(
            "control frame fragmented or over 125 bytes",
        ));
    }
    let mask = if masked {
        let Some(k) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        at += 4;
        Some([k[0], k[1], k[2], k[3]])
    } else {
        None
    };
    Ok(Some(Header {
        fin,
        opcode,
        mask,
        len,
        header_len: at,
    }))
}

/// A frame header ready to be written (at most [`MAX_HEADER_BYTES`]).
#[derive(Debug, Clone, Copy)]
pub struct HeaderBytes {
    bytes: [u8; MAX_HEADER_BYTES],
    len: u8,
}

impl HeaderBytes {
    /// The header's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// Builds the header of a frame whose payload is `len` bytes, with the
/// shortest length encoding; `mask` is the client's key (the payload must be
/// masked with it separately, see [`super::mask::apply_mask`]).
pub fn header(fin: bool, opcode: OpCode, len: usize, mask: Option<[u8; 4]>) -> HeaderBytes {
    let mut bytes = [0u8; MAX_HEADER_BYTES];
    bytes[0] = if fin { 0x80 } else { 0 } | opcode.bits();
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    let mut at = if len < 126 {
        bytes[1] = mask_bit | len as u8;
        2
    } else if len <= usize::from(u16::MAX) {
        bytes[1] = mask_bit | 126;
        bytes[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        4
    } else {
        bytes[1] = mask_bit | 127;
        bytes[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    };
    if let Some(key) = mask {
        bytes[at..at + 4].copy_from_slice(&key);
        at += 4;
    }
    HeaderBytes {
        bytes,
        len: at as u8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_at_every_length_encoding() {
        for len in [0usize, 1, 125, 126, 65_535, 65_536, 5 << 30] {
            for mask in [None, Some([1, 2, 3, 4])] {
                for (fin, op) in [(true, OpCode::Text), (false, OpCode::Continue)] {
                    let h = header(fin, op, len, mask);
                    let parsed = parse_header(h.as_slice()).unwrap().unwrap();
                    assert_eq!(
                        parsed,
                        Header {
                            fin,
                            opcode: op,
                            mask,
                            len: len as u64,
                            header_len: h.as_slice().len()
                        }
                    );
                    // One byte short is "need more", never a wrong header.
                    let short = &h.as_slice()[..h.as_slice().len() - 1];
                    assert_eq!(parse_header(short), Ok(None));
                }
            }
        }
        // The shortest encoding is used.
        assert_eq!(header(true, OpCode::Binary, 125, None).as_slice().len(), 2);
        assert_eq!(header(true, OpCode::Binary, 126, None).as_slice().len(), 4);
        assert_eq!(
            header(true, OpCode::Binary, 65_536, None).as_slice().len(),
            10
        );
    }

    #[test]
    fn bad_headers_are_violations() {
        // RSV1 set.
        assert!(parse_header(&[0xC1, 0x00]).is_err());
        // Opcode 0x3 is reserved.
        assert!(parse_header(&[0x83, 0x00]).is_err());
        // A fragmented ping, and a 126-byte close.
        assert!(parse_header(&[0x09, 0x00]).is_err());
        assert!(parse_header(&[0x88, 126, 0, 126]).is_err());
        // A 64-bit length with its top bit set.
        assert!(parse_header(&[0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 0]).is_err());
        // Lengths not in their shortest form (RFC 6455 §5.2).
        assert!(parse_header(&[0x82, 126, 0, 125]).is_err());
        assert!(parse_header(&[0x82, 127, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF]).is_err());
    }
}
