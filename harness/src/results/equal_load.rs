//! An equal-load run's own record (`equal-load.json`): the levels it measures, the
//! options its sweeps share, and the base the levels are fractions of, the aggregate
//! throughput of one exclusive pod in the closed loop. The run is a directory of
//! sweeps (`closed/`, then one per level, e.g. `load-50pct/`), each a run directory of
//! its own that every other command reads as it reads any sweep.
//!
//! Pure: the base from the closed sweep's cells and each level's rate.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::options::SweepOptions;
pub use crate::config::values::LoadLevel as Level;
use crate::domain::{Arm, CellStatus, Strategy};
use crate::error::{BenchError, Result};
use crate::results::record::CellRecord;
use crate::results::repeats::interval;

/// The record's file in the run directory.
pub const FILE: &str = "equal-load.json";

/// The closed-loop sweep's directory (and run id) inside the run directory.
pub const CLOSED: &str = "closed";

/// Versions of [`EqualLoadRecord`] this build reads.
pub const SCHEMA: u32 = 1;

/// What the levels are shares of: one pod's aggregate throughput alone on the GPU in
/// the closed loop, measured by the run's closed sweep on the same GPU: exclusive × 1,
/// or time-slicing × 1 where exclusive was not measured (one pod alone either way; the
/// CPU pipeline runs time-slicing only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Base {
    /// The strategy of the 1-pod cell it was measured in.
    pub strategy: Strategy,
    /// Inferences per second: the mean over the passes that measured the cell.
    pub per_s: f64,
    /// Half the 95% interval over those passes (None: one pass).
    #[serde(default)]
    pub half_width_per_s: Option<f64>,
    /// How many passes measured it.
    pub passes: usize,
}

/// `equal-load.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EqualLoadRecord {
    /// Version of this record's layout.
    pub schema: u32,
    /// The run's id (its directory's name).
    pub run_id: String,
    /// The levels, in the order they are measured.
    pub levels: Vec<Level>,
    /// The options every sweep of the run was made from (without `--load`, which the
    /// run sets per sweep, `--out` and `--run-id`).
    pub options: SweepOptions,
    /// Set once the closed sweep has measured exclusive × 1.
    #[serde(default)]
    pub base: Option<Base>,
    /// When the run started (UTC, RFC 3339).
    pub started_at: String,
    /// When its last sweep finished (None: not yet).
    #[serde(default)]
    pub finished_at: Option<String>,
}

impl EqualLoadRecord {
    /// The sweeps of the run, in order: the closed loop, then each level.
    pub fn sweeps(&self) -> Vec<String> {
        std::iter::once(CLOSED.to_string())
            .chain(self.levels.iter().map(|l| l.dir_name()))
            .collect()
    }

    /// Checks what serde cannot: errors name the file and the field.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let bad = |reason: String| {
            Err(BenchError::RunDir {
                path: path.to_path_buf(),
                reason,
            })
        };
        if self.schema != SCHEMA {
            return bad(format!("schema {} (this build reads {SCHEMA})", self.schema));
        }
        if crate::config::plan::validate_run_id(&self.run_id).is_err() {
            return bad(format!("run_id {:?} is not a plain directory name", self.run_id));
        }
        if self.levels.is_empty() {
            return bad("levels is empty: an equal-load run measures at least one".into());
        }
        let mut names = self.sweeps();
        names.sort();
        names.dedup();
        if names.len() != self.levels.len() + 1 {
            return bad("levels repeats a level".into());
        }
        if let Some(b) = &self.base
            && !(b.per_s.is_finite() && b.per_s > 0.0 && b.passes > 0)
        {
            return bad(format!(
                "base.per_s {} from {} passes: a capacity is a positive number from at least one pass",
                b.per_s, b.passes
            ));
        }
        Ok(())
    }
}

/// One sweep of an equal-load run as found on disk: its directory's name, its level
/// (None: the closed loop), and its run record and rows (None: not started).
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    /// `closed`, `load-50pct`, …
    pub name: &'a str,
    /// The level.
    pub level: Option<Level>,
    /// Its run.json and cells.jsonl.
    pub run: Option<(&'a crate::results::record::RunRecord, &'a [CellRecord])>,
}

/// Whether the sweeps on disk are the ones `record` made (pure): run in order with none
/// removed, each its own (its run id its directory's name), each level at its share of
/// the base, the base what the closed sweep measured, every sweep of the closed sweep's
/// plan but for its load, on its machine and GPUs, and the options what the closed
/// sweep ran. The first problem, naming the sweep and the field.
pub fn check_parts(record: &EqualLoadRecord, sweeps: &[Part]) -> std::result::Result<(), String> {
    use crate::config::values::Load;
    let on_disk: Vec<bool> = sweeps.iter().map(|s| s.run.is_some()).collect();
    if let Some(i) = (1..sweeps.len()).find(|&i| on_disk[i] && !on_disk[i - 1]) {
        return Err(format!(
            "{}/ is there but {}/ is not: the sweeps run in order, so one was removed",
            sweeps[i].name,
            sweeps[i - 1].name
        ));
    }
    if record.finished_at.is_some()
        && let Some(s) = sweeps.iter().find(|s| s.run.is_none())
    {
        return Err(format!("{}/ is missing, but the run finished", s.name));
    }
    let Some((closed_run, closed_cells)) = sweeps.first().and_then(|s| s.run) else {
        return match &record.base {
            Some(_) => Err("closed/ is missing, but base was measured in it".into()),
            None => Ok(()),
        };
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    // The base is what the closed sweep's rows give.
    if let (Some(b), Ok(want)) = (&record.base, base_of(closed_cells)) {
        let same = b.strategy == want.strategy
            && b.passes == want.passes
            && close(b.per_s, want.per_s)
            && match (b.half_width_per_s, want.half_width_per_s) {
                (Some(x), Some(y)) => close(x, y),
                (x, y) => x == y,
            };
        if !same {
            return Err(format!(
                "base is {} × 1 at {}/s over {} passes, but closed/ measured {} × 1 at {}/s over {}",
                b.strategy, b.per_s, b.passes, want.strategy, want.per_s, want.passes
            ));
        }
    }
    // The options are what the closed sweep ran.
    let closed_plan = &closed_run.plan;
    if let Some(pods) = &record.options.pods {
        let given: Vec<u32> = pods.0.iter().map(|p| p.0).collect();
        if given != closed_plan.pods {
            return Err(format!(
                "options.pods is {pods}, but closed/ measured {:?}",
                closed_plan.pods
            ));
        }
    }
    if let Some(strategies) = &record.options.strategies {
        // A plan may leave out what cannot run here (the CPU runs time-slicing alone),
        // never add.
        let given: Vec<Strategy> = strategies.0.iter().map(|s| s.0).collect();
        if closed_plan.strategies.iter().any(|s| !given.contains(s)) {
            return Err(format!(
                "options.strategies is {strategies}, but closed/ measured {:?}",
                closed_plan.strategies.iter().map(|s| s.name()).collect::<Vec<_>>()
            ));
        }
    }
    let without_load = |plan: &crate::results::record::PlanRecord| {
        let mut v = serde_json::to_value(plan).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.remove("load");
        }
        v
    };
    for s in sweeps {
        let Some((run, _)) = s.run else { continue };
        if run.run_id != s.name {
            return Err(format!(
                "{}/run.json: run_id {:?} is not {:?} (another sweep's, or another run's)",
                s.name, run.run_id, s.name
            ));
        }
        let want = match (s.level, &record.base) {
            (None, _) => Load::Closed,
            (Some(l), Some(b)) => Load::Total(l.rate(b.per_s)),
            (Some(_), None) => return Err(format!("{}/ is there, but no base was measured for its level", s.name)),
        };
        let same_load = match (run.plan.load, want) {
            (Load::Total(a), Load::Total(b)) => close(a, b),
            (a, b) => a == b,
        };
        if !same_load {
            return Err(format!(
                "{}/run.json: load {} is not {want} (its level of base.per_s)",
                s.name, run.plan.load
            ));
        }
        if without_load(&run.plan) != without_load(closed_plan) {
            return Err(format!(
                "{}/run.json: its plan is not closed/'s but for the load",
                s.name
            ));
        }
        let (env, base_env) = (&run.environment, &closed_run.environment);
        let uuids = |e: &crate::results::record::Environment| e.gpus.iter().map(|g| g.uuid.clone()).collect::<Vec<_>>();
        if env.hostname != base_env.hostname || uuids(env) != uuids(base_env) {
            return Err(format!(
                "{}/run.json: measured on another machine or GPU than closed/",
                s.name
            ));
        }
    }
    Ok(())
}

/// The strategies whose 1-pod cell can be the base, in order of preference.
pub const BASE_STRATEGIES: [Strategy; 2] = [Strategy::Exclusive, Strategy::TimeSlicing];

/// The base from the closed sweep's rows (pure): exclusive × 1's aggregate throughput
/// over the passes that measured it; time-slicing × 1's only where exclusive was not
/// measured because it cannot run here (not in the plan, or unavailable). An exclusive
/// × 1 that failed is an error: its cause would be measured as the base. The error says
/// what became of each candidate.
pub fn base_of(cells: &[CellRecord]) -> std::result::Result<Base, String> {
    let mut why = Vec::new();
    for strategy in BASE_STRATEGIES {
        let arm = Arm::of(strategy);
        let rows: Vec<&CellRecord> = cells
            .iter()
            .filter(|c| c.is_aggregate() && c.arm() == arm && c.pods == 1)
            .collect();
        if rows.is_empty() {
            continue;
        }
        if let Some(i) = interval(&rows, |c| c.throughput_per_s.filter(|t| *t > 0.0)) {
            return Ok(Base {
                strategy,
                per_s: i.mean,
                half_width_per_s: i.half_width,
                passes: i.n,
            });
        }
        let notes: Vec<String> = rows
            .iter()
            .filter(|r| r.status != CellStatus::Ok)
            .map(|r| format!("{}: {}", r.status, r.note))
            .collect();
        why.push(format!(
            "{} × 1 measured no throughput{}",
            strategy.title(),
            if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join("; "))
            }
        ));
        if !rows.iter().all(|r| r.status == CellStatus::Unavailable) {
            break;
        }
    }
    if why.is_empty() {
        return Err("the closed sweep has no exclusive × 1 or time-slicing × 1 cell".into());
    }
    Err(format!("in the closed sweep, {}", why.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(strategy: Strategy, pods: u32, repeat: u32, status: CellStatus, tput: Option<f64>) -> CellRecord {
        CellRecord {
            strategy,
            pods,
            repeat,
            status,
            throughput_per_s: tput,
            ..CellRecord::unmeasured(
                strategy,
                pods,
                crate::results::record::ALL_PODS,
                status,
                crate::domain::Source::Scrape,
                crate::domain::DeviceKind::Cuda,
            )
        }
    }

    #[test]
    fn the_base_is_exclusive_alone_over_its_passes() {
        let cells = vec![
            cell(Strategy::Exclusive, 1, 1, CellStatus::Ok, Some(880.0)),
            cell(Strategy::Exclusive, 1, 2, CellStatus::Ok, Some(900.0)),
            cell(Strategy::TimeSlicing, 1, 1, CellStatus::Ok, Some(2000.0)),
            cell(Strategy::Exclusive, 3, 1, CellStatus::Ok, Some(5000.0)),
        ];
        let b = base_of(&cells).expect("base");
        assert!((b.per_s - 890.0).abs() < 1e-9, "{b:?}");
        assert_eq!(b.passes, 2);
        assert!(b.half_width_per_s.is_some());

        assert_eq!(b.strategy, Strategy::Exclusive);

        // Exclusive unavailable (the CPU pipeline): time-slicing's pod alone.
        let mut cpu = cells.clone();
        cpu[0].status = CellStatus::Unavailable;
        cpu[0].throughput_per_s = None;
        cpu[1].status = CellStatus::Unavailable;
        cpu[1].throughput_per_s = None;
        let b = base_of(&cpu).expect("time-slicing");
        assert_eq!((b.strategy, b.per_s, b.passes), (Strategy::TimeSlicing, 2000.0, 1));

        // Exclusive × 1 failed: no fallback, since its cause would be measured as the base.
        let mut failed = cpu.clone();
        failed[0].status = CellStatus::Failed;
        let e = base_of(&failed).expect_err("failed");
        assert!(
            e.contains("Exclusive × 1 measured no throughput") && e.contains("failed"),
            "{e}"
        );
        assert!(!e.contains("Time-slicing"), "{e}");
        let e = base_of(&cells[3..]).expect_err("none");
        assert!(e.contains("no exclusive × 1 or time-slicing × 1 cell"), "{e}");
    }

    fn level(share: f64) -> Level {
        Level::new(share).expect("level")
    }

    #[test]
    fn a_record_with_a_repeated_level_or_no_level_is_refused() {
        let mut r = EqualLoadRecord {
            schema: SCHEMA,
            run_id: "eq".into(),
            levels: vec![level(0.5), level(0.9)],
            options: SweepOptions::default(),
            base: None,
            started_at: "2026-11-27T00:00:00Z".into(),
            finished_at: None,
        };
        let path = Path::new("equal-load.json");
        r.validate(path).expect("valid");
        assert_eq!(r.sweeps(), ["closed", "load-50pct", "load-90pct"]);
        let text = serde_json::to_string(&r).expect("json");
        let back: EqualLoadRecord = serde_json::from_str(&text).expect("back");
        assert_eq!(back, r);
        r.levels.push(level(0.5));
        assert!(
            r.validate(path)
                .expect_err("dup")
                .to_string()
                .contains("repeats a level")
        );
        r.levels.clear();
        assert!(
            r.validate(path)
                .expect_err("none")
                .to_string()
                .contains("levels is empty")
        );
        r.levels = vec![level(0.5)];
        r.base = Some(Base {
            strategy: Strategy::Exclusive,
            per_s: 0.0,
            half_width_per_s: None,
            passes: 1,
        });
        assert!(r.validate(path).expect_err("zero").to_string().contains("base.per_s"));
    }
}
