//! From flags and an optional config file to one validated [`SweepPlan`]: the rest of
//! the program never sees a raw string. Flags override the file; the file overrides
//! the defaults. Every error names the flag or file key and the bad value.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::domain::Strategy;
use crate::error::{BenchError, Result};
use crate::measure::MeasureSettings;

/// Where the workload pods run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Processes on this machine.
    Local,
    /// Pods on a Kubernetes node.
    Kubernetes,
}

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

impl PrometheusSetting {
    /// The setting as written on the command line.
    pub fn text(&self) -> String {
        match self {
            PrometheusSetting::Off => "off".into(),
            PrometheusSetting::Spawn => "spawn".into(),
            PrometheusSetting::Url(u) => u.clone(),
        }
    }
}

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

/// Values a sweep can take from flags or the config file (all optional here).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SweepOptions {
    /// local or kubernetes.
    pub backend: Option<String>,
    /// Comma-separated strategies.
    pub strategies: Option<StringOrList>,
    /// Comma-separated pod counts.
    pub pods: Option<StringOrList>,
    /// Model preset.
    pub model: Option<String>,
    /// fp32, tf32, bf16.
    pub precision: Option<String>,
    /// auto, cuda, cpu.
    pub device: Option<String>,
    /// Samples per inference.
    pub batch: Option<u32>,
    /// Warm-up duration, e.g. "10s".
    pub warmup: Option<String>,
    /// Window, e.g. "5s".
    pub window: Option<String>,
    /// Measurement cap per cell.
    pub max_cell: Option<String>,
    /// Longest wait for readiness.
    pub ready_timeout: Option<String>,
    /// Results directory.
    pub out: Option<PathBuf>,
    /// off, spawn or a URL.
    pub prometheus: Option<String>,
    /// The workload binary.
    pub workload_bin: Option<PathBuf>,
    /// Extra workload arguments (e.g. ["--weights", "DIR"]).
    pub workload_args: Option<Vec<String>>,
    /// Kubernetes node.
    pub node: Option<String>,
    /// Kubernetes namespace.
    pub namespace: Option<String>,
    /// Local pods listen on base_port + index instead of free ports.
    pub base_port: Option<u16>,
    /// Kubernetes: the workload image.
    pub image: Option<String>,
    /// Kubernetes: the MIG layout (value of nvidia.com/mig.config).
    pub mig_layout: Option<String>,
    /// Kubernetes: namespace of the Prometheus pod to port-forward to.
    pub prometheus_namespace: Option<String>,
    /// Kubernetes: label selector of that pod.
    pub prometheus_selector: Option<String>,
}

/// A list written either as a TOML array or a comma-separated string.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StringOrList {
    /// "1,3,5".
    Text(String),
    /// [1, 3, 5] or ["mps", "mig"].
    List(Vec<toml::Value>),
}

impl StringOrList {
    fn items(&self) -> Vec<String> {
        match self {
            StringOrList::Text(t) => t
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            StringOrList::List(v) => v
                .iter()
                .map(|x| match x {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect(),
        }
    }
}

impl SweepOptions {
    /// Reads a TOML config file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| BenchError::Config {
            path: path.to_path_buf(),
            reason: format!("cannot read: {e}"),
        })?;
        toml::from_str(&text).map_err(|e| BenchError::Config {
            path: path.to_path_buf(),
            reason: e.message().to_string() + &e.span().map(|s| format!(" (at byte {})", s.start)).unwrap_or_default(),
        })
    }

    /// `self` with every value `over` sets replaced.
    pub fn overridden_by(self, over: SweepOptions) -> SweepOptions {
        SweepOptions {
            backend: over.backend.or(self.backend),
            strategies: over.strategies.or(self.strategies),
            pods: over.pods.or(self.pods),
            model: over.model.or(self.model),
            precision: over.precision.or(self.precision),
            device: over.device.or(self.device),
            batch: over.batch.or(self.batch),
            warmup: over.warmup.or(self.warmup),
            window: over.window.or(self.window),
            max_cell: over.max_cell.or(self.max_cell),
            ready_timeout: over.ready_timeout.or(self.ready_timeout),
            out: over.out.or(self.out),
            prometheus: over.prometheus.or(self.prometheus),
            workload_bin: over.workload_bin.or(self.workload_bin),
            workload_args: over.workload_args.or(self.workload_args),
            node: over.node.or(self.node),
            namespace: over.namespace.or(self.namespace),
            base_port: over.base_port.or(self.base_port),
            image: over.image.or(self.image),
            mig_layout: over.mig_layout.or(self.mig_layout),
            prometheus_namespace: over.prometheus_namespace.or(self.prometheus_namespace),
            prometheus_selector: over.prometheus_selector.or(self.prometheus_selector),
        }
    }
}

/// A validated sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPlan {
    /// Backend.
    pub backend: BackendKind,
    /// Strategies in order, no duplicates.
    pub strategies: Vec<Strategy>,
    /// Pod counts in order, no duplicates.
    pub pods: Vec<u32>,
    /// Model preset (None: yolos-small on a GPU, tiny on the CPU).
    pub model: Option<String>,
    /// Precision (None: the device's default, bf16 on GPUs, fp32 on CPUs).
    pub precision: Option<String>,
    /// Device choice.
    pub device: DeviceChoice,
    /// Samples per inference.
    pub batch: u32,
    /// Measurement settings.
    pub measure: MeasureSettings,
    /// Results directory.
    pub out: PathBuf,
    /// Metrics source.
    pub prometheus: PrometheusSetting,
    /// Explicit workload binary.
    pub workload_bin: Option<PathBuf>,
    /// Extra workload arguments.
    pub workload_args: Vec<String>,
    /// Kubernetes node.
    pub node: Option<String>,
    /// Kubernetes namespace.
    pub namespace: String,
    /// Fixed ports for local pods (base + index).
    pub base_port: Option<u16>,
    /// Kubernetes: workload image.
    pub image: String,
    /// Kubernetes: MIG layout (None: from the GPU product).
    pub mig_layout: Option<String>,
    /// Kubernetes: where the Prometheus pod to port-forward to lives.
    pub prometheus_pod: (String, String),
}

/// Defaults: the reference study's pods and strategies; settings that keep the whole
/// default sweep on one GPU within 10 minutes (12 measured cells of at most ~45 s).
pub const DEFAULT_PODS: [u32; 4] = [1, 3, 5, 7];
/// Warm-up default.
pub const DEFAULT_WARMUP: &str = "10s";
/// Window default.
pub const DEFAULT_WINDOW: &str = "5s";
/// Cap default.
pub const DEFAULT_MAX_CELL: &str = "30s";

fn parse_duration(flag: &str, text: &str) -> Result<Duration> {
    humantime::parse_duration(text)
        .map_err(|e| BenchError::flag(flag, text, format!("{e} (examples: 10s, 1m30s, 500ms)")))
}

const MODELS: [&str; 3] = ["yolos-small", "minilm-l6", "tiny"];
const PRECISIONS: [&str; 3] = ["fp32", "tf32", "bf16"];

impl SweepPlan {
    /// Validates options into a plan.
    pub fn from_options(o: SweepOptions) -> Result<Self> {
        let backend = match o.backend.as_deref().unwrap_or("local") {
            "local" => BackendKind::Local,
            "kubernetes" | "k8s" => BackendKind::Kubernetes,
            other => return Err(BenchError::flag("--backend", other, "expected local or kubernetes")),
        };
        let mut strategies = Vec::new();
        for s in o
            .strategies
            .map(|s| s.items())
            .unwrap_or_else(|| Strategy::ALL.iter().map(|s| s.name().to_string()).collect())
        {
            let st: Strategy = s.parse()?;
            if !strategies.contains(&st) {
                strategies.push(st);
            }
        }
        if strategies.is_empty() {
            return Err(BenchError::flag("--strategies", "", "name at least one strategy"));
        }
        let mut pods = Vec::new();
        for p in o
            .pods
            .map(|p| p.items())
            .unwrap_or_else(|| DEFAULT_PODS.iter().map(u32::to_string).collect())
        {
            let n: u32 = p
                .parse()
                .map_err(|_| BenchError::flag("--pods", &p, "not a whole number"))?;
            if !(1..=64).contains(&n) {
                return Err(BenchError::flag("--pods", &p, "pod counts go from 1 to 64"));
            }
            if !pods.contains(&n) {
                pods.push(n);
            }
        }
        if pods.is_empty() {
            return Err(BenchError::flag("--pods", "", "name at least one pod count"));
        }
        if let Some(m) = &o.model
            && !MODELS.contains(&m.as_str())
        {
            return Err(BenchError::flag(
                "--model",
                m,
                "expected yolos-small, minilm-l6 or tiny",
            ));
        }
        let model = o.model;
        if let Some(p) = &o.precision
            && !PRECISIONS.contains(&p.as_str())
        {
            return Err(BenchError::flag("--precision", p, "expected fp32, tf32 or bf16"));
        }
        let device = match o.device.as_deref().unwrap_or("auto") {
            "auto" => DeviceChoice::Auto,
            "cuda" => DeviceChoice::Cuda,
            "cpu" => DeviceChoice::Cpu,
            other => return Err(BenchError::flag("--device", other, "expected auto, cuda or cpu")),
        };
        if device == DeviceChoice::Cpu && o.precision.as_deref().is_some_and(|p| p != "fp32") {
            return Err(BenchError::flag(
                "--precision",
                o.precision.as_deref().unwrap_or(""),
                "the CPU computes fp32 only",
            ));
        }
        let batch = o.batch.unwrap_or(1);
        if !(1..=4096).contains(&batch) {
            return Err(BenchError::flag("--batch", &batch.to_string(), "expected 1 to 4096"));
        }
        let warmup = parse_duration("--warmup", o.warmup.as_deref().unwrap_or(DEFAULT_WARMUP))?;
        let window_text = o.window.unwrap_or_else(|| DEFAULT_WINDOW.into());
        let window = parse_duration("--window", &window_text)?;
        if window < Duration::from_millis(500) {
            return Err(BenchError::flag(
                "--window",
                &window_text,
                "windows shorter than 500ms measure scrape jitter",
            ));
        }
        let cap_text = o.max_cell.unwrap_or_else(|| DEFAULT_MAX_CELL.into());
        let max_cell = parse_duration("--max-cell", &cap_text)?;
        let stable_windows = 3;
        if max_cell < window * stable_windows as u32 {
            return Err(BenchError::flag(
                "--max-cell",
                &cap_text,
                format!("shorter than {stable_windows} windows of {window_text}"),
            ));
        }
        let ready_timeout = parse_duration("--ready-timeout", o.ready_timeout.as_deref().unwrap_or("180s"))?;
        let prometheus = match o.prometheus.as_deref().unwrap_or("off") {
            "off" => PrometheusSetting::Off,
            "spawn" => PrometheusSetting::Spawn,
            u if u.starts_with("http://") || u.starts_with("https://") => {
                PrometheusSetting::Url(u.trim_end_matches('/').to_string())
            }
            other => {
                return Err(BenchError::flag(
                    "--prometheus",
                    other,
                    "expected off, spawn or an http(s):// URL",
                ));
            }
        };
        if backend == BackendKind::Kubernetes && prometheus == PrometheusSetting::Spawn {
            return Err(BenchError::flag(
                "--prometheus",
                "spawn",
                "spawn is for the local backend; on Kubernetes give the cluster's Prometheus URL (or leave it off to port-forward)",
            ));
        }
        if backend == BackendKind::Kubernetes && o.node.is_none() {
            return Err(BenchError::flag(
                "--node",
                "",
                "the Kubernetes backend needs the GPU node's name",
            ));
        }
        Ok(SweepPlan {
            backend,
            strategies,
            pods,
            model,
            precision: o.precision,
            device,
            batch,
            measure: MeasureSettings {
                ready_timeout,
                warmup,
                window,
                max_cell,
                stable_windows,
                tolerance: 0.05,
            },
            out: o.out.unwrap_or_else(|| PathBuf::from("results")),
            prometheus,
            workload_bin: o.workload_bin,
            workload_args: o.workload_args.unwrap_or_default(),
            node: o.node,
            namespace: o.namespace.unwrap_or_else(|| "gpushare-bench".into()),
            base_port: match o.base_port {
                Some(p) if !(1024..=65535 - 64).contains(&p) => {
                    return Err(BenchError::flag(
                        "--base-port",
                        &p.to_string(),
                        "use a port from 1024 to 65471",
                    ));
                }
                p => p,
            },
            image: o.image.unwrap_or_else(|| crate::k8s::manifests::DEFAULT_IMAGE.into()),
            mig_layout: o.mig_layout,
            prometheus_pod: (
                o.prometheus_namespace.unwrap_or_else(|| "monitoring".into()),
                o.prometheus_selector
                    .unwrap_or_else(|| "app.kubernetes.io/name=prometheus".into()),
            ),
        })
    }
}

/// Checks a run id: letters, digits, `.`, `_`, `-` (it becomes a directory name).
pub fn validate_run_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 100
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(BenchError::flag(
            "--run-id",
            id,
            "use letters, digits, '.', '_' and '-' (it names a directory)",
        ))
    }
}

/// A run id from the time and the device: `20261122T141500Z-h100`.
pub fn default_run_id(now_rfc3339: &str, device: &str) -> String {
    let stamp: String = now_rfc3339.chars().filter(|c| *c != '-' && *c != ':').collect();
    format!("{stamp}-{device}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> SweepOptions {
        SweepOptions::default()
    }

    #[test]
    fn defaults_are_the_reference_study() {
        let p = SweepPlan::from_options(opts()).expect("defaults are valid");
        assert_eq!(p.strategies, Strategy::ALL.to_vec());
        assert_eq!(p.pods, vec![1, 3, 5, 7]);
        assert_eq!(p.model, None);
        assert_eq!(p.measure.window, Duration::from_secs(5));
        assert_eq!(p.measure.stable_windows, 3);
        assert_eq!(p.prometheus, PrometheusSetting::Off);
    }

    #[test]
    fn flags_override_the_file_and_bad_values_are_named() {
        let file: SweepOptions =
            toml::from_str("pods = [1, 2]\nstrategies = \"mps,mig\"\nwarmup = \"3s\"\n").expect("toml");
        let flags = SweepOptions {
            pods: Some(StringOrList::Text("4".into())),
            ..opts()
        };
        let p = SweepPlan::from_options(file.overridden_by(flags)).expect("valid");
        assert_eq!(p.pods, vec![4]);
        assert_eq!(p.strategies, vec![Strategy::Mps, Strategy::Mig]);
        assert_eq!(p.measure.warmup, Duration::from_secs(3));
        let bad = |o: SweepOptions| {
            SweepPlan::from_options(o)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert_eq!(
            bad(SweepOptions {
                pods: Some(StringOrList::Text("1,0".into())),
                ..opts()
            }),
            "bad --pods `0`: pod counts go from 1 to 64"
        );
        assert!(
            bad(SweepOptions {
                warmup: Some("ten".into()),
                ..opts()
            })
            .starts_with("bad --warmup `ten`")
        );
        assert!(
            bad(SweepOptions {
                max_cell: Some("10s".into()),
                ..opts()
            })
            .contains("shorter than 3 windows")
        );
        assert!(
            bad(SweepOptions {
                prometheus: Some("maybe".into()),
                ..opts()
            })
            .contains("off, spawn or an http")
        );
        assert!(
            bad(SweepOptions {
                device: Some("cpu".into()),
                precision: Some("bf16".into()),
                ..opts()
            })
            .contains("fp32 only")
        );
        assert!(
            bad(SweepOptions {
                backend: Some("kubernetes".into()),
                ..opts()
            })
            .contains("--node")
        );
    }

    #[test]
    fn config_file_errors_name_the_file_and_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("sweep.toml");
        std::fs::write(&f, "podz = [1]\n").expect("write");
        let e = SweepOptions::from_file(&f)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("sweep.toml") && e.contains("podz"), "{e}");
        let missing = SweepOptions::from_file(&dir.path().join("nope.toml"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            missing.contains("nope.toml") && missing.contains("cannot read"),
            "{missing}"
        );
    }

    #[test]
    fn run_ids() {
        assert!(validate_run_id("20261122T141500Z-h100").is_ok());
        assert!(validate_run_id("../x").is_err());
        assert!(validate_run_id("").is_err());
        assert_eq!(default_run_id("2026-11-22T14:15:00Z", "h100"), "20261122T141500Z-h100");
    }
}
