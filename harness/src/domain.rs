//! The words of the domain: sharing strategies, cell outcomes, metric sources, devices.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::BenchError;

/// How pods share one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// No sharing: one pod gets the GPU, the others wait (the baseline).
    Exclusive,
    /// Pods share by the driver's time-slicing of contexts.
    TimeSlicing,
    /// Pods share through the Multi-Process Service.
    Mps,
    /// Pods get their own Multi-Instance GPU partition.
    Mig,
}

impl Strategy {
    /// All strategies in sweep order.
    pub const ALL: [Strategy; 4] = [Strategy::Exclusive, Strategy::TimeSlicing, Strategy::Mps, Strategy::Mig];

    /// The name on the command line, in files and in labels.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Exclusive => "exclusive",
            Strategy::TimeSlicing => "time-slicing",
            Strategy::Mps => "mps",
            Strategy::Mig => "mig",
        }
    }

    /// The name in tables.
    pub fn title(self) -> &'static str {
        match self {
            Strategy::Exclusive => "Exclusive",
            Strategy::TimeSlicing => "Time-slicing",
            Strategy::Mps => "MPS",
            Strategy::Mig => "MIG",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| BenchError::flag("--strategies", s, "expected exclusive, time-slicing, mps or mig"))
    }
}

/// The DRA driver's time-slice interval for a claim's GPU (`--timeslice`): its
/// `TimeSliceInterval` (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1,
/// `api/nvidia.com/resource/v1beta1/sharing.go`), which it applies with `nvidia-smi
/// compute-policy --set-timeslice` 0 to 3 at prepare and resets to 0 at unprepare. In
/// records and on the command line spelled in lower case; the claim's config spells it
/// as the driver does (`backend::k8s::dra_claims`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeSliceInterval {
    /// `Default` (0).
    Default,
    /// `Short` (1).
    Short,
    /// `Medium` (2).
    Medium,
    /// `Long` (3).
    Long,
}

impl TimeSliceInterval {
    /// Every interval, in the driver's order (0 to 3).
    pub const ALL: [TimeSliceInterval; 4] = [Self::Default, Self::Short, Self::Medium, Self::Long];

    /// The flag's spelling (`default`, `short`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Short => "short",
            Self::Medium => "medium",
            Self::Long => "long",
        }
    }

    /// The driver's spelling in a `GpuConfig` (`Default`, `Short`, ...).
    pub fn driver_name(self) -> &'static str {
        match self {
            Self::Default => "Default",
            Self::Short => "Short",
            Self::Medium => "Medium",
            Self::Long => "Long",
        }
    }
}

impl FromStr for TimeSliceInterval {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|i| i.name() == s.trim())
            .ok_or_else(|| "expected default, short, medium or long (the DRA driver's time-slice intervals)".into())
    }
}

impl fmt::Display for TimeSliceInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one row group of a sweep runs: a strategy and, for time-slicing through the DRA
/// driver with `--timeslice`, the interval its claim sets (each interval its own rows,
/// its own 1-pod baseline and its own line in the charts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arm {
    /// The sharing strategy.
    pub strategy: Strategy,
    /// Time-slicing through DRA: the claim's interval (None: no interval set).
    pub timeslice: Option<TimeSliceInterval>,
}

impl Arm {
    /// A strategy with nothing more to it.
    pub const fn of(strategy: Strategy) -> Arm {
        Arm {
            strategy,
            timeslice: None,
        }
    }

    /// The name in files, labels and object names (`time-slicing-short`).
    pub fn name(self) -> String {
        match self.timeslice {
            None => self.strategy.name().to_string(),
            Some(t) => format!("{}-{}", self.strategy.name(), t.name()),
        }
    }

    /// The name in tables and charts (`Time-slicing (short)`).
    pub fn title(self) -> String {
        match self.timeslice {
            None => self.strategy.title().to_string(),
            Some(t) => format!("{} ({})", self.strategy.title(), t.name()),
        }
    }
}

/// The arms of a sweep in order: each strategy once, time-slicing once per interval
/// when `timeslices` names any (pure).
pub fn arms(strategies: &[Strategy], timeslices: &[TimeSliceInterval]) -> Vec<Arm> {
    strategies
        .iter()
        .flat_map(|&strategy| match strategy {
            Strategy::TimeSlicing if !timeslices.is_empty() => timeslices
                .iter()
                .map(|&t| Arm {
                    strategy,
                    timeslice: Some(t),
                })
                .collect(),
            _ => vec![Arm::of(strategy)],
        })
        .collect()
}

impl From<Strategy> for Arm {
    fn from(strategy: Strategy) -> Arm {
        Arm::of(strategy)
    }
}

impl fmt::Display for Arm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// What happened to a pod or a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CellStatus {
    /// Measured.
    Ok,
    /// The strategy cannot run here (reason in `note`).
    Unavailable,
    /// A pod crashed or never became ready.
    Failed,
    /// The pod could not be scheduled / given a GPU.
    Pending,
    /// A pod ran out of GPU memory.
    Oom,
}

impl CellStatus {
    /// The name in files.
    pub fn name(self) -> &'static str {
        match self {
            CellStatus::Ok => "ok",
            CellStatus::Unavailable => "unavailable",
            CellStatus::Failed => "failed",
            CellStatus::Pending => "pending",
            CellStatus::Oom => "oom",
        }
    }
}

impl fmt::Display for CellStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the numbers came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The harness scraped each pod's /metrics.
    Scrape,
    /// The harness queried a Prometheus server.
    Prometheus,
    /// The harness sent the requests and timed each (`--request`).
    Client,
}

/// What the workload computed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// An NVIDIA GPU.
    Cuda,
    /// The CPU (smoke pipeline): not a GPU measurement.
    Cpu,
}

impl DeviceKind {
    /// The name in files.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cuda => "cuda",
            DeviceKind::Cpu => "cpu",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_name_their_interval_and_intervals_round_trip() {
        let plain = Arm::of(Strategy::TimeSlicing);
        let short = Arm {
            timeslice: Some(TimeSliceInterval::Short),
            ..plain
        };
        assert_eq!(
            (plain.name(), plain.title()),
            ("time-slicing".into(), "Time-slicing".into())
        );
        assert_eq!(
            (short.name(), short.title()),
            ("time-slicing-short".into(), "Time-slicing (short)".into())
        );
        for t in TimeSliceInterval::ALL {
            assert_eq!(t.name().parse::<TimeSliceInterval>(), Ok(t));
            assert_eq!(serde_json::to_string(&t).ok(), Some(format!("\"{}\"", t.name())));
            assert_eq!(t.driver_name().to_lowercase(), t.name());
        }
        assert!("Long".parse::<TimeSliceInterval>().is_err(), "the flag is lower case");
        let names: Vec<String> = arms(
            &[Strategy::Exclusive, Strategy::TimeSlicing, Strategy::Mps],
            &[TimeSliceInterval::Long, TimeSliceInterval::Default],
        )
        .into_iter()
        .map(Arm::name)
        .collect();
        assert_eq!(
            names,
            ["exclusive", "time-slicing-long", "time-slicing-default", "mps"],
            "the flag's order"
        );
        assert_eq!(arms(&[Strategy::TimeSlicing], &[]), vec![plain]);
    }

    #[test]
    fn strategy_names_round_trip_and_bad_ones_are_named() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>().ok(), Some(s));
            assert_eq!(serde_json::to_string(&s).ok(), Some(format!("\"{}\"", s.name())));
        }
        let e = "timeslicing"
            .parse::<Strategy>()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            e,
            "bad --strategies `timeslicing`: expected exclusive, time-slicing, mps or mig"
        );
    }
}
