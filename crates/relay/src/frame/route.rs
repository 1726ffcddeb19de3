//! Routing a data frame from its first bytes, for a node that forwards the
//! rest without reading it (`registry/splice_route.rs`).

use super::Reader;

/// The stream id of the encoded frame of `frame_len` bytes that `prefix`
/// starts, if `prefix` shows it to be a data frame (`RelayData`, field 5)
/// whose data runs to the frame's very end, after a version, the stream id
/// and acknowledgements only. Such a frame is routed by its stream id alone
/// and nothing after the prefix can change that (protobuf lets a later
/// field replace an earlier body, so a frame with anything after its data
/// is not one). `None` for every other frame, and for a prefix too short
/// to tell.
pub fn data_stream_id(prefix: &[u8], frame_len: usize) -> Option<&str> {
    let mut r = Reader(prefix);
    let mut stream_id = None;
    loop {
        let key = r.varint().ok()?;
        match (key >> 3, key & 7) {
            (1 | 3 | 4, 0) => {
                r.varint().ok()?;
            }
            (2, 2) => stream_id = Some(std::str::from_utf8(r.field_bytes()?).ok()?),
            (5, 2) => {
                let len = usize::try_from(r.varint().ok()?).ok()?;
                // Where the data's bytes start, in the prefix and so in
                // the frame.
                let start = prefix.len() - r.0.len();
                return (start.checked_add(len)? == frame_len)
                    .then_some(stream_id)
                    .flatten();
            }
            _ => return None,
        }
    }
}

impl<'a> Reader<'a> {
    /// A length-delimited value whose key was just read.
    fn field_bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint().ok()?).ok()?;
        self.skip(len).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Frame;
    use super::*;

    #[test]
    fn a_data_frame_is_routed_by_its_first_bytes() {
        let f = Frame::data("0f8fad5b-d9cb-469f-a165-70867728950e", 7, vec![9u8; 70_000]);
        let bytes = f.encode();
        for cut in [60, 80, 200] {
            assert_eq!(
                data_stream_id(&bytes[..cut], bytes.len()),
                Some("0f8fad5b-d9cb-469f-a165-70867728950e"),
                "prefix of {cut}"
            );
        }
        // Too short to see the data field's length.
        assert_eq!(data_stream_id(&bytes[..20], bytes.len()), None);
        // Anything after the data: not routed by its start.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0x42, 0x00]);
        assert_eq!(data_stream_id(&longer[..200], longer.len()), None);
    }

    #[test]
    fn other_frames_are_not_routed_by_their_first_bytes() {
        let id = "s1";
        for f in [
            Frame::resume(id),
            Frame::reset(id, "bye"),
            Frame::handshake(id, vec![1, 2, 3]),
        ] {
            let bytes = f.encode();
            assert_eq!(data_stream_id(&bytes, bytes.len()), None, "{f:?}");
        }
        // A data frame with no stream id.
        let bytes = Frame::data("", 1, vec![1, 2, 3]).encode();
        assert_eq!(data_stream_id(&bytes, bytes.len()), None);
    }
}
