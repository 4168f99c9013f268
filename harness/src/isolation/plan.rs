//! The trials of an isolation run, planned as pure functions: per strategy (exclusive
//! first), the victim alone (the baseline), then per scenario the victim beside its aggressors, each pod
//! with the workload arguments that make it what it is. A backend launches a trial's
//! pods in order (the victim first, so under exclusive it is the pod that gets the GPU
//! and the aggressors stay pending).

use std::time::Duration;

pub use crate::config::isolation::{
    DEFAULT_AGGRESSORS, DEFAULT_EVENT_AFTER, DEFAULT_OBSERVE, DEFAULT_VICTIM_RATE, IsolationPlan, Scenario,
    VICTIM_GROWS_AFTER, scenario_label,
};
use crate::domain::{MpsLimits, MpsMemory, MpsThreads, Strategy};
use crate::error::{BenchError, Result};

/// A pod's part in a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The pod whose service is judged.
    Victim,
    /// A pod that loads, squeezes, faults or dies.
    Aggressor,
}

/// One pod of a trial.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialPod {
    /// The `pod` label: `victim`, `aggressor-1`, …
    pub name: String,
    /// Its part.
    pub role: Role,
    /// Workload arguments added to the run's own (what makes it a victim or an
    /// aggressor: every backend runs the same pods, differing only by these).
    pub args: Vec<String>,
}

/// One trial: a strategy, a scenario (None: the victim alone), its pods.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// The sharing strategy.
    pub strategy: Strategy,
    /// The scenario; None for the baseline, the victim alone.
    pub scenario: Option<Scenario>,
    /// Aggressors beside the victim; for the MPS victim alone under a trial's limits
    /// ([`CAPPED`]), the aggressors of the trials whose limits it has.
    pub aggressors: u32,
    /// The victim first, then the aggressors.
    pub pods: Vec<TrialPod>,
    /// MPS: the client limits (`auto`: the split over the trial's pods; the capped
    /// victim alone: those it gets beside `aggressors` aggressors).
    pub mps: MpsLimits,
}

pub use crate::results::isolation::CAPPED;

impl Trial {
    /// What the trial is, for progress lines: "MPS · noisy neighbour × 3 aggressors".
    pub fn title(&self) -> String {
        format!(
            "{} · {}",
            self.strategy.title(),
            scenario_label(self.scenario_name(), self.aggressors)
        )
    }

    /// The scenario as records name it: `alone`, [`CAPPED`], or the scenario's name.
    pub fn scenario_name(&self) -> &'static str {
        match self.scenario {
            Some(s) => s.name(),
            None if !self.mps.is_auto() => CAPPED,
            None => "alone",
        }
    }

    /// The victim's `pod` label.
    pub fn victim_name(&self) -> &str {
        self.pods
            .iter()
            .find(|p| p.role == Role::Victim)
            .map_or("victim", |p| p.name.as_str())
    }
}

/// What the trials are made of.
#[derive(Debug, Clone, PartialEq)]
pub struct IsolationSettings {
    /// Scenarios, in order.
    pub scenarios: Vec<Scenario>,
    /// Strategies, in order.
    pub strategies: Vec<Strategy>,
    /// The victim's open-loop load, inferences per second.
    pub victim_rate: f64,
    /// Aggressor counts of the noisy-neighbour scenario.
    pub noisy_aggressors: Vec<u32>,
    /// When the aggressor faults, is killed or grows, after the pods are ready (it
    /// leaves the warm-up and a few windows of undisturbed service before).
    pub event_after: Duration,
    /// The GPU's memory (None on the CPU: the memory scenario uses small sizes there).
    pub memory_total_bytes: Option<u64>,
    /// The victim is a server of the user's own (`--workload-cmd`): it runs as it is,
    /// without gpushare-workload's arguments (its load is the harness's requests; in
    /// the memory scenario it does not ask for more), and the aggressors run
    /// gpushare-workload (`PodSpec::builtin`).
    pub own_victim: bool,
}

impl IsolationSettings {
    /// The settings [`trials`] plans from `plan`, for `strategies` on a GPU of
    /// `memory_total_bytes` (None: the CPU).
    /// `own_victim`: the pods are a server of the user's own.
    pub fn new(
        plan: &IsolationPlan,
        strategies: &[Strategy],
        memory_total_bytes: Option<u64>,
        own_victim: bool,
    ) -> Self {
        IsolationSettings {
            scenarios: plan.scenarios.clone(),
            strategies: strategies.to_vec(),
            victim_rate: plan.victim_rate,
            noisy_aggressors: plan.aggressors.clone(),
            event_after: Duration::from_secs_f64(plan.event_after_s),
            memory_total_bytes,
            own_victim,
        }
    }
}

/// The memory the memory-pressure aggressor takes, then the victim asks for, as
/// fractions of the GPU's memory: together more than the GPU has, each less than half
/// (what an MPS client is pinned to with two clients), so time-slicing cannot serve
/// both and MPS' limits decide who fails.
pub const AGGRESSOR_MEMORY: f64 = 0.70;
/// See [`AGGRESSOR_MEMORY`].
pub const VICTIM_MEMORY: f64 = 0.35;
// Two MPS clients are pinned to half the memory each: above the victim's ask, below the
// aggressor's; together the asks exceed the GPU. The memory scenario is built on this.
const _: () = assert!(AGGRESSOR_MEMORY > 0.5 && VICTIM_MEMORY < 0.5 && AGGRESSOR_MEMORY + VICTIM_MEMORY > 1.0);
/// On the CPU (no GPU memory to share): small fixed sizes, a test of the pipeline.
pub const CPU_AGGRESSOR_BYTES: u64 = 64 << 20;
/// See [`CPU_AGGRESSOR_BYTES`].
pub const CPU_VICTIM_BYTES: u64 = 32 << 20;

fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// The victim: gpushare-workload at `rate` with `extra`, or (`own`) a server of the
/// user's own as it is.
fn victim(rate: f64, extra: &[String], own: bool) -> TrialPod {
    let mut args = vec!["--load".to_string(), format!("poisson:{rate}")];
    args.extend(extra.iter().cloned());
    if own {
        args.clear();
    }
    TrialPod {
        name: "victim".into(),
        role: Role::Victim,
        args,
    }
}

fn aggressor(i: u32, args: Vec<String>) -> TrialPod {
    TrialPod {
        name: format!("aggressor-{i}"),
        role: Role::Aggressor,
        args,
    }
}

/// Every trial, strategy by strategy (exclusive first, the others in their order): the
/// victim alone, then each scenario's (the noisy neighbour once per aggressor count).
/// Errors name the bad setting.
pub fn trials(s: &IsolationSettings) -> Result<Vec<Trial>> {
    if !(s.victim_rate.is_finite() && s.victim_rate > 0.0) {
        return Err(BenchError::flag(
            "--victim-rate",
            &s.victim_rate.to_string(),
            "expected inferences per second above 0",
        ));
    }
    if let Some(k) = s.noisy_aggressors.iter().find(|k| !(1..=63).contains(*k)) {
        return Err(BenchError::flag("--aggressors", &k.to_string(), "expected 1 to 63"));
    }
    let mut out = Vec::new();
    // Exclusive's trials first: its victim alone sets the run's one latency target.
    let mut strategies = s.strategies.clone();
    strategies.sort_by_key(|&x| x != Strategy::Exclusive);
    for strategy in strategies {
        let first = out.len();
        out.push(Trial {
            strategy,
            scenario: None,
            aggressors: 0,
            pods: vec![victim(s.victim_rate, &[], s.own_victim)],
            mps: MpsLimits::default(),
        });
        for &scenario in &s.scenarios {
            let one = |victim_extra: Vec<String>, aggressor_args: Vec<String>| Trial {
                strategy,
                scenario: Some(scenario),
                aggressors: 1,
                pods: vec![
                    victim(s.victim_rate, &victim_extra, s.own_victim),
                    aggressor(1, aggressor_args),
                ],
                mps: MpsLimits::default(),
            };
            match scenario {
                Scenario::NoisyNeighbour => {
                    for &k in &s.noisy_aggressors {
                        let mut pods = vec![victim(s.victim_rate, &[], s.own_victim)];
                        pods.extend((1..=k).map(|i| aggressor(i, Vec::new())));
                        out.push(Trial {
                            strategy,
                            scenario: Some(scenario),
                            aggressors: k,
                            pods,
                            mps: MpsLimits::default(),
                        });
                    }
                }
                Scenario::MemoryPressure => {
                    let (a, v) = match s.memory_total_bytes {
                        Some(total) => (
                            (total as f64 * AGGRESSOR_MEMORY) as u64,
                            (total as f64 * VICTIM_MEMORY) as u64,
                        ),
                        None => (CPU_AGGRESSOR_BYTES, CPU_VICTIM_BYTES),
                    };
                    let at = s.event_after;
                    out.push(one(
                        vec![
                            "--grow-memory".into(),
                            format!("{}:{v}", millis(at + VICTIM_GROWS_AFTER)),
                        ],
                        vec!["--grow-memory".into(), format!("{}:{a}", millis(at))],
                    ));
                }
                Scenario::Fault => out.push(one(
                    Vec::new(),
                    vec!["--inject-fault-after".into(), millis(s.event_after)],
                )),
                Scenario::Crash => out.push(one(Vec::new(), vec!["--crash-after".into(), millis(s.event_after)])),
            }
        }
        if strategy == Strategy::Mps {
            // Right after the victim alone: the victim alone again under the limits it
            // gets in each trial, once per aggressor count, so that the cap's cost and
            // the neighbours' can be told apart.
            let mut counts: Vec<u32> = out[first..].iter().map(|t| t.aggressors).filter(|&k| k > 0).collect();
            counts.sort_unstable();
            counts.dedup();
            let capped: Vec<Trial> = counts
                .into_iter()
                .map(|k| Trial {
                    strategy,
                    scenario: None,
                    aggressors: k,
                    pods: vec![victim(s.victim_rate, &[], s.own_victim)],
                    mps: trial_limits(k + 1, s.memory_total_bytes),
                })
                .collect();
            out.splice(first + 1..first + 1, capped);
        }
    }
    Ok(out)
}

/// The limits of the capped victim alone in words, as [`mps_split`] says a trial's.
pub fn capped_split(limits: MpsLimits, clients: u32) -> String {
    let memory = match limits.memory {
        MpsMemory::Mebibytes(m) => format!(" and {m} MiB pinned"),
        _ => String::new(),
    };
    format!(
        "{}% of the SMs{memory}, alone: each client's share with {clients} clients",
        limits.threads.percent(clients)
    )
}

/// The MPS limits each of `clients` clients of a trial gets, explicitly (the device
/// plugin's equal split, as `auto` gives the trial's own pods).
pub fn trial_limits(clients: u32, memory_total_bytes: Option<u64>) -> MpsLimits {
    let n = clients.max(1);
    MpsLimits {
        threads: MpsThreads::Percent(u8::try_from(100 / n).unwrap_or(100).max(1)),
        memory: match MpsMemory::Auto.mebibytes(n, memory_total_bytes) {
            Some(m) => MpsMemory::Mebibytes(u32::try_from(m).unwrap_or(u32::MAX)),
            None => MpsMemory::Auto,
        },
    }
}

/// The MPS limits each client of a trial gets, in the words a report prints: the
/// device plugin's equal split over the trial's pods.
pub fn mps_split(pods: u32, memory_total_bytes: Option<u64>) -> String {
    let n = pods.max(1);
    match memory_total_bytes {
        Some(total) => format!(
            "{}% of the SMs and {} MiB pinned per client ({n} client{})",
            100 / n,
            total / (1 << 20) / u64::from(n),
            if n == 1 { "" } else { "s" }
        ),
        None => format!(
            "{}% of the SMs per client ({n} client{})",
            100 / n,
            if n == 1 { "" } else { "s" }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> IsolationSettings {
        IsolationSettings {
            scenarios: Scenario::ALL.to_vec(),
            strategies: vec![Strategy::TimeSlicing, Strategy::Mps],
            victim_rate: 100.0,
            noisy_aggressors: vec![1, 3, 6],
            event_after: Duration::from_secs(10),
            memory_total_bytes: Some(80 << 30),
            own_victim: false,
        }
    }

    fn args(t: &Trial, pod: usize) -> String {
        t.pods[pod].args.join(" ")
    }

    #[test]
    fn every_strategy_gets_a_baseline_and_each_scenario() {
        let t = trials(&settings()).expect("trials");
        // Per strategy: alone, noisy × 3 counts, memory, fault, crash; MPS also alone
        // under the limits of 1, 3 and 6 aggressors' trials, right after its alone.
        assert_eq!(t.len(), 2 * 7 + 3);
        let mps: Vec<&Trial> = t.iter().filter(|x| x.strategy == Strategy::Mps).collect();
        let names: Vec<(&str, u32)> = mps[..4].iter().map(|x| (x.scenario_name(), x.aggressors)).collect();
        assert_eq!(names, [("alone", 0), (CAPPED, 1), (CAPPED, 3), (CAPPED, 6)]);
        assert_eq!(
            (mps[3].pods.len(), mps[3].mps, mps[3].title()),
            (
                1,
                trial_limits(7, Some(80 << 30)),
                "MPS · victim alone, MPS limits as beside 6 aggressors".to_string()
            )
        );
        assert_eq!(
            trial_limits(7, Some(80 << 30)),
            MpsLimits {
                threads: MpsThreads::Percent(14),
                memory: MpsMemory::Mebibytes(11702)
            }
        );
        assert_eq!(
            capped_split(trial_limits(2, None), 2),
            "50% of the SMs, alone: each client's share with 2 clients"
        );
        let ts: Vec<&Trial> = t.iter().filter(|x| x.strategy == Strategy::TimeSlicing).collect();
        assert_eq!((ts[0].scenario, ts[0].aggressors, ts[0].pods.len()), (None, 0, 1));
        assert_eq!(args(ts[0], 0), "--load poisson:100");
        let noisy: Vec<u32> = ts
            .iter()
            .filter(|x| x.scenario == Some(Scenario::NoisyNeighbour))
            .map(|x| x.aggressors)
            .collect();
        assert_eq!(noisy, [1, 3, 6]);
        let six = ts.iter().find(|x| x.aggressors == 6).expect("six");
        assert_eq!(six.pods.len(), 7);
        assert_eq!(six.pods[0].role, Role::Victim, "the victim first");
        assert!(
            six.pods[1..]
                .iter()
                .all(|p| p.role == Role::Aggressor && p.args.is_empty())
        );
        assert_eq!(six.pods[6].name, "aggressor-6");
    }

    #[test]
    fn a_server_of_ones_own_is_a_victim_without_arguments_beside_the_same_aggressors() {
        let own = trials(&IsolationSettings {
            own_victim: true,
            ..settings()
        })
        .expect("trials");
        let plain = trials(&settings()).expect("trials");
        assert_eq!(own.len(), plain.len());
        for (o, p) in own.iter().zip(&plain) {
            assert!(o.pods[0].args.is_empty(), "{:?}", o.pods[0]);
            assert!(!p.pods[0].args.is_empty());
            assert_eq!(o.pods[1..], p.pods[1..], "the aggressors do not change");
        }
    }

    #[test]
    fn each_scenario_is_made_of_workload_arguments() {
        let t = trials(&settings()).expect("trials");
        let find = |s| {
            t.iter()
                .find(|x| x.strategy == Strategy::Mps && x.scenario == Some(s))
                .expect("trial")
        };
        let mem = find(Scenario::MemoryPressure);
        let (a, v) = ((80u64 << 30) * 7 / 10, (80u64 << 30) * 35 / 100);
        assert_eq!(args(mem, 1), format!("--grow-memory 10000ms:{a}"));
        assert_eq!(args(mem, 0), format!("--load poisson:100 --grow-memory 15000ms:{v}"));
        let fault = find(Scenario::Fault);
        assert_eq!(args(fault, 1), "--inject-fault-after 10000ms");
        assert_eq!(args(fault, 0), "--load poisson:100");
        let crash = find(Scenario::Crash);
        assert_eq!(args(crash, 1), "--crash-after 10000ms");
        // On the CPU: small sizes.
        let cpu = trials(&IsolationSettings {
            memory_total_bytes: None,
            own_victim: false,
            ..settings()
        })
        .expect("trials");
        let mem = cpu
            .iter()
            .find(|x| x.scenario == Some(Scenario::MemoryPressure))
            .expect("memory");
        assert_eq!(args(mem, 1), format!("--grow-memory 10000ms:{}", 64u64 << 20));
    }

    #[test]
    fn bad_settings_and_names_are_one_line_errors() {
        let e = trials(&IsolationSettings {
            victim_rate: 0.0,
            ..settings()
        })
        .expect_err("rate 0")
        .to_string();
        assert_eq!(e, "bad --victim-rate `0`: expected inferences per second above 0");
        let e = trials(&IsolationSettings {
            noisy_aggressors: vec![1, 64],
            ..settings()
        })
        .expect_err("64 aggressors")
        .to_string();
        assert_eq!(e, "bad --aggressors `64`: expected 1 to 63");
        let e = "noisy".parse::<Scenario>().expect_err("name");
        assert_eq!(e, "expected noisy-neighbour, memory-pressure, fault or crash");
        for s in Scenario::ALL {
            assert_eq!(s.name().parse::<Scenario>().ok(), Some(s));
        }
    }

    #[test]
    fn the_mps_split_is_the_device_plugins() {
        assert_eq!(
            mps_split(2, Some(80 << 30)),
            "50% of the SMs and 40960 MiB pinned per client (2 clients)"
        );
        assert_eq!(mps_split(7, None), "14% of the SMs per client (7 clients)");
    }
}
