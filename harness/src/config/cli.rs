//! The command line of `gpushare-bench`: subcommands and their flags. The sweep's
//! options are [`SweepOptions`], shared with the config file.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::isolation::Scenario;
use crate::config::options::SweepOptions;
use crate::config::values::{DeviceChoice, List, LoadLevel, Model, PodCount, Precision, Span};

/// Measure what GPU sharing costs an inference workload.
///
/// gpushare-bench runs the gpushare-workload inference server as 1, 3, 5 and 7 pods on
/// one GPU under each sharing strategy (exclusive, time-slicing, MPS, MIG), reads their
/// Prometheus latency histograms, and writes per-pod and per-cell results (mean, p50,
/// p90, p99, throughput, fairness, GPU telemetry) to runs/<run-id>/ (--out).
///
/// `isolation` measures what one misbehaving pod (busy, memory-hungry, faulting or
/// killed) does to a victim pod beside it under each strategy, as an isolation matrix.
///
/// It never changes GPU settings (MIG mode, compute mode, clocks): a strategy the GPU is
/// not set up for is reported unavailable, with the commands an administrator would run.
/// Every process it starts (pods, Prometheus, MPS daemons) stops with it, even when it is
/// killed with SIGKILL.
///
/// Exit codes: 0 done (sweep: every cell has a result); 1 an error, or no cell could be
/// measured; 2 bad input (flags, config file, run directory); 3 sweep partial: some cells
/// failed, their rows say why, the others are saved (isolation: a victim alone could not
/// be measured, so its trials have no baseline); compare: 1 when a cell regressed or
/// is missing; 128+N stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP): finished
/// cells are kept, `--resume` continues. A second signal stops at once.
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
    /// Put a victim pod beside misbehaving neighbours under each strategy: the isolation matrix
    ///
    /// Per strategy, a victim pod serves an open-loop Poisson load (--victim-rate) alone,
    /// then beside aggressors in each scenario:
    ///   noisy-neighbour  K aggressors (--aggressors) run closed loop
    ///   memory-pressure  an aggressor takes 70% of the GPU's memory after --event-after;
    ///                    5 s later the victim asks for 35% (who fails, with which code?)
    ///   fault            an aggressor's kernel writes through an unmapped address after
    ///                    --event-after (gpushare-workload --inject-fault-after): an
    ///                    ordinary CUDA illegal-address error that needs no GPU reset
    ///   crash            an aggressor is killed with SIGKILL after --event-after
    ///                    (gpushare-workload --crash-after: it sends it to itself)
    /// Each trial records the victim's p50/p99 over itself alone, its SLO attainment
    /// (--slo, default 1.5 × its p99 alone), which pods survived, and after a fault or
    /// crash how long until a new victim was warm and ready again. Exclusive is the reference (the
    /// aggressors stay pending); MIG runs on existing instances or is unavailable.
    ///
    /// Results go to runs/<run-id>/isolation.{jsonl,csv} after every trial;
    /// `report` renders the isolation matrix; --resume continues a broken run.
    /// Pods are made as in `sweep` (--backend, --model, --device, --workload-arg, …,
    /// also from --config). On Kubernetes (--backend kubernetes --node NODE) a trial is
    /// two Deployments, the victim's (applied first, bound before the aggressors come)
    /// and the aggressors'; the kubelet restarts a container that exits. Exit codes as
    /// `sweep`: 3 when a victim alone could not be measured (its trials then have no
    /// baseline).
    ///
    /// Your own server as the victim: --workload-cmd 'CMD … {port} …' (as in `sweep`);
    /// the aggressors stay gpushare-workload. With --request URL the harness sends it
    /// --victim-rate; without, it makes its own load. On Kubernetes (--image) the
    /// aggressors run --aggressor-image.
    #[command(verbatim_doc_comment)]
    Isolation(Box<IsolationArgs>),
    /// How many pods fit on one GPU per strategy at a per-pod load and a latency SLO
    ///
    /// Every pod gets Poisson arrivals at --load poisson:RATE. Per strategy, pod counts
    /// are measured upwards from 1 (as sweep cells, saved after each) until a count
    /// misses the SLO. Each pod's attainment (p99=25ms: the share of its requests within
    /// 25 ms) is judged at 95% confidence: its one-sided Clopper–Pearson bounds, widened
    /// by the histogram's interpolation bound.
    ///   fits      the cell measured, every pod kept up with its load (no request
    ///             failed or dropped, its backlog grew by no more than 3 standard
    ///             deviations of its change between windows, plus one, and it
    ///             served its rate within 5% or 3 Poisson deviations) and every
    ///             attainment's lower bound clears its percentile (a p99 needs at
    ///             least 299 requests, all within)
    ///   misses    a pod failed, ran out of memory, stayed pending or fell behind its
    ///             load, or an attainment's upper bound is below its percentile
    ///   marginal  the bounds straddle the percentile: neither is shown
    /// A cell runs on past its stable windows until every pod's attainments are decided,
    /// or to --max-cell. The walk stops at the first clear miss, at a second marginal or
    /// missed count in a row, or at --max-pods (exclusive: at 1, a second pod stays
    /// pending). The capacity is the largest count that fits with every smaller one.
    ///
    /// Prints the capacity table (strategy → pods that fit, aggregate goodput, p99, GPU
    /// utilisation, energy per request, first miss and why); `report` adds the
    /// latency-vs-offered-load chart (the knee) and `export --format capacity` the CSV.
    /// Pods are made as in `sweep` (--backend, --model, --device, --strategies, …, also
    /// from --config); --resume continues a broken search. Exit codes as `sweep`.
    #[command(verbatim_doc_comment)]
    Capacity(Box<CapacityArgs>),
    /// Strategies side by side at equal offered load: what sharing costs short of saturation.
    ///
    /// A closed-loop sweep measures each pod back to back, so its latencies are those of
    /// a saturated GPU. This run asks what a platform sees at a realistic load: the same
    /// aggregate request rate offered to every cell, whatever its strategy and pod count.
    ///   1. the closed sweep (RUN_DIR/closed/): every strategy × pod count in the closed
    ///      loop, as `sweep` measures them; its exclusive × 1 cell is the base, one
    ///      pod's capacity alone on the GPU (inferences/s, the mean over --repeat
    ///      passes; time-slicing × 1 where exclusive is not measured, e.g. on the CPU)
    ///   2. one sweep per level (RUN_DIR/load-50pct/, …): every cell offered Poisson
    ///      arrivals at LEVEL × base requests/s in total (--load total:RATE), split
    ///      equally over its pods; latency runs from each request's arrival, and a pod
    ///      that falls behind its share is flagged
    ///
    /// Each sweep is a run directory of its own (report, export, compare and verify read
    /// it as any sweep). `report RUN_DIR` renders the run's tables, p50, p99, mean and
    /// throughput per strategy × pods, with the closed loop and each level side by
    /// side, and equal-load.csv. The plan needs exclusive (or time-slicing) in
    /// --strategies and 1 in --pods (the base), on one GPU; each level is checked at the
    /// measured base before its sweep starts. --resume continues a broken run where it
    /// stopped, at the base it measured (with --levels, other levels for the sweeps not
    /// started). A closed sweep that ends without the base is kept, and the run stops.
    /// Exit codes as `sweep`, over all its sweeps.
    #[command(verbatim_doc_comment)]
    EqualLoad(Box<EqualLoadArgs>),
    /// Render a run as an HTML report (+ one SVG per chart, summary.md and CSV), in <RUN_DIR>/report/ or <out>/<run-id>/.
    Report(ReportArgs),
    /// Print a run as CSV, JSON or Markdown on stdout.
    Export(ExportArgs),
    /// Compare two runs cell by cell; exit code 1 when a cell regressed.
    Compare(CompareArgs),
    /// Recompute a run's rows from its raw windows; exit code 1 when a number differs.
    ///
    /// A run keeps each pod's latency-histogram increments per window in windows.jsonl.
    /// From them verify recomputes every pod's inferences, throughput, mean, p50, p90,
    /// p99, resolution, errors and SLO attainments, and each cell's pooled numbers and
    /// window spreads, and names every number cells.jsonl records otherwise (and every
    /// measured cell without windows). Capacity verdicts, intervals over repeats and
    /// comparisons are computed from those rows when read.
    Verify(VerifyArgs),
    /// Measure between-host noise from one sweep run on several GPUs of one model.
    ///
    /// Give at least three run directories of the same plan, each made on a GPU of its
    /// own (and host). Per cell measured in all of them, the relative standard deviation
    /// over the hosts of mean latency, p99 and throughput is pooled over the cells; the
    /// band of a change between two hosts is t(0.975, df) · s · √2. Prints one JSON line:
    /// the line `compare` reads from results/host-noise.jsonl (or --host-noise FILE) to
    /// judge runs made on different GPUs of that model.
    ///   gpushare-bench host-noise results/A results/B results/C >> results/host-noise.jsonl
    #[command(verbatim_doc_comment)]
    HostNoise(HostNoiseArgs),
    /// Check the GPU, driver, CUDA libraries, MPS, MIG, NVML, Prometheus and Kubernetes.
    ///
    /// With --kubernetes --node NODE: every prerequisite of a Kubernetes sweep on that
    /// node, one line each with its fix (cluster, node and its GPU count, the GPU
    /// operator's ClusterPolicy and device-plugin ConfigMap, operator and plugin versions,
    /// MIG manager, DCGM exporter, whether Prometheus may scrape the workload namespace,
    /// and every permission the sweep uses, asked with SelfSubjectAccessReview).
    Doctor(DoctorArgs),
    /// Write manifests/ from the objects the Kubernetes backend applies.
    Manifests(ManifestsArgs),
    /// Measure the cost of measuring: throughput with /metrics scraped every second vs not.
    Overhead(OverheadArgs),
    /// Put a Kubernetes GPU node back as a run found it, from the run's journal.
    ///
    /// A sweep restores the node itself when it ends, fails or is interrupted; after a
    /// SIGKILL (or a lost connection) this does it: it deletes the workload Deployment,
    /// puts back each node label the harness set if it still holds the harness's value,
    /// removes each device-plugin ConfigMap key the harness added if unchanged since,
    /// and waits for a MIG layout to go back. Nothing else is touched. `--resume` does the
    /// same at the end of the resumed run.
    Restore(RestoreArgs),
    /// (internal) The supervisor a sweep starts: stops what the harness started if it dies.
    #[command(hide = true)]
    Reap,
}

/// `sweep` flags. Every option can also be set in the --config file (same names, with
/// underscores: max_cell = "30s"); flags win.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// TOML file with sweep settings.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The sweep's options (also the config file's keys).
    #[command(flatten)]
    pub options: SweepOptions,
    /// Continue a broken run: its recorded plan, the cells not yet on disk.
    #[arg(long)]
    pub resume: Option<String>,
    /// Print every object and patch the sweep would apply, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// No progress bars (CI, scripts); errors still go to stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Do not render the report at the end (RUN_DIR/report/; `gpushare-bench report` renders it later).
    #[arg(long)]
    pub no_report: bool,
}

/// `isolation` flags: the trials' own, and the sweep's options that make the pods
/// (the sweep's --pods, --window, --max-cell, --repeat and --load do not apply and are refused).
#[derive(Debug, Clone, Args)]
#[command(
    mut_arg("pods", |a| a.hide(true)),
    mut_arg("window", |a| a.hide(true)),
    mut_arg("max_cell", |a| a.hide(true)),
    mut_arg("repeat", |a| a.hide(true)),
    mut_arg("load", |a| a.hide(true)),
    mut_arg("slo", |a| a.help("The victim's latency target, e.g. 20ms (or p99=20ms: only the threshold counts) [default: 1.5 × its p99 alone under the same strategy]"))
)]
pub struct IsolationArgs {
    /// Scenarios, comma-separated: noisy-neighbour, memory-pressure, fault, crash [default: all four].
    #[arg(long)]
    pub scenarios: Option<List<Scenario>>,
    /// The victim's open-loop Poisson load, inferences per second; keep it well below one pod's capacity [default: 50]. With --workload-cmd, the rate of the harness's --request to your server (refused without --request).
    #[arg(long)]
    pub victim_rate: Option<f64>,
    /// Aggressor counts of the noisy-neighbour scenario, comma-separated, 1 to 63 [default: 1,3,6].
    #[arg(long)]
    pub aggressors: Option<List<PodCount>>,
    /// When an aggressor grows, faults or is killed, after the pods are ready (after the warm-up) [default: 15s].
    #[arg(long)]
    pub event_after: Option<Span>,
    /// How long the victim is followed after that (more than 5s) [default: 15s].
    #[arg(long)]
    pub observe: Option<Span>,
    /// On Kubernetes, where the victim is a server of your own (--workload-cmd with --image): the image of gpushare-workload the aggressors run [default: gpushare-workload:0.1.0].
    #[arg(long)]
    pub aggressor_image: Option<String>,
    /// TOML file with sweep settings (the pods' model, device, backend, ...).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The pods' options, as `sweep`'s.
    #[command(flatten)]
    pub options: SweepOptions,
    /// Continue a broken isolation run: its recorded plan, the trials not yet on disk.
    #[arg(long)]
    pub resume: Option<String>,
    /// No progress bars (CI, scripts); errors still go to stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Do not render the report at the end (RUN_DIR/report/; `gpushare-bench report` renders it later).
    #[arg(long)]
    pub no_report: bool,
}

/// `capacity` flags: the search's own, and the sweep's options that make the pods
/// (the sweep's --pods and --repeat do not apply and are refused).
#[derive(Debug, Clone, Args)]
#[command(
    mut_arg("pods", |a| a.hide(true)),
    mut_arg("repeat", |a| a.hide(true)),
    mut_arg("load", |a| a.help("The load every pod gets: poisson:RATE, RATE requests per second per pod (required)")),
    mut_arg("slo", |a| a.help("Latency objectives every pod must meet, comma-separated: p50=DUR, p90=DUR, p99=DUR, e.g. p99=25ms (required)"))
)]
pub struct CapacityArgs {
    /// The largest pod count searched, 1 to 64 [default: 7].
    #[arg(long)]
    pub max_pods: Option<PodCount>,
    /// TOML file with sweep settings (the pods' model, device, backend, ...).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The pods' options, as `sweep`'s.
    #[command(flatten)]
    pub options: SweepOptions,
    /// Continue a broken capacity run: its recorded plan, the counts not yet measured.
    #[arg(long)]
    pub resume: Option<String>,
    /// No progress bars (CI, scripts); errors still go to stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Do not render the report at the end (RUN_DIR/report/; `gpushare-bench report` renders it later).
    #[arg(long)]
    pub no_report: bool,
}

/// `equal-load` flags: the levels, and the sweep's options for every sweep of the run
/// (`--load` is the run's to set).
#[derive(Debug, Clone, Args)]
#[command(mut_arg("load", |a| a.hide(true)))]
pub struct EqualLoadArgs {
    /// Offered loads, comma-separated, each a percentage of one pod's closed-loop capacity alone on the GPU (exclusive × 1), offered to a whole cell and split equally over its pods (e.g. 50%,90%) [default: 50%,90%].
    #[arg(long)]
    pub levels: Option<List<LoadLevel>>,
    /// TOML file with sweep settings (the pods' model, device, backend, ...).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The pods' options, as `sweep`'s.
    #[command(flatten)]
    pub options: SweepOptions,
    /// Continue a broken equal-load run (its run id, under --out): its recorded options and base, the sweeps and cells not yet on disk. Give --workload-bin again if the run used one, your server's flags as it recorded them, and --levels to replace levels not yet started.
    #[arg(long)]
    pub resume: Option<String>,
    /// No progress bars (CI, scripts); errors still go to stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Do not render the report at the end (RUN_DIR/report/; `gpushare-bench report` renders it later).
    #[arg(long)]
    pub no_report: bool,
}

/// `doctor` flags.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// Check a Kubernetes GPU node instead of this machine (needs --node).
    #[arg(long, requires = "node")]
    pub kubernetes: bool,
    /// The GPU node.
    #[arg(long)]
    pub node: Option<String>,
    /// The GPU operator's namespace.
    #[arg(long, default_value = "gpu-operator")]
    pub operator_namespace: String,
    /// The workload namespace.
    #[arg(long, default_value = "gpushare-bench")]
    pub namespace: String,
    /// kube-prometheus's namespace.
    #[arg(long, default_value = "monitoring")]
    pub monitoring_namespace: String,
}

/// `restore` flags.
#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    /// The GPU node to put back.
    #[arg(long)]
    pub node: String,
    /// The run directory whose journal to use [default: the newest run under --out
    /// that still has changes to undo on NODE].
    pub run_dir: Option<PathBuf>,
    /// Runs directory searched when no run directory is given.
    #[arg(long, default_value = crate::config::plan::DEFAULT_OUT)]
    pub out: PathBuf,
}

/// `overhead` flags.
#[derive(Debug, Clone, Args)]
pub struct OverheadArgs {
    /// Model preset.
    #[arg(long, default_value = "yolos-small")]
    pub model: Model,
    /// auto, cuda or cpu.
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
    /// Precision [default: bf16 on a GPU, fp32 on the CPU].
    #[arg(long)]
    pub precision: Option<Precision>,
    /// Length of each phase.
    #[arg(long, default_value = "20s")]
    pub phase: Span,
    /// Pairs of phases (without, with scraping).
    #[arg(long, default_value_t = 3)]
    pub repeats: u32,
    /// Scrape interval in the scraping phases.
    #[arg(long, default_value = "1s")]
    pub interval: Span,
    /// Discarded time after the pod is ready.
    #[arg(long, default_value = "10s")]
    pub warmup: Span,
    /// Runs directory; the result goes to <out>/<run-id>/overhead.json.
    #[arg(long, default_value = crate::config::plan::DEFAULT_OUT)]
    pub out: PathBuf,
    /// Run id [default: overhead-<UTC time>-<gpu>].
    #[arg(long)]
    pub run_id: Option<String>,
    /// The gpushare-workload binary.
    #[arg(long)]
    pub workload_bin: Option<PathBuf>,
    /// The GPU to measure, by index or GPU-… UUID (`nvidia-smi -L`) [default: 0].
    #[arg(long)]
    pub gpu: Option<crate::telemetry::inventory::GpuSelector>,
    /// Measure even though other processes compute on that GPU.
    #[arg(long)]
    pub allow_busy_gpu: bool,
}

/// `report` flags.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// The run directory, e.g. runs/20261126T101500Z-h100.
    pub run_dir: PathBuf,
    /// Where reports go: the report lands in <out>/<run-id>/ [default: beside the run,
    /// in <RUN_DIR>/report/].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// One row per cell and repeat, the cells' totals (an isolation run: one per trial).
    /// Shares are fractions, numbers rounded to four significant digits, with the GPU's name.
    Csv,
    /// One row per pod of each cell and repeat (CSV, as csv).
    Pods,
    /// {"run": run.json, "cells": [...]}.
    Json,
    /// The report's tables.
    Markdown,
    /// One row per cell (repeats combined): each metric's mean and the half-width of its
    /// 95% interval over repeats (`_ci95`), beside the within-cell spreads (CSV).
    Summary,
    /// A capacity run's table: per strategy the pods that fit, goodput, p99, GPU
    /// utilisation, energy per request and the first miss (CSV).
    Capacity,
}

/// `export` flags.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The run directory.
    pub run_dir: PathBuf,
    /// csv, pods, json, markdown, summary or capacity.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
}

/// `verify` flags.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// The run directory.
    pub run_dir: PathBuf,
    /// First rewrite each cell's speed-up and slowdown against its own pass's 1-pod cell
    /// (runs made while a later pass took an earlier pass's), saying what changed.
    #[arg(long)]
    pub rederive: bool,
}

/// `host-noise` flags.
#[derive(Debug, Clone, Args)]
pub struct HostNoiseArgs {
    /// Run directories of one sweep plan, each on a different GPU of one model (three or more).
    #[arg(required = true, num_args = 1..)]
    pub run_dirs: Vec<PathBuf>,
}

/// `compare` flags.
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// The reference run directory.
    pub baseline: PathBuf,
    /// The run to judge.
    pub candidate: PathBuf,
    /// A change counts when it is worse by more than this percentage (with its sign: 0.5%, 5%), than the noise (between repeats when both runs repeated the cell, else the window-to-window spread) and, for p99, than the quantile resolution.
    #[arg(long, default_value = "5%")]
    pub threshold: String,
    /// Between-host noise to judge runs made on different GPUs by (JSON lines from
    /// `host-noise`) [default: the measurements built in, from results/host-noise.jsonl].
    #[arg(long, value_name = "FILE")]
    pub host_noise: Option<PathBuf>,
}

/// `manifests` flags.
#[derive(Debug, Clone, Args)]
pub struct ManifestsArgs {
    /// Directory to write.
    #[arg(long, default_value = "manifests")]
    pub out: PathBuf,
    /// Workload image the Deployment and Job use.
    #[arg(long, default_value = crate::config::plan::DEFAULT_IMAGE)]
    pub image: String,
    /// The GPU node: the only node the harness's ClusterRole may read and label, and the
    /// node the Deployment and the Job name. The committed `manifests/` hold a
    /// placeholder; write your own set with `--node NODE --out DIR` and apply that.
    #[arg(long, value_name = "NODE", default_value = crate::config::plan::NODE_PLACEHOLDER)]
    pub node: String,
    /// Compare with the files instead of writing them (exit 1 when they differ).
    #[arg(long)]
    pub check: bool,
}
