//! `ByteChunk`: raw bytes carried as standard padded base64.

use base64::Engine;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The base64 engine of the wire: standard alphabet with padding.
pub const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Bytes on the wire as a base64 string (standard alphabet, padded). A bad string
/// fails to decode with the base64 crate's text, e.g. `Invalid symbol 33, offset 0.`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ByteChunk(pub Vec<u8>);

impl ByteChunk {
    /// Encodes bytes as base64 text.
    pub fn encode(bytes: &[u8]) -> String {
        BASE64.encode(bytes)
    }
}

impl From<Vec<u8>> for ByteChunk {
    fn from(v: Vec<u8>) -> Self {
        ByteChunk(v)
    }
}

impl Serialize for ByteChunk {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&BASE64.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for ByteChunk {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        BASE64
            .decode(s.as_bytes())
            .map(ByteChunk)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_error_text() {
        let c = ByteChunk(b"\x00\xffhi".to_vec());
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(s, "\"AP9oaQ==\"");
        assert_eq!(serde_json::from_str::<ByteChunk>(&s).unwrap(), c);
        let e = serde_json::from_str::<ByteChunk>("\"!!\"")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("Invalid symbol 33, offset 0."), "{e}");
    }
}
