//! The records a run leaves on disk: one [`CellRecord`] per pod per cell plus one
//! aggregate row per cell (`pod = "all"`) in `cells.csv` and `cells.jsonl`, and one
//! [`RunRecord`] in `run.json`. CSV, JSON and Markdown all derive from these structs;
//! there is no second, hand-kept list of columns.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::plan::{BackendKind, DeviceChoice, MAX_REPEAT, MeasureSettings, PrometheusSetting, SweepPlan};
use crate::domain::{CellStatus, DeviceKind, Source, Strategy};
use crate::error::{BenchError, Result};
pub use crate::telemetry::environment::{Environment, GpuRecord};

/// The label every CPU smoke run carries, in run.json, on the terminal and in reports.
pub const CPU_SMOKE_LABEL: &str = "CPU SMOKE RUN: no usable GPU, so the tiny model ran on the CPU; these numbers test the pipeline and say nothing about GPU sharing";

/// The label of a CPU run of a server of the user's own.
pub const OWN_SERVER_CPU_LABEL: &str =
    "CPU RUN: your server ran where the harness found no usable GPU (or with --device cpu); not a GPU measurement";
/// The label of a CPU run made with `--device cpu`.
pub const CPU_RUN_LABEL: &str = "CPU RUN (--device cpu): the workload ran on the CPU; not a GPU measurement";

/// The `pod` value of a cell's aggregate row.
pub const ALL_PODS: &str = "all";

/// How the `pod` value of a cell's row on one GPU begins (`gpu:<the GPU's UUID>`): a
/// cell that filled several GPUs has one such row per GPU besides its pooled aggregate.
/// No pod name has a colon.
pub const GPU_ROW_PREFIX: &str = "gpu:";

/// One row of `cells.csv`: a pod of a cell, the cell's aggregate (`pod = "all"`), or,
/// for a cell that filled several GPUs, one GPU's pods pooled (`pod = "gpu:<UUID>"`).
/// Numbers that were not measured are empty (`None`), never zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    /// The run this row belongs to.
    pub run_id: String,
    /// Sharing strategy.
    pub strategy: Strategy,
    /// Pods requested in this cell.
    pub pods: u32,
    /// Which pass over the plan measured it, from 1 (`--repeat N`: 1 to N).
    #[serde(default = "first_repeat")]
    pub repeat: u32,
    /// Pod name, or `all`.
    pub pod: String,
    /// Outcome.
    pub status: CellStatus,
    /// Inferences completed during the measurement.
    pub inferences: Option<u64>,
    /// Inferences per second (a pod: over its own measured interval; the aggregate: all
    /// pods' inferences over the cell's measured time, the time base fairness uses).
    pub throughput_per_s: Option<f64>,
    /// Exact mean latency (Δsum / Δcount), seconds.
    pub mean_s: Option<f64>,
    /// Median latency (histogram_quantile), seconds.
    pub p50_s: Option<f64>,
    /// 90th percentile latency, seconds.
    pub p90_s: Option<f64>,
    /// 99th percentile latency, seconds.
    pub p99_s: Option<f64>,
    /// Resolution of p50/p90/p99: the relative width of the widest histogram bucket they
    /// were interpolated in (0.0219 = ±2.2%).
    #[serde(default)]
    pub quantile_resolution: Option<f64>,
    /// The low end of p99's 95% sampling interval, seconds: distribution-free, the
    /// order statistic at the binomial rank below it, read from the histogram (empty:
    /// too few requests to bound it).
    #[serde(default)]
    pub p99_low_s: Option<f64>,
    /// The high end of p99's 95% sampling interval, seconds (empty: too few requests
    /// to bound it; p99 needs at least 368).
    #[serde(default)]
    pub p99_high_s: Option<f64>,
    /// The low end of p50's 95% sampling interval, seconds (as `p99_low_s`).
    #[serde(default)]
    pub p50_low_s: Option<f64>,
    /// The high end of p50's 95% sampling interval, seconds.
    #[serde(default)]
    pub p50_high_s: Option<f64>,
    /// The low end of p90's 95% sampling interval, seconds.
    #[serde(default)]
    pub p90_low_s: Option<f64>,
    /// The high end of p90's 95% sampling interval, seconds.
    #[serde(default)]
    pub p90_high_s: Option<f64>,
    /// Failed or dropped inferences during the measurement.
    pub errors: Option<u64>,
    /// Open loop, a pod's row: requests waiting at the end of the measurement less
    /// those waiting at its start, as the pod reports them (`workload_queue_depth`) or
    /// the harness counts them (`--request`); empty where neither says.
    #[serde(default)]
    pub backlog_growth: Option<f64>,
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
    /// Window-to-window spread of the median latency (moves in bucket steps).
    pub p50_spread: Option<f64>,
    /// Window-to-window spread of the mean latency (what the stability rule judges,
    /// with throughput).
    #[serde(default)]
    pub mean_spread: Option<f64>,
    /// Exit code of a pod that stopped on its own.
    pub exit_code: Option<i32>,
    /// Model preset.
    pub model: String,
    /// Arithmetic precision.
    pub precision: String,
    /// When the cell's measurement started (RFC 3339, UTC).
    pub started_at: String,
    /// Kubernetes: seconds from the first change for this cell to the node serving its
    /// configuration (0 when it already did; aggregate rows).
    #[serde(default)]
    pub switch_s: Option<f64>,
    /// Kubernetes: of which the MIG reconfiguration (mig-parted to a fresh device
    /// plugin), seconds.
    #[serde(default)]
    pub mig_reconfigure_s: Option<f64>,
    /// Seconds from launching the cell's pods to all of them ready (locally with an
    /// MPS cell's control daemon; aggregate rows).
    #[serde(default)]
    pub pods_ready_s: Option<f64>,
    /// Seconds of warm-up before the windows (aggregate rows): `--warmup`, or less where
    /// the pods were steady sooner.
    #[serde(default)]
    pub warmup_s: Option<f64>,
    /// Seconds to stop the cell's pods (and an MPS cell's daemon; aggregate rows).
    #[serde(default)]
    pub stop_s: Option<f64>,
    /// Requests per second offered under `--load poisson:RATE` or `total:RATE`: the
    /// pod's rate on its row, the cell's (rate × pods) on the aggregate row.
    #[serde(default)]
    pub offered_per_s: Option<f64>,
    /// `--slo p50=…`: the share of requests within its threshold (None: no such SLO,
    /// nothing measured, or the pod could not keep up with its offered load).
    #[serde(default)]
    pub slo_p50_attainment: Option<f64>,
    /// `--slo p90=…`: as `slo_p50_attainment`.
    #[serde(default)]
    pub slo_p90_attainment: Option<f64>,
    /// `--slo p99=…`: as `slo_p50_attainment`.
    #[serde(default)]
    pub slo_p99_attainment: Option<f64>,
    /// How far each attainment can be off: the largest share of requests in a histogram
    /// bucket that holds a threshold, which interpolation splits (0 at a bucket bound).
    #[serde(default)]
    pub slo_attainment_bound: Option<f64>,
    /// Whether every SLO held: each attainment at least its percentile.
    #[serde(default)]
    pub slo_met: Option<bool>,
    /// Requests per second completed within the tightest SLO threshold.
    #[serde(default)]
    pub goodput_per_s: Option<f64>,
    /// The seed of the pod's open-loop arrival times, as the pod reported it
    /// (`workload_info{load_seed}`; per-pod rows under `--load poisson:RATE`).
    #[serde(default)]
    pub load_seed: Option<u64>,
    /// Time-slicing through DRA with `--timeslice`: the interval the cell's claim set
    /// (its own rows beside the other intervals'; empty otherwise).
    #[serde(default)]
    pub timeslice: Option<crate::domain::TimeSliceInterval>,
    /// MPS with `--mps-threads`: each client's share of the SMs, percent (empty: auto,
    /// the device plugin's equal split, and on other strategies' rows).
    #[serde(default)]
    pub mps_threads: Option<crate::domain::MpsThreads>,
    /// MPS with `--mps-memory`: each client's pinned memory, `none` or a size (empty:
    /// auto, and on other strategies' rows).
    #[serde(default)]
    pub mps_memory: Option<crate::domain::MpsMemory>,
    /// Local `--gpus`: the index of the GPU that measured the cell (`environment.gpus`
    /// has its UUID); empty on a run of one GPU.
    #[serde(default)]
    pub gpu: Option<u32>,
    /// Local `--gpus`: how many other GPUs ran a cell of the run, on average, while
    /// this cell ran (launch to stop; aggregate rows). 0: it ran alone.
    #[serde(default)]
    pub other_gpus_busy: Option<f64>,
    /// The UUID of the GPU a pod ran on, as the pod reported it
    /// (`workload_info{device_uuid}`), or of a GPU row's GPU. Empty when not reported.
    #[serde(default)]
    pub gpu_uuid: Option<String>,
    /// A cell that filled several GPUs of a node (Kubernetes, device plugin): how many,
    /// `pods` asked on each (aggregate rows; empty: one GPU).
    #[serde(default)]
    pub gpus: Option<u32>,
    /// What slowed the GPU's clocks during the measurement (NVML's thermal and hardware
    /// slowdown reasons): `none`, or the reasons and in how many of the once-a-second
    /// samples (aggregate rows; empty: not read, as on the CPU or Kubernetes).
    #[serde(default)]
    pub clock_slowdown: Option<String>,
    /// The share of samples whose clocks were held at the board's power limit
    /// (aggregate rows; empty: not read).
    #[serde(default)]
    pub power_capped: Option<f64>,
    /// The share of samples with a slowdown (those `clock_slowdown` names; aggregate
    /// rows; empty: the reasons were not read).
    #[serde(default)]
    pub throttled_share: Option<f64>,
    /// The SM clock over the measurement's samples, MHz: mean (aggregate rows; empty:
    /// not read).
    #[serde(default)]
    pub sm_clock_mhz: Option<f64>,
    /// Its lowest sample, MHz.
    #[serde(default)]
    pub sm_clock_min_mhz: Option<f64>,
    /// The memory clock, MHz: mean.
    #[serde(default)]
    pub mem_clock_mhz: Option<f64>,
    /// Its lowest sample, MHz.
    #[serde(default)]
    pub mem_clock_min_mhz: Option<f64>,
    /// The GPU's temperature, °C: mean.
    #[serde(default)]
    pub temp_c: Option<f64>,
    /// Its highest sample, °C.
    #[serde(default)]
    pub temp_max_c: Option<f64>,
    /// Streamed answers (`--stream`): output tokens of the requests completed while
    /// measured (the server's `usage`, else the steps with text).
    #[serde(default)]
    pub output_tokens: Option<u64>,
    /// Those tokens per second (a pod's; the aggregate's: the GPU's).
    #[serde(default)]
    pub output_tokens_per_s: Option<f64>,
    /// Time to first token, from each request's scheduled arrival, seconds: mean.
    #[serde(default)]
    pub ttft_mean_s: Option<f64>,
    /// Its median.
    #[serde(default)]
    pub ttft_p50_s: Option<f64>,
    /// Its 90th percentile.
    #[serde(default)]
    pub ttft_p90_s: Option<f64>,
    /// Its 99th percentile.
    #[serde(default)]
    pub ttft_p99_s: Option<f64>,
    /// Inter-token latency (every gap between two tokens), seconds: mean.
    #[serde(default)]
    pub itl_mean_s: Option<f64>,
    /// Its median.
    #[serde(default)]
    pub itl_p50_s: Option<f64>,
    /// Its 90th percentile.
    #[serde(default)]
    pub itl_p90_s: Option<f64>,
    /// Its 99th percentile.
    #[serde(default)]
    pub itl_p99_s: Option<f64>,
    /// The gaps measured.
    #[serde(default)]
    pub itl_count: Option<u64>,
    /// Time per output token after the first, one per request of two tokens or more
    /// (vLLM's TPOT), seconds: mean.
    #[serde(default)]
    pub tpot_mean_s: Option<f64>,
    /// Its 99th percentile.
    #[serde(default)]
    pub tpot_p99_s: Option<f64>,
    /// The requests it was measured on.
    #[serde(default)]
    pub tpot_count: Option<u64>,
    /// With a `ttft:` objective: the share of requests whose first token came within its
    /// threshold.
    #[serde(default)]
    pub ttft_slo_attainment: Option<f64>,
    /// With an `itl:` objective: the share of gaps within its threshold.
    #[serde(default)]
    pub itl_slo_attainment: Option<f64>,
    /// With a `tpot:` objective: the share of requests within its threshold.
    #[serde(default)]
    pub tpot_slo_attainment: Option<f64>,
    /// With `--server-ttft-metric`: the server's own time to first token over the cell
    /// (from its histogram's increments, interpolated within its buckets), seconds: mean.
    #[serde(default)]
    pub server_ttft_mean_s: Option<f64>,
    /// Its median.
    #[serde(default)]
    pub server_ttft_p50_s: Option<f64>,
    /// Its 99th percentile.
    #[serde(default)]
    pub server_ttft_p99_s: Option<f64>,
    /// The requests it counted.
    #[serde(default)]
    pub server_ttft_count: Option<u64>,
    /// With `--server-itl-metric`: the server's own inter-token latency, seconds: mean.
    #[serde(default)]
    pub server_itl_mean_s: Option<f64>,
    /// Its median.
    #[serde(default)]
    pub server_itl_p50_s: Option<f64>,
    /// Its 99th percentile.
    #[serde(default)]
    pub server_itl_p99_s: Option<f64>,
    /// The gaps it counted.
    #[serde(default)]
    pub server_itl_count: Option<u64>,
}

/// The repeat of a row or plan recorded before `--repeat` existed: the only one.
fn first_repeat() -> u32 {
    1
}

impl CellRecord {
    /// What a reader must know before trusting a measured cell's numbers, in a few words:
    /// its windows did not settle (by how much they differ), a pod could not keep up
    /// with its offered load, an SLO was left undecided, a pod's histogram was left out,
    /// or the GPU throttled. Empty for a clean cell.
    pub fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        if self.note.contains("did not settle") {
            let spread = [self.mean_spread, self.throughput_spread]
                .into_iter()
                .flatten()
                .fold(0.0_f64, f64::max);
            flags.push(format!("unsettled: windows differ by {:.0}%", spread * 100.0));
        }
        if self.note.contains("could not keep up") {
            flags.push("a pod could not keep up with its load".to_string());
        }
        if self.note.contains("undecided at 95%") {
            flags.push("an SLO undecided at 95% when the cell ended".to_string());
        }
        if self.note.contains("left out of the cell's quantiles") {
            flags.push("a pod's histogram left out of the quantiles".to_string());
        }
        if let Some(slowdown) = self.clock_slowdown.as_deref().filter(|s| *s != "none") {
            flags.push(format!("throttled: {slowdown}"));
        }
        flags
    }

    /// A row that names its cell and pod and holds no measurement (every number empty,
    /// labels empty): what a sweep fills in, and the CSV header's probe.
    pub fn unmeasured(
        strategy: Strategy,
        pods: u32,
        pod: &str,
        status: CellStatus,
        source: Source,
        device: DeviceKind,
    ) -> CellRecord {
        CellRecord {
            run_id: String::new(),
            strategy,
            pods,
            repeat: 1,
            pod: pod.to_string(),
            status,
            inferences: None,
            throughput_per_s: None,
            mean_s: None,
            p50_s: None,
            p90_s: None,
            p99_s: None,
            quantile_resolution: None,
            p99_low_s: None,
            p99_high_s: None,
            p50_low_s: None,
            p50_high_s: None,
            p90_low_s: None,
            p90_high_s: None,
            backlog_growth: None,
            errors: None,
            fairness: None,
            gpu_util_pct: None,
            gpu_mem_bytes: None,
            power_w: None,
            energy_j_per_inference: None,
            source,
            device,
            note: String::new(),
            speedup_vs_1pod: None,
            slowdown_vs_1pod: None,
            duration_s: None,
            windows: None,
            throughput_spread: None,
            p50_spread: None,
            mean_spread: None,
            exit_code: None,
            model: String::new(),
            precision: String::new(),
            started_at: String::new(),
            switch_s: None,
            mig_reconfigure_s: None,
            pods_ready_s: None,
            warmup_s: None,
            stop_s: None,
            offered_per_s: None,
            slo_p50_attainment: None,
            slo_p90_attainment: None,
            slo_p99_attainment: None,
            slo_attainment_bound: None,
            slo_met: None,
            goodput_per_s: None,
            load_seed: None,
            timeslice: None,
            mps_threads: None,
            mps_memory: None,
            gpu: None,
            other_gpus_busy: None,
            gpu_uuid: None,
            gpus: None,
            clock_slowdown: None,
            power_capped: None,
            throttled_share: None,
            sm_clock_mhz: None,
            sm_clock_min_mhz: None,
            mem_clock_mhz: None,
            mem_clock_min_mhz: None,
            temp_c: None,
            temp_max_c: None,
            output_tokens: None,
            output_tokens_per_s: None,
            ttft_mean_s: None,
            ttft_p50_s: None,
            ttft_p90_s: None,
            ttft_p99_s: None,
            itl_mean_s: None,
            itl_p50_s: None,
            itl_p90_s: None,
            itl_p99_s: None,
            itl_count: None,
            tpot_mean_s: None,
            tpot_p99_s: None,
            tpot_count: None,
            ttft_slo_attainment: None,
            itl_slo_attainment: None,
            tpot_slo_attainment: None,
            server_ttft_mean_s: None,
            server_ttft_p50_s: None,
            server_ttft_p99_s: None,
            server_ttft_count: None,
            server_itl_mean_s: None,
            server_itl_p50_s: None,
            server_itl_p99_s: None,
            server_itl_count: None,
        }
    }

    /// The arm the row belongs to: its strategy, DRA time-slice interval and MPS
    /// client limits.
    pub fn arm(&self) -> crate::domain::Arm {
        crate::domain::Arm {
            strategy: self.strategy,
            timeslice: self.timeslice,
            mps: crate::domain::MpsLimits {
                threads: self.mps_threads.unwrap_or_default(),
                memory: self.mps_memory.unwrap_or_default(),
            },
        }
    }

    /// Whether this is a cell's aggregate row.
    pub fn is_aggregate(&self) -> bool {
        self.pod == ALL_PODS
    }

    /// Whether this is a cell's row for one of the GPUs it filled (`gpu:N`).
    pub fn is_gpu_row(&self) -> bool {
        self.pod.starts_with(GPU_ROW_PREFIX)
    }

    /// Whether this is one pod's row.
    pub fn is_pod(&self) -> bool {
        !self.is_aggregate() && !self.is_gpu_row()
    }

    /// Pods asked of the cell in all: `pods` on each GPU it filled.
    pub fn pods_asked(&self) -> u32 {
        self.pods * self.gpus.unwrap_or(1)
    }
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
    pub backend: BackendKind,
    /// Strategies in order.
    pub strategies: Vec<Strategy>,
    /// Pod counts in order.
    pub pods: Vec<u32>,
    /// Model preset (`custom`: a server of the user's own; in an isolation run beside
    /// one, the model its gpushare-workload aggressors run).
    pub model: String,
    /// Precision.
    pub precision: String,
    /// cuda or cpu.
    pub device: DeviceKind,
    /// Batch per inference.
    pub batch: u32,
    /// Warm-up after readiness, seconds: its longest where `warmup_steady`.
    pub warmup_s: f64,
    /// The warm-up ended once the pods were steady (`warmup_s` at most); false: always
    /// `warmup_s` (`--fixed-warmup`, and every run recorded before the rule).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warmup_steady: bool,
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
    /// Passes over the whole plan (`--repeat`), each in a rotated strategy order; with a
    /// precision target, the most.
    #[serde(default = "first_repeat")]
    pub repeat: u32,
    /// `--target`: passes go on over the cells whose 95% interval on mean latency or
    /// throughput is wider than this share of their mean (0.01: ±1%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<f64>,
    /// `--budget`: the most wall time of such a sweep, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_s: Option<f64>,
    /// How the pods got their requests (`--load`: closed, poisson:RATE, total:RATE).
    #[serde(default)]
    pub load: crate::config::values::Load,
    /// The latency objectives the rows are judged against (`--slo`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slos: Vec<crate::config::values::Slo>,
    /// The user's own server (`--workload-cmd`) instead of gpushare-workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_cmd: Option<String>,
    /// The user's own server as its image runs it (`--server-image`, Kubernetes): the
    /// entrypoint's arguments, `{port}` as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_args: Option<Vec<String>>,
    /// The latency histogram read (`--metric`).
    #[serde(default = "default_metric", skip_serializing_if = "is_default_metric")]
    pub metric: String,
    /// The readiness path, or `none` (`--ready-path`).
    #[serde(default = "default_ready_path", skip_serializing_if = "is_default_ready_path")]
    pub ready_path: String,
    /// The harness's own requests to that server (`--request`, `--body`); the rows'
    /// source is then `client`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<crate::config::request::RequestPlan>,
    /// Kubernetes: how pods got their share (`--sharing-api`; absent: device-plugin).
    #[serde(default, skip_serializing_if = "is_device_plugin")]
    pub sharing_api: crate::config::values::SharingApi,
    /// Kubernetes with DRA: the claims' time-slice intervals as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra: Option<crate::config::plan::DraSettings>,
    /// MPS: each client's shares of the SMs, each its own arm (`--mps-threads`; absent:
    /// auto).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mps_threads: Vec<crate::domain::MpsThreads>,
    /// MPS: each client's pinned memory limits, each its own arm (`--mps-memory`;
    /// absent: auto).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mps_memory: Vec<crate::domain::MpsMemory>,
    /// Local: the GPU asked for (`--gpu`; absent: GPU 0). The GPU measured is the one
    /// `environment.gpus` records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<crate::telemetry::inventory::GpuSelector>,
    /// Local sweep: the GPUs asked for (`--gpus`; absent: one GPU), whose cells ran in
    /// parallel. `environment.gpus` records them in this order, each cell row its `gpu`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<crate::telemetry::inventory::GpuSelector>,
    /// Local: measured although other processes computed on the GPU (`--allow-busy-gpu`);
    /// `environment.gpu_processes` names them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_busy_gpu: bool,
}

fn is_device_plugin(api: &crate::config::values::SharingApi) -> bool {
    *api == crate::config::values::SharingApi::DevicePlugin
}

fn default_metric() -> String {
    crate::config::plan::DEFAULT_METRIC.to_string()
}

fn is_default_metric(m: &str) -> bool {
    m == crate::config::plan::DEFAULT_METRIC
}

fn default_ready_path() -> String {
    crate::config::plan::DEFAULT_READY_PATH.to_string()
}

fn is_default_ready_path(p: &str) -> bool {
    p == crate::config::plan::DEFAULT_READY_PATH
}

impl PlanRecord {
    /// The recorded sweep's arms in order (as [`SweepPlan::arms`]).
    pub fn arms(&self) -> Vec<crate::domain::Arm> {
        let none = Vec::new();
        let timeslices = self.dra.as_ref().map_or(&none, |d| &d.timeslices);
        crate::domain::arms(&self.strategies, timeslices, (&self.mps_threads, &self.mps_memory))
    }

    /// The plan as recorded in run.json, after device resolution (the CPU smoke pipeline
    /// narrows it to tiny, fp32, time-slicing).
    pub fn from_plan(plan: &SweepPlan, device: DeviceKind, source: Source) -> PlanRecord {
        let smoke = device == DeviceKind::Cpu && plan.device == DeviceChoice::Auto;
        PlanRecord {
            backend: plan.backend_kind(),
            // The smoke pipeline runs time-slicing of what was asked; asked for none, the
            // strategies stay as asked and are unavailable (never silently replaced).
            strategies: if smoke && plan.strategies.contains(&Strategy::TimeSlicing) {
                vec![Strategy::TimeSlicing]
            } else {
                plan.strategies.clone()
            },
            pods: plan.pods.clone(),
            model: match (plan.model, device) {
                // The rows say whose numbers they are. An isolation run beside a
                // server of the user's own records its aggressors' model (they run it).
                _ if plan.own_server() && plan.kind.isolation().is_none() => "custom".into(),
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
            // A Prometheus source's series move at its scrape interval: its warm-up is fixed.
            warmup_steady: plan.measure.steady_warmup && source != Source::Prometheus,
            window_s: plan.measure.window.as_secs_f64(),
            max_cell_s: plan.measure.max_cell.as_secs_f64(),
            stable_windows: plan.measure.stable_windows as u32,
            tolerance: plan.measure.tolerance,
            source,
            prometheus: plan.prometheus.to_string(),
            workload_args: plan.workload_args.clone(),
            repeat: plan.repeat,
            target: plan.target,
            budget_s: plan.budget.map(|b| b.as_secs_f64()),
            load: plan.load,
            slos: plan.slos.clone(),
            workload_cmd: plan.workload_cmd.clone(),
            server_args: plan.server_args().cloned(),
            metric: plan.metric.clone(),
            ready_path: plan.ready_path.clone(),
            request: plan.request.clone(),
            sharing_api: plan.sharing_api(),
            dra: plan.dra().cloned(),
            mps_threads: plan.mps_threads.clone(),
            mps_memory: plan.mps_memory.clone(),
            gpu: plan.local().and_then(|l| l.gpu.clone()),
            gpus: plan.gpus().to_vec(),
            allow_busy_gpu: plan.local().is_some_and(|l| l.allow_busy_gpu),
        }
    }

    /// Whether the pods ran a server of the user's own (`--workload-cmd` or
    /// `--server-image`).
    pub fn own_server(&self) -> bool {
        self.workload_cmd.is_some() || self.server_args.is_some()
    }

    /// How the user's own server ran, for a report's sentence: `` `CMD` `` or its image's
    /// entrypoint with its arguments; None for gpushare-workload.
    pub fn own_server_text(&self) -> Option<String> {
        match (&self.workload_cmd, &self.server_args) {
            (Some(cmd), _) => Some(format!("`{cmd}`")),
            (None, Some(args)) if args.is_empty() => Some("its image as it runs".into()),
            (None, Some(args)) => Some(format!("its image's entrypoint with `{}`", args.join(" "))),
            (None, None) => None,
        }
    }

    /// The measurement settings of the recorded plan (what `--resume` continues with).
    pub fn measure_settings(&self, ready_timeout: std::time::Duration) -> MeasureSettings {
        use std::time::Duration;
        MeasureSettings {
            ready_timeout,
            warmup: Duration::from_secs_f64(self.warmup_s),
            steady_warmup: self.warmup_steady,
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
    /// What the run measured: an isolation run's plan (`isolation`: its records are in
    /// isolation.jsonl and its cells.jsonl stays empty), a capacity run's search
    /// (`capacity`: its cells are those the search measured, a subset of the plan's pod
    /// counts), or neither for a sweep.
    #[serde(flatten)]
    pub kind: crate::config::plan::RunKind,
}

impl RunRecord {
    /// A new run's record: `running`, started now, labelled when it is not a GPU
    /// measurement.
    pub fn new(run_id: String, plan: &SweepPlan, device: DeviceKind, environment: Environment) -> RunRecord {
        let source = match plan.prometheus {
            PrometheusSetting::Off if plan.request.is_some() => Source::Client,
            PrometheusSetting::Off if plan.backend_kind() == BackendKind::Local => Source::Scrape,
            _ => Source::Prometheus,
        };
        let label = match (device, plan.device) {
            // A server of the user's own ran as it runs; the harness only knows there
            // was no GPU for it (no tiny model is involved).
            (DeviceKind::Cpu, _) if plan.own_server() && plan.kind.isolation().is_none() => {
                Some(OWN_SERVER_CPU_LABEL.to_string())
            }
            (DeviceKind::Cpu, DeviceChoice::Auto) => Some(CPU_SMOKE_LABEL.to_string()),
            (DeviceKind::Cpu, _) => Some(CPU_RUN_LABEL.to_string()),
            (DeviceKind::Cuda, _) => None,
        };
        RunRecord {
            run_id,
            state: "running".into(),
            started_at: crate::clock::now_rfc3339(),
            finished_at: None,
            label,
            plan: PlanRecord::from_plan(plan, device, source),
            environment,
            unavailable: Vec::new(),
            kind: plan.kind.clone(),
        }
    }
}

/// Renders rows as CSV: the header comes from the struct's fields (the `csv` exporter
/// and `cells.csv` both use this). A run without rows still gets its header line.
pub fn cells_csv(cells: &[CellRecord]) -> Result<Vec<u8>> {
    let csv_err = |e: &dyn std::fmt::Display| BenchError::Results {
        path: "cells.csv".into(),
        reason: e.to_string(),
    };
    if cells.is_empty() {
        return csv_header();
    }
    let mut w = csv::Writer::from_writer(Vec::new());
    for c in cells {
        w.serialize(c).map_err(|e| csv_err(&e))?;
    }
    w.into_inner().map_err(|e| csv_err(&e))
}

/// The CSV header line alone. The csv crate writes a struct's header only with its first
/// record, so one probe record is serialised and only its first line kept: the columns
/// still come from the struct, never from a second list.
fn csv_header() -> Result<Vec<u8>> {
    let probe = CellRecord::unmeasured(
        Strategy::Exclusive,
        1,
        ALL_PODS,
        CellStatus::Ok,
        Source::Scrape,
        DeviceKind::Cpu,
    );
    let mut bytes = cells_csv(std::slice::from_ref(&probe))?;
    // Field names are plain identifiers, so the header is exactly the first line.
    let end = bytes.iter().position(|b| *b == b'\n').map_or(bytes.len(), |i| i + 1);
    bytes.truncate(end);
    Ok(bytes)
}

/// The longest duration a recorded plan may hold: 7 days, in seconds.
pub const MAX_RECORDED_SECONDS: f64 = crate::config::values::MAX_SPAN.as_secs() as f64;

/// The shortest measurement window a recorded plan may hold, seconds (as `--window`:
/// shorter windows measure scrape jitter).
pub const MIN_RECORDED_WINDOW_S: f64 = crate::config::plan::MIN_WINDOW.as_millis() as f64 / 1000.0;

/// One line error about a field of a file read back from disk.
fn bad_field(path: &Path, field: &str, reason: impl std::fmt::Display) -> BenchError {
    BenchError::RunDir {
        path: path.to_path_buf(),
        reason: format!("{field}: {reason}"),
    }
}

/// A number for messages: plain, or in exponent form when it is huge (1e300).
fn shown(v: f64) -> String {
    if v.is_finite() && v.abs() < 1e9 {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// "1, 3, 5" for messages.
fn listed<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

impl PlanRecord {
    /// Checks a recorded plan as strictly as the flags that make one: `path` is the
    /// run.json it came from, named with the field in every error. `--resume`, `report`,
    /// `export` and `compare` call this before trusting a plan read back from disk.
    pub fn validate(&self, path: &Path) -> Result<()> {
        if !crate::config::plan::is_metric_name(&self.metric) {
            return Err(bad_field(
                path,
                "plan.metric",
                format!("{:?} is not a metric name", self.metric),
            ));
        }
        if !crate::config::plan::is_ready_path(&self.ready_path) {
            return Err(bad_field(
                path,
                "plan.ready_path",
                format!("{:?} is neither an HTTP path nor \"none\"", self.ready_path),
            ));
        }
        if let Some(cmd) = &self.workload_cmd
            && !cmd.contains("{port}")
        {
            return Err(bad_field(path, "plan.workload_cmd", format!("{cmd:?} has no {{port}}")));
        }
        if self.server_args.is_some() && (self.workload_cmd.is_some() || self.backend != BackendKind::Kubernetes) {
            return Err(bad_field(
                path,
                "plan.server_args",
                "an image's entrypoint is the Kubernetes backend's, and instead of plan.workload_cmd",
            ));
        }
        if (self.sharing_api == crate::config::values::SharingApi::Dra) != self.dra.is_some()
            || (self.dra.is_some() && self.backend != BackendKind::Kubernetes)
        {
            return Err(bad_field(
                path,
                "plan.dra",
                "DRA settings belong to a Kubernetes run with sharing_api dra, and such a run has them",
            ));
        }
        if let Some(d) = &self.dra {
            let mut seen = d.timeslices.clone();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() != d.timeslices.len() {
                return Err(bad_field(path, "plan.dra.timeslices", "an interval is listed twice"));
            }
            if !d.timeslices.is_empty() && !self.strategies.contains(&Strategy::TimeSlicing) {
                return Err(bad_field(
                    path,
                    "plan.dra.timeslices",
                    "intervals of time-slicing, which plan.strategies does not list",
                ));
            }
        }
        // MPS's client limits: each value once, MPS swept, and only auto where the device
        // plugin shares the GPU (its config has no per-client setting).
        for (field, values) in [
            (
                "plan.mps_threads",
                self.mps_threads.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ),
            (
                "plan.mps_memory",
                self.mps_memory.iter().map(ToString::to_string).collect(),
            ),
        ] {
            let mut seen = values.clone();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() != values.len() {
                return Err(bad_field(path, field, "a value is listed twice"));
            }
            if !values.is_empty() && !self.strategies.contains(&Strategy::Mps) {
                return Err(bad_field(
                    path,
                    field,
                    "limits of MPS, which plan.strategies does not list",
                ));
            }
            if self.backend == BackendKind::Kubernetes && self.dra.is_none() && values.iter().any(|v| v != "auto") {
                return Err(bad_field(
                    path,
                    field,
                    "a limit other than auto on the device plugin's MPS sharing, which has none per client",
                ));
            }
        }
        if self.backend == BackendKind::Kubernetes && self.ready_path == "none" {
            return Err(bad_field(
                path,
                "plan.ready_path",
                "none on Kubernetes: the kubelet's probe needs a path",
            ));
        }
        if self.request.is_some() && self.backend != BackendKind::Local {
            return Err(bad_field(
                path,
                "plan.request",
                "the harness's own requests are the local backend's only",
            ));
        }
        if self.own_server() && self.request.is_none() && self.load != crate::config::values::Load::Closed {
            return Err(bad_field(
                path,
                "plan.load",
                "a server of your own that makes its own requests: its load is closed",
            ));
        }
        if let Some(r) = &self.request {
            if self.workload_cmd.is_none() {
                return Err(bad_field(
                    path,
                    "plan.request",
                    "requests go to a server of your own: plan.workload_cmd is missing",
                ));
            }
            r.validate()
                .map_err(|reason| bad_field(path, "plan.request.url", reason))?;
            if self.ready_path == "none"
                || self.source != Source::Client
                || self.prometheus != "off"
                || self.metric != crate::config::plan::DEFAULT_METRIC
            {
                return Err(bad_field(
                    path,
                    "plan.request",
                    "the harness's requests need a readiness path and are recorded with source client, no Prometheus and the default metric",
                ));
            }
            if let Some(st) = &r.stream {
                if r.body.is_some() {
                    return Err(bad_field(
                        path,
                        "plan.request.body",
                        "streamed requests are written by the harness: no body",
                    ));
                }
                if st.model.trim().is_empty() {
                    return Err(bad_field(path, "plan.request.stream.model", "empty"));
                }
                let max = crate::config::values::MAX_TOKENS;
                if st.lengths.len() > crate::config::values::MAX_LENGTH_PAIRS
                    || st.lengths.iter().flatten().any(|n| *n == 0 || *n > max)
                {
                    return Err(bad_field(
                        path,
                        "plan.request.stream.lengths",
                        format!(
                            "token counts from 1 to {max}, at most {} pairs",
                            crate::config::values::MAX_LENGTH_PAIRS
                        ),
                    ));
                }
                if !self.gpus.is_empty() {
                    return Err(bad_field(path, "plan.gpus", "streamed answers are measured on one GPU"));
                }
            }
        }
        let streamed = self.request.as_ref().is_some_and(|r| r.stream.is_some());
        for (i, slo) in self.slos.iter().enumerate() {
            let m = slo.metric;
            if m.is_token() && !streamed {
                return Err(bad_field(
                    path,
                    "plan.slos",
                    format!("{slo} is an objective on tokens: the plan streams no answers"),
                ));
            }
            if m.is_token() && self.slos[..i].iter().any(|o| o.metric == m) {
                return Err(bad_field(
                    path,
                    "plan.slos",
                    format!("two objectives on {}", m.prefix()),
                ));
            }
        }
        if self.strategies.is_empty() {
            return Err(bad_field(
                path,
                "plan.strategies",
                "empty: a run measures at least one strategy",
            ));
        }
        if let Some(s) = first_duplicate(&self.strategies) {
            return Err(bad_field(path, "plan.strategies", format!("{s} is listed twice")));
        }
        if self.pods.is_empty() {
            return Err(bad_field(
                path,
                "plan.pods",
                "empty: a run measures at least one pod count",
            ));
        }
        if let Some(p) = self.pods.iter().find(|p| !(1..=64).contains(*p)) {
            return Err(bad_field(path, "plan.pods", format!("{p} is outside 1 to 64")));
        }
        if let Some(p) = first_duplicate(&self.pods) {
            return Err(bad_field(path, "plan.pods", format!("{p} is listed twice")));
        }
        if !(1..=4096).contains(&self.batch) {
            return Err(bad_field(
                path,
                "plan.batch",
                format!("{} is outside 1 to 4096", self.batch),
            ));
        }
        for (field, v) in [
            ("plan.warmup_s", self.warmup_s),
            ("plan.window_s", self.window_s),
            ("plan.max_cell_s", self.max_cell_s),
        ] {
            if !(v.is_finite() && (0.0..=MAX_RECORDED_SECONDS).contains(&v)) {
                return Err(bad_field(
                    path,
                    field,
                    format!(
                        "{} is not a duration from 0 to {MAX_RECORDED_SECONDS} s (7 days)",
                        shown(v)
                    ),
                ));
            }
        }
        if self.window_s < MIN_RECORDED_WINDOW_S {
            return Err(bad_field(
                path,
                "plan.window_s",
                format!(
                    "{} s is shorter than {MIN_RECORDED_WINDOW_S} s (windows that short measure scrape jitter)",
                    shown(self.window_s)
                ),
            ));
        }
        if self.stable_windows == 0 {
            return Err(bad_field(
                path,
                "plan.stable_windows",
                "0: a cell needs at least one window",
            ));
        }
        if self.max_cell_s < self.window_s * f64::from(self.stable_windows) {
            return Err(bad_field(
                path,
                "plan.max_cell_s",
                format!(
                    "{} s is shorter than stable_windows × window_s = {} × {} s",
                    shown(self.max_cell_s),
                    self.stable_windows,
                    shown(self.window_s)
                ),
            ));
        }
        if !(1..=MAX_REPEAT).contains(&self.repeat) {
            return Err(bad_field(
                path,
                "plan.repeat",
                format!("{} is outside 1 to {MAX_REPEAT}", self.repeat),
            ));
        }
        if let Some(t) = self.target
            && !((0.0001..=0.5).contains(&t) && self.repeat >= 2)
        {
            return Err(bad_field(
                path,
                "plan.target",
                format!("{t} is not a share from 0.0001 to 0.5 with plan.repeat of 2 or more"),
            ));
        }
        if let Some(b) = self.budget_s
            && !(b.is_finite() && b > 0.0 && self.target.is_some())
        {
            return Err(bad_field(
                path,
                "plan.budget_s",
                format!("{b} is not a positive number of seconds of a run with plan.target"),
            ));
        }
        if !(self.tolerance > 0.0 && self.tolerance < 1.0) {
            return Err(bad_field(
                path,
                "plan.tolerance",
                format!(
                    "{} is not a fraction between 0 and 1 (0.05 = 5%)",
                    shown(self.tolerance)
                ),
            ));
        }
        Ok(())
    }
}

fn first_duplicate<T: PartialEq + Copy>(items: &[T]) -> Option<T> {
    items
        .iter()
        .enumerate()
        .find(|(i, x)| items[..*i].contains(x))
        .map(|(_, x)| *x)
}

impl RunRecord {
    /// Checks run.json as strictly as the flags that made it: the run id is a plain
    /// directory name and the plan passes [`PlanRecord::validate`]. `path` is the
    /// run.json, named with the field in every error. Call it on every run.json read
    /// back from disk (`--resume`, `report`, `export`, `compare`).
    pub fn validate(&self, path: &Path) -> Result<()> {
        crate::config::plan::validate_run_id(&self.run_id).map_err(|_| {
            bad_field(
                path,
                "run_id",
                format!(
                    "{:?} is not a plain directory name (letters, digits, '.', '_', '-')",
                    self.run_id
                ),
            )
        })?;
        self.plan.validate(path)?;
        if let Some(iso) = self.kind.isolation() {
            iso.validate(std::time::Duration::from_secs_f64(self.plan.warmup_s))
                .map_err(|e| bad_field(path, "isolation", e.to_string()))?;
        }
        if let Some(c) = self.kind.capacity() {
            c.validate().map_err(|e| bad_field(path, "capacity", e))?;
            let p = &self.plan;
            let problem = if p.pods != (1..=c.max_pods).collect::<Vec<u32>>() {
                Some(format!(
                    "plan.pods must be 1 to max_pods {}, not {:?}",
                    c.max_pods, p.pods
                ))
            } else if p.repeat != 1 {
                Some(format!("a capacity run has one repeat, not plan.repeat {}", p.repeat))
            } else if !matches!(p.load, crate::config::values::Load::PerPod(_)) {
                Some(format!("a capacity run's plan.load is poisson:RATE, not {}", p.load))
            } else if p.slos.is_empty() || p.slos.iter().any(|s| s.quantile.is_none()) {
                Some("a capacity run's plan.slos name a percentile each, e.g. p99=25ms".to_string())
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(bad_field(path, "capacity", problem));
            }
        }
        Ok(())
    }

    /// The GPU's memory when the run measured a GPU (None on the CPU).
    pub fn gpu_memory_bytes(&self) -> Option<u64> {
        match self.plan.device {
            DeviceKind::Cuda => self.environment.gpus.first().and_then(|g| g.memory_total_bytes),
            DeviceKind::Cpu => None,
        }
    }

    /// Whether the sweep finished (`state` is `complete`); a running, interrupted or
    /// failed run is partial: cells it lacks were never measured.
    pub fn is_complete(&self) -> bool {
        self.state == "complete"
    }
}

/// Parses `cells.jsonl` text and checks every row as strictly as flags: numbers finite
/// and non-negative (but `exit_code`), pods 1 to 64, repeat from 1, no two rows for one
/// (strategy, pods, repeat, pod), an aggregate row (`pod = "all"`) for every cell and no
/// more pod rows than the pods it asked (pods × the GPUs it filled); with `plan`, every row's strategy, pods and repeat inside it.
/// Errors name `path`, the line and the field.
pub fn parse_cells_jsonl(text: &str, path: &Path, plan: Option<&PlanRecord>) -> Result<Vec<CellRecord>> {
    let at = |line: usize, reason: String| BenchError::RunDir {
        path: path.to_path_buf(),
        reason: format!("line {line}: {reason}"),
    };
    let mut rows = Vec::new();
    // A cell: (arm, pods, repeat).
    type Key = (crate::domain::Arm, u32, u32);
    let mut seen: HashMap<(Key, &str), usize> = HashMap::new();
    // Per cell: the first pod row's line, pod rows, and the pods its aggregate asked
    // (None: no aggregate row yet).
    let mut cells: Vec<(Key, usize, u32, Option<u32>)> = Vec::new();
    for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line = i + 1;
        let row: CellRecord = serde_json::from_str(l).map_err(|e| at(line, e.to_string()))?;
        check_row(&row).map_err(|reason| at(line, reason))?;
        if let Some(plan) = plan {
            if !plan.strategies.contains(&row.strategy) {
                return Err(at(
                    line,
                    format!(
                        "strategy {} is not in run.json's plan ({})",
                        row.strategy,
                        listed(&plan.strategies)
                    ),
                ));
            }
            let arms = plan.arms();
            if !arms.contains(&row.arm()) {
                return Err(at(
                    line,
                    format!(
                        "{} (timeslice {}) is not in run.json's plan ({})",
                        row.strategy,
                        row.timeslice.map_or("empty", |t| t.name()),
                        listed(&arms)
                    ),
                ));
            }
            if !plan.pods.contains(&row.pods) {
                return Err(at(
                    line,
                    format!("pods {} is not in run.json's plan ({})", row.pods, listed(&plan.pods)),
                ));
            }
            if row.repeat > plan.repeat {
                return Err(at(
                    line,
                    format!(
                        "repeat {} is beyond run.json's plan (repeat {})",
                        row.repeat, plan.repeat
                    ),
                ));
            }
        }
        rows.push((line, row));
    }
    for (line, row) in &rows {
        let key = (row.arm(), row.pods, row.repeat);
        if let Some(first) = seen.insert((key, row.pod.as_str()), *line) {
            return Err(at(
                *line,
                format!(
                    "duplicate row (strategy {}, pods {}, repeat {}, pod {:?}), first on line {first}",
                    row.arm(),
                    row.pods,
                    row.repeat,
                    row.pod
                ),
            ));
        }
        let i = match cells.iter().position(|(k, ..)| *k == key) {
            Some(i) => i,
            None => {
                cells.push((key, *line, 0, None));
                cells.len() - 1
            }
        };
        if row.is_aggregate() {
            cells[i].3 = Some(row.pods_asked());
        } else if row.is_pod() {
            cells[i].2 += 1;
        }
    }
    for ((strategy, pods, repeat), line, pod_rows, aggregate) in cells {
        let cell = if repeat == 1 {
            format!("cell {strategy} × {pods} pods")
        } else {
            format!("cell {strategy} × {pods} pods (repeat {repeat})")
        };
        let Some(asked) = aggregate else {
            return Err(at(
                line,
                format!("{cell} has pod rows but no aggregate row (pod \"{ALL_PODS}\")"),
            ));
        };
        if pod_rows > asked {
            return Err(at(line, format!("{cell} has {pod_rows} pod rows")));
        }
    }
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}

/// One row's own checks; the reason names the field.
fn check_row(row: &CellRecord) -> std::result::Result<(), String> {
    if !(1..=64).contains(&row.pods) {
        return Err(format!("pods {} is outside 1 to 64", row.pods));
    }
    if row.pod.trim().is_empty() {
        return Err("pod is empty".into());
    }
    if let Some(g) = row.gpus
        && !(2..=64).contains(&g)
    {
        return Err(format!(
            "gpus {g} is outside 2 to 64 (a cell on one GPU leaves it empty)"
        ));
    }
    if !(1..=MAX_REPEAT).contains(&row.repeat) {
        return Err(format!("repeat {} is outside 1 to {MAX_REPEAT}", row.repeat));
    }
    for (field, share) in [
        ("slo_p50_attainment", row.slo_p50_attainment),
        ("slo_p90_attainment", row.slo_p90_attainment),
        ("slo_p99_attainment", row.slo_p99_attainment),
        ("slo_attainment_bound", row.slo_attainment_bound),
        ("fairness", row.fairness),
        ("power_capped", row.power_capped),
        ("throttled_share", row.throttled_share),
    ] {
        // Above 1 by more than rounding (a fairness of 1.0000000000000002 is 1).
        if let Some(x) = share.filter(|x| *x > 1.0 + 1e-9) {
            return Err(format!("{field} = {}: a share, at most 1", shown(x)));
        }
    }
    // A backlog may shrink over the measurement.
    check_numbers(row, &["exit_code", "backlog_growth"])
}

/// Checks every number of a record, by its serde name, so a field added later is
/// checked too: finite and ≥ 0, but the fields in `signed` (an exit code may be a
/// negative signal). JSON has no NaN or infinity, and serde_json refuses an
/// out-of-range number such as 1e400 while parsing the line.
pub fn check_numbers(record: &impl Serialize, signed: &[&str]) -> std::result::Result<(), String> {
    let serde_json::Value::Object(fields) = serde_json::to_value(record).map_err(|e| e.to_string())? else {
        return Err("not a JSON object".into());
    };
    for (field, v) in &fields {
        if signed.contains(&field.as_str()) {
            continue;
        }
        if let Some(x) = v.as_f64()
            && !(x.is_finite() && x >= 0.0)
        {
            return Err(format!("{field} = {}: must be a finite number ≥ 0", shown(x)));
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_text(file: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/h100-run")
            .join(file);
        std::fs::read_to_string(path).expect("fixture")
    }

    fn fixture_run() -> RunRecord {
        serde_json::from_str(&fixture_text("run.json")).expect("run.json")
    }

    #[test]
    fn a_recorded_plan_is_checked_field_by_field() {
        let path = Path::new("results/r/run.json");
        assert!(fixture_run().validate(path).is_ok());
        type Tamper = fn(&mut RunRecord);
        let cases: [(&str, Tamper); 21] = [
            ("plan.warmup_s: -5 is not a duration", |r| r.plan.warmup_s = -5.0),
            ("plan.max_cell_s: 1e300 is not a duration", |r| {
                r.plan.max_cell_s = 1e300
            }),
            ("plan.warmup_s: 604801 is not", |r| r.plan.warmup_s = 604_801.0),
            ("plan.window_s: NaN is not", |r| r.plan.window_s = f64::NAN),
            ("plan.window_s: 0 s is shorter than 0.5 s", |r| r.plan.window_s = 0.0),
            ("plan.pods: 0 is outside 1 to 64", |r| r.plan.pods = vec![0]),
            ("plan.pods: 65 is outside 1 to 64", |r| r.plan.pods = vec![1, 65]),
            ("plan.pods: empty", |r| r.plan.pods.clear()),
            ("plan.pods: 3 is listed twice", |r| r.plan.pods = vec![3, 1, 3]),
            ("plan.strategies: empty", |r| r.plan.strategies.clear()),
            ("plan.stable_windows: 0", |r| r.plan.stable_windows = 0),
            (
                "plan.max_cell_s: 14 s is shorter than stable_windows × window_s = 3 × 5 s",
                |r| r.plan.max_cell_s = 14.0,
            ),
            ("plan.tolerance: -1 is not a fraction", |r| r.plan.tolerance = -1.0),
            ("plan.repeat: 0 is outside 1 to 100", |r| r.plan.repeat = 0),
            ("plan.tolerance: 1 is not a fraction", |r| r.plan.tolerance = 1.0),
            ("plan.dra: DRA settings belong to a Kubernetes run", |r| {
                r.plan.dra = Some(Default::default())
            }),
            ("plan.dra.timeslices: an interval is listed twice", |r| {
                r.plan.backend = BackendKind::Kubernetes;
                r.plan.sharing_api = crate::config::values::SharingApi::Dra;
                r.plan.dra = Some(crate::config::plan::DraSettings {
                    timeslices: vec![crate::domain::TimeSliceInterval::Short; 2],
                    ..Default::default()
                });
            }),
            ("plan.dra.timeslices: intervals of time-slicing", |r| {
                r.plan.backend = BackendKind::Kubernetes;
                r.plan.sharing_api = crate::config::values::SharingApi::Dra;
                r.plan.strategies = vec![Strategy::Mps];
                r.plan.dra = Some(crate::config::plan::DraSettings {
                    timeslices: vec![crate::domain::TimeSliceInterval::Short],
                    ..Default::default()
                });
            }),
            ("plan.mps_threads: a value is listed twice", |r| {
                r.plan.mps_threads = vec![crate::domain::MpsThreads::Percent(50); 2];
            }),
            ("plan.mps_memory: limits of MPS", |r| {
                r.plan.strategies = vec![Strategy::TimeSlicing];
                r.plan.mps_memory = vec![crate::domain::MpsMemory::Unlimited];
            }),
            ("run_id: \"../..\" is not a plain directory name", |r| {
                r.run_id = "../..".into()
            }),
        ];
        for (want, tamper) in cases {
            let mut run = fixture_run();
            tamper(&mut run);
            let e = run.validate(path).expect_err(want).to_string();
            assert!(e.starts_with("results results/r/run.json: "), "{e}");
            assert!(e.contains(want), "{want:?} not in {e:?}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_recorded_server_of_ones_own_is_checked_like_its_flags() {
        let path = Path::new("results/r/run.json");
        let own = |r: &mut RunRecord| {
            r.plan.workload_cmd = Some("python3 serve.py {port}".into());
            r.plan.metric = "my_latency_seconds".into();
            r.plan.ready_path = "none".into();
            r.plan.backend = BackendKind::Local;
            r.plan.prometheus = "off".into();
        };
        let mut ok = fixture_run();
        own(&mut ok);
        assert!(ok.validate(path).is_ok(), "{:?}", ok.validate(path));
        type Tamper = fn(&mut RunRecord);
        let cases: [(&str, Tamper); 8] = [
            ("plan.workload_cmd: \"serve\" has no {port}", |r| {
                r.plan.workload_cmd = Some("serve".into())
            }),
            // An image's entrypoint (`--server-image`): Kubernetes only, never beside a
            // command, and a server that makes its own requests.
            (
                "plan.server_args: an image's entrypoint is the Kubernetes backend's",
                |r| r.plan.server_args = Some(vec!["--port={port}".into()]),
            ),
            ("its load is closed", |r| {
                r.plan.workload_cmd = None;
                r.plan.server_args = Some(Vec::new());
                r.plan.backend = BackendKind::Kubernetes;
                r.plan.ready_path = "/ready".into();
                r.plan.source = Source::Prometheus;
                r.plan.load = crate::config::values::Load::PerPod(10.0)
            }),
            ("plan.metric: \"1x\" is not a metric name", |r| {
                r.plan.metric = "1x".into()
            }),
            ("plan.ready_path: \"/a b\" is neither", |r| {
                r.plan.ready_path = "/a b".into()
            }),
            ("plan.ready_path: \"/a\\tb\" is neither", |r| {
                r.plan.ready_path = "/a\tb".into()
            }),
            ("recorded with source client", |r| {
                r.plan.request = Some(crate::config::request::RequestPlan {
                    url: "http://127.0.0.1:{port}/i".into(),
                    body: None,
                    body_bytes: 0,
                    stream: None,
                });
                r.plan.ready_path = "/healthz".into();
                r.plan.prometheus = "spawn".into();
                r.plan.source = Source::Prometheus;
            }),
            ("its load is closed", |r| {
                r.plan.load = crate::config::values::Load::PerPod(10.0)
            }),
        ];
        for (want, tamper) in cases {
            let mut run = fixture_run();
            own(&mut run);
            tamper(&mut run);
            let e = run.validate(path).expect_err(want).to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }

        // The harness's own requests: an open load is then allowed, with source client
        // and a readiness path.
        let requests = |r: &mut RunRecord| {
            own(r);
            r.plan.metric = crate::config::plan::DEFAULT_METRIC.into();
            r.plan.ready_path = "/healthz".into();
            r.plan.source = Source::Client;
            r.plan.load = crate::config::values::Load::PerPod(10.0);
            r.plan.request = Some(crate::config::request::RequestPlan {
                url: "http://127.0.0.1:{port}/infer".into(),
                body: None,
                body_bytes: 0,
                stream: None,
            });
        };
        let mut ok = fixture_run();
        requests(&mut ok);
        assert!(ok.validate(path).is_ok(), "{:?}", ok.validate(path));
        let stream = |r: &mut RunRecord| {
            if let Some(q) = r.plan.request.as_mut() {
                q.stream = Some(crate::config::request::StreamPlan {
                    api: crate::config::request::Api::Completions,
                    model: "m".into(),
                    prompt_tokens: "8".parse().expect("lengths"),
                    output_tokens: "8".parse().expect("lengths"),
                    lengths: Vec::new(),
                    lengths_file: None,
                    server_ttft_metric: None,
                    server_itl_metric: None,
                });
            }
            r.plan.slos = vec!["ttft:p90=1s".parse().expect("slo")];
        };
        let mut streamed = fixture_run();
        requests(&mut streamed);
        stream(&mut streamed);
        assert!(streamed.validate(path).is_ok(), "{:?}", streamed.validate(path));
        let token_cases: [(&str, Tamper); 4] = [
            ("is an objective on tokens: the plan streams no answers", |r| {
                if let Some(q) = r.plan.request.as_mut() {
                    q.stream = None
                }
            }),
            ("two objectives on ttft", |r| {
                r.plan.slos.push("ttft:p99=2s".parse().expect("slo"))
            }),
            ("plan.request.stream.model", |r| {
                if let Some(st) = r.plan.request.as_mut().and_then(|q| q.stream.as_mut()) {
                    st.model = " ".into()
                }
            }),
            ("streamed requests are written by the harness", |r| {
                if let Some(q) = r.plan.request.as_mut() {
                    q.body = Some("/tmp/b.json".into())
                }
            }),
        ];
        for (want, tamper) in token_cases {
            let mut run = fixture_run();
            requests(&mut run);
            stream(&mut run);
            tamper(&mut run);
            let e = run.validate(path).expect_err(want).to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
        let cases: [(&str, Tamper); 5] = [
            ("plan.request: requests go to a server of your own", |r| {
                r.plan.workload_cmd = None
            }),
            ("the local backend's only", |r| r.plan.backend = BackendKind::Kubernetes),
            ("plan.request.url: put {port} where", |r| {
                if let Some(q) = r.plan.request.as_mut() {
                    q.url = "http://127.0.0.1:80/infer".into()
                }
            }),
            ("need a readiness path", |r| r.plan.ready_path = "none".into()),
            ("recorded with source client", |r| r.plan.source = Source::Scrape),
        ];
        for (want, tamper) in cases {
            let mut run = fixture_run();
            requests(&mut run);
            tamper(&mut run);
            let e = run.validate(path).expect_err(want).to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }

    #[test]
    fn a_cpu_run_is_labelled_by_what_ran() {
        let label = |o: crate::config::options::SweepOptions| {
            let plan = SweepPlan::from_options(o).expect("plan");
            RunRecord::new("r".into(), &plan, DeviceKind::Cpu, Environment::default()).label
        };
        let own = crate::config::options::SweepOptions {
            workload_cmd: Some("serve --port {port}".into()),
            ..Default::default()
        };
        assert_eq!(label(own).as_deref(), Some(OWN_SERVER_CPU_LABEL), "no tiny model ran");
        assert_eq!(label(Default::default()).as_deref(), Some(CPU_SMOKE_LABEL));
        let cpu = crate::config::options::SweepOptions {
            device: Some(DeviceChoice::Cpu),
            ..Default::default()
        };
        assert_eq!(label(cpu).as_deref(), Some(CPU_RUN_LABEL));
    }

    #[test]
    fn a_capacity_run_must_record_the_plan_its_search_walks() {
        let path = Path::new("results/r/run.json");
        let capacity = |r: &mut RunRecord| {
            r.kind = crate::config::plan::RunKind::Capacity(crate::config::plan::CapacityPlan { max_pods: 3 });
            r.plan.pods = vec![1, 2, 3];
            r.plan.load = crate::config::values::Load::PerPod(125.0);
            r.plan.slos = vec!["p99=25ms".parse().expect("slo")];
        };
        let mut ok = fixture_run();
        capacity(&mut ok);
        assert!(ok.validate(path).is_ok());
        type Tamper = fn(&mut RunRecord);
        let cases: [(&str, Tamper); 5] = [
            ("max_pods 0 is not between 1 and 64", |r| {
                r.kind = crate::config::plan::RunKind::Capacity(crate::config::plan::CapacityPlan { max_pods: 0 })
            }),
            ("plan.pods must be 1 to max_pods 3, not [1, 3, 5, 7]", |r| {
                r.plan.pods = vec![1, 3, 5, 7]
            }),
            ("one repeat, not plan.repeat 2", |r| r.plan.repeat = 2),
            ("plan.load is poisson:RATE, not total:300", |r| {
                r.plan.load = crate::config::values::Load::Total(300.0)
            }),
            ("plan.slos name a percentile each", |r| r.plan.slos.clear()),
        ];
        for (want, tamper) in cases {
            let mut run = fixture_run();
            capacity(&mut run);
            tamper(&mut run);
            let e = run.validate(path).expect_err(want).to_string();
            assert!(e.contains("capacity: ") && e.contains(want), "{want:?} not in {e:?}");
        }
        // Both kinds at once cannot be built; run.json that says so is refused on reading.
        let mut both = serde_json::to_value(&ok).expect("json");
        both["isolation"] = serde_json::json!({
            "scenarios": ["crash"], "victim_rate": 50.0, "aggressors": [1],
            "event_after_s": 15.0, "observe_s": 15.0
        });
        let e = serde_json::from_value::<RunRecord>(both).expect_err("both").to_string();
        assert!(e.contains("an isolation run or a capacity run, not both"), "{e}");
    }

    /// The fixture's cells.jsonl with line `n` (1-based) changed by `f`.
    fn tampered(n: usize, f: impl Fn(&mut serde_json::Value)) -> String {
        tampered_lines(&[n], f)
    }

    /// The fixture's cells.jsonl with lines `ns` (1-based) changed by `f`.
    fn tampered_lines(ns: &[usize], f: impl Fn(&mut serde_json::Value)) -> String {
        let text = fixture_text("cells.jsonl");
        let mut out = String::new();
        for (i, l) in text.lines().enumerate() {
            let mut v: serde_json::Value = serde_json::from_str(l).expect("row");
            if ns.contains(&(i + 1)) {
                f(&mut v);
            }
            out.push_str(&v.to_string());
            out.push('\n');
        }
        out
    }

    fn parse_err(text: &str, plan: Option<&PlanRecord>) -> String {
        parse_cells_jsonl(text, Path::new("r/cells.jsonl"), plan)
            .expect_err("tampered cells")
            .to_string()
    }

    #[test]
    fn cells_read_back_are_checked_with_line_and_field() {
        let plan = fixture_run().plan;
        let good = fixture_text("cells.jsonl");
        assert_eq!(
            parse_cells_jsonl(&good, Path::new("x"), Some(&plan))
                .map(|c| c.len())
                .ok(),
            Some(64)
        );
        let first: CellRecord = serde_json::from_str(good.lines().next().expect("line")).expect("row");
        assert_eq!(
            (first.strategy, first.pods, first.pod.as_str()),
            (Strategy::Exclusive, 1, "pod-0")
        );

        let e = parse_err(&tampered(2, |v| v["throughput_per_s"] = (-3.5).into()), None);
        assert_eq!(
            e,
            "results r/cells.jsonl: line 2: throughput_per_s = -3.5: must be a finite number ≥ 0"
        );
        let e = parse_err(&tampered(2, |v| v["energy_j_per_inference"] = (-0.1).into()), None);
        assert!(e.contains("line 2: energy_j_per_inference = -0.1"), "{e}");
        // A backlog that shrank over the measurement is a number like any other.
        let shrank = tampered(2, |v| v["backlog_growth"] = (-3.0).into());
        assert_eq!(
            parse_cells_jsonl(&shrank, Path::new("x"), Some(&plan))
                .map(|c| c[1].backlog_growth)
                .ok(),
            Some(Some(-3.0))
        );
        // Shares are at most 1, but for rounding (an H100 run recorded a fairness of
        // 1.0000000000000002).
        let e = parse_err(&tampered(2, |v| v["slo_p99_attainment"] = 1.5.into()), None);
        assert!(
            e.contains("line 2: slo_p99_attainment = 1.5: a share, at most 1"),
            "{e}"
        );
        let rounded = tampered(2, |v| v["fairness"] = 1.000_000_000_000_000_2.into());
        assert!(parse_cells_jsonl(&rounded, Path::new("x"), None).is_ok());
        // JSON has no infinity; an out-of-range number is refused with its line.
        let inf = tampered(3, |_| ()).replacen("\"mean_s\":", "\"mean_s\":1e400,\"x\":", 1);
        assert!(
            parse_err(&inf, None).contains("line 1: number out of range"),
            "{inf:.200}"
        );
        // Line 2 again, as line 65.
        let dup = format!("{good}{}\n", good.lines().nth(1).expect("line 2"));
        let e = parse_err(&dup, None);
        assert!(
            e.contains("line 65: duplicate row (strategy exclusive, pods 1, repeat 1, pod \"all\"), first on line 2"),
            "{e}"
        );
        let no_aggregate: String = good
            .lines()
            .filter(|l| !(l.contains("\"strategy\":\"mps\",\"pods\":5,\"pod\":\"all\"")))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(no_aggregate.lines().count(), 63);
        let e = parse_err(&no_aggregate, None);
        assert!(
            e.contains("cell mps × 5 pods has pod rows but no aggregate row (pod \"all\")"),
            "{e}"
        );
        let e = parse_err(&tampered(5, |v| v["pods"] = 0.into()), None);
        assert!(e.contains("line 5: pods 0 is outside 1 to 64"), "{e}");
        // Outside the plan (the whole exclusive × 1 cell moved to 9 pods): only checked
        // against one.
        let nine = tampered_lines(&[1, 2], |v| v["pods"] = 9.into());
        assert!(parse_cells_jsonl(&nine, Path::new("x"), None).is_ok());
        let e = parse_err(&nine, Some(&plan));
        assert!(
            e.contains("line 1: pods 9 is not in run.json's plan (1, 3, 5, 7)"),
            "{e}"
        );
        // An interval the plan did not sweep (only time-slicing through DRA has any).
        let e = parse_err(
            &tampered_lines(&[1, 2], |v| v["timeslice"] = "short".into()),
            Some(&plan),
        );
        assert!(
            e.contains(
                "line 1: exclusive (timeslice short) is not in run.json's plan (exclusive, time-slicing, mps, mig)"
            ),
            "{e}"
        );
        let e = parse_err(
            &tampered_lines(&[1, 2], |v| v["timeslice"] = "Short".into()),
            Some(&plan),
        );
        assert!(e.contains("line 1: unknown variant `Short`"), "{e}");
        // A repeat the plan did not ask for, or none at all.
        let e = parse_err(&tampered_lines(&[1, 2], |v| v["repeat"] = 2.into()), Some(&plan));
        assert!(
            e.contains("line 1: repeat 2 is beyond run.json's plan (repeat 1)"),
            "{e}"
        );
        let e = parse_err(&tampered(4, |v| v["repeat"] = 0.into()), None);
        assert!(e.contains("line 4: repeat 0 is outside 1 to 100"), "{e}");
        // The same cell in two repeats is two cells.
        let twice: String = format!(
            "{good}{}",
            tampered_lines(&[1, 2], |v| v["repeat"] = 2.into())
                .lines()
                .take(2)
                .map(|l| format!("{l}\n"))
                .collect::<String>()
        );
        let mut two = plan.clone();
        two.repeat = 2;
        assert_eq!(
            parse_cells_jsonl(&twice, Path::new("x"), Some(&two))
                .map(|c| c.len())
                .ok(),
            Some(66)
        );
        let mut narrow = plan.clone();
        narrow.strategies.retain(|s| *s != Strategy::Mig);
        let e = parse_err(&good, Some(&narrow));
        assert!(
            e.contains("strategy mig is not in run.json's plan (exclusive, time-slicing, mps)"),
            "{e}"
        );
    }

    #[test]
    fn an_empty_run_still_has_the_csv_header() {
        let cells = parse_cells_jsonl(&fixture_text("cells.jsonl"), Path::new("x"), None).expect("cells");
        let full = String::from_utf8(cells_csv(&cells).expect("csv")).expect("utf-8");
        let empty = String::from_utf8(cells_csv(&[]).expect("csv")).expect("utf-8");
        let header = full.lines().next().expect("header");
        assert!(
            header.starts_with("run_id,strategy,pods,repeat,pod,status,"),
            "{header}"
        );
        assert_eq!(empty, format!("{header}\n"));
    }
}
