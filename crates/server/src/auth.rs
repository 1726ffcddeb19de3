//! WebSocket upgrade checks: `Origin` is refused (403), and with `--ws-auth` a
//! bearer token is required (401).

use exec_server_auth::{bearer_token, Digest, JwtRefusal};
pub use exec_server_auth::{constant_time_eq, JwtRules, MIN_SHARED_SECRET_BYTES};

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

/// Why an upgrade is refused: HTTP status and a short body.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 401, 403 or 503.
    pub status: u16,
    /// Short text; never echoes a credential.
    pub message: &'static str,
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
    let token = bearer_token(header).map_err(|_| Refusal {
        status: 401,
        message: "invalid authorization header",
    })?;
    match auth {
        WsAuth::SignedBearerToken(rules) => rules.check(token).map_err(|e| Refusal {
            status: 401,
            message: match e {
                JwtRefusal::Expired => "expired websocket jwt",
                JwtRefusal::Invalid => "invalid websocket jwt",
            },
        }),
        WsAuth::CapabilityToken { sha256 } => match Digest(*sha256).matches(token) {
            true => Ok(()),
            false => Err(Refusal {
                status: 401,
                message: "invalid websocket bearer token",
            }),
        },
    }
}

/// The digest for a token.
pub fn token_digest(token: &str) -> [u8; 32] {
    Digest::of(token).0
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
    use exec_server_auth::testing::unix_now as now;

    fn token(secret: &[u8], claims: serde_json::Value) -> String {
        exec_server_auth::testing::hs256(secret, &claims).unwrap()
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
