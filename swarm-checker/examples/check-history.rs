//! Checks a JSON Lines history for linearizability and prints the
//! report: verdict, totals, and for each key without a linearization the window of
//! operations where the search got stuck.
//!
//! ```text
//! cargo run --release -p swarm-checker --example check-history -- history.jsonl
//! some-recorder | cargo run --release -p swarm-checker --example check-history -- -
//! ```
//!
//! Exit status: 0 linearizable, 1 not linearizable (or undecided within `--budget`),
//! 2 the history cannot be read.

use std::fs::File;
use std::io::{self, BufReader};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use swarm_checker::{CheckOptions, History, ParseError, check_with};

/// Checks a history (one JSON operation per line) for linearizability.
#[derive(Debug, Parser)]
struct Args {
    /// The history file, or `-` for standard input.
    file: PathBuf,
    /// Threads checking keys in parallel (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Give up on a key after exploring this many search configurations (its verdict
    /// is then "undecided"); by default every key is decided, however long it takes.
    #[arg(long)]
    budget: Option<u64>,
}

fn read(file: &PathBuf) -> Result<History, String> {
    let parsed = if file.as_os_str() == "-" {
        History::from_jsonl(io::stdin().lock())
    } else {
        let f = File::open(file).map_err(|e| format!("cannot open {}: {e}", file.display()))?;
        History::from_jsonl(BufReader::new(f))
    };
    parsed.map_err(|e: ParseError| format!("{} is not a valid history: {e}", file.display()))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let history = match read(&args.file) {
        Ok(history) => history,
        Err(message) => {
            eprintln!("check-history: {message}");
            return ExitCode::from(2);
        }
    };
    let mut options = CheckOptions::new();
    if let Some(threads) = args.threads {
        options = options.threads(threads);
    }
    if let Some(budget) = args.budget {
        options = options.budget_per_key(budget);
    }
    let report = check_with(&history, &options);
    print!("{report}");
    if report.is_linearizable() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
