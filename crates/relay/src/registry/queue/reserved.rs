//! Frames an executor's reader splices into a stream's pipe: their budget
//! is taken before the first byte moves ([`HarnessQueue::reserve`]), and
//! they join the queue whole ([`HarnessQueue::send_reserved`]).

use super::{HarnessQueue, Item, Refused, Scope};
use std::collections::VecDeque;

/// Budget taken for a frame on its way into a queue
/// ([`HarnessQueue::reserve`]); given back when dropped unless the frame
/// was queued with it.
pub struct Reserved {
    queue: HarnessQueue,
    n: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.n > 0 {
            self.queue.release(self.n);
        }
    }
}

impl HarnessQueue {
    /// Takes `n` bytes of the budgets for a frame that is to be queued with
    /// [`HarnessQueue::send_reserved`], or says which budget it would pass.
    pub fn reserve(&self, n: usize) -> Result<Reserved, Scope> {
        self.take_budget(&mut self.lock(), n)?;
        Ok(Reserved {
            queue: self.clone(),
            n,
        })
    }

    /// Queues `items` (one frame as its executor sent it: piped, then the
    /// rest read, if any) with the budget `reserved` took for them,
    /// writing them through as [`HarnessQueue::send`] does. Their charges
    /// may pass `reserved` by [`super::QUEUED_FRAME_OVERHEAD`] per item after the
    /// first (taken whatever the budgets). Errors: [`Refused::Gone`].
    pub fn send_reserved(&self, items: Vec<Item>, mut reserved: Reserved) -> Result<(), Refused> {
        let mut held = self.lock();
        if held.closed {
            // Unlocked first: the reservation's drop takes the lock.
            drop(held);
            drop(reserved);
            return Err(Refused::Gone);
        }
        // The reservation's charge is the items' from here on (given back
        // here, not by its drop, which would take the lock held now).
        let total: usize = items.iter().map(Item::charge).sum();
        let taken = std::mem::take(&mut reserved.n);
        if total >= taken {
            let extra = total - taken;
            self.environment.force(extra);
            self.node.force(extra);
            held.bytes += extra;
        } else {
            self.uncharge(&mut held, taken - total);
        }
        let mut incoming = VecDeque::from(items);
        self.write_through_all(&mut held, &mut incoming, true)?;
        held.frames.extend(incoming);
        self.wake_task(held);
        Ok(())
    }
}
