//! `swarm`: create, use, inspect and benchmark SWARM-KV clusters.
//!
//! ```text
//! swarm init --dir /dev/shm/kv --nodes 3 --size 1GiB      # a shared-memory cluster
//! swarm put --dir /dev/shm/kv user42 hello
//! swarm put --dir /dev/shm/kv photo - < photo.jpg        # the value from standard input
//! swarm get --dir /dev/shm/kv user42
//! swarm get --dir /dev/shm/kv --raw photo > copy.jpg     # the bytes exactly, no newline
//! swarm get --dir /dev/shm/kv --json user42              # {"key": ..., "found": ..., ...}
//! swarm delete --dir /dev/shm/kv user42
//! swarm stat --dir /dev/shm/kv
//! swarm bench --dir /dev/shm/kv --workload b --keys 100000 --ops 1000000 --clients 4
//! swarm check history.jsonl
//! swarm init --rdma 10.0.0.1:7471,10.0.0.2:7471,10.0.0.3:7471 --dir cluster   # RDMA
//! swarm memnode --listen 10.0.0.1:7471 --size 4GiB --cluster cluster/swarm-cluster.conf
//! ```
//!
//! The RDMA commands need a build with the `rdma` feature (module `rdma`); without it
//! they parse their arguments and say how to get one (module `no_rdma`).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use swarm_benches::ycsb::{BenchConfig, BenchError, BenchReport};
use swarm_core::{Batch, Fabric, NodeId, OpStats, Roundtrip, block_on};
use swarm_kv::admin::{self, Eviction, RepairOptions, WriterRow};
use swarm_kv::{ClusterParams, DeleteOutcome, ShmStore, Store, SystemClock};

#[cfg_attr(not(feature = "rdma"), path = "no_rdma.rs")]
mod rdma;

/// SWARM-KV: a replicated key-value store on disaggregated memory.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a cluster: shared-memory node files (--dir with --nodes/--size), or the
    /// cluster file and token of an RDMA cluster (--rdma).
    Init(InitArgs),
    /// Insert or update a key.
    Put {
        #[command(flatten)]
        at: ClusterArg,
        /// The key (its bytes, as given).
        key: OsString,
        /// The value (its bytes, as given), or `-` to read it from standard input
        /// (binary-safe; to store a lone `-`, pipe it in).
        value: OsString,
    },
    /// Print a key's value and a newline (exit status 1 if it is absent).
    Get {
        #[command(flatten)]
        at: ClusterArg,
        /// The key.
        key: OsString,
        /// Write the value's bytes exactly, without the newline.
        #[arg(long, conflicts_with = "json")]
        raw: bool,
        /// Print one JSON object: `key`, `found`, `value` (the text if the value is
        /// UTF-8, else its base64; null if absent) and `value_encoding` (`utf-8`,
        /// `base64`, or null); `key` and `key_encoding` likewise.
        #[arg(long)]
        json: bool,
    },
    /// Delete a key (exit status 1 if it is absent).
    Delete {
        #[command(flatten)]
        at: ClusterArg,
        /// The key.
        key: OsString,
    },
    /// Show keys, memory used per node, and writers.
    Stat {
        #[command(flatten)]
        at: ClusterArg,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Give back the writer id of a client that died, so that a new client can use it
    /// (clients also take over expired ids by themselves when none is free; see
    /// `swarm stat` for ids and leases). Watches the lease for a lease period first
    /// and refuses if the client renewed it.
    Evict {
        #[command(flatten)]
        at: ClusterArg,
        /// The writer id to give back.
        #[arg(long)]
        writer: u16,
        /// Evict even a live client: its lease is killed at once (it stops at its next
        /// operation with a lease error), and the id is given back once the longest
        /// lease it may still believe in has passed.
        #[arg(long)]
        force: bool,
    },
    /// Bring lagging copies of the index up to date: after a memory node was down or
    /// slow, its copies of index slots miss the updates it did not see. Safe while
    /// clients run; run it after a node comes back, or periodically.
    Scrub {
        #[command(flatten)]
        at: ClusterArg,
        /// Keep scrubbing, a pass every this many seconds (a background scrubber);
        /// default: one pass.
        #[arg(long)]
        every: Option<f64>,
        /// With --every, stop after this many passes (default: run until stopped).
        #[arg(long, requires = "every")]
        passes: Option<u64>,
    },
    /// Rebuild a memory node that lost its memory (a node file missing, corrupted or
    /// re-created; an RDMA memory node restarted) from the other nodes, while clients
    /// keep running, and put it back in service: running clients start using it
    /// within a lease renewal period. Every other node must answer.
    Repair {
        #[command(flatten)]
        at: ClusterArg,
        /// The node to rebuild.
        #[arg(long)]
        node: u16,
        /// Rebuild it even if it serves (its memory is discarded first): for a node
        /// that fell too far behind.
        #[arg(long)]
        replace: bool,
        /// Take the repair lock even if another repair holds it and this host cannot
        /// tell that it is gone (RDMA: it may run on another host). Only once that
        /// repair is gone (killed, its host down): if it still runs, its late writes
        /// can undo this repair's.
        #[arg(long)]
        break_lock: bool,
    },
    /// Add a memory node to a shared-memory cluster while clients keep running: a
    /// new node file, chunks no client holds moved onto it (a replica each), and a
    /// configuration change that lists it; running clients start using it within a
    /// lease renewal period. Every node of the metadata group must answer.
    AddNode {
        /// The cluster directory.
        #[arg(long)]
        dir: PathBuf,
        /// Move at most this many chunks onto the new node (default: its fair share
        /// of the cluster's chunk replicas).
        #[arg(long)]
        chunks: Option<u64>,
        /// Required: this build cannot repair a cluster a node was added to (`swarm
        /// repair` refuses a cluster with placement records), so a node it loses
        /// afterwards stays out of service.
        #[arg(long)]
        accept_no_repair: bool,
    },
    /// Write the SWARM-KV superblock on freshly started RDMA memory nodes.
    Format {
        #[command(flatten)]
        at: ClusterArg,
        #[command(flatten)]
        params: ParamArgs,
    },
    /// Run a YCSB workload on a cluster (shared memory: --dir; RDMA: --cluster or
    /// --rdma) and report throughput, latency percentiles and roundtrips per
    /// operation type.
    Bench {
        #[command(flatten)]
        at: ClusterArg,
        #[command(flatten)]
        args: swarm_benches::ycsb::BenchArgs,
    },
    /// Draw the figures of saved reports (`swarm bench --json`, one report or an
    /// array each), e.g. several systems run one after the other, in one set of figures.
    Plot {
        /// Directory the figures are written to.
        #[arg(long)]
        out: PathBuf,
        /// Report files.
        #[arg(required = true)]
        reports: Vec<PathBuf>,
    },
    /// Check a history file (JSON Lines) for linearizability.
    Check {
        /// The history file (`-` for standard input).
        file: PathBuf,
    },
    /// Run an RDMA memory node: register memory, serve clients, stay passive.
    Memnode(rdma::MemnodeArgs),
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct Target {
    /// Directory of a shared-memory cluster.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// RDMA memory nodes HOST:PORT,... in node-id order (with --token).
    #[arg(long)]
    rdma: Option<String>,
    /// The cluster file of an RDMA cluster (written by `swarm init --rdma`).
    #[arg(long)]
    cluster: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ClusterArg {
    #[command(flatten)]
    target: Target,
    /// The token file of an RDMA cluster given with --rdma.
    #[arg(long, default_value = "swarm.token")]
    token: PathBuf,
    /// RDMA device (default: the first one).
    #[arg(long)]
    device: Option<String>,
    /// RDMA device port (default: the cluster file's, or 1).
    #[arg(long)]
    port: Option<u8>,
    /// RDMA GID table index, or `auto` (default: the cluster file's, or auto: the
    /// RoCE v2 GID of the local address that reaches each memory node).
    #[arg(long)]
    gid_index: Option<String>,
}

#[derive(Debug, Args)]
struct InitArgs {
    /// Directory for the node files (shared memory), or for the cluster file and token
    /// (with --rdma).
    #[arg(long)]
    dir: PathBuf,
    /// RDMA memory nodes HOST:PORT,... in node-id order: write an RDMA cluster file.
    #[arg(long)]
    rdma: Option<String>,
    /// Number of memory nodes (shared memory).
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// Bytes per memory node, e.g. 1GiB (shared memory).
    #[arg(long, default_value = "1GiB")]
    size: String,
    /// Timestamp tick in ns (at least 36 for a five-year horizon).
    #[arg(long, default_value_t = swarm_core::encoding::DEFAULT_TICK_NS)]
    tick_ns: u64,
    /// Replace an existing cluster in --dir.
    #[arg(long)]
    force: bool,
    /// Keep room to grow to this many nodes by `swarm add-node` (shared memory;
    /// default: twice --nodes, at most 64): the index and the chunk and placement
    /// tables get room for the keys of the added nodes, taken from the logs' share.
    /// --max-nodes equal to --nodes keeps no room.
    #[arg(long)]
    max_nodes: Option<u16>,
    #[command(flatten)]
    params: ParamArgs,
}

#[derive(Debug, Args)]
struct ParamArgs {
    /// Replicas per key (2f+1, odd, at most the number of nodes).
    #[arg(long, default_value_t = 3)]
    replicas: u16,
    /// Largest value, e.g. 1KiB.
    #[arg(long, default_value = "1KiB")]
    value_max: String,
    /// Longest key, bytes.
    #[arg(long, default_value_t = 128)]
    key_max: u32,
    /// Metadata words per register (W, SWARM §4.4); use at least the number of
    /// concurrent writers of a hot key for one-roundtrip writes under contention.
    #[arg(long, default_value_t = 8)]
    meta_words: u16,
    /// Writer ids (client threads) the cluster has room for.
    #[arg(long, default_value_t = 64)]
    writers: u16,
    /// Client lease duration, e.g. 2s: a client that stops renewing is presumed dead,
    /// and its writer id reclaimed, about 9/8 of this plus the reclamation grace later.
    #[arg(long, default_value = "2s")]
    lease: String,
    /// Lease renewal period, e.g. 250ms (less than half the lease).
    #[arg(long, default_value = "250ms")]
    lease_renew: String,
    /// Operation deadline, e.g. 200ms: an operation never posts a batch later than this
    /// after it started (it fails instead), so that memory it may reference can be
    /// recycled; with the renewal period, it must fit in 7/8 of the lease.
    #[arg(long, default_value = "200ms")]
    max_op: String,
    /// How long a client uses a cached key location after the index vouched for it,
    /// e.g. 10s, before asking the index again (a freshness bound: a deleted key's
    /// register is reused about --max-op later, whatever the cached locations).
    #[arg(long, default_value = "10s")]
    cache_ttl: String,
    /// How late after its post a write may still land on a memory node, e.g. 10ms:
    /// recycled memory waits this on top of --max-op. `swarm format` raises it to
    /// the RDMA queue pairs' retry window (≈ 547 ms with the default ack timeout).
    #[arg(long, default_value = "10ms")]
    delivery_margin: String,
}

impl ParamArgs {
    fn params(&self) -> Result<ClusterParams> {
        Ok(ClusterParams {
            key_max: self.key_max,
            value_max: u32::try_from(parse_size(&self.value_max)?)
                .context("--value-max is too large")?,
            meta_words: self.meta_words,
            writers: self.writers,
            replicas: self.replicas,
            lease_ns: parse_duration(&self.lease, "--lease")?,
            lease_renew_ns: parse_duration(&self.lease_renew, "--lease-renew")?,
            max_op_ns: parse_duration(&self.max_op, "--max-op")?,
            cache_ttl_ns: parse_duration(&self.cache_ttl, "--cache-ttl")?,
            delivery_margin_ns: parse_duration(&self.delivery_margin, "--delivery-margin")?,
            ..ClusterParams::default()
        })
    }
}

fn parse_size(text: &str) -> Result<u64> {
    swarm_core::units::parse_size(text).with_context(|| {
        format!("invalid size {text:?}: use e.g. 64MiB, 1GiB or a number of bytes")
    })
}

fn parse_duration(text: &str, flag: &str) -> Result<u64> {
    swarm_benches::duration::parse_duration_ns(text).with_context(|| flag.to_string())
}

fn main() -> ExitCode {
    swarm_cli::init_logging();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `$body` with `$store` bound to the store the target names (shared memory or
/// RDMA): every command is written once, generic over [`Store`].
macro_rules! with_store {
    ($at:expr, |$store:ident| $body:expr) => {
        match open_target($at)? {
            AnyStore::Shm($store) => $body,
            #[cfg(feature = "rdma")]
            AnyStore::Rdma($store) => $body,
        }
    };
}

enum AnyStore {
    Shm(ShmStore),
    #[cfg(feature = "rdma")]
    Rdma(rdma::Store),
}

fn open_target(at: &ClusterArg) -> Result<AnyStore> {
    if let Some(dir) = &at.target.dir {
        return Ok(AnyStore::Shm(ShmStore::open(dir).with_context(|| {
            format!("cannot open the SWARM-KV cluster in {}", dir.display())
        })?));
    }
    #[cfg(feature = "rdma")]
    return Ok(AnyStore::Rdma(rdma::open(at)?));
    #[cfg(not(feature = "rdma"))]
    match rdma::open(at)? {}
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Init(args) => init(args),
        Command::Format { at, .. } if at.target.dir.is_some() => Err(anyhow::anyhow!(
            "`swarm format` writes the superblock on RDMA memory nodes (--cluster or \
             --rdma); a shared-memory cluster is formatted when `swarm init --dir` creates \
             it"
        )),
        Command::Format { at, params } => rdma::format(&at, params.params()?),
        Command::Put { at, key, value } => {
            let value = value_arg(&value)?;
            with_store!(&at, |store| put(&store, &key, &value))
        }
        Command::Get { at, key, raw, json } => {
            let format = match (raw, json) {
                (_, true) => GetFormat::Json,
                (true, _) => GetFormat::Raw,
                _ => GetFormat::Line,
            };
            with_store!(&at, |store| get(&store, &key, format))
        }
        Command::Delete { at, key } => with_store!(&at, |store| delete(&store, &key)),
        Command::Stat { at, json } => with_store!(&at, |store| stat(&store, json)),
        Command::Repair {
            at,
            node,
            replace,
            break_lock,
        } => repair(&at, node, replace, break_lock),
        Command::AddNode {
            dir,
            chunks,
            accept_no_repair,
        } => add_node(&dir, chunks, accept_no_repair),
        Command::Evict { at, writer, force } => {
            with_store!(&at, |store| evict(&store, writer, force))
        }
        Command::Scrub { at, every, passes } => {
            with_store!(&at, |store| scrub(&store, every, passes))
        }
        Command::Bench { at, args } => with_store!(&at, |store| bench(&store, &args)),
        Command::Plot { out, reports } => plot(&out, &reports),
        Command::Check { file } => check(&file),
        Command::Memnode(args) => rdma::memnode(&args),
    }
}

/// The bytes of a `put` value: the argument's own, or standard input's for `-`.
fn value_arg(value: &OsStr) -> Result<Vec<u8>> {
    if value != "-" {
        return Ok(value.as_encoded_bytes().to_vec());
    }
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut bytes)
        .context("cannot read the value from standard input")?;
    Ok(bytes)
}

fn put<S: Store>(store: &S, key: &OsStr, value: &[u8]) -> Result<ExitCode> {
    with_client(store, |c, s| {
        block_on(c.fabric(), c.insert(key.as_encoded_bytes(), value, s))
    })?;
    Ok(ExitCode::SUCCESS)
}

/// How `swarm get` prints a value.
#[derive(Clone, Copy, Debug)]
enum GetFormat {
    /// The bytes and a newline.
    Line,
    /// The bytes only.
    Raw,
    /// A JSON object ([`get_json`]).
    Json,
}

fn get<S: Store>(store: &S, key: &OsStr, format: GetFormat) -> Result<ExitCode> {
    let key_bytes = key.as_encoded_bytes();
    let value = with_client(store, |c, s| block_on(c.fabric(), c.get(key_bytes, s)))?;
    let mut out = std::io::stdout().lock();
    match format {
        GetFormat::Json => {
            writeln!(out, "{}", get_json(key_bytes, value.as_deref()))?;
        }
        GetFormat::Line | GetFormat::Raw => {
            if let Some(value) = &value {
                out.write_all(value)?;
                if matches!(format, GetFormat::Line) {
                    out.write_all(b"\n")?;
                }
            }
        }
    }
    out.flush()?;
    if value.is_some() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("key not found: {}", key.display());
        Ok(ExitCode::FAILURE)
    }
}

/// `swarm get --json`: bytes that are UTF-8 as text, others as base64.
fn get_json(key: &[u8], value: Option<&[u8]>) -> serde_json::Value {
    let (key, key_encoding) = bytes_json(key);
    let (value, value_encoding) = match value {
        Some(value) => {
            let (text, encoding) = bytes_json(value);
            (serde_json::Value::String(text), serde_json::json!(encoding))
        }
        None => (serde_json::Value::Null, serde_json::Value::Null),
    };
    serde_json::json!({
        "key": key,
        "key_encoding": key_encoding,
        "found": !value.is_null(),
        "value": value,
        "value_encoding": value_encoding,
    })
}

/// Bytes as a JSON string and its encoding: the text if they are UTF-8, else base64.
fn bytes_json(bytes: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), "utf-8"),
        Err(_) => (base64(bytes), "base64"),
    }
}

/// Standard base64 (RFC 4648, with padding).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn delete<S: Store>(store: &S, key: &OsStr) -> Result<ExitCode> {
    let outcome = with_client(store, |c, s| {
        block_on(c.fabric(), c.delete(key.as_encoded_bytes(), s))
    })?;
    let key = key.display();
    match outcome {
        DeleteOutcome::Removed => Ok(ExitCode::SUCCESS),
        DeleteOutcome::Raced => {
            eprintln!(
                "{key} is deleted; another delete of it ran at the same time, and which of the two removed the value is undecided"
            );
            Ok(ExitCode::SUCCESS)
        }
        DeleteOutcome::Absent => {
            eprintln!("key not found: {key}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Runs `op` with a fresh client, then gives its writer id back.
type Client<S> = swarm_kv::KvClient<<S as Store>::Fabric, SystemClock>;

fn with_client<S: Store, T>(
    store: &S,
    op: impl FnOnce(&Client<S>, &OpStats) -> Result<T, swarm_kv::KvError>,
) -> Result<T> {
    let client = store.client().context("cannot start a client")?;
    let stats = OpStats::new();
    let result = op(&client, &stats);
    client.close();
    Ok(result?)
}

fn init(args: InitArgs) -> Result<ExitCode> {
    if let Some(list) = &args.rdma {
        return rdma::init(&args, list);
    }
    let params = ClusterParams {
        max_nodes: args.max_nodes.unwrap_or(0),
        ..args.params.params()?
    };
    let size = parse_size(&args.size)?;
    if args.force && args.dir.exists() {
        for node in 0..args.nodes.max(16) {
            let _ = std::fs::remove_file(args.dir.join(swarm_shm::node_file_name(node)));
        }
    }
    swarm_core::encoding::check_tick_ns(args.tick_ns)?;
    let store = ShmStore::create_with_tick(&args.dir, args.nodes, size, params, args.tick_ns)
        .with_context(|| format!("cannot create a cluster in {}", args.dir.display()))?;
    let layout = *store.layout();
    let p = layout.params;
    println!(
        "created a SWARM-KV cluster in {}: {} nodes of {}, {} replicas per key, room for {} keys ({} once grown to {} nodes by `swarm add-node`) of up to {} B with values up to {} B, {} writers with {} log slots each, client leases of {} renewed every {}, operations fenced after {}",
        args.dir.display(),
        args.nodes,
        args.size,
        p.replicas,
        p.registers,
        layout.capacity_max(),
        p.max_nodes.max(args.nodes),
        p.key_max,
        p.value_max,
        p.writers,
        p.log_slots,
        swarm_benches::duration::format_ns(p.lease_ns),
        swarm_benches::duration::format_ns(p.lease_renew_ns),
        swarm_benches::duration::format_ns(p.max_op_ns),
    );
    Ok(ExitCode::SUCCESS)
}

fn evict<S: Store>(store: &S, writer: u16, force: bool) -> Result<ExitCode> {
    let layout = *store.layout();
    let fabric = store.fabric()?;
    eprintln!(
        "{} writer {writer}'s lease; this takes {:.1} s",
        if force { "killing" } else { "watching" },
        admin::takeover_wait_ns(&layout.params) as f64 / 1e9
    );
    let eviction = admin::evict(&fabric, &layout, writer, force, store.config().owners)?;
    match eviction {
        Eviction::NotRegistered => {
            println!("writer {writer} is not registered: nothing to do");
        }
        Eviction::Released => {
            println!("writer {writer} given back (its lease expired)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn repair(at: &ClusterArg, node: u16, replace: bool, break_lock: bool) -> Result<ExitCode> {
    let options = RepairOptions {
        replace,
        break_lock,
        ..Default::default()
    };
    let mut shown = 0;
    let progress = |done: u64, total: u64| {
        let percent = (done * 100).checked_div(total).unwrap_or(100);
        if percent >= shown + 10 {
            shown = percent - percent % 10;
            eprintln!("repair: {percent}% copied ({} MiB)", done >> 20);
        }
    };
    let report = match &at.target.dir {
        Some(dir) => {
            eprintln!(
                "repair: waiting {} ms for what clients did on the lost memory to land, then copying",
                ShmStore::open(dir)
                    .map(|s| admin::quiescence_ns(s.layout()) / 1_000_000)
                    .unwrap_or(0)
            );
            ShmStore::repair(dir, node, options, progress)
                .with_context(|| format!("cannot repair node {node} of {}", dir.display()))?
        }
        None => rdma::repair(at, node, options, progress)?,
    };
    print_out(&format!(
        "node {} rebuilt ({} MiB copied in {} ms after a {} ms quiescence wait) and admitted \
         at configuration epoch {}{}",
        report.node,
        report.bytes >> 20,
        report.copy_ms,
        report.quiesce_ms,
        report.epoch,
        if report.conflicts.total() == 0 {
            String::new()
        } else {
            format!(
                "; {} words whose copies disagreed were poisoned on it (claims {}, locks {}, keys {})",
                report.conflicts.total(),
                report.conflicts.claims,
                report.conflicts.locks,
                report.conflicts.keys
            )
        }
    ));
    Ok(ExitCode::SUCCESS)
}

fn add_node(dir: &Path, chunks: Option<u64>, accept_no_repair: bool) -> Result<ExitCode> {
    if !accept_no_repair {
        bail!(
            "this build cannot repair a cluster a node was added to (`swarm repair` refuses a \
             cluster with placement records): a node it loses afterwards stays out of service, \
             and losing a majority loses data. Pass --accept-no-repair to add the node anyway"
        );
    }
    eprintln!(
        "add-node: after publishing the new configuration, waiting {} ms for every client to follow it before the moved chunks are used",
        ShmStore::open(dir)
            .map(|s| admin::quiescence_ns(s.layout()) / 1_000_000)
            .unwrap_or(0)
    );
    let options = admin::AddNodeOptions {
        chunks,
        ..Default::default()
    };
    let report = ShmStore::add_node(dir, options)
        .with_context(|| format!("cannot add a node to {}", dir.display()))?;
    let store = ShmStore::open(dir)?;
    let capacity = admin::capacity(&store.fabric(), store.layout())?;
    print_out(&format!(
        "node {} added at configuration epoch {}; {} chunks moved a replica onto it, {} reserve chunks recorded: room for {} keys now (at most {})",
        report.node,
        report.epoch,
        report.moved.len(),
        report.reserve.len(),
        capacity.now,
        capacity.max
    ));
    Ok(ExitCode::SUCCESS)
}

fn scrub<S: Store>(store: &S, every: Option<f64>, passes: Option<u64>) -> Result<ExitCode> {
    let period = match every {
        Some(secs) if !(secs.is_finite() && secs >= 0.0) => {
            bail!("--every {secs} is not a number of seconds")
        }
        Some(secs) => Some(std::time::Duration::from_secs_f64(secs)),
        None => None,
    };
    let fabric = store.fabric()?;
    let mut pass = 0u64;
    loop {
        // A scrub only moves slots forward; it never removes, so no writer id is needed.
        let report = admin::scrub(&fabric, store.layout())?;
        print_out(&format!(
            "scrubbed {} index buckets: {} lagging slot copies moved forward, {} buckets \
             skipped (fewer than a majority of well-formed copies answered)",
            report.buckets, report.repaired, report.skipped
        ));
        pass += 1;
        let Some(period) = period else { break };
        if passes.is_some_and(|n| pass >= n) {
            break;
        }
        std::thread::sleep(period);
    }
    Ok(ExitCode::SUCCESS)
}

/// Appends a formatted line to a `String` (the report is printed at once, with
/// [`print_out`], so that a closed pipe is not an error).
macro_rules! outln {
    ($text:ident, $($arg:tt)*) => {{
        $text.push_str(&format!($($arg)*));
        $text.push('\n');
    }};
}

/// `swarm stat`: the report as text, or (`json`) as one JSON object with the same
/// facts (docs/cli.md lists its fields).
fn stat<S: Store>(store: &S, json: bool) -> Result<ExitCode> {
    let mut text = String::new();
    let mut node_reports = Vec::new();
    let layout = *store.layout();
    let p = layout.params;
    let fabric = store.fabric()?;
    let nodes = fabric.node_count();
    let stats = OpStats::new();
    // Counting keys needs no writer id: `swarm stat` works on a cluster whose ids are
    // all taken.
    let keys = admin::count_keys(&fabric, &layout)?;
    outln!(
        text,
        "cluster: {} nodes, {} replicas per key, W = {} metadata words",
        nodes,
        p.replicas,
        p.meta_words
    );
    let meta = layout.metadata_nodes(nodes);
    if meta < nodes {
        outln!(
            text,
            "metadata group: nodes 0 to {} (index, client table, chunk table, configuration)",
            meta - 1
        );
    }
    let capacity = admin::capacity(&fabric, &layout)?;
    let holders = admin::chunk_holders(&fabric, &layout)?;
    outln!(
        text,
        "keys: {keys} (capacity {}; {} once grown to {} nodes by `swarm add-node`)",
        capacity.now,
        capacity.max,
        p.max_nodes.max(nodes as u16)
    );
    let mut report = serde_json::json!({
        "nodes": nodes,
        "metadata_nodes": meta,
        "replicas": p.replicas,
        "meta_words": p.meta_words,
        "keys": keys,
        "capacity": capacity.now,
        "capacity_max": capacity.max,
        "max_nodes": p.max_nodes.max(nodes as u16),
    });
    let unusable = store.unusable_nodes();
    let mut table_node = None;
    let mut chunk_tokens: Vec<u64> = Vec::new();
    for node in 0..nodes {
        let node = NodeId(node as u16);
        if let Some((_, why)) = unusable.iter().find(|(n, _)| *n == node) {
            outln!(
                text,
                "node {node}: UNUSABLE, left out (the others serve): {why}"
            );
            node_reports.push(serde_json::json!({
                "node": node.0, "state": "unusable", "reason": why,
            }));
            continue;
        }
        let words = block_on(&fabric, async {
            let mut rt = Roundtrip::start(&fabric, &stats);
            rt.post(
                node,
                Batch::read(layout.chunks_at, (8 * layout.chunks()) as u32),
            )?;
            rt.wait(1).await?;
            let words = rt.replies()[0].1.read(0).unwrap_or_default().to_vec();
            Ok::<_, swarm_core::FabricError>(
                words
                    .chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
                    .collect::<Vec<u64>>(),
            )
        });
        let words = match words {
            Ok(words) => words,
            Err(e) => {
                outln!(text, "node {node}: UNREACHABLE: {e}");
                node_reports.push(serde_json::json!({
                    "node": node.0, "state": "unreachable", "reason": e.to_string(),
                }));
                continue;
            }
        };
        // A node outside the metadata group holds no chunk table: the claims are
        // the metadata group's (its first node that answered).
        let words = if node.index() >= meta && table_node.is_some() {
            chunk_tokens.clone()
        } else {
            words
        };
        // The claimed chunks this node holds (with replica groups, those of its
        // groups: `NodeLayout::placement`).
        let claimed = words
            .iter()
            .enumerate()
            .filter(|(c, w)| **w != 0 && holders.get(*c).is_some_and(|h| h.contains(&node.index())))
            .count();
        if table_node.is_none() {
            table_node = Some(node);
            chunk_tokens = words;
        }
        let registers = (claimed as u64 * u64::from(p.chunk_registers)).min(p.registers);
        let used = registers * layout.register_slot_bytes;
        let area = layout.register_area_bytes();
        outln!(
            text,
            "node {node}: up, {} register chunks claimed ({registers} registers, {:.1} MiB of {:.1} MiB), logs {:.1} MiB",
            claimed,
            used as f64 / (1 << 20) as f64,
            area as f64 / (1 << 20) as f64,
            layout.swarm.log_bytes() as f64 / (1 << 20) as f64,
        );
        node_reports.push(serde_json::json!({
            "node": node.0,
            "state": "up",
            "chunks_claimed": claimed,
            "registers_claimed": registers,
            "register_bytes_used": used,
            "register_bytes": area,
            "log_bytes": layout.swarm.log_bytes(),
        }));
    }
    report["node_states"] = serde_json::Value::Array(node_reports);
    let table_node = table_node.context("no memory node answered")?;
    let census = admin::census(&fabric, &layout)?;
    outln!(
        text,
        "registers: {} holding data ({} with a key header: keys, inserts in flight and leaks; \
         {} retired in live clients' limbos; {} retired by gone clients, reclaimable), \
         {} free in pools ({} of gone clients or donated, reclaimable; {} of them donated, \
         taken without a grace), {} never used, {} unreadable",
        census.holding_data(),
        census.keyed,
        census.retired_live,
        census.retired_gone,
        census.pooled_live + census.pooled_gone,
        census.pooled_gone,
        census.donated,
        census.fresh,
        census.unknown
    );
    if !census.pooled_live_by_writer.is_empty() {
        let holders: Vec<String> = census
            .pooled_live_by_writer
            .iter()
            .take(8)
            .map(|(writer, n)| format!("writer {writer}: {n}"))
            .collect();
        outln!(
            text,
            "free in live clients' pools, by holder: {}",
            holders.join(", ")
        );
    }
    report["registers"] = serde_json::json!({
        "holding_data": census.holding_data(),
        "keyed": census.keyed,
        "retired_live": census.retired_live,
        "retired_gone": census.retired_gone,
        "pooled_live": census.pooled_live,
        "pooled_live_by_writer": census
            .pooled_live_by_writer
            .iter()
            .map(|(writer, n)| serde_json::json!({"writer": writer, "registers": n}))
            .collect::<Vec<_>>(),
        "pooled_gone": census.pooled_gone,
        "donated": census.donated,
        "fresh": census.fresh,
        "unknown": census.unknown,
    });
    let rows = admin::writer_table(&fabric, &layout, table_node)?;
    let takeover_wait_ns = admin::takeover_wait_ns(&p);
    let now = SystemClock::unix_ns();
    let registered: Vec<_> = rows.iter().filter(|r| r.token != 0).collect();
    let used = rows.iter().filter(|r| r.used).count();
    outln!(
        text,
        "leases: {}, renewed every {}, operations fenced after {}, writes land within {}; a \
         client that stops renewing loses its writer id to the next client that needs one \
         after {:.2} s",
        swarm_benches::duration::format_ns(p.lease_ns),
        swarm_benches::duration::format_ns(p.lease_renew_ns),
        swarm_benches::duration::format_ns(p.max_op_ns),
        swarm_benches::duration::format_ns(p.delivery_margin_ns),
        takeover_wait_ns as f64 / 1e9
    );
    report["leases"] = serde_json::json!({
        "lease_ns": p.lease_ns,
        "renew_ns": p.lease_renew_ns,
        "max_op_ns": p.max_op_ns,
        "delivery_margin_ns": p.delivery_margin_ns,
        "takeover_after_ns": takeover_wait_ns,
    });
    let status = |row: &WriterRow| {
        let age_ns = now.saturating_sub(row.renewed_unix_ns);
        if row.lease_killed() {
            ("killed: reclaimable now", true)
        } else if row.renewed_unix_ns != 0 && age_ns <= p.lease_ns {
            ("valid", false)
        } else {
            ("expired: reclaimable", true)
        }
    };
    let reclaimable = registered.iter().filter(|r| status(r).1).count();
    let sealed = rows
        .iter()
        .filter(|r| r.token == 0 && r.used && r.sealed())
        .count();
    outln!(
        text,
        "writers: {} of {} ids ever used, {} registered now, {} of them with an expired lease \
         (by the owners' wall clocks, node {table_node}'s copy)",
        used,
        p.writers,
        registered.len(),
        reclaimable
    );
    if layout.summaries_at.is_some() {
        let others = if p.tick_ceilings {
            "the others resume above their tick ceiling and examine the log lazily"
        } else {
            "the others are scanned whole (a cluster made before tick ceilings)"
        };
        outln!(
            text,
            "log resume: {sealed} of the {} free used ids have a sealed log summary (their \
             next client reads {:.1} KiB instead of the {:.1} MiB log); {others}",
            rows.iter().filter(|r| r.token == 0 && r.used).count(),
            layout.summary_bytes() as f64 / 1024.0,
            (u64::from(p.log_slots) * layout.swarm.slot_bytes()) as f64 / (1 << 20) as f64,
        );
    } else {
        outln!(
            text,
            "log resume: this cluster predates log summaries (superblock version 2): the \
             next client of a used id scans its whole log"
        );
    }
    report["writers"] = serde_json::json!({
        "ids": p.writers,
        "ever_used": used,
        "registered": registered.len(),
        "reclaimable": reclaimable,
        "sealed_summaries": sealed,
        "table_node": table_node.0,
        "clients": registered.iter().map(|row| serde_json::json!({
            "writer": row.writer,
            "pid": row.pid,
            "lease_counter": row.lease_counter(),
            "last_renewal_secs": now.saturating_sub(row.renewed_unix_ns) as f64 / 1e9,
            "lease": status(row).0.split(':').next().unwrap_or_default(),
        })).collect::<Vec<_>>(),
    });
    for row in &registered {
        let age = now.saturating_sub(row.renewed_unix_ns) as f64 / 1e9;
        outln!(
            text,
            "  writer {}: pid {}, lease counter {}, last renewal {:.1} s ago, lease {}",
            row.writer,
            row.pid,
            row.lease_counter(),
            age,
            status(row).0
        );
    }
    let live_tokens: Vec<u64> = registered
        .iter()
        .filter(|r| !status(r).1)
        .map(|r| r.token)
        .collect();
    let orphaned = chunk_tokens
        .iter()
        .filter(|t| **t != 0 && !live_tokens.contains(t))
        .count();
    outln!(
        text,
        "register chunks held by clients without a valid lease: {orphaned} ({} registers; \
         a client that runs out of registers adopts those whose owner's writer id was reclaimed \
         or given back, and reclaims what gone clients held, after the register grace)",
        orphaned as u64 * u64::from(p.chunk_registers)
    );
    report["orphaned_chunks"] = serde_json::json!(orphaned);
    report["orphaned_registers"] =
        serde_json::json!(orphaned as u64 * u64::from(p.chunk_registers));
    if json {
        print_out(&serde_json::to_string_pretty(&report).unwrap_or_default());
    } else {
        print_out(text.trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a report; a closed pipe (`swarm check FILE | head`) is not an error.
fn print_out(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}").and_then(|()| out.flush());
}

/// How `swarm bench` runs on a store: shared memory has emulated latency and the
/// FUSEE baseline; other transports run SWARM-KV and its register baselines with
/// their real latency.
trait Bench {
    fn bench(&self, config: &BenchConfig) -> Result<BenchReport, BenchError>;
}

impl Bench for ShmStore {
    fn bench(&self, config: &BenchConfig) -> Result<BenchReport, BenchError> {
        swarm_benches::ycsb::run(self, config)
    }
}

#[cfg(feature = "rdma")]
impl Bench for rdma::Store {
    fn bench(&self, config: &BenchConfig) -> Result<BenchReport, BenchError> {
        swarm_benches::ycsb::run_on(self, config)
    }
}

fn bench<S: Bench>(store: &S, args: &swarm_benches::ycsb::BenchArgs) -> Result<ExitCode> {
    let configs = args.to_configs()?;
    let mut reports = Vec::with_capacity(configs.len());
    for (i, config) in configs.iter().enumerate() {
        if configs.len() > 1 {
            eprintln!(
                "run {} of {}: {} {}, {} clients",
                i + 1,
                configs.len(),
                config.system,
                config.workload,
                config.clients
            );
        }
        let report = store.bench(config)?;
        print_out(&report.to_string());
        reports.push(report);
    }
    if reports.len() > 1 {
        print_out(&format!(
            "\n{}",
            swarm_benches::ycsb::comparison_table(&reports)
        ));
    }
    if let Some(path) = &args.json {
        let json = match reports.as_slice() {
            [one] => one.to_json(),
            all => serde_json::to_string_pretty(all).unwrap_or_default(),
        };
        std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(dir) = &args.plot {
        let written = swarm_benches::ycsb::plot::write_figures(&reports, dir)?;
        eprintln!("{} figures written to {}", written.len(), dir.display());
    }
    let errors: u64 = reports.iter().map(|r| r.total_errors()).sum();
    if errors > 0 {
        bail!("{errors} operations failed (see the report)");
    }
    Ok(ExitCode::SUCCESS)
}

fn plot(out: &Path, files: &[PathBuf]) -> Result<ExitCode> {
    let mut reports: Vec<swarm_benches::ycsb::BenchReport> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let parsed: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", file.display()))?;
        let items = match parsed {
            serde_json::Value::Array(items) => items,
            one => vec![one],
        };
        for item in items {
            reports.push(serde_json::from_value(item).with_context(|| {
                format!("{} is not a `swarm bench --json` report", file.display())
            })?);
        }
    }
    let written = swarm_benches::ycsb::plot::write_figures(&reports, out)?;
    eprintln!("{} figures written to {}", written.len(), out.display());
    Ok(ExitCode::SUCCESS)
}

fn check(file: &Path) -> Result<ExitCode> {
    let history = if file == Path::new("-") {
        swarm_checker::History::from_jsonl(std::io::stdin().lock())
    } else {
        let f = File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
        swarm_checker::History::from_jsonl(BufReader::new(f))
    }
    .with_context(|| format!("{} is not a valid history", file.display()))?;
    let report = swarm_checker::check(&history);
    print_out(&report.to_string());
    if report.is_linearizable() {
        Ok(ExitCode::SUCCESS)
    } else {
        bail!("the history is not linearizable")
    }
}
