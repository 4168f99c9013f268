//! The sweep's options: one struct that is both the `sweep` flags (`clap::Args`) and the
//! config file's keys (`Deserialize`), so the two can never drift apart. Every value is
//! typed ([`crate::config::values`]); flags override the file by a merge of the two
//! serialised forms, with no hand-kept list of fields.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::config::values::{
    BackendKind, DeviceChoice, List, Load, Model, PodCount, Precision, PrometheusSetting, SharingApi, Slo, Span,
    StrategyName, TimeSlice,
};
use crate::domain::{MpsMemory, MpsThreads};
use crate::error::{BenchError, Result};

/// Values a sweep can take from flags or the config file (all optional here; defaults
/// and cross-checks come in `SweepPlan::from_options`).
#[derive(Debug, Clone, Default, PartialEq, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepOptions {
    /// local (processes on this machine) or kubernetes.
    #[arg(long)]
    pub backend: Option<BackendKind>,
    /// Comma-separated: exclusive,time-slicing,mps,mig [default: all four].
    #[arg(long)]
    pub strategies: Option<List<StrategyName>>,
    /// Comma-separated pod counts [default: 1,3,5,7].
    #[arg(long)]
    pub pods: Option<List<PodCount>>,
    /// yolos-small, minilm-l6 or tiny [default: yolos-small].
    #[arg(long)]
    pub model: Option<Model>,
    /// fp32, tf32 or bf16 [default: bf16 on a GPU, fp32 on the CPU].
    #[arg(long)]
    pub precision: Option<Precision>,
    /// auto (the GPU, else the CPU smoke pipeline), cuda or cpu [default: auto].
    #[arg(long)]
    pub device: Option<DeviceChoice>,
    /// Samples per inference [default: 1].
    #[arg(long)]
    pub batch: Option<u32>,
    /// Discarded time after all pods are ready, at most: it ends earlier once the pods are steady, when three 1-s probes in a row agree within 2% on throughput and mean latency (so never before 3 s; not with --prometheus, whose series move at its scrape interval) [default: 10s].
    #[arg(long)]
    pub warmup: Option<Span>,
    /// Warm up for the whole of --warmup, steady or not (isolation runs always do: their events are timed from readiness).
    #[arg(long, action = clap::ArgAction::SetTrue)]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fixed_warmup: bool,
    /// Measurement window; a cell ends when 3 windows agree within 5% [default: 5s; 2s with --target].
    #[arg(long)]
    pub window: Option<Span>,
    /// Most measurement time per cell [default: 30s].
    #[arg(long)]
    pub max_cell: Option<Span>,
    /// Passes over the whole plan, each in a rotated strategy order; every cell then reports the mean over passes ± a 95% interval [default: 1].
    #[arg(long)]
    pub repeat: Option<u32>,
    /// A precision target instead of a fixed number of passes, e.g. 1%: passes go on (each in a rotated strategy order, as --repeat's) over the cells whose 95% interval on mean latency or throughput is still wider than ± that share of their mean, until every cell is within it, --repeat passes were made (then the most; default 10) or --budget is spent; the sweep then names the cells that did not get there. Every cell gets at least two passes.
    #[arg(long)]
    pub target: Option<String>,
    /// With --target: the most wall time the sweep may take, e.g. 10m; it stops before the next cell once spent (a resumed sweep counts from its resume).
    #[arg(long)]
    pub budget: Option<Span>,
    /// Requests: closed (each pod back to back, the reference study), poisson:RATE (Poisson arrivals, RATE per pod per second), or total:RATE (RATE per cell, split equally over its pods) [default: closed]. Open-loop latency runs from each request's scheduled arrival.
    #[arg(long)]
    pub load: Option<Load>,
    /// Latency objectives, comma-separated or repeated: p50=DUR, p90=DUR, p99=DUR (at most one each), e.g. p99=25ms; with --stream also on tokens, one each: ttft:pXX=DUR (time to first token), itl:pXX=DUR (every gap between tokens), tpot:pXX=DUR (time per output token), e.g. ttft:p99=500ms,itl:p99=50ms. Each row then gets the share within each threshold (slo_p99_attainment, ttft_slo_attainment…), whether all held (slo_met) and the goodput (goodput_per_s): the requests/s within the tightest latency threshold or, streamed, the requests/s that met every objective on their own numbers, as vLLM's --goodput counts them (an itl: objective judged on the request's TPOT).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "one_list")]
    pub slo: Vec<List<Slo>>,
    /// Longest wait for pods to become ready [default: 180s].
    #[arg(long)]
    pub ready_timeout: Option<Span>,
    /// Directory for the run; the run lands in <out>/<run-id>/ [default: runs].
    #[arg(long, value_parser = utf8_path)]
    pub out: Option<PathBuf>,
    /// Name of the run's directory [default: <UTC time>-<gpu>].
    #[arg(long, conflicts_with = "resume")]
    pub run_id: Option<String>,
    /// Metrics source: off (scrape pods), spawn (a private Prometheus), or a server URL [default: off].
    #[arg(long)]
    pub prometheus: Option<PrometheusSetting>,
    /// The gpushare-workload binary [default: beside gpushare-bench, then PATH].
    #[arg(long, value_parser = utf8_path)]
    pub workload_bin: Option<PathBuf>,
    /// Your own inference server instead of gpushare-workload: a shell command run once per pod, with {port} replaced by the port its /metrics must listen on (127.0.0.1 on the local backend), and PORT, POD and STRATEGY in its environment beside the strategy's CUDA/MPS settings, e.g. 'python3 serve.py --port {port}'. It must export a latency histogram (--metric) and make its own requests, or answer --request. On Kubernetes it runs in the image given by --image, under /bin/sh -c, {port} being 9400 (for an image without a shell, see --server-image).
    #[arg(long)]
    pub workload_cmd: Option<String>,
    /// The latency histogram to read, in seconds [default: inference_time_seconds].
    #[arg(long)]
    pub metric: Option<String>,
    /// Readiness: the HTTP path that answers 200 once a pod serves, or `none` for a server without one (ready at the histogram's first observation) [default: /healthz].
    #[arg(long)]
    pub ready_path: Option<String>,
    /// Send the requests yourself to a server of your own (--workload-cmd) that waits for them: the URL of each, {port} the pod's port, e.g. http://127.0.0.1:{port}/infer. The harness sends them as --load says (closed: one at a time per pod; poisson:RATE or total:RATE: Poisson arrivals, timed from each arrival) and times every answer into the rows' latency and throughput (source: client). Needs the server's --ready-path.
    #[arg(long)]
    pub request: Option<String>,
    /// The body of every --request, read once from FILE and POSTed (Content-Type application/json for *.json, else application/octet-stream); without it, GET.
    #[arg(long, value_parser = utf8_path)]
    pub body: Option<PathBuf>,
    /// --request is an OpenAI-compatible server's streaming endpoint (completions: /v1/completions, chat: /v1/chat/completions), e.g. vLLM's: the harness writes each request (--prompt-tokens, --output-tokens with ignore_eos, stream_options.include_usage) and times every token from the request's scheduled arrival. Rows gain time to first token (ttft_*), inter-token latency (itl_*), time per output token (tpot_*) and output tokens/s; the latency columns are end to end; every request is kept in requests.jsonl. Objectives may then name ttft:, itl: or tpot: (--slo).
    #[arg(long, value_enum)]
    pub stream: Option<crate::config::request::Api>,
    /// The `model` field of every streamed request: the name the server serves its model under (vLLM: --served-model-name) [default: default].
    #[arg(long)]
    pub served_model: Option<String>,
    /// Prompt tokens of each streamed request: N, or A-B drawn uniformly per request from the pod's recorded seed (completions send token ids, so the count is exact; chat sends that many short words) [default: 128].
    #[arg(long)]
    pub prompt_tokens: Option<crate::config::values::Lengths>,
    /// Output tokens of each streamed request (max_tokens, with ignore_eos so the server does not stop early): N or A-B [default: 128].
    #[arg(long)]
    pub output_tokens: Option<crate::config::values::Lengths>,
    /// Prompt and output lengths from a trace: FILE holds one request's `PROMPT OUTPUT` token counts per line (whitespace or a comma between; `#` comments), and each request draws a line uniformly from the pod's recorded seed; the pairs are kept in run.json. Instead of --prompt-tokens and --output-tokens.
    #[arg(long, value_parser = utf8_path)]
    pub lengths: Option<PathBuf>,
    /// The streaming server's own time-to-first-token histogram, read from its /metrics at the start and end of each cell (vLLM: vllm:time_to_first_token_seconds): rows gain server_ttft_* beside the client's ttft_*, and the report sets them side by side.
    #[arg(long)]
    pub server_ttft_metric: Option<String>,
    /// The streaming server's own inter-token histogram, read as --server-ttft-metric is (vLLM: vllm:inter_token_latency_seconds; before vLLM 0.11, vllm:time_per_output_token_seconds): rows gain server_itl_*.
    #[arg(long)]
    pub server_itl_metric: Option<String>,
    /// Extra argument for every workload pod (repeatable), e.g. --workload-arg=--weights --workload-arg=DIR; with --server-image, the arguments of your server's entrypoint.
    #[arg(long = "workload-arg", allow_hyphen_values = true)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload_args: Vec<String>,
    /// Local: the GPU to measure on a machine with several, by index or GPU-… UUID as `nvidia-smi -L` lists them (`gpushare-bench doctor` shows what runs on each). Its pods, the MPS daemon, MIG devices and telemetry all use that GPU, and run.json records its index, UUID, name and bus id [default: 0].
    #[arg(long)]
    pub gpu: Option<crate::telemetry::inventory::GpuSelector>,
    /// Local sweep: several GPUs at once, e.g. 0,1 (indices or GPU-… UUIDs). Each strategy's cells run on one of them, one cell per GPU at a time, the GPUs in parallel; then the cell that ran beside the most others is measured again alone, and the report sets the two side by side (the GPUs share the host's CPUs, PCIe and power). Not with --gpu or a Prometheus.
    #[arg(long, conflicts_with = "gpu")]
    pub gpus: Option<List<crate::telemetry::inventory::GpuSelector>>,
    /// Local: measure even though other processes compute on the GPU (a sweep refuses such a GPU: their work would count as the cost of sharing). Recorded in run.json.
    #[arg(long, action = clap::ArgAction::SetTrue)]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_busy_gpu: bool,
    /// Local pods listen on BASE, BASE+1, … (for an existing Prometheus that scrapes fixed ports) [default: free ports].
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Kubernetes: the GPU node to use.
    #[arg(long)]
    pub node: Option<String>,
    /// Kubernetes: namespace for the workload [default: gpushare-bench].
    #[arg(long)]
    pub namespace: Option<String>,
    /// Kubernetes: the workload image, or your server's with --workload-cmd [default: gpushare-workload:0.1.0, built from workload/Dockerfile].
    #[arg(long)]
    pub image: Option<String>,
    /// Kubernetes: your own inference server as its image runs it: the image's entrypoint, with the --workload-arg values as its arguments ({port} in them is the metrics port 9400; PORT, POD and STRATEGY are in its environment), e.g. --server-image REG/yolos-pytorch --workload-arg=--port={port}. No shell needed, so distroless images work; without --workload-arg the image's own CMD runs. Instead of --image with --workload-cmd.
    #[arg(long, conflicts_with_all = ["image", "workload_cmd"])]
    pub server_image: Option<String>,
    /// Kubernetes: a toleration of the workload pods, KEY[=VALUE][:EFFECT] (repeatable) [default: nvidia.com/gpu:NoSchedule, the taint GPU nodes commonly carry].
    #[arg(long = "toleration")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<String>,
    /// Kubernetes: an image pull secret of the workload pods (repeatable).
    #[arg(long = "image-pull-secret")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// Kubernetes: the GPU operator's namespace, where the ClusterPolicy's device-plugin ConfigMap lives [default: gpu-operator].
    #[arg(long)]
    pub operator_namespace: Option<String>,
    /// Kubernetes: the MIG layout label value [default: seven of the smallest instance, e.g. all-1g.10gb].
    #[arg(long)]
    pub mig_layout: Option<String>,
    /// Kubernetes: namespace of the Prometheus pod to port-forward to when --prometheus is off [default: monitoring].
    #[arg(long)]
    pub prometheus_namespace: Option<String>,
    /// Kubernetes: label selector of that pod [default: app.kubernetes.io/name=prometheus].
    #[arg(long)]
    pub prometheus_selector: Option<String>,
    /// Kubernetes: how pods get their share of the GPU: device-plugin (the GPU operator's node configuration, extended resources) or dra (ResourceClaims with the NVIDIA DRA driver's GpuConfig, Kubernetes 1.34+: a claim per pod for exclusive, one shared claim for time-slicing and MPS) [default: device-plugin].
    #[arg(long)]
    pub sharing_api: Option<SharingApi>,
    /// DRA: time-slicing's intervals, comma-separated from default, short, medium, long: each is set by the driver on the claim's GPU (feature gate TimeSlicingSettings) and measured as its own rows, e.g. --timeslice default,short,long [default: no GpuConfig: the GPU time-sliced as the node has it].
    #[arg(long)]
    pub timeslice: Option<List<TimeSlice>>,
    /// MPS: each client's share of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), comma-separated, each its own rows: auto (the device plugin's equal split, 100 / the cell's clients) or a percentage from 1 to 100, e.g. --mps-threads auto,100. Local and DRA sweeps; the device plugin's MPS sharing knows only auto [default: auto].
    #[arg(long)]
    pub mps_threads: Option<List<MpsThreads>>,
    /// MPS: each client's pinned device memory (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), comma-separated, each its own rows: auto (the GPU's memory / the cell's clients), none (no limit) or a size such as 20Gi or 20480Mi, e.g. --mps-memory auto,none. Local and DRA sweeps, as --mps-threads [default: auto].
    #[arg(long)]
    pub mps_memory: Option<List<MpsMemory>>,
}

/// A config file as read once: its path, its text (which names the line of a value
/// refused later) and its options.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    /// The file.
    pub path: std::path::PathBuf,
    /// Its text.
    pub text: String,
    /// What it sets.
    pub options: SweepOptions,
}

impl ConfigFile {
    /// Reads a TOML config file; errors name the file, the line and the bad value.
    pub fn read(path: &Path) -> Result<Self> {
        let text = crate::files::read_text(path, crate::files::limits::INPUT).map_err(|e| BenchError::Config {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let options = toml::from_str(&text).map_err(|e| BenchError::Config {
            path: path.to_path_buf(),
            reason: match e.span() {
                Some(span) => {
                    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                    let shown = text.lines().nth(line - 1).unwrap_or("").trim();
                    format!("line {line} (`{shown}`): {}", e.message())
                }
                None => e.message().to_string(),
            },
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            text,
            options,
        })
    }
}

impl SweepOptions {
    /// Reads a TOML config file ([`ConfigFile::read`]).
    pub fn from_file(path: &Path) -> Result<Self> {
        ConfigFile::read(path).map(|c| c.options)
    }

    /// `self` with every value `over` sets replaced (flags over a file). Both are
    /// serialised, unset values dropped, and the maps merged: no list of fields to keep.
    /// Every value round-trips (Display and FromStr agree, paths are UTF-8), so an error
    /// here is a bug, reported as such rather than silently dropping either side.
    pub fn overridden_by(self, over: SweepOptions) -> Result<SweepOptions> {
        let fail = |e: serde_json::Error| BenchError::Flag {
            flag: "options".into(),
            value: String::new(),
            reason: format!("cannot merge the flags over the config file: {e}"),
        };
        let base = serde_json::to_value(&self).map_err(fail)?;
        let top = serde_json::to_value(&over).map_err(fail)?;
        let (serde_json::Value::Object(mut base), serde_json::Value::Object(top)) = (base, top) else {
            return Ok(over);
        };
        for (k, v) in top {
            if !v.is_null() {
                base.insert(k, v);
            }
        }
        serde_json::from_value(serde_json::Value::Object(base)).map_err(fail)
    }
}

/// A repeatable list flag (`--slo A --slo B,C`) is one list in the config file and in
/// the merge of flags over it: `"A,B,C"`.
mod one_list {
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::config::values::List;

    pub fn serialize<T: std::fmt::Display + Clone, S: Serializer>(lists: &[List<T>], s: S) -> Result<S::Ok, S::Error> {
        List(lists.iter().flat_map(|l| l.0.iter().cloned()).collect()).serialize(s)
    }

    pub fn deserialize<'de, T: FromStr<Err = String> + PartialEq, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<List<T>>, D::Error> {
        Ok(vec![List::deserialize(d)?])
    }
}

/// A path flag: UTF-8, since it is recorded in run.json and merged as text.
fn utf8_path(s: &str) -> std::result::Result<PathBuf, String> {
    Ok(PathBuf::from(s))
}
