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
