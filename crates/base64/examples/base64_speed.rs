//! Base64 throughput of this crate's codec against `base64-simd` alone, on
//! this CPU, for buffers that fit in a core's cache and ones that do not.
//! Prints GB/s of input, best of several rounds.
//!
//! `cargo run --release -p exec-server-base64 --example base64_speed`

use base64_simd::AsOut;
use exec_server_base64 as base64_codec;
use std::hint::black_box;
use std::time::Instant;

/// Best GB/s over 7 rounds of `reps` calls of `f` on `bytes` of input.
fn best(bytes: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            (bytes * reps) as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

fn main() {
    for size in [64 << 10, 1 << 20, 16 << 20] {
        let data: Vec<u8> = (0..size as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let reps = (256 << 20) / size;
        let mut text = String::new();
        let ours_enc = best(size, reps, || {
            text.clear();
            base64_codec::encode_append(black_box(&data), &mut text);
        });
        let simd_enc = best(size, reps, || {
            text.clear();
            base64_simd::STANDARD.encode_append(black_box(&data), &mut text);
        });
        let mut out = vec![0u8; size + 3];
        let ours_dec = best(text.len(), reps, || {
            black_box(base64_codec::decode(black_box(text.as_bytes()), &mut out));
        });
        let simd_dec = best(text.len(), reps, || {
            let r = base64_simd::STANDARD
                .decode(black_box(text.as_bytes()), out.as_mut_slice().as_out());
            black_box(r.is_ok());
        });
        println!(
            "{:>6} KiB  encode: ours {ours_enc:5.1} GB/s, base64-simd {simd_enc:5.1}   decode: ours {ours_dec:5.1} GB/s, base64-simd {simd_dec:5.1}",
            size >> 10
        );
    }
}
