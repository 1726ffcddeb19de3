//! The registry's JSON bodies (`/cloud/environment/{id}/register`, `/connect`,
//! `/validate`), shared by our registry, executor and harness. Field names are
//! the wire names; extra fields are ignored on read (as the reference does).

use crate::keys::WirePublicKey;
use serde::{Deserialize, Serialize};

/// `POST …/register` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// Always `noise_hybrid_ik_v1`.
    pub security_profile: String,
    /// The executor's static key.
    pub executor_public_key: WirePublicKey,
}

/// `POST …/register` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// Must equal the requested id.
    pub environment_id: String,
    /// Relay WebSocket URL for the executor (opaque; signed and expiring).
    pub url: String,
    /// Always `noise_hybrid_ik_v1`.
    pub security_profile: String,
    /// Goes into every stream's prologue.
    pub executor_registration_id: String,
}

/// `POST …/connect` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnectRequest {
    /// The harness's static key (the one its handshake will prove).
    pub harness_public_key: WirePublicKey,
}

/// `POST …/connect` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnectResponse {
    /// Must equal the requested id.
    pub environment_id: String,
    /// Relay WebSocket URL for this harness connection (one stream).
    pub url: String,
    /// Always `noise_hybrid_ik_v1`.
    pub security_profile: String,
    /// Goes into the prologue.
    pub executor_registration_id: String,
    /// The executor's key, pinned by the handshake.
    pub executor_public_key: WirePublicKey,
    /// Opaque, short-lived; sent encrypted in msg1, checked by `/validate`.
    pub harness_key_authorization: String,
}

/// `POST …/validate` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ValidateRequest {
    /// The executor's current registration.
    pub executor_registration_id: String,
    /// The key the harness proved in msg1.
    pub harness_public_key: WirePublicKey,
    /// The msg1 payload.
    pub harness_key_authorization: String,
}

/// `POST …/validate` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ValidateResponse {
    /// Whether this harness key may use this registration now.
    pub valid: bool,
}

/// Error body: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Inside [`ErrorBody`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Machine-readable code, e.g. `registration_conflict`.
    pub code: String,
    /// Human-readable text.
    pub message: String,
}

/// Header naming the stream a `/validate` is for (sent by the reference executor).
pub const STREAM_ID_HEADER: &str = "x-codex-noise-stream-id";
/// Header carrying why the relay refused an upgrade.
pub const REJECTION_HEADER: &str = "x-codex-rendezvous-rejection-reason";

/// A harness's relay upgrade request header (value `1`) saying it takes
/// masked frames from the node (RFC 6455 has servers send unmasked ones),
/// and the node's 101 answer header saying it may send them: frames passed
/// on exactly as the executor masked them, which a node forwards without
/// copying them (`socket/splice.rs`). Ours only; a harness that does not
/// ask gets unmasked frames as before.
pub const MASKED_FRAMES_HEADER: &str = "x-exec-server-masked-frames";
