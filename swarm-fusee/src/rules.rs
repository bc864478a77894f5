//! SNAPSHOT's conflict-resolution rules (FUSEE §4.3, Algorithm 2), as pure functions.
//!
//! Every writer of a round read `v_old` from the primary slot and CASed every backup
//! slot from `v_old` to its own `v_new`. A backup slot takes exactly one writer's
//! value, and each CAS returns what the slot held, so every writer learns the
//! "snapshot" `v_list` of the backups (after replacing `v_old` by its own `v_new`
//! where its CAS succeeded). From that alone the writers agree on one last writer:
//!
//! * **Rule 1**: the writer that took *every* backup;
//! * **Rule 2**: else the writer that took a *majority* of the backups;
//! * **Rule 3**: else, if the primary still holds `v_old` (checked with one more
//!   read: otherwise a last writer was already decided and committed), the writer
//!   with the *smallest* value among the backups.
//!
//! Everybody else loses, and is linearized just before the last writer's CAS of the
//! primary. A backup that did not answer makes the round undecidable by the clients:
//! that is the master's job (FUSEE §5.2, [`crate::master`]).

/// What a writer learns from its backup CASes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Last writer by rule 1: CAS the primary.
    Rule1,
    /// Last writer by rule 2: finish the backups, then CAS the primary.
    Rule2,
    /// Rules 1 and 2 decide nothing and `v_new` is the smallest value: read the
    /// primary, and apply [`rule3`].
    CheckPrimary,
    /// Another writer is the last writer.
    Lose,
    /// A backup did not answer: ask the master.
    Fail,
}

/// Replaces `v_old` by `v_new` in the CAS results (the CASes that succeeded) and
/// evaluates rules 1 and 2 (Algorithm 2, lines 2-11). `None` is a backup that failed.
pub fn evaluate(v_list: &mut [Option<u64>], v_old: u64, v_new: u64) -> Verdict {
    if v_list.iter().any(Option::is_none) {
        return Verdict::Fail;
    }
    for v in v_list.iter_mut() {
        if *v == Some(v_old) {
            *v = Some(v_new);
        }
    }
    let values: Vec<u64> = v_list.iter().flatten().copied().collect();
    let Some((v_maj, cnt_maj)) = majority(&values) else {
        // No backups at all (a single replica): the primary alone decides.
        return Verdict::Rule1;
    };
    if cnt_maj == values.len() {
        return if v_maj == v_new {
            Verdict::Rule1
        } else {
            Verdict::Lose
        };
    }
    if 2 * cnt_maj > values.len() {
        return if v_maj == v_new {
            Verdict::Rule2
        } else {
            Verdict::Lose
        };
    }
    if !values.contains(&v_new) {
        return Verdict::Lose;
    }
    Verdict::CheckPrimary
}

/// Rule 3 once the primary was read again (Algorithm 2, lines 12-19): `Some(true)` if
/// this writer is the last writer, `Some(false)` if it lost, `None` if the primary
/// already moved past `v_old` (the round is finished: lost too, but there is no need
/// to wait for the primary to change).
pub fn rule3(v_list: &[Option<u64>], v_old: u64, v_new: u64, v_check: u64) -> Option<bool> {
    if v_check != v_old {
        return None;
    }
    let smallest = v_list.iter().flatten().min().copied();
    Some(smallest == Some(v_new))
}

/// The most frequent value and its count; ties go to the smaller value, so every
/// writer computes the same answer from the same list.
fn majority(values: &[u64]) -> Option<(u64, usize)> {
    let mut best: Option<(u64, usize)> = None;
    for &v in values {
        let count = values.iter().filter(|&&w| w == v).count();
        best = match best {
            Some((bv, bc)) if bc > count || (bc == count && bv <= v) => Some((bv, bc)),
            _ => Some((v, count)),
        };
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: u64 = 10;

    #[test]
    fn a_writer_alone_wins_by_rule_1() {
        let mut list = [Some(OLD), Some(OLD)];
        assert_eq!(evaluate(&mut list, OLD, 20), Verdict::Rule1);
        assert_eq!(list, [Some(20), Some(20)]);
    }

    #[test]
    fn the_writer_holding_a_majority_wins_by_rule_2_and_the_others_lose() {
        // Three backups: A took two, B one. Each sees the same final snapshot.
        let mut a = [Some(OLD), Some(OLD), Some(30)];
        assert_eq!(evaluate(&mut a, OLD, 20), Verdict::Rule2);
        let mut b = [Some(20), Some(20), Some(OLD)];
        assert_eq!(evaluate(&mut b, OLD, 30), Verdict::Lose);
    }

    #[test]
    fn a_split_snapshot_goes_to_rule_3_where_the_smallest_value_wins() {
        let mut a = [Some(OLD), Some(30)];
        let mut b = [Some(20), Some(OLD)];
        assert_eq!(evaluate(&mut a, OLD, 20), Verdict::CheckPrimary);
        assert_eq!(evaluate(&mut b, OLD, 30), Verdict::CheckPrimary);
        assert_eq!(rule3(&a, OLD, 20, OLD), Some(true));
        assert_eq!(rule3(&b, OLD, 30, OLD), Some(false));
        // Once the primary moved, nobody evaluates rule 3 any more.
        assert_eq!(rule3(&a, OLD, 20, 20), None);
    }

    #[test]
    fn a_writer_that_took_no_backup_loses_without_reading_the_primary() {
        let mut c = [Some(20), Some(30), Some(40)];
        assert_eq!(evaluate(&mut c, OLD, 50), Verdict::Lose);
    }

    #[test]
    fn a_failed_backup_makes_the_round_the_masters() {
        let mut list = [Some(OLD), None];
        assert_eq!(evaluate(&mut list, OLD, 20), Verdict::Fail);
    }

    #[test]
    fn at_most_one_writer_wins_any_snapshot() {
        // Exhaustive over snapshots of 3 backups taken by up to 3 writers.
        let writers = [20u64, 30, 40];
        for a in writers {
            for b in writers {
                for c in writers {
                    let snapshot = [a, b, c];
                    let mut winners = 0;
                    for w in writers {
                        let mut list: Vec<Option<u64>> = snapshot
                            .iter()
                            .map(|&v| Some(if v == w { OLD } else { v }))
                            .collect();
                        let wins = match evaluate(&mut list, OLD, w) {
                            Verdict::Rule1 | Verdict::Rule2 => true,
                            Verdict::CheckPrimary => rule3(&list, OLD, w, OLD) == Some(true),
                            Verdict::Lose | Verdict::Fail => false,
                        };
                        winners += usize::from(wins);
                    }
                    assert_eq!(winners, 1, "snapshot {snapshot:?}");
                }
            }
        }
    }
}
