//! Bearer tokens for executors (`--executor-tokens FILE`) and harnesses
//! (`--harness-tokens FILE`). One entry a line: `TOKEN`, `sha256:HEX`, or either
//! preceded by `ENV_ID ` to limit it to one environment; `#` starts a comment.
//! Only SHA-256 digests are kept, compared in constant time.

use ring::digest;

/// A parsed token file.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<(Option<String>, [u8; 32])>,
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, b).as_ref());
    out
}

impl Tokens {
    /// Parses the file's text. Errors name the line (never its content).
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (env, tok) = match (parts.next(), parts.next(), parts.next()) {
                (Some(t), None, None) => (None, t),
                (Some(e), Some(t), None) => (Some(e.to_string()), t),
                _ => return Err(format!("line {}: expected `[ENV_ID] TOKEN`", n + 1)),
            };
            let digest = match tok.strip_prefix("sha256:") {
                Some(hex) => {
                    let b: Vec<u8> = (0..hex.len() / 2)
                        .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
                        .collect();
                    b.try_into()
                        .map_err(|_| format!("line {}: sha256: needs 64 hex digits", n + 1))?
                }
                None => sha256(tok.as_bytes()),
            };
            entries.push((env, digest));
        }
        if entries.is_empty() {
            return Err("no tokens".into());
        }
        Ok(Tokens { entries })
    }

    /// Whether `bearer` may act on `environment_id`.
    pub fn allows(&self, bearer: &str, environment_id: &str) -> bool {
        let d = sha256(bearer.trim().as_bytes());
        let mut ok = false;
        for (env, want) in &self.entries {
            // Constant time: every byte is compared whatever the first difference.
            let same = d.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
            if same && env.as_deref().is_none_or(|e| e == environment_id) {
                ok = true;
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_hashed_and_scoped_tokens() {
        let hashed: String = sha256(b"beta").iter().map(|b| format!("{b:02x}")).collect();
        let t = Tokens::parse(&format!("# c\nalpha\nsha256:{hashed}\nenv1 gamma\n")).unwrap();
        assert!(t.allows("alpha", "x"));
        assert!(t.allows("beta", "x"));
        assert!(t.allows("gamma", "env1"));
        assert!(!t.allows("gamma", "env2"));
        assert!(!t.allows("delta", "env1"));
        assert!(Tokens::parse("a b c").is_err());
        assert!(Tokens::parse("sha256:12").is_err());
        assert!(Tokens::parse("\n#\n").is_err());
    }
}
