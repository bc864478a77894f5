//! Memory hints: a Safe-Guess read or write hints the fabric at every byte its
//! batches touch before posting them ([`Fabric::prefetch`]), so that on local memory
//! the cache misses of the replicas, and of the places in one replica, overlap.
//!
//! Hints change no result, so only a fabric that records them can tell whether they
//! are given: [`Hints`] traces the in-process fabric ([`Traced`]), records every hint
//! of an operation, and checks each batch the operation posts against them.

use std::cell::{Cell, RefCell};

use swarm_core::encoding::WriterId;
use swarm_core::fabric::{FailNodes, Traced, Tracer};
use swarm_core::layout::Layout;
use swarm_core::{
    Batch, Client, Fabric, FabricError, FixedClock, LocalExecutor, MemCluster, MemFabric, NodeId,
    Op, OpStats, ProtocolConfig, ReadValue, RegisterCache, RegisterLoc, Replicas, SwarmError,
    WriteOutcome, block_on_future,
};

/// A tracer that records the hints a fabric is given and, for every batch posted
/// (waited for or in the background), the operations of it whose bytes no earlier
/// hint covered.
#[derive(Default)]
struct Hints {
    hints: RefCell<Vec<(NodeId, u64, u64)>>,
    /// `(node, op index, addr, len)` of every operation posted without a hint
    /// covering its bytes.
    unhinted: RefCell<Vec<(NodeId, usize, u64, u64)>>,
    /// Batches submitted so far (waited for, not in the background).
    submitted: Cell<usize>,
    /// How many hints had been given when the first batch was submitted.
    hints_at_first_submit: Cell<Option<usize>>,
}

/// A fabric whose hints are recorded.
type Hinted<F> = Traced<F, Hints>;

impl Hints {
    /// Forgets what was recorded: the next operation starts with no hint.
    fn reset(&self) {
        self.hints.borrow_mut().clear();
        self.unhinted.borrow_mut().clear();
        self.submitted.set(0);
        self.hints_at_first_submit.set(None);
    }

    /// Records the operations of `batch` that no hint to `node` covers.
    fn check(&self, node: NodeId, batch: &Batch) {
        for (i, op) in batch.ops().iter().enumerate() {
            let (addr, len) = match op {
                Op::Read { addr, len } => (*addr, u64::from(*len)),
                Op::Write { addr, data } => (*addr, data.len() as u64),
                Op::Cas { addr, .. } => (*addr, 8),
            };
            if !self.covered(node, addr, len) {
                self.unhinted.borrow_mut().push((node, i, addr, len));
            }
        }
    }

    fn covered(&self, node: NodeId, addr: u64, len: u64) -> bool {
        self.hints
            .borrow()
            .iter()
            .any(|&(n, a, l)| n == node && a <= addr && addr + len <= a + l)
    }
}

impl Tracer for Hints {
    fn batch(&self, node: NodeId, batch: &Batch) {
        self.submitted.set(self.submitted.get() + 1);
        if self.hints_at_first_submit.get().is_none() {
            self.hints_at_first_submit
                .set(Some(self.hints.borrow().len()));
        }
        self.check(node, batch);
    }
    // Background posts (a write's VERIFIED marks and in-place copy) are checked too.
    fn detached(&self, node: NodeId, batch: &Batch) {
        self.check(node, batch);
    }
    fn prefetch(&self, node: NodeId, addr: u64, len: u64) {
        self.hints.borrow_mut().push((node, addr, len));
    }
}

fn client(cluster: &MemCluster) -> Client<Hinted<MemFabric>, FixedClock> {
    client_on(cluster.client())
}

/// Writer 1 on `fabric`, whose hints are recorded.
fn client_on<F: Fabric>(fabric: F) -> Client<Hinted<F>, FixedClock> {
    let layout = Layout::builder()
        .payload_max(64)
        .meta_words(8)
        .log_base(1 << 16)
        .writers(4)
        .slots_per_writer(64)
        .build()
        .unwrap();
    Client::new(
        Traced::new(fabric, Hints::default()),
        FixedClock(1_000),
        layout,
        WriterId::new(1).unwrap(),
        ProtocolConfig::default(),
    )
    .unwrap()
}

/// Every batch a common-case write or read posts was hinted in full first: the
/// metadata words, the out-of-place buffer and the in-place block alike (a write's
/// VERIFIED marks and in-place copy, posted in the background, included).
#[test]
fn reads_and_writes_hint_every_byte_they_touch_before_posting() {
    let cluster = MemCluster::new(3, 1 << 20);
    let client = client(&cluster);
    let fabric = client.fabric();
    let reg = RegisterLoc::at(4096, Replicas::all(3, 0).unwrap());
    let mut cache = RegisterCache::new();
    for i in 0..4u8 {
        fabric.tracer().reset();
        let stats = OpStats::new();
        let written = block_on_future(fabric, client.write(&reg, &mut cache, &stats, &[i; 40]));
        assert_eq!(written, Ok(Ok(WriteOutcome::Written)), "write {i}");
        assert_eq!(stats.roundtrips(), 1, "write {i}: the common case");
        assert!(
            fabric.tracer().submitted.get() >= 2,
            "write {i}: posts to a majority"
        );
        assert_eq!(
            *fabric.tracer().unhinted.borrow(),
            [],
            "write {i}: operations posted without a hint (node, op, addr, len)"
        );

        fabric.tracer().reset();
        let stats = OpStats::new();
        let read = block_on_future(fabric, client.read(&reg, &mut cache, &stats));
        assert_eq!(read, Ok(Ok(ReadValue::Value(vec![i; 40]))), "read {i}");
        assert!(
            fabric.tracer().submitted.get() >= 2,
            "read {i}: reads a majority"
        );
        assert_eq!(
            *fabric.tracer().unhinted.borrow(),
            [],
            "read {i}: operations posted without a hint (node, op, addr, len)"
        );
    }
}

type TestClient<F> = Client<Hinted<F>, FixedClock>;

/// One Safe-Guess read of `reg`, interleaved with the other operations of its thread
/// or not.
async fn read_register<F: Fabric>(
    client: &TestClient<F>,
    reg: RegisterLoc,
    interleaved: bool,
) -> Result<ReadValue, SwarmError> {
    let stats = if interleaved {
        OpStats::interleaved()
    } else {
        OpStats::new()
    };
    client.read(&reg, &mut RegisterCache::new(), &stats).await
}

fn register_at(addr: u64) -> RegisterLoc {
    RegisterLoc::at(addr, Replicas::all(3, 0).unwrap())
}

/// Operations in flight on one thread that are `OpStats::interleaved` all hint their
/// memory before any of them posts: each yields after its hints, so their cache
/// misses overlap. Without it, the first operation posts before the others have hinted
/// anything (the control case, which shows the test can tell the two apart).
#[test]
fn interleaved_operations_hint_before_any_of_them_posts() {
    const OPS: u64 = 4;
    for interleaved in [true, false] {
        let cluster = MemCluster::new(3, 1 << 20);
        let client = client(&cluster);
        let fabric = client.fabric();
        let registers: Vec<RegisterLoc> = (1..=OPS).map(|i| register_at(i * 4096)).collect();
        for (i, reg) in registers.iter().enumerate() {
            let written = block_on_future(
                fabric,
                client.write(
                    reg,
                    &mut RegisterCache::new(),
                    &OpStats::new(),
                    &[i as u8; 40],
                ),
            );
            assert_eq!(written, Ok(Ok(WriteOutcome::Written)));
        }
        // Fresh hints, and lines no longer in cache do not matter: what is checked is
        // the order of hints and posts.
        fabric.tracer().reset();
        let mut executor = LocalExecutor::new();
        for reg in &registers {
            executor.spawn(read_register(&client, reg.clone(), interleaved));
        }
        let mut read = vec![None; OPS as usize];
        executor
            .run(fabric, |task, value| read[task.0] = Some(value))
            .expect("no stall");
        for (i, value) in read.into_iter().enumerate() {
            assert_eq!(
                value,
                Some(Ok(ReadValue::Value(vec![i as u8; 40]))),
                "read {i} (interleaved: {interleaved})"
            );
        }
        let hinted_first = fabric.tracer().hints_at_first_submit.get().expect("posted");
        let all_hints = fabric.tracer().hints.borrow().len();
        let hinted_registers = |hints: &[(NodeId, u64, u64)]| {
            registers
                .iter()
                .filter(|reg| hints.iter().any(|&(_, addr, _)| addr == reg.offset(0)))
                .count()
        };
        let before = hinted_registers(&fabric.tracer().hints.borrow()[..hinted_first]);
        if interleaved {
            assert_eq!(
                before, OPS as usize,
                "every interleaved read hints before the first post ({hinted_first} of \
                 {all_hints} hints)"
            );
        } else {
            assert_eq!(
                before, 1,
                "only the first read has hinted at the first post"
            );
        }
    }
}

/// The executors' stall rule (nothing finished and nothing in flight, two rounds in
/// a row) still tells a stall from a yield: operations that can complete do so,
/// under `block_on` with nothing else to run and on a `LocalExecutor` whose tasks
/// each run one interleaved operation after another (every round then has tasks
/// that only yielded), and a read that can never reach a majority is reported as
/// stalled, not spun on forever.
#[test]
fn interleaved_operations_complete_alone_and_in_loops_and_still_stall_on_failed_nodes() {
    let cluster = MemCluster::new(3, 1 << 20);
    let client = client_on(FailNodes::new(cluster.client()));
    let fabric = client.fabric();
    let reg = register_at(4096);
    let stats = OpStats::interleaved();
    let written = block_on_future(
        fabric,
        client.write(&reg, &mut RegisterCache::new(), &stats, &[7; 40]),
    );
    assert_eq!(written, Ok(Ok(WriteOutcome::Written)));
    // Several steps on one `OpStats`, as a store's operation runs them: the second
    // step's yield comes right after the first step completed in place, in a round
    // that finished nothing and left nothing in flight.
    let stats = OpStats::interleaved();
    let reads = block_on_future(fabric, async {
        let mut cache = RegisterCache::new();
        let first = client.read(&reg, &mut cache, &stats).await;
        let second = client.read(&reg, &mut cache, &stats).await;
        (first, second)
    });
    let value = Ok(ReadValue::Value(vec![7; 40]));
    assert_eq!(reads, Ok((value.clone(), value)));

    // Tasks that run operation after operation: in most rounds, every task completes
    // one operation in place and yields in its next.
    let mut executor = LocalExecutor::new();
    for _ in 0..3 {
        executor.spawn(async {
            for _ in 0..10 {
                let read = read_register(&client, reg.clone(), true).await;
                assert_eq!(read, Ok(ReadValue::Value(vec![7; 40])));
            }
        });
    }
    assert_eq!(executor.run(fabric, |_, ()| {}), Ok(()));

    fabric.inner().fail_node(NodeId(1));
    fabric.inner().fail_node(NodeId(2));
    let lost = block_on_future(fabric, read_register(&client, reg.clone(), true));
    assert_eq!(lost, Err(FabricError::Stalled));
}
