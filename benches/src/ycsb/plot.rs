//! The paper's figures, drawn from benchmark reports (`swarm bench --plot DIR`, and
//! `SWARM_BENCH_PLOT=DIR` for the `ycsb` bench):
//!
//! * `latency-cdf-<workload>-<op>.png`: latency CDF per operation kind, a line per
//!   system (SWARM Figure 5);
//! * `throughput-vs-clients-<workload>.png`: throughput against client count, a line
//!   per system, when runs with several client counts are given (Figure 6);
//! * `roundtrips-<workload>.png` and `.md`: the roundtrip distribution of each system's
//!   gets and updates, stacked bars and a table (Table 2);
//! * `contention.png`: writers on one key against the fraction of one-roundtrip updates
//!   (the update-only workload on one key, §7.8);
//! * `timeline-<system>-<workload>.png`: throughput and latency per interval of the
//!   measured phase, with the node crash marked (Figure 11).
//!
//! Every figure has a caption line with its setup (machine, fabric and emulated RTT,
//! clients, keys, value size, operations), and the reports it was drawn from are
//! written beside it as `<name>.json`. Text is rendered with an embedded DejaVu font,
//! so no system font library is needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::error::BenchError;
use super::report::BenchReport;
use super::workload::{OpType, Workload};

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 700;
const CAPTION_HEIGHT: u32 = 40;
const FONT: &str = "sans-serif";

/// Colors of the systems, in a fixed order so a system keeps its color everywhere.
fn color_of(system: &str) -> RGBColor {
    match system {
        "raw" => RGBColor(120, 120, 120),
        "abd" => RGBColor(31, 119, 180),
        "fusee" => RGBColor(214, 39, 40),
        "swarm" => RGBColor(44, 160, 44),
        _ => RGBColor(148, 103, 189),
    }
}

/// Colors of 1, 2, 3 and 4+ roundtrips.
const RT_COLORS: [RGBColor; 4] = [
    RGBColor(44, 160, 44),
    RGBColor(255, 187, 60),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
];

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is a static, valid TrueType file: registering cannot fail.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

/// An axis label: up to three significant digits, no trailing zeros.
fn label(v: &f64) -> String {
    let v = *v;
    if v == 0.0 {
        return "0".into();
    }
    let digits = (2 - v.abs().log10().floor() as i32).clamp(0, 4) as usize;
    let text = format!("{v:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

fn plot_error(path: &Path, error: impl std::fmt::Display) -> BenchError {
    BenchError::Plot {
        path: path.to_path_buf(),
        message: error.to_string(),
    }
}

/// The machine, for captions: host name and cores.
fn machine() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this machine".into());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    format!("{host}, {cores} cores")
}

/// The setup of `r`, for a caption.
fn setup(r: &BenchReport, clients: Option<&str>) -> String {
    let clients = clients.map_or_else(|| r.clients.to_string(), String::from);
    format!(
        "setup: {}; shared-memory fabric, emulated RTT {} ns; {} clients x {} in flight; {} keys of {} B, {} B values; {}",
        machine(),
        r.rtt_ns,
        clients,
        r.inflight,
        r.keys,
        r.key_size,
        r.value_size,
        // A `--duration` run has no operation count (`ops` is then unbounded).
        match r.duration_ns {
            Some(ns) => format!("measured for {:.1} s", ns as f64 / 1e9),
            None => format!("{} measured ops", r.ops),
        }
    )
}

/// Draws the legend of `chart`'s labelled series at `position`.
fn legend<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    position: SeriesLabelPosition,
    size: u32,
    path: &Path,
) -> Result<(), BenchError> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT, size).into_font())
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_error(path, e))
}

/// Writes every figure `reports` allow into `dir` (created if needed); returns the
/// image files written.
pub fn write_figures(reports: &[BenchReport], dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    register_font();
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Output {
        what: "figures",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    let workloads: BTreeSet<&str> = reports.iter().map(|r| r.workload.name()).collect();
    for workload in workloads {
        let of_workload: Vec<&BenchReport> = reports
            .iter()
            .filter(|r| r.workload.name() == workload)
            .collect();
        // The CDFs and roundtrips of the largest client count of each system.
        let max_clients = of_workload.iter().map(|r| r.clients).max().unwrap_or(0);
        let main: Vec<&BenchReport> = of_workload
            .iter()
            .copied()
            .filter(|r| r.clients == max_clients)
            .collect();
        for op in OpType::ALL {
            if main
                .iter()
                .any(|r| r.op(op).is_some_and(|o| !o.cdf.is_empty()))
            {
                let name = format!("latency-cdf-{workload}-{}", op.name());
                written.push(latency_cdf(&main, op, &dir.join(format!("{name}.png")))?);
                write_json(&main, &dir.join(format!("{name}.json")))?;
            }
        }
        let name = format!("roundtrips-{workload}");
        written.push(roundtrips(&main, &dir.join(format!("{name}.png")))?);
        write_roundtrip_table(&main, &dir.join(format!("{name}.md")))?;
        write_json(&main, &dir.join(format!("{name}.json")))?;
        let counts: BTreeSet<usize> = of_workload.iter().map(|r| r.clients).collect();
        if counts.len() > 1 {
            let name = format!("throughput-vs-clients-{workload}");
            written.push(throughput_vs_clients(
                &of_workload,
                &dir.join(format!("{name}.png")),
            )?);
            write_json(&of_workload, &dir.join(format!("{name}.json")))?;
        }
    }
    let contention: Vec<&BenchReport> = reports
        .iter()
        .filter(|r| r.workload == Workload::U && r.keys == 1)
        .collect();
    if !contention.is_empty() {
        written.push(contention_figure(&contention, &dir.join("contention.png"))?);
        write_json(&contention, &dir.join("contention.json"))?;
    }
    for r in reports.iter().filter(|r| r.timeline.len() > 1) {
        let name = format!(
            "timeline-{}-{}-c{}",
            r.system.name(),
            r.workload.name(),
            r.clients
        );
        written.push(timeline(r, &dir.join(format!("{name}.png")))?);
        write_json(&[r], &dir.join(format!("{name}.json")))?;
    }
    Ok(written)
}

fn write_json(reports: &[&BenchReport], path: &Path) -> Result<(), BenchError> {
    let json = serde_json::to_string_pretty(reports).unwrap_or_default();
    std::fs::write(path, json).map_err(|source| BenchError::Output {
        what: "figure data",
        path: path.to_path_buf(),
        source,
    })
}

/// The drawing area of a figure and the strip below it for the caption.
fn canvas(
    path: &Path,
) -> (
    DrawingArea<BitMapBackend<'_>, Shift>,
    DrawingArea<BitMapBackend<'_>, Shift>,
) {
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    let _ = root.fill(&WHITE);
    root.split_vertically(HEIGHT - CAPTION_HEIGHT)
}

fn caption(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    text: &str,
    path: &Path,
) -> Result<(), BenchError> {
    area.draw(&Text::new(
        text.to_string(),
        (15, 10),
        (FONT, 15).into_font(),
    ))
    .map_err(|e| plot_error(path, e))
}

fn latency_cdf(reports: &[&BenchReport], op: OpType, path: &Path) -> Result<PathBuf, BenchError> {
    let us = |ns: u64| (ns.max(1) as f64) / 1e3;
    let all: Vec<f64> = reports
        .iter()
        .filter_map(|r| r.op(op))
        .flat_map(|o| o.cdf.iter().map(|&(ns, _)| us(ns)))
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(0.01) * 0.8;
    let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 2.0) * 1.2;
    let (main, strip) = canvas(path);
    {
        let mut chart = ChartBuilder::on(&main)
            .caption(
                format!("{} latency CDF, {}", op.name(), reports[0].workload),
                (FONT, 26).into_font(),
            )
            .margin(20)
            .x_label_area_size(55)
            .y_label_area_size(70)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
            .map_err(|e| plot_error(path, e))?;
        chart
            .configure_mesh()
            .x_desc("latency (µs, log scale)")
            .y_desc("fraction of operations")
            .x_labels(12)
            .x_label_formatter(&label)
            .y_label_formatter(&label)
            .label_style((FONT, 16).into_font())
            .axis_desc_style((FONT, 18).into_font())
            .draw()
            .map_err(|e| plot_error(path, e))?;
        for r in reports {
            let Some(o) = r.op(op) else { continue };
            let color = color_of(r.system.name());
            let points: Vec<(f64, f64)> = o.cdf.iter().map(|&(ns, q)| (us(ns), q)).collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(3)))
                .map_err(|e| plot_error(path, e))?
                .label(format!("{} (p50 {:.2} µs)", r.system.name(), us(o.p50_ns)))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 25, y)], color.stroke_width(3))
                });
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight, 17, path)?;
    }
    caption(&strip, &setup(reports[0], None), path)?;
    main.present().map_err(|e| plot_error(path, e))?;
    Ok(path.to_path_buf())
}

fn roundtrips(reports: &[&BenchReport], path: &Path) -> Result<PathBuf, BenchError> {
    let mut bars: Vec<(String, [f64; 4])> = Vec::new();
    for r in reports {
        for op in [OpType::Get, OpType::Update] {
            if let Some(o) = r.op(op) {
                let f = o.roundtrips;
                bars.push((
                    format!("{} {}", r.system.name(), op.name()),
                    [f.one + f.zero, f.two, f.three, f.four_plus],
                ));
            }
        }
    }
    let n = bars.len().max(1);
    let (main, strip) = canvas(path);
    {
        let labels: Vec<String> = bars.iter().map(|(l, _)| l.clone()).collect();
        let mut chart = ChartBuilder::on(&main)
            .caption(
                format!(
                    "roundtrips per operation, {} (Table 2)",
                    reports[0].workload
                ),
                (FONT, 26).into_font(),
            )
            .margin(20)
            .x_label_area_size(55)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..n as f64, 0.0..1.0)
            .map_err(|e| plot_error(path, e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - i as f64 - 0.5).abs() < 0.01 {
                    labels.get(i).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc("fraction of operations")
            .y_label_formatter(&label)
            .label_style((FONT, 15).into_font())
            .axis_desc_style((FONT, 18).into_font())
            .draw()
            .map_err(|e| plot_error(path, e))?;
        for (k, name) in ["1 RT", "2 RT", "3 RT", "4+ RT"].into_iter().enumerate() {
            let color = RT_COLORS[k];
            let rects: Vec<Rectangle<(f64, f64)>> = bars
                .iter()
                .enumerate()
                .map(|(i, (_, f))| {
                    let below: f64 = f[..k].iter().sum();
                    let x = i as f64;
                    Rectangle::new(
                        [(x + 0.15, below), (x + 0.85, below + f[k])],
                        color.filled(),
                    )
                })
                .collect();
            chart
                .draw_series(rects)
                .map_err(|e| plot_error(path, e))?
                .label(name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
                });
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 16, path)?;
    }
    caption(&strip, &setup(reports[0], None), path)?;
    main.present().map_err(|e| plot_error(path, e))?;
    Ok(path.to_path_buf())
}

/// Table 2 as markdown.
fn write_roundtrip_table(reports: &[&BenchReport], path: &Path) -> Result<(), BenchError> {
    use std::fmt::Write as _;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Roundtrips per operation, {} ({})\n",
        reports
            .first()
            .map_or(String::new(), |r| r.workload.to_string()),
        reports.first().map_or(String::new(), |r| setup(r, None))
    );
    let _ = writeln!(md, "| system | op | 1 RT | 2 RT | 3 RT | 4+ RT | mean |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for r in reports {
        for op in [OpType::Get, OpType::Update] {
            if let Some(o) = r.op(op) {
                let f = o.roundtrips;
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.1} % | {:.1} % | {:.1} % | {:.1} % | {:.2} |",
                    r.system.name(),
                    op.name(),
                    100.0 * (f.one + f.zero),
                    100.0 * f.two,
                    100.0 * f.three,
                    100.0 * f.four_plus,
                    o.roundtrips_mean
                );
            }
        }
    }
    std::fs::write(path, md).map_err(|source| BenchError::Output {
        what: "roundtrip table",
        path: path.to_path_buf(),
        source,
    })
}

/// A line per system of `(x, y)` points drawn from `reports`.
fn lines_by_system(
    reports: &[&BenchReport],
    point: impl Fn(&BenchReport) -> Option<(f64, f64)>,
) -> Vec<(&'static str, Vec<(f64, f64)>)> {
    let systems: BTreeSet<&'static str> = reports.iter().map(|r| r.system.name()).collect();
    systems
        .into_iter()
        .map(|s| {
            let mut points: Vec<(f64, f64)> = reports
                .iter()
                .filter(|r| r.system.name() == s)
                .filter_map(|r| point(r))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            (s, points)
        })
        .collect()
}

fn xy_figure(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[(&'static str, Vec<(f64, f64)>)],
    y_max: f64,
    setup_text: &str,
) -> Result<PathBuf, BenchError> {
    let x_max = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(x, _)| x))
        .fold(1.0, f64::max);
    let (main, strip) = canvas(path);
    {
        let mut chart = ChartBuilder::on(&main)
            .caption(title, (FONT, 26).into_font())
            .margin(20)
            .x_label_area_size(55)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..x_max * 1.08, 0.0..y_max)
            .map_err(|e| plot_error(path, e))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            // Client counts: whole numbers only.
            .x_label_formatter(&|v| {
                if v.fract() == 0.0 {
                    label(v)
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&label)
            .label_style((FONT, 16).into_font())
            .axis_desc_style((FONT, 18).into_font())
            .draw()
            .map_err(|e| plot_error(path, e))?;
        for (system, points) in lines {
            let color = color_of(system);
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(3)))
                .map_err(|e| plot_error(path, e))?
                .label(*system)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 25, y)], color.stroke_width(3))
                });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 5, color.filled())))
                .map_err(|e| plot_error(path, e))?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft, 17, path)?;
    }
    caption(&strip, setup_text, path)?;
    main.present().map_err(|e| plot_error(path, e))?;
    Ok(path.to_path_buf())
}

fn client_counts(reports: &[&BenchReport]) -> String {
    let counts: BTreeSet<usize> = reports.iter().map(|r| r.clients).collect();
    counts
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join("/")
}

fn throughput_vs_clients(reports: &[&BenchReport], path: &Path) -> Result<PathBuf, BenchError> {
    let lines = lines_by_system(reports, |r| {
        Some((r.clients as f64, r.throughput_ops_s / 1e3))
    });
    let y_max = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
        .fold(1.0, f64::max)
        * 1.15;
    xy_figure(
        path,
        &format!("throughput vs clients, {} (Figure 6)", reports[0].workload),
        "clients (threads, one operation in flight each)",
        "throughput (kops/s)",
        &lines,
        y_max,
        &setup(reports[0], Some(&client_counts(reports))),
    )
}

fn contention_figure(reports: &[&BenchReport], path: &Path) -> Result<PathBuf, BenchError> {
    let lines = lines_by_system(reports, |r| {
        r.op(OpType::Update)
            .map(|o| (r.clients as f64, o.roundtrips.one))
    });
    xy_figure(
        path,
        "contention: writers on one key (§7.8)",
        "clients updating the same key",
        "fraction of updates in one roundtrip",
        &lines,
        1.05,
        &setup(reports[0], Some(&client_counts(reports))),
    )
}

fn timeline(r: &BenchReport, path: &Path) -> Result<PathBuf, BenchError> {
    let t_max = r
        .timeline
        .last()
        .map_or(1.0, |p| p.t_ms + r.timeline_interval_ms);
    let kops_max = r
        .timeline
        .iter()
        .map(|p| p.throughput_ops_s / 1e3)
        .fold(1.0, f64::max)
        * 1.15;
    let us = |ns: u64| (ns.max(1) as f64) / 1e3;
    let lat: Vec<f64> = r
        .timeline
        .iter()
        .filter(|p| p.ops > 0)
        .flat_map(|p| [us(p.p50_ns), us(p.p99_ns)])
        .collect();
    let lat_lo = lat
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .clamp(0.01, 1.0)
        * 0.8;
    let lat_hi = lat.iter().copied().fold(0.0, f64::max).max(lat_lo * 10.0) * 1.5;
    let (main, strip) = canvas(path);
    {
        let (top, bottom) = main.split_vertically((HEIGHT - CAPTION_HEIGHT) / 2);
        let title = format!(
            "{} {}: throughput and latency every {} ms (Figure 11){}",
            r.system.name(),
            r.workload,
            r.timeline_interval_ms,
            r.fail_node
                .filter(|f| f.triggered)
                .map_or(String::new(), |f| format!(", node {} crashed", f.node))
        );
        let mut chart = ChartBuilder::on(&top)
            .caption(title, (FONT, 24).into_font())
            .margin(15)
            .x_label_area_size(35)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..t_max, 0.0..kops_max)
            .map_err(|e| plot_error(path, e))?;
        chart
            .configure_mesh()
            .y_desc("throughput (kops/s)")
            .x_label_formatter(&label)
            .y_label_formatter(&label)
            .label_style((FONT, 15).into_font())
            .axis_desc_style((FONT, 17).into_font())
            .draw()
            .map_err(|e| plot_error(path, e))?;
        let color = color_of(r.system.name());
        chart
            .draw_series(LineSeries::new(
                r.timeline
                    .iter()
                    .map(|p| (p.t_ms, p.throughput_ops_s / 1e3)),
                color.stroke_width(2),
            ))
            .map_err(|e| plot_error(path, e))?;
        if let Some(at) = r.fail_at_ms {
            chart
                .draw_series(LineSeries::new(
                    [(at, 0.0), (at, kops_max)],
                    BLACK.stroke_width(2),
                ))
                .map_err(|e| plot_error(path, e))?
                .label("node crash")
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 25, y)], BLACK.stroke_width(2))
                });
            let marks = r.repair.iter().flat_map(|m| {
                [
                    (
                        "repair: quiescence",
                        Some(m.started_ns),
                        RGBColor(255, 127, 14),
                    ),
                    ("repair: copy", m.copy_from_ns, RGBColor(148, 103, 189)),
                    ("repaired, admitted", m.done_ns, RGBColor(44, 160, 44)),
                ]
            });
            for (name, at, color) in marks {
                let Some(at) = at.map(|ns| ns as f64 / 1e6) else {
                    continue;
                };
                chart
                    .draw_series(LineSeries::new(
                        [(at, 0.0), (at, kops_max)],
                        color.stroke_width(2),
                    ))
                    .map_err(|e| plot_error(path, e))?
                    .label(name)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 25, y)], color.stroke_width(2))
                    });
            }
            legend(&mut chart, SeriesLabelPosition::LowerRight, 16, path)?;
        }
        let mut chart = ChartBuilder::on(&bottom)
            .margin(15)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..t_max, (lat_lo..lat_hi).log_scale())
            .map_err(|e| plot_error(path, e))?;
        chart
            .configure_mesh()
            .x_desc("time since the measured phase began (ms)")
            .y_desc("latency (µs, log)")
            .y_labels(12)
            .x_label_formatter(&label)
            .y_label_formatter(&label)
            .label_style((FONT, 15).into_font())
            .axis_desc_style((FONT, 17).into_font())
            .draw()
            .map_err(|e| plot_error(path, e))?;
        let busy = || r.timeline.iter().filter(|p| p.ops > 0);
        for (name, color, pick) in [
            (
                "p50",
                RGBColor(31, 119, 180),
                (|p: &super::report::TimelinePoint| p.p50_ns) as fn(&_) -> u64,
            ),
            ("p99", RGBColor(214, 39, 40), |p| p.p99_ns),
        ] {
            chart
                .draw_series(LineSeries::new(
                    busy().map(|p| (p.t_ms, us(pick(p)))),
                    color.stroke_width(2),
                ))
                .map_err(|e| plot_error(path, e))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 25, y)], color.stroke_width(2))
                });
        }
        if let Some(at) = r.fail_at_ms {
            chart
                .draw_series(LineSeries::new(
                    [(at, lat_lo), (at, lat_hi)],
                    BLACK.stroke_width(2),
                ))
                .map_err(|e| plot_error(path, e))?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 16, path)?;
    }
    caption(&strip, &setup(r, None), path)?;
    main.present().map_err(|e| plot_error(path, e))?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ycsb::config::{BenchConfig, FailPlan, System};
    use crate::ycsb::report::RunStats;
    use crate::ycsb::stats::PhaseStats;
    use crate::ycsb::timeline::Timeline;

    fn report(system: System, workload: Workload, clients: usize, keys: u64) -> BenchReport {
        let mut config = BenchConfig::new(system, workload);
        config.clients = clients;
        config.keys = keys;
        config.fail = Some(FailPlan {
            node: 1,
            after_ops: 10,
        });
        let mut measured = PhaseStats::default();
        let mut timeline = Timeline::new(1_000_000);
        for i in 0..1_000u64 {
            let op = if i % 2 == 0 && workload != Workload::U {
                OpType::Get
            } else {
                OpType::Update
            };
            measured.record(op, 1_000 + i * 7, 1 + u32::from(i % 5 == 0), true);
            timeline.record(i * 10_000, 1_000 + i);
        }
        let stats = RunStats {
            measured,
            measured_seconds: 0.01 * clients as f64,
            fail_triggered: true,
            timeline: timeline.points(0, 10_000_000),
            fail_at_ns: Some(4_000_000),
            ..RunStats::default()
        };
        BenchReport::new(&config, &stats)
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(label(&100.0), "100");
        assert_eq!(label(&1.5), "1.5");
        assert_eq!(label(&0.25), "0.25");
        assert_eq!(label(&0.0), "0");
        assert_eq!(label(&12345.0), "12345");
    }

    #[test]
    fn every_figure_is_a_png_with_its_data_beside_it() {
        let dir = swarm_shm::ScratchDir::new("plot-test").expect("scratch");
        let mut reports = Vec::new();
        for system in [System::Raw, System::Swarm] {
            for clients in [1, 2] {
                reports.push(report(system, Workload::B, clients, 100));
                reports.push(report(system, Workload::U, clients, 1));
            }
        }
        let written = write_figures(&reports, dir.path()).expect("figures");
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for expected in [
            "latency-cdf-b-get.png",
            "latency-cdf-b-update.png",
            "roundtrips-b.png",
            "throughput-vs-clients-b.png",
            "contention.png",
            "timeline-swarm-b-c2.png",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} not in {names:?}"
            );
        }
        for png in &written {
            let bytes = std::fs::read(png).expect("written");
            assert!(
                bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
                "{} is not a PNG",
                png.display()
            );
            assert!(bytes.len() > 10_000, "{} is nearly empty", png.display());
            assert!(
                png.with_extension("json").exists(),
                "no data beside {}",
                png.display()
            );
        }
        let table = std::fs::read_to_string(dir.path().join("roundtrips-b.md")).expect("table");
        assert!(
            table.contains("| swarm | update | 80.0 % | 20.0 % |"),
            "{table}"
        );
    }

    #[test]
    fn an_unwritable_directory_is_a_clear_error() {
        let dir = swarm_shm::ScratchDir::new("plot-test").expect("scratch");
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").expect("file");
        let err = write_figures(&[report(System::Swarm, Workload::B, 1, 10)], &file).unwrap_err();
        assert!(err.to_string().contains("a-file"), "{err}");
    }
}
