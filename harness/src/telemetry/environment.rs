//! The machine and software a run measured, as `run.json` records them.

use serde::{Deserialize, Serialize};

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
    /// PCI bus id, e.g. "00000000:19:00.0" (absent in runs before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
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
    /// The harness version and the commit it was built from (`git describe` at build
    /// time; runs before this was recorded say the version alone).
    pub harness: String,
    /// `git describe` of the directory the harness ran in, when it is a checkout (not
    /// necessarily the code of the binary: see `harness`).
    pub git_revision: Option<String>,
    /// Kubernetes with DRA: NVIDIA's DRA driver on the node, its image and feature gates
    /// as its kubelet plugin's pod shows them (or why they could not be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra_driver: Option<String>,
    /// Local: this machine's other GPUs, not measured (`GPU 1: NAME (UUID, bus …)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_gpus: Vec<String>,
    /// Local: compute processes not the run's on the measured GPU when it started
    /// (only with `--allow-busy-gpu`; otherwise the run refuses such a GPU).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_processes: Vec<String>,
    /// Kubernetes through the device plugin on a node with several GPUs: how many GPUs
    /// every cell fills, its `pods` on each (the plugin spreads a Deployment's pods over
    /// the node's GPUs). Absent: one GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_filled: Option<u32>,
}
