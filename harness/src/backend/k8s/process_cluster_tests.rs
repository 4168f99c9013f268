//! End to end on the real control plane with pods that really run: the node's kubelet
//! starts each workload pod's container as a local `gpushare-workload` process (the CPU
//! `tiny` model; the pod's own IP on loopback), a real Prometheus discovers the pods
//! through `kubernetes_sd_configs` against the real API server (as kube-prometheus's
//! `prometheus-k8s` service account, with the Role the base manifests grant it) and
//! scrapes them, and the harness reads every cell from that Prometheus by URL. The
//! numbers are CPU numbers of the `tiny` model: they test the path, not a GPU.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::cluster_tests::{settings, sim_rows, start, state};
use super::common_tests::{self, plan};
use super::device_plugin::KubernetesBackend;
use crate::backend::Session;
use crate::config::plan::{MeasureSettings, PrometheusSetting, SweepPlan};
use crate::shutdown::Shutdown;
use crate::sweep::progress::Quiet;
use gpushare_k8s_sim::ClusterSpec;
use gpushare_k8s_sim::cluster::TestCluster;
use gpushare_k8s_sim::node::ProcessSpec;
use gpushare_k8s_sim::prometheus::DiscoveringPrometheus;

/// The workload binary of this build (`make test` builds the workspace first).
fn workload_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe.parent().and_then(Path::parent).expect("target directory");
    let bin = dir.join("gpushare-workload");
    assert!(bin.is_file(), "{} missing: build the workspace first", bin.display());
    bin
}

/// A node whose workload pods run `gpushare-workload` for real.
fn running(spec: ClusterSpec, logs: &Path) -> ClusterSpec {
    let mut spec = spec;
    spec.processes = Some(ProcessSpec {
        images: [(crate::config::plan::DEFAULT_IMAGE.to_string(), workload_binary())].into(),
        logs: logs.to_path_buf(),
    });
    spec
}

/// Cells long enough for a 1 s scrape interval: rates over windows of a few scrapes.
fn scraped_measure() -> MeasureSettings {
    MeasureSettings {
        ready_timeout: Duration::from_secs(60),
        warmup: Duration::from_secs(2),
        steady_warmup: false,
        window: Duration::from_secs(3),
        max_cell: Duration::from_secs(12),
        stable_windows: 2,
        tolerance: 0.5,
    }
}

/// The plan as a CPU run of the `tiny` model, so that every row says what ran.
fn on_cpu(p: SweepPlan) -> SweepPlan {
    SweepPlan {
        model: Some(crate::config::values::Model::Tiny),
        precision: Some(crate::config::values::Precision::Fp32),
        device: crate::config::values::DeviceChoice::Cpu,
        ..p
    }
}

/// The run `sim` of `plan`, recorded as a CPU run.
fn cpu_run_store(p: &SweepPlan) -> crate::results::store::RunStore {
    use crate::results::record::{Environment, RunRecord};
    crate::results::store::RunStore::create(
        &p.out,
        RunRecord::new("sim".into(), p, crate::domain::DeviceKind::Cpu, Environment::default()),
    )
    .expect("run")
}

/// The backend's settings for the CPU workload.
fn cpu_settings(p: &SweepPlan) -> super::base::KubeSettings {
    let mut k = settings(p);
    k.workload.args = ["--model", "tiny", "--device", "cpu", "--precision", "fp32"]
        .map(String::from)
        .to_vec();
    k
}

/// Checks each cell of `rows` was measured from real scrapes: every pod served.
fn check_measured(c: &TestCluster, rows: &[Value], cells: usize, logs: &Path) {
    let agg: Vec<&Value> = rows.iter().filter(|r| r["pod"] == "all").collect();
    let log = || {
        let mut out = c.log();
        for e in std::fs::read_dir(logs).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            out.push_str(&format!("\n--- {} ---\n{}", e.path().display(), text));
        }
        out
    };
    assert_eq!(agg.len(), cells, "{rows:#?}\n{}", log());
    // Every pod that ran served, each its own process (under exclusive, one pod per GPU
    // runs and the others stay pending), and the rows say what ran.
    for r in rows.iter().filter(|r| r["pod"] != "all" && r["status"] != "pending") {
        assert_eq!(
            (&r["device"], &r["model"]),
            (&serde_json::json!("cpu"), &serde_json::json!("tiny")),
            "{r}"
        );
        assert!(
            r["throughput_per_s"].as_f64().is_some_and(|t| t > 0.0),
            "a pod that served nothing: {r}\n{}",
            log()
        );
    }
    for r in &agg {
        assert_eq!(r["status"], "ok", "{r}\n{}", log());
        let tput = r["throughput_per_s"].as_f64().unwrap_or_default();
        assert!(tput > 0.0, "no inferences: {r}");
        assert!(r["p50_s"].as_f64().is_some_and(|p| p > 0.0), "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_of_real_pods_is_measured_through_a_prometheus_that_discovers_them() {
    let tmp = tempfile::tempdir().expect("tmp");
    let logs = tmp.path().join("pods");
    let c = start(running(ClusterSpec::h100("gpu-1"), &logs)).await;
    let before = state(&c).await;
    let prom = DiscoveringPrometheus::start(&c, "gpushare-bench", tmp.path())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tmp");
    let p = on_cpu(plan(dir.path(), "exclusive,time-slicing,mps", "1,3"));
    let client = c.harness_client().await.expect("client");
    let mut backend = KubernetesBackend::new(client, cpu_settings(&p));
    backend.check_cluster().await.expect("cluster");
    let store = cpu_run_store(&p);
    backend.attach_journal(store.dir()).expect("journal");
    let mut s: Session<KubernetesBackend> = common_tests::session_of(backend, store, scraped_measure());
    s.metrics = PrometheusSetting::Url(prom.url.clone());
    let outcome = crate::sweep::runner::run(s, &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let rows = sim_rows(dir.path());
    assert_eq!((outcome.measured, outcome.failed), (6, 0), "{rows:#?}\n{}", c.log());
    check_measured(&c, &rows, 6, &logs);
    // Prometheus found every pod that ran through the API server: 1 + 3 under
    // time-slicing and MPS, 1 + 1 under exclusive (one GPU; the other two stay pending).
    assert_eq!(scraped_pods(&prom).await, 10, "{}", prom.log());
    assert_eq!(state(&c).await, before, "{}", c.log());
}

/// How many workload pods Prometheus scraped in the last ten minutes (by their `pod`
/// label, which only its Kubernetes discovery sets).
async fn scraped_pods(prom: &DiscoveringPrometheus) -> usize {
    let q = "count(count by (pod) (count_over_time(up{job=\"gpushare-workload\",namespace=\"gpushare-bench\"}[10m])))";
    let v = crate::metrics::prometheus::PromClient::new(&prom.url)
        .query(q, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    v.first().map_or(0, |s| s.value as usize)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_sweep_of_real_pods_is_measured_through_a_prometheus_that_discovers_them() {
    let tmp = tempfile::tempdir().expect("tmp");
    let logs = tmp.path().join("pods");
    let mut spec = running(ClusterSpec::h100("gpu-1"), &logs);
    spec.dra = Some(gpushare_k8s_sim::dra::Gates {
        time_slicing: true,
        mps: true,
    });
    spec.device_plugin = false;
    let c = start(spec).await;
    c.apply_manifests("dra").unwrap_or_else(|e| panic!("{e}"));
    let prom = DiscoveringPrometheus::start(&c, "gpushare-bench", tmp.path())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tmp");
    let o: crate::config::options::SweepOptions = toml::from_str(&format!(
        "backend = \"kubernetes\"\nnode = \"gpu-1\"\nsharing_api = \"dra\"\nstrategies = \"time-slicing,mps\"\npods = \"1,3\"\nrun_id = \"sim\"\nout = \"{}\"\n",
        dir.path().display()
    ))
    .expect("options");
    let p = on_cpu(SweepPlan::from_options(o).expect("plan"));
    let client = c.harness_client().await.expect("client");
    let mut backend = super::dra::DraBackend::new(client, cpu_settings(&p), super::common_tests::dra_of(&p));
    backend.check_cluster().await.expect("cluster");
    let store = cpu_run_store(&p);
    backend.attach_journal(store.dir()).expect("journal");
    let mut s = common_tests::session_of(backend, store, scraped_measure());
    s.metrics = PrometheusSetting::Url(prom.url.clone());
    let outcome = crate::sweep::runner::run(s, &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let rows = sim_rows(dir.path());
    assert_eq!((outcome.measured, outcome.failed), (4, 0), "{rows:#?}\n{}", c.log());
    check_measured(&c, &rows, 4, &logs);
    assert_eq!(scraped_pods(&prom).await, 8, "{}", prom.log());
}
