//! `sandboxDenied` (SANDBOX.md §2.8): did the sandbox likely cause the failure?
//! A heuristic over the retained output, computed once at exit, only for
//! sandboxed processes.

/// Words that mark a failure as caused by the sandbox (case-insensitive).
pub const DENIAL_KEYWORDS: &[&str] = &[
    "operation not permitted",
    "permission denied",
    "read-only file system",
    "seccomp",
    "sandbox",
    "landlock",
    "failed to write file",
];

/// Exit status of a process killed by SIGSYS (128 + 31): a seccomp kill.
pub const EXIT_SIGSYS: i32 = 159;

/// The reference's rule: false for exit 0; true when `output` (stdout and
/// stderr as retained) holds a [`DENIAL_KEYWORDS`] entry; else false for 2,
/// 126 and 127; else true only for [`EXIT_SIGSYS`].
pub fn is_likely_denied(exit_code: i32, output: &[u8]) -> bool {
    if exit_code == 0 {
        return false;
    }
    let text = String::from_utf8_lossy(output).to_lowercase();
    if DENIAL_KEYWORDS.iter().any(|k| text.contains(k)) {
        return true;
    }
    if matches!(exit_code, 2 | 126 | 127) {
        return false;
    }
    exit_code == EXIT_SIGSYS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_references_rule() {
        assert!(!is_likely_denied(0, b"Permission denied"));
        assert!(is_likely_denied(
            1,
            b"sh: 1: cannot create x: Read-only file system"
        ));
        assert!(is_likely_denied(2, b"PERMISSION DENIED"));
        assert!(!is_likely_denied(1, b""));
        assert!(!is_likely_denied(127, b"not found"));
        assert!(is_likely_denied(159, b""));
        assert!(!is_likely_denied(42, b""));
    }
}
