//! The local backend: every pod a `gpushare-workload` process on this machine, on its
//! own loopback port, with the strategy's environment; a private MPS daemon per MPS
//! cell. Processes run in their own process group (a terminal's Ctrl-C reaches only
//! the harness, which then stops them in order) and are killed if their guard is
//! dropped on any other path.

pub mod mps;
pub mod strategy;

pub mod session;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use crate::backend::local::mps::{MpsDaemon, dirs_for};
use crate::backend::local::strategy::{CellPlan, MpsDirs, plan_cell};
use crate::backend::{Backend, Pod, PodSpec, PodState, Prepared};
use crate::domain::{DeviceKind, Strategy};
use crate::error::{BenchError, Result};
use crate::process::{OwnedChild, free_port, last_error_line};
use crate::shutdown::{EndsOn, Shutdown};
use crate::telemetry::GpuInventory;

/// How to start workload pods.
#[derive(Debug, Clone)]
pub struct WorkloadCommand {
    /// The `gpushare-workload` binary.
    pub binary: PathBuf,
    /// Arguments every pod gets (`--model`, `--device`, `--precision`, ...).
    pub args: Vec<String>,
    /// The user's own server instead (`--workload-cmd`): a shell command with `{port}`,
    /// run with `sh -c` in its own process group, so all it starts stops with the pod.
    pub custom: Option<String>,
    /// When a pod is ready: a 200 answer on this path, or (`none`) the first
    /// observation in its latency histogram.
    pub ready_path: String,
    /// The latency histogram (`--metric`), for readiness by first observation.
    pub metric: String,
}

impl WorkloadCommand {
    /// Whether a pod runs gpushare-workload: every pod of a run without a server of
    /// the user's own, and those marked `builtin` beside one.
    fn runs_builtin(&self, builtin: bool) -> bool {
        self.custom.is_none() || builtin
    }

    /// gpushare-workload with these arguments.
    pub fn builtin(binary: PathBuf, args: Vec<String>) -> Self {
        Self {
            binary,
            args,
            custom: None,
            ready_path: crate::config::plan::DEFAULT_READY_PATH.into(),
            metric: crate::metrics::LATENCY_METRIC.into(),
        }
    }
}

/// The shell command of a pod of the user's own server (pure): `{port}` replaced.
pub fn custom_command(template: &str, port: u16) -> String {
    template.replace("{port}", &port.to_string())
}

/// Finds the workload binary: `explicit`, else beside the harness binary, else on PATH.
pub fn find_workload(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        let why = match std::fs::metadata(p) {
            Ok(m) if m.is_file() => return Ok(p.to_path_buf()),
            Ok(m) if m.is_dir() => "a directory: give the gpushare-workload binary itself".to_string(),
            Ok(_) => "not a regular file".to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "no such file".to_string(),
            Err(e) => format!("cannot read it: {e}"),
        };
        return Err(BenchError::flag("--workload-bin", &p.display().to_string(), why));
    }
    let beside = std::env::current_exe().ok().and_then(|exe| {
        // Test binaries live in target/<profile>/deps; the workload one level up.
        let dir = exe.parent()?.to_path_buf();
        [dir.join("gpushare-workload"), dir.parent()?.join("gpushare-workload")]
            .into_iter()
            .find(|p| p.is_file())
    });
    beside
        .or_else(|| crate::process::which("gpushare-workload", &[]))
        .ok_or_else(|| BenchError::Spawn {
            pod: "any".into(),
            reason: "cannot find the gpushare-workload binary beside gpushare-bench or on PATH (build it with `make build`, or pass --workload-bin)".into(),
        })
}

/// How long a pod gets to exit after SIGTERM before it is killed.
const POD_GRACE: Duration = Duration::from_secs(4);

/// One workload process.
#[derive(Debug)]
struct PodProcess {
    name: String,
    port: Option<u16>,
    child: Option<OwnedChild>,
    log: PathBuf,
    state: PodState,
    /// How it was started (None: pending, never started).
    launch: Option<PodLaunch>,
}

/// What a pod was started with, so that it can be started again in the same cell.
#[derive(Debug, Clone)]
struct PodLaunch {
    strategy: Strategy,
    index: u32,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Its log's name without `.log` (a new process gets `.2.log`, …).
    log_base: String,
    /// It runs gpushare-workload although the run's pods are a server of the user's
    /// own ([`PodSpec::builtin`]).
    builtin: bool,
}

impl PodProcess {
    fn pod(&self) -> Pod {
        Pod {
            name: self.name.clone(),
            metrics_url: self.port.map(|p| format!("http://127.0.0.1:{p}/metrics")),
            state: self.state.clone(),
        }
    }

    fn exited(&mut self, status: std::process::ExitStatus) {
        self.child = None;
        let detail = match (
            last_error_line(&self.log),
            std::os::unix::process::ExitStatusExt::signal(&status),
        ) {
            (Some(line), _) => line,
            (None, Some(sig)) => format!("killed by signal {sig}"),
            (None, None) => format!("exited with {status}"),
        };
        self.state = PodState::Exited {
            code: status.code(),
            detail,
        };
    }

    /// Updates `state` if the process has exited.
    fn reap(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(OwnedChild::try_wait) {
            self.exited(status);
        }
    }
}

/// Pods on this machine.
#[derive(Debug)]
pub struct LocalBackend {
    workload: WorkloadCommand,
    device: DeviceKind,
    inventory: GpuInventory,
    run_dir: PathBuf,
    mps_control: Option<PathBuf>,
    pods: Vec<PodProcess>,
    mps: Option<MpsDaemon>,
    base_port: Option<u16>,
    /// What the last cell's MPS server logged of a fatal GPU error.
    mps_note: Option<String>,
    /// The MPS clients' limits of the arm prepared last.
    mps_limits: crate::domain::MpsLimits,
}

impl LocalBackend {
    /// Pods listen on `base + index` instead of free ports.
    pub fn with_base_port(mut self, base: Option<u16>) -> Self {
        self.base_port = base;
        self
    }

    /// A backend that writes pod logs under `run_dir/logs`.
    pub fn new(
        workload: WorkloadCommand,
        device: DeviceKind,
        inventory: GpuInventory,
        run_dir: &Path,
        mps_control: Option<PathBuf>,
    ) -> Self {
        Self {
            workload,
            device,
            inventory,
            run_dir: run_dir.to_path_buf(),
            mps_control,
            pods: Vec::new(),
            mps: None,
            base_port: None,
            mps_note: None,
            mps_limits: crate::domain::MpsLimits::default(),
        }
    }

    /// The measured GPU's UUID on a GPU run (its inventory holds only that GPU).
    fn gpu_uuid(&self) -> Option<&str> {
        (self.device == DeviceKind::Cuda)
            .then(|| self.inventory.gpus.first().map(|g| g.uuid.as_str()))
            .flatten()
    }

    fn mps_dirs(&self, strategy: Strategy, pods: u32) -> Option<MpsDirs> {
        self.mps_control
            .as_ref()
            .map(|_| dirs_for(&self.run_dir, &format!("{}-{pods}p", strategy.name()), self.gpu_uuid()))
    }

    /// SIGTERM to every pod's group at once, then up to [`POD_GRACE`] for each group to
    /// be gone, not only its first process (cut short by a forced stop): a shell that
    /// dies of the signal at once leaves its server the rest of the grace. Then SIGKILL
    /// to what is left.
    async fn terminate_all(&mut self, shutdown: &Shutdown) {
        let mut stopping: Vec<(usize, OwnedChild)> = self
            .pods
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| p.child.take().map(|c| (i, c)))
            .collect();
        let stopped =
            futures_util::future::join_all(stopping.iter_mut().map(|(_, c)| c.stop(POD_GRACE, shutdown))).await;
        for ((i, _), r) in stopping.into_iter().zip(stopped) {
            match r {
                Some((status, false)) => self.pods[i].exited(status),
                _ => {
                    self.pods[i].state = PodState::Exited {
                        code: None,
                        detail: format!("killed: did not stop within {} s of SIGTERM", POD_GRACE.as_secs()),
                    }
                }
            }
        }
    }
}

/// Whether a pod is ready yet.
#[derive(Debug, Clone, PartialEq)]
enum Readiness {
    Ready,
    /// Not yet: what was seen last (said if it never becomes ready).
    NotYet(String),
    /// It never will: its metrics are not what `--metric` asks for.
    Broken(String),
}

/// Whether the pod on `port` is ready: a 200 answer on `path`, or with `none` a first
/// observation in its histogram `metric` (a server without a readiness endpoint).
async fn readiness(pod: &str, port: u16, path: &str, metric: &str) -> Readiness {
    if path != "none" {
        return if crate::metrics::http::ready(port, path).await {
            Readiness::Ready
        } else {
            Readiness::NotYet(format!("http://127.0.0.1:{port}{path} never answered 2xx"))
        };
    }
    let url = format!("http://127.0.0.1:{port}/metrics");
    let text = match crate::metrics::scrape::ScrapeSource::default().get(&url).await {
        Ok(t) => t,
        Err(e) => return Readiness::NotYet(format!("{url}: {e}")),
    };
    use crate::metrics::NoLatency;
    let said = |r: &str| format!("metrics from {pod} at {url}: {r}");
    match crate::metrics::latency_from_text(&text, metric) {
        Ok(h) if h.count > 0.0 => Readiness::Ready,
        Ok(_) => Readiness::NotYet(format!("{metric} at {url} has no observation")),
        // A histogram can appear late; what is unusable will not mend itself.
        Err(NoLatency::Missing(r)) => Readiness::NotYet(said(&r)),
        Err(NoLatency::Unusable(r)) => Readiness::Broken(said(&r)),
    }
}

impl LocalBackend {
    /// Spawns a cell's pods; `specs` (when given) name them and add their arguments,
    /// else every pod gets `args`.
    async fn spawn_cell(
        &mut self,
        strategy: Strategy,
        pods: u32,
        specs: &[PodSpec],
        args: &[String],
        shutdown: &Shutdown,
    ) -> Result<Vec<Pod>> {
        let dirs = self.mps_dirs(strategy, pods);
        let plan = match plan_cell(
            strategy,
            pods,
            self.device,
            &self.inventory,
            (dirs.as_ref(), self.mps_limits),
        ) {
            CellPlan::Pods(p) => p,
            CellPlan::Unavailable(reason) => {
                return Err(BenchError::Spawn {
                    pod: "all".into(),
                    reason,
                });
            }
        };
        if strategy == Strategy::Mps
            && let (Some(control), Some(dirs)) = (&self.mps_control, &dirs)
        {
            self.mps = Some(MpsDaemon::start(control, dirs, shutdown).await?);
        }
        let logs = self.run_dir.join("logs");
        for mut p in plan {
            let spec = specs.get(p.index as usize);
            if let Some(spec) = spec {
                p.name = spec.name.clone();
            }
            let group = spec.map_or(String::new(), |s| s.group.clone());
            let log_base = if group.is_empty() {
                format!("{}-{pods}p-{}", strategy.name(), p.name)
            } else {
                format!("{}-{group}-{}", strategy.name(), p.name)
            };
            let log = free_log_path(&logs, &log_base);
            if let Some(reason) = p.pending {
                self.pods.push(PodProcess {
                    name: p.name,
                    port: None,
                    child: None,
                    log,
                    state: PodState::Pending(reason),
                    launch: None,
                });
                continue;
            }
            let mut args = spec.map_or_else(|| args.to_vec(), |s| s.args.clone());
            let builtin = spec.is_some_and(|s| s.builtin);
            // Each launch draws its own open-loop arrivals (pods of a cell, cells and
            // repeats): a seed the pod reports back, unless the user fixed one.
            let given = |a: &[String]| a.iter().any(|x| x.starts_with("--load-seed"));
            if self.workload.runs_builtin(builtin) && !given(&self.workload.args) && !given(&args) {
                args.extend([
                    "--load-seed".to_string(),
                    crate::client::fresh_seed(p.index).to_string(),
                ]);
            }
            let launch = PodLaunch {
                strategy,
                index: p.index,
                args,
                env: p.env,
                log_base,
                builtin,
            };
            let pod = self.spawn_pod(p.name, launch, log)?;
            self.pods.push(pod);
        }
        Ok(self.pods.iter().map(PodProcess::pod).collect())
    }
}

impl LocalBackend {
    /// Starts one workload process: the run's arguments, the pod's own, its port, the
    /// strategy's environment; output to `log`.
    fn spawn_pod(&self, name: String, launch: PodLaunch, log: PathBuf) -> Result<PodProcess> {
        let port = match self.base_port {
            Some(base) => {
                let port = u16::try_from(launch.index)
                    .ok()
                    .and_then(|i| base.checked_add(i))
                    .ok_or_else(|| {
                        BenchError::flag(
                            "--base-port",
                            &base.to_string(),
                            format!("{name} would need a port above 65535: give a lower base"),
                        )
                    })?;
                std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
                    BenchError::flag("--base-port", &base.to_string(), format!("port {port} for {name}: {e}"))
                })?;
                port
            }
            None => free_port()?,
        };
        let file = std::fs::File::create(&log).map_err(BenchError::io(format!("creating {}", log.display())))?;
        let err_file = file.try_clone().map_err(BenchError::io("duplicating a log handle"))?;
        let custom = self
            .workload
            .custom
            .as_ref()
            .filter(|_| !self.workload.runs_builtin(launch.builtin));
        let mut cmd = match custom {
            Some(template) => {
                let mut c = Command::new("/bin/sh");
                c.arg("-c")
                    .arg(custom_command(template, port))
                    .env("PORT", port.to_string())
                    .env("POD", &name)
                    .env("STRATEGY", launch.strategy.name());
                c
            }
            None => {
                let mut c = Command::new(&self.workload.binary);
                c.args(&self.workload.args)
                    .args(&launch.args)
                    .arg("--listen")
                    .arg(format!("127.0.0.1:{port}"));
                c
            }
        };
        cmd.env("GPUSHARE_POD", &name)
            .env("GPUSHARE_STRATEGY", launch.strategy.name())
            .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err_file));
        let what = match custom {
            Some(template) => format!("--workload-cmd {template:?}"),
            None => self.workload.binary.display().to_string(),
        };
        let child = OwnedChild::spawn(&mut cmd, &what).map_err(|e| BenchError::Spawn {
            pod: name.clone(),
            reason: e.to_string(),
        })?;
        Ok(PodProcess {
            name,
            port: Some(port),
            child: Some(child),
            log,
            state: PodState::Starting,
            launch: Some(launch),
        })
    }
}

impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn prepare(&mut self, arm: crate::domain::Arm, _shutdown: &Shutdown) -> Result<Prepared> {
        // A time-slice interval is DRA's: the plan gives one to no other backend. MPS's
        // client limits are set in each client's environment.
        let strategy = arm.strategy;
        self.mps_limits = arm.mps;
        let dirs = self.mps_dirs(strategy, 1);
        Ok(
            match plan_cell(strategy, 1, self.device, &self.inventory, (dirs.as_ref(), arm.mps)) {
                CellPlan::Pods(_) => Prepared::Ready,
                CellPlan::Unavailable(reason) => Prepared::Unavailable(reason),
            },
        )
    }

    async fn launch(
        &mut self,
        strategy: Strategy,
        pods: u32,
        args: &[String],
        shutdown: &Shutdown,
    ) -> Result<Vec<Pod>> {
        self.spawn_cell(strategy, pods, &[], args, shutdown).await
    }

    async fn launch_pods(&mut self, strategy: Strategy, specs: &[PodSpec], shutdown: &Shutdown) -> Result<Vec<Pod>> {
        let pods = u32::try_from(specs.len()).unwrap_or(u32::MAX);
        self.spawn_cell(strategy, pods, specs, &[], shutdown).await
    }

    fn set_mps_limits(&mut self, limits: crate::domain::MpsLimits) -> std::result::Result<(), String> {
        // Each client's environment carries them.
        self.mps_limits = limits;
        Ok(())
    }

    async fn relaunch_pod(&mut self, name: &str, _shutdown: &Shutdown) -> Result<()> {
        let gone = |reason: &str| BenchError::Spawn {
            pod: name.into(),
            reason: reason.into(),
        };
        let i = self
            .pods
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| gone("no such pod in this cell"))?;
        let old = &mut self.pods[i];
        old.reap();
        if old.child.is_some() {
            return Err(gone("it is still running"));
        }
        let launch = old
            .launch
            .clone()
            .ok_or_else(|| gone("it was never started (pending)"))?;
        let log = free_log_path(&self.run_dir.join("logs"), &launch.log_base);
        self.pods[i] = self.spawn_pod(name.to_string(), launch, log)?;
        Ok(())
    }

    async fn wait_ready(&mut self, timeout: Duration, shutdown: &Shutdown) -> Result<Vec<Pod>> {
        let mut wait = shutdown.poll(EndsOn::Request, Duration::from_millis(100), timeout);
        let mut last_seen: std::collections::HashMap<usize, String> = std::collections::HashMap::new();
        loop {
            for (i, p) in self.pods.iter_mut().enumerate() {
                p.reap();
                if p.state == PodState::Starting
                    && let Some(port) = p.port
                {
                    // gpushare-workload's own contract, or the user's server's.
                    let builtin = self.workload.runs_builtin(p.launch.as_ref().is_some_and(|l| l.builtin));
                    let (path, metric) = if builtin {
                        (crate::config::plan::DEFAULT_READY_PATH, crate::metrics::LATENCY_METRIC)
                    } else {
                        (self.workload.ready_path.as_str(), self.workload.metric.as_str())
                    };
                    let name = p.name.clone();
                    match shutdown
                        .guard(async { Ok(readiness(&name, port, path, metric).await) })
                        .await?
                    {
                        Readiness::Ready => p.state = PodState::Running,
                        Readiness::NotYet(seen) => {
                            last_seen.insert(i, seen);
                        }
                        Readiness::Broken(why) => {
                            // Dropped, its group is killed: nothing reaps it over
                            // this reason later.
                            p.child = None;
                            p.state = PodState::Exited {
                                code: None,
                                detail: format!("not ready: {why}"),
                            };
                        }
                    }
                }
            }
            if !self.pods.iter().any(|p| p.state == PodState::Starting) {
                break;
            }
            if !wait.keep_waiting().await? {
                for (i, p) in self.pods.iter_mut().enumerate() {
                    if p.state == PodState::Starting {
                        p.state = PodState::Exited {
                            code: None,
                            detail: match last_seen.get(&i) {
                                Some(seen) => format!("not ready after {} s: {seen}", timeout.as_secs()),
                                None => format!("not ready after {} s", timeout.as_secs()),
                            },
                        };
                    }
                }
                break;
            }
        }
        Ok(self.pods.iter().map(PodProcess::pod).collect())
    }

    async fn poll(&mut self) -> Vec<Pod> {
        for p in &mut self.pods {
            p.reap();
        }
        self.pods.iter().map(PodProcess::pod).collect()
    }

    async fn stop_pods(&mut self, shutdown: &Shutdown) -> Result<Vec<Pod>> {
        for p in &mut self.pods {
            p.reap(); // keep a crash's exit code before we send SIGTERM
        }
        let before: Vec<Pod> = self.pods.iter().map(PodProcess::pod).collect();
        self.terminate_all(shutdown).await;
        self.mps_note = self.mps.as_ref().and_then(MpsDaemon::fatal_error_note);
        self.pods.clear();
        // A second signal (forced stop) skips the grace period: quit, then kill at once.
        let grace = if shutdown.is_forced() {
            Duration::ZERO
        } else {
            Duration::from_secs(5)
        };
        if let Some(Err(e)) = self
            .mps
            .take()
            .map(|mut d| d.stop_within(grace, &|| shutdown.is_forced()))
        {
            return Err(e);
        }
        Ok(before)
    }

    fn cell_setup(&self) -> Option<crate::backend::CellSetup> {
        self.mps_note.as_ref().map(|n| crate::backend::CellSetup {
            note: Some(n.clone()),
            ..Default::default()
        })
    }

    async fn restore(&mut self, shutdown: &Shutdown) -> Result<()> {
        // Nothing was changed on the machine; only our own processes to stop.
        self.stop_pods(shutdown).await.map(|_| ())
    }
}

/// `DIR/BASE.log`, or `DIR/BASE.2.log`, `DIR/BASE.3.log`, … when a launch of the same
/// pod of the same cell wrote one before (the passes of `--repeat`, a cell measured again
/// after a resume): every launch keeps its own log.
fn free_log_path(dir: &Path, base: &str) -> PathBuf {
    let first = dir.join(format!("{base}.log"));
    if !first.exists() {
        return first;
    }
    (2u32..)
        .map(|k| dir.join(format!("{base}.{k}.log")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}
