//! A router of typed request handlers.
//!
//! Each method is registered with its params type; [`Router::dispatch`] decodes the
//! params (absent params are `null`, and `{}` is retried as `null`), answers
//! -32602 with serde's text on a mismatch and -32601 for an unknown method, runs an
//! optional gate (e.g. "initialize first") after decoding, and returns the handler's
//! future. Whether that future is awaited in line or spawned is the caller's choice,
//! guided by the [`Mode`] the method was registered with.

use exec_server_protocol::binary::{add_empty_member, WithPayload};
use exec_server_protocol::{decode_params, ErrorObject};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

/// A handler's successful outcome: the result's JSON text, and an optional action to
/// run once the response has been queued on the connection (e.g. let a new process's
/// notifications flow only after the `process/start` response).
pub struct Reply {
    /// The `result` value, already encoded as JSON.
    pub result_json: String,
    /// Run after the response is queued.
    pub after_send: Option<Box<dyn FnOnce() + Send>>,
    /// The result's `chunk` as raw bytes, to be sent as a binary frame's
    /// payload (`result_json` then has no `chunk`). Only set by handlers that
    /// checked the connection agreed to binary frames.
    pub payload: Option<Vec<u8>>,
    /// The rest of the result, produced while it is sent: `result_json` is
    /// then only the result's beginning. Only set by handlers that checked
    /// [`crate::Outbound::streams`].
    pub stream: Option<crate::transport::TextStream>,
    /// With `stream`: resolves (or closes) once its producer is done. The
    /// connection waits for it before the next request of an in-order
    /// (`Inline`) method, so a later request never overtakes the reading.
    pub stream_done: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Reply {
    /// Encodes `value` as the result.
    pub fn of<T: Serialize>(value: &T) -> Reply {
        Reply::json(serde_json::to_string(value).unwrap_or_else(|_| "null".into()))
    }

    /// A result already encoded as JSON text.
    pub fn json(result_json: String) -> Reply {
        Reply {
            result_json,
            after_send: None,
            payload: None,
            stream: None,
            stream_done: None,
        }
    }

    /// A result sent while it is produced: `head` (JSON text), then each
    /// piece `body` yields until [`crate::transport::StreamPiece::End`], then
    /// `tail`. The pieces must complete `head` into valid JSON text; an `Err`,
    /// or a body closed before `End`, ends the connection (the message cannot
    /// be finished honestly). `done` resolves (or closes) once the producer
    /// has stopped.
    pub fn streamed(
        head: String,
        body: tokio::sync::mpsc::Receiver<
            Result<crate::transport::StreamPiece, crate::transport::StreamAborted>,
        >,
        tail: &'static str,
        done: tokio::sync::oneshot::Receiver<()>,
    ) -> Reply {
        Reply {
            result_json: head,
            after_send: None,
            payload: None,
            stream_done: Some(done),
            stream: Some(crate::transport::TextStream {
                head: Vec::new(),
                body,
                tail: tail.as_bytes().to_vec(),
            }),
        }
    }
}

/// The future a dispatched request runs.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Reply, ErrorObject>> + Send>>;

/// How the connection should run a method's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Awaited before the next message of the connection is handled: keeps the
    /// arrival order of requests that change state.
    Inline,
    /// Spawned: may take long (long-polls, HTTP) and must not delay other requests.
    Detached,
}

type Handler<C> =
    Box<dyn Fn(C, Value, Option<bytes::Bytes>) -> Result<HandlerFuture, ErrorObject> + Send + Sync>;
type Gate<C> = Box<dyn Fn(&C, &str) -> Result<(), ErrorObject> + Send + Sync>;

/// Method table for a context type `C` (cloned into each handler call).
pub struct Router<C> {
    handlers: HashMap<&'static str, (Mode, Handler<C>)>,
    gate: Option<Gate<C>>,
}

impl<C: Send + 'static> Default for Router<C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Send + 'static> Router<C> {
    /// An empty router.
    pub fn new() -> Self {
        Router {
            handlers: HashMap::new(),
            gate: None,
        }
    }

    /// Sets a check run after params decode and before the handler.
    pub fn gate(
        mut self,
        f: impl Fn(&C, &str) -> Result<(), ErrorObject> + Send + Sync + 'static,
    ) -> Self {
        self.gate = Some(Box::new(f));
        self
    }

    /// Registers a handler whose result is any serializable value.
    pub fn request<P, R, F, Fut>(&mut self, method: &'static str, mode: Mode, f: F) -> &mut Self
    where
        P: DeserializeOwned + Send + 'static,
        R: Serialize + 'static,
        F: Fn(C, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ErrorObject>> + Send + 'static,
    {
        self.request_reply(method, mode, move |ctx, p: P| {
            let fut = f(ctx, p);
            async move { fut.await.map(|r| Reply::of(&r)) }
        })
    }

    /// Registers a handler that builds its own [`Reply`].
    pub fn request_reply<P, F, Fut>(&mut self, method: &'static str, mode: Mode, f: F) -> &mut Self
    where
        P: DeserializeOwned + Send + 'static,
        F: Fn(C, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Reply, ErrorObject>> + Send + 'static,
    {
        self.handlers.insert(
            method,
            (
                mode,
                Box::new(move |ctx, params, payload| {
                    refuse_payload(&payload)?;
                    let p: P = decode_params(params).map_err(ErrorObject::invalid_params)?;
                    Ok(Box::pin(f(ctx, p)) as HandlerFuture)
                }),
            ),
        );
        self
    }

    /// Registers a handler whose params' bytes member (`P::MEMBER`) may also
    /// come apart as raw bytes (a binary frame's payload, or decoded out of
    /// the message buffer); then `params` must not hold it (-32602).
    pub fn request_with_payload<P, R, F, Fut>(
        &mut self,
        method: &'static str,
        mode: Mode,
        f: F,
    ) -> &mut Self
    where
        P: DeserializeOwned + WithPayload + Send + 'static,
        R: Serialize + 'static,
        F: Fn(C, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ErrorObject>> + Send + 'static,
    {
        self.handlers.insert(
            method,
            (
                mode,
                Box::new(move |ctx, mut params, payload| {
                    if payload.is_some() {
                        add_empty_member(&mut params, P::MEMBER)
                            .map_err(ErrorObject::invalid_params)?;
                    }
                    let mut p: P = decode_params(params).map_err(ErrorObject::invalid_params)?;
                    if let Some(bytes) = payload {
                        p.set_payload(bytes);
                    }
                    let fut = f(ctx, p);
                    Ok(Box::pin(async move { fut.await.map(|r| Reply::of(&r)) }) as HandlerFuture)
                }),
            ),
        );
        self
    }

    /// The registered wire name equal to `method`, as a `&'static str` (for
    /// labels that must come from a fixed set); `None` for an unknown method.
    pub fn known_method(&self, method: &str) -> Option<&'static str> {
        self.handlers.get_key_value(method).map(|(k, _)| *k)
    }

    /// Decodes params, runs the gate, and returns the handler's future with its mode.
    pub fn dispatch(
        &self,
        ctx: C,
        method: &str,
        params: Value,
    ) -> Result<(Mode, HandlerFuture), ErrorObject> {
        self.dispatch_with_payload(ctx, method, params, None)
    }

    /// As [`Self::dispatch`] for a request that came as a binary frame:
    /// `payload` is its `params.chunk`. A method that takes no bytes answers
    /// -32602.
    pub fn dispatch_with_payload(
        &self,
        ctx: C,
        method: &str,
        params: Value,
        payload: Option<bytes::Bytes>,
    ) -> Result<(Mode, HandlerFuture), ErrorObject> {
        let Some((mode, handler)) = self.handlers.get(method) else {
            return Err(ErrorObject::method_not_found(method));
        };
        // The handler decodes first so that bad params win over the gate, as in the
        // reference; the gate therefore runs inside a wrapper.
        let gate_result = self.gate.as_ref().map(|g| g(&ctx, method));
        let fut = handler(ctx, params, payload)?;
        if let Some(Err(e)) = gate_result {
            return Err(e);
        }
        Ok((*mode, fut))
    }
}

fn refuse_payload(payload: &Option<bytes::Bytes>) -> Result<(), ErrorObject> {
    match payload {
        Some(_) => Err(ErrorObject::invalid_params(
            "this method takes no binary payload",
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec_server_protocol::error::{INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND};
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Named {
        name: String,
    }

    fn router() -> Router<bool> {
        let mut r = Router::new().gate(|ready: &bool, _m: &str| {
            if *ready {
                Ok(())
            } else {
                Err(ErrorObject::invalid_request("not ready"))
            }
        });
        r.request("hello", Mode::Inline, |_ctx, p: Named| async move {
            Ok(format!("hi {}", p.name))
        });
        r.request("unit", Mode::Detached, |_ctx, _p: ()| async move { Ok(1) });
        r
    }

    async fn run(r: &Router<bool>, ready: bool, m: &str, p: Value) -> Result<String, i64> {
        match r.dispatch(ready, m, p) {
            Ok((_, f)) => f.await.map(|r| r.result_json).map_err(|e| e.code),
            Err(e) => Err(e.code),
        }
    }

    #[tokio::test]
    async fn decode_gate_and_unknown() {
        let r = router();
        assert_eq!(
            run(&r, true, "hello", serde_json::json!({"name":"x"})).await,
            Ok("\"hi x\"".into())
        );
        assert_eq!(
            run(&r, true, "hello", Value::Null).await,
            Err(INVALID_PARAMS)
        );
        // Bad params win over the gate.
        assert_eq!(
            run(&r, false, "hello", serde_json::json!({})).await,
            Err(INVALID_PARAMS)
        );
        assert_eq!(
            run(&r, false, "hello", serde_json::json!({"name":"x"})).await,
            Err(INVALID_REQUEST)
        );
        assert_eq!(
            run(&r, true, "nope", Value::Null).await,
            Err(METHOD_NOT_FOUND)
        );
        // Unit params: absent, null and {} accepted; anything else is -32602.
        assert_eq!(run(&r, true, "unit", Value::Null).await, Ok("1".into()));
        assert_eq!(
            run(&r, true, "unit", serde_json::json!({})).await,
            Ok("1".into())
        );
        assert_eq!(
            run(&r, true, "unit", serde_json::json!({"x":1})).await,
            Err(INVALID_PARAMS)
        );
        assert_eq!(
            run(&r, true, "unit", serde_json::json!([])).await,
            Err(INVALID_PARAMS)
        );
    }
}
