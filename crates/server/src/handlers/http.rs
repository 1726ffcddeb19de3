//! `http/request`: spawned, so a slow server never delays the connection.

use crate::connection::Ctx;
use crate::http;
use exec_server_protocol::types::HttpRequestParams;
use exec_server_protocol::{methods as m, ErrorObject};
use exec_server_rpc::router::{Mode, Reply, Router};

pub(super) fn register(r: &mut Router<Ctx>) {
    r.request_reply(m::HTTP_REQUEST, Mode::Detached, request);
}

async fn request(ctx: Ctx, p: HttpRequestParams) -> Result<Reply, ErrorObject> {
    let r = send(ctx, p).await;
    crate::metrics::http_request(r.is_ok());
    r
}

async fn send(ctx: Ctx, p: HttpRequestParams) -> Result<Reply, ErrorObject> {
    let prepared = http::prepare(&ctx.server.http, p)?;
    let (resp, stream) = http::send(prepared, ctx.outbound.clone()).await?;
    let mut reply = Reply::of(&resp);
    if let Some(task) = stream {
        // The body deltas follow the response that announces them.
        reply.after_send = Some(Box::new(move || {
            tokio::spawn(task);
        }));
    }
    Ok(reply)
}
