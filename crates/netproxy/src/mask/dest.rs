//! Where a masked secret may go: a provider's `url_prefixes` entry parsed
//! into scheme, host (exact or `*.` suffix), port and path prefix.

use super::scope_path;
use std::fmt;

/// The scheme of a request the proxy sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Scheme {
    /// Plain `http://` through the HTTP listener.
    Http,
    /// `https://` inside an intercepted `CONNECT` tunnel.
    Https,
}

impl Scheme {
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// The host part of a [`Dest`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum HostMatch {
    /// This host only (lowercase, no trailing dot, IPv6 without brackets).
    Exact(String),
    /// Any subdomain of this one (from `*.example.com`), not the domain itself.
    Subdomains(String),
}

/// One destination a secret may be sent to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dest {
    scheme: Scheme,
    host: HostMatch,
    port: u16,
    /// Path prefix, normalised ([`scope_path::normalize`]) and without a
    /// trailing `/`; empty: any path.
    path: String,
}

/// Why a destination text was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadDest(pub String);

impl fmt::Display for BadDest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid destination {:?}", self.0)
    }
}

use crate::host::normalize as normalize_host;

fn is_loopback_host(h: &str) -> bool {
    h == "localhost"
        || h.ends_with(".localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Dest {
    /// Parses `https://host[:port][/path]`, `http://…`, or a bare
    /// `host[:port][/path]` (`http` for a loopback host, else `https`). A
    /// query or fragment is refused; so is a wildcard anywhere but a leading
    /// `*.`, and a path that [`scope_path::normalize`] refuses.
    pub fn parse(text: &str) -> Result<Dest, BadDest> {
        let bad = || BadDest(text.to_string());
        let t = text.trim();
        let (scheme, rest) = match t.split_once("://") {
            Some((s, r)) if s.eq_ignore_ascii_case("https") => (Some(Scheme::Https), r),
            Some((s, r)) if s.eq_ignore_ascii_case("http") => (Some(Scheme::Http), r),
            Some(_) => return Err(bad()),
            None => (None, t),
        };
        if rest.contains(['?', '#', '@']) || rest.chars().any(|c| c.is_whitespace()) {
            return Err(bad());
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        // The port follows the IPv6 brackets, or the only ':' of a name.
        let (host, port_text) = if authority.starts_with('[') {
            let close = authority.find(']').ok_or_else(bad)?;
            match &authority[close + 1..] {
                "" => (&authority[..=close], None),
                p => (
                    &authority[..=close],
                    Some(p.strip_prefix(':').ok_or_else(bad)?),
                ),
            }
        } else if authority.matches(':').count() == 1 {
            let (h, p) = authority.split_once(':').ok_or_else(bad)?;
            (h, Some(p))
        } else {
            (authority, None)
        };
        let port = match port_text {
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(n),
                _ => return Err(bad()),
            },
            None => None,
        };
        let host = normalize_host(host);
        if host.is_empty() || crate::host::is_malformed(&host) {
            return Err(bad());
        }
        let host = match host.strip_prefix("*.") {
            Some(base) if !base.is_empty() && !base.contains('*') => {
                HostMatch::Subdomains(base.to_string())
            }
            _ if host.contains('*') => return Err(bad()),
            _ => HostMatch::Exact(host),
        };
        let scheme = scheme.unwrap_or(match &host {
            HostMatch::Exact(h) if is_loopback_host(h) => Scheme::Http,
            _ => Scheme::Https,
        });
        // Normalised as request paths are, so that the two compare alike.
        let path = match path {
            "" => String::new(),
            p => scope_path::normalize(p).map_err(|_| bad())?,
        };
        Ok(Dest {
            scheme,
            host,
            port: port.unwrap_or(scheme.default_port()),
            path: path.trim_end_matches('/').to_string(),
        })
    }

    /// `https://host` of one exact host (the built-in providers' destinations).
    pub fn https_host(host: &str) -> Dest {
        Dest {
            scheme: Scheme::Https,
            host: HostMatch::Exact(normalize_host(host)),
            port: 443,
            path: String::new(),
        }
    }

    /// `https://*.base`.
    pub fn https_subdomains(base: &str) -> Dest {
        Dest {
            scheme: Scheme::Https,
            host: HostMatch::Subdomains(normalize_host(base)),
            port: 443,
            path: String::new(),
        }
    }

    /// True for a `*.` destination.
    pub fn is_wildcard(&self) -> bool {
        matches!(self.host, HostMatch::Subdomains(_))
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// True when `host:port` (any path) over `scheme` is this destination's origin.
    pub fn matches_origin(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        if scheme != self.scheme || port != self.port {
            return false;
        }
        let h = normalize_host(host);
        match &self.host {
            HostMatch::Exact(e) => *e == h,
            HostMatch::Subdomains(base) => h
                .strip_suffix(base.as_str())
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
        }
    }

    /// True when a request to `scheme://host:port/path` is within this
    /// destination. `path` is the request-target as sent (a query is
    /// ignored); with a path prefix it is compared after
    /// [`scope_path::normalize`], whole segments only, and a path that does
    /// not normalise cleanly is never within: the upstream resolves the path
    /// (`/v1/%2e%2e/admin` is `/admin`), not the text the client wrote.
    pub fn matches(&self, scheme: Scheme, host: &str, port: u16, path: &str) -> bool {
        if !self.matches_origin(scheme, host, port) {
            return false;
        }
        if self.path.is_empty() {
            return true;
        }
        let Ok(path) = scope_path::normalize(path) else {
            return false;
        };
        path == self.path
            || path
                .strip_prefix(self.path.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches() {
        let d = Dest::parse("https://API.vendor.example/v1/").unwrap();
        assert!(d.matches(Scheme::Https, "api.vendor.example", 443, "/v1"));
        assert!(d.matches(Scheme::Https, "api.vendor.example.", 443, "/v1/x?q=1"));
        assert!(!d.matches(Scheme::Https, "api.vendor.example", 443, "/v10"));
        assert!(!d.matches(Scheme::Http, "api.vendor.example", 80, "/v1"));
        assert!(!d.matches(Scheme::Https, "api.vendor.example", 8443, "/v1"));
        assert!(!d.matches(Scheme::Https, "evil.example", 443, "/v1"));
        let d = Dest::parse("8.8.8.8:4443").unwrap();
        assert_eq!(d.scheme(), Scheme::Https);
        assert!(d.matches(Scheme::Https, "8.8.8.8", 4443, "/"));
        let d = Dest::parse("127.0.0.1:8080").unwrap();
        assert_eq!(d.scheme(), Scheme::Http, "bare loopback implies http");
        let d = Dest::parse("http://[::1]:81/a").unwrap();
        assert!(d.matches(Scheme::Http, "::1", 81, "/a/b"));
        let d = Dest::parse("*.ghe.com").unwrap();
        assert!(d.is_wildcard());
        assert!(d.matches(Scheme::Https, "acme.ghe.com", 443, "/"));
        assert!(!d.matches(Scheme::Https, "ghe.com", 443, "/"));
        assert!(!d.matches(Scheme::Https, "xghe.com", 443, "/"));
        for bad in [
            "",
            "ftp://x",
            "https://",
            "https://a/b?c",
            "https://u@h",
            "a*.b",
            "https://h:0",
            "https://h:x",
        ] {
            assert!(Dest::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// Issue 30: a path-scoped secret goes only where an RFC 3986 upstream
    /// resolves the path to, and nowhere a server might resolve differently.
    #[test]
    fn path_scope_holds_against_dot_and_encoding_tricks() {
        let d = Dest::parse("https://api.vendor.example/v1").unwrap();
        let within = |p: &str| d.matches(Scheme::Https, "api.vendor.example", 443, p);
        for inside in [
            "/v1",
            "/v1/",
            "/v1/x",
            "/v1/./x",
            "/v1/x/../y",
            "/v1/%78",
            "/v1/x?next=/../admin",
            "/v1/x#/../admin",
            "/v1/%2e/x",
        ] {
            assert!(within(inside), "{inside:?} is within /v1");
        }
        for outside in [
            "/v1/../admin",
            "/v1/%2e%2e/admin",
            "/v1/%2E%2E/admin",
            "/v1/.%2e/admin",
            "/v1/%2e./admin",
            "/v1/x/../../admin",
            "/v1/..",
            "/v1x",
            "/v1x/y",
            "/%76%31/../admin",
            "/V1/x",
            "/admin?/v1/x",
            "/admin#/v1/x",
        ] {
            assert!(!within(outside), "{outside:?} resolves outside /v1");
        }
        // Unclear paths never get a path-scoped secret, even where an RFC
        // 3986 reading would stay inside the prefix.
        for unclear in [
            "/v1/..%2Fadmin",
            "/v1/..%2fadmin",
            "/v1/x%2F..%2F..%2Fadmin",
            "/v1/..%5Cadmin",
            "/v1/..\\admin",
            "/v1/x\\y",
            "/v1//x",
            "/v1//../admin",
            "//v1/x",
            "/v1/%zz",
            "/v1/%",
            "/v1/%00",
            "/v1/x\0",
            "/v1/..;/admin",
            "/v1/%252e%252e/admin",
            "v1/x",
        ] {
            assert!(!within(unclear), "{unclear:?} is unclear");
        }
        // The prefix itself is normalised: written with a dot or an escape
        // it means the same segments.
        let d = Dest::parse("https://api.vendor.example/v1/./%61pi/").unwrap();
        assert!(d.matches(Scheme::Https, "api.vendor.example", 443, "/v1/api/x"));
        assert!(!d.matches(Scheme::Https, "api.vendor.example", 443, "/v1/apix"));
        for bad in ["https://h/v1//x", "https://h/v1%2fx", "https://h/a\\b"] {
            assert!(Dest::parse(bad).is_err(), "{bad:?}");
        }
        // Without a path prefix any path of the origin is within, unclear or not.
        let d = Dest::parse("https://api.vendor.example").unwrap();
        assert!(d.matches(Scheme::Https, "api.vendor.example", 443, "/a/..%2Fb"));
    }
}
