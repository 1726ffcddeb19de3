//! Where a masked secret may go: a provider's `url_prefixes` entry parsed
//! into scheme, host (exact or `*.` suffix), port and path prefix.

use std::fmt;

/// The scheme of a request the proxy sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostMatch {
    /// This host only (lowercase, no trailing dot, IPv6 without brackets).
    Exact(String),
    /// Any subdomain of this one (from `*.example.com`), not the domain itself.
    Subdomains(String),
}

/// One destination a secret may be sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dest {
    scheme: Scheme,
    host: HostMatch,
    port: u16,
    /// Path prefix, without a trailing `/`; empty: any path.
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

/// Lowercase, without a trailing dot or IPv6 brackets.
pub fn normalize_host(h: &str) -> String {
    let h = h.trim().trim_end_matches('.');
    let h = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    h.to_ascii_lowercase()
}

fn is_loopback_host(h: &str) -> bool {
    h == "localhost"
        || h.ends_with(".localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Dest {
    /// Parses `https://host[:port][/path]`, `http://…`, or a bare
    /// `host[:port][/path]` (`http` for a loopback host, else `https`). A
    /// query or fragment is refused; so is a wildcard anywhere but a leading `*.`.
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
    /// destination (the path prefix matches whole segments; `path` may
    /// carry a query, which is ignored).
    pub fn matches(&self, scheme: Scheme, host: &str, port: u16, path: &str) -> bool {
        if !self.matches_origin(scheme, host, port) {
            return false;
        }
        let path = path.split(['?', '#']).next().unwrap_or("");
        self.path.is_empty()
            || path == self.path
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
}
