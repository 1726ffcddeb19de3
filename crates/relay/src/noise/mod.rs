//! The Noise `hybridIK` channel of the reference's relay, built on Clatter
//! (`HybridHandshakeCore<X25519, MlKem768, MlKem768, AesGcm, Sha256>` with the
//! pattern `noise_hybrid_ik`, protocol name
//! `Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256`), as the reference is:
//!
//! ```text
//! <- s                                 (responder's X25519 + ML-KEM keys, pinned)
//! -> skem, e, es, s, ss   + payload    (msg1: 3568 bytes + payload)
//! <- ekem, skem, e, ee, se + empty     (msg2: 3424 bytes)
//! ```
//!
//! The initiator is the harness, the responder the executor. The responder reads
//! msg1 into a [`PendingResponder`] (the initiator's static key is then known
//! and authenticated), asks the registry whether that key may connect, and only
//! then writes msg2 with [`PendingResponder::complete`]. Both ends then hold a
//! [`Transport`]: records with implicit nonces 0, 1, 2… per direction, in
//! AES-256-GCM (the reference's) or, when our harness offered it and our
//! executor took it, AEGIS-256X2 (`transport.rs`, [`TransportCipher`]).
//!
//! This module checks every length before handing bytes to Clatter, because
//! Clatter panics (rather than failing) on oversized messages and short records.

use crate::keys::{Identity, PublicKey, KEM_CIPHERTEXT_LEN, KEM_PUBLIC_KEY_LEN};
use crate::random::{drawn, Randomness};
use clatter::bytearray::{ByteArray, HeapArray};
use clatter::crypto::cipher::AesGcm;
use clatter::crypto::dh::X25519;
use clatter::crypto::hash::Sha256;
use clatter::crypto::kem::rust_crypto_ml_kem::MlKem768;
use clatter::error::HandshakeError;
use clatter::handshakepattern::noise_hybrid_ik;
use clatter::traits::Handshaker;
use clatter::{HybridHandshakeCore, HybridHandshakeParams};

mod transport;
use transport::transport;
pub use transport::{CipherState, Opener, Sealer, Transport, TransportCipher, AEGIS256X2_KEY_INFO};

/// The protocol name hashed into the initial state (note `25519`, not `X25519`).
pub const PROTOCOL_NAME: &str = "Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256";
/// Largest Noise message, handshake or transport: 65 535 bytes.
pub const MAX_MESSAGE_LEN: usize = 65_535;
/// AES-GCM tag: 16 bytes.
pub const TAG_LEN: usize = 16;
/// msg1 without its payload: 3568 bytes.
pub const MSG1_OVERHEAD: usize = KEM_CIPHERTEXT_LEN
    + 32
    + KEM_PUBLIC_KEY_LEN
    + 32
    + TAG_LEN
    + KEM_PUBLIC_KEY_LEN
    + TAG_LEN
    + TAG_LEN;
/// msg2 (empty payload): 3424 bytes.
pub const MSG2_LEN: usize =
    KEM_CIPHERTEXT_LEN + KEM_CIPHERTEXT_LEN + TAG_LEN + 32 + KEM_PUBLIC_KEY_LEN + TAG_LEN;
/// Records per direction before the transport refuses to go on (as the
/// reference: `u32::MAX`), far from the nonce's 2^64 limit.
pub const MAX_RECORDS_PER_DIRECTION: u64 = u32::MAX as u64;

/// Random bytes msg1 consumes: the `skem` encapsulation (32), the ephemeral
/// X25519 key (32) and the ephemeral ML-KEM seeds d and z (64).
const MSG1_RANDOM: usize = 128;
/// Random bytes msg2 consumes: two encapsulations and an ephemeral pair.
const MSG2_RANDOM: usize = 160;

/// Why a handshake or record failed. None of these say which byte was wrong:
/// the peer is not told more than "no".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoiseError {
    /// A message has the wrong size.
    #[error("noise message has the wrong length")]
    Length,
    /// Authentication failed (wrong keys, prologue, or tampered bytes).
    #[error("noise message failed to decrypt")]
    Decrypt,
    /// A key in a message is not a valid encoding.
    #[error("noise message carries an invalid key")]
    InvalidKey,
    /// msg2 carried a payload (v1 requires it empty).
    #[error("noise handshake response payload must be empty")]
    NonEmptyResponse,
    /// The record counter reached [`MAX_RECORDS_PER_DIRECTION`].
    #[error("noise transport record counter exhausted")]
    Exhausted,
}

impl From<HandshakeError> for NoiseError {
    fn from(e: HandshakeError) -> NoiseError {
        match e {
            HandshakeError::InvalidMessage | HandshakeError::BufferTooSmall => NoiseError::Length,
            HandshakeError::Kem(_) | HandshakeError::Dh(_) => NoiseError::InvalidKey,
            _ => NoiseError::Decrypt,
        }
    }
}

type Handshake = HybridHandshakeCore<X25519, MlKem768, MlKem768, AesGcm, Sha256, drawn::Drawn>;
type Params<'a> = HybridHandshakeParams<'a, X25519, MlKem768, MlKem768>;

fn kem_public(key: &PublicKey) -> Result<HeapArray<KEM_PUBLIC_KEY_LEN>, NoiseError> {
    if key.mlkem768.len() != KEM_PUBLIC_KEY_LEN {
        return Err(NoiseError::InvalidKey);
    }
    Ok(HeapArray::from_slice(&key.mlkem768))
}

fn params<'a>(identity: &Identity, prologue: &'a [u8], initiator: bool) -> Params<'a> {
    Params::new(noise_hybrid_ik(), initiator)
        .with_prologue(prologue)
        .with_s(identity.dh.clone())
        .with_s_kem(identity.kem.clone())
}

/// The harness between msg1 and msg2.
pub struct Initiator {
    hs: Box<Handshake>,
}

impl Initiator {
    /// Writes msg1 to the responder whose keys are `responder` (pinned from the
    /// registry), carrying `payload` (the registry's harness authorization)
    /// encrypted. Errors: [`NoiseError::InvalidKey`] for a malformed responder key,
    /// [`NoiseError::Length`] when the message would exceed 65 535 bytes.
    pub fn start(
        identity: &Identity,
        responder: &PublicKey,
        prologue: &[u8],
        payload: &[u8],
        rng: &mut dyn Randomness,
    ) -> Result<(Initiator, Vec<u8>), NoiseError> {
        if MSG1_OVERHEAD + payload.len() > MAX_MESSAGE_LEN {
            return Err(NoiseError::Length);
        }
        let p = params(identity, prologue, true)
            .with_rs(responder.x25519)
            .with_rs_kem(kem_public(responder)?);
        let mut hs = Box::new(Handshake::new(p)?);
        let mut out = vec![0u8; MSG1_OVERHEAD + payload.len()];
        let n = drawn::with(rng, MSG1_RANDOM, || hs.write_message(payload, &mut out))?;
        out.truncate(n);
        Ok((Initiator { hs }, out))
    }

    /// Reads msg2 and enters transport mode with records in `cipher` (what
    /// the executor's msg2 frame named). Errors: [`NoiseError::Length`],
    /// [`NoiseError::Decrypt`] (not the pinned executor, or tampered),
    /// [`NoiseError::NonEmptyResponse`].
    pub fn finish(mut self, msg2: &[u8], cipher: TransportCipher) -> Result<Transport, NoiseError> {
        // A msg2 with a payload is longer than MSG2_LEN; v1 never sends one.
        if msg2.len() != MSG2_LEN {
            return Err(NoiseError::Length);
        }
        self.hs.read_message(msg2, &mut [])?;
        let states = self.hs.finalize()?.take();
        transport(
            states.initiator_to_responder,
            states.responder_to_initiator,
            cipher,
        )
    }
}

/// The executor after authenticating msg1, before deciding to answer.
pub struct PendingResponder {
    hs: Box<Handshake>,
    initiator: PublicKey,
    payload: Vec<u8>,
}

impl PendingResponder {
    /// Reads msg1 with this executor's `identity` and the stream's `prologue`.
    /// Errors: [`NoiseError::Length`], [`NoiseError::Decrypt`] (another
    /// prologue or executor key, or tampered bytes).
    pub fn read_request(
        identity: &Identity,
        prologue: &[u8],
        msg1: &[u8],
    ) -> Result<PendingResponder, NoiseError> {
        if msg1.len() < MSG1_OVERHEAD || msg1.len() > MAX_MESSAGE_LEN {
            return Err(NoiseError::Length);
        }
        let p = params(identity, prologue, false);
        let mut hs = Box::new(Handshake::new(p)?);
        let mut payload = vec![0u8; msg1.len() - MSG1_OVERHEAD];
        let n = hs.read_message(msg1, &mut payload)?;
        payload.truncate(n);
        let rs = hs.get_remote_static().ok_or(NoiseError::Decrypt)?;
        let initiator = PublicKey {
            x25519: *rs.dh(),
            mlkem768: rs.kem().as_slice().to_vec(),
        };
        Ok(PendingResponder {
            hs,
            initiator,
            payload,
        })
    }

    /// The initiator's authenticated static key (what `/validate` checks).
    pub fn initiator_key(&self) -> &PublicKey {
        &self.initiator
    }

    /// The decrypted msg1 payload (the harness authorization).
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Writes msg2 (empty payload) and enters transport mode with records
    /// in `cipher` (what the msg2 frame will name). Errors:
    /// [`NoiseError::InvalidKey`] when the initiator's KEM keys are malformed.
    pub fn complete(
        mut self,
        rng: &mut dyn Randomness,
        cipher: TransportCipher,
    ) -> Result<(Transport, Vec<u8>), NoiseError> {
        let mut out = vec![0u8; MSG2_LEN];
        let n = drawn::with(rng, MSG2_RANDOM, || self.hs.write_message(&[], &mut out))?;
        out.truncate(n);
        let states = self.hs.finalize()?.take();
        Ok((
            transport(
                states.responder_to_initiator,
                states.initiator_to_responder,
                cipher,
            )?,
            out,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::prologue;
    use crate::random::SeededRandom;

    fn sha256(parts: &[&[u8]]) -> [u8; 32] {
        let mut c = ring::digest::Context::new(&ring::digest::SHA256);
        for p in parts {
            c.update(p);
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(c.finish().as_ref());
        out
    }

    fn pair(seed: &[u8]) -> (Identity, Identity, SeededRandom) {
        let mut rng = SeededRandom::new(seed);
        let harness = Identity::generate(&mut rng);
        let executor = Identity::generate(&mut rng);
        (harness, executor, rng)
    }

    #[test]
    fn handshake_sizes_keys_and_records() {
        let (harness, executor, mut rng) = pair(b"sizes");
        let p = prologue("env", "reg-1", "stream-1");
        let auth = b"authorization-25-bytes!!!";
        let (init, msg1) =
            Initiator::start(&harness, &executor.public_key(), &p, auth, &mut rng).unwrap();
        assert_eq!(msg1.len(), 3568 + auth.len());
        let pending = PendingResponder::read_request(&executor, &p, &msg1).unwrap();
        assert_eq!(pending.payload(), auth);
        assert_eq!(pending.initiator_key(), &harness.public_key());
        let (mut exec_t, msg2) = pending.complete(&mut rng, TransportCipher::AesGcm).unwrap();
        assert_eq!(msg2.len(), 3424);
        let mut harness_t = init.finish(&msg2, TransportCipher::AesGcm).unwrap();
        for i in 0..3 {
            let c = harness_t.encrypt(format!("ping {i}").as_bytes()).unwrap();
            assert_eq!(c.len(), 6 + 16);
            assert_eq!(exec_t.decrypt(&c).unwrap(), format!("ping {i}").as_bytes());
            let c = exec_t.encrypt(b"pong").unwrap();
            assert_eq!(harness_t.decrypt(&c).unwrap(), b"pong");
        }
    }

    #[test]
    fn another_stream_key_or_tampering_fails() {
        let (harness, executor, mut rng) = pair(b"fail");
        let p = prologue("env", "reg-1", "stream-1");
        let (_, msg1) =
            Initiator::start(&harness, &executor.public_key(), &p, b"a", &mut rng).unwrap();
        let other = prologue("env", "reg-1", "stream-2");
        assert_eq!(
            PendingResponder::read_request(&executor, &other, &msg1).err(),
            Some(NoiseError::Decrypt)
        );
        let stranger = Identity::generate(&mut rng);
        assert_eq!(
            PendingResponder::read_request(&stranger, &p, &msg1).err(),
            Some(NoiseError::Decrypt)
        );
        for at in [0, 1100, 2400, msg1.len() - 1] {
            let mut bad = msg1.clone();
            bad[at] ^= 0x40;
            assert!(
                PendingResponder::read_request(&executor, &p, &bad).is_err(),
                "{at}"
            );
        }
        assert_eq!(
            PendingResponder::read_request(&executor, &p, &msg1[..100]).err(),
            Some(NoiseError::Length)
        );
        assert_eq!(
            PendingResponder::read_request(&executor, &p, &[]).err(),
            Some(NoiseError::Length)
        );
    }

    #[test]
    fn msg2_from_another_executor_and_replayed_records_fail() {
        let (harness, executor, mut rng) = pair(b"replay");
        let p = prologue("env", "reg-1", "s");
        let (init, msg1) =
            Initiator::start(&harness, &executor.public_key(), &p, b"x", &mut rng).unwrap();
        let pending = PendingResponder::read_request(&executor, &p, &msg1).unwrap();
        let (mut exec_t, msg2) = pending.complete(&mut rng, TransportCipher::AesGcm).unwrap();
        let mut bad = msg2.clone();
        bad[3000] ^= 1;
        let (init2, _) =
            Initiator::start(&harness, &executor.public_key(), &p, b"x", &mut rng).unwrap();
        assert!(init2.finish(&bad, TransportCipher::AesGcm).is_err());
        let mut t = init.finish(&msg2, TransportCipher::AesGcm).unwrap();
        let c0 = t.encrypt(b"zero").unwrap();
        let c1 = t.encrypt(b"one").unwrap();
        assert_eq!(exec_t.decrypt(&c0).unwrap(), b"zero");
        // A replayed record no longer decrypts (the nonce moved on); nor does an
        // out-of-order one; the good record still does afterwards.
        assert_eq!(exec_t.decrypt(&c0), Err(NoiseError::Decrypt));
        assert_eq!(exec_t.decrypt(&c1).unwrap(), b"one");
        assert_eq!(exec_t.decrypt(&[0u8; 5]), Err(NoiseError::Length));
    }

    /// Both ends agreeing on AEGIS-256X2 talk; an end that keeps AES-GCM
    /// cannot open what the other seals (the mismatch fails closed).
    #[test]
    fn an_aegis_handshake_talks_and_a_mismatch_fails() {
        let (harness, executor, mut rng) = pair(b"aegis");
        let p = prologue("env", "reg-1", "s");
        for (h, e, talks) in [
            (
                TransportCipher::Aegis256X2,
                TransportCipher::Aegis256X2,
                true,
            ),
            (TransportCipher::AesGcm, TransportCipher::Aegis256X2, false),
            (TransportCipher::Aegis256X2, TransportCipher::AesGcm, false),
        ] {
            let (init, msg1) =
                Initiator::start(&harness, &executor.public_key(), &p, b"x", &mut rng).unwrap();
            let pending = PendingResponder::read_request(&executor, &p, &msg1).unwrap();
            let (mut exec_t, msg2) = pending.complete(&mut rng, e).unwrap();
            assert_eq!(msg2.len(), MSG2_LEN, "msg2 is the reference's either way");
            let mut harness_t = init.finish(&msg2, h).unwrap();
            assert_eq!((harness_t.cipher(), exec_t.cipher()), (h, e));
            let c = harness_t.encrypt(b"ping").unwrap();
            assert_eq!(c.len(), 4 + TAG_LEN);
            let got = exec_t.decrypt(&c);
            let back = exec_t.encrypt(b"pong").map(|c| harness_t.decrypt(&c));
            if talks {
                assert_eq!(got.unwrap(), b"ping");
                assert_eq!(back.unwrap().unwrap(), b"pong");
            } else {
                assert_eq!(got, Err(NoiseError::Decrypt));
                assert_eq!(back.unwrap(), Err(NoiseError::Decrypt));
            }
        }
    }

    /// Pins the handshake bytes under fixed keys and randomness, so a change in
    /// any primitive (or a later swap to Clatter) cannot silently alter the wire.
    #[test]
    fn golden_handshake_bytes() {
        let (harness, executor, mut rng) = pair(b"exec-server golden handshake v1");
        let p = prologue(
            "golden-env",
            "golden-registration",
            "00000000-0000-4000-8000-000000000000",
        );
        let (init, msg1) = Initiator::start(
            &harness,
            &executor.public_key(),
            &p,
            b"golden-authorization",
            &mut rng,
        )
        .unwrap();
        let pending = PendingResponder::read_request(&executor, &p, &msg1).unwrap();
        let (mut exec_t, msg2) = pending.complete(&mut rng, TransportCipher::AesGcm).unwrap();
        let mut harness_t = init.finish(&msg2, TransportCipher::AesGcm).unwrap();
        let record = harness_t.encrypt(b"{\"id\":1}").unwrap();
        assert_eq!(exec_t.decrypt(&record).unwrap(), b"{\"id\":1}");
        let hex = |b: &[u8]| -> String { b.iter().map(|x| format!("{x:02x}")).collect() };
        let got = [
            hex(&sha256(&[
                &executor.public_key().x25519,
                &executor.public_key().mlkem768,
            ])),
            hex(&sha256(&[&msg1])),
            hex(&sha256(&[&msg2])),
            hex(&record),
        ];
        assert_eq!(got, GOLDEN);
    }

    const GOLDEN: [&str; 4] = [
        // SHA-256 of the executor's public keys, of msg1, of msg2; then the first record.
        "b6edf9a1914b7e35ded6fd698ae0bcd33f8f08dc8ad6abb9dd9aeb7ea89401ca",
        "efa5a79a15aff04f070c30d13978d3d55e24f88e648fee3dbdc5e8ec5469e38e",
        "bddfee62fa23ce024c402911e025cad76b1d2c997e1abf32c3cf8b8d9ed45d2d",
        "076cd393997c386a94ededa6e7db29de4a91d3c60a23e414",
    ];
}
