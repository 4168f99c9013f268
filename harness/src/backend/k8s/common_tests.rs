//! What the Kubernetes backend's test modules share: synthetic metrics, silent progress, a plan
//! and the backend's settings on the test node `gpu-1`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::base::KubeSettings;
use super::objects::{self, WorkloadSpec};
use crate::backend::Session;
use crate::config::options::SweepOptions;
use crate::config::plan::{MeasureSettings, SweepPlan};
use crate::domain::{DeviceKind, Source};
use crate::error::Result;
use crate::metrics::{MetricsSource, PodSnapshot, Target};
use crate::results::record::{Environment, RunRecord};
use crate::results::store::RunStore;
use crate::shutdown::Shutdown;
use crate::stats::Histogram;
use crate::sweep::progress::Progress;
use crate::telemetry::NoTelemetry;

/// What a pod's metrics say of its GPU, by pod name (`workload_info{device_uuid}`).
pub type DeviceOf = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Every pod serves 100 inferences/s of 10 ms from its first scrape on.
#[derive(Default)]
pub struct SteadyMetrics {
    first: Mutex<HashMap<String, Instant>>,
    device_of: Option<DeviceOf>,
}

impl SteadyMetrics {
    /// Pods that also say which GPU they run on, as `device_of` tells.
    pub fn reporting_devices(device_of: DeviceOf) -> Self {
        Self {
            device_of: Some(device_of),
            ..Self::default()
        }
    }
}

impl MetricsSource for SteadyMetrics {
    fn kind(&self) -> Source {
        Source::Scrape
    }

    async fn snapshot(&self, targets: &[Target]) -> Result<Vec<(String, Result<PodSnapshot>)>> {
        let now = Instant::now();
        let mut first = self.first.lock().expect("lock");
        Ok(targets
            .iter()
            .map(|t| {
                let t0 = *first.entry(t.pod.clone()).or_insert(now);
                let count = ((now - t0).as_secs_f64() * 100.0).floor();
                let latency = Histogram {
                    buckets: vec![(0.01, count), (f64::INFINITY, count)],
                    sum: count * 0.01,
                    count,
                };
                (
                    t.pod.clone(),
                    Ok(PodSnapshot {
                        at: now,
                        latency,
                        errors: 0.0,
                        backlog: None,
                        load_seed: None,
                        device_uuid: self.device_of.as_ref().and_then(|f| f(&t.pod)),
                        last_error: None,
                        streamed: None,
                        tokens: None,
                        server: None,
                    }),
                )
            })
            .collect())
    }
}

/// Asks for a stop (Ctrl-C) when the first cell is done.
pub struct StopAfterFirst(pub Shutdown);

impl Progress for StopAfterFirst {
    fn sweep_start(&self, _: u64, _: u64, _: &str) {}
    fn cell_start(&self, _: &str) {}
    fn phase(&self, _: &str) {}
    fn window(&self, _: usize, _: f64, _: f64, _: bool) {}
    fn cell_done(&self, _: &str, _: bool) {
        self.0.request(libc::SIGINT);
    }
    fn message(&self, _: &str) {}
    fn finish(&self) {}
}

/// A Kubernetes sweep's plan on node `gpu-1`, its run `sim` under `dir`.
pub fn plan(dir: &Path, strategies: &str, pods: &str) -> SweepPlan {
    let o: SweepOptions = toml::from_str(&format!(
        "backend = \"kubernetes\"\nnode = \"gpu-1\"\nstrategies = \"{strategies}\"\npods = \"{pods}\"\nrun_id = \"sim\"\nout = \"{}\"\n",
        dir.display()
    ))
    .expect("options");
    SweepPlan::from_options(o).expect("plan")
}

/// A Kubernetes plan's own settings.
pub fn kube(plan: &SweepPlan) -> &crate::config::plan::KubernetesPlan {
    plan.kubernetes().expect("a Kubernetes plan")
}

/// The DRA settings of a plan with `--sharing-api dra`.
pub fn dra_of(plan: &SweepPlan) -> crate::config::plan::DraSettings {
    plan.dra().expect("a DRA plan").clone()
}

/// The backend's settings for `plan` on node `gpu-1`, its waits `speed` times shorter.
pub fn settings(plan: &SweepPlan, speed: f64) -> KubeSettings {
    let workload = WorkloadSpec {
        namespace: kube(plan).namespace.clone(),
        image: kube(plan).image.clone(),
        node: "gpu-1".into(),
        args: vec!["--model".into(), "yolos-small".into()],
        tolerations: vec![objects::DEFAULT_TOLERATION.into()],
        pull_secrets: Vec::new(),
        server: None,
    };
    let mut s = KubeSettings::new("gpu-1", workload);
    s.strategies = plan.strategies.clone();
    s.pods = plan.pods.clone();
    s.mig_layout = kube(plan).mig_layout.clone();
    s.faster(speed)
}

/// Cells measured in a fraction of a wall-clock second, ready within 600 node seconds.
pub fn measure(speed: f64) -> MeasureSettings {
    MeasureSettings {
        ready_timeout: Duration::from_secs_f64(600.0 / speed),
        warmup: Duration::ZERO,
        steady_warmup: false,
        window: Duration::from_millis(30),
        max_cell: Duration::from_millis(300),
        stable_windows: 2,
        tolerance: 0.5,
    }
}

/// The run `sim` of `plan`: created, or reopened to resume.
pub fn run_store(plan: &SweepPlan, resume: bool) -> Result<RunStore> {
    run_store_filling(plan, resume, 1)
}

/// [`run_store`] of a run whose cells fill `gpus` GPUs of the node.
pub fn run_store_filling(plan: &SweepPlan, resume: bool, gpus: u32) -> Result<RunStore> {
    if resume {
        RunStore::open(&plan.out, "sim")
    } else {
        let env = Environment {
            gpus_filled: (gpus > 1).then_some(gpus),
            ..Environment::default()
        };
        RunStore::create(&plan.out, RunRecord::new("sim".into(), plan, DeviceKind::Cuda, env))
    }
}

/// A session of `backend` (its journal attached to `store`) with synthetic metrics
/// and no telemetry, measuring as `measure` says.
pub fn session_of<B>(backend: B, store: RunStore, measure: MeasureSettings) -> Session<B> {
    Session {
        backend,
        settings: measure,
        metrics: crate::config::plan::PrometheusSetting::Off,
        store,
        telemetry: Arc::new(NoTelemetry),
        notes: Vec::new(),
        keep_alive: Vec::new(),
    }
}
