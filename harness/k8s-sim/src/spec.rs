//! What a test cluster's GPU node is ([`ClusterSpec`]), how long its components take
//! ([`Timings`]), and what a test may learn about a pod beyond the API ([`PodFacts`]).

use std::collections::BTreeMap;

use crate::gpu::GpuModel;

/// Which images run as local processes ([`crate::node`]'s kubelet starts them), and
/// where their output goes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProcessSpec {
    /// Image → the program its entrypoint is (the image's ENTRYPOINT; a pod's `command`,
    /// when it has one, runs instead).
    pub images: BTreeMap<String, std::path::PathBuf>,
    /// Directory for each container's output (`<pod>.log`, appended across restarts).
    pub logs: std::path::PathBuf,
}

/// Virtual seconds.
pub type Secs = f64;

/// How long things take, in virtual seconds. The defaults follow the upstream constants
/// where there is one (named) and a plausible value where there is not (said so).
#[derive(Debug, Clone, PartialEq)]
pub struct Timings {
    /// Informer delay from a label change to the config-manager or MIG manager seeing it.
    pub informer: Secs,
    /// Kubelet's projection of a changed ConfigMap into the plugin pod's volume (A5: sync
    /// period 60 s + cache TTL); GFD's and the MPS daemon's pods lag by their own offsets.
    pub projection: [Secs; 3],
    /// Container restart back-off after the second exit in a row, doubling, capped
    /// (`initialCrashLoopBackOff` 10 s and `MaxCrashLoopBackOff` 300 s; the first restart
    /// is immediate: UPSTREAM-RULES.md I2).
    pub backoff: (Secs, Secs),
    /// Plugin stop, reload and register with the kubelet after a SIGHUP.
    pub plugin_restart: Secs,
    /// GFD's relabel after a SIGHUP, through NFD (NFD's latency not read: assumed).
    pub gfd_relabel: Secs,
    /// GFD's periodic relabel (`GFD_SLEEP_INTERVAL=60s` in the operator's asset).
    pub gfd_interval: Secs,
    /// The plugin's retry while the MPS daemon is not healthy (`restartTimeout` 30 s).
    pub mps_retry: Secs,
    /// A new operand pod until its main container runs.
    pub operand_start: Secs,
    /// Operand pod termination.
    pub operand_stop: Secs,
    /// The operator's reconcile period (labels it adds when absent).
    pub operator_reconcile: Secs,
    /// mig-parted: validate and persist the config, then set `pending`.
    pub mig_validate: Secs,
    /// mig-parted: MIG mode change.
    pub mig_mode: Secs,
    /// A workload pod from bound to ready (image present, model loaded).
    pub pod_ready: Secs,
    /// A workload pod's termination.
    pub pod_stop: Secs,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            informer: 1.0,
            projection: [60.0, 75.0, 90.0],
            backoff: (10.0, 300.0),
            plugin_restart: 5.0,
            gfd_relabel: 5.0,
            gfd_interval: 60.0,
            mps_retry: 30.0,
            operand_start: 15.0,
            operand_stop: 5.0,
            operator_reconcile: 30.0,
            mig_validate: 2.0,
            mig_mode: 40.0,
            pod_ready: 20.0,
            pod_stop: 5.0,
        }
    }
}

/// What the simulated cluster starts with.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpec {
    /// The GPU node's name.
    pub node: String,
    /// Its GPUs.
    pub gpu: GpuModel,
    /// How many.
    pub gpus: u32,
    /// The operator's namespace.
    pub operator_namespace: String,
    /// ClusterPolicy `devicePlugin.config` (name, default); name empty: no config-manager.
    pub plugin_config: (String, String),
    /// ClusterPolicy `mig.strategy`.
    pub mig_strategy: String,
    /// The device-plugin ConfigMap's data at the start (None: no ConfigMap).
    pub configmap: Option<BTreeMap<String, String>>,
    /// Node labels the user had set (e.g. `nvidia.com/device-plugin.config`).
    pub labels: BTreeMap<String, String>,
    /// Whether the node carries the `nvidia.com/gpu:NoSchedule` taint.
    pub gpu_taint: bool,
    /// Whether the MIG manager may reboot the node (`WITH_REBOOT`).
    pub with_reboot: bool,
    /// Durations.
    pub timings: Timings,
    /// Kubernetes minor version (1.35 asks `create` on pods/portforward too).
    pub minor_version: u32,
    /// NVIDIA's DRA driver on the node, with its feature gates (None: not installed):
    /// its DeviceClasses and the node's ResourceSlice exist, and claims are allocated
    /// and prepared by its rules (`sim/dra.rs`).
    pub dra: Option<super::dra::Gates>,
    /// DRA: MIG instances made on GPU 0 before the driver started, by profile (static
    /// MIG; empty: MIG off): the driver then publishes these and no whole GPU (J8).
    pub dra_mig: Vec<String>,
    /// Whether NVIDIA's device plugin runs on the node (the GPU operator's default). A
    /// node for NVIDIA's DRA driver has it off (`nvidia.com/gpu.deploy.device-plugin=false`):
    /// the driver's chart refuses to install beside it.
    pub device_plugin: bool,
    /// ClusterPolicy `dcgmExporter.serviceMonitor.enabled`: whether the operator makes
    /// the DCGM exporter's ServiceMonitor (in its own namespace) for Prometheus.
    pub dcgm_service_monitor: bool,
    /// Pods whose containers run as local processes (None: every pod is simulated).
    pub processes: Option<ProcessSpec>,
    /// Virtual seconds per second of a workload's own flags (`--inject-fault-after`,
    /// `--crash-after`): the harness's wall-clock times and the pods' flags agree when
    /// this is the simulator's speed.
    pub workload_time_scale: f64,
}

impl ClusterSpec {
    /// One H100 80GB node (tainted `nvidia.com/gpu:NoSchedule`) under GPU operator
    /// v25.10.1, set up as its time-slicing guide does: ClusterPolicy
    /// `devicePlugin.config {name: device-plugin-config, default: any}` and a ConfigMap
    /// with the user's key `any` (no sharing).
    pub fn h100(node: &str) -> Self {
        Self {
            node: node.into(),
            gpu: GpuModel::h100_80gb(),
            gpus: 1,
            operator_namespace: "gpu-operator".into(),
            plugin_config: ("device-plugin-config".into(), "any".into()),
            mig_strategy: "single".into(),
            configmap: Some(BTreeMap::from([("any".to_string(), "version: v1\n".to_string())])),
            labels: BTreeMap::new(),
            gpu_taint: true,
            with_reboot: false,
            timings: Timings::default(),
            minor_version: 34,
            device_plugin: true,
            dcgm_service_monitor: true,
            processes: None,
            workload_time_scale: 1.0,
            dra: None,
            dra_mig: Vec::new(),
        }
    }
}

/// Something a test may want to know about a workload pod that the API does not show.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodFacts {
    /// Index of the GPU (or MIG parent) its device is on.
    pub gpu: Option<u32>,
    /// The UUID CUDA reports inside the pod for that GPU (`cuDeviceGetUuid_v2`, as
    /// gpushare-workload publishes it in `workload_info{device_uuid}`): [`gpu_uuid`] of
    /// its index. None for a MIG slice, whose UUID is the instance's.
    pub device_uuid: Option<String>,
    /// Replicas the plugin advertised when it was allocated.
    pub plugin_replicas: Option<u32>,
    /// Replicas the MPS daemon enforced then (1/replicas of the SMs and memory).
    pub mps_enforced: Option<u32>,
    /// Whether its device was a MIG slice.
    pub mig: bool,
    /// Its `gpushare.dev/cell` label (`mps-3`).
    pub cell: String,
    /// Its container's image.
    pub image: String,
    /// Its `gpushare.dev/role` label in an isolation trial (`victim`, `aggressor`).
    pub role: String,
    /// Its container's command as the kubelet runs it (`$(NAME)` expanded, I6); empty:
    /// the image's ENTRYPOINT.
    pub command: Vec<String>,
    /// Its container's args as the kubelet passes them (I6); empty: the image's CMD.
    pub args: Vec<String>,
    /// The DRA claim its GPU came through (empty: the device plugin's resource).
    pub claim: String,
    /// What NVIDIA's DRA driver applied when it prepared that claim (J5).
    pub dra_sharing: Option<crate::dra::Sharing>,
    /// The extended resources (`nvidia.com/…`) its container's limits ask for.
    pub gpu_resources: Vec<String>,
}

/// The UUID of the simulated node's GPU `index`, in the 8-4-4-4-12 form CUDA reports
/// (nvidia-smi prints it after `GPU-`): fixed per index, distinct across indices.
pub fn gpu_uuid(index: u32) -> String {
    format!(
        "5c6f2a1e-0b7d-4c1a-9e3f-{:012x}",
        0x00de_ad00_0000_u64 + u64::from(index)
    )
}
