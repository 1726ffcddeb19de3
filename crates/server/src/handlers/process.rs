//! `process/*`: start, read, write, closeStdin, signal, terminate, resize, ack.
//! All but the long-poll `process/read` run in arrival order.

use super::session_of;
use crate::connection::Ctx;
use crate::process::Process;
use exec_server_protocol::types::*;
use exec_server_protocol::{methods as m, ErrorObject};
use exec_server_rpc::router::{Mode, Router};
use std::sync::Arc;
use std::time::Duration;

pub(super) fn register(r: &mut Router<Ctx>) {
    r.request_reply(m::PROCESS_START, Mode::Inline, super::process_start::start);
    r.request(
        m::PROCESS_READ,
        Mode::Detached,
        |ctx: Ctx, p: ReadParams| async move {
            let proc = known(&ctx, &p.process_id)?;
            let wait = p.wait_ms.filter(|w| *w > 0).map(Duration::from_millis);
            Ok(proc.read(p.after_seq.unwrap_or(0), p.max_bytes, wait).await)
        },
    );
    r.request_with_payload(
        m::PROCESS_WRITE,
        Mode::Inline,
        |ctx: Ctx, p: WriteParams| async move {
            let status = match find(&ctx, &p.process_id)? {
                Some(proc) => proc.write(p.chunk.into_vec(), p.write_id).await?,
                None => WriteStatus::UnknownProcess,
            };
            Ok(WriteResponse { status })
        },
    );
    r.request(
        m::PROCESS_CLOSE_STDIN,
        Mode::Inline,
        |ctx: Ctx, p: ProcessIdParams| async move {
            let status = match find(&ctx, &p.process_id)? {
                Some(proc) => proc.close_stdin(),
                None => WriteStatus::UnknownProcess,
            };
            Ok(WriteResponse { status })
        },
    );
    r.request(
        m::PROCESS_SIGNAL,
        Mode::Inline,
        |ctx: Ctx, p: SignalParams| async move {
            if let Some(proc) = find(&ctx, &p.process_id)? {
                proc.signal(p.signal);
            }
            Ok(Empty {})
        },
    );
    r.request(
        m::PROCESS_TERMINATE,
        Mode::Inline,
        |ctx: Ctx, p: ProcessIdParams| async move {
            let Some(proc) = find(&ctx, &p.process_id)? else {
                return Ok(TerminateResponse {
                    running: false,
                    killed_leftovers: None,
                });
            };
            // Leftovers are counted before the kill: afterwards nothing is left.
            let leftovers = !proc.is_running() && proc.has_leftovers();
            let running = proc.terminate();
            // Only when true: the reference's reply is exactly `{running}`.
            Ok(TerminateResponse {
                running,
                killed_leftovers: (leftovers && !running).then_some(true),
            })
        },
    );
    r.request(
        m::PROCESS_RESIZE,
        Mode::Inline,
        |ctx: Ctx, p: ResizeParams| async move {
            known(&ctx, &p.process_id)?.resize(p.cols, p.rows)?;
            Ok(Empty {})
        },
    );
    r.request(
        m::PROCESS_LIST,
        Mode::Inline,
        |ctx: Ctx, p: Option<ProcessListParams>| async move {
            let p = p.unwrap_or_default();
            let own = session_of(&ctx)?;
            if !p.all_sessions {
                let processes = own.processes().iter().map(|p| p.info()).collect();
                return Ok(ProcessListResponse { processes });
            }
            operator(&ctx, p.operator_token.as_deref())?;
            let mut processes = Vec::new();
            for session in ctx.server.sessions.all() {
                for proc in session.processes() {
                    let mut info = proc.info();
                    info.session_id = Some(session.id.clone());
                    processes.push(info);
                }
            }
            processes.sort_by_key(|i| i.started_at_ms);
            Ok(ProcessListResponse { processes })
        },
    );
    r.request(
        m::PROCESS_OPERATOR_SIGNAL,
        Mode::Inline,
        |ctx: Ctx, p: OperatorSignalParams| async move {
            session_of(&ctx)?;
            operator(&ctx, Some(&p.operator_token))?;
            let proc = ctx
                .server
                .sessions
                .get(&p.session_id)
                .and_then(|s| s.process(&p.process_id))
                .ok_or_else(|| {
                    ErrorObject::invalid_request(format!(
                        "unknown process id {} in session {}",
                        p.process_id, p.session_id
                    ))
                })?;
            let running = proc.is_running();
            match p.signal {
                Some(signal) => proc.signal(signal),
                None => {
                    proc.terminate();
                }
            }
            Ok(TerminateResponse {
                running,
                killed_leftovers: None,
            })
        },
    );
    r.request(
        m::PROCESS_ACK,
        Mode::Inline,
        |ctx: Ctx, p: AckParams| async move {
            known(&ctx, &p.process_id)?.ack(p.seq);
            Ok(Empty {})
        },
    );
}

/// Checks the operator credential of a request that reaches beyond its own
/// session: -32600 (never echoing what was sent) when the server has none
/// or `token` is not it.
fn operator(ctx: &Ctx, token: Option<&str>) -> Result<(), ErrorObject> {
    let allowed = match (&ctx.server.config.operator_token, token) {
        (Some(want), Some(got)) => crate::auth::constant_time_eq(want.as_bytes(), got.as_bytes()),
        _ => false,
    };
    if allowed {
        Ok(())
    } else {
        Err(ErrorObject::invalid_request(
            "this needs the server's operator credential \
             (operatorToken, set with --operator-token-file)",
        ))
    }
}

/// The process with this id in the connection's session, if any.
fn find(ctx: &Ctx, id: &str) -> Result<Option<Arc<Process>>, ErrorObject> {
    Ok(session_of(ctx)?.process(id))
}

/// The process with this id; -32600 `unknown process id <id>` if there is none.
fn known(ctx: &Ctx, id: &str) -> Result<Arc<Process>, ErrorObject> {
    find(ctx, id)?.ok_or_else(|| ErrorObject::invalid_request(format!("unknown process id {id}")))
}
