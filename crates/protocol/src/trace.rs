//! The optional `trace` member of a request: a W3C Trace Context
//! (<https://www.w3.org/TR/trace-context/>), so a tool call in the agent and the
//! process it starts on the executor land in one trace.
//!
//! Wire shape: `"trace": {"traceparent": "00-<32 hex>-<16 hex>-<2 hex>",
//! "tracestate": "vendor=value,…"}` beside `id`/`method`/`params`. Both members
//! are optional; `tracestate` means nothing without a valid `traceparent`.
//!
//! A malformed `trace` is ignored, never an error: tracing must not be able to
//! fail a request.

use serde_json::{Map, Value};

/// Longest `tracestate` kept (the W3C limit is 32 list members; 512 bytes is
/// what the specification asks a vendor to propagate at least). Longer values
/// are dropped rather than cut, since a cut list may be malformed.
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// A validated W3C trace context. Wire name: the request member `trace`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `traceparent`: version `00`, a non-zero 128-bit trace id, a non-zero
    /// 64-bit parent span id and 8 bits of flags, all lowercase hex, e.g.
    /// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`.
    pub traceparent: String,
    /// `tracestate`: vendor data, passed on untouched (≤ [`MAX_TRACESTATE_BYTES`]).
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// A context from its two header values; `None` when `traceparent` is not
    /// a valid version-00 value. A `tracestate` that is too long or holds
    /// control characters is dropped (the parent is still used).
    pub fn new(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        if !valid_traceparent(traceparent) {
            return None;
        }
        let tracestate = tracestate
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE_BYTES)
            .filter(|s| s.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .map(str::to_owned);
        Some(TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate,
        })
    }

    /// Reads the `trace` member's value leniently: anything but an object with
    /// a valid string `traceparent` is `None`.
    pub fn from_value(v: &Value) -> Option<TraceContext> {
        let obj = v.as_object()?;
        let parent = obj.get("traceparent")?.as_str()?;
        let state = obj.get("tracestate").and_then(Value::as_str);
        TraceContext::new(parent, state)
    }

    /// The 32 hex digits of the trace id.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The 16 hex digits of the parent span id.
    pub fn parent_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// The 8 trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        u8::from_str_radix(&self.traceparent[53..55], 16).unwrap_or(0)
    }

    /// The member's value, `{"traceparent":…,"tracestate"?:…}`.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert(
            "traceparent".into(),
            Value::String(self.traceparent.clone()),
        );
        if let Some(s) = &self.tracestate {
            m.insert("tracestate".into(), Value::String(s.clone()));
        }
        Value::Object(m)
    }
}

fn valid_traceparent(s: &str) -> bool {
    let b = s.as_bytes();
    // Version 00 is exactly 55 bytes; later versions may append fields, but
    // this server only understands 00 and does not guess.
    if b.len() != 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return false;
    }
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    let zero = |r: std::ops::Range<usize>| b[r].iter().all(|&c| c == b'0');
    b[0..2] == *b"00" && hex(3..35) && hex(36..52) && hex(53..55) && !zero(3..35) && !zero(36..52)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn valid_contexts_keep_ids_and_state() {
        let t = TraceContext::from_value(&json!({"traceparent": GOOD, "tracestate": "a=1,b=2"}))
            .expect("valid");
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert_eq!(t.flags(), 1);
        assert_eq!(t.tracestate.as_deref(), Some("a=1,b=2"));
        assert_eq!(TraceContext::from_value(&t.to_value()), Some(t));
    }

    #[test]
    fn malformed_contexts_are_ignored() {
        let bad = [
            json!(null),
            json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            json!({}),
            json!({"traceparent": 5}),
            json!({"traceparent": "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}),
            json!({"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}),
            json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"}),
            json!({"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}),
            json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-"}),
            json!({"traceparent": "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}),
            json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b-01"}),
        ];
        for v in bad {
            assert_eq!(TraceContext::from_value(&v), None, "{v}");
        }
        let long = "x=".to_owned() + &"y".repeat(MAX_TRACESTATE_BYTES);
        let t = TraceContext::from_value(&json!({"traceparent": GOOD, "tracestate": long}))
            .expect("parent still valid");
        assert_eq!(t.tracestate, None);
        let ctl = TraceContext::new(GOOD, Some("a=\n1")).expect("parent valid");
        assert_eq!(ctl.tracestate, None);
    }
}
