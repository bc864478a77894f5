//! Runs a seeded simulation of Safe-Guess (or DM-ABD) registers with faults and
//! writes the history, one operation per line, to stdout (the checker's JSON Lines
//! format); a summary goes to stderr.
//!
//! ```text
//! cargo run --release -p swarm-sim --example sim-history -- \
//!     --seed 7 --ops 2000 --clients 8 --keys 4 --faults all > history.jsonl
//! cargo run --release -p swarm-checker --example check-history -- history.jsonl
//! ```

use std::io::{BufWriter, Write};
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use swarm_sim::scenario::{self, Faults, Protocol, Scenario};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ProtocolArg {
    /// Safe-Guess over In-n-Out (SWARM).
    Sg,
    /// DM-ABD, the two-roundtrip baseline.
    Abd,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FaultArg {
    /// No fault.
    None,
    /// Crashed minority, slow node, clock skew and crashing clients.
    All,
    /// A crashed minority of memory nodes.
    Crash,
    /// One node 20x slower for a while.
    Slow,
    /// Client clocks skewed by up to ±20 µs.
    Skew,
    /// A quarter of the clients crash mid-operation.
    Clients,
}

/// Seeded SWARM simulation that prints its history as JSON Lines.
#[derive(Debug, Parser)]
struct Args {
    /// Seed of the simulation: the same seed gives the same history.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Total operations (split evenly among clients).
    #[arg(long, default_value_t = 1000)]
    ops: u32,
    /// Number of clients, each a writer (at most 2048).
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Number of registers.
    #[arg(long, default_value_t = 4)]
    keys: u32,
    /// Replicas per register (3, 5, 7, ...).
    #[arg(long, default_value_t = 3)]
    replicas: u16,
    /// Faults to inject (repeat or comma-separate).
    #[arg(long, value_delimiter = ',', default_value = "none")]
    faults: Vec<FaultArg>,
    /// Replication protocol.
    #[arg(long, value_enum, default_value = "sg")]
    protocol: ProtocolArg,
    /// Percentage of writes.
    #[arg(long, default_value_t = 50)]
    write_percent: u32,
    /// Metadata words per register (W, SWARM §4.4): writer w CASes word w mod W.
    #[arg(long, default_value_t = 4)]
    meta_words: u16,
    /// Virtual nanoseconds each client waits between operations.
    #[arg(long, default_value_t = 0)]
    think_ns: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.clients == 0 || args.clients > 2048 || args.replicas == 0 || args.replicas > 15 {
        eprintln!("error: use 1 to 2048 clients and 1 to 15 replicas");
        return ExitCode::from(2);
    }
    let mut faults = Faults::NONE;
    for f in &args.faults {
        match f {
            FaultArg::None => {}
            FaultArg::All => faults = Faults::ALL,
            FaultArg::Crash => faults.crash_minority = true,
            FaultArg::Slow => faults.slow_node = true,
            FaultArg::Skew => faults.clock_skew = true,
            FaultArg::Clients => faults.crash_clients = true,
        }
    }
    let mut s = Scenario::new(args.seed);
    s.clients = args.clients;
    s.ops_per_client = args.ops.div_ceil(args.clients);
    s.keys = args.keys.max(1);
    s.replicas = args.replicas;
    s.faults = faults;
    s.write_percent = args.write_percent.min(100);
    s.meta_words = args.meta_words.clamp(1, 64);
    s.think_ns = args.think_ns;
    s.protocol = match args.protocol {
        ProtocolArg::Sg => Protocol::SafeGuess,
        ProtocolArg::Abd => Protocol::Abd,
    };
    let outcome = match scenario::run(&s) {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("error: simulation with seed {} failed: {e}", args.seed);
            return ExitCode::FAILURE;
        }
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if let Err(e) = outcome
        .history
        .write_jsonl(&mut out)
        .and_then(|()| out.flush())
    {
        eprintln!("error: writing the history failed: {e}");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "seed {}: {} operations ({} crashed), {} errors, virtual time {} µs",
        args.seed,
        outcome.history.len(),
        outcome.history.crashed_count(),
        outcome.errors.len(),
        outcome.run.now / 1000
    );
    eprintln!("reads  roundtrips: {}", outcome.reads);
    eprintln!("writes roundtrips: {}", outcome.writes);
    eprintln!("max read iterations: {}", outcome.max_read_iterations);
    ExitCode::SUCCESS
}
