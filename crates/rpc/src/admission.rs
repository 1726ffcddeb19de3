//! Admission of requests a peer receives from the other side (on a client: the
//! server's `network/policyRequest`). Only non-negative integer ids are admitted, a
//! duplicate id still in flight is refused, at most a fixed number run at once, and
//! the id is released when the handler ends, by a guard.

use exec_server_protocol::{ErrorObject, RequestId};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Server→client requests allowed in flight at once: 256, as in the reference.
pub const MAX_INBOUND_REQUESTS: usize = 256;

/// Tracks ids in flight.
#[derive(Clone)]
pub struct InboundAdmission {
    ids: Arc<Mutex<HashSet<i64>>>,
    capacity: usize,
}

/// Holds an admitted id; dropping it releases the id.
#[derive(Debug)]
pub struct AdmissionGuard {
    ids: Arc<Mutex<HashSet<i64>>>,
    id: i64,
}

impl InboundAdmission {
    /// Admission with the given capacity.
    pub fn new(capacity: usize) -> Self {
        InboundAdmission {
            ids: Arc::default(),
            capacity,
        }
    }

    /// Admits `id` or explains why not (-32600).
    pub fn admit(&self, id: &RequestId) -> Result<AdmissionGuard, ErrorObject> {
        let key = match id {
            RequestId::Integer(i) if *i >= 0 => *i,
            _ => {
                return Err(ErrorObject::invalid_request(format!(
                    "request id {id} is not a non-negative integer"
                )))
            }
        };
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        if ids.contains(&key) {
            return Err(ErrorObject::invalid_request(format!(
                "request id {key} is already in flight"
            )));
        }
        if ids.len() >= self.capacity {
            return Err(ErrorObject::invalid_request(format!(
                "more than {} requests in flight",
                self.capacity
            )));
        }
        ids.insert(key);
        Ok(AdmissionGuard {
            ids: self.ids.clone(),
            id: key,
        })
    }

    /// Ids currently in flight.
    pub fn in_flight(&self) -> usize {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Default for InboundAdmission {
    fn default() -> Self {
        Self::new(MAX_INBOUND_REQUESTS)
    }
}

impl Drop for AdmissionGuard {
    fn drop(&mut self) {
        self.ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_rules() {
        let a = InboundAdmission::new(2);
        assert!(a.admit(&RequestId::Integer(-1)).is_err());
        assert!(a.admit(&RequestId::String("1".into())).is_err());
        let g1 = a.admit(&RequestId::Integer(1)).unwrap();
        assert!(
            a.admit(&RequestId::Integer(1)).is_err(),
            "duplicate in flight"
        );
        let _g2 = a.admit(&RequestId::Integer(2)).unwrap();
        assert!(a.admit(&RequestId::Integer(3)).is_err(), "capacity");
        drop(g1);
        assert_eq!(a.in_flight(), 1);
        assert!(
            a.admit(&RequestId::Integer(1)).is_ok(),
            "released by the guard"
        );
    }
}
