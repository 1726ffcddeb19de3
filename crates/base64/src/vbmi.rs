//! Base64 kernels for x86-64 CPUs with AVX-512 VBMI (Intel Ice Lake and
//! later, AMD Zen 4 and later): 48 bytes to 64 characters, or back, in a
//! handful of instructions.
//!
//! Decoding looks each character up in a 128-entry table with one
//! two-table byte permute (a character over 127, or one the table marks,
//! is not base64), merges four 6-bit values into three bytes with two
//! multiply-adds, and packs the 48 bytes with one byte permute. Encoding
//! spreads each 3 bytes over a 32-bit lane, cuts the four 6-bit fields
//! out with one multishift, and maps them to characters with one permute.
//!
//! Every function here requires the CPU features it enables: callers check
//! [`available`] first.

use std::arch::x86_64::*;

/// The standard alphabet (RFC 4648 §4).
pub(super) const ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Marks a byte that is not a base64 character (padding included).
const INVALID: u8 = 0x80;

/// Each ASCII byte's 6-bit value, or [`INVALID`].
const DECODE_TABLE: [u8; 128] = {
    let mut t = [INVALID; 128];
    let mut i = 0;
    while i < 64 {
        t[ALPHABET[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// For each output byte j < 48: the byte of the merged 24-bit lane it
/// takes (lanes are little-endian, the output big-endian).
const PACK: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut j = 0;
    while j < 48 {
        t[j] = ((j / 3) * 4 + (2 - j % 3)) as u8;
        j += 1;
    }
    t
};

/// For each 32-bit lane i: input bytes 3i+1, 3i, 3i+2, 3i+1, so that each
/// 6-bit field lies at a fixed bit offset in the lane (see `SHIFTS`).
const SPREAD: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 16 {
        t[4 * i] = (3 * i + 1) as u8;
        t[4 * i + 1] = (3 * i) as u8;
        t[4 * i + 2] = (3 * i + 2) as u8;
        t[4 * i + 3] = (3 * i + 1) as u8;
        i += 1;
    }
    t
};

/// Bit offsets of the four fields in each lane of a 64-bit word (10, 4,
/// 22, 16, then the same plus 32), one per output byte.
const SHIFTS: i64 = 0x3036_242a_1016_040a;

/// The low 48 bytes of a 64-byte vector.
const LOW_48: u64 = (1 << 48) - 1;

/// Whether this CPU runs these kernels (checked once, then cached by std).
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vbmi")
}

/// Whether `b` is a base64 character (not padding).
pub(super) fn is_base64(b: u8) -> bool {
    DECODE_TABLE.get(b as usize).is_some_and(|v| *v != INVALID)
}

/// Encodes `blocks` blocks of 48 bytes at `src` as 64 characters each at
/// `dst`.
///
/// # Safety
/// [`available`]; `src` readable for `48 * blocks` bytes, `dst` writable
/// for `64 * blocks`; the two do not overlap.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(super) unsafe fn encode(src: *const u8, blocks: usize, dst: *mut u8) {
    let spread = _mm512_loadu_si512(SPREAD.as_ptr().cast());
    let alphabet = _mm512_loadu_si512(ALPHABET.as_ptr().cast());
    let shifts = _mm512_set1_epi64(SHIFTS);
    for b in 0..blocks {
        // SAFETY: within the ranges the caller vouches for; the masked
        // load reads only the block's 48 bytes.
        unsafe {
            let input = _mm512_maskz_loadu_epi8(LOW_48, src.add(48 * b).cast());
            let lanes = _mm512_permutexvar_epi8(spread, input);
            let fields = _mm512_multishift_epi64_epi8(shifts, lanes);
            let text = _mm512_permutexvar_epi8(fields, alphabet);
            _mm512_storeu_si512(dst.add(64 * b).cast(), text);
        }
    }
}

/// Decodes whole blocks of 64 characters at `src` (of `len` bytes) into 48
/// bytes each at `dst`, stopping before the first block that is not all
/// base64 characters and before one that ends `src`. With `followed`, a
/// block is decoded only when the byte after it is a base64 character too
/// (so the block cannot hold a string's last group). Returns the blocks
/// decoded; a block is stored only once it is known good, so `src` past
/// them is as it was.
///
/// # Safety
/// [`available`]; `src` readable for `len` bytes, `dst` writable for
/// `48 * (len / 64)`; `dst` may be `src` or lie before it (each block is
/// read before its bytes are stored, and lands before what is unread), but
/// not after it within the same buffer.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(super) unsafe fn decode(src: *const u8, len: usize, dst: *mut u8, followed: bool) -> usize {
    let low = _mm512_loadu_si512(DECODE_TABLE.as_ptr().cast());
    let high = _mm512_loadu_si512(DECODE_TABLE[64..].as_ptr().cast());
    let pack = _mm512_loadu_si512(PACK.as_ptr().cast());
    let pairs = _mm512_set1_epi32(0x0140_0140);
    let quads = _mm512_set1_epi32(0x0001_1000);
    let mut b = 0;
    while 64 * (b + 1) + usize::from(followed) <= len {
        // SAFETY: the block and its follower lie within `len`; the store
        // lies within what the caller vouches for.
        unsafe {
            if followed && !is_base64(*src.add(64 * (b + 1))) {
                break;
            }
            let input = _mm512_loadu_si512(src.add(64 * b).cast());
            // Bit 6 picks the table half, bit 7 is ignored by the
            // permute: the OR with the input catches bytes over 127.
            let values = _mm512_permutex2var_epi8(low, input, high);
            if _mm512_movepi8_mask(_mm512_or_si512(values, input)) != 0 {
                break;
            }
            let words = _mm512_maddubs_epi16(values, pairs);
            let lanes = _mm512_madd_epi16(words, quads);
            let bytes = _mm512_permutexvar_epi8(pack, lanes);
            _mm512_mask_storeu_epi8(dst.add(48 * b).cast(), LOW_48, bytes);
        }
        b += 1;
    }
    b
}

/// Whether the first `blocks` blocks of 64 characters at `src` are all
/// base64 characters.
///
/// # Safety
/// [`available`]; `src` readable for `64 * blocks` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
pub(super) unsafe fn all_base64(src: *const u8, blocks: usize) -> bool {
    let low = _mm512_loadu_si512(DECODE_TABLE.as_ptr().cast());
    let high = _mm512_loadu_si512(DECODE_TABLE[64..].as_ptr().cast());
    let mut bad = _mm512_setzero_si512();
    for b in 0..blocks {
        // SAFETY: within what the caller vouches for.
        let input = unsafe { _mm512_loadu_si512(src.add(64 * b).cast()) };
        let values = _mm512_permutex2var_epi8(low, input, high);
        // One three-way OR: the running mark, the values, the input.
        bad = _mm512_ternarylogic_epi32(bad, values, input, 0xFE);
    }
    _mm512_movepi8_mask(bad) == 0
}
