//! The `capacity` command (the shell): its flags into a plan (a sweep's, with pod
//! counts 1 to `--max-pods` and the recorded [`CapacityPlan`]), the backend's session
//! as a sweep opens it, and the search's cells measured through the generic runner
//! ([`crate::sweep::runner::run_work`]) one at a time, each saved before the search
//! picks the next.

use crate::backend::{Backend, k8s, local};
use crate::capacity::record::{CapacityRecord, records};
use crate::capacity::search::{Step, cell_verdict, limit, next};
use crate::config::cli::CapacityArgs;
use crate::config::options::ConfigFile;
use crate::config::plan::{BackendPlan, CapacityPlan, Load, Sharing, SweepPlan};
use crate::error::{BenchError, Result};
use crate::metrics::MetricsSource;
use crate::shutdown::Shutdown;
use crate::sweep::SweepOutcome;
use crate::sweep::progress::{Progress, cell_title};
use crate::sweep::runner::{CellRunner, Work, labels, run_work};

/// `--max-pods` when not given: the reference study's largest cell.
pub const DEFAULT_MAX_PODS: u32 = 7;

/// The plan of a capacity run from its flags (and `--config`): errors name the flag.
/// A resumed run keeps its recorded load, SLOs and counts, so they need not be given.
pub fn plan(args: CapacityArgs) -> Result<SweepPlan> {
    let o = &args.options;
    let sweep_only = [
        ("--pods", o.pods.as_ref().map(ToString::to_string)),
        ("--repeat", o.repeat.map(|r| r.to_string())),
        ("--target", o.target.clone()),
        ("--budget", o.budget.as_ref().map(|b| b.text.clone())),
    ];
    if let Some((flag, Some(value))) = sweep_only.into_iter().find(|(_, v)| v.is_some()) {
        return Err(BenchError::flag(
            flag,
            &value,
            "a sweep option: capacity walks pod counts from 1 to --max-pods once per strategy",
        ));
    }
    // A resume sends what the run recorded: --request need not be given again.
    if let (Some(cmd), None, None) = (&o.workload_cmd, &o.request, &args.resume) {
        return Err(BenchError::flag(
            "--workload-cmd",
            cmd,
            "capacity offers each pod a Poisson load: give --request for the harness to send it to your server",
        ));
    }
    let max_pods = args.max_pods.map_or(DEFAULT_MAX_PODS, |p| p.0);
    let capacity = CapacityPlan { max_pods };
    let config = args.config.as_deref().map(ConfigFile::read).transpose()?;
    let file = config.as_ref().map(|c| c.options.clone()).unwrap_or_default();
    let from_file = [
        ("pods", file.pods.as_ref().map(ToString::to_string)),
        ("repeat", file.repeat.map(|r| r.to_string())),
        ("target", file.target.clone()),
        ("budget", file.budget.as_ref().map(|b| b.text.clone())),
    ];
    if let Some((key, Some(value))) = from_file.into_iter().find(|(_, v)| v.is_some()) {
        return Err(BenchError::Config {
            path: args.config.clone().unwrap_or_default(),
            reason: format!(
                "{key} = {value}: a sweep option; capacity walks pod counts from 1 to --max-pods once per strategy"
            ),
        });
    }
    let load_given = args.options.load.is_some() || file.load.is_some();
    let mut plan = SweepPlan::from_file_and_flags(config.as_ref(), args.options)?;
    crate::config::plan::one_gpu_only(&plan, "capacity")?;
    if args.resume.is_none() {
        match plan.load {
            Load::PerPod(_) => {}
            Load::Closed if load_given => {
                return Err(BenchError::flag(
                    "--load",
                    "closed",
                    "capacity needs an open-loop load per pod, e.g. --load poisson:100",
                ));
            }
            Load::Closed => {
                return Err(BenchError::MissingFlag {
                    flag: "--load".into(),
                    reason: "capacity needs an open-loop load per pod, e.g. --load poisson:100".into(),
                });
            }
            other @ Load::Total(_) => {
                return Err(BenchError::flag(
                    "--load",
                    &other.to_string(),
                    "capacity asks how many pods of a given rate fit: give the rate per pod, e.g. --load poisson:100",
                ));
            }
        }
        if plan.slos.is_empty() {
            return Err(BenchError::MissingFlag {
                flag: "--slo".into(),
                reason: "capacity needs a latency objective, e.g. --slo p99=25ms".into(),
            });
        }
    }
    plan.pods = (1..=max_pods).collect();
    plan.repeat = 1;
    plan.kind = crate::config::plan::RunKind::Capacity(capacity);
    Ok(plan)
}

/// What a finished capacity run reports.
#[derive(Debug, Clone)]
pub struct CapacityOutcome {
    /// The cells of the run, as a sweep counts them.
    pub sweep: SweepOutcome,
    /// The capacity table.
    pub records: Vec<CapacityRecord>,
}

/// Runs (or resumes) a capacity search.
pub async fn run(
    plan: SweepPlan,
    resume: Option<String>,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<CapacityOutcome> {
    if let Some(id) = &resume {
        crate::sweep::check_resume(&plan, id)?;
    }
    let finished = match &plan.backend {
        BackendPlan::Local(l) => {
            let session = local::session::open(&plan, l, resume.as_deref())?;
            run_work(session, &mut Search, progress, shutdown).await?
        }
        BackendPlan::Kubernetes(k) => match &k.sharing {
            Sharing::Dra(dra) => {
                let session = k8s::session::open_dra(&plan, k, dra, resume.as_deref(), shutdown).await?;
                run_work(session, &mut Search, progress, shutdown).await?
            }
            Sharing::DevicePlugin => {
                let session = k8s::session::open(&plan, k, resume.as_deref(), shutdown).await?;
                run_work(session, &mut Search, progress, shutdown).await?
            }
        },
    };
    let records = records(finished.store.run(), finished.store.cells());
    Ok(CapacityOutcome {
        sweep: crate::sweep::runner::outcome(finished),
        records,
    })
}

/// A capacity run's work: per strategy, the counts the search asks for that are not
/// on disk yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct Search;

impl<B: Backend> Work<B> for Search {
    async fn run<S: MetricsSource>(
        &mut self,
        session: &mut crate::backend::Session<B>,
        source: &S,
        progress: &dyn Progress,
        shutdown: &Shutdown,
    ) -> Result<usize> {
        let run = session.store.run().clone();
        let Some(cap) = run.kind.capacity().cloned() else {
            return Err(BenchError::flag(
                "--resume",
                &run.run_id,
                "this run is not a capacity run: continue it with the command that made it",
            ));
        };
        let slos = run.plan.slos.clone();
        let arms = run.plan.arms();
        let at_most: u32 = arms.iter().map(|a| limit(a.strategy, cap.max_pods)).sum();
        let store = &mut session.store;
        let done = store.cells().iter().filter(|c| c.is_aggregate()).count() as u64;
        progress.sweep_start(u64::from(at_most), done, "cells at most");
        let mut cells = CellRunner {
            backend: &mut session.backend,
            source,
            telemetry: session.telemetry.clone(),
            settings: &session.settings,
            progress,
            shutdown,
        };
        let mut ran = 0;
        for arm in arms {
            if shutdown.is_requested() {
                return Err(shutdown.interrupted());
            }
            let limit = limit(arm.strategy, cap.max_pods);
            let step =
                |store: &crate::results::store::RunStore| next(limit, |n| cell_verdict(store.cells(), arm, n, &slos));
            if step(store) == Step::Done {
                continue;
            }
            let prepared = cells.prepare(arm, store).await?;
            while let Step::Measure(pods) = step(store) {
                let title = cell_title(arm, pods, None);
                cells
                    .run(store, &prepared, &labels(store, arm, pods, 1), &title)
                    .await?;
                ran += 1;
                if let Some(v) = cell_verdict(store.cells(), arm, pods, &slos) {
                    progress.message(&format!("{title}: {}", verdict_line(&v)));
                }
            }
            if let Some(r) = records(store.run(), store.cells()).iter().find(|r| r.arm() == arm) {
                progress.message(&summary_line(r));
            }
        }
        Ok(ran)
    }
}

fn verdict_line(v: &crate::capacity::search::Verdict) -> String {
    use crate::capacity::search::Verdict;
    match v {
        Verdict::Fits => "fits".into(),
        Verdict::Marginal(why) => format!("marginal ({why})"),
        Verdict::Misses(why) => format!("misses ({why})"),
    }
}

/// "MPS: 5 pods fit (6 misses: …)".
pub fn summary_line(r: &CapacityRecord) -> String {
    let name = r.arm().title();
    match r.pods_fit {
        None => format!(
            "{name}: no capacity measured{}",
            if r.note.is_empty() {
                String::new()
            } else {
                format!(" ({})", r.note)
            }
        ),
        // Undecided from the first count: not "0 pods fit", which reads as a verdict.
        Some(0) if r.first_miss.starts_with("marginal") => {
            format!("{name}: undecided at 1 pod; {}", r.first_miss)
        }
        Some(n) => {
            let then = match r.first_miss_pods {
                Some(m) => format!("; {m} {}", r.first_miss),
                None if r.finished => format!("; searched to {}", r.searched_to),
                None => "; the search did not finish".into(),
            };
            format!("{name}: {n} pod{} fit{then}", if n == 1 { "" } else { "s" })
        }
    }
}

/// The plain-text capacity table the command prints.
pub fn render(records: &[CapacityRecord]) -> String {
    let mut out = String::new();
    for r in records {
        out.push_str(&summary_line(r));
        out.push('\n');
    }
    out
}
