//! Client leases in disaggregated memory: arithmetic, the lease word, and the
//! owner's renewal state (the fabric I/O is in [`crate::membership::writer_ids`]).
//!
//! Memory nodes run no code, so a lease is a word in the client's row of the client
//! table ([`crate::membership::writer_ids`]), replicated on every node, that only its owner and
//! *reclaimers* change, by CAS:
//!
//! * **The lease word** (row word 1) holds a renewal counter, bit 63 clear, or a
//!   *killed* counter (bit 63 set). The owner renews by CAS from the value it last saw
//!   on that node to a larger counter; a reclaimer kills by CAS from the value it
//!   observed to the same value with bit 63 set. The owner never CASes from a killed
//!   value of its own generation, so a kill is final; every owner write strictly
//!   increases a node's counter (the next counter is above every value the owner has
//!   seen), so a node never shows the same unkilled value twice (no ABA).
//!
//! ## Clock assumption
//! No synchronized clocks: each party measures time on its own monotonic clock
//! ([`swarm_core::Fabric::now`]), and every clock's *rate* is within `1/8`
//! ([`DRIFT_DIV`]) of real time. Messages (batches) land within the reclamation
//! grace of being posted or never (on RDMA: bounded RC retries, then the queue pair
//! is in error and nothing more lands).
//!
//! ## The argument (why a reclaimer never takes the row of a client that may still act)
//! *Owner.* It sends renewal `r` at local time `s` and counts it acknowledged when a
//! majority of its CASes succeeded; its lease is then valid until
//! `s + lease·(1 − 1/8) − margin` ([`LeaseParams::owner_term_ns`]) on its clock, i.e.
//! until real time at most `s + lease` (its clock runs at least `7/8` as fast as real
//! time). An operation starts only while the lease is valid for `max_op_ns` more and
//! never posts after `start + max_op_ns` (the operation deadline, SWARM-KV contract 1),
//! so the owner posts nothing after real time `s + lease`.
//!
//! *Reclaimer.* It reads the lease word on a majority, stamping the read at its
//! *completion* (`t0`), waits [`LeaseParams::observer_wait_ns`] =
//! `lease·(1 + 1/8) + grace` on its own clock (at least `lease + grace/(1+1/8)` real
//! time), then CASes each value it read to "killed". Suppose the kill succeeded on a
//! majority `K`. Any acknowledged renewal succeeded on a majority, so on some node of
//! `K`: not after the kill (the kill is final), not between the read and the kill (the
//! kill's CAS would have failed: the counter only grows), so before the read landed,
//! hence it was *sent* before `t0`. So the owner's lease ended by real time
//! `t0 + lease`, before the kill was even posted, and its last batches landed within
//! the grace. The row can be taken over and its log resumed
//! ([`swarm_core::Client::resume`]) with no batch of the old owner still to land.
//! A kill that reaches only a minority proves nothing: the reclaimer stops (the owner
//! renewed in time), and the owner keeps renewing on the other nodes.
//!
//! ## Idle clients
//! A client that stops issuing operations stops renewing (renewals ride on its
//! operations, off their critical path: [`crate::KvClient`]), so an idle client may
//! find its lease lapsed. Its next operation *revives* it before running: it renews
//! synchronously, and while no majority acknowledged and the lease is not lost
//! (killed, or the row taken over, on a majority: [`LeaseKeeper::lost_nodes`]) it
//! renews again every 20 ms, for up to [`crate::KvConfig::lease_revive_ns`] (5 s by
//! default). The retries are for transports that cut an idle client off: RDMA memory
//! nodes destroy the queue pair of a client whose lease word stopped changing
//! (`swarm_rdma::lease_watch`), so the first renewals fail until the transport has
//! reconnected in the background (the waits between retries drive it). If the
//! lease was killed, the client fails with [`crate::KvError::LeaseExpired`] and must
//! be reopened: its writer id may belong to another client now. On shared memory a
//! reclaimer never kills the lease of a row whose owner process runs
//! (`crate::membership::writer_takeover`, "A running owner's lease is not killed"),
//! so there an idle client (or a stopped one, continued) always revives; over RDMA
//! any client that finds every writer id claimed watches the table and kills what
//! did not move, so an idle client may find its lease killed.
//!
//! Reviving changes nothing in the argument above. A revival is an ordinary renewal:
//! a CAS from the word the owner last saw, sent at `s`, which counts only once a
//! majority swapped *and* still held the owner's claim, and buys the lease until
//! `s + owner_term_ns` — measured from its send, however long the client idled. A
//! reclaimer that killed the lease on a majority makes every such CAS fail on a
//! majority (the kill is final, and this generation never CASes from its own killed
//! value), so no revival counts after a successful kill. Until the revival is
//! acknowledged the client posts nothing but renewals; its self-fence
//! (`valid_for(now, max_op_ns)`) is checked again before the operation starts.
//!
//! Why not keep idle leases alive with a background thread instead: the library
//! core has no threads (the client is one `!Send` handle per thread, its fabric
//! included), and a keep-alive would have to renew through another connection and
//! share the keeper's counter and term with the owner's thread. Worse, it would
//! keep a writer id, its register chunks and its queue pairs pinned for a process
//! whose worker thread hung or stopped using the store for good, which is exactly
//! what the lease is there to detect. Reviving on demand costs one reconnect on the
//! first operation after an idle period longer than the lease (RDMA: tens of
//! milliseconds, more on soft-RoCE) and nothing otherwise; an application that must
//! not pay it can issue a cheap operation (a `get`) more often than the lease.

use swarm_core::fabric::Nanos;

/// Clock-rate drift bound: every clock's rate is within `1 / DRIFT_DIV` of real time
/// (the system's one clock model, [`swarm_core::slot_recycling::CLOCK_DRIFT_DIV`]).
pub const DRIFT_DIV: u64 = swarm_core::slot_recycling::CLOCK_DRIFT_DIV;
/// Safety margin subtracted from the owner's term (scheduling jitter around clock reads).
pub const MARGIN_NS: Nanos = 10_000_000;
/// Bit 63 of a lease word: the lease was killed by a reclaimer.
pub const KILLED: u64 = 1 << 63;

/// Why lease parameters were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseParamsError {
    /// A duration is zero.
    #[error("lease, renewal period and operation deadline must all be positive")]
    Zero,
    /// Renewals are too rare for the lease to survive one lost renewal.
    #[error(
        "the lease renewal period ({renew_ns} ns) must be less than half the lease ({lease_ns} ns): \
         shorten --lease-renew or lengthen --lease"
    )]
    RenewTooSlow {
        /// The lease, ns.
        lease_ns: Nanos,
        /// The renewal period, ns.
        renew_ns: Nanos,
    },
    /// An operation could not fit in the lease left after a renewal period.
    #[error(
        "the operation deadline ({max_op_ns} ns) plus the renewal period ({renew_ns} ns) must be \
         less than the owner's lease term ({term_ns} ns: 7/8 of the lease minus 10 ms): \
         lengthen --lease, or shorten --max-op or --lease-renew"
    )]
    OpTooLong {
        /// The operation deadline, ns.
        max_op_ns: Nanos,
        /// The renewal period, ns.
        renew_ns: Nanos,
        /// The owner's term, ns.
        term_ns: Nanos,
    },
}

/// A cluster's lease parameters (from the superblock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseParams {
    /// Lease duration, ns.
    pub lease_ns: Nanos,
    /// Renewal period, ns.
    pub renew_ns: Nanos,
    /// Operation deadline, ns.
    pub max_op_ns: Nanos,
    /// Delivery margin, ns (`ClusterParams::delivery_margin_ns`): how late after
    /// its post a batch may still land.
    pub delivery_margin_ns: Nanos,
}

impl LeaseParams {
    /// The lease parameters of a cluster.
    pub fn from_params(params: &crate::layout::ClusterParams) -> Self {
        Self {
            lease_ns: params.lease_ns,
            renew_ns: params.lease_renew_ns,
            max_op_ns: params.max_op_ns,
            delivery_margin_ns: params.delivery_margin_ns,
        }
    }

    /// Checks that leases can work: renewals at least twice per lease, and an
    /// operation plus a renewal period within the owner's term, so that a client
    /// renewing on time never has to renew synchronously.
    pub fn validate(&self) -> Result<(), LeaseParamsError> {
        if self.lease_ns == 0 || self.renew_ns == 0 || self.max_op_ns == 0 {
            return Err(LeaseParamsError::Zero);
        }
        if self.renew_ns >= self.lease_ns / 2 {
            return Err(LeaseParamsError::RenewTooSlow {
                lease_ns: self.lease_ns,
                renew_ns: self.renew_ns,
            });
        }
        let term_ns = self.owner_term_ns();
        if self.max_op_ns.saturating_add(self.renew_ns) >= term_ns {
            return Err(LeaseParamsError::OpTooLong {
                max_op_ns: self.max_op_ns,
                renew_ns: self.renew_ns,
                term_ns,
            });
        }
        Ok(())
    }

    /// How long after *sending* an acknowledged renewal the owner deems its lease
    /// valid, on its own clock: `lease·(1 − 1/8) − margin` (see the module docs).
    pub const fn owner_term_ns(&self) -> Nanos {
        (self.lease_ns - self.lease_ns / DRIFT_DIV).saturating_sub(MARGIN_NS)
    }

    /// How long a reclaimer watches a lease word unchanged, on its own clock, from
    /// the completion of its read, before it may kill it: `lease·(1 + 1/8) + grace`.
    pub const fn observer_wait_ns(&self) -> Nanos {
        self.lease_ns
            + self.lease_ns / DRIFT_DIV
            + swarm_core::slot_recycling::grace_with_margin_ns(
                self.max_op_ns,
                self.delivery_margin_ns,
            )
    }
}

/// Whether a lease word is killed.
pub const fn is_killed(word: u64) -> bool {
    word & KILLED != 0
}

/// The counter in a lease word.
pub const fn counter(word: u64) -> u64 {
    word & !KILLED
}

/// A renewal to post: for each node, the CAS `expected → next`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renewal {
    /// The new counter.
    pub next: u64,
    /// `(node index, expected word)` for every node the owner may renew on.
    pub cas: Vec<(usize, u64)>,
}

/// The owner's view of its lease word on each node, and how long its lease lasts.
#[derive(Clone, Debug)]
pub struct LeaseKeeper {
    params: LeaseParams,
    /// The first counter of this generation (this owner's incarnation): killed
    /// words with a counter below it are an earlier owner's, and may be taken over.
    base: u64,
    /// The largest counter used or seen.
    counter: u64,
    /// The word last seen on each node (`None`: never seen).
    known: Vec<Option<u64>>,
    /// Nodes whose claim word showed another token at the last renewal (the row was
    /// taken over there, or never claimed there).
    foreign: Vec<bool>,
    /// Until when (owner clock) the lease is valid; `None`: never acknowledged.
    valid_until: Option<Nanos>,
}

impl LeaseKeeper {
    /// The keeper of a freshly claimed row whose lease words were read as `seen`
    /// (one entry per node, `None` if a node did not answer).
    pub fn new(params: LeaseParams, seen: Vec<Option<u64>>) -> Self {
        let top = seen
            .iter()
            .flatten()
            .map(|w| counter(*w))
            .max()
            .unwrap_or(0);
        Self {
            params,
            base: top + 1,
            counter: top,
            foreign: vec![false; seen.len()],
            known: seen,
            valid_until: None,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &LeaseParams {
        &self.params
    }

    /// The first counter of this generation: every counter it writes is at or above
    /// it (what memory nodes fence this owner under, `swarm_core::fabric::OwnerFence`).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Starts this generation above `floor`, a counter an earlier owner of the row
    /// was revoked up to (`crate::membership::writer_takeover`): memory nodes refuse
    /// to fence a generation whose base is at or below it.
    pub fn raise_base(&mut self, floor: u64) {
        if floor >= self.base {
            self.base = floor.saturating_add(1);
            self.counter = self.counter.max(floor);
        }
    }

    /// Until when (owner clock) the lease is valid, if it ever was.
    pub fn valid_until(&self) -> Option<Nanos> {
        self.valid_until
    }

    /// Whether the lease is valid at `now` for `for_ns` more.
    pub fn valid_for(&self, now: Nanos, for_ns: Nanos) -> bool {
        self.valid_until
            .is_some_and(|until| now.saturating_add(for_ns) <= until)
    }

    /// Whether `word` is a kill of this generation's lease (final: never renewed over).
    fn killed_mine(&self, word: u64) -> bool {
        is_killed(word) && counter(word) >= self.base
    }

    /// Nodes where this generation's lease was seen killed, or the row's claim word
    /// held another token: on a majority, the lease can never be renewed again.
    pub fn lost_nodes(&self) -> usize {
        self.known
            .iter()
            .zip(&self.foreign)
            .filter(|(w, foreign)| **foreign || w.is_some_and(|w| self.killed_mine(w)))
            .count()
    }

    /// The next renewal: a counter above everything seen, CASed from the last word
    /// seen on each node, except nodes where a reclaimer killed this lease.
    pub fn renewal(&mut self) -> Renewal {
        let seen = self.known.iter().flatten().map(|w| counter(*w)).max();
        self.counter = self.counter.max(seen.unwrap_or(0)) + 1;
        let cas = self
            .known
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.is_some_and(|w| self.killed_mine(w)))
            .map(|(node, w)| (node, w.unwrap_or(0)))
            .collect();
        Renewal {
            next: self.counter,
            cas,
        }
    }

    /// Records the answer of `node` to a renewal CAS `expected → next`: the word the
    /// node held before, and whether the row's claim word, read right after the CAS in
    /// the same batch, held the owner's token. Returns whether the renewal counts on
    /// that node: the CAS took effect *and* the row was still the owner's.
    ///
    /// The claim check is what makes adopting any value learned from a failed CAS
    /// safe: after a takeover, the new owner's lease values only appear on a node
    /// after its claim landed there, so a CAS of the old owner from such a value reads
    /// a foreign claim and does not count (and on a majority, the lease is lost).
    pub fn absorb(
        &mut self,
        node: usize,
        expected: u64,
        next: u64,
        previous: u64,
        claim_is_mine: bool,
    ) -> bool {
        let swapped = previous == expected;
        if let Some(slot) = self.known.get_mut(node) {
            *slot = Some(if swapped { next } else { previous });
        }
        if let Some(foreign) = self.foreign.get_mut(node) {
            *foreign = !claim_is_mine;
        }
        swapped && claim_is_mine
    }

    /// Records that a renewal sent at `sent_at` (owner clock) succeeded on a majority.
    pub fn acknowledged(&mut self, sent_at: Nanos) {
        let until = sent_at.saturating_add(self.params.owner_term_ns());
        self.valid_until = Some(self.valid_until.map_or(until, |u| u.max(until)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn params() -> LeaseParams {
        LeaseParams {
            lease_ns: 2_000 * MS,
            renew_ns: 250 * MS,
            max_op_ns: 1_000 * MS,
            delivery_margin_ns: swarm_core::slot_recycling::DEFAULT_DELIVERY_MARGIN_NS,
        }
    }

    #[test]
    fn the_defaults_validate_and_bad_parameters_are_refused() {
        assert_eq!(params().validate(), Ok(()));
        let with = |lease_ns, renew_ns, max_op_ns| {
            LeaseParams {
                lease_ns,
                renew_ns,
                max_op_ns,
                delivery_margin_ns: 10 * MS,
            }
            .validate()
        };
        assert_eq!(with(0, 1, 1), Err(LeaseParamsError::Zero));
        assert!(matches!(
            with(1_000 * MS, 500 * MS, 100 * MS),
            Err(LeaseParamsError::RenewTooSlow { .. })
        ));
        // 7/8 of 2 s minus 10 ms is 1740 ms: 1500 + 250 does not fit, 1400 + 250 does.
        assert!(matches!(
            with(2_000 * MS, 250 * MS, 1_500 * MS),
            Err(LeaseParamsError::OpTooLong { term_ns, .. }) if term_ns == 1_740 * MS
        ));
        assert_eq!(with(2_000 * MS, 250 * MS, 1_400 * MS), Ok(()));
    }

    #[test]
    fn owner_term_and_observer_wait_bracket_the_lease_under_drift() {
        let p = params();
        assert_eq!(p.owner_term_ns(), 1_740 * MS);
        // 2 s · 9/8 + (1 s · 9/7 + 10 ms · 9/8).
        let grace = 1_285_714_286 + 11_250_000;
        assert_eq!(p.observer_wait_ns(), 2_250 * MS + grace);
        assert_eq!(swarm_core::slot_recycling::grace_ns(1_000 * MS), grace);
        // The worst case: the owner's clock runs 1/8 slow (its term lasts longer in
        // real time), the observer's 1/8 fast (its wait is shorter in real time).
        // Real time is measured in ns; owner term in real time = term / (7/8).
        let owner_real_end = p.owner_term_ns() * DRIFT_DIV / (DRIFT_DIV - 1);
        let observer_real_wait = p.observer_wait_ns() * DRIFT_DIV / (DRIFT_DIV + 1);
        assert!(owner_real_end <= p.lease_ns);
        assert!(
            observer_real_wait >= p.lease_ns + p.max_op_ns,
            "the observer waits out the lease and a whole operation"
        );
    }

    #[test]
    fn a_lease_is_valid_only_for_an_acknowledged_renewal() {
        let mut k = LeaseKeeper::new(params(), vec![Some(5), Some(7), None]);
        assert!(!k.valid_for(0, 0), "never acknowledged");
        let r = k.renewal();
        assert_eq!(r.next, 8, "above every counter seen");
        assert_eq!(r.cas, vec![(0, 5), (1, 7), (2, 0)]);
        k.acknowledged(100 * MS);
        assert!(k.valid_for(100 * MS, 1_000 * MS));
        assert!(k.valid_for(840 * MS, 1_000 * MS));
        assert!(!k.valid_for(841 * MS, 1_000 * MS), "1 s op past the term");
        // A later acknowledgement of an older renewal never shortens the lease.
        k.acknowledged(50 * MS);
        assert_eq!(k.valid_until(), Some(1_840 * MS));
    }

    #[test]
    fn a_kill_of_this_generation_is_never_renewed_over_but_an_older_one_is() {
        // Node 0 holds an earlier owner's killed counter 3; we start at base 8.
        let mut k = LeaseKeeper::new(params(), vec![Some(3 | KILLED), Some(7), Some(6)]);
        let r = k.renewal();
        assert_eq!(r.cas[0], (0, 3 | KILLED), "an older kill is taken over");
        for (node, expected) in r.cas.clone() {
            assert!(k.absorb(node, expected, r.next, expected, true));
        }
        assert_eq!(k.lost_nodes(), 0);
        // A reclaimer kills node 1 (our counter 8).
        assert!(!k.absorb(1, 8, 9, 8 | KILLED, true));
        assert_eq!(k.lost_nodes(), 1);
        let r = k.renewal();
        assert_eq!(r.next, 9);
        assert_eq!(r.cas, vec![(0, 8), (2, 8)], "node 1 is not renewed over");
        // A node that answers with another value teaches the next expected value and
        // pushes the counter above it.
        assert!(!k.absorb(2, 8, 9, 42, true));
        assert_eq!(k.renewal().next, 43);
        // A CAS that swaps on a node whose claim word is another client's does not
        // count, and marks the node lost.
        assert!(!k.absorb(2, 42, 43, 42, false));
        assert_eq!(k.lost_nodes(), 2);
    }
}
