//! Typed option values, each parsed once from a flag or a config file: the same
//! `FromStr` serves clap and serde, so a bad value gets the same reason from both
//! (`main` prints it as "bad --flag `value`: reason"; a config file error names the file
//! and line).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::domain::Strategy;

/// Implements serde for a type through its `FromStr` and `Display`.
macro_rules! serde_via_str {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = ScalarText::deserialize(d)?.0;
                text.parse()
                    .map_err(|reason: String| serde::de::Error::custom(format!("bad value `{text}`: {reason}")))
            }
        }
    };
}

/// A scalar of a config file as text: strings as they are, numbers and booleans written
/// out (so `batch = 4` and `window = "5s"` both work).
struct ScalarText(String);

impl<'de> Deserialize<'de> for ScalarText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(i64),
            Float(f64),
            Bool(bool),
        }
        Ok(ScalarText(match Raw::deserialize(d)? {
            Raw::Text(s) => s,
            Raw::Int(i) => i.to_string(),
            Raw::Float(f) => f.to_string(),
            Raw::Bool(b) => b.to_string(),
        }))
    }
}

/// Where the workload pods run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Processes on this machine.
    Local,
    /// Pods on a Kubernetes node.
    Kubernetes,
}

impl FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local" => Ok(BackendKind::Local),
            "kubernetes" | "k8s" => Ok(BackendKind::Kubernetes),
            _ => Err("expected local or kubernetes".into()),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Local => "local",
            BackendKind::Kubernetes => "kubernetes",
        })
    }
}
serde_via_str!(BackendKind);

/// `--sharing-api`: how pods on Kubernetes get their share of the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SharingApi {
    /// The device plugin's node configuration (GPU operator): extended resources.
    #[default]
    DevicePlugin,
    /// ResourceClaims with the NVIDIA DRA driver's `GpuConfig` (Kubernetes 1.34+).
    Dra,
}

impl FromStr for SharingApi {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "device-plugin" => Ok(SharingApi::DevicePlugin),
            "dra" => Ok(SharingApi::Dra),
            _ => Err("expected device-plugin or dra".into()),
        }
    }
}

impl fmt::Display for SharingApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SharingApi::DevicePlugin => "device-plugin",
            SharingApi::Dra => "dra",
        })
    }
}
serde_via_str!(SharingApi);

/// An item of `--timeslice`: the DRA driver's time-slice interval, as the flag spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeSlice(pub crate::domain::TimeSliceInterval);

impl FromStr for TimeSlice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse().map(TimeSlice)
    }
}

impl fmt::Display for TimeSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
serde_via_str!(TimeSlice);

/// A Kubernetes quantity of bytes for `--mps-memory-limit` (`20Gi`, `512Mi`, `21474836480`):
/// digits with an optional binary (Ki..Ei) or decimal (k, M, G, T, P, E) suffix, at least
/// 1 MiB (the driver refuses less).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity {
    /// As given.
    pub text: String,
    /// In bytes.
    pub bytes: u64,
}

impl FromStr for Quantity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let digits = s.bytes().take_while(u8::is_ascii_digit).count();
        let (number, suffix) = s.split_at(digits);
        let unit: u64 = match suffix {
            "" => 1,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            "Pi" => 1 << 50,
            "Ei" => 1 << 60,
            "k" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            "T" => 1_000_000_000_000,
            "P" => 1_000_000_000_000_000,
            "E" => 1_000_000_000_000_000_000,
            _ => return Err("a quantity of bytes such as 20Gi or 512Mi".into()),
        };
        let bytes = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(unit))
            .ok_or_else(|| "a quantity of bytes such as 20Gi or 512Mi".to_string())?;
        if bytes < 1 << 20 {
            return Err("less than 1Mi, which the DRA driver refuses".into());
        }
        Ok(Quantity {
            text: s.to_string(),
            bytes,
        })
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}
serde_via_str!(Quantity);

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The GPU if one is usable, else the CPU smoke pipeline.
    Auto,
    /// The GPU; fail without one.
    Cuda,
    /// The CPU.
    Cpu,
}

impl FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cuda" => Ok(DeviceChoice::Cuda),
            "cpu" => Ok(DeviceChoice::Cpu),
            _ => Err("expected auto, cuda or cpu".into()),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Cuda => "cuda",
            DeviceChoice::Cpu => "cpu",
        })
    }
}
serde_via_str!(DeviceChoice);

/// The workload's model preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// The reference study's model shape (default on a GPU).
    YolosSmall,
    /// BERT MiniLM-L6 with real weights.
    MinilmL6,
    /// A few MFLOP, for the CPU and CI.
    Tiny,
}

impl Model {
    /// The name the workload takes.
    pub fn name(self) -> &'static str {
        match self {
            Model::YolosSmall => "yolos-small",
            Model::MinilmL6 => "minilm-l6",
            Model::Tiny => "tiny",
        }
    }
}

impl FromStr for Model {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [Model::YolosSmall, Model::MinilmL6, Model::Tiny]
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| "expected yolos-small, minilm-l6 or tiny".into())
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
serde_via_str!(Model);

/// Arithmetic precision of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// IEEE single precision (the only one on the CPU).
    Fp32,
    /// TF32 tensor cores.
    Tf32,
    /// bfloat16 (default on a GPU).
    Bf16,
}

impl Precision {
    /// The name the workload takes.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }
}

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [Precision::Fp32, Precision::Tf32, Precision::Bf16]
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| "expected fp32, tf32 or bf16".into())
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
serde_via_str!(Precision);

/// Where metrics come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrometheusSetting {
    /// Scrape pods directly.
    Off,
    /// Start a private Prometheus server (local backend).
    Spawn,
    /// Use this server.
    Url(String),
}

impl FromStr for PrometheusSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(PrometheusSetting::Off),
            "spawn" => Ok(PrometheusSetting::Spawn),
            u if u.starts_with("http://") || u.starts_with("https://") => {
                let uri: hyper::Uri = u.parse().map_err(|e| format!("not a URL: {e}"))?;
                if uri.host().is_none_or(str::is_empty) {
                    return Err("the URL names no host".into());
                }
                if uri.query().is_some() {
                    return Err("give the server's base URL, without a query".into());
                }
                Ok(PrometheusSetting::Url(u.trim_end_matches('/').to_string()))
            }
            _ => Err("expected off, spawn or an http(s):// URL".into()),
        }
    }
}

impl fmt::Display for PrometheusSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrometheusSetting::Off => f.write_str("off"),
            PrometheusSetting::Spawn => f.write_str("spawn"),
            PrometheusSetting::Url(u) => f.write_str(u),
        }
    }
}
serde_via_str!(PrometheusSetting);

/// The longest duration any setting takes: beyond it, deadlines computed from it would
/// overflow the clock, and no measurement needs it.
pub const MAX_SPAN: Duration = Duration::from_secs(7 * 24 * 3600);

/// A duration as written ("10s", "1m30s", "500ms"), kept with its text for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The value.
    pub duration: Duration,
    /// As written.
    pub text: String,
}

impl FromStr for Span {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let duration = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 10s, 1m30s, 500ms)"))?;
        if duration > MAX_SPAN {
            return Err(format!("longer than {}", humantime::format_duration(MAX_SPAN)));
        }
        Ok(Span {
            duration,
            text: s.to_string(),
        })
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}
serde_via_str!(Span);

/// What an objective is on (`--slo METRIC:pXX=DUR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum SloMetric {
    /// A request's latency (end to end for a streamed answer): no prefix.
    #[default]
    Latency,
    /// Time to first token of a streamed answer (`ttft:`).
    Ttft,
    /// Every gap between two tokens of a streamed answer (`itl:`).
    Itl,
    /// A streamed answer's time per output token after the first (`tpot:`).
    Tpot,
}

impl SloMetric {
    /// The prefix it is named by (empty for latency).
    pub fn prefix(self) -> &'static str {
        match self {
            SloMetric::Latency => "",
            SloMetric::Ttft => "ttft",
            SloMetric::Itl => "itl",
            SloMetric::Tpot => "tpot",
        }
    }

    /// Whether it needs streamed answers (`--stream`).
    pub fn is_token(self) -> bool {
        self != SloMetric::Latency
    }
}

/// A latency objective (`--slo`): `pXX=DUR`, at least XX% of requests (p50, p90 or
/// p99) within DUR, or a bare `DUR`, a latency target without a percentile (what
/// `isolation` takes). On streamed answers an objective may name a token metric:
/// `ttft:p99=500ms`, `itl:p99=50ms`, `tpot:p90=40ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    /// What it is on.
    pub metric: SloMetric,
    /// The share of requests that must be within the threshold (None: a bare target).
    pub quantile: Option<f64>,
    /// The latency threshold.
    pub threshold: Duration,
}

impl FromStr for Slo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (metric, s) = match s.split_once(':') {
            Some((m, rest)) => {
                let metric = match m.trim() {
                    "ttft" => SloMetric::Ttft,
                    "itl" => SloMetric::Itl,
                    "tpot" => SloMetric::Tpot,
                    other => {
                        return Err(format!(
                            "unknown metric `{other}`: expected ttft, itl or tpot (e.g. ttft:p99=500ms), or none for the request's latency"
                        ));
                    }
                };
                (metric, rest)
            }
            None => (SloMetric::Latency, s),
        };
        let (quantile, dur) = match s.split_once('=') {
            Some((q, d)) => {
                let q = match q.trim() {
                    "p50" => 0.5,
                    "p90" => 0.9,
                    "p99" => 0.99,
                    other => {
                        return Err(format!(
                            "unknown percentile `{other}`: expected p50, p90 or p99 (e.g. p99=25ms)"
                        ));
                    }
                };
                (Some(q), d)
            }
            None => (None, s),
        };
        let threshold = humantime::parse_duration(dur.trim()).map_err(|e| format!("{e} (e.g. p99=25ms)"))?;
        if threshold.is_zero() || threshold > MAX_SPAN {
            return Err(format!(
                "the threshold must be above 0 and at most {}",
                humantime::format_duration(MAX_SPAN)
            ));
        }
        if metric.is_token() && quantile.is_none() {
            return Err(format!(
                "name the percentile of {}, e.g. {}:p99={}",
                metric.prefix(),
                metric.prefix(),
                humantime::format_duration(threshold)
            ));
        }
        Ok(Slo {
            metric,
            quantile,
            threshold,
        })
    }
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = humantime::format_duration(self.threshold);
        if self.metric.is_token() {
            write!(f, "{}:", self.metric.prefix())?;
        }
        match self.quantile {
            Some(q) => write!(f, "p{}={t}", (q * 100.0).round()),
            None => write!(f, "{t}"),
        }
    }
}

serde_via_str!(Slo);

/// Token counts of streamed requests (`--prompt-tokens`, `--output-tokens`): `N`, every
/// request the same, or `A-B`, each drawn uniformly from A to B (both included) from the
/// pod's seeded random numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lengths {
    /// The fewest.
    pub low: u32,
    /// The most.
    pub high: u32,
}

/// The most tokens a prompt or an answer may be given.
pub const MAX_TOKENS: u32 = 1 << 20;

impl FromStr for Lengths {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let number = |t: &str| -> Result<u32, String> {
            let n: u32 = t
                .trim()
                .parse()
                .map_err(|_| format!("`{}` is not a count of tokens (e.g. 128 or 64-256)", t.trim()))?;
            if n == 0 || n > MAX_TOKENS {
                return Err(format!("{n} tokens: give 1 to {MAX_TOKENS}"));
            }
            Ok(n)
        };
        let (low, high) = match s.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => {
                let n = number(s)?;
                (n, n)
            }
        };
        if low > high {
            return Err(format!("{low}-{high}: the first must not exceed the second"));
        }
        Ok(Lengths { low, high })
    }
}

impl fmt::Display for Lengths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.low == self.high {
            write!(f, "{}", self.low)
        } else {
            write!(f, "{}-{}", self.low, self.high)
        }
    }
}

serde_via_str!(Lengths);

/// The most lines `--lengths` may hold (each is kept in run.json).
pub const MAX_LENGTH_PAIRS: usize = 100_000;

/// Prompt and answer lengths from a file (`--lengths FILE`, pure): one request's
/// `PROMPT OUTPUT` token counts per line, as a trace of real traffic gives them
/// (whitespace or a comma between them; blank lines and `#` comments skipped). The
/// error names the line.
pub fn parse_length_pairs(text: &str) -> Result<Vec<[u32; 2]>, String> {
    let mut pairs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let at = |why: String| format!("line {}: {why}", i + 1);
        let fields: Vec<&str> = line
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|f| !f.is_empty())
            .collect();
        let [prompt, output] = fields[..] else {
            return Err(at(format!(
                "`{line}`: give two token counts, the prompt's and the answer's (e.g. `512 128`)"
            )));
        };
        let count = |f: &str| -> Result<u32, String> {
            let l: Lengths = f.parse().map_err(at)?;
            if l.low != l.high {
                return Err(at(format!("`{f}`: one count, not a range")));
            }
            Ok(l.low)
        };
        pairs.push([count(prompt)?, count(output)?]);
        if pairs.len() > MAX_LENGTH_PAIRS {
            return Err(format!("more than {MAX_LENGTH_PAIRS} lines: sample the trace"));
        }
    }
    if pairs.is_empty() {
        return Err("no lengths in it: one `PROMPT OUTPUT` pair of token counts per line".into());
    }
    Ok(pairs)
}

/// How the pods get their requests (`--load`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Load {
    /// Back to back, as fast as each pod serves (the reference study's closed loop).
    #[default]
    Closed,
    /// Poisson arrivals at this rate per pod (`poisson:RATE`).
    PerPod(f64),
    /// Poisson arrivals at this rate per cell, split equally over its pods
    /// (`total:RATE`): strategies compared at equal aggregate offered load.
    Total(f64),
}

/// A level: a share of one exclusive pod's closed-loop capacity, offered to a whole
/// cell (`50%` → `total:RATE` with RATE half that capacity, split over the cell's pods).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct LoadLevel(f64);

/// The highest level accepted, as a share (500%: far past what any strategy serves).
pub const MAX_LEVEL: f64 = 5.0;

impl LoadLevel {
    /// A level from its share (0.5 for 50%), on a grid of 0.1%: what the run measures,
    /// names its sweep by and records are one number. None outside (0, [`MAX_LEVEL`]] once
    /// rounded.
    pub fn new(share: f64) -> Option<LoadLevel> {
        let share = (share * 1000.0).round() / 1000.0;
        (share.is_finite() && share > 0.0 && share <= MAX_LEVEL).then_some(LoadLevel(share))
    }

    /// The share of the base (0.5).
    pub fn share(self) -> f64 {
        self.0
    }

    /// The percentage, as the flag writes it (50, 12.5).
    pub fn percent(self) -> f64 {
        (self.0 * 1000.0).round() / 10.0
    }

    /// The level's sweep directory and run id (`load-50pct`, `load-12.5pct`).
    pub fn dir_name(self) -> String {
        format!("load-{}pct", self.percent())
    }

    /// Requests per second for a whole cell at this level of `base` per second.
    pub fn rate(self, base: f64) -> f64 {
        self.0 * base
    }
}

impl FromStr for LoadLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let number = s.strip_suffix('%').ok_or_else(|| {
            format!("a level is a percentage of one exclusive pod's closed-loop capacity, e.g. 50%, not `{s}`")
        })?;
        let pct: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("`{number}` is not a number of percent"))?;
        LoadLevel::new(pct / 100.0).ok_or_else(|| {
            format!(
                "a level is at least 0.1% (levels are kept to 0.1%) and at most {}% of one pod's capacity alone",
                MAX_LEVEL * 100.0
            )
        })
    }
}

impl fmt::Display for LoadLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.percent())
    }
}

impl From<LoadLevel> for String {
    fn from(l: LoadLevel) -> String {
        l.to_string()
    }
}

impl TryFrom<String> for LoadLevel {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// The highest rate `--load` accepts per second (the workload's own limit).
pub const MAX_RATE: f64 = 1e6;

impl FromStr for Load {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "closed" {
            return Ok(Load::Closed);
        }
        let (kind, rate) = s
            .split_once(':')
            .ok_or("expected closed, poisson:RATE (per pod) or total:RATE (per cell), RATE in requests per second")?;
        let rate: f64 = rate
            .parse()
            .map_err(|_| format!("RATE `{rate}` is not a number of requests per second"))?;
        if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE) {
            return Err(format!("RATE must be above 0 and at most {MAX_RATE} per second"));
        }
        match kind {
            "poisson" => Ok(Load::PerPod(rate)),
            "total" => Ok(Load::Total(rate)),
            other => Err(format!(
                "unknown load `{other}`: expected closed, poisson:RATE (per pod) or total:RATE (per cell)"
            )),
        }
    }
}

impl fmt::Display for Load {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Load::Closed => f.write_str("closed"),
            // A rate far below one a second in exponent form (1e-300 in full is 300 digits).
            Load::PerPod(r) if *r < 1e-3 => write!(f, "poisson:{r:e}"),
            Load::Total(r) if *r < 1e-3 => write!(f, "total:{r:e}"),
            Load::PerPod(r) => write!(f, "poisson:{r}"),
            Load::Total(r) => write!(f, "total:{r}"),
        }
    }
}

serde_via_str!(Load);

impl Load {
    /// Requests per second offered to each pod of a cell of `pods` pods (None: closed).
    pub fn per_pod_rate(self, pods: u32) -> Option<f64> {
        match self {
            Load::Closed => None,
            Load::PerPod(r) => Some(r),
            Load::Total(r) => Some(r / f64::from(pods.max(1))),
        }
    }

    /// The workload arguments that make a cell's pods follow this load (pure).
    pub fn workload_args(self, pods: u32) -> Vec<String> {
        match self.per_pod_rate(pods) {
            None => Vec::new(),
            Some(r) => vec!["--load".into(), format!("poisson:{r}")],
        }
    }
}

/// The most pods a cell may have.
pub const MAX_PODS: u32 = 64;

/// A pod count of a sweep, 1 to [`MAX_PODS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodCount(pub u32);

impl FromStr for PodCount {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let n: u32 = s.trim().parse().map_err(|_| "not a whole number".to_string())?;
        if (1..=MAX_PODS).contains(&n) {
            Ok(PodCount(n))
        } else {
            Err("pod counts go from 1 to 64".into())
        }
    }
}

impl fmt::Display for PodCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A strategy as an option value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrategyName(pub Strategy);

impl FromStr for StrategyName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Strategy::ALL
            .into_iter()
            .find(|x| x.name() == s.trim())
            .map(StrategyName)
            .ok_or_else(|| "expected exclusive, time-slicing, mps or mig".into())
    }
}

impl fmt::Display for StrategyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name())
    }
}

/// A list written as "a,b,c" (flags, config strings) or as a TOML array; duplicates
/// dropped, order kept. The first bad item is the error (named by its own text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct List<T>(pub Vec<T>);

impl<T: FromStr<Err = String> + PartialEq> List<T> {
    fn from_items<'a>(items: impl Iterator<Item = &'a str>) -> Result<Self, (String, String)> {
        let mut out = Vec::new();
        for item in items.map(str::trim).filter(|s| !s.is_empty()) {
            let v = item.parse::<T>().map_err(|reason| (item.to_string(), reason))?;
            if !out.contains(&v) {
                out.push(v);
            }
        }
        Ok(List(out))
    }
}

/// The error of a list: which item, and why (clap shows the whole value otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListItemError {
    /// The bad item.
    pub item: String,
    /// Why.
    pub reason: String,
}

impl fmt::Display for ListItemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.reason)
    }
}

impl std::error::Error for ListItemError {}

impl<T: FromStr<Err = String> + PartialEq> FromStr for List<T> {
    type Err = ListItemError;
    fn from_str(s: &str) -> Result<Self, ListItemError> {
        List::from_items(s.split(',')).map_err(|(item, reason)| ListItemError { item, reason })
    }
}

impl<T: fmt::Display> fmt::Display for List<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<String> = self.0.iter().map(T::to_string).collect();
        f.write_str(&items.join(","))
    }
}

impl<T: fmt::Display> Serialize for List<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de, T: FromStr<Err = String> + PartialEq> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Items(Vec<ScalarText>),
        }
        let items: Vec<String> = match Raw::deserialize(d)? {
            Raw::Text(t) => t.split(',').map(str::to_string).collect(),
            Raw::Items(v) => v.into_iter().map(|x| x.0).collect(),
        };
        List::from_items(items.iter().map(String::as_str))
            .map_err(|(item, reason)| serde::de::Error::custom(format!("bad value `{item}`: {reason}")))
    }
}

/// The toleration GPU nodes' usual taint needs (every GPU operator operand carries it).
pub const DEFAULT_TOLERATION: &str = "nvidia.com/gpu:NoSchedule";

/// A toleration from `key[=value][:Effect]` (pure): `Exists` without a value.
pub fn toleration(spec: &str) -> std::result::Result<serde_json::Value, String> {
    let (kv, effect) = match spec.rsplit_once(':') {
        Some((kv, e)) => (kv, Some(e)),
        None => (spec, None),
    };
    if let Some(e) = effect
        && !matches!(e, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
    {
        return Err(format!("effect {e:?} is not NoSchedule, PreferNoSchedule or NoExecute"));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err("the key is empty (use KEY[=VALUE][:EFFECT])".into());
    }
    let mut t = match value {
        Some(v) => serde_json::json!({ "key": key, "operator": "Equal", "value": v }),
        None => serde_json::json!({ "key": key, "operator": "Exists" }),
    };
    if let Some(e) = effect {
        t["effect"] = serde_json::json!(e);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slos_name_a_percentile_and_a_threshold() {
        let s: Slo = "p99=25ms".parse().expect("slo");
        assert_eq!((s.quantile, s.threshold), (Some(0.99), Duration::from_millis(25)));
        assert_eq!(s.to_string(), "p99=25ms");
        assert_eq!(s.to_string().parse::<Slo>(), Ok(s));
        assert_eq!("20ms".parse::<Slo>().map(|s| s.quantile), Ok(None));
        assert_eq!("p90=1s".parse::<List<Slo>>().map(|l| l.0.len()), Ok(1));
        for bad in [
            "p95=10ms",
            "p99=",
            "p99=0ms",
            "p99=fast",
            "=5ms",
            "ttl:p99=5ms",
            "ttft:5ms",
            "itl:",
        ] {
            assert!(bad.parse::<Slo>().is_err(), "{bad}");
        }
        let t: Slo = "ttft:p99=500ms".parse().expect("ttft");
        assert_eq!((t.metric, t.quantile), (SloMetric::Ttft, Some(0.99)));
        assert_eq!(t.to_string(), "ttft:p99=500ms");
        let l: List<Slo> = "ttft:p99=500ms,itl:p90=50ms,tpot:p50=20ms,p99=2s"
            .parse()
            .expect("list");
        let metrics: Vec<SloMetric> = l.0.iter().map(|s| s.metric).collect();
        assert_eq!(
            metrics,
            [SloMetric::Ttft, SloMetric::Itl, SloMetric::Tpot, SloMetric::Latency]
        );
        for s in &l.0 {
            assert_eq!(s.to_string().parse::<Slo>().as_ref(), Ok(s));
        }
        assert!("ttft:p99=5ms".parse::<Slo>().expect("ok").metric.is_token());
    }

    #[test]
    fn lengths_are_a_count_or_a_range() {
        assert_eq!(
            parse_length_pairs("# prompt output\n512 128\n\n 64,16 # short\n"),
            Ok(vec![[512, 128], [64, 16]])
        );
        for (bad, says) in [
            ("512\n", "line 1: `512`: give two token counts"),
            ("1 2\n3 4 5\n", "line 2"),
            ("1 0\n", "line 1: 0 tokens"),
            ("1 2-3\n", "line 1: `2-3`: one count"),
            ("# nothing\n", "no lengths"),
        ] {
            let err = parse_length_pairs(bad).expect_err(bad);
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        assert_eq!("128".parse::<Lengths>(), Ok(Lengths { low: 128, high: 128 }));
        assert_eq!("64-256".parse::<Lengths>(), Ok(Lengths { low: 64, high: 256 }));
        assert_eq!("64-256".parse::<Lengths>().map(|l| l.to_string()), Ok("64-256".into()));
        assert_eq!("7".parse::<Lengths>().map(|l| l.to_string()), Ok("7".into()));
        for bad in ["0", "-5", "5-", "9-3", "x", "1-2000000", ""] {
            assert!(bad.parse::<Lengths>().is_err(), "{bad}");
        }
    }

    #[test]
    fn loads_give_each_pod_its_rate() {
        assert_eq!("closed".parse::<Load>(), Ok(Load::Closed));
        assert_eq!("poisson:100".parse::<Load>(), Ok(Load::PerPod(100.0)));
        let total: Load = "total:300".parse().expect("total");
        assert_eq!(total.per_pod_rate(3), Some(100.0));
        assert_eq!(total.workload_args(4), ["--load", "poisson:75"]);
        assert_eq!(Load::PerPod(40.0).workload_args(7), ["--load", "poisson:40"]);
        assert!(Load::Closed.workload_args(3).is_empty());
        assert_eq!(total.to_string().parse::<Load>(), Ok(total));
        for bad in [
            "open",
            "poisson:",
            "poisson:0",
            "total:-1",
            "poisson:inf",
            "total:2e6",
            "burst:5",
        ] {
            assert!(bad.parse::<Load>().is_err(), "{bad}");
        }
    }

    #[test]
    fn values_parse_once_for_flags_and_files() {
        assert_eq!("1, 3,3,5".parse::<List<PodCount>>().map(|l| l.0.len()), Ok(3));
        let e = "1,0".parse::<List<PodCount>>().expect_err("0 is out of range");
        assert_eq!(
            (e.item.as_str(), e.reason.as_str()),
            ("0", "pod counts go from 1 to 64")
        );
        assert!(
            "18446744073709551615s".parse::<Span>().is_err(),
            "huge durations are refused"
        );
        assert_eq!("90s".parse::<Span>().map(|s| s.duration), Ok(Duration::from_secs(90)));
        assert!("http://".parse::<PrometheusSetting>().is_err());
        assert!("http://[::1".parse::<PrometheusSetting>().is_err());
        assert_eq!(
            "http://prom:9090/".parse::<PrometheusSetting>(),
            Ok(PrometheusSetting::Url("http://prom:9090".into()))
        );
        #[derive(Deserialize)]
        struct F {
            pods: List<PodCount>,
            strategies: List<StrategyName>,
            precision: Precision,
        }
        let f: F = toml::from_str("pods = [1, 2]\nstrategies = \"mps,mig\"\nprecision = \"tf32\"\n").expect("toml");
        assert_eq!(f.pods.0, vec![PodCount(1), PodCount(2)]);
        assert_eq!(
            f.strategies.0,
            vec![StrategyName(Strategy::Mps), StrategyName(Strategy::Mig)]
        );
        assert_eq!(f.precision, Precision::Tf32);
        let bad = toml::from_str::<F>("pods = [1, 65]\nstrategies = \"mps\"\nprecision = \"tf32\"\n")
            .err()
            .map(|e| e.message().to_string())
            .unwrap_or_default();
        assert_eq!(bad, "bad value `65`: pod counts go from 1 to 64");
    }

    #[test]
    fn levels_parse_as_percentages_and_name_their_sweeps() {
        let l: LoadLevel = "50%".parse().expect("50%");
        assert_eq!(l.share(), 0.5);
        assert_eq!(l.dir_name(), "load-50pct");
        assert_eq!(l.to_string(), "50%");
        assert_eq!("12.5%".parse::<LoadLevel>().expect("12.5").dir_name(), "load-12.5pct");
        assert!((l.rate(800.0) - 400.0).abs() < 1e-9);
        // Kept to 0.1%: the rate, the sweep's name and the record agree, and two levels
        // that round alike are one.
        let third: LoadLevel = "33.33%".parse().expect("33.33%");
        assert_eq!(
            (third.share(), third.dir_name(), third.to_string()),
            (0.333, "load-33.3pct".into(), "33.3%".into())
        );
        assert_eq!(third, "33.34%".parse::<LoadLevel>().expect("33.34%"));
        let list: List<LoadLevel> = "33.33%,33.34%,50%".parse().expect("list");
        assert_eq!(list.0.len(), 2);
        for (bad, says) in [
            ("50", "a percentage"),
            ("0%", "at least 0.1%"),
            ("0.04%", "at least 0.1%"),
            ("-5%", "at least 0.1%"),
            ("600%", "at most 500%"),
            ("x%", "not a number"),
            ("NaN%", "at least 0.1%"),
        ] {
            let e = bad.parse::<LoadLevel>().expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
