//! What each sharing strategy means for the pods of one cell, decided without touching
//! anything: environment variables, which pods can run, and why a strategy is
//! unavailable. The local backend and the tests use these pure functions.

use crate::domain::{DeviceKind, Strategy};
use crate::telemetry::{GpuInfo, GpuInventory};

/// One pod of a cell as planned.
#[derive(Debug, Clone, PartialEq)]
pub struct PodPlan {
    /// Index within the cell.
    pub index: u32,
    /// Name (the `pod` label).
    pub name: String,
    /// Extra environment for the workload process.
    pub env: Vec<(String, String)>,
    /// Why the pod cannot start (it is recorded `pending`), or None when it runs.
    pub pending: Option<String>,
}

/// The pods of one cell, or why the strategy cannot run.
#[derive(Debug, Clone, PartialEq)]
pub enum CellPlan {
    /// Run these pods (some may be pending).
    Pods(Vec<PodPlan>),
    /// The strategy cannot run on this machine.
    Unavailable(String),
}

/// Where the MPS clients find their control daemon.
#[derive(Debug, Clone, PartialEq)]
pub struct MpsDirs {
    /// CUDA_MPS_PIPE_DIRECTORY.
    pub pipe: String,
    /// CUDA_MPS_LOG_DIRECTORY.
    pub log: String,
    /// The GPU (UUID) the daemon is started on, as its CUDA_VISIBLE_DEVICES (None: what
    /// CUDA sees).
    pub gpu: Option<String>,
}

/// The pod name of index `i`.
pub fn pod_name(i: u32) -> String {
    format!("pod-{i}")
}

/// MPS client limits for `replicas` clients: by default (`auto`) as the NVIDIA device
/// plugin sets them, an equal share of the SMs (`floor(100 / replicas)` percent) and of
/// device memory (`total / replicas`, in MiB, pinned on device 0); `limits` may give
/// another share of the SMs, another memory limit or none.
pub fn mps_client_env(
    replicas: u32,
    memory_total_bytes: Option<u64>,
    limits: crate::domain::MpsLimits,
    dirs: &MpsDirs,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("CUDA_MPS_PIPE_DIRECTORY".to_string(), dirs.pipe.clone()),
        ("CUDA_MPS_LOG_DIRECTORY".to_string(), dirs.log.clone()),
        (
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(),
            limits.threads.percent(replicas).to_string(),
        ),
    ];
    if let Some(mib) = limits.memory.mebibytes(replicas, memory_total_bytes) {
        env.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(), format!("0={mib}M")));
    }
    env
}

/// A typical smallest MIG profile for a GPU of this memory size (for the hint text).
fn smallest_profile(gpu: &GpuInfo) -> &'static str {
    match gpu.memory_total_bytes.map(|b| b / (1 << 30)) {
        Some(g) if g >= 130 => "1g.18gb",
        Some(g) if g >= 90 => "1g.12gb",
        Some(g) if g >= 70 => "1g.10gb",
        Some(g) if g >= 35 => "1g.5gb",
        Some(g) if g >= 20 => "1g.6gb",
        _ => "<smallest profile from `nvidia-smi mig -lgip`>",
    }
}

/// Why MIG cannot run on `gpu`, with the admin commands that would enable it.
pub fn mig_unavailable_reason(gpu: &GpuInfo) -> Option<String> {
    let p = smallest_profile(gpu);
    let i = gpu.index;
    let create = format!(
        "create instances with `sudo nvidia-smi mig -i {i} -cgi {p},{p},{p},{p},{p},{p},{p} -C` (profiles: `nvidia-smi mig -lgip`)"
    );
    match gpu.mig_enabled {
        None => Some(format!(
            "GPU {i} ({}) does not support MIG (MIG needs an A100, A30, H100, H200 or newer data-center GPU)",
            gpu.name
        )),
        Some(false) => Some(format!(
            "MIG mode is Disabled on GPU {i} ({}); gpushare-bench never changes GPU settings. An administrator can enable it with `sudo nvidia-smi -i {i} -mig 1` (no processes may use the GPU; some systems need a GPU reset or reboot), then {create}",
            gpu.name
        )),
        Some(true) if gpu.mig_devices.is_empty() => Some(format!(
            "MIG mode is Enabled on GPU {i} ({}) but no MIG devices exist; an administrator can {create}",
            gpu.name
        )),
        Some(true) => None,
    }
}

/// Plans the pods of one cell of `strategy` with `pods` pods; `mps` is where MPS's
/// clients find its daemon (None: no MPS here) and the limits each gets.
pub fn plan_cell(
    strategy: Strategy,
    pods: u32,
    device: DeviceKind,
    inventory: &GpuInventory,
    mps: (Option<&MpsDirs>, crate::domain::MpsLimits),
) -> CellPlan {
    let (mps, limits) = mps;
    let gpu = inventory.gpus.first();
    if device == DeviceKind::Cpu && strategy != Strategy::TimeSlicing {
        return CellPlan::Unavailable(format!(
            "{} needs a GPU; the CPU smoke pipeline runs time-slicing only",
            strategy.title()
        ));
    }
    // On a GPU run every pod is pinned to the measured GPU by UUID (the inventory holds
    // only that one), whatever CUDA_VISIBLE_DEVICES the harness was started with; a MIG
    // pod to its MIG device instead.
    let visible: Vec<(String, String)> = match (device, gpu) {
        (DeviceKind::Cuda, Some(g)) => vec![("CUDA_VISIBLE_DEVICES".into(), g.uuid.clone())],
        _ => Vec::new(),
    };
    let plain = |i: u32| PodPlan {
        index: i,
        name: pod_name(i),
        env: visible.clone(),
        pending: None,
    };
    match strategy {
        Strategy::TimeSlicing => CellPlan::Pods((0..pods).map(plain).collect()),
        Strategy::Exclusive => CellPlan::Pods(
            (0..pods)
                .map(|i| PodPlan {
                    pending: (i > 0)
                        .then(|| "exclusive: one pod per GPU; without sharing the others stay Pending".to_string()),
                    ..plain(i)
                })
                .collect(),
        ),
        Strategy::Mps => {
            let Some(dirs) = mps else {
                return CellPlan::Unavailable("MPS: nvidia-cuda-mps-control was not found (install the NVIDIA driver's MPS binaries or put them on PATH)".into());
            };
            if let Some(g) = gpu.filter(|g| g.mig_enabled == Some(true)) {
                return CellPlan::Unavailable(format!(
                    "MPS: GPU {} is in MIG mode; run MPS on a GPU without MIG",
                    g.index
                ));
            }
            let mut env = visible.clone();
            env.extend(mps_client_env(
                pods,
                gpu.and_then(|g| g.memory_total_bytes),
                limits,
                dirs,
            ));
            CellPlan::Pods(
                (0..pods)
                    .map(|i| PodPlan {
                        env: env.clone(),
                        ..plain(i)
                    })
                    .collect(),
            )
        }
        Strategy::Mig => {
            let Some(gpu) = gpu else {
                return CellPlan::Unavailable("MIG: no NVIDIA GPU found (NVML did not answer)".into());
            };
            if let Some(reason) = mig_unavailable_reason(gpu) {
                return CellPlan::Unavailable(reason);
            }
            CellPlan::Pods(
                (0..pods)
                    .map(|i| match gpu.mig_devices.get(i as usize) {
                        Some(m) => PodPlan {
                            env: vec![("CUDA_VISIBLE_DEVICES".into(), m.uuid.clone())],
                            ..plain(i)
                        },
                        None => PodPlan {
                            env: Vec::new(),
                            pending: Some(format!(
                                "MIG: only {} MIG devices exist on GPU {}; one pod per device",
                                gpu.mig_devices.len(),
                                gpu.index
                            )),
                            ..plain(i)
                        },
                    })
                    .collect(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::MigDevice;
    use crate::telemetry::inventory::parse_nvidia_smi_list;

    fn h100(mig: Option<bool>, devices: usize) -> GpuInventory {
        GpuInventory {
            gpus: vec![GpuInfo {
                index: 0,
                name: "NVIDIA H100 80GB HBM3".into(),
                uuid: "GPU-1".into(),
                memory_total_bytes: Some(81_559 * 1024 * 1024),
                mig_enabled: mig,
                compute_mode: Some("Default".into()),
                mig_devices: (0..devices)
                    .map(|i| MigDevice {
                        profile: "1g.10gb".into(),
                        uuid: format!("MIG-{i}"),
                    })
                    .collect(),
                ..GpuInfo::default()
            }],
            driver_version: Some("580.159.04".into()),
            cuda_driver_version: Some("13.0".into()),
            nvml: true,
        }
    }

    fn dirs() -> MpsDirs {
        MpsDirs {
            pipe: "/r/mps/pipe".into(),
            log: "/r/mps/log".into(),
            gpu: None,
        }
    }

    fn env<'a>(p: &'a PodPlan, k: &str) -> Option<&'a str> {
        p.env.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn mps_splits_threads_and_memory_like_the_device_plugin() {
        let CellPlan::Pods(pods) = plan_cell(
            Strategy::Mps,
            7,
            DeviceKind::Cuda,
            &h100(Some(false), 0),
            (Some(&dirs()), Default::default()),
        ) else {
            panic!("MPS runs on a GPU without MIG")
        };
        assert_eq!(pods.len(), 7);
        assert!(pods.iter().all(|p| p.pending.is_none()));
        assert_eq!(env(&pods[3], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("14"));
        // 81559 MiB / 7 = 11651 MiB.
        assert_eq!(env(&pods[3], "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some("0=11651M"));
        assert_eq!(env(&pods[0], "CUDA_MPS_PIPE_DIRECTORY"), Some("/r/mps/pipe"));
        // An arm's own limits: every SM and no pinned memory, or a size of its own.
        use crate::domain::{MpsLimits, MpsMemory, MpsThreads};
        let with = |threads, memory| {
            let limits = MpsLimits { threads, memory };
            let CellPlan::Pods(p) = plan_cell(
                Strategy::Mps,
                7,
                DeviceKind::Cuda,
                &h100(Some(false), 0),
                (Some(&dirs()), limits),
            ) else {
                panic!("MPS runs")
            };
            (
                env(&p[3], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").map(str::to_string),
                env(&p[3], "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").map(str::to_string),
            )
        };
        assert_eq!(
            with(MpsThreads::Percent(100), MpsMemory::Unlimited),
            (Some("100".into()), None)
        );
        assert_eq!(
            with(MpsThreads::Auto, MpsMemory::Mebibytes(20480)),
            (Some("14".into()), Some("0=20480M".into()))
        );
        let CellPlan::Pods(one) = plan_cell(
            Strategy::Mps,
            1,
            DeviceKind::Cuda,
            &h100(None, 0),
            (Some(&dirs()), Default::default()),
        ) else {
            panic!()
        };
        assert_eq!(env(&one[0], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("100"));
        assert!(
            matches!(plan_cell(Strategy::Mps, 3, DeviceKind::Cuda, &h100(None, 0), (None, Default::default())), CellPlan::Unavailable(r) if r.contains("nvidia-cuda-mps-control"))
        );
    }

    #[test]
    fn mig_off_is_unavailable_with_the_admin_commands() {
        let CellPlan::Unavailable(reason) = plan_cell(
            Strategy::Mig,
            3,
            DeviceKind::Cuda,
            &h100(Some(false), 0),
            (None, Default::default()),
        ) else {
            panic!("MIG is off")
        };
        assert!(reason.contains("MIG mode is Disabled on GPU 0"), "{reason}");
        assert!(reason.contains("sudo nvidia-smi -i 0 -mig 1"), "{reason}");
        assert!(reason.contains("-cgi 1g.10gb,"), "{reason}");
        assert!(reason.contains("never changes GPU settings"), "{reason}");
        let CellPlan::Unavailable(none) = plan_cell(
            Strategy::Mig,
            1,
            DeviceKind::Cuda,
            &h100(Some(true), 0),
            (None, Default::default()),
        ) else {
            panic!()
        };
        assert!(none.contains("no MIG devices exist"), "{none}");
        let CellPlan::Unavailable(cap) = plan_cell(
            Strategy::Mig,
            1,
            DeviceKind::Cuda,
            &h100(None, 0),
            (None, Default::default()),
        ) else {
            panic!()
        };
        assert!(cap.contains("does not support MIG"), "{cap}");
    }

    #[test]
    fn mig_gives_each_pod_its_own_device_and_the_rest_wait() {
        let CellPlan::Pods(pods) = plan_cell(
            Strategy::Mig,
            5,
            DeviceKind::Cuda,
            &h100(Some(true), 3),
            (None, Default::default()),
        ) else {
            panic!("MIG devices exist")
        };
        assert_eq!(env(&pods[2], "CUDA_VISIBLE_DEVICES"), Some("MIG-2"));
        assert!(pods[2].pending.is_none());
        assert!(
            pods[3]
                .pending
                .as_deref()
                .is_some_and(|r| r.contains("only 3 MIG devices"))
        );
        assert!(pods[4].env.is_empty());
    }

    #[test]
    fn mig_devices_from_a_real_listing_plan_like_nvml_ones() {
        let listed = parse_nvidia_smi_list(
            "GPU 0: NVIDIA H200 (UUID: GPU-9)\n  MIG 1g.18gb     Device  0: (UUID: MIG-aa)\n  MIG 1g.18gb     Device  1: (UUID: MIG-bb)\n",
        );
        let inv = GpuInventory {
            gpus: listed,
            ..GpuInventory::default()
        };
        let CellPlan::Pods(pods) = plan_cell(Strategy::Mig, 2, DeviceKind::Cuda, &inv, (None, Default::default()))
        else {
            panic!()
        };
        assert_eq!(env(&pods[1], "CUDA_VISIBLE_DEVICES"), Some("MIG-bb"));
    }

    #[test]
    fn exclusive_runs_one_pod_and_cpu_runs_time_slicing_only() {
        let CellPlan::Pods(pods) = plan_cell(
            Strategy::Exclusive,
            3,
            DeviceKind::Cuda,
            &h100(None, 0),
            (None, Default::default()),
        ) else {
            panic!()
        };
        assert_eq!(pods.iter().filter(|p| p.pending.is_none()).count(), 1);
        assert_eq!(pods[2].name, "pod-2");
        assert!(
            matches!(plan_cell(Strategy::TimeSlicing, 3, DeviceKind::Cpu, &GpuInventory::default(), (None, Default::default())), CellPlan::Pods(p) if p.len() == 3)
        );
        assert!(matches!(
            plan_cell(
                Strategy::Mps,
                3,
                DeviceKind::Cpu,
                &GpuInventory::default(),
                (Some(&dirs()), Default::default())
            ),
            CellPlan::Unavailable(_)
        ));
    }

    #[test]
    fn every_pod_runs_on_the_chosen_gpu_of_an_eight_gpu_host() {
        use crate::telemetry::inventory::tests::{EIGHT, host};
        use crate::telemetry::inventory::{GpuSelector, narrow_to};
        let host = host(EIGHT);
        let gpu5 = narrow_to(&host, Some(&GpuSelector::Index(5))).expect("GPU 5");
        let uuid5 = "GPU-8ea03145-26dd-4f94-b035-a17c4f5e6d06";
        for strategy in [Strategy::TimeSlicing, Strategy::Exclusive, Strategy::Mps] {
            let CellPlan::Pods(pods) = plan_cell(
                strategy,
                3,
                DeviceKind::Cuda,
                &gpu5,
                (Some(&dirs()), Default::default()),
            ) else {
                panic!("{strategy:?}")
            };
            let running: Vec<_> = pods.iter().filter(|p| p.pending.is_none()).collect();
            assert!(!running.is_empty());
            for p in running {
                assert_eq!(env(p, "CUDA_VISIBLE_DEVICES"), Some(uuid5), "{strategy:?} {}", p.name);
            }
        }
        // MPS keeps its limits beside the pinning (device 0 is the one GPU it sees).
        let CellPlan::Pods(pods) = plan_cell(
            Strategy::Mps,
            3,
            DeviceKind::Cuda,
            &gpu5,
            (Some(&dirs()), Default::default()),
        ) else {
            panic!()
        };
        assert_eq!(env(&pods[0], "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some("0=27306M"));
        // GPU 3 is in MIG mode: its own MIG devices, and MPS refused naming it.
        let gpu3 = narrow_to(&host, Some(&GpuSelector::Index(3))).expect("GPU 3");
        let CellPlan::Pods(pods) = plan_cell(Strategy::Mig, 3, DeviceKind::Cuda, &gpu3, (None, Default::default()))
        else {
            panic!()
        };
        assert_eq!(
            env(&pods[1], "CUDA_VISIBLE_DEVICES"),
            Some("MIG-2e3d4c5b-6f70-5b8c-9dae-1f2a3b4c5d61")
        );
        assert!(
            pods[2]
                .pending
                .as_deref()
                .is_some_and(|r| r.contains("only 2 MIG devices exist on GPU 3"))
        );
        assert!(
            matches!(plan_cell(Strategy::Mps, 1, DeviceKind::Cuda, &gpu3, (Some(&dirs()), Default::default())), CellPlan::Unavailable(r) if r.contains("GPU 3 is in MIG mode"))
        );
        // GPU 0 of the same host is not in MIG mode: MIG is refused there, naming GPU 0.
        let gpu0 = narrow_to(&host, None).expect("GPU 0");
        assert!(
            matches!(plan_cell(Strategy::Mig, 1, DeviceKind::Cuda, &gpu0, (None, Default::default())), CellPlan::Unavailable(r) if r.contains("MIG mode is Disabled on GPU 0"))
        );
        // The CPU pipeline pins nothing.
        let CellPlan::Pods(pods) = plan_cell(
            Strategy::TimeSlicing,
            2,
            DeviceKind::Cpu,
            &GpuInventory::default(),
            (None, Default::default()),
        ) else {
            panic!()
        };
        assert!(pods.iter().all(|p| p.env.is_empty()));
    }
}
