//! A mutational fuzzer (stable Rust) for what a relay peer controls: the frame
//! decoder and validator, and one established stream's receive side (reorder
//! window, Noise record layer, message reassembly). It mutates real frames and
//! checks that nothing panics, that every accepted frame re-encodes to a frame
//! that decodes the same, and that a tampered record never yields a message.
//!
//! `cargo run --release -p exec-server-relay --example fuzz_relay -- --seconds 600`

use exec_server_relay::frame::{Body, Frame};
use exec_server_relay::keys::{prologue, Identity};
use exec_server_relay::noise::{Initiator, PendingResponder, TransportCipher};
use exec_server_relay::random::SeededRandom;
use exec_server_relay::stream::{halves, RecvHalf, SendHalf};
use std::time::{Duration, Instant};

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
        match rng.below(5) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next() as u8);
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            3 => {
                let i = rng.below(v.len() + 1);
                v.truncate(i);
            }
            _ => {
                // A huge varint length, the classic decoder trap.
                let i = rng.below(v.len() + 1);
                v.splice(i..i, [0x22, 0xff, 0xff, 0xff, 0xff, 0x0f]);
            }
        }
    }
    v
}

fn stream_pair() -> (SendHalf, RecvHalf) {
    let mut rng = SeededRandom::new(b"fuzz");
    let h = Identity::generate(&mut rng);
    let e = Identity::generate(&mut rng);
    let p = prologue("env", "reg", "s");
    let (init, msg1) = Initiator::start(&h, &e.public_key(), &p, b"auth", &mut rng).unwrap();
    let pending = PendingResponder::read_request(&e, &p, &msg1).unwrap();
    let (exec_t, msg2) = pending.complete(&mut rng, TransportCipher::AesGcm).unwrap();
    let harness_t = init.finish(&msg2, TransportCipher::AesGcm).unwrap();
    let (send, _) = halves("s", harness_t);
    let (_, recv) = halves("s", exec_t);
    (send, recv)
}

fn main() {
    let seconds: u64 = std::env::args()
        .skip_while(|a| a != "--seconds")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let corpus: Vec<Vec<u8>> = vec![
        Frame::resume("0f8fad5b-d9cb-469f-a165-70867728950e").encode(),
        Frame::data("s", 7, vec![1; 40]).encode(),
        Frame::reset("s", "noise_relay_protocol_error").encode(),
        Frame::handshake("s", vec![9; 100]).encode(),
    ];
    let (mut send, mut recv) = stream_pair();
    let (mut frames, mut accepted, mut records) = (0u64, 0u64, 0u64);
    while Instant::now() < deadline {
        for _ in 0..1000 {
            let pick = rng.below(corpus.len());
            let input = mutate(&mut rng, &corpus[pick]);
            frames += 1;
            if let Ok(f) = Frame::decode(&input) {
                let again = Frame::decode(&f.encode()).expect("re-encoded frame decodes");
                assert_eq!(again, f, "re-encoding changed a frame");
                if f.validate().is_ok() {
                    accepted += 1;
                }
            }
        }
        // Stream receive side: one good message as frames, mutated.
        let msg = vec![b'm'; 1 + rng.below(150_000)];
        for f in send.seal(&msg).unwrap() {
            let f = if rng.below(4) == 0 {
                mutate(&mut rng, &f)
            } else {
                f.to_vec()
            };
            records += 1;
            let Ok(Frame {
                body: Some(Body::Data { seq, payload, .. }),
                ..
            }) = Frame::decode(&f)
            else {
                continue;
            };
            match recv.open(seq, payload) {
                Ok(msgs) => {
                    for m in msgs {
                        assert!(
                            m.iter().all(|&b| b == b'm'),
                            "a tampered record produced a message"
                        );
                    }
                }
                Err(_) => {
                    // The stream is torn down in real use; start a fresh one.
                    (send, recv) = stream_pair();
                    break;
                }
            }
        }
    }
    println!("fuzz_relay: {frames} frames ({accepted} valid), {records} records, no panics");
}
