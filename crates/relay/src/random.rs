//! Randomness for keys and handshakes: the OS generator in production, a
//! seeded stream in tests, and the bridge that hands a caller's generator
//! to Clatter ([`drawn`]).

/// A source of randomness: the OS in production, a fixed stream in the golden test.
pub trait Randomness {
    /// Fills `out` with random bytes.
    fn fill(&mut self, out: &mut [u8]);
}

/// The operating system's generator (`ring::rand::SystemRandom`).
pub struct OsRandom;

impl Randomness for OsRandom {
    fn fill(&mut self, out: &mut [u8]) {
        use ring::rand::SecureRandom;
        // The OS generator does not fail on Linux once the process runs; if it
        // ever did, continuing with predictable keys would be worse than aborting.
        if ring::rand::SystemRandom::new().fill(out).is_err() {
            std::process::abort();
        }
    }
}

/// A deterministic byte stream (SHAKE256 of a seed) for tests and the golden test.
pub struct SeededRandom(sha3::Shake256Reader);

impl SeededRandom {
    /// The stream for `seed`. Never use outside tests: anyone knowing the seed
    /// knows every key.
    pub fn new(seed: &[u8]) -> SeededRandom {
        use sha3::digest::{ExtendableOutput, Update};
        let mut h = sha3::Shake256::default();
        h.update(seed);
        SeededRandom(h.finalize_xof())
    }
}

impl Randomness for SeededRandom {
    fn fill(&mut self, out: &mut [u8]) {
        sha3::digest::XofReader::read(&mut self.0, out);
    }
}

pub(crate) mod drawn {
    //! Clatter builds its generator with `Default` inside the handshake, so a
    //! caller's [`Randomness`] cannot be handed in. Instead the bytes one step
    //! needs are drawn from it up front into a thread-local buffer that
    //! [`Drawn`] hands out; Clatter's calls are synchronous, so nothing else on
    //! the thread can interleave. Should a step ever ask for more than was
    //! drawn, the rest comes from the OS (the golden test would then fail).

    use super::{OsRandom, Randomness};
    use clatter::rand_core::{impls, CryptoRng, Error, RngCore};
    use std::cell::RefCell;

    thread_local! {
        static BUFFER: RefCell<(Vec<u8>, usize)> = const { RefCell::new((Vec::new(), 0)) };
    }

    /// The generator Clatter sees.
    #[derive(Default, Clone)]
    pub(crate) struct Drawn;

    impl RngCore for Drawn {
        fn next_u32(&mut self) -> u32 {
            impls::next_u32_via_fill(self)
        }
        fn next_u64(&mut self) -> u64 {
            impls::next_u64_via_fill(self)
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            let filled = BUFFER.with(|b| {
                let (buf, at) = &mut *b.borrow_mut();
                let n = dest.len().min(buf.len() - *at);
                dest[..n].copy_from_slice(&buf[*at..*at + n]);
                *at += n;
                n
            });
            if filled < dest.len() {
                OsRandom.fill(&mut dest[filled..]);
            }
        }
        fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), Error> {
            self.fill_bytes(dest);
            Ok(())
        }
    }

    impl CryptoRng for Drawn {}

    /// Runs `f` with `n` bytes drawn from `rng` available to [`Drawn`]; the
    /// buffer is wiped afterwards.
    pub(crate) fn with<T>(rng: &mut dyn Randomness, n: usize, f: impl FnOnce() -> T) -> T {
        let mut bytes = vec![0u8; n];
        rng.fill(&mut bytes);
        BUFFER.with(|b| *b.borrow_mut() = (bytes, 0));
        let out = f();
        BUFFER.with(|b| {
            let (buf, at) = &mut *b.borrow_mut();
            buf.iter_mut().for_each(|x| *x = 0);
            buf.clear();
            *at = 0;
        });
        out
    }
}
