//! NVML: the GPU inventory (with `nvidia-smi -L` for MIG devices) and telemetry of one
//! GPU. NVML is opened at run time, so the binary starts on machines without a driver.
//! Read only.

use crate::telemetry::inventory::{GpuProcess, parse_nvidia_smi_list};
use crate::telemetry::{GpuInfo, GpuInventory, GpuSample, Telemetry};

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
            pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
            processes: processes(&d),
            uuid,
        });
    }
    inv
}

/// The compute processes NVML lists on `d` (on a MIG GPU, those of every instance).
fn processes(d: &nvml_wrapper::Device<'_>) -> Vec<GpuProcess> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    d.running_compute_processes()
        .unwrap_or_default()
        .into_iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            name: process_name(p.pid),
            used_memory_bytes: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            },
        })
        .collect()
}

/// A process's program name: its argv[0]'s file name (comm is cut at 15 bytes), else
/// comm; None when this machine cannot see it (another container's pid).
fn process_name(pid: u32) -> Option<String> {
    let argv0 = std::fs::read(format!("/proc/{pid}/cmdline")).ok().and_then(|c| {
        let first = c.split(|&b| b == 0).next()?;
        let name = String::from_utf8_lossy(first);
        let base = name.rsplit('/').next()?.trim().to_string();
        (!base.is_empty()).then_some(base)
    });
    argv0.or_else(|| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|n| n.trim().to_string())
    })
}

/// The compute processes on the GPU with this UUID now (empty without NVML).
pub fn processes_on(uuid: &str) -> Vec<GpuProcess> {
    let Ok(nvml) = nvml_wrapper::Nvml::init() else {
        return Vec::new();
    };
    nvml.device_by_uuid(uuid).map(|d| processes(&d)).unwrap_or_default()
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
        use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
        let d = self.nvml.device_by_index(self.index).ok()?;
        Some(GpuSample {
            at_s: 0.0,
            util_pct: d.utilization_rates().ok()?.gpu as f64,
            mem_used_bytes: d.memory_info().ok()?.used,
            power_w: d.power_usage().ok()? as f64 / 1000.0,
            energy_mj: d.total_energy_consumption().ok(),
            clock_reasons: d.current_throttle_reasons().ok().map(|r| r.bits()),
            sm_clock_mhz: d.clock_info(Clock::SM).ok().map(f64::from),
            mem_clock_mhz: d.clock_info(Clock::Memory).ok().map(f64::from),
            temp_c: d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_named_by_its_whole_program_name() {
        let exe = std::env::current_exe().expect("exe");
        let want = exe.file_name().expect("name").to_string_lossy().into_owned();
        assert!(
            want.len() > 15,
            "the test binary's name is longer than comm keeps: {want}"
        );
        assert_eq!(process_name(std::process::id()).as_deref(), Some(want.as_str()));
        assert_eq!(process_name(u32::MAX), None);
    }
}
