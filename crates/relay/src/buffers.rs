//! Frame buffers handed back by the socket writer that sent them, for an
//! executor's streams to seal their next frames into.
//!
//! Why: a streaming executor seals one ~60 KiB frame after another. A fresh
//! allocation for each must be zeroed before the record is sealed into it
//! (safe Rust has no uninitialised buffer to seal into), and when the
//! allocator has given pages back, the kernel faults them in again; both
//! showed in the executor's profile (about 5 % of its CPU). A buffer that
//! was just written out needs neither, and is still warm in the cache: the
//! pool is last in, first out for that reason, and small: it only has to
//! cover the frames of one write batch or two. (A node recycling the frames
//! it forwards the same way measured no gain: its copies cost the same.)

use bytes::{Bytes, BytesMut};
use std::sync::{Arc, Mutex};

/// Buffers a pool keeps at most: 16.
pub const POOLED_BUFFERS: usize = 16;
/// Smallest buffer capacity worth keeping: 16 KiB (a small frame is cheap
/// to allocate, and keeping one would hold a slot a large one could use).
pub const MIN_POOLED_CAPACITY: usize = 16 * 1024;
/// Largest buffer capacity kept: 128 KiB (a relay data frame is at most
/// about 60 KiB; a rare larger one is not worth holding on to). So a pool
/// holds at most 2 MiB.
pub const MAX_POOLED_CAPACITY: usize = 128 * 1024;

/// A small last-in-first-out stack of frame buffers shared by the sealers
/// of a socket's streams (which take) and its writer (which gives back). Cheap
/// to clone (shared). The contents of a buffer taken with
/// [`BufferPool::take_filled`] are whatever it held before: callers
/// overwrite all of it.
#[derive(Clone, Default)]
pub struct BufferPool(Arc<Mutex<Vec<BytesMut>>>);

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("held", &self.held())
            .finish()
    }
}

impl BufferPool {
    /// An empty pool.
    pub fn new() -> BufferPool {
        BufferPool::default()
    }

    fn pop(&self, capacity: usize) -> Option<BytesMut> {
        if !(MIN_POOLED_CAPACITY..=MAX_POOLED_CAPACITY).contains(&capacity) {
            return None;
        }
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // The most recent that fits (the warmest): not one too small, nor
        // one more than twice the size (a short frame would hold a large
        // buffer for as long as it is queued).
        let fits = |b: &BytesMut| (capacity..=capacity.saturating_mul(2)).contains(&b.capacity());
        let at = held.iter().rposition(fits)?;
        Some(held.remove(at))
    }

    /// An empty buffer with room for at least `capacity` bytes: the one
    /// given back last among those that fit, else a new one.
    pub fn take(&self, capacity: usize) -> BytesMut {
        match self.pop(capacity) {
            Some(mut b) => {
                b.clear();
                b
            }
            None => BytesMut::with_capacity(capacity),
        }
    }

    /// A buffer of exactly `len` bytes whose contents are unspecified (a
    /// recycled buffer's old bytes, or zeros): for a caller that writes
    /// every byte of it, so nothing is spent clearing it first.
    pub fn take_filled(&self, len: usize) -> BytesMut {
        match self.pop(len) {
            Some(mut b) => {
                if b.len() >= len {
                    b.truncate(len);
                } else {
                    b.resize(len, 0);
                }
                b
            }
            None => BytesMut::zeroed(len),
        }
    }

    /// Gives `frame` back once it is sent: kept if nothing else holds it,
    /// its capacity is one worth keeping and the pool has room; else
    /// dropped.
    pub fn give(&self, frame: Bytes) {
        let Ok(b) = frame.try_into_mut() else {
            return;
        };
        if !(MIN_POOLED_CAPACITY..=MAX_POOLED_CAPACITY).contains(&b.capacity()) {
            return;
        }
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if held.len() == POOLED_BUFFERS {
            // The oldest (the coldest) makes room.
            held.remove(0);
        }
        held.push(b);
    }

    /// Buffers held now.
    pub fn held(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_buffer_given_back_is_the_next_taken() {
        let pool = BufferPool::new();
        let a = BytesMut::zeroed(60 * 1024).freeze();
        let a_ptr = a.as_ptr();
        pool.give(a);
        let b = pool.take(60 * 1024);
        assert_eq!(b.as_ptr(), a_ptr);
        assert!(b.is_empty());
        assert_eq!(pool.held(), 0);
    }

    #[test]
    fn a_shared_small_or_huge_buffer_is_not_kept() {
        let pool = BufferPool::new();
        let shared = BytesMut::zeroed(60 * 1024).freeze();
        let other = shared.clone();
        pool.give(shared);
        pool.give(BytesMut::zeroed(100).freeze());
        pool.give(BytesMut::zeroed(MAX_POOLED_CAPACITY + 1).freeze());
        assert_eq!(pool.held(), 0);
        drop(other);
    }

    #[test]
    fn a_small_frame_does_not_take_a_large_buffer() {
        let pool = BufferPool::new();
        pool.give(BytesMut::zeroed(MAX_POOLED_CAPACITY).freeze());
        let small = pool.take(MIN_POOLED_CAPACITY);
        assert!(small.capacity() < MAX_POOLED_CAPACITY);
        assert_eq!(pool.held(), 1);
    }

    #[test]
    fn the_pool_holds_at_most_its_count_and_keeps_the_newest() {
        let pool = BufferPool::new();
        for _ in 0..POOLED_BUFFERS + 5 {
            pool.give(BytesMut::zeroed(MIN_POOLED_CAPACITY).freeze());
        }
        let newest = BytesMut::zeroed(MIN_POOLED_CAPACITY).freeze();
        let newest_ptr = newest.as_ptr();
        pool.give(newest);
        assert_eq!(pool.held(), POOLED_BUFFERS);
        assert_eq!(pool.take(MIN_POOLED_CAPACITY).as_ptr(), newest_ptr);
    }

    #[test]
    fn a_filled_buffer_has_exactly_its_length_and_a_too_small_one_is_left() {
        let pool = BufferPool::new();
        pool.give(BytesMut::zeroed(20 * 1024).freeze());
        // Too small for 40 KiB: a new one, and the pooled one stays.
        let big = pool.take_filled(40 * 1024);
        assert_eq!(big.len(), 40 * 1024);
        assert_eq!(pool.held(), 1);
        let small = pool.take_filled(18 * 1024);
        assert_eq!(small.len(), 18 * 1024);
        assert_eq!(pool.held(), 0);
    }

    #[test]
    fn a_full_frame_finds_its_buffer_under_a_partial_ones() {
        // A message's last record is short: its frame, written last, is on
        // top when the next full frame is sealed.
        let pool = BufferPool::new();
        let full = BytesMut::zeroed(60 * 1024).freeze();
        let full_ptr = full.as_ptr();
        pool.give(full);
        pool.give(BytesMut::zeroed(20 * 1024).freeze());
        let b = pool.take_filled(60 * 1024);
        assert_eq!(b.as_ptr(), full_ptr);
        assert_eq!(pool.held(), 1);
    }
}
