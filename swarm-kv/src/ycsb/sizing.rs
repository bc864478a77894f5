//! How big a cluster a benchmark needs, and whether a given cluster is big enough.
//!
//! Registers are allocated in chunks claimed by each client (two-level allocation,
//! FUSEE §4.4, DESIGN.md §5), so a load of `keys` keys by `clients` clients may leave
//! up to one partly used chunk per client: the cluster needs that much slack.

use swarm_core::encoding::MAX_WRITERS;

use super::config::BenchConfig;
use super::error::BenchError;
use crate::layout::{ClusterParams, NodeLayout, ParamsError};

/// Writer ids beyond the benchmark's clients (tools attached to the same cluster).
const SPARE_WRITERS: usize = 4;
/// Node sizes are searched in steps of this.
const NODE_BYTES_STEP: u64 = 1 << 20;
/// The largest node the sizing proposes.
const MAX_NODE_BYTES: u64 = 1 << 40;

/// Registers `config` needs in a cluster with chunks of `chunk_registers`: every
/// key, plus one partly used chunk per client.
pub fn registers_needed(config: &BenchConfig, chunk_registers: u32) -> u64 {
    config
        .keys
        .saturating_add(config.clients as u64 * u64::from(chunk_registers))
}

/// Parameters and node size (bytes) of the smallest cluster (to the MiB) that holds
/// `config` with `replicas` replicas per key; pass both to `KvStore::create`.
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
    let fits = |bytes: u64| match params.for_node_size(bytes) {
        Ok(sized) => Ok(sized.registers >= needed),
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
                    "{} keys of {} B with {} B values need more than {MAX_NODE_BYTES} B per node",
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

/// Checks that the cluster laid out as `layout` can run `config`; the error says what
/// is missing and how to get a cluster that has it.
pub fn check_capacity(layout: &NodeLayout, config: &BenchConfig) -> Result<(), BenchError> {
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
    if p.registers < needed {
        return Err(BenchError::Capacity(format!(
            "{} keys loaded by {} clients need {needed} registers but it has {} \
             (and memory is not recycled yet): lower --keys or create a larger cluster \
             (`swarm init --size`) in a fresh directory",
            config.keys, config.clients, p.registers
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
        for (keys, clients, value_size) in [(10, 1, 64), (10_000, 4, 64), (100_000, 16, 1024)] {
            let mut config = BenchConfig::new(System::Swarm, Workload::B);
            config.keys = keys;
            config.clients = clients;
            config.value_size = value_size;
            let (params, bytes) = cluster_for(&config, 3).unwrap();
            let sized = params.for_node_size(bytes).unwrap();
            let layout = NodeLayout::new(sized).unwrap();
            check_capacity(&layout, &config).unwrap();
            assert!(layout.end() <= bytes);
            // One step less would not fit (or is below the search's floor).
            let smaller = params.for_node_size(bytes - NODE_BYTES_STEP);
            assert!(
                bytes <= 16 * NODE_BYTES_STEP
                    || smaller.is_err()
                    || smaller.unwrap().registers
                        < registers_needed(&config, params.chunk_registers),
                "{keys} keys: {bytes} B is not the smallest"
            );
        }
    }

    #[test]
    fn capacity_errors_name_the_fix() {
        let config = BenchConfig::new(System::Swarm, Workload::B);
        let small = ClusterParams::default().for_node_size(64 << 20).unwrap();
        let layout = NodeLayout::new(small).unwrap();
        let err = check_capacity(&layout, &config).unwrap_err().to_string();
        assert!(
            err.contains("--keys") && err.contains("swarm init"),
            "{err}"
        );
        let mut tiny_keys = config.clone();
        tiny_keys.keys = 10;
        tiny_keys.key_size = 200;
        let err = check_capacity(&layout, &tiny_keys).unwrap_err().to_string();
        assert!(err.contains("--key-size"), "{err}");
        let mut many = config.clone();
        many.keys = 10;
        many.clients = 100;
        let err = check_capacity(&layout, &many).unwrap_err().to_string();
        assert!(err.contains("--clients"), "{err}");
    }
}
