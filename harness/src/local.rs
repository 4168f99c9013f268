//! The local backend: every pod a `gpushare-workload` process on this machine, on its
//! own loopback port, with the strategy's environment; a private MPS daemon per MPS
//! cell. Processes run in their own process group (a terminal's Ctrl-C reaches only
//! the harness, which then stops them in order) and are killed if their guard is
//! dropped on any other path.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Pod, PodState, Prepared};
use crate::domain::{DeviceKind, Strategy};
use crate::error::{BenchError, Result};
use crate::gpu::GpuInventory;
use crate::mps::{MpsDaemon, dirs_for};
use crate::strategy::{CellPlan, MpsDirs, plan_cell};

/// How to start workload pods.
#[derive(Debug, Clone)]
pub struct WorkloadCommand {
    /// The `gpushare-workload` binary.
    pub binary: PathBuf,
    /// Arguments every pod gets (`--model`, `--device`, `--precision`, ...).
    pub args: Vec<String>,
}

/// Finds the workload binary: `explicit`, else beside the harness binary, else on PATH.
pub fn find_workload(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(BenchError::flag(
                "--workload-bin",
                &p.display().to_string(),
                "no such file",
            ))
        };
    }
    let beside = std::env::current_exe().ok().and_then(|exe| {
        // Test binaries live in target/<profile>/deps; the workload one level up.
        let dir = exe.parent()?.to_path_buf();
        [dir.join("gpushare-workload"), dir.parent()?.join("gpushare-workload")]
            .into_iter()
            .find(|p| p.is_file())
    });
    let on_path = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("gpushare-workload"))
                .find(|p| p.is_file())
        })
    };
    beside.or_else(on_path).ok_or_else(|| BenchError::Spawn {
        pod: "any".into(),
        reason: "cannot find the gpushare-workload binary beside gpushare-bench or on PATH (build it with `make build`, or pass --workload-bin)".into(),
    })
}

/// A free loopback port (the OS picks; the listener is closed before the pod binds).
fn free_port() -> Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(BenchError::io("finding a free port"))
}

/// One workload process.
#[derive(Debug)]
struct PodProcess {
    name: String,
    port: Option<u16>,
    child: Option<Child>,
    log: PathBuf,
    state: PodState,
}

impl PodProcess {
    fn pod(&self) -> Pod {
        Pod {
            name: self.name.clone(),
            metrics_url: self.port.map(|p| format!("http://127.0.0.1:{p}/metrics")),
            state: self.state.clone(),
        }
    }

    /// Updates `state` if the process has exited.
    fn reap(&mut self) {
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
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
    }
}

/// The last line of a pod's log that reads as an error (the workload prints one).
fn last_error_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .find(|l| l.starts_with("gpushare-workload:") || l.contains("ERROR") || l.contains("panicked"))
        .map(|l| l.trim().to_string())
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
        }
    }

    fn mps_dirs(&self, strategy: Strategy, pods: u32) -> Option<MpsDirs> {
        self.mps_control
            .as_ref()
            .map(|_| dirs_for(&self.run_dir, &format!("{}-{pods}p", strategy.name())))
    }

    async fn terminate_all(&mut self) {
        for p in &mut self.pods {
            if let Some(child) = p.child.as_ref()
                && let Some(pid) = child.id()
            {
                // SAFETY: kill(2) on a child we own and have not reaped.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(4);
        loop {
            for p in &mut self.pods {
                p.reap();
            }
            if self.pods.iter().all(|p| p.child.is_none()) || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for p in &mut self.pods {
            if let Some(mut child) = p.child.take() {
                let _ = child.start_kill();
                let _ = child.wait().await;
                p.state = PodState::Exited {
                    code: None,
                    detail: "killed: did not stop within 4 s of SIGTERM".into(),
                };
            }
        }
    }
}

impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn prepare(&mut self, strategy: Strategy) -> Result<Prepared> {
        let dirs = self.mps_dirs(strategy, 1);
        Ok(
            match plan_cell(strategy, 1, self.device, &self.inventory, dirs.as_ref()) {
                CellPlan::Pods(_) => Prepared::Ready,
                CellPlan::Unavailable(reason) => Prepared::Unavailable(reason),
            },
        )
    }

    async fn launch(&mut self, strategy: Strategy, pods: u32) -> Result<Vec<Pod>> {
        let dirs = self.mps_dirs(strategy, pods);
        let plan = match plan_cell(strategy, pods, self.device, &self.inventory, dirs.as_ref()) {
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
            self.mps = Some(MpsDaemon::start(control, dirs)?);
        }
        let logs = self.run_dir.join("logs");
        for p in plan {
            let log = logs.join(format!("{}-{pods}p-{}.log", strategy.name(), p.name));
            if let Some(reason) = p.pending {
                self.pods.push(PodProcess {
                    name: p.name,
                    port: None,
                    child: None,
                    log,
                    state: PodState::Pending(reason),
                });
                continue;
            }
            let port = match self.base_port {
                Some(base) => {
                    let port = base + p.index as u16;
                    std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
                        BenchError::flag(
                            "--base-port",
                            &base.to_string(),
                            format!("port {port} for {}: {e}", p.name),
                        )
                    })?;
                    port
                }
                None => free_port()?,
            };
            let file = std::fs::File::create(&log).map_err(BenchError::io(format!("creating {}", log.display())))?;
            let err_file = file.try_clone().map_err(BenchError::io("duplicating a log handle"))?;
            let child = Command::new(&self.workload.binary)
                .args(&self.workload.args)
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .env("GPUSHARE_POD", &p.name)
                .env("GPUSHARE_STRATEGY", strategy.name())
                .envs(p.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .stdin(Stdio::null())
                .stdout(Stdio::from(file))
                .stderr(Stdio::from(err_file))
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| BenchError::Spawn {
                    pod: p.name.clone(),
                    reason: format!("{}: {e}", self.workload.binary.display()),
                })?;
            self.pods.push(PodProcess {
                name: p.name,
                port: Some(port),
                child: Some(child),
                log,
                state: PodState::Starting,
            });
        }
        Ok(self.pods.iter().map(PodProcess::pod).collect())
    }

    async fn wait_ready(&mut self, timeout: Duration, cancel: &CancellationToken) -> Result<Vec<Pod>> {
        let deadline = Instant::now() + timeout;
        loop {
            for p in &mut self.pods {
                p.reap();
                if p.state == PodState::Starting
                    && let Some(port) = p.port
                    && crate::scrape::healthz(port).await
                {
                    p.state = PodState::Running;
                }
            }
            if !self.pods.iter().any(|p| p.state == PodState::Starting) {
                break;
            }
            if Instant::now() > deadline {
                for p in self.pods.iter_mut().filter(|p| p.state == PodState::Starting) {
                    p.state = PodState::Exited {
                        code: None,
                        detail: format!("not ready after {} s", timeout.as_secs()),
                    };
                }
                break;
            }
            tokio::select! {
                _ = cancel.cancelled() => return Err(BenchError::Interrupted),
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
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

    async fn stop_pods(&mut self) -> Result<Vec<Pod>> {
        for p in &mut self.pods {
            p.reap(); // keep a crash's exit code before we send SIGTERM
        }
        let before: Vec<Pod> = self.pods.iter().map(PodProcess::pod).collect();
        self.terminate_all().await;
        self.pods.clear();
        let mps = self.mps.take().map(|mut d| d.stop());
        if let Some(Err(e)) = mps {
            return Err(e);
        }
        Ok(before)
    }

    async fn restore(&mut self) -> Result<()> {
        // Nothing was changed on the machine; only our own processes to stop.
        self.stop_pods().await.map(|_| ())
    }
}
