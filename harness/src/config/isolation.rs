//! An isolation run's own plan as the command line and run.json give it: the scenarios,
//! the victim's load and the aggressor counts (the trials are planned in `isolation`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};

/// A trial's name in reports: "victim alone", "noisy neighbour × 3 aggressors",
/// "memory pressure" (`scenario` as recorded: a [`Scenario::name`] or `alone`).
pub fn scenario_label(scenario: &str, aggressors: u32) -> String {
    match scenario {
        "alone" => "victim alone".into(),
        "alone-capped" => format!(
            "victim alone, MPS limits as beside {aggressors} aggressor{}",
            if aggressors == 1 { "" } else { "s" }
        ),
        "noisy-neighbour" => format!(
            "noisy neighbour × {aggressors} aggressor{}",
            if aggressors == 1 { "" } else { "s" }
        ),
        other => other.replace('-', " "),
    }
}

/// What the aggressors do to the victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// K aggressors run closed loop while the victim serves an open-loop load.
    NoisyNeighbour,
    /// An aggressor takes most of the GPU's memory; then the victim needs more.
    MemoryPressure,
    /// An aggressor's kernel writes through an unmapped address.
    Fault,
    /// An aggressor is killed with SIGKILL mid-load (`gpushare-workload --crash-after`).
    Crash,
}

impl Scenario {
    /// Every scenario, in report order.
    pub const ALL: [Scenario; 4] = [
        Scenario::NoisyNeighbour,
        Scenario::MemoryPressure,
        Scenario::Fault,
        Scenario::Crash,
    ];

    /// The name on the command line and in records.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::NoisyNeighbour => "noisy-neighbour",
            Scenario::MemoryPressure => "memory-pressure",
            Scenario::Fault => "fault",
            Scenario::Crash => "crash",
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scenario {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Scenario::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| "expected noisy-neighbour, memory-pressure, fault or crash".to_string())
    }
}

/// An isolation run's own plan, recorded in run.json (`isolation`) beside the sweep
/// plan its pods are made from: what `--resume` continues and the report reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IsolationPlan {
    /// Scenarios, in order.
    pub scenarios: Vec<Scenario>,
    /// The victim's open-loop load, inferences per second.
    pub victim_rate: f64,
    /// Aggressor counts of the noisy-neighbour scenario.
    pub aggressors: Vec<u32>,
    /// Seconds after the pods are ready when an aggressor grows, faults or is killed.
    pub event_after_s: f64,
    /// Seconds the victim is followed after that.
    pub observe_s: f64,
    /// The victim's latency target, seconds (None: 1.5 × its p99 alone).
    pub slo_s: Option<f64>,
    /// On Kubernetes beside a server of the user's own: the image the aggressors run
    /// (None: gpushare-workload's default image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggressor_image: Option<String>,
}

/// Defaults of the `isolation` command.
pub const DEFAULT_VICTIM_RATE: f64 = 50.0;
/// See [`DEFAULT_VICTIM_RATE`].
pub const DEFAULT_AGGRESSORS: [u32; 3] = [1, 3, 6];
/// See [`DEFAULT_VICTIM_RATE`].
pub const DEFAULT_EVENT_AFTER: Duration = Duration::from_secs(15);
/// See [`DEFAULT_VICTIM_RATE`]: longer than [`VICTIM_GROWS_AFTER`], so the memory
/// scenario's victim asks for its memory inside the observation.
pub const DEFAULT_OBSERVE: Duration = Duration::from_secs(15);

impl IsolationPlan {
    /// Checks a plan (from flags or a run.json read back): errors name the flag.
    pub fn validate(&self, warmup: Duration) -> Result<()> {
        if self.scenarios.is_empty() {
            return Err(BenchError::flag("--scenarios", "", "name at least one scenario"));
        }
        if let Some(dup) = self
            .scenarios
            .iter()
            .enumerate()
            .find(|(i, s)| self.scenarios[..*i].contains(s))
        {
            return Err(BenchError::flag("--scenarios", dup.1.name(), "named twice"));
        }
        if !(self.victim_rate.is_finite() && self.victim_rate > 0.0 && self.victim_rate <= 100_000.0) {
            return Err(BenchError::flag(
                "--victim-rate",
                &self.victim_rate.to_string(),
                "expected inferences per second above 0 (at most 100000)",
            ));
        }
        if self.aggressors.is_empty() {
            return Err(BenchError::flag(
                "--aggressors",
                "",
                "name at least one aggressor count",
            ));
        }
        if let Some(k) = self.aggressors.iter().find(|k| !(1..=63).contains(*k)) {
            return Err(BenchError::flag("--aggressors", &k.to_string(), "expected 1 to 63"));
        }
        let secs = |v: f64| v.is_finite() && v > 0.0 && v <= 3600.0;
        if !secs(self.event_after_s) || Duration::from_secs_f64(self.event_after_s) <= warmup {
            return Err(BenchError::flag(
                "--event-after",
                &format!("{}s", self.event_after_s),
                format!(
                    "expected a time after the warm-up ({} s) and at most 1 h: the victim's undisturbed service comes first",
                    warmup.as_secs_f64()
                ),
            ));
        }
        if !secs(self.observe_s) || self.observe_s <= VICTIM_GROWS_AFTER.as_secs_f64() {
            return Err(BenchError::flag(
                "--observe",
                &format!("{}s", self.observe_s),
                format!(
                    "expected more than {} s (the memory scenario's victim asks for its memory {} s after the event) and at most 1 h",
                    VICTIM_GROWS_AFTER.as_secs(),
                    VICTIM_GROWS_AFTER.as_secs()
                ),
            ));
        }
        if let Some(slo) = self.slo_s
            && !(slo.is_finite() && slo > 0.0)
        {
            return Err(BenchError::flag(
                "--slo",
                &format!("{slo}s"),
                "expected a latency above 0",
            ));
        }
        Ok(())
    }

    /// Every pod count a trial of this plan launches (the victim and its aggressors),
    /// ascending: the run's `plan.pods`.
    pub fn pod_counts(&self) -> Vec<u32> {
        let mut n = vec![1];
        for s in &self.scenarios {
            match s {
                Scenario::NoisyNeighbour => n.extend(self.aggressors.iter().map(|k| k + 1)),
                _ => n.push(2),
            }
        }
        n.sort_unstable();
        n.dedup();
        n
    }
}

/// How long after the aggressor's growth the victim asks for its memory.
pub const VICTIM_GROWS_AFTER: Duration = Duration::from_secs(5);
