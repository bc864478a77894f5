//! Client processes share a SWARM-KV cluster on shared memory; one is killed with
//! SIGKILL mid-run. The others keep going, nothing acknowledged is lost, the index
//! stays consistent, and the merged history is linearizable.
//!
//! The test re-executes its own binary as the client processes (`SWARM_KV_CHILD`).
//! Every process records its operations in a JSON Lines file, with times from
//! `CLOCK_MONOTONIC` (shared by all processes), writing a "begin" line before each
//! operation so that the one a killed process was in the middle of becomes a crashed
//! operation (end null) in the merged history.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use swarm_checker::{History, OpKind, Operation};
use swarm_core::{OpStats, block_on};
use swarm_kv::ClusterParams;
use swarm_kv::ShmStore;
use swarm_shm::ScratchDir;

const CHILD_VAR: &str = "SWARM_KV_CHILD";
const KEYS: u64 = 8;

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One line of a child's log: an operation began, or it ended.
fn line(kind: &str, id: u64, op: &Operation) -> String {
    format!("{kind} {id} {}\n", op.to_json(None))
}

fn child(dir: &Path, client: u64, ops: u64, log: &Path) {
    let store = ShmStore::open(dir).unwrap();
    let kv = store.client().unwrap();
    let f = kv.fabric();
    let mut out = std::fs::File::create(log).unwrap();
    let mut x = client.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in 0..ops {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = format!("key{}", x % KEYS);
        let value = format!("c{client}-{i}");
        let kind = match (x >> 8) % 10 {
            0..=4 => OpKind::Get,
            5..=8 => OpKind::Update,
            _ => OpKind::Insert,
        };
        let written = (kind != OpKind::Get).then_some(value.as_str());
        let begin = Operation::crashed(client, kind, key.clone(), written, monotonic_ns());
        out.write_all(line("begin", i, &begin).as_bytes()).unwrap();
        let s = OpStats::new();
        let (ok, got) = match kind {
            OpKind::Get => (
                true,
                block_on(f, kv.get(key.as_bytes(), &s))
                    .unwrap()
                    .map(|v| String::from_utf8(v).unwrap()),
            ),
            OpKind::Update => (
                block_on(f, kv.update(key.as_bytes(), value.as_bytes(), &s)).unwrap(),
                Some(value.clone()),
            ),
            _ => {
                block_on(f, kv.insert(key.as_bytes(), value.as_bytes(), &s)).unwrap();
                (true, Some(value.clone()))
            }
        };
        let end = Operation::completed(
            client,
            kind,
            key,
            got.as_deref(),
            ok,
            begin.start,
            monotonic_ns(),
        );
        out.write_all(line("end", i, &end).as_bytes()).unwrap();
    }
    out.flush().unwrap();
    kv.close();
}

fn spawn(dir: &Path, client: u64, ops: u64, log: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "killed_client_loses_nothing_acknowledged",
            "--nocapture",
        ])
        .env(
            CHILD_VAR,
            format!("{}|{client}|{ops}|{}", dir.display(), log.display()),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Reads a child's log: completed operations, plus the one in flight (if any) as crashed.
fn read_log(path: &Path, history: &mut History) {
    let file = std::fs::File::open(path).unwrap();
    let mut open: Option<Operation> = None;
    for l in BufReader::new(file).lines() {
        let l = l.unwrap();
        let mut parts = l.splitn(3, ' ');
        let (kind, _, json) = (
            parts.next().unwrap(),
            parts.next(),
            parts.next().unwrap_or(""),
        );
        // A line cut by the kill is incomplete JSON: ignore it.
        let Ok(parsed) = History::from_jsonl(json.as_bytes()) else {
            continue;
        };
        let Some(op) = parsed.operations().into_iter().next().map(|n| n.op) else {
            continue;
        };
        match kind {
            "begin" => open = Some(op),
            _ => {
                open = None;
                history.push(op).unwrap();
            }
        }
    }
    if let Some(op) = open {
        history.push(op).unwrap();
    }
}

#[test]
fn killed_client_loses_nothing_acknowledged() {
    if let Ok(spec) = std::env::var(CHILD_VAR) {
        let parts: Vec<&str> = spec.split('|').collect();
        child(
            Path::new(parts[0]),
            parts[1].parse().unwrap(),
            parts[2].parse().unwrap(),
            Path::new(parts[3]),
        );
        return;
    }
    let scratch = ScratchDir::new("kv-kill").unwrap();
    let dir = scratch.path().join("cluster");
    let params = ClusterParams {
        key_max: 16,
        value_max: 32,
        writers: 16,
        ..ClusterParams::default()
    };
    let store = ShmStore::create(&dir, 3, 32 << 20, params).unwrap();
    // Load every key first, from this process, recorded as client 0.
    let mut history = History::new();
    let kv = store.client().unwrap();
    for k in 0..KEYS {
        let key = format!("key{k}");
        let start = monotonic_ns();
        block_on(
            kv.fabric(),
            kv.insert(key.as_bytes(), b"init", &OpStats::new()),
        )
        .unwrap();
        history
            .push(Operation::completed(
                0,
                OpKind::Insert,
                key,
                Some("init"),
                true,
                start,
                monotonic_ns(),
            ))
            .unwrap();
    }
    let logs: Vec<_> = (1..=4u64)
        .map(|c| scratch.path().join(format!("client{c}.log")))
        .collect();
    // The victim (client 4) has more operations than it can finish before the kill,
    // however fast it runs: a victim that finished first tested nothing.
    let mut children: Vec<Child> = (1..=4u64)
        .map(|c| {
            let ops = if c == 4 { 1_000_000 } else { 3_000 };
            spawn(&dir, c, ops, &logs[c as usize - 1])
        })
        .collect();
    // Kill client 4 once it has done some work.
    let victim_log = &logs[3];
    for _ in 0..500 {
        if std::fs::metadata(victim_log)
            .map(|m| m.len() > 20_000)
            .unwrap_or(false)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: plain libc call on the pid of a child we own and have not waited for.
    let killed = unsafe { libc::kill(children[3].id() as libc::pid_t, libc::SIGKILL) };
    assert_eq!(killed, 0, "kill failed");
    for (i, c) in children.iter_mut().enumerate() {
        let status = c.wait().unwrap();
        if i < 3 {
            assert!(status.success(), "client {} failed: {status}", i + 1);
        } else {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                status.signal(),
                Some(libc::SIGKILL),
                "the victim finished before the kill"
            );
        }
    }
    for log in &logs {
        read_log(log, &mut history);
    }
    assert!(
        history.crashed_count() <= 1,
        "only the killed client may leave an operation unfinished"
    );
    // Every key is still readable, by a fresh client; record the reads last.
    for k in 0..KEYS {
        let key = format!("key{k}");
        let start = monotonic_ns();
        let got = block_on(kv.fabric(), kv.get(key.as_bytes(), &OpStats::new())).unwrap();
        let got = got.map(|v| String::from_utf8(v).unwrap());
        assert!(got.is_some(), "{key} vanished");
        history
            .push(Operation::completed(
                99,
                OpKind::Get,
                key,
                got.as_deref(),
                true,
                start,
                monotonic_ns(),
            ))
            .unwrap();
    }
    let report = swarm_checker::check(&history);
    assert!(report.is_linearizable(), "{report}");
}
