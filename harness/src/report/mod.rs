//! Reports of a run: the reference study's tables (strategies × pods) and more, charts
//! (plotters, SVG), the environment, as one self-contained HTML page, a Markdown summary
//! and the exports. Everything here is a pure function of the run's records.

pub mod capacity;
pub mod charts;
pub mod compare;
pub mod equal_load;
pub mod export;
pub mod host_noise;
pub mod html;
pub mod isolation;
pub mod isolation_matrix;
pub mod outcome;
pub mod parallel;
pub mod tables;
pub mod verdict;
pub mod verify;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use crate::domain::{Arm, CellStatus, DeviceKind, Strategy};
use crate::error::{BenchError, Result};
use crate::results::isolation::{IsolationRecord, isolation_csv};
use crate::results::record::{CellRecord, RunRecord, parse_cells_jsonl};
use crate::results::repeats::{combine, interval};
use crate::results::store::{read_isolation, read_run};
use crate::stats::interval::Interval;

/// A run as the reports see it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunData {
    /// The run directory it was loaded from.
    pub dir: PathBuf,
    /// run.json.
    pub run: RunRecord,
    /// cells.jsonl.
    pub cells: Vec<CellRecord>,
    /// isolation.jsonl (an isolation run's records; empty for a sweep).
    pub isolation: Vec<IsolationRecord>,
    /// alone.jsonl: a `--gpus` sweep's cells measured again alone (empty otherwise).
    pub alone: Vec<CellRecord>,
}

impl RunData {
    /// Loads `RUN_DIR/run.json` and `RUN_DIR/cells.jsonl`, both checked as strictly as
    /// flags ([`RunRecord::validate`], [`parse_cells_jsonl`] with the plan): errors name
    /// the file, the field and, in cells.jsonl, the line.
    pub fn load(dir: &Path) -> Result<Self> {
        let run_json = dir.join("run.json");
        if !run_json.is_file() {
            return Err(BenchError::RunDir {
                path: dir.to_path_buf(),
                reason: if equal_load::is_equal_load(dir) {
                    "an equal-load run, a directory of sweeps: give one of them (e.g. its closed/), or `report` the whole run".into()
                } else {
                    "not a run directory (no run.json); give runs/<run-id>".into()
                },
            });
        }
        let run = read_run(&run_json)?;
        run.validate(&run_json)?;
        // A sweep writes an empty cells.jsonl when it creates the run, so a missing one
        // means the directory was tampered with: say so rather than report nothing.
        let cells_path = dir.join("cells.jsonl");
        let text = crate::files::read_text(&cells_path, crate::files::limits::ROWS).map_err(|e| match e {
            crate::files::ReadError::Missing => BenchError::RunDir {
                path: cells_path.clone(),
                reason: "no cells.jsonl: the run directory has run.json but no cells file (a sweep writes one when it starts, so it was removed)".into(),
            },
            e => crate::files::unreadable(&cells_path, e),
        })?;
        let cells = parse_cells_jsonl(&text, &cells_path, Some(&run.plan))?;
        let isolation = read_isolation(&dir.join("isolation.jsonl"), &run)?;
        let alone = crate::results::store::read_alone(dir, &run.plan)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            run,
            cells,
            isolation,
            alone,
        })
    }

    /// Set when the run is partial (run.json's `state` is not `complete`): the line
    /// every report and the Markdown summary show above the tables.
    pub fn partial(&self) -> Option<String> {
        if self.run.is_complete() {
            return None;
        }
        if let Some(iso) = self.run.kind.isolation() {
            let planned = crate::isolation::plan::IsolationSettings::new(
                iso,
                &self.run.plan.strategies,
                self.run.gpu_memory_bytes(),
                self.run.plan.own_server(),
            );
            let planned = crate::isolation::plan::trials(&planned).map_or(0, |t| t.len());
            return Some(format!(
                "PARTIAL RUN: run.json says state {:?}, not \"complete\"; {} of {planned} trials are on disk, the others were never run",
                self.run.state,
                self.isolation.len()
            ));
        }
        let plan = &self.run.plan;
        if self.run.kind.capacity().is_some() {
            return Some(format!(
                "PARTIAL RUN: run.json says state {:?}, not \"complete\"; the search stopped after {} cells; a capacity marked unfinished may be higher",
                self.run.state,
                self.cells.iter().filter(|c| c.is_aggregate()).count()
            ));
        }
        let arms = plan.arms().len();
        let planned = arms * plan.pods.len() * plan.repeat as usize;
        // Rows read back are inside the plan (checked at load), one aggregate per cell.
        let measured = self.cells.iter().filter(|c| c.is_aggregate()).count();
        let repeats = if plan.repeat > 1 {
            format!(" ({} repeats of {} cells)", plan.repeat, arms * plan.pods.len())
        } else {
            String::new()
        };
        Some(format!(
            "PARTIAL RUN: run.json says state {:?}, not \"complete\"; {measured} of {planned} cells{repeats} are on disk, the others were never measured",
            self.run.state
        ))
    }

    /// The aggregate row of a cell: the row itself in a run of one repeat, the rows of
    /// every repeat combined ([`combine`]: means over the repeats that measured it) in a
    /// run of several.
    pub fn aggregate(&self, arm: impl Into<Arm>, pods: u32) -> Option<Cow<'_, CellRecord>> {
        let rows = self.repeats(arm, pods);
        match rows.as_slice() {
            [] => None,
            [one] => Some(Cow::Borrowed(*one)),
            _ => combine(&rows).map(Cow::Owned),
        }
    }

    /// What to read with care in a cell: the flags of its measured passes
    /// ([`CellRecord::flags`]), each once, in the order first seen.
    pub fn flags(&self, arm: impl Into<Arm>, pods: u32) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        self.repeats(arm, pods)
            .iter()
            .filter(|r| r.status == CellStatus::Ok)
            .flat_map(|r| r.flags())
            .filter(|f| seen.insert(f.clone()))
            .collect()
    }

    /// The aggregate rows of a cell, one per repeat, in repeat order.
    pub fn repeats(&self, arm: impl Into<Arm>, pods: u32) -> Vec<&CellRecord> {
        let arm = arm.into();
        let mut rows: Vec<&CellRecord> = self
            .cells
            .iter()
            .filter(|c| c.arm() == arm && c.pods == pods && c.is_aggregate())
            .collect();
        rows.sort_by_key(|c| c.repeat);
        rows
    }

    /// A metric of a cell over its repeats: mean and 95% interval (None: not measured).
    pub fn interval(
        &self,
        arm: impl Into<Arm>,
        pods: u32,
        metric: impl Fn(&CellRecord) -> Option<f64>,
    ) -> Option<Interval> {
        interval(&self.repeats(arm, pods), metric)
    }

    /// Passes over the plan the run asked for (`--repeat`).
    pub fn planned_repeats(&self) -> u32 {
        self.run.plan.repeat
    }

    /// Strategies in plan order.
    pub fn strategies(&self) -> Vec<Strategy> {
        self.run.plan.strategies.clone()
    }

    /// Arms in plan order: the rows of the tables and the lines of the charts (a
    /// strategy, or time-slicing once per DRA interval).
    pub fn arms(&self) -> Vec<Arm> {
        self.run.plan.arms()
    }

    /// Pod counts, fewest first: the order of every table's columns and every chart's
    /// axis; a capacity run's are the counts its search measured.
    pub fn pods_order(&self) -> Vec<u32> {
        let mut p = self.run.plan.pods.clone();
        if self.run.kind.capacity().is_some() {
            p.retain(|n| self.cells.iter().any(|c| c.pods == *n));
        }
        p.sort_unstable();
        p
    }

    /// The label a CPU run or an emulation carries on every table and chart.
    pub fn label(&self) -> Option<String> {
        self.run
            .label
            .clone()
            .or_else(|| (self.run.plan.device == DeviceKind::Cpu).then(|| "CPU run: not a GPU measurement".to_string()))
    }

    /// A short tag for titles: "CPU run" or None.
    pub fn short_label(&self) -> Option<&'static str> {
        self.label().map(|_| "CPU run — not a GPU measurement")
    }

    /// The names the CSV exports give each row's GPU.
    pub fn gpu_names(&self) -> export::tidy::GpuNames {
        export::tidy::GpuNames {
            default: self.device_name(),
            by_index: match self.run.plan.device {
                DeviceKind::Cuda => self
                    .run
                    .environment
                    .gpus
                    .iter()
                    .map(|g| (g.index, g.name.clone()))
                    .collect(),
                DeviceKind::Cpu => Vec::new(),
            },
        }
    }

    /// The GPU's name, or the CPU's for CPU runs.
    pub fn device_name(&self) -> String {
        match (self.run.plan.device, self.run.environment.gpus.first()) {
            (DeviceKind::Cuda, Some(g)) => g.name.clone(),
            _ => format!("CPU: {}", self.run.environment.cpu),
        }
    }
}

#[cfg(test)]
impl RunData {
    /// Tests: this run as one of `factors.len()` repeats, every row copied per repeat and
    /// changed by `scale(row, factor)`.
    pub fn repeated(&self, factors: &[f64], scale: fn(&mut CellRecord, f64)) -> RunData {
        let mut out = self.clone();
        out.run.plan.repeat = factors.len() as u32;
        out.cells = factors
            .iter()
            .enumerate()
            .flat_map(|(i, &f)| {
                self.cells.iter().map(move |c| {
                    let mut row = CellRecord {
                        repeat: i as u32 + 1,
                        ..c.clone()
                    };
                    scale(&mut row, f);
                    row
                })
            })
            .collect();
        out
    }
}

/// Files of a rendered report.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// index.html.
    pub html: String,
    /// summary.md.
    pub markdown: String,
    /// (file name, SVG) of each chart.
    pub charts: Vec<(String, String)>,
    /// (file name, CSV): summary.csv, one row per cell with repeats combined and their
    /// intervals; cells.csv, one per cell and repeat; pods.csv, one per pod (a capacity
    /// run adds capacity.csv, one row per strategy); for an
    /// isolation run isolation.csv, one row per trial.
    pub csv: Vec<(String, Vec<u8>)>,
}

/// The tables of a run, as the report and the Markdown export show them (pure): an
/// isolation run's matrix; a sweep's metric tables, after the capacity table in a
/// capacity run.
pub fn run_tables(data: &RunData) -> tables::Tables {
    if data.run.kind.isolation().is_some() {
        return isolation::tables(data);
    }
    let mut t = tables::all(data);
    if let Some(cap) = capacity::table(data, &mut t.notes) {
        // A count the search did not need is not a cell missing from the run.
        for cell in t
            .tables
            .iter_mut()
            .flat_map(|t| t.rows.iter_mut())
            .flat_map(|r| r.1.iter_mut())
        {
            if *cell == tables::Cell::Missing {
                *cell = tables::Cell::Empty;
            }
        }
        t.tables.insert(0, cap);
        t.reading.splice(0..0, capacity::reading(data));
    }
    t
}

/// Renders everything (pure).
pub fn render(data: &RunData) -> Result<Report> {
    if data.run.kind.isolation().is_some() {
        let charts: Vec<(String, String)> = isolation::chart(data)?.into_iter().collect();
        let tables = run_tables(data);
        let raw = isolation_csv(&data.isolation)?;
        return Ok(Report {
            html: html::page(data, &tables, &charts),
            markdown: tables::markdown(data, &tables),
            charts,
            csv: vec![(
                "isolation.csv".into(),
                export::tidy::tidy(&raw, &data.gpu_names(), "isolation.csv")?,
            )],
        });
    }
    let mut charts = charts::all(data)?;
    let tables = run_tables(data);
    let gpu = data.gpu_names();
    let mut csv = vec![
        (
            "summary.csv".into(),
            export::tidy::tidy(&export::summary::csv(data)?, &gpu, "summary.csv")?,
        ),
        ("cells.csv".into(), export::cells(data)?),
        ("pods.csv".into(), export::pods(data)?),
    ];
    if data.run.kind.capacity().is_some() {
        charts.splice(0..0, capacity::chart(data)?);
        let records = crate::capacity::record::records(&data.run, &data.cells);
        let raw = crate::capacity::record::csv(&records)?;
        csv.push(("capacity.csv".into(), export::tidy::tidy(&raw, &gpu, "capacity.csv")?));
    }
    Ok(Report {
        html: html::page(data, &tables, &charts),
        markdown: tables::markdown(data, &tables),
        charts,
        csv,
    })
}

/// Renders the run in `run_dir` into `<out>/<run-id>/`, or into `<run_dir>/report/` when
/// `out` is `None`; returns the path of `index.html`.
pub fn write(run_dir: &Path, out: Option<&Path>) -> Result<PathBuf> {
    if equal_load::is_equal_load(run_dir) {
        return equal_load::write(run_dir, out);
    }
    let data = RunData::load(run_dir)?;
    // The id comes from a file someone else may have made: it must stay a plain name.
    crate::config::plan::validate_run_id(&data.run.run_id).map_err(|_| BenchError::RunDir {
        path: run_dir.join("run.json"),
        reason: format!(
            "run_id {:?} is not a plain directory name (letters, digits, '.', '_', '-')",
            data.run.run_id
        ),
    })?;
    let report = render(&data)?;
    // Under --out, the report is named for the run's directory (a copy of a run keeps
    // its run.json's id and must not overwrite the original's report).
    let dir_name = run_dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .filter(|n| crate::config::plan::validate_run_id(n).is_ok())
        .unwrap_or_else(|| data.run.run_id.clone());
    let dir = match out {
        Some(out) => out.join(dir_name),
        None => run_dir.join("report"),
    };
    crate::files::refuse_links(&dir)?;
    std::fs::create_dir_all(&dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
    for (name, svg) in &report.charts {
        crate::files::write_atomic(&dir.join(name), svg.as_bytes())?;
    }
    crate::files::write_atomic(&dir.join("summary.md"), report.markdown.as_bytes())?;
    for (name, bytes) in &report.csv {
        crate::files::write_atomic(&dir.join(name), bytes)?;
    }
    let index = dir.join("index.html");
    crate::files::write_atomic(&index, report.html.as_bytes())?;
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> RunData {
        RunData::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h100-run")).expect("fixture")
    }

    #[test]
    fn quantile_tables_state_their_resolution() {
        let old = tables::all(&fixture());
        assert!(
            old.tables.iter().all(|t| !t.unit.contains("resolution")),
            "an older run has none to state"
        );
        let mut data = fixture();
        for c in &mut data.cells {
            c.quantile_resolution = Some(0.0219);
        }
        let t = tables::all(&data);
        let unit = |title: &str| t.tables.iter().find(|x| x.title == title).map(|x| x.unit.clone());
        assert_eq!(unit("p99 latency").as_deref(), Some("ms, resolution ±2.2%"));
        assert_eq!(unit("Median (p50) latency").as_deref(), Some("ms, resolution ±2.2%"));
        assert_eq!(
            unit("Mean inference latency").as_deref(),
            Some("ms"),
            "the mean is exact"
        );
        assert!(t.reading.iter().any(|r| r.contains("off by up to 2.2%")));
    }

    #[test]
    fn a_single_pass_shows_p50_and_p99_with_their_sampling_intervals() {
        let mut data = fixture();
        for c in data.cells.iter_mut().filter(|c| c.is_aggregate()) {
            if let (Some(p50), Some(p99)) = (c.p50_s, c.p99_s) {
                (c.p50_low_s, c.p50_high_s) = (Some(p50 * 0.99), Some(p50 * 1.01));
                (c.p99_low_s, c.p99_high_s) = (Some(p99 * 0.98), None);
            }
        }
        let t = tables::all(&data);
        let a = data.aggregate(crate::domain::Strategy::Mps, 3).expect("mps × 3");
        let shown = |title: &str| {
            let table = t.tables.iter().find(|x| x.title == title).expect("table");
            let (_, cells) = table.rows.iter().find(|(s, _)| s == "MPS").expect("MPS row");
            match &cells[1] {
                tables::Cell::Value(v) => v.clone(),
                other => format!("{other:?}"),
            }
        };
        let p50 = a.p50_s.expect("p50") * 1e3;
        assert_eq!(
            shown("Median (p50) latency"),
            format!("{p50:.2} ({:.2}–{:.2})", p50 * 0.99, p50 * 1.01)
        );
        let p99 = a.p99_s.expect("p99") * 1e3;
        assert_eq!(shown("p99 latency"), format!("{p99:.2} ({:.2}–?)", p99 * 0.98));
        assert!(
            t.reading
                .iter()
                .any(|r| r.starts_with("In the p50 and p99 tables, brackets"))
        );
    }

    #[test]
    fn charts_of_a_repeated_run_carry_error_bars() {
        let once = fixture();
        let thrice = once.repeated(&[0.97, 1.0, 1.03], |c, f| {
            c.throughput_per_s = c.throughput_per_s.map(|v| v * f)
        });
        let svg = |d: &RunData| {
            charts::all(d)
                .expect("charts")
                .into_iter()
                .find(|(n, _)| n == "throughput.svg")
                .map(|(_, s)| s)
                .expect("throughput chart")
        };
        let lines = |s: &str| s.matches("<line").count() + s.matches("<polyline").count();
        // Three strategies × four pod counts measured: one bar of three strokes each.
        let (a, b) = (svg(&once), svg(&thrice));
        assert!(lines(&b) >= lines(&a) + 12, "{} vs {}", lines(&a), lines(&b));
        assert!(render(&thrice).expect("render").html.contains("3 passes over the plan"));
    }

    #[test]
    fn a_partial_run_is_marked_in_html_and_markdown() {
        let complete = render(&fixture()).expect("render");
        assert!(!complete.html.contains("PARTIAL") && !complete.markdown.contains("PARTIAL"));
        let mut data = fixture();
        data.run.state = "interrupted".into();
        data.cells.retain(|c| c.strategy == crate::domain::Strategy::Exclusive);
        let r = render(&data).expect("render");
        let line = "PARTIAL RUN: run.json says state &quot;interrupted&quot;, not &quot;complete&quot;; 4 of 16 cells are on disk, the others were never measured";
        assert!(
            r.html
                .contains(&format!("<div class=\"banner partial\" role=\"alert\">{line}</div>")),
            "{}",
            &r.html[..2000]
        );
        assert!(
            r.markdown
                .contains(&format!("> **{}**\n", line.replace("&quot;", "\""))),
            "{}",
            r.markdown
        );
    }
}
