//! The records a run leaves on disk: one [`CellRecord`] per pod per cell plus one
//! aggregate row per cell (`pod = "all"`) in `cells.csv` and `cells.jsonl`, and one
//! [`RunRecord`] in `run.json`. CSV, JSON and Markdown all derive from these structs;
//! there is no second, hand-kept list of columns.

use serde::{Deserialize, Serialize};

use crate::config::plan::{BackendKind, DeviceChoice, MeasureSettings, PrometheusSetting, SweepPlan};
use crate::domain::{CellStatus, DeviceKind, Source, Strategy};

/// The label every CPU smoke run carries, in run.json, on the terminal and in reports.
pub const CPU_SMOKE_LABEL: &str = "CPU SMOKE RUN: no usable GPU, so the tiny model ran on the CPU; these numbers test the pipeline and say nothing about GPU sharing";

/// The label of a run the user asked to run on the CPU.
pub const CPU_RUN_LABEL: &str = "CPU RUN (--device cpu): the workload ran on the CPU; not a GPU measurement";

/// The `pod` value of a cell's aggregate row.
pub const ALL_PODS: &str = "all";

/// One row of `cells.csv`: a pod of a cell, or the cell's aggregate (`pod = "all"`).
/// Numbers that were not measured are empty (`None`), never zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    /// The run this row belongs to.
    pub run_id: String,
    /// Sharing strategy.
    pub strategy: Strategy,
    /// Pods requested in this cell.
    pub pods: u32,
    /// Pod name, or `all`.
    pub pod: String,
    /// Outcome.
    pub status: CellStatus,
    /// Inferences completed during the measurement.
    pub inferences: Option<u64>,
    /// Inferences per second (aggregate: summed over pods).
    pub throughput_per_s: Option<f64>,
    /// Exact mean latency (Δsum / Δcount), seconds.
    pub mean_s: Option<f64>,
    /// Median latency (histogram_quantile), seconds.
    pub p50_s: Option<f64>,
    /// 90th percentile latency, seconds.
    pub p90_s: Option<f64>,
    /// 99th percentile latency, seconds.
    pub p99_s: Option<f64>,
    /// Failed or dropped inferences during the measurement.
    pub errors: Option<u64>,
    /// Jain's fairness index over the requested pods' throughput (aggregate rows).
    pub fairness: Option<f64>,
    /// Mean GPU utilisation during the measurement, percent (aggregate rows).
    pub gpu_util_pct: Option<f64>,
    /// Peak device memory in use during the measurement, bytes (aggregate rows).
    pub gpu_mem_bytes: Option<u64>,
    /// Mean board power, watts (aggregate rows).
    pub power_w: Option<f64>,
    /// GPU energy over the measurement / inferences, joules (aggregate rows).
    pub energy_j_per_inference: Option<f64>,
    /// Where the numbers came from.
    pub source: Source,
    /// What the workload ran on.
    pub device: DeviceKind,
    /// Why a status is not ok, and anything else a reader should know.
    pub note: String,
    /// Aggregate throughput over the same strategy's 1-pod cell.
    pub speedup_vs_1pod: Option<f64>,
    /// Mean latency over the same strategy's 1-pod cell.
    pub slowdown_vs_1pod: Option<f64>,
    /// Length of the measurement, seconds.
    pub duration_s: Option<f64>,
    /// Measurement windows.
    pub windows: Option<u32>,
    /// Window-to-window spread of throughput, (max − min) / mean over all windows.
    pub throughput_spread: Option<f64>,
    /// Window-to-window spread of the median latency.
    pub p50_spread: Option<f64>,
    /// Exit code of a pod that stopped on its own.
    pub exit_code: Option<i32>,
    /// Model preset.
    pub model: String,
    /// Arithmetic precision.
    pub precision: String,
    /// When the cell's measurement started (RFC 3339, UTC).
    pub started_at: String,
}

impl CellRecord {
    /// Whether this is a cell's aggregate row.
    pub fn is_aggregate(&self) -> bool {
        self.pod == ALL_PODS
    }
}

/// A GPU as the run saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuRecord {
    /// NVML index.
    pub index: u32,
    /// Name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// GPU UUID.
    pub uuid: String,
    /// Memory, bytes.
    pub memory_total_bytes: Option<u64>,
    /// "Enabled", "Disabled", or None when the GPU has no MIG.
    pub mig_mode: Option<String>,
    /// Compute mode, e.g. "Default".
    pub compute_mode: Option<String>,
    /// MIG devices: "MIG 1g.10gb (UUID: MIG-...)".
    pub mig_devices: Vec<String>,
}

/// The machine and software a run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// Host name.
    pub hostname: String,
    /// Operating system and kernel.
    pub os: String,
    /// CPU model.
    pub cpu: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// GPUs (empty without NVML).
    pub gpus: Vec<GpuRecord>,
    /// NVIDIA driver version.
    pub driver_version: Option<String>,
    /// Highest CUDA version the driver supports, e.g. "13.0".
    pub cuda_driver_version: Option<String>,
    /// Whether NVML answered (telemetry available).
    pub nvml: bool,
    /// The MPS control binary used.
    pub mps_control: Option<String>,
    /// The workload binary and its version line.
    pub workload: String,
    /// The harness version.
    pub harness: String,
    /// `git describe` of the checkout, when run from one.
    pub git_revision: Option<String>,
}

/// A strategy that could not run, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unavailable {
    /// The strategy.
    pub strategy: Strategy,
    /// Why, and what an administrator could do.
    pub reason: String,
}

/// The sweep plan as recorded (what `--resume` continues).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRecord {
    /// local or kubernetes.
    pub backend: String,
    /// Strategies in order.
    pub strategies: Vec<Strategy>,
    /// Pod counts in order.
    pub pods: Vec<u32>,
    /// Model preset.
    pub model: String,
    /// Precision.
    pub precision: String,
    /// cuda or cpu.
    pub device: DeviceKind,
    /// Batch per inference.
    pub batch: u32,
    /// Warm-up after readiness, seconds.
    pub warmup_s: f64,
    /// Measurement window, seconds.
    pub window_s: f64,
    /// Measurement cap per cell, seconds.
    pub max_cell_s: f64,
    /// Windows that must agree to end a cell.
    pub stable_windows: u32,
    /// Agreement tolerance (0.05 = 5%).
    pub tolerance: f64,
    /// scrape or prometheus.
    pub source: Source,
    /// The Prometheus setting: off, spawn or a URL.
    pub prometheus: String,
    /// Extra arguments given to every workload pod.
    pub workload_args: Vec<String>,
}

impl PlanRecord {
    /// The plan as recorded in run.json, after device resolution (the CPU smoke pipeline
    /// narrows it to tiny, fp32, time-slicing).
    pub fn from_plan(plan: &SweepPlan, device: DeviceKind, source: Source) -> PlanRecord {
        let smoke = device == DeviceKind::Cpu && plan.device == DeviceChoice::Auto;
        PlanRecord {
            backend: match plan.backend {
                BackendKind::Local => "local".into(),
                BackendKind::Kubernetes => "kubernetes".into(),
            },
            strategies: if smoke {
                vec![Strategy::TimeSlicing]
            } else {
                plan.strategies.clone()
            },
            pods: plan.pods.clone(),
            model: match (plan.model, device) {
                (Some(m), _) if !smoke => m.name().into(),
                (_, DeviceKind::Cpu) => "tiny".into(),
                (_, DeviceKind::Cuda) => "yolos-small".into(),
            },
            precision: match (device, plan.precision) {
                (DeviceKind::Cpu, _) => "fp32".into(),
                (DeviceKind::Cuda, Some(p)) => p.name().into(),
                (DeviceKind::Cuda, None) => "bf16".into(),
            },
            device,
            batch: plan.batch,
            warmup_s: plan.measure.warmup.as_secs_f64(),
            window_s: plan.measure.window.as_secs_f64(),
            max_cell_s: plan.measure.max_cell.as_secs_f64(),
            stable_windows: plan.measure.stable_windows as u32,
            tolerance: plan.measure.tolerance,
            source,
            prometheus: plan.prometheus.text(),
            workload_args: plan.workload_args.clone(),
        }
    }

    /// The measurement settings of the recorded plan (what `--resume` continues with).
    pub fn measure_settings(&self, ready_timeout: std::time::Duration) -> MeasureSettings {
        use std::time::Duration;
        MeasureSettings {
            ready_timeout,
            warmup: Duration::from_secs_f64(self.warmup_s),
            window: Duration::from_secs_f64(self.window_s),
            max_cell: Duration::from_secs_f64(self.max_cell_s),
            stable_windows: self.stable_windows as usize,
            tolerance: self.tolerance,
        }
    }

    /// The arguments every workload pod gets.
    pub fn workload_args(&self) -> Vec<String> {
        let mut a = vec![
            "--model".to_string(),
            self.model.clone(),
            "--device".into(),
            self.device.name().into(),
            "--precision".into(),
            self.precision.clone(),
            "--batch".into(),
            self.batch.to_string(),
        ];
        a.extend(self.workload_args.iter().cloned());
        a
    }

    /// The recorded metrics source setting.
    pub fn prometheus_setting(&self) -> PrometheusSetting {
        match self.prometheus.as_str() {
            "off" => PrometheusSetting::Off,
            "spawn" => PrometheusSetting::Spawn,
            url => PrometheusSetting::Url(url.to_string()),
        }
    }
}

/// `run.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Run identifier (the directory name).
    pub run_id: String,
    /// running, complete or interrupted.
    pub state: String,
    /// When the run started (RFC 3339, UTC).
    pub started_at: String,
    /// When it ended.
    pub finished_at: Option<String>,
    /// Set when the numbers are not a GPU measurement (CPU smoke run, emulation).
    pub label: Option<String>,
    /// What was asked.
    pub plan: PlanRecord,
    /// Where it ran.
    pub environment: Environment,
    /// Strategies that could not run here.
    pub unavailable: Vec<Unavailable>,
}

impl RunRecord {
    /// A new run's record: `running`, started now, labelled when it is not a GPU
    /// measurement.
    pub fn new(run_id: String, plan: &SweepPlan, device: DeviceKind, environment: Environment) -> RunRecord {
        let source = match plan.prometheus {
            PrometheusSetting::Off if plan.backend == BackendKind::Local => Source::Scrape,
            _ => Source::Prometheus,
        };
        let label = match (device, plan.device) {
            (DeviceKind::Cpu, DeviceChoice::Auto) => Some(CPU_SMOKE_LABEL.to_string()),
            (DeviceKind::Cpu, _) => Some(CPU_RUN_LABEL.to_string()),
            (DeviceKind::Cuda, _) => None,
        };
        RunRecord {
            run_id,
            state: "running".into(),
            started_at: now_rfc3339(),
            finished_at: None,
            label,
            plan: PlanRecord::from_plan(plan, device, source),
            environment,
            unavailable: Vec::new(),
        }
    }
}

/// Renders rows as CSV: the header comes from the struct's fields (the `csv` exporter
/// and `cells.csv` both use this).
pub fn cells_csv(cells: &[CellRecord]) -> crate::error::Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for c in cells {
        w.serialize(c).map_err(|e| crate::error::BenchError::Results {
            path: "cells.csv".into(),
            reason: e.to_string(),
        })?;
    }
    w.into_inner().map_err(|e| crate::error::BenchError::Results {
        path: "cells.csv".into(),
        reason: e.to_string(),
    })
}

/// Renders rows as JSON lines (`cells.jsonl`).
pub fn cells_jsonl(cells: &[CellRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in cells {
        // Serialising our own plain struct cannot fail.
        out.extend(serde_json::to_vec(c).unwrap_or_default());
        out.push(b'\n');
    }
    out
}

/// Now, RFC 3339 in UTC with seconds.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
