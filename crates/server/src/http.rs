//! `http/request`: an HTTP client on the executor, with optional streaming of the
//! body as `http/request/bodyDelta` notifications.

use crate::error::{ExecError, ExecResult};
use exec_server_protocol::types::{
    HttpBodyDelta, HttpRequestParams, HttpResponse, HttpResponseHeader, RedirectPolicy,
};
use exec_server_protocol::{methods, ByteChunk};
use exec_server_rpc::Outbound;
use std::time::Duration;

/// Largest body piece in one `http/request/bodyDelta`: 1 MiB.
pub const MAX_HTTP_BODY_DELTA_BYTES: usize = 1024 * 1024;

/// Default for `--max-http-body-bytes`, the largest buffered (not streamed)
/// response body: 64 MiB. A larger body is refused with an error naming
/// `streamResponse`, and is never held in memory past this size.
pub const DEFAULT_MAX_BUFFERED_HTTP_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Redirects followed under `redirectPolicy: follow` before giving up: 10.
pub const MAX_HTTP_REDIRECTS: usize = 10;

/// Two clients, one per redirect policy (reqwest fixes the policy per client),
/// and the cap on buffered bodies.
pub struct HttpClients {
    follow: reqwest::Client,
    stop: reqwest::Client,
    max_buffered_body_bytes: usize,
}

/// Why a redirect was not followed. Carried inside reqwest's error so the
/// reply can name it without matching on text.
#[derive(Debug)]
enum RedirectRefused {
    /// The `Location` resolves to a scheme other than http/https (`file`, `ftp`…).
    UnsupportedScheme(String),
    /// More than [`MAX_HTTP_REDIRECTS`] hops.
    TooMany,
}

impl std::fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedirectRefused::UnsupportedScheme(s) => {
                write!(f, "redirect target uses unsupported URL scheme: {s}")
            }
            RedirectRefused::TooMany => write!(f, "too many redirects"),
        }
    }
}

impl std::error::Error for RedirectRefused {}

fn is_http_scheme(scheme: &str) -> bool {
    scheme == "http" || scheme == "https"
}

impl HttpClients {
    /// Builds both clients (rustls, no system OpenSSL). Buffered response bodies
    /// above `max_buffered_body_bytes` are refused.
    pub fn new(max_buffered_body_bytes: usize) -> Result<Self, String> {
        let build = |policy| {
            reqwest::Client::builder()
                .redirect(policy)
                .build()
                .map_err(|e| e.to_string())
        };
        // reqwest refuses a non-http hop itself, but only with a vague "builder
        // error"; checking first names the scheme (as the reference does).
        let follow = reqwest::redirect::Policy::custom(|attempt| {
            let scheme = attempt.url().scheme().to_string();
            if !is_http_scheme(&scheme) {
                attempt.error(RedirectRefused::UnsupportedScheme(scheme))
            } else if attempt.previous().len() > MAX_HTTP_REDIRECTS {
                attempt.error(RedirectRefused::TooMany)
            } else {
                attempt.follow()
            }
        });
        Ok(HttpClients {
            follow: build(follow)?,
            stop: build(reqwest::redirect::Policy::none())?,
            max_buffered_body_bytes,
        })
    }
}

/// A validated request ready to send.
pub struct Prepared {
    req: reqwest::RequestBuilder,
    stream: bool,
    request_id: String,
    follow: bool,
    timeout_ms: Option<u64>,
    max_buffered_body_bytes: usize,
}

/// Validates params (`InvalidParams` on a bad method, URL, scheme or header) and builds
/// the request.
pub fn prepare(clients: &HttpClients, p: HttpRequestParams) -> ExecResult<Prepared> {
    let method = reqwest::Method::from_bytes(p.method.as_bytes())
        .map_err(|e| ExecError::invalid_params(format!("http/request method is invalid: {e}")))?;
    let url = url::Url::parse(&p.url)
        .map_err(|e| ExecError::invalid_params(format!("http/request url is invalid: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(ExecError::invalid_params(format!(
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
                ExecError::invalid_params(format!(
                    "http/request header `{}` names environment variable `{var}`, which is not set on the executor",
                    h.name
                ))
            })?,
            None => h.value.clone(),
        };
        let name = reqwest::header::HeaderName::from_bytes(h.name.as_bytes()).map_err(|e| {
            ExecError::invalid_params(format!(
                "http/request header name `{}` is invalid: {e}",
                h.name
            ))
        })?;
        // The value may be a secret from the environment: never echo it.
        let value = reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
            ExecError::invalid_params(format!(
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
        follow: matches!(p.redirect_policy, RedirectPolicy::Follow),
        timeout_ms: p.timeout_ms,
        max_buffered_body_bytes: clients.max_buffered_body_bytes,
    })
}

/// Describes a reqwest failure: a timeout as a timeout (reqwest would say
/// "error decoding response body" when it strikes while reading the body), a
/// refused redirect by its reason, anything else with its chain of causes.
fn describe(e: &reqwest::Error, timeout_ms: Option<u64>) -> String {
    if e.is_timeout() {
        return match timeout_ms {
            Some(ms) => format!("request timed out (timeoutMs {ms})"),
            None => "request timed out".into(),
        };
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut text = e.to_string();
    while let Some(c) = cause {
        if let Some(r) = c.downcast_ref::<RedirectRefused>() {
            return r.to_string();
        }
        cause = c.source();
        if let Some(next) = cause {
            let next = next.to_string();
            if !text.contains(&next) {
                text.push_str(": ");
                text.push_str(&next);
            }
        }
    }
    text
}

fn transport_error(e: reqwest::Error, timeout_ms: Option<u64>) -> ExecError {
    ExecError::failed(format!("http/request failed: {}", describe(&e, timeout_ms))).with_source(e)
}

fn too_big(limit: usize) -> ExecError {
    ExecError::failed(format!(
        "http/request failed: response body is larger than {limit} bytes, the limit for buffered responses; \
         set streamResponse: true to receive it as http/request/bodyDelta notifications"
    ))
}

/// A redirect status whose `Location` leaves http/https. The HTTP stack hands
/// such a response back as is instead of consulting the policy, so under
/// `follow` it is checked here: following it is refused, as the reference does.
fn unfollowable_redirect(resp: &reqwest::Response) -> Option<RedirectRefused> {
    // The statuses the HTTP stack follows; 300 and 304 are answers, not hops.
    if !matches!(resp.status().as_u16(), 301 | 302 | 303 | 307 | 308) {
        return None;
    }
    let location = resp
        .headers()
        .get(reqwest::header::LOCATION)?
        .to_str()
        .ok()?;
    let target = resp.url().join(location).ok()?;
    (!is_http_scheme(target.scheme()))
        .then(|| RedirectRefused::UnsupportedScheme(target.scheme().to_string()))
}

/// Reads a whole body, refusing (without holding more) once it passes `limit`.
async fn read_capped(
    mut resp: reqwest::Response,
    limit: usize,
    timeout_ms: Option<u64>,
) -> ExecResult<Vec<u8>> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_big(limit));
    }
    let mut body = Vec::with_capacity(resp.content_length().unwrap_or(0) as usize);
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| transport_error(e, timeout_ms))?
    {
        if chunk.len() > limit - body.len() {
            return Err(too_big(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
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
    ExecError,
> {
    let timeout_ms = prepared.timeout_ms;
    if timeout_ms == Some(0) {
        // A zero budget has run out before anything is sent (as the reference
        // answers); racing a zero timer against a connect would answer at random.
        return Err(ExecError::failed(
            "http/request failed: request timed out (timeoutMs 0)",
        ));
    }
    let resp = prepared
        .req
        .send()
        .await
        .map_err(|e| transport_error(e, timeout_ms))?;
    if prepared.follow {
        if let Some(refused) = unfollowable_redirect(&resp) {
            return Err(ExecError::failed(format!("http/request failed: {refused}")));
        }
    }
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
        let body = read_capped(resp, prepared.max_buffered_body_bytes, timeout_ms).await?;
        return Ok((
            HttpResponse {
                status,
                headers,
                body_base64: ByteChunk::from(body),
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
                delta_base64: ByteChunk::from(data.to_vec()),
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
                    let why = describe(&e, timeout_ms);
                    let _ = out.send(send(seq + 1, &[], true, Some(why))).await;
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
