//! The `sandbox` field (FileSystemSandboxContext). This server does not enforce
//! sandboxes, so it must never pretend to: a request whose sandbox would restrict
//! the file system or the network is refused ([`ErrorKind::PermissionDenied`](crate::error::ErrorKind::PermissionDenied)) unless the operator started
//! the server with `--allow-unsandboxed`. A sandbox that restricts nothing
//! (`permissions.type` `disabled`, or `managed` with an unrestricted file system
//! and enabled network, or `external` with enabled network) is accepted.

use crate::error::{ExecError, ExecResult};
use serde_json::Value;

/// True if `sandbox` asks for no restriction this server would have to enforce.
pub fn is_unrestricted(sandbox: &Value) -> bool {
    if sandbox.is_null() {
        return true;
    }
    let perms = &sandbox["permissions"];
    let network_open = perms["network"].as_str() == Some("enabled");
    match perms["type"].as_str() {
        Some("disabled") => true,
        Some("external") => network_open,
        Some("managed") => {
            network_open && perms["file_system"]["type"].as_str() == Some("unrestricted")
        }
        _ => false,
    }
}

/// True if `sandbox` denies reading some path (an entry with access `deny` or
/// `none`), which a read this server performs unrestricted could violate.
pub fn denies_reads(sandbox: &Value) -> bool {
    let fs = &sandbox["permissions"]["file_system"];
    fs["entries"].as_array().is_some_and(|entries| {
        entries
            .iter()
            .any(|e| matches!(e["access"].as_str(), Some("deny" | "none")))
    })
}

/// Checks a read-only request's sandbox: refused only when the sandbox denies
/// reading somewhere (reads are otherwise allowed by every sandbox preset).
pub fn check_read(sandbox: Option<&Value>, allow_unsandboxed: bool) -> ExecResult<()> {
    match sandbox {
        Some(s) if !allow_unsandboxed && denies_reads(s) => Err(ExecError::permission_denied(
            "this exec-server does not enforce sandboxes, and the request's `sandbox` denies reading some \
             paths; it was refused rather than run unrestricted. Send it without `sandbox`, or start the \
             server with --allow-unsandboxed",
        )),
        _ => Ok(()),
    }
}

/// Checks a request's sandbox. `allow_unsandboxed` is the operator's consent to
/// run restricted requests without restriction.
pub fn check(sandbox: Option<&Value>, allow_unsandboxed: bool) -> ExecResult<()> {
    match sandbox {
        Some(s) if !allow_unsandboxed && !is_unrestricted(s) => Err(ExecError::permission_denied(
            "this exec-server does not enforce sandboxes, and the request's `sandbox` restricts the file \
             system or network; it was refused rather than run unsandboxed. Send it without `sandbox`, or \
             start the server with --allow-unsandboxed to accept running it without restriction",
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn restrictive_sandboxes_are_refused_unless_allowed() {
        let read_only = json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": []}, "network": "restricted"}, "windowsSandboxLevel": "disabled"});
        assert_eq!(
            check(Some(&read_only), false).unwrap_err().kind(),
            crate::error::ErrorKind::PermissionDenied
        );
        assert!(check(Some(&read_only), true).is_ok());
        let open = json!({"permissions": {"type": "managed", "file_system": {"type": "unrestricted"}, "network": "enabled"}, "windowsSandboxLevel": "disabled"});
        assert!(check(Some(&open), false).is_ok());
        assert!(check(Some(&json!({"permissions": {"type": "disabled"}})), false).is_ok());
        assert!(check(Some(&Value::Null), false).is_ok());
        assert!(check(None, false).is_ok());
        assert!(check(Some(&json!({"permissions": {"type": "weird"}})), false).is_err());
        assert!(
            check_read(Some(&read_only), false).is_ok(),
            "reads pass a read-only sandbox"
        );
        let deny = json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [{"path": {"type": "path", "path": "file:///secret"}, "access": "deny"}]}, "network": "enabled"}});
        assert_eq!(
            check_read(Some(&deny), false).unwrap_err().kind(),
            crate::error::ErrorKind::PermissionDenied
        );
        assert!(check_read(Some(&deny), true).is_ok());
    }
}
