//! A cluster of memory nodes: a directory of node files, created and validated.
//!
//! Layout: `DIR/node-0.swarm`, ..., `DIR/node-<n-1>.swarm`, each a memory node whose
//! first [`HEADER_SIZE`] bytes are its [`NodeHeader`]. Node files are created with
//! mode 0600 (the memory is as private as the data it will hold) and the directory
//! with mode 0700 if it did not exist.
//!
//! Creation never exposes a half-built cluster and never truncates a file another
//! process may have mapped: each node is built in a temporary file (sized,
//! preallocated, header written) and then published under its final name, node 0
//! last, so an opener that finds `node-0.swarm` finds a complete cluster. Publishing
//! uses `link` (fails if the name exists) or, when overwriting, `rename` (atomically
//! replaces the old file while processes that mapped it keep the old memory).
//!
//! **Added nodes.** A node added to a running cluster ([`ShmCluster::add_node`])
//! is the next file, `node-<n>.swarm`, with the cluster's id, epoch and tick; its
//! header's node count is the cluster's count with it (`n + 1`), while the nodes
//! before it keep the count they were created with. So the node count is not part
//! of a cluster's identity: an opener takes the highest count its agreeing nodes
//! show, and a process that opened the cluster before the add reaches the new node
//! once it admits it ([`ShmCluster::admit`], after the store's configuration lists
//! it). Whether a node serves is the store's configuration's to say, not the files'.
//!
//! Opening trusts nothing in the files (see the crate docs): lengths come from
//! `metadata`, headers are read with `pread` and fully validated, and only then is a
//! file mapped, for exactly the length its header and the file system agree on.

use std::collections::hash_map::RandomState;
use std::fs::{self, DirBuilder, OpenOptions};
use std::hash::BuildHasher;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use swarm_core::fabric::{EmulatedRtt, FailNodes, Nanos};
use swarm_core::header::{
    ENCODED_LEN, HEADER_SIZE, HeaderError, INCARNATION_AT, INCARNATION_LEN, NodeHeader, RETIRED_AT,
    decode_incarnation, encode_incarnation,
};
use swarm_core::{MAX_CLUSTER_NODES, NodeId};

use crate::backing::Backing;
use crate::error::ShmError;
use crate::fabric::{EmulatedFabric, ShmFabric};
use crate::mapping::{self, Mapping};
use crate::node::NodeMemory;

/// Default timestamp tick: 1 µs.
pub const DEFAULT_TICK_NS: u64 = 1000;

const NODE_PREFIX: &str = "node-";
const NODE_SUFFIX: &str = ".swarm";

/// The file name of node `index` inside a cluster directory.
pub fn node_file_name(index: u16) -> String {
    format!("{NODE_PREFIX}{index}{NODE_SUFFIX}")
}

/// The node index named by a node file name, if `name` is one.
fn parse_node_file_name(name: &str) -> Option<u16> {
    let digits = name.strip_prefix(NODE_PREFIX)?.strip_suffix(NODE_SUFFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Options of [`ShmCluster::create_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateOptions {
    /// Length of a timestamp tick in ns, recorded in every header.
    pub tick_ns: u64,
    /// Replace an existing cluster in the directory instead of refusing.
    pub overwrite: bool,
    /// Reserve the files' blocks at creation (Linux), so a full tmpfs fails here with
    /// "no space" instead of with `SIGBUS` at first touch.
    pub preallocate: bool,
}

impl Default for CreateOptions {
    fn default() -> Self {
        Self {
            tick_ns: DEFAULT_TICK_NS,
            overwrite: false,
            preallocate: true,
        }
    }
}

/// An opened, validated cluster: every node file mapped into this process.
///
/// `Send + Sync`: share it between threads with an [`Arc`] and give each client
/// thread its own [`ShmFabric`] ([`ShmCluster::client`]).
#[derive(Debug)]
pub struct ShmCluster {
    dir: PathBuf,
    /// The header the usable nodes agree on (node 0's when it is usable).
    reference: NodeHeader,
    headers: Vec<Option<NodeHeader>>,
    /// Each usable node's incarnation (`swarm_core::header`; 0 for older files).
    incarnations: Vec<Option<u64>>,
    nodes: Vec<Option<NodeMemory>>,
    /// A node admitted after the cluster was shared ([`ShmCluster::admit`]), with its
    /// incarnation: it replaces `nodes[i]` for every handle from then on. One slot
    /// per node the cluster may ever have ([`MAX_CLUSTER_NODES`]): a node added
    /// since the open ([`ShmCluster::add_node`]) is admitted into a slot past
    /// `nodes`.
    admitted: Vec<OnceLock<(NodeMemory, u64)>>,
    /// Node slots: `nodes.len()` at open, grown by the admission of an added node.
    node_count: AtomicUsize,
    absent: Vec<AbsentNode>,
    /// Per node slot, an incarnation whose memory is known lost: found retired at
    /// open, or declared by the store ([`ShmCluster::declare_lost`]).
    lost: Vec<Option<u64>>,
}

/// A node of the cluster that could not be used when it was opened, and why.
#[derive(Debug)]
pub struct AbsentNode {
    /// The node.
    pub node: NodeId,
    /// Why its file was not usable (missing, corrupted, of another cluster...).
    pub error: ShmError,
}

impl ShmCluster {
    /// Creates a cluster of `nodes` memory nodes of `bytes_per_node` bytes each
    /// (header included, a multiple of 8) in `dir`, with default options, and opens it.
    pub fn create(
        dir: impl AsRef<Path>,
        nodes: u16,
        bytes_per_node: u64,
    ) -> Result<Self, ShmError> {
        Self::create_with(dir, nodes, bytes_per_node, &CreateOptions::default())
    }

    /// Creates a cluster with explicit options, and opens it.
    pub fn create_with(
        dir: impl AsRef<Path>,
        nodes: u16,
        bytes_per_node: u64,
        options: &CreateOptions,
    ) -> Result<Self, ShmError> {
        let dir = dir.as_ref();
        check_params(nodes, bytes_per_node, options)?;
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(ShmError::io("cannot create cluster directory", dir))?;
        if let Ok(Backing::Disk { fs_type }) = Backing::of(dir) {
            tracing::warn!(
                dir = %dir.display(),
                fs_type = format_args!("{fs_type:#x}"),
                "the cluster's node files are on a disk-backed filesystem: the first touch of \
                 each page reads or allocates a disk block and can stall operations (they are \
                 retried, slowly); create the cluster under /dev/shm (tmpfs), a hugetlbfs \
                 mount, or a DAX filesystem instead"
            );
        }
        let existing = node_files(dir)?;
        if !existing.is_empty() && !options.overwrite {
            return Err(ShmError::AlreadyExists { dir: dir.into() });
        }

        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| ShmError::Clock)?;
        let template = NodeHeader {
            node_id: 0,
            node_count: nodes,
            size: bytes_per_node,
            cluster_id: random_id(),
            epoch_unix_ns: u64::try_from(epoch.as_nanos()).unwrap_or(u64::MAX),
            tick_ns: options.tick_ns,
        };

        if options.overwrite {
            // Nodes beyond the new count would make the new cluster look inconsistent.
            for (index, path) in &existing {
                if *index >= nodes {
                    fs::remove_file(path)
                        .map_err(ShmError::io("cannot remove old node file", path))?;
                }
            }
        }
        let mut published = Vec::new();
        // Node 0 last: its presence means the cluster is complete.
        for node_id in (1..nodes).chain([0]) {
            let header = NodeHeader {
                node_id,
                ..template
            };
            match publish_node(dir, &header, options) {
                Ok((path, _)) => published.push(path),
                Err(error) => {
                    if !options.overwrite {
                        // Best effort: do not leave a partial cluster behind.
                        for path in &published {
                            let _ = fs::remove_file(path);
                        }
                    }
                    return Err(error);
                }
            }
        }
        Self::open(dir)
    }

    /// Opens the cluster in `dir`, validating every node file (see the module docs).
    ///
    /// A replicated cluster serves with any majority of its nodes, so a *minority* of
    /// node files that are missing, corrupted, truncated or from another cluster does
    /// not stop it: those nodes are [absent](ShmCluster::absent) (batches to them fail
    /// with [`swarm_core::FabricError::NodeFailed`], as a crashed node's would) and the reason is
    /// kept for the caller to report. Only when the usable nodes are not a majority
    /// does opening fail ([`ShmError::NoMajority`], or the single node's own error for
    /// a one-node cluster). Usable nodes must agree on the cluster (id, node count,
    /// epoch, tick length); the largest agreeing group is the cluster.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, ShmError> {
        let cluster = Self::open_quietly(dir)?;
        for a in &cluster.absent {
            tracing::warn!(node = a.node.0, reason = %a.error, "memory node unusable: serving with the others");
        }
        Ok(cluster)
    }

    /// [`ShmCluster::open`] without the warning per unusable node: for a tool that
    /// opens a cluster again after reporting its nodes once (a repair).
    pub fn open_quietly(dir: impl AsRef<Path>) -> Result<Self, ShmError> {
        let dir = dir.as_ref();
        if !fs::metadata(dir)
            .map_err(ShmError::io("cannot open cluster directory", dir))?
            .is_dir()
        {
            return Err(ShmError::NotACluster { dir: dir.into() });
        }
        let files = node_files(dir)?;
        if files.is_empty() {
            return Err(ShmError::NotACluster { dir: dir.into() });
        }
        let mut usable: Vec<(NodeHeader, NodeMemory, u64)> = Vec::new();
        let mut problems: Vec<(u16, ShmError)> = Vec::new();
        for (index, path) in &files {
            match open_node(dir, *index) {
                Ok(Some(node)) => usable.push(node),
                Ok(None) => problems.push((
                    *index,
                    ShmError::Io {
                        op: "node file vanished while opening",
                        path: path.clone(),
                        error: io::ErrorKind::NotFound.into(),
                    },
                )),
                Err(error) => problems.push((*index, error)),
            }
        }
        // The cluster is the largest group of usable nodes that agree. A node added
        // after creation says how many nodes the cluster had with it (module docs,
        // "Added nodes"): the node count is not part of the identity.
        let identity = |h: &NodeHeader| (h.cluster_id, h.epoch_unix_ns, h.tick_ns);
        let reference = usable.iter().map(|(h, _, _)| *h).max_by_key(|h| {
            let agreeing = usable
                .iter()
                .filter(|(o, _, _)| identity(o) == identity(h))
                .count();
            // Ties go to the group of the lowest node.
            (agreeing, core::cmp::Reverse(h.node_id))
        });
        let Some(reference) = reference else {
            // Nothing usable at all: the first node's own error says most.
            let (_, error) = problems.remove(0);
            return Err(error);
        };
        let node_count = usable
            .iter()
            .filter(|(h, _, _)| identity(h) == identity(&reference))
            .map(|(h, _, _)| h.node_count.max(h.node_id + 1))
            .max()
            .unwrap_or(reference.node_count);
        let mut headers: Vec<Option<NodeHeader>> = vec![None; usize::from(node_count)];
        let mut nodes: Vec<Option<NodeMemory>> = (0..node_count).map(|_| None).collect();
        let mut incarnations: Vec<Option<u64>> = vec![None; usize::from(node_count)];
        for (header, node, incarnation) in usable {
            let path = dir.join(node_file_name(header.node_id));
            if identity(&header) == identity(&reference) {
                headers[usize::from(header.node_id)] = Some(header);
                nodes[usize::from(header.node_id)] = Some(node);
                incarnations[usize::from(header.node_id)] = Some(incarnation);
                continue;
            }
            let reason = if header.cluster_id != reference.cluster_id {
                "it belongs to another cluster (different cluster id)".to_string()
            } else {
                "its epoch or tick length differs from the other nodes'".to_string()
            };
            problems.push((header.node_id, ShmError::Mismatch { path, reason }));
        }
        if let Some((index, _)) = problems.iter().find(|(index, _)| *index >= node_count) {
            return Err(ShmError::Mismatch {
                path: dir.join(node_file_name(*index)),
                reason: format!("the cluster has only {node_count} nodes"),
            });
        }
        let mut absent = Vec::new();
        let mut lost = vec![None; usize::from(node_count)];
        for index in 0..node_count {
            if nodes[usize::from(index)].is_some() {
                continue;
            }
            let error = match problems.iter().position(|(i, _)| *i == index) {
                Some(at) => problems.swap_remove(at).1,
                None => ShmError::MissingNode {
                    path: dir.join(node_file_name(index)),
                    nodes: node_count,
                },
            };
            if let ShmError::Retired { incarnation, .. } = &error {
                lost[usize::from(index)] = Some(*incarnation);
            }
            absent.push(AbsentNode {
                node: NodeId(index),
                error,
            });
        }
        let present = nodes.iter().flatten().count();
        if present <= usize::from(node_count) / 2 {
            if node_count == 1 || absent.len() == 1 {
                return Err(absent.remove(0).error);
            }
            return Err(ShmError::NoMajority {
                dir: dir.into(),
                usable: present,
                nodes: node_count,
                problems: absent
                    .iter()
                    .map(|a| format!("node {}: {}", a.node.0, a.error))
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
        let admitted = (0..MAX_CLUSTER_NODES.max(usize::from(node_count)))
            .map(|_| OnceLock::new())
            .collect();
        Ok(Self {
            dir: dir.into(),
            reference,
            headers,
            incarnations,
            nodes,
            admitted,
            node_count: AtomicUsize::new(usize::from(node_count)),
            absent,
            lost,
        })
    }

    /// A client handle for one thread, with no emulated latency.
    pub fn client(self: &Arc<Self>) -> ShmFabric {
        ShmFabric::new(Arc::clone(self))
    }

    /// A client handle for the calling thread with an emulated roundtrip of `rtt_ns`
    /// (0: none) and nodes that can be crashed for it
    /// ([`swarm_core::fabric::FailNodes::fail_node`]): for benchmarks and failure tests.
    pub fn client_with(self: &Arc<Self>, rtt_ns: Nanos) -> EmulatedFabric {
        FailNodes::new(EmulatedRtt::new(self.client(), rtt_ns))
    }

    /// The cluster directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Number of memory node slots: the nodes found at open, and any added node
    /// admitted since ([`ShmCluster::admit`]).
    pub fn node_count(&self) -> usize {
        self.node_count.load(Ordering::Acquire)
    }

    /// The validated header of each node, in node order; `None` for an absent node.
    pub fn headers(&self) -> &[Option<NodeHeader>] {
        &self.headers
    }

    /// The header the usable nodes agree on (cluster id, node count, epoch, tick), with
    /// the size and id of the lowest usable node.
    pub fn header(&self) -> &NodeHeader {
        &self.reference
    }

    /// Each node's incarnation, in node order (`None` for an absent node; 0 for a file
    /// written before incarnations existed): the store admits a node as a replica only
    /// if its configuration records this incarnation (`swarm_kv::layout::Configuration`).
    pub fn incarnations(&self) -> &[Option<u64>] {
        &self.incarnations
    }

    /// Replaces node `index` of the cluster in `dir` by a new, empty node file with a
    /// fresh incarnation (a new memory node in that slot, as after a disk loss or a
    /// node replacement). Processes that mapped the old file keep its memory; every
    /// later opener sees the new one, which the store leaves out (its incarnation is
    /// not in the configuration) until a repair rebuilds it and admits it with a
    /// configuration change. A majority of the other nodes must be usable.
    pub fn replace_node(dir: impl AsRef<Path>, index: u16) -> Result<(), ShmError> {
        let dir = dir.as_ref();
        let cluster = Self::open_quietly(dir)?;
        let reference = *cluster.header();
        if usize::from(index) >= cluster.node_count() {
            return Err(ShmError::InvalidConfig(format!(
                "node {index} does not exist: the cluster has {} nodes",
                cluster.node_count()
            )));
        }
        let size = (0..cluster.node_count() as u16)
            .filter_map(|i| cluster.headers[usize::from(i)].map(|h| h.size))
            .next()
            .unwrap_or(reference.size);
        let header = NodeHeader {
            node_id: index,
            size,
            ..reference
        };
        let options = CreateOptions {
            tick_ns: reference.tick_ns,
            overwrite: true,
            preallocate: true,
        };
        drop(cluster);
        // Whoever still maps the old file must stop using it as a replica.
        Self::retire_node(dir, index)?;
        publish_node(dir, &header, &options)?;
        tracing::warn!(
            node = index,
            "memory node file replaced by an empty one with a new incarnation: it stays out of service until repaired"
        );
        Ok(())
    }

    /// Adds node `index` to the cluster in `dir` (module docs, "Added nodes"): a new,
    /// empty node file of the others' size with a fresh incarnation, whose header
    /// says the cluster has `index + 1` nodes. `index` is the store's choice: the
    /// first slot its configuration does not list (`swarm_kv`'s add-node). A file
    /// already there is replaced only with `replace` (a stopped add's file, never
    /// listed, so nobody uses it), and retired first, as [`Self::replace_node`]
    /// does. Returns the new node's incarnation. A majority of the nodes must be
    /// usable.
    pub fn add_node(dir: impl AsRef<Path>, index: u16, replace: bool) -> Result<u64, ShmError> {
        let dir = dir.as_ref();
        let cluster = Self::open_quietly(dir)?;
        let reference = *cluster.header();
        if usize::from(index) >= MAX_CLUSTER_NODES {
            return Err(ShmError::InvalidConfig(format!(
                "a cluster has at most {MAX_CLUSTER_NODES} memory nodes"
            )));
        }
        if usize::from(index) > cluster.node_count() {
            return Err(ShmError::InvalidConfig(format!(
                "node {index} would leave a gap: the cluster has {} node slots",
                cluster.node_count()
            )));
        }
        let header = NodeHeader {
            node_id: index,
            node_count: index + 1,
            ..reference
        };
        let options = CreateOptions {
            tick_ns: reference.tick_ns,
            overwrite: replace,
            preallocate: true,
        };
        drop(cluster);
        if replace {
            Self::retire_node(dir, index)?;
        }
        let (_, incarnation) = publish_node(dir, &header, &options)?;
        tracing::info!(
            node = index,
            incarnation = format_args!("{incarnation:#x}"),
            "memory node file added: it serves once the store's configuration lists it"
        );
        Ok(incarnation)
    }

    /// Declares the memory of node `index` of the cluster in `dir` lost, as a crash
    /// of a memory node that takes its memory with it: sets the retired word of its
    /// header (`swarm_core::header::RETIRED_AT`), after which every process that maps
    /// the file fails its batches to it as to a crashed node, and openers refuse it
    /// ([`ShmError::Retired`]). The file stays until [`ShmCluster::replace_node`]
    /// replaces it. Returns `false` if there was no such file. Only the header page is
    /// touched; the rest of the file is not validated.
    pub fn retire_node(dir: impl AsRef<Path>, index: u16) -> Result<bool, ShmError> {
        let path = dir.as_ref().join(node_file_name(index));
        let file = match OpenOptions::new().write(true).open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(ShmError::io("cannot open node file", path)(error)),
        };
        let len = file
            .metadata()
            .map_err(ShmError::io("cannot inspect node file", &path))?
            .len();
        if len < HEADER_SIZE {
            // Too short to be mapped by anyone: nothing to retire.
            return Ok(true);
        }
        // A shared write through the page cache: every mapping sees it at once.
        file.write_all_at(&1u64.to_le_bytes(), RETIRED_AT as u64)
            .map_err(ShmError::io("cannot retire node file", &path))?;
        tracing::warn!(
            node = index,
            "memory node retired: its memory is declared lost"
        );
        Ok(true)
    }

    /// Admits node `node`, found in its file with incarnation `incarnation`, into this
    /// opened (and possibly shared) cluster: every handle, existing or new, reaches the
    /// new memory from its next batch on. For a node that a repair rebuilt and a
    /// configuration change admitted (`swarm_kv::repair`): the caller has read that
    /// configuration. The file must be of this cluster, not retired, and carry exactly
    /// `incarnation`. A node slot can be admitted once per opened cluster (a second
    /// replacement of the same node needs a fresh [`ShmCluster::open`]); admitting the
    /// incarnation already in use is a no-op.
    pub fn admit(&self, node: NodeId, incarnation: u64) -> Result<(), ShmError> {
        let index = node.index();
        let path = self.dir.join(node_file_name(node.0));
        let Some(slot) = self.admitted.get(index) else {
            return Err(ShmError::InvalidConfig(format!(
                "node {node} cannot exist: a cluster has at most {MAX_CLUSTER_NODES} nodes"
            )));
        };
        if self.incarnation_of(node) == Some(incarnation)
            && self.node(node).is_some_and(|m| !m.is_retired())
        {
            return Ok(());
        }
        if slot.get().is_some() {
            return Err(ShmError::InvalidConfig(format!(
                "node {node} was admitted once already by this process: open the cluster again to admit another incarnation"
            )));
        }
        let Some((header, memory, found)) = open_node(&self.dir, node.0)? else {
            return Err(ShmError::MissingNode {
                path,
                nodes: self.reference.node_count,
            });
        };
        let identity = |h: &NodeHeader| (h.cluster_id, h.epoch_unix_ns, h.tick_ns);
        if identity(&header) != identity(&self.reference) {
            return Err(ShmError::Mismatch {
                path,
                reason: "it belongs to another cluster (or its epoch or tick differs)".into(),
            });
        }
        if found != incarnation {
            return Err(ShmError::Mismatch {
                path,
                reason: format!(
                    "its incarnation is {found:#x}, the configuration admits {incarnation:#x}"
                ),
            });
        }
        // A race with another admitter of the same incarnation is harmless: one wins.
        let _ = slot.set((memory, found));
        // An added node's slot counts from now on (its memory is in place first).
        self.node_count.fetch_max(index + 1, Ordering::AcqRel);
        tracing::info!(%node, incarnation = format_args!("{incarnation:#x}"), "memory node admitted");
        Ok(())
    }

    /// The incarnation of the memory this cluster uses for `node` now (an admitted
    /// one, else the one opened); `None` for an absent node.
    pub fn incarnation_of(&self, node: NodeId) -> Option<u64> {
        if let Some((_, incarnation)) = self.admitted.get(node.index()).and_then(OnceLock::get) {
            return Some(*incarnation);
        }
        self.incarnations.get(node.index()).copied().flatten()
    }

    /// Whether the memory of `node`'s incarnation `incarnation` is known lost for good
    /// (`swarm_core::Fabric::memory_lost`): its file was retired (before the cluster
    /// was opened, or since, in the memory this process maps), or the store declared
    /// it lost ([`ShmCluster::declare_lost`]). A file that is merely missing or
    /// unreadable is not known lost: it may come back with its memory.
    pub fn memory_lost(&self, node: NodeId, incarnation: u64) -> bool {
        let i = node.index();
        if self.lost.get(i).copied().flatten() == Some(incarnation) {
            return true;
        }
        if let Some((memory, admitted)) = self.admitted.get(i).and_then(OnceLock::get)
            && *admitted == incarnation
        {
            return memory.is_retired();
        }
        self.incarnations.get(i).copied().flatten() == Some(incarnation)
            && self
                .nodes
                .get(i)
                .and_then(Option::as_ref)
                .is_some_and(NodeMemory::is_retired)
    }

    /// Records that the memory of `node`'s incarnation `incarnation` is lost for good:
    /// the store found another incarnation's file in its place (a node file re-created
    /// after that memory was retired or deleted). Before the cluster is shared.
    pub fn declare_lost(&mut self, node: NodeId, incarnation: u64) {
        if let Some(slot) = self.lost.get_mut(node.index()) {
            *slot = Some(incarnation);
        }
    }

    /// Nodes that could not be used when the cluster was opened, and why.
    pub fn absent(&self) -> &[AbsentNode] {
        &self.absent
    }

    /// Leaves `node` out from now on, as if its file had been unusable at open:
    /// its memory is unmapped and batches to it fail with `NodeFailed`. For layers
    /// above that find a node's contents unusable (`reason` is reported with
    /// [`ShmCluster::absent`]). Call before sharing the cluster; unknown or already
    /// absent nodes are ignored.
    pub fn leave_out(&mut self, node: NodeId, reason: String) {
        let Some(slot) = self.nodes.get_mut(node.index()) else {
            return;
        };
        if slot.take().is_none() {
            return;
        }
        self.headers[node.index()] = None;
        self.incarnations[node.index()] = None;
        self.absent.push(AbsentNode {
            node,
            error: ShmError::LeftOut { reason },
        });
        self.absent.sort_by_key(|a| a.node);
    }

    /// The random id shared by all nodes of this cluster.
    pub fn cluster_id(&self) -> u64 {
        self.reference.cluster_id
    }

    /// Unix time (ns) of timestamp tick 0.
    pub fn epoch_unix_ns(&self) -> u64 {
        self.reference.epoch_unix_ns
    }

    /// Length of a timestamp tick in ns.
    pub fn tick_ns(&self) -> u64 {
        self.reference.tick_ns
    }

    /// A node's memory (the admitted one, [`ShmCluster::admit`], if any); `None` past
    /// the node count or for an absent node.
    #[inline]
    pub fn node(&self, node: NodeId) -> Option<&NodeMemory> {
        if let Some((memory, _)) = self.admitted.get(node.index()).and_then(OnceLock::get) {
            return Some(memory);
        }
        self.nodes.get(node.index()).and_then(Option::as_ref)
    }
}

fn check_params(nodes: u16, bytes_per_node: u64, options: &CreateOptions) -> Result<(), ShmError> {
    let invalid = |reason: String| Err(ShmError::InvalidConfig(reason));
    if nodes == 0 {
        return invalid("a cluster needs at least one memory node".into());
    }
    if bytes_per_node < HEADER_SIZE + 8 || !bytes_per_node.is_multiple_of(8) {
        return invalid(format!(
            "bytes per node must be a multiple of 8 and larger than the {HEADER_SIZE}-byte header, got {bytes_per_node}"
        ));
    }
    if usize::try_from(bytes_per_node).is_err() {
        return invalid(format!(
            "{bytes_per_node} bytes per node do not fit this host's address space"
        ));
    }
    if options.tick_ns == 0 {
        return invalid("the tick length must be at least 1 ns".into());
    }
    Ok(())
}

/// A random cluster id: `RandomState` is seeded from the OS's entropy source; the
/// time and process id separate clusters created by one process.
fn random_id() -> u64 {
    RandomState::new().hash_one((SystemTime::now(), std::process::id()))
}

/// Node files present in `dir`, by index.
fn node_files(dir: &Path) -> Result<Vec<(u16, PathBuf)>, ShmError> {
    let entries = fs::read_dir(dir).map_err(ShmError::io("cannot list cluster directory", dir))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(ShmError::io("cannot list cluster directory", dir))?;
        if let Some(index) = entry.file_name().to_str().and_then(parse_node_file_name) {
            files.push((index, entry.path()));
        }
    }
    files.sort();
    Ok(files)
}

/// Builds node `header.node_id` in a temporary file and publishes it; returns the
/// published path.
fn publish_node(
    dir: &Path,
    header: &NodeHeader,
    options: &CreateOptions,
) -> Result<(PathBuf, u64), ShmError> {
    let path = dir.join(node_file_name(header.node_id));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        node_file_name(header.node_id),
        std::process::id()
    ));
    // A leftover of a crashed creation by a process that had our pid.
    let _ = fs::remove_file(&tmp);
    let built = build_node_file(&tmp, header, options);
    let published = built.and_then(|incarnation| {
        if options.overwrite {
            fs::rename(&tmp, &path)
                .map_err(ShmError::io("cannot publish node file", &path))
                .map(|()| incarnation)
        } else {
            fs::hard_link(&tmp, &path)
                .map(|()| incarnation)
                .map_err(|error| {
                    if error.kind() == io::ErrorKind::AlreadyExists {
                        ShmError::AlreadyExists { dir: dir.into() }
                    } else {
                        ShmError::Io {
                            op: "cannot publish node file",
                            path: path.clone(),
                            error,
                        }
                    }
                })
        }
    });
    // After a rename the temporary name is gone already; after a link or a failure it
    // must go.
    let _ = fs::remove_file(&tmp);
    published.map(|incarnation| (path, incarnation))
}

/// Builds a node file at `tmp`; returns the incarnation it drew.
fn build_node_file(
    tmp: &Path,
    header: &NodeHeader,
    options: &CreateOptions,
) -> Result<u64, ShmError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(ShmError::io("cannot create node file", tmp))?;
    file.set_len(header.size)
        .map_err(ShmError::io("cannot size node file", tmp))?;
    if options.preallocate {
        mapping::preallocate(&file, header.size)
            .map_err(ShmError::io("cannot reserve memory for node file", tmp))?;
    }
    file.write_all_at(&header.encode(), 0)
        .map_err(ShmError::io("cannot write node header", tmp))?;
    let incarnation = random_incarnation();
    file.write_all_at(&encode_incarnation(incarnation), INCARNATION_AT as u64)
        .map_err(ShmError::io("cannot write node incarnation", tmp))?;
    Ok(incarnation)
}

/// A random, nonzero node incarnation (0 means "written before incarnations").
fn random_incarnation() -> u64 {
    random_id().max(1)
}

/// Opens, validates and maps node `index` of the cluster in `dir`; `None` if its file
/// does not exist.
fn open_node(dir: &Path, index: u16) -> Result<Option<(NodeHeader, NodeMemory, u64)>, ShmError> {
    let path = dir.join(node_file_name(index));
    let file = match OpenOptions::new().read(true).write(true).open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(ShmError::io("cannot open node file", path)(error)),
    };
    let metadata = file
        .metadata()
        .map_err(ShmError::io("cannot inspect node file", &path))?;
    if !metadata.is_file() {
        return Err(ShmError::Mismatch {
            path,
            reason: "it is not a regular file".into(),
        });
    }
    let len = metadata.len();
    let truncated = || ShmError::Truncated {
        path: path.clone(),
        len,
    };
    if len < HEADER_SIZE {
        return Err(truncated());
    }
    let mut bytes = [0u8; ENCODED_LEN];
    file.read_exact_at(&mut bytes, 0)
        .map_err(ShmError::io("cannot read node header", &path))?;
    let header = NodeHeader::decode(&bytes, len).map_err(|error| match error {
        HeaderError::Truncated { .. } => truncated(),
        error => ShmError::Header {
            path: path.clone(),
            error,
        },
    })?;
    let mismatch = |reason: String| ShmError::Mismatch {
        path: path.clone(),
        reason,
    };
    if header.size != len {
        return Err(mismatch(format!(
            "the file is {len} bytes but its header says {}",
            header.size
        )));
    }
    if !header.size.is_multiple_of(8) {
        return Err(mismatch(format!(
            "its size {} is not a multiple of 8 bytes",
            header.size
        )));
    }
    if header.node_id != index {
        return Err(mismatch(format!(
            "its header says it is node {}, not node {index}",
            header.node_id
        )));
    }
    let mut incarnation = [0u8; INCARNATION_LEN];
    file.read_exact_at(&mut incarnation, INCARNATION_AT as u64)
        .map_err(ShmError::io("cannot read node incarnation", &path))?;
    let incarnation = decode_incarnation(&incarnation).map_err(|error| ShmError::Header {
        path: path.clone(),
        error,
    })?;
    let mut retired = [0u8; 8];
    file.read_exact_at(&mut retired, RETIRED_AT as u64)
        .map_err(ShmError::io("cannot read node header", &path))?;
    if retired != [0; 8] {
        return Err(ShmError::Retired { path, incarnation });
    }
    let mapping =
        Mapping::new(&file, header.size).map_err(ShmError::io("cannot map node file", &path))?;
    if Backing::of(dir).is_ok_and(Backing::is_disk) {
        mapping.read_ahead();
    }
    Ok(Some((
        header,
        NodeMemory::new(NodeId(index), path, mapping),
        incarnation,
    )))
}

#[cfg(test)]
mod tests;
