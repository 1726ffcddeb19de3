//! Random values matching a custom provider's pattern, generated from the
//! pattern alone (never from the secret, so a placeholder reveals nothing of
//! it): literals kept, a class yields one of its characters (printable ASCII
//! ones preferred), a repetition repeats between its bounds (at most
//! [`MAX_EXTRA_REPEAT`] beyond the minimum), an alternation picks a branch,
//! look-arounds yield nothing.

use regex_syntax::hir::{Class, Hir, HirKind};
use ring::rand::{SecureRandom, SystemRandom};

/// Most repetitions beyond a repetition's minimum.
const MAX_EXTRA_REPEAT: u32 = 16;
/// Longest value generated: 2048 bytes.
const MAX_BYTES: usize = 2048;

struct Rng(SystemRandom);

impl Rng {
    /// A uniform-enough number below `n` (n > 0); `None` if the OS fails.
    fn below(&self, n: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.0.fill(&mut b).ok()?;
        Some(u64::from_le_bytes(b) % n)
    }
}

/// One random value of `pattern`, `None` when it cannot be parsed, needs a
/// byte class, or grows past [`MAX_BYTES`].
pub fn generate(pattern: &str) -> Option<String> {
    let hir = regex_syntax::parse(pattern).ok()?;
    let rng = Rng(SystemRandom::new());
    let mut out = String::new();
    walk(&hir, &rng, &mut out)?;
    Some(out)
}

fn walk(h: &Hir, rng: &Rng, out: &mut String) -> Option<()> {
    if out.len() > MAX_BYTES {
        return None;
    }
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) => {}
        HirKind::Literal(l) => out.push_str(std::str::from_utf8(&l.0).ok()?),
        HirKind::Class(Class::Unicode(c)) => {
            let ascii: Vec<(u32, u32)> = c
                .ranges()
                .iter()
                .filter_map(|r| {
                    let (lo, hi) = (u32::from(r.start()).max(0x21), u32::from(r.end()).min(0x7e));
                    (lo <= hi).then_some((lo, hi))
                })
                .collect();
            let ranges: Vec<(u32, u32)> = if ascii.is_empty() {
                c.ranges()
                    .iter()
                    .map(|r| (u32::from(r.start()), u32::from(r.end())))
                    .collect()
            } else {
                ascii
            };
            let total: u64 = ranges.iter().map(|(a, b)| u64::from(b - a) + 1).sum();
            if total == 0 {
                return None;
            }
            let mut k = rng.below(total)?;
            for (a, b) in ranges {
                let n = u64::from(b - a) + 1;
                if k < n {
                    out.push(char::from_u32(a + u32::try_from(k).ok()?)?);
                    return Some(());
                }
                k -= n;
            }
            return None;
        }
        HirKind::Class(Class::Bytes(_)) => return None,
        HirKind::Repetition(r) => {
            let max = r
                .max
                .unwrap_or(u32::MAX)
                .min(r.min.saturating_add(MAX_EXTRA_REPEAT));
            let n = r.min + u32::try_from(rng.below(u64::from(max - r.min) + 1)?).ok()?;
            for _ in 0..n {
                walk(&r.sub, rng, out)?;
            }
        }
        HirKind::Capture(c) => walk(&c.sub, rng, out)?,
        HirKind::Concat(v) => {
            for s in v {
                walk(s, rng, out)?;
            }
        }
        HirKind::Alternation(v) => {
            let i = usize::try_from(rng.below(v.len() as u64)?).ok()?;
            walk(&v[i], rng, out)?;
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_their_pattern() {
        for p in [
            "tok_[0-9a-f]{16}",
            "vendor_[a-z]{24}",
            "(sk|pk)_(live|test)_[A-Za-z0-9]{8,32}",
            r"\bkey-\w+\b",
            "x+y*",
        ] {
            let re = regex::Regex::new(&format!("^(?:{p})$")).unwrap();
            for _ in 0..20 {
                let v = generate(p).unwrap();
                assert!(re.is_match(&v), "{p}: {v:?}");
            }
        }
        assert!(generate("(?-u)\\xff").is_none());
        assert!(generate("(").is_none());
    }
}
