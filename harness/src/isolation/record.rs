//! One [`IsolationRecord`] per trial, made from what was observed (pure): how the
//! victim fared beside its aggressors, against the same victim alone under the same
//! strategy.

use serde::{Deserialize, Serialize};

use crate::backend::{Pod, PodState};
use crate::domain::{CellStatus, Strategy};
use crate::isolation::plan::{Role, Trial};
use crate::stats::Histogram;
use crate::sweep::cell::{finite, pod_status};

/// How much slower than alone a latency target allows by default: the SLO is this
/// times the victim's p99 alone under the same strategy.
pub const DEFAULT_SLO_FACTOR: f64 = 1.5;

/// One trial of an isolation run. Numbers not measured are empty, never zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IsolationRecord {
    /// The run.
    pub run_id: String,
    /// The scenario, or `alone` for the victim alone.
    pub scenario: String,
    /// Sharing strategy.
    pub strategy: Strategy,
    /// Aggressors beside the victim.
    pub aggressors: u32,
    /// The victim's outcome.
    pub victim_status: CellStatus,
    /// The victim's exit code when it stopped on its own.
    pub victim_exit_code: Option<i32>,
    /// Victim inferences measured.
    pub victim_inferences: Option<u64>,
    /// Exact mean latency of the victim, seconds.
    pub victim_mean_s: Option<f64>,
    /// Victim p50, seconds.
    pub victim_p50_s: Option<f64>,
    /// Victim p99, seconds.
    pub victim_p99_s: Option<f64>,
    /// Resolution of the victim's quantiles (0.022 = ±2.2%).
    pub quantile_resolution: Option<f64>,
    /// The victim's p99 over its p99 alone under the same strategy.
    pub p99_inflation: Option<f64>,
    /// The victim's mean over its mean alone.
    pub mean_inflation: Option<f64>,
    /// The latency target, seconds (default: 1.5 × the p99 alone).
    pub slo_s: Option<f64>,
    /// The fraction of the victim's inferences within the target.
    pub slo_attainment: Option<f64>,
    /// Pods that were serving at the end.
    pub survivors: u32,
    /// Pods started (pending ones not counted).
    pub started: u32,
    /// What became of the aggressors, e.g. "aggressor-1 exit 5: GPU fault …".
    pub aggressor_outcome: String,
    /// MPS: the thread and memory split the clients got.
    pub mps_split: Option<String>,
    /// Anything else a reader should know.
    pub note: String,
}

/// What a trial observed.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The victim's histogram over the measurement (None: nothing measured).
    pub victim: Option<Histogram>,
    /// Every pod's last state.
    pub pods: Vec<Pod>,
}

fn outcome_of(pod: &Pod) -> String {
    match &pod.state {
        PodState::Running => format!("{} serving", pod.name),
        PodState::Pending(_) => format!("{} pending", pod.name),
        PodState::Starting => format!("{} never ready", pod.name),
        PodState::Exited { code: Some(c), detail } => format!("{} exit {c}: {detail}", pod.name),
        PodState::Exited { code: None, detail } => format!("{}: {detail}", pod.name),
    }
}

/// The record of a trial (pure). `alone` is the same strategy's record of the victim
/// alone (None for the baseline itself); `slo_s` overrides the default target.
pub fn record(
    run_id: &str,
    trial: &Trial,
    seen: &Observed,
    alone: Option<&IsolationRecord>,
    slo_s: Option<f64>,
    mps_split: Option<String>,
) -> IsolationRecord {
    let victim_name = trial.victim_name();
    let victim_pod = seen.pods.iter().find(|p| p.name == victim_name);
    let (victim_status, victim_exit_code, victim_note) = match victim_pod {
        Some(p) => pod_status(&p.state, &None),
        None => (CellStatus::Failed, None, "the victim was not launched".into()),
    };
    let h = seen.victim.as_ref().filter(|h| h.count > 0.0);
    let p99 = h.and_then(|h| finite(h.quantile(0.99)));
    let mean = h.and_then(|h| finite(h.mean()));
    let slo = slo_s.or_else(|| alone.and_then(|a| a.victim_p99_s).map(|p| p * DEFAULT_SLO_FACTOR));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let aggressors: Vec<String> = trial
        .pods
        .iter()
        .filter(|p| p.role == Role::Aggressor)
        .filter_map(|p| seen.pods.iter().find(|s| s.name == p.name))
        .map(outcome_of)
        .collect();
    IsolationRecord {
        run_id: run_id.to_string(),
        scenario: trial.scenario.map_or("alone".to_string(), |s| s.name().to_string()),
        strategy: trial.strategy,
        aggressors: trial.aggressors,
        victim_status,
        victim_exit_code,
        victim_inferences: h.map(|h| h.count as u64),
        victim_mean_s: mean,
        victim_p50_s: h.and_then(|h| finite(h.quantile(0.5))),
        victim_p99_s: p99,
        quantile_resolution: h.and_then(Histogram::quantile_resolution),
        p99_inflation: ratio(p99, alone.and_then(|a| a.victim_p99_s)),
        mean_inflation: ratio(mean, alone.and_then(|a| a.victim_mean_s)),
        slo_s: slo,
        slo_attainment: match (h, slo) {
            (Some(h), Some(s)) => finite(h.fraction_at_most(s)),
            _ => None,
        },
        survivors: seen.pods.iter().filter(|p| p.state == PodState::Running).count() as u32,
        started: seen
            .pods
            .iter()
            .filter(|p| !matches!(p.state, PodState::Pending(_)))
            .count() as u32,
        aggressor_outcome: aggressors.join("; "),
        mps_split,
        note: victim_note,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::isolation::plan::{IsolationSettings, Scenario, trials};

    fn trial(scenario: Option<Scenario>, strategy: Strategy) -> Trial {
        trials(&IsolationSettings {
            scenarios: Scenario::ALL.to_vec(),
            strategies: vec![strategy],
            victim_rate: 100.0,
            noisy_aggressors: vec![1],
            event_after: Duration::from_secs(10),
            memory_total_bytes: Some(80 << 30),
        })
        .expect("plan")
        .into_iter()
        .find(|t| t.scenario == scenario)
        .expect("trial")
    }

    /// 100 observations uniformly spread over (0, 10 ms] × `scale`, in 1 ms buckets.
    fn spread(scale: f64) -> Histogram {
        let mut buckets: Vec<(f64, f64)> = (1..=40).map(|i| (i as f64 * 1e-3, 0.0)).collect();
        for (ub, cum) in &mut buckets {
            *cum = ((*ub / (0.01 * scale)) * 100.0).min(100.0);
        }
        buckets.push((f64::INFINITY, 100.0));
        Histogram {
            buckets,
            sum: 100.0 * 0.005 * scale,
            count: 100.0,
        }
    }

    fn pod(name: &str, state: PodState) -> Pod {
        Pod {
            name: name.into(),
            metrics_url: None,
            state,
        }
    }

    #[test]
    fn a_noisy_neighbour_is_judged_against_the_victim_alone() {
        let alone_trial = trial(None, Strategy::TimeSlicing);
        let alone = record(
            "r",
            &alone_trial,
            &Observed {
                victim: Some(spread(1.0)),
                pods: vec![pod("victim", PodState::Running)],
            },
            None,
            None,
            None,
        );
        assert_eq!(
            (alone.scenario.as_str(), alone.victim_status),
            ("alone", CellStatus::Ok)
        );
        assert_eq!(alone.p99_inflation, None);
        let p99 = alone.victim_p99_s.expect("p99");
        assert!((p99 - 0.0099).abs() < 1e-12, "{p99}");
        let noisy = record(
            "r",
            &trial(Some(Scenario::NoisyNeighbour), Strategy::TimeSlicing),
            &Observed {
                victim: Some(spread(2.0)),
                pods: vec![pod("victim", PodState::Running), pod("aggressor-1", PodState::Running)],
            },
            Some(&alone),
            None,
            None,
        );
        assert!((noisy.p99_inflation.expect("inflation") - 2.0).abs() < 1e-9);
        assert!((noisy.mean_inflation.expect("inflation") - 2.0).abs() < 1e-9);
        // SLO 1.5 × 9.9 ms = 14.85 ms: 74.25% of a uniform (0, 20 ms] spread.
        assert!((noisy.slo_s.expect("slo") - 0.01485).abs() < 1e-12);
        assert!((noisy.slo_attainment.expect("attainment") - 0.7425).abs() < 1e-9);
        assert_eq!((noisy.survivors, noisy.started), (2, 2));
        assert_eq!(noisy.aggressor_outcome, "aggressor-1 serving");
    }

    #[test]
    fn a_victim_that_dies_of_its_neighbours_fault_is_recorded_with_its_exit_code() {
        let fault = record(
            "r",
            &trial(Some(Scenario::Fault), Strategy::Mps),
            &Observed {
                victim: Some(spread(1.0)),
                pods: vec![
                    pod(
                        "victim",
                        PodState::Exited {
                            code: Some(5),
                            detail: "GPU fault while waiting for the GPU: CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                        },
                    ),
                    pod(
                        "aggressor-1",
                        PodState::Exited {
                            code: Some(5),
                            detail: "GPU fault".into(),
                        },
                    ),
                ],
            },
            None,
            Some(0.02),
            Some("50% of the SMs".into()),
        );
        assert_eq!(
            (fault.victim_status, fault.victim_exit_code),
            (CellStatus::Failed, Some(5))
        );
        assert!(fault.note.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{}", fault.note);
        assert_eq!((fault.survivors, fault.started), (0, 2));
        assert_eq!(fault.aggressor_outcome, "aggressor-1 exit 5: GPU fault");
        assert_eq!(
            fault.slo_attainment,
            Some(1.0),
            "what it served before, it served in time"
        );
        // Exclusive: the aggressor is pending, not started.
        let ex = record(
            "r",
            &trial(Some(Scenario::Crash), Strategy::Exclusive),
            &Observed {
                victim: None,
                pods: vec![
                    pod("victim", PodState::Running),
                    pod("aggressor-1", PodState::Pending("the GPU is taken".into())),
                ],
            },
            None,
            None,
            None,
        );
        assert_eq!((ex.survivors, ex.started, ex.victim_inferences), (1, 1, None));
        assert_eq!(ex.aggressor_outcome, "aggressor-1 pending");
    }
}
