//! The sweep: dispatch to a backend's session (`backend::local::session`,
//! `backend::k8s::session`), then the generic [`runner`] over its cells. [`measure`]
//! measures one cell (I/O: waits and snapshots); [`cell`] turns what was measured into
//! the cell's rows (pure); [`progress`] is what the user sees meanwhile.

pub mod cell;
pub mod measure;
pub mod progress;
pub mod runner;
#[cfg(test)]
mod runner_tests;

use std::path::PathBuf;

use crate::backend::{k8s, local};
use crate::config::plan::{BackendKind, SweepPlan};
use crate::error::{BenchError, Result};
use crate::shutdown::Shutdown;
use crate::sweep::progress::{Bars, Lines, Progress, Quiet};

/// What a finished sweep reports.
#[derive(Debug, Clone)]
pub struct SweepOutcome {
    /// The run directory.
    pub dir: PathBuf,
    /// Cells saved in this invocation.
    pub cells_run: usize,
    /// The run's label when it is not a GPU measurement.
    pub label: Option<String>,
    /// Cells of the whole run (resumed ones included) that were measured (`ok`, `oom`,
    /// or `pending` with every pod waiting, as the exclusive baseline expects).
    pub measured: usize,
    /// Cells that failed (a pod crashed, never became ready, or the cell could not start).
    pub failed: usize,
    /// Cells whose strategy cannot run here.
    pub unavailable: usize,
}

impl SweepOutcome {
    /// The exit code the command line documents: 0 every cell has a result, 3 some
    /// cells failed (partial), 1 no cell could be measured.
    pub fn exit_code(&self) -> u8 {
        match (self.measured, self.failed) {
            (0, _) => 1,
            (_, 0) => 0,
            _ => 3,
        }
    }
}

/// Progress on stderr: bars on a terminal, plain lines otherwise, nothing but messages
/// with `--quiet`.
pub fn progress_for(quiet: bool) -> Box<dyn Progress> {
    if quiet {
        Box::new(Quiet)
    } else if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        Box::new(Bars::new())
    } else {
        Box::new(Lines)
    }
}

/// Runs (or resumes) a sweep and returns its directory. `shutdown` is owned by the
/// caller (`main` wires it to the signals).
pub async fn run(
    plan: SweepPlan,
    resume: Option<String>,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<SweepOutcome> {
    let mut plan = plan;
    if let Some(id) = &resume {
        plan.backend = recorded_backend(&plan, id, RunKind::Sweep)?;
    }
    match plan.backend {
        BackendKind::Local => {
            let session = local::session::open(&plan, resume.as_deref())?;
            runner::run(session, progress, shutdown).await
        }
        BackendKind::Kubernetes => {
            let session = k8s::session::open(&plan, resume.as_deref(), shutdown).await?;
            runner::run(session, progress, shutdown).await
        }
    }
}

/// What made a run: its records and how `--resume` continues it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    /// `sweep`: every strategy × pod count.
    Sweep,
    /// `isolation`: trials.
    Isolation,
    /// `capacity`: the search's cells.
    Capacity,
}

impl RunKind {
    /// The kind of a recorded run.
    pub fn of(run: &crate::results::record::RunRecord) -> RunKind {
        match (run.isolation.is_some(), run.capacity.is_some()) {
            (true, _) => RunKind::Isolation,
            (false, true) => RunKind::Capacity,
            (false, false) => RunKind::Sweep,
        }
    }

    /// The command that made it.
    pub fn command(self) -> &'static str {
        match self {
            RunKind::Sweep => "sweep",
            RunKind::Isolation => "isolation",
            RunKind::Capacity => "capacity",
        }
    }

    /// What `--resume` of another command says about a run of this kind.
    pub fn resume_hint(self) -> String {
        format!(
            "this run is {} {} run: continue it with `gpushare-bench {} --resume`",
            if self == RunKind::Isolation { "an" } else { "a" },
            self.command(),
            self.command()
        )
    }
}

/// The backend a run was made with: a resume continues there, whatever the flags say.
/// A run resumes only with the command that made it, refused here before anything is
/// opened or changed.
pub(crate) fn recorded_backend(plan: &SweepPlan, id: &str, kind: RunKind) -> Result<BackendKind> {
    crate::config::plan::validate_run_id(id)?;
    let path = plan.out.join(id).join("run.json");
    let run = crate::results::store::read_run(&path)?;
    let recorded = RunKind::of(&run);
    if recorded != kind {
        return Err(BenchError::flag("--resume", id, recorded.resume_hint()));
    }
    let recorded: BackendKind = run.plan.backend.parse().map_err(|reason: String| BenchError::Results {
        path: path.clone(),
        reason: format!("plan.backend {:?}: {reason}", run.plan.backend),
    })?;
    // A recorded command runs only when the user gives it again, on either backend: a
    // run directory never makes the harness execute a command on its own.
    if plan.workload_cmd != run.plan.workload_cmd {
        let image = if recorded == BackendKind::Kubernetes {
            " and its --image"
        } else {
            ""
        };
        return Err(match (&run.plan.workload_cmd, &plan.workload_cmd) {
            (Some(cmd), _) => BenchError::flag(
                "--resume",
                id,
                format!(
                    "this run measured a server of your own: resume it with the same --workload-cmd {cmd:?}{image}"
                ),
            ),
            (None, given) => BenchError::flag(
                "--workload-cmd",
                given.as_deref().unwrap_or_default(),
                "this run measured gpushare-workload: resume it without --workload-cmd",
            ),
        });
    }
    if recorded == BackendKind::Kubernetes && plan.node.is_none() {
        return Err(BenchError::flag(
            "--resume",
            id,
            "this run was made with the Kubernetes backend: resume it with --backend kubernetes --node NODE",
        ));
    }
    Ok(recorded)
}

/// What a sweep would do, and changes nothing.
pub fn dry_run(plan: &SweepPlan) -> String {
    match plan.backend {
        BackendKind::Kubernetes => k8s::session::dry_run(plan),
        BackendKind::Local => local::session::dry_run(plan),
    }
}
