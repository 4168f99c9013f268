//! The machine a run measured: host, OS, CPU, GPUs and driver, tool versions. Read
//! once per run into the [`Environment`] record; nothing here changes anything.

use std::path::Path;

use crate::telemetry::GpuInventory;
use crate::telemetry::environment::Environment;

/// The first line a command prints on success (None when it fails or prints nothing).
pub fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The CPU model from `/proc/cpuinfo` (the architecture when it says nothing).
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.into())
}

/// Records the machine: host, OS, CPU, GPUs and driver, MPS binary, versions.
pub fn environment(inventory: &GpuInventory, workload: &str, mps: Option<&Path>) -> Environment {
    Environment {
        hostname: command_line("hostname", &[]).unwrap_or_default(),
        os: command_line("uname", &["-srm"]).unwrap_or_else(|| std::env::consts::OS.into()),
        cpu: cpu_name(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        gpus: inventory.gpus.iter().map(|g| g.record()).collect(),
        driver_version: inventory.driver_version.clone(),
        cuda_driver_version: inventory.cuda_driver_version.clone(),
        nvml: inventory.nvml,
        mps_control: mps.map(|p| p.display().to_string()),
        workload: match command_line(workload, &["--version"]) {
            Some(v) => format!("{workload} ({v})"),
            None => workload.to_string(),
        },
        harness: format!(
            "gpushare-bench {} built from {}",
            env!("CARGO_PKG_VERSION"),
            option_env!("GPUSHARE_BUILD_REVISION").unwrap_or("an unrecorded revision")
        ),
        git_revision: command_line("git", &["describe", "--always", "--dirty", "--tags"]),
        dra_driver: None,
        other_gpus: Vec::new(),
        gpu_processes: Vec::new(),
        gpus_filled: None,
    }
}
