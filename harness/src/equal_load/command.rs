//! The `equal-load` command (the shell): its flags into the run's record, then its
//! sweeps in order, each created or resumed through `sweep::run`, the record saved
//! after the base is measured and when the last sweep ends.

use std::path::{Path, PathBuf};

use crate::config::cli::EqualLoadArgs;
use crate::config::options::SweepOptions;
use crate::config::plan::{SweepPlan, default_run_id, one_gpu_only, validate_run_id};
use crate::config::values::{Load, LoadLevel};
use crate::error::{BenchError, Result};
use crate::results::equal_load::{BASE_STRATEGIES, Base, CLOSED, EqualLoadRecord, FILE, SCHEMA, base_of};
use crate::shutdown::Shutdown;
use crate::sweep::SweepOutcome;
use crate::sweep::progress::Progress;

/// `--levels` when not given.
pub const DEFAULT_LEVELS: [f64; 2] = [0.5, 0.9];

/// `--out` when not given (as `sweep`'s).
const DEFAULT_OUT: &str = "runs";

/// A run to start or continue: where it lives and its record.
#[derive(Debug, Clone)]
pub struct EqualLoadRun {
    /// `<out>/<run-id>`.
    pub dir: PathBuf,
    /// What `equal-load.json` holds (or will).
    pub record: EqualLoadRecord,
    /// Continuing a run found on disk.
    pub resumed: bool,
}

/// What a finished equal-load run reports.
#[derive(Debug, Clone)]
pub struct EqualLoadOutcome {
    /// The run directory.
    pub dir: PathBuf,
    /// The base the levels were set from.
    pub base: Base,
    /// Each sweep's outcome, in order (closed first).
    pub sweeps: Vec<(String, SweepOutcome)>,
}

impl EqualLoadOutcome {
    /// The exit code over every sweep: 1 when no cell measured, 3 when some failed.
    pub fn exit_code(&self) -> u8 {
        let measured: usize = self.sweeps.iter().map(|(_, s)| s.measured).sum();
        let failed: usize = self.sweeps.iter().map(|(_, s)| s.failed).sum();
        match (measured, failed) {
            (0, _) => 1,
            (_, 0) => 0,
            _ => 3,
        }
    }
}

/// The run from its flags (and `--config`), checked before anything is measured: each
/// level's sweep plan is made once here, so a bad combination fails now, not after the
/// closed sweep. Errors name the flag.
pub fn plan(args: EqualLoadArgs) -> Result<EqualLoadRun> {
    if let Some(id) = args.resume.clone() {
        return resumed(&id, args);
    }
    let file = match &args.config {
        Some(path) => SweepOptions::from_file(path)?,
        None => SweepOptions::default(),
    };
    let mut options = file.overridden_by(args.options)?;
    if let Some(load) = options.load {
        return Err(BenchError::flag(
            "--load",
            &load.to_string(),
            "an equal-load run sets each sweep's load itself: closed, then total:RATE per --levels",
        ));
    }
    let out = options.out.take().unwrap_or_else(|| PathBuf::from(DEFAULT_OUT));
    let run_id = match options.run_id.take() {
        Some(id) => {
            validate_run_id(&id)?;
            id
        }
        None => default_run_id(&crate::clock::now_rfc3339(), "equal-load"),
    };
    let levels = match args.levels {
        Some(l) => l.0,
        None => DEFAULT_LEVELS.iter().filter_map(|s| LoadLevel::new(*s)).collect(),
    };
    let dir = out.join(&run_id);
    if dir.exists() {
        return Err(BenchError::flag(
            "--run-id",
            &run_id,
            format!(
                "{} exists: continue it with --resume {run_id}, or pick another id",
                dir.display()
            ),
        ));
    }
    let record = EqualLoadRecord {
        schema: SCHEMA,
        run_id,
        levels,
        options,
        base: None,
        started_at: crate::clock::now_rfc3339(),
        finished_at: None,
    };
    check_plans(&record, &dir)?;
    Ok(EqualLoadRun {
        dir,
        record,
        resumed: false,
    })
}

/// A resume: the recorded levels and options; only `--out` (where to look) and a
/// server's `--workload-cmd` (never run from a file) are given again.
fn resumed(id: &str, args: EqualLoadArgs) -> Result<EqualLoadRun> {
    validate_run_id(id)?;
    let out = args.options.out.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_OUT));
    let given_cmd = args.options.workload_cmd.clone();
    let mut rest = args.options;
    rest.out = None;
    rest.workload_cmd = None;
    if rest != SweepOptions::default() || args.config.is_some() {
        return Err(BenchError::flag(
            "--resume",
            id,
            "a resumed equal-load run keeps the options it recorded: give only --out (and --workload-cmd if it measured a server of your own)",
        ));
    }
    let dir = out.join(id);
    let record = read(&dir)?;
    if record.run_id != id {
        return Err(BenchError::Results {
            path: dir.join(FILE),
            reason: format!("run_id {:?} is not the directory's name {id:?}", record.run_id),
        });
    }
    if record.options.workload_cmd != given_cmd {
        let why = match &record.options.workload_cmd {
            Some(cmd) => {
                format!("this run measured a server of your own: resume it with the same --workload-cmd {cmd:?}")
            }
            None => "this run measured gpushare-workload: resume it without --workload-cmd".to_string(),
        };
        return Err(BenchError::flag("--resume", id, why));
    }
    if record.finished_at.is_some() {
        return Err(BenchError::flag(
            "--resume",
            id,
            "this equal-load run is complete: `gpushare-bench report` renders it",
        ));
    }
    check_plans(&record, &dir)?;
    Ok(EqualLoadRun {
        dir,
        record,
        resumed: true,
    })
}

/// Reads and checks `DIR/equal-load.json`.
pub fn read(dir: &Path) -> Result<EqualLoadRecord> {
    let path = dir.join(FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| BenchError::RunDir {
        path: dir.to_path_buf(),
        reason: if e.kind() == std::io::ErrorKind::NotFound {
            format!("not an equal-load run (no {FILE})")
        } else {
            format!("cannot read {FILE}: {e}")
        },
    })?;
    let record: EqualLoadRecord = serde_json::from_str(&text).map_err(|e| BenchError::Results {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    record.validate(&path)?;
    Ok(record)
}

fn write(dir: &Path, record: &EqualLoadRecord) -> Result<()> {
    let mut text = serde_json::to_string_pretty(record).map_err(|e| BenchError::Results {
        path: dir.join(FILE),
        reason: e.to_string(),
    })?;
    text.push('\n');
    crate::files::write_atomic(&dir.join(FILE), text.as_bytes())
}

/// The plan of one sweep of the run: the recorded options with the sweep's load, in
/// the run's directory under the sweep's name.
fn sweep_plan(record: &EqualLoadRecord, dir: &Path, name: &str, load: Load) -> Result<SweepPlan> {
    let mut o = record.options.clone();
    o.load = Some(load);
    o.out = Some(dir.to_path_buf());
    o.run_id = Some(name.to_string());
    SweepPlan::from_options(o)
}

/// Checks the closed sweep's plan and each level's (at a stand-in rate: the base is
/// not measured yet), and that the plan holds the base's cell.
fn check_plans(record: &EqualLoadRecord, dir: &Path) -> Result<()> {
    let closed = sweep_plan(record, dir, CLOSED, Load::Closed)?;
    one_gpu_only(&closed, "equal-load")?;
    if !BASE_STRATEGIES.iter().any(|s| closed.strategies.contains(s)) {
        let given: Vec<String> = closed.strategies.iter().map(|s| s.name().to_string()).collect();
        return Err(BenchError::flag(
            "--strategies",
            &given.join(","),
            "the levels are shares of one pod's capacity alone on the GPU, exclusive × 1 (or time-slicing × 1): include exclusive",
        ));
    }
    if !closed.pods.contains(&1) {
        let given: Vec<String> = closed.pods.iter().map(u32::to_string).collect();
        return Err(BenchError::flag(
            "--pods",
            &given.join(","),
            "the levels are shares of one pod's capacity alone on the GPU, measured at 1 pod: include 1",
        ));
    }
    let stand_in = record.base.as_ref().map_or(1000.0, |b| b.per_s);
    for level in &record.levels {
        let rate = level.rate(stand_in).min(crate::config::values::MAX_RATE);
        sweep_plan(record, dir, &level.dir_name(), Load::Total(rate))?;
    }
    Ok(())
}

/// Runs (or resumes) the run's sweeps in order, the closed one first.
pub async fn run(run: EqualLoadRun, progress: &dyn Progress, shutdown: &Shutdown) -> Result<EqualLoadOutcome> {
    let EqualLoadRun { dir, mut record, .. } = run;
    if !dir.join(FILE).is_file() {
        crate::files::refuse_links(&dir)?;
        std::fs::create_dir_all(&dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
        write(&dir, &record)?;
    }
    let total = record.levels.len() + 1;
    let mut sweeps = Vec::new();
    progress.message(&format!("equal-load: sweep 1 of {total}, the closed loop ({CLOSED}/)"));
    let closed = one_sweep(&record, &dir, CLOSED, Load::Closed, progress, shutdown).await?;
    let cells = crate::results::store::read_cells(&dir.join(CLOSED).join("cells.jsonl"))?;
    sweeps.push((CLOSED.to_string(), closed));
    let base = match &record.base {
        Some(b) => b.clone(),
        None => {
            let b = base_of(&cells).map_err(|why| BenchError::RunDir {
                path: dir.join(CLOSED),
                reason: format!("{why}: no capacity to set the levels from (fix the cause and --resume)"),
            })?;
            record.base = Some(b.clone());
            write(&dir, &record)?;
            b
        }
    };
    progress.message(&format!(
        "equal-load: the base, {} × 1 in the closed loop, serves {:.1} inferences/s",
        base.strategy.title(),
        base.per_s
    ));
    for (i, level) in record.levels.clone().into_iter().enumerate() {
        if shutdown.is_requested() {
            return Err(shutdown.interrupted());
        }
        let rate = level.rate(base.per_s);
        let name = level.dir_name();
        progress.message(&format!(
            "equal-load: sweep {} of {total}, {level} of the base: total:{rate:.1} requests/s per cell ({name}/)",
            i + 2
        ));
        let outcome = one_sweep(&record, &dir, &name, Load::Total(rate), progress, shutdown).await?;
        sweeps.push((name, outcome));
    }
    record.finished_at = Some(crate::clock::now_rfc3339());
    write(&dir, &record)?;
    Ok(EqualLoadOutcome { dir, base, sweeps })
}

/// One sweep: created, resumed, or counted when it is complete already.
async fn one_sweep(
    record: &EqualLoadRecord,
    dir: &Path,
    name: &str,
    load: Load,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<SweepOutcome> {
    let plan = sweep_plan(record, dir, name, load)?;
    let run_json = dir.join(name).join("run.json");
    if !run_json.is_file() {
        return crate::sweep::run(plan, None, progress, shutdown).await;
    }
    let run = crate::results::store::read_run(&run_json)?;
    if run.is_complete() {
        let cells = crate::results::store::read_cells(&dir.join(name).join("cells.jsonl"))?;
        return Ok(SweepOutcome::of(&dir.join(name), run.label.clone(), &cells, 0));
    }
    crate::sweep::run(plan, Some(name.to_string()), progress, shutdown).await
}
