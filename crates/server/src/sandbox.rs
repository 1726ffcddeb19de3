//! The `sandbox` field (FileSystemSandboxContext). This server does not enforce
//! sandboxes, so it must never pretend to: a request whose sandbox would restrict
//! the file system or the network is refused (-32603) unless the operator started
//! the server with `--allow-unsandboxed`. A sandbox that restricts nothing
//! (`permissions.type` `disabled`, or `managed` with an unrestricted file system
//! and enabled network, or `external` with enabled network) is accepted.

use exec_server_protocol::ErrorObject;
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

/// Checks a request's sandbox. `allow_unsandboxed` is the operator's consent to
/// run restricted requests without restriction.
pub fn check(sandbox: Option<&Value>, allow_unsandboxed: bool) -> Result<(), ErrorObject> {
    match sandbox {
        Some(s) if !allow_unsandboxed && !is_unrestricted(s) => Err(ErrorObject::internal(
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
        assert_eq!(check(Some(&read_only), false).unwrap_err().code, -32603);
        assert!(check(Some(&read_only), true).is_ok());
        let open = json!({"permissions": {"type": "managed", "file_system": {"type": "unrestricted"}, "network": "enabled"}, "windowsSandboxLevel": "disabled"});
        assert!(check(Some(&open), false).is_ok());
        assert!(check(Some(&json!({"permissions": {"type": "disabled"}})), false).is_ok());
        assert!(check(Some(&Value::Null), false).is_ok());
        assert!(check(None, false).is_ok());
        assert!(check(Some(&json!({"permissions": {"type": "weird"}})), false).is_err());
    }
}
