//! Ten `swarm bench` processes SIGKILLed one after the other on a cluster with only
//! four writer ids and short leases: each leaves its writer ids claimed, yet the next
//! bench, and `swarm put`/`get`/`bench` afterwards, take over the dead clients' ids
//! once their leases expired, and no acknowledged write is lost: neither the one made
//! before the kills nor those made between them, each by a `swarm put` that took over
//! a dead client's id.

mod cli_support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::{SHORT_LEASES, swarm, text};
use swarm_shm::ScratchDir;

/// How many rows `swarm stat` shows registered to process `pid`.
fn rows_of(dir: &str, pid: u32) -> usize {
    let out = swarm(&["stat", "--dir", dir]);
    text(&out).matches(&format!(": pid {pid}, ")).count()
}

/// Rounds followed by an acknowledged `swarm put`.
const PUT_ROUNDS: usize = 8;

#[test]
fn ten_killed_benches_leave_a_four_writer_cluster_usable() {
    let scratch = ScratchDir::new("lease-kill").unwrap();
    let dir = scratch.path().join("c");
    let d = dir.to_str().unwrap();
    let mut args = vec![
        "init",
        "--dir",
        d,
        "--size",
        "64MiB",
        "--value-max",
        "64",
        "--key-max",
        "32",
        "--writers",
        "4",
    ];
    args.extend_from_slice(&SHORT_LEASES);
    let out = swarm(&args);
    assert!(out.status.success(), "{}", text(&out));
    let out = swarm(&["put", "--dir", d, "before", "the kills"]);
    assert!(out.status.success(), "{}", text(&out));

    for round in 0..10 {
        let mut bench = Command::new(env!("CARGO_BIN_EXE_swarm"))
            .args([
                "bench",
                "--dir",
                d,
                "--workload",
                "a",
                "--keys",
                "200",
                "--duration",
                "60s",
                "--clients",
                "2",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a bench");
        // Kill it once both its clients hold a writer id (reclaiming dead ones takes
        // it a lease period from the third round on).
        let pid = bench.id();
        let started = Instant::now();
        while rows_of(d, pid) < 2 {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "round {round}: the bench never got two writer ids"
            );
            if let Ok(Some(status)) = bench.try_wait() {
                panic!("round {round}: the bench exited early: {status}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "round {round}: bench {pid} held two writer ids after {:?}",
            started.elapsed()
        );
        // SAFETY: plain libc call on the pid of a child we own and have not waited for.
        let killed = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        assert_eq!(killed, 0, "kill failed");
        bench.wait().expect("reap the bench");
        // An acknowledged write right after each kill: it takes over a dead id (and
        // resumes its log) while the killed bench's buffers are still current, and
        // frees the other dead rows. Not after the last two kills, whose benches are
        // left holding all four ids.
        if round < PUT_ROUNDS {
            let (key, value) = (format!("round-{round}"), format!("value {round}"));
            let out = swarm(&["put", "--dir", d, &key, &value]);
            assert!(out.status.success(), "round {round}: {}", text(&out));
        }
    }
    let out = swarm(&["stat", "--dir", d]);
    assert!(
        text(&out).contains("4 registered now"),
        "the killed benches hold every id: {}",
        text(&out)
    );

    // Right after the last kill: the next commands take over dead ids.
    let started = Instant::now();
    let out = swarm(&["put", "--dir", d, "after", "the kills"]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!(
        "swarm put succeeded {:?} after the last kill",
        started.elapsed()
    );
    let acknowledged = [
        ("before", "the kills".to_string()),
        ("after", "the kills".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .chain((0..PUT_ROUNDS).map(|r| (format!("round-{r}"), format!("value {r}"))));
    for (key, value) in acknowledged {
        let out = swarm(&["get", "--dir", d, &key]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{value}\n"));
    }
    let out = swarm(&[
        "bench",
        "--dir",
        d,
        "--workload",
        "a",
        "--keys",
        "200",
        "--ops",
        "2000",
        "--clients",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("all done {:?} after the last kill", started.elapsed());
}
