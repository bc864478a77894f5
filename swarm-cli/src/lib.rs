//! What the `swarm` command and the `swarm-memnode` command share: their logging and,
//! with the `rdma` feature, the memory node's command-line arguments.
//!
//! The commands themselves are `src/bin/swarm` (every `swarm` subcommand) and
//! `src/bin/swarm-memnode.rs` (a memory node and its diagnostics, feature `rdma`).
#![warn(missing_docs)]

/// Logs to standard error, filtered by `RUST_LOG` (default: warnings and errors only),
/// e.g. `RUST_LOG=swarm_core=info` to see memory nodes suspected and trusted again, or
/// `RUST_LOG=debug` for slow paths and retries too.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(feature = "rdma")]
pub use memnode::{MemnodeArgs, parse_gid_arg};

#[cfg(feature = "rdma")]
mod memnode {
    use std::path::PathBuf;

    use swarm_rdma::config::parse_gid_choice;
    use swarm_rdma::memnode::MemnodeOptions;
    use swarm_rdma::verbs::gid::GidChoice;

    /// The command-line arguments of a memory node, shared by `swarm memnode` and
    /// `swarm-memnode run`: [`MemnodeOptions`] as flags.
    #[derive(Clone, Debug, clap::Args)]
    pub struct MemnodeArgs {
        /// Address to accept clients on (must be listed in the cluster file).
        #[arg(long)]
        pub listen: String,
        /// Memory to serve, e.g. 4GiB.
        #[arg(long)]
        pub size: String,
        /// RDMA device (default: the first one).
        #[arg(long)]
        pub device: Option<String>,
        /// The cluster file written by `swarm init --rdma` (or `swarm-memnode init`).
        #[arg(long, default_value = MemnodeOptions::DEFAULT_CLUSTER_FILE)]
        pub cluster: PathBuf,
        /// Device port (default: the cluster file's, or 1).
        #[arg(long)]
        pub port: Option<u8>,
        /// GID table index, or `auto` (default: the cluster file's, or auto: the RoCE v2
        /// GID of the --listen address).
        #[arg(long, value_parser = parse_gid_arg)]
        pub gid_index: Option<GidChoice>,
    }

    impl MemnodeArgs {
        /// The library's options these flags give.
        pub fn options(&self) -> MemnodeOptions {
            MemnodeOptions {
                listen: self.listen.clone(),
                size: self.size.clone(),
                device: self.device.clone(),
                cluster: self.cluster.clone(),
                port: self.port,
                gid_index: self.gid_index,
            }
        }
    }

    /// `--gid-index`'s parser.
    pub fn parse_gid_arg(text: &str) -> Result<GidChoice, String> {
        parse_gid_choice(text).map_err(|e| e.to_string())
    }
}
