//! The wire's base64: the standard alphabet with padding, strict (RFC 4648
//! §4: no line breaks, no whitespace, padding only at the end, zero
//! trailing bits), exactly as `base64-simd`'s `STANDARD`, which it runs on
//! where nothing faster exists.
//!
//! On x86-64 the bulk of a string goes through kernels of our own: [`vbmi`]'s
//! on CPUs with AVX-512 VBMI (about 2.4 times `base64-simd`'s AVX2 decoding
//! and 1.5 times its encoding there), else [`avx2`]'s; only its last group
//! or so goes through `base64-simd`, which keeps the padding and
//! trailing-bit rules in one place. The split never changes an answer: the
//! bulk holds whole groups that are not the last, where any character
//! outside the alphabet (`=` included) makes the whole string invalid
//! either way.

#![deny(missing_docs)]
use base64_simd::AsOut;

/// Length in bytes of the base64 text of `n` bytes (padded).
pub const fn encoded_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod vbmi;

#[cfg(test)]
mod tests;

/// Characters in one kernel block (decoding to 48 bytes).
const BLOCK_CHARS: usize = 64;
/// Bytes in one kernel block (encoding to 64 characters).
const BLOCK_BYTES: usize = 48;

/// A set of block kernels this CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernels {
    #[cfg(target_arch = "x86_64")]
    Vbmi,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// The fastest kernels this CPU runs, if any (the features are checked
/// once, then cached by std).
fn kernels() -> Option<Kernels> {
    #[cfg(target_arch = "x86_64")]
    {
        if vbmi::available() {
            return Some(Kernels::Vbmi);
        }
        if avx2::available() {
            return Some(Kernels::Avx2);
        }
    }
    None
}

impl Kernels {
    /// Encodes `blocks` blocks of 48 bytes at `src` as 64 characters each.
    ///
    /// # Safety
    /// `self` runs here (from [`kernels`]); `src` readable for `48 *
    /// blocks` bytes, `dst` writable for `64 * blocks`, not overlapping.
    unsafe fn encode(self, src: *const u8, blocks: usize, dst: *mut u8) {
        // SAFETY: passed on from the caller.
        unsafe {
            match self {
                #[cfg(target_arch = "x86_64")]
                Kernels::Vbmi => vbmi::encode(src, blocks, dst),
                #[cfg(target_arch = "x86_64")]
                Kernels::Avx2 => avx2::encode(src, blocks, dst),
            }
        }
    }

    /// Decodes whole blocks of 64 characters of `src` (`len` bytes) into 48
    /// bytes each at `dst`, up to the first that is not all base64 or that
    /// ends `src` (with `followed`, that no base64 character follows).
    /// Returns the blocks decoded; `src` past them is untouched.
    ///
    /// # Safety
    /// `self` runs here; `src` readable for `len` bytes, `dst` writable for
    /// `48 * (len / 64)`; `dst` is `src`, lies before it, or is distinct.
    unsafe fn decode(self, src: *const u8, len: usize, dst: *mut u8, followed: bool) -> usize {
        // SAFETY: passed on from the caller.
        unsafe {
            match self {
                #[cfg(target_arch = "x86_64")]
                Kernels::Vbmi => vbmi::decode(src, len, dst, followed),
                #[cfg(target_arch = "x86_64")]
                Kernels::Avx2 => avx2::decode(src, len, dst, followed),
            }
        }
    }

    /// Whether the first `blocks` blocks of 64 characters at `src` are all
    /// base64 characters.
    ///
    /// # Safety
    /// `self` runs here; `src` readable for `64 * blocks` bytes.
    unsafe fn all_base64(self, src: *const u8, blocks: usize) -> bool {
        // SAFETY: passed on from the caller.
        unsafe {
            match self {
                #[cfg(target_arch = "x86_64")]
                Kernels::Vbmi => vbmi::all_base64(src, blocks),
                #[cfg(target_arch = "x86_64")]
                Kernels::Avx2 => avx2::all_base64(src, blocks),
            }
        }
    }
}

/// Whole kernel blocks at the start of a `len`-character string that leave
/// its last group (and anything short of a group) to `base64-simd`.
fn bulk_blocks(len: usize) -> usize {
    len.saturating_sub(4) / BLOCK_CHARS
}

/// Appends the base64 text of `data` to `out` (`4 * ceil(len / 3)`
/// characters, padded).
pub fn encode_append(data: &[u8], out: &mut String) {
    let mut rest = data;
    if let Some(k) = kernels() {
        let blocks = data.len() / BLOCK_BYTES;
        out.reserve(encoded_len(data.len()));
        // SAFETY: the kernels run here (checked); `data` holds the blocks;
        // the reserve above made room for their text past `out`'s end,
        // which the kernel writes as ASCII (so `out` stays UTF-8) before
        // the length covers it.
        unsafe {
            let v = out.as_mut_vec();
            let at = v.len();
            k.encode(data.as_ptr(), blocks, v.as_mut_ptr().add(at));
            v.set_len(at + blocks * BLOCK_CHARS);
        }
        rest = &data[blocks * BLOCK_BYTES..];
    }
    base64_simd::STANDARD.encode_append(rest, out);
}

/// Decodes `text` into the start of `out`, which must have room for
/// `text.len() / 4 * 3` bytes. Returns the bytes written, or `None` when
/// `text` is not valid base64 or `out` is too short (`out` may then hold
/// anything).
pub fn decode(text: &[u8], out: &mut [u8]) -> Option<usize> {
    if out.len() < text.len() / 4 * 3 {
        // (`base64-simd` would panic.)
        return None;
    }
    let mut done = 0;
    if let Some(k) = kernels() {
        let blocks = bulk_blocks(text.len());
        // SAFETY: the kernels run here; `text` holds the blocks, `out` has
        // room for their bytes, and the two are distinct slices.
        done = unsafe { k.decode(text.as_ptr(), blocks * BLOCK_CHARS, out.as_mut_ptr(), false) };
        if done < blocks {
            return None;
        }
    }
    let tail = base64_simd::STANDARD
        .decode(
            &text[done * BLOCK_CHARS..],
            out[done * BLOCK_BYTES..].as_out(),
        )
        .ok()?
        .len();
    Some(done * BLOCK_BYTES + tail)
}

/// Appends the bytes `text` decodes to to `out` (no zeroing first).
/// Returns how many, or `None` when it is not valid base64 (`out` is then
/// as it was).
pub fn decode_append(text: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    let at = out.len();
    let mut done = 0;
    if let Some(k) = kernels() {
        let blocks = bulk_blocks(text.len());
        out.reserve(blocks * BLOCK_BYTES);
        // SAFETY: the kernels run here; `text` holds the blocks; the
        // reserve above made room for their bytes past `out`'s end, and the
        // length covers only blocks the kernel stored.
        unsafe {
            done = k.decode(
                text.as_ptr(),
                blocks * BLOCK_CHARS,
                out.as_mut_ptr().add(at),
                false,
            );
            if done < blocks {
                return None;
            }
            out.set_len(at + done * BLOCK_BYTES);
        }
    }
    match base64_simd::STANDARD.decode_append(&text[done * BLOCK_CHARS..], out) {
        Ok(_) => Some(out.len() - at),
        Err(_) => {
            out.truncate(at);
            None
        }
    }
}

/// Decodes `buf` in place: the bytes land at its start. Returns how many,
/// or `None` when it is not valid base64 (`buf` may then hold anything).
pub fn decode_in_place(buf: &mut [u8]) -> Option<usize> {
    let mut done = 0;
    if let Some(k) = kernels() {
        let blocks = bulk_blocks(buf.len());
        let p = buf.as_mut_ptr();
        // SAFETY: the kernels run here; the blocks lie in `buf`, and each
        // block's bytes land before any text not yet read.
        done = unsafe { k.decode(p, blocks * BLOCK_CHARS, p, false) };
        if done < blocks {
            return None;
        }
    }
    let from = done * BLOCK_CHARS;
    let n = base64_simd::STANDARD
        .decode_inplace(&mut buf[from..])
        .ok()?
        .len();
    buf.copy_within(from..from + n, done * BLOCK_BYTES);
    Some(done * BLOCK_BYTES + n)
}

/// Whether `text` is valid base64 (read only).
pub fn is_valid(text: &[u8]) -> bool {
    let mut from = 0;
    if let Some(k) = kernels() {
        let blocks = bulk_blocks(text.len());
        // SAFETY: the kernels run here; the blocks lie in `text`.
        if !unsafe { k.all_base64(text.as_ptr(), blocks) } {
            return false;
        }
        from = blocks * BLOCK_CHARS;
    }
    base64_simd::STANDARD.check(&text[from..]).is_ok()
}

/// Decodes, in place from `buf`'s start, the longest run of whole blocks of
/// 64 characters each followed by another base64 character (so none can
/// hold a string's last group). Returns (characters read, bytes written);
/// `buf` past the characters read is untouched. `(0, 0)` where the kernels
/// do not run: the caller's general path does the work.
pub fn decode_leading_in_place(buf: &mut [u8]) -> (usize, usize) {
    if let Some(k) = kernels() {
        let p = buf.as_mut_ptr();
        // SAFETY: the kernels run here; it reads within `buf` and each
        // block's bytes land before any text not yet read.
        let blocks = unsafe { k.decode(p, buf.len(), p, true) };
        return (blocks * BLOCK_CHARS, blocks * BLOCK_BYTES);
    }
    (0, 0)
}
