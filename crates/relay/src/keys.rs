//! Static identities, public keys in the registry's JSON form, and the prologue
//! that binds a handshake to one environment, registration and stream.

use crate::random::Randomness;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use clatter::bytearray::{HeapArray, SensitiveByteArray};
use clatter::crypto::dh::X25519;
use clatter::crypto::kem::rust_crypto_ml_kem::MlKem768;
use clatter::traits::{Dh, Kem};
use clatter::KeyPair;
use serde::{Deserialize, Serialize};

/// The suite tag carried in key JSON (wire name of field `suite`). Not the
/// hashed protocol name: that one says `25519`, this one `X25519`.
pub const SUITE: &str = "Noise_hybridIK_X25519+MLKEM768_AESGCM_SHA256";
/// The registry's `security_profile` for this channel.
pub const SECURITY_PROFILE: &str = "noise_hybrid_ik_v1";
/// First prologue part.
pub const PROLOGUE_DOMAIN: &[u8] = b"codex-exec-server-relay-noise/v1";

/// ML-KEM-768 encapsulation (public) key: 1184 bytes.
pub const KEM_PUBLIC_KEY_LEN: usize = 1184;
/// ML-KEM-768 ciphertext: 1088 bytes.
pub const KEM_CIPHERTEXT_LEN: usize = 1088;

/// A public key: X25519 (32 bytes) and ML-KEM-768 encapsulation key (1184 bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// X25519 public key.
    pub x25519: [u8; 32],
    /// ML-KEM-768 encapsulation key.
    pub mlkem768: Vec<u8>,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Whole identities in logs make correlation easy; a short prefix suffices.
        write!(
            f,
            "PublicKey({:02x}{:02x}{:02x}{:02x}…)",
            self.x25519[0], self.x25519[1], self.x25519[2], self.x25519[3]
        )
    }
}

/// The JSON form (`NoiseChannelPublicKey`): `{"suite", "x25519_public_key",
/// "mlkem768_public_key"}`, standard base64 with padding, unknown fields refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WirePublicKey {
    /// Always [`SUITE`].
    pub suite: String,
    /// base64 of 32 bytes.
    pub x25519_public_key: String,
    /// base64 of 1184 bytes.
    pub mlkem768_public_key: String,
}

/// A key in JSON that is not a key of this suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// `suite` is not [`SUITE`].
    #[error("unsupported Noise channel suite")]
    Suite,
    /// Not base64, or the wrong length.
    #[error("invalid public key encoding")]
    Encoding,
}

impl PublicKey {
    /// The JSON form.
    pub fn to_wire(&self) -> WirePublicKey {
        WirePublicKey {
            suite: SUITE.into(),
            x25519_public_key: STANDARD.encode(self.x25519),
            mlkem768_public_key: STANDARD.encode(&self.mlkem768),
        }
    }

    /// Parses the JSON form, checking suite and lengths.
    pub fn from_wire(w: &WirePublicKey) -> Result<PublicKey, KeyError> {
        if w.suite != SUITE {
            return Err(KeyError::Suite);
        }
        let x = STANDARD
            .decode(&w.x25519_public_key)
            .map_err(|_| KeyError::Encoding)?;
        let k = STANDARD
            .decode(&w.mlkem768_public_key)
            .map_err(|_| KeyError::Encoding)?;
        if k.len() != KEM_PUBLIC_KEY_LEN {
            return Err(KeyError::Encoding);
        }
        Ok(PublicKey {
            x25519: x.try_into().map_err(|_| KeyError::Encoding)?,
            mlkem768: k,
        })
    }
}

/// A static identity: both key pairs (Clatter's types, wiped on drop). One per
/// process, reused across reconnects; never serialized.
#[derive(Clone)]
pub struct Identity {
    pub(crate) dh: KeyPair<[u8; 32], SensitiveByteArray<[u8; 32]>>,
    pub(crate) kem: KeyPair<HeapArray<1184>, SensitiveByteArray<HeapArray<2400>>>,
    public: PublicKey,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// A fresh identity from 96 bytes of `rng`: the X25519 key, then ML-KEM's
    /// seeds d and z (the order Clatter's key generators read them in).
    pub fn generate(rng: &mut dyn Randomness) -> Identity {
        let (dh, kem) = crate::random::drawn::with(rng, 96, || {
            let mut r = crate::random::drawn::Drawn;
            (X25519::genkey_rng(&mut r), MlKem768::genkey_rng(&mut r))
        });
        // Both generators are infallible for these algorithms (they only wrap
        // fixed-size arrays); an error would mean a broken build of Clatter.
        let (Ok(dh), Ok(kem)) = (dh, kem) else {
            std::process::abort();
        };
        Identity {
            public: PublicKey {
                x25519: dh.public,
                mlkem768: clatter::bytearray::ByteArray::as_slice(&kem.public).to_vec(),
            },
            dh,
            kem,
        }
    }

    /// The public half.
    pub fn public_key(&self) -> PublicKey {
        self.public.clone()
    }
}

/// The prologue: four parts, each a u64 big-endian length and its bytes:
/// [`PROLOGUE_DOMAIN`], environment id, executor registration id, stream id.
/// A handshake made for one stream fails on any other.
pub fn prologue(environment_id: &str, executor_registration_id: &str, stream_id: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for part in [
        PROLOGUE_DOMAIN,
        environment_id.as_bytes(),
        executor_registration_id.as_bytes(),
        stream_id.as_bytes(),
    ] {
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}
