//! What can go wrong when creating or opening a shared-memory cluster.

use std::io;
use std::path::PathBuf;

use swarm_core::header::HeaderError;

/// Errors of [`crate::ShmCluster::create`] and [`crate::ShmCluster::open`].
///
/// Messages are self-contained: they include the underlying error and say what to
/// do, so the underlying error is a field of the variant rather than a
/// [`std::error::Error::source`] (which would print it twice).
///
/// Operations on an opened cluster report [`swarm_core::FabricError`]s instead.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A file system call on `path` failed.
    #[error("{op} {path}: {error}", path = path.display())]
    Io {
        /// What was being done ("cannot open", "cannot map", ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        error: io::Error,
    },
    /// A node file's header is missing, corrupted or of another format.
    #[error(
        "{path} is not a usable memory node: {error}; recreate the cluster or point at the right directory",
        path = path.display()
    )]
    Header {
        /// The node file.
        path: PathBuf,
        /// Why its header was refused.
        error: HeaderError,
    },
    /// A node file is shorter than a header or than the size its header records:
    /// mapping it would fault (`SIGBUS`) on the missing pages.
    #[error(
        "memory node file {path} is truncated to {len} bytes, shorter than its header or than the size it records: restore it or recreate the cluster",
        path = path.display()
    )]
    Truncated {
        /// The node file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// A node file's memory was declared lost (its header's retired word is set: it
    /// was crashed on purpose or replaced, `ShmCluster::retire_node`).
    #[error(
        "memory node file {path} was retired (its memory is declared lost): replace and repair it (`swarm repair`)",
        path = path.display()
    )]
    Retired {
        /// The node file.
        path: PathBuf,
        /// The incarnation of the memory it held.
        incarnation: u64,
    },
    /// The directory holds no cluster (no `node-0.swarm`).
    #[error(
        "{dir} holds no SWARM cluster (no {first}): create one first (e.g. `cargo run -p swarm-shm --example swarm-shm-demo -- --dir {dir} --keep`)",
        dir = dir.display(),
        first = crate::node_file_name(0)
    )]
    NotACluster {
        /// The directory given.
        dir: PathBuf,
    },
    /// Too few node files are usable: a cluster serves with a majority of its nodes.
    /// A layer above left a node out (its contents are unusable: say, its SWARM-KV
    /// superblock is missing after the file was recreated).
    #[error("{reason}")]
    LeftOut {
        /// Why.
        reason: String,
    },
    #[error(
        "only {usable} of the {nodes} memory nodes in {dir} are usable, and a majority is needed: {problems}",
        dir = dir.display()
    )]
    NoMajority {
        /// The cluster directory.
        dir: PathBuf,
        /// Nodes that could be opened and agree.
        usable: usize,
        /// The cluster's node count.
        nodes: u16,
        /// Each unusable node and why.
        problems: String,
    },
    /// A node file of the cluster is missing.
    #[error(
        "memory node file {path} is missing (the cluster has {nodes} nodes): restore it or recreate the cluster",
        path = path.display()
    )]
    MissingNode {
        /// The missing file.
        path: PathBuf,
        /// The node count recorded in the headers.
        nodes: u16,
    },
    /// A node file does not belong with the others, or its size does not match its
    /// header.
    #[error(
        "{path} does not belong to this cluster: {reason}; recreate the cluster or remove stray files",
        path = path.display()
    )]
    Mismatch {
        /// The offending file.
        path: PathBuf,
        /// What disagrees.
        reason: String,
    },
    /// `create` found an existing cluster and was not allowed to replace it.
    #[error(
        "{dir} already holds a SWARM cluster: open it, remove its node files, or create with overwrite",
        dir = dir.display()
    )]
    AlreadyExists {
        /// The directory given.
        dir: PathBuf,
    },
    /// The parameters given to `create` cannot describe a cluster.
    #[error("invalid cluster parameters: {0}")]
    InvalidConfig(String),
    /// The system clock reads before 1970, so no cluster epoch can be recorded.
    #[error("the system clock reads before the Unix epoch: fix the clock, then create the cluster")]
    Clock,
}

impl ShmError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |error| Self::Io { op, path, error }
    }
}
