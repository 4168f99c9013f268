//! The directory of a run: `<out>/<run-id>/{run.json, cells.csv, cells.jsonl,
//! windows.jsonl, bucket-layouts.json, logs/}`. Every write goes to a temporary file
//! that is renamed into place, and the cell files are rewritten after every cell (its
//! raw windows first), so a crash or Ctrl-C never leaves half a file and never loses a
//! finished cell. `--resume` reopens a run and skips the cells already on disk.

use std::path::{Path, PathBuf};

use crate::config::plan::{SweepPlan, default_run_id, validate_run_id};
use crate::domain::{Arm, DeviceKind};
use crate::error::{BenchError, Result};
use crate::files::{ReadError, limits, read_text, unreadable, write_atomic};
use crate::results::isolation::{IsolationRecord, isolation_csv, isolation_jsonl, parse_isolation_jsonl};
use crate::results::lock::RunLock;
use crate::results::raw::{CellWindows, LAYOUTS_FILE, Layouts, RAW_FILE, RawCell, raw_jsonl, read_layouts, read_raw};
use crate::results::record::{CellRecord, Environment, RunRecord, cells_csv, cells_jsonl, parse_cells_jsonl};
use crate::results::requests::{REQUESTS_FILE, RequestLine, read_requests, requests_jsonl};

/// An open run directory.
#[derive(Debug)]
pub struct RunStore {
    dir: PathBuf,
    run: RunRecord,
    /// Held while the store is open: one sweep per run directory.
    _lock: RunLock,
    cells: Vec<CellRecord>,
    /// An isolation run's records (isolation.jsonl).
    isolation: Vec<IsolationRecord>,
    /// A `--gpus` sweep's cells measured again alone ([`ALONE_FILE`]).
    alone: Vec<CellRecord>,
    /// The saved cells' raw windows ([`RAW_FILE`]).
    raw: Vec<RawCell>,
    /// The bucket layouts they count in ([`LAYOUTS_FILE`]).
    layouts: Layouts,
    /// The saved cells' streamed requests ([`REQUESTS_FILE`]).
    requests: Vec<RequestLine>,
}

/// A `--gpus` sweep's cells measured a second time with the other GPUs idle, beside
/// cells.jsonl (same rows; not part of the sweep's tables).
pub const ALONE_FILE: &str = "alone.jsonl";

/// Reads a `--gpus` run's [`ALONE_FILE`] (missing: none measured yet), its rows checked
/// as cells.jsonl's are.
pub fn read_alone(dir: &Path, plan: &crate::results::record::PlanRecord) -> Result<Vec<CellRecord>> {
    if plan.gpus.is_empty() {
        return Ok(Vec::new());
    }
    read_cells_in(&dir.join(ALONE_FILE), Some(plan))
}

/// Reads `cells.jsonl`, checking every row ([`parse_cells_jsonl`]: numbers, duplicates,
/// aggregate rows) and naming the line that is wrong.
///
/// A missing file reads as no rows: this is `--resume`'s path, where a sweep that died
/// between writing run.json and the first (empty) cells.jsonl has simply measured
/// nothing yet, and measuring every cell again loses nothing. Reports need the file:
/// `report::RunData::load` refuses a run directory without one.
pub fn read_cells(path: &Path) -> Result<Vec<CellRecord>> {
    read_cells_in(path, None)
}

/// Reads `cells.jsonl` (missing: no rows yet), refusing rows outside `plan` when given.
pub fn read_cells_in(path: &Path, plan: Option<&crate::results::record::PlanRecord>) -> Result<Vec<CellRecord>> {
    let text = match read_text(path, limits::ROWS) {
        Ok(t) => t,
        Err(ReadError::Missing) => return Ok(Vec::new()),
        Err(e) => return Err(unreadable(path, e)),
    };
    parse_cells_jsonl(&text, path, plan)
}

/// Reads an isolation run's `isolation.jsonl` (missing: no records yet), checked
/// against its run.json ([`parse_isolation_jsonl`]); a sweep's run has none.
pub fn read_isolation(path: &Path, run: &RunRecord) -> Result<Vec<IsolationRecord>> {
    if run.kind.isolation().is_none() {
        return Ok(Vec::new());
    }
    match read_text(path, limits::ROWS) {
        Ok(text) => parse_isolation_jsonl(&text, path, run),
        // An isolation run writes an empty one when it starts: missing, it was removed.
        Err(ReadError::Missing) => Err(BenchError::RunDir {
            path: path.to_path_buf(),
            reason: "missing: an isolation run writes isolation.jsonl when it starts, so it was removed".into(),
        }),
        Err(e) => Err(unreadable(path, e)),
    }
}

/// Reads `run.json`.
pub fn read_run(path: &Path) -> Result<RunRecord> {
    let text = read_text(path, limits::RECORD).map_err(|e| unreadable(path, e))?;
    serde_json::from_str(&text).map_err(|e| BenchError::RunDir {
        path: path.to_path_buf(),
        reason: format!("not a run record: {e}"),
    })
}

impl RunStore {
    /// Creates `out/<run_id>/` (which must not exist yet) and writes `run.json`.
    pub fn create(out: &Path, run: RunRecord) -> Result<Self> {
        let dir = out.join(&run.run_id);
        std::fs::create_dir_all(out).map_err(BenchError::io(format!("creating {}", out.display())))?;
        // create_dir, not create_dir_all: of two sweeps given one run id, one gets it.
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(BenchError::RunDir {
                    path: dir,
                    reason: "already exists: choose another --run-id, or continue it with --resume".into(),
                });
            }
            Err(e) => return Err(BenchError::io(format!("creating {}", dir.display()))(e)),
        }
        let lock = RunLock::acquire(&dir)?;
        std::fs::create_dir_all(dir.join("logs")).map_err(BenchError::io(format!("creating {}", dir.display())))?;
        let store = Self {
            dir,
            run,
            _lock: lock,
            cells: Vec::new(),
            isolation: Vec::new(),
            alone: Vec::new(),
            raw: Vec::new(),
            layouts: Layouts::default(),
            requests: Vec::new(),
        };
        store.write_run()?;
        store.write_cells()?;
        if store.run.kind.isolation().is_some() {
            store.write_isolation()?;
        }
        Ok(store)
    }

    /// Reopens an existing run for `--resume`.
    pub fn open(out: &Path, run_id: &str) -> Result<Self> {
        let dir = out.join(run_id);
        crate::files::refuse_links(&dir)?;
        if !dir.join("run.json").is_file() {
            return Err(BenchError::RunDir {
                path: dir,
                reason: "no run to resume here (no run.json)".into(),
            });
        }
        let lock = RunLock::acquire(&dir)?;
        let run = read_run(&dir.join("run.json"))?;
        // A resumed plan is checked as strictly as flags: it decides how pods run.
        run.validate(&dir.join("run.json"))?;
        if run.run_id != run_id {
            return Err(BenchError::RunDir {
                path: dir.join("run.json"),
                reason: format!("run_id {:?} does not match its directory {run_id:?}", run.run_id),
            });
        }
        // Rows outside the recorded plan are tampering, not cells to keep.
        let cells = read_cells_in(&dir.join("cells.jsonl"), Some(&run.plan))?;
        let isolation = read_isolation(&dir.join("isolation.jsonl"), &run)?;
        let alone = read_alone(&dir, &run.plan)?;
        // Windows of cells that are not (or no longer) in cells.jsonl are left out.
        let layouts = read_layouts(&dir)?;
        let mut raw = read_raw(&dir)?;
        let read = raw.len();
        raw.retain(|r| {
            cells
                .iter()
                .any(|c| c.is_aggregate() && c.repeat == r.repeat && c.arm() == r.arm() && c.pods == r.pods)
        });
        if raw.len() < read {
            // A stop between writing a cell's windows and its rows: the cell is measured
            // again, so its old windows go from disk too.
            write_atomic(&dir.join(RAW_FILE), &raw_jsonl(&raw))?;
        }
        // The same for the streamed requests of a cell measured again.
        let mut requests = read_requests(&dir)?;
        let read = requests.len();
        requests.retain(|r| {
            cells
                .iter()
                .any(|c| c.is_aggregate() && c.repeat == r.repeat && c.arm() == r.arm() && c.pods == r.pods)
        });
        if requests.len() < read {
            write_atomic(&dir.join(REQUESTS_FILE), &requests_jsonl(&requests))?;
        }
        std::fs::create_dir_all(dir.join("logs"))
            .map_err(BenchError::io(format!("creating {}/logs", dir.display())))?;
        Ok(Self {
            dir,
            run,
            _lock: lock,
            cells,
            isolation,
            alone,
            raw,
            layouts,
            requests,
        })
    }

    /// Opens the run directory of a sweep: the one to resume (its recorded plan wins), or
    /// a new one named by the plan's run id (default: the time and `short`, the GPU's
    /// short name).
    /// `environment` is read only for a new run.
    pub fn open_or_create(
        plan: &SweepPlan,
        resume: Option<&str>,
        device: DeviceKind,
        short: &str,
        environment: impl FnOnce() -> Environment,
    ) -> Result<Self> {
        if let Some(id) = resume {
            validate_run_id(id)?;
            return Self::open(&plan.out, id);
        }
        let id = match plan.run_id.clone() {
            Some(id) => {
                validate_run_id(&id)?;
                id
            }
            None => default_run_id(&crate::clock::now_rfc3339(), short),
        };
        Self::create(&plan.out, RunRecord::new(id, plan, device, environment()))
    }

    /// Cells (aggregate rows) on disk.
    pub fn cell_count(&self) -> usize {
        self.cells.iter().filter(|c| c.is_aggregate()).count()
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The run record.
    pub fn run(&self) -> &RunRecord {
        &self.run
    }

    /// Rows saved so far.
    pub fn cells(&self) -> &[CellRecord] {
        &self.cells
    }

    /// Whether a cell of a repeat is already on disk.
    pub fn has_cell(&self, repeat: u32, arm: impl Into<Arm>, pods: u32) -> bool {
        self.aggregate(repeat, arm, pods).is_some()
    }

    /// The aggregate row of a cell of a repeat.
    pub fn aggregate(&self, repeat: u32, arm: impl Into<Arm>, pods: u32) -> Option<&CellRecord> {
        let arm = arm.into();
        self.cells
            .iter()
            .find(|c| c.repeat == repeat && c.arm() == arm && c.pods == pods && c.is_aggregate())
    }

    /// Updates run.json (state, unavailable strategies, finish time).
    pub fn update_run(&mut self, f: impl FnOnce(&mut RunRecord)) -> Result<()> {
        f(&mut self.run);
        self.write_run()
    }

    /// Appends one cell's rows and rewrites the cell files atomically.
    pub fn save_cell(&mut self, rows: Vec<CellRecord>) -> Result<()> {
        self.save_cell_with(rows, None)
    }

    /// [`save_cell`](Self::save_cell) with the cell's raw windows, written first (to
    /// [`RAW_FILE`]): rows are never on disk without the windows they came from.
    pub fn save_cell_with(&mut self, rows: Vec<CellRecord>, raw: Option<CellWindows>) -> Result<()> {
        if let Some(first) = rows.first()
            && self.has_cell(first.repeat, first.arm(), first.pods)
        {
            return Err(BenchError::Results {
                path: self.dir.clone(),
                reason: format!(
                    "cell {} × {} pods (repeat {}) is already saved",
                    first.arm(),
                    first.pods,
                    first.repeat
                ),
            });
        }
        if let Some(CellWindows {
            mut cell,
            bounds,
            requests,
        }) = raw
        {
            if !requests.is_empty() {
                self.requests.extend(requests);
                write_atomic(&self.dir.join(REQUESTS_FILE), &requests_jsonl(&self.requests))?;
            }
            let known = self.layouts.layouts.len();
            for (series, bounds) in cell.series.iter_mut().zip(&bounds) {
                series.layout = self.layouts.index_of(bounds);
            }
            if self.layouts.layouts.len() > known {
                let json = serde_json::to_vec(&self.layouts).map_err(|e| BenchError::Results {
                    path: self.dir.join(LAYOUTS_FILE),
                    reason: e.to_string(),
                })?;
                write_atomic(&self.dir.join(LAYOUTS_FILE), &json)?;
            }
            self.raw.push(cell);
            write_atomic(&self.dir.join(RAW_FILE), &raw_jsonl(&self.raw))?;
        }
        self.cells.extend(rows);
        self.write_cells()
    }

    /// A `--gpus` run's cells measured again alone, saved so far.
    pub fn alone(&self) -> &[CellRecord] {
        &self.alone
    }

    /// Saves a cell measured again alone (one per cell) to [`ALONE_FILE`] atomically.
    pub fn save_alone(&mut self, rows: Vec<CellRecord>) -> Result<()> {
        let same = |r: &CellRecord, f: &CellRecord| r.repeat == f.repeat && r.arm() == f.arm() && r.pods == f.pods;
        if let Some(first) = rows.first()
            && self.alone.iter().any(|r| same(r, first))
        {
            return Err(BenchError::Results {
                path: self.dir.join(ALONE_FILE),
                reason: format!("cell {} × {} pods is already measured alone", first.arm(), first.pods),
            });
        }
        self.alone.extend(rows);
        write_atomic(&self.dir.join(ALONE_FILE), &cells_jsonl(&self.alone))
    }

    /// An isolation run's records saved so far.
    pub fn isolation(&self) -> &[IsolationRecord] {
        &self.isolation
    }

    /// Appends one isolation trial's record and rewrites isolation.jsonl and
    /// isolation.csv atomically.
    pub fn save_isolation(&mut self, record: IsolationRecord) -> Result<()> {
        if self.isolation.iter().any(|r| r.same_trial(&record)) {
            return Err(BenchError::Results {
                path: self.dir.clone(),
                reason: format!(
                    "trial {} {} × {} is already saved",
                    record.strategy, record.scenario, record.aggressors
                ),
            });
        }
        self.isolation.push(record);
        self.write_isolation()
    }

    fn write_isolation(&self) -> Result<()> {
        write_atomic(&self.dir.join("isolation.csv"), &isolation_csv(&self.isolation)?)?;
        write_atomic(&self.dir.join("isolation.jsonl"), &isolation_jsonl(&self.isolation))
    }

    fn write_run(&self) -> Result<()> {
        let json = serde_json::to_vec_pretty(&self.run).map_err(|e| BenchError::Results {
            path: self.dir.join("run.json"),
            reason: e.to_string(),
        })?;
        write_atomic(&self.dir.join("run.json"), &json)
    }

    /// Recomputes every aggregate's speed-up and slowdown against its own pass's 1-pod
    /// cell (`sweep::cell::against_one_pod`, the rule `verify` checks) and rewrites the
    /// rows that change: for runs made while a later pass took an earlier pass's 1-pod
    /// cell. Returns each change, as `cell: old → new`.
    pub fn rederive_speedups(
        &mut self,
        rule: impl Fn(&[CellRecord], &CellRecord) -> (Option<f64>, Option<f64>),
    ) -> Result<Vec<String>> {
        let mut changes = Vec::new();
        let before = self.cells.clone();
        for (i, agg) in before.iter().enumerate().filter(|(_, c)| c.is_aggregate()) {
            let (speedup, slowdown) = rule(&before, agg);
            if (speedup, slowdown) != (agg.speedup_vs_1pod, agg.slowdown_vs_1pod) {
                changes.push(format!(
                    "{} × {} (repeat {}): speed-up {:?} → {speedup:?}, slowdown {:?} → {slowdown:?}",
                    agg.arm(),
                    agg.pods,
                    agg.repeat,
                    agg.speedup_vs_1pod,
                    agg.slowdown_vs_1pod
                ));
                self.cells[i].speedup_vs_1pod = speedup;
                self.cells[i].slowdown_vs_1pod = slowdown;
            }
        }
        if !changes.is_empty() {
            self.write_cells()?;
        }
        Ok(changes)
    }

    fn write_cells(&self) -> Result<()> {
        write_atomic(&self.dir.join("cells.csv"), &cells_csv(&self.cells)?)?;
        write_atomic(&self.dir.join("cells.jsonl"), &cells_jsonl(&self.cells))
    }
}
