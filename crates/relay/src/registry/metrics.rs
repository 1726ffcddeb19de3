//! One registry node's metrics, in the Prometheus text format at
//! `GET /metrics` on the registry's own port (no credential: they name no
//! environment, token or key). Every name starts with `exec_server_registry_`:
//!
//! - `executors_attached` (gauge): executor relay sockets on this node;
//! - `streams_open` (gauge): harness streams on this node;
//! - `relayed_bytes_to_executor_total`, `relayed_bytes_to_harness_total`
//!   (counters): frame bytes routed (never opened);
//! - `spliced_bytes_to_harness_total` (counter): of those to harnesses, the
//!   bytes moved without a copy through the node (`splice(2)`: our harness,
//!   a plain TCP node), and `spliced_fallback_bytes_total`, the bytes of
//!   such frames read instead because their harness's pipe was full;
//! - `relay_buffered_bytes` (gauge): bytes held for harnesses that have not
//!   read them yet, against the node's budget (`--relay-buffer-bytes`);
//! - `stalled_stream_resets_total` (counter): streams reset because their
//!   harness stopped reading (see [`super::hub::STREAM_BUFFER_BYTES`]) or
//!   held the most when their environment's or the node's budget ran out;
//! - `cross_node_connects_total` (counter): `/connect` answers naming another
//!   node's relay (the node that holds the executor);
//! - `store_seconds` (histogram): latency of each store call (the database,
//!   for a fleet).

use super::store::{Attachment, Authorization, Registration, Store, StoreError};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counters the hub and the registry bump as they work; cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct Counters {
    /// Frame bytes from harnesses to executors.
    pub to_executor: Counter,
    /// Frame bytes from executors to harnesses.
    pub to_harness: Counter,
    /// Of those, bytes spliced (never copied through the node).
    pub spliced: Counter,
    /// Bytes of frames being spliced that were read instead (pipe full).
    pub splice_fallback: Counter,
    /// Streams reset for a harness that stopped reading.
    pub stalled_resets: Counter,
    /// `/connect` answers naming another node's relay.
    pub cross_node: Counter,
    /// Connections answered 503 at the node's connection limit.
    pub connections_refused: Counter,
}

/// The node's metric registry.
pub(crate) struct NodeMetrics {
    prom: prometheus_client::registry::Registry,
    executors: Gauge,
    streams: Gauge,
    buffered: Gauge,
}

impl NodeMetrics {
    /// Registers `counters` and the store's latency histogram.
    pub fn new(counters: &Counters, store_seconds: &Histogram) -> NodeMetrics {
        let mut prom = prometheus_client::registry::Registry::with_prefix("exec_server_registry");
        let executors = Gauge::default();
        let streams = Gauge::default();
        let buffered = Gauge::default();
        prom.register(
            "executors_attached",
            "Executor relay sockets attached to this node",
            executors.clone(),
        );
        prom.register(
            "streams_open",
            "Harness streams open on this node",
            streams.clone(),
        );
        prom.register(
            "relay_buffered_bytes",
            "Bytes held for harnesses that have not read them yet",
            buffered.clone(),
        );
        prom.register(
            "relayed_bytes_to_executor",
            "Frame bytes routed from harnesses to executors",
            counters.to_executor.clone(),
        );
        prom.register(
            "spliced_bytes_to_harness",
            "Frame bytes moved from executors to harnesses without a copy",
            counters.spliced.clone(),
        );
        prom.register(
            "spliced_fallback_bytes",
            "Bytes of spliced frames read instead because the harness's pipe was full",
            counters.splice_fallback.clone(),
        );
        prom.register(
            "relayed_bytes_to_harness",
            "Frame bytes routed from executors to harnesses",
            counters.to_harness.clone(),
        );
        prom.register(
            "stalled_stream_resets",
            "Streams reset because their harness stopped reading or their budget ran out",
            counters.stalled_resets.clone(),
        );
        prom.register(
            "cross_node_connects",
            "Connect answers naming another node's relay",
            counters.cross_node.clone(),
        );
        prom.register(
            "connections_refused",
            "Connections answered 503 at the node's connection limit",
            counters.connections_refused.clone(),
        );
        prom.register(
            "store_seconds",
            "Latency of each store call",
            store_seconds.clone(),
        );
        NodeMetrics {
            prom,
            executors,
            streams,
            buffered,
        }
    }

    /// The text exposition, with the gauges read now (`buffered` in bytes).
    pub fn render(&self, executors: usize, streams: usize, buffered: usize) -> String {
        self.executors.set(executors as i64);
        self.streams.set(streams as i64);
        self.buffered
            .set(i64::try_from(buffered).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.prom);
        out
    }
}

/// A histogram of store latencies, 0.5 ms to about 4 s.
pub(crate) fn store_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0005, 2.0, 14,
    ))
}

/// A [`Store`] that times every call of the one it wraps.
pub(crate) struct TimedStore {
    pub inner: Arc<dyn Store>,
    pub seconds: Histogram,
}

impl TimedStore {
    async fn timed<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        let start = Instant::now();
        let out = call.await;
        self.seconds
            .observe(start.elapsed().min(Duration::from_secs(3600)).as_secs_f64());
        out
    }
}

#[async_trait::async_trait]
impl Store for TimedStore {
    async fn put_registration(&self, r: Registration) -> Result<(), StoreError> {
        self.timed(self.inner.put_registration(r)).await
    }
    async fn registration(&self, environment_id: &str) -> Result<Option<Registration>, StoreError> {
        self.timed(self.inner.registration(environment_id)).await
    }
    async fn put_authorization(&self, token: &str, a: Authorization) -> Result<(), StoreError> {
        self.timed(self.inner.put_authorization(token, a)).await
    }
    async fn take_authorization(
        &self,
        token: &str,
        now_unix: u64,
    ) -> Result<Option<Authorization>, StoreError> {
        self.timed(self.inner.take_authorization(token, now_unix))
            .await
    }
    async fn signing_key(&self) -> Result<[u8; 32], StoreError> {
        self.timed(self.inner.signing_key()).await
    }
    async fn node_heartbeat(&self, node_id: &str, ws_base: &str) -> Result<(), StoreError> {
        self.timed(self.inner.node_heartbeat(node_id, ws_base))
            .await
    }
    async fn node_gone(&self, node_id: &str) -> Result<(), StoreError> {
        self.timed(self.inner.node_gone(node_id)).await
    }
    async fn attach(&self, a: &Attachment) -> Result<(), StoreError> {
        self.timed(self.inner.attach(a)).await
    }
    async fn detach(&self, environment_id: &str, attach_id: &str) -> Result<(), StoreError> {
        self.timed(self.inner.detach(environment_id, attach_id))
            .await
    }
    async fn attachment(
        &self,
        environment_id: &str,
        fresh: Duration,
    ) -> Result<Option<Attachment>, StoreError> {
        self.timed(self.inner.attachment(environment_id, fresh))
            .await
    }
}
