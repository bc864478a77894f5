//! Safe-Guess registers on shared memory, many *processes*, one of them killed by
//! `SIGKILL` in the middle of an operation: the merged history must be linearizable
//! (SWARM §2.2 "any number of application threads can fail", §3, appendix C;
//! ARCHITECTURE.md, "How correctness is tested").
//!
//! The parent test creates a three-node `ShmCluster` and re-executes this test binary
//! as client processes (`--exact protocol_child`, configured by environment
//! variables), each with its own writer id. A client opens the cluster itself, checks
//! in, waits for the start flag and runs the seeded workload of `protocol_support`
//! (mixed Safe-Guess reads and writes of unique values on two or three registers,
//! two clients with emulated RDMA-like roundtrips and two with skewed clocks). A
//! client with an emulated roundtrip yields its core while it waits for a completion
//! (`PauseBeforeProgress`), so operations of different processes overlap even when the host's
//! load leaves the clients one core (about half of them do; the run prints how many).
//! Every client journals each operation as JSON Lines with `CLOCK_MONOTONIC` times,
//! which all processes of the host share: a record at the call and one at the return,
//! each one `write(2)` (see `journal.rs`), so a process killed mid-operation leaves
//! its unfinished operation behind as a call record. The parent merges the journals into
//! one history and runs `swarm_checker` on it.
//!
//! Killing *mid-operation*, for certain and without timing assumptions: the victim
//! runs with an emulated roundtrip time (so most of its time is spent inside
//! operations) and publishes, in a control word of node 0, the index of the operation
//! it is in (set after its call record is journaled, cleared before its return record
//! is). The parent stops it with `SIGSTOP`, waits until it is stopped, reads the word,
//! and either kills it with `SIGKILL` right there or lets it continue (`SIGCONT`) and
//! tries again. Wherever it stopped inside the operation (a batch half executed on a
//! node, a guessed tuple on one replica but not yet a majority, a spin waiting for a
//! completion), the others keep going: reads that find its GUESSED tuple lock it in
//! READ mode and return it (SWARM §3.2), and the checker may place the unfinished
//! operation anywhere after its call, or nowhere. The survivors are made to run a
//! few hundred more operations after the kill.
//!
//! Interleavings are not reproducible, but the operation mix of every client is
//! (`SWARM_SHM_SEED`); a failing history is saved and its path printed.

#[allow(dead_code)] // Each test crate uses a different part of the shared support.
mod protocol_support;

#[path = "protocol_processes/journal.rs"]
mod journal;

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use swarm_checker::{History, OpKind};
use swarm_core::header::HEADER_SIZE;
use swarm_core::{Client, Clock, Fabric, NodeId, ProtocolConfig};
use swarm_shm::{NodeMemory, ScratchDir, ShmCluster};

use journal::Journal;
use protocol_support::{
    CONTROL_BYTES, NODES, PauseBeforeProgress, SEED_VAR, Shape, Skew, WallClock, Worker, Workload,
    assert_linearizable, writer_id,
};

/// The child's configuration ([`ChildSpec`]); unset in a normal test run.
const CHILD_VAR: &str = "SWARM_SHM_PROTOCOL_CHILD";
/// The cluster directory, for the child to open.
const DIR_VAR: &str = "SWARM_SHM_PROTOCOL_DIR";
/// Prefixes a child's one-line summary on its standard output.
const RESULT_TAG: &str = "SWARM-PROTOCOL-CHILD";

/// The node whose control area holds the coordination words below.
const CONTROL: NodeId = NodeId(0);
/// Each child increments it once it is ready to start.
const READY: u64 = HEADER_SIZE;
/// Set to 1 by the parent once every child is ready.
const START: u64 = HEADER_SIZE + 8;
/// Set to 1 by the parent once the victim is dead.
const VICTIM_GONE: u64 = HEADER_SIZE + 16;
/// Operations the victim has completed.
const VICTIM_DONE: u64 = HEADER_SIZE + 24;
/// `i + 1` while the victim is inside its operation `i` (between its call and return
/// records), 0 between operations.
const VICTIM_IN_OP: u64 = HEADER_SIZE + 32;
const _: () = assert!(VICTIM_IN_OP + 8 <= HEADER_SIZE + CONTROL_BYTES);

/// Children and the parent give up after this long: a hung run must not hang the
/// suite. Generous: a normal run takes well under a second.
const DEADLINE: Duration = Duration::from_secs(60);

// ------------------------------------------------------------------ child side

/// What a child process does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Runs its operations to the end and reports.
    Survivor,
    /// Runs until the parent kills it.
    Victim,
}

/// A child's configuration, passed in `SWARM_SHM_PROTOCOL_CHILD` as
/// `role=survivor writer=2 writers=5 keys=2 log_writes=2000 ops=800 after_kill=300
/// rtt=0 skew=0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChildSpec {
    role: Role,
    /// This client's writer id (unique in the run).
    writer: u32,
    /// Writers with a log; with `keys` and `log_writes`, the cluster shape, which
    /// every process must agree on.
    writers: u16,
    keys: u32,
    log_writes: u32,
    /// A survivor runs at least this many operations; the victim at most this many
    /// (then it waits to be killed, and the parent reports that it was too slow).
    ops: u32,
    /// A survivor also runs at least this many operations that start after the
    /// parent announced the victim's death.
    after_kill: u32,
    /// Emulated roundtrip time of the child's fabric.
    rtt_ns: u64,
    /// Fixed clock skew (0: none).
    skew_ns: i64,
}

impl ChildSpec {
    fn to_env(self) -> String {
        let role = match self.role {
            Role::Survivor => "survivor",
            Role::Victim => "victim",
        };
        format!(
            "role={role} writer={} writers={} keys={} log_writes={} ops={} after_kill={} \
             rtt={} skew={}",
            self.writer,
            self.writers,
            self.keys,
            self.log_writes,
            self.ops,
            self.after_kill,
            self.rtt_ns,
            self.skew_ns
        )
    }

    fn parse(text: &str) -> Result<Self, String> {
        let field = |name: &str| -> Result<&str, String> {
            text.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .ok_or_else(|| format!("no {name}=... in {text:?}"))
        };
        fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, String> {
            value
                .parse()
                .map_err(|_| format!("{name}={value:?} is not a number"))
        }
        let role = match field("role")? {
            "survivor" => Role::Survivor,
            "victim" => Role::Victim,
            other => return Err(format!("unknown role {other:?}")),
        };
        Ok(Self {
            role,
            writer: number("writer", field("writer")?)?,
            writers: number("writers", field("writers")?)?,
            keys: number("keys", field("keys")?)?,
            log_writes: number("log_writes", field("log_writes")?)?,
            ops: number("ops", field("ops")?)?,
            after_kill: number("after_kill", field("after_kill")?)?,
            rtt_ns: number("rtt", field("rtt")?)?,
            skew_ns: number("skew", field("skew")?)?,
        })
    }

    fn shape(&self) -> Shape {
        Shape {
            meta_words: 4,
            writers: self.writers,
            keys: self.keys,
            writes_per_writer: self.log_writes,
        }
    }
}

/// The coordination words on node 0, accessed directly (they are not part of what
/// is tested).
struct Control<'a>(&'a NodeMemory);

impl Control<'_> {
    fn load(&self, addr: u64) -> u64 {
        let mut word = [0u8; 8];
        self.0
            .read(addr, &mut word)
            .expect("control words are in bounds");
        u64::from_le_bytes(word)
    }

    fn store(&self, addr: u64, value: u64) {
        self.0
            .write(addr, &value.to_le_bytes())
            .expect("control words are in bounds");
    }

    fn increment(&self, addr: u64) {
        let mut expected = self.load(addr);
        loop {
            let previous = self
                .0
                .cas(addr, expected, expected + 1)
                .expect("control words are in bounds and aligned");
            if previous == expected {
                return;
            }
            expected = previous;
        }
    }
}

/// Entry point of the client processes; does nothing in a normal test run.
#[test]
fn protocol_child() {
    let Ok(text) = std::env::var(CHILD_VAR) else {
        return;
    };
    let spec = ChildSpec::parse(&text).unwrap_or_else(|e| panic!("{CHILD_VAR}: {e}"));
    let dir = PathBuf::from(std::env::var(DIR_VAR).expect("the parent sets the cluster dir"));
    let cluster = Arc::new(ShmCluster::open(&dir).expect("the child opens the cluster"));
    let control = Control(cluster.node(CONTROL).expect("the cluster has node 0"));
    let shape = spec.shape();
    let skew = match spec.skew_ns {
        0 => Skew::None,
        ns => Skew::Fixed(ns),
    };
    let client = Client::new(
        PauseBeforeProgress {
            fabric: cluster.client_with(spec.rtt_ns),
            pause: thread::yield_now,
        },
        WallClock::new(&cluster, skew),
        shape.layout(),
        writer_id(spec.writer),
        ProtocolConfig::default(),
    )
    .expect("a client for a writer with a log");
    let workload = Workload {
        seed: protocol_support::seed(),
        write_percent: 50,
    };
    let mut worker = Worker::new(client, shape, workload);
    let mut journal = Journal::create(journal::path(&dir, spec.writer)).expect("a new journal");

    control.increment(READY);
    let deadline = Instant::now() + DEADLINE;
    while control.load(START) == 0 {
        assert!(Instant::now() < deadline, "the parent never said start");
        thread::yield_now();
    }
    match spec.role {
        Role::Survivor => run_survivor(&spec, &mut worker, &mut journal, &control, deadline),
        Role::Victim => run_victim(&spec, &mut worker, &mut journal, &control, deadline),
    }
    // On a line of its own: libtest has already printed "test protocol_child ... ".
    println!("\n{RESULT_TAG} writer {}: {}", spec.writer, worker.tally);
    assert!(
        worker.tally.errors.is_empty(),
        "writer {}: operations failed with every node alive: {:#?}",
        spec.writer,
        worker.tally.errors
    );
}

fn run_survivor<F: Fabric, C: Clock>(
    spec: &ChildSpec,
    worker: &mut Worker<F, C>,
    journal: &mut Journal,
    control: &Control<'_>,
    deadline: Instant,
) {
    let (mut done, mut after_kill) = (0, 0);
    while done < spec.ops || after_kill < spec.after_kill {
        let victim_gone = control.load(VICTIM_GONE) != 0;
        worker.step(&mut |op| journal.record(op));
        done += 1;
        after_kill += u32::from(victim_gone);
        // A process finishes hundreds of operations within one time slice; yielding
        // often interleaves all of them on two cores.
        if done % 4 == 0 {
            thread::yield_now();
        }
        assert!(
            Instant::now() < deadline,
            "writer {}: still running after {DEADLINE:?} ({done} operations, {after_kill} \
             after the kill)",
            spec.writer
        );
    }
}

fn run_victim<F: Fabric, C: Clock>(
    spec: &ChildSpec,
    worker: &mut Worker<F, C>,
    journal: &mut Journal,
    control: &Control<'_>,
    deadline: Instant,
) {
    for i in 0..u64::from(spec.ops) {
        let mut calling = true;
        worker.step(&mut |op| {
            if calling {
                journal.record(op);
                control.store(VICTIM_IN_OP, i + 1);
            } else {
                control.store(VICTIM_IN_OP, 0);
                journal.record(op);
            }
            calling = !calling;
        });
        control.store(VICTIM_DONE, i + 1);
    }
    // Not killed yet: the parent sees VICTIM_DONE at the maximum and fails the test.
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    panic!("the victim was never killed");
}

// ----------------------------------------------------------------- parent side

/// A child process; killed and reaped when dropped (a failing parent must not leave
/// clients spinning).
struct ChildProcess {
    name: String,
    child: Child,
    /// Reaped outside of `std` (`waitpid` in [`kill_mid_operation`]).
    reaped: bool,
}

/// How a child process ended.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl ChildProcess {
    fn spawn(dir: &Path, spec: ChildSpec, seed: u64) -> Self {
        let child = Command::new(std::env::current_exe().expect("test binary path"))
            .args([
                "--exact",
                "protocol_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_VAR, spec.to_env())
            .env(DIR_VAR, dir)
            .env(SEED_VAR, seed.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a child process");
        Self {
            name: format!("{:?} writer {}", spec.role, spec.writer).to_lowercase(),
            child,
            reaped: false,
        }
    }

    /// Panics with the child's output if it has exited already.
    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("poll a child") {
            let out = self.output(status);
            panic!(
                "{} exited early ({status}):\n{}\n{}",
                self.name, out.stdout, out.stderr
            );
        }
    }

    /// Waits for the child to exit, killing it after `deadline`. Children print a
    /// few lines only, so reading their pipes after they exit cannot deadlock.
    fn finish(&mut self, deadline: Instant) -> Finished {
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("poll a child") {
                break status;
            }
            assert!(Instant::now() < deadline, "{} timed out", self.name);
            thread::sleep(Duration::from_millis(5));
        };
        self.output(status)
    }

    fn output(&mut self, status: ExitStatus) -> Finished {
        let read = |pipe: Option<&mut dyn Read>| {
            let mut text = String::new();
            if let Some(pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        };
        let stdout = read(self.child.stdout.as_mut().map(|p| p as &mut dyn Read));
        let stderr = read(self.child.stderr.as_mut().map(|p| p as &mut dyn Read));
        Finished {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `signal` to process `pid`.
fn send_signal(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; `pid` is a
    // child of this process that has not been reaped, so it cannot be a recycled pid.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {signal}) failed: {}",
        std::io::Error::last_os_error()
    );
}

/// Waits until child `pid` is stopped; `Err(raw wait status)` if it exited instead
/// (it is then reaped).
fn wait_until_stopped(pid: libc::pid_t) -> Result<(), libc::c_int> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is a valid, writable int that outlives the call; `pid` is an
        // unreaped child of this process.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
        if rc == pid {
            return if libc::WIFSTOPPED(status) {
                Ok(())
            } else {
                Err(status)
            };
        }
        let error = std::io::Error::last_os_error();
        assert_eq!(
            error.kind(),
            std::io::ErrorKind::Interrupted,
            "waitpid({pid}) failed: {error}"
        );
    }
}

/// Kills `victim` with `SIGKILL` while it is inside an operation (see the module
/// docs); returns the index of that operation.
fn kill_mid_operation(victim: &mut ChildProcess, control: &Control<'_>, max_ops: u32) -> u64 {
    let pid = libc::pid_t::try_from(victim.child.id()).expect("a pid fits pid_t");
    let deadline = Instant::now() + DEADLINE;
    for attempt in 0u64.. {
        send_signal(pid, libc::SIGSTOP);
        if let Err(status) = wait_until_stopped(pid) {
            victim.reaped = true;
            panic!("the victim exited (wait status {status:#x}) before it could be killed");
        }
        let in_op = control.load(VICTIM_IN_OP);
        if in_op != 0 {
            victim.child.kill().expect("SIGKILL the victim");
            let status = victim.child.wait().expect("reap the victim");
            assert_eq!(
                status.signal(),
                Some(libc::SIGKILL),
                "the victim did not die of SIGKILL: {status}"
            );
            println!(
                "victim killed inside operation {} (attempt {attempt})",
                in_op - 1
            );
            return in_op - 1;
        }
        let done = control.load(VICTIM_DONE);
        assert!(
            done < u64::from(max_ops) && Instant::now() < deadline,
            "the victim was never caught inside an operation ({done} done, {attempt} \
             attempts): is the host overloaded?"
        );
        send_signal(pid, libc::SIGCONT);
        thread::sleep(Duration::from_micros(100));
    }
    unreachable!("the loop above returns or panics")
}

/// A client to kill in a run.
#[derive(Clone, Copy, Debug)]
struct VictimPlan {
    rtt_ns: u64,
    /// Kill it once it completed this many operations.
    kill_after: u64,
    /// The most it runs (it must be killed before).
    max_ops: u32,
    /// What the survivors run after the kill.
    survivors_after_kill: u32,
}

/// One multi-process run.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    name: &'static str,
    keys: u32,
    survivors: u32,
    /// Operations per survivor.
    ops: u32,
    rtt_ns: fn(u32) -> u64,
    skew_ns: fn(u32) -> i64,
    victim: Option<VictimPlan>,
}

/// What a run produced, for the tests' own assertions.
#[derive(Debug)]
struct RunResult {
    history: History,
    /// The client that was killed, if any.
    killed: Option<Killed>,
}

/// The client killed in a run, and where.
#[derive(Debug)]
struct Killed {
    writer: u32,
    /// The index of the operation it was killed in.
    op: u64,
    /// The value that operation was writing, if it was a write.
    value: Option<String>,
}

/// Runs `scenario`, merges the journals, checks the history and the children.
fn run(scenario: &Scenario) -> RunResult {
    // Runs take turns: on two cores, two at once would barely overlap their clients.
    static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let seed = protocol_support::seed();
    let victim = scenario.victim;
    let after_kill = victim.map_or(0, |v| v.survivors_after_kill);
    let writers = scenario.survivors + u32::from(victim.is_some());
    let spec = |role, writer| ChildSpec {
        role,
        writer,
        writers: u16::try_from(writers).expect("a few writers"),
        keys: scenario.keys,
        log_writes: (scenario.ops + after_kill).max(victim.map_or(0, |v| v.max_ops)),
        ops: scenario.ops,
        after_kill,
        rtt_ns: (scenario.rtt_ns)(writer),
        skew_ns: (scenario.skew_ns)(writer),
    };
    let dir = ScratchDir::new("swarm-shm-protocol-processes").expect("scratch directory");
    let cluster = ShmCluster::create(
        dir.path(),
        NODES,
        spec(Role::Survivor, 0).shape().node_bytes(),
    )
    .expect("create the cluster");
    let control = Control(cluster.node(CONTROL).expect("node 0"));

    let mut survivors: Vec<_> = (0..scenario.survivors)
        .map(|w| ChildProcess::spawn(dir.path(), spec(Role::Survivor, w), seed))
        .collect();
    let mut victim_process = victim.map(|v| {
        let spec = ChildSpec {
            ops: v.max_ops,
            rtt_ns: v.rtt_ns,
            ..spec(Role::Victim, scenario.survivors)
        };
        ChildProcess::spawn(dir.path(), spec, seed)
    });

    let deadline = Instant::now() + DEADLINE;
    while control.load(READY) < u64::from(writers) {
        survivors
            .iter_mut()
            .chain(victim_process.as_mut())
            .for_each(ChildProcess::assert_running);
        assert!(Instant::now() < deadline, "the children did not check in");
        thread::sleep(Duration::from_millis(1));
    }
    control.store(START, 1);

    let killed_in = victim.zip(victim_process.as_mut()).map(|(plan, process)| {
        while control.load(VICTIM_DONE) < plan.kill_after {
            process.assert_running();
            assert!(Instant::now() < deadline, "the victim made no progress");
            thread::sleep(Duration::from_micros(200));
        }
        let op = kill_mid_operation(process, &control, plan.max_ops);
        control.store(VICTIM_GONE, 1);
        op
    });
    let finished: Vec<_> = survivors
        .iter_mut()
        .map(|child| child.finish(deadline + Duration::from_secs(10)))
        .collect();

    // Merge the journals.
    let mut history = History::new();
    let mut killed = None;
    for writer in 0..writers {
        let path = journal::path(dir.path(), writer);
        let entries = journal::read(&path).unwrap_or_else(|e| panic!("{e}"));
        if let Some(op) = killed_in.filter(|_| writer == scenario.survivors) {
            assert_eq!(
                (entries.returned() as u64, entries.unfinished),
                (op, 1),
                "the victim's journal does not end inside operation {op}"
            );
            let last = entries.ops.last().expect("the unfinished operation");
            let value = (last.op == OpKind::Write)
                .then(|| last.value.clone())
                .flatten();
            killed = Some(Killed { writer, op, value });
        } else {
            assert_eq!(
                (entries.unfinished, entries.torn_tail),
                (0, false),
                "writer {writer} left an unfinished journal"
            );
        }
        for op in entries.ops {
            history
                .push(op)
                .expect("journaled operations are well formed");
        }
    }
    let what = format!("{} ({} processes, seed {seed})", scenario.name, writers);
    for out in &finished {
        if let Some(line) = out.stdout.lines().find(|l| l.starts_with(RESULT_TAG)) {
            println!("{what}: {line}");
        }
    }
    println!(
        "{what}: {} of {} completed operations overlapped another on the same register",
        overlapping(&history),
        history.len() - history.crashed_count()
    );
    assert_linearizable(&history, scenario.name, seed);
    for (child, out) in survivors.iter().zip(&finished) {
        assert!(
            out.status.success(),
            "{what}: {} failed ({}):\n{}\n{}",
            child.name,
            out.status,
            out.stdout,
            out.stderr
        );
    }
    RunResult { history, killed }
}

/// How many completed operations overlap in time with another completed operation on
/// the same key (necessarily another client's: a client's operations are sequential):
/// how concurrent the run really was, which depends on the host's load.
fn overlapping(history: &History) -> usize {
    let mut by_key: std::collections::HashMap<String, Vec<(u64, u64)>> = Default::default();
    for n in history.operations() {
        if let Some(end) = n.op.end {
            by_key.entry(n.op.key).or_default().push((n.op.start, end));
        }
    }
    let mut count = 0;
    for mut intervals in by_key.into_values() {
        intervals.sort_unstable();
        let mut overlaps = vec![false; intervals.len()];
        // The latest end so far, and whose it is.
        let mut reach: Option<(u64, usize)> = None;
        for (i, &(start, end)) in intervals.iter().enumerate() {
            if let Some((until, j)) = reach
                && start < until
            {
                overlaps[i] = true;
                overlaps[j] = true;
            }
            if reach.is_none_or(|(until, _)| end > until) {
                reach = Some((end, i));
            }
        }
        count += overlaps.iter().filter(|o| **o).count();
    }
    count
}

/// Roundtrip times of the clients: two with RDMA-like roundtrips, whose longer
/// operations overlap more of the others'.
fn mixed_rtt_ns(writer: u32) -> u64 {
    match writer {
        1 => 1_500,
        3 => 5_000,
        _ => 0,
    }
}

#[test]
fn processes_on_shared_registers_are_linearizable() {
    let result = run(&Scenario {
        name: "processes",
        keys: 3,
        survivors: 4,
        ops: 1500,
        rtt_ns: mixed_rtt_ns,
        // Two clients 40 µs ahead and behind: stale guesses take the slow path
        // (TRYLOCK in WRITE mode, rewrite) across processes.
        skew_ns: |w| match w {
            1 => 40_000,
            2 => -40_000,
            _ => 0,
        },
        victim: None,
    });
    assert_eq!(result.history.len(), 4 * 1500);
    assert_eq!(result.history.crashed_count(), 0);
}

#[test]
fn a_client_killed_mid_operation_leaves_a_linearizable_history() {
    let result = run(&Scenario {
        name: "processes, one killed",
        keys: 2,
        survivors: 4,
        ops: 800,
        rtt_ns: mixed_rtt_ns,
        skew_ns: |_| 0,
        victim: Some(VictimPlan {
            // Below the 50 µs after which a step also asks the third replica.
            rtt_ns: 20_000,
            kill_after: 150,
            max_ops: 3000,
            survivors_after_kill: 300,
        }),
    });
    let Killed { writer, op, value } = result.killed.expect("the victim was killed");
    assert!(result.history.crashed_count() >= 1);
    // Informational: whether the survivors saw the unfinished write take effect.
    if let Some(value) = value {
        let seen = result
            .history
            .operations()
            .iter()
            .filter(|o| o.op.op == OpKind::Read && o.op.value.as_deref() == Some(&value))
            .count();
        println!("writer {writer} died writing {value} (operation {op}); {seen} reads returned it");
    } else {
        println!("writer {writer} died reading (operation {op})");
    }
}
