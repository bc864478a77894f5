//! Side-by-side comparison of runs: SWARM-KV next to its baselines, as the paper
//! presents them (§7.1, Figure 5 and Table 2), one block per workload setting.

use std::fmt::Write as _;

use super::report::{BenchReport, OpTypeReport, format_fraction, format_ns, format_rate};
use super::workload::OpType;

/// The setting a block of the table shares: everything but the system.
fn setting(r: &BenchReport) -> String {
    format!(
        "{}: {} clients x {} in flight, {} keys, {} ops, {} B values, rtt {} ns",
        r.workload, r.clients, r.inflight, r.keys, r.ops, r.value_size, r.rtt_ns
    )
}

fn op_cells(r: Option<&OpTypeReport>) -> String {
    match r {
        None => format!(
            "{:>10} {:>8} {:>6} {:>6} {:>6} {:>6}",
            "", "", "", "", "", ""
        ),
        Some(r) => format!(
            "{:>10} {:>8} {:>6} {:>6} {:>6} {:>6}",
            format_ns(r.p50_ns as f64),
            format_ns(r.p99_ns as f64),
            format_fraction(r.roundtrips.one),
            format_fraction(r.roundtrips.two),
            format_fraction(r.roundtrips.three),
            format_fraction(r.roundtrips.four_plus)
        ),
    }
}

/// One table of `reports`: a block per setting (in order of first appearance), a row
/// per system with throughput, then median and 99th percentile latency and the
/// roundtrip distribution of gets and of updates, then the error count.
pub fn comparison_table(reports: &[BenchReport]) -> String {
    let mut settings: Vec<String> = Vec::new();
    for r in reports {
        let s = setting(r);
        if !settings.contains(&s) {
            settings.push(s);
        }
    }
    let mut out = String::new();
    let op_header = |op: &str| {
        format!(
            "{:>10} {:>8} {:>6} {:>6} {:>6} {:>6}",
            format!("{op} p50"),
            "p99",
            "1 RT",
            "2 RT",
            "3 RT",
            "4+ RT"
        )
    };
    for s in settings {
        let _ = writeln!(out, "{s}");
        let _ = writeln!(
            out,
            "  {:<6} {:>13} | {} | {} | {:>6}",
            "system",
            "throughput",
            op_header("get"),
            op_header("update"),
            "errors"
        );
        for r in reports.iter().filter(|r| setting(r) == s) {
            let _ = writeln!(
                out,
                "  {:<6} {:>13} | {} | {} | {:>6}",
                r.system.name(),
                format_rate(r.throughput_ops_s),
                op_cells(r.op(OpType::Get)),
                op_cells(r.op(OpType::Update)),
                r.errors
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ycsb::config::{BenchConfig, System};
    use crate::ycsb::report::RunStats;
    use crate::ycsb::workload::Workload;

    fn report(system: System, workload: Workload, rt: u32) -> BenchReport {
        let config = BenchConfig::new(system, workload);
        let mut stats = RunStats {
            measured_seconds: 1.0,
            ..RunStats::default()
        };
        for _ in 0..10 {
            stats
                .measured
                .record(OpType::Get, 1000 * u64::from(rt), rt, true);
        }
        if workload != Workload::C {
            stats.measured.record(OpType::Update, 1500, rt, true);
        }
        BenchReport::new(&config, &stats)
    }

    #[test]
    fn one_block_per_setting_one_row_per_system() {
        let reports = [
            report(System::Raw, Workload::A, 1),
            report(System::Abd, Workload::A, 2),
            report(System::Raw, Workload::C, 1),
            report(System::Swarm, Workload::A, 1),
        ];
        let table = comparison_table(&reports);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2 + 3 + 2 + 1, "{table}");
        assert!(lines[0].starts_with("YCSB-A: 4 clients"), "{table}");
        assert!(
            lines[1].contains("get p50") && lines[1].contains("update p50"),
            "{table}"
        );
        assert!(lines[2].trim_start().starts_with("raw"), "{table}");
        assert!(
            lines[3].trim_start().starts_with("abd") && lines[3].contains("2.00µs"),
            "{table}"
        );
        assert!(lines[4].trim_start().starts_with("swarm"), "{table}");
        assert!(lines[5].starts_with("YCSB-C"), "{table}");
        // Every row lines up with its header.
        assert_eq!(
            lines[1].chars().count(),
            lines[2].chars().count(),
            "{table}"
        );
        assert_eq!(
            lines[6].chars().count(),
            lines[7].chars().count(),
            "{table}"
        );
    }
}
