//! The `swarm` command: bad input gives a clear message and a non-zero exit status,
//! and leaves the cluster usable.

mod cli_support;

use std::path::Path;
use std::process::{Command, Output};

use cli_support::{SHORT_LEASES, swarm, text};
use swarm_shm::ScratchDir;

/// `swarm get` of `key` in the cluster at `dir` succeeds and prints `value`.
fn assert_get(dir: &str, key: &str, value: &str) {
    let out = swarm(&["get", "--dir", dir, key]);
    assert!(out.status.success(), "get {key}: {}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{value}\n"),
        "get {key}: {}",
        text(&out)
    );
}

/// `swarm init` of a three-node cluster at `dir` with nodes of `size`, values up to
/// `value_max`, keys up to `key_max`, and the `extra` options; its output.
fn init_sized(dir: &str, size: &str, value_max: &str, key_max: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "init",
        "--dir",
        dir,
        "--nodes",
        "3",
        "--size",
        size,
        "--value-max",
        value_max,
        "--key-max",
        key_max,
    ];
    args.extend_from_slice(extra);
    let out = swarm(&args);
    assert!(out.status.success(), "{}", text(&out));
    out
}

fn init(dir: &Path) {
    let out = swarm(&[
        "init",
        "--dir",
        dir.to_str().unwrap(),
        "--nodes",
        "3",
        "--size",
        "32MiB",
        "--value-max",
        "64",
        "--key-max",
        "16",
    ]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn put_get_delete_stat_roundtrip() {
    let scratch = ScratchDir::new("cli-ok").unwrap();
    let dir = scratch.path().join("c");
    init(&dir);
    let d = dir.to_str().unwrap();
    assert!(swarm(&["put", "--dir", d, "alpha", "one"]).status.success());
    assert_get(d, "alpha", "one");
    let out = swarm(&["stat", "--dir", d]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("keys: 1"), "{}", text(&out));
    assert!(swarm(&["delete", "--dir", d, "alpha"]).status.success());
    let out = swarm(&["get", "--dir", d, "alpha"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("key not found"), "{}", text(&out));
}

#[test]
fn bad_input_fails_clearly_and_the_cluster_stays_usable() {
    let scratch = ScratchDir::new("cli-bad").unwrap();
    let dir = scratch.path().join("c");
    init(&dir);
    let d = dir.to_str().unwrap();
    assert!(swarm(&["put", "--dir", d, "keep", "safe"]).status.success());

    let cases: &[(&[&str], &str)] = &[
        (
            &["put", "--dir", d, "a-key-longer-than-16", "v"],
            "exceeds the cluster's limit",
        ),
        (&["put", "--dir", d, "k", &"v".repeat(65)], "--value-max"),
        (&["get", "--dir", d, "unknown"], "key not found"),
        (&["delete", "--dir", d, "unknown"], "key not found"),
        (
            &["get", "--dir", scratch.path().to_str().unwrap(), "keep"],
            "error",
        ),
        (&["format", "--dir", d], "formatted when `swarm init --dir`"),
    ];
    for (args, expected) in cases {
        let out = swarm(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let t = text(&out);
        assert!(
            t.contains(expected),
            "{args:?}: expected {expected:?} in {t}"
        );
        assert!(!t.contains("panicked"), "{args:?} panicked: {t}");
    }
    assert_get(d, "keep", "safe");
}

/// Issue 12, item 1: a replicated cluster serves with a majority. One node's header
/// corrupted: every command works, with a warning naming the node, and `stat` shows
/// it left out; a second node's corrupted too: no majority, an error naming both.
#[test]
fn a_minority_of_corrupted_nodes_is_left_out_and_a_majority_is_needed() {
    let scratch = ScratchDir::new("cli-corrupt").unwrap();
    let dir = scratch.path().join("c");
    init(&dir);
    let d = dir.to_str().unwrap();
    assert!(swarm(&["put", "--dir", d, "keep", "safe"]).status.success());
    let corrupt = |index: u16| {
        let node = dir.join(swarm_shm::node_file_name(index));
        let original = std::fs::read(&node).unwrap();
        let mut bytes = original.clone();
        bytes[20] ^= 0xff;
        std::fs::write(&node, &bytes).unwrap();
        (node, original)
    };
    let (node0, original0) = corrupt(0);
    let out = swarm(&["get", "--dir", d, "keep"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("node-0.swarm") && t.contains("WARN"), "{t}");
    assert!(swarm(&["put", "--dir", d, "more", "data"]).status.success());
    assert_get(d, "more", "data");
    assert!(swarm(&["delete", "--dir", d, "more"]).status.success());
    let out = swarm(&["stat", "--dir", d]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("node 0: UNUSABLE") && t.contains("node 1: up"),
        "{t}"
    );
    let (_, _) = corrupt(2);
    let out = swarm(&["get", "--dir", d, "keep"]);
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("majority") && t.contains("node 0") && t.contains("node 2"),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
    // Restoring node 0 gives the majority back, with nothing lost.
    std::fs::write(&node0, &original0).unwrap();
    assert_get(d, "keep", "safe");
}

#[test]
fn a_node_whose_memory_was_lost_is_left_out_and_never_read_as_a_replica() {
    let scratch = ScratchDir::new("cli-wiped").unwrap();
    let dir = scratch.path().join("c");
    init(&dir);
    let d = dir.to_str().unwrap();
    for i in 0..20 {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        assert!(swarm(&["put", "--dir", d, &key, &value]).status.success());
    }
    // Node 1 comes back with its header but empty memory, as a restarted RDMA
    // memory node does: it must not count towards any quorum.
    let wipe = |index: u16| {
        let node = dir.join(swarm_shm::node_file_name(index));
        let mut bytes = std::fs::read(&node).unwrap();
        let header = swarm_core::header::HEADER_SIZE as usize;
        bytes[header..].fill(0);
        std::fs::write(&node, &bytes).unwrap();
    };
    wipe(1);
    for i in 0..20 {
        let out = swarm(&["get", "--dir", d, &format!("k{i}")]);
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        assert!(t.starts_with(&format!("v{i}\n")), "{t}");
    }
    let out = swarm(&["stat", "--dir", d]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("node 1: UNUSABLE") && t.contains("no SWARM-KV superblock"),
        "{t}"
    );
    assert!(swarm(&["put", "--dir", d, "more", "data"]).status.success());
    assert_get(d, "more", "data");
    // Losing a second node's memory loses the majority: refused, not wrong.
    wipe(0);
    let out = swarm(&["get", "--dir", d, "k1"]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(!t.contains("panicked"), "{t}");
}

/// Issue 12's scenario: node 1's header corrupted, the store serves with a warning,
/// `swarm repair` rebuilds it while a bench runs, and then losing node 0 too leaves
/// every key readable (and a node wiped in place is rebuilt the same way).
#[test]
fn repair_rebuilds_a_lost_node_while_a_bench_runs_and_the_next_loss_loses_nothing() {
    let scratch = ScratchDir::new("cli-repair").unwrap();
    let dir = scratch.path().join("c");
    let d = dir.to_str().unwrap();
    let out = swarm(&["init", "--dir", d, "--size", "32MiB", "--value-max", "64"]);
    assert!(out.status.success(), "{}", text(&out));
    for i in 0..10 {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        assert!(swarm(&["put", "--dir", d, &key, &value]).status.success());
    }
    let node = |index: u16| dir.join(swarm_shm::node_file_name(index));
    let corrupt_header = |index: u16| {
        let mut bytes = std::fs::read(node(index)).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(node(index), &bytes).unwrap();
    };
    corrupt_header(1);
    let out = swarm(&["put", "--dir", d, "k10", "v10"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("WARN"), "{}", text(&out));
    assert_get(d, "k3", "v3");
    let bench = Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(["bench", "--dir", d, "--workload", "a", "--keys", "200"])
        .args(["--duration", "6s", "--clients", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the bench");
    let out = swarm(&["repair", "--dir", d, "--node", "1"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("node 1 rebuilt") && t.contains("epoch 3"), "{t}");
    let bench = bench.wait_with_output().expect("run the bench");
    assert!(bench.status.success(), "{}", text(&bench));
    assert!(text(&bench).contains(" 0 errors"), "{}", text(&bench));
    let out = swarm(&["stat", "--dir", d]);
    assert!(text(&out).contains("node 1: up"), "{}", text(&out));
    // Node 0 goes too: the rebuilt node 1 and node 2 hold everything.
    corrupt_header(0);
    for i in 0..=10 {
        assert_get(d, &format!("k{i}"), &format!("v{i}"));
    }
    // Node 0 rebuilt in turn; then node 2's memory wiped in place (header and
    // incarnation intact): left out, and repaired the same way.
    let out = swarm(&["repair", "--dir", d, "--node", "0"]);
    assert!(out.status.success(), "{}", text(&out));
    let mut bytes = std::fs::read(node(2)).unwrap();
    bytes[swarm_core::header::HEADER_SIZE as usize..].fill(0);
    std::fs::write(node(2), &bytes).unwrap();
    let out = swarm(&["repair", "--dir", d, "--node", "2"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("epoch 7"), "{}", text(&out));
    for i in 0..=10 {
        assert_get(d, &format!("k{i}"), &format!("v{i}"));
    }
    let out = swarm(&["repair", "--dir", d, "--node", "2"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("already a member"), "{}", text(&out));
}

/// A `swarm repair` stopped (SIGSTOP) while it holds the repair lock: a second one
/// of the same node exits 1, names it and leaves the node file alone, and the first,
/// continued, rebuilds the node. A repair killed while it holds the lock leaves its
/// token behind, and the next repair takes it over (its process is gone).
#[test]
fn a_second_repair_refuses_while_a_stopped_one_runs_and_takes_over_from_a_killed_one() {
    use std::io::{Read, Seek, SeekFrom};
    let scratch = ScratchDir::new("cli-repair-lock").unwrap();
    let dir = scratch.path().join("c");
    let d = dir.to_str().unwrap();
    let out = swarm(&["init", "--dir", d, "--size", "32MiB", "--value-max", "64"]);
    assert!(out.status.success(), "{}", text(&out));
    for i in 0..5 {
        assert!(
            swarm(&["put", "--dir", d, &format!("k{i}"), &format!("v{i}")])
                .status
                .success()
        );
    }
    let node = |index: u16| dir.join(swarm_shm::node_file_name(index));
    let corrupt_header = |index: u16| {
        let mut bytes = std::fs::read(node(index)).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(node(index), &bytes).unwrap();
    };
    // The repair lock word on node 0 (the superblock area, after the header page).
    let lock_word = || {
        let mut f = std::fs::File::open(node(0)).unwrap();
        f.seek(SeekFrom::Start(swarm_core::header::HEADER_SIZE + 2048))
            .unwrap();
        let mut word = [0u8; 8];
        f.read_exact(&mut word).unwrap();
        u64::from_le_bytes(word)
    };
    let start = || {
        let child = Command::new(env!("CARGO_BIN_EXE_swarm"))
            .args(["repair", "--dir", d, "--node", "1"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start a repair");
        let began = std::time::Instant::now();
        while lock_word() == 0 {
            assert!(
                began.elapsed().as_secs() < 30,
                "the repair never took the lock"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child
    };
    let signal = |child: &std::process::Child, sig: &str| {
        let status = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    corrupt_header(1);
    let first = start();
    signal(&first, "-STOP");
    let file_before = std::fs::read(node(1)).unwrap();
    let out = swarm(&["repair", "--dir", d, "--node", "1"]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("holds the repair lock") && t.contains(&first.id().to_string()),
        "{t}"
    );
    assert!(
        std::fs::read(node(1)).unwrap() == file_before,
        "the node file was left alone"
    );
    signal(&first, "-CONT");
    let out = first.wait_with_output().expect("the first repair");
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("node 1 rebuilt"), "{}", text(&out));
    assert_eq!(lock_word(), 0, "given back");

    corrupt_header(1);
    let mut killed = start();
    signal(&killed, "-KILL");
    killed.wait().expect("reap the killed repair");
    assert_ne!(lock_word(), 0, "a killed repair leaves its token");
    let out = swarm(&["repair", "--dir", d, "--node", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("node 1 rebuilt"), "{}", text(&out));
    assert_eq!(lock_word(), 0, "given back");
    for i in 0..5 {
        assert_get(d, &format!("k{i}"), &format!("v{i}"));
    }
}

/// Six nodes in two replica groups of three (nodes 0-2 and 3-5 in every band):
/// `swarm init` reports twice the keys of three nodes at the same size, node 1 is
/// lost and `swarm repair` rebuilds it from its group while a bench records a
/// history, which must be linearizable with 0 errors; then node 2 is lost too
/// (the same group: 1 and 0 are left) and every key stays readable.
#[test]
fn six_nodes_hold_twice_the_keys_and_repair_a_lost_node_while_a_bench_runs() {
    let scratch = ScratchDir::new("cli-repair6").unwrap();
    let capacity = |out: &Output| -> u64 {
        let t = text(out);
        let at = t.find("room for ").expect("the capacity") + "room for ".len();
        t[at..].split(' ').next().unwrap().parse().unwrap()
    };
    let dir3 = scratch.path().join("three");
    let out = swarm(&["init", "--dir", dir3.to_str().unwrap(), "--size", "32MiB"]);
    assert!(out.status.success(), "{}", text(&out));
    let three = capacity(&out);
    let dir = scratch.path().join("c");
    let d = dir.to_str().unwrap();
    let out = swarm(&["init", "--dir", d, "--nodes", "6", "--size", "32MiB"]);
    assert!(out.status.success(), "{}", text(&out));
    let six = capacity(&out);
    assert!(
        six * 10 >= three * 19,
        "6 nodes: {six} keys, 3 nodes: {three}"
    );
    for i in 0..12 {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        assert!(swarm(&["put", "--dir", d, &key, &value]).status.success());
    }
    let node = |index: u16| dir.join(swarm_shm::node_file_name(index));
    let corrupt_header = |index: u16| {
        let mut bytes = std::fs::read(node(index)).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(node(index), &bytes).unwrap();
    };
    corrupt_header(1);
    let history = scratch.path().join("history.jsonl");
    let bench = Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(["bench", "--dir", d, "--workload", "a", "--keys", "300"])
        .args(["--duration", "6s", "--clients", "2", "--history"])
        .arg(&history)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the bench");
    let out = swarm(&["repair", "--dir", d, "--node", "1"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("node 1 rebuilt") && t.contains("epoch 3"), "{t}");
    let bench = bench.wait_with_output().expect("run the bench");
    assert!(bench.status.success(), "{}", text(&bench));
    assert!(text(&bench).contains(" 0 errors"), "{}", text(&bench));
    let out = swarm(&["check", history.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let out = swarm(&["stat", "--dir", d]);
    assert!(text(&out).contains("node 1: up"), "{}", text(&out));
    // Node 2 goes too: its group keeps nodes 0 and the rebuilt 1.
    corrupt_header(2);
    for i in 0..12 {
        assert_get(d, &format!("k{i}"), &format!("v{i}"));
    }
}

/// The capacity `swarm stat --json` reports: keys the cluster holds now, and at
/// most once grown.
fn capacity(d: &str) -> (u64, u64) {
    let out = swarm(&["stat", "--dir", d, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        report["capacity"].as_u64().unwrap(),
        report["capacity_max"].as_u64().unwrap(),
    )
}

/// `swarm add-node` while a bench records a history: 0 errors, a linearizable
/// history, and the cluster has a fourth node in service that new keys use, and
/// holds more keys than before (`swarm stat`), up to what `swarm init` said it
/// could grow to.
#[test]
fn add_node_while_a_bench_runs_gives_a_fourth_node_and_a_linearizable_history() {
    let scratch = ScratchDir::new("cli-add-node").unwrap();
    let dir = scratch.path().join("c");
    let d = dir.to_str().unwrap();
    let out = swarm(&["init", "--dir", d, "--size", "32MiB"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("once grown to 6 nodes"),
        "{}",
        text(&out)
    );
    let (before, most) = capacity(d);
    assert!(most >= 2 * before, "room to grow to twice the nodes");
    let history = scratch.path().join("history.jsonl");
    let bench = Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(["bench", "--dir", d, "--workload", "a", "--keys", "300"])
        .args(["--duration", "6s", "--clients", "2", "--history"])
        .arg(&history)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the bench");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let refused = swarm(&["add-node", "--dir", d]);
    assert!(
        !refused.status.success(),
        "add-node without --accept-no-repair"
    );
    let out = swarm(&["add-node", "--dir", d, "--accept-no-repair"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("node 3 added at configuration epoch 2"), "{t}");
    let bench = bench.wait_with_output().expect("run the bench");
    assert!(bench.status.success(), "{}", text(&bench));
    assert!(text(&bench).contains(" 0 errors"), "{}", text(&bench));
    let out = swarm(&["check", history.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    for i in 0..40 {
        let (key, value) = (format!("new{i}"), format!("v{i}"));
        assert!(swarm(&["put", "--dir", d, &key, &value]).status.success());
    }
    for i in 0..40 {
        assert_get(d, &format!("new{i}"), &format!("v{i}"));
    }
    let out = swarm(&["stat", "--dir", d]);
    assert!(text(&out).contains("node 3: up"), "{}", text(&out));
    let (after, still_most) = capacity(d);
    println!("capacity {before} before the add, {after} after, at most {most}");
    assert!(after > before, "the add gave the cluster keys");
    assert!(after <= most && still_most == most);
    assert!(
        text(&out).contains(&format!("capacity {after};")),
        "{}",
        text(&out)
    );
}

/// More nodes than one roundtrip posts to (16): 32 nodes, whose index, client table
/// and configuration are on a metadata group of five (`swarm stat` says so). A
/// register-only node (27) and then a metadata node (1) are lost, each rebuilt by
/// `swarm repair` while a bench records a history, which must be linearizable with
/// 0 errors; then node 2 is lost too and every key stays readable.
#[test]
fn thirty_two_nodes_serve_a_bench_and_repair_a_register_node_and_a_metadata_node() {
    let scratch = ScratchDir::new("cli-repair32").unwrap();
    let dir = scratch.path().join("c");
    let d = dir.to_str().unwrap();
    let out = swarm(&[
        "init",
        "--dir",
        d,
        "--nodes",
        "32",
        "--size",
        "8MiB",
        "--writers",
        "8",
        "--value-max",
        "64",
        "--key-max",
        "32",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    for i in 0..12 {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        assert!(swarm(&["put", "--dir", d, &key, &value]).status.success());
    }
    let out = swarm(&["stat", "--dir", d]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("cluster: 32 nodes") && t.contains("metadata group: nodes 0 to 4"),
        "{t}"
    );
    let node = |index: u16| dir.join(swarm_shm::node_file_name(index));
    let corrupt_header = |index: u16| {
        let mut bytes = std::fs::read(node(index)).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(node(index), &bytes).unwrap();
    };
    for (lost, epoch) in [(27u16, 3), (1, 5)] {
        corrupt_header(lost);
        let history = scratch.path().join(format!("history-{lost}.jsonl"));
        let bench = Command::new(env!("CARGO_BIN_EXE_swarm"))
            .args(["bench", "--dir", d, "--workload", "a", "--keys", "300"])
            .args(["--duration", "6s", "--clients", "2", "--history"])
            .arg(&history)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the bench");
        let out = swarm(&["repair", "--dir", d, "--node", &lost.to_string()]);
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        assert!(
            t.contains(&format!("node {lost} rebuilt")) && t.contains(&format!("epoch {epoch}")),
            "{t}"
        );
        let bench = bench.wait_with_output().expect("run the bench");
        assert!(bench.status.success(), "{}", text(&bench));
        assert!(text(&bench).contains(" 0 errors"), "{}", text(&bench));
        let out = swarm(&["check", history.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out));
        let out = swarm(&["stat", "--dir", d]);
        assert!(
            text(&out).contains(&format!("node {lost}: up")),
            "{}",
            text(&out)
        );
    }
    corrupt_header(2);
    for i in 0..12 {
        assert_get(d, &format!("k{i}"), &format!("v{i}"));
    }
}

#[test]
fn scrub_reports_what_it_examined_and_leaves_a_healthy_index_alone() {
    let scratch = ScratchDir::new("cli-scrub").unwrap();
    let dir = scratch.path().join("c");
    init(&dir);
    let d = dir.to_str().unwrap();
    for i in 0..10 {
        assert!(
            swarm(&["put", "--dir", d, &format!("k{i}"), "v"])
                .status
                .success()
        );
    }
    let out = swarm(&["scrub", "--dir", d]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("index buckets: 0 lagging slot copies moved forward, 0 buckets skipped"),
        "{t}"
    );
    assert_get(d, "k3", "v");
    // As a background scrubber: a pass every 10 ms, two passes.
    let out = swarm(&["scrub", "--dir", d, "--every", "0.01", "--passes", "2"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(t.matches("scrubbed ").count(), 2, "{t}");
    let out = swarm(&["scrub", "--dir", d, "--every=-1"]);
    assert!(!out.status.success() && text(&out).contains("--every"));
}

#[test]
fn check_accepts_good_and_rejects_bad_histories() {
    let scratch = ScratchDir::new("cli-check").unwrap();
    let good = scratch.path().join("good.jsonl");
    std::fs::write(
        &good,
        "{\"client\":1,\"op\":\"insert\",\"key\":\"k\",\"value\":\"a\",\"ok\":true,\"start\":0,\"end\":10}\n\
         {\"client\":2,\"op\":\"get\",\"key\":\"k\",\"value\":\"a\",\"ok\":true,\"start\":20,\"end\":30}\n",
    )
    .unwrap();
    assert!(swarm(&["check", good.to_str().unwrap()]).status.success());
    let bad = scratch.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"client\":1,\"op\":\"insert\",\"key\":\"k\",\"value\":\"a\",\"ok\":true,\"start\":0,\"end\":10}\n\
         {\"client\":2,\"op\":\"get\",\"key\":\"k\",\"value\":null,\"ok\":true,\"start\":20,\"end\":30}\n",
    )
    .unwrap();
    let out = swarm(&["check", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let garbage = scratch.path().join("garbage.jsonl");
    std::fs::write(&garbage, "not json\n").unwrap();
    let out = swarm(&["check", garbage.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out).contains("line 1"), "{}", text(&out));
}

#[cfg(not(feature = "rdma"))]
#[test]
fn rdma_commands_in_a_build_without_rdma_say_how_to_get_one() {
    let scratch = ScratchDir::new("cli-no-rdma").unwrap();
    let dir = scratch.path().join("rdma");
    let d = dir.to_str().unwrap();
    let conf = dir.join("swarm-cluster.conf");
    let c = conf.to_str().unwrap();
    let attempts: &[&[&str]] = &[
        &[
            "init",
            "--rdma",
            "127.0.0.1:7471,127.0.0.1:7472",
            "--dir",
            d,
        ],
        &["get", "--cluster", c, "k"],
        &["put", "--rdma", "127.0.0.1:7471", "--token", c, "k", "v"],
        &["stat", "--cluster", c],
        &["format", "--cluster", c],
        &["memnode", "--listen", "127.0.0.1:7471", "--size", "64MiB"],
    ];
    for args in attempts {
        let out = swarm(args);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {t}");
        assert!(
            t.contains("built without RDMA support") && t.contains("--features rdma"),
            "{args:?}: {t}"
        );
        assert!(!t.contains("panicked"), "{args:?}: {t}");
    }
    assert!(!dir.exists(), "a refused init must not write anything");
}

#[cfg(feature = "rdma")]
#[test]
fn rdma_commands_without_a_device_fail_clearly() {
    let scratch = ScratchDir::new("cli-rdma").unwrap();
    let dir = scratch.path().join("rdma");
    let d = dir.to_str().unwrap();
    let out = swarm(&[
        "init",
        "--rdma",
        "127.0.0.1:7471,127.0.0.1:7472,127.0.0.1:7473",
        "--dir",
        d,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let conf = dir.join("swarm-cluster.conf");
    let token = dir.join("swarm.token");
    assert!(conf.exists() && token.exists());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&token).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let token_text = std::fs::read_to_string(&token).unwrap();
    assert!(
        !text(&out).contains(token_text.trim()),
        "the token must not be printed"
    );
    // A second init refuses to overwrite the token.
    assert!(
        !swarm(&["init", "--rdma", "127.0.0.1:7471", "--dir", d])
            .status
            .success()
    );
    let c = conf.to_str().unwrap();
    let t = token.to_str().unwrap();
    let attempts: &[&[&str]] = &[
        &["get", "--cluster", c, "k"],
        &[
            "put",
            "--rdma",
            "127.0.0.1:7471,127.0.0.1:7472,127.0.0.1:7473",
            "--token",
            t,
            "k",
            "v",
        ],
        &["format", "--cluster", c],
        &[
            "memnode",
            "--listen",
            "127.0.0.1:7471",
            "--size",
            "64MiB",
            "--cluster",
            c,
        ],
    ];
    for args in attempts {
        let out = swarm(args);
        assert!(
            !out.status.success(),
            "{args:?} should fail without a device"
        );
        let t = text(&out);
        if t.contains("no RDMA device found") {
            assert!(!t.contains("panicked"), "{args:?}: {t}");
        } else {
            // A machine with a device but no memory node running: a clear connection error.
            assert!(t.contains("error"), "{args:?}: {t}");
            println!("{args:?}: an RDMA device exists here: {t}");
        }
    }
}

/// The crashed client of the evict test: a process that registers a writer id, says
/// which, and never renews nor closes (its parent kills it).
const CRASHED_CHILD: &str = "SWARM_CLI_EVICT_CHILD";

/// `swarm evict` watches a lease for a lease period: it gives back the writer id of a
/// client that crashed, refuses a client that keeps renewing (and, on shared memory,
/// one whose process still runs), and with --force evicts even that one, which then
/// stops with a lease error instead of writing.
#[test]
fn evict_gives_back_the_writer_id_of_a_crashed_client_and_refuses_a_live_one() {
    if let Ok(dir) = std::env::var(CRASHED_CHILD) {
        let store = swarm_kv::ShmStore::open(Path::new(&dir)).expect("open the cluster");
        let client = store.client().expect("a writer id");
        println!("{}", client.writer());
        std::mem::forget(client);
        std::thread::sleep(std::time::Duration::from_secs(120));
        return;
    }
    let scratch = ScratchDir::new("cli-evict").unwrap();
    let dir = scratch.path().join("c");
    let d = dir.to_str().unwrap();
    let out = init_sized(d, "32MiB", "64", "16", &SHORT_LEASES);
    assert!(
        text(&out).contains("client leases of 400ms renewed every 50ms"),
        "{}",
        text(&out)
    );
    // A client that never closes nor renews: its row stays claimed, as after a crash.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "evict_gives_back_the_writer_id_of_a_crashed_client_and_refuses_a_live_one",
            "--nocapture",
        ])
        .env(CRASHED_CHILD, &dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the client to crash");
    let crashed_id = {
        use std::io::BufRead;
        let stdout = child.stdout.take().unwrap();
        std::io::BufReader::new(stdout)
            .lines()
            .map(|l| l.unwrap())
            .find(|l| l.trim().parse::<u16>().is_ok())
            .expect("the child's writer id")
            .trim()
            .to_string()
    };
    // While its process runs, its id is not given back (it may be stopped, not dead).
    let out = swarm(&["evict", "--dir", d, "--writer", &crashed_id]);
    assert!(!out.status.success());
    assert!(text(&out).contains("still runs"), "{}", text(&out));
    child.kill().unwrap();
    child.wait().unwrap();
    let store = swarm_kv::ShmStore::open(&dir).expect("open the cluster");
    // A live client, renewing as it works.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (live_id_tx, live_id_rx) = std::sync::mpsc::channel();
    let live = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let kv = store.client().expect("a writer id");
            live_id_tx.send(kv.writer()).unwrap();
            let s = swarm_core::OpStats::new();
            let mut ops = 0u64;
            loop {
                let result = swarm_core::block_on(kv.fabric(), kv.get(b"k", &s));
                if let Err(e) = result {
                    return (ops, Some(e.to_string()));
                }
                ops += 1;
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return (ops, None);
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        })
    };
    let live_id = live_id_rx.recv().unwrap().to_string();
    let out = swarm(&["stat", "--dir", d]);
    assert!(text(&out).contains("2 registered now"), "{}", text(&out));

    // The live client renews during the watch: refused with the reason.
    let out = swarm(&["evict", "--dir", d, "--writer", &live_id]);
    assert!(!out.status.success());
    assert!(text(&out).contains("it is alive"), "{}", text(&out));
    let out = swarm(&["evict", "--dir", d, "--writer", "999"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("no writer 999"), "{}", text(&out));

    // The crashed one is given back.
    let evict_crashed = ["evict", "--dir", d, "--writer", &crashed_id];
    let out = swarm(&evict_crashed);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("given back"), "{}", text(&out));
    let out = swarm(&["stat", "--dir", d]);
    assert!(text(&out).contains("1 registered now"), "{}", text(&out));
    let out = swarm(&evict_crashed);
    assert!(text(&out).contains("not registered"), "{}", text(&out));

    // --force evicts the live one; it stops with a lease error at its next operation.
    let out = swarm(&["evict", "--dir", d, "--writer", &live_id, "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    let (ops, error) = live.join().unwrap();
    assert!(ops > 0);
    let error = error.expect("the evicted client stopped by itself");
    assert!(error.contains("lease"), "{error}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // The cluster keeps working, and the ids are used again.
    assert!(swarm(&["put", "--dir", d, "k", "v"]).status.success());
    assert_get(d, "k", "v");
}

/// `swarm stat | head -1`: a reader that stops early is not an error.
#[test]
fn stat_into_a_closed_pipe_is_not_an_error() {
    let scratch = ScratchDir::new("cli-pipe").unwrap();
    let dir = scratch.path().join("c");
    init(&dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(["stat", "--dir", dir.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run swarm");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("swarm exits");
    assert!(out.status.success(), "{}", text(&out));
}

/// `--plot` draws the figures of a client sweep and of the contention experiment, with
/// their data beside them; `--json` of several runs is an array.
#[test]
fn bench_draws_the_papers_figures() {
    let scratch = ScratchDir::new("cli-plot").unwrap();
    let dir = scratch.path().join("c");
    let d = dir.to_str().unwrap();
    let out = swarm(&[
        "init",
        "--dir",
        d,
        "--size",
        "64MiB",
        "--value-max",
        "64",
        "--writers",
        "16",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let plots = scratch.path().join("plots");
    let json = scratch.path().join("runs.json");
    let common = [
        "--dir",
        d,
        "--keys",
        "200",
        "--ops",
        "4000",
        "--timeline-ms",
        "1",
        "--plot",
        plots.to_str().unwrap(),
    ];
    let mut sweep = vec![
        "bench",
        "--clients",
        "1,2",
        "--json",
        json.to_str().unwrap(),
    ];
    sweep.extend_from_slice(&common);
    let out = swarm(&sweep);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("run 2 of 2"), "{}", text(&out));
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(runs.as_array().map(Vec::len), Some(2));
    let mut contention = vec!["bench", "--contention", "1,2", "--system", "fusee"];
    contention.extend_from_slice(&common);
    let out = swarm(&contention);
    assert!(out.status.success(), "{}", text(&out));
    for name in [
        "latency-cdf-b-get.png",
        "latency-cdf-b-update.png",
        "roundtrips-b.png",
        "roundtrips-b.md",
        "throughput-vs-clients-b.png",
        "contention.png",
        "timeline-swarm-b-c2.png",
    ] {
        let path = plots.join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if name.ends_with(".png") {
            assert!(bytes.starts_with(b"\x89PNG"), "{name}");
            assert!(
                path.with_extension("json").exists(),
                "{name} has no data beside it"
            );
        }
    }
    let out = swarm(&[
        "bench",
        "--dir",
        d,
        "--clients",
        "1,2",
        "--history",
        "h.jsonl",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("--history records one run"),
        "{}",
        text(&out)
    );
}

/// Runs `swarm` again (up to three times) when an operation ran past its deadline: on
/// a loaded machine a process may stall longer than `--max-op`, and the error says to
/// retry.
fn retried(args: &[&str]) -> Output {
    let mut out = swarm(args);
    for _ in 0..2 {
        if out.status.success() || !text(&out).contains("max_op_ns") {
            break;
        }
        out = swarm(args);
    }
    out
}

/// The registers a one-shot `swarm delete` retires come back (SWARM §5.4,
/// `swarm_kv::registers::limbo`): on a cluster of 256 registers (one chunk), `pairs` put + delete
/// processes in a row, each exiting right after its operation, leave at most a couple
/// of registers holding data, where leaking every deleted register would hold one
/// per pair (and exhaust the cluster after 256 pairs). `SWARM_CLI_LIMBO_PAIRS=300`
/// runs past the capacity.
#[test]
fn one_shot_deletes_do_not_leak_registers() {
    let pairs: usize = std::env::var("SWARM_CLI_LIMBO_PAIRS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(40);
    let scratch = ScratchDir::new("cli-limbo").unwrap();
    let dir = scratch.path().join("c");
    let d = dir.to_str().unwrap();
    init_sized(
        d,
        "8MiB",
        "8KiB",
        "16",
        &["--writers", "4", "--cache-ttl", "20ms"],
    );
    let holding = |d: &str| -> (u64, String) {
        let out = swarm(&["stat", "--dir", d]);
        assert!(out.status.success(), "{}", text(&out));
        let t = text(&out);
        let census = t
            .lines()
            .find_map(|l| l.strip_prefix("registers: "))
            .unwrap_or_else(|| panic!("no register census in {t}"));
        let number_before = |what: &str| -> u64 {
            census
                .split(what)
                .next()
                .and_then(|head| head.rsplit([' ', '(']).find(|w| !w.is_empty()))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no {what:?} in {census}"))
        };
        // Registers holding data, but for those retired by gone clients: a client
        // that runs out takes them back (when donations are on offer it takes those
        // first, so they may wait).
        let n = number_before(" holding data") - number_before(" retired by gone clients");
        (n, t)
    };
    assert!(text(&swarm(&["stat", "--dir", d])).contains("capacity 256"));
    assert!(swarm(&["put", "--dir", d, "keep", "safe"]).status.success());
    let mut most = 0;
    for i in 0..pairs {
        let key = format!("k{i}");
        let out = retried(&["put", "--dir", d, &key, "v"]);
        assert!(out.status.success(), "put {key}: {}", text(&out));
        let out = retried(&["delete", "--dir", d, &key]);
        // A retried delete may find the key gone already.
        assert!(
            out.status.success() || text(&out).contains("key not found"),
            "delete {key}: {}",
            text(&out)
        );
        assert!(
            !swarm(&["get", "--dir", d, &key]).status.success(),
            "{key} is back"
        );
        if i % 10 == 9 {
            let (n, t) = holding(d);
            most = most.max(n);
            // The kept key, and a few deletes whose unmap a stalled process could
            // not finish (their key maps to a tombstone until it is inserted again:
            // not this leak); the deleted keys' registers are reclaimable.
            assert!(
                n <= 8,
                "after {} pairs, {n} registers hold data:\n{t}",
                i + 1
            );
        }
    }
    let (n, t) = holding(d);
    eprintln!("{pairs} put+delete pairs: at most {most} registers held data, {n} at the end");
    eprintln!(
        "{}",
        t.lines()
            .find(|l| l.starts_with("registers: "))
            .unwrap_or("")
    );
    assert!(t.contains("keys: 1 "), "{t}");
    assert_get(d, "keep", "safe");
    let out = swarm(&["get", "--dir", d, "k0"]);
    assert!(!out.status.success(), "k0 came back: {}", text(&out));
}

/// `swarm bench` again and again on one cluster: each run's load puts its keys again,
/// which takes a fresh register per key for a while, so the chunks earlier runs
/// claimed soon outnumber the unclaimed ones. What those runs left behind (their
/// pools, the registers they retired) is reclaimable, and the capacity check counts
/// it: the third run used to be refused ("the cluster is too small").
#[test]
fn bench_runs_again_and_again_on_one_cluster() {
    let scratch = ScratchDir::new("cli-bench-again").unwrap();
    let dir = scratch.path().join("c");
    let d = dir.to_str().unwrap();
    init_sized(
        d,
        "8MiB",
        "64",
        "24",
        &["--writers", "4", "--cache-ttl", "20ms"],
    );
    assert!(text(&swarm(&["stat", "--dir", d])).contains("capacity 9216"));
    for run in 1..=4 {
        let out = retried(&[
            "bench",
            "--dir",
            d,
            "--workload",
            "b",
            "--keys",
            "4000",
            "--ops",
            "2000",
            "--clients",
            "1",
        ]);
        assert!(out.status.success(), "run {run}: {}", text(&out));
    }
}

/// Runs `swarm` with `args` (any bytes) and `stdin` on its standard input.
fn swarm_with_input(args: &[&std::ffi::OsStr], stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run swarm");
    child
        .stdin
        .take()
        .expect("a pipe")
        .write_all(stdin)
        .expect("write swarm's standard input");
    child.wait_with_output().expect("wait for swarm")
}

/// `put KEY -` stores standard input's bytes, `get --raw` writes them back exactly,
/// `get` adds a newline; `put KEY VALUE` takes a value that is not UTF-8 as is.
#[test]
fn binary_values_round_trip_through_stdin_and_stdout() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let scratch = ScratchDir::new("cli-binary").unwrap();
    let dir = scratch.path().join("c");
    init(&dir);
    let d = OsStr::new(dir.to_str().unwrap());
    let mut value = vec![0, b'\n', 0xff, b'\r'];
    value.extend((4..64u32).map(|i| (i * 37 + 200) as u8));
    assert!(std::str::from_utf8(&value).is_err(), "not UTF-8");
    assert!(value.contains(&0) && value.contains(&b'\n'));
    let put = swarm_with_input(
        &[
            OsStr::new("put"),
            OsStr::new("--dir"),
            d,
            OsStr::new("blob"),
            OsStr::new("-"),
        ],
        &value,
    );
    assert!(put.status.success(), "{}", text(&put));
    let raw = swarm_with_input(
        &[
            OsStr::new("get"),
            OsStr::new("--dir"),
            d,
            OsStr::new("--raw"),
            OsStr::new("blob"),
        ],
        b"",
    );
    assert!(raw.status.success(), "{}", text(&raw));
    assert_eq!(raw.stdout, value);
    let line = swarm_with_input(
        &[
            OsStr::new("get"),
            OsStr::new("--dir"),
            d,
            OsStr::new("blob"),
        ],
        b"",
    );
    assert_eq!(line.stdout, [&value[..], b"\n"].concat());
    // Too large from standard input: the cluster's limit, not a panic.
    let big = swarm_with_input(
        &[
            OsStr::new("put"),
            OsStr::new("--dir"),
            d,
            OsStr::new("big"),
            OsStr::new("-"),
        ],
        &[7u8; 65],
    );
    assert!(!big.status.success());
    assert!(text(&big).contains("--value-max"), "{}", text(&big));
    // A command-line value that is not UTF-8, under a key that is not either.
    let key = OsStr::from_bytes(b"k\xfe");
    let arg = OsStr::from_bytes(b"\xff\x01-\x80");
    let put = swarm_with_input(&[OsStr::new("put"), OsStr::new("--dir"), d, key, arg], b"");
    assert!(put.status.success(), "{}", text(&put));
    let raw = swarm_with_input(
        &[
            OsStr::new("get"),
            OsStr::new("--dir"),
            d,
            OsStr::new("--raw"),
            key,
        ],
        b"",
    );
    assert_eq!(raw.stdout, b"\xff\x01-\x80");
}

/// `get --json` and `stat --json` print JSON: text values as strings, other bytes as
/// base64, absent keys as `found: false` (exit 1).
#[test]
fn json_output_of_get_and_stat_parses() {
    let scratch = ScratchDir::new("cli-json").unwrap();
    let dir = scratch.path().join("c");
    init(&dir);
    let d = dir.to_str().unwrap();
    let json = |out: &Output| -> serde_json::Value {
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(out)))
    };
    assert!(
        swarm(&["put", "--dir", d, "word", "héllo \"quoted\""])
            .status
            .success()
    );
    let put = swarm_with_input(
        &["put", "--dir", d, "bin", "-"].map(std::ffi::OsStr::new),
        b"\x00\xff\nhi",
    );
    assert!(put.status.success(), "{}", text(&put));

    let out = swarm(&["get", "--dir", d, "--json", "word"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        json(&out),
        serde_json::json!({"key": "word", "key_encoding": "utf-8", "found": true,
            "value": "héllo \"quoted\"", "value_encoding": "utf-8"})
    );
    let out = swarm(&["get", "--dir", d, "--json", "bin"]);
    let got = json(&out);
    assert_eq!(got["value"], "AP8KaGk=", "{got}");
    assert_eq!(got["value_encoding"], "base64");
    let out = swarm(&["get", "--dir", d, "--json", "missing"]);
    assert!(!out.status.success(), "absent: exit 1");
    let got = json(&out);
    assert_eq!(got["found"], false);
    assert!(got["value"].is_null());

    let out = swarm(&["stat", "--dir", d, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let stat = json(&out);
    assert_eq!(stat["keys"], 2, "{stat}");
    assert_eq!(stat["nodes"], 3);
    let states = stat["node_states"].as_array().expect("node_states");
    assert_eq!(states.len(), 3);
    assert!(states.iter().all(|n| n["state"] == "up"), "{stat}");
    assert_eq!(stat["registers"]["keyed"], 2);
    assert_eq!(
        stat["writers"]["registered"], 0,
        "every command gave its id back"
    );
    assert!(stat["leases"]["lease_ns"].as_u64().is_some());
}
