//! The `swarm-shm-demo` binary runs end to end, cleans up after itself, attaches to
//! a kept cluster, and reports a bad cluster as a clear error.

use std::process::{Command, Output};

use swarm_shm::{ScratchDir, node_file_name};

fn demo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_swarm-shm-demo"))
        .args(args)
        .output()
        .expect("run swarm-shm-demo")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn demo_creates_exercises_and_removes_a_cluster() {
    let scratch = ScratchDir::new("swarm-shm-demo-test").expect("scratch directory");
    let dir = scratch.path().join("cluster");
    let dir_arg = dir.to_str().expect("utf-8 path");

    let out = demo(&["--dir", dir_arg, "--ops", "300", "--rtt-ns", "300"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for expected in [
        "wrote 64 bytes to 3 nodes",
        "pipelined write + CAS on",
        "counter 0 -> 600",
        "a majority read still takes 1 roundtrip",
        "the operation stalled",
        "removed the cluster",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    assert!(
        !dir.join(node_file_name(0)).exists(),
        "node files were left behind"
    );

    // Keep one, attach a second run to it: it sees the first run's increments.
    let out = demo(&["--dir", dir_arg, "--ops", "100", "--keep"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = demo(&["--dir", dir_arg, "--ops", "100", "--attach"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("claimed slot 1"), "{stdout}");
    assert!(stdout.contains("counter 200 -> 400"), "{stdout}");

    // Creating over it without --overwrite is refused; a corrupted node is named.
    let out = demo(&["--dir", dir_arg]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("already holds a SWARM cluster"),
        "{}",
        text(&out.stderr)
    );
    // One corrupted node of three: the others serve, with a warning naming it.
    std::fs::write(dir.join(node_file_name(2)), b"garbage").expect("corrupt node 2");
    let out = demo(&["--dir", dir_arg, "--attach"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.starts_with("warning: memory node 2") && stderr.contains("node-2.swarm"),
        "{stderr}"
    );
    // Two: no majority, an error naming both.
    std::fs::write(dir.join(node_file_name(1)), b"garbage").expect("corrupt node 1");
    let out = demo(&["--dir", dir_arg, "--attach"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.starts_with("error: ") && stderr.contains("node 1") && stderr.contains("node 2"),
        "{stderr}"
    );
}
