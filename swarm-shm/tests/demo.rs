//! The `swarm-shm-demo` example runs end to end, cleans up after itself, attaches to
//! a kept cluster, and reports a bad cluster as a clear error.
//!
//! `cargo test` builds a package's examples beside its tests; a run of this test alone
//! (`cargo test -p swarm-shm --test demo`) needs
//! `cargo build -p swarm-shm --example swarm-shm-demo` first.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use swarm_shm::{ScratchDir, node_file_name};

/// The example's binary: `target/<profile>/examples/swarm-shm-demo`, beside this
/// test's `target/<profile>/deps/demo-<hash>`, where `cargo test` and
/// `cargo build --example` leave it.
fn demo_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps")
        .join("examples")
        .join(format!("swarm-shm-demo{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo test -p swarm-shm` (which builds the examples), or \
         `cargo build -p swarm-shm --example swarm-shm-demo` before this test alone",
        bin.display()
    );
    bin
}

fn demo(args: &[&str]) -> Output {
    Command::new(demo_bin())
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
