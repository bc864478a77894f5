//! The `swarm-memnode` binary where there is no RDMA device: a clear message and a
//! non-zero exit status, never a panic (moved here from swarm-rdma's `tests/device.rs`
//! with the binary). Needs the `rdma` feature.

use std::io::Write;
use std::net::TcpListener;
use std::process::Command;

/// The no-device behaviour, where there is no device: a clear message and a
/// non-zero exit status from the daemon binary, never a panic.
#[test]
fn without_a_device_the_daemon_exits_with_a_clear_message() {
    if swarm_rdma::device_names().is_ok() {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED without_a_device_the_daemon_exits_with_a_clear_message: this machine has an RDMA device"
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("swarm-rdma-nodev-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let bin = env!("CARGO_BIN_EXE_swarm-memnode");
    let init = Command::new(bin)
        .args(["init", "--rdma", &listen, "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    let cluster = dir.join("swarm-cluster.conf");
    for args in [
        vec!["run", "--listen", &listen, "--size", "1TiB", "--cluster"],
        vec!["check", "--cluster"],
    ] {
        let out = Command::new(bin)
            .args(&args)
            .arg(&cluster)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: no RDMA device found: "),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
