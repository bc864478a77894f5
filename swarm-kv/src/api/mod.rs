//! The application API: a blocking client ([`Kv`]), an async one ([`AsyncKv`]) and
//! their statistics ([`Stats`]), on top of [`crate::KvClient`]. Re-exported at the
//! crate root; the crate docs say how they fit together.

mod blocking;
mod nonblocking;
mod oneshot;
mod stats;

pub use blocking::Kv;
pub use nonblocking::AsyncKv;
pub use stats::Stats;

#[cfg(feature = "rdma")]
impl crate::RdmaStore {
    /// Opens the store on the RDMA memory nodes named by a cluster file (written by
    /// `swarm init --rdma`; it names the nodes, the token file and the device
    /// settings): what [`crate::RdmaStore::open`] does with the configuration the
    /// file describes.
    pub fn open_cluster_file(path: &std::path::Path) -> Result<Self, crate::KvError> {
        let cluster =
            swarm_rdma::config::ClusterConfig::load(path).map_err(crate::KvError::Rdma)?;
        let config =
            swarm_rdma::RdmaConfig::from_cluster(&cluster).map_err(crate::KvError::Rdma)?;
        Self::open(config)
    }
}
