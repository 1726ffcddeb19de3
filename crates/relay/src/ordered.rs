//! Receive-side ordering of a stream's data frames by `seq` before decryption
//! (Noise nonces are implicit, so records must be opened in order).

use std::collections::BTreeMap;

/// Furthest ahead of the expected seq a frame may be buffered: 64.
pub const MAX_REORDER_DISTANCE: u32 = 64;
/// Most frames buffered: 64.
pub const MAX_PENDING_FRAMES: usize = 64;
/// Most payload bytes buffered: 1 MiB.
pub const MAX_PENDING_BYTES: usize = 1024 * 1024;

/// A frame too far ahead, too many buffered, or the seq space exhausted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("relay stream frames out of order beyond the reorder window")]
pub struct OutOfWindow;

/// Orders one direction of one stream's payloads (`T`: any byte buffer).
pub struct Ordered<T> {
    expected: u32,
    pending: BTreeMap<u32, T>,
    pending_bytes: usize,
}

impl<T> Default for Ordered<T> {
    fn default() -> Self {
        Ordered {
            expected: 0,
            pending: BTreeMap::new(),
            pending_bytes: 0,
        }
    }
}

impl<T> Ordered<T> {
    /// Whether `seq` is the frame expected next with none buffered behind
    /// it: the caller may then open it at once and call [`Ordered::advance`]
    /// instead of [`Ordered::push`].
    pub fn is_next(&self, seq: u32) -> bool {
        seq == self.expected && self.pending.is_empty()
    }

    /// Counts the frame [`Ordered::is_next`] allowed as delivered. Errors:
    /// [`OutOfWindow`] once the seq space is exhausted.
    pub fn advance(&mut self) -> Result<(), OutOfWindow> {
        self.expected = self.expected.checked_add(1).ok_or(OutOfWindow)?;
        Ok(())
    }
}

impl<T: AsRef<[u8]>> Ordered<T> {
    /// Accepts the frame at `seq` and returns the payloads now in order (empty
    /// for a duplicate or a buffered frame). Errors: [`OutOfWindow`].
    pub fn push(&mut self, seq: u32, payload: T) -> Result<Vec<T>, OutOfWindow> {
        if seq < self.expected || self.pending.contains_key(&seq) {
            return Ok(Vec::new()); // duplicate
        }
        if seq > self.expected {
            if seq - self.expected > MAX_REORDER_DISTANCE
                || self.pending.len() >= MAX_PENDING_FRAMES
                || self.pending_bytes + payload.as_ref().len() > MAX_PENDING_BYTES
            {
                return Err(OutOfWindow);
            }
            self.pending_bytes += payload.as_ref().len();
            self.pending.insert(seq, payload);
            return Ok(Vec::new());
        }
        let mut out = vec![payload];
        self.expected = self.expected.checked_add(1).ok_or(OutOfWindow)?;
        while let Some(p) = self.pending.remove(&self.expected) {
            self.pending_bytes -= p.as_ref().len();
            out.push(p);
            self.expected = self.expected.checked_add(1).ok_or(OutOfWindow)?;
        }
        Ok(out)
    }
}

/// Numbers the frames one direction of a stream sends: 0, 1, 2…, never wrapping.
#[derive(Default)]
pub struct SendSeq(u32);

impl SendSeq {
    /// The next seq, or [`OutOfWindow`] once 2^32 frames were sent.
    pub fn take(&mut self) -> Result<u32, OutOfWindow> {
        let s = self.0;
        self.0 = s.checked_add(1).ok_or(OutOfWindow)?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reorders_drops_duplicates_and_bounds_the_window() {
        let mut o = Ordered::<Vec<u8>>::default();
        assert!(o.push(1, vec![1]).unwrap().is_empty());
        assert!(o.push(1, vec![1]).unwrap().is_empty());
        assert_eq!(o.push(0, vec![0]).unwrap(), vec![vec![0], vec![1]]);
        assert!(o.push(0, vec![0]).unwrap().is_empty());
        assert_eq!(
            o.push(2 + MAX_REORDER_DISTANCE + 1, vec![9]),
            Err(OutOfWindow)
        );
        assert!(o
            .push(2 + MAX_REORDER_DISTANCE, vec![9])
            .unwrap()
            .is_empty());
        assert_eq!(o.push(3, vec![0; MAX_PENDING_BYTES]), Err(OutOfWindow));
    }

    #[test]
    fn only_the_expected_frame_with_none_behind_it_is_next() {
        let mut o = Ordered::<Vec<u8>>::default();
        assert!(o.is_next(0) && !o.is_next(1));
        o.advance().unwrap();
        assert!(o.is_next(1) && !o.is_next(0));
        assert!(o.push(2, vec![2]).unwrap().is_empty());
        assert!(!o.is_next(1), "a frame waits behind 1");
        assert_eq!(o.push(1, vec![1]).unwrap(), vec![vec![1], vec![2]]);
        assert!(o.is_next(3));
    }
}
