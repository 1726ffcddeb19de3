//! The decision for one destination, in the reference's order (SANDBOX.md
//! §3.1): a malformed host is refused; a local/private destination is refused
//! unless `allowLocalBinding`; `domains` deny, then `reviewDomains` (always
//! asked), then `domains` allow; otherwise the [`Decider`] is asked when the
//! launch enabled it, else the destination is refused. A decider's valid
//! answer is remembered per host for the life of the proxy, so a host is asked
//! about once; a failed ask (timeout, disconnect, bad answer) is not remembered.

use crate::host;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::OnceCell;

/// How the child reached the proxy (`protocol` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// A plain `http://` request through the HTTP listener.
    Http,
    /// `CONNECT` through the HTTP listener.
    HttpsConnect,
    /// SOCKS5 `CONNECT`.
    Socks5Tcp,
    /// SOCKS5 `UDP ASSOCIATE` datagrams.
    Socks5Udp,
}

impl Protocol {
    /// The wire name: `http`, `https_connect`, `socks5_tcp`, `socks5_udp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::HttpsConnect => "https_connect",
            Protocol::Socks5Tcp => "socks5_tcp",
            Protocol::Socks5Udp => "socks5_udp",
        }
    }
}

/// One destination the child asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// How it was asked.
    pub protocol: Protocol,
    /// Host name or IP literal as the child gave it (IPv6 without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
    /// HTTP method (`GET`, `CONNECT`…); `None` for SOCKS.
    pub method: Option<String>,
    /// The child's end of the proxy connection.
    pub client: Option<SocketAddr>,
}

/// `allow` / `deny` / `ask` (the wire's `decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward.
    Allow,
    /// Refuse (403).
    Deny,
    /// The client wants a human to decide: refused (403) for now.
    Ask,
}

impl Verdict {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Ask => "ask",
        }
    }
}

/// Who decided (`source` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The launch's own rules.
    Baseline,
    /// The [`Decider`] (the client).
    Decider,
}

impl Source {
    /// The wire name: `baseline_policy` or `decider`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Baseline => "baseline_policy",
            Source::Decider => "decider",
        }
    }
}

/// Reason of a local/private destination refused.
pub const REASON_LOCAL: &str = "not_allowed_local";
/// Reason of a `domains` deny.
pub const REASON_DENIED: &str = "denied";
/// Reason of everything else refused, including every failed ask.
pub const REASON_NOT_ALLOWED: &str = "not_allowed";
/// Reason of a `limited`-mode refusal of a method other than GET/HEAD/OPTIONS.
pub const REASON_METHOD: &str = "method_not_allowed";
/// Reason of an allowed destination.
pub const REASON_ALLOW: &str = "allow";

/// The outcome for one destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// What to do.
    pub verdict: Verdict,
    /// Who decided.
    pub source: Source,
    /// Why (one of the `REASON_*` constants or the decider's text).
    pub reason: String,
    /// True when the decider allowed what the baseline would have refused.
    pub policy_override: bool,
    /// False for the silent pass of a local destination under
    /// `allowLocalBinding` (the reference reports no audit event for it).
    pub audited: bool,
}

impl Decision {
    fn baseline(verdict: Verdict, reason: &str) -> Self {
        Decision {
            verdict,
            source: Source::Baseline,
            reason: reason.into(),
            policy_override: false,
            audited: true,
        }
    }

    /// True when the request goes through.
    pub fn allowed(&self) -> bool {
        self.verdict == Verdict::Allow
    }
}

/// A decider's valid answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The verdict.
    pub verdict: Verdict,
    /// The decider's reason, if it gave one.
    pub reason: Option<String>,
}

/// Why an ask produced no answer; every variant is a deny (`not_allowed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskFailure {
    /// No answer within the timeout.
    TimedOut,
    /// Nobody to ask (no connection attached, or it closed).
    Unavailable,
    /// The decider answered with an error or something malformed.
    Invalid(String),
    /// Too many asks in flight.
    Busy,
}

/// A boxed future, as [`Decider`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What the proxy consults for destinations its rules leave open, and where it
/// reports decisions. The server implements it over `network/policyRequest`.
pub trait Decider: Send + Sync + 'static {
    /// Asks about `dest`. Must resolve (the implementation owns the timeout).
    fn ask(&self, dest: &Destination) -> BoxFuture<Result<Answer, AskFailure>>;
    /// Reports a decision (the audit trail). Must not block.
    fn audit(&self, dest: &Destination, decision: &Decision);
}

/// A `domains` / `reviewDomains` pattern: `*` (any host), `*.example.com`
/// (strict subdomains), `**.example.com` (the domain and its subdomains), or
/// an exact host. Matching is case-insensitive and ignores a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    /// Normalises `p` (lower case, no trailing dot, no IPv6 brackets).
    pub fn new(p: &str) -> Self {
        Pattern(normal(p))
    }

    /// True when the pattern covers `host` (already normalised).
    fn matches(&self, host: &str) -> bool {
        let p = self.0.as_str();
        if p == "*" {
            return true;
        }
        if let Some(base) = p.strip_prefix("**.") {
            return host == base || host.ends_with(&format!(".{base}"));
        }
        if let Some(base) = p.strip_prefix("*.") {
            return host.ends_with(&format!(".{base}"));
        }
        p == host
    }
}

use crate::host::normalize as normal;

/// The launch's rules.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Local/private destinations pass without asking.
    pub allow_local_binding: bool,
    /// `domains` with `allow`.
    pub allow: Vec<Pattern>,
    /// `domains` with `deny` (wins over every allow).
    pub deny: Vec<Pattern>,
    /// `reviewDomains`: always asked (refused when asking is off).
    pub review: Vec<Pattern>,
    /// Ask the decider about what no rule decides (`policyDecisionTimeoutMs` given).
    pub ask: bool,
    /// `mode: limited`: plain HTTP methods other than GET, HEAD, OPTIONS refused.
    pub limited: bool,
    /// The ports the server running this proxy listens on: a local
    /// destination on one of them is refused even with
    /// [`Rules::allow_local_binding`], so a command cannot reach that server
    /// (and start unconfined processes) through its own proxy.
    pub reserved_local_ports: Vec<u16>,
}

/// The rules plus the decider and its remembered answers.
pub struct Policy {
    rules: Rules,
    decider: Arc<dyn Decider>,
    asked: Mutex<HashMap<String, Arc<OnceCell<Answer>>>>,
}

impl Policy {
    /// A policy over `rules` consulting `decider`.
    pub fn new(rules: Rules, decider: Arc<dyn Decider>) -> Self {
        Policy {
            rules,
            decider,
            asked: Mutex::new(HashMap::new()),
        }
    }

    /// The rules.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Decides `dest` (`local` = the host is or resolved to a local/private
    /// address) and reports the decision to the decider's audit.
    pub async fn decide(&self, dest: &Destination, local: bool) -> Decision {
        let d = self.decide_quietly(dest, local).await;
        if d.audited {
            self.decider.audit(dest, &d);
        }
        d
    }

    async fn decide_quietly(&self, dest: &Destination, local: bool) -> Decision {
        if host::is_malformed(&dest.host) {
            return Decision::baseline(Verdict::Deny, REASON_NOT_ALLOWED);
        }
        if self.rules.limited
            && dest.protocol == Protocol::Http
            && !matches!(dest.method.as_deref(), Some("GET" | "HEAD" | "OPTIONS"))
        {
            return Decision::baseline(Verdict::Deny, REASON_METHOD);
        }
        if local
            && (!self.rules.allow_local_binding
                || self.rules.reserved_local_ports.contains(&dest.port))
        {
            return Decision::baseline(Verdict::Deny, REASON_LOCAL);
        }
        let h = normal(&dest.host);
        if self.rules.deny.iter().any(|p| p.matches(&h)) {
            return Decision::baseline(Verdict::Deny, REASON_DENIED);
        }
        let review = self.rules.review.iter().any(|p| p.matches(&h));
        if !review && self.rules.allow.iter().any(|p| p.matches(&h)) {
            return Decision::baseline(Verdict::Allow, REASON_ALLOW);
        }
        if local && !review {
            let mut d = Decision::baseline(Verdict::Allow, REASON_ALLOW);
            d.audited = false;
            return d;
        }
        if !self.rules.ask {
            return Decision::baseline(Verdict::Deny, REASON_NOT_ALLOWED);
        }
        let cell = {
            let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
            asked.entry(h).or_default().clone()
        };
        let answer = cell
            .get_or_try_init(|| self.decider.ask(dest))
            .await
            .cloned();
        match answer {
            Ok(a) => Decision {
                verdict: a.verdict,
                source: Source::Decider,
                reason: match (a.verdict, a.reason) {
                    (Verdict::Allow, _) => REASON_ALLOW.into(),
                    (_, Some(r)) if !r.is_empty() => r,
                    _ => REASON_NOT_ALLOWED.into(),
                },
                policy_override: a.verdict == Verdict::Allow,
                audited: true,
            },
            Err(why) => {
                tracing::debug!(host = %dest.host, ?why, "network policy ask failed: denied");
                Decision {
                    verdict: Verdict::Deny,
                    source: Source::Decider,
                    reason: REASON_NOT_ALLOWED.into(),
                    policy_override: false,
                    audited: true,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Fake {
        answer: Result<Answer, AskFailure>,
        asks: AtomicUsize,
        audits: Mutex<Vec<Decision>>,
    }

    impl Decider for Fake {
        fn ask(&self, _: &Destination) -> BoxFuture<Result<Answer, AskFailure>> {
            self.asks.fetch_add(1, Ordering::SeqCst);
            let a = self.answer.clone();
            Box::pin(async move { a })
        }
        fn audit(&self, _: &Destination, d: &Decision) {
            self.audits.lock().unwrap().push(d.clone());
        }
    }

    fn fake(answer: Result<Answer, AskFailure>) -> Arc<Fake> {
        Arc::new(Fake {
            answer,
            asks: AtomicUsize::new(0),
            audits: Mutex::new(vec![]),
        })
    }

    fn dest(host: &str) -> Destination {
        Destination {
            protocol: Protocol::Http,
            host: host.into(),
            port: 80,
            method: Some("GET".into()),
            client: None,
        }
    }

    fn allow() -> Result<Answer, AskFailure> {
        Ok(Answer {
            verdict: Verdict::Allow,
            reason: None,
        })
    }

    #[tokio::test]
    async fn local_refused_before_anything_else_unless_allowed() {
        let f = fake(allow());
        let mut rules = Rules {
            ask: true,
            allow: vec![Pattern::new("*")],
            ..Rules::default()
        };
        let p = Policy::new(rules.clone(), f.clone());
        let d = p.decide(&dest("127.0.0.1"), true).await;
        assert_eq!(
            (d.verdict, d.reason.as_str()),
            (Verdict::Deny, REASON_LOCAL)
        );
        assert_eq!(d.source, Source::Baseline);
        assert_eq!(f.asks.load(Ordering::SeqCst), 0);
        assert_eq!(f.audits.lock().unwrap().len(), 1);
        rules.allow.clear();
        rules.allow_local_binding = true;
        let p = Policy::new(rules, f.clone());
        let d = p.decide(&dest("localhost"), true).await;
        assert!(d.allowed() && !d.audited);
        assert_eq!(f.asks.load(Ordering::SeqCst), 0, "local pass asks nobody");
        assert_eq!(f.audits.lock().unwrap().len(), 1, "and audits nothing");
    }

    #[tokio::test]
    async fn the_servers_own_ports_stay_closed_with_local_binding() {
        let mut rules = Rules {
            allow_local_binding: true,
            reserved_local_ports: vec![8765],
            ..Rules::default()
        };
        let p = Policy::new(rules.clone(), fake(allow()));
        let mut to = dest("127.0.0.1");
        to.port = 8765;
        let d = p.decide(&to, true).await;
        assert_eq!(
            (d.verdict, d.reason.as_str()),
            (Verdict::Deny, REASON_LOCAL)
        );
        to.port = 8766;
        assert!(p.decide(&to, true).await.allowed(), "another local port");
        rules.reserved_local_ports.clear();
        let p = Policy::new(rules, fake(allow()));
        to.port = 8765;
        assert!(p.decide(&to, true).await.allowed(), "not reserved");
    }

    #[tokio::test]
    async fn domain_rules_deny_wins_and_review_asks() {
        let f = fake(Ok(Answer {
            verdict: Verdict::Deny,
            reason: Some("nope".into()),
        }));
        let rules = Rules {
            ask: true,
            allow: vec![Pattern::new("**.Example.com"), Pattern::new("*.review.org")],
            deny: vec![Pattern::new("bad.example.com")],
            review: vec![Pattern::new("x.review.org")],
            ..Rules::default()
        };
        let p = Policy::new(rules, f.clone());
        let ok = p.decide(&dest("example.com."), false).await;
        assert_eq!((ok.verdict, ok.source), (Verdict::Allow, Source::Baseline));
        assert!(p.decide(&dest("a.b.example.com"), false).await.allowed());
        let bad = p.decide(&dest("BAD.example.com"), false).await;
        assert_eq!(
            (bad.verdict, bad.reason.as_str()),
            (Verdict::Deny, REASON_DENIED)
        );
        assert_eq!(f.asks.load(Ordering::SeqCst), 0);
        let r = p.decide(&dest("x.review.org"), false).await;
        assert_eq!(
            (r.verdict, r.source, r.reason.as_str()),
            (Verdict::Deny, Source::Decider, "nope")
        );
        assert_eq!(f.asks.load(Ordering::SeqCst), 1);
        assert!(p.decide(&dest("y.review.org"), false).await.allowed());
    }

    #[tokio::test]
    async fn asks_once_per_host_and_failures_are_not_remembered() {
        let f = fake(allow());
        let p = Policy::new(
            Rules {
                ask: true,
                ..Rules::default()
            },
            f.clone(),
        );
        for _ in 0..3 {
            let d = p.decide(&dest("8.8.8.8"), false).await;
            assert!(d.allowed() && d.policy_override);
            assert_eq!(d.source, Source::Decider);
        }
        assert_eq!(f.asks.load(Ordering::SeqCst), 1);
        let failing = fake(Err(AskFailure::TimedOut));
        let p = Policy::new(
            Rules {
                ask: true,
                ..Rules::default()
            },
            failing.clone(),
        );
        for _ in 0..2 {
            let d = p.decide(&dest("8.8.8.8"), false).await;
            assert_eq!(
                (d.verdict, d.reason.as_str()),
                (Verdict::Deny, REASON_NOT_ALLOWED)
            );
        }
        assert_eq!(failing.asks.load(Ordering::SeqCst), 2);
        let ask = fake(Ok(Answer {
            verdict: Verdict::Ask,
            reason: None,
        }));
        let p = Policy::new(
            Rules {
                ask: true,
                ..Rules::default()
            },
            ask,
        );
        let d = p.decide(&dest("8.8.4.4"), false).await;
        assert_eq!(
            (d.verdict, d.reason.as_str()),
            (Verdict::Ask, REASON_NOT_ALLOWED)
        );
    }

    #[tokio::test]
    async fn without_ask_unknown_hosts_are_refused_and_limited_mode_guards_methods() {
        let f = fake(allow());
        let p = Policy::new(
            Rules {
                limited: true,
                allow: vec![Pattern::new("*")],
                ..Rules::default()
            },
            f.clone(),
        );
        let mut post = dest("a.com");
        post.method = Some("POST".into());
        assert_eq!(p.decide(&post, false).await.reason, REASON_METHOD);
        assert!(p.decide(&dest("a.com"), false).await.allowed());
        let p = Policy::new(Rules::default(), f.clone());
        let d = p.decide(&dest("a.com"), false).await;
        assert_eq!(
            (d.verdict, d.reason.as_str()),
            (Verdict::Deny, REASON_NOT_ALLOWED)
        );
        assert_eq!(
            p.decide(&dest("a b"), false).await.reason,
            REASON_NOT_ALLOWED
        );
        assert_eq!(f.asks.load(Ordering::SeqCst), 0);
    }
}
