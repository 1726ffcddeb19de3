//! The pump's read buffers. Output read from a child is kept by the log and sent
//! in a binary frame from one allocation: the buffer leaves room in front of
//! the bytes for the frame's header, so neither the log nor the frame copies
//! them.

use exec_server_protocol::binary;

/// Reads shorter than this fraction of the buffer are copied out and the
/// buffer reused: a log of many small chunks then never pins large buffers.
const KEEP_FRACTION: usize = 2;

/// A buffer a child's output is read into ([`ReadBuf::read_from`]), then
/// handed out ([`ReadBuf::take`]). Reads land in unused capacity: a fresh
/// buffer is never zeroed (zeroing showed in a stream's server profile).
pub struct ReadBuf {
    /// Room for a frame header, then the bytes read so far (the payload);
    /// capacity for `size` of them.
    buf: Filled,
    size: usize,
}

/// Bytes read from a child, with room in front for a binary frame's header.
pub type Filled = binary::FrameBuf;

impl ReadBuf {
    /// A buffer reading `size` bytes at most, with `headroom` bytes in front
    /// (at least a binary frame's header and head).
    pub fn new(headroom: usize, size: usize) -> Self {
        ReadBuf {
            buf: Filled::with_room(headroom, size),
            size,
        }
    }

    /// One non-blocking read from `fd` after the first `at` bytes read
    /// (fewer if fewer are there), of at most what the buffer has room for.
    /// Returns the bytes read (0 at the end of the output, or when full).
    ///
    /// # Errors
    /// The read's error; `WouldBlock` when nothing is there yet.
    pub fn read_from(&mut self, fd: impl std::os::fd::AsFd, at: usize) -> std::io::Result<usize> {
        let at = at.min(self.buf.payload().len());
        let headroom = self.buf.headroom();
        let vec = self.buf.as_mut_vec();
        vec.truncate(headroom + at);
        exec_server_sysio::read_at::append_once(fd, vec, self.size - at)
    }

    /// The first `n` bytes read (fewer if fewer are there).
    pub fn filled(&self, n: usize) -> &[u8] {
        let payload = self.buf.payload();
        &payload[..n.min(payload.len())]
    }

    /// How many bytes a read may return.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Grows the readable part to `size` bytes (never shrinks).
    pub fn grow(&mut self, size: usize) {
        if size > self.size {
            self.size = size;
            let headroom = self.buf.headroom();
            let vec = self.buf.as_mut_vec();
            vec.reserve_exact(headroom + size - vec.len());
        }
    }

    /// Hands out the first `n` bytes read (fewer if fewer are there) and
    /// empties the buffer. A large read takes the buffer's allocation (a
    /// new one is made for the next read); a small one is copied.
    pub fn take(&mut self, n: usize) -> Filled {
        let n = n.min(self.buf.payload().len());
        let headroom = self.buf.headroom();
        if n * KEEP_FRACTION < self.size {
            // Without room in front: a log of small chunks stays their size
            // (a frame then copies them once, cheaply).
            let filled = Filled::copy_of(&self.buf.payload()[..n], 0);
            self.buf.as_mut_vec().truncate(headroom);
            return filled;
        }
        let mut out = std::mem::replace(&mut self.buf, Filled::with_room(headroom, self.size));
        out.as_mut_vec().truncate(headroom + n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_the_encoded_frame_and_shares_the_bytes() {
        let mut buf = ReadBuf::new(64, 1024);
        fill(&mut buf, &[7; 1000]);
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
        assert_eq!(fill(&mut buf, &[1; 2000]), 1024);
        assert_eq!(buf.filled(5000), &[1; 1024][..]);
    }

    #[test]
    fn small_reads_are_copied_and_long_heads_still_encode() {
        let mut buf = ReadBuf::new(8, 1024);
        fill(&mut buf, b"abc");
        let mut filled = buf.take(3);
        assert_eq!(filled.payload(), b"abc");
        assert_eq!(filled.headroom(), 0, "a small chunk carries no room");
        assert_eq!(filled.as_mut_vec().capacity(), 3, "nor spare capacity");
        let head = "{\"long\":\"head beyond the room\"}";
        let (frame, payload) = filled.into_frame(binary::Kind::ParamsChunk, head);
        assert_eq!(
            &frame[..],
            &binary::encode(binary::Kind::ParamsChunk, head, b"abc")[..]
        );
        assert_eq!(&payload[..], b"abc");
        assert_eq!(buf.filled(10), b"", "taking empties the buffer");
        buf.grow(4096);
        assert_eq!(fill(&mut buf, &[2; 5000]), 4096);
        assert_eq!(
            buf.take(5000).payload().len(),
            4096,
            "never past what was read"
        );
    }

    #[test]
    fn a_read_at_an_offset_keeps_what_came_before_and_replaces_what_came_after() {
        let mut buf = ReadBuf::new(4, 16);
        fill(&mut buf, b"abcdef");
        let (r, mut w) = std::io::pipe().unwrap();
        std::io::Write::write_all(&mut w, b"XY").unwrap();
        assert_eq!(buf.read_from(&r, 3).unwrap(), 2);
        assert_eq!(buf.filled(100), b"abcXY");
        // An offset past what was read reads on from the end.
        std::io::Write::write_all(&mut w, b"Z").unwrap();
        assert_eq!(buf.read_from(&r, 99).unwrap(), 1);
        assert_eq!(buf.filled(100), b"abcXYZ");
    }

    /// Reads `data` into `buf` through a pipe, as from a child; returns the
    /// bytes read.
    fn fill(buf: &mut ReadBuf, data: &[u8]) -> usize {
        let (r, mut w) = std::io::pipe().unwrap();
        std::io::Write::write_all(&mut w, data).unwrap();
        drop(w);
        let at = buf.filled(usize::MAX).len();
        buf.read_from(&r, at).unwrap()
    }
}
