//! The public-key primitives the channel needs and `ring` lacks: X25519 with
//! static keys, ML-KEM-768, and the SHA-3 family ML-KEM is built on.
//!
//! They exist because this build machine cannot fetch Clatter (the reference's
//! Noise library) or RustCrypto's `ml-kem`/`x25519-dalek`; each module follows
//! its standard step by step and is tested against the standard's vectors, and
//! the whole channel against the reference binary. Swapping in those crates
//! later touches only this module and `noise.rs`.

pub mod keccak;
pub mod mlkem;
pub mod x25519;
