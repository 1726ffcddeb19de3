//! The environment id rule: 1 to [`MAX_LEN`] characters from `A-Z`, `a-z`,
//! `0-9`, `_` and `-` (REMOTE.md (a): the reference 0.169.0 only trims and
//! rejects empty, older builds enforced this rule, and a new implementation
//! should, so that an id is always exactly one URL path segment and prints
//! safely). The `≤ 64` rule of REMOTE.md (e) is for the ids in a harness's
//! `environments.toml`, a different namespace.

/// Longest environment id: 256 characters.
pub const MAX_LEN: usize = 256;

/// Why a string is not an environment id. The messages never quote the id
/// (it may hold control or bidirectional characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidEnvironmentId {
    /// Nothing at all.
    #[error("the environment id is empty (it must be 1 to 256 of A-Z, a-z, 0-9, '_' and '-')")]
    Empty,
    /// More than [`MAX_LEN`] bytes.
    #[error("the environment id is {len} bytes long (it must be 1 to 256 of A-Z, a-z, 0-9, '_' and '-')")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A character outside `[A-Za-z0-9_-]`.
    #[error("the environment id has a character other than A-Z, a-z, 0-9, '_' and '-' at byte {position}")]
    BadCharacter {
        /// Byte offset of the first such character.
        position: usize,
    },
}

/// Checks `id` against the rule (no trimming: callers trim first if they
/// mean to, as the reference executor does with `--environment-id`).
pub fn validate(id: &str) -> Result<(), InvalidEnvironmentId> {
    if id.is_empty() {
        return Err(InvalidEnvironmentId::Empty);
    }
    if let Some(position) = id
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    {
        return Err(InvalidEnvironmentId::BadCharacter { position });
    }
    if id.len() > MAX_LEN {
        return Err(InvalidEnvironmentId::TooLong { len: id.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        for good in ["a", "devbox", "A-b_9", &"z".repeat(256)] {
            assert_eq!(validate(good), Ok(()), "{good}");
        }
        assert_eq!(validate(""), Err(InvalidEnvironmentId::Empty));
        assert_eq!(
            validate(&"z".repeat(257)),
            Err(InvalidEnvironmentId::TooLong { len: 257 })
        );
        for (bad, position) in [
            ("..", 0),
            ("a/../../x", 1),
            ("a\0b", 1),
            ("a\nb", 1),
            ("ab\u{202e}c", 2),
            (" x", 0),
            ("a%2F", 1),
            ("é", 0),
        ] {
            let e = validate(bad).unwrap_err();
            assert_eq!(
                e,
                InvalidEnvironmentId::BadCharacter { position },
                "{bad:?}"
            );
            assert!(!e.to_string().contains(bad), "{e} quotes {bad:?}");
        }
    }
}
