//! Command-line interface of `gpushare-workload`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::backend::{DEFAULT_SEED, ModelPlan};
use crate::config::{Device, Precision, Preset};
use crate::error::Result;
use crate::load::LoadPattern;
use crate::size::parse_bytes;

/// Transformer inference workload for GPU-sharing experiments.
///
/// Without a subcommand it serves: it runs inferences in a loop and exports their
/// latency as the Prometheus histogram `inference_time_seconds` on --listen
/// (/metrics, and /healthz, which answers 200 once the model is warm).
///
/// Exit codes: 0 clean stop (SIGTERM/SIGINT), 2 bad arguments or input files,
/// 3 no GPU or driver, 4 out of GPU memory, 5 a GPU fault lost the CUDA context
/// (--inject-fault-after, or a neighbour's fault under MPS), 1 anything else.
#[derive(Debug, Parser)]
#[command(name = "gpushare-workload", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Optional subcommand; without one the workload serves.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Serving options.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Subcommands besides serving.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure latency and TFLOP/s per model and precision (and, on the GPU, per kernel).
    Bench(BenchArgs),
    /// Serve a Llama-style decoder behind an OpenAI-compatible streaming API (POST
    /// /v1/completions and /v1/chat/completions with "stream": true; GET /healthz), greedy
    /// decoding at batch 1, one request at a time: for gpushare-bench's --stream.
    Llm(LlmArgs),
    /// Write a bf16 copy of a safetensors weights directory (half the size, for GPU machines).
    ConvertWeights {
        /// Directory with model.safetensors, config.json and tokenizer.json.
        src: PathBuf,
        /// Directory to write the copy to.
        dst: PathBuf,
    },
}

/// What to run and how, shared by serving and bench.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Model: yolos-small (the reference study's shape), minilm-l6 (real weights, needs --weights), tiny.
    #[arg(long, default_value = "yolos-small", value_parser = clap::value_parser!(PresetArg))]
    pub model: PresetArg,
    /// cuda or cpu.
    #[arg(long, default_value = "cuda", value_parser = clap::value_parser!(DeviceArg))]
    pub device: DeviceArg,
    /// fp32, tf32 or bf16 [default: bf16 on cuda, fp32 on cpu].
    #[arg(long, value_parser = clap::value_parser!(PrecisionArg))]
    pub precision: Option<PrecisionArg>,
    /// Images or sentences per inference.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Directory with model.safetensors, config.json and tokenizer.json (minilm-l6).
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Seed of the seeded weights and inputs.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Run every kernel eagerly instead of replaying one CUDA graph.
    #[arg(long)]
    pub no_graph: bool,
}

impl ModelArgs {
    /// The engine plan, validated.
    pub fn plan(&self, reserve_bytes: u64) -> Result<ModelPlan> {
        let device = self.device.0;
        let plan = ModelPlan {
            preset: self.model.0,
            device,
            precision: self.precision.map(|p| p.0).unwrap_or(match device {
                Device::Cuda => Precision::Bf16,
                Device::Cpu => Precision::Fp32,
            }),
            batch: self.batch,
            weights: self.weights.clone(),
            seed: self.seed,
            reserve_bytes,
            use_graph: !self.no_graph,
        };
        plan.validate()?;
        Ok(plan)
    }
}

/// Serving options.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// closed (next inference when the last returns) or poisson:RATE (open loop, RATE per second; latency includes queueing).
    #[arg(long, default_value = "closed", value_parser = clap::value_parser!(LoadArg))]
    pub load: LoadArg,
    /// Address of the metrics endpoint.
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub listen: String,
    /// Extra GPU memory to allocate and touch at start, e.g. 8GiB (models memory-hungry workloads).
    #[arg(long, default_value = "0", value_parser = parse_size_arg)]
    pub reserve_memory: u64,
    /// Host-side work added to every inference, inside its timed latency, e.g. 0.2ms: a
    /// busy wait on the CPU after the GPU pass returns (models pre- and post-processing;
    /// plants a known slowdown to test a regression check). 0 adds nothing.
    #[arg(long, default_value = "0", value_parser = parse_delay_arg)]
    pub add_latency: std::time::Duration,
    /// Fault on purpose this long after turning ready, e.g. 5s. On the GPU a kernel writes
    /// through an unmapped address: this process's CUDA context is lost and it exits
    /// with code 5 (an ordinary illegal-address error; the GPU needs no reset). On the
    /// CPU the process aborts (SIGABRT). Off unless given: isolation tests only.
    #[arg(long, value_parser = parse_fault_arg)]
    pub inject_fault_after: Option<std::time::Duration>,
    /// Kill this process with SIGKILL this long after turning ready, e.g. 5s: a crash
    /// mid-load, from inside (on Kubernetes the harness cannot send a SIGKILL: deleting
    /// a pod sends SIGTERM first). The process must not be its PID namespace's init:
    /// the kernel ignores SIGKILL sent to PID 1 from inside (a container needs
    /// `shareProcessNamespace: true`); it then exits with code 1 and says so. Off
    /// unless given: isolation tests only.
    #[arg(long, value_parser = parse_crash_arg)]
    pub crash_after: Option<std::time::Duration>,
    /// Take more memory while serving: AFTER:SIZE[,AFTER:SIZE…] from turning ready, e.g.
    /// 5s:8GiB,10s:8GiB (device memory on the GPU, touched; exit code 4 when there is
    /// not enough). Models a neighbour that grows.
    #[arg(long, value_parser = parse_grow_arg)]
    pub grow_memory: Option<GrowSchedule>,
    /// Inferences run and discarded before /healthz turns 200.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Open loop: seed of the arrival times. Default: derived from --seed and this pod's
    /// name (GPUSHARE_POD, else POD_NAME, else the host name), so the pods of a cell draw
    /// independent arrivals. The value used is exported as workload_info{load_seed}.
    #[arg(long)]
    pub load_seed: Option<u64>,
    /// Open loop: most requests waiting; later arrivals are dropped and counted in inference_errors_total{kind="dropped"}.
    #[arg(long, default_value_t = 10_000)]
    pub max_queue: usize,
}

/// Options of the decoder's server.
#[derive(Debug, Clone, Args)]
pub struct LlmArgs {
    /// The decoder's shape: llm (1.1 B parameters, Llama 3.2 1B's body) or tiny (for
    /// the CPU and tests).
    #[arg(long, default_value = "llm")]
    pub shape: String,
    /// cuda (our kernels, on GPU 0 of CUDA_VISIBLE_DEVICES) or cpu (the f32 reference
    /// the kernels are tested against; labelled a CPU run wherever its numbers appear).
    #[arg(long, default_value = "cuda", value_parser = clap::value_parser!(DeviceArg))]
    pub device: DeviceArg,
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub listen: String,
    /// Seed of the random weights.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Requests of 16 tokens run before /healthz answers 200.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Runs each decode step's kernels one by one instead of replaying them as one CUDA
    /// graph (GPU only; to measure what the graph saves).
    #[arg(long)]
    pub no_graph: bool,
}

/// Bench options.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Models, comma-separated.
    #[arg(long, default_value = "yolos-small", value_delimiter = ',', value_parser = clap::value_parser!(PresetArg))]
    pub models: Vec<PresetArg>,
    /// Precisions, comma-separated [default: fp32,tf32,bf16 on cuda, fp32 on cpu].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(PrecisionArg))]
    pub precisions: Vec<PrecisionArg>,
    /// cuda or cpu.
    #[arg(long, default_value = "cuda", value_parser = clap::value_parser!(DeviceArg))]
    pub device: DeviceArg,
    /// Images or sentences per inference.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Timed inferences per configuration (after warm-up).
    #[arg(long, default_value_t = 200)]
    pub iters: usize,
    /// Untimed inferences first.
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// Directory with real weights (for minilm-l6).
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Also time every kernel separately (GPU only).
    #[arg(long)]
    pub split: bool,
    /// Write the results as JSON lines to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run every kernel eagerly instead of replaying one CUDA graph.
    #[arg(long)]
    pub no_graph: bool,
}

macro_rules! parsed_arg {
    ($name:ident, $inner:ty) => {
        /// Command-line wrapper that parses with the domain type's `FromStr`.
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub struct $name(pub $inner);
        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                s.parse::<$inner>().map($name).map_err(|e| e.to_string())
            }
        }
    };
}
parsed_arg!(PresetArg, Preset);
parsed_arg!(PrecisionArg, Precision);
parsed_arg!(DeviceArg, Device);
parsed_arg!(LoadArg, LoadPattern);

/// A `--grow-memory` schedule: (time from readiness, bytes), in order.
#[derive(Debug, Clone, PartialEq)]
pub struct GrowSchedule(pub Vec<(std::time::Duration, u64)>);

fn parse_grow_arg(s: &str) -> std::result::Result<GrowSchedule, String> {
    crate::size::parse_grow_schedule(s)
        .map(GrowSchedule)
        .map_err(|e| e.to_string())
}

fn parse_fault_arg(s: &str) -> std::result::Result<std::time::Duration, String> {
    crate::size::parse_fault_after(s).map_err(|e| e.to_string())
}

fn parse_crash_arg(s: &str) -> std::result::Result<std::time::Duration, String> {
    crate::size::parse_crash_after(s).map_err(|e| e.to_string())
}

fn parse_delay_arg(s: &str) -> std::result::Result<std::time::Duration, String> {
    crate::size::parse_delay(s).map_err(|e| e.to_string())
}

fn parse_size_arg(s: &str) -> std::result::Result<u64, String> {
    parse_bytes(s).map_err(|e| e.to_string())
}
