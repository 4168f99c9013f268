//! `gpushare-bench doctor`: one line per prerequisite, with a fix for each failure.

use std::fmt::Write;
use std::path::Path;

use crate::telemetry::GpuInventory;

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Works.
    Ok,
    /// Optional, or only needed for some modes.
    Warn,
    /// Needed for a GPU sweep and missing.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// The verdict.
    pub verdict: Verdict,
    /// What was found, and for failures how to fix it.
    pub detail: String,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tag = match self.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{tag}  {:<22} {}", self.name, self.detail)
    }
}

/// What `doctor` prints: one line per check.
pub fn render(checks: &[Check]) -> String {
    checks.iter().map(|c| format!("{c}\n")).collect()
}

/// Whether a check failed (`doctor` then exits 1).
pub fn any_failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.verdict == Verdict::Fail)
}

fn dl_present(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: dlopen/dlclose by name only.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY);
        if h.is_null() {
            false
        } else {
            libc::dlclose(h);
            true
        }
    }
}

/// What the checks look at, gathered by the caller (tests pass fixtures).
#[derive(Debug, Clone)]
pub struct Facts {
    /// NVML inventory.
    pub inventory: GpuInventory,
    /// libcuda loads.
    pub libcuda: bool,
    /// libcublasLt.so.13 loads.
    pub cublaslt: bool,
    /// libnvrtc.so.13 loads.
    pub nvrtc: bool,
    /// The MPS control binary.
    pub mps_control: Option<String>,
    /// The workload binary and its version.
    pub workload: Result<String, String>,
    /// `prometheus --version` first line.
    pub prometheus: Option<String>,
    /// A kubeconfig path (and its context) or "in-cluster"; `Err` when the file found is
    /// not a kubeconfig.
    pub kubernetes: Option<std::result::Result<String, String>>,
}

/// Reads the facts from this machine.
pub fn gather() -> Facts {
    let workload = crate::backend::local::find_workload(None)
        .map_err(|e| e.to_string())
        .map(|p| {
            let v = std::process::Command::new(&p)
                .arg("--version")
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default();
            format!("{} ({v})", p.display())
        });
    let prometheus = std::process::Command::new("prometheus")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
            text.lines().next().map(str::to_string)
        });
    let kubernetes = if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        Some(Ok("in-cluster service account".into()))
    } else {
        std::env::var("KUBECONFIG")
            .ok()
            .filter(|p| Path::new(p.split(':').next().unwrap_or("")).is_file())
            .or_else(|| {
                let home = std::env::var("HOME").ok()?;
                let p = format!("{home}/.kube/config");
                Path::new(&p).is_file().then_some(p)
            })
            .map(|p| kubeconfig_summary(&p))
    };
    Facts {
        inventory: crate::telemetry::nvml::probe(),
        libcuda: dl_present("libcuda.so.1"),
        cublaslt: dl_present("libcublasLt.so.13"),
        nvrtc: dl_present("libnvrtc.so.13"),
        mps_control: crate::backend::local::mps::find_control().map(|p| p.display().to_string()),
        workload,
        prometheus,
        kubernetes,
    }
}

/// The checks (pure).
pub fn checks(f: &Facts) -> Vec<Check> {
    use Verdict::*;
    let mut out = Vec::new();
    let c = |name, verdict, detail: String| Check { name, verdict, detail };
    out.push(match f.inventory.gpus.first() {
        Some(g) => c(
            "GPU and driver",
            Ok,
            format!(
                "{} GPU(s), GPU 0: {} (driver {}, CUDA {})",
                f.inventory.gpus.len(),
                g.name,
                f.inventory.driver_version.as_deref().unwrap_or("?"),
                f.inventory.cuda_driver_version.as_deref().unwrap_or("?")
            ),
        ),
        None => c(
            "GPU and driver",
            Fail,
            "no NVIDIA GPU visible through NVML — fix: install the NVIDIA driver (or expose the GPU to this container); without one, `sweep --device auto` runs the CPU smoke pipeline".into(),
        ),
    });
    // Every GPU, with what computes on it: a sweep measures one (--gpu) and refuses a
    // busy one unless --allow-busy-gpu.
    for g in &f.inventory.gpus {
        let mut detail = g.line();
        if let Some(m) = g.memory_total_bytes {
            let _ = write!(detail, ", {} GiB", m >> 30);
        }
        let mig = match g.mig_enabled {
            Some(true) => format!("MIG enabled ({} devices)", g.mig_devices.len()),
            Some(false) => "MIG disabled".into(),
            None => "no MIG".into(),
        };
        let _ = write!(
            detail,
            ", {mig}, compute mode {}",
            g.compute_mode.as_deref().unwrap_or("?")
        );
        out.push(if g.processes.is_empty() {
            c("GPU", Ok, format!("{detail}; idle"))
        } else {
            let list: Vec<String> = g.processes.iter().map(ToString::to_string).collect();
            c(
                "GPU",
                Warn,
                format!(
                    "{detail}; busy: {} — a sweep on it measures their load too, so it refuses this GPU unless --allow-busy-gpu; pick another with --gpu",
                    list.join(", ")
                ),
            )
        });
    }
    out.push(if f.libcuda {
        c("CUDA driver library", Ok, "libcuda.so.1 loads".into())
    } else {
        c(
            "CUDA driver library",
            Fail,
            "libcuda.so.1 not found — fix: install the NVIDIA driver".into(),
        )
    });
    for (name, ok, lib) in [
        ("cuBLASLt", f.cublaslt, "libcublasLt.so.13"),
        ("NVRTC", f.nvrtc, "libnvrtc.so.13"),
    ] {
        out.push(if ok {
            c(name, Ok, format!("{lib} loads"))
        } else {
            c(
                name,
                Fail,
                format!("{lib} not found — fix: install CUDA 13 and `export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH`"),
            )
        });
    }
    out.push(match &f.mps_control {
        Some(p) => c("MPS", Ok, p.clone()),
        None => c(
            "MPS",
            Warn,
            "nvidia-cuda-mps-control not found — the mps strategy will be unavailable; fix: install the driver's MPS binaries or add their directory to PATH".into(),
        ),
    });
    for g in &f.inventory.gpus {
        let (verdict, detail) = match crate::backend::local::strategy::mig_unavailable_reason(g) {
            None => (
                Ok,
                format!("GPU {}: MIG enabled, {} MIG device(s)", g.index, g.mig_devices.len()),
            ),
            Some(reason) => (Warn, format!("the mig strategy will be unavailable: {reason}")),
        };
        out.push(c("MIG", verdict, detail));
        if let Some(m) = &g.compute_mode {
            out.push(c(
                "compute mode",
                Ok,
                format!("GPU {}: {m} (read only; gpushare-bench never changes it)", g.index),
            ));
        }
    }
    out.push(if f.inventory.nvml {
        c(
            "NVML telemetry",
            Ok,
            "utilisation, memory, power and energy are recorded per cell".into(),
        )
    } else {
        c(
            "NVML telemetry",
            Warn,
            "NVML not available — GPU telemetry columns will be empty".into(),
        )
    });
    out.push(match &f.workload {
        Result::Ok(w) => c("workload binary", Ok, w.clone()),
        Err(e) => c("workload binary", Fail, e.clone()),
    });
    out.push(match &f.prometheus {
        Some(v) => c("Prometheus", Ok, format!("{v} (for --prometheus spawn)")),
        None => c(
            "Prometheus",
            Warn,
            "`prometheus` not on PATH — only needed for --prometheus spawn; fix: `apt-get install prometheus`".into(),
        ),
    });
    out.push(match &f.kubernetes {
        Some(std::result::Result::Ok(k)) => c("Kubernetes context", Ok, k.clone()),
        Some(std::result::Result::Err(e)) => c(
            "Kubernetes context",
            Warn,
            format!("{e} — only needed for --backend kubernetes; fix: point KUBECONFIG at a kubeconfig file"),
        ),
        None => c(
            "Kubernetes context",
            Warn,
            "no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a cluster — only needed for --backend kubernetes"
                .into(),
        ),
    });
    out
}

/// What a kubeconfig file holds, in words; `Err` when it is not a kubeconfig at all.
pub fn kubeconfig_summary(path: &str) -> std::result::Result<String, String> {
    let first = path.split(':').next().unwrap_or(path);
    let config = kube::config::Kubeconfig::read_from(first).map_err(|e| format!("{first} is not a kubeconfig: {e}"))?;
    match config.current_context {
        Some(ctx) => Ok(format!("{first} (context {ctx})")),
        None if config.contexts.is_empty() => Err(format!("{first} has no context")),
        None => Ok(format!(
            "{first} (no current context; {} contexts)",
            config.contexts.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_that_is_not_one_says_so() {
        let dir = tempfile::tempdir().expect("tmp");
        let garbage = dir.path().join("config");
        std::fs::write(&garbage, [0u8, 159, 146, 150, 255, 10, 1, 2]).expect("write");
        let e = kubeconfig_summary(&garbage.to_string_lossy()).expect_err("garbage");
        assert!(e.contains("is not a kubeconfig"), "{e}");
        let ok = dir.path().join("ok");
        std::fs::write(
            &ok,
            "apiVersion: v1\nkind: Config\ncurrent-context: lab\ncontexts:\n- name: lab\n  context: {cluster: c, user: u}\nclusters: []\nusers: []\n",
        )
        .expect("write");
        assert!(
            kubeconfig_summary(&ok.to_string_lossy())
                .expect("valid")
                .contains("context lab")
        );
    }

    #[test]
    fn a_machine_without_a_gpu_fails_with_fixes() {
        let f = Facts {
            inventory: GpuInventory::default(),
            libcuda: false,
            cublaslt: false,
            nvrtc: false,
            mps_control: None,
            workload: Err("cannot find".into()),
            prometheus: None,
            kubernetes: None,
        };
        let lines: Vec<String> = checks(&f).iter().map(|c| c.to_string()).collect();
        assert!(
            lines[0].starts_with("FAIL  GPU and driver") && lines[0].contains("fix:"),
            "{}",
            lines[0]
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("FAIL  cuBLASLt") && l.contains("LD_LIBRARY_PATH"))
        );
        assert!(lines.iter().any(|l| l.starts_with("warn  MPS")));
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("warn  Prometheus") && l.contains("apt-get install prometheus"))
        );
    }

    #[test]
    fn every_gpu_of_a_two_gpu_host_is_listed_with_what_runs_on_it() {
        use crate::telemetry::inventory::GpuProcess;
        use crate::telemetry::inventory::tests::{TWO, host};
        let mut inventory = host(TWO);
        inventory.gpus[1].processes = vec![GpuProcess {
            pid: 31337,
            name: Some("vllm".into()),
            used_memory_bytes: Some(70 << 30),
        }];
        let f = Facts {
            inventory,
            libcuda: true,
            cublaslt: true,
            nvrtc: true,
            mps_control: Some("/usr/bin/nvidia-cuda-mps-control".into()),
            workload: Ok("gpushare-workload 0.1.0".into()),
            prometheus: None,
            kubernetes: None,
        };
        let lines: Vec<String> = checks(&f).iter().map(|c| c.to_string()).collect();
        let gpus: Vec<&String> = lines.iter().filter(|l| l[6..].starts_with("GPU  ")).collect();
        assert_eq!(gpus.len(), 2, "{lines:#?}");
        assert_eq!(
            gpus[0].as_str(),
            "ok    GPU                    GPU 0: NVIDIA H200 (GPU-3f6a9b21-c4d8-4e07-8a15-92b0d7e3f611, bus 00000000:18:00.0), 80 GiB, MIG disabled, compute mode Default; idle"
        );
        assert!(
            gpus[1].starts_with("warn  GPU                    GPU 1: NVIDIA H200 (GPU-4e7b0c32")
                && gpus[1].contains("busy: 31337 vllm (71680 MiB)")
                && gpus[1].contains("--allow-busy-gpu"),
            "{}",
            gpus[1]
        );
    }
}
