//! The command line of `gpushare-bench`: raw arguments, turned into plans by `plan.rs`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::plan::{StringOrList, SweepOptions};

/// Measure what GPU sharing costs an inference workload.
///
/// gpushare-bench runs the gpushare-workload inference server as 1, 3, 5 and 7 pods on
/// one GPU under each sharing strategy (exclusive, time-slicing, MPS, MIG), reads their
/// Prometheus latency histograms, and writes per-pod and per-cell results (mean, p50,
/// p90, p99, throughput, fairness, GPU telemetry) to results/<run-id>/.
///
/// It never changes GPU settings (MIG mode, compute mode, clocks): a strategy the GPU is
/// not set up for is reported unavailable, with the commands an administrator would run.
#[derive(Debug, Parser)]
#[command(name = "gpushare-bench", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the experiment: every strategy × pod count, saved after each cell.
    Sweep(Box<SweepArgs>),
    /// Render results/<run-id> as reports/<run-id>/index.html (+ one SVG per chart and summary.md).
    Report(ReportArgs),
    /// Print a run as CSV, JSON or Markdown on stdout.
    Export(ExportArgs),
    /// Compare two runs cell by cell; exit code 1 when a cell regressed.
    Compare(CompareArgs),
    /// Check the GPU, driver, CUDA libraries, MPS, MIG, NVML, Prometheus and Kubernetes.
    Doctor,
    /// Write manifests/ from the objects the Kubernetes backend applies.
    Manifests(ManifestsArgs),
    /// Measure the cost of measuring: throughput with /metrics scraped every second vs not.
    Overhead(OverheadArgs),
}

/// `sweep` flags. Every flag can also be set in the --config file (same names, with
/// underscores: max_cell = "30s"); flags win.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// TOML file with sweep settings.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// local (processes on this machine) or kubernetes.
    #[arg(long)]
    pub backend: Option<String>,
    /// Comma-separated: exclusive,time-slicing,mps,mig [default: all four].
    #[arg(long)]
    pub strategies: Option<String>,
    /// Comma-separated pod counts [default: 1,3,5,7].
    #[arg(long)]
    pub pods: Option<String>,
    /// yolos-small, minilm-l6 or tiny [default: yolos-small].
    #[arg(long)]
    pub model: Option<String>,
    /// fp32, tf32 or bf16 [default: bf16 on a GPU, fp32 on the CPU].
    #[arg(long)]
    pub precision: Option<String>,
    /// auto (the GPU, else the CPU smoke pipeline), cuda or cpu [default: auto].
    #[arg(long)]
    pub device: Option<String>,
    /// Samples per inference [default: 1].
    #[arg(long)]
    pub batch: Option<u32>,
    /// Discarded time after all pods are ready [default: 10s].
    #[arg(long)]
    pub warmup: Option<String>,
    /// Measurement window; a cell ends when 3 windows agree within 5% [default: 5s].
    #[arg(long)]
    pub window: Option<String>,
    /// Most measurement time per cell [default: 30s].
    #[arg(long)]
    pub max_cell: Option<String>,
    /// Longest wait for pods to become ready [default: 180s].
    #[arg(long)]
    pub ready_timeout: Option<String>,
    /// Results directory [default: results].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Name of the run's directory [default: <UTC time>-<gpu>].
    #[arg(long, conflicts_with = "resume")]
    pub run_id: Option<String>,
    /// Continue a broken run: its recorded plan, the cells not yet on disk.
    #[arg(long)]
    pub resume: Option<String>,
    /// Metrics source: off (scrape pods), spawn (a private Prometheus), or a server URL [default: off].
    #[arg(long)]
    pub prometheus: Option<String>,
    /// The gpushare-workload binary [default: beside gpushare-bench, then PATH].
    #[arg(long)]
    pub workload_bin: Option<PathBuf>,
    /// Extra argument for every workload pod (repeatable), e.g. --workload-arg=--weights --workload-arg=DIR.
    #[arg(long = "workload-arg", allow_hyphen_values = true)]
    pub workload_args: Vec<String>,
    /// Local pods listen on BASE, BASE+1, … (for an existing Prometheus that scrapes fixed ports) [default: free ports].
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Kubernetes: the workload image [default: gpushare-workload:0.1.0, built from workload/Dockerfile].
    #[arg(long)]
    pub image: Option<String>,
    /// Kubernetes: the MIG layout label value [default: seven of the smallest instance, e.g. all-1g.10gb].
    #[arg(long)]
    pub mig_layout: Option<String>,
    /// Kubernetes: namespace of the Prometheus pod to port-forward to when --prometheus is off [default: monitoring].
    #[arg(long)]
    pub prometheus_namespace: Option<String>,
    /// Kubernetes: label selector of that pod [default: app.kubernetes.io/name=prometheus].
    #[arg(long)]
    pub prometheus_selector: Option<String>,
    /// Print every object and patch the sweep would apply, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Kubernetes: the GPU node to use.
    #[arg(long)]
    pub node: Option<String>,
    /// Kubernetes: namespace for the workload [default: gpushare-bench].
    #[arg(long)]
    pub namespace: Option<String>,
    /// No progress bars (CI, scripts); errors still go to stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

impl SweepArgs {
    /// The flags as options (None where not given).
    pub fn options(&self) -> SweepOptions {
        SweepOptions {
            backend: self.backend.clone(),
            strategies: self.strategies.clone().map(StringOrList::Text),
            pods: self.pods.clone().map(StringOrList::Text),
            model: self.model.clone(),
            precision: self.precision.clone(),
            device: self.device.clone(),
            batch: self.batch,
            warmup: self.warmup.clone(),
            window: self.window.clone(),
            max_cell: self.max_cell.clone(),
            ready_timeout: self.ready_timeout.clone(),
            out: self.out.clone(),
            prometheus: self.prometheus.clone(),
            workload_bin: self.workload_bin.clone(),
            workload_args: (!self.workload_args.is_empty()).then(|| self.workload_args.clone()),
            node: self.node.clone(),
            namespace: self.namespace.clone(),
            base_port: self.base_port,
            image: self.image.clone(),
            mig_layout: self.mig_layout.clone(),
            prometheus_namespace: self.prometheus_namespace.clone(),
            prometheus_selector: self.prometheus_selector.clone(),
        }
    }
}

/// `overhead` flags.
#[derive(Debug, Clone, Args)]
pub struct OverheadArgs {
    /// Model preset.
    #[arg(long, default_value = "yolos-small")]
    pub model: String,
    /// auto, cuda or cpu.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Precision [default: bf16 on a GPU, fp32 on the CPU].
    #[arg(long)]
    pub precision: Option<String>,
    /// Length of each phase.
    #[arg(long, default_value = "20s")]
    pub phase: String,
    /// Pairs of phases (without, with scraping).
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// Scrape interval in the scraping phases.
    #[arg(long, default_value = "1s")]
    pub interval: String,
    /// Discarded time after the pod is ready.
    #[arg(long, default_value = "10s")]
    pub warmup: String,
    /// Results directory; the result goes to <out>/<run-id>/overhead.json.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Run id [default: overhead-<UTC time>-<gpu>].
    #[arg(long)]
    pub run_id: Option<String>,
    /// The gpushare-workload binary.
    #[arg(long)]
    pub workload_bin: Option<PathBuf>,
}

/// `report` flags.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// The run directory, e.g. results/20261122-h100-yolos-bf16.
    pub run_dir: PathBuf,
    /// Where reports go; the report lands in <out>/<run-id>/.
    #[arg(long, default_value = "reports")]
    pub out: PathBuf,
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// One row per pod per cell plus aggregate rows (spreadsheet-ready).
    Csv,
    /// {"run": run.json, "cells": [...]}.
    Json,
    /// The report's tables.
    Markdown,
}

/// `export` flags.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The run directory.
    pub run_dir: PathBuf,
    /// csv, json or markdown.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
}

/// `compare` flags.
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// The reference run directory.
    pub baseline: PathBuf,
    /// The run to judge.
    pub candidate: PathBuf,
    /// A change counts when it is worse by more than this and than the windows' noise.
    #[arg(long, default_value = "5%")]
    pub threshold: String,
}

/// `manifests` flags.
#[derive(Debug, Clone, Args)]
pub struct ManifestsArgs {
    /// Directory to write.
    #[arg(long, default_value = "manifests")]
    pub out: PathBuf,
    /// Workload image the Deployment and Job use.
    #[arg(long, default_value = crate::k8s::manifests::DEFAULT_IMAGE)]
    pub image: String,
    /// Compare with the files instead of writing them (exit 1 when they differ).
    #[arg(long)]
    pub check: bool,
}
