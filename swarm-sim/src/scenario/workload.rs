//! The workload generator: each client runs closed-loop lanes that pick an
//! operation (read, write, or, with deletes, insert and delete) on a random register,
//! run it through the chosen protocol, and record it for the checker.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::format;
use std::rc::Rc;
use std::string::{String, ToString};

use crate::{Fault, SimClock, SimFabric, SimRng};
use swarm_checker::{OpKind, Operation};
use swarm_core::fabric::NodeId;
use swarm_core::layout::Layout;
use swarm_core::{Client, OpStats};
use swarm_core::{ReadValue, RegisterCache, RegisterLoc, SwarmError, WriteOutcome};

use super::config::{Protocol, Scenario};
use super::faults::random_skew;
use super::outcome::Record;
use super::run::{Directory, register};

/// One operation a lane issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Read,
    Write,
    Delete,
    Insert,
}

impl Action {
    fn pick(scenario: &Scenario, first: bool, rng: &mut SimRng) -> Self {
        let insert = if scenario.key_value() {
            Self::Insert
        } else {
            Self::Write
        };
        if scenario.write_first && first {
            return insert;
        }
        let roll = rng.below(100);
        let deletes = if scenario.key_value() {
            u64::from(scenario.delete_percent)
        } else {
            0
        };
        let writes = u64::from(scenario.write_percent);
        if roll < deletes {
            Self::Delete
        } else if roll < 2 * deletes {
            insert
        } else if roll < 2 * deletes + writes {
            Self::Write
        } else {
            Self::Read
        }
    }

    /// How the history names it.
    fn kind(self, key_value: bool) -> OpKind {
        match (self, key_value) {
            (Self::Read, false) => OpKind::Read,
            (Self::Write, false) => OpKind::Write,
            (Self::Read, true) => OpKind::Get,
            (Self::Write, true) => OpKind::Update,
            (Self::Delete, _) => OpKind::Delete,
            (Self::Insert, _) => OpKind::Insert,
        }
    }
}

/// One of a client's concurrent sequences of operations.
pub(super) struct Lane {
    pub(super) scenario: Scenario,
    pub(super) client: Rc<Client<SimFabric, SimClock>>,
    pub(super) index: u32,
    pub(super) lane: u32,
    /// The client's operation number of this incarnation's first (values stay unique
    /// across incarnations).
    pub(super) first_op: u32,
    pub(super) layout: Layout,
    pub(super) directory: Rc<RefCell<Directory>>,
    pub(super) record: Rc<RefCell<Record>>,
    pub(super) seed: u64,
    /// Lanes of this client still running (its slot-recycling task stops at zero).
    pub(super) lanes_left: Rc<core::cell::Cell<u32>>,
    /// Where this lane's incarnation crashes, if it does.
    pub(super) crash: Option<CrashAt>,
    /// Writes of this incarnation that returned.
    pub(super) writes_done: Rc<core::cell::Cell<u64>>,
}

/// Where a crash-restarting incarnation crashes ([`Scenario::crash_restarts`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct CrashAt {
    /// The lane's first write from this operation number on (of the incarnation's).
    pub(super) op: u32,
    /// At this post from the write's start (1: before anything leaves).
    pub(super) post: u32,
}

/// What an operation returned, for the history.
struct Done {
    /// `None`: unknown (a delete that raced another, `DeleteOutcome::Raced`).
    ok: Option<bool>,
    /// The value a read returned.
    value: Option<String>,
    /// Whether it read (for the roundtrip histograms).
    read: bool,
}

pub(super) async fn lane_task(lane: Lane) {
    let Lane {
        scenario,
        client,
        index,
        lane,
        first_op,
        layout,
        directory,
        record,
        seed,
        lanes_left,
        mut crash,
        writes_done,
    } = lane;
    // Counts this lane down when it ends (also when a client crash drops it).
    struct LaneDone(Rc<core::cell::Cell<u32>>);
    impl Drop for LaneDone {
        fn drop(&mut self) {
            self.0.set(self.0.get().saturating_sub(1));
        }
    }
    let _done = LaneDone(lanes_left);
    let world = client.fabric().world().clone();
    let inflight = scenario.inflight.max(1);
    let process = u64::from(index) * u64::from(inflight) + u64::from(lane);
    let key_value = scenario.key_value();
    let mut rng = SimRng::new(seed);
    let mut ops = OpContext {
        scenario,
        client: &client,
        layout,
        directory: &directory,
        caches: BTreeMap::new(),
    };
    for (n, i) in (lane..scenario.ops_per_client)
        .step_by(inflight as usize)
        .enumerate()
    {
        if scenario.think_ns > 0 {
            client.fabric().sleep(scenario.think_ns).await;
        }
        if scenario.faults.clock_jumps && rng.chance(0.125) {
            client
                .clock()
                .set_skew(random_skew(&mut rng, scenario.max_skew_ns));
        }
        if scenario.faults.suspicions && rng.chance(0.25) {
            let node = NodeId(rng.below(u64::from(scenario.replicas)) as u16);
            client.suspicion().suspect(node, world.now());
        }
        let key = rng.below(u64::from(scenario.keys.max(1))) as u32;
        let action = Action::pick(&scenario, n == 0, &mut rng);
        let value = format!("c{index}-{}", first_op + i);
        if let Some(at) = crash.filter(|at| i >= at.op && action == Action::Write) {
            world.apply(Fault::CrashClientAtPost(client.fabric().id(), at.post));
            crash = None;
        }
        let start = world.now();
        // Recorded as crashed until it completes: a client crash drops this task here.
        let slot = {
            let mut r = record.borrow_mut();
            let written = matches!(action, Action::Write | Action::Insert).then_some(&*value);
            r.history.push(Operation::crashed(
                process,
                action.kind(key_value),
                key.to_string(),
                written,
                start,
            ));
            r.history.len() - 1
        };
        let stats = OpStats::new();
        let result = ops.run(action, key, &value, &stats).await;
        let end = world.now();
        let mut r = record.borrow_mut();
        r.longest_op_ns = r.longest_op_ns.max(end - start);
        r.recycled_fetches += u64::from(stats.recycled_fetches());
        match result {
            Ok(done) => {
                // A delete that raced another goes into the history with an unknown
                // outcome: it took effect, reporting neither answer.
                r.raced_deletes += u64::from(action == Action::Delete && done.ok.is_none());
                let op = &mut r.history[slot];
                op.end = Some(end);
                op.ok = done.ok;
                if done.read {
                    op.value = done.value;
                    r.reads.add(stats.roundtrips());
                    r.max_iterations = r.max_iterations.max(stats.iterations());
                } else {
                    r.writes.add(stats.roundtrips());
                    writes_done.set(writes_done.get() + 1);
                }
            }
            Err(e) => r.errors.push(format!(
                "client {index} op {i} ({:?}, {} ns, {} roundtrips): {e}",
                action,
                end - start,
                stats.roundtrips()
            )),
        }
    }
}

/// Why a scenario operation failed.
#[derive(Debug, thiserror::Error)]
enum OpError {
    /// The protocol failed.
    #[error(transparent)]
    Swarm(#[from] SwarmError),
    /// Every register of the layout went to an earlier insert.
    #[error("no free register left for an insert: size the scenario's layout larger")]
    NoFreeRegister,
}

/// What a lane needs to run operations: its caches are its own, so two lanes of one
/// client are two independent operations of one writer.
struct OpContext<'a> {
    scenario: Scenario,
    client: &'a Client<SimFabric, SimClock>,
    layout: Layout,
    directory: &'a RefCell<Directory>,
    caches: BTreeMap<u32, RegisterCache>,
}

impl OpContext<'_> {
    async fn run(
        &mut self,
        action: Action,
        key: u32,
        value: &str,
        stats: &OpStats,
    ) -> Result<Done, OpError> {
        let client = self.client;
        let current = self.directory.borrow().current[key as usize];
        // A get of an absent key returns nothing; the other operations fail.
        let absent = Done {
            ok: Some(action == Action::Read),
            value: None,
            read: action == Action::Read,
        };
        match (action, current) {
            (Action::Insert, _) => self.insert(key, current, value, stats).await,
            (_, None) => Ok(absent),
            (Action::Read, Some(reg)) => {
                let read = match self.scenario.protocol {
                    Protocol::SafeGuess => {
                        let (loc, cache) = self.register(reg);
                        client.read(&loc, cache, stats).await?
                    }
                    Protocol::Abd => {
                        let (loc, cache) = self.register(reg);
                        client.abd_read(&loc, cache, stats).await?
                    }
                };
                let value = match read {
                    ReadValue::Value(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
                    ReadValue::Empty | ReadValue::Deleted => None,
                };
                Ok(Done {
                    ok: Some(true),
                    value,
                    read: true,
                })
            }
            (Action::Write, Some(reg)) => {
                let outcome = match self.scenario.protocol {
                    Protocol::SafeGuess => {
                        let (loc, cache) = self.register(reg);
                        client.write(&loc, cache, stats, value.as_bytes()).await?
                    }
                    Protocol::Abd => {
                        let (loc, cache) = self.register(reg);
                        client
                            .abd_write(&loc, cache, stats, value.as_bytes())
                            .await?
                    }
                };
                Ok(Done {
                    // A register write always takes effect; an update fails on a
                    // deleted key.
                    ok: Some(!self.scenario.key_value() || outcome == WriteOutcome::Written),
                    value: None,
                    read: false,
                })
            }
            (Action::Delete, Some(reg)) => {
                let (loc, cache) = self.register(reg);
                let outcome = client.delete(&loc, cache, stats).await?;
                Ok(Done {
                    ok: outcome.removed(),
                    value: None,
                    read: false,
                })
            }
        }
    }

    /// Insert: an update of the current register if the key is there; otherwise
    /// (absent, or the update found it deleted) the value goes into a fresh register,
    /// published if the key has not moved meanwhile, else tried again.
    async fn insert(
        &mut self,
        key: u32,
        mut current: Option<u32>,
        value: &str,
        stats: &OpStats,
    ) -> Result<Done, OpError> {
        let client = self.client;
        let written = Done {
            ok: Some(true),
            value: None,
            read: false,
        };
        loop {
            if let Some(reg) = current {
                let (loc, cache) = self.register(reg);
                if client.write(&loc, cache, stats, value.as_bytes()).await?
                    == WriteOutcome::Written
                {
                    return Ok(written);
                }
            }
            let Some(fresh) = self.directory.borrow_mut().allocate() else {
                return Err(OpError::NoFreeRegister);
            };
            let (loc, cache) = self.register(fresh);
            client.write(&loc, cache, stats, value.as_bytes()).await?;
            let mut dir = self.directory.borrow_mut();
            let slot = &mut dir.current[key as usize];
            if *slot == current {
                *slot = Some(fresh);
                return Ok(written);
            }
            current = *slot;
        }
    }

    fn register(&mut self, index: u32) -> (RegisterLoc, &mut RegisterCache) {
        let scenario = &self.scenario;
        let loc = register(
            &self.layout,
            scenario.replicas,
            scenario.placed_offsets,
            index,
        );
        (loc, self.caches.entry(index).or_default())
    }
}
