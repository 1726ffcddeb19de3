//! Signed, expiring relay URLs: `{base}/relay?role=R&env=E&reg=G&exp=T&v=1&sig=HEX`,
//! `sig` = HMAC-SHA256 over the other parameters with the store's signing key.
//! A refusal names one of the reference's rejection reasons.

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
}

fn mac_input(role: &str, env: &str, reg: &str, exp: &str) -> Vec<u8> {
    let mut m = Vec::new();
    for part in [URL_VERSION, role, env, reg, exp] {
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
        ),
    );
    let sig: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("role", grant.role.as_str())
        .append_pair("env", &grant.environment_id)
        .append_pair("reg", &grant.registration_id)
        .append_pair("exp", &exp)
        .append_pair("v", URL_VERSION)
        .append_pair("sig", &sig)
        .finish()
}

/// Checks a query string; the error is the rejection reason (wire value of
/// `x-codex-rendezvous-rejection-reason`).
pub fn verify(key: &[u8; 32], query: &str, now_unix: u64) -> Result<Grant, &'static str> {
    let (mut role, mut env, mut reg, mut exp, mut v, mut sig) =
        (None, None, None, None, None, None);
    for (k, val) in url::form_urlencoded::parse(query.as_bytes()) {
        let slot = match k.as_ref() {
            "role" => &mut role,
            "env" => &mut env,
            "reg" => &mut reg,
            "exp" => &mut exp,
            "v" => &mut v,
            "sig" => &mut sig,
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
    let sig_bytes: Vec<u8> = (0..sig.len() / 2)
        .filter_map(|i| u8::from_str_radix(sig.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::verify(&k, &mac_input(&role_s, &env, &reg, &exp_s), &sig_bytes)
        .map_err(|_| "invalid_signature")?;
    if expires < now_unix {
        return Err("expired");
    }
    Ok(Grant {
        role,
        environment_id: env,
        registration_id: reg,
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
    }
}
