//! Hand-made histories with known verdicts: violations the checker must reject and
//! tricky linearizable histories (overlaps, crashes, cuts) it must accept.

use swarm_checker::{
    CheckOptions, History, OpKind, Operation, ParseError, Recorder, Report, Verdict, check,
    check_with,
};

const K: &str = "k";

fn done(client: u64, op: OpKind, value: Option<&str>, ok: bool, start: u64, end: u64) -> Operation {
    Operation::completed(client, op, K, value, ok, start, end)
}
fn w(client: u64, v: &str, start: u64, end: u64) -> Operation {
    done(client, OpKind::Write, Some(v), true, start, end)
}
fn r(client: u64, v: Option<&str>, start: u64, end: u64) -> Operation {
    done(client, OpKind::Read, v, true, start, end)
}
fn ins(client: u64, v: &str, start: u64, end: u64) -> Operation {
    done(client, OpKind::Insert, Some(v), true, start, end)
}
fn upd(client: u64, v: &str, ok: bool, start: u64, end: u64) -> Operation {
    done(client, OpKind::Update, Some(v), ok, start, end)
}
fn del(client: u64, ok: bool, start: u64, end: u64) -> Operation {
    done(client, OpKind::Delete, None, ok, start, end)
}
fn get(client: u64, v: Option<&str>, start: u64, end: u64) -> Operation {
    done(client, OpKind::Get, v, true, start, end)
}
fn crashed(client: u64, op: OpKind, v: Option<&str>, start: u64) -> Operation {
    Operation::crashed(client, op, K, v, start)
}

fn history(ops: Vec<Operation>) -> History {
    let mut h = History::new();
    for op in ops {
        h.push(op).expect("valid operation");
    }
    h
}

fn run(ops: Vec<Operation>) -> Report {
    check(&history(ops))
}

#[track_caller]
fn accepted(ops: Vec<Operation>) {
    let report = run(ops);
    assert!(
        report.is_linearizable(),
        "should be linearizable:\n{report}"
    );
}

#[track_caller]
fn rejected(ops: Vec<Operation>) -> Report {
    let report = run(ops);
    assert!(
        !report.is_linearizable(),
        "should NOT be linearizable:\n{report}"
    );
    assert_eq!(report.violations().count(), 1, "{report}");
    report
}

// ---- violations -------------------------------------------------------------------

#[test]
fn stale_read_after_a_completed_write() {
    let report = rejected(vec![w(1, "a", 0, 10), r(2, None, 20, 30)]);
    let v = report.violations().next().unwrap();
    assert_eq!((v.linearized, v.completed), (1, 2));
    assert_eq!(v.state.as_deref(), Some("a"));
    assert_eq!(v.stuck.op.line, 2);
    assert_eq!(v.stuck.why, "returns null, but the value is \"a\"");
}

#[test]
fn read_of_a_value_never_written() {
    let report = rejected(vec![w(1, "a", 0, 10), r(2, Some("zz"), 5, 15)]);
    let v = report.violations().next().unwrap();
    assert_eq!(
        v.notes,
        ["line 2 returns \"zz\", which no operation on this key writes"]
    );
}

#[test]
fn sequential_reads_returning_new_then_old() {
    rejected(vec![
        w(1, "old", 0, 5),
        w(1, "new", 10, 100),
        r(2, Some("new"), 20, 30),
        r(3, Some("old"), 40, 50),
    ]);
}

#[test]
fn lost_update() {
    rejected(vec![
        ins(1, "a", 0, 10),
        upd(2, "b", true, 20, 30),
        upd(3, "c", true, 40, 50),
        get(1, Some("b"), 60, 70),
    ]);
}

#[test]
fn get_of_a_deleted_value_after_the_delete() {
    let report = rejected(vec![
        ins(1, "a", 0, 10),
        del(2, true, 20, 30),
        get(3, Some("a"), 40, 50),
    ]);
    let v = report.violations().next().unwrap();
    assert_eq!(v.stuck.why, "returns \"a\", but the key is absent");
    assert_eq!(v.state, None);
}

#[test]
fn successful_update_of_a_key_never_inserted() {
    let report = rejected(vec![upd(1, "a", true, 0, 10), get(2, Some("a"), 20, 30)]);
    let v = report.violations().next().unwrap();
    assert_eq!(v.stuck.why, "reports ok: true, but the key is absent");
}

#[test]
fn failed_delete_of_a_present_key() {
    rejected(vec![ins(1, "a", 0, 10), del(2, false, 20, 30)]);
}

#[test]
fn successful_delete_of_an_absent_key() {
    rejected(vec![
        ins(1, "a", 0, 10),
        del(2, true, 20, 30),
        del(3, true, 40, 50),
    ]);
}

#[test]
fn operations_that_cannot_fail_reporting_failure() {
    rejected(vec![done(1, OpKind::Insert, Some("a"), false, 0, 10)]);
    rejected(vec![done(1, OpKind::Write, Some("a"), false, 0, 10)]);
    rejected(vec![done(1, OpKind::Read, None, false, 0, 10)]);
    rejected(vec![done(1, OpKind::Get, None, false, 0, 10)]);
}

#[test]
fn crashed_write_observed_then_unobserved() {
    // Once a crashed write has been seen, it has taken effect for good.
    rejected(vec![
        crashed(1, OpKind::Write, Some("a"), 0),
        r(2, Some("a"), 10, 20),
        r(3, None, 30, 40),
    ]);
}

#[test]
fn crashed_write_observed_before_it_was_called() {
    rejected(vec![
        r(2, Some("a"), 0, 10),
        crashed(1, OpKind::Write, Some("a"), 20),
    ]);
}

#[test]
fn crashed_write_applied_at_most_once() {
    rejected(vec![
        crashed(1, OpKind::Write, Some("a"), 0),
        r(2, Some("a"), 10, 20),
        w(3, "b", 30, 40),
        r(2, Some("a"), 50, 60),
    ]);
}

#[test]
fn contradiction_that_needs_both_states_at_a_cut() {
    // Either write may be last before the cut at 10..20, but not both.
    rejected(vec![
        w(1, "a", 0, 10),
        w(2, "b", 0, 10),
        r(3, Some("a"), 20, 30),
        r(3, Some("b"), 40, 50),
    ]);
}

#[test]
fn get_after_delete_returns_the_value_again() {
    rejected(vec![
        ins(1, "a", 0, 10),
        crashed(2, OpKind::Delete, None, 15),
        get(3, None, 20, 30),
        get(3, Some("a"), 40, 50),
    ]);
}

// ---- linearizable histories -----------------------------------------------------------

#[test]
fn concurrent_writes_and_a_read_in_any_order() {
    for seen in [None, Some("a"), Some("b")] {
        accepted(vec![w(1, "a", 0, 10), w(2, "b", 5, 15), r(3, seen, 6, 20)]);
    }
}

#[test]
fn reads_during_overlapping_writes_flip_between_values() {
    accepted(vec![
        w(1, "a", 0, 100),
        w(2, "b", 5, 100),
        r(3, Some("b"), 10, 20),
        r(3, Some("a"), 30, 40),
        r(4, Some("a"), 45, 50),
    ]);
}

#[test]
fn touching_intervals_are_concurrent() {
    accepted(vec![w(1, "a", 0, 10), r(2, None, 10, 20)]);
}

#[test]
fn either_state_at_a_cut_is_possible() {
    // The search first leaves the cut with "b" and must come back for "a".
    accepted(vec![
        w(1, "a", 0, 10),
        w(2, "b", 0, 10),
        r(3, Some("a"), 20, 30),
        w(3, "c", 40, 50),
        r(1, Some("c"), 60, 70),
    ]);
}

#[test]
fn a_second_write_of_the_current_value_may_take_effect_later() {
    // Found by the brute-force cross-check: w(a) while the value is already "a" is a
    // no-op now, but it may be the write that restores "a" after the crashed w(b).
    accepted(vec![
        w(1, "a", 0, 0),
        crashed(2, OpKind::Write, Some("b"), 0),
        w(1, "a", 5, 10),
        r(3, Some("b"), 10, 13),
        r(3, Some("a"), 14, 14),
    ]);
}

#[test]
fn crashed_write_observed_later() {
    accepted(vec![
        crashed(1, OpKind::Write, Some("a"), 0),
        r(2, None, 10, 20),
        r(2, Some("a"), 30, 40),
        r(3, Some("a"), 50, 60),
    ]);
}

#[test]
fn crashed_write_never_observed() {
    accepted(vec![
        w(2, "b", 0, 5),
        crashed(1, OpKind::Write, Some("a"), 1),
        r(2, Some("b"), 10, 20),
        r(3, Some("b"), 30, 40),
    ]);
}

#[test]
fn crashed_write_overwritten_before_being_observed() {
    accepted(vec![
        crashed(1, OpKind::Write, Some("a"), 0),
        r(2, Some("a"), 10, 20),
        w(3, "b", 30, 40),
        r(2, Some("b"), 50, 60),
    ]);
}

#[test]
fn crashed_insert_then_get_null() {
    accepted(vec![
        crashed(1, OpKind::Insert, Some("a"), 0),
        get(2, None, 10, 20),
    ]);
    accepted(vec![
        crashed(1, OpKind::Insert, Some("a"), 0),
        get(2, None, 10, 20),
        get(2, Some("a"), 30, 40),
    ]);
}

#[test]
fn crashed_update_takes_effect_only_on_a_present_key() {
    accepted(vec![
        crashed(1, OpKind::Update, Some("a"), 0),
        get(2, None, 10, 20),
        ins(2, "b", 30, 40),
        get(3, Some("a"), 50, 60),
    ]);
    rejected(vec![
        crashed(1, OpKind::Update, Some("a"), 0),
        get(2, Some("a"), 10, 20),
    ]);
}

#[test]
fn crashed_delete_takes_effect_between_gets() {
    accepted(vec![
        ins(1, "a", 0, 10),
        crashed(2, OpKind::Delete, None, 15),
        get(3, Some("a"), 20, 30),
        get(3, None, 40, 50),
        upd(1, "b", false, 60, 70),
    ]);
}

#[test]
fn key_value_semantics_of_insert_update_delete() {
    accepted(vec![
        upd(1, "x", false, 0, 10),
        del(1, false, 20, 30),
        ins(2, "a", 40, 50),
        ins(3, "b", 60, 70), // an insert of a present key updates it
        get(1, Some("b"), 80, 90),
        upd(2, "c", true, 100, 110),
        del(3, true, 120, 130),
        get(1, None, 140, 150),
        ins(1, "d", 160, 170),
        get(2, Some("d"), 180, 190),
    ]);
}

#[test]
fn three_clients_interleaved() {
    // One linearization: w1(a) r2(a) w3(c) r3(c) w2(b) r3(b) r2(b) w1(d) r2(d) r3(d).
    accepted(vec![
        w(1, "a", 0, 50),
        r(2, Some("a"), 5, 15),
        w(3, "c", 10, 40),
        w(2, "b", 20, 60),
        r(3, Some("c"), 45, 55),
        r(3, Some("b"), 58, 65),
        w(1, "d", 62, 80),
        r(2, Some("b"), 63, 70),
        r(2, Some("d"), 75, 90),
        r(3, Some("d"), 81, 85),
    ]);
}

#[test]
fn many_concurrent_writers_then_reads_of_the_survivor() {
    let history = |writers: u64, last_read: Option<&str>| {
        let mut ops: Vec<Operation> = (0..writers)
            .map(|c| w(c, &format!("v{c}"), c, 100 + c))
            .collect();
        for c in 0..writers {
            ops.push(r(c, Some("v7"), 200 + c * 10, 205 + c * 10));
        }
        if let Some(v) = last_read {
            ops.push(r(3, Some(v), 1000, 1010));
        }
        ops
    };
    accepted(history(16, None));
    // Refuting it means trying every set of writes with every last one: 12 * 2^11.
    rejected(history(12, Some("v8")));
}

// ---- whole histories, reports and options --------------------------------------------

#[test]
fn keys_are_judged_independently() {
    let mut ops = Vec::new();
    for key in ["a", "b", "c"] {
        ops.push(Operation::completed(
            1,
            OpKind::Write,
            key,
            Some("1"),
            true,
            0,
            10,
        ));
        ops.push(Operation::completed(
            2,
            OpKind::Read,
            key,
            Some("1"),
            true,
            20,
            30,
        ));
    }
    // On key "b" alone, the write then reads back null.
    ops.push(Operation::completed(
        3,
        OpKind::Read,
        "b",
        None,
        true,
        40,
        50,
    ));
    ops.push(Operation::completed(3, OpKind::Get, "kv", None, true, 0, 5));
    let report = run(ops);
    assert!(!report.is_linearizable());
    let keys: Vec<&str> = report.violations().map(|v| &*v.key).collect();
    assert_eq!(keys, ["b"]);
    assert_eq!(report.key("a").unwrap().verdict, Verdict::Linearizable);
    assert_eq!(report.key("kv").unwrap().verdict, Verdict::Linearizable);
    assert_eq!((report.operations(), report.keys().len()), (8, 4));
}

#[test]
fn report_prints_the_window_as_json_lines() {
    let text = r#"{"client": 1, "op": "write", "key": "reg", "value": "a", "ok": true, "start": 0, "end": 10}
{"client": 2, "op": "write", "key": "reg", "value": "b", "ok": true, "start": 20, "end": 30}
{"client": 3, "op": "read", "key": "reg", "value": "a", "ok": true, "start": 40, "end": 50}
{"client": 1, "op": "write", "key": "reg", "value": "c", "ok": true, "start": 45, "end": 60}
"#;
    let report = check(&History::from_jsonl(text.as_bytes()).unwrap());
    let shown = report.to_string();
    assert!(
        shown.starts_with("NOT linearizable: 4 operations (0 crashed) on 1 key,"),
        "{shown}"
    );
    assert!(
        shown.contains("key \"reg\": NOT linearizable (register, 4 completed operations)"),
        "{shown}"
    );
    let v = report.violations().next().unwrap();
    // Line 3 is stuck whether or not the concurrent write of "c" goes first.
    assert_eq!(v.stuck.op.line, 3);
    assert_eq!(v.possible, [Some("b".to_string()), Some("c".to_string())]);
    assert!(shown.contains("can leave any of \"b\", \"c\""), "{shown}");
    assert!(
        shown.contains("line 3: returns \"a\", but the value is \"c\""),
        "{shown}"
    );
    // Every JSON line of the window parses back as an operation of the input.
    let window: String = shown
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(|l| format!("{l}\n"))
        .collect();
    let reparsed = History::from_jsonl(window.as_bytes()).unwrap();
    assert_eq!(reparsed.len(), 4, "{shown}");
}

#[test]
fn mixing_models_on_a_key_is_a_parse_error() {
    let text = r#"{"client": 1, "op": "write", "key": "k", "value": "a", "ok": true, "start": 0, "end": 10}
{"client": 1, "op": "get", "key": "k", "value": "a", "ok": true, "start": 20, "end": 30}
"#;
    let err = History::from_jsonl(text.as_bytes()).unwrap_err();
    assert!(matches!(err, ParseError::Invalid { line: 2, .. }), "{err}");
}

#[test]
fn a_search_budget_leaves_keys_undecided_never_accepted() {
    let mut ops: Vec<Operation> = (0..12)
        .map(|c| w(c, &format!("v{c}"), c, 100 + c))
        .collect();
    ops.push(r(3, Some("nope"), 200, 210));
    let h = history(ops);
    let report = check_with(&h, &CheckOptions::new().budget_per_key(10).threads(1));
    assert!(!report.is_linearizable());
    assert_eq!(report.undecided().count(), 1);
    assert!(report.to_string().starts_with("UNDECIDED"), "{report}");
    let report = check_with(&h, &CheckOptions::new());
    assert_eq!(report.violations().count(), 1, "{report}");
}

#[test]
fn recorder_from_threads_sharing_a_locked_register() {
    use std::sync::Mutex;
    use std::time::Instant;

    let rec = Recorder::new();
    let registers: Vec<Mutex<Option<String>>> = (0..3).map(|_| Mutex::new(None)).collect();
    let epoch = Instant::now();
    let now = || epoch.elapsed().as_nanos() as u64;
    std::thread::scope(|s| {
        for client in 0..4u64 {
            let (rec, registers) = (&rec, &registers);
            s.spawn(move || {
                for i in 0..300u64 {
                    let k = ((client + i) % 3) as usize;
                    let key = format!("r{k}");
                    if (client + i) % 2 == 0 {
                        let value = format!("{client}-{i}");
                        let id = rec.begin(client, OpKind::Write, &key, Some(&value), now());
                        *registers[k].lock().unwrap() = Some(value);
                        rec.end(id, true, None, now()).unwrap();
                    } else {
                        let id = rec.begin(client, OpKind::Read, &key, None, now());
                        let seen = registers[k].lock().unwrap().clone();
                        rec.end(id, true, seen.as_deref(), now()).unwrap();
                    }
                }
            });
        }
    });
    let history = rec.into_history().unwrap();
    assert_eq!(history.len(), 1200);
    let report = check(&history);
    assert!(report.is_linearizable(), "{report}");
}

#[test]
fn recorder_from_threads_sharing_a_locked_key_value_map() {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Instant;

    let rec = Recorder::new();
    let map: Mutex<HashMap<String, String>> = Mutex::new(HashMap::new());
    let epoch = Instant::now();
    let now = || epoch.elapsed().as_nanos() as u64;
    std::thread::scope(|s| {
        for client in 0..4u64 {
            let (rec, map) = (&rec, &map);
            s.spawn(move || {
                for i in 0..300u64 {
                    let key = format!("k{}", (client * 7 + i) % 4);
                    let value = format!("{client}-{i}");
                    let kind = [OpKind::Get, OpKind::Insert, OpKind::Update, OpKind::Delete]
                        [((client + i * 3) % 4) as usize];
                    let written = kind.writes_value().then_some(value.as_str());
                    let id = rec.begin(client, kind, &key, written, now());
                    let mut map = map.lock().unwrap();
                    let (ok, seen) = match kind {
                        OpKind::Get => (true, map.get(&key).cloned()),
                        OpKind::Insert => {
                            map.insert(key, value);
                            (true, None)
                        }
                        OpKind::Update => match map.get_mut(&key) {
                            Some(v) => {
                                *v = value;
                                (true, None)
                            }
                            None => (false, None),
                        },
                        _ => (map.remove(&key).is_some(), None),
                    };
                    drop(map);
                    rec.end(id, ok, seen.as_deref(), now()).unwrap();
                }
            });
        }
    });
    let history = rec.into_history().unwrap();
    let report = check(&history);
    assert!(report.is_linearizable(), "{report}");
    assert_eq!((report.operations(), report.keys().len()), (1200, 4));
}
