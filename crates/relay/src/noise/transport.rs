//! A stream's transport records after the handshake: the cipher both ends
//! agreed ([`TransportCipher`]), one [`CipherState`] per direction, and the
//! [`Transport`] that holds both (split into a [`Sealer`] and an [`Opener`]
//! for a writer and a reader task).

use super::{NoiseError, MAX_MESSAGE_LEN, MAX_RECORDS_PER_DIRECTION, TAG_LEN};
use aws_lc_rs::aead;
use clatter::cipherstate::CipherState as ClatterCipher;
use clatter::crypto::cipher::AesGcm;

/// The AEAD that seals a stream's transport records. The reference speaks
/// only [`TransportCipher::AesGcm`]; our harness offers
/// [`TransportCipher::Aegis256X2`] beside its msg1 and our executor takes it,
/// see [`TransportCipher::WIRE_AEGIS256X2`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportCipher {
    /// AES-256-GCM under the handshake's split keys, as Noise's `AESGCM`
    /// (nonce: 4 zero bytes and the 64-bit big-endian counter).
    AesGcm,
    /// AEGIS-256X2 (draft-irtf-cfrg-aegis-aead, 16-byte tags) under keys
    /// derived from the split keys: HKDF-SHA256 with an empty salt, the
    /// split key as input and [`AEGIS256X2_KEY_INFO`] as info, per direction;
    /// nonce: 24 zero bytes and the 64-bit big-endian counter. Same record
    /// sizes as AES-GCM, about 3 times less CPU where AES-GCM has no
    /// VAES (see BENCHMARKS.md).
    Aegis256X2,
}

/// HKDF info of a direction's AEGIS-256X2 key: its own label, so the key
/// never equals the AES-GCM key it comes from.
pub const AEGIS256X2_KEY_INFO: &[u8] = b"exec-server relay transport AEGIS-256X2 v1";

impl TransportCipher {
    /// The value of a handshake frame's `transport_cipher` (ours, field
    /// 2001) that offers or takes AEGIS-256X2: `AEGIS-256X2`.
    pub const WIRE_AEGIS256X2: &'static str = "AEGIS-256X2";

    /// The cipher a handshake frame's `transport_cipher` names: AEGIS-256X2
    /// for [`TransportCipher::WIRE_AEGIS256X2`], else AES-GCM (absent or
    /// unknown: the reference's).
    pub fn from_wire(value: Option<&str>) -> TransportCipher {
        match value {
            Some(Self::WIRE_AEGIS256X2) => TransportCipher::Aegis256X2,
            _ => TransportCipher::AesGcm,
        }
    }

    /// The environment variable that turns AEGIS-256X2 off for a harness
    /// (no offer) or an executor (never takes one): `aes-256-gcm`.
    pub const ENV: &'static str = "EXEC_SERVER_RELAY_CIPHER";

    /// What this process offers or takes: AEGIS-256X2 unless
    /// [`TransportCipher::ENV`] says `aes-256-gcm` (unset, empty or
    /// `aegis-256x2`: AEGIS-256X2). Any other value also keeps AES-GCM
    /// (the reference's), with a warning.
    pub fn preferred() -> TransportCipher {
        match std::env::var(Self::ENV).as_deref() {
            Err(_) | Ok("" | "aegis-256x2") => TransportCipher::Aegis256X2,
            Ok("aes-256-gcm") => TransportCipher::AesGcm,
            Ok(other) => {
                tracing::warn!(
                    value = other,
                    "{} is neither aegis-256x2 nor aes-256-gcm; relay streams use aes-256-gcm",
                    Self::ENV
                );
                TransportCipher::AesGcm
            }
        }
    }

    /// What a handshake frame carries for this cipher (`None` for AES-GCM:
    /// the reference's frames, unchanged).
    pub fn wire(self) -> Option<&'static str> {
        match self {
            TransportCipher::AesGcm => None,
            TransportCipher::Aegis256X2 => Some(Self::WIRE_AEGIS256X2),
        }
    }
}

/// One direction's key, in the cipher the stream agreed.
enum RecordKey {
    AesGcm(aead::LessSafeKey),
    Aegis256X2(AegisKey),
}

/// An AEGIS-256X2 key, zeroed when dropped.
type AegisKey = zeroize::Zeroizing<[u8; 32]>;

/// One direction's record key and nonce counter, for the transport phase.
/// The handshake runs in Clatter; its split keys then go to aws-lc-rs's
/// AES-GCM (AVX-512 VAES where the CPU has it), which seals a record's
/// bulk from where it lies into the frame (one pass instead of a copy and
/// an in-place pass), or to AEGIS-256X2 when both ends agreed
/// ([`TransportCipher`]). Noise's AESGCM records are the reference's: nonce
/// 4 zero bytes and the counter big-endian, the associated data empty.
pub struct CipherState {
    key: RecordKey,
    nonce: u64,
}

impl CipherState {
    /// Takes over one direction of a finished handshake in `cipher`.
    /// Errors: [`NoiseError::InvalidKey`] when the key is not 32 bytes.
    fn from_handshake(
        state: ClatterCipher<AesGcm>,
        cipher: TransportCipher,
    ) -> Result<CipherState, NoiseError> {
        use clatter::bytearray::ByteArray;
        let (key, nonce) = state.take();
        let key = match cipher {
            TransportCipher::AesGcm => {
                let key = aead::UnboundKey::new(&aead::AES_256_GCM, key.as_slice())
                    .map_err(|_| NoiseError::InvalidKey)?;
                RecordKey::AesGcm(aead::LessSafeKey::new(key))
            }
            TransportCipher::Aegis256X2 => RecordKey::Aegis256X2(derive_aegis_key(key.as_slice())?),
        };
        Ok(CipherState { key, nonce })
    }

    fn next_counter(&self) -> Result<u64, NoiseError> {
        if self.nonce >= MAX_RECORDS_PER_DIRECTION {
            return Err(NoiseError::Exhausted);
        }
        Ok(self.nonce)
    }

    fn encrypt(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        let mut out = vec![0; plaintext.len() + TAG_LEN];
        self.seal_into(&mut out, 0, plaintext)?;
        Ok(out)
    }

    /// Seals the record whose plaintext is `frame[start..end]` followed by
    /// `tail`, where `end` leaves room for `tail`'s ciphertext and the tag
    /// at the end of `frame`: those bytes are all overwritten, whatever
    /// they held.
    fn seal_into(&mut self, frame: &mut [u8], start: usize, tail: &[u8]) -> Result<(), NoiseError> {
        let end = frame
            .len()
            .checked_sub(tail.len() + TAG_LEN)
            .filter(|end| *end >= start)
            .ok_or(NoiseError::Length)?;
        if end - start + tail.len() + TAG_LEN > MAX_MESSAGE_LEN {
            return Err(NoiseError::Length);
        }
        let counter = self.next_counter()?;
        let (head, tail_out) = frame[start..].split_at_mut(end - start);
        match &self.key {
            RecordKey::AesGcm(key) => key
                .seal_in_place_scatter(
                    aes_gcm_nonce(counter),
                    aead::Aad::empty(),
                    head,
                    tail,
                    tail_out,
                )
                .map_err(|_| NoiseError::Length)?,
            RecordKey::Aegis256X2(key) => {
                let (tail_out, tag_out) = tail_out.split_at_mut(tail.len());
                let mut sealing = aegis256(key, counter).encryptor(&[]);
                sealing.update_in_place(head);
                sealing.update(tail, tail_out);
                tag_out.copy_from_slice(&sealing.finalize());
            }
        }
        self.nonce += 1;
        Ok(())
    }

    fn decrypt(&mut self, ciphertext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        self.open_owned(ciphertext.to_vec())
    }

    fn open_owned(&mut self, mut buf: Vec<u8>) -> Result<Vec<u8>, NoiseError> {
        let n = self.open_within(&mut buf, 0)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Decrypts `buf[src..]` into `buf[..]`; returns the plaintext's
    /// length (the bytes after it are left as they were, or zeroed when
    /// the record fails under AEGIS-256X2).
    fn open_within(&mut self, buf: &mut [u8], src: usize) -> Result<usize, NoiseError> {
        let len = buf.len().saturating_sub(src);
        if !(TAG_LEN..=MAX_MESSAGE_LEN).contains(&len) {
            return Err(NoiseError::Length);
        }
        let counter = self.next_counter()?;
        let n = match &self.key {
            RecordKey::AesGcm(key) => key
                .open_within(aes_gcm_nonce(counter), aead::Aad::empty(), buf, src..)
                .map_err(|_| NoiseError::Decrypt)?
                .len(),
            RecordKey::Aegis256X2(key) => {
                // libaegis decrypts in place only: move the record first
                // (a cache-hot copy of at most one record).
                buf.copy_within(src.., 0);
                let n = len - TAG_LEN;
                let (body, rest) = buf.split_at_mut(n);
                let mut tag = [0u8; TAG_LEN];
                tag.copy_from_slice(&rest[..TAG_LEN]);
                aegis256(key, counter)
                    .decrypt_in_place(body, &tag, &[])
                    .map_err(|_| NoiseError::Decrypt)?;
                n
            }
        };
        self.nonce += 1;
        Ok(n)
    }
}

fn aes_gcm_nonce(counter: u64) -> aead::Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    aead::Nonce::assume_unique_for_key(n)
}

fn aegis256(key: &AegisKey, counter: u64) -> aegis::aegis256x2::Aegis256X2<TAG_LEN> {
    let mut nonce = [0u8; 32];
    nonce[24..].copy_from_slice(&counter.to_be_bytes());
    aegis::aegis256x2::Aegis256X2::new(key, &nonce)
}

/// A direction's AEGIS-256X2 key from its split key (see
/// [`TransportCipher::Aegis256X2`]).
fn derive_aegis_key(split_key: &[u8]) -> Result<AegisKey, NoiseError> {
    use aws_lc_rs::hkdf;
    if split_key.len() != 32 {
        return Err(NoiseError::InvalidKey);
    }
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(split_key);
    let mut key = AegisKey::new([0u8; 32]);
    prk.expand(&[AEGIS256X2_KEY_INFO], hkdf::HKDF_SHA256)
        .and_then(|okm| okm.fill(&mut key[..]))
        .map_err(|_| NoiseError::InvalidKey)?;
    Ok(key)
}

/// The transport of a finished handshake: records sent under `send`'s key,
/// received under `recv`'s, both in `cipher`. Errors:
/// [`NoiseError::InvalidKey`] when a key is not 32 bytes.
pub(super) fn transport(
    send: ClatterCipher<AesGcm>,
    recv: ClatterCipher<AesGcm>,
    cipher: TransportCipher,
) -> Result<Transport, NoiseError> {
    Ok(Transport {
        send: CipherState::from_handshake(send, cipher)?,
        recv: CipherState::from_handshake(recv, cipher)?,
        cipher,
    })
}

/// An established channel: records encrypted in order, decrypted in order.
/// Callers must present received records in sequence (see [`crate::ordered`]).
pub struct Transport {
    send: CipherState,
    recv: CipherState,
    cipher: TransportCipher,
}

/// The sending half of a [`Transport`] (see [`Transport::split`]).
pub struct Sealer(CipherState);
/// The receiving half of a [`Transport`].
pub struct Opener(CipherState);

impl Sealer {
    /// As [`Transport::encrypt`].
    pub fn encrypt(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        self.0.encrypt(plaintext)
    }

    /// Seals the next record into a frame already as long as the record
    /// needs: the plaintext is `frame[start..end]` (encrypted where it
    /// lies) followed by `tail` (read from where it lies, no copy first),
    /// where `end` is `tail.len()` plus the tag's length before `frame`'s
    /// end, and those last bytes (whatever they held) become `tail`'s
    /// ciphertext and the tag. The same record as [`Sealer::encrypt`] of
    /// the joined plaintext. Errors: [`NoiseError::Length`] when
    /// `frame` is shorter than that or the record too long; as
    /// [`Transport::encrypt`] otherwise.
    pub fn seal_into(
        &mut self,
        frame: &mut [u8],
        start: usize,
        tail: &[u8],
    ) -> Result<(), NoiseError> {
        self.0.seal_into(frame, start, tail)
    }
}

impl Opener {
    /// As [`Transport::decrypt`], decrypting `record` where it lies and
    /// leaving the plaintext in it.
    pub fn decrypt_in_place(&mut self, record: &mut bytes::BytesMut) -> Result<(), NoiseError> {
        let n = self.0.open_within(record, 0)?;
        record.truncate(n);
        Ok(())
    }

    /// Decrypts the record at `buf[src..]` and leaves its plaintext at
    /// `buf[..]`, moved while decrypted (no separate copy); returns the
    /// plaintext's length. Errors as [`Transport::decrypt`].
    pub fn decrypt_within(&mut self, buf: &mut [u8], src: usize) -> Result<usize, NoiseError> {
        self.0.open_within(buf, src)
    }
}

impl Transport {
    /// A transport whose send and receive keys are `send` and `recv` (from
    /// nonce 0), for tests that need two identical ones.
    #[cfg(test)]
    pub(crate) fn from_keys(send: &[u8; 32], recv: &[u8; 32]) -> Transport {
        let state = |k: &[u8; 32]| {
            CipherState::from_handshake(ClatterCipher::new(k, 0), TransportCipher::AesGcm)
                .unwrap_or_else(|_| unreachable!())
        };
        Transport {
            send: state(send),
            recv: state(recv),
            cipher: TransportCipher::AesGcm,
        }
    }

    /// The cipher of this transport's records.
    pub fn cipher(&self) -> TransportCipher {
        self.cipher
    }

    /// Separates the directions so a writer task and a reader task can each own one.
    pub fn split(self) -> (Sealer, Opener) {
        (Sealer(self.send), Opener(self.recv))
    }

    /// Encrypts one record (plaintext ≤ 65 519 bytes). Errors:
    /// [`NoiseError::Length`], [`NoiseError::Exhausted`].
    pub fn encrypt(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        self.send.encrypt(plaintext)
    }

    /// Decrypts the next record. A failed record leaves the counter where it
    /// was, but the stream should be torn down (the peer is broken or hostile).
    pub fn decrypt(&mut self, ciphertext: &[u8]) -> Result<Vec<u8>, NoiseError> {
        self.recv.decrypt(ciphertext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ring's records are Clatter's records: each side opens what the other
    /// sealed, nonce after nonce, and a flipped bit or a skipped record fails.
    #[test]
    fn transport_records_match_clatters_cipher_both_ways() {
        let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        let mut ours =
            CipherState::from_handshake(ClatterCipher::new(&key, 0), TransportCipher::AesGcm)
                .unwrap();
        let mut theirs = ClatterCipher::<AesGcm>::new(&key, 0);
        for len in [0usize, 1, 15, 16, 17, 4096, 60 * 1024] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let sealed = ours.encrypt(&plain).unwrap();
            let mut opened = vec![0u8; len];
            theirs.decrypt_with_ad(&[], &sealed, &mut opened).unwrap();
            assert_eq!(opened, plain, "ours → clatter, {len} bytes");
        }
        let mut ours =
            CipherState::from_handshake(ClatterCipher::new(&key, 0), TransportCipher::AesGcm)
                .unwrap();
        let mut theirs = ClatterCipher::<AesGcm>::new(&key, 0);
        for len in [3usize, 65_535 - TAG_LEN] {
            let plain = vec![9u8; len];
            let mut sealed = vec![0u8; len + TAG_LEN];
            theirs.encrypt_with_ad(&[], &plain, &mut sealed).unwrap();
            assert_eq!(ours.decrypt(&sealed).unwrap(), plain, "clatter → ours");
        }
        let mut sealed = vec![0u8; 8 + TAG_LEN];
        theirs
            .encrypt_with_ad(&[], b"tampered", &mut sealed)
            .unwrap();
        sealed[2] ^= 1;
        assert!(matches!(ours.decrypt(&sealed), Err(NoiseError::Decrypt)));
        // The failure left the counter: the next record is still expected.
        let mut next = vec![0u8; 4 + TAG_LEN];
        theirs.encrypt_with_ad(&[], b"next", &mut next).unwrap();
        assert!(
            matches!(ours.decrypt(&next), Err(NoiseError::Decrypt)),
            "a skipped record fails"
        );
    }

    /// AEGIS-256X2 records, checked against an oracle built apart: the key
    /// from ring's HKDF-SHA256 (empty salt, our info), the nonce 24 zero
    /// bytes and the counter, libaegis's one-shot seal. Sealing from two
    /// parts gives the same record; tampering, replay and the other
    /// cipher fail.
    #[test]
    fn aegis_records_match_an_independent_oracle() {
        let split: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(11) ^ 0xa5).collect();
        let mut ours =
            CipherState::from_handshake(ClatterCipher::new(&split, 0), TransportCipher::Aegis256X2)
                .unwrap();
        let mut key = [0u8; 32];
        ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, &[])
            .extract(&split)
            .expand(&[AEGIS256X2_KEY_INFO], ring::hkdf::HKDF_SHA256)
            .unwrap()
            .fill(&mut key)
            .unwrap();
        let oracle = |counter: u64, plain: &[u8]| -> Vec<u8> {
            let mut nonce = [0u8; 32];
            nonce[24..].copy_from_slice(&counter.to_be_bytes());
            let (mut c, tag) =
                aegis::aegis256x2::Aegis256X2::<16>::new(&key, &nonce).encrypt(plain, &[]);
            c.extend_from_slice(&tag);
            c
        };
        for (counter, len) in [0usize, 1, 15, 16, 17, 4096, 60 * 1024]
            .into_iter()
            .enumerate()
        {
            let plain: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
            assert_eq!(
                ours.encrypt(&plain).unwrap(),
                oracle(counter as u64, &plain),
                "{len}"
            );
        }
        // Two parts: 40 bytes in the frame, the rest read from elsewhere.
        let plain: Vec<u8> = (0..5000).map(|i| (i * 3) as u8).collect();
        let mut frame = vec![0xeeu8; 7 + plain.len() + TAG_LEN];
        frame[7..47].copy_from_slice(&plain[..40]);
        ours.seal_into(&mut frame, 7, &plain[40..]).unwrap();
        assert_eq!(&frame[7..], &oracle(7, &plain)[..]);

        let mut opener =
            CipherState::from_handshake(ClatterCipher::new(&split, 0), TransportCipher::Aegis256X2)
                .unwrap();
        let first = oracle(0, b"first");
        let mut shifted = vec![0u8; 3];
        shifted.extend_from_slice(&first);
        assert_eq!(opener.open_within(&mut shifted, 3).unwrap(), 5);
        assert_eq!(&shifted[..5], b"first");
        assert_eq!(opener.decrypt(&first), Err(NoiseError::Decrypt), "replayed");
        let mut bad = oracle(1, b"second");
        bad[0] ^= 1;
        assert_eq!(opener.decrypt(&bad), Err(NoiseError::Decrypt), "tampered");
        assert_eq!(opener.decrypt(&oracle(1, b"second")).unwrap(), b"second");
        let mut aes =
            CipherState::from_handshake(ClatterCipher::new(&split, 0), TransportCipher::AesGcm)
                .unwrap();
        assert_eq!(aes.decrypt(&oracle(0, b"first")), Err(NoiseError::Decrypt));
    }

    #[test]
    fn the_wire_names_one_cipher_and_anything_else_is_aes_gcm() {
        assert_eq!(
            TransportCipher::from_wire(Some("AEGIS-256X2")),
            TransportCipher::Aegis256X2
        );
        for other in [
            None,
            Some(""),
            Some("aegis-256x2"),
            Some("AEGIS-256"),
            Some("AEGIS-128L"),
        ] {
            assert_eq!(TransportCipher::from_wire(other), TransportCipher::AesGcm);
        }
        assert_eq!(TransportCipher::AesGcm.wire(), None);
        assert_eq!(TransportCipher::Aegis256X2.wire(), Some("AEGIS-256X2"));
    }
}
