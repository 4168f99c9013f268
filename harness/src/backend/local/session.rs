//! Opening a local sweep: resolve `--device`, find the workload and MPS binaries, read
//! the GPUs, open the run directory (new or resumed) and build the [`LocalBackend`] from
//! the recorded plan. Also `--dry-run` for the local backend.

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::local::strategy::{CellPlan, MpsDirs, plan_cell};
use crate::backend::local::{LocalBackend, WorkloadCommand, find_workload, mps};
use crate::backend::{Lane, Session};
use crate::config::plan::{DeviceChoice, LocalPlan, SweepPlan};
use crate::domain::{DeviceKind, Source};
use crate::error::{BenchError, Result};
use crate::process::supervisor;
use crate::results::record::{GpuRecord, PlanRecord};
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
    let (mut lanes, others) = chosen_gpus(probed, &[selector.cloned()], "--gpu")?;
    Ok((lanes.remove(0), others))
}

/// One inventory per selector, each holding only its GPU (a `--gpus` run's lanes, in
/// the order given), and the lines of the GPUs none of them names; a GPU named twice
/// (by index and UUID) is refused (pure). `flag` names the selectors in errors.
pub fn chosen_gpus(
    probed: &GpuInventory,
    selectors: &[Option<GpuSelector>],
    flag: &str,
) -> Result<(Vec<GpuInventory>, Vec<String>)> {
    let mut lanes: Vec<GpuInventory> = Vec::new();
    for selector in selectors {
        let given = selector.as_ref().map_or("0".into(), ToString::to_string);
        let inventory =
            narrow_to(probed, selector.as_ref()).map_err(|reason| BenchError::flag(flag, &given, reason))?;
        if let Some(g) = inventory.gpus.first()
            && lanes.iter().any(|l| l.gpus.first().is_some_and(|o| o.uuid == g.uuid))
        {
            return Err(BenchError::flag(
                flag,
                &given,
                format!("names {} a second time: give each GPU once", g.line()),
            ));
        }
        lanes.push(inventory);
    }
    let chosen: Vec<&str> = lanes
        .iter()
        .filter_map(|l| l.gpus.first())
        .map(|g| g.uuid.as_str())
        .collect();
    let others = probed
        .gpus
        .iter()
        .filter(|g| !chosen.contains(&g.uuid.as_str()))
        .map(GpuInfo::line)
        .collect();
    Ok((lanes, others))
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

/// The GPU a resumed run measures (pure): the one it recorded, by UUID, when it
/// recorded one (a run since `--gpu` records only the GPU it measured), else what its
/// plan asked for (older runs list every GPU and measured GPU 0).
pub fn resumed_gpu(recorded: &[GpuRecord], asked: Option<&GpuSelector>) -> Option<GpuSelector> {
    match recorded {
        [one] => Some(GpuSelector::Uuid(one.uuid.clone())),
        _ => asked.cloned(),
    }
}

/// The GPUs a resumed run measures, one per lane (pure): a `--gpus` run's by the UUIDs
/// it recorded in the order of its lanes, else the one of [`resumed_gpu`].
pub fn resumed_gpus(recorded: &[GpuRecord], plan: &PlanRecord) -> Vec<Option<GpuSelector>> {
    match plan.gpus.as_slice() {
        [] => vec![resumed_gpu(recorded, plan.gpu.as_ref())],
        asked if asked.len() == recorded.len() => recorded
            .iter()
            .map(|g| Some(GpuSelector::Uuid(g.uuid.clone())))
            .collect(),
        asked => asked.iter().cloned().map(Some).collect(),
    }
}

/// Opens a local run of one GPU (a new run, or `resume`): `capacity` and `isolation`,
/// which measure one GPU.
pub fn open(plan: &SweepPlan, local: &LocalPlan, resume: Option<&str>) -> Result<Session<LocalBackend>> {
    let (session, _, lanes) = open_lanes(plan, local, resume)?;
    if !lanes.is_empty() {
        return Err(BenchError::Results {
            path: session.store.dir().join("run.json"),
            reason: "plan.gpus names several GPUs, which only a sweep spreads its cells over".into(),
        });
    }
    Ok(session)
}

/// Opens a local sweep (a new run, or `resume`): the session of its first GPU and, for
/// `--gpus`, a [`Lane`] for each other GPU.
pub fn open_lanes(
    plan: &SweepPlan,
    local: &LocalPlan,
    resume: Option<&str>,
) -> Result<(Session<LocalBackend>, u32, Vec<Lane<LocalBackend>>)> {
    let probed = crate::telemetry::nvml::probe();
    // A server of the user's own runs under sh; gpushare-workload is needed only for
    // an isolation run's aggressors beside it.
    let workload = match (&plan.workload_cmd, plan.kind.isolation()) {
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
    let (flag, asked): (&str, Vec<Option<GpuSelector>>) = if local.gpus.is_empty() {
        ("--gpu", vec![local.gpu.clone()])
    } else {
        ("--gpus", local.gpus.iter().cloned().map(Some).collect())
    };
    // A new run measures the GPUs --gpu or --gpus name, refused before its directory
    // exists when other processes use one; a resumed run the GPUs its record names.
    let (lanes, other_gpus, gpu_processes) = match device {
        DeviceKind::Cuda => {
            let (lanes, others) = chosen_gpus(&probed, &asked, flag)?;
            same_kind(&lanes)?;
            let mut processes = Vec::new();
            for l in &lanes {
                processes.extend(check_busy(l.gpus.first(), local.allow_busy_gpu)?);
            }
            (lanes, others, processes)
        }
        DeviceKind::Cpu if resume.is_none() && asked.iter().any(Option::is_some) => {
            let given = asked
                .iter()
                .flatten()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",");
            return Err(BenchError::flag(
                flag,
                &given,
                "this run has no GPU (--device cpu, or no usable GPU with --device auto)",
            ));
        }
        DeviceKind::Cpu => (vec![probed.clone()], Vec::new(), Vec::new()),
    };
    let measured = GpuInventory {
        gpus: lanes.iter().filter_map(|l| l.gpus.first().cloned()).collect(),
        ..probed.clone()
    };
    let short = short_device_name(device, &measured);
    let env = || {
        let mut e = host::environment(&measured, &workload.display().to_string(), mps_control.as_deref());
        e.other_gpus = other_gpus.clone();
        e.gpu_processes = gpu_processes.clone();
        if let Some(cmd) = &plan.workload_cmd {
            e.workload = match plan.kind.isolation() {
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
        let journal = supervisor::read_journal(store.dir()).map_err(|reason| BenchError::Results {
            path: supervisor::journal_path(store.dir()),
            reason,
        })?;
        if let Some(why) = journal.foreign {
            notes.push(why.to_string());
        }
        let mut left = journal.entries;
        // Groups prove themselves by their token; a daemon only by a pipe directory
        // this run made.
        left.retain(|e| matches!(e, supervisor::Entry::Group { .. }) || super::mps::is_runs_daemon(store.dir(), e));
        let stopped = supervisor::clean_up(&left, Duration::from_secs(3));
        if !stopped.is_empty() {
            notes.push(format!(
                "stopped what the interrupted run left running: {}",
                stopped.join(", ")
            ));
        }
        let on_disk = match store.run().kind.isolation() {
            Some(_) => format!("{} trials", store.isolation().len()),
            None => format!("{} cells", store.cell_count()),
        };
        notes.push(format!(
            "resuming {} ({on_disk} on disk); its recorded plan is used",
            store.dir().display()
        ));
    }
    // A resumed GPU run measures the GPUs it recorded (by UUID when it recorded them),
    // and refuses one that other processes now use.
    let lanes = match (resume, recorded.device) {
        (Some(_), DeviceKind::Cuda) => {
            let selectors = resumed_gpus(&store.run().environment.gpus, &recorded);
            let flag = if recorded.gpus.is_empty() { "--gpu" } else { "--gpus" };
            let (lanes, _) = chosen_gpus(&probed, &selectors, flag)?;
            for l in &lanes {
                let now = l.gpus.first().map(|g| GpuInfo {
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
            }
            lanes
        }
        _ => lanes,
    };
    supervisor::journal_to(store.dir());
    if let Some(l) = &store.run().label {
        notes.push(format!("\n*** {l} ***\n"));
    }
    let command = WorkloadCommand {
        custom: recorded.workload_cmd.clone(),
        ready_path: recorded.ready_path.clone(),
        metric: recorded.metric.clone(),
        ..WorkloadCommand::builtin(workload, recorded.workload_args())
    };
    // Each GPU its backend (pods on their own ports: --base-port leaves room for the
    // largest cell of every GPU before it) and its telemetry.
    let stride = recorded.pods.iter().copied().max().unwrap_or(1);
    let labels = lane_labels(&store.run().environment.gpus, &lanes);
    let mut lanes = lanes
        .into_iter()
        .zip(labels)
        .enumerate()
        .map(|(i, (inventory, label))| {
            let gpu_index = inventory.gpus.first().map_or(0, |g| g.index);
            let telemetry: Arc<dyn Telemetry> = match (recorded.device, NvmlTelemetry::open(gpu_index)) {
                (DeviceKind::Cuda, Some(t)) => Arc::new(t),
                _ => Arc::new(NoTelemetry),
            };
            let base_port = local.base_port.map(|b| lane_base_port(b, i, stride));
            let backend = LocalBackend::new(
                command.clone(),
                recorded.device,
                inventory,
                store.dir(),
                mps_control.clone(),
            )
            .with_base_port(base_port);
            Lane {
                gpu: label,
                backend,
                telemetry,
            }
        });
    let first = lanes.next().ok_or_else(|| BenchError::Results {
        path: store.dir().join("run.json"),
        reason: "no GPU to measure".into(),
    })?;
    let more: Vec<Lane<LocalBackend>> = lanes.collect();
    let session = Session {
        backend: first.backend,
        metrics: recorded.prometheus_setting(),
        telemetry: first.telemetry,
        settings: recorded.measure_settings(plan.measure.ready_timeout),
        store,
        notes,
        keep_alive: Vec::new(),
    };
    Ok((session, first.gpu, more))
}

/// The GPU numbers a `--gpus` run's rows carry, one per lane (pure): a resumed run's as
/// it recorded them (`environment.gpus`, in lane order), so that its rows keep naming
/// each GPU alike after the host renumbered them (each lane is found by its UUID);
/// a new run's as the host numbers them.
pub fn lane_labels(recorded: &[GpuRecord], lanes: &[GpuInventory]) -> Vec<u32> {
    let now = lanes.iter().map(|l| l.gpus.first().map_or(0, |g| g.index));
    if recorded.len() == lanes.len()
        && recorded
            .iter()
            .zip(lanes)
            .all(|(r, l)| l.gpus.first().is_some_and(|g| g.uuid == r.uuid))
    {
        recorded.iter().map(|r| r.index).collect()
    } else {
        now.collect()
    }
}

/// Refuses `--gpus` over GPUs that differ in model or MIG mode (pure): their strategies
/// would be measured on different hardware and set side by side in one table.
pub fn same_kind(lanes: &[GpuInventory]) -> Result<()> {
    let gpus: Vec<&GpuInfo> = lanes.iter().filter_map(|l| l.gpus.first()).collect();
    let Some(first) = gpus.first() else { return Ok(()) };
    if gpus
        .iter()
        .all(|g| g.name == first.name && g.mig_enabled == first.mig_enabled)
    {
        return Ok(());
    }
    let mig = |g: &GpuInfo| match g.mig_enabled {
        Some(true) => "MIG on",
        Some(false) => "MIG off",
        None => "no MIG",
    };
    let listed: Vec<String> = gpus
        .iter()
        .map(|g| format!("GPU {} {} ({})", g.index, g.name, mig(g)))
        .collect();
    let given: Vec<String> = gpus.iter().map(|g| g.index.to_string()).collect();
    Err(BenchError::flag(
        "--gpus",
        &given.join(","),
        format!(
            "the GPUs differ ({}): each strategy would be measured on other hardware; give GPUs of one model and MIG mode",
            listed.join("; ")
        ),
    ))
}

/// The first fixed port of lane `lane`'s pods (pure): `base` for the first GPU, then
/// `stride` (the largest cell's pods) further for each GPU after it, saturating.
pub fn lane_base_port(base: u16, lane: usize, stride: u32) -> u16 {
    let offset = u32::try_from(lane).unwrap_or(u32::MAX).saturating_mul(stride);
    u16::try_from(u32::from(base).saturating_add(offset)).unwrap_or(u16::MAX)
}

/// What a local sweep would start, cell by cell (pure apart from reading the GPUs).
/// A device or GPU the run would refuse is refused here too, with the same error.
pub fn dry_run(plan: &SweepPlan, local: &LocalPlan) -> Result<String> {
    let probed = crate::telemetry::nvml::probe();
    let device = resolve_device(plan.device, &probed, libcuda_present())?;
    let inventory = match device {
        // A --gpus run's cells are shown as its first GPU runs them.
        DeviceKind::Cuda => chosen_gpu(&probed, local.gpus.first().or(local.gpu.as_ref()))?.0,
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
    for arm in record.arms() {
        for &n in &record.pods {
            let _ = writeln!(out, "{} × {n}:", arm.title());
            match plan_cell(arm.strategy, n, device, &inventory, (mps.as_ref(), arm.mps)) {
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
    Ok(out)
}

#[cfg(test)]
mod gpu_tests {
    use super::*;
    use crate::telemetry::inventory::GpuProcess;
    use crate::telemetry::inventory::tests::{EIGHT, TWO, host};

    #[test]
    fn a_run_records_its_gpu_and_the_others_and_resumes_on_the_same_one() {
        let probed = host(EIGHT);
        let (inv, others) = chosen_gpu(&probed, Some(&GpuSelector::Index(6))).expect("GPU 6");
        assert_eq!(inv.gpus.len(), 1);
        assert_eq!(others.len(), 7);
        assert!(
            others[0].starts_with("GPU 0: NVIDIA H100 80GB HBM3 (GPU-0a1e3c55"),
            "{others:?}"
        );
        let e = chosen_gpu(&probed, Some(&GpuSelector::Index(9))).expect_err("no GPU 9");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().starts_with("bad --gpu `9`: there is no GPU 9"), "{e}");
        // A resumed run finds its GPU by the UUID it recorded, even if indices moved.
        let recorded = vec![inv.gpus[0].record()];
        let again = resumed_gpu(&recorded, Some(&GpuSelector::Index(6))).expect("selector");
        assert_eq!(
            again,
            GpuSelector::Uuid("GPU-9fb14256-37ee-40a5-c146-b28d506f7e07".into())
        );
        let mut moved = probed.clone();
        moved.gpus.swap(6, 2);
        for (i, g) in moved.gpus.iter_mut().enumerate() {
            g.index = i as u32;
        }
        let (inv, _) = chosen_gpu(&moved, Some(&again)).expect("found by UUID");
        assert_eq!(inv.gpus[0].index, 2);
        // An older run recorded every GPU: its plan decides (none: GPU 0).
        let all: Vec<_> = probed.gpus.iter().map(|g| g.record()).collect();
        assert_eq!(resumed_gpu(&all, None), None);
    }

    #[test]
    fn gpus_of_an_eight_gpu_host_are_lanes_in_the_order_given_each_once() {
        let probed = host(EIGHT);
        // GPU 0 and 1's UUIDs share their first 36 characters: a prefix must go past them.
        let gpu0 = "GPU-0a1e3c55-7d21-4f0b-9c3e-1b2a64f0c001";
        let asked = [Some(GpuSelector::Index(5)), Some(GpuSelector::Uuid(gpu0.into()))];
        let (lanes, others) = chosen_gpus(&probed, &asked, "--gpus").expect("two GPUs");
        let idx: Vec<u32> = lanes.iter().map(|l| l.gpus[0].index).collect();
        assert_eq!(idx, [5, 0]);
        assert!(lanes.iter().all(|l| l.gpus.len() == 1), "each lane sees its GPU only");
        assert_eq!(others.len(), 6);
        assert!(
            !others
                .iter()
                .any(|o| o.starts_with("GPU 5:") || o.starts_with("GPU 0:")),
            "{others:?}"
        );
        // The same GPU by index and by UUID is refused, naming it.
        let twice = [Some(GpuSelector::Index(0)), Some(GpuSelector::Uuid(gpu0.into()))];
        let e = chosen_gpus(&probed, &twice, "--gpus").expect_err("twice");
        assert!(
            e.to_string().starts_with(&format!(
                "bad --gpus `{gpu0}`: names GPU 0: NVIDIA H100 80GB HBM3 ({gpu0}"
            )),
            "{e}"
        );
        assert!(e.to_string().ends_with("a second time: give each GPU once"), "{e}");
        let e = chosen_gpus(
            &host(TWO),
            &[Some(GpuSelector::Index(0)), Some(GpuSelector::Index(2))],
            "--gpus",
        )
        .expect_err("no GPU 2");
        assert!(e.to_string().starts_with("bad --gpus `2`: there is no GPU 2"), "{e}");
        // A resumed --gpus run finds its lanes by the UUIDs it recorded, in their order.
        let recorded: Vec<GpuRecord> = lanes.iter().map(|l| l.gpus[0].record()).collect();
        let mut plan = PlanRecord::from_plan(
            &SweepPlan::from_options(crate::config::options::SweepOptions::default()).expect("plan"),
            DeviceKind::Cuda,
            Source::Scrape,
        );
        plan.gpus = vec![GpuSelector::Index(5), GpuSelector::Index(0)];
        let again = resumed_gpus(&recorded, &plan);
        assert_eq!(again[0], Some(GpuSelector::Uuid(probed.gpus[5].uuid.clone())));
        assert_eq!(again[1], Some(GpuSelector::Uuid(probed.gpus[0].uuid.clone())));
        plan.gpus.clear();
        assert_eq!(
            resumed_gpus(&recorded[..1], &plan),
            [Some(GpuSelector::Uuid(probed.gpus[5].uuid.clone()))]
        );
    }

    #[test]
    fn a_resumed_run_names_its_gpus_as_it_recorded_them_and_mixed_gpus_are_refused() {
        let probed = host(EIGHT);
        let asked = [Some(GpuSelector::Index(2)), Some(GpuSelector::Index(6))];
        let (lanes, _) = chosen_gpus(&probed, &asked, "--gpus").expect("two GPUs");
        let recorded: Vec<GpuRecord> = lanes.iter().map(|l| l.gpus[0].record()).collect();
        assert_eq!(lane_labels(&recorded, &lanes), [2, 6]);
        // The host renumbered its GPUs: the lanes are found by UUID and keep their names.
        let mut moved = probed.clone();
        moved.gpus.swap(6, 1);
        moved.gpus.swap(2, 5);
        for (i, g) in moved.gpus.iter_mut().enumerate() {
            g.index = i as u32;
        }
        let by_uuid: Vec<Option<GpuSelector>> = recorded
            .iter()
            .map(|r| Some(GpuSelector::Uuid(r.uuid.clone())))
            .collect();
        let (now, _) = chosen_gpus(&moved, &by_uuid, "--gpus").expect("found");
        assert_eq!(now.iter().map(|l| l.gpus[0].index).collect::<Vec<_>>(), [5, 1]);
        assert_eq!(lane_labels(&recorded, &now), [2, 6], "the rows' names, not today's");
        // A new run (nothing recorded yet) names them as the host does.
        assert_eq!(lane_labels(&[], &now), [5, 1]);
        // GPUs of one model: accepted; another model or MIG mode: refused, naming both.
        assert!(same_kind(&lanes).is_ok());
        let mut mixed = lanes.clone();
        mixed[1].gpus[0].name = "NVIDIA A100-SXM4-80GB".into();
        let e = same_kind(&mixed).expect_err("mixed models").to_string();
        assert!(
            e.starts_with("bad --gpus `2,6`: the GPUs differ (GPU 2 NVIDIA H100 80GB HBM3"),
            "{e}"
        );
        assert!(e.contains("GPU 6 NVIDIA A100-SXM4-80GB"), "{e}");
        let mut mig = lanes.clone();
        mig[0].gpus[0].mig_enabled = Some(true);
        mig[1].gpus[0].mig_enabled = Some(false);
        assert!(
            same_kind(&mig)
                .expect_err("MIG on one")
                .to_string()
                .contains("(MIG on)")
        );
    }

    #[test]
    fn fixed_ports_leave_room_for_each_gpus_largest_cell() {
        assert_eq!(lane_base_port(9400, 0, 7), 9400);
        assert_eq!(lane_base_port(9400, 1, 7), 9407);
        assert_eq!(lane_base_port(9400, 7, 7), 9449);
        assert_eq!(
            lane_base_port(65530, 2, 7),
            u16::MAX,
            "saturates; binding it then fails by name"
        );
    }

    #[test]
    fn a_busy_gpu_stops_the_run_unless_allowed_and_then_is_recorded() {
        let mut inv = host(TWO);
        assert_eq!(check_busy(inv.gpus.first(), false).expect("idle"), Vec::<String>::new());
        inv.gpus[0].processes = vec![GpuProcess {
            pid: 9,
            name: Some("trainer".into()),
            used_memory_bytes: None,
        }];
        let e = check_busy(inv.gpus.first(), false).expect_err("busy");
        assert!(matches!(e, BenchError::GpuBusy { .. }), "{e:?}");
        assert_eq!(e.exit_code(), 1);
        assert!(e.to_string().contains("9 trainer"), "{e}");
        assert_eq!(
            check_busy(inv.gpus.first(), true).expect("allowed"),
            vec!["9 trainer".to_string()]
        );
        assert_eq!(check_busy(None, false).expect("no GPU"), Vec::<String>::new());
    }
}
