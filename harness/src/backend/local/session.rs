//! Opening a local sweep: resolve `--device`, find the workload and MPS binaries, read
//! the GPUs, open the run directory (new or resumed) and build the [`LocalBackend`] from
//! the recorded plan. Also `--dry-run` for the local backend.

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Session;
use crate::backend::local::strategy::{CellPlan, MpsDirs, plan_cell};
use crate::backend::local::{LocalBackend, WorkloadCommand, find_workload, mps};
use crate::config::plan::{DeviceChoice, SweepPlan};
use crate::domain::{DeviceKind, Source};
use crate::error::{BenchError, Result};
use crate::process::supervisor;
use crate::results::record::PlanRecord;
use crate::results::store::RunStore;
use crate::telemetry::inventory::{GpuSelector, busy_gpu_refusal, narrow_to};
use crate::telemetry::{GpuInfo, GpuInventory, NoTelemetry, NvmlTelemetry, Telemetry, host};

/// Whether the CUDA driver library can be loaded.
pub fn libcuda_present() -> bool {
    // SAFETY: dlopen/dlclose of a system library by name, nothing else.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY);
        if h.is_null() {
            false
        } else {
            libc::dlclose(h);
            true
        }
    }
}

/// Resolves `--device auto` (pure): a GPU when NVML lists one and libcuda loads.
pub fn resolve_device(choice: DeviceChoice, inventory: &GpuInventory, libcuda: bool) -> Result<DeviceKind> {
    match choice {
        DeviceChoice::Cpu => Ok(DeviceKind::Cpu),
        DeviceChoice::Cuda if inventory.gpus.is_empty() || !libcuda => Err(BenchError::flag(
            "--device",
            "cuda",
            "no usable NVIDIA GPU here (NVML lists none or libcuda is missing); use --device auto for the CPU smoke pipeline",
        )),
        DeviceChoice::Cuda => Ok(DeviceKind::Cuda),
        DeviceChoice::Auto if inventory.gpus.is_empty() || !libcuda => Ok(DeviceKind::Cpu),
        DeviceChoice::Auto => Ok(DeviceKind::Cuda),
    }
}

/// The short device name that default run ids carry ("h100", "cpu").
pub fn short_device_name(device: DeviceKind, inventory: &GpuInventory) -> String {
    match device {
        DeviceKind::Cuda => inventory.gpus.first().map_or("gpu".into(), |g| g.short_name()),
        DeviceKind::Cpu => "cpu".into(),
    }
}

/// The inventory a GPU run works with, only the GPU `selector` names (see
/// [`narrow_to`]), and the lines of the machine's other GPUs for the record (pure).
pub fn chosen_gpu(probed: &GpuInventory, selector: Option<&GpuSelector>) -> Result<(GpuInventory, Vec<String>)> {
    let inventory = narrow_to(probed, selector)
        .map_err(|reason| BenchError::flag("--gpu", &selector.map_or("0".into(), ToString::to_string), reason))?;
    let chosen = inventory.gpus.first().map(|g| g.uuid.as_str());
    let others = probed
        .gpus
        .iter()
        .filter(|g| Some(g.uuid.as_str()) != chosen)
        .map(GpuInfo::line)
        .collect();
    Ok((inventory, others))
}

/// Refuses a GPU other processes compute on, unless `allow` (pure): their work would
/// be measured as the cost of sharing. With `allow`, the processes for the record.
pub fn check_busy(gpu: Option<&GpuInfo>, allow: bool) -> Result<Vec<String>> {
    let Some(gpu) = gpu else { return Ok(Vec::new()) };
    match busy_gpu_refusal(gpu) {
        Some(detail) if !allow => Err(BenchError::GpuBusy { detail }),
        _ => Ok(gpu.processes.iter().map(ToString::to_string).collect()),
    }
}

/// Opens a local sweep (a new run, or `resume`).
pub fn open(plan: &SweepPlan, resume: Option<&str>) -> Result<Session<LocalBackend>> {
    let probed = crate::telemetry::nvml::probe();
    // A server of the user's own runs under sh; gpushare-workload is needed only for
    // an isolation run's aggressors beside it.
    let workload = match (&plan.workload_cmd, &plan.isolation) {
        (Some(_), None) => std::path::PathBuf::from("/bin/sh"),
        _ => find_workload(plan.workload_bin.as_deref())?,
    };
    let mps_control = mps::find_control();
    // When resuming, the recorded plan decides; the device only names a new run.
    let device = if resume.is_some() {
        DeviceKind::Cpu
    } else {
        resolve_device(plan.device, &probed, libcuda_present())?
    };
    // A new run measures the GPU --gpu names, refused before its directory exists when
    // other processes use it; a resumed run the GPU its record names (below).
    let (inventory, other_gpus, gpu_processes) = match device {
        DeviceKind::Cuda => {
            let (inventory, others) = chosen_gpu(&probed, plan.gpu.as_ref())?;
            let processes = check_busy(inventory.gpus.first(), plan.allow_busy_gpu)?;
            (inventory, others, processes)
        }
        DeviceKind::Cpu if resume.is_none() && plan.gpu.is_some() => {
            return Err(BenchError::flag(
                "--gpu",
                &plan.gpu.as_ref().map(ToString::to_string).unwrap_or_default(),
                "this run has no GPU (--device cpu, or no usable GPU with --device auto)",
            ));
        }
        DeviceKind::Cpu => (probed.clone(), Vec::new(), Vec::new()),
    };
    let short = short_device_name(device, &inventory);
    let env = || {
        let mut e = host::environment(&inventory, &workload.display().to_string(), mps_control.as_deref());
        e.other_gpus = other_gpus.clone();
        e.gpu_processes = gpu_processes.clone();
        if let Some(cmd) = &plan.workload_cmd {
            e.workload = match plan.isolation {
                Some(_) => format!("custom: {cmd}; aggressors: {}", workload.display()),
                None => format!("custom: {cmd}"),
            };
        }
        e
    };
    let store = RunStore::open_or_create(plan, resume, device, &short, env)?;
    let recorded = store.run().plan.clone();
    // The same --workload-cmd was given again (`sweep::recorded_backend`).
    let mut notes = Vec::new();
    if resume.is_some() {
        // Whatever a killed run left running (its supervisor killed too) is stopped
        // before anything is measured next to it; only provably ours (see supervisor).
        let left = supervisor::read_journal(store.dir()).map_err(|reason| BenchError::Results {
            path: supervisor::journal_path(store.dir()),
            reason,
        })?;
        let stopped = supervisor::clean_up(&left, Duration::from_secs(3));
        if !stopped.is_empty() {
            notes.push(format!(
                "stopped what the interrupted run left running: {}",
                stopped.join(", ")
            ));
        }
        let on_disk = match store.run().isolation {
            Some(_) => format!("{} trials", store.isolation().len()),
            None => format!("{} cells", store.cell_count()),
        };
        notes.push(format!(
            "resuming {} ({on_disk} on disk); its recorded plan is used",
            store.dir().display()
        ));
    }
    // A resumed GPU run measures the GPU it recorded (by UUID when it recorded one),
    // and refuses it when other processes now use it.
    let inventory = match (resume, recorded.device) {
        (Some(_), DeviceKind::Cuda) => {
            let env_gpus = &store.run().environment.gpus;
            let selector = match env_gpus.as_slice() {
                [one] => Some(GpuSelector::Uuid(one.uuid.clone())),
                _ => recorded.gpu.clone(),
            };
            let (inventory, _) = chosen_gpu(&probed, selector.as_ref())?;
            let now = inventory.gpus.first().map(|g| GpuInfo {
                processes: crate::telemetry::nvml::processes_on(&g.uuid),
                ..g.clone()
            });
            let busy = check_busy(now.as_ref(), recorded.allow_busy_gpu)?;
            if !busy.is_empty() {
                notes.push(format!(
                    "measuring beside other processes (--allow-busy-gpu): {}",
                    busy.join(", ")
                ));
            }
            inventory
        }
        _ => inventory,
    };
    supervisor::journal_to(store.dir());
    if let Some(l) = &store.run().label {
        notes.push(format!("\n*** {l} ***\n"));
    }
    let gpu_index = inventory.gpus.first().map_or(0, |g| g.index);
    let telemetry: Arc<dyn Telemetry> = match (recorded.device, NvmlTelemetry::open(gpu_index)) {
        (DeviceKind::Cuda, Some(t)) => Arc::new(t),
        _ => Arc::new(NoTelemetry),
    };
    let command = WorkloadCommand {
        custom: recorded.workload_cmd.clone(),
        ready_path: recorded.ready_path.clone(),
        metric: recorded.metric.clone(),
        ..WorkloadCommand::builtin(workload, recorded.workload_args())
    };
    let backend =
        LocalBackend::new(command, recorded.device, inventory, store.dir(), mps_control).with_base_port(plan.base_port);
    Ok(Session {
        backend,
        metrics: recorded.prometheus_setting(),
        telemetry,
        settings: recorded.measure_settings(plan.measure.ready_timeout),
        store,
        notes,
        keep_alive: Vec::new(),
    })
}

/// What a local sweep would start, cell by cell (pure apart from reading the GPUs).
pub fn dry_run(plan: &SweepPlan) -> String {
    let probed = crate::telemetry::nvml::probe();
    let device = resolve_device(plan.device, &probed, libcuda_present()).unwrap_or(DeviceKind::Cpu);
    let inventory = match device {
        DeviceKind::Cuda => match chosen_gpu(&probed, plan.gpu.as_ref()) {
            Ok((inventory, _)) => inventory,
            Err(e) => return format!("{e}\n"),
        },
        DeviceKind::Cpu => probed,
    };
    let record = PlanRecord::from_plan(plan, device, Source::Scrape);
    let gpu = (device == DeviceKind::Cuda).then(|| inventory.gpus.first()).flatten();
    let mps = mps::find_control().map(|_| MpsDirs {
        pipe: "<run>/mps/<cell>/pipe".into(),
        log: "<run>/mps/<cell>/log".into(),
        gpu: gpu.map(|g| g.uuid.clone()),
    });
    let mut out = match gpu {
        Some(g) => format!("on {}\n", g.line()),
        None => String::new(),
    };
    out += &match &record.workload_cmd {
        Some(cmd) => format!("sh -c {cmd:?} (per pod, {{port}} its port; PORT, POD, STRATEGY set)\n"),
        None => format!("gpushare-workload {}\n", record.workload_args().join(" ")),
    };
    if let Some(r) = &record.request {
        let what = match &r.body {
            Some(b) => format!("POST {} with {} ({} bytes)", r.url, b.display(), r.body_bytes),
            None => format!("GET {}", r.url),
        };
        let _ = writeln!(
            out,
            "requests: {what}, per pod, --load {}; timed by the harness",
            record.load
        );
    }
    for &s in &record.strategies {
        for &n in &record.pods {
            let _ = writeln!(out, "{} × {n}:", s.title());
            match plan_cell(s, n, device, &inventory, mps.as_ref()) {
                CellPlan::Unavailable(r) => {
                    let _ = writeln!(out, "  unavailable: {r}");
                }
                CellPlan::Pods(pods) => {
                    for p in pods {
                        match p.pending {
                            Some(r) => {
                                let _ = writeln!(out, "  {}: pending ({r})", p.name);
                            }
                            None => {
                                let env: Vec<String> = p.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
                                let _ = writeln!(out, "  {}: {}", p.name, env.join(" "));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}
