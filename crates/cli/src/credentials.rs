//! The listener's credentials from `serve`'s flags: `--ws-auth` and its
//! token or shared-secret files, and `--operator-token-file`.

use crate::serve::{AuthMode, ServeArgs};
use exec_server::auth::{token_digest, WsAuth};

/// The WebSocket upgrade authentication the flags ask for. Errors: a
/// missing or conflicting flag, a relative path, an unreadable, empty or
/// too short file (named).
pub fn auth_from(args: &ServeArgs) -> Result<Option<WsAuth>, String> {
    let Some(mode) = args.ws_auth else {
        return Ok(None);
    };
    if let AuthMode::SignedBearerToken = mode {
        if args.ws_token_file.is_some() || args.ws_token_sha256.is_some() {
            return Err(
                "--ws-token-file and --ws-token-sha256 go with --ws-auth capability-token".into(),
            );
        }
        let path = args
            .ws_shared_secret_file
            .as_ref()
            .ok_or("--ws-auth signed-bearer-token needs --ws-shared-secret-file")?;
        if !path.is_absolute() {
            return Err("--ws-shared-secret-file needs an absolute path".into());
        }
        check_permissions(path);
        let secret = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let secret = secret.trim().as_bytes().to_vec();
        if secret.len() < exec_server::auth::MIN_SHARED_SECRET_BYTES {
            return Err(format!(
                "{} holds {} bytes; a shared secret needs at least {}",
                path.display(),
                secret.len(),
                exec_server::auth::MIN_SHARED_SECRET_BYTES
            ));
        }
        return Ok(Some(WsAuth::SignedBearerToken(
            exec_server::auth::JwtRules {
                secret,
                issuer: args.ws_issuer.clone(),
                audience: args.ws_audience.clone(),
                max_clock_skew_seconds: args.ws_max_clock_skew_seconds.unwrap_or(30),
            },
        )));
    }
    if args.ws_shared_secret_file.is_some() {
        return Err("--ws-shared-secret-file goes with --ws-auth signed-bearer-token".into());
    }
    if let Some(path) = &args.ws_token_file {
        if !path.is_absolute() {
            return Err("--ws-token-file needs an absolute path".into());
        }
        check_permissions(path);
        let token = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if token.trim().is_empty() {
            return Err(format!("{} is empty", path.display()));
        }
        return Ok(Some(WsAuth::CapabilityToken {
            sha256: token_digest(&token),
        }));
    }
    if let Some(hex_digest) = &args.ws_token_sha256 {
        let bytes = hex::decode(hex_digest.trim())
            .map_err(|_| "--ws-token-sha256 must be 64 hex digits".to_string())?;
        let sha256: [u8; 32] = bytes
            .try_into()
            .map_err(|_| "--ws-token-sha256 must be 64 hex digits".to_string())?;
        return Ok(Some(WsAuth::CapabilityToken { sha256 }));
    }
    Err("--ws-auth capability-token needs --ws-token-file or --ws-token-sha256".into())
}

/// `--operator-token-file`: the trimmed token. Errors: a relative path, an
/// unreadable or empty file.
pub fn operator_token_from(path: Option<&std::path::Path>) -> Result<Option<String>, String> {
    let Some(path) = path else {
        return Ok(None);
    };
    if !path.is_absolute() {
        return Err("--operator-token-file needs an absolute path".into());
    }
    check_permissions(path);
    let token = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let token = token.trim();
    if token.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(Some(token.to_string()))
}

/// Warns when a secret file is open to group or others.
pub(crate) fn check_permissions(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path) {
        if m.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                "secret file {} is readable by group or others (mode {:o}); chmod 600 it",
                path.display(),
                m.permissions().mode() & 0o777
            );
        }
    }
}
