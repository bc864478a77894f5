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
    /// Every fault below.
    All,
    /// A crashed minority of memory nodes.
    Crash,
    /// One node 20x slower for a while.
    Slow,
    /// Client clocks skewed by up to ±max-skew-ns.
    Skew,
    /// A quarter of the clients crash mid-operation.
    Clients,
    /// One message in eight delayed by 5 to 40 µs: new tuples sit on a minority.
    Late,
    /// Nodes take turns being 5-40x slower for 5 to 50 µs.
    Spells,
    /// A third of the client-node links 3-15x slower, redrawn over time.
    Links,
    /// Nodes stall up to 5 µs between two operations of one batch.
    Stalls,
    /// Client clocks jump to a new skew before one operation in eight.
    Jumps,
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
    /// Operations each client keeps in flight (one writer id).
    #[arg(long, default_value_t = 1)]
    inflight: u32,
    /// Number of keys.
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
    /// Percentage of deletes, and as many inserts (Safe-Guess only; the history is
    /// then a key-value one).
    #[arg(long, default_value_t = 0)]
    delete_percent: u32,
    /// Length of a timestamp tick in virtual nanoseconds.
    #[arg(long, default_value_t = 100)]
    tick_ns: u64,
    /// Largest clock skew of the `skew` and `jumps` faults, in virtual nanoseconds.
    #[arg(long, default_value_t = 20_000)]
    max_skew_ns: u64,
    /// Metadata words per register (W, SWARM §4.4): writer w CASes word w mod W.
    #[arg(long, default_value_t = 4)]
    meta_words: u16,
    /// Make each client's first operation a write (an insert with deletes on).
    #[arg(long)]
    write_first: bool,
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
            FaultArg::Late => faults.late_messages = true,
            FaultArg::Spells => faults.slow_spells = true,
            FaultArg::Links => faults.slow_links = true,
            FaultArg::Stalls => faults.node_stalls = true,
            FaultArg::Jumps => faults.clock_jumps = true,
        }
    }
    let mut s = Scenario::new(args.seed);
    s.clients = args.clients;
    s.ops_per_client = args.ops.div_ceil(args.clients);
    s.inflight = args.inflight.clamp(1, 64);
    s.keys = args.keys.max(1);
    s.delete_percent = args.delete_percent.min(50);
    s.tick_ns = args.tick_ns.max(1);
    s.max_skew_ns = args.max_skew_ns;
    s.replicas = args.replicas;
    s.faults = faults;
    s.write_percent = args.write_percent.min(100 - 2 * s.delete_percent);
    s.meta_words = args.meta_words.clamp(1, 64);
    s.think_ns = args.think_ns;
    s.write_first = args.write_first;
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
