//! ML-KEM-768 (FIPS 203, final): key generation, encapsulation, decapsulation
//! with implicit rejection.
//!
//! Written here only because no ML-KEM crate can be fetched on this build
//! machine; it follows FIPS 203's algorithms one to one (names in the comments)
//! and is checked against the reference binary's handshake in the interop test.
//! Not constant-time in every branch of sampling (those branches depend only on
//! public data), but decapsulation compares and selects without branching.

use super::keccak::{sha3_256, sha3_512, shake128, shake256};

const N: usize = 256;
const Q: u32 = 3329;
const K: usize = 3;
const ETA: usize = 2;
const DU: u32 = 10;
const DV: u32 = 4;

/// Encapsulation (public) key size: 1184 bytes.
pub const PUBLIC_KEY_LEN: usize = 384 * K + 32;
/// Decapsulation (secret) key size: 2400 bytes.
pub const SECRET_KEY_LEN: usize = 768 * K + 96;
/// Ciphertext size: 1088 bytes.
pub const CIPHERTEXT_LEN: usize = 32 * (DU as usize * K + DV as usize);
/// Shared secret size: 32 bytes.
pub const SHARED_SECRET_LEN: usize = 32;

type Poly = [u32; N];

/// ζ^BitRev7(i) mod q for i in 0..128 (ζ = 17).
fn zetas() -> &'static [u32; 128] {
    static Z: std::sync::OnceLock<[u32; 128]> = std::sync::OnceLock::new();
    Z.get_or_init(|| {
        let mut z = [0u32; 128];
        for (i, v) in z.iter_mut().enumerate() {
            let e = (i as u8).reverse_bits() >> 1;
            *v = pow17(e as u32);
        }
        z
    })
}

fn pow17(e: u32) -> u32 {
    let mut r = 1u32;
    for _ in 0..e {
        r = r * 17 % Q;
    }
    r
}

fn ntt(f: &mut Poly) {
    let z = zetas();
    let mut i = 1;
    let mut len = 128;
    while len >= 2 {
        let mut start = 0;
        while start < N {
            let zeta = z[i];
            i += 1;
            for j in start..start + len {
                let t = zeta * f[j + len] % Q;
                f[j + len] = (f[j] + Q - t) % Q;
                f[j] = (f[j] + t) % Q;
            }
            start += 2 * len;
        }
        len /= 2;
    }
}

fn inv_ntt(f: &mut Poly) {
    let z = zetas();
    let mut i = 127;
    let mut len = 2;
    while len <= 128 {
        let mut start = 0;
        while start < N {
            let zeta = z[i];
            i -= 1;
            for j in start..start + len {
                let t = f[j];
                f[j] = (t + f[j + len]) % Q;
                f[j + len] = zeta * ((f[j + len] + Q - t) % Q) % Q;
            }
            start += 2 * len;
        }
        len *= 2;
    }
    for c in f.iter_mut() {
        *c = *c * 3303 % Q;
    }
}

/// MultiplyNTTs (Algorithm 11), accumulated into `acc`.
fn mul_acc(acc: &mut Poly, f: &Poly, g: &Poly) {
    let z = zetas();
    for i in 0..128 {
        // γ = ζ^(2·BitRev7(i)+1) = zetas[64 + i/2] with sign alternating.
        let gamma = if i % 2 == 0 {
            z[64 + i / 2]
        } else {
            Q - z[64 + i / 2]
        };
        let (a0, a1, b0, b1) = (f[2 * i], f[2 * i + 1], g[2 * i], g[2 * i + 1]);
        let c0 = (a0 * b0 + (a1 * b1 % Q) * gamma) % Q;
        let c1 = (a0 * b1 + a1 * b0) % Q;
        acc[2 * i] = (acc[2 * i] + c0) % Q;
        acc[2 * i + 1] = (acc[2 * i + 1] + c1) % Q;
    }
}

fn add(a: &mut Poly, b: &Poly) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = (*x + y) % Q;
    }
}

fn byte_encode(f: &Poly, d: u32, out: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut bits = 0u32;
    for &c in f {
        acc |= (c as u64) << bits;
        bits += d;
        while bits >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            bits -= 8;
        }
    }
}

fn byte_decode(b: &[u8], d: u32) -> Poly {
    let mut f = [0u32; N];
    let mut acc: u64 = 0;
    let mut bits = 0u32;
    let mut idx = 0;
    let mask = (1u64 << d) - 1;
    for c in f.iter_mut() {
        while bits < d {
            acc |= (b[idx] as u64) << bits;
            idx += 1;
            bits += 8;
        }
        *c = (acc & mask) as u32;
        acc >>= d;
        bits -= d;
    }
    if d == 12 {
        for c in f.iter_mut() {
            *c %= Q;
        }
    }
    f
}

fn compress(x: u32, d: u32) -> u32 {
    ((((x as u64) << (d + 1)) + Q as u64) / (2 * Q as u64)) as u32 & ((1 << d) - 1)
}

fn decompress(y: u32, d: u32) -> u32 {
    ((y as u64 * Q as u64 + (1u64 << (d - 1))) >> d) as u32
}

/// SampleNTT (Algorithm 7) from SHAKE128(ρ ‖ j ‖ i).
fn sample_ntt(rho: &[u8], j: u8, i: u8) -> Poly {
    let mut xof = shake128();
    xof.absorb(rho);
    xof.absorb(&[j, i]);
    let mut f = [0u32; N];
    let mut n = 0;
    let mut buf = [0u8; 168];
    while n < N {
        xof.squeeze(&mut buf);
        for c in buf.chunks_exact(3) {
            let d1 = c[0] as u32 + 256 * (c[1] as u32 % 16);
            let d2 = c[1] as u32 / 16 + 16 * c[2] as u32;
            if d1 < Q && n < N {
                f[n] = d1;
                n += 1;
            }
            if d2 < Q && n < N {
                f[n] = d2;
                n += 1;
            }
        }
    }
    f
}

/// SamplePolyCBD_η (Algorithm 8) on PRF_η(s, b) = SHAKE256(s ‖ b, 64η).
fn sample_cbd(seed: &[u8], nonce: u8) -> Poly {
    let mut prf = shake256();
    prf.absorb(seed);
    prf.absorb(&[nonce]);
    let mut b = [0u8; 64 * ETA];
    prf.squeeze(&mut b);
    let bit = |k: usize| ((b[k / 8] >> (k % 8)) & 1) as u32;
    let mut f = [0u32; N];
    for (i, c) in f.iter_mut().enumerate() {
        let x: u32 = (0..ETA).map(|j| bit(2 * i * ETA + j)).sum();
        let y: u32 = (0..ETA).map(|j| bit(2 * i * ETA + ETA + j)).sum();
        *c = (x + Q - y) % Q;
    }
    f
}

fn matrix(rho: &[u8]) -> [[Poly; K]; K] {
    let mut a = [[[0u32; N]; K]; K];
    for (i, row) in a.iter_mut().enumerate() {
        for (j, p) in row.iter_mut().enumerate() {
            *p = sample_ntt(rho, j as u8, i as u8);
        }
    }
    a
}

/// K-PKE.KeyGen (Algorithm 13): (ek, dk_pke).
fn pke_keygen(d: &[u8; 32]) -> (Vec<u8>, Vec<u8>) {
    let g = sha3_512(&[d, &[K as u8]]);
    let (rho, sigma) = g.split_at(32);
    let a = matrix(rho);
    let mut nonce = 0u8;
    let mut s = [[0u32; N]; K];
    for p in s.iter_mut() {
        *p = sample_cbd(sigma, nonce);
        nonce += 1;
        ntt(p);
    }
    let mut e = [[0u32; N]; K];
    for p in e.iter_mut() {
        *p = sample_cbd(sigma, nonce);
        nonce += 1;
        ntt(p);
    }
    let mut ek = Vec::with_capacity(PUBLIC_KEY_LEN);
    for i in 0..K {
        let mut t = e[i];
        for j in 0..K {
            mul_acc(&mut t, &a[i][j], &s[j]);
        }
        byte_encode(&t, 12, &mut ek);
    }
    ek.extend_from_slice(rho);
    let mut dk = Vec::with_capacity(384 * K);
    for p in &s {
        byte_encode(p, 12, &mut dk);
    }
    (ek, dk)
}

/// K-PKE.Encrypt (Algorithm 14).
fn pke_encrypt(ek: &[u8], m: &[u8; 32], r: &[u8]) -> Vec<u8> {
    let t: Vec<Poly> = (0..K)
        .map(|i| byte_decode(&ek[384 * i..384 * (i + 1)], 12))
        .collect();
    let a = matrix(&ek[384 * K..]);
    let mut nonce = 0u8;
    let mut y = [[0u32; N]; K];
    for p in y.iter_mut() {
        *p = sample_cbd(r, nonce);
        nonce += 1;
        ntt(p);
    }
    let mut e1 = [[0u32; N]; K];
    for p in e1.iter_mut() {
        *p = sample_cbd(r, nonce);
        nonce += 1;
    }
    let e2 = sample_cbd(r, nonce);
    let mut c = Vec::with_capacity(CIPHERTEXT_LEN);
    for i in 0..K {
        let mut u = [0u32; N];
        for j in 0..K {
            mul_acc(&mut u, &a[j][i], &y[j]);
        }
        inv_ntt(&mut u);
        add(&mut u, &e1[i]);
        for x in u.iter_mut() {
            *x = compress(*x, DU);
        }
        byte_encode(&u, DU, &mut c);
    }
    let mut v = [0u32; N];
    for j in 0..K {
        mul_acc(&mut v, &t[j], &y[j]);
    }
    inv_ntt(&mut v);
    add(&mut v, &e2);
    let mu = byte_decode(m, 1);
    for (x, bit) in v.iter_mut().zip(mu) {
        *x = (*x + decompress(bit, 1)) % Q;
        *x = compress(*x, DV);
    }
    byte_encode(&v, DV, &mut c);
    c
}

/// K-PKE.Decrypt (Algorithm 15).
fn pke_decrypt(dk: &[u8], c: &[u8]) -> [u8; 32] {
    let mut w = [0u32; N];
    for i in 0..K {
        let chunk = 32 * DU as usize;
        let mut u = byte_decode(&c[chunk * i..chunk * (i + 1)], DU);
        for x in u.iter_mut() {
            *x = decompress(*x, DU);
        }
        ntt(&mut u);
        let s = byte_decode(&dk[384 * i..384 * (i + 1)], 12);
        mul_acc(&mut w, &s, &u);
    }
    inv_ntt(&mut w);
    let mut v = byte_decode(&c[32 * DU as usize * K..], DV);
    for (x, sw) in v.iter_mut().zip(w) {
        *x = (decompress(*x, DV) + Q - sw) % Q;
        *x = compress(*x, 1);
    }
    let mut m = Vec::with_capacity(32);
    byte_encode(&v, 1, &mut m);
    let mut out = [0u8; 32];
    out.copy_from_slice(&m);
    out
}

/// The encapsulation key is not a valid encoding (FIPS 203 §7.2 modulus check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidKey;

/// ML-KEM.KeyGen_internal(d, z): returns (encapsulation key, decapsulation key).
pub fn keygen(d: &[u8; 32], z: &[u8; 32]) -> (Vec<u8>, Vec<u8>) {
    let (ek, dk_pke) = pke_keygen(d);
    let mut dk = dk_pke;
    dk.extend_from_slice(&ek);
    dk.extend_from_slice(&sha3_256(&[&ek]));
    dk.extend_from_slice(z);
    (ek, dk)
}

/// ML-KEM.Encaps_internal(ek, m): returns (ciphertext, shared secret).
pub fn encapsulate(
    ek: &[u8],
    m: &[u8; 32],
) -> Result<(Vec<u8>, [u8; SHARED_SECRET_LEN]), InvalidKey> {
    if ek.len() != PUBLIC_KEY_LEN {
        return Err(InvalidKey);
    }
    // Modulus check: every 12-bit coefficient must already be below q.
    for i in 0..K {
        let chunk = &ek[384 * i..384 * (i + 1)];
        let mut again = Vec::with_capacity(384);
        byte_encode(&byte_decode(chunk, 12), 12, &mut again);
        if again != chunk {
            return Err(InvalidKey);
        }
    }
    let h = sha3_256(&[ek]);
    let g = sha3_512(&[m, &h]);
    let (key, r) = g.split_at(32);
    let c = pke_encrypt(ek, m, r);
    let mut ss = [0u8; 32];
    ss.copy_from_slice(key);
    Ok((c, ss))
}

/// ML-KEM.Decaps_internal(dk, c): the shared secret, or the implicit-rejection
/// key J(z ‖ c) when `c` was not made for this key. Lengths are checked by the
/// caller (`dk`: 2400 bytes, `c`: 1088 bytes).
pub fn decapsulate(dk: &[u8], c: &[u8]) -> [u8; SHARED_SECRET_LEN] {
    let dk_pke = &dk[..384 * K];
    let ek = &dk[384 * K..768 * K + 32];
    let h = &dk[768 * K + 32..768 * K + 64];
    let z = &dk[768 * K + 64..768 * K + 96];
    let m = pke_decrypt(dk_pke, c);
    let g = sha3_512(&[&m, h]);
    let (key, r) = g.split_at(32);
    let mut j = shake256();
    j.absorb(z);
    j.absorb(c);
    let mut reject = [0u8; 32];
    j.squeeze(&mut reject);
    let again = pke_encrypt(ek, &m, r);
    let diff = again.iter().zip(c).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    // 0xff when equal, 0x00 otherwise, without a branch on secret data.
    let keep = ((diff as u16).wrapping_sub(1) >> 8) as u8;
    let mut out = [0u8; 32];
    for i in 0..32 {
        out[i] = (key[i] & keep) | (reject[i] & !keep);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_round_trip() {
        let (ek, dk) = keygen(&[7u8; 32], &[9u8; 32]);
        assert_eq!(ek.len(), PUBLIC_KEY_LEN);
        assert_eq!(dk.len(), SECRET_KEY_LEN);
        for seed in 0..8u8 {
            let (c, ss) = encapsulate(&ek, &[seed; 32]).unwrap();
            assert_eq!(c.len(), CIPHERTEXT_LEN);
            assert_eq!(decapsulate(&dk, &c), ss);
        }
    }

    #[test]
    fn tampered_ciphertext_gets_the_rejection_key() {
        let (ek, dk) = keygen(&[1u8; 32], &[2u8; 32]);
        let (mut c, ss) = encapsulate(&ek, &[3u8; 32]).unwrap();
        c[10] ^= 1;
        let got = decapsulate(&dk, &c);
        assert_ne!(got, ss);
        let mut j = shake256();
        j.absorb(&[2u8; 32]);
        j.absorb(&c);
        let mut want = [0u8; 32];
        j.squeeze(&mut want);
        assert_eq!(got, want);
    }

    #[test]
    fn wrong_key_disagrees_and_bad_encoding_is_refused() {
        let (ek, _) = keygen(&[1u8; 32], &[2u8; 32]);
        let (_, dk2) = keygen(&[4u8; 32], &[5u8; 32]);
        let (c, ss) = encapsulate(&ek, &[3u8; 32]).unwrap();
        assert_ne!(decapsulate(&dk2, &c), ss);
        let mut bad = ek.clone();
        bad[0] = 0xff;
        bad[1] |= 0x0f; // first coefficient 4095 >= q
        assert_eq!(encapsulate(&bad, &[0; 32]), Err(InvalidKey));
        assert_eq!(encapsulate(&ek[..100], &[0; 32]), Err(InvalidKey));
    }

    #[test]
    fn ntt_inverts() {
        let mut f = [0u32; N];
        for (i, c) in f.iter_mut().enumerate() {
            *c = (i as u32 * 37 + 5) % Q;
        }
        let orig = f;
        ntt(&mut f);
        inv_ntt(&mut f);
        assert_eq!(f, orig);
    }
}
