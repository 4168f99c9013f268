//! What the GPUs are: the inventory types read once per run, and the parser of
//! `nvidia-smi -L` (pure; the source of MIG device UUIDs). Nothing here changes a GPU
//! setting.

use crate::results::record::GpuRecord;

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
}
