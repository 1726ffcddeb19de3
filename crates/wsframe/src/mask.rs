//! Masking (RFC 6455 §5.3): every byte a client sends is XORed with its
//! frame's key, and every byte a server receives XORed back. Every byte of
//! a transfer passes here, so it runs 64 bytes at a time in AVX-512
//! registers where the CPU has them (32 with AVX2), and a copy that must
//! also mask does both in one pass.

/// The key as seen from payload offset `phase`: byte i is `key[(phase + i) % 4]`.
fn rotated(key: [u8; 4], phase: usize) -> [u8; 4] {
    let mut k = [0u8; 4];
    for (i, b) in k.iter_mut().enumerate() {
        *b = key[(phase + i) % 4];
    }
    k
}

/// XORs `data` with `key`, `data[0]` taking key byte `phase % 4` (masking
/// and unmasking are the same operation).
pub fn apply_mask(data: &mut [u8], key: [u8; 4], phase: usize) {
    let k = rotated(key, phase);
    #[cfg(target_arch = "x86_64")]
    if wide() {
        let p = data.as_mut_ptr();
        // SAFETY: the CPU has the features (checked); `p` is valid for
        // `data.len()` bytes, read and written in place.
        unsafe { xor_avx512(p, p, data.len(), k) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { mask_avx2(data, k) };
        return;
    }
    mask_words(data, k);
}

/// Appends `src` XORed with `key` (`src[0]` taking key byte `phase % 4`)
/// to `out`: the copy and the mask in one pass.
pub fn append_masked(out: &mut bytes::BytesMut, src: &[u8], key: [u8; 4], phase: usize) {
    #[cfg(target_arch = "x86_64")]
    if wide() {
        out.reserve(src.len());
        let at = out.len();
        // SAFETY: the CPU has the features (checked); the reserve made room
        // for `src.len()` bytes past `out`'s end, which the kernel writes
        // before the length covers them; `src` is another buffer.
        unsafe {
            xor_avx512(
                src.as_ptr(),
                out.as_mut_ptr().add(at),
                src.len(),
                rotated(key, phase),
            );
            out.set_len(at + src.len());
        }
        return;
    }
    let at = out.len();
    out.extend_from_slice(src);
    apply_mask(&mut out[at..], key, phase);
}

/// Whether the AVX-512 kernel runs here (checked once, then cached by std).
#[cfg(target_arch = "x86_64")]
fn wide() -> bool {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
}

/// Writes `len` bytes from `src` XORed with the repeated `k` to `dst`: 64
/// bytes a step, then one masked step for the rest.
///
/// # Safety
/// AVX-512 F and BW; `src` readable and `dst` writable for `len` bytes;
/// they are the same buffer or do not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn xor_avx512(src: *const u8, dst: *mut u8, len: usize, k: [u8; 4]) {
    use std::arch::x86_64::*;
    let key = _mm512_set1_epi32(i32::from_ne_bytes(k));
    let mut i = 0;
    while i + 64 <= len {
        // SAFETY: within `len` of both pointers.
        unsafe {
            let v = _mm512_loadu_si512(src.add(i).cast());
            _mm512_storeu_si512(dst.add(i).cast(), _mm512_xor_si512(v, key));
        }
        i += 64;
    }
    if i < len {
        let m: u64 = (1 << (len - i)) - 1;
        // SAFETY: the byte mask covers only the `len - i` bytes left.
        unsafe {
            let v = _mm512_maskz_loadu_epi8(m, src.add(i).cast());
            _mm512_mask_storeu_epi8(dst.add(i).cast(), m, _mm512_xor_si512(v, key));
        }
    }
}

/// [`mask_words`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn mask_avx2(data: &mut [u8], k: [u8; 4]) {
    mask_words(data, k);
}

/// The XOR itself, written so the compiler vectorises it: four 8-byte words
/// per step, then words, then bytes.
#[inline(always)]
fn mask_words(data: &mut [u8], k: [u8; 4]) {
    let word = u64::from_ne_bytes([k[0], k[1], k[2], k[3], k[0], k[1], k[2], k[3]]);
    let xor8 = |c: &mut [u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        c.copy_from_slice(&(u64::from_ne_bytes(w) ^ word).to_ne_bytes());
    };
    let mut blocks = data.chunks_exact_mut(32);
    for block in &mut blocks {
        for c in block.chunks_exact_mut(8) {
            xor8(c);
        }
    }
    let mut words = blocks.into_remainder().chunks_exact_mut(8);
    for c in &mut words {
        xor8(c);
    }
    for (i, b) in words.into_remainder().iter_mut().enumerate() {
        *b ^= k[i % 4];
    }
}

/// Masking keys for a client's frames: unpredictable (RFC 6455 §5.3), drawn
/// from the operating system's generator a batch at a time.
#[derive(Debug)]
pub struct MaskKeys {
    pool: [u8; 256],
    used: usize,
}

impl Default for MaskKeys {
    fn default() -> Self {
        MaskKeys {
            pool: [0; 256],
            // Empty: the first key draws a batch.
            used: 256,
        }
    }
}

impl MaskKeys {
    /// A fresh key.
    pub fn next_key(&mut self) -> [u8; 4] {
        if self.used + 4 > self.pool.len() {
            if getrandom::fill(&mut self.pool).is_err() {
                // No entropy source: a key from the clock and a counter still
                // varies per frame (masking guards intermediaries, not secrets).
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos())
                    .unwrap_or(0);
                for (i, c) in self.pool.chunks_exact_mut(4).enumerate() {
                    c.copy_from_slice(&(t ^ (i as u32).wrapping_mul(0x9E37_79B9)).to_ne_bytes());
                }
            }
            self.used = 0;
        }
        let k = &self.pool[self.used..self.used + 4];
        self.used += 4;
        [k[0], k[1], k[2], k[3]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_twice_restores_and_phase_continues_across_pieces() {
        let key = [0xA1, 0xB2, 0xC3, 0xD4];
        let original: Vec<u8> = (0..1003u32).map(|i| (i * 7) as u8).collect();
        let mut whole = original.clone();
        apply_mask(&mut whole, key, 0);
        // Byte by byte, as RFC 6455 defines it.
        for (i, (m, o)) in whole.iter().zip(&original).enumerate() {
            assert_eq!(*m, o ^ key[i % 4]);
        }
        // Masked in two pieces split at an odd offset: the same bytes.
        let mut split = original.clone();
        let (a, b) = split.split_at_mut(13);
        apply_mask(a, key, 0);
        apply_mask(b, key, 13);
        assert_eq!(split, whole);
        apply_mask(&mut whole, key, 0);
        assert_eq!(whole, original);
        // Every length around the block and word sizes, both code paths.
        for len in 0..80 {
            for phase in 0..4 {
                let want: Vec<u8> = original[..len]
                    .iter()
                    .enumerate()
                    .map(|(i, o)| o ^ key[(phase + i) % 4])
                    .collect();
                let mut got = original[..len].to_vec();
                apply_mask(&mut got, key, phase);
                assert_eq!(got, want, "len {len} phase {phase}");
                let mut k = [0u8; 4];
                for (i, b) in k.iter_mut().enumerate() {
                    *b = key[(phase + i) % 4];
                }
                let mut scalar = original[..len].to_vec();
                mask_words(&mut scalar, k);
                assert_eq!(scalar, want, "portable path, len {len} phase {phase}");
            }
        }
    }

    #[test]
    fn mask_keys_vary() {
        let mut keys = MaskKeys::default();
        let all: std::collections::HashSet<[u8; 4]> = (0..200).map(|_| keys.next_key()).collect();
        assert!(all.len() > 190, "keys repeat: {}", all.len());
    }

    #[test]
    fn a_masked_copy_is_the_copy_masked() {
        let key = [0x11, 0x22, 0x33, 0x44];
        let src: Vec<u8> = (0..300u32).map(|i| (i * 13) as u8).collect();
        for len in [0, 1, 3, 63, 64, 65, 127, 128, 200, 300] {
            for phase in 0..4 {
                let mut want = src[..len].to_vec();
                apply_mask(&mut want, key, phase);
                let mut out = bytes::BytesMut::from(&b"head"[..]);
                append_masked(&mut out, &src[..len], key, phase);
                assert_eq!(&out[..4], b"head");
                assert_eq!(&out[4..], &want[..], "len {len} phase {phase}");
            }
        }
    }
}
