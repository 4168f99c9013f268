//! The sweep: for each strategy, prepare it; for each pod count, launch the cell, measure
//! it, stop its pods and save its rows before the next cell starts; restore at the end
//! and on every failure path. SIGINT/SIGTERM stop the pods (and any MPS daemon) within
//! seconds and keep every finished cell.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Prepared};
use crate::domain::{CellStatus, DeviceKind, Source, Strategy};
use crate::error::{BenchError, Result};
use crate::gpu::{GpuInventory, NoTelemetry, NvmlTelemetry, Telemetry};
use crate::local::{LocalBackend, WorkloadCommand, find_workload};
use crate::measure::{CellLabels, MeasureSettings, empty_row, measure_cell, unavailable_rows};
use crate::plan::{BackendKind, DeviceChoice, PrometheusSetting, SweepPlan, default_run_id, validate_run_id};
use crate::progress::{Bars, Lines, Progress, Quiet};
use crate::prometheus::PrometheusSource;
use crate::record::{Environment, PlanRecord, RunRecord, Unavailable, now_rfc3339};
use crate::scrape::{MetricsSource, ScrapeSource};
use crate::store::RunStore;

/// The label every CPU smoke run carries, in run.json, on the terminal and in reports.
pub const CPU_SMOKE_LABEL: &str = "CPU SMOKE RUN: no usable GPU, so the tiny model ran on the CPU; these numbers test the pipeline and say nothing about GPU sharing";

/// The label of a run the user asked to run on the CPU.
pub const CPU_RUN_LABEL: &str = "CPU RUN (--device cpu): the workload ran on the CPU; not a GPU measurement";

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

/// The plan as recorded in run.json, after device resolution (the CPU smoke pipeline
/// narrows it to tiny, fp32, time-slicing).
pub fn plan_record(plan: &SweepPlan, device: DeviceKind, source: Source) -> PlanRecord {
    let smoke = device == DeviceKind::Cpu && plan.device == DeviceChoice::Auto;
    PlanRecord {
        backend: match plan.backend {
            BackendKind::Local => "local".into(),
            BackendKind::Kubernetes => "kubernetes".into(),
        },
        strategies: if smoke {
            vec![Strategy::TimeSlicing]
        } else {
            plan.strategies.clone()
        },
        pods: plan.pods.clone(),
        model: match (&plan.model, device) {
            (Some(m), _) if !smoke => m.clone(),
            (_, DeviceKind::Cpu) => "tiny".into(),
            (_, DeviceKind::Cuda) => "yolos-small".into(),
        },
        precision: match (device, &plan.precision) {
            (DeviceKind::Cpu, _) => "fp32".into(),
            (DeviceKind::Cuda, Some(p)) => p.clone(),
            (DeviceKind::Cuda, None) => "bf16".into(),
        },
        device,
        batch: plan.batch,
        warmup_s: plan.measure.warmup.as_secs_f64(),
        window_s: plan.measure.window.as_secs_f64(),
        max_cell_s: plan.measure.max_cell.as_secs_f64(),
        stable_windows: plan.measure.stable_windows as u32,
        tolerance: plan.measure.tolerance,
        source,
        prometheus: plan.prometheus.text(),
        workload_args: plan.workload_args.clone(),
    }
}

/// Measurement settings back from a recorded plan (for --resume).
pub fn settings_from_record(p: &PlanRecord, ready_timeout: std::time::Duration) -> MeasureSettings {
    use std::time::Duration;
    MeasureSettings {
        ready_timeout,
        warmup: Duration::from_secs_f64(p.warmup_s),
        window: Duration::from_secs_f64(p.window_s),
        max_cell: Duration::from_secs_f64(p.max_cell_s),
        stable_windows: p.stable_windows as usize,
        tolerance: p.tolerance,
    }
}

/// The workload arguments for a recorded plan.
pub fn workload_args(p: &PlanRecord) -> Vec<String> {
    let mut a = vec![
        "--model".to_string(),
        p.model.clone(),
        "--device".into(),
        p.device.name().into(),
        "--precision".into(),
        p.precision.clone(),
        "--batch".into(),
        p.batch.to_string(),
    ];
    a.extend(p.workload_args.iter().cloned());
    a
}

fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Records the machine: host, OS, CPU, GPUs and driver, MPS binary, versions.
pub fn environment(inventory: &GpuInventory, workload: &str, mps: Option<&Path>) -> Environment {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.into());
    Environment {
        hostname: command_line("hostname", &[]).unwrap_or_default(),
        os: command_line("uname", &["-srm"]).unwrap_or_else(|| std::env::consts::OS.into()),
        cpu,
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
        harness: format!("gpushare-bench {}", env!("CARGO_PKG_VERSION")),
        git_revision: command_line("git", &["describe", "--always", "--dirty", "--tags"]),
    }
}

/// Cancels `token` on SIGINT or SIGTERM.
pub fn cancel_on_signals(token: CancellationToken) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        token.cancel();
    });
}

/// What a finished sweep reports.
#[derive(Debug, Clone)]
pub struct SweepOutcome {
    /// The run directory.
    pub dir: PathBuf,
    /// Cells saved in this invocation.
    pub cells_run: usize,
    /// The run's label when it is not a GPU measurement.
    pub label: Option<String>,
}

fn progress_for(quiet: bool) -> Box<dyn Progress> {
    if quiet {
        Box::new(Quiet)
    } else if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        Box::new(Bars::new())
    } else {
        Box::new(Lines)
    }
}

/// Opens the run directory: a new run, or the one to resume (its recorded plan wins).
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_store(
    plan: &SweepPlan,
    run_id: Option<String>,
    resume: Option<&str>,
    device: DeviceKind,
    short: &str,
    environment: impl FnOnce() -> Environment,
    progress: &dyn Progress,
) -> Result<RunStore> {
    if let Some(id) = resume {
        validate_run_id(id)?;
        let s = RunStore::open(&plan.out, id)?;
        progress.message(&format!(
            "resuming {} ({} cells on disk); its recorded plan is used",
            s.dir().display(),
            s.cells().iter().filter(|c| c.is_aggregate()).count()
        ));
        return Ok(s);
    }
    let id = match run_id {
        Some(id) => {
            validate_run_id(&id)?;
            id
        }
        None => default_run_id(&now_rfc3339(), short),
    };
    let source = match plan.prometheus {
        PrometheusSetting::Off if plan.backend == BackendKind::Local => Source::Scrape,
        _ => Source::Prometheus,
    };
    let label = match (device, plan.device) {
        (DeviceKind::Cpu, DeviceChoice::Auto) => Some(CPU_SMOKE_LABEL.to_string()),
        (DeviceKind::Cpu, _) => Some(CPU_RUN_LABEL.to_string()),
        (DeviceKind::Cuda, _) => None,
    };
    RunStore::create(
        &plan.out,
        RunRecord {
            run_id: id,
            state: "running".into(),
            started_at: now_rfc3339(),
            finished_at: None,
            label,
            plan: plan_record(plan, device, source),
            environment: environment(),
            unavailable: Vec::new(),
        },
    )
}

/// The recorded Prometheus setting.
pub(crate) fn prometheus_setting(recorded: &PlanRecord) -> PrometheusSetting {
    match recorded.prometheus.as_str() {
        "off" => PrometheusSetting::Off,
        "spawn" => PrometheusSetting::Spawn,
        url => PrometheusSetting::Url(url.to_string()),
    }
}

/// Runs the cells with the recorded metrics source, then restores the backend and
/// records how the run ended, whatever happened; returns the run's outcome.
pub(crate) async fn run_cells<B: Backend>(
    backend: &mut B,
    store: &mut RunStore,
    prometheus: PrometheusSetting,
    telemetry: Arc<dyn Telemetry>,
    settings: &MeasureSettings,
    progress: &dyn Progress,
    cancel: &CancellationToken,
) -> Result<SweepOutcome> {
    let result = match prometheus {
        PrometheusSetting::Off => {
            sweep_cells(
                backend,
                &ScrapeSource::default(),
                telemetry,
                settings,
                store,
                progress,
                cancel,
            )
            .await
        }
        PrometheusSetting::Spawn => match PrometheusSource::spawn(store.dir()).await {
            Ok(mut source) => {
                progress.message(&format!("Prometheus: private server at {}", source.client().base()));
                let r = sweep_cells(backend, &source, telemetry, settings, store, progress, cancel).await;
                source.stop().await;
                r
            }
            Err(e) => Err(e),
        },
        PrometheusSetting::Url(url) => {
            let source = PrometheusSource::connect(&url);
            sweep_cells(backend, &source, telemetry, settings, store, progress, cancel).await
        }
    };
    let restored = backend.restore().await;
    let interrupted = matches!(result, Err(BenchError::Interrupted));
    store.update_run(|r| {
        r.state = match (&result, interrupted) {
            (Ok(_), _) => "complete".into(),
            (Err(_), true) => "interrupted".into(),
            (Err(_), false) => "failed".into(),
        };
        r.finished_at = Some(now_rfc3339());
    })?;
    progress.finish();
    let cells_run = result?;
    restored?;
    Ok(SweepOutcome {
        dir: store.dir().to_path_buf(),
        cells_run,
        label: store.run().label.clone(),
    })
}

/// Runs (or resumes) a sweep and returns its directory.
pub async fn run(plan: SweepPlan, run_id: Option<String>, resume: Option<String>, quiet: bool) -> Result<SweepOutcome> {
    let progress = progress_for(quiet);
    let cancel = CancellationToken::new();
    cancel_on_signals(cancel.clone());
    match plan.backend {
        BackendKind::Local => run_local(plan, run_id, resume, &*progress, &cancel).await,
        BackendKind::Kubernetes => crate::k8s::sweep::run(plan, run_id, resume, &*progress, &cancel).await,
    }
}

async fn run_local(
    plan: SweepPlan,
    run_id: Option<String>,
    resume: Option<String>,
    progress: &dyn Progress,
    cancel: &CancellationToken,
) -> Result<SweepOutcome> {
    let inventory = crate::gpu::probe();
    let workload = find_workload(plan.workload_bin.as_deref())?;
    let mps_control = crate::mps::find_control();
    // When resuming, the recorded plan decides; the device only names a new run.
    let device = if resume.is_some() {
        DeviceKind::Cpu
    } else {
        resolve_device(plan.device, &inventory, libcuda_present())?
    };
    let short = match device {
        DeviceKind::Cuda => inventory.gpus.first().map_or("gpu".into(), |g| g.short_name()),
        DeviceKind::Cpu => "cpu".into(),
    };
    let env = || environment(&inventory, &workload.display().to_string(), mps_control.as_deref());
    let mut store = open_store(&plan, run_id, resume.as_deref(), device, &short, env, progress)?;
    let recorded = store.run().plan.clone();
    if let Some(l) = &store.run().label {
        progress.message(&format!("\n*** {l} ***\n"));
    }
    let settings = settings_from_record(&recorded, plan.measure.ready_timeout);
    let telemetry: Arc<dyn Telemetry> = match (recorded.device, NvmlTelemetry::open(0)) {
        (DeviceKind::Cuda, Some(t)) => Arc::new(t),
        _ => Arc::new(NoTelemetry),
    };
    let command = WorkloadCommand {
        binary: workload,
        args: workload_args(&recorded),
    };
    let mut backend =
        LocalBackend::new(command, recorded.device, inventory, store.dir(), mps_control).with_base_port(plan.base_port);
    let prometheus = prometheus_setting(&recorded);
    run_cells(
        &mut backend,
        &mut store,
        prometheus,
        telemetry,
        &settings,
        progress,
        cancel,
    )
    .await
}

/// What a local sweep would start, cell by cell (pure apart from reading the GPUs).
pub fn dry_run_local(plan: &SweepPlan) -> String {
    use std::fmt::Write;
    let inventory = crate::gpu::probe();
    let device = resolve_device(plan.device, &inventory, libcuda_present()).unwrap_or(DeviceKind::Cpu);
    let record = plan_record(plan, device, Source::Scrape);
    let mps = crate::mps::find_control().map(|_| crate::strategy::MpsDirs {
        pipe: "<run>/mps/<cell>/pipe".into(),
        log: "<run>/mps/<cell>/log".into(),
    });
    let mut out = format!("gpushare-workload {}\n", workload_args(&record).join(" "));
    for &s in &record.strategies {
        for &n in &record.pods {
            let _ = writeln!(out, "{} × {n}:", s.title());
            match crate::strategy::plan_cell(s, n, device, &inventory, mps.as_ref()) {
                crate::strategy::CellPlan::Unavailable(r) => {
                    let _ = writeln!(out, "  unavailable: {r}");
                }
                crate::strategy::CellPlan::Pods(pods) => {
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

/// A cell that could not be measured at all: one failed aggregate row with the reason.
pub fn failed_rows(l: &CellLabels, source: Source, reason: &str) -> Vec<crate::record::CellRecord> {
    vec![empty_row(
        l,
        crate::record::ALL_PODS,
        CellStatus::Failed,
        source,
        reason.to_string(),
    )]
}

/// One line per finished cell for the terminal.
pub fn cell_summary(rows: &[crate::record::CellRecord]) -> String {
    let Some(agg) = rows.iter().find(|r| r.is_aggregate()) else {
        return String::new();
    };
    let head = format!(
        "{:<13} {} pod{}",
        agg.strategy.title(),
        agg.pods,
        if agg.pods == 1 { " " } else { "s" }
    );
    match (agg.status, agg.mean_s, agg.throughput_per_s) {
        (CellStatus::Ok, Some(mean), Some(tput)) => format!(
            "{head}  mean {:>8.2} ms  p99 {:>8.2} ms  {:>8.1} inf/s  fairness {}",
            mean * 1e3,
            agg.p99_s.unwrap_or(f64::NAN) * 1e3,
            tput,
            agg.fairness.map_or("-".into(), |f| format!("{f:.3}"))
        ),
        (status, _, _) => format!("{head}  {status}: {}", agg.note),
    }
}

async fn sweep_cells<B: Backend, S: MetricsSource>(
    backend: &mut B,
    source: &S,
    telemetry: Arc<dyn Telemetry>,
    settings: &MeasureSettings,
    store: &mut RunStore,
    progress: &dyn Progress,
    cancel: &CancellationToken,
) -> Result<usize> {
    let plan = store.run().plan.clone();
    let total = (plan.strategies.len() * plan.pods.len()) as u64;
    let done = plan
        .strategies
        .iter()
        .flat_map(|s| plan.pods.iter().map(move |p| (*s, *p)))
        .filter(|(s, p)| store.has_cell(*s, *p))
        .count() as u64;
    progress.sweep_start(total, done);
    let mut ran = 0;
    for &strategy in &plan.strategies {
        if cancel.is_cancelled() {
            return Err(BenchError::Interrupted);
        }
        if plan.pods.iter().all(|p| store.has_cell(strategy, *p)) {
            continue;
        }
        let run_id = store.run().run_id.clone();
        let labels = |pods| CellLabels {
            run_id: run_id.clone(),
            strategy,
            pods,
            model: plan.model.clone(),
            precision: plan.precision.clone(),
            device: plan.device,
        };
        let prepared = backend.prepare(strategy).await?;
        if let Prepared::Unavailable(reason) = &prepared {
            progress.message(&format!("{} unavailable: {reason}", strategy.title()));
            store.update_run(|r| {
                if !r.unavailable.iter().any(|u| u.strategy == strategy) {
                    r.unavailable.push(Unavailable {
                        strategy,
                        reason: reason.clone(),
                    });
                }
            })?;
        }
        for &pods in &plan.pods {
            if store.has_cell(strategy, pods) {
                continue;
            }
            progress.cell_start(strategy, pods);
            let rows = match &prepared {
                Prepared::Unavailable(reason) => unavailable_rows(&labels(pods), source.kind(), reason),
                Prepared::Ready => {
                    let launched = backend.launch(strategy, pods).await;
                    let measured = match launched {
                        Ok(_) => {
                            let baseline = store.aggregate(strategy, 1).cloned();
                            measure_cell(
                                backend,
                                source,
                                telemetry.clone(),
                                settings,
                                &labels(pods),
                                baseline.as_ref(),
                                progress,
                                cancel,
                            )
                            .await
                        }
                        Err(e) => Err(e),
                    };
                    // Pods stop before anything else happens, whatever the outcome.
                    let stopped = backend.stop_pods().await;
                    let rows = match measured {
                        Ok(rows) => rows,
                        Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
                        // Without its metrics source nothing more can be measured.
                        Err(e @ BenchError::Prometheus { .. }) => return Err(e),
                        // A cell that could not start is an outcome, not the end of the sweep.
                        Err(e) => failed_rows(&labels(pods), source.kind(), &e.to_string()),
                    };
                    stopped?;
                    rows
                }
            };
            progress.cell_done(&cell_summary(&rows));
            store.save_cell(rows)?;
            ran += 1;
        }
    }
    Ok(ran)
}
