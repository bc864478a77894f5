//! [`SimFabric`]: one simulated client's handle, implementing [`Fabric`].

use core::cell::Cell;
use core::fmt;
use core::task::Poll;

use alloc::rc::Rc;

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
    /// The client's own clock ([`Fabric::now`]), shared by the clones.
    clock: Rc<Cell<ClientClock>>,
}

/// Parts per [`RATE_UNIT`] of real (virtual) time a client clock advances by.
pub const RATE_UNIT: u32 = 1 << 10;

/// A client's fabric clock: `base + (world − world_base) · rate / RATE_UNIT`.
#[derive(Clone, Copy, Debug)]
struct ClientClock {
    world_base: Nanos,
    base: Nanos,
    rate: u32,
}

impl ClientClock {
    fn at(self, world: Nanos) -> Nanos {
        let elapsed = u128::from(world.saturating_sub(self.world_base));
        let scaled = elapsed * u128::from(self.rate) / u128::from(RATE_UNIT);
        self.base
            .saturating_add(u64::try_from(scaled).unwrap_or(u64::MAX))
    }

    /// The first world time at which this clock reads `deadline` or more.
    fn world_time_of(self, deadline: Nanos) -> Nanos {
        let ahead = u128::from(deadline.saturating_sub(self.base));
        let world = (ahead * u128::from(RATE_UNIT)).div_ceil(u128::from(self.rate.max(1)));
        self.world_base
            .saturating_add(u64::try_from(world).unwrap_or(u64::MAX))
    }
}

impl fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFabric").field("id", &self.id).finish()
    }
}

impl SimFabric {
    pub(crate) fn new(world: SimWorld, id: ClientId) -> Self {
        let clock = ClientClock {
            world_base: world.now(),
            base: world.now(),
            rate: RATE_UNIT,
        };
        Self {
            world,
            id,
            clock: Rc::new(Cell::new(clock)),
        }
    }

    /// Makes this client's fabric clock ([`Fabric::now`]: what its fences, leases
    /// and recycling graces are measured on) advance `rate / RATE_UNIT` as fast as
    /// virtual (real) time from now on, for every clone of this handle. SWARM
    /// assumes every clock's rate within 1/8 of real time (`swarm_core::reclaim::
    /// CLOCK_DRIFT_DIV`): rates from `7/8 · RATE_UNIT` to `9/8 · RATE_UNIT` model
    /// it. The clock stays monotonic across a change.
    ///
    /// # Panics
    /// If `rate` is 0.
    pub fn set_clock_rate(&self, rate: u32) {
        assert!(rate > 0, "a clock rate of 0 never advances");
        let world = self.world.now();
        let now = self.clock.get().at(world);
        self.clock.set(ClientClock {
            world_base: world,
            base: now,
            rate,
        });
    }

    /// This client's clock rate, in parts per [`RATE_UNIT`] of virtual time.
    pub fn clock_rate(&self) -> u32 {
        self.clock.get().rate
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

    /// Lost, refused, or fully executed: the simulation knows when nothing of a
    /// batch can land any more, before its completion comes back.
    fn settled(&self, ticket: Ticket) -> bool {
        self.world.state.borrow_mut().settled(self.id, ticket)
    }

    fn progress(&self) -> bool {
        self.world.progress()
    }

    fn now(&self) -> Nanos {
        self.clock.get().at(self.world.now())
    }

    fn wake_at(&self, deadline: Nanos) {
        self.world.wake_at(self.clock.get().world_time_of(deadline));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SimConfig, SimWorld};

    #[test]
    fn a_client_clock_runs_at_its_rate_and_wakes_on_its_own_time() {
        let world = SimWorld::new(1, SimConfig::default());
        let fast = world.client();
        let slow = world.client();
        fast.set_clock_rate(RATE_UNIT * 9 / 8);
        slow.set_clock_rate(RATE_UNIT * 7 / 8);
        let t0 = world.now();
        let (fast0, slow0) = (fast.now(), slow.now());
        world.advance_to(t0 + 8_000);
        assert_eq!(fast.now() - fast0, 9_000);
        assert_eq!(slow.now() - slow0, 7_000);
        assert_eq!(world.now() - t0, 8_000);
        // A deadline on the slow clock is reached at the world time that makes the
        // slow clock read it, not earlier.
        let deadline = slow.now() + 7_000;
        slow.wake_at(deadline);
        while slow.now() < deadline {
            assert!(world.step(), "the wake-up is scheduled");
        }
        assert_eq!(slow.now(), deadline);
        // A change of rate keeps the clock monotonic; clones share the clock.
        let before = fast.now();
        fast.set_clock_rate(RATE_UNIT);
        assert_eq!(fast.clone().now(), before);
        assert_eq!(fast.clone().clock_rate(), RATE_UNIT);
    }
}
