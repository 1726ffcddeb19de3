//! Bearer credentials, checked one way wherever they are presented: the
//! WebSocket listener's `--ws-auth` and the registry's executor and harness
//! token files.
//!
//! - [`bearer_token`]: the token of an `Authorization: Bearer …` header;
//! - [`Digest`]: a token known by its SHA-256, compared in constant time;
//! - [`JwtRules`]: an HS256 JWT signed with a shared secret (`exp` required,
//!   `exp`/`nbf` with leeway, `iss` and one `aud` member when given).
//!
//! No credential is ever part of an error.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use sha2::{Digest as _, Sha256};

/// Smallest accepted HS256 shared secret: 32 bytes.
pub const MIN_SHARED_SECRET_BYTES: usize = 32;

/// Why an `Authorization` header carries no usable bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// Not UTF-8, not `SCHEME TOKEN`, or a scheme other than `Bearer`
    /// (compared without regard to case).
    Malformed,
}

/// The token of an `Authorization` header value (`Bearer TOKEN`), trimmed.
pub fn bearer_token(header: &[u8]) -> Result<&str, HeaderError> {
    let header = std::str::from_utf8(header).map_err(|_| HeaderError::Malformed)?;
    let (scheme, token) = header
        .trim()
        .split_once(' ')
        .ok_or(HeaderError::Malformed)?;
    match scheme.eq_ignore_ascii_case("bearer") {
        true => Ok(token.trim()),
        false => Err(HeaderError::Malformed),
    }
}

/// Equal bytes, compared in time that does not depend on where they differ
/// (only on the lengths).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A token known only by its SHA-256 (32 bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Digest(pub [u8; 32]);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Digest(..)")
    }
}

impl Digest {
    /// The digest of `token` (trimmed of surrounding white space).
    pub fn of(token: &str) -> Digest {
        Digest(Sha256::digest(token.trim().as_bytes()).into())
    }

    /// Whether `token` (trimmed) is the one this digest was made of, in
    /// constant time.
    pub fn matches(&self, token: &str) -> bool {
        constant_time_eq(&Digest::of(token).0, &self.0)
    }
}

/// What an HS256 bearer JWT must satisfy.
#[derive(Clone)]
pub struct JwtRules {
    /// The shared HMAC secret (at least [`MIN_SHARED_SECRET_BYTES`]).
    pub secret: Vec<u8>,
    /// Required `iss`, if set.
    pub issuer: Option<String>,
    /// Required member of `aud`, if set.
    pub audience: Option<String>,
    /// Allowed clock difference for `exp` and `nbf`, in seconds.
    pub max_clock_skew_seconds: u64,
}

impl std::fmt::Debug for JwtRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtRules").finish_non_exhaustive()
    }
}

/// Why a JWT is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtRefusal {
    /// Well signed, but past its `exp` (beyond the leeway).
    Expired,
    /// Anything else: bad signature, algorithm, claims or shape.
    Invalid,
}

impl JwtRules {
    /// Checks `token`: HS256 only, `exp` required, `exp` and `nbf` with
    /// [`JwtRules::max_clock_skew_seconds`] of leeway, `iss` and one `aud`
    /// member when the rules name them.
    pub fn check(&self, token: &str) -> Result<(), JwtRefusal> {
        use jsonwebtoken::{decode, errors::ErrorKind, Algorithm, DecodingKey, Validation};
        let mut v = Validation::new(Algorithm::HS256);
        v.leeway = self.max_clock_skew_seconds;
        v.validate_exp = true;
        v.validate_nbf = true;
        // A claim the rules name must be there: jsonwebtoken checks `iss`
        // and `aud` only when present, so a token without them passed.
        let mut required = vec!["exp"];
        required.extend(self.issuer.as_ref().map(|_| "iss"));
        required.extend(self.audience.as_ref().map(|_| "aud"));
        v.set_required_spec_claims(&required);
        match &self.issuer {
            Some(i) => v.set_issuer(&[i]),
            None => v.iss = None,
        }
        match &self.audience {
            Some(a) => v.set_audience(&[a]),
            None => v.validate_aud = false,
        }
        match decode::<serde_json::Value>(token, &DecodingKey::from_secret(&self.secret), &v) {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.kind(), ErrorKind::ExpiredSignature) => Err(JwtRefusal::Expired),
            Err(_) => Err(JwtRefusal::Invalid),
        }
    }
}

/// Minting credentials for tests of the checks above (the listener's, the
/// registry's): never used by a server to accept anything.
pub mod testing {
    /// Seconds since the Unix epoch now (0 before it).
    pub fn unix_now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }

    /// An HS256 JWT of `claims` signed with `secret`; `None` if the claims
    /// cannot be encoded.
    pub fn hs256(secret: &[u8], claims: &serde_json::Value) -> Option<String> {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            claims,
            &jsonwebtoken::EncodingKey::from_secret(secret),
        )
        .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::unix_now as now;
    use super::*;

    fn jwt(secret: &[u8], claims: serde_json::Value) -> String {
        testing::hs256(secret, &claims).unwrap()
    }

    #[test]
    fn headers() {
        assert_eq!(bearer_token(b" Bearer  abc "), Ok("abc"));
        assert_eq!(bearer_token(b"bearer abc"), Ok("abc"));
        assert_eq!(bearer_token(b"Basic abc"), Err(HeaderError::Malformed));
        assert_eq!(bearer_token(b"Bearer"), Err(HeaderError::Malformed));
        assert_eq!(bearer_token(b"Bearer \xff"), Err(HeaderError::Malformed));
    }

    #[test]
    fn digests() {
        let d = Digest::of("alpha");
        assert!(d.matches(" alpha\n"));
        assert!(!d.matches("alphb"));
        assert!(!constant_time_eq(b"ab", b"abc"));
        assert_eq!(format!("{d:?}"), "Digest(..)");
    }

    #[test]
    fn jwts() {
        let secret = [7u8; 32];
        let rules = JwtRules {
            secret: secret.to_vec(),
            issuer: Some("me".into()),
            audience: Some("exec".into()),
            max_clock_skew_seconds: 30,
        };
        let ok = serde_json::json!({"exp": now() + 60, "iss": "me", "aud": ["x", "exec"]});
        assert_eq!(rules.check(&jwt(&secret, ok.clone())), Ok(()));
        assert_eq!(rules.check(&jwt(&[8u8; 32], ok)), Err(JwtRefusal::Invalid));
        let old = serde_json::json!({"exp": now() - 120, "iss": "me", "aud": "exec"});
        assert_eq!(rules.check(&jwt(&secret, old)), Err(JwtRefusal::Expired));
        let skewed = serde_json::json!({"exp": now() - 10, "iss": "me", "aud": "exec"});
        assert_eq!(rules.check(&jwt(&secret, skewed)), Ok(()));
        let no_exp = serde_json::json!({"iss": "me", "aud": "exec"});
        assert_eq!(rules.check(&jwt(&secret, no_exp)), Err(JwtRefusal::Invalid));
        let wrong_iss = serde_json::json!({"exp": now() + 60, "iss": "you", "aud": "exec"});
        assert_eq!(
            rules.check(&jwt(&secret, wrong_iss)),
            Err(JwtRefusal::Invalid)
        );
        let future =
            serde_json::json!({"exp": now() + 600, "nbf": now() + 300, "iss": "me", "aud": "exec"});
        assert_eq!(rules.check(&jwt(&secret, future)), Err(JwtRefusal::Invalid));
        assert_eq!(rules.check("not.a.jwt"), Err(JwtRefusal::Invalid));
        // Named claims are required, not only checked when present.
        for claims in [
            serde_json::json!({"exp": now() + 60}),
            serde_json::json!({"exp": now() + 60, "aud": "exec"}),
            serde_json::json!({"exp": now() + 60, "iss": "me"}),
            serde_json::json!({"exp": now() + 60, "iss": null, "aud": null}),
            serde_json::json!({"exp": now() + 60, "iss": "me", "aud": null}),
        ] {
            assert_eq!(
                rules.check(&jwt(&secret, claims.clone())),
                Err(JwtRefusal::Invalid),
                "{claims}"
            );
        }
        // Rules that name neither accept a token without them.
        let open = JwtRules {
            issuer: None,
            audience: None,
            ..rules
        };
        let bare = serde_json::json!({"exp": now() + 60});
        assert_eq!(open.check(&jwt(&secret, bare)), Ok(()));
    }
}
