//! The Kubernetes backend against Kubernetes' own control plane (v1.34: API server,
//! scheduler, controllers) with a GPU node played through its API
//! (`gpushare_k8s_sim::cluster`): whole sweeps as the service account of
//! `manifests/base/rbac.yaml`, after the user's `kubectl apply -k manifests/base`; kills
//! mid-switch, resume and restore, refused set-ups. Metrics are synthetic here: these
//! tests are about what the harness does to the cluster, not about numbers.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::base::{KubeSettings, restore_from_journal};
use super::device_plugin::KubernetesBackend;
use super::journal;
use super::objects::{self, WorkloadSpec};
use crate::backend::Session;
use crate::config::options::SweepOptions;
use crate::config::plan::{MeasureSettings, SweepPlan};
use crate::domain::{DeviceKind, Source, Strategy};
use crate::error::Result;
use crate::metrics::{MetricsSource, PodSnapshot, Target};
use crate::results::record::{Environment, RunRecord};
use crate::results::store::RunStore;
use crate::shutdown::Shutdown;
use crate::stats::Histogram;
use crate::sweep::SweepOutcome;
use crate::sweep::progress::Progress;
use crate::sweep::runner::run_with_source;
use crate::telemetry::NoTelemetry;
use gpushare_k8s_sim::ClusterSpec;
use gpushare_k8s_sim::cluster::TestCluster;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;

/// Node seconds per wall-clock second.
const SPEED: f64 = 50.0;

/// Every pod serves 100 inferences/s of 10 ms from its first scrape on.
#[derive(Default)]
struct SteadyMetrics {
    first: Mutex<HashMap<String, Instant>>,
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
                        load_seed: None,
                    }),
                )
            })
            .collect())
    }
}

struct Quiet;

impl Progress for Quiet {
    fn sweep_start(&self, _: u64, _: u64, _: &str) {}
    fn cell_start(&self, _: &str) {}
    fn phase(&self, _: &str) {}
    fn window(&self, _: usize, _: f64, _: f64, _: bool) {}
    fn cell_done(&self, _: &str, _: bool) {}
    fn message(&self, _: &str) {}
    fn finish(&self) {}
}

fn plan(dir: &Path, strategies: &str, pods: &str) -> SweepPlan {
    let o: SweepOptions = toml::from_str(&format!(
        "backend = \"kubernetes\"\nnode = \"gpu-1\"\nstrategies = \"{strategies}\"\npods = \"{pods}\"\nrun_id = \"sim\"\nout = \"{}\"\n",
        dir.display()
    ))
    .expect("options");
    SweepPlan::from_options(o).expect("plan")
}

fn settings(plan: &SweepPlan) -> KubeSettings {
    let workload = WorkloadSpec {
        namespace: plan.namespace.clone(),
        image: plan.image.clone(),
        node: "gpu-1".into(),
        args: vec!["--model".into(), "yolos-small".into()],
        tolerations: vec![objects::DEFAULT_TOLERATION.into()],
        pull_secrets: Vec::new(),
        server: None,
    };
    let mut s = KubeSettings::new("gpu-1", workload);
    s.strategies = plan.strategies.clone();
    s.pods = plan.pods.clone();
    s.mig_layout = plan.mig_layout.clone();
    s.faster(SPEED)
}

/// Opens a session as `k8s::session::open` does (check the cluster, create or reopen
/// the run, attach its journal) on the simulator's client.
async fn session(c: &TestCluster, plan: &SweepPlan, resume: bool) -> Result<Session<KubernetesBackend>> {
    session_with(c, plan, resume, settings(plan)).await
}

/// [`session`] with the backend's settings given.
async fn session_with(
    c: &TestCluster,
    plan: &SweepPlan,
    resume: bool,
    settings: KubeSettings,
) -> Result<Session<KubernetesBackend>> {
    let client = c.harness_client().await.expect("the harness's service account");
    let mut backend = KubernetesBackend::new(client, settings);
    backend.check_cluster().await?;
    let store = if resume {
        RunStore::open(&plan.out, "sim")?
    } else {
        RunStore::create(
            &plan.out,
            RunRecord::new("sim".into(), plan, DeviceKind::Cuda, Environment::default()),
        )?
    };
    backend.attach_journal(store.dir())?;
    Ok(Session {
        backend,
        settings: sim_measure(),
        metrics: crate::config::plan::PrometheusSetting::Off,
        store,
        telemetry: Arc::new(NoTelemetry),
        notes: Vec::new(),
        keep_alive: Vec::new(),
    })
}

/// Cells measured in a fraction of a wall-clock second, ready within 600 virtual seconds.
fn sim_measure() -> MeasureSettings {
    MeasureSettings {
        ready_timeout: Duration::from_secs_f64(600.0 / SPEED),
        warmup: Duration::ZERO,
        window: Duration::from_millis(30),
        max_cell: Duration::from_millis(300),
        stable_windows: 2,
        tolerance: 0.5,
    }
}

async fn sweep(c: &TestCluster, plan: &SweepPlan, resume: bool) -> Result<SweepOutcome> {
    let shutdown = Shutdown::new();
    let s = session(c, plan, resume).await?;
    run_with_source(s, &SteadyMetrics::default(), &Quiet, &shutdown).await
}

/// Asks for a stop (Ctrl-C) when the first cell is done.
struct StopAfterFirst(Shutdown);

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

/// The label mig-parted adds when a node without it goes through a MIG change: it
/// pauses `nvidia.com/gpu.deploy.nvsm` and sets it back to `true` whatever it was, unless
/// `false` (mig-parted v0.13.1 `pkg/mig/reconfigure/reconfigure.go` `maybeSetPaused`,
/// `maybeSetTrue`). The harness did not set it and does not remove it.
const MIG_MANAGER_ADDS: &str = "nvidia.com/gpu.deploy.nvsm";

/// The node's labels and the device-plugin ConfigMap, after the operator has settled.
async fn state(c: &TestCluster) -> (BTreeMap<String, String>, Option<BTreeMap<String, String>>) {
    c.node.settle(150.0).await;
    let node = Api::<Node>::all(c.admin.clone()).get("gpu-1").await.expect("node");
    let mut labels: BTreeMap<String, String> = node.metadata.labels.unwrap_or_default().into_iter().collect();
    if labels.get(MIG_MANAGER_ADDS).map(String::as_str) == Some("true") {
        labels.remove(MIG_MANAGER_ADDS);
    }
    let cms: Api<ConfigMap> = Api::namespaced(c.admin.clone(), "gpu-operator");
    let cm = cms
        .get_opt("device-plugin-config")
        .await
        .expect("ConfigMap")
        .map(|cm| cm.data.unwrap_or_default().into_iter().collect());
    (labels, cm)
}

/// A cluster where the user ran `kubectl apply -k manifests/base`, as the docs say. The
/// operator's periodic relabelling is off, so that a label the harness wrongly removed
/// stays removed.
async fn start(spec: ClusterSpec) -> TestCluster {
    let mut spec = spec;
    spec.timings.operator_reconcile = 1e9;
    spec.workload_time_scale = SPEED;
    let c = TestCluster::start(spec, SPEED).await.unwrap_or_else(|e| panic!("{e}"));
    c.apply_manifests("base").unwrap_or_else(|e| panic!("{e}"));
    c
}

/// Checks every cell was measured (not pending or failed) and what the pods ran on.
fn check_cells(c: &TestCluster, dir: &Path, cells: usize) {
    let text = std::fs::read_to_string(dir.join("sim/cells.jsonl")).expect("cells");
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("row")).collect();
    let agg: Vec<&Value> = rows.iter().filter(|r| r["pod"] == "all").collect();
    assert_eq!(agg.len(), cells, "{}", c.log());
    for r in &agg {
        assert_eq!(r["status"], "ok", "{r}\n{}", c.log());
        // What switching cost is recorded per cell.
        assert!(r["switch_s"].is_number() && r["pods_ready_s"].is_number(), "{r}");
        assert!(
            r["note"]
                .as_str()
                .is_some_and(|n| n.contains("device-plugin entry") || n.contains("MIG layout")),
            "{r}"
        );
    }
    if let Some(mig1) = agg.iter().find(|r| r["strategy"] == "mig" && r["pods"] == 1) {
        assert!(mig1["mig_reconfigure_s"].as_f64().is_some_and(|s| s > 0.0), "{mig1}");
    }
    if let Some(mps1) = agg.iter().find(|r| r["strategy"] == "mps" && r["pods"] == 1) {
        assert!(
            mps1["note"].as_str().is_some_and(|n| n.contains("2 MPS replicas")),
            "{mps1}"
        );
    }
    // Every pod ran under its own cell's configuration.
    let facts = c.node.facts();
    let max = {
        facts
            .values()
            .filter_map(|f| f.cell.rsplit_once('-').and_then(|(_, n)| n.parse::<u32>().ok()))
            .max()
            .unwrap_or(1)
    };
    {
        for (pod, f) in &facts {
            let (strategy, n) = f.cell.rsplit_once('-').expect("cell label");
            let n: u32 = n.parse().expect("pods");
            let (replicas, mig) = match strategy {
                "mps" => (objects::sharing_replicas(n), false),
                "time-slicing" => (objects::sharing_replicas(max), false),
                "mig" => (1, true),
                _ => (1, false),
            };
            assert_eq!(
                (f.plugin_replicas, f.mig),
                (Some(replicas), mig),
                "{pod} of cell {}",
                f.cell
            );
            if strategy == "mps" {
                assert_eq!(
                    f.mps_enforced,
                    Some(replicas),
                    "{pod}: the MPS daemon did not enforce the plugin's {replicas} replicas"
                );
            }
        }
    }
    // Keys were projected before the relabel: no config-manager ever missed its file.
    let log = c.node.log();
    assert!(!log.contains("does not exist"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_sweep_in_both_directions_leaves_the_node_as_it_began() {
    for order in ["time-slicing,mps,mig,exclusive", "exclusive,mig,mps,time-slicing"] {
        let c = start(ClusterSpec::h100("gpu-1")).await;
        let before = state(&c).await;
        let dir = tempfile::tempdir().expect("tmp");
        let p = plan(dir.path(), order, "1,3,5,7");
        let outcome = sweep(&c, &p, false)
            .await
            .unwrap_or_else(|e| panic!("{order}: {e}\n{}", c.log()));
        let cells = std::fs::read_to_string(dir.path().join("sim/cells.jsonl")).unwrap_or_default();
        let bad: Vec<&str> = cells
            .lines()
            .filter(|l| l.contains("\"pod\":\"all\"") && !l.contains("\"status\":\"ok\""))
            .collect();
        assert_eq!(
            (outcome.measured, outcome.failed),
            (16, 0),
            "{order}: {bad:#?}\n{}",
            c.log()
        );
        check_cells(&c, dir.path(), 16);
        let facts = c.node.facts();
        assert!(facts.values().any(|f| f.mig) && facts.values().any(|f| f.mps_enforced.is_some()));
        assert_eq!(
            state(&c).await,
            before,
            "{order}: node or ConfigMap not as they began\n{}",
            c.log()
        );
        let j = journal::read(&dir.path().join("sim").join(journal::FILE))
            .expect("journal")
            .expect("exists");
        assert!(j.restored && !j.has_changes());
    }
}
