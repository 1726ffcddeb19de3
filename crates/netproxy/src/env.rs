//! The child's proxy environment (SANDBOX.md §3.1): set over whatever the
//! request gave, so a command cannot be started pointing elsewhere.

use std::net::SocketAddr;

/// The variables, in a stable order. `socks` (when started) backs `ALL_PROXY`
/// as `socks5h://` (names resolved by the proxy); else every variable names
/// the HTTP listener.
pub fn child_env(
    http: SocketAddr,
    socks: Option<SocketAddr>,
    allow_local_binding: bool,
) -> Vec<(String, String)> {
    let h = format!("http://{http}");
    let all = socks.map_or_else(|| h.clone(), |s| format!("socks5h://{s}"));
    let mut v: Vec<(String, String)> = Vec::new();
    let mut both = |name: &str, val: &str| {
        v.push((name.to_ascii_uppercase(), val.to_string()));
        v.push((name.to_ascii_lowercase(), val.to_string()));
    };
    for n in [
        "http_proxy",
        "https_proxy",
        "ftp_proxy",
        "ws_proxy",
        "wss_proxy",
    ] {
        both(n, &h);
    }
    both("all_proxy", &all);
    both("no_proxy", "");
    for n in ["npm_config_proxy", "npm_config_https_proxy"] {
        both(n, &h);
    }
    for n in [
        "YARN_HTTP_PROXY",
        "YARN_HTTPS_PROXY",
        "BUNDLE_HTTP_PROXY",
        "BUNDLE_HTTPS_PROXY",
        "DOCKER_HTTP_PROXY",
        "DOCKER_HTTPS_PROXY",
        "PIP_PROXY",
    ] {
        v.push((n.into(), h.clone()));
    }
    v.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
    v.push(("ELECTRON_GET_USE_PROXY".into(), "true".into()));
    v.push(("CODEX_NETWORK_PROXY_ACTIVE".into(), "1".into()));
    v.push((
        "CODEX_NETWORK_ALLOW_LOCAL_BINDING".into(),
        if allow_local_binding { "1" } else { "0" }.into(),
    ));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn every_variable_points_at_the_proxy() {
        let http: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let socks: SocketAddr = "127.0.0.1:2000".parse().unwrap();
        let m: HashMap<_, _> = child_env(http, Some(socks), false).into_iter().collect();
        for k in [
            "HTTP_PROXY",
            "https_proxy",
            "WSS_PROXY",
            "ftp_proxy",
            "PIP_PROXY",
            "npm_config_https_proxy",
            "NPM_CONFIG_PROXY",
            "YARN_HTTP_PROXY",
        ] {
            assert_eq!(m[k], "http://127.0.0.1:1000", "{k}");
        }
        assert_eq!(m["ALL_PROXY"], "socks5h://127.0.0.1:2000");
        assert_eq!(m["NO_PROXY"], "");
        assert_eq!(m["no_proxy"], "");
        assert_eq!(m["CODEX_NETWORK_PROXY_ACTIVE"], "1");
        assert_eq!(m["CODEX_NETWORK_ALLOW_LOCAL_BINDING"], "0");
        let m: HashMap<_, _> = child_env(http, None, true).into_iter().collect();
        assert_eq!(m["all_proxy"], "http://127.0.0.1:1000");
        assert_eq!(m["CODEX_NETWORK_ALLOW_LOCAL_BINDING"], "1");
    }
}
