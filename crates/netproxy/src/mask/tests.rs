use super::*;

const GH: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
const OAI: &str = "sk-proj-REALREALREALREALREALREALREALREALREALREALREAL1";

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn auth(v: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
    h.insert(USER_AGENT, HeaderValue::from_str(v).unwrap());
    h
}

#[test]
fn builtins_are_masked_and_restored_only_for_their_hosts() {
    let mut e = env(&[
        ("GH_TOKEN", GH),
        ("OPENAI_API_KEY", OAI),
        ("GH_ENTERPRISE_TOKEN", GH),
        ("PATH", "/bin"),
    ]);
    let (m, skipped) = Masking::mask_env(&[], &mut e);
    assert!(skipped.is_empty());
    assert_eq!(m.records().len(), 2, "no GH_HOST: enterprise not masked");
    let gh = e["GH_TOKEN"].clone();
    let oai = e["OPENAI_API_KEY"].clone();
    assert!(gh.starts_with("ghp_") && gh != GH && gh.len() == GH.len());
    assert!(oai.starts_with("sk-proj-") && oai != OAI);
    assert_eq!(e["GH_ENTERPRISE_TOKEN"], GH);
    assert_eq!(e[ACTIVE_ENV], "1");
    let pairs: Vec<(String, String)> = serde_json::from_str(&e[BROKERED_ENV]).unwrap();
    assert_eq!(pairs.len(), 2);
    assert!(!e[BROKERED_ENV].contains(GH) && !e[BROKERED_ENV].contains(OAI));
    assert!(m.intercepts("api.github.com", 443));
    assert!(m.intercepts("acme.ghe.com", 443));
    assert!(!m.intercepts("api.github.com", 8443));
    assert!(!m.intercepts("example.com", 443));

    let mut h = auth(&format!("Bearer {gh}"));
    assert_eq!(
        m.substitute(Scheme::Https, "api.github.com", 443, "/user", &mut h),
        1
    );
    assert_eq!(h[AUTHORIZATION], format!("Bearer {GH}").as_str());
    assert_eq!(h[USER_AGENT], format!("Bearer {gh}").as_str(), "never UA");
    // The GitHub placeholder sent to OpenAI, or over plain http: unchanged.
    for (scheme, host) in [
        (Scheme::Https, "api.openai.com"),
        (Scheme::Http, "api.github.com"),
        (Scheme::Https, "evil.example"),
    ] {
        let mut h = auth(&format!("Bearer {gh}"));
        let port = if scheme == Scheme::Http { 80 } else { 443 };
        assert_eq!(m.substitute(scheme, host, port, "/", &mut h), 0, "{host}");
        assert_eq!(h[AUTHORIZATION], format!("Bearer {gh}").as_str());
    }
    let mut h = auth(&format!("Bearer {oai}"));
    m.substitute(Scheme::Https, "API.OPENAI.COM.", 443, "/v1/models", &mut h);
    assert_eq!(h[AUTHORIZATION], format!("Bearer {OAI}").as_str());
}

#[test]
fn enterprise_token_follows_gh_host() {
    let mut e = env(&[
        ("GITHUB_ENTERPRISE_TOKEN", GH),
        ("GH_HOST", "GHE.Corp.example"),
    ]);
    let (m, _) = Masking::mask_env(&[], &mut e);
    assert_eq!(m.records().len(), 1);
    assert!(m.intercepts("ghe.corp.example", 443));
    assert!(!m.intercepts("github.com", 443));
    let mut e = env(&[("GH_ENTERPRISE_TOKEN", GH), ("GH_HOST", "github.com")]);
    assert!(Masking::mask_env(&[], &mut e).0.is_empty());
}

#[test]
fn unusable_values_are_left_alone() {
    let mut e = env(&[("GH_TOKEN", "   "), ("OPENAI_API_KEY", "a\u{1}b")]);
    let before = e.clone();
    let (m, _) = Masking::mask_env(&[], &mut e);
    assert!(m.is_empty());
    assert_eq!(e["GH_TOKEN"], before["GH_TOKEN"]);
    assert_eq!(e["OPENAI_API_KEY"], before["OPENAI_API_KEY"]);
    assert_eq!(e[BROKERED_ENV], "[]");
}

fn vendor() -> CustomProvider {
    CustomProvider {
        name: "vendor".into(),
        env: vec!["VENDOR_TOKEN".into(), "VENDOR_KEY".into()],
        patterns: vec!["vendor_[a-z]{24}".into()],
        url_prefixes: vec!["https://api.vendor.example/v1".into()],
        url_prefix_from_env: Some("VENDOR_URL".into()),
        auth: vec![AuthMethod::Header, AuthMethod::Basic],
        header: Some("X-Api-Key".into()),
        prefix: None,
    }
}

#[test]
fn custom_provider_masks_matching_values_for_its_prefixes() {
    let real = format!("vendor_{}", "k".repeat(24));
    let mut e = env(&[
        ("VENDOR_TOKEN", &real),
        ("VENDOR_KEY", "not-a-vendor-token"),
        ("VENDOR_URL", "https://eu.vendor.example:8443"),
    ]);
    let (m, skipped) = Masking::mask_env(&[vendor()], &mut e);
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(m.records().len(), 1);
    let ph = e["VENDOR_TOKEN"].clone();
    assert!(ph.starts_with("vendor_") && ph.len() == real.len() && ph != real);
    assert_ne!(&ph[7..], &real[7..]);
    assert_eq!(e["VENDOR_KEY"], "not-a-vendor-token", "no pattern match");
    assert!(m.intercepts("eu.vendor.example", 8443), "from VENDOR_URL");
    let mut h = HeaderMap::new();
    h.insert("x-api-key", HeaderValue::from_str(&ph).unwrap());
    assert_eq!(
        m.substitute(Scheme::Https, "api.vendor.example", 443, "/v2", &mut h),
        0,
        "outside the path prefix"
    );
    for escape in ["/v1/../admin", "/v1/%2e%2e/admin", "/v1/..%2Fadmin"] {
        assert_eq!(
            m.substitute(Scheme::Https, "api.vendor.example", 443, escape, &mut h),
            0,
            "{escape} leaves the path prefix"
        );
    }
    assert_eq!(
        m.substitute(Scheme::Https, "api.vendor.example", 443, "/v1/x", &mut h),
        1
    );
    assert_eq!(h["x-api-key"], real.as_str());
    // Basic: the placeholder inside the base64 pair.
    let b = base64::engine::general_purpose::STANDARD;
    let mut h = auth(&format!("Basic {}", b.encode(format!("user:{ph}"))));
    m.substitute(Scheme::Https, "eu.vendor.example", 8443, "/", &mut h);
    let got = h[AUTHORIZATION].to_str().unwrap().to_string();
    assert_eq!(
        b.decode(got.strip_prefix("Basic ").unwrap()).unwrap(),
        format!("user:{real}").into_bytes()
    );
}

#[test]
fn invalid_custom_providers_are_skipped_with_a_reason() {
    let cases: Vec<(CustomProvider, &str)> = vec![
        (CustomProvider::default(), "empty provider name"),
        (
            CustomProvider {
                env: vec![],
                ..vendor()
            },
            "no environment keys",
        ),
        (
            CustomProvider {
                env: vec!["GH_TOKEN".into()],
                ..vendor()
            },
            "built-in",
        ),
        (
            CustomProvider {
                header: None,
                ..vendor()
            },
            "exactly when",
        ),
        (
            CustomProvider {
                header: Some("User-Agent".into()),
                ..vendor()
            },
            "User-Agent",
        ),
        (
            CustomProvider {
                patterns: vec!["a*".into()],
                ..vendor()
            },
            "empty value",
        ),
        (
            CustomProvider {
                patterns: vec!["(".into()],
                ..vendor()
            },
            "invalid credential pattern",
        ),
        (
            CustomProvider {
                url_prefixes: vec!["ftp://x".into()],
                ..vendor()
            },
            "invalid destination",
        ),
        (
            CustomProvider {
                url_prefix_from_env: Some("VENDOR_TOKEN".into()),
                ..vendor()
            },
            "host environment key",
        ),
    ];
    for (p, why) in cases {
        let mut e = env(&[("VENDOR_TOKEN", &format!("vendor_{}", "k".repeat(24)))]);
        let (m, skipped) = Masking::mask_env(std::slice::from_ref(&p), &mut e);
        assert!(m.is_empty(), "{why}");
        assert_eq!(skipped.len(), 1, "{why}");
        assert!(skipped[0].reason.contains(why), "{why}: {skipped:?}");
    }
}

#[test]
fn variables_added_after_masking_are_masked_or_dropped() {
    let mut e = env(&[("OPENAI_API_KEY", OAI), ("PATH", "/bin")]);
    let (m, _) = Masking::mask_env(&[vendor()], &mut e);
    let before: std::collections::BTreeSet<String> = e.keys().cloned().collect();
    let ph = e["OPENAI_API_KEY"].clone();
    // A shell snapshot exported these.
    e.insert("GH_TOKEN".into(), GH.into());
    e.insert("GITHUB_TOKEN".into(), format!(" {OAI}"));
    e.insert("VENDOR_TOKEN".into(), "anything".into());
    e.insert("OTHER".into(), GH.into());
    let removed = m.scrub_added(&before, &[vendor()], &mut e);
    assert_eq!(
        removed,
        vec!["GH_TOKEN".to_string(), "VENDOR_TOKEN".to_string()]
    );
    assert_eq!(e["GITHUB_TOKEN"], ph, "a known secret gets its placeholder");
    assert_eq!(e["OPENAI_API_KEY"], ph);
    assert_eq!(e["OTHER"], GH, "no provider names it");
}
