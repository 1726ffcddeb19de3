//! Remote mode's transport, with no knowledge of JSON-RPC: the rendezvous
//! relay's frames ([`frame`]), the Noise `hybridIK` channel ([`noise`], [`keys`]),
//! and how one stream's byte messages become ordered encrypted records
//! ([`records`], [`ordered`]).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod api;
pub mod buffers;
pub mod causes;
pub mod environment_id;
pub mod executor;
pub mod frame;
pub mod harness;
pub mod keys;
pub mod noise;
pub mod ordered;
pub mod random;
pub mod records;
pub mod registry;
pub mod registry_client;
pub mod socket;
pub mod stream;
mod stream_send;
#[doc(hidden)]
pub mod testing;
pub mod tls;

/// Most relay frames a socket writer (executor or node) writes behind one
/// another before it flushes: 16. A writer sends what is already queued
/// with the frame it waited for, so a running stream makes fewer, larger
/// socket writes; an idle one still flushes each frame at once.
const MAX_FRAMES_PER_FLUSH: usize = 16;

pub use keys::{Identity, PublicKey, WirePublicKey};
pub use noise::{Initiator, NoiseError, PendingResponder, Transport, TransportCipher};
pub use random::{OsRandom, Randomness};
