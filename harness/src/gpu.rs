//! What the GPUs are and what they do: an inventory read once per run (NVML, with
//! `nvidia-smi -L` as the fallback for MIG devices) and telemetry sampled during
//! measurements. Read only: nothing here changes a GPU setting.

use std::sync::Arc;
use std::sync::Mutex;

use crate::record::GpuRecord;

/// One MIG device as `nvidia-smi -L` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// Profile, e.g. `1g.10gb`.
    pub profile: String,
    /// `MIG-…` UUID, what `CUDA_VISIBLE_DEVICES` takes.
    pub uuid: String,
}

/// One GPU in the inventory.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    /// Index.
    pub index: u32,
    /// Name.
    pub name: String,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Memory in bytes.
    pub memory_total_bytes: Option<u64>,
    /// Some(true) MIG enabled, Some(false) disabled, None not MIG-capable / unknown.
    pub mig_enabled: Option<bool>,
    /// Compute mode name.
    pub compute_mode: Option<String>,
    /// Existing MIG devices.
    pub mig_devices: Vec<MigDevice>,
}

impl GpuInfo {
    /// The record written to run.json.
    pub fn record(&self) -> GpuRecord {
        GpuRecord {
            index: self.index,
            name: self.name.clone(),
            uuid: self.uuid.clone(),
            memory_total_bytes: self.memory_total_bytes,
            mig_mode: self
                .mig_enabled
                .map(|m| if m { "Enabled" } else { "Disabled" }.to_string()),
            compute_mode: self.compute_mode.clone(),
            mig_devices: self
                .mig_devices
                .iter()
                .map(|m| format!("MIG {} (UUID: {})", m.profile, m.uuid))
                .collect(),
        }
    }

    /// Short name for run ids: "h100", "a100", …
    pub fn short_name(&self) -> String {
        let lower = self.name.to_lowercase();
        let tokens: Vec<&str> = lower
            .split(|c: char| c.is_whitespace() || c == '-' || c == '_')
            .filter(|t| !t.is_empty())
            .collect();
        let has_digit = |t: &&&str| t.chars().any(|c| c.is_ascii_digit());
        tokens
            .iter()
            .filter(has_digit)
            .find(|t| t.starts_with(|c: char| c.is_ascii_alphabetic()))
            .or_else(|| tokens.iter().find(has_digit))
            .map(|t| t.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>())
            .unwrap_or_else(|| "gpu".into())
    }
}

/// All GPUs, and the driver.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuInventory {
    /// GPUs by index.
    pub gpus: Vec<GpuInfo>,
    /// Driver version.
    pub driver_version: Option<String>,
    /// CUDA version the driver supports, e.g. "13.0".
    pub cuda_driver_version: Option<String>,
    /// Whether NVML answered.
    pub nvml: bool,
}

/// Parses `nvidia-smi -L`:
/// ```text
/// GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-…)
///   MIG 1g.5gb      Device  0: (UUID: MIG-c6d4f1ef-…)
/// ```
pub fn parse_nvidia_smi_list(text: &str) -> Vec<GpuInfo> {
    let mut gpus: Vec<GpuInfo> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        let uuid = t
            .rfind("(UUID: ")
            .and_then(|i| t[i + 7..].strip_suffix(')'))
            .map(str::trim)
            .unwrap_or("")
            .to_string();
        if let Some(rest) = t.strip_prefix("GPU ") {
            let Some((idx, after)) = rest.split_once(':') else {
                continue;
            };
            let Ok(index) = idx.trim().parse() else { continue };
            let name = after.split(" (UUID:").next().unwrap_or("").trim().to_string();
            gpus.push(GpuInfo {
                index,
                name,
                uuid,
                memory_total_bytes: None,
                mig_enabled: None,
                compute_mode: None,
                mig_devices: Vec::new(),
            });
        } else if let Some(rest) = t.strip_prefix("MIG ") {
            let profile = rest.split_whitespace().next().unwrap_or("").to_string();
            if let Some(gpu) = gpus.last_mut()
                && uuid.starts_with("MIG-")
            {
                gpu.mig_devices.push(MigDevice { profile, uuid });
                gpu.mig_enabled = Some(true);
            }
        }
    }
    gpus
}

/// Reads the inventory through NVML; MIG devices from `nvidia-smi -L` (same driver,
/// simpler than NVML's MIG handles). Empty when there is no driver.
pub fn probe() -> GpuInventory {
    let Ok(nvml) = nvml_wrapper::Nvml::init() else {
        return GpuInventory::default();
    };
    let mut inv = GpuInventory {
        nvml: true,
        driver_version: nvml.sys_driver_version().ok(),
        cuda_driver_version: nvml
            .sys_cuda_driver_version()
            .ok()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        gpus: Vec::new(),
    };
    let listed = std::process::Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| parse_nvidia_smi_list(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default();
    for i in 0..nvml.device_count().unwrap_or(0) {
        let Ok(d) = nvml.device_by_index(i) else { continue };
        let uuid = d.uuid().unwrap_or_default();
        let mig_enabled = d.mig_mode().ok().map(|m| m.current == 1);
        inv.gpus.push(GpuInfo {
            index: i,
            name: d.name().unwrap_or_else(|_| "unknown GPU".into()),
            memory_total_bytes: d.memory_info().ok().map(|m| m.total),
            mig_enabled,
            compute_mode: d.compute_mode().ok().map(|m| format!("{m:?}")),
            mig_devices: listed
                .iter()
                .find(|g| g.uuid == uuid)
                .map(|g| g.mig_devices.clone())
                .unwrap_or_default(),
            uuid,
        });
    }
    inv
}

/// One telemetry reading of the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuSample {
    /// GPU utilisation, percent.
    pub util_pct: f64,
    /// Device memory in use, bytes.
    pub mem_used_bytes: u64,
    /// Board power, watts.
    pub power_w: f64,
    /// Energy counter since driver load, millijoules.
    pub energy_mj: Option<u64>,
}

/// Reads device telemetry (NVML on GPU 0, or nothing).
pub trait Telemetry: Send + Sync {
    /// One reading, or None when there is no GPU to read.
    fn sample(&self) -> Option<GpuSample>;
}

/// No GPU: no numbers (cells get empty telemetry columns, not zeros).
#[derive(Debug, Default)]
pub struct NoTelemetry;

impl Telemetry for NoTelemetry {
    fn sample(&self) -> Option<GpuSample> {
        None
    }
}

/// NVML telemetry of one GPU.
pub struct NvmlTelemetry {
    nvml: nvml_wrapper::Nvml,
    index: u32,
}

impl std::fmt::Debug for NvmlTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NvmlTelemetry(gpu {})", self.index)
    }
}

impl NvmlTelemetry {
    /// Opens NVML, if the driver is there.
    pub fn open(index: u32) -> Option<Self> {
        nvml_wrapper::Nvml::init().ok().map(|nvml| Self { nvml, index })
    }
}

impl Telemetry for NvmlTelemetry {
    fn sample(&self) -> Option<GpuSample> {
        let d = self.nvml.device_by_index(self.index).ok()?;
        Some(GpuSample {
            util_pct: d.utilization_rates().ok()?.gpu as f64,
            mem_used_bytes: d.memory_info().ok()?.used,
            power_w: d.power_usage().ok()? as f64 / 1000.0,
            energy_mj: d.total_energy_consumption().ok(),
        })
    }
}

/// Telemetry summarised over a measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TelemetrySummary {
    /// Mean utilisation.
    pub util_pct: Option<f64>,
    /// Peak memory in use.
    pub mem_bytes: Option<u64>,
    /// Mean power.
    pub power_w: Option<f64>,
    /// Energy over the measurement, joules (from the energy counter).
    pub energy_j: Option<f64>,
}

/// Summarises samples taken once a second (pure).
pub fn summarise(samples: &[GpuSample]) -> TelemetrySummary {
    if samples.is_empty() {
        return TelemetrySummary::default();
    }
    let n = samples.len() as f64;
    let energy_j = match (
        samples.first().and_then(|s| s.energy_mj),
        samples.last().and_then(|s| s.energy_mj),
    ) {
        (Some(a), Some(b)) if b >= a && samples.len() > 1 => Some((b - a) as f64 / 1000.0),
        _ => None,
    };
    TelemetrySummary {
        util_pct: Some(samples.iter().map(|s| s.util_pct).sum::<f64>() / n),
        mem_bytes: samples.iter().map(|s| s.mem_used_bytes).max(),
        power_w: Some(samples.iter().map(|s| s.power_w).sum::<f64>() / n),
        energy_j,
    }
}

/// Samples telemetry every second on a background task until dropped or finished.
pub struct Sampler {
    samples: Arc<Mutex<Vec<GpuSample>>>,
    stop: tokio_util::sync::CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling now (one reading at once, then every second).
    pub fn start(telemetry: Arc<dyn Telemetry>) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let task = {
            let (samples, stop) = (samples.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {
                            let t = telemetry.clone();
                            if let Ok(Some(s)) = tokio::task::spawn_blocking(move || t.sample()).await
                                && let Ok(mut v) = samples.lock() {
                                    v.push(s);
                                }
                        }
                    }
                }
            })
        };
        Self {
            samples,
            stop,
            task: Some(task),
        }
    }

    /// Stops (taking one last reading, on a blocking thread like the others: a
    /// telemetry source may block on network I/O) and summarises.
    pub async fn finish(mut self, telemetry: Arc<dyn Telemetry>) -> TelemetrySummary {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        let mut v = self.samples.lock().map(|v| v.clone()).unwrap_or_default();
        if let Ok(Some(s)) = tokio::task::spawn_blocking(move || telemetry.sample()).await {
            v.push(s);
        }
        summarise(&v)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nvidia_smi_list_with_mig_devices() {
        let text = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-1234-5678-9abc-def012345678)\n\
  MIG 1g.5gb      Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)\n\
  MIG 1g.5gb      Device  1: (UUID: MIG-cba6c3a5-2c7a-5c8b-9d3e-6b53d3a8e5a1)\n\
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)\n";
        let gpus = parse_nvidia_smi_list(text);
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].name, "NVIDIA A100-SXM4-40GB");
        assert_eq!(gpus[0].uuid, "GPU-5d5ba0d6-1234-5678-9abc-def012345678");
        assert_eq!(gpus[0].mig_devices.len(), 2);
        assert_eq!(gpus[0].mig_devices[1].profile, "1g.5gb");
        assert_eq!(gpus[0].mig_devices[1].uuid, "MIG-cba6c3a5-2c7a-5c8b-9d3e-6b53d3a8e5a1");
        assert!(gpus[1].mig_devices.is_empty());
        assert_eq!(gpus[1].short_name(), "h100");
        assert_eq!(gpus[0].short_name(), "a100");
    }

    #[test]
    fn summarises_samples() {
        let s = |u, m, p, e| GpuSample {
            util_pct: u,
            mem_used_bytes: m,
            power_w: p,
            energy_mj: e,
        };
        let sum = summarise(&[s(50.0, 10, 100.0, Some(1_000)), s(100.0, 30, 300.0, Some(5_000))]);
        assert_eq!(sum.util_pct, Some(75.0));
        assert_eq!(sum.mem_bytes, Some(30));
        assert_eq!(sum.power_w, Some(200.0));
        assert_eq!(sum.energy_j, Some(4.0));
        assert_eq!(summarise(&[]), TelemetrySummary::default());
        // One sample: no energy difference to take.
        assert_eq!(summarise(&[s(1.0, 1, 1.0, Some(9))]).energy_j, None);
    }
}
