//! The `equal-load` command (the shell): its flags into the run's record, then its
//! sweeps in order, each created or resumed through `sweep::run`, the record saved
//! after the base is measured and when the last sweep ends.

use std::path::{Path, PathBuf};

use crate::config::cli::EqualLoadArgs;
use crate::config::options::SweepOptions;
use crate::config::plan::{SweepPlan, default_run_id, one_gpu_only, validate_run_id};
use crate::config::values::{Load, LoadLevel, MAX_RATE};
use crate::domain::Arm;
use crate::error::{BenchError, Result};
use crate::results::equal_load::{
    BASE_STRATEGIES, Base, CLOSED, EqualLoadRecord, FILE, Part, SCHEMA, base_of, check_parts,
};
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
    /// `--workload-bin`, given each time (a run directory never names a program to run).
    pub workload_bin: Option<PathBuf>,
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
            "(the flag or the --config file's load) an equal-load run sets each sweep's load itself: closed, then total:RATE per --levels",
        ));
    }
    if let Some(t) = &options.target {
        return Err(BenchError::flag(
            "--target",
            t,
            "a sweep option (gpushare-bench sweep --target): an equal-load run's sweeps make a fixed number of passes",
        ));
    }
    let workload_bin = options.workload_bin.take();
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
    if levels.is_empty() {
        return Err(BenchError::MissingFlag {
            flag: "--levels".into(),
            reason: "give at least one level, e.g. --levels 50%,90%".into(),
        });
    }
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
    record.validate(&dir.join(FILE))?;
    check_plans(&record, &dir, workload_bin.as_deref())?;
    Ok(EqualLoadRun {
        dir,
        record,
        resumed: false,
        workload_bin,
    })
}

/// A resume: the recorded options. Given again: `--out` (where to look),
/// `--workload-bin` (never recorded), a server of the user's own exactly as recorded
/// (`--workload-cmd`, `--server-image`, `--workload-arg`: a run directory never makes the
/// harness run a command), and `--levels` to replace the levels whose sweeps have not
/// started (one that has must stay).
fn resumed(id: &str, args: EqualLoadArgs) -> Result<EqualLoadRun> {
    validate_run_id(id)?;
    let out = args.options.out.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_OUT));
    let given = args.options.clone();
    let mut rest = args.options;
    rest.out = None;
    rest.workload_bin = None;
    rest.workload_cmd = None;
    rest.server_image = None;
    rest.workload_args = Vec::new();
    if rest != SweepOptions::default() || args.config.is_some() {
        return Err(BenchError::flag(
            "--resume",
            id,
            "a resumed equal-load run keeps the options it recorded: give only --out, --workload-bin, --levels, and your server's flags as the run recorded them",
        ));
    }
    let dir = out.join(id);
    let mut record = read(&dir)?;
    if record.run_id != id {
        return Err(BenchError::RunDir {
            path: dir.join(FILE),
            reason: format!("run_id {:?} is not the directory's name {id:?}", record.run_id),
        });
    }
    // What was measured must be what the record says: a tampered part would be built on.
    check_on_disk(&dir, &record)?;
    let same_server = record.options.workload_cmd == given.workload_cmd
        && record.options.server_image == given.server_image
        && record.options.workload_args == given.workload_args;
    if !same_server {
        let r = &record.options;
        let why = match (&r.workload_cmd, &r.server_image) {
            (Some(cmd), _) => format!(
                "this run measured a server of your own: resume it with the same --workload-cmd {cmd:?}{}",
                if r.workload_args.is_empty() { String::new() } else { " and --workload-arg values".into() }
            ),
            (None, Some(image)) => format!(
                "this run measured your server's image: resume it with the same --server-image {image:?} and --workload-arg values"
            ),
            (None, None) if r.workload_args.is_empty() => {
                "this run measured gpushare-workload: resume it without --workload-cmd, --server-image or --workload-arg".to_string()
            }
            (None, None) => "resume it with the same --workload-arg values the run recorded".to_string(),
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
    if let Some(levels) = args.levels {
        let started: Vec<LoadLevel> = record
            .levels
            .iter()
            .copied()
            .filter(|l| dir.join(l.dir_name()).exists())
            .collect();
        if let Some(kept) = started.iter().find(|l| !levels.0.contains(l)) {
            return Err(BenchError::flag(
                "--levels",
                &levels.to_string(),
                format!(
                    "the {kept} sweep has started ({}/): keep it in the list",
                    kept.dir_name()
                ),
            ));
        }
        record.levels = levels.0;
        record.validate(&dir.join(FILE))?;
    }
    let workload_bin = given.workload_bin;
    check_plans(&record, &dir, workload_bin.as_deref())?;
    Ok(EqualLoadRun {
        dir,
        record,
        resumed: true,
        workload_bin,
    })
}

/// Checks the sweeps on disk against the record ([`check_parts`]).
fn check_on_disk(dir: &Path, record: &EqualLoadRecord) -> Result<()> {
    let levels = std::iter::once(None).chain(record.levels.iter().copied().map(Some));
    let mut found = Vec::new();
    for (name, level) in record.sweeps().into_iter().zip(levels) {
        let sub = dir.join(&name);
        let run = if sub.join("run.json").is_file() {
            let run = crate::results::store::read_run(&sub.join("run.json"))?;
            let cells = crate::results::store::read_cells(&sub.join("cells.jsonl"))?;
            Some((run, cells))
        } else {
            None
        };
        found.push((name, level, run));
    }
    let parts: Vec<Part> = found
        .iter()
        .map(|(name, level, run)| Part {
            name,
            level: *level,
            run: run.as_ref().map(|(r, c)| (r, &c[..])),
        })
        .collect();
    check_parts(record, &parts).map_err(|reason| BenchError::RunDir {
        path: dir.join(FILE),
        reason,
    })
}

/// Reads and checks `DIR/equal-load.json`.
pub fn read(dir: &Path) -> Result<EqualLoadRecord> {
    let path = dir.join(FILE);
    let text = crate::files::read_text(&path, crate::files::limits::RECORD).map_err(|e| match e {
        crate::files::ReadError::Missing => BenchError::RunDir {
            path: dir.to_path_buf(),
            reason: format!("not an equal-load run (no {FILE})"),
        },
        e => crate::files::unreadable(&path, e),
    })?;
    let record: EqualLoadRecord = serde_json::from_str(&text).map_err(|e| BenchError::RunDir {
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
fn sweep_plan(record: &EqualLoadRecord, dir: &Path, name: &str, load: Load, bin: Option<&Path>) -> Result<SweepPlan> {
    let mut o = record.options.clone();
    o.workload_bin = bin.map(Path::to_path_buf);
    o.load = Some(load);
    o.out = Some(dir.to_path_buf());
    o.run_id = Some(name.to_string());
    SweepPlan::from_options(o)
}

/// Checks the closed sweep's plan, that it holds the base's cell, and the levels' plans
/// (each at its rate once the base is measured; before, what does not depend on it).
fn check_plans(record: &EqualLoadRecord, dir: &Path, bin: Option<&Path>) -> Result<()> {
    let closed = sweep_plan(record, dir, CLOSED, Load::Closed, bin)?;
    one_gpu_only(&closed, "equal-load")?;
    let arms = closed.arms();
    if !BASE_STRATEGIES.iter().any(|s| arms.contains(&Arm::of(*s))) {
        let given: Vec<String> = closed.strategies.iter().map(|s| s.name().to_string()).collect();
        return Err(BenchError::flag(
            "--strategies",
            &given.join(","),
            "the levels are shares of one pod's capacity alone on the GPU, exclusive × 1 (or time-slicing × 1 with no interval or limit set): include exclusive",
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
    match &record.base {
        Some(base) => check_levels(record, dir, base, bin),
        // What does not depend on the rate (a server that cannot be sent requests, a
        // backend that refuses an open loop): checked at the highest rate, which no
        // window refuses; the rate itself once the base is known.
        None => {
            for level in record.levels.iter().take(1) {
                sweep_plan(record, dir, &level.dir_name(), Load::Total(MAX_RATE), bin)?;
            }
            Ok(())
        }
    }
}

/// Each level not yet started as a plan at the measured base: a rate the workload or the
/// window cannot take is refused by its level, before any of its cells runs.
fn check_levels(record: &EqualLoadRecord, dir: &Path, base: &Base, bin: Option<&Path>) -> Result<()> {
    for level in &record.levels {
        let name = level.dir_name();
        if dir.join(&name).exists() {
            continue;
        }
        let rate = level.rate(base.per_s);
        let refuse = |why: String| {
            Err(BenchError::flag(
                "--levels",
                &level.to_string(),
                format!(
                    "at the measured base of {:.1} inferences/s this level offers total:{rate:.1} requests/s, which {why}; resume with --levels to choose others",
                    base.per_s
                ),
            ))
        };
        if rate > MAX_RATE {
            return refuse(format!("is above the workload's limit of {MAX_RATE} per second"));
        }
        if let Err(e) = sweep_plan(record, dir, &name, Load::Total(rate), bin) {
            return refuse(format!("the sweep refuses ({e})"));
        }
    }
    Ok(())
}

/// Runs (or resumes) the run's sweeps in order, the closed one first.
pub async fn run(run: EqualLoadRun, progress: &dyn Progress, shutdown: &Shutdown) -> Result<EqualLoadOutcome> {
    let EqualLoadRun {
        dir,
        mut record,
        workload_bin,
        ..
    } = run;
    let bin = workload_bin.as_deref();
    if !dir.join(FILE).is_file() {
        crate::files::refuse_links(&dir)?;
        std::fs::create_dir_all(&dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
        write(&dir, &record)?;
    }
    let total = record.levels.len() + 1;
    let mut sweeps = Vec::new();
    progress.message(&format!("equal-load: sweep 1 of {total}, the closed loop ({CLOSED}/)"));
    let closed = one_sweep(&record, &dir, CLOSED, Load::Closed, bin, progress, shutdown).await?;
    let cells = crate::results::store::read_cells(&dir.join(CLOSED).join("cells.jsonl"))?;
    sweeps.push((CLOSED.to_string(), closed));
    let base = match &record.base {
        Some(b) => b.clone(),
        None => {
            // The closed sweep ended (complete): its base cell will not be measured
            // again, so a resume cannot help. A measurement that failed, not bad input:
            // exit 1 now and on every resume, which reaches here again.
            let b = base_of(&cells).map_err(|why| BenchError::Results {
                path: dir.join(CLOSED),
                reason: format!(
                    "{why}: no capacity to set the levels from; the closed sweep is kept (`gpushare-bench report {}` renders it), and a new run measures again once the cause is fixed",
                    dir.join(CLOSED).display()
                ),
            })?;
            record.base = Some(b.clone());
            write(&dir, &record)?;
            b
        }
    };
    check_levels(&record, &dir, &base, bin)?;
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
        let outcome = one_sweep(&record, &dir, &name, Load::Total(rate), bin, progress, shutdown).await?;
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
    bin: Option<&Path>,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<SweepOutcome> {
    let plan = sweep_plan(record, dir, name, load, bin)?;
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
