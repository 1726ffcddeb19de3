//! X25519 (RFC 7748) with static private keys, which `ring` does not offer
//! (its agreement keys are single-use). Field elements are five 51-bit limbs.
//!
//! Written here only because no X25519 crate can be fetched on this build
//! machine; tested against RFC 7748's vectors. The ladder is constant-time
//! (conditional swaps by mask, no secret-dependent branches or indexes).

const MASK: u64 = (1 << 51) - 1;

#[derive(Clone, Copy)]
struct Fe([u64; 5]);

impl Fe {
    const ZERO: Fe = Fe([0; 5]);
    const ONE: Fe = Fe([1, 0, 0, 0, 0]);

    fn from_bytes(b: &[u8; 32]) -> Fe {
        let w = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[8 * i..8 * i + 8]);
            u64::from_le_bytes(x)
        };
        let (w0, w1, w2, w3) = (w(0), w(1), w(2), w(3));
        Fe([
            w0 & MASK,
            ((w0 >> 51) | (w1 << 13)) & MASK,
            ((w1 >> 38) | (w2 << 26)) & MASK,
            ((w2 >> 25) | (w3 << 39)) & MASK,
            (w3 >> 12) & MASK,
        ])
    }

    fn carry(mut h: [u64; 5]) -> Fe {
        for _ in 0..2 {
            for i in 0..4 {
                h[i + 1] += h[i] >> 51;
                h[i] &= MASK;
            }
            let c = h[4] >> 51;
            h[4] &= MASK;
            h[0] += 19 * c;
        }
        Fe(h)
    }

    fn to_bytes(self) -> [u8; 32] {
        let mut h = Fe::carry(self.0).0;
        // h < 2^255 + small; subtract p once if h >= p.
        let mut q = (h[0] + 19) >> 51;
        for limb in h.iter().skip(1) {
            q = (limb + q) >> 51;
        }
        h[0] += 19 * q;
        for i in 0..4 {
            h[i + 1] += h[i] >> 51;
            h[i] &= MASK;
        }
        h[4] &= MASK;
        let words = [
            h[0] | (h[1] << 51),
            (h[1] >> 13) | (h[2] << 38),
            (h[2] >> 26) | (h[3] << 25),
            (h[3] >> 39) | (h[4] << 12),
        ];
        let mut out = [0u8; 32];
        for (i, w) in words.iter().enumerate() {
            out[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    fn add(&self, o: &Fe) -> Fe {
        let mut h = [0u64; 5];
        for (i, v) in h.iter_mut().enumerate() {
            *v = self.0[i] + o.0[i];
        }
        Fe::carry(h)
    }

    fn sub(&self, o: &Fe) -> Fe {
        // Add 4p so limbs never go negative.
        const FOUR_P: [u64; 5] = [(MASK - 18) * 4, MASK * 4, MASK * 4, MASK * 4, MASK * 4];
        let mut h = [0u64; 5];
        for (i, v) in h.iter_mut().enumerate() {
            *v = self.0[i] + FOUR_P[i] - o.0[i];
        }
        Fe::carry(h)
    }

    fn mul(&self, o: &Fe) -> Fe {
        let a = self.0.map(|x| x as u128);
        let b = o.0.map(|x| x as u128);
        let b19 = b.map(|x| x * 19);
        let r0 = a[0] * b[0] + a[1] * b19[4] + a[2] * b19[3] + a[3] * b19[2] + a[4] * b19[1];
        let r1 = a[0] * b[1] + a[1] * b[0] + a[2] * b19[4] + a[3] * b19[3] + a[4] * b19[2];
        let r2 = a[0] * b[2] + a[1] * b[1] + a[2] * b[0] + a[3] * b19[4] + a[4] * b19[3];
        let r3 = a[0] * b[3] + a[1] * b[2] + a[2] * b[1] + a[3] * b[0] + a[4] * b19[4];
        let r4 = a[0] * b[4] + a[1] * b[3] + a[2] * b[2] + a[3] * b[1] + a[4] * b[0];
        Fe::reduce_wide([r0, r1, r2, r3, r4])
    }

    fn reduce_wide(r: [u128; 5]) -> Fe {
        let mut r = r;
        for i in 0..4 {
            r[i + 1] += r[i] >> 51;
            r[i] &= MASK as u128;
        }
        let c = r[4] >> 51;
        r[4] &= MASK as u128;
        r[0] += c * 19;
        // r[0] may exceed 64 bits here; carry once more before narrowing.
        r[1] += r[0] >> 51;
        r[0] &= MASK as u128;
        Fe::carry(r.map(|x| x as u64))
    }

    fn square(&self) -> Fe {
        self.mul(self)
    }

    fn mul_small(&self, k: u64) -> Fe {
        Fe::reduce_wide(self.0.map(|x| x as u128 * k as u128))
    }

    /// z^(p-2) = z^(2^255 - 21).
    fn invert(&self) -> Fe {
        let mut r = Fe::ONE;
        // Exponent bits from the top: 2^255 - 21 = 0x7fff…ffeb.
        for bit in (0..255).rev() {
            r = r.square();
            let set = !matches!(bit, 2 | 4);
            if set {
                r = r.mul(self);
            }
        }
        r
    }

    fn cswap(a: &mut Fe, b: &mut Fe, swap: u64) {
        let mask = 0u64.wrapping_sub(swap);
        for i in 0..5 {
            let t = mask & (a.0[i] ^ b.0[i]);
            a.0[i] ^= t;
            b.0[i] ^= t;
        }
    }
}

/// X25519(k, u): the scalar is clamped, the top bit of `u` ignored.
pub fn x25519(scalar: &[u8; 32], u: &[u8; 32]) -> [u8; 32] {
    let mut k = *scalar;
    k[0] &= 248;
    k[31] &= 127;
    k[31] |= 64;
    let x1 = Fe::from_bytes(u);
    let (mut x2, mut z2, mut x3, mut z3) = (Fe::ONE, Fe::ZERO, x1, Fe::ONE);
    let mut swap = 0u64;
    for t in (0..255).rev() {
        let bit = ((k[t / 8] >> (t % 8)) & 1) as u64;
        swap ^= bit;
        Fe::cswap(&mut x2, &mut x3, swap);
        Fe::cswap(&mut z2, &mut z3, swap);
        swap = bit;
        let a = x2.add(&z2);
        let aa = a.square();
        let b = x2.sub(&z2);
        let bb = b.square();
        let e = aa.sub(&bb);
        let c = x3.add(&z3);
        let d = x3.sub(&z3);
        let da = d.mul(&a);
        let cb = c.mul(&b);
        x3 = da.add(&cb).square();
        z3 = x1.mul(&da.sub(&cb).square());
        x2 = aa.mul(&bb);
        z2 = e.mul(&aa.add(&e.mul_small(121665)));
    }
    Fe::cswap(&mut x2, &mut x3, swap);
    Fe::cswap(&mut z2, &mut z3, swap);
    x2.mul(&z2.invert()).to_bytes()
}

/// The public key of a private key: X25519(k, 9).
pub fn public_key(private: &[u8; 32]) -> [u8; 32] {
    let mut nine = [0u8; 32];
    nine[0] = 9;
    x25519(private, &nine)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        for i in 0..32 {
            out[i] = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }

    #[test]
    fn rfc7748_vectors() {
        let k = unhex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4");
        let u = unhex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c");
        assert_eq!(
            x25519(&k, &u),
            unhex("c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552")
        );
        let alice = unhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let bob = unhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb");
        assert_eq!(
            public_key(&alice),
            unhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
        );
        assert_eq!(
            public_key(&bob),
            unhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
        );
        let shared = unhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
        assert_eq!(x25519(&alice, &public_key(&bob)), shared);
        assert_eq!(x25519(&bob, &public_key(&alice)), shared);
    }

    #[test]
    fn iterated_once_and_thousand() {
        // RFC 7748 §5.2: k = u = 9, then k = X25519(k, u), u = old k.
        let mut k = [0u8; 32];
        k[0] = 9;
        let mut u = k;
        for i in 1..=1000 {
            let r = x25519(&k, &u);
            u = k;
            k = r;
            if i == 1 {
                assert_eq!(
                    k,
                    unhex("422c8e7a6227d7bca1350b3e2bb7279f7897b87bb6854b783c60e80311ae3079")
                );
            }
        }
        assert_eq!(
            k,
            unhex("684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51")
        );
    }
}
