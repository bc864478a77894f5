//! Bookkeeping of posted batches, shared by every transport.

use alloc::vec::Vec;
use core::task::Poll;

use super::{Completion, FabricError, Ticket};

enum Slot<P> {
    Free {
        next: Option<u32>,
    },
    /// Posted, not yet complete; `P` is the transport's own pending state.
    Pending {
        pending: P,
        forgotten: bool,
    },
    Done(Result<Completion, FabricError>),
}

/// A slab of in-flight batches indexed by [`Ticket`]: transports store what they need
/// per pending batch (`P`: a ready time, a work-request id, ...) and the result once
/// it is known. Forgotten tickets are freed as soon as they complete.
pub struct TicketSlab<P> {
    slots: Vec<Slot<P>>,
    free: Option<u32>,
    pending: usize,
}

impl<P> core::fmt::Debug for TicketSlab<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TicketSlab")
            .field("slots", &self.slots.len())
            .field("pending", &self.pending)
            .finish()
    }
}

impl<P> Default for TicketSlab<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> TicketSlab<P> {
    /// An empty slab.
    pub const fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: None,
            pending: 0,
        }
    }

    fn allocate(&mut self, slot: Slot<P>) -> Ticket {
        match self.free {
            Some(index) => {
                let entry = &mut self.slots[index as usize];
                let Slot::Free { next } = *entry else {
                    unreachable!("free list points at a used slot")
                };
                self.free = next;
                *entry = slot;
                Ticket(index)
            }
            None => {
                self.slots.push(slot);
                Ticket((self.slots.len() - 1) as u32)
            }
        }
    }

    fn release(&mut self, index: u32) {
        self.slots[index as usize] = Slot::Free { next: self.free };
        self.free = Some(index);
    }

    /// Registers a batch that will complete later.
    pub fn insert_pending(&mut self, pending: P) -> Ticket {
        self.pending += 1;
        self.allocate(Slot::Pending {
            pending,
            forgotten: false,
        })
    }

    /// Registers a batch whose result is already known (synchronous transports, or a
    /// batch rejected before it was sent).
    pub fn insert_done(&mut self, result: Result<Completion, FabricError>) -> Ticket {
        self.allocate(Slot::Done(result))
    }

    /// Registers a batch that a synchronous transport executes now: `execute`
    /// appends its outputs to an empty completion, or fails.
    pub fn insert_executed(
        &mut self,
        execute: impl FnOnce(&mut Completion) -> Result<(), FabricError>,
    ) -> Ticket {
        let mut completion = Completion::new();
        let result = execute(&mut completion).map(|()| completion);
        self.insert_done(result)
    }

    /// Number of batches posted and not yet complete (forgotten ones included).
    pub fn pending_count(&self) -> usize {
        self.pending
    }

    /// The transport state of a pending ticket.
    pub fn pending_mut(&mut self, ticket: Ticket) -> Option<&mut P> {
        match self.slots.get_mut(ticket.0 as usize) {
            Some(Slot::Pending { pending, .. }) => Some(pending),
            _ => None,
        }
    }

    /// Iterates over pending tickets and their transport state.
    pub fn pending_iter(&self) -> impl Iterator<Item = (Ticket, &P)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| match slot {
                Slot::Pending { pending, .. } => Some((Ticket(i as u32), pending)),
                _ => None,
            })
    }

    /// Records the result of a pending batch (dropped if the ticket was forgotten).
    /// Returns the transport state that was stored for it.
    pub fn complete(
        &mut self,
        ticket: Ticket,
        result: Result<Completion, FabricError>,
    ) -> Option<P> {
        let slot = self.slots.get_mut(ticket.0 as usize)?;
        if !matches!(slot, Slot::Pending { .. }) {
            return None;
        }
        self.pending -= 1;
        let Slot::Pending { pending, forgotten } = core::mem::replace(slot, Slot::Done(result))
        else {
            unreachable!("checked above")
        };
        if forgotten {
            self.release(ticket.0);
        }
        Some(pending)
    }

    /// Redeems a ticket: `Ready` once its batch completed, which frees the ticket.
    pub fn poll(&mut self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        match self.slots.get(ticket.0 as usize) {
            Some(Slot::Pending { .. }) => Poll::Pending,
            Some(Slot::Done(_)) => {
                let Slot::Done(result) = core::mem::replace(
                    &mut self.slots[ticket.0 as usize],
                    Slot::Free { next: self.free },
                ) else {
                    unreachable!("checked above")
                };
                self.free = Some(ticket.0);
                Poll::Ready(result)
            }
            _ => Poll::Ready(Err(FabricError::UnknownTicket(ticket.0))),
        }
    }

    /// Drops interest in a ticket: frees it now if complete, on completion otherwise.
    pub fn forget(&mut self, ticket: Ticket) {
        match self.slots.get_mut(ticket.0 as usize) {
            Some(Slot::Pending { forgotten, .. }) => *forgotten = true,
            Some(Slot::Done(_)) => self.release(ticket.0),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_are_reused_after_redeem_and_forget() {
        let mut slab: TicketSlab<u8> = TicketSlab::new();
        let a = slab.insert_pending(1);
        let b = slab.insert_done(Ok(Completion::new()));
        assert_eq!(slab.poll(a), Poll::Pending);
        assert!(matches!(slab.poll(b), Poll::Ready(Ok(_))));
        assert!(matches!(
            slab.poll(b),
            Poll::Ready(Err(FabricError::UnknownTicket(_)))
        ));
        slab.forget(a);
        assert_eq!(slab.pending_count(), 1);
        assert_eq!(slab.complete(a, Ok(Completion::new())), Some(1));
        assert_eq!(slab.pending_count(), 0);
        // Both slots are free again: the next two tickets reuse them.
        let c = slab.insert_pending(2);
        let d = slab.insert_pending(3);
        assert!(c.0 <= 1 && d.0 <= 1 && c != d);
    }
}
