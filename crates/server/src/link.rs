//! The attachment of a session to the connection it currently talks through: a
//! leaf that the process pump and the file watcher write their notifications to,
//! so neither needs to know what a session is.

use exec_server_rpc::Outbound;
use std::sync::{Mutex, MutexGuard};

/// The attachment of a session to a connection: where its notifications go.
/// Detached (no connection, or a closed one), notifications are dropped and the
/// client reads what it missed by seq.
#[derive(Default)]
pub struct Link {
    current: Mutex<Option<(u64, Outbound)>>,
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, Option<(u64, Outbound)>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attached connection's sending handle, if attached and alive.
    pub fn outbound(&self) -> Option<Outbound> {
        self.lock()
            .as_ref()
            .filter(|(_, o)| !o.is_closed())
            .map(|(_, o)| o.clone())
    }

    /// The id of the attached live connection.
    pub fn attached_to(&self) -> Option<u64> {
        self.lock()
            .as_ref()
            .filter(|(_, o)| !o.is_closed())
            .map(|(id, _)| *id)
    }

    pub(crate) fn attach(&self, conn: u64, out: Outbound) {
        *self.lock() = Some((conn, out));
    }

    /// Detaches if `conn` is the attached connection; true if it was.
    pub(crate) fn detach(&self, conn: u64) -> bool {
        let mut cur = self.lock();
        if cur.as_ref().is_some_and(|(id, _)| *id == conn) {
            *cur = None;
            return true;
        }
        false
    }
}
