use super::*;
use base64::Engine;
use proptest::prelude::*;

const REFERENCE: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Bytes that break a string in interesting ways: padding, JSON's quote
/// and escape, bytes over 127 (0xC1 and 0xB0 are `A` and `0` with the top
/// bit set), the URL-safe alphabet, whitespace.
const BREAKERS: &[u8] = b"=\"\\-_ \n\x80\xff\xc1\xb0\x7f\x00A";

fn data(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// Every answer of this module for `text`, against the `base64` crate's.
fn agrees(text: &[u8]) -> Result<(), TestCaseError> {
    let want = REFERENCE.decode(text).ok();
    prop_assert_eq!(is_valid(text), want.is_some());
    let mut out = vec![0u8; text.len() / 4 * 3];
    let got = decode(text, &mut out).map(|n| out[..n].to_vec());
    prop_assert_eq!(&got, &want);
    let mut appended = b"head".to_vec();
    let got = decode_append(text, &mut appended).map(|n| appended[4..4 + n].to_vec());
    prop_assert_eq!(&got, &want);
    if got.is_none() {
        prop_assert_eq!(&appended, b"head");
    }
    let mut buf = text.to_vec();
    let got = decode_in_place(&mut buf).map(|n| buf[..n].to_vec());
    prop_assert_eq!(&got, &want);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn encodes_as_the_base64_crate(len in 0usize..700, seed: u32, prefix in "[a-z]{0,3}") {
        let d = data(len, seed);
        let mut s = prefix.clone();
        encode_append(&d, &mut s);
        prop_assert_eq!(&s[prefix.len()..], REFERENCE.encode(&d));
    }

    #[test]
    fn valid_strings_decode_as_the_base64_crate(len in 0usize..700, seed: u32) {
        agrees(REFERENCE.encode(data(len, seed)).as_bytes())?;
    }

    #[test]
    fn broken_strings_are_refused_as_by_the_base64_crate(
        len in 1usize..700,
        seed: u32,
        at: prop::sample::Index,
        breaker: prop::sample::Index,
        cut in 0usize..3,
    ) {
        let mut text = REFERENCE.encode(data(len, seed)).into_bytes();
        let i = at.index(text.len());
        text[i] = BREAKERS[breaker.index(BREAKERS.len())];
        text.truncate(text.len() - cut.min(text.len() - 1));
        agrees(&text)?;
    }

    #[test]
    fn leading_blocks_stop_before_a_last_group_or_a_break(
        len in 0usize..900,
        seed: u32,
        at: prop::sample::Index,
        breaker: prop::sample::Index,
        tail in "[\"=\\\\A]?",
    ) {
        let mut text = REFERENCE.encode(data(len, seed)).into_bytes();
        text.extend_from_slice(tail.as_bytes());
        if !text.is_empty() {
            let i = at.index(text.len());
            text[i] = BREAKERS[breaker.index(BREAKERS.len())];
        }
        let mut buf = text.clone();
        let (chars, bytes) = decode_leading_in_place(&mut buf);
        prop_assert_eq!(&buf[chars..], &text[chars..]);
        prop_assert_eq!(chars / 4 * 3, bytes);
        let good = |c: &u8| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/';
        if kernels().is_some() {
            // The longest run of whole blocks, each followed by base64.
            let mut want = 0;
            while want + 65 <= text.len() && text[want..want + 65].iter().all(good) {
                want += 64;
            }
            prop_assert_eq!(chars, want);
            let want = REFERENCE.decode(&text[..chars]).unwrap();
            prop_assert_eq!(&buf[..bytes], want.as_slice());
        } else {
            prop_assert_eq!((chars, bytes), (0, 0));
        }
    }
}

#[test]
fn short_output_room_is_refused_not_overrun() {
    let text = REFERENCE.encode(data(300, 7));
    let mut out = vec![0u8; 299];
    assert_eq!(decode(text.as_bytes(), &mut out), None);
    let mut out = vec![0u8; 300];
    assert_eq!(decode(text.as_bytes(), &mut out), Some(300));
    assert_eq!(out, data(300, 7));
}

#[test]
fn edge_cases_agree_with_the_base64_crate() {
    for t in [
        "", "=", "==", "A", "AA", "AAA", "AA=", "AA==", "AB==", "AAB=", "AAA=", "A===", "AAAA=",
        "AAAA====", "AA==AA==", " AAA", "AAA\n", "AA=A", "////", "+/+/", "-_-_",
    ] {
        agrees(t.as_bytes()).unwrap();
        // The same at the end of a long string (past the kernels' bulk).
        let long = format!("{}{t}", "QUJD".repeat(40));
        agrees(long.as_bytes()).unwrap();
    }
}

/// Every kernel set this CPU runs, not only the one [`kernels`] picks.
fn runnable() -> Vec<Kernels> {
    #[allow(unused_mut)]
    let mut all = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if vbmi::available() {
            all.push(Kernels::Vbmi);
        }
        if avx2::available() {
            all.push(Kernels::Avx2);
        }
    }
    all
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn each_kernel_set_agrees_with_the_base64_crate_on_whole_blocks(
        blocks in 0usize..12,
        seed: u32,
        at: prop::sample::Index,
        breaker: prop::sample::Index,
        broken: bool,
    ) {
        let d = data(blocks * BLOCK_BYTES, seed);
        for k in runnable() {
            let mut text = vec![0u8; blocks * BLOCK_CHARS];
            // SAFETY: `k` runs here; the buffers have the sizes it needs.
            unsafe { k.encode(d.as_ptr(), blocks, text.as_mut_ptr()) };
            let want_text = REFERENCE.encode(&d);
            prop_assert_eq!(&text, want_text.as_bytes(), "{:?}", k);
            let mut want = blocks;
            if broken && blocks > 0 {
                let i = at.index(text.len());
                text[i] = BREAKERS[breaker.index(BREAKERS.len())];
                if !(text[i].is_ascii_alphanumeric() || text[i] == b'+' || text[i] == b'/') {
                    want = i / BLOCK_CHARS;
                }
            }
            let mut out = vec![0u8; blocks * BLOCK_BYTES];
            // SAFETY: as above.
            let n = unsafe { k.decode(text.as_ptr(), text.len(), out.as_mut_ptr(), false) };
            prop_assert_eq!(n, want, "{:?}", k);
            // The blocks decoded, followed by a group (so none is the last).
            let mut whole = text[..n * BLOCK_CHARS].to_vec();
            whole.extend_from_slice(b"AAAA");
            let want_bytes = REFERENCE.decode(&whole).unwrap();
            prop_assert_eq!(&out[..n * BLOCK_BYTES], &want_bytes[..n * BLOCK_BYTES], "{:?}", k);
            // SAFETY: as above.
            let all = unsafe { k.all_base64(text.as_ptr(), blocks) };
            prop_assert_eq!(all, want == blocks, "{:?}", k);
        }
    }
}

/// Each byte value at each place of a block: decoded exactly when it is a
/// base64 character, to its value.
#[test]
fn each_kernel_set_classifies_every_byte() {
    for k in runnable() {
        for c in 0..=255u8 {
            for at in [0, 13, 31, 32, 63] {
                // Followed by a group: a block is never a string's last.
                let mut text = [b'A'; BLOCK_CHARS + 4];
                text[at] = c;
                let want = REFERENCE
                    .decode(text)
                    .ok()
                    .map(|d| d[..BLOCK_BYTES].to_vec());
                let mut out = [0u8; BLOCK_BYTES];
                // SAFETY: `k` runs here; the buffers have the sizes it needs.
                let n = unsafe { k.decode(text.as_ptr(), BLOCK_CHARS, out.as_mut_ptr(), false) };
                let got = (n == 1).then(|| out.to_vec());
                assert_eq!(got, want, "{k:?}: byte {c:#04x} at {at}");
                // SAFETY: as above.
                let all = unsafe { k.all_base64(text.as_ptr(), 1) };
                assert_eq!(all, want.is_some(), "{k:?}: byte {c:#04x} at {at}");
            }
        }
    }
}
