//! The report of an equal-load run: its sweeps side by side, the closed loop first,
//! then each level, one table per metric with rows strategy × pods and a column per
//! sweep; `equal-load.csv` is every sweep's summary rows under its sweep's name. Pure
//! but for [`load`] and [`write`].

use std::path::{Path, PathBuf};

use maud::{DOCTYPE, html};

use crate::domain::{Arm, CellStatus, Strategy};
use crate::error::{BenchError, Result};
use crate::results::equal_load::{EqualLoadRecord, FILE, Level, Part, check_parts};
use crate::results::record::CellRecord;

use super::RunData;
use super::tables::{Cell, Table, Tables, note_number};

/// One sweep of the run: its name, its level (None: the closed loop) and its data
/// (None: not on disk yet).
#[derive(Debug, Clone)]
pub struct Sweep {
    /// The directory's name (`closed`, `load-50pct`).
    pub name: String,
    /// The level (None for the closed loop).
    pub level: Option<Level>,
    /// The sweep, when it was started.
    pub data: Option<RunData>,
}

/// An equal-load run as the report sees it.
#[derive(Debug, Clone)]
pub struct EqualLoadData {
    /// The run directory.
    pub dir: PathBuf,
    /// `equal-load.json`.
    pub record: EqualLoadRecord,
    /// The closed sweep, then each level's.
    pub sweeps: Vec<Sweep>,
}

/// Whether `dir` is an equal-load run.
pub fn is_equal_load(dir: &Path) -> bool {
    dir.join(FILE).is_file()
}

/// Loads the run and every sweep on disk, each checked as `report` checks a sweep.
pub fn load(dir: &Path) -> Result<EqualLoadData> {
    let record = crate::equal_load::command::read(dir)?;
    let mut sweeps = Vec::new();
    let levels = std::iter::once(None).chain(record.levels.iter().copied().map(Some));
    for (name, level) in record.sweeps().into_iter().zip(levels) {
        let sub = dir.join(&name);
        let data = if sub.join("run.json").is_file() {
            Some(RunData::load(&sub)?)
        } else {
            None
        };
        sweeps.push(Sweep { name, level, data });
    }
    let parts: Vec<Part> = sweeps
        .iter()
        .map(|s| Part {
            name: &s.name,
            level: s.level,
            run: s.data.as_ref().map(|d| (&d.run, &d.cells[..])),
        })
        .collect();
    check_parts(&record, &parts).map_err(|reason| BenchError::RunDir {
        path: dir.join(FILE),
        reason,
    })?;
    Ok(EqualLoadData {
        dir: dir.to_path_buf(),
        record,
        sweeps,
    })
}

impl EqualLoadData {
    /// The closed sweep, when it was started.
    pub fn closed(&self) -> Option<&RunData> {
        self.sweeps.first().and_then(|s| s.data.as_ref())
    }

    /// A column heading: "closed loop" or "50%: 445.2 req/s".
    fn heading(&self, s: &Sweep) -> String {
        match (s.level, &self.record.base) {
            (None, _) => "closed loop".into(),
            (Some(l), Some(b)) => format!("{l}: {:.1} req/s", l.rate(b.per_s)),
            (Some(l), None) => format!("{l}"),
        }
    }

    /// The rows: every arm × pod count of the plan, exclusive only alone (its other
    /// pods stay pending, so a share of the load would go to pods that never run).
    fn rows(&self) -> Vec<(Arm, u32)> {
        let Some(closed) = self.closed() else {
            return Vec::new();
        };
        let pods = closed.pods_order();
        closed
            .arms()
            .into_iter()
            .flat_map(|a| pods.iter().map(move |&p| (a, p)))
            .filter(|(a, p)| a.strategy != Strategy::Exclusive || *p == 1)
            .collect()
    }

    /// Set while a sweep is missing or unfinished: the banner above the tables.
    pub fn partial(&self) -> Option<String> {
        let unfinished: Vec<&str> = self
            .sweeps
            .iter()
            .filter(|s| !s.data.as_ref().is_some_and(|d| d.run.is_complete()))
            .map(|s| s.name.as_str())
            .collect();
        (!unfinished.is_empty()).then(|| {
            let out = self
                .dir
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or(String::new(), |p| format!(" --out {}", p.display()));
            format!(
                "PARTIAL RUN: {} of {} sweeps did not finish ({}); `gpushare-bench equal-load --resume {}{out}` continues it on the GPU it measured",
                unfinished.len(),
                self.sweeps.len(),
                unfinished.join(", "),
                self.record.run_id
            )
        })
    }

    /// The label a CPU run or an emulation carries (the closed sweep's).
    pub fn label(&self) -> Option<String> {
        self.closed().and_then(RunData::label)
    }
}

/// A metric of the side-by-side tables.
struct Metric {
    title: &'static str,
    unit: &'static str,
    value: fn(&CellRecord) -> Option<f64>,
    decimals: usize,
}

const METRICS: [Metric; 4] = [
    Metric {
        title: "p99 latency at equal load",
        unit: "ms",
        value: |c| c.p99_s.map(|v| v * 1e3),
        decimals: 2,
    },
    Metric {
        title: "Median (p50) latency at equal load",
        unit: "ms",
        value: |c| c.p50_s.map(|v| v * 1e3),
        decimals: 2,
    },
    Metric {
        title: "Mean latency at equal load",
        unit: "ms",
        value: |c| c.mean_s.map(|v| v * 1e3),
        decimals: 2,
    },
    Metric {
        title: "Throughput served at equal load",
        unit: "inferences/s, all pods",
        value: |c| c.throughput_per_s,
        decimals: 1,
    },
];

/// The tables (pure): one per metric, a column per sweep, then an SLO attainment table
/// when the run has an objective.
pub fn tables(d: &EqualLoadData) -> Tables {
    let mut notes = Vec::new();
    let rows = d.rows();
    let columns: Vec<String> = d.sweeps.iter().map(|s| d.heading(s)).collect();
    let mut out = Vec::new();
    let slo = d
        .closed()
        .and_then(|c| c.run.plan.slos.iter().find(|s| s.quantile == Some(0.99)).copied());
    let attainment = Metric {
        title: "SLO attainment at equal load, p99",
        unit: "% of requests within the p99 threshold",
        value: |c| c.slo_p99_attainment.map(|v| v * 100.0),
        decimals: 2,
    };
    let metrics: Vec<&Metric> = METRICS.iter().chain(slo.map(|_| &attainment)).collect();
    for m in metrics {
        let table_rows = rows
            .iter()
            .map(|&(arm, pods)| {
                let cells = d.sweeps.iter().map(|s| cell(s, arm, pods, m, &mut notes)).collect();
                (format!("{} × {pods}", arm.title()), cells)
            })
            .collect();
        let unit = match (m.title, slo) {
            (t, Some(s)) if t == attainment.title => {
                format!("% of requests within {}", humantime::format_duration(s.threshold))
            }
            _ => m.unit.to_string(),
        };
        out.push(Table {
            title: m.title.to_string(),
            unit,
            corner: "Strategy × pods".into(),
            columns: columns.clone(),
            rows: table_rows,
        });
    }
    let mut reading = vec![reading_base(d)];
    reading.push("The closed loop sends each pod its next request as soon as the last is answered, so its latencies are those of a saturated GPU; each level offers every cell the same aggregate rate, Poisson arrivals split equally over its pods, and times each request from its arrival. Exclusive × 1 at a level is one pod alone at that load: the latency sharing is measured against. A flagged number (⚑) is to be read with care, e.g. a pod that fell behind its share of the load: its latency then grows with the run, not with the strategy.".into());
    Tables {
        tables: out,
        notes,
        reading,
        warnings: Vec::new(),
    }
}

/// How the base was measured.
fn reading_base(d: &EqualLoadData) -> String {
    match &d.record.base {
        Some(b) => format!(
            "Levels are shares of the base: one pod alone on the GPU in the closed loop ({} × 1) served {:.1} inferences/s{} in this run's closed sweep, on the same GPU.",
            b.strategy.title(),
            b.per_s,
            match b.half_width_per_s {
                Some(h) => format!(" (±{h:.1}, 95% interval over {} passes)", b.passes),
                None => " (one pass)".into(),
            }
        ),
        None => "The base (one exclusive pod's closed-loop capacity) is not measured yet.".into(),
    }
}

fn cell(s: &Sweep, arm: Arm, pods: u32, m: &Metric, notes: &mut Vec<(usize, String)>) -> Cell {
    let Some(data) = &s.data else {
        return Cell::Missing;
    };
    let Some(row) = data.aggregate(arm, pods) else {
        return Cell::Missing;
    };
    if row.status != CellStatus::Ok {
        let n = note_number(
            notes,
            format!("{} × {pods} — {}: {}", arm.title(), row.status, row.note),
        );
        return Cell::Status(row.status, n);
    }
    let Some(v) = (m.value)(&row) else {
        return Cell::Empty;
    };
    let text = format!("{v:.*}", m.decimals);
    let flags = data.flags(arm, pods);
    if flags.is_empty() {
        Cell::Value(text)
    } else {
        let n = note_number(
            notes,
            format!("{} × {pods}, {}: {}", arm.title(), s.name, flags.join("; ")),
        );
        Cell::Flagged(text, n)
    }
}

/// The answer at a glance (pure): per level, the p99 of each strategy at the largest
/// pod count measured, beside exclusive alone at that load.
pub fn answer(d: &EqualLoadData) -> Vec<String> {
    let Some(base) = &d.record.base else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    for s in d.sweeps.iter().skip(1) {
        let (Some(level), Some(data)) = (s.level, &s.data) else {
            continue;
        };
        let p99 = |arm: Arm, pods: u32| {
            data.aggregate(arm, pods)
                .filter(|r| r.status == CellStatus::Ok)
                .and_then(|r| r.p99_s.map(|v| (v * 1e3, !data.flags(arm, pods).is_empty())))
        };
        let Some(&most) = data.pods_order().iter().filter(|&&p| p > 1).max() else {
            continue;
        };
        let shared: Vec<String> = data
            .arms()
            .into_iter()
            .filter(|a| a.strategy != Strategy::Exclusive)
            .filter_map(|a| {
                p99(a, most).map(|(v, flagged)| {
                    format!(
                        "{} {v:.2} ms{}",
                        a.title(),
                        if flagged { " (read with care)" } else { "" }
                    )
                })
            })
            .collect();
        if shared.is_empty() {
            continue;
        }
        let alone = p99(Arm::of(Strategy::Exclusive), 1).map_or(String::new(), |(v, _)| {
            format!("; one exclusive pod alone at that load: {v:.2} ms")
        });
        lines.push(format!(
            "At {level} of one pod's capacity alone ({:.1} requests/s in all), {most} pods sharing the GPU: p99 {}{alone}.",
            level.rate(base.per_s),
            shared.join(", ")
        ));
    }
    lines
}

/// `equal-load.csv`: each sweep's summary rows (`summary.csv`'s columns, rounded and
/// with the GPU's name last, as the report writes it) after its sweep's name, level and
/// offered rate.
pub fn csv(d: &EqualLoadData) -> Result<Vec<u8>> {
    let fail = |e: &dyn std::fmt::Display| BenchError::Results {
        path: "equal-load.csv".into(),
        reason: e.to_string(),
    };
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header_written = false;
    for s in &d.sweeps {
        let Some(data) = &s.data else { continue };
        let bytes = super::export::summary::csv(data)?;
        let mut r = csv::Reader::from_reader(bytes.as_slice());
        let header = r.headers().map_err(|e| fail(&e))?.clone();
        if !header_written && !header.is_empty() {
            let mut h = vec!["sweep", "level_percent", "offered_total_per_s"];
            h.extend(header.iter());
            w.write_record(&h).map_err(|e| fail(&e))?;
            header_written = true;
        }
        let level = s.level.map_or(String::new(), |l| l.percent().to_string());
        let offered = match (s.level, &d.record.base) {
            (Some(l), Some(b)) => super::export::tidy::round(l.rate(b.per_s)),
            _ => String::new(),
        };
        for rec in r.records() {
            let rec = rec.map_err(|e| fail(&e))?;
            let mut row = vec![s.name.clone(), level.clone(), offered.clone()];
            row.extend(rec.iter().map(str::to_string));
            w.write_record(&row).map_err(|e| fail(&e))?;
        }
    }
    let bytes = w.into_inner().map_err(|e| fail(&e))?;
    // As summary.csv is written: rounded, percentages named, the GPU's name last.
    match d.closed() {
        Some(c) => super::export::tidy::tidy(&bytes, &c.gpu_names(), "equal-load.csv"),
        None => Ok(bytes),
    }
}

/// Each started sweep's latency chart (mean, and the p50–p99 band, against pods), under
/// its column's heading (pure).
pub fn charts(d: &EqualLoadData) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for s in &d.sweeps {
        let Some(data) = &s.data else { continue };
        if let Some((_, svg)) = super::charts::all(data)?
            .into_iter()
            .find(|(name, _)| name == "latency.svg")
        {
            out.push((d.heading(s), svg));
        }
    }
    Ok(out)
}

/// The page (pure).
pub fn page(d: &EqualLoadData, t: &Tables, charts: &[(String, String)]) -> String {
    let title = format!("gpushare-bench — {} (equal offered load)", d.record.run_id);
    let tag = d
        .label()
        .map(|_| " — CPU run — not a GPU measurement")
        .unwrap_or_default();
    let answer = answer(d);
    html! {
        (DOCTYPE) "\n"
        html lang="en" {
            (super::html::head(&title))
            body {
                "\n"
                h1 { (title) } "\n"
                @if let Some(c) = d.closed() {
                    p.muted {
                        (c.device_name()) " · " (c.run.plan.model) " · " (c.run.plan.precision) " · batch " (c.run.plan.batch)
                        " · " (c.run.plan.backend) " backend · run " (d.record.started_at) " → "
                        (d.record.finished_at.as_deref().unwrap_or("unfinished"))
                    } "\n"
                }
                @if let Some(label) = d.label() {
                    div.banner role="alert" { (label) } "\n"
                }
                @if let Some(p) = d.partial() {
                    div.banner.partial role="alert" { (p) } "\n"
                }
                (super::html::answer(&answer))
                @if !charts.is_empty() {
                    h2 { "Latency against pods, one chart per sweep" }
                    div.charts {
                        "\n"
                        @for (heading, svg) in charts {
                            figure {
                                figcaption { (heading) }
                                (super::html::inline_svg(svg))
                            } "\n"
                        }
                    } "\n"
                }
                h2 { "Results" } "\n"
                @for r in &t.reading {
                    p { (r) } "\n"
                }
                @for table in &t.tables {
                    (super::html::table(table, t, tag))
                }
                @if !t.notes.is_empty() {
                    h2 { "Notes" }
                    ol {
                        "\n"
                        @for (_, text) in &t.notes {
                            li { (text) } "\n"
                        }
                    } "\n"
                }
                h2 { "Each sweep" }
                ul {
                    "\n"
                    @for s in &d.sweeps {
                        li {
                            @if s.data.is_some() {
                                a href=(format!("{}/index.html", s.name)) { (s.name) }
                            } @else {
                                (s.name) " (not started)"
                            }
                            ": " (d.heading(s))
                        } "\n"
                    }
                } "\n"
                @if let Some(c) = d.closed() {
                    h2 { "Environment" }
                    dl {
                        "\n"
                        @for (k, v) in super::html::environment(c) {
                            dt { (k) } dd { (v) } "\n"
                        }
                    } "\n"
                }
                p.muted { "Generated by gpushare-bench report. Each sweep's own report (charts, every table, its CSV) is linked above." } "\n"
            }
        } "\n"
    }
    .into_string()
}

/// The Markdown summary (pure): the answer and the tables.
pub fn markdown(d: &EqualLoadData, t: &Tables) -> String {
    use std::fmt::Write;
    let mut out = format!("# {} (equal offered load)\n\n", d.record.run_id);
    if let Some(l) = d.label() {
        let _ = writeln!(out, "**{l}**\n");
    }
    if let Some(p) = d.partial() {
        let _ = writeln!(out, "**{p}**\n");
    }
    for a in answer(d) {
        let _ = writeln!(out, "- {a}");
    }
    for r in &t.reading {
        let _ = writeln!(out, "\n{r}");
    }
    for table in &t.tables {
        let _ = writeln!(out, "\n### {} ({})\n", table.title, table.unit);
        let _ = writeln!(out, "| {} | {} |", table.corner, table.columns.join(" | "));
        let _ = writeln!(out, "|---|{}", "---:|".repeat(table.columns.len()));
        for (name, cells) in &table.rows {
            let cells: Vec<String> = cells
                .iter()
                .map(|c| match c {
                    Cell::Value(v) => v.clone(),
                    Cell::Flagged(v, n) => format!("{v} ⚑{n}"),
                    Cell::Rated(v, _) => v.clone(),
                    Cell::Status(s, n) => format!("{s} ({n})"),
                    Cell::Empty => "–".into(),
                    Cell::Missing => "not run".into(),
                })
                .collect();
            let _ = writeln!(out, "| {name} | {} |", cells.join(" | "));
        }
    }
    if !t.notes.is_empty() {
        out.push('\n');
        for (n, text) in &t.notes {
            let _ = writeln!(out, "{n}. {text}");
        }
    }
    out
}

/// Renders the run's page, summary.md and equal-load.csv into `DIR/report/` (or
/// `OUT/<run-id>/`), and each sweep's own report beside them, under its name.
pub fn write(dir: &Path, out: Option<&Path>) -> Result<PathBuf> {
    let d = load(dir)?;
    let target = match out {
        Some(o) => o.join(&d.record.run_id),
        None => dir.join("report"),
    };
    crate::files::refuse_links(&target)?;
    std::fs::create_dir_all(&target).map_err(BenchError::io(format!("creating {}", target.display())))?;
    for s in &d.sweeps {
        if s.data.is_some() {
            super::write(&dir.join(&s.name), Some(&target))?;
        }
    }
    let t = tables(&d);
    crate::files::write_atomic(&target.join("equal-load.csv"), &csv(&d)?)?;
    crate::files::write_atomic(&target.join("summary.md"), markdown(&d, &t).as_bytes())?;
    let index = target.join("index.html");
    crate::files::write_atomic(&index, page(&d, &t, &charts(&d)?).as_bytes())?;
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::options::SweepOptions;
    use crate::results::equal_load::{Base, SCHEMA};

    fn fixture() -> RunData {
        RunData::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h100-run")).expect("fixture")
    }

    /// The fixture as the closed sweep, and as the 50% level with every latency halved
    /// and time-slicing × 7's pods behind their load; the 90% level not started.
    fn run() -> EqualLoadData {
        let closed = fixture();
        let mut half = fixture();
        for c in &mut half.cells {
            c.p99_s = c.p99_s.map(|v| v / 2.0);
            if c.strategy == Strategy::TimeSlicing && c.pods == 7 {
                c.note = "did not settle: windows differ by 40%".into();
                c.mean_spread = Some(0.4);
            }
        }
        let level = |s: f64| Level::new(s).expect("level");
        EqualLoadData {
            dir: PathBuf::from("eq"),
            record: EqualLoadRecord {
                schema: SCHEMA,
                run_id: "eq".into(),
                levels: vec![level(0.5), level(0.9)],
                options: SweepOptions::default(),
                base: Some(Base {
                    strategy: Strategy::Exclusive,
                    per_s: 800.0,
                    half_width_per_s: None,
                    passes: 1,
                }),
                started_at: "2026-11-27T00:00:00Z".into(),
                finished_at: None,
            },
            sweeps: vec![
                Sweep {
                    name: "closed".into(),
                    level: None,
                    data: Some(closed),
                },
                Sweep {
                    name: "load-50pct".into(),
                    level: Some(level(0.5)),
                    data: Some(half),
                },
                Sweep {
                    name: "load-90pct".into(),
                    level: Some(level(0.9)),
                    data: None,
                },
            ],
        }
    }

    #[test]
    fn a_column_per_sweep_and_exclusive_only_alone() {
        let d = run();
        let t = tables(&d);
        let p99 = &t.tables[0];
        assert_eq!(p99.title, "p99 latency at equal load");
        assert_eq!(p99.columns, ["closed loop", "50%: 400.0 req/s", "90%: 720.0 req/s"]);
        let names: Vec<&str> = p99.rows.iter().map(|r| r.0.as_str()).collect();
        assert!(
            names.contains(&"Exclusive × 1") && !names.contains(&"Exclusive × 3"),
            "{names:?}"
        );
        let ts7 = &p99.rows.iter().find(|r| r.0 == "Time-slicing × 7").expect("ts 7").1;
        assert_eq!(ts7[0], Cell::Value("14.76".into()));
        assert!(matches!(&ts7[1], Cell::Flagged(v, _) if v == "7.38"), "{:?}", ts7[1]);
        assert_eq!(ts7[2], Cell::Missing, "a sweep not started");
        let mig = &p99.rows.iter().find(|r| r.0 == "MIG × 1").expect("mig").1;
        assert!(matches!(mig[0], Cell::Status(CellStatus::Unavailable, _)));
        assert!(d.partial().expect("partial").contains("load-90pct"));
        assert!(
            t.reading[0].contains("served 800.0 inferences/s (one pass)"),
            "{}",
            t.reading[0]
        );
    }

    #[test]
    fn the_answer_names_each_strategy_at_the_most_pods_beside_one_pod_alone() {
        let lines = answer(&run());
        assert_eq!(lines.len(), 1, "{lines:?}");
        let l = &lines[0];
        assert!(
            l.starts_with("At 50% of one pod's capacity alone (400.0 requests/s in all), 7 pods"),
            "{l}"
        );
        assert!(
            l.contains("Time-slicing 7.38 ms (read with care)") && l.contains("MPS 6.01 ms"),
            "{l}"
        );
        assert!(l.contains("one exclusive pod alone at that load: 1.09 ms"), "{l}");
    }

    #[test]
    fn the_csv_holds_every_started_sweep_under_its_name() {
        let text = String::from_utf8(csv(&run()).expect("csv")).expect("utf-8");
        let mut lines = text.lines();
        assert!(
            lines
                .next()
                .expect("header")
                .starts_with("sweep,level_percent,offered_total_per_s,run_id,")
        );
        assert_eq!(text.lines().filter(|l| l.starts_with("closed,,,")).count(), 16);
        assert_eq!(text.lines().filter(|l| l.starts_with("load-50pct,50,400,")).count(), 16);
        assert!(!text.contains("load-90pct"));
    }

    #[test]
    fn the_page_shows_a_latency_chart_per_started_sweep() {
        let d = run();
        let c = charts(&d).expect("charts");
        let headings: Vec<&str> = c.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(
            headings,
            ["closed loop", "50%: 400.0 req/s"],
            "the 90% sweep never started"
        );
        let page = page(&d, &tables(&d), &c);
        assert_eq!(page.matches("<figure>").count(), 2);
        assert!(page.contains("<figcaption>50%: 400.0 req/s</figcaption>"));
        assert!(!page.contains("<?xml"), "the SVGs' prologs are not inside the page");
    }
}
