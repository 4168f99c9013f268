//! From options (flags over a config file) to one validated [`SweepPlan`]: defaults
//! and the checks that involve several options. The rest of the program never sees a
//! raw string.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::options::{ConfigFile, SweepOptions};
pub use crate::config::values::{BackendKind, DeviceChoice, Load, Model, Precision, PrometheusSetting, Slo};
use crate::domain::Strategy;
use crate::error::{BenchError, Result};

/// How long and how finely a cell is measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasureSettings {
    /// Longest wait for pods to become ready.
    pub ready_timeout: Duration,
    /// Discarded time after readiness: its longest, or its length where
    /// `steady_warmup` is off.
    pub warmup: Duration,
    /// Warm-up ends once the pods are steady (see [`crate::stats::steady`]) rather
    /// than always after `warmup`.
    pub steady_warmup: bool,
    /// Window length.
    pub window: Duration,
    /// Measurement cap (after warm-up).
    pub max_cell: Duration,
    /// Windows that must agree; also the minimum number of windows.
    pub stable_windows: usize,
    /// Agreement tolerance (0.05 = 5%).
    pub tolerance: f64,
}

impl MeasureSettings {
    /// How long one cell measures: at least its warm-up and the windows that must agree,
    /// at most its warm-up and its cap (pods' start-up and strategy switches come on top).
    pub fn cell_time(&self) -> (Duration, Duration) {
        let windows = self.window * self.stable_windows as u32;
        (self.warmup + windows, self.warmup + self.max_cell.max(windows))
    }
}

/// What a DRA sweep may set beyond the strategy (`--timeslice`; MPS's limits are the
/// plan's arms, as on every backend).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DraSettings {
    /// Time-slicing's intervals, each its own arm of the sweep (`--timeslice
    /// default,short,long`; none: one shared claim without config).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeslices: Vec<crate::domain::TimeSliceInterval>,
    /// A run made with the DRA-only `--mps-thread-percentage`, which `--mps-threads`
    /// replaced: the share every MPS claim of the run set (its rows carry no limit of
    /// their own). Read to report it; never written.
    #[serde(default, rename = "mps_thread_percentage", skip_serializing)]
    pub former_mps_thread_percentage: Option<u32>,
    /// As `former_mps_thread_percentage`, for `--mps-memory-limit`.
    #[serde(default, rename = "mps_memory_limit", skip_serializing)]
    pub former_mps_memory_limit: Option<String>,
}

/// A validated sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPlan {
    /// Where the pods run, with the settings only that backend has.
    pub backend: BackendPlan,
    /// Strategies in order, no duplicates.
    pub strategies: Vec<Strategy>,
    /// Pod counts in order, no duplicates.
    pub pods: Vec<u32>,
    /// Model preset (None: yolos-small on a GPU, tiny on the CPU).
    pub model: Option<Model>,
    /// Precision (None: the device's default, bf16 on GPUs, fp32 on CPUs).
    pub precision: Option<Precision>,
    /// Device choice.
    pub device: DeviceChoice,
    /// Samples per inference.
    pub batch: u32,
    /// Passes over the whole plan (1 to 100); with a precision target, the most.
    pub repeat: u32,
    /// `--target`: the relative 95% half-width on mean latency and throughput each
    /// cell's passes go on until (a fraction: 0.01 for 1%).
    pub target: Option<f64>,
    /// `--budget`: the most wall time of a sweep with a precision target.
    pub budget: Option<Duration>,
    /// How the pods get their requests.
    pub load: Load,
    /// Latency objectives each row is judged against.
    pub slos: Vec<Slo>,
    /// MPS: each client's share of the SMs, each its own arm (`--mps-threads`; empty:
    /// auto alone).
    pub mps_threads: Vec<crate::domain::MpsThreads>,
    /// MPS: each client's pinned memory, each its own arm (`--mps-memory`; empty: auto
    /// alone).
    pub mps_memory: Vec<crate::domain::MpsMemory>,
    /// Measurement settings.
    pub measure: MeasureSettings,
    /// Results directory.
    pub out: PathBuf,
    /// The run's directory name (None: from the time and the GPU).
    pub run_id: Option<String>,
    /// Metrics source.
    pub prometheus: PrometheusSetting,
    /// Explicit workload binary.
    pub workload_bin: Option<PathBuf>,
    /// Extra workload arguments.
    pub workload_args: Vec<String>,
    /// The user's own server (`--workload-cmd`, local): a shell command with `{port}`.
    pub workload_cmd: Option<String>,
    /// The latency histogram read from every pod (`--metric`).
    pub metric: String,
    /// The readiness path, or `none`: ready at the histogram's first observation.
    pub ready_path: String,
    /// The harness's own requests to the user's server (`--request`, `--body`).
    pub request: Option<crate::config::request::RequestPlan>,
    /// What the run measures: a sweep's cells, an isolation run's trials or a capacity
    /// search's cells.
    pub kind: RunKind,
}

/// Where the pods run, with the settings only that backend has: a local plan holds no
/// node and a Kubernetes plan no GPU of this machine.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendPlan {
    /// Processes on this machine.
    Local(LocalPlan),
    /// Pods on a Kubernetes node.
    Kubernetes(Box<KubernetesPlan>),
}

/// The local backend's settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LocalPlan {
    /// Fixed ports for the pods (base + index).
    pub base_port: Option<u16>,
    /// The GPU measured (`--gpu`; None: GPU 0).
    pub gpu: Option<crate::telemetry::inventory::GpuSelector>,
    /// A sweep's GPUs whose cells run in parallel (`--gpus`; empty: one GPU).
    pub gpus: Vec<crate::telemetry::inventory::GpuSelector>,
    /// Measure a GPU other processes use (`--allow-busy-gpu`).
    pub allow_busy_gpu: bool,
}

/// The Kubernetes backend's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesPlan {
    /// The GPU node.
    pub node: String,
    /// The namespace of the workload pods.
    pub namespace: String,
    /// The workload image.
    pub image: String,
    /// The user's own server as its image runs it (`--server-image`): the entrypoint's
    /// arguments (the `--workload-arg` values, `{port}` not yet replaced).
    pub server_args: Option<Vec<String>>,
    /// The MIG layout (None: from the GPU product).
    pub mig_layout: Option<String>,
    /// Tolerations of the workload pods (`KEY[=VALUE][:EFFECT]`).
    pub tolerations: Vec<String>,
    /// Image pull secrets of the workload pods.
    pub image_pull_secrets: Vec<String>,
    /// The GPU operator's namespace.
    pub operator_namespace: String,
    /// Where the Prometheus pod to port-forward to lives: namespace and label selector.
    pub prometheus_pod: (String, String),
    /// How the pods get their share of the GPU.
    pub sharing: Sharing,
}

/// How Kubernetes pods get their share of the GPU.
#[derive(Debug, Clone, PartialEq)]
pub enum Sharing {
    /// The device plugin's node configuration (GPU operator): extended resources.
    DevicePlugin,
    /// ResourceClaims with the NVIDIA DRA driver's `GpuConfig`, with the time-slice
    /// intervals and MPS limits of the claims.
    Dra(DraSettings),
}

impl Sharing {
    /// The API's name, as `--sharing-api` gives it.
    pub fn api(&self) -> crate::config::values::SharingApi {
        match self {
            Sharing::DevicePlugin => crate::config::values::SharingApi::DevicePlugin,
            Sharing::Dra(_) => crate::config::values::SharingApi::Dra,
        }
    }
}

/// What a run measures, with the plan only that kind of run has: a run is a sweep, an
/// isolation run or a capacity search, never two of them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "RunKindFields", into = "RunKindFields")]
pub enum RunKind {
    /// `sweep`: every strategy × pod count.
    #[default]
    Sweep,
    /// `isolation`: its trials instead of the sweep's cells.
    Isolation(crate::config::isolation::IsolationPlan),
    /// `capacity`: the pod counts it may search (`plan.pods` is then 1 to its
    /// `max_pods`, the cells the search may measure).
    Capacity(CapacityPlan),
}

/// [`RunKind`] as run.json writes it: an `isolation` or a `capacity` object beside the
/// plan, neither for a sweep.
#[derive(serde::Serialize, serde::Deserialize)]
struct RunKindFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    isolation: Option<crate::config::isolation::IsolationPlan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capacity: Option<CapacityPlan>,
}

impl TryFrom<RunKindFields> for RunKind {
    type Error = &'static str;
    fn try_from(f: RunKindFields) -> std::result::Result<Self, Self::Error> {
        match (f.isolation, f.capacity) {
            (None, None) => Ok(RunKind::Sweep),
            (Some(i), None) => Ok(RunKind::Isolation(i)),
            (None, Some(c)) => Ok(RunKind::Capacity(c)),
            (Some(_), Some(_)) => Err("a run is an isolation run or a capacity run, not both"),
        }
    }
}

impl From<RunKind> for RunKindFields {
    fn from(k: RunKind) -> Self {
        let (isolation, capacity) = match k {
            RunKind::Sweep => (None, None),
            RunKind::Isolation(i) => (Some(i), None),
            RunKind::Capacity(c) => (None, Some(c)),
        };
        RunKindFields { isolation, capacity }
    }
}

impl RunKind {
    /// An isolation run's plan.
    pub fn isolation(&self) -> Option<&crate::config::isolation::IsolationPlan> {
        match self {
            RunKind::Isolation(i) => Some(i),
            _ => None,
        }
    }

    /// A capacity run's search.
    pub fn capacity(&self) -> Option<&CapacityPlan> {
        match self {
            RunKind::Capacity(c) => Some(c),
            _ => None,
        }
    }

    /// The command that makes this kind of run.
    pub fn command(&self) -> &'static str {
        match self {
            RunKind::Sweep => "sweep",
            RunKind::Isolation(_) => "isolation",
            RunKind::Capacity(_) => "capacity",
        }
    }

    /// What `--resume` of another command says about a run of this kind.
    pub fn resume_hint(&self) -> String {
        let c = self.command();
        let article = if matches!(self, RunKind::Isolation(_)) {
            "an"
        } else {
            "a"
        };
        format!("this run is {article} {c} run: continue it with `gpushare-bench {c} --resume`")
    }
}

/// Defaults: the reference study's pods and strategies; settings that keep the whole
/// default sweep on one GPU within 10 minutes (12 measured cells of at most ~45 s).
pub const DEFAULT_PODS: [u32; 4] = [1, 3, 5, 7];
/// Warm-up default.
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(10);
/// Window default.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(5);
/// Window default of a sweep with a precision target: its precision comes from the
/// passes, and within a cell 5-s windows agree to 0.01–0.41% (the H200 reference run,
/// whose passes differ by up to 0.67%).
pub const TARGET_WINDOW: Duration = Duration::from_secs(2);
/// Cap default.
pub const DEFAULT_MAX_CELL: Duration = Duration::from_secs(30);
/// The shortest window: shorter ones measure scrape jitter.
pub const MIN_WINDOW: Duration = Duration::from_millis(500);
/// Readiness default.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(180);
/// The Kubernetes workload image: `gpushare-workload:<version>`, under the registry the
/// build was given (`GPUSHARE_IMAGE_REGISTRY`: the release binaries name the images
/// the release published; a source build names the image docs/kubernetes.md builds).
pub const DEFAULT_IMAGE: &str = env!("GPUSHARE_DEFAULT_IMAGE");
/// The GPU node's name in the committed manifests, which `gpushare-bench manifests
/// --node` replaces (a valid node name, so that they validate as they are).
pub const NODE_PLACEHOLDER: &str = "replace-with-the-gpu-node";
/// The most passes a sweep with `--target` makes unless `--repeat` says.
pub const DEFAULT_TARGET_PASSES: u32 = 10;

/// A precision target, `1%` or `0.5%` (pure): the fraction, from 0.01% to 50%.
pub fn parse_target(s: &str) -> std::result::Result<f64, String> {
    let pct: f64 = s
        .trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| "give a share of the mean, e.g. 1%".to_string())?;
    if !(0.01..=50.0).contains(&pct) {
        return Err(format!("{pct}%: give 0.01% to 50%"));
    }
    Ok(pct / 100.0)
}

/// The most `--repeat` accepts.
pub const MAX_REPEAT: u32 = 100;

/// Where runs go unless `--out` says otherwise: a git-ignored directory, apart from the
/// project's committed reference runs under `results/`.
pub const DEFAULT_OUT: &str = "runs";

/// Checks a Kubernetes name: an RFC 1123 label (namespaces: at most 63 characters) or
/// subdomain (node names: at most 253, dots allowed), as the API server does
/// (k8s.io/apimachinery `IsDNS1123Label` / `IsDNS1123Subdomain`).
pub fn validate_k8s_name(flag: &str, value: &str, subdomain: bool) -> Result<()> {
    let max = if subdomain { 253 } else { 63 };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let ok = value.len() <= max
        && if subdomain {
            value.split('.').all(label_ok)
        } else {
            label_ok(value)
        };
    if ok {
        Ok(())
    } else {
        Err(BenchError::flag(
            flag,
            value,
            format!(
                "not a Kubernetes name: lower-case letters, digits and '-'{}, at most {max} characters",
                if subdomain { " (and '.' between parts)" } else { "" }
            ),
        ))
    }
}

/// Checks a container image reference: not empty, no whitespace or control characters.
pub fn validate_image(value: &str) -> Result<()> {
    if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) || value.len() > 1024 {
        return Err(BenchError::flag(
            "--image",
            value,
            "give an image reference, e.g. registry.example/gpushare-workload:0.1.0",
        ));
    }
    Ok(())
}

/// The precision a device computes in: the CPU only fp32, a GPU bf16 unless asked.
pub fn device_precision(cpu: bool, asked: Option<Precision>) -> Result<Precision> {
    match (cpu, asked) {
        (true, Some(p)) if p != Precision::Fp32 => {
            Err(BenchError::flag("--precision", p.name(), "the CPU computes fp32 only"))
        }
        (true, _) => Ok(Precision::Fp32),
        (false, Some(p)) => Ok(p),
        (false, None) => Ok(Precision::Bf16),
    }
}

/// The latency histogram of gpushare-workload, read unless `--metric` names another.
pub const DEFAULT_METRIC: &str = crate::metrics::LATENCY_METRIC;
/// Where gpushare-workload answers once it serves.
pub const DEFAULT_READY_PATH: &str = "/healthz";

/// Whether `name` is a Prometheus metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
pub fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `p` is a `--ready-path`: `none`, or an HTTP path without spaces.
pub fn is_ready_path(p: &str) -> bool {
    p == "none" || (p.starts_with('/') && !p.chars().any(|c| c.is_whitespace() || c.is_control()))
}

/// `--workload-cmd`, `--metric`, `--ready-path`, `--request` and `--body`, checked
/// together: what a user's own server can be measured with (both backends, its own
/// load or the harness's requests on the local one).
struct OwnWorkload {
    cmd: Option<String>,
    metric: Option<String>,
    ready_path: Option<String>,
    with_workload_args: bool,
    image_given: bool,
    /// `--server-image` (Kubernetes): the image's entrypoint is the server.
    server_image: Option<String>,
    request: Option<String>,
    body: Option<PathBuf>,
    /// `--stream`, `--served-model`, `--prompt-tokens`, `--output-tokens`.
    stream: StreamFlags,
}

/// The flags of streamed requests, as given.
struct StreamFlags {
    api: Option<crate::config::request::Api>,
    model: Option<String>,
    prompt_tokens: Option<crate::config::values::Lengths>,
    output_tokens: Option<crate::config::values::Lengths>,
    server_ttft_metric: Option<String>,
    server_itl_metric: Option<String>,
    lengths: Option<PathBuf>,
}

/// Why `name` cannot name a Prometheus histogram (None: it can): letters, digits, `_`
/// and `:`, not starting with a digit.
fn metric_name_problem(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    (!ok).then(|| "a Prometheus metric name: letters, digits, _ and :, e.g. vllm:time_to_first_token_seconds".into())
}

impl StreamFlags {
    /// The first flag given without `--stream`, for the error.
    fn stray(&self) -> Option<(&'static str, String)> {
        if let Some(m) = &self.model {
            return Some(("--served-model", m.clone()));
        }
        if let Some(p) = self.prompt_tokens {
            return Some(("--prompt-tokens", p.to_string()));
        }
        if let Some(m) = &self.server_ttft_metric {
            return Some(("--server-ttft-metric", m.clone()));
        }
        if let Some(l) = &self.lengths {
            return Some(("--lengths", l.display().to_string()));
        }
        if let Some(m) = &self.server_itl_metric {
            return Some(("--server-itl-metric", m.clone()));
        }
        self.output_tokens.map(|o| ("--output-tokens", o.to_string()))
    }

    /// The recorded plan of streamed requests (None: not streamed).
    fn plan(&self) -> Result<Option<crate::config::request::StreamPlan>> {
        let Some(api) = self.api else { return Ok(None) };
        let model = self.model.clone().unwrap_or_else(|| "default".to_string());
        if model.trim().is_empty() || model.chars().any(char::is_control) {
            return Err(BenchError::flag(
                "--served-model",
                &model,
                "give the name the server serves its model under (vLLM: --served-model-name)",
            ));
        }
        for (flag, name) in [
            ("--server-ttft-metric", &self.server_ttft_metric),
            ("--server-itl-metric", &self.server_itl_metric),
        ] {
            if let Some(name) = name
                && let Some(why) = metric_name_problem(name)
            {
                return Err(BenchError::flag(flag, name, why));
            }
        }
        let default = crate::config::values::Lengths { low: 128, high: 128 };
        let (lengths, lengths_file) = match &self.lengths {
            None => (Vec::new(), None),
            Some(path) => {
                let shown = path.display().to_string();
                if self.prompt_tokens.is_some() || self.output_tokens.is_some() {
                    return Err(BenchError::flag(
                        "--lengths",
                        &shown,
                        "gives each request's prompt and output lengths: drop --prompt-tokens and --output-tokens",
                    ));
                }
                let text = crate::files::read_text(path, crate::files::limits::INPUT)
                    .map_err(|e| BenchError::flag("--lengths", &shown, e.to_string()))?;
                let pairs = crate::config::values::parse_length_pairs(&text)
                    .map_err(|why| BenchError::flag("--lengths", &shown, why))?;
                (pairs, Some(shown))
            }
        };
        let range = |i: usize| {
            let (lo, hi) = lengths
                .iter()
                .fold((u32::MAX, 0), |(lo, hi), p: &[u32; 2]| (lo.min(p[i]), hi.max(p[i])));
            crate::config::values::Lengths { low: lo, high: hi }
        };
        let (prompt_tokens, output_tokens) = if lengths.is_empty() {
            (
                self.prompt_tokens.unwrap_or(default),
                self.output_tokens.unwrap_or(default),
            )
        } else {
            (range(0), range(1))
        };
        Ok(Some(crate::config::request::StreamPlan {
            api,
            model,
            prompt_tokens,
            output_tokens,
            lengths,
            lengths_file,
            server_ttft_metric: self.server_ttft_metric.clone(),
            server_itl_metric: self.server_itl_metric.clone(),
        }))
    }
}

/// What [`own_workload`] settles: the command, the metric, the readiness path and the
/// harness's requests.
type OwnSettled = (
    Option<String>,
    String,
    String,
    Option<crate::config::request::RequestPlan>,
);

impl SweepPlan {
    /// The plan of the config file (when given) with `flags` over it. A value the plan
    /// refuses that came from the file, not a flag, is named by the file and its line,
    /// as a file's type errors are.
    pub fn from_file_and_flags(file: Option<&ConfigFile>, flags: SweepOptions) -> Result<SweepPlan> {
        let Some(file) = file else {
            return SweepPlan::from_options(flags);
        };
        let merged = file.options.clone().overridden_by(flags.clone())?;
        SweepPlan::from_options(merged).map_err(|e| blame_file(e, file, &flags))
    }

    /// The sweep's arms in order: each strategy, time-slicing once per `--timeslice`
    /// interval (DRA), MPS once per `--mps-threads` and `--mps-memory` value.
    pub fn arms(&self) -> Vec<crate::domain::Arm> {
        crate::domain::arms(
            &self.strategies,
            self.dra().map_or(&[], |d| &d.timeslices),
            (&self.mps_threads, &self.mps_memory),
        )
    }

    /// Whether the pods run a server of the user's own (`--workload-cmd` or
    /// `--server-image`) instead of gpushare-workload.
    pub fn own_server(&self) -> bool {
        self.workload_cmd.is_some() || self.server_args().is_some()
    }

    /// Local or Kubernetes.
    pub fn backend_kind(&self) -> BackendKind {
        match self.backend {
            BackendPlan::Local(_) => BackendKind::Local,
            BackendPlan::Kubernetes(_) => BackendKind::Kubernetes,
        }
    }

    /// The local backend's settings (None on Kubernetes).
    pub fn local(&self) -> Option<&LocalPlan> {
        match &self.backend {
            BackendPlan::Local(l) => Some(l),
            BackendPlan::Kubernetes(_) => None,
        }
    }

    /// The Kubernetes backend's settings (None on the local backend).
    pub fn kubernetes(&self) -> Option<&KubernetesPlan> {
        match &self.backend {
            BackendPlan::Kubernetes(k) => Some(k),
            BackendPlan::Local(_) => None,
        }
    }

    /// The GPUs a local sweep spreads its cells over (`--gpus`; empty: one GPU, and on
    /// Kubernetes).
    pub fn gpus(&self) -> &[crate::telemetry::inventory::GpuSelector] {
        self.local().map_or(&[], |l| &l.gpus)
    }

    /// How the pods get their share: the device plugin's unless a Kubernetes plan says
    /// DRA.
    pub fn sharing_api(&self) -> crate::config::values::SharingApi {
        self.kubernetes()
            .map_or(crate::config::values::SharingApi::DevicePlugin, |k| k.sharing.api())
    }

    /// A DRA run's settings of its claims.
    pub fn dra(&self) -> Option<&DraSettings> {
        match &self.kubernetes()?.sharing {
            Sharing::Dra(d) => Some(d),
            Sharing::DevicePlugin => None,
        }
    }

    /// The entrypoint's arguments of a server's image run as it is (`--server-image`).
    pub fn server_args(&self) -> Option<&Vec<String>> {
        self.kubernetes()?.server_args.as_ref()
    }

    /// A Kubernetes plan's settings to change (tests build plans from flags, then set
    /// what no flag sets).
    #[cfg(test)]
    pub fn kubernetes_mut(&mut self) -> &mut KubernetesPlan {
        match &mut self.backend {
            BackendPlan::Kubernetes(k) => k,
            BackendPlan::Local(_) => panic!("a local plan"),
        }
    }

    /// A local plan's settings to change (tests).
    #[cfg(test)]
    pub fn local_mut(&mut self) -> &mut LocalPlan {
        match &mut self.backend {
            BackendPlan::Local(l) => l,
            BackendPlan::Kubernetes(_) => panic!("a Kubernetes plan"),
        }
    }
}

/// `--server-image`'s refusals: a Kubernetes server of the user's own that makes its own
/// requests (the harness's are the local backend's).
fn server_image(image: &str, beside: bool, request: Option<&str>, backend: BackendKind, load: Load) -> Result<()> {
    let refuse = |why: &str| Err(BenchError::flag("--server-image", image, why.to_string()));
    validate_image(image).map_err(|_| {
        BenchError::flag(
            "--server-image",
            image,
            "give an image reference, e.g. registry.example/yolos-pytorch:1",
        )
    })?;
    if backend != BackendKind::Kubernetes {
        return refuse(
            "the Kubernetes backend's: on the local backend give your server's command line with --workload-cmd",
        );
    }
    // clap refuses these pairs on the command line; a config file can still hold them.
    if beside {
        return refuse(
            "it names the image and runs its entrypoint: give either it or --image with --workload-cmd, not both",
        );
    }
    if let Some(url) = request {
        return Err(BenchError::flag(
            "--request",
            url,
            "the local backend's for now: on Kubernetes your server must make its own requests",
        ));
    }
    if load != Load::Closed {
        return refuse("a server that makes its own requests sets its own pace: on Kubernetes --load stays closed");
    }
    Ok(())
}

fn own_workload(
    o: OwnWorkload,
    backend: BackendKind,
    load: Load,
    prometheus: &PrometheusSetting,
) -> Result<OwnSettled> {
    let metric = o.metric.unwrap_or_else(|| DEFAULT_METRIC.to_string());
    if !is_metric_name(&metric) {
        return Err(BenchError::flag(
            "--metric",
            &metric,
            "not a Prometheus metric name (letters, digits, '_' and ':', not starting with a digit)",
        ));
    }
    if backend == BackendKind::Kubernetes
        && o.cmd.is_none()
        && o.server_image.is_none()
        && o.ready_path.as_deref().is_some_and(|p| p != DEFAULT_READY_PATH)
    {
        return Err(BenchError::flag(
            "--ready-path",
            o.ready_path.as_deref().unwrap_or_default(),
            "gpushare-workload answers /healthz; another path is for a server of your own (--server-image, or --workload-cmd with --image)",
        ));
    }
    if backend == BackendKind::Kubernetes && o.ready_path.as_deref() == Some("none") {
        return Err(BenchError::flag(
            "--ready-path",
            "none",
            "on Kubernetes the kubelet's readiness probe decides when a pod serves: give your server's path",
        ));
    }
    let ready_path = o.ready_path.unwrap_or_else(|| DEFAULT_READY_PATH.to_string());
    if !is_ready_path(&ready_path) {
        return Err(BenchError::flag(
            "--ready-path",
            &ready_path,
            "an HTTP path such as /healthz (or none: ready at the histogram's first observation)",
        ));
    }
    if let (Some(body), None) = (&o.body, &o.request) {
        return Err(BenchError::flag(
            "--body",
            &body.display().to_string(),
            "the body of --request: give the URL to send it to",
        ));
    }
    if o.stream.api.is_none()
        && let Some((flag, value)) = o.stream.stray()
    {
        return Err(BenchError::flag(
            flag,
            &value,
            "a setting of streamed requests: add --stream completions (or chat) with --request",
        ));
    }
    if let (Some(api), None) = (o.stream.api, &o.request) {
        return Err(BenchError::flag(
            "--stream",
            &api.to_string(),
            "streams the answers of --request: give the endpoint's URL, e.g. --request http://127.0.0.1:{port}/v1/completions",
        ));
    }
    if let (Some(body), Some(_)) = (&o.body, o.stream.api) {
        return Err(BenchError::flag(
            "--body",
            &body.display().to_string(),
            "with --stream the harness writes each request (--prompt-tokens, --output-tokens): drop --body",
        ));
    }
    if let Some(image) = &o.server_image {
        let beside = o.cmd.is_some() || o.image_given;
        server_image(image, beside, o.request.as_deref(), backend, load)?;
        return Ok((None, metric, ready_path, None));
    }
    let Some(cmd) = o.cmd else {
        if let Some(url) = &o.request {
            return Err(BenchError::flag(
                "--request",
                url,
                "for a server of your own (--workload-cmd); gpushare-workload makes its own requests",
            ));
        }
        if metric != DEFAULT_METRIC {
            return Err(BenchError::flag(
                "--metric",
                &metric,
                "gpushare-workload exports inference_time_seconds; another histogram is a server of your own's (--workload-cmd)",
            ));
        }
        return Ok((None, metric, ready_path, None));
    };
    let refuse = |why: &str| Err(BenchError::flag("--workload-cmd", &cmd, why.to_string()));
    if cmd.trim().is_empty() || !cmd.contains("{port}") {
        return refuse("put {port} where the server's metrics port goes, e.g. 'python3 serve.py --port {port}'");
    }
    if backend == BackendKind::Kubernetes && !o.image_given {
        return refuse(
            "on Kubernetes it runs in your server's image: give it with --image (the command runs there under /bin/sh -c, {port} the metrics port 9400)",
        );
    }
    if backend == BackendKind::Kubernetes && o.request.is_some() {
        return Err(BenchError::flag(
            "--request",
            o.request.as_deref().unwrap_or_default(),
            "the local backend's for now: on Kubernetes your server must make its own requests",
        ));
    }
    if load != Load::Closed && o.request.is_none() {
        return refuse(
            "a server that makes its own requests sets its own pace: give --request for the harness to send them as --load says",
        );
    }
    if o.with_workload_args {
        return refuse("--workload-arg is for gpushare-workload; put your server's arguments in the command");
    }
    let request = match &o.request {
        None => None,
        Some(url) => {
            if *prometheus != PrometheusSetting::Off {
                return Err(BenchError::flag(
                    "--prometheus",
                    &prometheus.to_string(),
                    "with --request the harness times the requests itself: Prometheus has none of its numbers",
                ));
            }
            if ready_path == "none" {
                return Err(BenchError::flag(
                    "--ready-path",
                    "none",
                    "a server that waits for --request has no first observation to wait for: give its readiness path",
                ));
            }
            if metric != DEFAULT_METRIC {
                return Err(BenchError::flag(
                    "--metric",
                    &metric,
                    "with --request the harness times the requests itself and reads no histogram of the server's",
                ));
            }
            let mut plan = crate::config::request::RequestPlan::new(url, o.body.as_deref())
                .map_err(|(flag, value, reason)| BenchError::flag(flag, &value, reason))?;
            plan.stream = o.stream.plan()?;
            Some(plan)
        }
    };
    Ok((Some(cmd), metric, ready_path, request))
}

impl SweepPlan {
    /// Validates options into a plan.
    pub fn from_options(o: SweepOptions) -> Result<Self> {
        let backend = o.backend.unwrap_or(BackendKind::Local);
        // Checked last, so that a flag with a message of its own keeps it.
        let kubernetes_flag = (backend == BackendKind::Local).then(|| kubernetes_flag(&o)).flatten();
        let (strategies, pods) = strategies_and_pods(&o)?;
        let device = o.device.unwrap_or(DeviceChoice::Auto);
        if device == DeviceChoice::Cpu {
            device_precision(true, o.precision)?;
            if let Some(g) = &o.gpu {
                return Err(BenchError::flag(
                    "--gpu",
                    &g.to_string(),
                    "a GPU for a --device cpu run: drop one of them",
                ));
            }
        }
        let batch = o.batch.unwrap_or(1);
        if !(1..=4096).contains(&batch) {
            return Err(BenchError::flag("--batch", &batch.to_string(), "expected 1 to 4096"));
        }
        let target = match &o.target {
            Some(t) => Some(parse_target(t).map_err(|why| BenchError::flag("--target", t, why))?),
            None => None,
        };
        if let (Some(b), None) = (&o.budget, target) {
            return Err(BenchError::flag(
                "--budget",
                &b.text,
                "bounds a sweep with a precision target: give --target too, e.g. --target 1%",
            ));
        }
        let repeat = o
            .repeat
            .unwrap_or(if target.is_some() { DEFAULT_TARGET_PASSES } else { 1 });
        if target.is_some() && repeat < 2 {
            return Err(BenchError::flag(
                "--repeat",
                &repeat.to_string(),
                "with --target, the most passes: an interval needs at least 2",
            ));
        }
        if !(1..=MAX_REPEAT).contains(&repeat) {
            return Err(BenchError::flag(
                "--repeat",
                &repeat.to_string(),
                format!("expected 1 to {}", MAX_REPEAT),
            ));
        }
        let load = o.load.unwrap_or_default();
        // One load per pod: the workload refuses a second --load.
        if load != Load::Closed
            && let Some(arg) = o
                .workload_args
                .iter()
                .find(|a| a.starts_with("--load") && !a.starts_with("--load-seed"))
        {
            return Err(BenchError::flag(
                "--load",
                &load.to_string(),
                format!("--workload-arg={arg} sets the load too; give it with --load only"),
            ));
        }
        let slos = slos(&o)?;
        let measure = measure(&o)?;
        load_fits_window(load, &pods, &o)?;
        let prometheus = o.prometheus.clone().unwrap_or(PrometheusSetting::Off);
        let gpus = local_gpus(&o, backend, device, &prometheus)?;
        if let Some(id) = &o.run_id {
            validate_run_id(id)?;
        }
        kubernetes_names(&o)?;
        let sharing = sharing(o.sharing_api, o.timeslice.clone(), backend)?;
        let (mps_threads, mps_memory) = mps_limits(&o, &strategies, backend, &sharing)?;
        if let Sharing::Dra(dra) = &sharing
            && !dra.timeslices.is_empty()
            && !strategies.contains(&Strategy::TimeSlicing)
        {
            return Err(BenchError::flag(
                "--timeslice",
                &crate::config::values::List(dra.timeslices.clone()).to_string(),
                "sets time-slicing's interval: add time-slicing to --strategies",
            ));
        }
        if let Some(p) = o.base_port.filter(|p| !(1024..=65535 - 64).contains(p)) {
            return Err(BenchError::flag(
                "--base-port",
                &p.to_string(),
                "use a port from 1024 to 65471",
            ));
        }
        let own = OwnWorkload {
            cmd: o.workload_cmd.clone(),
            metric: o.metric.clone(),
            ready_path: o.ready_path.clone(),
            with_workload_args: !o.workload_args.is_empty(),
            image_given: o.image.is_some(),
            server_image: o.server_image.clone(),
            request: o.request.clone(),
            body: o.body.clone(),
            stream: StreamFlags {
                api: o.stream,
                model: o.served_model.clone(),
                prompt_tokens: o.prompt_tokens,
                output_tokens: o.output_tokens,
                server_ttft_metric: o.server_ttft_metric.clone(),
                server_itl_metric: o.server_itl_metric.clone(),
                lengths: o.lengths.clone(),
            },
        };
        let (workload_cmd, metric, ready_path, request) = own_workload(own, backend, load, &prometheus)?;
        if let Some((flag, value)) = kubernetes_flag {
            return Err(BenchError::flag(
                flag,
                &value,
                "a setting of the Kubernetes backend: give --backend kubernetes --node NODE, or drop it",
            ));
        }
        // The --workload-arg values are the entrypoint's with --server-image, not
        // gpushare-workload's (an isolation run's aggressors keep theirs).
        let (workload_args, server_args) = match o.server_image {
            Some(_) => (Vec::new(), Some(o.workload_args.clone())),
            None => (o.workload_args.clone(), None),
        };
        let backend = match backend {
            BackendKind::Local => BackendPlan::Local(LocalPlan {
                base_port: o.base_port,
                gpu: o.gpu.clone(),
                gpus,
                allow_busy_gpu: o.allow_busy_gpu,
            }),
            BackendKind::Kubernetes => BackendPlan::Kubernetes(Box::new(kubernetes_plan(&o, server_args, sharing))),
        };
        Ok(SweepPlan {
            backend,
            strategies,
            pods,
            model: o.model,
            precision: o.precision,
            device,
            batch,
            repeat,
            target,
            budget: o.budget.as_ref().map(|b| b.duration),
            load,
            slos,
            mps_threads,
            mps_memory,
            measure,
            out: o.out.unwrap_or_else(|| PathBuf::from(DEFAULT_OUT)),
            run_id: o.run_id,
            prometheus,
            workload_bin: o.workload_bin,
            workload_args,
            workload_cmd,
            metric,
            ready_path,
            request,
            kind: RunKind::Sweep,
        })
    }
}

/// `--strategies` and `--pods`, each at least one (defaults: every strategy; 1, 3, 5, 7).
fn strategies_and_pods(o: &SweepOptions) -> Result<(Vec<Strategy>, Vec<u32>)> {
    let strategies: Vec<Strategy> = match &o.strategies {
        Some(l) => l.0.iter().map(|s| s.0).collect(),
        None => Strategy::ALL.to_vec(),
    };
    if strategies.is_empty() {
        return Err(BenchError::flag("--strategies", "", "name at least one strategy"));
    }
    let pods: Vec<u32> = match &o.pods {
        Some(l) => l.0.iter().map(|p| p.0).collect(),
        None => DEFAULT_PODS.to_vec(),
    };
    if pods.is_empty() {
        return Err(BenchError::flag("--pods", "", "name at least one pod count"));
    }
    Ok((strategies, pods))
}

/// `--slo`: a percentile each, one threshold per percentile of the latency, one
/// objective per token metric, and those only on streamed answers (`--stream`).
fn slos(o: &SweepOptions) -> Result<Vec<Slo>> {
    use crate::config::values::SloMetric;
    let slos: Vec<Slo> = o.slo.iter().flat_map(|l| l.0.iter().copied()).collect();
    for (i, s) in slos.iter().enumerate() {
        let text = s.to_string();
        if s.quantile.is_none() {
            return Err(BenchError::flag(
                "--slo",
                &text,
                "name the percentile, e.g. p99=25ms (p50, p90 or p99)",
            ));
        }
        if s.metric.is_token() {
            if o.stream.is_none() {
                return Err(BenchError::flag(
                    "--slo",
                    &text,
                    "an objective on tokens needs streamed answers: --request URL --stream completions (or chat)",
                ));
            }
            if slos[..i].iter().any(|o| o.metric == s.metric) {
                return Err(BenchError::flag(
                    "--slo",
                    &text,
                    format!("one objective on {} (its attainment is one column)", s.metric.prefix()),
                ));
            }
            if s.metric != SloMetric::Ttft && o.output_tokens.is_some_and(|l| l.high < 2) {
                return Err(BenchError::flag(
                    "--slo",
                    &text,
                    "answers of one token have no gap between tokens: give --output-tokens of 2 or more",
                ));
            }
        }
        if slos[..i]
            .iter()
            .any(|o| o.metric == s.metric && o.quantile == s.quantile)
        {
            return Err(BenchError::flag("--slo", &text, "one threshold per percentile"));
        }
    }
    Ok(slos)
}

/// The window: `--window`, else 2 s with a precision target and 5 s without.
fn window_of(o: &SweepOptions) -> Duration {
    match (&o.window, &o.target) {
        (Some(s), _) => s.duration,
        (None, Some(_)) => TARGET_WINDOW,
        (None, None) => DEFAULT_WINDOW,
    }
}

/// `--window` as given (or its default), for messages.
fn window_text(o: &SweepOptions) -> String {
    o.window
        .as_ref()
        .map_or_else(|| format!("{}s", window_of(o).as_secs()), |s| s.text.clone())
}

/// `--warmup`, `--fixed-warmup`, `--window`, `--max-cell` and `--ready-timeout`,
/// checked together.
fn measure(o: &SweepOptions) -> Result<MeasureSettings> {
    let window = window_of(o);
    if window < MIN_WINDOW {
        return Err(BenchError::flag(
            "--window",
            &window_text(o),
            "windows shorter than 500ms measure scrape jitter",
        ));
    }
    let max_cell = o.max_cell.as_ref().map_or(DEFAULT_MAX_CELL, |s| s.duration);
    let stable_windows = 3;
    if max_cell < window * stable_windows as u32 {
        return Err(BenchError::flag(
            "--max-cell",
            &o.max_cell.as_ref().map_or("30s".to_string(), |s| s.text.clone()),
            format!("shorter than {stable_windows} windows of {}", window_text(o)),
        ));
    }
    Ok(MeasureSettings {
        ready_timeout: o.ready_timeout.as_ref().map_or(DEFAULT_READY_TIMEOUT, |s| s.duration),
        warmup: o.warmup.as_ref().map_or(DEFAULT_WARMUP, |s| s.duration),
        steady_warmup: !o.fixed_warmup,
        window,
        max_cell,
        stable_windows,
        tolerance: 0.05,
    })
}

/// An open-loop rate must expect a request in every pod's window: below that a window
/// measures nothing, and a capacity search would call every count a miss.
fn load_fits_window(load: Load, pods: &[u32], o: &SweepOptions) -> Result<()> {
    let window = window_of(o).as_secs_f64();
    let lowest_per_pod = match load {
        Load::Closed => return Ok(()),
        Load::PerPod(r) => r,
        Load::Total(r) => r / f64::from(pods.iter().copied().max().unwrap_or(1)),
    };
    // (A rate that gives exactly one, such as total:1.4 over 7 pods in 5 s, passes
    // despite rounding.)
    if lowest_per_pod * window >= 1.0 - 1e-9 {
        return Ok(());
    }
    Err(BenchError::flag(
        "--load",
        &load.to_string(),
        format!(
            "{} requests per pod in a window of {}: give a rate that expects at least one (≥ {}/s per pod), or a longer --window",
            shown_rate(lowest_per_pod * window),
            window_text(o),
            shown_rate(1.0 / window)
        ),
    ))
}

/// `--gpu`, `--gpus` and `--allow-busy-gpu`: the local backend's, checked against the
/// rest of the plan; the GPUs of `--gpus` (empty without it).
fn local_gpus(
    o: &SweepOptions,
    backend: BackendKind,
    device: DeviceChoice,
    prometheus: &PrometheusSetting,
) -> Result<Vec<crate::telemetry::inventory::GpuSelector>> {
    if backend == BackendKind::Kubernetes && prometheus == &PrometheusSetting::Spawn {
        return Err(BenchError::flag(
            "--prometheus",
            "spawn",
            "spawn is for the local backend; on Kubernetes give the cluster's Prometheus URL (or leave it off to port-forward)",
        ));
    }
    if backend == BackendKind::Kubernetes
        && let Some(g) = &o.gpu
    {
        return Err(BenchError::flag(
            "--gpu",
            &g.to_string(),
            "picks a GPU of this machine for the local backend; on Kubernetes the node (--node) and its device plugin or DRA driver give the pods their GPU",
        ));
    }
    let gpus = lanes_gpus(o.gpus.as_ref(), o.gpu.as_ref(), backend, device, prometheus)?;
    if let (Some(api), Some(g)) = (o.stream, o.gpus.as_ref()) {
        return Err(BenchError::flag(
            "--gpus",
            &g.to_string(),
            format!("a sweep over several GPUs does not stream answers yet (--stream {api}): give one --gpu"),
        ));
    }
    if backend == BackendKind::Kubernetes && o.allow_busy_gpu {
        return Err(BenchError::flag(
            "--allow-busy-gpu",
            "",
            "is for the local backend, which checks the GPU's processes itself",
        ));
    }
    if backend == BackendKind::Kubernetes && o.node.is_none() {
        return Err(BenchError::flag(
            "--node",
            "",
            "the Kubernetes backend needs the GPU node's name",
        ));
    }
    Ok(gpus)
}

/// The Kubernetes names and values among the flags, as the API server checks them.
fn kubernetes_names(o: &SweepOptions) -> Result<()> {
    if let Some(n) = &o.node {
        validate_k8s_name("--node", n, true)?;
    }
    if let Some(ns) = &o.namespace {
        validate_k8s_name("--namespace", ns, false)?;
    }
    if let Some(ns) = &o.prometheus_namespace {
        validate_k8s_name("--prometheus-namespace", ns, false)?;
    }
    if let Some(image) = &o.image {
        validate_image(image)?;
    }
    for t in &o.tolerations {
        crate::config::values::toleration(t).map_err(|reason| BenchError::flag("--toleration", t, reason))?;
    }
    for s in &o.image_pull_secrets {
        validate_k8s_name("--image-pull-secret", s, true)?;
    }
    if let Some(ns) = &o.operator_namespace {
        validate_k8s_name("--operator-namespace", ns, false)?;
    }
    if let Some(layout) = &o.mig_layout {
        // A label value (k8s.io/apimachinery `IsValidLabelValue`).
        let ok = layout.len() <= 63
            && layout
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && layout.starts_with(|c: char| c.is_ascii_alphanumeric())
            && layout.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !ok {
            return Err(BenchError::flag(
                "--mig-layout",
                layout,
                "not a label value (letters, digits, '-', '_', '.'; e.g. all-1g.10gb)",
            ));
        }
    }
    Ok(())
}

/// A Kubernetes plan from checked flags, with the defaults of the manifests.
fn kubernetes_plan(o: &SweepOptions, server_args: Option<Vec<String>>, sharing: Sharing) -> KubernetesPlan {
    KubernetesPlan {
        node: o.node.clone().unwrap_or_default(),
        namespace: o.namespace.clone().unwrap_or_else(|| "gpushare-bench".into()),
        image: o
            .server_image
            .clone()
            .or_else(|| o.image.clone())
            .unwrap_or_else(|| DEFAULT_IMAGE.into()),
        server_args,
        mig_layout: o.mig_layout.clone(),
        tolerations: if o.tolerations.is_empty() {
            vec![crate::config::values::DEFAULT_TOLERATION.to_string()]
        } else {
            o.tolerations.clone()
        },
        image_pull_secrets: o.image_pull_secrets.clone(),
        operator_namespace: o.operator_namespace.clone().unwrap_or_else(|| "gpu-operator".into()),
        prometheus_pod: (
            o.prometheus_namespace.clone().unwrap_or_else(|| "monitoring".into()),
            o.prometheus_selector
                .clone()
                .unwrap_or_else(|| "app.kubernetes.io/name=prometheus".into()),
        ),
        sharing,
    }
}

/// `--sharing-api` and the DRA settings, checked together: DRA is Kubernetes', and its
/// settings are DRA's.
fn sharing(
    api: Option<crate::config::values::SharingApi>,
    timeslices: Option<crate::config::values::List<crate::config::values::TimeSlice>>,
    backend: BackendKind,
) -> Result<Sharing> {
    use crate::config::values::SharingApi;
    let api = api.unwrap_or_default();
    if api == SharingApi::Dra && backend != BackendKind::Kubernetes {
        return Err(BenchError::flag(
            "--sharing-api",
            "dra",
            "ResourceClaims are Kubernetes': give --backend kubernetes --node NODE",
        ));
    }
    let dra_only = [("--timeslice", timeslices.as_ref().map(ToString::to_string))];
    if api != SharingApi::Dra
        && let Some((flag, Some(value))) = dra_only.into_iter().find(|(_, v)| v.is_some())
    {
        return Err(BenchError::flag(
            flag,
            &value,
            "a setting of the DRA driver's GpuConfig: give --sharing-api dra (the device plugin's sharing has no such setting per pod)",
        ));
    }
    Ok(match api {
        SharingApi::DevicePlugin => Sharing::DevicePlugin,
        SharingApi::Dra => Sharing::Dra(DraSettings {
            former_mps_thread_percentage: None,
            former_mps_memory_limit: None,
            timeslices: timeslices
                .map(|l| l.0.into_iter().map(|t| t.0).collect())
                .unwrap_or_default(),
        }),
    })
}

/// `--mps-threads` and `--mps-memory`, checked against the plan: MPS must be swept, and
/// the device plugin's MPS sharing has no per-client setting (its config names only a
/// node's replicas, which split the SMs and memory equally).
fn mps_limits(
    o: &SweepOptions,
    strategies: &[Strategy],
    backend: BackendKind,
    sharing: &Sharing,
) -> Result<(Vec<crate::domain::MpsThreads>, Vec<crate::domain::MpsMemory>)> {
    use crate::domain::{MpsMemory, MpsThreads};
    let threads: Vec<MpsThreads> = o.mps_threads.clone().map(|l| l.0).unwrap_or_default();
    let memory: Vec<MpsMemory> = o.mps_memory.clone().map(|l| l.0).unwrap_or_default();
    let given = [
        ("--mps-threads", &o.mps_threads.as_ref().map(ToString::to_string)),
        ("--mps-memory", &o.mps_memory.as_ref().map(ToString::to_string)),
    ];
    for (flag, value) in given {
        let Some(value) = value else { continue };
        if !strategies.contains(&Strategy::Mps) {
            return Err(BenchError::flag(
                flag,
                value,
                "sets MPS's client limits: add mps to --strategies",
            ));
        }
    }
    let not_auto = threads.iter().any(|t| *t != MpsThreads::Auto) || memory.iter().any(|m| *m != MpsMemory::Auto);
    if backend == BackendKind::Kubernetes
        && matches!(sharing, Sharing::DevicePlugin)
        && not_auto
        && let Some((flag, Some(value))) = given.into_iter().find(|(_, v)| v.is_some())
    {
        return Err(BenchError::flag(
            flag,
            value,
            "the device plugin's MPS sharing splits the GPU equally among a node's replicas and has no per-client setting (only auto): give --sharing-api dra, whose claims set each client's limits",
        ));
    }
    Ok((threads, memory))
}

/// The first of the Kubernetes backend's flags given, which the local backend refuses:
/// nothing there would read it.
fn kubernetes_flag(o: &SweepOptions) -> Option<(&'static str, String)> {
    let given = [
        ("--node", o.node.clone()),
        ("--namespace", o.namespace.clone()),
        ("--image", o.image.clone()),
        ("--mig-layout", o.mig_layout.clone()),
        ("--toleration", o.tolerations.first().cloned()),
        ("--image-pull-secret", o.image_pull_secrets.first().cloned()),
        ("--operator-namespace", o.operator_namespace.clone()),
        ("--prometheus-namespace", o.prometheus_namespace.clone()),
        ("--prometheus-selector", o.prometheus_selector.clone()),
    ];
    given.into_iter().find_map(|(flag, v)| Some((flag, v?)))
}

/// A rate for a message: three significant digits, no exponent above 0.001.
fn shown_rate(r: f64) -> String {
    if r >= 0.001 {
        format!("{}", (r * 1000.0).round() / 1000.0)
    } else {
        format!("{r:.1e}")
    }
}

/// Checks a run id: letters, digits, `.`, `_`, `-` (it becomes a directory name).
pub fn validate_run_id(id: &str) -> Result<()> {
    if id.len() > 100 {
        return Err(BenchError::flag(
            "--run-id",
            id,
            format!("{} characters: at most 100 (it names a directory)", id.chars().count()),
        ));
    }
    // It starts with a letter or digit: a leading '-' reads as a flag, and a leading
    // '-' or '+' as a formula where a spreadsheet opens the CSV (its first cell).
    let ok = id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(BenchError::flag(
            "--run-id",
            id,
            "use letters, digits, '.', '_' and '-', starting with a letter or digit (it names a directory and a spreadsheet's first cell)",
        ))
    }
}

/// A flag's error as the config file's, with its line, when the value came from the file
/// at `path` (the flags did not set it).
fn blame_file(e: BenchError, file: &ConfigFile, flags: &SweepOptions) -> BenchError {
    let BenchError::Flag { flag, value, reason } = e else {
        return e;
    };
    let key = flag.trim_start_matches("--").replace('-', "_");
    let given = serde_json::to_value(flags).is_ok_and(|v| v.get(&key).is_some_and(|v| !v.is_null()));
    let line = file.text.lines().enumerate().find_map(|(i, l)| {
        let (k, _) = l.split_once('=')?;
        (k.trim() == key).then(|| (i + 1, l.trim().to_string()))
    });
    match line {
        Some((n, shown)) if !given => BenchError::Config {
            path: file.path.clone(),
            reason: format!("line {n} (`{shown}`): {key} `{value}`: {reason}"),
        },
        _ => BenchError::Flag { flag, value, reason },
    }
}

/// A run id from the time and the device: `20261122T141500Z-h100`.
pub fn default_run_id(now_rfc3339: &str, device: &str) -> String {
    let stamp: String = now_rfc3339.chars().filter(|c| *c != '-' && *c != ':').collect();
    format!("{stamp}-{device}")
}

/// Refuses `--gpus` for a command that measures one GPU (`capacity`, `isolation`).
pub fn one_gpu_only(plan: &SweepPlan, command: &str) -> Result<()> {
    if plan.gpus().is_empty() {
        return Ok(());
    }
    let given: Vec<String> = plan.gpus().iter().map(ToString::to_string).collect();
    Err(BenchError::flag(
        "--gpus",
        &given.join(","),
        format!("spreads a sweep's cells over several GPUs; {command} measures one GPU: pick it with --gpu"),
    ))
}

/// The GPUs of `--gpus` (empty without it), checked against the rest of the plan: at
/// least two, on this machine (the local backend) with a GPU, and read by the direct
/// scrape (a Prometheus, private or not, serves one cell's targets at a time).
fn lanes_gpus(
    gpus: Option<&crate::config::values::List<crate::telemetry::inventory::GpuSelector>>,
    gpu: Option<&crate::telemetry::inventory::GpuSelector>,
    backend: BackendKind,
    device: DeviceChoice,
    prometheus: &PrometheusSetting,
) -> Result<Vec<crate::telemetry::inventory::GpuSelector>> {
    let Some(list) = gpus else { return Ok(Vec::new()) };
    let given = list.to_string();
    let refuse = |reason: &str| Err(BenchError::flag("--gpus", &given, reason));
    if list.0.len() < 2 {
        return refuse("name at least two GPUs, e.g. 0,1 (one GPU is --gpu)");
    }
    if gpu.is_some() {
        return refuse("--gpu names one GPU and --gpus several: give one of them");
    }
    if backend == BackendKind::Kubernetes {
        return refuse(
            "spreads cells over this machine's GPUs (the local backend); on Kubernetes the node's device plugin or DRA driver places pods",
        );
    }
    if device == DeviceChoice::Cpu {
        return refuse("GPUs for a --device cpu run: drop one of them");
    }
    if *prometheus != PrometheusSetting::Off {
        return refuse(&format!(
            "reads every pod's /metrics directly; a Prometheus (--prometheus {prometheus}) serves one cell at a time: leave --prometheus off"
        ));
    }
    Ok(list.0.clone())
}

/// The recorded part of a capacity run's plan (`run.json` `capacity`): the counts it
/// may search. The load and the SLOs are the plan's own (`plan.load`, `plan.slos`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacityPlan {
    /// The largest pod count searched (`--max-pods`).
    pub max_pods: u32,
}

impl CapacityPlan {
    /// Checks a plan read back from run.json or built from flags.
    pub fn validate(&self) -> Result<(), String> {
        use crate::config::values::MAX_PODS;
        if (1..=MAX_PODS).contains(&self.max_pods) {
            Ok(())
        } else {
            Err(format!("max_pods {} is not between 1 and {MAX_PODS}", self.max_pods))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> SweepOptions {
        SweepOptions::default()
    }

    fn bad(o: SweepOptions) -> String {
        SweepPlan::from_options(o)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_cell_measures_between_its_agreeing_windows_and_its_cap() {
        let s = |secs| Duration::from_secs(secs);
        let mut m = MeasureSettings {
            ready_timeout: s(60),
            warmup: s(10),
            steady_warmup: false,
            window: s(5),
            max_cell: s(30),
            stable_windows: 3,
            tolerance: 0.05,
        };
        assert_eq!(m.cell_time(), (s(25), s(40)));
        // A cap shorter than the windows that must agree never makes the most the least.
        m.max_cell = s(5);
        assert_eq!(m.cell_time(), (s(25), s(25)));
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
    fn flags_override_the_file_and_bad_combinations_are_named() {
        let file: SweepOptions = toml::from_str(
            "pods = [1, 2]\nstrategies = \"mps,mig\"\nwarmup = \"3s\"\nrun_id = \"from-file\"\nworkload_args = [\"--x\"]\n",
        )
        .expect("toml");
        let flags = SweepOptions {
            pods: Some("4".parse().expect("pods")),
            ..opts()
        };
        let p = SweepPlan::from_options(file.overridden_by(flags).expect("merge")).expect("valid");
        assert_eq!(p.pods, vec![4]);
        assert_eq!(p.strategies, vec![Strategy::Mps, Strategy::Mig]);
        assert_eq!(p.measure.warmup, Duration::from_secs(3));
        assert_eq!(p.run_id.as_deref(), Some("from-file"), "run_id works in the file too");
        assert_eq!(
            p.workload_args,
            vec!["--x".to_string()],
            "an empty flag list keeps the file's"
        );
        assert!(
            bad(SweepOptions {
                max_cell: Some("10s".parse().expect("span")),
                ..opts()
            })
            .contains("shorter than 3 windows")
        );
        assert!(
            bad(SweepOptions {
                device: Some(DeviceChoice::Cpu),
                precision: Some(Precision::Bf16),
                ..opts()
            })
            .contains("fp32 only")
        );
        assert!(
            bad(SweepOptions {
                backend: Some(BackendKind::Kubernetes),
                ..opts()
            })
            .contains("--node")
        );
        assert!(
            bad(SweepOptions {
                run_id: Some("../x".into()),
                ..opts()
            })
            .starts_with("bad --run-id")
        );
    }

    #[test]
    fn a_servers_image_takes_the_workload_args_as_its_entrypoints() {
        let k8s = || SweepOptions {
            backend: Some(BackendKind::Kubernetes),
            node: Some("gpu-1".into()),
            server_image: Some("me/server:1".into()),
            workload_args: vec!["--port={port}".into(), "--x".into()],
            ready_path: Some("/ready".into()),
            ..opts()
        };
        let p = SweepPlan::from_options(k8s()).expect("plan");
        assert_eq!(p.kubernetes().map(|k| k.image.as_str()), Some("me/server:1"));
        assert_eq!(
            p.server_args(),
            Some(&vec!["--port={port}".to_string(), "--x".to_string()])
        );
        assert!(
            p.workload_args.is_empty(),
            "not gpushare-workload's: {:?}",
            p.workload_args
        );
        assert!(p.own_server() && p.workload_cmd.is_none());
        let record = crate::results::record::PlanRecord::from_plan(
            &p,
            crate::domain::DeviceKind::Cuda,
            crate::domain::Source::Prometheus,
        );
        assert_eq!(record.model, "custom");
        assert_eq!(record.server_args.as_ref(), p.server_args());
        for (o, says) in [
            (
                SweepOptions {
                    backend: Some(BackendKind::Local),
                    ..k8s()
                },
                "bad --server-image `me/server:1`: the Kubernetes backend's",
            ),
            (
                SweepOptions {
                    image: Some("me/other:1".into()),
                    ..k8s()
                },
                "give either it or --image with --workload-cmd, not both",
            ),
            (
                SweepOptions {
                    workload_cmd: Some("serve {port}".into()),
                    ..k8s()
                },
                "give either it or --image with --workload-cmd, not both",
            ),
            (
                SweepOptions {
                    load: Some("poisson:10".parse().expect("load")),
                    ..k8s()
                },
                "on Kubernetes --load stays closed",
            ),
            (
                SweepOptions {
                    request: Some("http://127.0.0.1:{port}/i".into()),
                    ..k8s()
                },
                "bad --request `http://127.0.0.1:{port}/i`: the local backend's for now",
            ),
            (
                SweepOptions {
                    server_image: Some("me/server 1".into()),
                    ..k8s()
                },
                "bad --server-image `me/server 1`: give an image reference",
            ),
        ] {
            let e = bad(o);
            assert!(e.contains(says), "{says:?} not in {e:?}");
        }
    }

    #[test]
    fn a_rate_a_window_cannot_sample_is_refused() {
        let load = |l: &str, pods: &str| SweepOptions {
            load: Some(l.parse().expect("load")),
            pods: Some(pods.parse().expect("pods")),
            ..opts()
        };
        for (o, says) in [
            (
                load("poisson:0.001", "1"),
                "bad --load `poisson:0.001`: 0.005 requests per pod in a window of 5s",
            ),
            (
                load("poisson:1e-300", "1"),
                "bad --load `poisson:1e-300`: 5.0e-300 requests per pod",
            ),
            (load("total:1", "1,7"), "bad --load `total:1`: 0.714 requests per pod"),
        ] {
            let e = bad(o);
            assert!(e.contains(says), "{says:?} not in {e:?}");
        }
        assert!(SweepPlan::from_options(load("poisson:0.2", "1,7")).is_ok());
        assert!(SweepPlan::from_options(load("total:1.4", "1,7")).is_ok());
    }

    #[test]
    fn the_local_backend_refuses_the_kubernetes_backends_flags() {
        for (o, says) in [
            (
                SweepOptions {
                    node: Some("gpu-1".into()),
                    ..opts()
                },
                "bad --node `gpu-1`: a setting of the Kubernetes backend",
            ),
            (
                SweepOptions {
                    tolerations: vec!["gpu:NoSchedule".into()],
                    ..opts()
                },
                "bad --toleration `gpu:NoSchedule`: a setting of the Kubernetes backend",
            ),
            (
                SweepOptions {
                    image: Some("me/w:1".into()),
                    ..opts()
                },
                "bad --image `me/w:1`: a setting of the Kubernetes backend",
            ),
        ] {
            let e = bad(o);
            assert!(e.contains(says), "{says:?} not in {e:?}");
        }
        let p = SweepPlan::from_options(opts()).expect("plan");
        assert_eq!((p.backend_kind(), p.kubernetes()), (BackendKind::Local, None));
    }

    #[test]
    fn dra_is_kubernetes_and_its_settings_need_it() {
        use crate::config::values::SharingApi;
        use crate::domain::TimeSliceInterval;
        let k8s = || SweepOptions {
            backend: Some(BackendKind::Kubernetes),
            node: Some("gpu-1".into()),
            ..opts()
        };
        let p = SweepPlan::from_options(SweepOptions {
            sharing_api: Some(SharingApi::Dra),
            timeslice: Some("long,short".parse().expect("intervals")),
            mps_threads: Some("auto,25".parse().expect("threads")),
            mps_memory: Some("20Gi".parse().expect("memory")),
            ..k8s()
        })
        .expect("plan");
        assert_eq!(p.sharing_api(), SharingApi::Dra);
        let dra = p.dra().expect("dra").clone();
        assert_eq!(dra.timeslices, [TimeSliceInterval::Long, TimeSliceInterval::Short]);
        let arms: Vec<String> = p.arms().into_iter().map(crate::domain::Arm::name).collect();
        assert_eq!(
            arms,
            [
                "exclusive",
                "time-slicing-long",
                "time-slicing-short",
                "mps-memory20480mi",
                "mps-threads25-memory20480mi",
                "mig"
            ],
            "one time-slicing arm per interval, one MPS arm per limit, in the flags' order"
        );
        let record = crate::results::record::PlanRecord::from_plan(
            &p,
            crate::domain::DeviceKind::Cuda,
            crate::domain::Source::Prometheus,
        );
        assert_eq!(record.dra.as_ref(), Some(&dra));
        let json = serde_json::to_value(&record).expect("json");
        assert_eq!(json["sharing_api"], "dra");
        assert_eq!(
            json["dra"]["timeslices"],
            serde_json::json!(["long", "short"]),
            "the flag's spelling"
        );
        assert_eq!(record.arms(), p.arms());
        assert_eq!(
            (json["mps_threads"].clone(), json["mps_memory"].clone()),
            (serde_json::json!(["auto", "25"]), serde_json::json!(["20Gi"]))
        );
        // The device plugin's runs record neither.
        let plain = crate::results::record::PlanRecord::from_plan(
            &SweepPlan::from_options(k8s()).expect("plan"),
            crate::domain::DeviceKind::Cuda,
            crate::domain::Source::Prometheus,
        );
        let json = serde_json::to_value(&plain).expect("json");
        assert!(json.get("sharing_api").is_none() && json.get("dra").is_none(), "{json}");
        // Read from Prometheus, whose series move at its scrape interval: a fixed warm-up,
        // though the plan asked for a steady one; scraped directly, the steady one.
        let steady = SweepPlan::from_options(k8s()).expect("plan");
        assert!(steady.measure.steady_warmup && !plain.warmup_steady);
        let scraped = crate::results::record::PlanRecord::from_plan(
            &steady,
            crate::domain::DeviceKind::Cuda,
            crate::domain::Source::Scrape,
        );
        assert!(scraped.warmup_steady);
        for (o, says) in [
            (
                SweepOptions {
                    sharing_api: Some(SharingApi::Dra),
                    ..opts()
                },
                "bad --sharing-api `dra`: ResourceClaims are Kubernetes'",
            ),
            (
                SweepOptions {
                    timeslice: Some("short".parse().expect("interval")),
                    ..k8s()
                },
                "bad --timeslice `short`: a setting of the DRA driver's GpuConfig: give --sharing-api dra",
            ),
            (
                SweepOptions {
                    sharing_api: Some(SharingApi::Dra),
                    timeslice: Some("short, long,short".parse().expect("intervals")),
                    strategies: Some("exclusive,mps".parse().expect("strategies")),
                    ..k8s()
                },
                "bad --timeslice `short,long`: sets time-slicing's interval: add time-slicing to --strategies",
            ),
            (
                SweepOptions {
                    mps_threads: Some("auto,100".parse().expect("threads")),
                    ..k8s()
                },
                "bad --mps-threads `auto,100`: the device plugin's MPS sharing splits the GPU equally",
            ),
            (
                SweepOptions {
                    mps_memory: Some("none".parse().expect("memory")),
                    strategies: Some("exclusive,time-slicing".parse().expect("strategies")),
                    ..opts()
                },
                "bad --mps-memory `none`: sets MPS's client limits: add mps to --strategies",
            ),
        ] {
            let e = bad(o);
            assert!(e.contains(says), "{says:?} not in {e:?}");
        }
        assert!("Long".parse::<crate::config::values::TimeSlice>().is_err());
        // auto is what the device plugin gives; locally every limit is the client's own.
        assert!(
            SweepPlan::from_options(SweepOptions {
                mps_threads: Some("auto".parse().expect("auto")),
                ..k8s()
            })
            .is_ok()
        );
        let local = SweepPlan::from_options(SweepOptions {
            mps_threads: Some("auto,100".parse().expect("threads")),
            mps_memory: Some("auto,none".parse().expect("memory")),
            ..opts()
        })
        .expect("local");
        assert_eq!(
            local
                .arms()
                .iter()
                .filter(|a| a.strategy == crate::domain::Strategy::Mps)
                .count(),
            4
        );
        for (q, bytes) in [("20Gi", 20u64 << 30), ("512Mi", 512 << 20), ("2G", 2_000_000_000)] {
            assert_eq!(q.parse::<crate::config::values::Quantity>().map(|q| q.bytes), Ok(bytes));
        }
        for q in ["", "20GB", "1Ki", "-1Gi", "1.5Gi"] {
            assert!(q.parse::<crate::config::values::Quantity>().is_err(), "{q}");
        }
    }

    #[test]
    fn config_file_errors_name_the_file_line_and_value() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("sweep.toml");
        std::fs::write(&f, "podz = [1]\n").expect("write");
        let e = SweepOptions::from_file(&f)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("sweep.toml") && e.contains("podz"), "{e}");
        std::fs::write(&f, "window = \"5s\"\npods = \"1,0\"\n").expect("write");
        let e = SweepOptions::from_file(&f)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("sweep.toml") && e.contains("line 2") && e.contains("bad value `0`: pod counts go from 1 to 64"),
            "{e}"
        );
        let missing = SweepOptions::from_file(&dir.path().join("nope.toml"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            missing.contains("nope.toml") && missing.contains("cannot read"),
            "{missing}"
        );
        // A value the plan refuses names the file and line where the file gave it, the
        // flag where a flag did.
        std::fs::write(&f, "window = \"5s\"\nmax_cell = \"2s\"\n").expect("write");
        let file = ConfigFile::read(&f).expect("a file of known keys");
        let e = SweepPlan::from_file_and_flags(Some(&file), SweepOptions::default())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.starts_with("config file ") && e.contains("sweep.toml: line 2 (`max_cell = \"2s\"`): max_cell `2s`"),
            "{e}"
        );
        let flags = SweepOptions {
            max_cell: Some("2s".parse().expect("span")),
            ..SweepOptions::default()
        };
        let e = SweepPlan::from_file_and_flags(Some(&file), flags)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("bad --max-cell `2s`"), "{e}");
    }

    #[test]
    fn kubernetes_names_are_checked_like_the_api_server_does() {
        assert!(validate_k8s_name("--namespace", "gpushare-bench", false).is_ok());
        assert!(validate_k8s_name("--namespace", "Bad_NS", false).is_err());
        assert!(validate_k8s_name("--node", "gpu-node-1.example.internal", true).is_ok());
        assert!(validate_k8s_name("--node", "bad node/../x", true).is_err());
        assert!(validate_k8s_name("--namespace", &"a".repeat(64), false).is_err());
        assert!(validate_image("").is_err());
        assert!(validate_image("reg.io/x:1").is_ok());
        assert!(
            bad(SweepOptions {
                backend: Some(BackendKind::Kubernetes),
                node: Some("bad node/../x".into()),
                ..opts()
            })
            .starts_with("bad --node `bad node/../x`: not a Kubernetes name")
        );
    }

    #[test]
    fn run_ids() {
        assert!(validate_run_id("20261122T141500Z-h100").is_ok());
        assert!(validate_run_id("../x").is_err());
        assert!(validate_run_id("").is_err());
        // A formula where a spreadsheet opens the CSV, or a flag to a later command.
        for id in ["-1-1", "_x", ".hidden"] {
            assert!(validate_run_id(id).is_err(), "{id}");
        }
        assert_eq!(default_run_id("2026-11-22T14:15:00Z", "h100"), "20261122T141500Z-h100");
    }

    #[test]
    fn capacity_max_pods_is_checked() {
        assert!(CapacityPlan { max_pods: 7 }.validate().is_ok());
        assert!(CapacityPlan { max_pods: 0 }.validate().is_err());
        assert!(CapacityPlan { max_pods: 65 }.validate().is_err());
    }

    #[test]
    fn slo_is_repeatable_and_one_list_in_the_config_file() {
        use clap::Parser;
        let cli = crate::config::cli::Cli::try_parse_from([
            "gpushare-bench",
            "sweep",
            "--slo",
            "p99=25ms",
            "--slo",
            "p50=5ms,p90=9ms",
        ])
        .expect("flags");
        let crate::config::cli::Command::Sweep(args) = cli.command else {
            panic!("not a sweep");
        };
        let file: SweepOptions = toml::from_str("slo = \"p90=1s\"\nrepeat = 2\n").expect("file");
        let plan = SweepPlan::from_options(file.overridden_by(args.options).expect("merge")).expect("plan");
        let slos: Vec<String> = plan.slos.iter().map(ToString::to_string).collect();
        assert_eq!(
            slos,
            ["p99=25ms", "p50=5ms", "p90=9ms"],
            "the flags win, all three of them"
        );
        assert_eq!(plan.repeat, 2);
        let file_only =
            SweepPlan::from_options(toml::from_str("slo = \"p90=1s,p99=2s\"\n").expect("file")).expect("plan");
        assert_eq!(file_only.slos.len(), 2);
    }

    #[test]
    fn a_precision_target_is_a_share_with_passes_to_spend_and_a_budget_needs_one() {
        let plan = |toml_text: &str| SweepPlan::from_options(toml::from_str(toml_text).expect("file"));
        let p = plan("target = \"1%\"\nbudget = \"10m\"\n").expect("plan");
        assert_eq!((p.target, p.repeat), (Some(0.01), DEFAULT_TARGET_PASSES));
        assert_eq!(p.budget, Some(Duration::from_secs(600)));
        // Its windows are 2 s unless --window says; without a target, 5 s.
        assert_eq!(p.measure.window, TARGET_WINDOW);
        assert_eq!(
            plan("target = \"1%\"\nwindow = \"5s\"\n").expect("plan").measure.window,
            Duration::from_secs(5)
        );
        assert_eq!(plan("").expect("plan").measure.window, DEFAULT_WINDOW);
        assert_eq!(plan("target = \"0.5%\"\nrepeat = 4\n").expect("plan").repeat, 4);
        for (text, says) in [
            (
                "target = \"1\"\n",
                "bad --target `1`: give a share of the mean, e.g. 1%",
            ),
            ("target = \"0%\"\n", "0%: give 0.01% to 50%"),
            ("target = \"60%\"\n", "60%: give 0.01% to 50%"),
            ("target = \"1%\"\nrepeat = 1\n", "an interval needs at least 2"),
            ("budget = \"5m\"\n", "give --target too"),
        ] {
            let err = plan(text).expect_err(text).to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
