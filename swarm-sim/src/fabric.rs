//! [`SimFabric`]: one simulated client's handle, implementing [`Fabric`].

use core::fmt;
use core::task::Poll;

use super::world::{SimWorld, Sleep};
use swarm_core::fabric::{Batch, Completion, Fabric, FabricError, Nanos, NodeId, Ticket};

/// Identifies a simulated client (one per [`SimWorld::client`] call).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientId(pub u32);

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// A client's view of a [`SimWorld`]: posts batches, polls their tickets.
///
/// Clones share the client (same id, same tickets), so several tasks of one client
/// can each own a handle. [`Fabric::progress`] advances the *whole* world
/// ([`SimWorld::progress`]), so `block_on(&fabric, ..)` works for a single client, and
/// [`super::SimRunner`] drives many.
#[derive(Clone)]
pub struct SimFabric {
    world: SimWorld,
    id: ClientId,
}

impl fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFabric").field("id", &self.id).finish()
    }
}

impl SimFabric {
    pub(crate) fn new(world: SimWorld, id: ClientId) -> Self {
        Self { world, id }
    }

    /// This client's id.
    pub fn id(&self) -> ClientId {
        self.id
    }

    /// The world this client lives in.
    pub fn world(&self) -> &SimWorld {
        &self.world
    }

    /// Sleeps `ns` of virtual time (see [`SimWorld::sleep`]).
    pub fn sleep(&self, ns: Nanos) -> Sleep {
        self.world.sleep(ns)
    }
}

impl Fabric for SimFabric {
    fn node_count(&self) -> usize {
        self.world.node_count()
    }

    fn post(&self, node: NodeId, batch: Batch) -> Ticket {
        self.world.state.borrow_mut().post(self.id, node, batch)
    }

    fn poll(&self, ticket: Ticket) -> Poll<Result<Completion, FabricError>> {
        self.world.state.borrow_mut().poll(self.id, ticket)
    }

    fn forget(&self, ticket: Ticket) {
        self.world.state.borrow_mut().forget(self.id, ticket);
    }

    fn progress(&self) -> bool {
        self.world.progress()
    }

    fn now(&self) -> Nanos {
        self.world.now()
    }

    fn wake_at(&self, deadline: Nanos) {
        self.world.wake_at(deadline);
    }
}
