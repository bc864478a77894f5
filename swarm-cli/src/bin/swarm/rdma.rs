//! The RDMA half of the `swarm` command (feature `rdma`): cluster files and tokens,
//! `swarm format`, `swarm memnode`, and opening a store over RDMA memory nodes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use swarm_kv::ClusterParams;
use swarm_kv::RdmaStore;
use swarm_rdma::auth::Token;
use swarm_rdma::config::{ClusterConfig, PathConfig, parse_gid_choice, parse_nodes};
use swarm_rdma::{RdmaConfig, memnode};

use crate::{ClusterArg, InitArgs};

/// `swarm memnode`'s arguments.
pub type MemnodeArgs = swarm_cli::MemnodeArgs;

/// The store an RDMA target names.
pub type Store = RdmaStore;

/// The RDMA configuration `--rdma LIST --token FILE` or `--cluster FILE` gives, if any.
fn config(at: &ClusterArg) -> Result<Option<RdmaConfig>> {
    let mut config = match (&at.target.rdma, &at.target.cluster) {
        (Some(list), _) => {
            let nodes = parse_nodes(list)?;
            let token = Token::load(&at.token)
                .with_context(|| format!("cannot load the cluster token {}", at.token.display()))?;
            RdmaConfig::new(nodes, token)
        }
        (None, Some(file)) => {
            let cluster = ClusterConfig::load(file)
                .with_context(|| format!("cannot load the cluster file {}", file.display()))?;
            RdmaConfig::from_cluster(&cluster)?
        }
        (None, None) => return Ok(None),
    };
    config.device = at.device.clone();
    let gid = at.gid_index.as_deref().map(parse_gid_choice).transpose()?;
    config.path = config.path.overridden_by(at.port, gid);
    Ok(Some(config))
}

/// Opens the cluster `--rdma`/`--cluster` names.
pub fn open(at: &ClusterArg) -> Result<Store> {
    let config = config(at)?.context("give --dir, --rdma or --cluster")?;
    RdmaStore::open(config).context("cannot open the SWARM-KV cluster over RDMA")
}

/// `swarm repair` of an RDMA memory node.
pub fn repair(
    at: &ClusterArg,
    node: u16,
    options: swarm_kv::admin::RepairOptions,
    progress: impl FnMut(u64, u64),
) -> Result<swarm_kv::admin::RepairReport> {
    let config = config(at)?.context("give --dir, --rdma or --cluster")?;
    RdmaStore::repair(config, node, options, progress)
        .with_context(|| format!("cannot repair memory node {node}"))
}

/// `swarm format`: writes the superblock on freshly started memory nodes.
pub fn format(at: &ClusterArg, params: ClusterParams) -> Result<ExitCode> {
    let config = config(at)?
        .context("`swarm format` formats RDMA memory nodes: give --rdma or --cluster")?;
    let store = RdmaStore::format(config, params).context("cannot format the RDMA memory nodes")?;
    let params = swarm_kv::Store::layout(&store).params;
    println!(
        "formatted: room for {} keys; writes land within {} (the queue pairs' retry window), \
         so superseded log slots are reused {} after they stop being the newest",
        params.registers,
        swarm_benches::duration::format_ns(params.delivery_margin_ns),
        swarm_benches::duration::format_ns(params.slot_grace_ns()),
    );
    Ok(ExitCode::SUCCESS)
}

/// `swarm memnode`: serves one memory node until stopped.
pub fn memnode(args: &MemnodeArgs) -> Result<ExitCode> {
    memnode::serve(&args.options())?;
    Ok(ExitCode::SUCCESS)
}

/// `swarm init --rdma LIST`: writes the cluster file and a fresh token (both 0600).
pub fn init(args: &InitArgs, list: &str) -> Result<ExitCode> {
    let nodes = parse_nodes(list)?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let token = Token::generate()?;
    let token_path = args.dir.join("swarm.token");
    token
        .write(&token_path, args.force)
        .with_context(|| format!("use --force to replace {}", token_path.display()))?;
    let random = swarm_rdma::auth::random_nonce()?;
    let mut id = [0u8; 8];
    id.copy_from_slice(&random[..8]);
    let config = ClusterConfig {
        nodes,
        cluster_id: u64::from_le_bytes(id),
        epoch_unix_ns: swarm_kv::SystemClock::unix_ns(),
        tick_ns: args.tick_ns,
        // Relative: resolved against the cluster file's directory on load.
        token_file: PathBuf::from("swarm.token"),
        path: PathConfig::default(),
    };
    let conf_path = args.dir.join("swarm-cluster.conf");
    write_private(&conf_path, config.render().as_bytes(), args.force)?;
    println!(
        "wrote {} and {} (token fingerprint {}); start `swarm memnode` on every node",
        conf_path.display(),
        token_path.display(),
        token.fingerprint()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes a private (0600) file; refuses to replace one unless `overwrite`. A replaced
/// file gets mode 0600 too (opening an existing file keeps its old mode).
fn write_private(path: &Path, bytes: &[u8], overwrite: bool) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(0o600);
    if overwrite {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = options.open(path).with_context(|| {
        format!(
            "cannot write {} (use --force to replace it)",
            path.display()
        )
    })?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(bytes)?;
    Ok(())
}
