//! The notifications a process sends: `process/output` (hot: encoded by hand,
//! benchmarked in `benches/output_chunk.rs`), `process/exited` and
//! `process/closed` (cold: built from the protocol types).

use exec_server_protocol::methods;
use exec_server_protocol::types::{
    OutputStream, ProcessClosedNotification, ProcessExitedNotification,
};

/// Encodes a `process/output` notification straight into one string (hot path:
/// no intermediate JSON value, base64 written in place).
pub fn encode_output_notification(
    process_id: &str,
    seq: u64,
    stream: OutputStream,
    data: &[u8],
) -> String {
    use exec_server_protocol::bytes;
    let mut s = String::with_capacity(96 + process_id.len() + bytes::encoded_len(data.len()));
    s.push_str("{\"method\":\"process/output\",\"params\":{\"processId\":");
    s.push_str(&serde_json::to_string(process_id).unwrap_or_else(|_| "\"\"".into()));
    s.push_str(",\"seq\":");
    s.push_str(&seq.to_string());
    s.push_str(",\"stream\":\"");
    s.push_str(stream.as_str());
    s.push_str("\",\"chunk\":\"");
    bytes::encode_into(data, &mut s);
    s.push_str("\"}}");
    s
}

/// The head of a `process/output` binary frame (`docs/binary-frames.md`):
/// the notification without `chunk`.
pub fn output_frame_head(process_id: &str, seq: u64, stream: OutputStream) -> String {
    let mut head = String::with_capacity(96 + process_id.len());
    head.push_str("{\"method\":\"process/output\",\"params\":{\"processId\":");
    head.push_str(&serde_json::to_string(process_id).unwrap_or_else(|_| "\"\"".into()));
    head.push_str(",\"seq\":");
    head.push_str(&seq.to_string());
    head.push_str(",\"stream\":\"");
    head.push_str(stream.as_str());
    head.push_str("\"}}");
    head
}

/// Room a read buffer leaves in front of the bytes so that a `process/output`
/// frame for `process_id` (any seq and stream) is written in place.
pub fn output_frame_headroom(process_id: &str) -> usize {
    // The head of the longest seq (20 digits) and stream name.
    let head = output_frame_head(process_id, u64::MAX, OutputStream::Stdout);
    exec_server_protocol::binary::HEADER_BYTES + head.len()
}

pub(super) fn exited_json(
    id: &str,
    seq: u64,
    code: i32,
    sandbox_denied: bool,
    limit: Option<exec_server_protocol::types::LimitReason>,
    signal: Option<nix::sys::signal::Signal>,
) -> String {
    exec_server_protocol::encode_notification(
        methods::PROCESS_EXITED,
        &ProcessExitedNotification {
            process_id: id.to_string(),
            seq,
            exit_code: code,
            sandbox_denied,
            limit,
            signal: signal.map(|s| s.as_str().to_string()),
        },
    )
}

pub(super) fn closed_json(id: &str, seq: u64) -> String {
    exec_server_protocol::encode_notification(
        methods::PROCESS_CLOSED,
        &ProcessClosedNotification {
            process_id: id.to_string(),
            seq,
        },
    )
}
