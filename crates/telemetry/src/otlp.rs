//! The OTLP/HTTP span exporter (protobuf over HTTP POST to `…/v1/traces`).
//!
//! Spans are batched on the SDK's own thread and sent with a blocking HTTP
//! client, so exporting never runs on the server's runtime; the batch
//! settings follow the standard `OTEL_BSP_*` variables (e.g.
//! `OTEL_BSP_SCHEDULE_DELAY`, milliseconds, default 5000).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use opentelemetry_sdk::Resource;
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::registry::LookupSpan;

/// Why the exporter could not be built (e.g. a malformed endpoint URL).
pub type BuildError = opentelemetry_otlp::ExporterBuildError;

/// Where to send spans, from a flag value or the standard variables:
/// `flag` and `OTEL_EXPORTER_OTLP_ENDPOINT` are base URLs (`/v1/traces` is
/// appended), `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is used as it is and wins
/// over the base variable. `None` (no export) when none is set, or when
/// `OTEL_SDK_DISABLED=true`.
pub fn traces_endpoint(flag: Option<&str>) -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return None;
    }
    let base = |b: &str| format!("{}/v1/traces", b.trim().trim_end_matches('/'));
    if let Some(f) = flag.filter(|f| !f.trim().is_empty()) {
        return Some(base(f));
    }
    if let Some(t) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Some(t.trim().to_owned());
    }
    var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|b| base(&b))
}

/// Longest a single export may take (connect, send, response), so a
/// collector that hangs delays only the exporter's own thread, boundedly.
const EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The exporter's HTTP client: blocking, because the SDK's batch processor
/// exports from a thread of its own with no async runtime.
#[derive(Debug)]
struct BlockingHttp(reqwest::blocking::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for BlockingHttp {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let response = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body.to_vec())
            .send()?;
        let mut out = http::Response::builder().status(response.status());
        if let Some(h) = out.headers_mut() {
            *h = response.headers().clone();
        }
        // The collector's answer is small (a partial-success message at most).
        let body = response.bytes()?;
        Ok(out.body(body)?)
    }
}

/// Flushes and stops the exporter when dropped: hold it until the program
/// ends, or spans of the last batch are lost.
pub struct OtlpGuard {
    provider: SdkTracerProvider,
}

impl Drop for OtlpGuard {
    fn drop(&mut self) {
        // A collector that is down must not keep the program from exiting;
        // the SDK bounds the flush by its export timeout.
        let _ = self.provider.shutdown();
    }
}

/// A `tracing` layer exporting spans to `endpoint` (a full `…/v1/traces` URL)
/// as service `service_name`, and the guard that flushes it.
///
/// Errors: [`BuildError`] when the HTTP exporter cannot be built.
pub fn layer<S>(
    endpoint: &str,
    service_name: &'static str,
) -> Result<(OpenTelemetryLayer<S, Tracer>, OtlpGuard), BuildError>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let client = reqwest::blocking::Client::builder()
        .timeout(EXPORT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| BuildError::InternalFailure(e.to_string()))?;
    let exporter = SpanExporter::builder()
        .with_http()
        .with_http_client(BlockingHttp(client))
        .with_endpoint(endpoint)
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service_name).build())
        .build();
    let tracer = provider.tracer(service_name);
    Ok((
        tracing_opentelemetry::layer().with_tracer(tracer),
        OtlpGuard { provider },
    ))
}
