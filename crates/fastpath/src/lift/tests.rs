use super::*;
use crate::hot::{decode_lifted, decode_text};

fn data(n: usize) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}

fn write_file(b64: &str) -> String {
    format!(
        r#"{{"id":4,"method":"fs/writeFile","params":{{"path":"file:///tmp/x","dataBase64":"{b64}","followSymlinks":true}}}}"#
    )
}

/// Feeds `text` in pieces of the given sizes (cycled), calling `progress`
/// after each; returns what `finish` gives and the longest the buffer got.
fn feed(text: &[u8], pieces: &[usize]) -> (Finished, usize) {
    let mut lift = HotLift::new();
    let mut buf = Vec::with_capacity(text.len());
    let (mut at, mut k, mut peak) = (0, 0, 0);
    while at < text.len() {
        let n = pieces[k % pieces.len()].min(text.len() - at);
        buf.extend_from_slice(&text[at..at + n]);
        peak = peak.max(buf.len());
        lift.progress(&mut buf);
        at += n;
        k += 1;
    }
    (lift.finish(buf), peak)
}

#[test]
fn base64_arriving_in_pieces_is_decoded_as_it_lands() {
    let bytes = data(3_000_001);
    let b64 = exec_server_protocol::ByteChunk::encode(&bytes);
    let text = write_file(&b64);
    for pieces in [&[65_536usize][..], &[1, 7, 4093, 100_000], &[1 << 20]] {
        let (done, peak) = feed(text.as_bytes(), pieces);
        let Finished::Lifted(lifted) = done else {
            panic!("not lifted with pieces {pieces:?}");
        };
        assert!(lifted.payload == bytes, "payload differs ({pieces:?})");
        assert_eq!(lifted.member, "dataBase64");
        assert_eq!(
            lifted.skeleton,
            write_file("").into_bytes(),
            "skeleton ({pieces:?})"
        );
        assert_eq!(lifted.restore(), text.as_bytes());
        // Never the whole base64 at once: the decoded bytes and one piece.
        let largest = *pieces.iter().max().unwrap_or(&0);
        assert!(
            peak <= bytes.len() + largest + 200,
            "buffer reached {peak} bytes for {} decoded ({pieces:?})",
            bytes.len()
        );
        // Decoded as the whole text would be.
        let (msg, payload) = decode_lifted(lifted).expect("decodes");
        let (whole, whole_payload) = decode_text(text.clone()).expect("decodes");
        assert_eq!(msg, whole);
        assert_eq!(payload, whole_payload);
    }
}

#[test]
fn anything_unexpected_gives_back_the_text_as_received() {
    let b64 = exec_server_protocol::ByteChunk::encode(&data(300_000));
    let n = b64.len();
    let mut cases = Vec::new();
    for at in [0, 5, n / 2, n - 5, n - 1] {
        let mut bad = b64.clone().into_bytes();
        bad[at] = b'!';
        cases.push(write_file(&String::from_utf8(bad).unwrap()));
    }
    cases.push(write_file(&format!(
        "{}\\n{}",
        &b64[..n / 2],
        &b64[n / 2..]
    )));
    cases.push(write_file(&format!("QQ=={}", &b64[4..])));
    cases.push(write_file(&b64[..n - 1]));
    // Ends inside the string, or the member is not in `params`.
    cases.push(write_file(&b64)[..n].to_string());
    cases.push(format!(
        r#"{{"id":1,"method":"fs/writeFile","dataBase64":"{b64}"}}"#
    ));
    // Starts too late to be looked for.
    cases.push(format!(
        r#"{{"id":1,"pad":"{}","method":"fs/writeFile","params":{{"dataBase64":"{b64}"}}}}"#,
        "x".repeat(SEARCH_LIMIT_BYTES)
    ));
    for (i, text) in cases.iter().enumerate() {
        // Small steps (each decoded through scratch) and one large one
        // (most of it decoded straight into place).
        for pieces in [&[4096usize][..], &[3, 65_537], &[1 << 20]] {
            let (done, _) = feed(text.as_bytes(), pieces);
            assert_eq!(
                done,
                Finished::Text(text.clone().into_bytes()),
                "case {i} with pieces {pieces:?}"
            );
        }
    }
}

#[test]
fn a_lifted_message_that_is_not_a_hot_request_decodes_as_sent() {
    let bytes = data(100_000);
    let b64 = exec_server_protocol::ByteChunk::encode(&bytes);
    let texts = [
        // Not a hot method; the wrong member for the method; a duplicate key.
        format!(r#"{{"id":1,"method":"process/start","params":{{"chunk":"{b64}"}}}}"#),
        format!(r#"{{"id":1,"method":"fs/writeFile","params":{{"chunk":"{b64}"}}}}"#),
        format!(r#"{{"id":1,"id":2,"method":"fs/writeBlock","params":{{"chunk":"{b64}"}}}}"#),
        // Method after params: still taken.
        format!(
            r#"{{"params":{{"handleId":"h","offset":0,"chunk":"{b64}"}},"id":1,"method":"fs/writeBlock"}}"#
        ),
    ];
    for text in texts {
        let (done, _) = feed(text.as_bytes(), &[8192]);
        let Finished::Lifted(lifted) = done else {
            panic!("lifted: {}", &text[..60]);
        };
        let got = decode_lifted(lifted).map_err(|e| e.to_string());
        let want = decode_text(text.clone()).map_err(|e| e.to_string());
        assert_eq!(got, want, "{}", &text[..60]);
    }
}
