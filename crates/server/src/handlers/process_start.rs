//! `process/start`: the wire params become one [`LaunchPlan`] (limits,
//! sandbox, environment built once, network proxy and masking, shell
//! snapshot), which the process module carries out.

use super::session_of;
use crate::connection::Ctx;
use crate::error::ExecError;
use crate::process::plan::{self, Exec, LaunchPlan};
use crate::process::{spawn, Process};
use crate::session::Session;
use exec_server_protocol::types::*;
use exec_server_protocol::ErrorObject;
use exec_server_rpc::router::Reply;
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::oneshot;

pub(super) async fn start(ctx: Ctx, p: ExecParams) -> Result<Reply, ErrorObject> {
    let r = start_process(ctx, p).await;
    crate::metrics::process_start(r.is_ok());
    r
}

async fn start_process(ctx: Ctx, mut p: ExecParams) -> Result<Reply, ErrorObject> {
    if p.argv.is_empty() {
        return Err(ErrorObject::invalid_params("argv must not be empty"));
    }
    match p.output_window_bytes {
        Some(_) if !p.ack_output => {
            return Err(ErrorObject::invalid_params(
                "outputWindowBytes needs ackOutput: without acknowledgements the window is fixed",
            ));
        }
        Some(0) => {
            return Err(ErrorObject::invalid_params(
                "outputWindowBytes must be positive",
            ));
        }
        _ => {}
    }
    p.limits = effective_limits(&ctx, &p)?;
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
    let session = session_of(&ctx)?;
    let plan = plan_launch(&ctx, &session, &p).await?;
    let sandbox_type = crate::sandbox::sandbox_type(plan.confinement.as_ref());
    // The pump sends nothing before this fires, so the response comes first.
    let (gate_tx, gate_rx) = oneshot::channel();
    let weak = Arc::downgrade(&session);
    let settings = crate::process::SpawnSettings {
        spool: ctx.server.spool.clone(),
        spool_share: session.spool_share.clone(),
        limit_grace: ctx.server.config.limit_grace,
        live: Some(live),
        host: ctx.server.host.clone(),
    };
    let link = session.link.clone();
    let proc = session.insert_process_with(&p.process_id, || {
        let on_retire = Box::new(move |proc: &Arc<Process>| {
            if let Some(s) = weak.upgrade() {
                s.retire(proc);
            }
        });
        Process::spawn(plan, link, gate_rx, on_retire, settings)
    })?;
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

/// The request's limits over the server's defaults, under its maxima;
/// -32602 naming what cannot hold here.
fn effective_limits(ctx: &Ctx, p: &ExecParams) -> Result<Option<ProcessLimits>, ErrorObject> {
    let config = &ctx.server.config;
    let limits = crate::process::limits::effective(
        p.limits.as_ref(),
        &config.default_limits,
        &config.max_limits,
    )
    .map_err(ErrorObject::invalid_params)?;
    if let Some(limits) = &limits {
        crate::process::limits::validate(limits, ctx.server.host.cgroups.places())
            .map_err(ErrorObject::invalid_params)?;
    }
    Ok(limits)
}

/// Decides everything the start runs with: the sandbox, the environment
/// (built once, then masked, joined by the proxy's variables and rewritten
/// by a shell snapshot), the proxy that is kept until the process closes.
async fn plan_launch(
    ctx: &Ctx,
    session: &Arc<Session>,
    p: &ExecParams,
) -> Result<LaunchPlan, ErrorObject> {
    let server = &ctx.server;
    let cwd = crate::fs::native(&p.cwd)?;
    let mut confinement = crate::sandbox::for_start(
        p.sandbox.as_ref(),
        p.enforce_managed_network,
        p.network_proxy.is_some(),
        &cwd,
        &server.sandbox,
    )?;
    let mut env = spawn::build_env(
        &p.env,
        p.env_policy.as_ref(),
        spawn::server_env(&server.host.tool_dirs),
    );
    // Masked before the child exists: the secrets it would inherit are
    // replaced by placeholders.
    let masking = crate::network::masking::mask_env(p, &mut env);
    let mut kept: Vec<crate::process::KeptUntilClosed> = Vec::new();
    let mut volatile = BTreeSet::new();
    if let Some(np) = &p.network_proxy {
        let routed = match confinement.as_ref().is_some_and(|c| c.routed()) {
            true => Some(server.runtime_dir().map_err(|e| {
                ErrorObject::internal(format!("cannot start the network proxy: {e}"))
            })?),
            false => None,
        };
        let mask = masking.clone().map(|m| (m, &env));
        let running = crate::network::start(
            np,
            &p.process_id,
            session.link.clone(),
            routed,
            &server.config,
            mask,
        )
        .await?;
        if let (Some(c), Some(route)) = (confinement.as_mut(), running.route.clone()) {
            c.set_route(route);
        }
        let vars = running.child_env();
        volatile.extend(vars.iter().map(|(k, _)| k.clone()));
        let masked = masking.is_some();
        plan::add_proxy_vars(&mut env, vars, &p.env, p.env_policy.as_ref(), masked);
        kept.push(Box::new(running));
    }
    let masked_names: Option<BTreeSet<String>> =
        masking.as_ref().map(|_| env.keys().cloned().collect());
    if p.shell_snapshot.is_some() && session.process(&p.process_id).is_some() {
        // Before a capture that may take seconds, for nothing.
        return Err(
            ExecError::already_exists(format!("process {} already exists", p.process_id)).into(),
        );
    }
    let named = plan::named_by_request(p, &env, &volatile, masking.is_some());
    let mut exec = Exec::of(p, cwd, env);
    let snapshot = session
        .shell_snapshots
        .apply(
            p,
            &mut exec,
            &named,
            confinement.as_ref(),
            &volatile,
            &server.host,
        )
        .await
        .map_err(|e| ErrorObject::invalid_params(e.to_string()))?;
    tracing::debug!(?snapshot, "shell snapshot");
    // A snapshot may export secrets the startup files set: masked too.
    if let (Some(m), Some(before)) = (&masking, &masked_names) {
        crate::network::masking::scrub_added(m, before, p, &mut exec.env);
    }
    Ok(LaunchPlan {
        process_id: p.process_id.clone(),
        exec,
        confinement,
        limits: p.limits.clone(),
        ack_output: p.ack_output,
        output_window_bytes: p.output_window_bytes,
        kept,
        shown: crate::process::list::StartedWith::of(p),
    })
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
