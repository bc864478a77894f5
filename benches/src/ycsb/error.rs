//! Why a benchmark could not run.
//!
//! Failures of individual operations are *not* errors of the benchmark: they are
//! counted in the report ([`BenchReport::total_errors`](super::BenchReport::total_errors))
//! and the run goes on, so that one bad operation does not hide the figures of a
//! million good ones. The CLI exits non-zero when any occurred.

use std::io;
use std::path::PathBuf;

use swarm_kv::KvError;
use swarm_kv::admin::ParamsError;

/// Why a benchmark could not be configured or run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A setting is out of range; the message names it and the accepted values.
    #[error("invalid benchmark setting: {0}")]
    InvalidConfig(String),
    /// Keys shorter than YCSB's names.
    #[error(
        "keys of {size} B cannot hold YCSB key names (\"user\" and up to 19 digits): use --key-size {min} or more"
    )]
    KeySizeTooSmall {
        /// The requested key size.
        size: usize,
        /// The smallest accepted.
        min: usize,
    },
    /// Values too short for the tag that makes each of them unique.
    #[error(
        "values of {size} B cannot hold the tag that makes every written value unique (client and operation number): use --value-size {min} or more"
    )]
    ValueSizeTooSmall {
        /// The requested value size.
        size: usize,
        /// The smallest accepted for this run's clients and operation count.
        min: usize,
    },
    /// The cluster cannot hold what the benchmark needs.
    #[error("the cluster is too small for this benchmark: {0}")]
    Capacity(String),
    /// Cluster parameters for a benchmark cluster could not be derived.
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// Creating or opening the cluster failed.
    #[error("cannot set up the benchmark cluster: {0}")]
    Store(#[from] KvError),
    /// Creating the FUSEE baseline's store failed.
    #[error("cannot set up the FUSEE store: {0}")]
    Fusee(#[from] swarm_fusee::FuseeError),
    /// No scratch directory for a temporary cluster could be made.
    #[error(
        "cannot create a scratch directory for the benchmark cluster under /dev/shm or the temporary directory: {0}"
    )]
    TempDir(io::Error),
    /// Writing an output file failed.
    #[error("cannot write the {what} to {path}: {source}")]
    Output {
        /// What was being written (history, report).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Drawing a figure failed.
    #[error("cannot draw the figure {path}: {message}")]
    Plot {
        /// The image file.
        path: PathBuf,
        /// What the plotting library said.
        message: String,
    },
    /// A client thread could not start (registering its writer id, spawning).
    #[error("client {client} could not start: {message}")]
    ClientStart {
        /// The client's index.
        client: usize,
        /// What failed.
        message: String,
    },
    /// A client thread panicked; its measurements are lost.
    #[error("client {client} panicked: {message}")]
    ClientPanicked {
        /// The client's index.
        client: usize,
        /// The panic message.
        message: String,
    },
}
