//! `process/*`: start, read, write, closeStdin, signal, terminate, resize, ack.
//! All but the long-poll `process/read` run in arrival order.

use super::session_of;
use crate::connection::Ctx;
use crate::error::ExecError;
use crate::process::Process;
use exec_server_protocol::types::*;
use exec_server_protocol::{methods as m, ErrorObject};
use exec_server_rpc::router::{Mode, Reply, Router};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

pub(super) fn register(r: &mut Router<Ctx>) {
    r.request_reply(m::PROCESS_START, Mode::Inline, start);
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

/// Takes the new process's place in its session's and the server's running
/// counts, refusing a start past `--max-session-processes` or
/// `--max-processes` (naming the cap). Atomic: racing starts never overshoot.
fn take_live_slot(ctx: &Ctx) -> Result<crate::process::live::LiveSlot, ErrorObject> {
    let config = &ctx.server.config;
    let session = session_of(ctx)?;
    crate::process::live::LiveSlot::take(&[
        (&session.live, config.max_session_processes),
        (&ctx.server.live_processes, config.max_processes),
    ])
    .map_err(|which| {
        let (max, flag, whose) = match which {
            0 => (
                config.max_session_processes,
                "--max-session-processes",
                "this session",
            ),
            _ => (config.max_processes, "--max-processes", "the server"),
        };
        crate::error::ExecError::limit_reached(format!(
            "{whose} already runs {} processes ({flag})",
            max.unwrap_or(0)
        ))
        .into()
    })
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

async fn start(ctx: Ctx, p: ExecParams) -> Result<Reply, ErrorObject> {
    let r = start_process(ctx, p).await;
    crate::metrics::process_start(r.is_ok());
    r
}

async fn start_process(ctx: Ctx, mut p: ExecParams) -> Result<Reply, ErrorObject> {
    if p.argv.is_empty() {
        return Err(ErrorObject::invalid_params("argv must not be empty"));
    }
    let config = &ctx.server.config;
    p.limits = crate::process::limits::effective(
        p.limits.as_ref(),
        &config.default_limits,
        &config.max_limits,
    )
    .map_err(ErrorObject::invalid_params)?;
    if let Some(limits) = &p.limits {
        crate::process::limits::validate(limits, ctx.server.host.cgroups.places())
            .map_err(ErrorObject::invalid_params)?;
    }
    let live = take_live_slot(&ctx)?;
    if let Some(np) = &p.network_proxy {
        np.validate(&p.process_id)
            .map_err(ErrorObject::invalid_params)?;
    }
    if p.enforce_managed_network && p.sandbox.is_none() {
        // Ours: the reference ignores it, leaving the proxy advisory only.
        return Err(ErrorObject::invalid_params(
            crate::network::ENFORCE_NEEDS_SANDBOX,
        ));
    }
    let cwd = crate::fs::native(&p.cwd)?;
    let mut confine = crate::sandbox::for_start(
        p.sandbox.as_ref(),
        p.enforce_managed_network,
        p.network_proxy.is_some(),
        &cwd,
        &ctx.server.sandbox,
    )?;
    let sandbox_type = crate::sandbox::sandbox_type(confine.as_ref());
    let session = session_of(&ctx)?;
    // Masking resolves the child's environment into `p.env` first, so the
    // secrets it would inherit are replaced before it exists.
    let masking = crate::network::masking::mask_start_env(&mut p, &ctx.server.host.tool_dirs);
    let proxy = match &p.network_proxy {
        Some(np) => {
            let routed = match confine.as_ref().is_some_and(|c| c.routed()) {
                true => Some(ctx.server.runtime_dir().map_err(|e| {
                    ErrorObject::internal(format!("cannot start the network proxy: {e}"))
                })?),
                false => None,
            };
            let mask = masking.clone().map(|m| (m, &p.env));
            let running = crate::network::start(
                np,
                &p.process_id,
                session.link.clone(),
                routed,
                &ctx.server.config,
                mask,
            )
            .await?;
            if let (Some(c), Some(route)) = (confine.as_mut(), running.route.clone()) {
                c.set_route(route);
            }
            Some(running)
        }
        None => None,
    };
    let mut volatile = std::collections::BTreeSet::new();
    if let Some(running) = &proxy {
        let vars = running.child_env();
        volatile.extend(vars.iter().map(|(k, _)| k.clone()));
        // A masked start's `env` holds the whole resolved environment and
        // overrides the policy's `set`: the proxy's variables go there too.
        match p.env_policy.as_mut() {
            Some(policy) if masking.is_none() => policy.set.extend(vars),
            Some(policy) => {
                policy.set.extend(vars.clone());
                p.env.extend(vars);
            }
            None => p.env.extend(vars),
        }
    }
    let masked_names: Option<std::collections::BTreeSet<String>> =
        masking.as_ref().map(|_| p.env.keys().cloned().collect());
    if p.shell_snapshot.is_some() && session.process(&p.process_id).is_some() {
        // Before a capture that may take seconds, for nothing.
        return Err(
            ExecError::already_exists(format!("process {} already exists", p.process_id)).into(),
        );
    }
    let snapshot = session
        .shell_snapshots
        .apply(&mut p, &cwd, confine.as_ref(), &volatile, &ctx.server.host)
        .await
        .map_err(|e| ErrorObject::invalid_params(e.to_string()))?;
    // A snapshot may export secrets the startup files set: masked too.
    if let (Some(m), Some(before)) = (&masking, &masked_names) {
        crate::network::masking::scrub_added(m, before, &mut p);
    }
    tracing::debug!(?snapshot, "shell snapshot");
    // The pump sends nothing before this fires, so the response comes first.
    let (gate_tx, gate_rx) = oneshot::channel();
    let weak = Arc::downgrade(&session);
    let link = session.link.clone();
    let share = session.spool_share.clone();
    let proc = session.insert_process_with(&p.process_id, || {
        Process::spawn(
            &p,
            &cwd,
            link,
            gate_rx,
            Box::new(move |proc| {
                if let Some(s) = weak.upgrade() {
                    s.retire(proc);
                }
            }),
            confine.as_ref(),
            crate::process::SpawnSettings {
                spool: ctx.server.spool.clone(),
                spool_share: share,
                limit_grace: ctx.server.config.limit_grace,
                live: Some(live),
                host: ctx.server.host.clone(),
            },
        )
    })?;
    if let Some(proxy) = proxy {
        proc.hold_until_closed(Box::new(proxy));
    }
    let mut reply = Reply::of(&ExecResponse {
        process_id: p.process_id,
        sandbox_type: sandbox_type.into(),
        pid: Some(proc.pid()),
    });
    reply.after_send = Some(Box::new(move || {
        let _ = gate_tx.send(());
    }));
    Ok(reply)
}
