//! A request path as a path-scoped destination compares it: normalised as an
//! RFC 3986 upstream resolves it (§6.2.2: percent-encoded unreserved
//! characters, dots included, decoded and the other escapes' hex upper-cased;
//! §5.2.4 `remove_dot_segments`), so that `/v1/%2e%2e/admin` is compared as
//! `/admin`, never as text that merely starts with `/v1/`.
//!
//! A path on whose meaning servers disagree is refused rather than guessed,
//! since a wrong guess sends a secret outside its scope: an encoded `/` or
//! `\` (a separator to some servers, a name character to others), a raw `\`
//! (a separator on Windows servers), a NUL or other control character,
//! invalid percent-encoding, non-ASCII bytes, an empty segment other than a
//! trailing one (`//`, merged by some servers before dots are resolved, so
//! `/v1//../x` is `/v1/x` to RFC 3986 but `/x` to them), a dot segment with
//! parameters (`..;`, resolved as `..` by some servers) and an encoded `%`
//! before two hex digits (`%252e`, a dot to servers that decode twice).

use std::fmt;

/// Why a request path was refused for path-scoped matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnclearPath {
    /// The path does not start with `/` (not origin-form).
    NotAbsolute,
    /// A `%` not followed by two hex digits.
    InvalidPercent,
    /// `%2F` or `%5C`: an encoded `/` or `\`.
    EncodedSeparator,
    /// A raw `\`.
    Backslash,
    /// A control character (NUL included), raw or percent-encoded.
    Control,
    /// A byte outside ASCII.
    NonAscii,
    /// An empty segment before the last (`//`).
    EmptySegment,
    /// A `.` or `..` segment with `;` parameters.
    DotWithParameters,
    /// `%25` followed by two hex digits (a second layer of encoding).
    DoubleEncoded,
}

impl fmt::Display for UnclearPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnclearPath::NotAbsolute => "path does not start with /",
            UnclearPath::InvalidPercent => "invalid percent-encoding",
            UnclearPath::EncodedSeparator => "encoded / or \\",
            UnclearPath::Backslash => "backslash",
            UnclearPath::Control => "control character",
            UnclearPath::NonAscii => "non-ASCII byte",
            UnclearPath::EmptySegment => "empty segment (//)",
            UnclearPath::DotWithParameters => "dot segment with parameters",
            UnclearPath::DoubleEncoded => "double percent-encoding",
        })
    }
}

impl std::error::Error for UnclearPath {}

/// RFC 3986 unreserved: ALPHA / DIGIT / `-` / `.` / `_` / `~`.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn is_control(b: u8) -> bool {
    b < 0x20 || b == 0x7f
}

fn hex_value(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Decodes the unreserved escapes of `path` and upper-cases the others' hex.
fn decode_unreserved(path: &str) -> Result<String, UnclearPath> {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => {
                let hi = bytes.get(i + 1).copied().and_then(hex_value);
                let lo = bytes.get(i + 2).copied().and_then(hex_value);
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(UnclearPath::InvalidPercent);
                };
                let v = hi << 4 | lo;
                if is_unreserved(v) {
                    out.push(char::from(v));
                } else if v == b'/' || v == b'\\' {
                    return Err(UnclearPath::EncodedSeparator);
                } else if is_control(v) {
                    return Err(UnclearPath::Control);
                } else {
                    out.push_str(&format!("%{v:02X}"));
                }
                i += 3;
            }
            b'\\' => return Err(UnclearPath::Backslash),
            _ if is_control(b) => return Err(UnclearPath::Control),
            _ if !b.is_ascii() => return Err(UnclearPath::NonAscii),
            _ => {
                out.push(char::from(b));
                i += 1;
            }
        }
    }
    Ok(out)
}

/// True when `decoded` holds `%25` followed by two hex digits.
fn is_double_encoded(decoded: &str) -> bool {
    decoded
        .as_bytes()
        .windows(5)
        .any(|w| w.starts_with(b"%25") && w[3].is_ascii_hexdigit() && w[4].is_ascii_hexdigit())
}

/// The path part of `target` (before any `?` or `#`) normalised as the
/// module documentation says: always starting with `/`, without `.` or
/// `..` segments, with a trailing `/` where the input's last segment was
/// empty, `.` or `..`. Errors name the first reason the path is unclear.
pub fn normalize(target: &str) -> Result<String, UnclearPath> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    let decoded = decode_unreserved(path)?;
    let Some(rest) = decoded.strip_prefix('/') else {
        return Err(UnclearPath::NotAbsolute);
    };
    if is_double_encoded(&decoded) {
        return Err(UnclearPath::DoubleEncoded);
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let last = segments.len() - 1;
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, seg) in segments.iter().enumerate() {
        let is_last = i == last;
        if seg.is_empty() && !is_last {
            return Err(UnclearPath::EmptySegment);
        }
        let bare = seg.split(';').next().unwrap_or("");
        if (bare == "." || bare == "..") && bare.len() != seg.len() {
            return Err(UnclearPath::DotWithParameters);
        }
        if *seg == ".." {
            out.pop();
        }
        if *seg == "." || *seg == ".." {
            // A dot segment last leaves a directory: `/a/b/..` is `/a/`.
            if is_last {
                out.push("");
            }
            continue;
        }
        out.push(seg);
    }
    Ok(format!("/{}", out.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_dot_segments_after_decoding_unreserved_escapes() {
        for (input, want) in [
            ("/", "/"),
            ("/v1", "/v1"),
            ("/v1/", "/v1/"),
            ("/v1/x?q=/../a#f", "/v1/x"),
            ("/v1/./x", "/v1/x"),
            ("/v1/../admin", "/admin"),
            ("/v1/%2e%2e/admin", "/admin"),
            ("/v1/%2E%2E/admin", "/admin"),
            ("/v1/.%2e/admin", "/admin"),
            ("/v1/%2e./admin", "/admin"),
            ("/v1/%2e/x", "/v1/x"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/..", "/"),
            ("/../../x", "/x"),
            ("/%7Euser/%41b", "/~user/Ab"),
            ("/a%3fb/%3a", "/a%3Fb/%3A"),
            ("/a;p=1/b", "/a;p=1/b"),
            ("/...", "/..."),
        ] {
            assert_eq!(normalize(input).as_deref(), Ok(want), "{input:?}");
        }
    }

    #[test]
    fn refuses_what_servers_read_differently() {
        for (input, why) in [
            ("", UnclearPath::NotAbsolute),
            ("v1/x", UnclearPath::NotAbsolute),
            ("%2fv1", UnclearPath::EncodedSeparator),
            ("/v1%2f..%2fadmin", UnclearPath::EncodedSeparator),
            ("/v1/..%2Fadmin", UnclearPath::EncodedSeparator),
            ("/v1/..%5cadmin", UnclearPath::EncodedSeparator),
            ("/v1\\..\\admin", UnclearPath::Backslash),
            ("/v1/%", UnclearPath::InvalidPercent),
            ("/v1/%2", UnclearPath::InvalidPercent),
            ("/v1/%zz", UnclearPath::InvalidPercent),
            ("/v1/%00", UnclearPath::Control),
            ("/v1/\0", UnclearPath::Control),
            ("/v1/%0a", UnclearPath::Control),
            ("/v1/\u{e9}", UnclearPath::NonAscii),
            ("//v1/x", UnclearPath::EmptySegment),
            ("/v1//../admin", UnclearPath::EmptySegment),
            ("/v1/..;/admin", UnclearPath::DotWithParameters),
            ("/v1/.;x/admin", UnclearPath::DotWithParameters),
            ("/v1/%252e%252e/admin", UnclearPath::DoubleEncoded),
            ("/v1/%25%32%65", UnclearPath::DoubleEncoded),
        ] {
            assert_eq!(normalize(input), Err(why), "{input:?}");
        }
        // A literal percent sign that no second decoding can turn into more.
        assert_eq!(normalize("/100%25").as_deref(), Ok("/100%25"));
    }
}
