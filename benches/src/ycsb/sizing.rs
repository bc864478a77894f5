//! How big a cluster a benchmark needs, and whether a given cluster is big enough.
//!
//! Registers are allocated in chunks claimed by each client (two-level allocation,
//! FUSEE §4.4), so a load of `keys` keys by `clients` clients may leave
//! up to one partly used chunk per client: the cluster needs that much slack.
//!
//! Every write also takes an out-of-place log slot of its writer (SWARM §4.3) until
//! it is superseded and a grace period has passed (`swarm_core::slot_recycling`), so each
//! client's log must hold the live values it may own plus a backlog of superseded
//! slots waiting out the grace, not every value it ever writes (see
//! [`log_slots_needed`]).

use swarm_core::encoding::MAX_WRITERS;

use super::config::BenchConfig;
use super::error::BenchError;
use swarm_kv::ClusterParams;
use swarm_kv::admin::{NodeLayout, ParamsError};

/// Writer ids beyond the benchmark's clients (tools attached to the same cluster).
const SPARE_WRITERS: usize = 4;
/// Node sizes are searched in steps of this.
const NODE_BYTES_STEP: u64 = 1 << 20;
/// The largest node the sizing proposes.
const MAX_NODE_BYTES: u64 = 1 << 40;
/// Log slots beyond a client's share of the live keys that a run for a duration
/// needs ([`check_capacity`]): writes in flight, and the share's rounding.
const LIVE_SLACK: u64 = 64;
/// Log slots beyond the estimate of [`log_slots_needed`].
const LOG_SLACK: u64 = 1024;
/// Superseded slots a writer's log should have room for while they wait out the
/// recycling grace. A smaller backlog does not fail writes: a writer whose log is
/// full waits for the oldest one (its write rate is then at most backlog / grace).
const RECYCLING_BACKLOG: u64 = 8192;
/// The backlog a cluster sized for a benchmark ([`cluster_for`]) gets: a writer
/// throttled to [`RECYCLING_BACKLOG`] slots per grace period (about 40 000 writes/s
/// at the default 200 ms operation limit) held YCSB A on shared memory at half its
/// speed (2 clients, 100k keys: 502 kops/s, 971 kops/s with this backlog).
const SIZED_BACKLOG: u64 = 65536;

/// Registers `config` needs in a cluster with chunks of `chunk_registers`: every
/// key (churn: its window of live keys), plus one partly used chunk per client.
pub fn registers_needed(config: &BenchConfig, chunk_registers: u32) -> u64 {
    // Churn loads nothing, but keeps a window of `keys` live keys; the registers of
    // the keys it deleted come back after the recycling grace (`swarm_kv::registers::recycle`).
    config
        .keys
        .saturating_add(config.clients as u64 * u64::from(chunk_registers))
}

/// Out-of-place log slots each writer needs for `config`: the fewer of
///
/// * every value it writes (its share of the load, plus twice its even share of the
///   workload's expected updates — measured operations go to whichever client is
///   free, so shares are uneven), and
/// * what recycling keeps in use at once: the newest value of every key may be this
///   writer's (one live slot per key), plus `RECYCLING_BACKLOG` (8192) superseded slots
///   waiting out the grace,
///
/// plus some slack (logs at most about half full keep picking a free slot by hashing
/// cheap). Keys that can be live at once are `config.keys`, or for the churn workload
/// (a key space larger than the cluster) at most `registers`, one per register.
pub fn log_slots_needed(config: &BenchConfig, registers: u64) -> u64 {
    log_slots_with_backlog(config, registers, RECYCLING_BACKLOG)
}

/// Keys that can be live at once: `config.keys`, or for a workload that loads nothing
/// (churn: its window) at most the registers there are.
fn live_keys(config: &BenchConfig, registers: u64) -> u64 {
    if config.workload.loads_keys() {
        config.keys
    } else {
        config.keys.min(registers)
    }
}

/// [`log_slots_needed`] with room for `backlog` superseded slots.
fn log_slots_with_backlog(config: &BenchConfig, registers: u64, backlog: u64) -> u64 {
    let clients = config.clients.max(1) as u64;
    let load_share = if config.workload.loads_keys() {
        config.keys.div_ceil(clients)
    } else {
        0
    };
    let workload_ops = config.warmup_ops.saturating_add(config.ops) as f64;
    let updates = (workload_ops * (1.0 - config.workload.get_proportion())).ceil() as u64;
    let every_write = load_share.saturating_add(updates.div_ceil(clients).saturating_mul(2));
    let recycled = live_keys(config, registers).saturating_add(backlog);
    every_write.min(recycled).saturating_add(LOG_SLACK)
}

/// Parameters and node size (bytes) of the smallest cluster (to the MiB) that holds
/// `config` with `replicas` replicas per key; pass both to `ShmStore::create`.
pub fn cluster_for(
    config: &BenchConfig,
    replicas: u16,
) -> Result<(ClusterParams, u64), BenchError> {
    config.validate()?;
    let writers = (config.clients + SPARE_WRITERS).min(usize::from(MAX_WRITERS));
    let params = ClusterParams {
        // Validated: key and value sizes are at most 4 KiB and 1 MiB.
        key_max: config.key_size as u32,
        value_max: (config.value_size as u32).max(1),
        writers: writers as u16,
        replicas,
        ..ClusterParams::default()
    };
    let needed = registers_needed(config, params.chunk_registers);
    let slots = log_slots_with_backlog(config, u64::MAX, SIZED_BACKLOG);
    let fits = |bytes: u64| match params.for_node_size(bytes) {
        Ok(sized) => Ok(sized.registers >= needed && u64::from(sized.log_slots) >= slots),
        Err(ParamsError::TooSmall { .. }) => Ok(false),
        Err(other) => Err(BenchError::from(other)),
    };
    // Double until it fits, then bisect back down to the step.
    let mut high = 16 * NODE_BYTES_STEP;
    while !fits(high)? {
        high = high
            .checked_mul(2)
            .filter(|&b| b <= MAX_NODE_BYTES)
            .ok_or_else(|| {
                BenchError::Capacity(format!(
                    "{} keys of {} B with {} B values and {slots} log slots per client need \
                     more than {MAX_NODE_BYTES} B per node",
                    config.keys, config.key_size, config.value_size
                ))
            })?;
    }
    let mut low = high / 2;
    while high - low > NODE_BYTES_STEP {
        let mid = (low + high) / 2 / NODE_BYTES_STEP * NODE_BYTES_STEP;
        if fits(mid)? {
            high = mid;
        } else {
            low = mid;
        }
    }
    Ok((params, high))
}

/// Registers of `layout` outside the `claimed_chunks` chunks earlier clients claimed.
pub fn unclaimed_registers(layout: &NodeLayout, claimed_chunks: u64) -> u64 {
    let p = &layout.params;
    p.registers
        .saturating_sub(claimed_chunks.saturating_mul(u64::from(p.chunk_registers)))
}

/// Checks that the cluster laid out as `layout`, where earlier clients claimed
/// `claimed_chunks` register chunks and left `reclaimable` registers in them that a
/// client running out takes back (their pools and retired registers,
/// `swarm_kv::registers::limbo`), can run `config`; the error says what is missing and how to get
/// a cluster that has it.
pub fn check_capacity(
    layout: &NodeLayout,
    claimed_chunks: u64,
    reclaimable: u64,
    config: &BenchConfig,
) -> Result<(), BenchError> {
    let p = &layout.params;
    let fix = "create the cluster with larger limits (`swarm init`)";
    if (p.key_max as usize) < config.key_size {
        return Err(BenchError::Capacity(format!(
            "keys of {} B exceed its key limit of {} B: lower --key-size or {fix}",
            config.key_size, p.key_max
        )));
    }
    if (p.value_max as usize) < config.value_size {
        return Err(BenchError::Capacity(format!(
            "values of {} B exceed its value limit of {} B: lower --value-size or {fix}",
            config.value_size, p.value_max
        )));
    }
    if usize::from(p.writers) < config.clients {
        return Err(BenchError::Capacity(format!(
            "{} clients need as many writer ids but it has {}: lower --clients or {fix}",
            config.clients, p.writers
        )));
    }
    let needed = registers_needed(config, p.chunk_registers);
    let free = unclaimed_registers(layout, claimed_chunks);
    if free.saturating_add(reclaimable) < needed {
        return Err(BenchError::Capacity(format!(
            "{} keys loaded by {} clients need {needed} registers but it has {free} free \
             of {} and {reclaimable} reclaimable ({claimed_chunks} chunks of {} claimed by \
             earlier clients, holding keys or retired registers still in a live client's \
             hands): lower --keys or create a larger cluster (`swarm init --size`) in a \
             fresh directory",
            config.keys, config.clients, p.registers, p.chunk_registers
        )));
    }
    // A run for a duration writes without bound: its backlog of superseded slots is
    // throttled (a full log waits for its oldest slot), but the live values are not.
    // Each client holds at least its share of them, which no waiting frees.
    if config.ops == u64::MAX {
        let share = live_keys(config, p.registers)
            .div_ceil(config.clients.max(1) as u64)
            .saturating_add(LIVE_SLACK);
        if u64::from(p.log_slots) < share {
            return Err(BenchError::Capacity(format!(
                "each client holds the live values of about {share} keys (its share of \
                 --keys, and a few in flight) in its out-of-place log, which holds {}: \
                 lower --keys, run more --clients, or create the cluster with more memory \
                 per node, smaller values or fewer writers (`swarm init --size`, \
                 `--value-max`, `--writers`) so each log holds more",
                p.log_slots
            )));
        }
    }
    let slots = log_slots_needed(config, p.registers);
    if config.ops != u64::MAX && u64::from(p.log_slots) < slots {
        return Err(BenchError::Capacity(format!(
            "each client may need about {slots} log slots at once (the live value of \
             every key, plus superseded slots waiting to be recycled) but a writer's \
             out-of-place log holds {}: lower --keys, or create the cluster with more \
             memory per node, smaller values or fewer writers (`swarm init --size`, \
             `--value-max`, `--writers`) so each log holds more",
            p.log_slots
        )));
    }
    if usize::from(p.replicas) < 3 && config.fail.is_some() {
        return Err(BenchError::Capacity(format!(
            "--fail-node needs keys replicated at least 3 times to survive a crash; it has {}",
            p.replicas
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ycsb::config::System;
    use crate::ycsb::workload::Workload;

    #[test]
    fn sized_cluster_holds_the_benchmark_and_is_tight() {
        for (keys, clients, value_size, workload) in [
            (10, 1, 64, Workload::B),
            (10_000, 4, 64, Workload::A),
            (100_000, 16, 1024, Workload::B),
        ] {
            let mut config = BenchConfig::new(System::Swarm, workload);
            config.keys = keys;
            config.clients = clients;
            config.value_size = value_size;
            let (params, bytes) = cluster_for(&config, 3).unwrap();
            let sized = params.for_node_size(bytes).unwrap();
            let layout = NodeLayout::new(sized).unwrap();
            check_capacity(&layout, 0, 0, &config).unwrap();
            let slots = log_slots_with_backlog(&config, u64::MAX, SIZED_BACKLOG);
            assert!(u64::from(sized.log_slots) >= slots);
            assert!(layout.end() <= bytes);
            // One step less would not fit (or is below the search's floor).
            let smaller = params.for_node_size(bytes - NODE_BYTES_STEP);
            assert!(
                bytes <= 16 * NODE_BYTES_STEP
                    || smaller.is_err()
                    || smaller.as_ref().unwrap().registers
                        < registers_needed(&config, params.chunk_registers)
                    || u64::from(smaller.unwrap().log_slots) < slots,
                "{keys} keys: {bytes} B is not the smallest"
            );
        }
    }

    #[test]
    fn log_estimate_covers_each_clients_writes() {
        let mut config = BenchConfig::new(System::Swarm, Workload::A);
        config.keys = 1000;
        config.ops = 10_000;
        config.clients = 4;
        // 250 inserts, then twice an even share of 5 000 updates, plus slack.
        assert_eq!(
            log_slots_needed(&config, u64::MAX),
            250 + 2 * 1250 + LOG_SLACK
        );
        config.workload = Workload::C;
        assert_eq!(log_slots_needed(&config, u64::MAX), 250 + LOG_SLACK);
        // Far more writes than the log: recycling keeps live values and a backlog.
        config.workload = Workload::A;
        config.ops = 5_000_000;
        assert_eq!(
            log_slots_needed(&config, u64::MAX),
            1000 + RECYCLING_BACKLOG + LOG_SLACK
        );
    }

    #[test]
    fn registers_claimed_by_earlier_clients_are_free_only_if_reclaimable() {
        let mut config = BenchConfig::new(System::Swarm, Workload::B);
        config.keys = 1000;
        config.clients = 2;
        let (params, bytes) = cluster_for(&config, 3).unwrap();
        let layout = NodeLayout::new(params.for_node_size(bytes).unwrap()).unwrap();
        check_capacity(&layout, 0, 0, &config).unwrap();
        // Earlier runs claimed every chunk: the same run no longer fits...
        let err = check_capacity(&layout, layout.chunks(), 0, &config)
            .unwrap_err()
            .to_string();
        assert!(err.contains("0 free") && err.contains("claimed"), "{err}");
        // ... unless they left enough behind that a client running out takes back.
        let needed = registers_needed(&config, params.chunk_registers);
        check_capacity(&layout, layout.chunks(), needed, &config).unwrap();
        assert!(check_capacity(&layout, layout.chunks(), needed - 1, &config).is_err());
    }

    #[test]
    fn capacity_errors_name_the_fix() {
        let config = BenchConfig::new(System::Swarm, Workload::B);
        let small = ClusterParams::default().for_node_size(64 << 20).unwrap();
        let layout = NodeLayout::new(small).unwrap();
        let err = check_capacity(&layout, 0, 0, &config)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--keys") && err.contains("swarm init"),
            "{err}"
        );
        let mut tiny_keys = config.clone();
        tiny_keys.keys = 10;
        tiny_keys.key_size = 200;
        let err = check_capacity(&layout, 0, 0, &tiny_keys)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--key-size"), "{err}");
        let mut many = config.clone();
        many.keys = 10;
        many.clients = 100;
        let err = check_capacity(&layout, 0, 0, &many)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--clients"), "{err}");
        // Writes far beyond the logs fit: slots are recycled (`swarm init --size
        // 64MiB --value-max 64 --writers 4`: about 47 000 slots per writer).
        let four = ClusterParams {
            value_max: 64,
            writers: 4,
            ..ClusterParams::default()
        };
        let four = NodeLayout::new(four.for_node_size(64 << 20).unwrap()).unwrap();
        let mut long = config.clone();
        long.keys = 1000;
        long.clients = 2;
        long.workload = Workload::A;
        long.ops = 100_000_000;
        assert!(u64::from(four.params.log_slots) < long.ops / 100);
        check_capacity(&four, 0, 0, &long).unwrap();
        // Live data (plus the backlog) beyond the logs does not.
        let mut wide = long.clone();
        wide.keys = 40_000;
        assert!(wide.keys + RECYCLING_BACKLOG > u64::from(four.params.log_slots));
        let err = check_capacity(&four, 0, 0, &wide).unwrap_err().to_string();
        assert!(err.contains("log slots") && err.contains("--keys"), "{err}");
        // A run for a duration: the live values must fit, the backlog need not (the
        // defaults at 64 MiB: 582 slots per writer).
        let defaults =
            NodeLayout::new(ClusterParams::default().for_node_size(64 << 20).unwrap()).unwrap();
        let slots = u64::from(defaults.params.log_slots);
        let mut churn = config.clone();
        churn.workload = Workload::Churn;
        churn.ops = u64::MAX;
        churn.clients = 2;
        churn.keys = 2000;
        assert!(churn.keys / 2 > slots);
        let err = check_capacity(&defaults, 0, 0, &churn)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("out-of-place log") && err.contains("--keys"),
            "{err}"
        );
        churn.keys = 2 * (slots - LIVE_SLACK);
        check_capacity(&defaults, 0, 0, &churn).unwrap();
    }
}
