//! Running the `swarm` command from the tests of the command line (`cli.rs`,
//! `lease_kill.rs`).

use std::process::{Command, Output};

/// Runs `swarm` with `args` and waits for it.
pub fn swarm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_swarm"))
        .args(args)
        .output()
        .expect("run swarm")
}

/// What `out` printed, standard output then standard error.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `swarm init` options for leases short enough that a test waits out a killed
/// client's (400 ms, renewed every 50 ms, operations fenced at 200 ms).
pub const SHORT_LEASES: [&str; 6] = [
    "--lease",
    "400ms",
    "--lease-renew",
    "50ms",
    "--max-op",
    "200ms",
];
