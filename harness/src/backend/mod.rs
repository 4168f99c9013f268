//! What a sweep needs from the place pods run: prepare a strategy, launch a cell's pods,
//! report their states, stop them, and put everything back. The local backend runs
//! processes on this machine; the Kubernetes backend drives a node.

#[cfg(test)]
pub mod fake;
pub mod k8s;
pub mod local;

use std::sync::Arc;
use std::time::Duration;

use crate::config::plan::{MeasureSettings, PrometheusSetting};
use crate::domain::{Arm, MpsLimits, Strategy};
use crate::error::Result;
use crate::results::store::RunStore;
use crate::shutdown::Shutdown;
use crate::telemetry::Telemetry;

/// Whether a strategy can run.
#[derive(Debug, Clone, PartialEq)]
pub enum Prepared {
    /// Cells can be launched.
    Ready,
    /// It cannot run here; the reason (with what an administrator could do).
    Unavailable(String),
}

/// A pod's state as the backend sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum PodState {
    /// Started, not yet ready.
    Starting,
    /// Ready and serving metrics.
    Running,
    /// Could not be scheduled / given a GPU.
    Pending(String),
    /// Stopped on its own: exit code (4 = out of GPU memory), and what happened.
    Exited {
        /// Exit code, when the process had one.
        code: Option<i32>,
        /// What the backend knows (last log line, Kubernetes reason).
        detail: String,
    },
}

/// One launched pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    /// The `pod` label.
    pub name: String,
    /// Where its metrics are scraped (`http://host:port/metrics`), if it runs.
    pub metrics_url: Option<String>,
    /// Its state.
    pub state: PodState,
}

/// A pod of a cell whose pods differ (an isolation trial): its name and the workload
/// arguments added to the run's own.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSpec {
    /// The `pod` label.
    pub name: String,
    /// Extra workload arguments.
    pub args: Vec<String>,
    /// What the pod's cell is, for its log's name (e.g. `fault`; empty: the pod count).
    pub group: String,
    /// It runs gpushare-workload even where the run's pods are a server of the user's
    /// own (`--workload-cmd`): an isolation trial's aggressors, whose load, memory,
    /// fault and crash are gpushare-workload's flags.
    pub builtin: bool,
}

/// How a backend set the last launched cell up (recorded in its aggregate row).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CellSetup {
    /// Seconds from the first change for the cell to the node serving it.
    pub switch_s: Option<f64>,
    /// Of which the MIG reconfiguration, seconds.
    pub mig_reconfigure_s: Option<f64>,
    /// Seconds from launch to every pod ready.
    pub pods_ready_s: Option<f64>,
    /// What a reader should know (the configuration the cell ran under).
    pub note: Option<String>,
    /// The MPS limits each client got, where they are not the equal split over the
    /// cell's pods (a DRA claim's `GpuConfig`).
    pub mps_split: Option<String>,
}

/// Where pods run.
#[allow(async_fn_in_trait)] // used generically on one task; no Send bounds needed
pub trait Backend {
    /// Short name for records ("local", "kubernetes").
    fn name(&self) -> &'static str;

    /// Readies an arm: its strategy (Kubernetes: switch the node; local: check it can
    /// run) and, through DRA, the claim settings its cells' launches use.
    async fn prepare(&mut self, arm: Arm, shutdown: &Shutdown) -> Result<Prepared>;

    /// Starts the pods of one cell, each with `args` added to the run's workload
    /// arguments (the cell's load: `--load poisson:RATE`).
    async fn launch(&mut self, strategy: Strategy, pods: u32, args: &[String], shutdown: &Shutdown)
    -> Result<Vec<Pod>>;

    /// Starts a cell whose pods differ, one per spec in order (the first is the one an
    /// exclusive GPU goes to); the strategy's limits are those of `specs.len()` pods.
    async fn launch_pods(&mut self, strategy: Strategy, specs: &[PodSpec], shutdown: &Shutdown) -> Result<Vec<Pod>> {
        let _ = (strategy, shutdown);
        Err(crate::error::BenchError::Spawn {
            pod: specs.first().map_or_else(|| "all".into(), |s| s.name.clone()),
            reason: format!(
                "the {} backend cannot launch pods with their own arguments yet",
                self.name()
            ),
        })
    }

    /// MPS: the client limits the next launches give (`auto`: the split over the cell's
    /// pods). An isolation run measures its MPS victim alone under the limits it gets
    /// beside aggressors. Err: this backend cannot set them per cell, and why.
    fn set_mps_limits(&mut self, limits: MpsLimits) -> std::result::Result<(), String> {
        if limits.is_auto() {
            Ok(())
        } else {
            Err(format!(
                "the {} backend cannot set MPS's client limits per cell",
                self.name()
            ))
        }
    }

    /// Starts a pod of the current cell again, with its name, arguments and place under
    /// the strategy (the same MPS server while it runs): after a fault or a crash, does
    /// the strategy serve again? [`wait_ready`](Self::wait_ready) then waits for it.
    async fn relaunch_pod(&mut self, name: &str, shutdown: &Shutdown) -> Result<()> {
        let _ = shutdown;
        Err(crate::error::BenchError::Spawn {
            pod: name.into(),
            reason: format!("the {} backend cannot start a pod again yet", self.name()),
        })
    }

    /// Waits until every launched pod is ready, pending or gone, at most `timeout`.
    async fn wait_ready(&mut self, timeout: Duration, shutdown: &Shutdown) -> Result<Vec<Pod>>;

    /// The current state of the launched pods.
    async fn poll(&mut self) -> Vec<Pod>;

    /// Stops the cell's pods (and a per-cell MPS daemon); returns their last states. A
    /// forced stop skips the grace periods but still stops everything.
    async fn stop_pods(&mut self, shutdown: &Shutdown) -> Result<Vec<Pod>>;

    /// Puts the machine or node back as it was found.
    async fn restore(&mut self, shutdown: &Shutdown) -> Result<()>;

    /// How the last launched cell was set up (None: nothing to record).
    fn cell_setup(&self) -> Option<CellSetup> {
        None
    }
}

/// A backend ready to run a sweep's cells: what each backend's `session::open` returns
/// to the generic runner (`sweep::runner`).
pub struct Session<B> {
    /// Where pods run.
    pub backend: B,
    /// The run directory (new, or the one being resumed).
    pub store: RunStore,
    /// Where metrics come from (from the recorded plan).
    pub metrics: PrometheusSetting,
    /// GPU telemetry during measurements.
    pub telemetry: Arc<dyn Telemetry>,
    /// How cells are measured (from the recorded plan).
    pub settings: MeasureSettings,
    /// What the user should read before the first cell.
    pub notes: Vec<String>,
    /// Things that must live as long as the sweep (a port-forward).
    pub keep_alive: Vec<Box<dyn std::any::Any + Send>>,
}

/// One GPU of a run that measures several at once (`--gpus`): its backend, whose pods
/// use only that GPU, and its telemetry.
pub struct Lane<B> {
    /// The GPU's index, recorded in the rows it measures.
    pub gpu: u32,
    /// Where that GPU's pods run.
    pub backend: B,
    /// That GPU's telemetry.
    pub telemetry: Arc<dyn Telemetry>,
}
