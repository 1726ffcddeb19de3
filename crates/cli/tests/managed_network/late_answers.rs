//! Answers to `network/policyRequest` that come after the call stopped
//! waiting (issue 30): dropped, the connection and its session kept, where
//! the reference closes the connection. An id the server never gave out
//! still closes it (SPEC.md §1.5).

use super::*;

#[tokio::test]
async fn an_answer_after_the_timeout_is_dropped_and_the_connection_kept() {
    private_internet();
    let s = Server::start(&[]);
    let mut c = Conn::open(&s.url, None).await;
    let d = tmpdir("late");
    let (port, task, served) = upstream("8.8.8.8").await;
    let url = format!("http://8.8.8.8:{port}/");
    // Unanswered: denied after 1 ms + the 5 s transport margin.
    let np = json!({"proxy": proxy(json!({})), "policyDecisionTimeoutMs": 1});
    let o = run_proxied(&mut c, "late", &d, &curl(&url), np, None, Reply::Silence).await;
    assert_eq!(blocked(&o)["reason"], "not_allowed", "{o:?}");
    assert_eq!(o.requests.len(), 1, "{o:?}");
    let id = o.requests[0]["id"].clone();
    // The client's answers arrive now: an allow, then an error for the same id.
    let allow = json!({"id": id, "result": {"decision": {"type": "allow"}}});
    c.send_raw(allow.to_string()).await;
    let error = json!({"id": id, "error": {"code": -32000, "message": "too late"}});
    c.send_raw(error.to_string()).await;
    // Messages of one connection are handled in order: this answer proves
    // both were read and the connection kept.
    let r = read(&mut c, "late", 0, 0).await;
    assert_eq!(r["closed"], true, "the same session: {r}");
    assert_eq!(
        served.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "never forwarded"
    );
    // The proxy asks again on the same connection, and is answered in time.
    let np = json!({"proxy": proxy(json!({})), "policyDecisionTimeoutMs": 30_000});
    let allow = Reply::Result(json!({"decision": {"type": "allow"}}));
    let o = run_proxied(&mut c, "again", &d, &curl(&url), np, None, allow).await;
    assert_eq!(
        o.http(),
        ("hello from 8.8.8.8".into(), "200".into()),
        "{o:?}"
    );
    assert!(o.requests[0]["id"] != id, "a new id: {o:?}");
    // An id never given out is still connection-fatal, as in the reference.
    c.send_raw(json!({"id": 10_000, "result": {}}).to_string())
        .await;
    assert!(
        c.closed_within(Duration::from_secs(10)).await,
        "unsolicited id closes"
    );
    task.abort();
}
