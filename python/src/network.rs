//! A Python network policy: an object whose `decide(request)` is a
//! coroutine resolving to a decision (`"allow"`, `"deny"` or `"ask"`, or a
//! `(decision, reason)` pair). The request is passed as JSON text; the
//! Python side (`exec_server.network`) turns a plain `async def` into that
//! object. Any failure of the callback is a deny, as the server treats a
//! missing answer.

use exec_server_client::network::{DecisionFuture, NetworkPolicy, SharedNetworkPolicy};
use exec_server_client::protocol::{NetworkDecision, NetworkPolicyRequestParams};
use pyo3::prelude::*;
use std::sync::Arc;

struct PythonPolicy {
    decide: Py<PyAny>,
    locals: pyo3_async_runtimes::TaskLocals,
}

/// Wraps `policy` (with `decide`), bound to the event loop running now.
pub(crate) fn python_policy(policy: Py<PyAny>) -> PyResult<SharedNetworkPolicy> {
    let locals = Python::attach(pyo3_async_runtimes::tokio::get_current_locals)?;
    Ok(Arc::new(PythonPolicy {
        decide: policy,
        locals,
    }))
}

fn denied(reason: &str) -> NetworkDecision {
    NetworkDecision::Deny {
        reason: Some(reason.into()),
    }
}

impl NetworkPolicy for PythonPolicy {
    fn decide(&self, request: NetworkPolicyRequestParams) -> DecisionFuture {
        let text = serde_json::to_string(&request).unwrap_or_default();
        if crate::EXITING.load(std::sync::atomic::Ordering::Acquire) {
            return Box::pin(async { denied("the client is exiting") });
        }
        let awaited = Python::attach(|py| {
            let coro = self.decide.bind(py).call_method1("decide", (text,))?;
            pyo3_async_runtimes::into_future_with_locals(&self.locals, coro)
        });
        Box::pin(async move {
            let Ok(fut) = awaited else {
                return denied("the client's network policy failed");
            };
            let Ok(answer) = fut.await else {
                return denied("the client's network policy failed");
            };
            crate::attach(|py| {
                let answer = answer.bind(py);
                let (word, reason): (String, Option<String>) = match answer.extract::<String>() {
                    Ok(w) => (w, None),
                    Err(_) => match answer.extract::<(String, Option<String>)>() {
                        Ok(pair) => pair,
                        Err(_) => return denied("the client's network policy answered nonsense"),
                    },
                };
                match word.as_str() {
                    "allow" => NetworkDecision::Allow,
                    "ask" => NetworkDecision::Ask { reason },
                    _ => NetworkDecision::Deny { reason },
                }
            })
            .await
        })
    }
}
