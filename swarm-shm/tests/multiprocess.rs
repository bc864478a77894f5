//! Several processes on one shared-memory cluster (SWARM §2.1 on emulated CXL).
//!
//! The parent tests create a cluster and re-execute this test binary as child
//! processes (`--exact child_process`, with the role in `SWARM_SHM_CHILD_ROLE`). The
//! children open the cluster themselves, check in and wait for a start flag in shared
//! memory, then:
//!
//! - `cas`: 4 processes × 100,000 increments of one word with retrying CAS through
//!   `ShmFabric` roundtrips. Each success claims the value it swapped in, so the
//!   parent checks the exact final count *and* that every value `1..=400,000` was
//!   claimed exactly once (the sum of the claims), i.e. that the CAS is atomic across
//!   processes.
//! - `writer`/`reader`: one process appends sequence-numbered 64-byte records with a
//!   checksum, each published by one ordered batch `[write record, CAS counter]`;
//!   two reader processes chase the writer with batches `[read counter, read the
//!   record the writer is probably writing now]` and check that whenever the counter
//!   covers that record, the record read *after* it in the same batch is complete —
//!   the batch ordering property across processes, on both the writer's and the
//!   readers' side. Reads of records not yet published may be torn; the readers
//!   count them to show that they really raced the writer.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use swarm_core::header::HEADER_SIZE;
use swarm_core::{Batch, Completion, NodeId, Op, OpStats, Roundtrip, block_on_future};
use swarm_shm::{ScratchDir, ShmCluster, ShmFabric};

const ROLE_VAR: &str = "SWARM_SHM_CHILD_ROLE";
const DIR_VAR: &str = "SWARM_SHM_CHILD_DIR";
const RESULT_TAG: &str = "SWARM-CHILD-RESULT";

const NODE: NodeId = NodeId(0);
/// Set to 1 by the parent once every child has checked in at `READY`.
const START_FLAG: u64 = HEADER_SIZE;
/// Each child increments this word once it has opened the cluster.
const READY: u64 = HEADER_SIZE + 8;
/// The word the CAS children increment.
const COUNTER: u64 = HEADER_SIZE + 64;
/// The writer's publication counter: records `1..=PUBLISHED` are complete.
const PUBLISHED: u64 = HEADER_SIZE + 128;
/// Record `seq` lives at `RECORDS + (seq - 1) * RECORD_LEN`; records are never reused.
const RECORDS: u64 = HEADER_SIZE + 4096;
const RECORD_LEN: u64 = 64;

const CAS_PROCESSES: u64 = 4;
const INCREMENTS: u64 = 100_000;
const RECORD_COUNT: u64 = 100_000;
const READERS: usize = 2;
const NODE_BYTES: u64 = RECORDS + RECORD_COUNT * RECORD_LEN;

/// Children give up after this long (a hung child must not hang the suite).
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- child side

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
fn child_process() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    let dir = std::env::var(DIR_VAR).expect("the parent sets the cluster directory");
    let cluster = Arc::new(ShmCluster::open(&dir).expect("child opens the cluster"));
    let fabric = cluster.client();
    wait_for_start(&fabric);
    let result = match role.as_str() {
        "cas" => cas_child(&fabric),
        "writer" => writer_child(&fabric),
        "reader" => reader_child(&fabric),
        other => panic!("unknown child role {other}"),
    };
    // On a line of its own: libtest has already printed "test child_process ... ".
    println!("\n{RESULT_TAG} {result}");
}

/// One roundtrip of `batch` to node 0.
fn roundtrip(fabric: &ShmFabric, batch: Batch) -> Completion {
    let stats = OpStats::new();
    block_on_future(fabric, async {
        let mut rt = Roundtrip::start(fabric, &stats);
        rt.post(NODE, batch).expect("post");
        rt.wait(1).await.expect("node 0 answers");
        rt.replies_mut()[0].1.clone()
    })
    .expect("no stall on a live node")
}

fn read_word(fabric: &ShmFabric, addr: u64) -> u64 {
    let completion = roundtrip(fabric, Batch::read(addr, 8));
    u64::from_le_bytes(
        completion
            .read(0)
            .expect("read output")
            .try_into()
            .expect("8 bytes"),
    )
}

/// Atomically adds 1 to the word at `addr` with retrying CAS; returns the new value.
fn increment(fabric: &ShmFabric, addr: u64) -> u64 {
    let mut expected = 0;
    loop {
        let completion = roundtrip(fabric, Batch::cas(addr, expected, expected + 1));
        match completion.cas(0).expect("cas output") {
            previous if previous == expected => return expected + 1,
            previous => expected = previous,
        }
    }
}

/// Checks in, then waits for the parent's start signal, so that all children start
/// their work together rather than staggered by process start-up.
fn wait_for_start(fabric: &ShmFabric) {
    increment(fabric, READY);
    let deadline = Instant::now() + CHILD_DEADLINE;
    while read_word(fabric, START_FLAG) == 0 {
        assert!(
            Instant::now() < deadline,
            "the parent never gave the start signal"
        );
        std::thread::yield_now();
    }
}

/// Increments the shared counter `INCREMENTS` times; reports the sum of the values
/// it claimed.
fn cas_child(fabric: &ShmFabric) -> String {
    let (mut expected, mut claimed_sum, mut retries) = (0u64, 0u64, 0u64);
    for _ in 0..INCREMENTS {
        loop {
            let completion = roundtrip(fabric, Batch::cas(COUNTER, expected, expected + 1));
            let previous = completion.cas(0).expect("cas output");
            if previous == expected {
                expected += 1;
                claimed_sum += expected;
                break;
            }
            expected = previous;
            retries += 1;
        }
    }
    format!("sum={claimed_sum} retries={retries}")
}

/// The 64-byte record number `seq`: `seq`, 6 payload words derived from it, checksum.
fn record(seq: u64) -> [u8; RECORD_LEN as usize] {
    let mut words = [0u64; 8];
    words[0] = seq;
    for (i, word) in words.iter_mut().enumerate().take(7).skip(1) {
        *word = mix(seq.wrapping_mul(31).wrapping_add(i as u64));
    }
    words[7] = checksum(&words[..7]);
    let mut bytes = [0u8; RECORD_LEN as usize];
    for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    bytes
}

/// Whether `bytes` is exactly record `seq`; describes the damage otherwise.
fn check_record(seq: u64, bytes: &[u8]) -> Result<(), String> {
    if bytes == record(seq) {
        return Ok(());
    }
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    Err(format!(
        "record {seq} incomplete although published: seq field {}, checksum {}",
        words.first().copied().unwrap_or_default(),
        if words.len() == 8 && checksum(&words[..7]) == words[7] {
            "ok"
        } else {
            "bad"
        },
    ))
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn checksum(words: &[u64]) -> u64 {
    words
        .iter()
        .fold(0x5157_4152_4d00_0001, |acc, w| mix(acc ^ w))
}

fn writer_child(fabric: &ShmFabric) -> String {
    for seq in 1..=RECORD_COUNT {
        let mut batch = Batch::new();
        batch
            .push(Op::Write {
                addr: RECORDS + (seq - 1) * RECORD_LEN,
                data: record(seq).to_vec().into(),
            })
            .expect("room")
            .push(Op::Cas {
                addr: PUBLISHED,
                expected: seq - 1,
                new: seq,
            })
            .expect("room");
        let completion = roundtrip(fabric, batch);
        assert_eq!(
            completion.cas(1),
            Some(seq - 1),
            "only the writer moves the counter"
        );
    }
    format!("written={RECORD_COUNT}")
}

/// Chases the writer: each batch reads the counter, then the record just past the
/// counter seen last time, which the writer is likely writing right now. If the
/// counter read first covers that record, the record must be complete.
fn reader_child(fabric: &ShmFabric) -> String {
    let deadline = Instant::now() + CHILD_DEADLINE;
    let (mut last_published, mut verified, mut in_flight, mut torn) = (0u64, 0u64, 0u64, 0u64);
    loop {
        let target = (last_published + 1).min(RECORD_COUNT);
        let mut batch = Batch::new();
        batch
            .push(Op::Read {
                addr: PUBLISHED,
                len: 8,
            })
            .expect("room")
            .push(Op::Read {
                addr: RECORDS + (target - 1) * RECORD_LEN,
                len: RECORD_LEN as u32,
            })
            .expect("room");
        let completion = roundtrip(fabric, batch);
        let published = u64::from_le_bytes(
            completion
                .read(0)
                .expect("counter")
                .try_into()
                .expect("8 bytes"),
        );
        let bytes = completion.read(1).expect("record");
        assert!(
            published >= last_published,
            "the counter went back from {last_published} to {published}"
        );
        assert!(
            published <= RECORD_COUNT,
            "the counter passed {RECORD_COUNT}: {published}"
        );
        last_published = published;
        if published >= target {
            // Published before our read of the record in the same batch: complete.
            if let Err(damage) = check_record(target, bytes) {
                panic!("{damage} (counter {published})");
            }
            verified += 1;
            if target == RECORD_COUNT {
                break;
            }
        } else {
            // Not published when we looked: it may be absent, complete, or torn.
            in_flight += 1;
            torn +=
                u64::from(bytes.iter().any(|b| *b != 0) && check_record(target, bytes).is_err());
            assert!(
                Instant::now() < deadline,
                "the writer stopped at record {published}"
            );
        }
    }
    format!("verified={verified} in_flight={in_flight} torn={torn}")
}

// ---------------------------------------------------------------- parent side

fn spawn_child(dir: &Path, role: &str) -> Child {
    Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "--exact",
            "child_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ROLE_VAR, role)
        .env(DIR_VAR, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child process")
}

/// Waits for every child (killing them all if one overruns) and returns each one's
/// result line.
fn collect(mut children: Vec<(String, Child)>) -> Vec<String> {
    let deadline = Instant::now() + CHILD_DEADLINE + Duration::from_secs(30);
    let mut results = Vec::new();
    for i in 0..children.len() {
        let status = loop {
            if let Some(status) = children[i].1.try_wait().expect("wait for child") {
                break status;
            }
            if Instant::now() > deadline {
                for (_, child) in &mut children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                panic!("child {} timed out", children[i].0);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (role, child) = &mut children[i];
        let mut stdout = String::new();
        let mut stderr = String::new();
        child
            .stdout
            .take()
            .expect("piped")
            .read_to_string(&mut stdout)
            .expect("child stdout");
        child
            .stderr
            .take()
            .expect("piped")
            .read_to_string(&mut stderr)
            .expect("child stderr");
        assert!(
            status.success(),
            "child {role} failed ({status}):\n{stdout}\n{stderr}"
        );
        let line = stdout
            .lines()
            .find_map(|l| l.split_once(RESULT_TAG).map(|(_, result)| result))
            .unwrap_or_else(|| panic!("child {role} reported no result:\n{stdout}\n{stderr}"));
        results.push(line.trim().to_string());
    }
    results
}

fn field(result: &str, name: &str) -> u64 {
    result
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {result:?}"))
}

/// Waits until `children` have checked in, then gives the start signal.
fn start(fabric: &ShmFabric, children: u64) {
    let deadline = Instant::now() + CHILD_DEADLINE;
    while read_word(fabric, READY) < children {
        assert!(Instant::now() < deadline, "children did not check in");
        std::thread::sleep(Duration::from_millis(1));
    }
    let stats = OpStats::new();
    block_on_future(fabric, async {
        let mut rt = Roundtrip::start(fabric, &stats);
        rt.post(NODE, Batch::cas(START_FLAG, 0, 1)).expect("post");
        rt.wait(1).await.expect("start flag set");
    })
    .expect("no stall");
}

/// Creates a one-node cluster, runs one child per role, returns their result lines.
/// Children print a few lines only, so collecting their pipes after they exit cannot
/// deadlock.
///
/// Scenarios run one at a time: on a 2-core machine, two of them at once would
/// time-share the cores so much that their processes barely overlap.
fn run(roles: &[&str]) -> (Arc<ShmCluster>, Vec<String>, ScratchDir) {
    static ONE_SCENARIO_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_SCENARIO_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = ScratchDir::new("swarm-shm-multiprocess").expect("scratch directory");
    let cluster = Arc::new(ShmCluster::create(dir.path(), 1, NODE_BYTES).expect("create cluster"));
    let children = roles
        .iter()
        .map(|role| (role.to_string(), spawn_child(dir.path(), role)))
        .collect();
    start(&cluster.client(), roles.len() as u64);
    let results = collect(children);
    (cluster, results, dir)
}

#[test]
fn processes_share_an_atomic_counter() {
    let roles = vec!["cas"; CAS_PROCESSES as usize];
    let (cluster, results, _dir) = run(&roles);
    let total = CAS_PROCESSES * INCREMENTS;
    let fabric = cluster.client();
    assert_eq!(
        read_word(&fabric, COUNTER),
        total,
        "lost or duplicated increments"
    );
    let claimed: u64 = results.iter().map(|r| field(r, "sum")).sum();
    assert_eq!(
        claimed,
        total * (total + 1) / 2,
        "a value was claimed twice: {results:?}"
    );
    let retries: u64 = results.iter().map(|r| field(r, "retries")).sum();
    println!("{total} increments by {CAS_PROCESSES} processes, {retries} CAS retries");
}

#[test]
fn readers_never_see_a_published_record_incomplete() {
    let mut roles = vec!["writer"];
    roles.extend(["reader"; READERS]);
    let (cluster, results, _dir) = run(&roles);
    assert_eq!(field(&results[0], "written"), RECORD_COUNT);
    for result in &results[1..] {
        assert!(field(result, "verified") >= 1, "{result}");
    }
    let fabric = cluster.client();
    assert_eq!(read_word(&fabric, PUBLISHED), RECORD_COUNT);
    // And every record ended up complete.
    let node = cluster.node(NODE).expect("node 0");
    let mut bytes = [0u8; RECORD_LEN as usize];
    for seq in 1..=RECORD_COUNT {
        node.read(RECORDS + (seq - 1) * RECORD_LEN, &mut bytes)
            .expect("in bounds");
        check_record(seq, &bytes).expect("final record");
    }
    println!("{results:?}");
}
