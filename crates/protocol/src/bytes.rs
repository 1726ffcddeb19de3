//! `ByteChunk`: raw bytes carried as standard padded base64.
//!
//! Encoding and decoding run on [`exec_server_base64`] (our AVX-512 VBMI or
//! AVX2 kernels where the CPU has them, `base64-simd` elsewhere): the
//! byte-carrying methods spend most of their time here. Refusals keep the
//! `base64` crate's wording (the reference's), so a bad string is re-decoded
//! by that crate only to name the fault.

use base64::Engine;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The base64 engine of the wire: standard alphabet with padding.
pub const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Bytes on the wire as a base64 string (standard alphabet, padded). A bad string
/// fails to decode with the base64 crate's text, e.g. `Invalid symbol 33, offset 0.`
///
/// Shared bytes ([`bytes::Bytes`]): a binary frame's payload, or a chunk of
/// the output log, becomes a `ByteChunk` without being copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ByteChunk(pub bytes::Bytes);

impl ByteChunk {
    /// Encodes bytes as base64 text.
    pub fn encode(bytes: &[u8]) -> String {
        let mut s = String::with_capacity(encoded_len(bytes.len()));
        encode_into(bytes, &mut s);
        s
    }
}

/// Length in bytes of the base64 text of `n` bytes (padded).
pub use exec_server_base64::encoded_len;

/// Appends the base64 text of `data` to `out` (no intermediate buffer).
pub fn encode_into(data: &[u8], out: &mut String) {
    exec_server_base64::encode_append(data, out);
}

/// A base64 string that does not decode; its text is the `base64` crate's
/// (e.g. `Invalid symbol 33, offset 0.`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Names the fault in `text`, known not to decode, as the `base64` crate does.
#[cold]
fn fault(text: &[u8]) -> DecodeError {
    match BASE64.decode(text) {
        Err(e) => DecodeError(e.to_string()),
        // Both decoders refuse the same strings (tested); stay safe if not.
        Ok(_) => DecodeError("Invalid padding".into()),
    }
}

/// Decodes standard padded base64.
///
/// # Errors
/// [`DecodeError`] naming the first fault.
pub fn decode(text: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    match exec_server_base64::decode_append(text, &mut out) {
        Some(_) => Ok(out),
        None => Err(fault(text)),
    }
}

/// Decodes standard padded base64 in the string's own buffer: no second
/// allocation (the result keeps the text's capacity, about 4/3 of its length).
///
/// # Errors
/// [`DecodeError`] naming the first fault.
pub fn decode_owned(text: String) -> Result<Vec<u8>, DecodeError> {
    // Checked first (a fast read-only pass) so that a fault is named from the
    // intact text: in-place decoding overwrites what it has passed.
    if !exec_server_base64::is_valid(text.as_bytes()) {
        return Err(fault(text.as_bytes()));
    }
    decode_checked_in_place(text)
}

/// Decodes `text`, already checked to be base64, in its own buffer.
fn decode_checked_in_place(text: String) -> Result<Vec<u8>, DecodeError> {
    let mut buf = text.into_bytes();
    let Some(n) = exec_server_base64::decode_in_place(&mut buf) else {
        return Err(DecodeError("Invalid padding".into()));
    };
    buf.truncate(n);
    Ok(buf)
}

/// `fs/writeFile`'s `dataBase64` (wire: a base64 string). Any string
/// deserializes; one that is not base64 keeps its text and fault, for the
/// method to report once its other checks passed, as the reference does
/// (-32600 `fs/writeFile requires valid base64 dataBase64: <fault>`, after
/// the params, the session and the path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LenientChunk {
    /// Valid base64: the bytes.
    Valid(ByteChunk),
    /// Not base64: the string as sent, and why.
    Invalid {
        /// The string as sent (serialized back unchanged).
        text: String,
        /// The `base64` crate's fault text.
        fault: DecodeError,
    },
}

impl Default for LenientChunk {
    fn default() -> Self {
        LenientChunk::Valid(ByteChunk::default())
    }
}

impl LenientChunk {
    /// The bytes, or the fault of a string that is not base64.
    ///
    /// # Errors
    /// [`DecodeError`] for a string that is not base64.
    pub fn bytes(&self) -> Result<&bytes::Bytes, &DecodeError> {
        match self {
            LenientChunk::Valid(c) => Ok(&c.0),
            LenientChunk::Invalid { fault, .. } => Err(fault),
        }
    }
}

impl From<Vec<u8>> for LenientChunk {
    fn from(v: Vec<u8>) -> Self {
        LenientChunk::Valid(ByteChunk::from(v))
    }
}

impl Serialize for LenientChunk {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            LenientChunk::Valid(c) => c.serialize(s),
            LenientChunk::Invalid { text, .. } => s.serialize_str(text),
        }
    }
}

impl<'de> Deserialize<'de> for LenientChunk {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if !exec_server_base64::is_valid(text.as_bytes()) {
            let fault = fault(text.as_bytes());
            return Ok(LenientChunk::Invalid { text, fault });
        }
        match decode_checked_in_place(text) {
            Ok(v) => Ok(LenientChunk::from(v)),
            // Checked above; unreachable, but never a panic.
            Err(fault) => Ok(LenientChunk::Invalid {
                text: String::new(),
                fault,
            }),
        }
    }
}

impl From<Vec<u8>> for ByteChunk {
    fn from(v: Vec<u8>) -> Self {
        ByteChunk(v.into())
    }
}

impl ByteChunk {
    /// The bytes as a vector: free when this chunk holds its whole buffer
    /// alone (bytes decoded from base64), a copy otherwise.
    pub fn into_vec(self) -> Vec<u8> {
        self.0.into()
    }
}

impl Serialize for ByteChunk {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&ByteChunk::encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for ByteChunk {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(ChunkVisitor)
    }
}

struct ChunkVisitor;

impl serde::de::Visitor<'_> for ChunkVisitor {
    type Value = ByteChunk;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteChunk, E> {
        decode(v.as_bytes()).map(ByteChunk::from).map_err(E::custom)
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<ByteChunk, E> {
        decode_owned(v).map(ByteChunk::from).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_error_text() {
        let c = ByteChunk::from(b"\x00\xffhi".to_vec());
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(s, "\"AP9oaQ==\"");
        assert_eq!(serde_json::from_str::<ByteChunk>(&s).unwrap(), c);
        // Owned strings (from a `Value`) take the in-place path.
        let v = serde_json::Value::String("AP9oaQ==".into());
        assert_eq!(serde_json::from_value::<ByteChunk>(v).unwrap(), c);
        let e = serde_json::from_str::<ByteChunk>("\"!!\"")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("Invalid symbol 33, offset 0."), "{e}");
        let e = serde_json::from_value::<ByteChunk>(serde_json::json!("AA!A"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "Invalid symbol 33, offset 2.");
        let e = serde_json::from_value::<ByteChunk>(serde_json::json!(5))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "invalid type: integer `5`, expected a string");
    }

    #[test]
    fn edge_cases_agree_with_the_base64_crate() {
        for t in [
            "", "=", "==", "A", "AA", "AAA", "AA=", "AA==", "AB==", "AAB=", "AAA=", "A===",
            "AAAA=", "AAAA====", "AA==AA==", " AAA", "AAA\n", "AA=A", "////", "+/+/", "-_-_",
        ] {
            let a = BASE64.decode(t).ok();
            let b = decode(t.as_bytes()).ok();
            let c = decode_owned(t.to_string()).ok();
            assert_eq!(a, b, "{t:?}");
            assert_eq!(a, c, "{t:?}");
        }
    }

    #[test]
    fn a_lenient_chunk_keeps_a_bad_string_and_its_fault() {
        let ok: LenientChunk = serde_json::from_str("\"AP9oaQ==\"").unwrap();
        assert_eq!(ok.bytes().unwrap().as_ref(), b"\x00\xffhi");
        let bad: LenientChunk = serde_json::from_str("\"QUJ!\"").unwrap();
        assert_eq!(
            bad.bytes().unwrap_err().to_string(),
            "Invalid symbol 33, offset 3."
        );
        assert_eq!(serde_json::to_string(&bad).unwrap(), "\"QUJ!\"");
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"AP9oaQ==\"");
        // Not a string at all is still a params error.
        assert!(serde_json::from_str::<LenientChunk>("5").is_err());
    }

    proptest! {
        #[test]
        fn same_answers_as_the_base64_crate(t in "[A-Da-d0-3+/=!\\-]{0,40}") {
            let a = BASE64.decode(&t).map_err(|e| e.to_string());
            let b = decode(t.as_bytes()).map_err(|e| e.to_string());
            let c = decode_owned(t.clone()).map_err(|e| e.to_string());
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(&a, &c);
        }

        #[test]
        fn encodes_like_the_base64_crate(d in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut s = String::from("x");
            encode_into(&d, &mut s);
            prop_assert_eq!(&s[1..], BASE64.encode(&d));
            prop_assert_eq!(s.len() - 1, encoded_len(d.len()));
        }
    }
}
