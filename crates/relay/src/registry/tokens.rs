//! Bearer tokens for executors (`--executor-tokens FILE`) and harnesses
//! (`--harness-tokens FILE`). One entry a line, `#` starts a comment:
//!
//! ```text
//! [ENV_ID] TOKEN                     a plain token (only its SHA-256 is kept)
//! [ENV_ID] sha256:HEX                the SHA-256 of a token
//! [ENV_ID] hs256:SECRET [iss=I] [aud=A] [skew=SECONDS]
//!                                    any HS256 JWT signed with SECRET (>= 32 bytes)
//! ```
//!
//! `ENV_ID` limits the entry to one environment. JWTs are checked as the
//! listener's `--ws-auth signed-bearer-token` checks them: HS256 only, `exp`
//! required, `exp`/`nbf` with `skew` seconds of leeway (default 30), `iss` and
//! one `aud` member required when given. Digests compare in constant time.

use exec_server_auth::{Digest, JwtRules};
use hex::FromHex;

/// Smallest accepted HS256 secret: 32 bytes (as the listener).
pub const MIN_JWT_SECRET_BYTES: usize = exec_server_auth::MIN_SHARED_SECRET_BYTES;

#[derive(Debug, Clone)]
enum Check {
    Digest(Digest),
    Jwt(JwtRules),
}

/// A parsed token file.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<(Option<String>, Check)>,
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
            let words: Vec<&str> = line.split_whitespace().collect();
            let options = words
                .iter()
                .rev()
                .take_while(|w| ["iss=", "aud=", "skew="].iter().any(|p| w.starts_with(p)))
                .count();
            let (head, options) = words.split_at(words.len() - options);
            let (env, tok) = match head {
                [t] => (None, *t),
                [e, t] => (Some(e.to_string()), *t),
                _ => return Err(format!("line {}: expected `[ENV_ID] TOKEN`", n + 1)),
            };
            if let Some(secret) = tok.strip_prefix("hs256:") {
                entries.push((env, Check::Jwt(jwt_rule(secret, options, n + 1)?)));
                continue;
            }
            if !options.is_empty() {
                return Err(format!("line {}: iss=/aud=/skew= go with hs256:", n + 1));
            }
            let digest = match tok.strip_prefix("sha256:") {
                Some(hex) => Digest(
                    <[u8; 32]>::from_hex(hex)
                        .map_err(|_| format!("line {}: sha256: needs 64 hex digits", n + 1))?,
                ),
                None => Digest::of(tok),
            };
            entries.push((env, Check::Digest(digest)));
        }
        if entries.is_empty() {
            return Err("no tokens".into());
        }
        Ok(Tokens { entries })
    }

    /// Whether `bearer` may act on `environment_id`. Every entry is checked,
    /// whatever the first match, and digests compare in constant time.
    pub fn allows(&self, bearer: &str, environment_id: &str) -> bool {
        let bearer = bearer.trim();
        let mut ok = false;
        for (env, check) in &self.entries {
            if env.as_deref().is_some_and(|e| e != environment_id) {
                continue;
            }
            ok |= match check {
                Check::Digest(want) => want.matches(bearer),
                Check::Jwt(rules) => rules.check(bearer).is_ok(),
            };
        }
        ok
    }
}

fn jwt_rule(secret: &str, options: &[&str], line: usize) -> Result<JwtRules, String> {
    if secret.len() < MIN_JWT_SECRET_BYTES {
        return Err(format!(
            "line {line}: an hs256 secret needs at least {MIN_JWT_SECRET_BYTES} bytes"
        ));
    }
    let mut rule = JwtRules {
        secret: secret.as_bytes().to_vec(),
        issuer: None,
        audience: None,
        max_clock_skew_seconds: 30,
    };
    for o in options {
        if let Some(v) = o.strip_prefix("iss=") {
            rule.issuer = Some(v.to_string());
        } else if let Some(v) = o.strip_prefix("aud=") {
            rule.audience = Some(v.to_string());
        } else if let Some(v) = o.strip_prefix("skew=") {
            rule.max_clock_skew_seconds = v
                .parse()
                .map_err(|_| format!("line {line}: skew= takes seconds"))?;
        }
    }
    Ok(rule)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_hashed_and_scoped_tokens() {
        let hashed: String = Digest::of("beta")
            .0
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let t = Tokens::parse(&format!("# c\nalpha\nsha256:{hashed}\nenv1 gamma\n")).unwrap();
        assert!(t.allows("alpha", "x"));
        assert!(t.allows("beta", "x"));
        assert!(t.allows("gamma", "env1"));
        assert!(!t.allows("gamma", "env2"));
        assert!(!t.allows("delta", "env1"));
        assert!(Tokens::parse("a b c").is_err());
        assert!(Tokens::parse("sha256:12").is_err());
        assert!(Tokens::parse("\n#\n").is_err());
        assert!(Tokens::parse("alpha iss=x").is_err());
    }

    use exec_server_auth::testing::unix_now as now;

    fn jwt(secret: &[u8], claims: serde_json::Value) -> String {
        exec_server_auth::testing::hs256(secret, &claims).unwrap()
    }

    #[test]
    fn hs256_jwts_as_the_listener_checks_them() {
        let secret = "0123456789abcdef0123456789abcdef";
        let t = Tokens::parse(&format!(
            "hs256:{secret} iss=me aud=exec\nenv1 hs256:{secret}xyz skew=0\n"
        ))
        .unwrap();
        let exp = now() + 600;
        let good = jwt(
            secret.as_bytes(),
            serde_json::json!({"exp": exp, "iss": "me", "aud": "exec"}),
        );
        assert!(t.allows(&good, "any"));
        assert!(t.allows(&format!(" {good} "), "any"));
        let mut tampered = good.clone();
        tampered.pop();
        tampered.push(if good.ends_with('A') { 'B' } else { 'A' });
        assert!(!t.allows(&tampered, "any"));
        for bad in [
            serde_json::json!({"exp": exp, "iss": "other", "aud": "exec"}),
            serde_json::json!({"exp": exp, "iss": "me", "aud": "else"}),
            serde_json::json!({"iss": "me", "aud": "exec"}),
            serde_json::json!({"exp": now() - 120, "iss": "me", "aud": "exec"}),
            serde_json::json!({"exp": exp, "nbf": now() + 120, "iss": "me", "aud": "exec"}),
        ] {
            assert!(
                !t.allows(&jwt(secret.as_bytes(), bad.clone()), "any"),
                "{bad}"
            );
        }
        assert!(!t.allows(
            &jwt(
                b"another-secret-another-secret-xx",
                serde_json::json!({"exp": exp, "iss": "me", "aud": "exec"})
            ),
            "any"
        ));
        // The scoped entry: its own secret, only for env1, no iss/aud needed.
        let scoped = jwt(
            format!("{secret}xyz").as_bytes(),
            serde_json::json!({"exp": exp}),
        );
        assert!(t.allows(&scoped, "env1"));
        assert!(!t.allows(&scoped, "env2"));
        let none = jsonwebtoken::Header {
            alg: jsonwebtoken::Algorithm::HS512,
            ..Default::default()
        };
        let hs512 = jsonwebtoken::encode(
            &none,
            &serde_json::json!({"exp": exp}),
            &jsonwebtoken::EncodingKey::from_secret(format!("{secret}xyz").as_bytes()),
        )
        .unwrap();
        assert!(!t.allows(&hs512, "env1"), "only HS256");
        assert!(Tokens::parse("hs256:short").is_err());
        assert!(Tokens::parse(&format!("hs256:{secret} skew=x")).is_err());
    }
}
