//! Keccak-f[1600] and the FIPS 202 functions ML-KEM needs: SHA3-256 (`H`),
//! SHA3-512 (`G`), SHAKE128 (matrix sampling) and SHAKE256 (`PRF`, `J`).
//!
//! Written here only because no SHA-3 crate can be fetched on this build
//! machine; replace with `sha3` (or Clatter's ML-KEM backend) when one can.

const ROUNDS: usize = 24;

/// Round constants, derived once from the LFSR of FIPS 202 §3.2.5 so that no
/// hand-copied table can be wrong.
fn round_constants() -> [u64; ROUNDS] {
    let mut rc = [0u64; ROUNDS];
    let mut r: u8 = 1;
    for c in rc.iter_mut() {
        for j in 0..7 {
            if r & 1 == 1 {
                *c ^= 1u64 << ((1u32 << j) - 1);
            }
            r = if r & 0x80 != 0 {
                (r << 1) ^ 0x71
            } else {
                r << 1
            };
        }
    }
    rc
}

/// Rotation offsets per lane (index x + 5y), from the (x, y) walk of §3.2.2.
fn rotations() -> [u32; 25] {
    let mut rot = [0u32; 25];
    let (mut x, mut y) = (1usize, 0usize);
    for t in 0..24u32 {
        rot[x + 5 * y] = ((t + 1) * (t + 2) / 2) % 64;
        (x, y) = (y, (2 * x + 3 * y) % 5);
    }
    rot
}

fn keccak_f(a: &mut [u64; 25]) {
    // Tiny tables: recomputing them per permutation would dominate; cache them.
    static TABLES: std::sync::OnceLock<([u64; ROUNDS], [u32; 25])> = std::sync::OnceLock::new();
    let (rc, rot) = TABLES.get_or_init(|| (round_constants(), rotations()));
    for &round_constant in rc.iter() {
        let mut c = [0u64; 5];
        for x in 0..5 {
            c[x] = a[x] ^ a[x + 5] ^ a[x + 10] ^ a[x + 15] ^ a[x + 20];
        }
        for x in 0..5 {
            let d = c[(x + 4) % 5] ^ c[(x + 1) % 5].rotate_left(1);
            for y in 0..5 {
                a[x + 5 * y] ^= d;
            }
        }
        let mut b = [0u64; 25];
        for x in 0..5 {
            for y in 0..5 {
                b[y + 5 * ((2 * x + 3 * y) % 5)] = a[x + 5 * y].rotate_left(rot[x + 5 * y]);
            }
        }
        for y in 0..5 {
            for x in 0..5 {
                a[x + 5 * y] = b[x + 5 * y] ^ (!b[(x + 1) % 5 + 5 * y] & b[(x + 2) % 5 + 5 * y]);
            }
        }
        a[0] ^= round_constant;
    }
}

/// A sponge being absorbed into or squeezed from. `rate` in bytes.
#[derive(Clone)]
pub struct Sponge {
    state: [u64; 25],
    rate: usize,
    pos: usize,
    domain: u8,
    squeezing: bool,
}

impl Sponge {
    fn new(rate: usize, domain: u8) -> Sponge {
        Sponge {
            state: [0; 25],
            rate,
            pos: 0,
            domain,
            squeezing: false,
        }
    }

    fn xor_byte(&mut self, i: usize, b: u8) {
        self.state[i / 8] ^= (b as u64) << (8 * (i % 8));
    }

    /// Absorbs `data` (only before the first squeeze).
    pub fn absorb(&mut self, data: &[u8]) {
        debug_assert!(!self.squeezing);
        for &b in data {
            self.xor_byte(self.pos, b);
            self.pos += 1;
            if self.pos == self.rate {
                keccak_f(&mut self.state);
                self.pos = 0;
            }
        }
    }

    /// Squeezes `out.len()` more bytes.
    pub fn squeeze(&mut self, out: &mut [u8]) {
        if !self.squeezing {
            self.xor_byte(self.pos, self.domain);
            self.xor_byte(self.rate - 1, 0x80);
            keccak_f(&mut self.state);
            self.pos = 0;
            self.squeezing = true;
        }
        for o in out.iter_mut() {
            if self.pos == self.rate {
                keccak_f(&mut self.state);
                self.pos = 0;
            }
            *o = (self.state[self.pos / 8] >> (8 * (self.pos % 8))) as u8;
            self.pos += 1;
        }
    }
}

/// SHAKE128 sponge (rate 168 bytes).
pub fn shake128() -> Sponge {
    Sponge::new(168, 0x1f)
}

/// SHAKE256 sponge (rate 136 bytes).
pub fn shake256() -> Sponge {
    Sponge::new(136, 0x1f)
}

/// SHA3-256 of the concatenation of `parts`.
pub fn sha3_256(parts: &[&[u8]]) -> [u8; 32] {
    let mut s = Sponge::new(136, 0x06);
    for p in parts {
        s.absorb(p);
    }
    let mut out = [0u8; 32];
    s.squeeze(&mut out);
    out
}

/// SHA3-512 of the concatenation of `parts`.
pub fn sha3_512(parts: &[&[u8]]) -> [u8; 64] {
    let mut s = Sponge::new(72, 0x06);
    for p in parts {
        s.absorb(p);
    }
    let mut out = [0u8; 64];
    s.squeeze(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn fips202_known_answers() {
        assert_eq!(
            hex(&sha3_256(&[])),
            "a7ffc6f8bf1ed76651c14756a061d662f580ff4de43b49fa82d80a4b80f8434a"
        );
        assert_eq!(
            hex(&sha3_256(&[b"abc"])),
            "3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532"
        );
        assert_eq!(
            hex(&sha3_512(&[b"abc"])),
            "b751850b1a57168a5693cd924b6b096e08f621827444f70d884f5d0240d2712e10e116e9192af3c91a7ec57647e3934057340b4cf408d5a56592f8274eec53f0"
        );
        let mut out = [0u8; 32];
        let mut s = shake128();
        s.squeeze(&mut out);
        assert_eq!(
            hex(&out),
            "7f9c2ba4e88f827d616045507605853ed73b8093f6efbc88eb1a6eacfa66ef26"
        );
        let mut s = shake256();
        let mut out = [0u8; 32];
        s.squeeze(&mut out);
        assert_eq!(
            hex(&out),
            "46b9dd2b0ba88d13233b3feb743eeb243fcd52ea62b81b82b50c27646ed5762f"
        );
    }

    #[test]
    fn absorbing_across_the_rate_boundary_matches_one_shot() {
        let data: Vec<u8> = (0..500u32).map(|i| i as u8).collect();
        let one = sha3_256(&[&data]);
        let split = sha3_256(&[&data[..135], &data[135..137], &data[137..]]);
        assert_eq!(one, split);
        let mut a = shake128();
        a.absorb(&data);
        let mut long = [0u8; 400];
        a.squeeze(&mut long);
        let mut b = shake128();
        b.absorb(&data);
        let mut first = [0u8; 170];
        let mut rest = [0u8; 230];
        b.squeeze(&mut first);
        b.squeeze(&mut rest);
        assert_eq!(&long[..170], &first);
        assert_eq!(&long[170..], &rest);
    }
}
