//! `http/request`: an HTTP client on the executor, with optional streaming of the
//! body as `http/request/bodyDelta` notifications.

use exec_server_protocol::types::{
    HttpBodyDelta, HttpRequestParams, HttpResponse, HttpResponseHeader, RedirectPolicy,
};
use exec_server_protocol::{methods, ByteChunk, ErrorObject};
use exec_server_rpc::Outbound;
use std::time::Duration;

/// Largest body piece in one `http/request/bodyDelta`: 1 MiB.
pub const MAX_HTTP_BODY_DELTA_BYTES: usize = 1024 * 1024;

/// Largest buffered (non-streamed) response body: 256 MiB.
pub const MAX_BUFFERED_HTTP_BODY_BYTES: usize = 256 * 1024 * 1024;

/// Two clients, one per redirect policy (reqwest fixes the policy per client).
pub struct HttpClients {
    follow: reqwest::Client,
    stop: reqwest::Client,
}

impl HttpClients {
    /// Builds both clients (rustls, no system OpenSSL).
    pub fn new() -> Result<Self, String> {
        let build = |policy| {
            reqwest::Client::builder()
                .redirect(policy)
                .build()
                .map_err(|e| e.to_string())
        };
        Ok(HttpClients {
            follow: build(reqwest::redirect::Policy::limited(10))?,
            stop: build(reqwest::redirect::Policy::none())?,
        })
    }
}

/// A validated request ready to send.
pub struct Prepared {
    req: reqwest::RequestBuilder,
    stream: bool,
    request_id: String,
}

/// Validates params (-32602 on a bad method, URL, scheme or header) and builds
/// the request.
pub fn prepare(clients: &HttpClients, p: HttpRequestParams) -> Result<Prepared, ErrorObject> {
    let method = reqwest::Method::from_bytes(p.method.as_bytes())
        .map_err(|e| ErrorObject::invalid_params(format!("http/request method is invalid: {e}")))?;
    let url = url::Url::parse(&p.url)
        .map_err(|e| ErrorObject::invalid_params(format!("http/request url is invalid: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(ErrorObject::invalid_params(format!(
            "http/request only supports http and https URLs, got {}",
            url.scheme()
        )));
    }
    let client = match p.redirect_policy {
        RedirectPolicy::Follow => &clients.follow,
        RedirectPolicy::Stop => &clients.stop,
    };
    let mut headers = reqwest::header::HeaderMap::new();
    for h in &p.headers {
        let value = match &h.value_env_var {
            Some(var) => std::env::var(var).map_err(|_| {
                ErrorObject::invalid_params(format!(
                    "http/request header `{}` names environment variable `{var}`, which is not set on the executor",
                    h.name
                ))
            })?,
            None => h.value.clone(),
        };
        let name = reqwest::header::HeaderName::from_bytes(h.name.as_bytes()).map_err(|e| {
            ErrorObject::invalid_params(format!(
                "http/request header name `{}` is invalid: {e}",
                h.name
            ))
        })?;
        // The value may be a secret from the environment: never echo it.
        let value = reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
            ErrorObject::invalid_params(format!(
                "http/request header `{}` has an invalid value",
                h.name
            ))
        })?;
        headers.append(name, value);
    }
    let mut req = client.request(method, url).headers(headers);
    if let Some(body) = p.body_base64 {
        req = req.body(body.0);
    }
    if let Some(ms) = p.timeout_ms {
        req = req.timeout(Duration::from_millis(ms));
    }
    Ok(Prepared {
        req,
        stream: p.stream_response,
        request_id: p.request_id,
    })
}

fn transport_error(e: reqwest::Error) -> ErrorObject {
    ErrorObject::internal(format!("http/request failed: {e}"))
}

/// Sends the request. Buffered: the whole body in the result. Streamed: the result
/// carries status and headers with an empty body, and the returned task (to start
/// once the response is queued) sends the body as deltas on `out`.
pub async fn send(
    prepared: Prepared,
    out: Outbound,
) -> Result<
    (
        HttpResponse,
        Option<impl std::future::Future<Output = ()> + Send>,
    ),
    ErrorObject,
> {
    let resp = prepared.req.send().await.map_err(transport_error)?;
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| HttpResponseHeader {
            name: k.as_str().to_string(),
            value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
        })
        .collect();
    if !prepared.stream {
        if resp
            .content_length()
            .is_some_and(|n| n as usize > MAX_BUFFERED_HTTP_BODY_BYTES)
        {
            return Err(ErrorObject::internal(format!(
                "http/request failed: response body above {MAX_BUFFERED_HTTP_BODY_BYTES} bytes; use streamResponse"
            )));
        }
        let body = resp.bytes().await.map_err(transport_error)?;
        return Ok((
            HttpResponse {
                status,
                headers,
                body_base64: ByteChunk(body.to_vec()),
            },
            None,
        ));
    }
    let request_id = prepared.request_id;
    let task = async move {
        let mut resp = resp;
        let mut seq = 0u64;
        let send = |seq: u64, data: &[u8], done: bool, error: Option<String>| {
            let delta = HttpBodyDelta {
                request_id: request_id.clone(),
                seq,
                delta_base64: ByteChunk(data.to_vec()),
                done,
                error,
            };
            exec_server_protocol::encode_notification(
                methods::HTTP_REQUEST_BODY_DELTA,
                &serde_json::to_value(&delta).unwrap_or_default(),
            )
        };
        loop {
            match resp.chunk().await {
                Ok(Some(bytes)) => {
                    for piece in bytes.chunks(MAX_HTTP_BODY_DELTA_BYTES) {
                        seq += 1;
                        if out.send(send(seq, piece, false, None)).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(None) => {
                    let _ = out.send(send(seq + 1, &[], true, None)).await;
                    return;
                }
                Err(e) => {
                    let _ = out
                        .send(send(seq + 1, &[], true, Some(e.to_string())))
                        .await;
                    return;
                }
            }
        }
    };
    Ok((
        HttpResponse {
            status,
            headers,
            body_base64: ByteChunk::default(),
        },
        Some(task),
    ))
}
