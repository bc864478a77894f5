//! The checker's verdicts: per key, and for the whole history.

use core::fmt;
use core::time::Duration;
use std::boxed::Box;
use std::sync::Arc;
use std::vec::Vec;

use super::explain::Violation;
use super::op::Model;

/// The verdict on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The key's sub-history has a linearization.
    Linearizable,
    /// It has none; the violation explains where the search got stuck.
    NotLinearizable(Box<Violation>),
    /// The search gave up after exploring its budget of configurations.
    Undecided,
}

/// What the checker found on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyReport {
    /// The key.
    pub key: Arc<str>,
    /// Its object model.
    pub model: Model,
    /// Operations on the key.
    pub operations: usize,
    /// Of which crashed (no end).
    pub crashed: usize,
    /// Quiescent cuts found in its history.
    pub cuts: usize,
    /// Configurations the search explored.
    pub configurations: u64,
    /// The most configurations its memo held at once.
    pub peak_memo: usize,
    /// The verdict.
    pub verdict: Verdict,
}

/// The result of checking a history: a verdict per key and totals.
#[derive(Clone, Debug)]
pub struct Report {
    pub(crate) keys: Vec<KeyReport>,
    pub(crate) operations: usize,
    pub(crate) crashed: usize,
    pub(crate) elapsed: Duration,
    pub(crate) threads: usize,
    pub(crate) budget: Option<u64>,
}

impl Report {
    /// Whether every key's sub-history is linearizable, hence the whole history
    /// (linearizability is compositional).
    pub fn is_linearizable(&self) -> bool {
        self.keys.iter().all(|k| k.verdict == Verdict::Linearizable)
    }

    /// The keys that are not linearizable, with the explanation for each.
    pub fn violations(&self) -> impl Iterator<Item = &Violation> {
        self.keys.iter().filter_map(|k| match &k.verdict {
            Verdict::NotLinearizable(v) => Some(&**v),
            _ => None,
        })
    }

    /// The keys whose search ran out of budget.
    pub fn undecided(&self) -> impl Iterator<Item = &KeyReport> {
        self.keys.iter().filter(|k| k.verdict == Verdict::Undecided)
    }

    /// Every key's report, in order of first appearance in the history.
    pub fn keys(&self) -> &[KeyReport] {
        &self.keys
    }

    /// The report on `key`, if the history has it.
    pub fn key(&self, key: &str) -> Option<&KeyReport> {
        self.keys.iter().find(|k| &*k.key == key)
    }

    /// Operations checked.
    pub fn operations(&self) -> usize {
        self.operations
    }

    /// Crashed operations among them.
    pub fn crashed(&self) -> usize {
        self.crashed
    }

    /// Wall-clock time of the check.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Configurations explored over all keys.
    pub fn configurations(&self) -> u64 {
        self.keys.iter().map(|k| k.configurations).sum()
    }
}

/// How many violations `Display` spells out.
const SHOWN_VIOLATIONS: usize = 10;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let violations = self.violations().count();
        let undecided = self.undecided().count();
        let verdict = match (violations, undecided) {
            (0, 0) => "linearizable",
            (0, _) => "UNDECIDED",
            _ => "NOT linearizable",
        };
        writeln!(
            f,
            "{verdict}: {} ({} crashed) on {}, checked in {:.3} s on {}",
            plural(self.operations, "operation"),
            self.crashed,
            plural(self.keys.len(), "key"),
            self.elapsed.as_secs_f64(),
            plural(self.threads, "thread"),
        )?;
        if let Some(busiest) = self.keys.iter().max_by_key(|k| k.operations) {
            writeln!(
                f,
                "  busiest key {:?}: {} operations, {} quiescent cuts, {} configurations explored (at most {} held); {} in total",
                &*busiest.key,
                busiest.operations,
                busiest.cuts,
                busiest.configurations,
                busiest.peak_memo,
                self.configurations()
            )?;
        }
        if violations > 0 {
            writeln!(
                f,
                "  {violations} of {} ha{} no linearization",
                plural(self.keys.len(), "key"),
                if violations == 1 { "s" } else { "ve" }
            )?;
        }
        if undecided > 0 {
            let budget = self.budget.unwrap_or(0);
            write!(
                f,
                "  {} exhausted the search budget of {budget} configurations before a verdict; raise it to decide:",
                plural(undecided, "key")
            )?;
            for k in self.undecided().take(SHOWN_VIOLATIONS) {
                write!(f, " {:?}", &*k.key)?;
            }
            writeln!(f)?;
        }
        for v in self.violations().take(SHOWN_VIOLATIONS) {
            writeln!(f)?;
            write!(f, "{v}")?;
        }
        if violations > SHOWN_VIOLATIONS {
            writeln!(f, "\n... and {} more keys", violations - SHOWN_VIOLATIONS)?;
        }
        Ok(())
    }
}

/// `n` and `noun`, plural when `n != 1`.
fn plural(n: usize, noun: &str) -> std::string::String {
    std::format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}
