//! Signed, expiring relay URLs: `{base}/relay?role=R&env=E&reg=G&exp=T&v=1[&n=NONCE]&sig=HEX`,
//! `sig` = HMAC-SHA256 over the other parameters with the store's signing key.
//! A harness URL carries a nonce `n` that makes it single use (the registry
//! keeps it in its store until the first upgrade takes it); an executor URL
//! has none, since the executor reconnects with the same URL.
//! A refusal names one of the reference's rejection reasons.

use hex::FromHex;
use ring::hmac;

/// Version of the URL format (`v`).
const URL_VERSION: &str = "1";

/// Who may upgrade with a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The registered executor (one socket, many streams).
    Executor,
    /// A harness (one socket, one stream).
    Harness,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Executor => "executor",
            Role::Harness => "harness",
        }
    }
}

/// What a valid URL grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Role.
    pub role: Role,
    /// Environment id.
    pub environment_id: String,
    /// Registration id the URL was issued for.
    pub registration_id: String,
    /// The single-use nonce (`n`, 32 hex digits) of a harness URL; `None`
    /// for an executor URL, and for a harness URL signed without one.
    pub nonce: Option<String>,
}

/// The signed bytes: each part length-prefixed; the nonce, when there is
/// one, last (a URL without one signs exactly what it always did).
fn mac_input(role: &str, env: &str, reg: &str, exp: &str, nonce: Option<&str>) -> Vec<u8> {
    let mut m = Vec::new();
    for part in [URL_VERSION, role, env, reg, exp].into_iter().chain(nonce) {
        m.extend_from_slice(&(part.len() as u64).to_be_bytes());
        m.extend_from_slice(part.as_bytes());
    }
    m
}

/// The query string (after `?`) for a URL valid until `expires_unix`.
pub fn sign(key: &[u8; 32], grant: &Grant, expires_unix: u64) -> String {
    let exp = expires_unix.to_string();
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    let tag = hmac::sign(
        &k,
        &mac_input(
            grant.role.as_str(),
            &grant.environment_id,
            &grant.registration_id,
            &exp,
            grant.nonce.as_deref(),
        ),
    );
    let sig: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    query
        .append_pair("role", grant.role.as_str())
        .append_pair("env", &grant.environment_id)
        .append_pair("reg", &grant.registration_id)
        .append_pair("exp", &exp)
        .append_pair("v", URL_VERSION);
    if let Some(n) = &grant.nonce {
        query.append_pair("n", n);
    }
    query.append_pair("sig", &sig).finish()
}

/// Checks a query string; the error is the rejection reason (wire value of
/// `x-codex-rendezvous-rejection-reason`).
pub fn verify(key: &[u8; 32], query: &str, now_unix: u64) -> Result<Grant, &'static str> {
    let (mut role, mut env, mut reg, mut exp, mut v, mut sig, mut nonce) =
        (None, None, None, None, None, None, None);
    for (k, val) in url::form_urlencoded::parse(query.as_bytes()) {
        let slot = match k.as_ref() {
            "role" => &mut role,
            "env" => &mut env,
            "reg" => &mut reg,
            "exp" => &mut exp,
            "v" => &mut v,
            "sig" => &mut sig,
            "n" => &mut nonce,
            _ => return Err("extra_query_param"),
        };
        if slot.replace(val.into_owned()).is_some() {
            return Err("malformed_query");
        }
    }
    let role_s = role.ok_or("missing_role")?;
    let exp_s = exp.ok_or("missing_expiry")?;
    let sig = sig.ok_or("missing_signature")?;
    let v = v.ok_or("missing_version")?;
    let reg = reg.ok_or("missing_executor_registration_id")?;
    let env = env.ok_or("malformed_query")?;
    if v != URL_VERSION {
        return Err("malformed_query");
    }
    let role = match role_s.as_str() {
        "executor" => Role::Executor,
        "harness" => Role::Harness,
        _ => return Err("invalid_role"),
    };
    let expires: u64 = exp_s.parse().map_err(|_| "invalid_expiry")?;
    // Strict: one spelling per signature (pairs that did not parse were
    // skipped, so `zz` or a stray digit anywhere still verified).
    let sig_bytes = <[u8; 32]>::from_hex(&sig).map_err(|_| "invalid_signature")?;
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    let signed = mac_input(&role_s, &env, &reg, &exp_s, nonce.as_deref());
    hmac::verify(&k, &signed, &sig_bytes).map_err(|_| "invalid_signature")?;
    if expires < now_unix {
        return Err("expired");
    }
    Ok(Grant {
        role,
        environment_id: env,
        registration_id: reg,
        nonce,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_tamper_expire() {
        let key = [3u8; 32];
        let g = Grant {
            role: Role::Harness,
            environment_id: "dev box/1".into(),
            registration_id: "reg_1".into(),
            nonce: None,
        };
        let q = sign(&key, &g, 1000);
        assert_eq!(verify(&key, &q, 999), Ok(g.clone()));
        assert_eq!(verify(&key, &q, 1001), Err("expired"));
        assert_eq!(verify(&[4u8; 32], &q, 10), Err("invalid_signature"));
        let q2 = q.replace("role=harness", "role=executor");
        assert_eq!(verify(&key, &q2, 10), Err("invalid_signature"));
        assert_eq!(
            verify(&key, &format!("{q}&x=1"), 10),
            Err("extra_query_param")
        );
        assert_eq!(verify(&key, "", 10), Err("missing_role"));
        // A signature has one spelling: pairs that were not hex digits, a
        // stray digit or a sign were skipped before, and the URL opened.
        let (head, sig) = q.split_once("sig=").unwrap();
        let (sig, tail) = sig.split_at(64);
        for other in [
            format!("zz{sig}"),
            format!("{sig}f"),
            format!("{}ZZ{}", &sig[..10], &sig[10..]),
            format!("+{}", &sig[1..]),
        ] {
            let q = format!("{head}sig={other}{tail}");
            assert_eq!(verify(&key, &q, 999), Err("invalid_signature"), "{other}");
        }
    }

    #[test]
    fn a_nonce_is_signed_and_cannot_be_added_removed_or_changed() {
        let key = [3u8; 32];
        let g = Grant {
            role: Role::Harness,
            environment_id: "env".into(),
            registration_id: "reg_1".into(),
            nonce: Some("0123456789abcdef0123456789abcdef".into()),
        };
        let q = sign(&key, &g, 1000);
        assert!(q.contains("&n=0123456789abcdef0123456789abcdef&"), "{q}");
        assert_eq!(verify(&key, &q, 999), Ok(g.clone()));
        let changed = q.replace("&n=0123", "&n=f123");
        assert_eq!(verify(&key, &changed, 10), Err("invalid_signature"));
        let removed = q.replace("&n=0123456789abcdef0123456789abcdef", "");
        assert_eq!(verify(&key, &removed, 10), Err("invalid_signature"));
        let plain = sign(
            &key,
            &Grant {
                nonce: None,
                ..g.clone()
            },
            1000,
        );
        let (head, sig) = plain.rsplit_once("&sig=").unwrap();
        let added = format!("{head}&n=0123456789abcdef0123456789abcdef&sig={sig}");
        assert_eq!(verify(&key, &added, 10), Err("invalid_signature"));
    }
}
