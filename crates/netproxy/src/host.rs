//! Which destinations count as local or private (refused unless
//! `allowLocalBinding`), and the host-name shape check.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest host name accepted: 253 bytes (DNS).
pub const MAX_HOST_BYTES: usize = 253;

/// A host as policies and masking compare it: trimmed, lowercase, without
/// a trailing dot or IPv6 brackets (`[::1]` → `::1`, `Example.COM.` →
/// `example.com`). The one normalisation of the crate.
pub fn normalize(h: &str) -> String {
    let h = h.trim().trim_end_matches('.');
    let h = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    h.to_ascii_lowercase()
}

/// True for a host that cannot be a valid destination name: empty, longer
/// than [`MAX_HOST_BYTES`], or holding whitespace or control characters.
pub fn is_malformed(host: &str) -> bool {
    host.is_empty()
        || host.len() > MAX_HOST_BYTES
        || host.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// True when `host` names this machine by name (`localhost`, `*.localhost`).
pub fn is_local_name(host: &str) -> bool {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    h == "localhost" || h.ends_with(".localhost")
}

/// The IP literal in `host`, if it is one (`[::1]` brackets allowed).
pub fn literal(host: &str) -> Option<IpAddr> {
    let h = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    h.parse().ok()
}

/// True for loopback, private (RFC 1918, ULA), link-local, CGNAT,
/// unspecified, broadcast, multicast and documentation (TEST-NET) addresses.
pub fn is_local_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_local_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_local_v4(v4),
            None => is_local_v6(v6),
        },
    }
}

fn is_local_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64.0.0/10, carrier-grade NAT
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // 198.18.0.0/15, benchmarking
        || o[0] >= 240 // reserved
}

fn is_local_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_and_public_addresses() {
        for l in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.1.1",
            "0.0.0.0",
            "192.0.2.7",
            "198.51.100.1",
            "203.0.113.9",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "255.255.255.255",
        ] {
            assert!(is_local_ip(l.parse().unwrap()), "{l}");
        }
        for p in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700::1111",
            "100.128.0.1",
            "172.32.0.1",
        ] {
            assert!(!is_local_ip(p.parse().unwrap()), "{p}");
        }
    }

    #[test]
    fn names_and_shapes() {
        assert!(is_local_name("localhost"));
        assert!(is_local_name("Foo.LOCALHOST."));
        assert!(!is_local_name("localhost.example.com"));
        assert_eq!(literal("[::1]"), Some("::1".parse().unwrap()));
        assert_eq!(literal("example.com"), None);
        assert!(is_malformed(""));
        assert!(is_malformed("a b"));
        assert!(is_malformed("a\u{7}"));
        assert!(is_malformed(&"a".repeat(254)));
        assert!(!is_malformed(&"a".repeat(253)));
    }
}
