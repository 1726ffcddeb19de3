//! Remote mode's transport, with no knowledge of JSON-RPC: the rendezvous
//! relay's frames ([`frame`]), the Noise `hybridIK` channel ([`noise`], [`keys`]),
//! and how one stream's byte messages become ordered encrypted records
//! ([`records`], [`ordered`]).
#![deny(missing_docs)]

pub mod crypto;
pub mod frame;
pub mod keys;
pub mod noise;
pub mod ordered;
pub mod records;

pub use keys::{Identity, PublicKey, WirePublicKey};
pub use noise::{Initiator, NoiseError, OsRandom, PendingResponder, Randomness, Transport};
