//! Runs isolation trials through a backend (I/O): per trial, launch the victim and its
//! aggressors as planned, wait for them, warm up, then follow the victim's histogram
//! every second until the observation ends, killing the pods the plan kills on time;
//! stop the pods and hand the trial's record to `save` before the next trial starts.
//! A stop request ends every wait at once; the pods are stopped and every saved record
//! is kept.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Pod, PodSpec, PodState, Prepared};
use crate::domain::{CellStatus, Strategy};
use crate::error::Result;
use crate::isolation::plan::{Trial, mps_split};
use crate::isolation::record::{IsolationRecord, Observed, record};
use crate::metrics::{MetricsSource, PodSnapshot, Target};
use crate::shutdown::Shutdown;

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
    /// The victim's latency target (None: 1.5 × its p99 alone).
    pub slo_s: Option<f64>,
    /// The GPU's memory, for the MPS split in words.
    pub memory_total_bytes: Option<u64>,
}

/// How often the victim is read and the pods polled.
const TICK: Duration = Duration::from_secs(1);

/// A record for a trial whose strategy cannot run here.
fn unavailable(run_id: &str, trial: &Trial, reason: &str) -> IsolationRecord {
    let nothing = Observed {
        victim: None,
        pods: Vec::new(),
    };
    IsolationRecord {
        victim_status: CellStatus::Unavailable,
        note: reason.to_string(),
        ..record(run_id, trial, &nothing, None, None, None)
    }
}

/// Runs `trials` in order; returns their records (also given to `save` one by one).
pub async fn run_trials<B: Backend, S: MetricsSource>(
    backend: &mut B,
    source: &S,
    trials: &[Trial],
    s: &TrialSettings,
    run_id: &str,
    shutdown: &Shutdown,
    mut save: impl FnMut(&IsolationRecord) -> Result<()>,
) -> Result<Vec<IsolationRecord>> {
    let mut prepared: HashMap<Strategy, Prepared> = HashMap::new();
    let mut out: Vec<IsolationRecord> = Vec::new();
    for trial in trials {
        if shutdown.is_requested() {
            return Err(shutdown.interrupted());
        }
        let ready = match prepared.get(&trial.strategy) {
            Some(p) => p.clone(),
            None => {
                let p = backend.prepare(trial.strategy, shutdown).await?;
                prepared.insert(trial.strategy, p.clone());
                p
            }
        };
        let alone = out
            .iter()
            .find(|r| r.strategy == trial.strategy && r.scenario == "alone" && r.victim_status == CellStatus::Ok)
            .cloned();
        let rec = match ready {
            Prepared::Unavailable(reason) => unavailable(run_id, trial, &reason),
            Prepared::Ready => {
                let seen = run_one(backend, source, trial, s, shutdown).await;
                // The pods stop before anything else, whatever happened.
                let stopped = backend.stop_pods(shutdown).await;
                let seen = seen?;
                stopped?;
                let mut rec = record(run_id, trial, &seen, alone.as_ref(), s.slo_s, None);
                if trial.strategy == Strategy::Mps {
                    rec.mps_split = Some(mps_split(rec.started, s.memory_total_bytes));
                }
                rec
            }
        };
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
    shutdown: &Shutdown,
) -> Result<Observed> {
    let specs: Vec<PodSpec> = trial
        .pods
        .iter()
        .map(|p| PodSpec {
            name: p.name.clone(),
            args: p.args.clone(),
        })
        .collect();
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
        return Ok(Observed { victim: None, pods });
    };
    shutdown.sleep(s.warmup).await?;
    let read = |snaps: Vec<(String, Result<PodSnapshot>)>| snaps.into_iter().next().and_then(|(_, r)| r.ok());
    let Some(first) = read(source.snapshot(std::slice::from_ref(&target)).await?) else {
        return Ok(Observed {
            victim: None,
            pods: backend.poll().await,
        });
    };
    let mut last = first.clone();
    let mut kills: Vec<(Duration, String)> = trial
        .pods
        .iter()
        .filter_map(|p| Some((p.kill_after?, p.name.clone())))
        .collect();
    let end = ready_at + s.event_after + s.observe_after;
    while Instant::now() < end {
        shutdown.sleep(TICK.min(end - Instant::now())).await?;
        let since = Instant::now() - ready_at;
        for (_, name) in kills.iter().filter(|(at, _)| *at <= since) {
            backend.kill_pod(name).await?;
        }
        kills.retain(|(at, _)| *at > since);
        let pods = backend.poll().await;
        if victim_gone(&pods, &victim_name) {
            break;
        }
        if let Some(snap) = read(source.snapshot(std::slice::from_ref(&target)).await?) {
            last = snap;
        }
    }
    Ok(Observed {
        victim: last.latency.delta(&first.latency),
        pods: backend.poll().await,
    })
}

fn victim_gone(pods: &[Pod], victim: &str) -> bool {
    pods.iter()
        .any(|p| p.name == victim && matches!(p.state, PodState::Exited { .. }))
}
