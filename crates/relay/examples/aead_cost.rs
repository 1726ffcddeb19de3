//! The CPU a relay stream's encryption costs, whoever relays it: seals and
//! opens `MIB` MiB (default 2048) as the relay does (AES-256-GCM from aws-lc-rs,
//! in place, 61 440-byte records, Noise's nonce layout), and prints the CPU
//! seconds each direction took on this thread.
//!
//! ```text
//! cargo run --release -p exec-server-relay --example aead_cost [MIB]
//! ```
//!
//! Why: a relay stream is sealed by the executor and opened by the client
//! on top of everything a direct connection does. On a machine whose cores
//! are all busy streaming, that CPU is taken from the same budget, so it
//! bounds the relay/direct ratio from above (BENCHMARKS.md).

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};

const RECORD: usize = 61_440;
/// Distinct sealed records opened in turn (about 4 MiB: beyond L2).
const POOL: usize = 64;

/// CPU seconds this thread has used.
fn cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    use nix::sys::time::TimeValLike;
    let u = getrusage(UsageWho::RUSAGE_THREAD).expect("the thread's CPU use");
    (u.user_time() + u.system_time()).num_microseconds() as f64 / 1e6
}

fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; NONCE_LEN];
    b[4..].copy_from_slice(&n.to_be_bytes());
    Nonce::assume_unique_for_key(b)
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2048);
    let key = || LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7u8; 32]).expect("32-byte key"));
    let (seal, open) = (key(), key());
    let records = (mib << 20).div_ceil(RECORD);
    let mut buf = vec![0u8; RECORD];
    let c = cpu_seconds();
    // Every record sealed in the same buffer: the cipher's cost alone, with
    // the data in cache as the relay's freshly copied record is.
    for n in 0..records as u64 {
        let tag = seal
            .seal_in_place_separate_tag(nonce(n), Aad::empty(), &mut buf)
            .expect("seal");
        let _ = std::hint::black_box(tag);
    }
    let sealed = cpu_seconds() - c;
    // Opening destroys a record, so each is first copied from a pool of
    // sealed ones; the copies alone are timed too and taken off.
    let mut pool = Vec::with_capacity(POOL);
    for n in 0..POOL as u64 {
        let mut r = vec![0u8; RECORD];
        let tag = seal
            .seal_in_place_separate_tag(nonce(n), Aad::empty(), &mut r)
            .expect("seal");
        r.extend_from_slice(tag.as_ref());
        pool.push(r);
    }
    let mut work = vec![0u8; RECORD + 16];
    let copy_only = {
        let c = cpu_seconds();
        for i in 0..records {
            work.copy_from_slice(&pool[i % POOL]);
            std::hint::black_box(&mut work);
        }
        cpu_seconds() - c
    };
    let c = cpu_seconds();
    for i in 0..records {
        work.copy_from_slice(&pool[i % POOL]);
        open.open_within(nonce((i % POOL) as u64), Aad::empty(), &mut work, 0..)
            .expect("open");
    }
    let opened = cpu_seconds() - c - copy_only;
    let gb = (records * RECORD) as f64 / 1e9;
    println!(
        "{mib} MiB in {records} records of {RECORD} bytes: seal {:.3} CPU-s ({:.2} GB/s), open {opened:.3} CPU-s ({:.2} GB/s), both {:.3} CPU-s",
        sealed,
        gb / sealed,
        gb / opened,
        sealed + opened
    );
}
