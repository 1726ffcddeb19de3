//! Managed network (issue 14, SANDBOX.md §3, cases N1–N7): the per-process
//! proxy, `network/policyRequest` answered by this test as the client, the
//! audit notifications, and enforcement inside a sandbox.
//!
//! Upstream "internet" hosts never leave the machine: the tests that need a
//! non-local destination move their own thread into a network namespace they
//! make (`unshare(CLONE_NEWNET)`, root only), give its loopback the addresses
//! 8.8.8.8 and 8.8.4.4, and run the server, the upstream and curl there.

mod common;

use common::sandbox::*;
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Moves this test's thread (and every process and thread it starts from now
/// on) into a fresh network namespace with `lo` up and 8.8.8.8, 8.8.4.4 on it.
fn private_internet() {
    // SAFETY: unshare with a flag constant; affects only the calling thread.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "unshare(CLONE_NEWNET) needs root: {}",
        std::io::Error::last_os_error()
    );
    for args in [
        &["link", "set", "lo", "up"][..],
        &["addr", "add", "8.8.8.8/32", "dev", "lo"],
        &["addr", "add", "8.8.4.4/32", "dev", "lo"],
    ] {
        let st = Command::new("ip")
            .args(args)
            .status()
            .expect("ip (iproute2)");
        assert!(st.success(), "ip {args:?}");
    }
}

/// An upstream answering every request with `hello from <addr>`; returns its
/// port, its accept task and the count of requests served.
async fn upstream(
    ip: &str,
) -> (
    u16,
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    let ip = ip.to_string();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body = format!("hello from {ip}");
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut tmp).await {
                        Ok(n) if n > 0 => buf.extend_from_slice(&tmp[..n]),
                        _ => return,
                    }
                }
                let r = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(r.as_bytes()).await;
            });
        }
    });
    (port, task, served)
}

fn proxy(extra: Value) -> Value {
    let mut p = json!({"enabled": true, "enableSocks5": false, "enableSocks5Udp": false,
        "allowUpstreamProxy": false, "dangerouslyAllowAllUnixSockets": false, "mode": "full",
        "allowLocalBinding": false});
    if let (Some(o), Some(e)) = (p.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    p
}

/// curl through the proxy variables: prints the body, a newline and the status.
fn curl(url: &str) -> String {
    format!("curl -sS --max-time 30 -o - -w '\\n%{{http_code}}' {url}")
}

/// How the test answers a `network/policyRequest`.
#[derive(Clone)]
enum Reply {
    Result(Value),
    Error,
    Silence,
}

#[derive(Debug, Default)]
struct Outcome {
    out: String,
    exit: i64,
    requests: Vec<Value>,
    audits: Vec<Value>,
}

impl Outcome {
    /// The status curl printed last, and the body before it.
    fn http(&self) -> (String, String) {
        let (body, code) = self
            .out
            .trim_end()
            .rsplit_once('\n')
            .unwrap_or(("", self.out.trim()));
        (body.to_string(), code.to_string())
    }
}

/// Starts `sh -c script` with `network_proxy` (and `sandbox`), answers each
/// policy request with `reply`, and collects everything until the close.
async fn run_proxied(
    c: &mut Conn,
    id: &str,
    cwd: &Path,
    script: &str,
    network_proxy: Value,
    sandbox: Option<Value>,
    reply: Reply,
) -> Outcome {
    let mut p = start_params(id, &["/bin/sh", "-c", script], cwd, false, false);
    p["networkProxy"] = network_proxy;
    if let Some(s) = sandbox {
        p["enforceManagedNetwork"] = json!(true);
        p["sandbox"] = s;
    }
    run_start(c, id, p, reply).await
}

/// Sends the `process/start` `p` (process `id`), answers each policy request
/// with `reply`, and collects everything until the close.
async fn run_start(c: &mut Conn, id: &str, p: Value, reply: Reply) -> Outcome {
    c.ok("process/start", p).await;
    let mut o = Outcome::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .expect("process closes in 60 s");
        let m = c
            .expect(|m| m["params"]["processId"] == json!(id), left)
            .await
            .unwrap_or_else(|| panic!("{id}: no close; so far {o:?}"));
        match m["method"].as_str() {
            Some("network/policyRequest") => {
                assert!(m["id"].as_i64().is_some_and(|i| i >= 1), "{m}");
                o.requests.push(m.clone());
                let answer = match &reply {
                    Reply::Result(r) => Some(json!({"id": m["id"], "result": r})),
                    Reply::Error => {
                        Some(json!({"id": m["id"], "error": {"code": -32000, "message": "no"}}))
                    }
                    Reply::Silence => None,
                };
                if let Some(a) = answer {
                    c.send_raw(a.to_string()).await;
                }
            }
            Some("network/policyDecision") => o.audits.push(m["params"].clone()),
            Some("process/output") => o
                .out
                .push_str(&String::from_utf8_lossy(&unb64(&m["params"]["chunk"]))),
            Some("process/exited") => o.exit = m["params"]["exitCode"].as_i64().unwrap_or(-1),
            Some("process/closed") => break,
            _ => {}
        }
    }
    // Audits are sent on their own tasks: one that lost the race with
    // `closed` is still in flight.
    while let Some(m) = c
        .expect(
            |m| m["method"] == "network/policyDecision" && m["params"]["processId"] == json!(id),
            Duration::from_millis(300),
        )
        .await
    {
        o.audits.push(m["params"].clone());
    }
    o
}

fn blocked(o: &Outcome) -> Value {
    let (body, code) = o.http();
    assert_eq!(code, "403", "{o:?}");
    // The JSON body is the last line before the status (the script may print before it).
    let body = body.lines().last().unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|_| panic!("JSON 403 body: {body:?}"))
}

/// What an error message must be.
enum Text {
    Is(&'static str),
    Has(&'static str),
    Any,
}

#[tokio::test]
async fn n7_launch_validation_and_enforcement_without_proxy_or_sandbox() {
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let d = tmpdir("n7");
    let start = |id: &str, extra: Value| {
        let mut p = start_params(id, &["/bin/true"], &d, false, false);
        if let (Some(o), Some(e)) = (p.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        p
    };
    // (process id, extra params, code, what the message must be or contain)
    let cases = [
        (
            "n7a",
            json!({"networkProxy": {"proxy": proxy(json!({})), "policyDecisionTimeoutMs": 0}}),
            -32602,
            Text::Is("network policy decision callback timeout must be nonzero"),
        ),
        (
            "",
            json!({"networkProxy": {"proxy": proxy(json!({})), "policyDecisionTimeoutMs": 10}}),
            -32602,
            Text::Is("callback-enabled process ID must be non-empty and at most 256 bytes"),
        ),
        (
            "n7c",
            json!({"networkProxy": {"proxy": proxy(json!({"enabled": false}))}}),
            -32602,
            Text::Any,
        ),
        // Missing required fields.
        (
            "n7d",
            json!({"networkProxy": {"proxy": {"enabled": true}}}),
            -32602,
            Text::Any,
        ),
        // 0.171.0 type-checks transparentTcp.
        (
            "n7g",
            json!({"networkProxy": {"proxy": proxy(json!({"transparentTcp": 12345}))}}),
            -32602,
            Text::Has("expected a boolean"),
        ),
        // Ours: enforcement without a sandbox is refused, not ignored.
        (
            "n7e",
            json!({"enforceManagedNetwork": true, "networkProxy": {"proxy": proxy(json!({}))}}),
            -32602,
            Text::Has("requires a sandbox"),
        ),
        // Credential masking's wire, as the reference 0.169.0 checks it.
        (
            "n7cm1",
            json!({"networkProxy": {"proxy": proxy(json!({"credentialProviders": {"x": 5}}))}}),
            -32602,
            Text::Has("expected struct CredentialProviderConfig"),
        ),
        (
            "n7cm2",
            json!({"networkProxy": {"proxy": proxy(json!({"credentialProviders": {"x": {"secret_env_var": "A"}}}))}}),
            -32602,
            Text::Has("unknown field `secret_env_var`, expected one of `env`, `patterns`, `url_prefixes`, `url_prefix_from_env`, `auth`, `header`, `prefix`"),
        ),
        (
            "n7cm3",
            json!({"networkProxy": {"proxy": proxy(json!({"credentialMasking": 5}))}}),
            -32602,
            Text::Has("expected a boolean"),
        ),
        (
            "n7cm4",
            json!({"networkProxy": {"proxy": proxy(json!({"credentialProviders": {"x": {"auth": ["digest"]}}}))}}),
            -32602,
            Text::Has("unknown variant `digest`"),
        ),
        // S24: with a sandbox but no proxy the command never runs.
        (
            "n7f",
            json!({"enforceManagedNetwork": true, "sandbox": ww(&d)}),
            -32603,
            Text::Any,
        ),
    ];
    for (id, extra, code, text) in cases {
        let r = c.call("process/start", start(id, extra)).await;
        assert_eq!(r["error"]["code"], code, "{id:?}: {r}");
        let message = r["error"]["message"].as_str().unwrap_or("");
        match text {
            Text::Is(t) => assert_eq!(message, t, "{id:?}"),
            Text::Has(t) => assert!(message.contains(t), "{id:?}: {r}"),
            Text::Any => {}
        }
    }
    // An empty provider is accepted (it masks nothing).
    let ok = json!({"networkProxy": {"proxy": proxy(json!({"credentialMasking": true,
        "credentialProviders": {"x": {}}}))}});
    c.ok("process/start", start("n7ok", ok)).await;
    let caps = c.ok("environment/info", json!({})).await;
    let caps = if caps["capabilities"].is_object() {
        caps["capabilities"].clone()
    } else {
        caps["environmentInfo"]["capabilities"].clone()
    };
    assert_eq!(caps["networkProxyLaunch"], true, "{caps}");
    assert_eq!(caps["networkProxyReviewDomains"], true, "{caps}");
    assert_eq!(caps["networkProxyTransparentTcp"], true, "{caps}");
    assert_eq!(caps["credentialMasking"], true, "{caps}");
    assert_eq!(caps["credentialMaskingCustomProviders"], true, "{caps}");
}

#[tokio::test]
async fn n1_local_destinations_are_refused_without_asking() {
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let d = tmpdir("n1");
    let (base, task) = loopback_http::http_server().await;
    let np = json!({"proxy": proxy(json!({})), "policyDecisionTimeoutMs": 2000});
    let script = format!("env | grep -E '^(HTTP_PROXY|http_proxy|ALL_PROXY|NO_PROXY|CODEX_NETWORK_PROXY_ACTIVE|CODEX_NETWORK_ALLOW_LOCAL_BINDING|NODE_USE_ENV_PROXY|PIP_PROXY)=' | sort; {}", curl(&format!("{base}/echo")));
    let o = run_proxied(
        &mut c,
        "n1",
        &d,
        &script,
        np,
        None,
        Reply::Result(json!({"decision": {"type": "allow"}})),
    )
    .await;
    let proxy_url = o
        .out
        .lines()
        .find_map(|l| l.strip_prefix("HTTP_PROXY="))
        .expect("HTTP_PROXY set")
        .to_string();
    assert!(proxy_url.starts_with("http://127.0.0.1:"), "{proxy_url}");
    for want in [
        format!("http_proxy={proxy_url}"),
        format!("ALL_PROXY={proxy_url}"),
        format!("PIP_PROXY={proxy_url}"),
        "NO_PROXY=".into(),
        "CODEX_NETWORK_PROXY_ACTIVE=1".into(),
        "CODEX_NETWORK_ALLOW_LOCAL_BINDING=0".into(),
        "NODE_USE_ENV_PROXY=1".into(),
    ] {
        assert!(o.out.lines().any(|l| l == want), "{want} in {}", o.out);
    }
    let b = blocked(&o);
    assert_eq!(b["reason"], "not_allowed_local", "{b}");
    assert_eq!(b["source"], "baseline_policy");
    assert_eq!(b["decision"], "deny");
    assert_eq!(b["status"], "blocked");
    assert_eq!(b["protocol"], "http");
    assert_eq!(b["host"], "127.0.0.1");
    assert_eq!(
        b["message"],
        "Sandbox policy blocks local/private network addresses."
    );
    assert!(o.requests.is_empty(), "no policyRequest: {:?}", o.requests);
    assert_eq!(o.audits.len(), 1, "{:?}", o.audits);
    assert_eq!(o.audits[0]["reason"], "not_allowed_local");
    assert_eq!(o.audits[0]["scope"], "domain");
    assert_eq!(o.audits[0]["policyOverride"], false);
    // allowLocalBinding: loopback goes through, no callback, no audit.
    let np = json!({"proxy": proxy(json!({"allowLocalBinding": true})), "policyDecisionTimeoutMs": 2000});
    let o = run_proxied(
        &mut c,
        "n1b",
        &d,
        &curl(&format!("{base}/echo")),
        np,
        None,
        Reply::Silence,
    )
    .await;
    assert_eq!(o.http().1, "200", "{o:?}");
    assert!(
        o.http().0.contains("GET /echo"),
        "origin-form request line reached the server: {o:?}"
    );
    assert!(o.requests.is_empty() && o.audits.is_empty(), "{o:?}");
    task.abort();
}

#[tokio::test]
async fn n2_n3_n4_the_client_decides_and_failures_deny() {
    private_internet();
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let d = tmpdir("n2");
    let (port, task, _) = upstream("8.8.8.8").await;
    let url = format!("http://8.8.8.8:{port}/x");
    let np = |t: u64| json!({"proxy": proxy(json!({})), "policyDecisionTimeoutMs": t});
    // N2: allow → forwarded; audit allow with policyOverride.
    let o = run_proxied(
        &mut c,
        "n2",
        &d,
        &curl(&url),
        np(2000),
        None,
        Reply::Result(json!({"decision": {"type": "allow"}})),
    )
    .await;
    assert_eq!(
        o.http(),
        ("hello from 8.8.8.8".into(), "200".into()),
        "{o:?}"
    );
    assert_eq!(o.requests.len(), 1, "{o:?}");
    assert_eq!(
        o.requests[0]["params"]["request"],
        json!({"protocol": "http", "host": "8.8.8.8", "port": port})
    );
    let a = &o.audits[0];
    assert_eq!(
        (
            a["decision"].as_str(),
            a["source"].as_str(),
            a["policyOverride"].as_bool()
        ),
        (Some("allow"), Some("decider"), Some(true)),
        "{a}"
    );
    assert_eq!(a["method"], "GET");
    // Allowed but unreachable: 502.
    let o = run_proxied(
        &mut c,
        "n2b",
        &d,
        &curl("http://8.8.4.4:9/"),
        np(2000),
        None,
        Reply::Result(json!({"decision": {"type": "allow"}})),
    )
    .await;
    assert_eq!(o.http().1, "502", "{o:?}");
    // N3: deny with the client's reason; ask.
    let o = run_proxied(
        &mut c,
        "n3",
        &d,
        &curl(&url),
        np(2000),
        None,
        Reply::Result(json!({"decision": {"type": "deny", "reason": "not today"}})),
    )
    .await;
    let b = blocked(&o);
    assert_eq!(
        (
            b["decision"].as_str(),
            b["reason"].as_str(),
            b["source"].as_str()
        ),
        (Some("deny"), Some("not today"), Some("decider")),
        "{b}"
    );
    assert_eq!(o.audits[0]["decision"], "deny");
    let o = run_proxied(
        &mut c,
        "n3b",
        &d,
        &curl(&url),
        np(2000),
        None,
        Reply::Result(json!({"decision": {"type": "ask", "reason": "ask a human"}})),
    )
    .await;
    assert_eq!(blocked(&o)["decision"], "ask");
    assert_eq!(o.audits[0]["decision"], "ask");
    // N4: an error answer and a malformed one deny at once; silence after timeout + 5 s.
    for (id, reply) in [
        ("n4a", Reply::Error),
        (
            "n4b",
            Reply::Result(json!({"decision": {"type": "perhaps"}})),
        ),
        (
            "n4c",
            Reply::Result(json!({"decision": {"type": "deny", "reason": "bell\u{7}"}})),
        ),
    ] {
        let t = Instant::now();
        let o = run_proxied(&mut c, id, &d, &curl(&url), np(30_000), None, reply).await;
        assert_eq!(blocked(&o)["reason"], "not_allowed", "{id}: {o:?}");
        assert!(t.elapsed() < Duration::from_secs(10), "{id} denied at once");
    }
    let t = Instant::now();
    let o = run_proxied(
        &mut c,
        "n4d",
        &d,
        &curl(&url),
        np(300),
        None,
        Reply::Silence,
    )
    .await;
    let b = blocked(&o);
    assert_eq!(
        (b["reason"].as_str(), b["decision"].as_str()),
        (Some("not_allowed"), Some("deny")),
        "{b}"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(5300),
        "waited timeout + 5 s: {:?}",
        t.elapsed()
    );
    // Without policyDecisionTimeoutMs nobody is asked.
    let o = run_proxied(
        &mut c,
        "n4e",
        &d,
        &curl(&url),
        json!({"proxy": proxy(json!({}))}),
        None,
        Reply::Silence,
    )
    .await;
    assert_eq!(blocked(&o)["reason"], "not_allowed");
    assert!(o.requests.is_empty());
    task.abort();
}

#[tokio::test]
async fn n5_domain_rules_decide_without_asking() {
    private_internet();
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let d = tmpdir("n5");
    let (port, task, _) = upstream("8.8.8.8").await;
    let url = format!("http://8.8.8.8:{port}/");
    let np = |rule: &str| json!({"proxy": proxy(json!({"domains": {"8.8.8.8": rule}})), "policyDecisionTimeoutMs": 2000});
    let o = run_proxied(
        &mut c,
        "n5a",
        &d,
        &curl(&url),
        np("allow"),
        None,
        Reply::Silence,
    )
    .await;
    assert_eq!(
        o.http(),
        ("hello from 8.8.8.8".into(), "200".into()),
        "{o:?}"
    );
    assert!(o.requests.is_empty());
    let o = run_proxied(
        &mut c,
        "n5b",
        &d,
        &curl(&url),
        np("deny"),
        None,
        Reply::Silence,
    )
    .await;
    let b = blocked(&o);
    assert_eq!(
        (b["reason"].as_str(), b["source"].as_str()),
        (Some("denied"), Some("baseline_policy")),
        "{b}"
    );
    assert!(o.requests.is_empty());
    // reviewDomains: asked even though `domains` allows it.
    let np = json!({"proxy": proxy(json!({"domains": {"8.8.8.8": "allow"}, "reviewDomains": ["8.8.8.8"]})), "policyDecisionTimeoutMs": 2000});
    let o = run_proxied(
        &mut c,
        "n5c",
        &d,
        &curl(&url),
        np,
        None,
        Reply::Result(json!({"decision": {"type": "deny", "reason": "reviewed"}})),
    )
    .await;
    assert_eq!(blocked(&o)["reason"], "reviewed");
    assert_eq!(o.requests.len(), 1);
    // HTTPS through CONNECT: the tunnel is decided as `https_connect` (the
    // upstream speaks no TLS, so curl fails after the tunnel opened).
    let np = json!({"proxy": proxy(json!({})), "policyDecisionTimeoutMs": 2000});
    let o = run_proxied(
        &mut c,
        "n5d",
        &d,
        &format!("curl -sS --max-time 10 https://8.8.8.8:{port}/ ; echo rc=$?"),
        np,
        None,
        Reply::Result(json!({"decision": {"type": "allow"}})),
    )
    .await;
    assert_eq!(
        o.requests[0]["params"]["request"]["protocol"], "https_connect",
        "{o:?}"
    );
    // SOCKS5 (ALL_PROXY=socks5h://…): decided as `socks5_tcp`.
    let np =
        json!({"proxy": proxy(json!({"enableSocks5": true})), "policyDecisionTimeoutMs": 2000});
    let o = run_proxied(
        &mut c,
        "n5e",
        &d,
        &format!("curl -sS --max-time 10 -x \"$ALL_PROXY\" -o - -w '\\n%{{http_code}}' {url}"),
        np,
        None,
        Reply::Result(json!({"decision": {"type": "allow"}})),
    )
    .await;
    assert_eq!(
        o.http(),
        ("hello from 8.8.8.8".into(), "200".into()),
        "{o:?}"
    );
    assert_eq!(
        o.requests[0]["params"]["request"]["protocol"], "socks5_tcp",
        "{o:?}"
    );
    task.abort();
}

#[tokio::test]
async fn n6_enforced_sandbox_reaches_only_the_proxy() {
    private_internet();
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let f = fixture("n6");
    let (port, task, served) = upstream("8.8.8.8").await;
    let (local, local_task) = loopback_http::http_server().await;
    let url = format!("http://8.8.8.8:{port}/");
    let script = format!(
        "curl -sS --max-time 5 --noproxy '*' {local}/echo; echo direct_loopback=$?; \
         curl -sS --max-time 5 --noproxy '*' {url}; echo direct_upstream=$?; \
         {} ; echo; {}",
        curl(&url),
        curl(&format!("{url}again"))
    );
    let np = json!({"proxy": proxy(json!({})), "policyDecisionTimeoutMs": 5000});
    let o = run_proxied(
        &mut c,
        "n6",
        &f.ws,
        &script,
        np,
        Some(ww(&f.ws)),
        Reply::Result(json!({"decision": {"type": "allow"}})),
    )
    .await;
    assert!(
        o.out.contains("direct_loopback=7"),
        "direct to host loopback fails: {o:?}"
    );
    assert!(
        o.out.contains("direct_upstream=7"),
        "direct to the upstream fails: {o:?}"
    );
    assert_eq!(
        o.out.matches("hello from 8.8.8.8").count(),
        2,
        "proxied requests reach the upstream: {o:?}"
    );
    assert_eq!(
        o.requests.len(),
        1,
        "one policyRequest per new host: {:?}",
        o.requests
    );
    assert_eq!(
        served.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "only the proxied requests arrived"
    );
    assert_eq!(o.exit, 0, "{o:?}");
    // Denied inside the sandbox too.
    let np = json!({"proxy": proxy(json!({})), "policyDecisionTimeoutMs": 5000});
    let o = run_proxied(
        &mut c,
        "n6b",
        &f.ws,
        &curl(&url),
        np,
        Some(ww(&f.ws)),
        Reply::Result(json!({"decision": {"type": "deny", "reason": "no"}})),
    )
    .await;
    assert_eq!(blocked(&o)["reason"], "no");
    task.abort();
    local_task.abort();
}

#[tokio::test]
async fn a_detached_session_denies_pending_asks_at_once() {
    private_internet();
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let session = c.session.clone();
    let d = tmpdir("detach");
    let (port, task, _) = upstream("8.8.8.8").await;
    let mut p = start_params(
        "det",
        &["/bin/sh", "-c", &curl(&format!("http://8.8.8.8:{port}/"))],
        &d,
        false,
        false,
    );
    p["networkProxy"] = json!({"proxy": proxy(json!({})), "policyDecisionTimeoutMs": 60_000});
    c.ok("process/start", p).await;
    let req = c
        .expect(|m| m["method"] == "network/policyRequest", WAIT)
        .await
        .expect("asked");
    assert!(req["id"].as_i64().is_some(), "{req}");
    let t = Instant::now();
    c.close().await;
    let mut c = Conn::open(&s.url, Some(&session)).await;
    let (mut out, mut after) = (String::new(), 0);
    for _ in 0..50 {
        let r = read(&mut c, "det", after, 1000).await;
        for ch in r["chunks"].as_array().into_iter().flatten() {
            out.push_str(&String::from_utf8_lossy(&unb64(&ch["chunk"])));
        }
        after = r["nextSeq"]
            .as_u64()
            .unwrap_or(after)
            .saturating_sub(1)
            .max(after);
        if r["closed"] == true {
            break;
        }
    }
    assert!(out.contains("403"), "denied after the disconnect: {out}");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "not after the 65 s timeout"
    );
    task.abort();
}

/// `exec-server run --allow-host`: the listed host is allowed through the
/// proxy, any other denied, by the CLI answering the policy requests.
#[tokio::test]
async fn cli_run_allow_host_allows_only_the_listed_hosts() {
    private_internet();
    let (port, task, _) = upstream("8.8.8.8").await;
    let (port2, task2, served2) = upstream("8.8.4.4").await;
    let script = format!(
        "{}; echo; {}",
        curl(&format!("http://8.8.8.8:{port}/")),
        curl(&format!("http://8.8.4.4:{port2}/"))
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args([
                "run",
                "--allow-host",
                "8.8.8.8",
                "--",
                "/bin/sh",
                "-c",
                &script,
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("hello from 8.8.8.8\n200"), "{text}");
    assert!(
        text.contains("not in the client's allow list") && text.trim_end().ends_with("403"),
        "{text}"
    );
    assert_eq!(
        served2.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the unlisted host was never reached"
    );
    task.abort();
    task2.abort();
}

/// A raw TCP echo server: returns its port and the count of connections
/// it accepted.
async fn echo(
    ip: &str,
) -> (
    u16,
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (port, task, accepted)
}

/// A program that ignores every proxy variable: connects straight to
/// `ip:port`, sends `ping`, prints `TAG got <reply>` or `TAG err <errno>`;
/// once connected, connects again and prints `TAG again <errno>`.
fn raw_tcp(tag: &str, ip: &str, port: u16) -> String {
    let py = [
        "import socket".to_string(),
        "try:".into(),
        format!(" s = socket.create_connection((\"{ip}\", {port}), timeout=5)"),
        " s.sendall(b\"ping\")".into(),
        format!(" print(\"{tag} got\", s.recv(100).decode())"),
        "except OSError as e:".into(),
        format!(" print(\"{tag} err\", e.errno)"),
        "else:".into(),
        " try:".into(),
        format!("  s.connect((\"{ip}\", {port}))"),
        " except OSError as e:".into(),
        format!("  print(\"{tag} again\", e.errno)"),
    ];
    format!("python3 -c '{}'", py.join("\n"))
}

/// A one-shot-per-connection HTTP CONNECT proxy on 127.0.0.1: records each
/// request line and tunnels to the named destination.
async fn connect_proxy() -> (
    u16,
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let l = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
                    match s.read_u8().await {
                        Ok(b) => head.push(b),
                        Err(_) => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let line = head.lines().next().unwrap_or("").to_string();
                log.lock().unwrap().push(line.clone());
                let Some(target) = line
                    .strip_prefix("CONNECT ")
                    .and_then(|r| r.split(' ').next())
                else {
                    let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
                    return;
                };
                let Ok(mut up) = tokio::net::TcpStream::connect(target).await else {
                    let _ = s.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                    return;
                };
                let _ = s
                    .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    .await;
                let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
            });
        }
    });
    (port, task, seen)
}

#[tokio::test]
async fn transparent_tcp_carries_raw_connects_through_the_policy() {
    private_internet();
    let st = Command::new("ip")
        .args(["addr", "add", "1.1.1.1/32", "dev", "lo"])
        .status()
        .expect("ip");
    assert!(st.success());
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let f = fixture("ttcp");
    let (allowed, t1, allowed_n) = echo("8.8.8.8").await;
    let (denied, t2, denied_n) = echo("8.8.4.4").await;
    let (asked, t3, asked_n) = echo("1.1.1.1").await;
    let (http, t4, _) = upstream("8.8.8.8").await;
    let script = [
        raw_tcp("allowed", "8.8.8.8", allowed),
        raw_tcp("denied", "8.8.4.4", denied),
        raw_tcp("asked1", "1.1.1.1", asked),
        raw_tcp("asked2", "1.1.1.1", asked),
        // From a thread other than the main one (the notification names the thread).
        format!(
            "python3 -c 'import socket,threading\ndef f():\n s=socket.create_connection((\"8.8.8.8\",{allowed}),timeout=5); \
             s.sendall(b\"ping\"); print(\"thread got\", s.recv(100).decode())\n\
             t=threading.Thread(target=f); t.start(); t.join()'"
        ),
        format!("curl -sS --max-time 5 --noproxy '*' http://8.8.8.8:{http}/; echo; echo curl=$?"),
    ]
    .join("; ");
    let np = json!({"proxy": proxy(json!({"transparentTcp": true,
        "domains": {"8.8.8.8": "allow", "8.8.4.4": "deny"}})), "policyDecisionTimeoutMs": 5000});
    let started = Instant::now();
    let o = run_proxied(
        &mut c,
        "ttcp",
        &f.ws,
        &script,
        np,
        Some(ww(&f.ws)),
        Reply::Result(json!({"decision": {"type": "allow"}})),
    )
    .await;
    assert!(o.out.contains("allowed got ping"), "{o:?}");
    assert!(o.out.contains("thread got ping"), "{o:?}");
    assert!(
        o.out.contains(&format!("allowed again {}", libc::EISCONN)),
        "a carried socket is connected for the program too: {o:?}"
    );
    assert!(
        o.out
            .contains(&format!("denied err {}", libc::ECONNREFUSED)),
        "a denied destination is refused: {o:?}"
    );
    assert!(
        o.out.contains("asked1 got ping") && o.out.contains("asked2 got ping"),
        "{o:?}"
    );
    assert!(
        o.out.contains("hello from 8.8.8.8") && o.out.contains("curl=0"),
        "{o:?}"
    );
    assert_eq!(o.requests.len(), 1, "one policyRequest: {:?}", o.requests);
    assert_eq!(
        o.requests[0]["params"]["request"],
        json!({"protocol": "socks5_tcp", "host": "1.1.1.1", "port": asked})
    );
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(allowed_n.load(SeqCst), 2);
    assert_eq!(denied_n.load(SeqCst), 0, "the denied upstream saw nothing");
    assert_eq!(asked_n.load(SeqCst), 2);
    assert!(
        o.audits
            .iter()
            .any(|a| a["host"] == "8.8.4.4" && a["decision"] == "deny"),
        "{:?}",
        o.audits
    );
    assert_eq!(o.exit, 0, "{o:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    for t in [t1, t2, t3, t4] {
        t.abort();
    }
}

#[tokio::test]
async fn tcp_upstream_proxy_carries_transparent_tcp_and_false_keeps_it_blocked() {
    private_internet();
    let (pport, ptask, seen) = connect_proxy().await;
    let upstream_flag = format!("127.0.0.1:{pport}");
    let s = Server::start(&[
        "--linux-sandbox-transparent-tcp",
        "--tcp-upstream-proxy",
        &upstream_flag,
    ]);
    let mut c = Conn::open(&s.url, None).await;
    let f = fixture("ttcp-up");
    let (port, task, accepted) = echo("8.8.8.8").await;
    // The flag turns it on for a request that does not say.
    let np = json!({"proxy": proxy(json!({"domains": {"8.8.8.8": "allow"}}))});
    let o = run_proxied(
        &mut c,
        "ttcp-up",
        &f.ws,
        &raw_tcp("via", "8.8.8.8", port),
        np,
        Some(ww(&f.ws)),
        Reply::Silence,
    )
    .await;
    assert!(o.out.contains("via got ping"), "{o:?}");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![format!("CONNECT 8.8.8.8:{port} HTTP/1.1")],
        "the raw connection went through the CONNECT proxy"
    );
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(accepted.load(SeqCst), 1);
    // A request's explicit false wins: raw TCP stays blocked (no route).
    let np = json!({"proxy": proxy(json!({"transparentTcp": false,
        "domains": {"8.8.8.8": "allow"}}))});
    let o = run_proxied(
        &mut c,
        "ttcp-off",
        &f.ws,
        &raw_tcp("off", "8.8.8.8", port),
        np,
        Some(ww(&f.ws)),
        Reply::Silence,
    )
    .await;
    assert!(
        o.out.contains(&format!("off err {}", libc::ENETUNREACH)),
        "{o:?}"
    );
    assert_eq!(
        accepted.load(SeqCst),
        1,
        "nothing more reached the upstream"
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    task.abort();
    ptask.abort();
}

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
         curl -sS --max-time 10 -H \"X-Svc-Key: $SVC_KEY\" http://8.8.4.4:{plain_port}/; echo \" rc=$?\""
    );
    let mut p = start_params("m2", &["/bin/sh", "-c", &script], &f.ws, false, false);
    p["networkProxy"] = np;
    p["env"]["SVC_KEY"] = json!(real);
    p["enforceManagedNetwork"] = json!(true);
    p["sandbox"] = ww(&f.ws);
    let o = run_start(&mut c, "m2", p, Reply::Silence).await;
    let lines: Vec<&str> = o.out.lines().collect();
    assert!(lines.len() >= 4, "{o:?}");
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
    assert_eq!(tls_got.len(), 2, "{tls_got:?}");
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
    let plain_got = plain_heads.lock().unwrap().clone();
    assert_eq!(plain_got.len(), 1, "{plain_got:?}");
    assert!(
        lower(&plain_got[0]).contains(&format!("x-svc-key: {real}")),
        "{plain_got:?}"
    );
    for l in &lines[1..4] {
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
