//! The Noise `hybridIK` channel of the reference's relay (Clatter's pattern
//! `noise_hybrid_ik`, protocol name `Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256`):
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
//! [`Transport`]: AES-256-GCM records with implicit nonces 0, 1, 2… per direction.
//!
//! Symmetric primitives come from `ring`; X25519 with static keys and ML-KEM-768
//! from [`crate::crypto`].

use crate::crypto::{mlkem, x25519};
use crate::keys::{Identity, PublicKey};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hmac;

/// The protocol name hashed into the initial state (note `25519`, not `X25519`).
pub const PROTOCOL_NAME: &str = "Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256";
/// Largest Noise message, handshake or transport: 65 535 bytes.
pub const MAX_MESSAGE_LEN: usize = 65_535;
/// AES-GCM tag: 16 bytes.
pub const TAG_LEN: usize = 16;
/// msg1 without its payload: 3568 bytes.
pub const MSG1_OVERHEAD: usize = mlkem::CIPHERTEXT_LEN
    + 32
    + mlkem::PUBLIC_KEY_LEN
    + 32
    + TAG_LEN
    + mlkem::PUBLIC_KEY_LEN
    + TAG_LEN
    + TAG_LEN;
/// msg2 (empty payload): 3424 bytes.
pub const MSG2_LEN: usize =
    mlkem::CIPHERTEXT_LEN + mlkem::CIPHERTEXT_LEN + TAG_LEN + 32 + mlkem::PUBLIC_KEY_LEN + TAG_LEN;
/// Records per direction before the transport refuses to go on (as the
/// reference: `u32::MAX`), far from the nonce's 2^64 limit.
pub const MAX_RECORDS_PER_DIRECTION: u64 = u32::MAX as u64;

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

fn random32(rng: &mut dyn Randomness) -> [u8; 32] {
    let mut b = [0u8; 32];
    rng.fill(&mut b);
    b
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut c = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        c.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(c.finish().as_ref());
    out
}

fn hmac256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mut c = hmac::Context::with_key(&k);
    for p in parts {
        c.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(c.sign().as_ref());
    out
}

/// Noise HKDF with three outputs (the first two are HKDF(…, 2)).
fn hkdf3(ck: &[u8; 32], ikm: &[u8]) -> ([u8; 32], [u8; 32], [u8; 32]) {
    let temp = hmac256(ck, &[ikm]);
    let o1 = hmac256(&temp, &[&[1]]);
    let o2 = hmac256(&temp, &[&o1, &[2]]);
    let o3 = hmac256(&temp, &[&o2, &[3]]);
    (o1, o2, o3)
}

/// One direction's AES-256-GCM key and nonce counter.
pub struct CipherState {
    key: LessSafeKey,
    n: u64,
}

impl CipherState {
    fn new(k: &[u8; 32]) -> CipherState {
        // AES_256_GCM accepts any 32-byte key.
        let unbound = UnboundKey::new(&AES_256_GCM, k).unwrap_or_else(|_| unreachable!());
        CipherState {
            key: LessSafeKey::new(unbound),
            n: 0,
        }
    }

    fn nonce(&self) -> Nonce {
        let mut b = [0u8; 12];
        b[4..].copy_from_slice(&self.n.to_be_bytes());
        Nonce::assume_unique_for_key(b)
    }

    fn encrypt(&mut self, ad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let mut buf = Vec::with_capacity(plaintext.len() + TAG_LEN);
        buf.extend_from_slice(plaintext);
        // Sealing only fails for inputs above AES-GCM's 64 GiB limit.
        let _ = self
            .key
            .seal_in_place_append_tag(self.nonce(), Aad::from(ad), &mut buf);
        self.n += 1;
        buf
    }

    fn decrypt(&mut self, ad: &[u8], ciphertext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        if ciphertext.len() < TAG_LEN {
            return Err(NoiseError::Length);
        }
        let mut buf = ciphertext.to_vec();
        let len = self
            .key
            .open_in_place(self.nonce(), Aad::from(ad), &mut buf)
            .map_err(|_| NoiseError::Decrypt)?
            .len();
        buf.truncate(len);
        self.n += 1;
        Ok(buf)
    }
}

/// Noise SymmetricState.
struct Symmetric {
    h: [u8; 32],
    ck: [u8; 32],
    cipher: Option<CipherState>,
}

impl Symmetric {
    fn new(prologue: &[u8]) -> Symmetric {
        // The name is longer than 32 bytes, so h = HASH(name).
        let h = sha256(&[PROTOCOL_NAME.as_bytes()]);
        let mut s = Symmetric {
            h,
            ck: h,
            cipher: None,
        };
        s.mix_hash(prologue);
        s
    }

    fn mix_hash(&mut self, data: &[u8]) {
        self.h = sha256(&[&self.h, data]);
    }

    fn mix_key(&mut self, ikm: &[u8]) {
        let (ck, k, _) = hkdf3(&self.ck, ikm);
        self.ck = ck;
        self.cipher = Some(CipherState::new(&k));
    }

    fn mix_key_and_hash(&mut self, ikm: &[u8]) {
        let (ck, temp_h, k) = hkdf3(&self.ck, ikm);
        self.ck = ck;
        self.mix_hash(&temp_h);
        self.cipher = Some(CipherState::new(&k));
    }

    fn encrypt_and_hash(&mut self, plaintext: &[u8], out: &mut Vec<u8>) {
        let c = match &mut self.cipher {
            Some(c) => c.encrypt(&self.h, plaintext),
            None => plaintext.to_vec(),
        };
        self.mix_hash(&c);
        out.extend_from_slice(&c);
    }

    fn decrypt_and_hash(&mut self, data: &[u8]) -> Result<Vec<u8>, NoiseError> {
        let p = match &mut self.cipher {
            Some(c) => c.decrypt(&self.h, data)?,
            None => data.to_vec(),
        };
        self.mix_hash(data);
        Ok(p)
    }

    /// (initiator → responder, responder → initiator).
    fn split(&self) -> (CipherState, CipherState) {
        let (k1, k2, _) = hkdf3(&self.ck, &[]);
        (CipherState::new(&k1), CipherState::new(&k2))
    }
}

/// Reads fixed-size pieces off a message.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], NoiseError> {
        if self.0.len() < n {
            return Err(NoiseError::Length);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
}

fn array32(b: &[u8]) -> Result<[u8; 32], NoiseError> {
    b.try_into().map_err(|_| NoiseError::Length)
}

/// An ephemeral X25519 + ML-KEM pair, generated for one handshake.
struct Ephemeral {
    dh_private: [u8; 32],
    dh_public: [u8; 32],
    kem_public: Vec<u8>,
    kem_secret: Vec<u8>,
}

impl Ephemeral {
    fn generate(rng: &mut dyn Randomness) -> Ephemeral {
        let dh_private = random32(rng);
        let (kem_public, kem_secret) = mlkem::keygen(&random32(rng), &random32(rng));
        Ephemeral {
            dh_public: x25519::public_key(&dh_private),
            dh_private,
            kem_public,
            kem_secret,
        }
    }
}

/// The harness between msg1 and msg2.
pub struct Initiator {
    sym: Symmetric,
    identity: Identity,
    e: Ephemeral,
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
        let mut sym = Symmetric::new(prologue);
        sym.mix_hash(&responder.x25519);
        sym.mix_hash(&responder.mlkem768);
        let mut out = Vec::with_capacity(MSG1_OVERHEAD + payload.len());
        // skem
        let (ct, ss) = mlkem::encapsulate(&responder.mlkem768, &random32(rng))
            .map_err(|_| NoiseError::InvalidKey)?;
        sym.encrypt_and_hash(&ct, &mut out);
        sym.mix_key_and_hash(&ss);
        // e
        let e = Ephemeral::generate(rng);
        out.extend_from_slice(&e.dh_public);
        sym.mix_hash(&e.dh_public);
        out.extend_from_slice(&e.kem_public);
        sym.mix_hash(&e.kem_public);
        // es
        sym.mix_key(&x25519::x25519(&e.dh_private, &responder.x25519));
        // s
        let me = identity.public_key();
        sym.encrypt_and_hash(&me.x25519, &mut out);
        sym.encrypt_and_hash(&me.mlkem768, &mut out);
        // ss
        sym.mix_key(&identity.dh(&responder.x25519));
        sym.encrypt_and_hash(payload, &mut out);
        Ok((
            Initiator {
                sym,
                identity: identity.clone(),
                e,
            },
            out,
        ))
    }

    /// Reads msg2 and enters transport mode. Errors: [`NoiseError::Length`],
    /// [`NoiseError::Decrypt`] (not the pinned executor, or tampered),
    /// [`NoiseError::NonEmptyResponse`].
    pub fn finish(mut self, msg2: &[u8]) -> Result<Transport, NoiseError> {
        if msg2.len() != MSG2_LEN {
            return Err(NoiseError::Length);
        }
        let mut r = Reader(msg2);
        let sym = &mut self.sym;
        // ekem
        let ct = r.take(mlkem::CIPHERTEXT_LEN)?;
        sym.mix_hash(ct);
        sym.mix_key(&mlkem::decapsulate(&self.e.kem_secret, ct));
        // skem
        let ct = sym.decrypt_and_hash(r.take(mlkem::CIPHERTEXT_LEN + TAG_LEN)?)?;
        sym.mix_key_and_hash(&self.identity.decapsulate(&ct)?);
        // e
        let re = array32(r.take(32)?)?;
        sym.mix_hash(&re);
        sym.mix_hash(r.take(mlkem::PUBLIC_KEY_LEN)?);
        // ee, se
        sym.mix_key(&x25519::x25519(&self.e.dh_private, &re));
        sym.mix_key(&self.identity.dh(&re));
        let payload = sym.decrypt_and_hash(r.0)?;
        if !payload.is_empty() {
            return Err(NoiseError::NonEmptyResponse);
        }
        let (send, recv) = sym.split();
        Ok(Transport { send, recv })
    }
}

/// The executor after authenticating msg1, before deciding to answer.
pub struct PendingResponder {
    sym: Symmetric,
    re: [u8; 32],
    re_kem: Vec<u8>,
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
        let mut sym = Symmetric::new(prologue);
        let me = identity.public_key();
        sym.mix_hash(&me.x25519);
        sym.mix_hash(&me.mlkem768);
        let mut r = Reader(msg1);
        // skem
        let ct = sym.decrypt_and_hash(r.take(mlkem::CIPHERTEXT_LEN)?)?;
        sym.mix_key_and_hash(&identity.decapsulate(&ct)?);
        // e
        let re = array32(r.take(32)?)?;
        sym.mix_hash(&re);
        let re_kem = r.take(mlkem::PUBLIC_KEY_LEN)?.to_vec();
        sym.mix_hash(&re_kem);
        // es
        sym.mix_key(&identity.dh(&re));
        // s
        let rs = array32(&sym.decrypt_and_hash(r.take(32 + TAG_LEN)?)?)?;
        let rs_kem = sym.decrypt_and_hash(r.take(mlkem::PUBLIC_KEY_LEN + TAG_LEN)?)?;
        // ss
        sym.mix_key(&identity.dh(&rs));
        let payload = sym.decrypt_and_hash(r.0)?;
        Ok(PendingResponder {
            sym,
            re,
            re_kem,
            initiator: PublicKey {
                x25519: rs,
                mlkem768: rs_kem,
            },
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

    /// Writes msg2 (empty payload) and enters transport mode. Errors:
    /// [`NoiseError::InvalidKey`] when the initiator's KEM keys are malformed.
    pub fn complete(
        mut self,
        rng: &mut dyn Randomness,
    ) -> Result<(Transport, Vec<u8>), NoiseError> {
        let sym = &mut self.sym;
        let mut out = Vec::with_capacity(MSG2_LEN);
        // ekem
        let (ct, ss) =
            mlkem::encapsulate(&self.re_kem, &random32(rng)).map_err(|_| NoiseError::InvalidKey)?;
        out.extend_from_slice(&ct);
        sym.mix_hash(&ct);
        sym.mix_key(&ss);
        // skem
        let (ct, ss) = mlkem::encapsulate(&self.initiator.mlkem768, &random32(rng))
            .map_err(|_| NoiseError::InvalidKey)?;
        sym.encrypt_and_hash(&ct, &mut out);
        sym.mix_key_and_hash(&ss);
        // e
        let e = Ephemeral::generate(rng);
        out.extend_from_slice(&e.dh_public);
        sym.mix_hash(&e.dh_public);
        out.extend_from_slice(&e.kem_public);
        sym.mix_hash(&e.kem_public);
        // ee, se
        sym.mix_key(&x25519::x25519(&e.dh_private, &self.re));
        sym.mix_key(&x25519::x25519(&e.dh_private, &self.initiator.x25519));
        sym.encrypt_and_hash(&[], &mut out);
        let (recv, send) = sym.split();
        Ok((Transport { send, recv }, out))
    }
}

/// An established channel: records encrypted in order, decrypted in order.
/// Callers must present received records in sequence (see [`crate::ordered`]).
pub struct Transport {
    send: CipherState,
    recv: CipherState,
}

/// The sending half of a [`Transport`] (see [`Transport::split`]).
pub struct Sealer(CipherState);
/// The receiving half of a [`Transport`].
pub struct Opener(CipherState);

impl Sealer {
    /// As [`Transport::encrypt`].
    pub fn encrypt(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        if plaintext.len() + TAG_LEN > MAX_MESSAGE_LEN {
            return Err(NoiseError::Length);
        }
        if self.0.n >= MAX_RECORDS_PER_DIRECTION {
            return Err(NoiseError::Exhausted);
        }
        Ok(self.0.encrypt(&[], plaintext))
    }
}

impl Opener {
    /// As [`Transport::decrypt`].
    pub fn decrypt(&mut self, ciphertext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        if ciphertext.len() > MAX_MESSAGE_LEN {
            return Err(NoiseError::Length);
        }
        if self.0.n >= MAX_RECORDS_PER_DIRECTION {
            return Err(NoiseError::Exhausted);
        }
        self.0.decrypt(&[], ciphertext)
    }
}

impl Transport {
    /// Separates the directions so a writer task and a reader task can each own one.
    pub fn split(self) -> (Sealer, Opener) {
        (Sealer(self.send), Opener(self.recv))
    }

    /// Encrypts one record (plaintext ≤ 65 519 bytes). Errors:
    /// [`NoiseError::Length`], [`NoiseError::Exhausted`].
    pub fn encrypt(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        if plaintext.len() + TAG_LEN > MAX_MESSAGE_LEN {
            return Err(NoiseError::Length);
        }
        if self.send.n >= MAX_RECORDS_PER_DIRECTION {
            return Err(NoiseError::Exhausted);
        }
        Ok(self.send.encrypt(&[], plaintext))
    }

    /// Decrypts the next record. A failed record leaves the counter where it
    /// was, but the stream should be torn down (the peer is broken or hostile).
    pub fn decrypt(&mut self, ciphertext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        if ciphertext.len() > MAX_MESSAGE_LEN {
            return Err(NoiseError::Length);
        }
        if self.recv.n >= MAX_RECORDS_PER_DIRECTION {
            return Err(NoiseError::Exhausted);
        }
        self.recv.decrypt(&[], ciphertext)
    }
}

/// A deterministic byte stream (SHAKE256 of a seed) for tests and the golden test.
pub struct SeededRandom(crate::crypto::keccak::Sponge);

impl SeededRandom {
    /// The stream for `seed`. Never use outside tests: anyone knowing the seed
    /// knows every key.
    pub fn new(seed: &[u8]) -> SeededRandom {
        let mut s = crate::crypto::keccak::shake256();
        s.absorb(seed);
        SeededRandom(s)
    }
}

impl Randomness for SeededRandom {
    fn fill(&mut self, out: &mut [u8]) {
        self.0.squeeze(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::prologue;

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
        let (mut exec_t, msg2) = pending.complete(&mut rng).unwrap();
        assert_eq!(msg2.len(), 3424);
        let mut harness_t = init.finish(&msg2).unwrap();
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
        let (mut exec_t, msg2) = pending.complete(&mut rng).unwrap();
        let mut bad = msg2.clone();
        bad[3000] ^= 1;
        let (init2, _) =
            Initiator::start(&harness, &executor.public_key(), &p, b"x", &mut rng).unwrap();
        assert!(init2.finish(&bad).is_err());
        let mut t = init.finish(&msg2).unwrap();
        let c0 = t.encrypt(b"zero").unwrap();
        let c1 = t.encrypt(b"one").unwrap();
        assert_eq!(exec_t.decrypt(&c0).unwrap(), b"zero");
        // A replayed record no longer decrypts (the nonce moved on); nor does an
        // out-of-order one; the good record still does afterwards.
        assert_eq!(exec_t.decrypt(&c0), Err(NoiseError::Decrypt));
        assert_eq!(exec_t.decrypt(&c1).unwrap(), b"one");
        assert_eq!(exec_t.decrypt(&[0u8; 5]), Err(NoiseError::Length));
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
        let (mut exec_t, msg2) = pending.complete(&mut rng).unwrap();
        let mut harness_t = init.finish(&msg2).unwrap();
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
