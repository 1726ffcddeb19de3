//! Credential masking (`credentialMasking`, CAPABILITIES.md §3–4): the
//! child's environment gets placeholders instead of provider secrets, and the
//! proxy puts the real secret back only into the headers of requests going to
//! that provider's destinations. Nothing else is rewritten: not request bodies
//! or URLs, not responses, not requests to any other host (a placeholder sent
//! elsewhere leaves unchanged: it is worthless there, and refusing the request
//! would break commands that merely carry it).
//!
//! Providers: the built-in ones (as the reference's broker: `GH_TOKEN` and
//! `GITHUB_TOKEN` for github.com, api.github.com and `*.ghe.com`;
//! `GH_ENTERPRISE_TOKEN` and `GITHUB_ENTERPRISE_TOKEN` for the host in
//! `GH_HOST`; `OPENAI_API_KEY` for api.openai.com, all over https only) and
//! the request's custom ones ([`CustomProvider`]).

pub mod dest;
mod generate;
mod placeholder;
pub mod scope_path;

pub use dest::{Dest, Scheme};

use base64::Engine as _;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, HOST, USER_AGENT};
use std::collections::BTreeMap;
use std::fmt;

/// Set to `1` in a masked child's environment (the reference's name).
pub const ACTIVE_ENV: &str = "CODEX_NETWORK_PROXY_CREDENTIAL_BROKER_ACTIVE";
/// The masked variables and their placeholders, a JSON array of
/// `[name, placeholder]` pairs (the reference's name).
pub const BROKERED_ENV: &str = "CODEX_NETWORK_PROXY_BROKERED_CREDENTIALS";

/// Longest pattern of a custom provider: 2048 bytes.
pub const MAX_PATTERN_BYTES: usize = 2048;

/// How a custom provider's clients send the secret (`auth` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// `Authorization: Bearer <secret>`.
    Bearer,
    /// `Authorization: token <secret>`.
    Token,
    /// `Authorization: Basic base64(…<secret>…)`.
    Basic,
    /// `<header>: <prefix><secret>`.
    Header,
}

/// A custom provider (`credentialProviders.<name>`).
#[derive(Debug, Clone, Default)]
pub struct CustomProvider {
    /// The provider's name (the map key).
    pub name: String,
    /// Environment variables that may hold the secret.
    pub env: Vec<String>,
    /// Regular expressions a value must match in full to be masked.
    pub patterns: Vec<String>,
    /// Destinations ([`Dest::parse`]).
    pub url_prefixes: Vec<String>,
    /// A variable of the child's environment holding one more destination.
    pub url_prefix_from_env: Option<String>,
    /// How clients send it.
    pub auth: Vec<AuthMethod>,
    /// The header of [`AuthMethod::Header`].
    pub header: Option<String>,
    /// Text before the secret in that header.
    pub prefix: Option<String>,
}

/// Environment variables of the built-in providers (and `GH_HOST`, which
/// binds the enterprise token): a custom provider may not claim them.
const BUILTIN_ENV: [&str; 6] = [
    "GH_TOKEN",
    "GITHUB_TOKEN",
    "GH_ENTERPRISE_TOKEN",
    "GITHUB_ENTERPRISE_TOKEN",
    "OPENAI_API_KEY",
    "GH_HOST",
];

/// One masked variable. Serialised only into an upgrade's state document
/// (a memfd of this process), never to disk.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Masked {
    /// The variable's name.
    pub env_var: String,
    /// The provider (`github`, `github-enterprise`, `openai`, or a custom name).
    pub provider: String,
    /// What the child sees.
    pub placeholder: String,
    real: String,
    dests: Vec<Dest>,
}

impl fmt::Debug for Masked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Masked")
            .field("env_var", &self.env_var)
            .field("provider", &self.provider)
            .field("placeholder", &self.placeholder)
            .field("dests", &self.dests)
            .finish_non_exhaustive()
    }
}

/// The masking of one process: placeholder → secret, per destination.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Masking {
    records: Vec<Masked>,
}

/// A custom provider that cannot be used, and why (it masks nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The provider's name.
    pub provider: String,
    /// Why.
    pub reason: String,
}

fn valid_env_key(k: &str) -> bool {
    !k.is_empty() && !k.contains(['=', '\0'])
}

fn usable(real: &str) -> bool {
    !real.is_empty() && HeaderValue::from_str(&format!("Bearer {real}")).is_ok()
}

fn github_cloud(host: &str) -> bool {
    matches!(host, "github.com" | "api.github.com") || host.ends_with(".ghe.com")
}

/// A custom provider checked and compiled.
struct Compiled<'a> {
    p: &'a CustomProvider,
    patterns: Vec<regex::Regex>,
    dests: Vec<Dest>,
}

impl CustomProvider {
    /// The reference's rules for a complete provider; Err: why it cannot be used.
    fn compile(&self) -> Result<Compiled<'_>, String> {
        let need = |ok: bool, why: &str| if ok { Ok(()) } else { Err(why.to_string()) };
        need(!self.name.is_empty(), "empty provider name")?;
        need(!self.env.is_empty(), "no environment keys")?;
        need(!self.patterns.is_empty(), "no credential patterns")?;
        need(
            !self.url_prefixes.is_empty() || self.url_prefix_from_env.is_some(),
            "no destination URL prefixes",
        )?;
        need(
            self.env.iter().all(|k| valid_env_key(k)),
            "invalid environment key",
        )?;
        need(
            !self.env.iter().any(|k| BUILTIN_ENV.contains(&k.as_str())),
            "overlaps a built-in credential source",
        )?;
        if let Some(k) = &self.url_prefix_from_env {
            need(
                valid_env_key(k) && !self.env.contains(k),
                "invalid host environment key",
            )?;
        }
        let dests = self
            .url_prefixes
            .iter()
            .map(|d| Dest::parse(d).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let header = match &self.header {
            Some(h) => Some(HeaderName::from_bytes(h.as_bytes()).map_err(|_| "invalid header")?),
            None => None,
        };
        need(
            self.auth.contains(&AuthMethod::Header) == header.is_some(),
            "a header name is required exactly when using header authentication",
        )?;
        need(
            self.prefix.is_none() || header.is_some(),
            "a header prefix requires header authentication",
        )?;
        need(
            header
                .as_ref()
                .is_none_or(|h| *h != USER_AGENT && *h != HOST),
            "proxy secrets cannot be injected into User-Agent or Host",
        )?;
        let patterns = self
            .patterns
            .iter()
            .map(|p| {
                need(p.len() <= MAX_PATTERN_BYTES, "credential pattern too long")?;
                let re = regex::RegexBuilder::new(&format!("^(?:{p})$"))
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| format!("invalid credential pattern: {e}"))?;
                need(
                    !re.is_match(""),
                    "credential pattern matches an empty value",
                )?;
                Ok(re)
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Compiled {
            p: self,
            patterns,
            dests,
        })
    }
}

impl Masking {
    /// Masks `env` (the child's whole environment) in place: each provider
    /// variable holding a usable secret gets a placeholder, and
    /// [`ACTIVE_ENV`] and [`BROKERED_ENV`] are set. Returns the masking and
    /// the custom providers that could not be used.
    pub fn mask_env(
        custom: &[CustomProvider],
        env: &mut BTreeMap<String, String>,
    ) -> (Masking, Vec<Skipped>) {
        let mut m = Masking::default();
        let gh_cloud = vec![
            Dest::https_host("github.com"),
            Dest::https_host("api.github.com"),
            Dest::https_subdomains("ghe.com"),
        ];
        for k in ["GH_TOKEN", "GITHUB_TOKEN"] {
            m.mask(env, k, "github", gh_cloud.clone(), placeholder::github);
        }
        let gh_host = env
            .get("GH_HOST")
            .map(|h| crate::host::normalize(h))
            .filter(|h| !h.is_empty() && !github_cloud(h));
        if let Some(h) = gh_host {
            for k in ["GH_ENTERPRISE_TOKEN", "GITHUB_ENTERPRISE_TOKEN"] {
                let d = vec![Dest::https_host(&h)];
                m.mask(env, k, "github-enterprise", d, placeholder::github);
            }
        }
        let openai = vec![Dest::https_host("api.openai.com")];
        m.mask(env, "OPENAI_API_KEY", "openai", openai, placeholder::openai);
        let mut skipped = Vec::new();
        for p in custom {
            match p.compile() {
                Ok(c) => m.mask_custom(env, &c),
                Err(reason) => skipped.push(Skipped {
                    provider: p.name.clone(),
                    reason,
                }),
            }
        }
        env.insert(ACTIVE_ENV.into(), "1".into());
        let pairs: Vec<(&str, &str)> = m
            .records
            .iter()
            .map(|r| (r.env_var.as_str(), r.placeholder.as_str()))
            .collect();
        env.insert(
            BROKERED_ENV.into(),
            serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".into()),
        );
        (m, skipped)
    }

    fn mask(
        &mut self,
        env: &mut BTreeMap<String, String>,
        key: &str,
        provider: &str,
        dests: Vec<Dest>,
        make: impl Fn(&str) -> Option<String>,
    ) {
        let Some(real) = env.get(key).map(|v| v.trim().to_string()) else {
            return;
        };
        if !usable(&real) || self.records.iter().any(|r| r.placeholder == real) {
            return;
        }
        let Some(placeholder) = make(&real).filter(|p| *p != real && usable(p)) else {
            return;
        };
        env.insert(key.to_string(), placeholder.clone());
        self.records.push(Masked {
            env_var: key.to_string(),
            provider: provider.to_string(),
            placeholder,
            real,
            dests,
        });
    }

    fn mask_custom(&mut self, env: &mut BTreeMap<String, String>, c: &Compiled<'_>) {
        let mut dests = c.dests.clone();
        let dynamic =
            c.p.url_prefix_from_env
                .as_ref()
                .and_then(|k| env.get(k))
                .and_then(|v| Dest::parse(v).ok())
                .filter(|d| !d.is_wildcard());
        if let Some(d) = dynamic {
            if !dests.contains(&d) {
                dests.push(d);
            }
        }
        if dests.is_empty() {
            return;
        }
        let full = |v: &str| c.patterns.iter().any(|re| re.is_match(v));
        for key in &c.p.env {
            let matches = env.get(key).is_some_and(|v| full(v.trim()));
            if matches {
                self.mask(env, key, &c.p.name, dests.clone(), |real| {
                    placeholder::matching(real, &c.p.patterns, |v| full(v) && usable(v))
                });
            }
        }
    }

    /// After something added variables to an already masked `env` (a shell
    /// snapshot's exports; `before`: the names present when it was masked):
    /// an added provider variable (built-in, or one of `custom`'s) holding a
    /// masked secret gets that secret's placeholder; holding anything else it
    /// is removed, since it can no longer be masked. Returns the names removed.
    pub fn scrub_added(
        &self,
        before: &std::collections::BTreeSet<String>,
        custom: &[CustomProvider],
        env: &mut BTreeMap<String, String>,
    ) -> Vec<String> {
        let keys = BUILTIN_ENV[..5]
            .iter()
            .map(|k| k.to_string())
            .chain(custom.iter().flat_map(|p| p.env.iter().cloned()));
        let mut removed = Vec::new();
        for k in keys {
            if before.contains(&k) {
                continue;
            }
            let Some(v) = env.get(&k).map(|v| v.trim().to_string()) else {
                continue;
            };
            let known = self
                .records
                .iter()
                .filter(|r| r.real == v)
                .min_by_key(|r| r.env_var != k);
            match known {
                Some(r) => {
                    env.insert(k, r.placeholder.clone());
                }
                None => {
                    env.remove(&k);
                    removed.push(k);
                }
            }
        }
        removed
    }

    /// The masked variables.
    pub fn records(&self) -> &[Masked] {
        &self.records
    }

    /// True when nothing was masked.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// True when a `CONNECT host:port` must be intercepted (TLS terminated
    /// by the proxy) because some secret may go to that https origin.
    pub fn intercepts(&self, host: &str, port: u16) -> bool {
        self.records.iter().any(|r| {
            r.dests
                .iter()
                .any(|d| d.matches_origin(Scheme::Https, host, port))
        })
    }

    /// Puts the real secrets back into the headers of a request to
    /// `scheme://host:port/path`: every placeholder of a provider whose
    /// destinations include it is replaced, in any header but `Host` and
    /// `User-Agent` (in `Authorization: Basic` inside the base64 too).
    /// Returns how many header values changed.
    pub fn substitute(
        &self,
        scheme: Scheme,
        host: &str,
        port: u16,
        path: &str,
        headers: &mut HeaderMap,
    ) -> usize {
        let here: Vec<&Masked> = self
            .records
            .iter()
            .filter(|r| r.dests.iter().any(|d| d.matches(scheme, host, port, path)))
            .collect();
        if here.is_empty() {
            return 0;
        }
        let replace = |text: &str| -> Option<String> {
            let mut out = None::<String>;
            for r in &here {
                let cur = out.as_deref().unwrap_or(text);
                if cur.contains(&r.placeholder) {
                    out = Some(cur.replace(&r.placeholder, &r.real));
                }
            }
            out
        };
        let mut changed = 0;
        for (name, value) in headers.iter_mut() {
            if name == HOST || name == USER_AGENT {
                continue;
            }
            let Ok(text) = value.to_str() else {
                continue;
            };
            let mut new = replace(text);
            if name == AUTHORIZATION && new.is_none() {
                new = replace_in_basic(text, &replace);
            }
            if let Some(v) = new.and_then(|n| HeaderValue::from_str(&n).ok()) {
                let mut v = v;
                v.set_sensitive(true);
                *value = v;
                changed += 1;
            }
        }
        changed
    }
}

/// `Basic <base64>` with the substitution applied to the decoded pair.
fn replace_in_basic(text: &str, replace: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let (scheme, b64) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let b = base64::engine::general_purpose::STANDARD;
    let pair = String::from_utf8(b.decode(b64.trim()).ok()?).ok()?;
    Some(format!("{scheme} {}", b.encode(replace(&pair)?)))
}

#[cfg(test)]
mod tests;
