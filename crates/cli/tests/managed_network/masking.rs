//! Credential masking (`credentialMasking`, `credentialMaskingCustomProviders`):
//! placeholders in the child's environment, secrets put back by the proxy
//! only on the way to their provider's destinations (docs/credential-masking.md).

use super::*;

/// A test CA and a TLS server configuration for `ip` signed by it: (the CA's
/// PEM, the configuration).
fn test_tls(ip: &str) -> (String, std::sync::Arc<rustls::ServerConfig>) {
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "test upstream CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![ip.to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    (ca.pem(), std::sync::Arc::new(cfg))
}

type Heads = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// Reads one request head from `s`, records it, and answers
/// `got=<its Authorization value>`.
async fn answer_with_authorization<S>(mut s: S, heads: Heads)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    let mut tmp = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
        match s.read(&mut tmp).await {
            Ok(n) if n > 0 => buf.extend_from_slice(&tmp[..n]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let auth = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("authorization"))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    heads.lock().unwrap().push(head);
    let body = format!("got={auth}");
    let r = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(r.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// An upstream on `ip` (TLS with `tls`) recording every request head.
async fn recording_upstream(
    ip: &str,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
) -> (u16, tokio::task::JoinHandle<()>, Heads) {
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let heads = Heads::default();
    let h = heads.clone();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (h, tls) = (h.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    Some(cfg) => {
                        if let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(s).await {
                            answer_with_authorization(s, h).await;
                        }
                    }
                    None => answer_with_authorization(s, h).await,
                }
            });
        }
    });
    (port, task, heads)
}

#[tokio::test]
async fn m1_credential_masking_puts_secrets_back_only_for_their_provider() {
    private_internet();
    let d = tmpdir("m1");
    let (ca_pem, tls) = test_tls("8.8.8.8");
    let (_, other_tls) = test_tls("8.8.4.4");
    let ca_file = d.join("upstream-ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let s = Server::start(&["--netproxy-upstream-root", ca_file.to_str().unwrap()]);
    let mut c = Conn::open(&s.url, None).await;
    let (tls_port, t1, tls_heads) = recording_upstream("8.8.8.8", Some(tls)).await;
    let (plain_port, t2, plain_heads) = recording_upstream("8.8.4.4", None).await;
    let (other_port, t3, other_heads) = recording_upstream("8.8.4.4", Some(other_tls)).await;
    let real = "vendor_qwertyuiopasdfghjklzxcvb";
    let oai = format!("sk-proj-{}", "Q1w2E3r4".repeat(6));
    let np = json!({"proxy": proxy(json!({
        "domains": {"8.8.8.8": "allow", "8.8.4.4": "allow"},
        "credentialMasking": true,
        "credentialProviders": {"vendor": {
            "env": ["VENDOR_TOKEN"], "patterns": ["vendor_[a-z]{24}"],
            "url_prefixes": [format!("https://8.8.8.8:{tls_port}")], "auth": ["bearer"]}}}))});
    let hdr = "-H \"Authorization: Bearer $VENDOR_TOKEN\"";
    let script = format!(
        "printenv VENDOR_TOKEN OPENAI_API_KEY; \
         test -r \"$CURL_CA_BUNDLE\" && echo ca_readable; \
         stat -c dir_mode=%a \"$(dirname \"$SSL_CERT_FILE\")\"; \
         curl -sS --max-time 10 {hdr} https://8.8.8.8:{tls_port}/v1 https://8.8.8.8:{tls_port}/v2; echo \" rc=$?\"; \
         curl -sS --max-time 10 {hdr} http://8.8.4.4:{plain_port}/; echo \" rc=$?\"; \
         curl -sS --max-time 10 {hdr} https://8.8.4.4:{other_port}/ 2>/dev/null; echo \" rc=$?\""
    );
    let mut p = start_params("m1", &["/bin/sh", "-c", &script], &d, false, false);
    p["networkProxy"] = np;
    p["env"]["VENDOR_TOKEN"] = json!(real);
    p["env"]["OPENAI_API_KEY"] = json!(oai);
    let o = run_start(&mut c, "m1", p, Reply::Silence).await;
    let lines: Vec<&str> = o.out.lines().collect();
    assert!(lines.len() >= 6, "{o:?}");
    // The child sees shaped placeholders, never the secrets.
    let ph = lines[0];
    assert!(
        ph.starts_with("vendor_") && ph.len() == real.len() && ph != real,
        "{o:?}"
    );
    assert!(
        lines[1].starts_with("sk-proj-") && lines[1] != oai,
        "built-in OpenAI key masked: {o:?}"
    );
    assert!(!o.out.contains(&oai), "{o:?}");
    assert_eq!(lines[2], "ca_readable", "{o:?}");
    assert_eq!(lines[3], "dir_mode=700", "{o:?}");
    // The provider's origin got the real secret through the intercepted
    // tunnel (curl trusted the proxy's CA); the response is not rewritten.
    // Two requests on one tunnel: the upstream closed after the first
    // (`Connection: close`), the proxy reconnected for the second.
    let got = tls_heads.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "{got:?}");
    for g in &got {
        let g = g.to_ascii_lowercase();
        assert!(
            g.contains(&format!("authorization: bearer {real}")),
            "{got:?}"
        );
    }
    assert_eq!(
        lines[4],
        format!("got=Bearer {real}got=Bearer {real} rc=0"),
        "{o:?}"
    );
    let tunnels = o
        .audits
        .iter()
        .filter(|a| a["method"] == "CONNECT" && a["port"] == json!(tls_port))
        .count();
    assert_eq!(tunnels, 1, "curl reused its tunnel: {:?}", o.audits);
    // Another host gets the placeholder unchanged (plain http)…
    let got = plain_heads.lock().unwrap().clone();
    assert!(
        got.len() == 1 && got[0].contains(ph) && !got[0].contains(real),
        "{got:?}"
    );
    assert_eq!(lines[5], format!("got=Bearer {ph} rc=0"), "{o:?}");
    // …and its https is a plain tunnel: curl meets the upstream's own
    // certificate, which it does not trust (60), so nothing is sent.
    assert_eq!(lines[6], " rc=60", "{o:?}");
    assert!(other_heads.lock().unwrap().is_empty());
    assert_eq!(o.exit, 0, "{o:?}");
    for t in [t1, t2, t3] {
        t.abort();
    }
}

#[tokio::test]
async fn m2_masking_inside_an_enforced_sandbox_and_over_plain_http() {
    private_internet();
    let f = fixture("m2");
    let (ca_pem, tls) = test_tls("8.8.8.8");
    let ca_file = f.ws.join("upstream-ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let s = Server::start(&["--netproxy-upstream-root", ca_file.to_str().unwrap()]);
    let mut c = Conn::open(&s.url, None).await;
    let (tls_port, t1, tls_heads) = recording_upstream("8.8.8.8", Some(tls)).await;
    let (plain_port, t2, plain_heads) = recording_upstream("8.8.4.4", None).await;
    let real = "tok_0123456789abcdef";
    // A provider allowed over plain http too (an explicit http:// prefix),
    // sending the secret in a header of its own.
    let np = json!({"proxy": proxy(json!({
        "domains": {"8.8.8.8": "allow", "8.8.4.4": "allow"},
        "credentialMasking": true,
        "credentialProviders": {"svc": {
            "env": ["SVC_KEY"], "patterns": ["tok_[0-9a-f]{16}"],
            "url_prefixes": [format!("https://8.8.8.8:{tls_port}/api"), format!("http://8.8.4.4:{plain_port}")],
            "auth": ["header"], "header": "X-Svc-Key"}}}))});
    let script = format!(
        "printenv SVC_KEY; \
         curl -sS --max-time 10 -H \"X-Svc-Key: $SVC_KEY\" https://8.8.8.8:{tls_port}/api/x; echo \" rc=$?\"; \
         curl -sS --max-time 10 -H \"X-Svc-Key: $SVC_KEY\" https://8.8.8.8:{tls_port}/other; echo \" rc=$?\"; \
         curl -sS --max-time 10 --path-as-is -H \"X-Svc-Key: $SVC_KEY\" https://8.8.8.8:{tls_port}/api/%2e%2e/admin; echo \" rc=$?\"; \
         curl -sS --max-time 10 -H \"X-Svc-Key: $SVC_KEY\" http://8.8.4.4:{plain_port}/; echo \" rc=$?\""
    );
    let mut p = start_params("m2", &["/bin/sh", "-c", &script], &f.ws, false, false);
    p["networkProxy"] = np;
    p["env"]["SVC_KEY"] = json!(real);
    p["enforceManagedNetwork"] = json!(true);
    p["sandbox"] = ww(&f.ws);
    let o = run_start(&mut c, "m2", p, Reply::Silence).await;
    let lines: Vec<&str> = o.out.lines().collect();
    assert!(lines.len() >= 5, "{o:?}");
    let ph = lines[0];
    assert!(
        ph.starts_with("tok_") && ph.len() == real.len() && ph != real,
        "{o:?}"
    );
    assert!(
        !o.out.contains(real),
        "responses do not echo the header: {o:?}"
    );
    let tls_got = tls_heads.lock().unwrap().clone();
    assert_eq!(tls_got.len(), 3, "{tls_got:?}");
    // Inside the path prefix: the secret; outside it: the placeholder.
    let lower = |h: &str| h.to_ascii_lowercase();
    assert!(
        lower(&tls_got[0]).contains(&format!("x-svc-key: {real}")),
        "{tls_got:?}"
    );
    assert!(
        lower(&tls_got[1]).contains(&format!("x-svc-key: {ph}")),
        "{tls_got:?}"
    );
    // Issue 30: `/api/%2e%2e/admin` is `/admin` to the upstream: outside the
    // prefix, so the placeholder, though the text starts with `/api/`.
    assert!(
        tls_got[2].starts_with("GET /api/%2e%2e/admin ")
            && lower(&tls_got[2]).contains(&format!("x-svc-key: {ph}"))
            && !tls_got[2].contains(real),
        "{tls_got:?}"
    );
    let plain_got = plain_heads.lock().unwrap().clone();
    assert_eq!(plain_got.len(), 1, "{plain_got:?}");
    assert!(
        lower(&plain_got[0]).contains(&format!("x-svc-key: {real}")),
        "{plain_got:?}"
    );
    for l in &lines[1..5] {
        assert!(l.ends_with(" rc=0"), "{o:?}");
    }
    t1.abort();
    t2.abort();
}

#[tokio::test]
async fn m3_secrets_exported_by_a_shell_snapshot_are_masked_or_dropped() {
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let home = tmpdir("m3");
    let gh = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
    let oai = format!("sk-proj-{}", "Z9y8X7w6".repeat(6));
    std::fs::write(
        home.join(".bash_profile"),
        format!("export GITHUB_TOKEN={gh}\nexport OPENAI_API_KEY={oai}\nexport KEEP=1\n"),
    )
    .unwrap();
    let script = "echo gh=$GH_TOKEN; echo ghb=$GITHUB_TOKEN; echo oai=${OPENAI_API_KEY-unset}; echo keep=$KEEP; echo proxy=$HTTP_PROXY";
    let mut p = start_params("m3", &["/bin/bash", "-lc", script], &home, false, false);
    p["env"]["HOME"] = json!(home.to_str().unwrap());
    // The secret (and a stale proxy) come through the policy, as Codex sends them.
    p["envPolicy"] = json!({"inherit": "core", "ignoreDefaultExcludes": true, "exclude": [],
        "set": {"GH_TOKEN": gh, "HTTP_PROXY": "http://corp.example:3128"}, "includeOnly": []});
    p["shellSnapshot"] = json!({"scopeId": "m3", "shell": {"name": "bash", "path": "/bin/bash"}});
    p["networkProxy"] = json!({"proxy": proxy(json!({"credentialMasking": true}))});
    let o = run_start(&mut c, "m3", p, Reply::Silence).await;
    let lines: Vec<&str> = o.out.lines().collect();
    assert_eq!(lines.len(), 5, "{o:?}");
    let ph = lines[0].strip_prefix("gh=").unwrap();
    assert!(ph.starts_with("ghp_") && ph != gh, "{o:?}");
    // The profile exported the same token: it gets the same placeholder; the
    // OpenAI key it exported cannot be masked any more, so it is dropped.
    assert_eq!(lines[1], format!("ghb={ph}"), "{o:?}");
    assert_eq!(lines[2], "oai=unset", "{o:?}");
    assert_eq!(lines[3], "keep=1", "the snapshot applied: {o:?}");
    assert!(
        lines[4].starts_with("proxy=http://127.0.0.1:"),
        "the proxy's variables win: {o:?}"
    );
    assert!(!o.out.contains(gh) && !o.out.contains(&oai), "{o:?}");
}
