//! The RDMA half of the `swarm` command in a build without the `rdma` feature: every
//! RDMA command parses its arguments as usual and then says how to get a build that
//! has RDMA, instead of failing to link or to start without libibverbs.

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;
use swarm_kv::ClusterParams;

use crate::{ClusterArg, InitArgs};

/// What every RDMA command says in this build.
pub const NO_RDMA: &str = "this `swarm` was built without RDMA support: rebuild it with \
`cargo build --release -p swarm-cli --features rdma`, which needs the rdma-core headers and \
libclang (Debian: apt-get install libibverbs-dev librdmacm-dev libclang-dev pkg-config)";

/// `swarm memnode`'s arguments, taken as they come: this build cannot serve them.
#[derive(Debug, Args)]
pub struct MemnodeArgs {
    /// The memory node's arguments (see a build with the `rdma` feature).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// No RDMA store in this build: [`open`] never returns one.
pub type Store = std::convert::Infallible;

/// Opening an RDMA cluster: refused.
pub fn open(_at: &ClusterArg) -> Result<Store> {
    bail!(NO_RDMA)
}

/// `swarm format`: refused.
pub fn format(_at: &ClusterArg, _params: ClusterParams) -> Result<ExitCode> {
    bail!(NO_RDMA)
}

/// `swarm repair` of an RDMA node: refused.
pub fn repair(
    _at: &ClusterArg,
    _node: u16,
    _options: swarm_kv::admin::RepairOptions,
    _progress: impl FnMut(u64, u64),
) -> Result<swarm_kv::admin::RepairReport> {
    bail!(NO_RDMA)
}

/// `swarm memnode`: refused.
pub fn memnode(_args: &MemnodeArgs) -> Result<ExitCode> {
    bail!(NO_RDMA)
}

/// `swarm init --rdma`: refused.
pub fn init(_args: &InitArgs, _list: &str) -> Result<ExitCode> {
    bail!(NO_RDMA)
}
