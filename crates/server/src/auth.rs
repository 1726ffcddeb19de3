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
}

/// Why an upgrade is refused: HTTP status and a short body.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 401, 403 or 503.
    pub status: u16,
    /// Short text; never echoes a credential.
    pub message: &'static str,
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
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
