//! Trace context for the exec-server: the bridge between the JSON-RPC `trace`
//! member ([`TraceContext`], W3C Trace Context) and `tracing` spans carried by
//! OpenTelemetry (`tracing-opentelemetry`).
//!
//! * [`adopt_parent`]: the server makes a request's span a child of the
//!   caller's span named in the request's `trace`.
//! * [`current_trace`]: the client names the current span in the `trace` of
//!   each request it sends (install it with
//!   `exec_server_rpc::peer::set_trace_source(exec_server_telemetry::current_trace)`).
//! * [`otlp`] (feature `otlp`): the OTLP/HTTP (protobuf) span exporter that
//!   the binary installs when `OTEL_EXPORTER_OTLP_ENDPOINT` (or a flag) is set.
//!
//! Without an OpenTelemetry layer in the subscriber both functions do nothing
//! (a failed downcast per call), so tracing costs nothing when it is off.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use exec_server_protocol::TraceContext;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use std::str::FromStr;
use tracing_opentelemetry::OpenTelemetrySpanExt;

#[cfg(feature = "otlp")]
pub mod otlp;

/// Makes `span` a child of the remote span that `trace` names. Call it before
/// the span is first entered (a started span keeps its parent). Does nothing
/// when no OpenTelemetry layer is installed or the ids do not parse.
pub fn adopt_parent(span: &tracing::Span, trace: &TraceContext) {
    let (Ok(trace_id), Ok(span_id)) = (
        TraceId::from_hex(trace.trace_id()),
        SpanId::from_hex(trace.parent_id()),
    ) else {
        return;
    };
    let state = trace
        .tracestate
        .as_deref()
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    let remote = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(trace.flags()),
        true,
        state,
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(remote);
    // Refused when the layer is absent or the span is filtered out: then there
    // is no trace to join, which is fine.
    let _ = span.set_parent(cx);
}

/// The trace context of the current `tracing` span, for the `trace` member
/// of a request about to be sent; `None` when no OpenTelemetry layer records
/// the span (tracing off).
pub fn current_trace() -> Option<TraceContext> {
    trace_of(&tracing::Span::current())
}

/// The trace context naming `span` as the parent, or `None` (see
/// [`current_trace`]).
pub fn trace_of(span: &tracing::Span) -> Option<TraceContext> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    let otel_span = cx.span();
    let sc = otel_span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let parent = format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    );
    let state = sc.trace_state().header();
    TraceContext::new(&parent, Some(state.as_str()).filter(|s| !s.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_opentelemetry_layer_nothing_is_propagated() {
        let span = tracing::info_span!("request");
        let t = TraceContext::new(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            None,
        )
        .expect("valid");
        adopt_parent(&span, &t);
        assert_eq!(trace_of(&span), None);
        assert_eq!(current_trace(), None);
    }
}
