//! What a scenario run returns: the history for the linearizability checker, with
//! its roundtrip and read-loop measures ([`Outcome`], [`RoundtripHistogram`]).

use std::string::String;
use std::vec::Vec;

use crate::{ClientId, RunReport};
use swarm_checker::{History, Operation};

/// Roundtrips taken by operations of one kind: `counts[i]` operations took `i + 1`
/// roundtrips, the last bucket counting 4 or more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundtripHistogram {
    /// Operations by roundtrips: 1, 2, 3, 4+.
    pub counts: [u64; 4],
}

impl RoundtripHistogram {
    pub(super) fn add(&mut self, roundtrips: u32) {
        let bucket = (roundtrips.max(1) as usize - 1).min(3);
        self.counts[bucket] += 1;
    }

    /// Operations counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Fraction of operations that took exactly one roundtrip.
    pub fn one_roundtrip_fraction(&self) -> f64 {
        if self.total() == 0 {
            return 0.0;
        }
        self.counts[0] as f64 / self.total() as f64
    }
}

impl core::fmt::Display for RoundtripHistogram {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let total = self.total().max(1) as f64;
        let pct = |i: usize| 100.0 * self.counts[i] as f64 / total;
        write!(
            f,
            "1: {:.1}%  2: {:.1}%  3: {:.1}%  4+: {:.1}%  (n={})",
            pct(0),
            pct(1),
            pct(2),
            pct(3),
            self.total()
        )
    }
}

/// What a scenario produced.
#[derive(Debug)]
pub struct Outcome {
    /// Every operation, crashed ones without an end.
    pub history: History,
    /// Roundtrips of completed reads.
    pub reads: RoundtripHistogram,
    /// Roundtrips of completed writes.
    pub writes: RoundtripHistogram,
    /// The most iterations any Safe-Guess read needed.
    pub max_read_iterations: u32,
    /// Operations that returned an error (recorded as crashed: outcome unknown).
    pub errors: Vec<String>,
    /// The simulation run.
    pub run: RunReport,
    /// Log slots recycled, all clients together (clients that crashed excluded).
    pub recycled_slots: u64,
    /// The most log slots any surviving writer had in use when it finished.
    pub max_slots_in_use: u32,
    /// The longest operation that returned, in virtual ns (to size a fence).
    pub longest_op_ns: u64,
    /// Value fetches that found their buffer recycled and read again
    /// (`OpStats::recycled_fetches`, all operations together): zero when recycling
    /// keeps its rules, since every operation here has a deadline.
    pub recycled_fetches: u64,
    /// Deletes that raced another delete of the same value
    /// (`swarm_core::DeleteOutcome::Raced`), recorded with an unknown outcome.
    pub raced_deletes: u64,
    /// Incarnations that resumed from a log summary ([`Scenario::incarnations`](super::Scenario::incarnations)).
    pub summary_resumes: u64,
    /// Slots those incarnations carried over, all together.
    pub carried_slots: u64,
    /// Carried slots examined before their incarnation stopped, all together.
    pub carried_examined: u64,
    /// Incarnations that took a crashed writer id over
    /// ([`Scenario::crash_restarts`](super::Scenario::crash_restarts)).
    pub crash_resumes: u64,
    /// Writes of crashed incarnations that left for a minority of the replicas of
    /// their register only (abandoned there: the crash came between two posts).
    pub partial_writes: u64,
    /// The fewest writes that any incarnation which took a crashed writer id over
    /// completed (`u64::MAX` if none did): it started with every slot of its log
    /// taken, so beyond the log's size it wrote into slots that came back.
    pub min_writes_after_crash: u64,
    /// Writes (first or rewrite) of an incarnation whose timestamp is at or below
    /// one that an earlier incarnation of the same writer id sent for the same
    /// register ([`Scenario::crash_restarts`](super::Scenario::crash_restarts)): each must be empty.
    pub ticks_not_above_predecessors: Vec<String>,
}

#[derive(Default)]
pub(super) struct Record {
    pub(super) history: Vec<Operation>,
    pub(super) reads: RoundtripHistogram,
    pub(super) writes: RoundtripHistogram,
    pub(super) max_iterations: u32,
    pub(super) errors: Vec<String>,
    pub(super) recycled: u64,
    pub(super) max_in_use: u32,
    pub(super) longest_op_ns: u64,
    pub(super) recycled_fetches: u64,
    pub(super) raced_deletes: u64,
    pub(super) summary_resumes: u64,
    pub(super) carried_slots: u64,
    pub(super) carried_examined: u64,
    pub(super) crash_resumes: u64,
    pub(super) min_writes_after_crash: Option<u64>,
    /// Per incarnation of a crash-restarting client: its simulated client, writer
    /// index, incarnation number, and whether it crashed.
    pub(super) incarnations: Vec<(ClientId, u32, u32, bool)>,
}
