//! Prometheus metrics: what the server is doing, for an operator's scraper.
//!
//! One process-wide set of metrics ([`metrics`]), recorded through the small
//! functions below and exposed in the text format by [`serve`] on the
//! `--metrics-listen` address (off by default). Names follow Prometheus
//! conventions: `exec_server_` prefix, counters end in `_total`, units are base
//! units in the name (`_seconds`, `_bytes`).
//!
//! Cost: every hot-path metric (output bytes, file bytes, process counts) is a
//! pre-resolved atomic; labelled families are only looked up per request or per
//! process, never per output chunk. Gauges that describe state the server already
//! keeps (sessions, spool use) are read from that state at scrape time instead of
//! being maintained on every change.
//!
//! Process-wide rather than per [`crate::ServerState`]: a program that embeds
//! several servers reports their sum, which is what one scrape target means.

mod serve;

pub use serve::{serve, MetricsListener};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::LazyLock;
use std::time::Instant;

type Labels = [(&'static str, &'static str); 1];
type CodeLabels = [(&'static str, i64); 1];

/// Buckets of `exec_server_request_duration_seconds`: 0.5 ms to ~33 s by ×4
/// (long-polls of `process/read` land in the top buckets).
fn duration_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0005, 4.0, 9)
}

/// Every metric of the server.
pub struct Metrics {
    registry: Registry,
    connections_open: Gauge,
    connections: Counter,
    sessions: Family<Labels, Gauge>,
    processes_running: Gauge,
    process_starts: Family<Labels, Counter>,
    process_exits: Family<Labels, Counter>,
    limits_fired: Family<Labels, Counter>,
    request_duration: Family<Labels, Histogram, fn() -> Histogram>,
    errors: Family<CodeLabels, Counter>,
    output_bytes: Counter,
    file_read_bytes: Counter,
    file_written_bytes: Counter,
    spool_bytes: Gauge,
    http_requests: Family<Labels, Counter>,
    relay_streams_open: Gauge,
    relay_streams: Counter,
    relay_handshake_failures: Counter,
    relay_registrations: Counter,
}

/// The process-wide metrics (created, and registered, on first use).
pub fn metrics() -> &'static Metrics {
    static M: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &M
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("exec_server");
        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "JSON-RPC connections open now",
            connections_open.clone(),
        );
        let connections = Counter::default();
        registry.register(
            "connections",
            "JSON-RPC connections accepted since start",
            connections.clone(),
        );
        let sessions = Family::<Labels, Gauge>::default();
        registry.register(
            "sessions",
            "Sessions by state: attached to a connection, or detached awaiting resume",
            sessions.clone(),
        );
        let processes_running = Gauge::default();
        registry.register(
            "processes_running",
            "Started processes not yet exited",
            processes_running.clone(),
        );
        let process_starts = Family::<Labels, Counter>::default();
        registry.register(
            "process_starts",
            "process/start attempts by outcome (started, failed)",
            process_starts.clone(),
        );
        let process_exits = Family::<Labels, Counter>::default();
        registry.register(
            "process_exits",
            "Process exits by class: zero, nonzero, signal (exit code above 128, as a shell reports a signal)",
            process_exits.clone(),
        );
        let limits_fired = Family::<Labels, Counter>::default();
        registry.register(
            "process_limits_fired",
            "Processes ended by a limit, by reason (wallTimeout, idleTimeout, outputLimit)",
            limits_fired.clone(),
        );
        let request_duration: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(duration_buckets()));
        registry.register_with_unit(
            "request_duration",
            "Time from a request's arrival to its response being queued, by method",
            Unit::Seconds,
            request_duration.clone(),
        );
        let errors = Family::<CodeLabels, Counter>::default();
        registry.register(
            "request_errors",
            "Error responses by JSON-RPC code",
            errors.clone(),
        );
        let output_bytes = Counter::default();
        registry.register_with_unit(
            "process_output",
            "Bytes of process output read from children (stdout, stderr, PTY)",
            Unit::Bytes,
            output_bytes.clone(),
        );
        let file_bytes = Family::<Labels, Counter>::default();
        registry.register_with_unit(
            "file",
            "Bytes of file content read and written by fs/* requests, by op",
            Unit::Bytes,
            file_bytes.clone(),
        );
        let spool_bytes = Gauge::default();
        registry.register_with_unit(
            "output_spool",
            "Bytes of delivered process output held in the disk spool",
            Unit::Bytes,
            spool_bytes.clone(),
        );
        let http_requests = Family::<Labels, Counter>::default();
        registry.register(
            "http_requests",
            "http/request calls by outcome (ok, error)",
            http_requests.clone(),
        );
        let relay_streams_open = Gauge::default();
        registry.register(
            "relay_streams_open",
            "Remote mode: relay streams open now (each is also a connection)",
            relay_streams_open.clone(),
        );
        let relay_streams = Counter::default();
        registry.register(
            "relay_streams",
            "Remote mode: relay streams opened (Noise handshake and validation passed)",
            relay_streams.clone(),
        );
        let relay_handshake_failures = Counter::default();
        registry.register(
            "relay_handshake_failures",
            "Remote mode: relay stream handshakes or validations that failed",
            relay_handshake_failures.clone(),
        );
        let relay_registrations = Counter::default();
        registry.register(
            "relay_registrations",
            "Remote mode: successful registrations with the environment registry",
            relay_registrations.clone(),
        );
        Metrics {
            relay_streams_open,
            relay_streams,
            relay_handshake_failures,
            relay_registrations,
            connections_open,
            connections,
            sessions,
            processes_running,
            process_starts,
            process_exits,
            limits_fired,
            request_duration,
            errors,
            output_bytes,
            file_read_bytes: file_bytes.get_or_create_owned(&[("op", "read")]),
            file_written_bytes: file_bytes.get_or_create_owned(&[("op", "write")]),
            spool_bytes,
            http_requests,
            registry,
        }
    }

    /// The text exposition (OpenMetrics text, which Prometheus scrapes), after
    /// setting the scrape-time gauges from `state`.
    pub fn render(&self, state: &crate::ServerState) -> String {
        let (attached, detached) = state.sessions.counts();
        self.sessions
            .get_or_create(&[("state", "attached")])
            .set(attached as i64);
        self.sessions
            .get_or_create(&[("state", "detached")])
            .set(detached as i64);
        let spool = state.spool.as_ref().map_or(0, |s| s.used_bytes());
        self.spool_bytes
            .set(i64::try_from(spool).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Counts one open connection until the guard drops.
pub struct ConnectionGuard(());

/// A connection was accepted; the gauge drops when the guard does.
pub fn connection_opened() -> ConnectionGuard {
    let m = metrics();
    m.connections.inc();
    m.connections_open.inc();
    ConnectionGuard(())
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        metrics().connections_open.dec();
    }
}

/// A request finished: `method` is its wire name when the router knows it (an
/// unknown method is counted as `other`, so peers cannot grow the label set),
/// `error_code` the JSON-RPC code of an error answer.
pub fn request_done(method: Option<&'static str>, started: Instant, error_code: Option<i64>) {
    let m = metrics();
    m.request_duration
        .get_or_create(&[("method", method.unwrap_or("other"))])
        .observe(started.elapsed().as_secs_f64());
    if let Some(code) = error_code {
        request_error(code);
    }
}

/// An error answer with `code` (also for messages that never became a request).
pub fn request_error(code: i64) {
    metrics().errors.get_or_create(&[("code", code)]).inc();
}

/// A `process/start` request succeeded (`true`) or failed (refused, or the
/// spawn failed).
pub fn process_start(started: bool) {
    let outcome = if started { "started" } else { "failed" };
    metrics()
        .process_starts
        .get_or_create(&[("outcome", outcome)])
        .inc();
}

/// A child was spawned; [`process_exit`] balances it.
pub fn process_spawned() {
    metrics().processes_running.inc();
}

/// A limit ended a process (`exec_server_process_limits_fired_total{reason}`).
pub fn limit_fired(reason: exec_server_protocol::types::LimitReason) {
    metrics()
        .limits_fired
        .get_or_create(&[("reason", reason.as_str())])
        .inc();
}

/// A spawned process exited with `code` (its status, or 128+N for signal N).
pub fn process_exit(code: i32) {
    let m = metrics();
    m.processes_running.dec();
    let class = match code {
        0 => "zero",
        129.. => "signal",
        _ => "nonzero",
    };
    m.process_exits.get_or_create(&[("class", class)]).inc();
}

/// `n` bytes of output were read from a child.
pub fn output_bytes(n: usize) {
    metrics().output_bytes.inc_by(n as u64);
}

/// `n` bytes of file content were read by an `fs/*` request.
pub fn file_read(n: usize) {
    metrics().file_read_bytes.inc_by(n as u64);
}

/// `n` bytes of file content were written by an `fs/*` request.
pub fn file_written(n: usize) {
    metrics().file_written_bytes.inc_by(n as u64);
}

/// An `http/request` finished, successfully or not.
pub fn http_request(ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    metrics()
        .http_requests
        .get_or_create(&[("outcome", outcome)])
        .inc();
}

/// Remote mode: a relay stream was opened.
pub fn relay_stream_opened() {
    let m = metrics();
    m.relay_streams.inc();
    m.relay_streams_open.inc();
}

/// Remote mode: a relay stream opened earlier ended.
pub fn relay_stream_closed() {
    metrics().relay_streams_open.dec();
}

/// Remote mode: a relay stream's handshake or validation failed.
pub fn relay_handshake_failed() {
    metrics().relay_handshake_failures.inc();
}

/// Remote mode: registered with the registry.
pub fn relay_registered() {
    metrics().relay_registrations.inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_classes_follow_the_shell_convention() {
        fn before(class: &'static str) -> u64 {
            metrics()
                .process_exits
                .get_or_create(&[("class", class)])
                .get()
        }
        let (z, n, s) = (before("zero"), before("nonzero"), before("signal"));
        process_exit(0);
        process_exit(1);
        process_exit(128);
        process_exit(137);
        assert_eq!(before("zero"), z + 1);
        assert_eq!(before("nonzero"), n + 2);
        assert_eq!(before("signal"), s + 1);
    }
}
