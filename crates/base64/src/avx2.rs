//! Base64 kernels for x86-64 CPUs with AVX2 (nearly all since 2013, AMD
//! Zen included) but without AVX-512 VBMI: the same blocks as [`super::vbmi`]
//! (48 bytes, 64 characters), each as two 32-character halves.
//!
//! Decoding classifies each character by its two nibbles: one table look-up
//! per nibble gives a class mask, and a character is base64 when the two
//! masks share no bit (every byte over 127 shares one). A third look-up,
//! by the high nibble (one less for `/`), gives what to add to turn the
//! character into its 6-bit value. Two multiply-adds merge four values into
//! three bytes, and a byte shuffle plus a lane permute pack them.
//! Encoding spreads each 3 bytes over a 32-bit lane, cuts the four 6-bit
//! fields out with a multiply-high and a multiply-low, and turns each into
//! a character by adding an offset that depends only on its range.
//!
//! Every function here requires AVX2: callers check [`available`] first.

use std::arch::x86_64::*;

/// Per high nibble, a class bit: a character is invalid when the class bit
/// of its high nibble is set in the low nibble's mask. 0x10: never valid
/// (controls, bytes over 127); 0x01: `+` `/` row; 0x02: digits; 0x04: `A`–`O`
/// and `a`–`o` rows; 0x08: `P`–`Z` and `p`–`z` rows.
const HIGH_CLASS: [u8; 16] = [
    0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,
];

/// Per low nibble, the classes in which it is not a base64 character.
const LOW_INVALID: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut lo = 0;
    while lo < 16 {
        let mut bits = 0x10;
        if lo != 0x0b && lo != 0x0f {
            bits |= 0x01; // only `+` (0x2B) and `/` (0x2F) in row 2
        }
        if lo > 9 {
            bits |= 0x02; // digits are 0x30–0x39
        }
        if lo == 0 {
            bits |= 0x04; // 0x40 and 0x60 are not letters
        }
        if lo > 0x0a {
            bits |= 0x08; // letters end at 0x5A and 0x7A
        }
        t[lo] = bits;
        lo += 1;
    }
    t
};

/// Per high nibble (minus one for `/`), what to add to a valid character
/// to get its 6-bit value.
const ROLL: [i8; 16] = [
    0,
    63 - b'/' as i8,
    62 - b'+' as i8,
    52 - b'0' as i8,
    -(b'A' as i8),
    -(b'A' as i8),
    26 - b'a' as i8,
    26 - b'a' as i8,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
];

/// Within each 128-bit lane: the three bytes of each merged 32-bit value,
/// most significant first (the values are little-endian), into 12 bytes.
const PACK_IN_LANE: [i8; 16] = [2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1];

/// For each 32-bit lane i of a 128-bit lane whose 12 input bytes start at
/// byte `at`: bytes 3i+1, 3i, 3i+2, 3i+1, so each 6-bit field lies at a
/// fixed offset in the lane.
const fn spread(at: i8) -> [i8; 16] {
    let mut t = [0i8; 16];
    let mut i = 0;
    while i < 4 {
        let b = at + 3 * i as i8;
        t[4 * i] = b + 1;
        t[4 * i + 1] = b;
        t[4 * i + 2] = b + 2;
        t[4 * i + 3] = b + 1;
        i += 1;
    }
    t
}

/// Offsets from a 6-bit value to its character, indexed as `encode` maps
/// values: 0–25 → 13, 26–51 → 0, 52–61 → 1–10, 62 → 11, 63 → 12.
const TO_CHAR: [i8; 16] = [
    b'a' as i8 - 26,
    b'0' as i8 - 52,
    b'0' as i8 - 52,
    b'0' as i8 - 52,
    b'0' as i8 - 52,
    b'0' as i8 - 52,
    b'0' as i8 - 52,
    b'0' as i8 - 52,
    b'0' as i8 - 52,
    b'0' as i8 - 52,
    b'0' as i8 - 52,
    b'+' as i8 - 62,
    b'/' as i8 - 63,
    b'A' as i8,
    0,
    0,
];

/// Whether this CPU runs these kernels (checked once, then cached by std).
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// Both 128-bit lanes set to `t` (a table of 16 bytes, `u8` or `i8`).
#[target_feature(enable = "avx2")]
fn both_lanes<T: Copy>(t: &[T; 16]) -> __m256i {
    const { assert!(std::mem::size_of::<T>() == 1) };
    // SAFETY: `t` is 16 bytes (checked above at compile time).
    let lane = unsafe { _mm_loadu_si128(t.as_ptr().cast()) };
    _mm256_broadcastsi128_si256(lane)
}

/// Where 32 characters are not base64 (nonzero bytes there), and their
/// high nibbles.
#[target_feature(enable = "avx2")]
fn classify(input: __m256i, t: &DecodeTables) -> (__m256i, __m256i) {
    let high = _mm256_and_si256(_mm256_srli_epi32(input, 4), t.nibble);
    let low = _mm256_and_si256(input, t.nibble);
    let class = _mm256_shuffle_epi8(t.high_class, high);
    let invalid = _mm256_shuffle_epi8(t.low_invalid, low);
    (_mm256_and_si256(class, invalid), high)
}

/// The 24 bytes of 32 base64 characters (with their high nibbles), in the
/// low 24 bytes.
#[target_feature(enable = "avx2")]
fn decode_half(input: __m256i, high: __m256i, t: &DecodeTables) -> __m256i {
    let is_slash = _mm256_cmpeq_epi8(input, t.slash);
    let roll = _mm256_shuffle_epi8(t.roll, _mm256_add_epi8(is_slash, high));
    let values = _mm256_add_epi8(input, roll);
    let words = _mm256_maddubs_epi16(values, t.pairs);
    let lanes = _mm256_madd_epi16(words, t.quads);
    let packed = _mm256_shuffle_epi8(lanes, t.pack);
    _mm256_permutevar8x32_epi32(packed, t.gather)
}

/// Whether every bit of `v` is clear: one `vptest`, as written (the
/// optimiser otherwise reduces the vector by halves, six instructions).
#[target_feature(enable = "avx2")]
fn all_clear(v: __m256i) -> bool {
    let clear: u8;
    // SAFETY: one AVX register test and a flag read (this function
    // requires AVX2); no memory.
    unsafe {
        std::arch::asm!(
            "vptest {v}, {v}",
            "setz {clear}",
            v = in(ymm_reg) v,
            clear = out(reg_byte) clear,
            options(pure, nomem, nostack),
        );
    }
    clear != 0
}

/// The constants of [`classify`] and [`decode_half`], loaded once per call
/// of [`decode`].
struct DecodeTables {
    nibble: __m256i,
    high_class: __m256i,
    low_invalid: __m256i,
    roll: __m256i,
    slash: __m256i,
    pairs: __m256i,
    quads: __m256i,
    pack: __m256i,
    gather: __m256i,
}

impl DecodeTables {
    #[target_feature(enable = "avx2")]
    fn new() -> DecodeTables {
        DecodeTables {
            nibble: _mm256_set1_epi8(0x0f),
            high_class: both_lanes(&HIGH_CLASS),
            low_invalid: both_lanes(&LOW_INVALID),
            roll: both_lanes(&ROLL),
            slash: _mm256_set1_epi8(b'/' as i8),
            pairs: _mm256_set1_epi32(0x0140_0140),
            quads: _mm256_set1_epi32(0x0001_1000),
            pack: both_lanes(&PACK_IN_LANE),
            gather: _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7),
        }
    }
}

/// Decodes whole blocks of 64 characters at `src` (of `len` bytes) into 48
/// bytes each at `dst`, as [`super::vbmi::decode`]: stopping before the
/// first block that is not all base64 characters and before one that ends
/// `src`; with `followed`, only blocks followed by a base64 character.
/// Returns the blocks decoded; a block is stored only once both its halves
/// are known good, so `src` past them is as it was.
///
/// # Safety
/// [`available`]; `src` readable for `len` bytes, `dst` writable for
/// `48 * (len / 64)`; `dst` may be `src` or lie before it (each block is
/// read before its bytes are stored, and lands before what is unread), but
/// not after it within the same buffer.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn decode(src: *const u8, len: usize, dst: *mut u8, followed: bool) -> usize {
    let t = DecodeTables::new();
    let mut b = 0;
    while 64 * (b + 1) + usize::from(followed) <= len {
        // SAFETY: the block and its follower lie within `len`; the stores
        // lie within the block's 48 bytes at `dst`.
        unsafe {
            if followed && !super::vbmi::is_base64(*src.add(64 * (b + 1))) {
                break;
            }
            let first = _mm256_loadu_si256(src.add(64 * b).cast());
            let second = _mm256_loadu_si256(src.add(64 * b + 32).cast());
            let (bad_first, high_first) = classify(first, &t);
            let (bad_second, high_second) = classify(second, &t);
            if !all_clear(_mm256_or_si256(bad_first, bad_second)) {
                break;
            }
            let first = decode_half(first, high_first, &t);
            let second = decode_half(second, high_second, &t);
            let out = dst.add(48 * b);
            // 32 bytes, of which the last 8 are overwritten next.
            _mm256_storeu_si256(out.cast(), first);
            _mm_storeu_si128(out.add(24).cast(), _mm256_castsi256_si128(second));
            _mm_storel_epi64(out.add(40).cast(), _mm256_extracti128_si256::<1>(second));
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
#[target_feature(enable = "avx2")]
pub(super) unsafe fn all_base64(src: *const u8, blocks: usize) -> bool {
    let t = DecodeTables::new();
    let mut bad = _mm256_setzero_si256();
    for half in 0..2 * blocks {
        // SAFETY: within what the caller vouches for.
        let input = unsafe { _mm256_loadu_si256(src.add(32 * half).cast()) };
        bad = _mm256_or_si256(bad, classify(input, &t).0);
    }
    all_clear(bad)
}

/// `vpmulhuw`, as written: the optimiser otherwise rewrites a multiply-high
/// by powers of two into widening shifts or multiplies and packs, over twice
/// the instructions.
#[target_feature(enable = "avx2")]
fn mulhi_epu16(a: __m256i, b: __m256i) -> __m256i {
    let out: __m256i;
    // SAFETY: one AVX2 register instruction (this function requires AVX2);
    // no memory, no flags.
    unsafe {
        std::arch::asm!(
            "vpmulhuw {out}, {a}, {b}",
            out = lateout(ymm_reg) out,
            a = in(ymm_reg) a,
            b = in(ymm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// Encodes `blocks` blocks of 48 bytes at `src` as 64 characters each at
/// `dst`.
///
/// # Safety
/// [`available`]; `src` readable for `48 * blocks` bytes, `dst` writable
/// for `64 * blocks`; the two do not overlap.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn encode(src: *const u8, blocks: usize, dst: *mut u8) {
    // The low lane takes its 12 bytes from the start of a 16-byte load,
    // the high lane from byte 4 of a load 8 bytes further: 24 bytes read.
    let spread = _mm256_setr_m128i(
        // SAFETY: 16-byte tables.
        unsafe { _mm_loadu_si128(spread(0).as_ptr().cast()) },
        unsafe { _mm_loadu_si128(spread(4).as_ptr().cast()) },
    );
    let field_ac = _mm256_set1_epi32(0x0fc0_fc00);
    let shift_ac = _mm256_set1_epi32(0x0400_0040);
    let field_bd = _mm256_set1_epi32(0x003f_03f0);
    let shift_bd = _mm256_set1_epi32(0x0100_0010);
    let to_char = both_lanes(&TO_CHAR);
    let above_51 = _mm256_set1_epi8(51);
    let below_26 = _mm256_set1_epi8(26);
    let letters_up = _mm256_set1_epi8(13);
    for half in 0..2 * blocks {
        // SAFETY: within the ranges the caller vouches for: the two loads
        // cover bytes 0..16 and 8..24 of this half's 24.
        unsafe {
            let at = src.add(24 * half);
            let input = _mm256_setr_m128i(
                _mm_loadu_si128(at.cast()),
                _mm_loadu_si128(at.add(8).cast()),
            );
            let lanes = _mm256_shuffle_epi8(input, spread);
            let ac = mulhi_epu16(_mm256_and_si256(lanes, field_ac), shift_ac);
            let bd = _mm256_mullo_epi16(_mm256_and_si256(lanes, field_bd), shift_bd);
            let values = _mm256_or_si256(ac, bd);
            // 0 for 0–51, 1–12 for 52–63; then 13 for 0–25.
            let index = _mm256_subs_epu8(values, above_51);
            let letters = _mm256_cmpgt_epi8(below_26, values);
            let index = _mm256_or_si256(index, _mm256_and_si256(letters, letters_up));
            let text = _mm256_add_epi8(values, _mm256_shuffle_epi8(to_char, index));
            _mm256_storeu_si256(dst.add(32 * half).cast(), text);
        }
    }
}
