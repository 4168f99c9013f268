//! The GPU operator's operands on the node and the labels its components own.

use serde_json::Value;

use crate::gpu::PluginConfig;
use crate::spec::Secs;

/// The operator's operands on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OperandKind {
    /// `nvidia-device-plugin-daemonset`.
    Plugin,
    /// `gpu-feature-discovery`.
    Gfd,
    /// `nvidia-device-plugin-mps-control-daemon`.
    Mps,
}

impl OperandKind {
    pub(crate) fn app(self) -> &'static str {
        match self {
            Self::Plugin => "nvidia-device-plugin-daemonset",
            Self::Gfd => "gpu-feature-discovery",
            Self::Mps => "nvidia-device-plugin-mps-control-daemon",
        }
    }

    /// The main container's name (gpu-operator v25.10.1 assets, H14).
    pub(crate) fn container(self) -> &'static str {
        match self {
            Self::Plugin => "nvidia-device-plugin",
            Self::Gfd => "gpu-feature-discovery",
            Self::Mps => "mps-control-daemon-ctr",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// The main process of an operand pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Process {
    /// Starting (until the time), with the config it will load.
    Starting,
    /// Running with this config.
    Running(PluginConfig),
    /// Exited with this error; restarts at the time.
    Crashed(String),
}

/// One operand pod and its config-manager.
#[derive(Debug, Clone, PartialEq)]
pub struct Operand {
    /// Which.
    pub kind: OperandKind,
    /// Pod name.
    pub pod: String,
    /// Created at.
    pub created: Secs,
    /// The entry its config symlink points to (None: not yet, `Some("")`: /dev/null).
    pub linked: Option<String>,
    /// The config-manager sidecar's last error (it is crash-looping).
    pub manager_error: Option<String>,
    /// Consecutive config-manager failures (backoff).
    pub manager_failures: u32,
    /// Consecutive process failures (backoff).
    pub process_failures: u32,
    /// The main process.
    pub process: Process,
    /// Plugin: registered with the kubelet (its resources are advertised).
    pub registered: bool,
    /// Being deleted.
    pub terminating: bool,
    /// Container restarts that left no error state (the MPS sidecar's panic, H10).
    pub restarts: u32,
}

/// What a workload container does on its own, from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WorkloadAct {
    /// `--inject-fault-after`: a kernel writes through an unmapped address.
    Fault,
    /// `--crash-after`: SIGKILL to itself.
    Crash,
}

/// The GPU operator's operand label values a MIG change pauses (mig-parted v0.13.1
/// `reconfigure.go`, step 7).
pub(crate) const PAUSED: &str = "paused-for-mig-change";
pub(crate) const DEPLOY_PAUSED: [&str; 5] = [
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.nvsm",
];
/// Labels the operator adds when absent (gpu-operator v25.10.1 `state_manager.go`
/// `addGPUStateLabels`), with `mig-manager` on MIG-capable nodes.
pub(crate) const DEPLOY_LABELS: [&str; 9] = [
    "nvidia.com/gpu.deploy.driver",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.container-toolkit",
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.node-status-exporter",
    "nvidia.com/gpu.deploy.operator-validator",
    "nvidia.com/gpu.deploy.mig-manager",
];
/// The label the config-managers watch.
pub const PLUGIN_LABEL: &str = "nvidia.com/device-plugin.config";
/// The label the MIG manager watches.
pub const MIG_LABEL: &str = "nvidia.com/mig.config";
/// The MIG manager's state label.
pub const MIG_STATE: &str = "nvidia.com/mig.config.state";
/// Field manager of the simulated operator components.
pub const OPERATOR: &str = "gpu-operator";

/// GFD removes its features file on exit (`cmd/gpu-feature-discovery/main.go` `run`), so
/// NFD drops them while GFD is down.
pub(crate) fn is_gfd_label(k: &str) -> bool {
    (k.starts_with("nvidia.com/gpu.") && !k.starts_with("nvidia.com/gpu.deploy."))
        || k.starts_with("nvidia.com/mig-")
        || matches!(
            k,
            "nvidia.com/mig.capable" | "nvidia.com/mps.capable" | "nvidia.com/mig.strategy"
        )
}

/// A workload flag's duration from a container's arguments (`15000ms`, `5s`).
pub(crate) fn arg_duration(args: &Value, flag: &str) -> Option<Secs> {
    let args = args.as_array()?;
    let i = args.iter().position(|a| a == flag)?;
    let v = args.get(i + 1)?.as_str()?;
    match v.strip_suffix("ms") {
        Some(ms) => ms.parse::<f64>().ok().map(|m| m / 1000.0),
        None => v.strip_suffix('s')?.parse().ok(),
    }
}
