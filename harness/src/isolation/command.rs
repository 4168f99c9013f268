//! The `isolation` command (the shell): its flags into a plan (the sweep's pods plus
//! the recorded [`IsolationPlan`]), the backend's session as a sweep opens it, and the
//! trials run through the generic runner ([`crate::sweep::runner::run_work`]), so the
//! run directory, the metrics source, the clean-up on every path and `--resume` are
//! the sweep's.

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::{Backend, Session, k8s, local};
use crate::config::cli::IsolationArgs;
use crate::config::options::{ConfigFile, SweepOptions};
use crate::config::plan::{BackendKind, BackendPlan, Sharing, SweepPlan};
use crate::config::values::Load;
use crate::domain::CellStatus;
use crate::error::{BenchError, Result};
use crate::isolation::plan::{
    DEFAULT_AGGRESSORS, DEFAULT_EVENT_AFTER, DEFAULT_OBSERVE, DEFAULT_VICTIM_RATE, IsolationPlan, IsolationSettings,
    Scenario, trials,
};
use crate::isolation::runner::{TrialSettings, run_trials};
use crate::metrics::MetricsSource;
use crate::results::isolation::IsolationRecord;
use crate::results::record::Unavailable;
use crate::shutdown::Shutdown;
use crate::sweep::progress::Progress;
use crate::sweep::runner::{Finished, Work, run_work};

/// The plan of an isolation run from its flags (and `--config`): errors name the flag.
pub fn plan(args: IsolationArgs) -> Result<SweepPlan> {
    let mut args = args;
    // The victim's one latency target; a percentile, if given, is not used.
    let slos: Vec<_> = std::mem::take(&mut args.options.slo)
        .into_iter()
        .flat_map(|l| l.0)
        .collect();
    if let Some(token) = slos.iter().find(|s| s.metric.is_token()) {
        return Err(BenchError::flag(
            "--slo",
            &token.to_string(),
            "isolation judges the victim's request latency: give a target without a metric, e.g. 20ms",
        ));
    }
    if let Some(api) = args.options.stream {
        return Err(BenchError::flag(
            "--stream",
            &api.to_string(),
            "isolation does not stream answers yet: its victim's requests are timed whole",
        ));
    }
    let slo = match slos.as_slice() {
        [] => None,
        [one] => Some(one.threshold.as_secs_f64()),
        [_, two, ..] => {
            return Err(BenchError::flag(
                "--slo",
                &two.to_string(),
                "isolation takes one latency target for the victim, e.g. 20ms",
            ));
        }
    };
    // Sweep options, given as flags or in the config file: refused, not ignored.
    let sweep_only = |o: &SweepOptions| {
        [
            ("--pods", o.pods.as_ref().map(ToString::to_string)),
            ("--window", o.window.as_ref().map(|s| s.text.clone())),
            ("--max-cell", o.max_cell.as_ref().map(|s| s.text.clone())),
            ("--repeat", o.repeat.map(|r| r.to_string())),
            ("--target", o.target.clone()),
            ("--budget", o.budget.as_ref().map(|b| b.text.clone())),
            ("--load", o.load.map(|l| l.to_string())),
            ("--mps-threads", o.mps_threads.as_ref().map(ToString::to_string)),
            ("--mps-memory", o.mps_memory.as_ref().map(ToString::to_string)),
        ]
    };
    const WHY: &str = "a sweep option: isolation trials choose their own pods (--aggressors) and loads (--victim-rate; aggressors closed loop) and follow the victim for --event-after + --observe";
    if let Some((flag, Some(value))) = sweep_only(&args.options).into_iter().find(|(_, v)| v.is_some()) {
        return Err(BenchError::flag(flag, &value, WHY));
    }
    let config = args.config.as_deref().map(ConfigFile::read).transpose()?;
    let file = config.as_ref().map(|c| c.options.clone()).unwrap_or_default();
    if let Some((flag, Some(value))) = sweep_only(&file).into_iter().find(|(_, v)| v.is_some()) {
        return Err(BenchError::Config {
            path: args.config.clone().unwrap_or_default(),
            reason: format!("{} = {value}: {WHY}", flag.trim_start_matches("--").replace('-', "_")),
        });
    }
    let mut plan = SweepPlan::from_file_and_flags(config.as_ref(), args.options)?;
    crate::config::plan::one_gpu_only(&plan, "isolation")?;
    // Its events are timed from readiness: the warm-up is always --warmup.
    plan.measure.steady_warmup = false;
    if let Some(dra) = plan.dra().filter(|d| d.timeslices.len() > 1) {
        return Err(BenchError::flag(
            "--timeslice",
            &crate::config::values::List(dra.timeslices.clone()).to_string(),
            "isolation trials measure each strategy once: give one interval (a sweep takes several)",
        ));
    }
    // A server of the user's own is the victim, loaded at --victim-rate by the
    // harness's requests (--request) or by itself; the aggressors run gpushare-workload,
    // whose flags make them misbehave.
    if let (true, None, Some(rate)) = (plan.own_server(), &plan.request, args.victim_rate) {
        return Err(BenchError::flag(
            "--victim-rate",
            &rate.to_string(),
            "the rate of the harness's requests to a server of your own: give --request URL (and --body FILE), or leave it out for a server that makes its own load",
        ));
    }
    if let Some(image) = &args.aggressor_image
        && (plan.backend_kind() != BackendKind::Kubernetes || !plan.own_server())
    {
        return Err(BenchError::flag(
            "--aggressor-image",
            image,
            "for Kubernetes with a server of your own (--server-image, or --workload-cmd with --image); otherwise the aggressors run the pods' own gpushare-workload",
        ));
    }
    let iso = IsolationPlan {
        scenarios: args.scenarios.map_or_else(|| Scenario::ALL.to_vec(), |l| l.0),
        victim_rate: args.victim_rate.unwrap_or(DEFAULT_VICTIM_RATE),
        aggressors: args.aggressors.map_or_else(
            || DEFAULT_AGGRESSORS.to_vec(),
            |l| l.0.into_iter().map(|p| p.0).collect(),
        ),
        event_after_s: args
            .event_after
            .map_or(DEFAULT_EVENT_AFTER, |s| s.duration)
            .as_secs_f64(),
        observe_s: args.observe.map_or(DEFAULT_OBSERVE, |s| s.duration).as_secs_f64(),
        slo_s: slo,
        aggressor_image: args.aggressor_image,
    };
    iso.validate(plan.measure.warmup)?;
    plan.pods = iso.pod_counts();
    plan.repeat = 1;
    if plan.request.is_some() {
        // The harness's requests to the victim (and only to it: the runner prepares
        // the source for the victim alone).
        plan.load = Load::PerPod(iso.victim_rate);
    }
    plan.kind = crate::config::plan::RunKind::Isolation(iso);
    Ok(plan)
}

/// What a finished isolation run reports.
#[derive(Debug, Clone)]
pub struct IsolationOutcome {
    /// The run directory.
    pub dir: PathBuf,
    /// Trials run in this invocation.
    pub ran: usize,
    /// The run's label when it is not a GPU measurement.
    pub label: Option<String>,
    /// Every record of the run.
    pub records: Vec<IsolationRecord>,
}

impl IsolationOutcome {
    /// Strategies whose victim alone could not be measured (it failed, ran out of
    /// memory, or served nothing readable): their trials have no baseline to be judged
    /// against.
    pub fn failed_baselines(&self) -> Vec<String> {
        self.records
            .iter()
            .filter(|r| r.scenario == "alone" && r.victim_status != CellStatus::Unavailable && r.victim_p99_s.is_none())
            .map(|r| r.strategy.title().to_string())
            .collect()
    }

    /// 0 every trial has its record, 3 some strategy's victim alone failed (partial),
    /// 1 no victim was measured at all. A victim that dies of its neighbour is a result.
    pub fn exit_code(&self) -> u8 {
        let measured = self.records.iter().any(|r| r.victim_inferences.is_some());
        match (measured, self.failed_baselines().is_empty()) {
            (false, _) => 1,
            (true, true) => 0,
            (true, false) => 3,
        }
    }
}

/// Runs (or resumes) an isolation run.
pub async fn run(
    plan: SweepPlan,
    resume: Option<String>,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<IsolationOutcome> {
    if let Some(id) = &resume {
        crate::sweep::check_resume(&plan, id)?;
    }
    let finished = match &plan.backend {
        BackendPlan::Local(l) => {
            let session = local::session::open(&plan, l, resume.as_deref())?;
            run_work(session, &mut Trials, progress, shutdown).await?
        }
        BackendPlan::Kubernetes(k) => match &k.sharing {
            Sharing::Dra(dra) => {
                let session = k8s::session::open_dra(&plan, k, dra, resume.as_deref(), shutdown).await?;
                run_work(session, &mut Trials, progress, shutdown).await?
            }
            Sharing::DevicePlugin => {
                let session = k8s::session::open(&plan, k, resume.as_deref(), shutdown).await?;
                run_work(session, &mut Trials, progress, shutdown).await?
            }
        },
    };
    let Finished { store, ran } = finished;
    Ok(IsolationOutcome {
        dir: store.dir().to_path_buf(),
        ran,
        label: store.run().label.clone(),
        records: store.isolation().to_vec(),
    })
}

/// An isolation run's work: the recorded plan's trials not yet on disk.
#[derive(Debug, Clone, Copy, Default)]
pub struct Trials;

impl<B: Backend> Work<B> for Trials {
    async fn run<S: MetricsSource>(
        &mut self,
        session: &mut Session<B>,
        source: &S,
        progress: &dyn Progress,
        shutdown: &Shutdown,
    ) -> Result<usize> {
        let run = session.store.run().clone();
        let Some(iso) = run.kind.isolation().cloned() else {
            return Err(BenchError::flag("--resume", &run.run_id, run.kind.resume_hint()));
        };
        let memory = run.gpu_memory_bytes();
        let trials = trials(&IsolationSettings::new(
            &iso,
            &run.plan.strategies,
            memory,
            run.plan.own_server(),
        ))?;
        let settings = TrialSettings {
            ready_timeout: session.settings.ready_timeout,
            warmup: session.settings.warmup,
            event_after: Duration::from_secs_f64(iso.event_after_s),
            observe_after: Duration::from_secs_f64(iso.observe_s),
            slo_s: iso.slo_s,
            // The harness's requests or gpushare-workload's own Poisson load; a server
            // of the user's own without --request makes its own.
            victim_rate: (!run.plan.own_server() || run.plan.request.is_some()).then_some(iso.victim_rate),
            memory_total_bytes: memory,
        };
        let done = session.store.isolation().to_vec();
        let store = &mut session.store;
        let records = run_trials(
            &mut session.backend,
            source,
            &trials,
            &settings,
            &run.run_id,
            &done,
            progress,
            shutdown,
            |r| {
                // A strategy is unavailable when its trials are, not when the backend
                // cannot cap MPS's victim alone as in a trial (that record says so).
                if r.victim_status == CellStatus::Unavailable
                    && r.scenario != crate::isolation::plan::CAPPED
                    && !store.run().unavailable.iter().any(|u| u.strategy == r.strategy)
                {
                    store.update_run(|run| {
                        run.unavailable.push(Unavailable {
                            strategy: r.strategy,
                            reason: r.note.clone(),
                        })
                    })?;
                }
                store.save_isolation(r.clone())
            },
        )
        .await?;
        Ok(records.len() - done.len())
    }
}
