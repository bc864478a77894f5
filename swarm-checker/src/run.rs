//! Checking a whole history: one independent search per key, spread over threads.

use core::cmp::Reverse;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::boxed::Box;
use std::thread;
use std::time::Instant;
use std::vec::Vec;

use super::explain::explain;
use super::history::{History, KeyLog};
use super::prepare::Prepared;
use super::report::{KeyReport, Report, Verdict};
use super::search::{Found, search};

/// How to check: threads and the search budget.
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    threads: Option<usize>,
    budget: Option<u64>,
}

impl CheckOptions {
    /// Defaults: one thread per available core, no budget (every key is decided).
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks keys on `threads` threads (at least one).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads.max(1));
        self
    }

    /// Gives up on a key (verdict [`Verdict::Undecided`]) after exploring this many
    /// configurations. Deciding a non-linearizable history can take time exponential in
    /// its concurrency; the budget bounds it.
    pub fn budget_per_key(mut self, configurations: u64) -> Self {
        self.budget = Some(configurations);
        self
    }
}

/// Checks `history` with the default options.
pub fn check(history: &History) -> Report {
    check_with(history, &CheckOptions::default())
}

/// Checks `history`: each key on its own (P-compositionality), biggest keys first, on
/// `options.threads` threads.
pub fn check_with(history: &History, options: &CheckOptions) -> Report {
    let started = Instant::now();
    let logs = history.key_logs();
    let threads = options
        .threads
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, logs.len().max(1));
    // Biggest keys first, so that a hot key does not start last and run alone.
    let mut order: Vec<usize> = (0..logs.len()).collect();
    order.sort_by_key(|&k| Reverse(logs[k].ops.len()));
    let next = AtomicUsize::new(0);
    let worker = || {
        let mut done = Vec::new();
        while let Some(&k) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
            done.push((k, check_key(history, &logs[k], options.budget)));
        }
        done
    };
    let mut results: Vec<(usize, KeyReport)> = if threads == 1 {
        worker()
    } else {
        thread::scope(|s| {
            let handles: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        })
    };
    results.sort_unstable_by_key(|(k, _)| *k);
    Report {
        keys: results.into_iter().map(|(_, r)| r).collect(),
        operations: history.len(),
        crashed: history.crashed_count(),
        elapsed: started.elapsed(),
        threads,
        budget: options.budget,
    }
}

fn check_key(history: &History, log: &KeyLog, budget: Option<u64>) -> KeyReport {
    let prep = Prepared::new(log);
    let (found, stats) = search(&prep, budget);
    let verdict = match found {
        Found::Linearizable => Verdict::Linearizable,
        Found::Violation(deepest) => {
            Verdict::NotLinearizable(Box::new(explain(history, log, &prep, &deepest)))
        }
        Found::BudgetExhausted => Verdict::Undecided,
    };
    KeyReport {
        key: log.name.clone(),
        model: log.model,
        operations: log.ops.len(),
        crashed: log.ops.iter().filter(|o| o.end.is_none()).count(),
        cuts: prep.cuts,
        configurations: stats.configurations,
        peak_memo: stats.peak_memo,
        verdict,
    }
}

impl History {
    /// Checks this history with the default options; see [`check`].
    pub fn check(&self) -> Report {
        check(self)
    }
}
