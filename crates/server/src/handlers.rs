//! The method table: one handler per method, each a thin adapter from typed params
//! to the session, process, fs, http or discovery module that does the work.

use crate::connection::{gate, Ctx, Phase};
use crate::process::Process;
use crate::sandbox::fs_helper::{Need, Route};
use crate::session::InsertError;
use crate::{discovery, fs, http};
use exec_server_protocol::types::*;
use exec_server_protocol::{methods as m, ErrorObject};
use exec_server_rpc::router::{Mode, Reply, Router};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ErrorObject> + Send + 'static,
) -> Result<T, ErrorObject> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(ErrorObject::internal(format!(
            "file system task failed: {e}"
        )))
    })
}

fn process(ctx: &Ctx, id: &str) -> Result<Option<Arc<Process>>, ErrorObject> {
    Ok(ctx.session()?.process(id))
}

/// A result holding bytes, built in one allocation: base64 never needs JSON
/// escaping, so the usual serializer's per-byte escape scan and the extra copies
/// are skipped (the hot path of file transfers).
fn raw_bytes_reply(head: &str, data: &[u8], tail: &str) -> Reply {
    use base64::Engine;
    let mut s = String::with_capacity(head.len() + data.len().div_ceil(3) * 4 + tail.len());
    s.push_str(head);
    exec_server_protocol::bytes::BASE64.encode_string(data, &mut s);
    s.push_str(tail);
    Reply {
        result_json: s,
        after_send: None,
    }
}

fn unknown_process(id: &str) -> ErrorObject {
    ErrorObject::invalid_request(format!("unknown process id {id}"))
}

/// Builds the router. `fs_mode` is `Detached` when `--concurrent-requests` > 1.
pub fn router(fs_mode: Mode) -> Router<Ctx> {
    let mut r = Router::new().gate(gate);

    r.request_reply(m::INITIALIZE, Mode::Inline, |ctx: Ctx, p: InitializeParams| async move {
        if !matches!(*ctx.phase(), Phase::Fresh) {
            return Err(ErrorObject::invalid_request("initialize may only be sent once per connection"));
        }
        let server = &ctx.server;
        let session = match &p.resume_session_id {
            Some(id) => server.sessions.resume(id, ctx.id, ctx.outbound.clone())?,
            None => server.sessions.create(ctx.id, ctx.outbound.clone()),
        };
        *ctx.phase() = Phase::Initializing(session.clone());
        tracing::info!(conn = ctx.id, session = %session.id, client = %p.client_name, resumed = p.resume_session_id.is_some(), "initialized");
        // Built from the environment info encoded once at start (hot on connect).
        Ok(Reply {
            result_json: format!("{{\"sessionId\":\"{}\",\"environmentInfo\":{}}}", session.id, server.env_info_json),
            after_send: None,
        })
    });
    r.request_reply(
        m::ENVIRONMENT_INFO,
        Mode::Inline,
        |ctx: Ctx, _: ()| async move {
            Ok(Reply {
                result_json: ctx.server.env_info_json.clone(),
                after_send: None,
            })
        },
    );
    r.request(
        m::ENVIRONMENT_STATUS,
        Mode::Inline,
        |_ctx: Ctx, _: ()| async move {
            Ok(StatusResponse {
                status: "ready".into(),
            })
        },
    );

    // Processes.
    r.request_reply(
        m::PROCESS_START,
        Mode::Inline,
        |ctx: Ctx, p: ExecParams| async move {
            if p.argv.is_empty() {
                return Err(ErrorObject::invalid_params("argv must not be empty"));
            }
            let cwd = fs::native(&p.cwd)?;
            let confine = crate::sandbox::for_start(
                p.sandbox.as_ref(),
                p.enforce_managed_network,
                &cwd,
                &ctx.server.sandbox,
            )?;
            let sandbox_type = crate::sandbox::sandbox_type(confine.as_ref());
            let session = ctx.session()?;
            let (gate_tx, gate_rx) = oneshot::channel();
            let weak = Arc::downgrade(&session);
            let link = session.link.clone();
            let inserted = session.insert_process_with(&p.process_id, || {
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
                )
            });
            match inserted {
                Err(InsertError::Exists) => Err(ErrorObject::invalid_request(format!(
                    "process {} already exists",
                    p.process_id
                ))),
                Err(InsertError::Full) => Err(ErrorObject::invalid_request(format!(
                    "too many processes in this session (limit {})",
                    crate::session::MAX_PROCESSES_PER_SESSION
                ))),
                Ok(Err(e)) => Err(ErrorObject::internal(e.to_string())),
                Ok(Ok(_proc)) => {
                    let mut reply = Reply::of(&ExecResponse {
                        process_id: p.process_id,
                        sandbox_type: sandbox_type.into(),
                    });
                    reply.after_send = Some(Box::new(move || {
                        let _ = gate_tx.send(());
                    }));
                    Ok(reply)
                }
            }
        },
    );
    r.request(
        m::PROCESS_READ,
        Mode::Detached,
        |ctx: Ctx, p: ReadParams| async move {
            let proc =
                process(&ctx, &p.process_id)?.ok_or_else(|| unknown_process(&p.process_id))?;
            let wait = p.wait_ms.filter(|w| *w > 0).map(Duration::from_millis);
            Ok(proc.read(p.after_seq.unwrap_or(0), p.max_bytes, wait).await)
        },
    );
    r.request(
        m::PROCESS_WRITE,
        Mode::Inline,
        |ctx: Ctx, p: WriteParams| async move {
            let Some(proc) = process(&ctx, &p.process_id)? else {
                return Ok(WriteResponse {
                    status: WriteStatus::UnknownProcess,
                });
            };
            Ok(WriteResponse {
                status: proc.write(p.chunk.0, p.write_id).await?,
            })
        },
    );
    r.request(
        m::PROCESS_CLOSE_STDIN,
        Mode::Inline,
        |ctx: Ctx, p: ProcessIdParams| async move {
            let Some(proc) = process(&ctx, &p.process_id)? else {
                return Ok(WriteResponse {
                    status: WriteStatus::UnknownProcess,
                });
            };
            Ok(WriteResponse {
                status: proc.close_stdin(),
            })
        },
    );
    r.request(
        m::PROCESS_SIGNAL,
        Mode::Inline,
        |ctx: Ctx, p: SignalParams| async move {
            if let Some(proc) = process(&ctx, &p.process_id)? {
                proc.signal(p.signal);
            }
            Ok(Empty {})
        },
    );
    r.request(
        m::PROCESS_TERMINATE,
        Mode::Inline,
        |ctx: Ctx, p: ProcessIdParams| async move {
            let running = match process(&ctx, &p.process_id)? {
                Some(proc) => proc.terminate(),
                None => false,
            };
            Ok(TerminateResponse { running })
        },
    );
    r.request(
        m::PROCESS_RESIZE,
        Mode::Inline,
        |ctx: Ctx, p: ResizeParams| async move {
            let proc =
                process(&ctx, &p.process_id)?.ok_or_else(|| unknown_process(&p.process_id))?;
            proc.resize(p.cols, p.rows)?;
            Ok(Empty {})
        },
    );
    r.request(
        m::PROCESS_ACK,
        Mode::Inline,
        |ctx: Ctx, p: AckParams| async move {
            let proc =
                process(&ctx, &p.process_id)?.ok_or_else(|| unknown_process(&p.process_id))?;
            proc.ack(p.seq);
            Ok(Empty {})
        },
    );

    // File system.
    r.request_reply(
        m::FS_READ_FILE,
        fs_mode,
        |ctx: Ctx, p: ReadFileParams| async move {
            let data = match crate::sandbox::fs_helper::route(
                p.sandbox.as_ref(),
                Need::Read,
                &ctx.server.sandbox,
            )? {
                Route::Helper(h) => h.call(m::FS_READ_FILE, &p).await?,
                Route::InProcess => blocking(move || fs::read_file(&p)).await?,
            };
            Ok(raw_bytes_reply(
                "{\"dataBase64\":\"",
                &data.data_base64.0,
                "\"}",
            ))
        },
    );
    r.request(
        m::FS_WRITE_FILE,
        fs_mode,
        |ctx: Ctx, p: WriteFileParams| async move {
            match crate::sandbox::fs_helper::route(
                p.sandbox.as_ref(),
                Need::Write,
                &ctx.server.sandbox,
            )? {
                Route::Helper(h) => h.call(m::FS_WRITE_FILE, &p).await,
                Route::InProcess => blocking(move || fs::write_file(p)).await,
            }
        },
    );
    r.request(
        m::FS_CREATE_DIRECTORY,
        fs_mode,
        |ctx: Ctx, p: CreateDirectoryParams| async move {
            match crate::sandbox::fs_helper::route(
                p.sandbox.as_ref(),
                Need::Write,
                &ctx.server.sandbox,
            )? {
                Route::Helper(h) => h.call(m::FS_CREATE_DIRECTORY, &p).await,
                Route::InProcess => blocking(move || fs::create_directory(&p)).await,
            }
        },
    );
    r.request(
        m::FS_GET_METADATA,
        fs_mode,
        |ctx: Ctx, p: PathParams| async move {
            match crate::sandbox::fs_helper::route(
                p.sandbox.as_ref(),
                Need::Read,
                &ctx.server.sandbox,
            )? {
                Route::Helper(h) => h.call(m::FS_GET_METADATA, &p).await,
                Route::InProcess => blocking(move || fs::get_metadata(&p)).await,
            }
        },
    );
    r.request(
        m::FS_CANONICALIZE,
        fs_mode,
        |ctx: Ctx, p: PathParams| async move {
            match crate::sandbox::fs_helper::route(
                p.sandbox.as_ref(),
                Need::Read,
                &ctx.server.sandbox,
            )? {
                Route::Helper(h) => h.call(m::FS_CANONICALIZE, &p).await,
                Route::InProcess => blocking(move || fs::canonicalize(&p)).await,
            }
        },
    );
    r.request(
        m::FS_READ_DIRECTORY,
        fs_mode,
        |ctx: Ctx, p: PathParams| async move {
            match crate::sandbox::fs_helper::route(
                p.sandbox.as_ref(),
                Need::Read,
                &ctx.server.sandbox,
            )? {
                Route::Helper(h) => h.call(m::FS_READ_DIRECTORY, &p).await,
                Route::InProcess => blocking(move || fs::read_directory(&p)).await,
            }
        },
    );
    r.request(m::FS_WALK, fs_mode, |ctx: Ctx, p: WalkParams| async move {
        match crate::sandbox::fs_helper::route(p.sandbox.as_ref(), Need::Read, &ctx.server.sandbox)?
        {
            Route::Helper(h) => h.call(m::FS_WALK, &p).await,
            Route::InProcess => {
                blocking(move || {
                    let root = fs::native(&p.path)?;
                    fs::walk::walk(&root, &p.options)
                })
                .await
            }
        }
    });
    r.request(
        m::FS_REMOVE,
        fs_mode,
        |ctx: Ctx, p: RemoveParams| async move {
            match crate::sandbox::fs_helper::route(
                p.sandbox.as_ref(),
                Need::Write,
                &ctx.server.sandbox,
            )? {
                Route::Helper(h) => h.call(m::FS_REMOVE, &p).await,
                Route::InProcess => blocking(move || fs::remove(&p)).await,
            }
        },
    );
    r.request(m::FS_COPY, fs_mode, |ctx: Ctx, p: CopyParams| async move {
        match crate::sandbox::fs_helper::route(
            p.sandbox.as_ref(),
            Need::Write,
            &ctx.server.sandbox,
        )? {
            Route::Helper(h) => h.call(m::FS_COPY, &p).await,
            Route::InProcess => blocking(move || fs::copy(&p)).await,
        }
    });
    r.request(m::FS_OPEN, fs_mode, |ctx: Ctx, p: OpenParams| async move {
        let need = if p.mode == OpenMode::Replace {
            Need::Write
        } else {
            Need::Read
        };
        let route =
            crate::sandbox::fs_helper::route(p.sandbox.as_ref(), need, &ctx.server.sandbox)?;
        let session = ctx.session()?;
        if let Route::Helper(h) = route {
            session.files.check_free(&p.handle_id)?;
            let handle = h.open(&p).await?;
            session.files.insert(&p.handle_id, handle)?;
            return Ok(OpenResponse {
                handle_id: p.handle_id,
            });
        }
        blocking(move || fs::open(&p, &session.files)).await
    });
    r.request_reply(
        m::FS_READ_BLOCK,
        fs_mode,
        |ctx: Ctx, p: ReadBlockParams| async move {
            let session = ctx.session()?;
            let block = blocking(move || fs::read_block(&p, &session.files)).await?;
            let tail = if block.eof {
                "\",\"eof\":true}"
            } else {
                "\",\"eof\":false}"
            };
            Ok(raw_bytes_reply("{\"chunk\":\"", &block.chunk.0, tail))
        },
    );
    r.request(
        m::FS_WRITE_BLOCK,
        fs_mode,
        |ctx: Ctx, p: WriteBlockParams| async move {
            let session = ctx.session()?;
            blocking(move || fs::write_block(&p, &session.files)).await
        },
    );
    r.request(
        m::FS_CLOSE,
        fs_mode,
        |ctx: Ctx, p: HandleParams| async move {
            let session = ctx.session()?;
            blocking(move || {
                session
                    .files
                    .remove(&p.handle_id)
                    .map_err(|e| ErrorObject::from_io(&e))?;
                Ok(Empty {})
            })
            .await
        },
    );

    r.request(
        m::FS_WATCH,
        Mode::Inline,
        |ctx: Ctx, p: WatchParams| async move {
            let session = ctx.session()?;
            session
                .watches
                .watch(&p.watch_id, &p.path, p.recursive, session.link.clone())?;
            Ok(Empty {})
        },
    );
    r.request(
        m::FS_UNWATCH,
        Mode::Inline,
        |ctx: Ctx, p: UnwatchParams| async move {
            ctx.session()?.watches.unwatch(&p.watch_id);
            Ok(Empty {})
        },
    );

    // Discovery and configuration.
    r.request(
        m::ENVIRONMENT_CONFIG_READ,
        fs_mode,
        |_ctx: Ctx, p: EnvironmentConfigReadParams| async move {
            blocking(move || discovery::environment_config_read(&p)).await
        },
    );
    r.request(
        m::CAPABILITIES_DISCOVER_V2,
        fs_mode,
        |_ctx: Ctx, p: DiscoverV2Params| async move {
            blocking(move || discovery::discover_v2(&p)).await
        },
    );
    r.request(
        m::CAPABILITY_ROOTS_DISCOVER_V1,
        fs_mode,
        |_ctx: Ctx, p: RootsDiscoverParams| async move {
            blocking(move || discovery::roots_discover_v1(&p)).await
        },
    );

    // HTTP.
    r.request_reply(
        m::HTTP_REQUEST,
        Mode::Detached,
        |ctx: Ctx, p: HttpRequestParams| async move {
            let prepared = http::prepare(&ctx.server.http, p)?;
            let (resp, stream) = http::send(prepared, ctx.outbound.clone()).await?;
            let mut reply = Reply::of(&resp);
            if let Some(task) = stream {
                reply.after_send = Some(Box::new(move || {
                    tokio::spawn(task);
                }));
            }
            Ok(reply)
        },
    );
    r
}
