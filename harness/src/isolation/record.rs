//! One [`IsolationRecord`] per trial, made from what was observed (pure): how the
//! victim fared beside its aggressors, against the same victim alone under the same
//! strategy.

use crate::backend::{Pod, PodState};
use crate::domain::CellStatus;
use crate::isolation::plan::{Role, Trial};
use crate::results::isolation::IsolationRecord;
use crate::stats::Histogram;
use crate::sweep::cell::{finite, pod_status};

/// How much slower than alone a latency target allows by default: the SLO is this
/// times the victim's p99 alone under the same strategy.
pub const DEFAULT_SLO_FACTOR: f64 = 1.5;

/// What a trial observed.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The victim's histogram over the measurement (None: nothing measured).
    pub victim: Option<Histogram>,
    /// Every pod's last state.
    pub pods: Vec<Pod>,
    /// Whether the victim served again after the event (None: not tried).
    pub recovery: Option<Recovery>,
    /// Errors the victim counted over the measurement (failed or dropped inferences,
    /// or the harness's failed requests): they add no latency, so they are said.
    pub victim_errors: f64,
    /// The victim's backlog at its first read and at each read after, where it reports
    /// one (`workload_queue_depth`, or the harness's requests in flight).
    pub victim_backlog: Vec<f64>,
    /// Seconds between the victim's first and last reads.
    pub victim_secs: f64,
    /// The load the victim was offered, requests per second (None: a server of the
    /// user's own making its own).
    pub victim_offered: Option<f64>,
    /// A victim that exited: seconds from its first read to its exit being seen.
    pub victim_died_after: Option<f64>,
}

impl Observed {
    /// A trial where nothing was measured (its pods as they were last seen).
    pub fn nothing(pods: Vec<Pod>) -> Self {
        Observed {
            victim: None,
            pods,
            recovery: None,
            victim_errors: 0.0,
            victim_backlog: Vec::new(),
            victim_secs: 0.0,
            victim_offered: None,
            victim_died_after: None,
        }
    }
}

/// The run's one latency target for a trial's record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SloTarget {
    /// Known: `--slo`, or set by the reference victim alone, seconds.
    Set(f64),
    /// This trial is the reference victim alone: [`DEFAULT_SLO_FACTOR`] × its own p99.
    FromThisVictim,
    /// The reference was not measured: no target.
    Unset,
}

/// The target of a run's trials when `--slo` gave none (pure): the one the first victim
/// alone measured set, [`DEFAULT_SLO_FACTOR`] × its p99 (exclusive's, whose trials come
/// first, where the run has it and it ran), once there is one.
pub fn common_target(records: &[IsolationRecord]) -> SloTarget {
    records
        .iter()
        .find(|r| r.scenario == "alone" && r.victim_status == CellStatus::Ok && r.slo_s.is_some())
        .and_then(|r| r.slo_s)
        .map_or(SloTarget::Unset, SloTarget::Set)
}

/// After a fault or a kill: did the strategy serve the victim again?
#[derive(Debug, Clone, PartialEq)]
pub enum Recovery {
    /// The victim never stopped serving.
    NotNeeded,
    /// A replacement victim was ready this long after the victim's exit was seen.
    Ready(std::time::Duration),
    /// The replacement did not serve: what became of it.
    Failed(String),
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
/// alone (None for the baseline itself); `target` the run's latency target.
pub fn record(
    run_id: &str,
    trial: &Trial,
    seen: &Observed,
    alone: Option<&IsolationRecord>,
    target: SloTarget,
    mps_split: Option<String>,
) -> IsolationRecord {
    let victim_name = trial.victim_name();
    let victim_pod = seen.pods.iter().find(|p| p.name == victim_name);
    let (victim_status, victim_exit_code, victim_note) = match victim_pod {
        Some(p) => pod_status(&p.state, &None),
        None => (CellStatus::Failed, None, "the victim was not launched".into()),
    };
    let h = seen.victim.as_ref().filter(|h| h.count > 0.0);
    // Serving but unmeasured is no baseline and no result: it failed to be measured.
    let (victim_status, victim_note) = match (victim_status, h) {
        (CellStatus::Ok, None) => (
            CellStatus::Failed,
            "the victim was serving but no inference was measured (its metrics could not be read, or it served none)"
                .to_string(),
        ),
        other => (other.0, victim_note),
    };
    let p99 = h.and_then(|h| finite(h.quantile(0.99)));
    let mean = h.and_then(|h| finite(h.mean()));
    let slo = match target {
        SloTarget::Set(s) => Some(s),
        SloTarget::FromThisVictim => p99.map(|p| p * DEFAULT_SLO_FACTOR),
        SloTarget::Unset => None,
    };
    // Kept up with its load? Judged as a sweep's pods are, while it served.
    let behind = match (h, seen.victim_offered) {
        (Some(h), Some(offered)) if seen.victim_secs > 0.0 => Some(crate::sweep::cell::fell_behind(
            offered,
            h.count / seen.victim_secs,
            seen.victim_secs,
            &seen.victim_backlog,
            seen.victim_errors,
        )),
        _ => None,
    };
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
        scenario: trial.scenario_name().to_string(),
        strategy: trial.strategy,
        aggressors: trial.aggressors,
        victim_status,
        victim_exit_code,
        victim_inferences: h.map(|h| h.count as u64),
        victim_mean_s: mean,
        victim_p50_s: h.and_then(|h| finite(h.quantile(0.5))),
        victim_p99_s: p99,
        victim_p50_low_s: h.and_then(|h| h.quantile_interval(0.5).0),
        victim_p50_high_s: h.and_then(|h| h.quantile_interval(0.5).1),
        victim_p99_low_s: h.and_then(|h| h.quantile_interval(0.99).0),
        victim_p99_high_s: h.and_then(|h| h.quantile_interval(0.99).1),
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
        recovery_s: match &seen.recovery {
            Some(Recovery::Ready(d)) => Some(d.as_secs_f64()),
            _ => None,
        },
        recovery: match &seen.recovery {
            None => String::new(),
            Some(Recovery::NotNeeded) => "not needed: the victim kept serving".into(),
            Some(Recovery::Ready(d)) => format!(
                "a new victim was warm and ready {:.1} s after the old one's exit was seen",
                d.as_secs_f64()
            ),
            Some(Recovery::Failed(why)) => format!("a new victim did not serve: {why}"),
        },
        mps_split,
        note: {
            let mut note = victim_note;
            let add = |note: &mut String, text: &str| crate::sweep::cell::add_note(note, text);
            if seen.victim_errors >= 1.0 {
                add(
                    &mut note,
                    &format!(
                        "the victim counted {:.0} errors over the measurement (failed or dropped inferences or requests), which add no latency",
                        seen.victim_errors
                    ),
                );
            }
            if let Some(Some(why)) = &behind
                && seen.victim_errors < 1.0
            {
                add(&mut note, &format!("the victim: {why}"));
            }
            if let Some(t) = seen.victim_died_after {
                add(
                    &mut note,
                    &format!("the victim exited {t:.1} s into its measurement: its numbers cover that time only"),
                );
            }
            if slo.is_none() && h.is_some() {
                add(
                    &mut note,
                    "no latency target: no victim alone was measured before this trial to set one (--slo gives one)",
                );
            }
            note
        },
        victim_kept_up: behind.map(|b| b.is_none()),
        victim_died_after_s: seen.victim_died_after,
        p99_over_capped: None,
    }
}

/// Whether `record` is the record of `trial`.
pub fn is_record_of(record: &IsolationRecord, trial: &Trial) -> bool {
    record.strategy == trial.strategy
        && record.aggressors == trial.aggressors
        && record.scenario == trial.scenario_name()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::Strategy;
    use crate::isolation::plan::{IsolationSettings, Scenario, trials};
    use crate::results::isolation::{isolation_jsonl, parse_isolation_jsonl};

    fn trial(scenario: Option<Scenario>, strategy: Strategy) -> Trial {
        trials(&IsolationSettings {
            scenarios: Scenario::ALL.to_vec(),
            strategies: vec![strategy],
            victim_rate: 100.0,
            noisy_aggressors: vec![1],
            event_after: Duration::from_secs(10),
            memory_total_bytes: Some(80 << 30),
            own_victim: false,
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
                ..Observed::nothing(vec![pod("victim", PodState::Running)])
            },
            None,
            SloTarget::Unset,
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
                victim_errors: 12.0,
                victim: Some(spread(2.0)),
                ..Observed::nothing(vec![
                    pod("victim", PodState::Running),
                    pod("aggressor-1", PodState::Running),
                ])
            },
            Some(&alone),
            SloTarget::Set(alone.victim_p99_s.expect("p99") * DEFAULT_SLO_FACTOR),
            None,
        );
        assert!((noisy.p99_inflation.expect("inflation") - 2.0).abs() < 1e-9);
        assert!((noisy.mean_inflation.expect("inflation") - 2.0).abs() < 1e-9);
        // SLO 1.5 × 9.9 ms = 14.85 ms: 74.25% of a uniform (0, 20 ms] spread.
        assert!((noisy.slo_s.expect("slo") - 0.01485).abs() < 1e-12);
        assert!((noisy.slo_attainment.expect("attainment") - 0.7425).abs() < 1e-9);
        assert_eq!((noisy.survivors, noisy.started), (2, 2));
        assert_eq!(noisy.aggressor_outcome, "aggressor-1 serving");
        // Errors add no latency: they are said.
        assert!(
            noisy.note.contains("the victim counted 12 errors over the measurement"),
            "{}",
            noisy.note
        );
        // The reference victim alone sets the target from its own p99; another
        // strategy's does not, and the trials wait for the reference's.
        assert_eq!(alone.slo_s, None);
        assert!(alone.note.contains("no latency target"), "{}", alone.note);
        let ex = record(
            "r",
            &trial(None, Strategy::Exclusive),
            &Observed {
                victim: Some(spread(1.0)),
                ..Observed::nothing(vec![pod("victim", PodState::Running)])
            },
            None,
            SloTarget::FromThisVictim,
            None,
        );
        assert!((ex.slo_s.expect("its own target") - 0.01485).abs() < 1e-12);
        assert_eq!(
            common_target(&[alone.clone(), ex.clone()]),
            SloTarget::Set(ex.slo_s.expect("target")),
            "the first victim alone that set a target"
        );
        assert_eq!(common_target(std::slice::from_ref(&alone)), SloTarget::Unset);
        assert!(ex.note.is_empty(), "{}", ex.note);
    }

    #[test]
    fn a_victim_behind_its_load_is_said_and_one_that_kept_up_too() {
        let t = trial(Some(Scenario::NoisyNeighbour), Strategy::TimeSlicing);
        // spread(): 100 requests; over 1 s at 100/s offered it kept up, at 200/s not.
        let seen = |offered: f64, backlog: Vec<f64>| Observed {
            victim: Some(spread(1.0)),
            victim_secs: 1.0,
            victim_offered: Some(offered),
            victim_backlog: backlog,
            ..Observed::nothing(vec![pod("victim", PodState::Running)])
        };
        let kept = record(
            "r",
            &t,
            &seen(100.0, vec![2.0, 3.0, 1.0, 2.0]),
            None,
            SloTarget::Set(0.01),
            None,
        );
        assert_eq!(kept.victim_kept_up, Some(true));
        assert!(!kept.outcome_text().contains("fell behind"));
        let behind = record(
            "r",
            &t,
            &seen(100.0, vec![0.0, 40.0, 80.0, 120.0]),
            None,
            SloTarget::Set(0.01),
            None,
        );
        assert_eq!(behind.victim_kept_up, Some(false));
        assert!(behind.note.contains("the victim: its backlog grew"), "{}", behind.note);
        assert!(behind.outcome_text().contains("victim fell behind its load"));
        let slow = record("r", &t, &seen(200.0, Vec::new()), None, SloTarget::Set(0.01), None);
        assert_eq!(slow.victim_kept_up, Some(false));
        assert!(slow.note.contains("judged by throughput"), "{}", slow.note);
        // A server of the user's own making its own load is not judged.
        let unjudged = Observed {
            victim_offered: None,
            ..seen(100.0, Vec::new())
        };
        assert_eq!(
            record("r", &t, &unjudged, None, SloTarget::Set(0.01), None).victim_kept_up,
            None
        );
    }

    #[test]
    fn a_victim_that_dies_of_its_neighbours_fault_is_recorded_with_its_exit_code() {
        let fault = record(
            "r",
            &trial(Some(Scenario::Fault), Strategy::Mps),
            &Observed {
                victim: Some(spread(1.0)),
                victim_died_after: Some(12.25),
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
                ..Observed::nothing(Vec::new())
            },
            None,
            SloTarget::Set(0.02),
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
        // Its numbers are marked as those of the time before its exit.
        assert_eq!(fault.victim_died_after_s, Some(12.25));
        assert!(
            fault.note.contains("exited 12.2 s into its measurement"),
            "{}",
            fault.note
        );
        assert!(
            fault
                .outcome_text()
                .starts_with("victim failed (exit 5) 12.2 s in, numbers until then"),
            "{}",
            fault.outcome_text()
        );
        // Exclusive: the aggressor is pending, not started.
        let ex = record(
            "r",
            &trial(Some(Scenario::Crash), Strategy::Exclusive),
            &Observed::nothing(vec![
                pod("victim", PodState::Running),
                pod("aggressor-1", PodState::Pending("the GPU is taken".into())),
            ]),
            None,
            SloTarget::Unset,
            None,
        );
        assert_eq!((ex.survivors, ex.started, ex.victim_inferences), (1, 1, None));
        // Serving but unmeasured: no baseline, no result.
        assert_eq!(ex.victim_status, CellStatus::Failed);
        assert!(ex.note.contains("no inference was measured"), "{}", ex.note);
        assert_eq!(ex.aggressor_outcome, "aggressor-1 pending");
    }

    #[test]
    fn records_read_back_are_checked_with_line_and_field() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h100-isolation");
        let run = crate::results::store::read_run(&dir.join("run.json")).expect("run");
        let text = std::fs::read_to_string(dir.join("isolation.jsonl")).expect("records");
        let path = dir.join("isolation.jsonl");
        let all = parse_isolation_jsonl(&text, &path, &run).expect("the real run reads back");
        assert_eq!(all.len(), 28);
        let written = String::from_utf8(isolation_jsonl(&all)).expect("utf-8");
        if let Some((a, b)) = written.lines().zip(text.lines()).find(|(a, b)| a != b) {
            panic!("written differs from read:\n{a}\n{b}");
        }
        let first = text.lines().next().expect("line");
        // The first record again as line 2, with one field changed.
        let bad = |field: &str, to: serde_json::Value| {
            let mut v: serde_json::Value = serde_json::from_str(first).expect("json");
            v[field] = to;
            parse_isolation_jsonl(&format!("{first}\n{v}\n"), &path, &run)
                .expect_err(field)
                .to_string()
        };
        let meteor = bad("scenario", "meteor".into());
        assert!(
            meteor.contains("line 2: scenario \"meteor\" is not in run.json's isolation plan"),
            "{meteor}"
        );
        let twice = bad("note", "".into());
        assert!(
            twice.contains("line 2: a second record of exclusive alone × 0"),
            "{twice}"
        );
        let neg = bad("victim_mean_s", (-1.5).into());
        assert!(
            neg.contains("line 2: victim_mean_s = -1.5: must be a finite number ≥ 0"),
            "{neg}"
        );
        let swapped = bad("victim_p50_s", 0.5.into());
        assert!(
            swapped.contains("line 2: victim_p50_s 0.5 is above victim_p99_s"),
            "{swapped}"
        );
        let huge = bad("aggressors", 4294967295u64.into());
        assert!(
            huge.contains("line 2: aggressors 4294967295 is outside 0 to 63"),
            "{huge}"
        );
        let nine = bad("survivors", 9.into());
        assert!(nine.contains("9 survivors and 1 started of 1 pods"), "{nine}");
        // A sweep's run.json plans no isolation: its records are refused.
        let mut sweep = run.clone();
        sweep.kind = crate::config::plan::RunKind::Sweep;
        assert!(
            parse_isolation_jsonl(first, &path, &sweep).is_ok(),
            "alone is always known"
        );
        let noisy = text.lines().nth(1).expect("line 2");
        assert!(
            parse_isolation_jsonl(noisy, &path, &sweep)
                .expect_err("no plan")
                .to_string()
                .contains("is not in run.json's isolation plan")
        );
    }
}
