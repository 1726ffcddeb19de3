//! Managed network (issue 14, SANDBOX.md §3, cases N1–N7): the per-process
//! proxy, `network/policyRequest` answered by this test as the client, the
//! audit notifications, and enforcement inside a sandbox.
//!
//! Upstream "internet" hosts never leave the machine: the tests that need a
//! non-local destination move their own thread into a network namespace they
//! make (`unshare(CLONE_NEWNET)`, root only), give its loopback the addresses
//! 8.8.8.8 and 8.8.4.4, and run the server, the upstream and curl there.

use crate::common;
/// Answers to policy requests after their timeout.
#[path = "managed_network/late_answers.rs"]
mod late_answers;
/// Credential masking.
#[path = "managed_network/masking.rs"]
mod masking;
/// Transparent TCP (0.171.0's `networkProxyTransparentTcp`).
#[path = "managed_network/ttcp.rs"]
mod ttcp;

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

/// A `networkProxy.proxy` object: full mode, nothing allowed locally, `extra` on top.
pub(crate) fn proxy(extra: Value) -> Value {
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
    // The server may not have seen the close yet: retried while attached.
    let mut c = Conn::open_retry(&s.url, &session).await;
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
        crate::common::server_command(BIN)
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
