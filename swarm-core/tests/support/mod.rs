//! Helpers shared by the in-process-fabric tests of log recycling and resume: clients
//! whose grace is a few ticks of `MemFabric`'s logical clock, registers at fixed
//! addresses, and single operations run to their end.
#![allow(dead_code)] // each test binary uses its own subset

use swarm_core::encoding::WriterId;
use swarm_core::layout::Layout;
use swarm_core::{
    Client, Fabric, FixedClock, MemCluster, MemFabric, OpStats, ProtocolConfig, RegisterCache,
    RegisterLoc, Replicas, block_on, block_on_future,
};

/// The grace of [`client`]s (`max_op_ns` 3, `· 9/7` rounded up for drift, no
/// delivery margin), in ticks of the in-process fabric's logical clock.
pub const GRACE: u64 = 4;

/// A client of writer `writer` on `cluster` whose timestamp clock reads `clock`.
pub fn client(
    cluster: &MemCluster,
    layout: Layout,
    writer: u32,
    clock: u64,
) -> Client<MemFabric, FixedClock> {
    let config = ProtocolConfig::default()
        .with_max_op_ns(3)
        .with_delivery_margin_ns(0);
    assert_eq!(config.grace_ns(), GRACE);
    Client::new(
        cluster.client(),
        FixedClock(clock),
        layout,
        WriterId::new(writer).unwrap(),
        config,
    )
    .unwrap()
}

/// Register `i`: 512 bytes apart from 4096, on all three nodes.
pub fn reg(i: u64) -> RegisterLoc {
    RegisterLoc::at(4096 + i * 512, Replicas::all(3, i).unwrap())
}

/// Writes `v` to `r`, to its end.
pub fn write(c: &Client<MemFabric, FixedClock>, r: &RegisterLoc, v: &[u8]) {
    let stats = OpStats::new();
    block_on(c.fabric(), c.write(r, &mut RegisterCache::new(), &stats, v)).unwrap();
}

/// One reclaim step of `c` checking up to `budget` registers, run to its end.
pub fn step(
    c: &Client<MemFabric, FixedClock>,
    budget: usize,
) -> swarm_core::slot_recycling::SlotCounters {
    block_on_future(c.fabric(), c.recycle_slots_step(budget)).unwrap()
}

/// Lets the in-process fabric's logical clock move on by `ticks`.
pub fn pass(c: &Client<MemFabric, FixedClock>, ticks: u64) {
    for _ in 0..ticks {
        c.fabric().progress();
    }
}
