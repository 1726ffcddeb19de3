//! WebSocket upgrade checks: `Origin` is refused (403), and with `--ws-auth` a
//! bearer token is required (401).

use sha2::{Digest, Sha256};

/// How upgrades are authenticated.
#[derive(Clone)]
pub enum WsAuth {
    /// `--ws-auth capability-token`: SHA-256 of the expected bearer token.
    CapabilityToken {
        /// SHA-256 digest of the token.
        sha256: [u8; 32],
    },
    /// `--ws-auth signed-bearer-token`: an HS256 JWT signed with a shared secret.
    SignedBearerToken(JwtRules),
}

/// What a signed bearer token must satisfy.
#[derive(Clone)]
pub struct JwtRules {
    /// The shared HMAC secret (at least 32 bytes).
    pub secret: Vec<u8>,
    /// Required `iss`, if set.
    pub issuer: Option<String>,
    /// Required member of `aud`, if set.
    pub audience: Option<String>,
    /// Allowed clock difference for `exp` and `nbf`, in seconds.
    pub max_clock_skew_seconds: u64,
}

/// Smallest accepted shared secret for signed bearer tokens: 32 bytes.
pub const MIN_SHARED_SECRET_BYTES: usize = 32;

fn check_jwt(rules: &JwtRules, token: &str) -> Result<(), Refusal> {
    use jsonwebtoken::{decode, errors::ErrorKind, Algorithm, DecodingKey, Validation};
    let mut v = Validation::new(Algorithm::HS256);
    v.leeway = rules.max_clock_skew_seconds;
    v.validate_exp = true;
    v.validate_nbf = true;
    v.set_required_spec_claims(&["exp"]);
    match &rules.issuer {
        Some(i) => v.set_issuer(&[i]),
        None => v.iss = None,
    }
    match &rules.audience {
        Some(a) => v.set_audience(&[a]),
        None => v.validate_aud = false,
    }
    match decode::<serde_json::Value>(token, &DecodingKey::from_secret(&rules.secret), &v) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), ErrorKind::ExpiredSignature) => Err(Refusal {
            status: 401,
            message: "expired websocket jwt",
        }),
        Err(_) => Err(Refusal {
            status: 401,
            message: "invalid websocket jwt",
        }),
    }
}

/// Why an upgrade is refused: HTTP status and a short body.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 401, 403 or 503.
    pub status: u16,
    /// Short text; never echoes a credential.
    pub message: &'static str,
}

/// Equal bytes, compared in time that does not depend on where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks an upgrade request's headers.
pub fn check_upgrade(
    auth: Option<&WsAuth>,
    origin: Option<&[u8]>,
    authorization: Option<&[u8]>,
) -> Result<(), Refusal> {
    if origin.is_some() {
        return Err(Refusal {
            status: 403,
            message: "websocket upgrades with an Origin header are not allowed",
        });
    }
    let Some(auth) = auth else { return Ok(()) };
    let Some(header) = authorization else {
        return Err(Refusal {
            status: 401,
            message: "missing websocket bearer token",
        });
    };
    let header = std::str::from_utf8(header).map_err(|_| Refusal {
        status: 401,
        message: "invalid authorization header",
    })?;
    let (scheme, token) = header.trim().split_once(' ').ok_or(Refusal {
        status: 401,
        message: "invalid authorization header",
    })?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Refusal {
            status: 401,
            message: "invalid authorization header",
        });
    }
    match auth {
        WsAuth::SignedBearerToken(rules) => check_jwt(rules, token.trim()),
        WsAuth::CapabilityToken { sha256 } => {
            let got = Sha256::digest(token.trim().as_bytes());
            if constant_time_eq(&got, sha256) {
                Ok(())
            } else {
                Err(Refusal {
                    status: 401,
                    message: "invalid websocket bearer token",
                })
            }
        }
    }
}

/// The digest for a token.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.trim().as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_and_tokens() {
        assert_eq!(
            check_upgrade(None, Some(b"http://x"), None)
                .unwrap_err()
                .status,
            403
        );
        assert!(check_upgrade(None, None, None).is_ok());
        let auth = WsAuth::CapabilityToken {
            sha256: token_digest("s3cret"),
        };
        assert_eq!(
            check_upgrade(Some(&auth), None, None).unwrap_err().status,
            401
        );
        assert_eq!(
            check_upgrade(Some(&auth), None, Some(b"Bearer nope"))
                .unwrap_err()
                .status,
            401
        );
        assert_eq!(
            check_upgrade(Some(&auth), None, Some(b"Basic s3cret"))
                .unwrap_err()
                .status,
            401
        );
        assert!(check_upgrade(Some(&auth), None, Some(b"bearer  s3cret ")).is_ok());
    }
}

#[cfg(test)]
mod jwt_tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn token(secret: &[u8], claims: serde_json::Value) -> String {
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    #[test]
    fn signed_bearer_tokens() {
        let secret = b"0123456789abcdef0123456789abcdef".to_vec();
        let rules = JwtRules {
            secret: secret.clone(),
            issuer: Some("me".into()),
            audience: Some("exec".into()),
            max_clock_skew_seconds: 30,
        };
        let auth = WsAuth::SignedBearerToken(rules);
        let check =
            |t: &str| check_upgrade(Some(&auth), None, Some(format!("Bearer {t}").as_bytes()));
        let good = token(
            &secret,
            serde_json::json!({"exp": now() + 60, "iss": "me", "aud": ["x", "exec"]}),
        );
        assert!(check(&good).is_ok());
        let expired = token(
            &secret,
            serde_json::json!({"exp": now() - 120, "iss": "me", "aud": "exec"}),
        );
        assert_eq!(
            check(&expired).unwrap_err().message,
            "expired websocket jwt"
        );
        let skewed = token(
            &secret,
            serde_json::json!({"exp": now() - 10, "iss": "me", "aud": "exec"}),
        );
        assert!(check(&skewed).is_ok(), "within the clock skew");
        let early = token(
            &secret,
            serde_json::json!({"exp": now() + 600, "nbf": now() + 300, "iss": "me", "aud": "exec"}),
        );
        assert!(check(&early).is_err());
        let wrong_iss = token(
            &secret,
            serde_json::json!({"exp": now() + 60, "iss": "other", "aud": "exec"}),
        );
        assert!(check(&wrong_iss).is_err());
        let wrong_aud = token(
            &secret,
            serde_json::json!({"exp": now() + 60, "iss": "me", "aud": "nope"}),
        );
        assert!(check(&wrong_aud).is_err());
        let no_exp = token(&secret, serde_json::json!({"iss": "me", "aud": "exec"}));
        assert!(check(&no_exp).is_err());
        let other_key = token(
            b"another-secret-another-secret-xx",
            serde_json::json!({"exp": now() + 60, "iss": "me", "aud": "exec"}),
        );
        assert_eq!(check(&other_key).unwrap_err().status, 401);
    }
}
