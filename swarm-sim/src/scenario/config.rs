//! A scenario's knobs: the protocol, the workload's shape (clients, registers,
//! operations in flight, deletes), the failures to inject ([`Faults`]) and log slot
//! recycling ([`Recycling`]).

/// Which replication protocol the clients run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Safe-Guess over In-n-Out (SWARM).
    SafeGuess,
    /// DM-ABD, the two-roundtrip baseline.
    Abd,
}

/// Which faults to inject.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Crash `f` of the `2f + 1` nodes at random times.
    pub crash_minority: bool,
    /// Slow one node down by 20× for part of the run.
    pub slow_node: bool,
    /// Skew client clocks by up to ±[`Scenario::max_skew_ns`], so guesses go stale.
    pub clock_skew: bool,
    /// Crash up to a quarter of the clients mid-operation.
    pub crash_clients: bool,
    /// Delay about one message in eight by 5 to 40 µs (a per-node tail), so that a
    /// new tuple often sits on a minority while a majority still holds older ones:
    /// the new-old inversions that read write-backs and the same-writer rule of
    /// Safe-Guess must handle (appendix A, Lemma A.3; appendix C).
    pub late_messages: bool,
    /// Nodes take turns being 5 to 40 times slower for 5 to 50 µs: messages sent to
    /// a node in its spell arrive late, so tuples land on different majorities in
    /// different orders, and clients suspect different nodes (§6 fallbacks).
    pub slow_spells: bool,
    /// About a third of the client-node links are 3 to 15 times slower, redrawn
    /// every 40 µs or so: clients disagree about which nodes answer first, so one
    /// client's majority holds a tuple that another's misses (the wrong maximum of
    /// a max-register read concurrent with writes, SWARM §3.2 Figure 2).
    pub slow_links: bool,
    /// Nodes stall for up to 5 µs between two operations of one batch (one gap in
    /// five), so that other clients land between a buffer write and the CAS that
    /// publishes it, or between a pipelined read and its CAS (SWARM §2.1, §4.3).
    pub node_stalls: bool,
    /// Before about one operation in eight, a client's clock jumps to a new skew in
    /// ±[`Scenario::max_skew_ns`], so guesses go stale again after every
    /// re-synchronisation and writes take the slow path often (§3.2, §6).
    pub clock_jumps: bool,
    /// Before about one operation in four, a client starts suspecting a random node
    /// (as a timeout would make it): clients then contact different majorities
    /// (§6), so a tuple or tombstone on one client's majority can be missing from
    /// another's, and racing deletes reach different nodes first. Not in
    /// [`Faults::ALL`], whose scenarios' seeds the mutant record refers to
    /// (`scripts/mutants.sh`): tests ask for it.
    pub suspicions: bool,
    /// A few times during the run, node 1's copy of every out-of-place record (not
    /// the timestamp-lock words) is overwritten, as writes landing later than the
    /// delivery margin would overwrite recycled slots (`swarm_core::slot_recycling`): a
    /// maximum's buffer can be unusable on some of its holders (only node 1 is
    /// hit). Combine it with no node crash, which could take the last intact copy,
    /// and no client crash, which can leave a write on node 1 alone. Reads must find
    /// an intact copy: value fetches meet foreign records, so
    /// [`Outcome::recycled_fetches`](super::Outcome::recycled_fetches) is not zero under this fault.
    pub wiped_copies: bool,
    /// Every client's fabric clock (what its operation fences, slot-recycling graces
    /// and leases are measured on) runs at its own rate, drawn in `7/8..=9/8` of
    /// virtual time: the clock model every grace allows for
    /// (`swarm_core::slot_recycling::CLOCK_DRIFT_DIV`). Drawn from a generator of
    /// its own, so the other faults' schedules stay those of the seed. Not in
    /// [`Faults::ALL`] (its seeds' timings are what the mutant record refers to):
    /// tests ask for it.
    pub clock_rates: bool,
    /// About every 500 µs of the first half of the run, the next write into a log
    /// slot that some client sends to node 0 or 2 is held on its way
    /// ([`Fault::HoldWrite`](crate::Fault::HoldWrite)) until a later batch wrote the
    /// same bytes of that node (it lands right over them), or for up to four
    /// operation deadlines: a writer's record batch to a slow replica that would
    /// land over the record of a later write in the same slot (docs/pauses.md, H9),
    /// or a reader's write-back that would land over the writer's next record in the
    /// slot it copies into (H7). Node 1 is left alone, so that combined with
    /// [`Faults::wiped_copies`] (node 1's records lost) a value whose other copy a
    /// late batch garbled has none left. Needs [`Scenario::recycling`]. Not in
    /// [`Faults::ALL`]: tests ask for it.
    pub held_batches: bool,
}

impl Faults {
    /// No fault at all.
    pub const NONE: Self = Self {
        crash_minority: false,
        slow_node: false,
        clock_skew: false,
        crash_clients: false,
        late_messages: false,
        slow_spells: false,
        slow_links: false,
        node_stalls: false,
        clock_jumps: false,
        suspicions: false,
        wiped_copies: false,
        clock_rates: false,
        held_batches: false,
    };
    /// Every fault.
    pub const ALL: Self = Self {
        crash_minority: true,
        slow_node: true,
        clock_skew: true,
        crash_clients: true,
        late_messages: true,
        slow_spells: true,
        slow_links: true,
        node_stalls: true,
        clock_jumps: true,
        suspicions: false,
        wiped_copies: false,
        clock_rates: false,
        held_batches: false,
    };
}

/// A scenario's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Seed of the world and of every random choice.
    pub seed: u64,
    /// Operations per client (all its in-flight lanes together).
    pub ops_per_client: u32,
    /// Number of clients (each one writer).
    pub clients: u32,
    /// Operations each client keeps in flight at once, on one [`Client`](swarm_core::Client) (one
    /// writer id): its lanes pick keys independently, so one writer may have two
    /// writes in flight on one register.
    pub inflight: u32,
    /// Number of keys.
    pub keys: u32,
    /// Replicas per register (`2f + 1`); the cluster has this many nodes.
    pub replicas: u16,
    /// The protocol.
    pub protocol: Protocol,
    /// The faults.
    pub faults: Faults,
    /// Fraction of writes among operations, in percent.
    pub write_percent: u32,
    /// Fraction of deletes among operations, in percent (Safe-Guess only). Above 0,
    /// the history is a key-value one (SWARM-KV §5.3): reads are gets, writes are
    /// updates (which fail on a deleted key), and as many operations again are
    /// inserts, which re-create a deleted key in a fresh register.
    pub delete_percent: u32,
    /// Metadata words per register (`W`, §4.4).
    pub meta_words: u16,
    /// Virtual nanoseconds a client pauses between operations.
    pub think_ns: u64,
    /// Whether each lane's first operation is a write (an insert with deletes on),
    /// so that reads find values.
    pub write_first: bool,
    /// Length of a timestamp tick in virtual nanoseconds. Ticks longer than a
    /// roundtrip make concurrent writers guess the same ticks, which only the writer
    /// id orders, so the lower ids take the slow path.
    pub tick_ns: u64,
    /// Largest clock skew of [`Faults::clock_skew`] and [`Faults::clock_jumps`].
    pub max_skew_ns: u64,
    /// Log slot recycling (SWARM §4.5): `None` sizes every log for the whole run,
    /// as if nothing were recycled; `Some` gives each writer a tiny log and runs a
    /// background slot-recycling task per client.
    pub recycling: Option<Recycling>,
    /// Incarnations per client (1: one for the whole run). With more, each client's
    /// operations are split among that many incarnations of its writer id, one after
    /// the other: an incarnation stops cleanly once its operations returned, hands
    /// its log summary on (`swarm_core::summary`, through its encoding), and the next
    /// one resumes from it and examines the carried slots in the background.
    pub incarnations: u32,
    /// With [`Scenario::incarnations`] above 1: every incarnation but the last
    /// *crashes* instead of stopping cleanly, in the middle of one of its writes (at
    /// its first, second, ... post, [`Fault::CrashClientAtPost`](crate::Fault::CrashClientAtPost): the write reaches
    /// some replicas only, other lanes' operations stay in flight), and leaves no
    /// summary. A delivery margin later, the successor takes the writer id over as
    /// SWARM-KV does after a crash: it reads the id's tick ceiling from a majority,
    /// resumes with `Client::resume_crashed` above it (every slot carried, examined
    /// lazily) and persists the ceiling with `Client::set_tick_ceiling`, as every
    /// incarnation does. Client crash faults ([`Faults::crash_clients`]) are not
    /// scheduled: these crashes replace them. See [`Outcome::crash_resumes`](super::Outcome::crash_resumes).
    pub crash_restarts: bool,
    /// Largest value of a register (`Layout::payload_max`), which sizes log slots:
    /// larger slots make a writer's log span several examination steps of a resumed
    /// incarnation (`swarm_core::protocol::carried`, 64 KiB per node per step).
    pub payload_max: u32,
    /// Registers whose replicas sit at different offsets on different nodes
    /// (`swarm_core::RegisterLoc::placed`): node `n` keeps register `i` in register
    /// slot `i ^ (n mod 4)` (the register count rounded up to a multiple of 4), while
    /// the register's identity (its log records' owner tag) stays slot `i`'s address.
    pub placed_offsets: bool,
    /// How many times [`Faults::wiped_copies`] wipes node 1's records during the run.
    pub wipes: u32,
    /// How many times longer than its estimate (`ops_per_client · (3 µs +
    /// think_ns)`) the run is expected to last: the wipes of
    /// [`Faults::wiped_copies`] and the holds of [`Faults::held_batches`] are spread
    /// over that much (the other faults over the estimate). 1 by default; faults
    /// that slow every operation down stretch a run.
    pub stretch: u32,
}

/// A scenario's log slot recycling (see `swarm_core::slot_recycling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recycling {
    /// Slots in each writer's log (the tombstone slot included).
    pub log_slots: u32,
    /// The operation fence, `ProtocolConfig::max_op_ns`.
    pub max_op_ns: u64,
    /// `ProtocolConfig::delivery_margin_ns`: the simulated links deliver within
    /// microseconds, even late messages and slow spells.
    pub delivery_margin_ns: u64,
    /// Registers per background slot-recycling check, one check every `interval_ns`.
    pub budget: usize,
    /// Time between two background slot-recycling ticks.
    pub interval_ns: u64,
}

impl Scenario {
    /// A fault-free Safe-Guess scenario with 4 clients, 4 keys, 3 replicas, 50% writes.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            ops_per_client: 50,
            clients: 4,
            inflight: 1,
            keys: 4,
            replicas: 3,
            protocol: Protocol::SafeGuess,
            faults: Faults::NONE,
            write_percent: 50,
            delete_percent: 0,
            meta_words: 4,
            think_ns: 0,
            write_first: false,
            tick_ns: 100,
            max_skew_ns: 20_000,
            recycling: None,
            incarnations: 1,
            crash_restarts: false,
            payload_max: 32,
            placed_offsets: false,
            wipes: 16,
            stretch: 1,
        }
    }

    /// Whether the history uses the key-value model (deletes and inserts).
    pub(super) fn key_value(&self) -> bool {
        self.delete_percent > 0 && self.protocol == Protocol::SafeGuess
    }
}
