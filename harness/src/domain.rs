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

/// Serde through the type's text (`Display` and `FromStr`), as flags spell it: the
/// `From`/`TryFrom` pair that `#[serde(into = "String", try_from = "String")]` needs.
macro_rules! text_serde {
    ($t:ty) => {
        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.to_string()
            }
        }

        impl TryFrom<String> for $t {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                s.parse()
            }
        }
    };
}

/// An MPS client's share of the SMs, its `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`
/// (`--mps-threads`): `auto` is the NVIDIA device plugin's equal split,
/// floor(100 / clients) percent; a number gives every client that percentage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum MpsThreads {
    /// floor(100 / clients) percent each.
    #[default]
    Auto,
    /// This percentage each (1 to 100).
    Percent(u8),
}

impl MpsThreads {
    /// The percentage a client of a cell of `clients` gets.
    pub fn percent(self, clients: u32) -> u32 {
        match self {
            MpsThreads::Auto => 100 / clients.max(1),
            MpsThreads::Percent(p) => u32::from(p),
        }
    }
}

impl fmt::Display for MpsThreads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MpsThreads::Auto => f.write_str("auto"),
            MpsThreads::Percent(p) => write!(f, "{p}"),
        }
    }
}

impl FromStr for MpsThreads {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(MpsThreads::Auto),
            n => match n.parse::<u8>() {
                Ok(p) if (1..=100).contains(&p) => Ok(MpsThreads::Percent(p)),
                _ => Err("expected auto (100 / the cell's clients, as the device plugin splits) or a percentage of the SMs from 1 to 100".into()),
            },
        }
    }
}

text_serde!(MpsThreads);

/// An MPS client's pinned device memory, its `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
/// (`--mps-memory`): `auto` is the device plugin's equal split, the GPU's memory /
/// clients; `none` pins no limit; or a size in MiB (`20480Mi`) or GiB (`20Gi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum MpsMemory {
    /// The GPU's memory / clients each.
    #[default]
    Auto,
    /// No limit.
    Unlimited,
    /// This many MiB each.
    Mebibytes(u32),
}

impl MpsMemory {
    /// The limit a client of a cell of `clients` gets on a GPU of `total` bytes, MiB
    /// (None: no limit, or `auto` where the GPU's memory is not known).
    pub fn mebibytes(self, clients: u32, total: Option<u64>) -> Option<u64> {
        match self {
            MpsMemory::Auto => total.map(|t| t / (1024 * 1024) / u64::from(clients.max(1))),
            MpsMemory::Unlimited => None,
            MpsMemory::Mebibytes(m) => Some(u64::from(m)),
        }
    }
}

impl fmt::Display for MpsMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MpsMemory::Auto => f.write_str("auto"),
            MpsMemory::Unlimited => f.write_str("none"),
            MpsMemory::Mebibytes(m) if m % 1024 == 0 => write!(f, "{}Gi", m / 1024),
            MpsMemory::Mebibytes(m) => write!(f, "{m}Mi"),
        }
    }
}

impl FromStr for MpsMemory {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            "expected auto (the GPU's memory / the cell's clients, as the device plugin splits), none (no limit), or a size such as 20Gi or 20480Mi".to_string()
        };
        let s = s.trim();
        let (digits, scale) = match (s.strip_suffix("Gi"), s.strip_suffix("Mi")) {
            _ if s == "auto" => return Ok(MpsMemory::Auto),
            _ if s == "none" => return Ok(MpsMemory::Unlimited),
            (Some(g), _) => (g, 1024u64),
            (None, Some(m)) => (m, 1),
            (None, None) => return Err(bad()),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        match n.checked_mul(scale).map(u32::try_from) {
            Some(Ok(m)) if m > 0 => Ok(MpsMemory::Mebibytes(m)),
            _ => Err(bad()),
        }
    }
}

text_serde!(MpsMemory);

/// What MPS gives each client of a cell: its share of the SMs and its pinned memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MpsLimits {
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.
    pub threads: MpsThreads,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`.
    pub memory: MpsMemory,
}

impl MpsLimits {
    /// The device plugin's split (`auto` for both).
    pub fn is_auto(self) -> bool {
        self == MpsLimits::default()
    }
}

/// What one row group of a sweep runs: a strategy and, for time-slicing through the DRA
/// driver with `--timeslice`, the interval its claim sets, or for MPS with
/// `--mps-threads` and `--mps-memory`, each client's limits (each its own rows, its own
/// 1-pod baseline and its own line in the charts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arm {
    /// The sharing strategy.
    pub strategy: Strategy,
    /// Time-slicing through DRA: the claim's interval (None: no interval set).
    pub timeslice: Option<TimeSliceInterval>,
    /// MPS: each client's limits (`auto` for both: the device plugin's split; other
    /// strategies leave it so).
    pub mps: MpsLimits,
}

impl Arm {
    /// A strategy with nothing more to it.
    pub const fn of(strategy: Strategy) -> Arm {
        Arm {
            strategy,
            timeslice: None,
            mps: MpsLimits {
                threads: MpsThreads::Auto,
                memory: MpsMemory::Auto,
            },
        }
    }

    /// The name in files, labels and object names (`time-slicing-short`,
    /// `mps-threads100-memory-none`).
    pub fn name(self) -> String {
        let mut name = self.strategy.name().to_string();
        if let Some(t) = self.timeslice {
            name = format!("{name}-{}", t.name());
        }
        if let MpsThreads::Percent(p) = self.mps.threads {
            name = format!("{name}-threads{p}");
        }
        match self.mps.memory {
            MpsMemory::Auto => {}
            MpsMemory::Unlimited => name.push_str("-memory-none"),
            MpsMemory::Mebibytes(m) => name = format!("{name}-memory{m}mi"),
        }
        name
    }

    /// The name in tables and charts (`Time-slicing (short)`, `MPS (100% of the SMs,
    /// memory unpinned)`).
    pub fn title(self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.timeslice {
            parts.push(t.name().to_string());
        }
        if let MpsThreads::Percent(p) = self.mps.threads {
            parts.push(format!("{p}% of the SMs"));
        }
        match self.mps.memory {
            MpsMemory::Auto => {}
            MpsMemory::Unlimited => parts.push("memory unpinned".into()),
            m @ MpsMemory::Mebibytes(_) => parts.push(format!("{m} pinned")),
        }
        if parts.is_empty() {
            self.strategy.title().to_string()
        } else {
            format!("{} ({})", self.strategy.title(), parts.join(", "))
        }
    }
}

/// The arms of a sweep in order (pure): each strategy once, time-slicing once per
/// interval when `timeslices` names any, MPS once per thread share and memory limit
/// (threads outer; none named: `auto`).
pub fn arms(strategies: &[Strategy], timeslices: &[TimeSliceInterval], mps: (&[MpsThreads], &[MpsMemory])) -> Vec<Arm> {
    let or_auto = |v: &[MpsThreads]| {
        if v.is_empty() {
            vec![MpsThreads::Auto]
        } else {
            v.to_vec()
        }
    };
    let memories = if mps.1.is_empty() {
        vec![MpsMemory::Auto]
    } else {
        mps.1.to_vec()
    };
    strategies
        .iter()
        .flat_map(|&strategy| match strategy {
            Strategy::TimeSlicing if !timeslices.is_empty() => timeslices
                .iter()
                .map(|&t| Arm {
                    timeslice: Some(t),
                    ..Arm::of(strategy)
                })
                .collect(),
            Strategy::Mps => or_auto(mps.0)
                .into_iter()
                .flat_map(|threads| {
                    memories.iter().map(move |&memory| Arm {
                        mps: MpsLimits { threads, memory },
                        ..Arm::of(strategy)
                    })
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
            (&[], &[]),
        )
        .into_iter()
        .map(Arm::name)
        .collect();
        assert_eq!(
            names,
            ["exclusive", "time-slicing-long", "time-slicing-default", "mps"],
            "the flag's order"
        );
        assert_eq!(arms(&[Strategy::TimeSlicing], &[], (&[], &[])), vec![plain]);
    }

    #[test]
    fn mps_limits_name_their_arms_and_parse_strictly() {
        let t = |s: &str| s.parse::<MpsThreads>();
        let m = |s: &str| s.parse::<MpsMemory>();
        assert_eq!(
            (t("auto"), t("100"), t(" 25 ")),
            (
                Ok(MpsThreads::Auto),
                Ok(MpsThreads::Percent(100)),
                Ok(MpsThreads::Percent(25))
            )
        );
        for bad in ["0", "101", "50%", "", "-1"] {
            assert!(t(bad).is_err(), "{bad}");
        }
        assert_eq!(
            (m("auto"), m("none"), m("20Gi"), m("1536Mi")),
            (
                Ok(MpsMemory::Auto),
                Ok(MpsMemory::Unlimited),
                Ok(MpsMemory::Mebibytes(20480)),
                Ok(MpsMemory::Mebibytes(1536))
            )
        );
        for bad in [
            "20G",
            "0Mi",
            "Gi",
            "20 Gi",
            "99999999999Gi",
            "18446744073709551615Gi",
            "unlimited",
        ] {
            assert!(m(bad).is_err(), "{bad}");
        }
        assert_eq!(MpsMemory::Mebibytes(20480).to_string(), "20Gi");
        assert_eq!(MpsThreads::Auto.percent(7), 14);
        assert_eq!(MpsThreads::Percent(100).percent(7), 100);
        assert_eq!(MpsMemory::Auto.mebibytes(2, Some(80 << 30)), Some(40960));
        assert_eq!(MpsMemory::Unlimited.mebibytes(2, Some(80 << 30)), None);
        let all = arms(
            &[Strategy::Exclusive, Strategy::Mps],
            &[],
            (
                &[MpsThreads::Auto, MpsThreads::Percent(100)],
                &[MpsMemory::Auto, MpsMemory::Unlimited],
            ),
        );
        let names: Vec<String> = all.iter().map(|a| a.name()).collect();
        assert_eq!(
            names,
            [
                "exclusive",
                "mps",
                "mps-memory-none",
                "mps-threads100",
                "mps-threads100-memory-none"
            ]
        );
        assert_eq!(all[4].title(), "MPS (100% of the SMs, memory unpinned)");
        assert_eq!(
            Arm {
                mps: MpsLimits {
                    threads: MpsThreads::Auto,
                    memory: MpsMemory::Mebibytes(20480)
                },
                ..Arm::of(Strategy::Mps)
            }
            .title(),
            "MPS (20Gi pinned)"
        );
        assert!(all[1].mps.is_auto() && !all[2].mps.is_auto());
        // The limits are MPS's: other strategies get one arm each.
        assert_eq!(
            arms(&[Strategy::TimeSlicing], &[], (&[MpsThreads::Percent(50)], &[])).len(),
            1
        );
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
