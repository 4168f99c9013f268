//! Runs isolation trials through a backend (I/O): per trial, launch the victim and its
//! aggressors as planned, wait for them, warm up, then follow the victim's histogram
//! every second until the observation ends (what an aggressor does, it does by its
//! own workload arguments); stop the pods and hand the trial's record to `save` before the next trial starts.
//! A stop request ends every wait at once; the pods are stopped and every saved record
//! is kept.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Pod, PodSpec, PodState, Prepared};
use crate::domain::MpsLimits;
use crate::domain::{CellStatus, Strategy};
use crate::error::{BenchError, Result};
use crate::isolation::plan::{Role, Scenario, Trial, capped_split, mps_split};
use crate::isolation::record::{Observed, Recovery, SloTarget, common_target, record};
use crate::metrics::{MetricsSource, PodSnapshot, Release, Target};
use crate::results::isolation::IsolationRecord;
use crate::shutdown::Shutdown;
use crate::sweep::progress::Progress;

/// How each trial is run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialSettings {
    /// Longest wait for the pods to become ready.
    pub ready_timeout: Duration,
    /// Discarded time after readiness (shorter than `event_after`).
    pub warmup: Duration,
    /// When the plan's events happen, after readiness (the workload counts the same).
    pub event_after: Duration,
    /// How long the victim is followed after the events.
    pub observe_after: Duration,
    /// The run's latency target (None: 1.5 × the exclusive victim's p99 alone).
    pub slo_s: Option<f64>,
    /// The load the victim is offered, requests per second (None: a server of the
    /// user's own making its own load).
    pub victim_rate: Option<f64>,
    /// The GPU's memory, for the MPS split in words.
    pub memory_total_bytes: Option<u64>,
}

/// How often the pods are polled: a victim's exit is seen within this.
const POLL: Duration = Duration::from_millis(250);
/// The victim's histogram is read every this many polls (once a second).
const READ_EVERY: u32 = 4;

/// A record for a trial whose strategy cannot run here.
fn unavailable(run_id: &str, trial: &Trial, reason: &str) -> IsolationRecord {
    let nothing = Observed::nothing(Vec::new());
    IsolationRecord {
        victim_status: CellStatus::Unavailable,
        note: reason.to_string(),
        ..record(run_id, trial, &nothing, None, SloTarget::Unset, None)
    }
}

/// Runs the `trials` that `done` (records already on disk, for `--resume`) lacks, in
/// order; returns every record, old and new (each new one also given to `save`).
#[allow(clippy::too_many_arguments)] // the runner's inputs, each used once
pub async fn run_trials<B: Backend, S: MetricsSource>(
    backend: &mut B,
    source: &S,
    trials: &[Trial],
    s: &TrialSettings,
    run_id: &str,
    done: &[IsolationRecord],
    progress: &dyn Progress,
    shutdown: &Shutdown,
    mut save: impl FnMut(&IsolationRecord) -> Result<()>,
) -> Result<Vec<IsolationRecord>> {
    let mut prepared: HashMap<Strategy, Prepared> = HashMap::new();
    let mut out: Vec<IsolationRecord> = done.to_vec();
    // One latency target for every trial: --slo, or set by the first victim alone
    // measured (the plan puts exclusive first; a strategy unavailable here passes it on).
    let target = |trial: &Trial, out: &[IsolationRecord]| match (s.slo_s, common_target(out)) {
        (Some(slo), _) => SloTarget::Set(slo),
        (None, SloTarget::Unset) if trial.scenario_name() == "alone" => SloTarget::FromThisVictim,
        (None, known) => known,
    };
    let on_disk = trials
        .iter()
        .filter(|t| out.iter().any(|r| crate::isolation::record::is_record_of(r, t)))
        .count();
    // A trial follows its pods from readiness to the event and past it (start-up and
    // the alone trial's shorter run aside).
    let trial = s.event_after + s.observe_after;
    progress.plan_per_item(trial, trial);
    progress.sweep_start(trials.len() as u64, on_disk as u64, "trials");
    for trial in trials {
        if out.iter().any(|r| crate::isolation::record::is_record_of(r, trial)) {
            continue;
        }
        if shutdown.is_requested() {
            return Err(shutdown.interrupted());
        }
        progress.cell_start(&trial.title());
        let ready = match prepared.get(&trial.strategy) {
            Some(p) => p.clone(),
            None => {
                let p = backend.prepare(trial.strategy.into(), shutdown).await?;
                if let Prepared::Unavailable(reason) = &p {
                    progress.message(&format!("{} unavailable: {reason}", trial.strategy.title()));
                }
                prepared.insert(trial.strategy, p.clone());
                p
            }
        };
        let alone = out
            .iter()
            .find(|r| r.strategy == trial.strategy && r.scenario == "alone" && r.victim_status == CellStatus::Ok)
            .cloned();
        // The MPS victim alone under a trial's limits needs a backend that sets them.
        let ready = match (ready, backend.set_mps_limits(trial.mps)) {
            (Prepared::Ready, Err(reason)) => Prepared::Unavailable(reason),
            (ready, _) => ready,
        };
        let rec = match ready {
            Prepared::Unavailable(reason) => unavailable(run_id, trial, &reason),
            Prepared::Ready => {
                let seen = run_one(backend, source, trial, s, progress, shutdown).await;
                // The pods stop before anything else, whatever happened.
                let stopped = backend.stop_pods(shutdown).await;
                // Back to the split over each trial's pods (setting it cannot fail).
                let _ = backend.set_mps_limits(MpsLimits::default());
                let rec = match seen {
                    Ok(seen) => record(run_id, trial, &seen, alone.as_ref(), target(trial, &out), None),
                    Err(e) if e.is_interrupt() => {
                        if let Err(se) = stopped {
                            tracing::warn!("stopping the trial's pods after the interrupt: {se}");
                        }
                        return Err(e);
                    }
                    // Without its metrics source nothing more can be measured.
                    Err(e @ BenchError::Prometheus { .. }) => return Err(e),
                    // A trial that could not run is an outcome, not the end of the run.
                    Err(e) => IsolationRecord {
                        victim_status: CellStatus::Failed,
                        note: e.to_string(),
                        ..unavailable(run_id, trial, "")
                    },
                };
                let mut rec = rec;
                let setup = backend.cell_setup().unwrap_or_default();
                if let Some(note) = &setup.note {
                    crate::sweep::cell::add_note(&mut rec.note, note);
                }
                if trial.strategy == Strategy::Mps && trial.scenario.is_some() {
                    // The neighbours' part: against the victim alone under these limits.
                    let capped = out.iter().find(|r| {
                        r.strategy == Strategy::Mps
                            && r.scenario == crate::isolation::plan::CAPPED
                            && r.aggressors == trial.aggressors
                            && r.victim_status == CellStatus::Ok
                    });
                    rec.p99_over_capped = match (rec.victim_p99_s, capped.and_then(|c| c.victim_p99_s)) {
                        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                        _ => None,
                    };
                }
                if trial.strategy == Strategy::Mps {
                    rec.mps_split = Some(setup.mps_split.unwrap_or_else(|| {
                        if trial.mps.is_auto() {
                            mps_split(trial.pods.len() as u32, s.memory_total_bytes)
                        } else {
                            capped_split(trial.mps, trial.aggressors + 1)
                        }
                    }));
                }
                if let Err(e) = stopped {
                    // The record is saved first: a measured trial is never lost.
                    save(&rec)?;
                    return Err(if shutdown.is_requested() {
                        shutdown.interrupted()
                    } else {
                        e
                    });
                }
                rec
            }
        };
        progress.cell_done(
            &format!("{}: {}", trial.title(), rec.outcome_text()),
            rec.victim_status == CellStatus::Failed && rec.scenario == "alone",
        );
        save(&rec)?;
        out.push(rec);
    }
    Ok(out)
}

/// Launches one trial and follows its victim; the caller stops the pods.
async fn run_one<B: Backend, S: MetricsSource>(
    backend: &mut B,
    source: &S,
    trial: &Trial,
    s: &TrialSettings,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<Observed> {
    let specs: Vec<PodSpec> = trial
        .pods
        .iter()
        .map(|p| PodSpec {
            name: p.name.clone(),
            args: p.args.clone(),
            group: match trial.scenario {
                None => "alone".into(),
                Some(Scenario::NoisyNeighbour) => format!("noisy-{}", trial.aggressors),
                Some(s) => s.name().into(),
            },
            // Beside a server of the user's own, the aggressors are gpushare-workload.
            builtin: p.role == Role::Aggressor,
        })
        .collect();
    progress.phase("starting pods");
    backend.launch_pods(trial.strategy, &specs, shutdown).await?;
    let pods = backend.wait_ready(s.ready_timeout, shutdown).await?;
    let ready_at = Instant::now();
    let victim_name = trial.victim_name().to_string();
    let target = pods
        .iter()
        .find(|p| p.name == victim_name && p.state == PodState::Running)
        .and_then(|p| {
            Some(Target {
                pod: p.name.clone(),
                url: p.metrics_url.clone()?,
            })
        });
    let Some(target) = target else {
        return Ok(Observed::nothing(pods));
    };
    // The source follows the victim alone: a private Prometheus scrapes it, the
    // harness's requests (`--request`) go to it; they end with the trial.
    let _release = Release(source);
    source.prepare(std::slice::from_ref(&target), shutdown).await?;
    progress.phase("warm-up");
    // Counted from readiness, as the aggressors' events are.
    shutdown.sleep(s.warmup.saturating_sub(ready_at.elapsed())).await?;
    let read = |snaps: Vec<(String, Result<PodSnapshot>)>| snaps.into_iter().next().and_then(|(_, r)| r.ok());
    let Some(first) = read(source.snapshot(std::slice::from_ref(&target)).await?) else {
        return Ok(Observed::nothing(backend.poll().await));
    };
    let mut last = first.clone();
    let mut backlog: Vec<f64> = first.backlog.into_iter().collect();
    let mut died_after = None;
    let recovers = matches!(trial.scenario, Some(Scenario::Fault | Scenario::Crash));
    let mut death: Option<Pod> = None;
    let mut recovery = None;
    let end = ready_at + s.event_after + s.observe_after;
    let mut polls = 0u32;
    progress.phase("observing the victim");
    while Instant::now() < end {
        shutdown.sleep(POLL.min(end - Instant::now())).await?;
        let pods = backend.poll().await;
        if let Some(gone) = pods
            .iter()
            .find(|p| p.name == victim_name && matches!(p.state, PodState::Exited { .. }))
        {
            death = Some(gone.clone());
            died_after = Some(first.at.elapsed().as_secs_f64());
            if recovers {
                progress.phase("the victim exited: starting it again");
                recovery = Some(relaunch(backend, &victim_name, s.ready_timeout, shutdown).await?);
            }
            break;
        }
        polls += 1;
        if polls.is_multiple_of(READ_EVERY)
            && let Some(snap) = read(source.snapshot(std::slice::from_ref(&target)).await?)
        {
            backlog.extend(snap.backlog);
            last = snap;
        }
    }
    if death.is_none() {
        // The victim served to the end: one last read.
        if let Some(snap) = read(source.snapshot(std::slice::from_ref(&target)).await?) {
            backlog.extend(snap.backlog);
            last = snap;
        }
        if recovers {
            recovery = Some(Recovery::NotNeeded);
        }
    }
    // The victim's record is its first process's: a replacement does not undo its exit.
    let mut pods = backend.poll().await;
    if let Some(d) = death {
        for p in pods.iter_mut().filter(|p| p.name == d.name) {
            *p = d.clone();
        }
    }
    Ok(Observed {
        victim_errors: (last.errors - first.errors).max(0.0),
        victim: last.latency.delta(&first.latency),
        pods,
        recovery,
        victim_backlog: backlog,
        victim_secs: (last.at - first.at).as_secs_f64(),
        victim_offered: s.victim_rate,
        victim_died_after: died_after,
    })
}

/// Starts the exited victim again on the same strategy set-up and times it to ready.
async fn relaunch<B: Backend>(backend: &mut B, name: &str, timeout: Duration, shutdown: &Shutdown) -> Result<Recovery> {
    let t0 = Instant::now();
    if let Err(e) = backend.relaunch_pod(name, shutdown).await {
        return Ok(Recovery::Failed(e.to_string()));
    }
    let pods = backend.wait_ready(timeout, shutdown).await?;
    Ok(match pods.iter().find(|p| p.name == name).map(|p| &p.state) {
        Some(PodState::Running) => Recovery::Ready(t0.elapsed()),
        Some(PodState::Exited { code, detail }) => Recovery::Failed(match code {
            Some(c) => format!("exit {c}: {detail}"),
            None => detail.clone(),
        }),
        Some(other) => Recovery::Failed(format!("{other:?}")),
        None => Recovery::Failed("it vanished".into()),
    })
}
