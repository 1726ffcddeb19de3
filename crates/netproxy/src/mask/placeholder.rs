//! Placeholders: random values shaped like the secret they stand for, so a
//! client that checks a key's shape before using it still accepts them. A
//! built-in provider's keeps the key kind's public prefix (`ghp_`,
//! `sk-proj-`) and the secret's length and character classes; a custom
//! provider's is generated from its pattern.

use ring::rand::{SecureRandom, SystemRandom};

/// Random bytes from the OS; `None` only if the OS generator fails.
fn random_bytes(n: usize) -> Option<Vec<u8>> {
    let mut v = vec![0u8; n];
    SystemRandom::new().fill(&mut v).ok()?;
    Some(v)
}

/// `prefix` followed by random characters shaped like `real` from byte
/// `prefix.len()` on: a digit stays a digit, an upper-case letter an upper-case
/// letter, any other ASCII alphanumeric (or a position past `real`'s end) a
/// lower-case letter, and everything else (punctuation, non-ASCII bytes) is
/// copied. At least `min_len` bytes long. `None` when the OS generator fails
/// or the result would not be UTF-8 (a prefix that cuts a character).
pub fn shaped(real: &str, prefix: &str, min_len: usize) -> Option<String> {
    let target = real.len().max(min_len).max(prefix.len());
    let rnd = random_bytes(target)?;
    let mut out = prefix.as_bytes().to_vec();
    for (i, r) in rnd.iter().enumerate().take(target).skip(prefix.len()) {
        let c = match real.as_bytes().get(i).copied() {
            Some(t) if !t.is_ascii_alphanumeric() => t,
            Some(t) if t.is_ascii_digit() => b'0' + r % 10,
            Some(t) if t.is_ascii_uppercase() => b'A' + r % 26,
            _ => b'a' + r % 26,
        };
        out.push(c);
    }
    String::from_utf8(out).ok()
}

/// GitHub token prefixes kept in a placeholder (`ghp_` when none matches).
const GITHUB_PREFIXES: [&str; 6] = ["github_pat_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_"];

/// A GitHub token's placeholder: its kind's prefix, at least 40 bytes.
pub fn github(real: &str) -> Option<String> {
    let prefix = GITHUB_PREFIXES
        .iter()
        .copied()
        .find(|p| real.starts_with(p))
        .unwrap_or("ghp_");
    shaped(real, prefix, 40)
}

/// An OpenAI key's placeholder: `sk-` and the key kind (`sk-proj-`…), at
/// least 51 bytes.
pub fn openai(real: &str) -> Option<String> {
    let prefix = match real.strip_prefix("sk-") {
        Some(rest) => rest.find('-').map_or("sk-", |i| &real[..i + 4]),
        None => "sk-",
    };
    shaped(real, prefix, 51)
}

/// Attempts per pattern.
const ATTEMPTS: usize = 16;

/// A custom provider's placeholder: a value generated from one of its
/// `patterns` (never from `real`, so it reveals nothing of the secret) that
/// `accept`s (matches a pattern in full, is usable in a header) and differs
/// from `real`.
pub fn matching(real: &str, patterns: &[String], accept: impl Fn(&str) -> bool) -> Option<String> {
    for p in patterns {
        for _ in 0..ATTEMPTS {
            let Some(c) = super::generate::generate(p) else {
                break;
            };
            if c != real && accept(&c) {
                return Some(c);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let real = "ghp_AbC123-xyz";
        let p = github(real).unwrap();
        assert!(p.starts_with("ghp_") && p.len() == 40, "{p}");
        assert_ne!(p, github(real).unwrap(), "random");
        assert_eq!(&p[10..11], "-", "punctuation kept: {p}");
        assert!(p[4..7]
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_lowercase()));
        let p = openai("sk-proj-abcdefghijklmnop").unwrap();
        assert!(p.starts_with("sk-proj-") && p.len() == 51, "{p}");
        let p = openai("weird").unwrap();
        assert!(p.starts_with("sk-"), "{p}");
        let re = regex::Regex::new("^vendor_[a-z]{24}$").unwrap();
        let real = format!("vendor_{}", "q".repeat(24));
        let pats = ["vendor_[a-z]{24}".to_string()];
        let p = matching(&real, &pats, |c| re.is_match(c)).unwrap();
        assert!(re.is_match(&p) && p != real, "{p}");
        assert!(matching("abc", &pats, |_| false).is_none());
        assert!(shaped("é", "", 0).is_some(), "non-ASCII copied whole");
    }
}
