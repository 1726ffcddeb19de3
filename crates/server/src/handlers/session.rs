//! The handshake: `initialize` (create or resume a session) and the gate every
//! other method passes.

use crate::connection::{Ctx, Phase};
use exec_server_protocol::types::InitializeParams;
use exec_server_protocol::{methods as m, ErrorObject};
use exec_server_rpc::router::{Mode, Reply, Router};

pub(super) fn register(r: &mut Router<Ctx>) {
    r.request_reply(m::INITIALIZE, Mode::Inline, initialize);
}

async fn initialize(ctx: Ctx, p: InitializeParams) -> Result<Reply, ErrorObject> {
    if !matches!(*ctx.phase(), Phase::Fresh) {
        return Err(ErrorObject::invalid_request(
            "initialize may only be sent once per connection",
        ));
    }
    let server = &ctx.server;
    let session = match &p.resume_session_id {
        Some(id) => server
            .sessions
            .resume(id, ctx.id, ctx.outbound.clone(), ctx.calls.clone())?,
        None => server
            .sessions
            .create(ctx.id, ctx.outbound.clone(), ctx.calls.clone()),
    };
    *ctx.phase() = Phase::Initializing(session.clone());
    // Binary frames only for a client that asked, on a transport that carries
    // them; on from here, so a resumed session's output may use them at once.
    let binary = p
        .extensions
        .as_ref()
        .and_then(|e| e.binary_frames)
        .is_some_and(|v| v >= exec_server_protocol::binary::VERSION)
        && ctx.outbound.enable_binary();
    let binary_member = if binary {
        format!(
            ",\"binaryFrames\":{}",
            exec_server_protocol::binary::VERSION
        )
    } else {
        String::new()
    };
    tracing::info!(conn = ctx.id, session = %session.id, client = %p.client_name, resumed = p.resume_session_id.is_some(), "initialized");
    // Spliced from the environment info encoded once at start: every connection
    // pays for this reply, and re-encoding it showed in the connect benchmark.
    Ok(Reply::json(format!(
        "{{\"sessionId\":\"{}\",\"environmentInfo\":{}{binary_member}}}",
        session.id, server.env_info_json
    )))
}

/// The group name used in handshake errors, as the reference words them.
pub fn method_group(method: &str) -> &'static str {
    if method.starts_with("process/") {
        "exec"
    } else if method.starts_with("fs/") {
        "filesystem"
    } else if method.starts_with("http/") {
        "http"
    } else if method.starts_with("environment") {
        "environment info"
    } else {
        "capability"
    }
}

/// The handshake gate: every method but `initialize` needs `initialize` and then
/// `initialized` (-32600 otherwise). Runs after params decode.
pub(super) fn gate(ctx: &Ctx, method: &str) -> Result<(), ErrorObject> {
    if method == m::INITIALIZE {
        return Ok(());
    }
    let verb = match &*ctx.phase() {
        Phase::Ready(_) => return Ok(()),
        Phase::Fresh => "call initialize",
        Phase::Initializing(_) => "send initialized",
    };
    Err(ErrorObject::invalid_request(format!(
        "client must {verb} before using {} methods",
        method_group(method)
    )))
}
