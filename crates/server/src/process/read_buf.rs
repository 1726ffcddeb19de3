//! The pump's read buffers. Output read from a child is kept by the log and sent
//! in a binary frame from one allocation: the buffer leaves room in front of
//! the bytes for the frame's header, so neither the log nor the frame copies
//! them.

use bytes::Bytes;
use exec_server_protocol::binary;

/// Reads shorter than this fraction of the buffer are copied out and the
/// buffer reused: a log of many small chunks then never pins large buffers.
const KEEP_FRACTION: usize = 2;

/// A buffer a child's output is read into ([`ReadBuf::spare`]), then handed
/// out ([`ReadBuf::take`]).
pub struct ReadBuf {
    /// `headroom` bytes of room for a frame header, then `size` to read into.
    vec: Vec<u8>,
    headroom: usize,
    size: usize,
}

/// Bytes read from a child, with room in front for a binary frame's header.
pub struct Filled {
    vec: Vec<u8>,
    headroom: usize,
}

impl ReadBuf {
    /// A buffer reading `size` bytes at most, with `headroom` bytes in front
    /// (at least a binary frame's header and head).
    pub fn new(headroom: usize, size: usize) -> Self {
        ReadBuf {
            vec: vec![0; headroom + size],
            headroom,
            size,
        }
    }

    /// Where the next read goes.
    pub fn spare(&mut self) -> &mut [u8] {
        &mut self.vec[self.headroom..]
    }

    /// How many bytes a read may return.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Grows the readable part to `size` bytes (never shrinks).
    pub fn grow(&mut self, size: usize) {
        if size > self.size {
            self.size = size;
            self.vec.resize(self.headroom + size, 0);
        }
    }

    /// Hands out the `n` bytes just read into [`Self::spare`]. A large read
    /// takes the buffer's allocation (a new one is made for the next read); a
    /// small one is copied.
    pub fn take(&mut self, n: usize) -> Filled {
        let n = n.min(self.size);
        if n * KEEP_FRACTION < self.size {
            // Without room in front: a log of small chunks stays their size
            // (a frame then copies them once, cheaply).
            return Filled::copy_of(&self.vec[self.headroom..self.headroom + n], 0);
        }
        let mut vec = std::mem::replace(&mut self.vec, vec![0; self.headroom + self.size]);
        vec.truncate(self.headroom + n);
        Filled {
            vec,
            headroom: self.headroom,
        }
    }
}

impl Filled {
    /// A copy of `data` with `headroom` bytes of room in front.
    pub fn copy_of(data: &[u8], headroom: usize) -> Self {
        let mut vec = Vec::with_capacity(headroom + data.len());
        vec.resize(headroom, 0);
        vec.extend_from_slice(data);
        Filled { vec, headroom }
    }

    /// The bytes read.
    pub fn payload(&self) -> &[u8] {
        &self.vec[self.headroom..]
    }

    /// The bytes read, for the log.
    pub fn into_payload(self) -> Bytes {
        let headroom = self.headroom;
        Bytes::from(self.vec).slice(headroom..)
    }

    /// A binary frame of `kind` with `head` (JSON text) in front of the bytes,
    /// and the bytes alone; both share one allocation. A head longer than the
    /// room in front costs one copy of the bytes.
    pub fn into_frame(mut self, kind: binary::Kind, head: &str) -> (Bytes, Bytes) {
        match binary::encode_in_headroom(kind, head, &mut self.vec, self.headroom) {
            Some(start) => {
                let all = Bytes::from(self.vec);
                (all.slice(start..), all.slice(self.headroom..))
            }
            None => {
                let payload = self.into_payload();
                let frame = Bytes::from(binary::encode(kind, head, &payload));
                (frame, payload)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_the_encoded_frame_and_shares_the_bytes() {
        let mut buf = ReadBuf::new(64, 1024);
        buf.spare()[..1000].fill(7);
        let filled = buf.take(1000);
        let ptr = filled.payload().as_ptr();
        let (frame, payload) = filled.into_frame(binary::Kind::ParamsChunk, "{\"a\":1}");
        assert_eq!(
            &frame[..],
            &binary::encode(binary::Kind::ParamsChunk, "{\"a\":1}", &[7; 1000])[..]
        );
        assert_eq!(&payload[..], &[7u8; 1000][..]);
        assert_eq!(payload.as_ptr(), ptr, "the payload was copied");
        // The buffer got a new allocation of the same size.
        assert_eq!(buf.spare().len(), 1024);
    }

    #[test]
    fn small_reads_are_copied_and_long_heads_still_encode() {
        let mut buf = ReadBuf::new(8, 1024);
        buf.spare()[..3].copy_from_slice(b"abc");
        let filled = buf.take(3);
        assert_eq!(filled.payload(), b"abc");
        assert_eq!(filled.vec.capacity(), 3, "a small chunk carries no room");
        let head = "{\"long\":\"head beyond the room\"}";
        let (frame, payload) = filled.into_frame(binary::Kind::ParamsChunk, head);
        assert_eq!(
            &frame[..],
            &binary::encode(binary::Kind::ParamsChunk, head, b"abc")[..]
        );
        assert_eq!(&payload[..], b"abc");
        buf.grow(4096);
        assert_eq!(buf.spare().len(), 4096);
        assert_eq!(
            buf.take(5000).payload().len(),
            4096,
            "never past the buffer"
        );
    }
}
