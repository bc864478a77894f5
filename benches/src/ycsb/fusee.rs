//! The FUSEE baseline in the harness: a throw-away FUSEE store sized for one run, on
//! the same shared-memory fabric (and emulated roundtrip time) as SWARM-KV's runs.

use swarm_fusee::{FuseeClient, FuseeConfig, FuseeParams, FuseeStore};
use swarm_shm::{EmulatedFabric, ScratchDir};

use super::config::BenchConfig;
use super::error::BenchError;

/// A FUSEE store in a scratch directory, removed when dropped.
#[derive(Debug)]
pub(crate) struct TempFusee {
    store: FuseeStore,
    _dir: ScratchDir,
}

impl TempFusee {
    /// A store of `nodes` nodes holding `config`'s keys and every object its run
    /// writes (FUSEE objects are not recycled here).
    pub(crate) fn new(config: &BenchConfig, nodes: u16) -> Result<Self, BenchError> {
        let writes = config
            .keys
            .saturating_add(config.warmup_ops)
            .saturating_add(config.ops)
            .saturating_add(config.keys.saturating_mul(config.clients as u64));
        let to_u32 = |n: usize, what: &str| {
            u32::try_from(n)
                .map_err(|_| BenchError::InvalidConfig(format!("{what} too large for FUSEE")))
        };
        let clients = u16::try_from(config.clients)
            .map_err(|_| BenchError::InvalidConfig("too many clients for FUSEE".into()))?;
        let params = FuseeParams::for_workload(
            config.keys,
            writes,
            to_u32(config.key_size, "--key-size")?,
            to_u32(config.value_size, "--value-size")?,
            clients,
        );
        let dir = ScratchDir::new("swarm-fusee").map_err(BenchError::TempDir)?;
        let store = FuseeStore::create(dir.path(), nodes, params)?;
        Ok(Self { store, _dir: dir })
    }

    /// One client per benchmark thread.
    pub(crate) fn connect(
        &self,
        config: &BenchConfig,
    ) -> Result<Vec<FuseeClient<EmulatedFabric>>, BenchError> {
        (0..config.clients)
            .map(|index| {
                self.store
                    .client_with(config.rtt_ns, FuseeConfig::default())
                    .map_err(|e| BenchError::ClientStart {
                        client: index,
                        message: e.to_string(),
                    })
            })
            .collect()
    }
}
