//! A mutational fuzzer for the bounded decoder and envelope classification that
//! runs on stable Rust: it starts from a corpus of real messages, mutates them
//! (bit flips, byte insertions and deletions, splices, deep nesting, repeated keys)
//! and checks that decoding never panics, that every accepted message
//! re-encodes and decodes to the same value, and that the hot requests' fast
//! path (`hot::decode_text`) gives what the plain decoder gives.
//!
//! `cargo run --release -p exec-server-fastpath --example fuzz_decode -- --seconds 600`

use exec_server_protocol::{decode_params, types, Message};
use std::time::{Duration, Instant};

const CORPUS: &[&str] = &[
    r#"{"id":1,"method":"initialize","params":{"clientName":"c"}}"#,
    r#"{"method":"initialized"}"#,
    r#"{"id":"x","method":"process/start","params":{"processId":"p","argv":["sh","-c","echo"],"cwd":"file:///tmp","env":{"A":"1"},"tty":false,"pipeStdin":true}}"#,
    r#"{"id":2,"method":"process/read","params":{"processId":"p","afterSeq":3,"maxBytes":10,"waitMs":100}}"#,
    r#"{"id":3,"method":"process/write","params":{"processId":"p","chunk":"aGVsbG8=","writeId":"w"}}"#,
    r#"{"id":4,"result":{"status":"ready"}}"#,
    r#"{"error":{"code":-32600,"message":"x"},"id":-1}"#,
    r#"{"method":"process/output","params":{"processId":"p","seq":1,"stream":"stdout","chunk":"AAEC"}}"#,
    r#"{"id":5,"method":"fs/walk","params":{"path":"file:///","options":{"maxDepth":1,"maxDirectories":1,"maxEntries":1,"followDirectorySymlinks":false}}}"#,
    r#"[1,{"a":[true,false,null,1.5e10,"\u00e9"]}]"#,
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..=rng.below(4) {
        match rng.below(8) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(v.len() + 1);
                let b = b"{}[]\",:0123456789-.eEtrufalsn\\ "[rng.below(31)];
                v.insert(i, b);
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            3 => {
                let other = CORPUS[rng.below(CORPUS.len())].as_bytes();
                let i = rng.below(v.len() + 1);
                let j = rng.below(other.len() + 1);
                v.truncate(i);
                v.extend_from_slice(&other[j..]);
            }
            4 => {
                let depth = rng.below(300);
                let mut s = "[".repeat(depth).into_bytes();
                s.extend(std::iter::repeat_n(b']', depth));
                let i = rng.below(v.len() + 1);
                v.splice(i..i, s);
            }
            5 => {
                let i = rng.below(v.len() + 1);
                v.splice(i..i, br#""id":1,"id":2,"#.iter().copied());
            }
            6 => {
                let i = rng.below(v.len() + 1);
                let n = rng.below(2000);
                let mut s = b"[".to_vec();
                for k in 0..n {
                    if k > 0 {
                        s.push(b',');
                    }
                    s.push(b'0');
                }
                s.push(b']');
                v.splice(i..i, s);
            }
            _ => {}
        }
    }
    v
}

/// The hot path agrees with the plain decoder: the same error text, or the
/// same message once the lifted bytes are put back as base64.
fn check_hot(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let plain = Message::decode(input);
    match (
        exec_server_fastpath::hot::decode_text(text.to_owned()),
        plain,
    ) {
        (Err(h), Err(p)) => assert_eq!(h.to_string(), p.to_string(), "errors differ"),
        (Ok((mut msg, payload)), Ok(p)) => {
            if let (Some(bytes), Message::Request(r)) = (payload, &mut msg) {
                let member = exec_server_fastpath::hot::HOT_METHODS
                    .iter()
                    .find(|(m, _)| *m == r.method)
                    .map(|(_, member)| *member)
                    .expect("only hot methods lift");
                if let serde_json::Value::Object(m) = &mut r.params {
                    let b64 = exec_server_protocol::ByteChunk::from(bytes.to_vec());
                    m.insert(member.into(), serde_json::to_value(b64).expect("encodes"));
                }
            }
            assert_eq!(msg, p, "the hot path changed the message");
        }
        (h, p) => panic!("hot path {:?} but plain decoder {:?}", h.is_ok(), p.is_ok()),
    }
}

fn check(input: &[u8], budget: usize) -> bool {
    check_hot(input);
    match Message::decode_with_budget(input, budget) {
        Ok(msg) => {
            let text = msg.encode();
            let again = Message::decode(text.as_bytes()).expect("re-encoded message must decode");
            assert_eq!(again, msg, "round trip changed the message");
            if let Message::Request(r) = msg {
                // Params decoding must not panic either, whatever the method.
                let _ = decode_params::<types::ExecParams>(r.params.clone());
                let _ = decode_params::<types::ReadParams>(r.params.clone());
                let _ = decode_params::<types::WalkParams>(r.params.clone());
                let _ = decode_params::<types::HttpRequestParams>(r.params);
            }
            true
        }
        Err(_) => false,
    }
}

fn main() {
    let mut seconds = 10u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--seconds" {
            seconds = args.next().and_then(|s| s.parse().ok()).unwrap_or(seconds);
        }
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    let mut rng = Rng(seed);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let (mut execs, mut accepted) = (0u64, 0u64);
    let mut pool: Vec<Vec<u8>> = CORPUS.iter().map(|s| s.as_bytes().to_vec()).collect();
    // Hot requests long enough for the fast path (at least 16 KiB of base64).
    let data: Vec<u8> = (0..13_000u32).map(|i| (i * 31 % 256) as u8).collect();
    let b64 = exec_server_protocol::ByteChunk::encode(&data);
    for (method, member) in exec_server_fastpath::hot::HOT_METHODS {
        pool.push(
            format!(r#"{{"id":9,"method":"{method}","params":{{"handleId":"h","{member}":"{b64}","offset":0}}}}"#)
                .into_bytes(),
        );
    }
    while Instant::now() < deadline {
        for _ in 0..1000 {
            let base = &pool[rng.below(pool.len())];
            let input = mutate(&mut rng, base);
            let budget = if rng.below(4) == 0 {
                rng.below(64)
            } else {
                exec_server_protocol::MAX_JSONRPC_VALUE_NODES
            };
            if check(&input, budget) {
                accepted += 1;
                if pool.len() < 4096 && rng.below(16) == 0 {
                    pool.push(input);
                }
            }
            execs += 1;
        }
    }
    println!(
        "fuzz_decode: {execs} executions in {:.1} s, {accepted} accepted, 0 crashes (seed {seed})",
        started.elapsed().as_secs_f64()
    );
}
