//! SWARM-KV over RDMA memory nodes (`swarm memnode`, see `swarm-rdma`).
//!
//! Memory nodes are passive: each `swarm memnode` registers zeroed memory with the
//! node header, and the first client formats the store by writing the superblock
//! ([`RdmaStore::format`], `swarm format`). After that, [`RdmaStore::open`] works like
//! its shared-memory counterpart, and every command and the benchmark run unchanged
//! through the [`Store`] trait.
//!
//! Every client fences itself on the memory nodes under its lease word once it holds
//! its writer row and before it stores anything under it (`Fabric::fence_owner`, from
//! `crate::membership::writer_ids::register`), so that a node cuts its queue pair when
//! the lease is killed or not renewed, and at once when a reclaimer revokes it
//! (`swarm_rdma::lease_watch`): a writer id is taken over or released only once
//! every memory node acknowledged the revocation
//! (`crate::membership::writer_takeover`).
//!
//! **Idle clients.** A client that issues nothing for longer than its lease stops
//! renewing, so every node cuts it off. That is the intended defence against a hung
//! client, and no reason for a merely idle application to fail: its next operation
//! revives the lease ([`crate::membership::lease`], "Idle clients"). On RDMA that goes: the
//! first post after an idle gap sees the nodes' cut notices on the bootstrap
//! connections and fails those nodes at once (instead of waiting out the queue
//! pairs' retry window); the fabric reconnects them in the background right away,
//! re-arming the watch (a node refuses a killed lease word, and is then never used
//! again by this client); the operation's renewals fail until a majority is back,
//! then one succeeds and the operation runs. It costs the first operation one
//! reconnect (a bootstrap per node, in parallel); it logs
//! `memory node cut this client off` (warn, per node) and `idle client revived`
//! (info). A killed lease fails with [`KvError::LeaseExpired`] ("reopen"): at once if
//! a renewal meets the kill on a majority; but nodes that refused the reconnect for
//! a killed word never answer this client again, so usually only once
//! [`crate::KvConfig::lease_revive_ns`] (5 s by default) has passed, as when a
//! majority stays unreachable. Never with a write under the reclaimed id.
//! There is deliberately no keep-alive thread (see [`crate::membership::lease`] for why).
//!
//! Without an RDMA device both fail with the transport's `no RDMA device found: ...`
//! error.

use std::sync::Arc;

use swarm_core::Fabric;
use swarm_core::fabric::{FabricError, NodeId};
use swarm_core::header::NodeHeader;
use swarm_rdma::fabric::ClusterHandle;
use swarm_rdma::{RdmaCluster, RdmaConfig, RdmaError, RdmaFabric};

use crate::KvError;
use crate::layout::{ClusterParams, NodeLayout, ParamsError, SUPERBLOCK_AT};
use crate::repair::{RepairError, RepairOptions, RepairReport, repair_node};
use crate::store::{Store, open_layout, write_superblock};

/// A SWARM-KV cluster on RDMA memory nodes, opened by this process: over verbs
/// ([`RdmaCluster`]), or over emulated memory nodes in tests (any
/// [`ClusterHandle`]).
///
/// **Nodes that restart while the store is open.** Every client ([`Store::fabric`],
/// [`Store::client_with`]) comes from the one cluster handle, which pins each node's
/// incarnation when it first reaches it: a client made after a node restarted with
/// empty memory leaves that node out (its old memory reported lost) instead of taking
/// it as a replica. Every client also reads the configuration when it connects,
/// before it registers, and admits its members (`KvClient::connect`).
#[derive(Debug)]
pub struct RdmaStore<C: ClusterHandle = RdmaCluster> {
    cluster: Arc<C>,
    layout: NodeLayout,
    header: NodeHeader,
    /// Nodes left out when the store was opened, and why.
    unusable: Arc<[(NodeId, String)]>,
    /// Member incarnations found replaced when the store opened (their memory is
    /// gone: `RdmaFabric::declare_lost` on every client).
    lost: Arc<[(NodeId, u64)]>,
}

impl<C: ClusterHandle> Clone for RdmaStore<C> {
    fn clone(&self) -> Self {
        Self {
            cluster: self.cluster.clone(),
            layout: self.layout,
            header: self.header,
            unusable: self.unusable.clone(),
            lost: self.lost.clone(),
        }
    }
}

fn first_header<T: swarm_rdma::fabric::Transport>(
    fabric: &RdmaFabric<T>,
) -> Result<NodeHeader, KvError> {
    Ok(fabric
        .headers()
        .iter()
        .flatten()
        .next()
        .copied()
        .ok_or(ParamsError::NotInitialized)?)
}

impl RdmaStore {
    /// Connects to the memory nodes of `config`.
    pub fn open(config: RdmaConfig) -> Result<Self, KvError> {
        Self::open_on(RdmaCluster::open(config).map_err(rdma)?)
    }
    /// Rebuilds memory node `node` of the cluster of `config` from the other nodes and
    /// admits it back (`crate::repair`), while clients keep running; they reconnect to
    /// it within a lease renewal period. The node must be reachable with a memory
    /// node process whose memory is not a member (one started after the old one was
    /// lost: a restarted `swarm memnode`); [`RepairOptions::replace`] is refused here,
    /// since a client cannot discard a remote node's memory (restart its process).
    pub fn repair(
        config: RdmaConfig,
        node: u16,
        options: RepairOptions,
        progress: impl FnMut(u64, u64),
    ) -> Result<RepairReport, KvError> {
        if options.replace {
            return Err(KvError::Unsupported(
                "--replace over RDMA (restart the memory node process to discard its memory, then repair it)",
            ));
        }
        let store = Self::open(config)?;
        let fabric = store.cluster.client().map_err(rdma)?;
        fabric.bound_delivery(store.layout.params.delivery_margin_ns);
        let id = NodeId(node);
        if usize::from(node) >= fabric.node_count() {
            return Err(RepairError::NoSuchNode {
                node: id,
                nodes: fabric.node_count(),
            }
            .into());
        }
        let Some(incarnation) = fabric.incarnations()[usize::from(node)] else {
            return Err(RepairError::Donor {
                node: id,
                error: FabricError::NodeFailed {
                    node: id,
                    cause: swarm_core::FailureCause::Disconnected,
                },
            }
            .into());
        };
        let layout = store.layout;
        let report = swarm_core::block_on(&fabric, async {
            Ok::<_, FabricError>(
                repair_node(&fabric, &layout, id, incarnation, options, progress).await,
            )
        })??;
        Ok(report)
    }

    /// Writes the superblock of a fresh store on the memory nodes of `config`, with
    /// capacities derived from `params` and the nodes' size.
    pub fn format(config: RdmaConfig, params: ClusterParams) -> Result<Self, KvError> {
        Self::format_on(RdmaCluster::open(config).map_err(rdma)?, params)
    }
}

impl<C: ClusterHandle> RdmaStore<C> {
    /// Connects to the memory nodes of `cluster`, whose clients serve the store.
    pub fn open_on(cluster: C) -> Result<Self, KvError> {
        let cluster = Arc::new(cluster);
        let fabric = cluster.client().map_err(rdma)?;
        let header = first_header(&fabric)?;
        let crate::store::OpenedLayout {
            layout,
            left_out: mut unusable,
            lost,
        } = open_layout(&fabric, &header, fabric.incarnations())?;
        // Every client's late writes must fall within the margin the cluster's
        // recyclers wait for (`swarm_core::reclaim`).
        let transport_ns = cluster.delivery_bound_ns();
        if transport_ns > layout.params.delivery_margin_ns {
            return Err(KvError::DeliveryMargin {
                transport_ns,
                cluster_ns: layout.params.delivery_margin_ns,
            });
        }
        // Nodes this first client could not reach (each later client connects on
        // its own, and may reach them).
        for (i, node_header) in fabric.headers().iter().enumerate() {
            let node = NodeId(i as u16);
            if node_header.is_none() && !unusable.iter().any(|(n, _)| *n == node) {
                let addr = cluster.node_addr(i);
                unusable.push((
                    node,
                    format!("unreachable or refused when the cluster was opened ({addr})"),
                ));
            }
        }
        unusable.sort_by_key(|(n, _)| *n);
        Ok(Self {
            cluster,
            layout,
            header,
            unusable: unusable.into(),
            lost: lost.into(),
        })
    }

    /// Writes the superblock of a fresh store on the memory nodes of `cluster`, with
    /// capacities derived from `params` and the nodes' size, then opens it.
    pub fn format_on(cluster: C, params: ClusterParams) -> Result<Self, KvError> {
        let fabric = cluster.client().map_err(rdma)?;
        let header = first_header(&fabric)?;
        // Batches may land as late as the queue pairs' retry window after their post:
        // the recycling grace must wait for them (`swarm_core::slot_recycling`).
        let params = ClusterParams {
            delivery_margin_ns: params.delivery_margin_ns.max(cluster.delivery_bound_ns()),
            // Replica groups over the cluster's nodes (`NodeLayout::placement`).
            placement_nodes: u16::try_from(fabric.node_count())
                .map_err(|_| KvError::Unsupported("more than 65535 memory nodes"))?,
            ..params
        }
        .for_node_size(header.size)?;
        if let Some(node) = formatted_node(&fabric)? {
            return Err(KvError::AlreadyFormatted { node });
        }
        write_superblock(&fabric, &params)?;
        let members = crate::configuration::Configuration::new(
            1,
            fabric
                .incarnations()
                .iter()
                .map(|i| i.unwrap_or_default())
                .collect(),
        );
        crate::store::write_configuration(&fabric, &members)?;
        drop(fabric);
        Self::open_on(cluster)
    }
}

/// The first reachable node that already holds a superblock, if any: formatting
/// over it would make a restarted, empty node look like a replica of the store the
/// others hold.
fn formatted_node<T: swarm_rdma::fabric::Transport>(
    fabric: &RdmaFabric<T>,
) -> Result<Option<NodeId>, KvError> {
    let stats = swarm_core::OpStats::new();
    let reachable: Vec<NodeId> = (0..fabric.node_count())
        .map(|i| NodeId(i as u16))
        .filter(|n| !fabric.is_failed(*n))
        .collect();
    let replies = swarm_core::block_on(fabric, async {
        let rt = swarm_core::quorum::broadcast(
            fabric,
            &stats,
            reachable.iter().copied(),
            reachable.len(),
            |_| {
                Ok(swarm_core::Batch::read(
                    SUPERBLOCK_AT,
                    crate::layout::SUPERBLOCK_ENCODED_BYTES as u32,
                ))
            },
        )
        .await?;
        Ok::<_, swarm_core::FabricError>(
            rt.replies()
                .iter()
                .map(|(n, c)| (*n, c.read(0).unwrap_or_default().to_vec()))
                .collect::<Vec<_>>(),
        )
    })?;
    Ok(replies
        .into_iter()
        .find(|(_, bytes)| ClusterParams::decode(bytes).is_ok())
        .map(|(n, _)| n))
}

fn rdma(e: RdmaError) -> KvError {
    KvError::Rdma(e)
}

impl<C: ClusterHandle> Store for RdmaStore<C> {
    type Fabric = RdmaFabric<C::Transport>;

    fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    fn header(&self) -> &NodeHeader {
        &self.header
    }

    fn fabric(&self) -> Result<Self::Fabric, KvError> {
        let fabric = self.cluster.client().map_err(rdma)?;
        // Nothing this client posts may land after the margin the recyclers wait for.
        fabric.bound_delivery(self.layout.params.delivery_margin_ns);
        // A node without the cluster's superblock (restarted with empty memory)
        // never serves, even if this client reaches it.
        for (node, _) in self.unusable.iter() {
            fabric.retire(*node);
        }
        for &(node, incarnation) in self.lost.iter() {
            fabric.declare_lost(node, incarnation);
        }
        Ok(fabric)
    }

    fn unusable_nodes(&self) -> Vec<(NodeId, String)> {
        self.unusable.to_vec()
    }

    fn client_with(
        &self,
        config: crate::KvConfig,
    ) -> Result<crate::KvClient<Self::Fabric, crate::clock::SystemClock>, KvError> {
        let fabric = self.fabric()?;
        let clock =
            crate::clock::SystemClock::new(self.header().epoch_unix_ns, self.header().tick_ns);
        crate::KvClient::connect(fabric, clock, self.layout, config)
    }
}
