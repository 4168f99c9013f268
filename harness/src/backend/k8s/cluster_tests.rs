//! The Kubernetes backend against Kubernetes' own control plane (v1.34: API server,
//! scheduler, controllers) with a GPU node played through its API
//! (`gpushare_k8s_sim::cluster`): whole sweeps as the service account of
//! `manifests/base/rbac.yaml`, after the user's `kubectl apply -k manifests/base`; kills
//! mid-switch, resume and restore, refused set-ups. Metrics are synthetic here: these
//! tests are about what the harness does to the cluster, not about numbers.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::base::{KubeSettings, restore_from_journal};
use super::common_tests::{self, SteadyMetrics, StopAfterFirst, plan};
use super::device_plugin::KubernetesBackend;
use super::journal;
use super::objects::{self};
use crate::backend::Session;
use crate::config::options::SweepOptions;
use crate::config::plan::{MeasureSettings, SweepPlan};
use crate::domain::Strategy;
use crate::error::Result;
use crate::shutdown::Shutdown;
use crate::sweep::SweepOutcome;
use crate::sweep::progress::Quiet;
use crate::sweep::runner::run_with_source;
use gpushare_k8s_sim::ClusterSpec;
use gpushare_k8s_sim::cluster::TestCluster;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;

/// Node seconds per wall-clock second.
const SPEED: f64 = 50.0;

fn settings(plan: &SweepPlan) -> KubeSettings {
    common_tests::settings(plan, SPEED)
}

fn sim_measure() -> MeasureSettings {
    common_tests::measure(SPEED)
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
    let store = common_tests::run_store(plan, resume)?;
    backend.attach_journal(store.dir())?;
    Ok(common_tests::session_of(backend, store, sim_measure()))
}

async fn sweep(c: &TestCluster, plan: &SweepPlan, resume: bool) -> Result<SweepOutcome> {
    let shutdown = Shutdown::new();
    let s = session(c, plan, resume).await?;
    run_with_source(s, &SteadyMetrics::default(), &Quiet, &shutdown).await
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_deployment_applied_by_kubectl_is_refused_before_any_change_and_left_alone() {
    // The user ran the workload by hand before (`kubectl apply -k manifests/workload`,
    // as `manifests/base` itself did in earlier versions): kubectl's client-side apply
    // owns its fields, among them the `nvidia.com/gpu` request.
    let c = start(ClusterSpec::h100("gpu-1")).await;
    c.apply_manifests("workload").unwrap_or_else(|e| panic!("{e}"));
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "time-slicing", "1");
    let err = match sweep(&c, &p, false).await {
        Ok(o) => panic!("the sweep ran over the user's Deployment: {o:?}\n{}", c.log()),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(
            "Deployment gpushare-bench/gpushare-workload exists with fields written by kubectl-client-side-apply"
        ) && err.contains("kubectl delete deployment -n gpushare-bench gpushare-workload"),
        "{err}"
    );
    assert_eq!(state(&c).await, before, "refused before any change\n{}", c.log());
    c.kubectl(&["get", "deployment", "-n", "gpushare-bench", "gpushare-workload"])
        .unwrap_or_else(|e| panic!("the user's Deployment is gone: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_deployment_still_being_deleted_is_waited_out_before_the_next_apply() {
    // A Deployment of the harness's (a killed run's, say) that another controller's
    // finalizer keeps while it is deleted: an apply landing on it changes an object the
    // Deployment controller no longer scales, and the cell would get no pods.
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let deps: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(c.admin.clone(), "gpushare-bench");
    let held = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "gpushare-workload", "namespace": "gpushare-bench", "finalizers": ["test.gpushare.dev/hold"]},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "held"}},
                 "template": {"metadata": {"labels": {"app": "held"}}, "spec": {"containers": [{"name": "w", "image": "x"}]}}}
    });
    deps.patch(
        "gpushare-workload",
        &kube::api::PatchParams::apply(objects::FIELD_MANAGER),
        &kube::api::Patch::Apply(held),
    )
    .await
    .expect("apply");
    deps.delete("gpushare-workload", &Default::default())
        .await
        .expect("delete");
    let release = {
        let deps = deps.clone();
        let after = c.node.wall(400.0);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let patch = serde_json::json!({"metadata": {"finalizers": null}});
            deps.patch(
                "gpushare-workload",
                &Default::default(),
                &kube::api::Patch::Merge(patch),
            )
            .await
            .map(|_| ())
        })
    };
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "time-slicing", "1");
    let outcome = sweep(&c, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    release.await.expect("join").expect("finalizer removed");
    let rows = sim_rows(dir.path());
    assert_eq!((outcome.measured, outcome.failed), (1, 0), "{rows:#?}\n{}", c.log());
}

/// A node with NVIDIA's DRA driver (its feature gates) and, as the driver's chart
/// requires, without the device plugin.
fn dra_node(time_slicing: bool, mps: bool) -> ClusterSpec {
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.dra = Some(gpushare_k8s_sim::dra::Gates { time_slicing, mps });
    spec.device_plugin = false;
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_run_on_a_node_where_the_device_plugin_also_hands_out_the_gpu_is_refused() {
    let mut spec = dra_node(true, true);
    spec.device_plugin = true;
    let c = start_dra(spec).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps", "1", "");
    let err = match dra_session(&c, &p).await {
        Ok(_) => panic!("a DRA run beside the device plugin was accepted\n{}", c.log()),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("node gpu-1 also has NVIDIA's device plugin, which advertises nvidia.com/gpu: 1")
            && err.contains("nvidia.com/gpu.deploy.device-plugin=false"),
        "{err}"
    );
}

fn dra_plan(dir: &Path, strategies: &str, pods: &str, more: &str) -> SweepPlan {
    let o: SweepOptions = toml::from_str(&format!(
        "backend = \"kubernetes\"\nnode = \"gpu-1\"\nsharing_api = \"dra\"\nstrategies = \"{strategies}\"\npods = \"{pods}\"\nrun_id = \"sim\"\nout = \"{}\"\n{more}",
        dir.display()
    ))
    .expect("options");
    SweepPlan::from_options(o).expect("plan")
}

/// Opens a session as `k8s::session::open_dra` does, as the harness's service account.
async fn dra_session(c: &TestCluster, plan: &SweepPlan) -> Result<Session<super::dra::DraBackend>> {
    let client = c.harness_client().await.expect("the harness's service account");
    let mut backend = super::dra::DraBackend::new(client, settings(plan), plan.dra.clone());
    backend.check_cluster().await?;
    let store = common_tests::run_store(plan, false)?;
    backend.attach_journal(store.dir())?;
    Ok(common_tests::session_of(backend, store, sim_measure()))
}

/// The rows of the run `sim` under `dir`.
fn sim_rows(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("sim/cells.jsonl")).expect("cells");
    text.lines().map(|l| serde_json::from_str(l).expect("row")).collect()
}

/// The arm a row read back as JSON belongs to (`time-slicing-long`).
fn arm_of(r: &Value) -> String {
    let s = r["strategy"].as_str().unwrap_or_default();
    match r["timeslice"].as_str() {
        Some(t) => format!("{s}-{t}"),
        None => s.to_string(),
    }
}

/// The aggregate row of `arm` (a strategy, or `time-slicing-long`) × `pods` among `rows`.
fn agg_row(rows: &[Value], strategy: &str, pods: u64) -> Value {
    rows.iter()
        .find(|r| r["pod"] == "all" && arm_of(r) == strategy && r["pods"] == pods)
        .cloned()
        .unwrap_or_else(|| panic!("{strategy} × {pods} missing: {rows:?}"))
}

/// The workload namespace's claims, claim templates, Deployments and pods, once the
/// controllers have had time to finish deleting.
async fn dra_leftovers(c: &TestCluster) -> Vec<String> {
    c.node.settle(100.0).await;
    let out = c
        .kubectl(&[
            "get",
            "resourceclaims,resourceclaimtemplates,deployments,pods",
            "-n",
            "gpushare-bench",
            "-o",
            "name",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    out.lines().map(str::to_string).collect()
}

/// A cluster with the DRA driver, where the user applied `manifests/base` and
/// `manifests/dra` (the Role for reading the driver's pods).
async fn start_dra(spec: ClusterSpec) -> TestCluster {
    let c = start(spec).await;
    c.apply_manifests("dra").unwrap_or_else(|e| panic!("{e}"));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_sweep_shares_one_gpu_through_claims_and_leaves_nothing() {
    let c = start_dra(dra_node(true, true)).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(
        dir.path(),
        "exclusive,time-slicing,mps,mig",
        "1,3",
        "timeslice = \"default,long\"\n",
    );
    let s = dra_session(&c, &p).await.unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let outcome = run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let rows = sim_rows(dir.path());
    let agg = |s: &str, n: u64| agg_row(&rows, s, n);
    // Exclusive, time-slicing once per interval, MPS: 4 arms × 2 counts; MIG unavailable.
    assert_eq!(
        (outcome.measured, outcome.unavailable),
        (8, 2),
        "{rows:#?}\n{}",
        c.log()
    );
    for (s, n, note) in [
        ("exclusive", 1, "DRA: a claim (and a GPU) per pod"),
        ("time-slicing-default", 1, "GpuConfig TimeSlicing interval Default"),
        ("time-slicing-default", 3, "GpuConfig TimeSlicing interval Default"),
        ("time-slicing-long", 1, "GpuConfig TimeSlicing interval Long"),
        ("time-slicing-long", 3, "GpuConfig TimeSlicing interval Long"),
        (
            "mps",
            3,
            "GpuConfig MPS (33% of the threads, pinned memory 27186Mi per client)",
        ),
    ] {
        let r = agg(s, n);
        assert!(r["note"].as_str().is_some_and(|t| t.contains(note)), "{r}");
        assert!(n == 1 || s == "exclusive" || r["speedup_vs_1pod"].is_number(), "{r}");
    }
    // One GPU: exclusive × 3 gives one pod a claim's GPU; the real scheduler's DRA
    // allocator finds none for the other two claims.
    let ex3: Vec<&Value> = rows
        .iter()
        .filter(|r| r["strategy"] == "exclusive" && r["pods"] == 3 && r["pod"] != "all")
        .collect();
    let pending: Vec<&&Value> = ex3.iter().filter(|r| r["status"] == "pending").collect();
    assert_eq!(pending.len(), 2, "{ex3:#?}");
    assert!(
        pending[0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("cannot allocate all claims")),
        "{:?}",
        pending[0]
    );
    assert!(
        agg("mig", 1)["note"]
            .as_str()
            .is_some_and(|n| n.contains("publishes no MIG device (mig.nvidia.com)")),
        "MIG off: unavailable, and the harness turns nothing on"
    );
    // What the driver applied to each shared cell's pods: one claim, one GPU, and no
    // device-plugin resource beside it.
    let facts = c.node.facts();
    for (cell, want) in [
        (
            "time-slicing-long-3",
            Some(gpushare_k8s_sim::dra::Sharing::TimeSlicing("Long".into())),
        ),
        (
            "time-slicing-default-3",
            Some(gpushare_k8s_sim::dra::Sharing::TimeSlicing("Default".into())),
        ),
        (
            "mps-3",
            Some(gpushare_k8s_sim::dra::Sharing::Mps {
                thread_percentage: Some(33),
                pinned_limit: Some("27186Mi".into()),
            }),
        ),
    ] {
        let of_cell: Vec<&gpushare_k8s_sim::PodFacts> = facts.values().filter(|f| f.cell == cell).collect();
        assert_eq!(of_cell.len(), 3, "{cell}");
        assert!(
            of_cell.iter().all(|f| f.claim == format!("gpushare-{cell}")),
            "{cell}: {of_cell:?}"
        );
        assert!(
            of_cell.iter().all(|f| f.dra_sharing == want && f.gpu == Some(0)),
            "{cell}: {of_cell:?}"
        );
    }
    assert!(
        facts.values().all(|f| f.gpu_resources.is_empty()),
        "a DRA pod also asked for a device-plugin resource: {facts:#?}"
    );
    // A claim of its own per exclusive pod, made from the template by the resourceclaim
    // controller.
    let ex1: Vec<&gpushare_k8s_sim::PodFacts> = facts.values().filter(|f| f.cell == "exclusive-1").collect();
    assert!(
        ex1.len() == 1 && ex1[0].claim.starts_with("gpushare-workload-"),
        "{ex1:?}"
    );
    let left = dra_leftovers(&c).await;
    assert!(left.is_empty(), "{left:?}\n{}", c.log());
    assert_eq!(state(&c).await, before, "nothing on the node changes\n{}", c.log());
    let j = journal::read(&dir.path().join("sim").join(journal::FILE))
        .expect("journal")
        .expect("exists");
    assert!(
        j.restored && j.claims.contains("resourceclaims/gpushare-mps-3"),
        "{j:?}"
    );
    assert!(j.labels_set.is_empty() && j.keys_added.is_empty(), "{j:?}");
}

async fn journal_shows(path: &Path, f: impl Fn(&journal::Journal) -> bool) {
    loop {
        if let Ok(Some(j)) = journal::read(path)
            && f(&j)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Runs a sweep until `when` holds for its journal, then drops it: no restore runs, as
/// when the harness is killed with SIGKILL (the run directory's lock goes with it).
async fn kill_when(c: &TestCluster, plan: &SweepPlan, when: impl Fn(&journal::Journal) -> bool) {
    let path = plan.out.join("sim").join(journal::FILE);
    tokio::select! {
        r = sweep(c, plan, false) => panic!("the sweep ended before the kill: {r:?}\n{}", c.log()),
        () = journal_shows(&path, when) => {}
    }
    // The label patch that follows the journal entry reaches the cluster or not; either
    // way the node is mid-switch now.
}

/// A node whose user had chosen a device-plugin config entry of their own.
fn user_labelled(spec: ClusterSpec) -> ClusterSpec {
    let mut spec = spec;
    spec.labels.insert(objects::LABEL_PLUGIN_CONFIG.into(), "any".into());
    spec
}

async fn node_labels(c: &TestCluster) -> BTreeMap<String, String> {
    let node = Api::<Node>::all(c.admin.clone()).get("gpu-1").await.expect("node");
    node.metadata.labels.unwrap_or_default().into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_mig_switch_then_resumed_restores_the_original_labels_from_the_journal() {
    let c = start(user_labelled(ClusterSpec::h100("gpu-1"))).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "time-slicing,mig,exclusive", "1,3");
    kill_when(&c, &p, |j| j.labels_set.contains_key(objects::LABEL_MIG_CONFIG)).await;
    let mid = node_labels(&c).await;
    assert_ne!(mid.get(objects::LABEL_PLUGIN_CONFIG).map(String::as_str), Some("any"));
    // Resume: the originals come from the journal, not from the node as it is now.
    let outcome = sweep(&c, &p, true)
        .await
        .unwrap_or_else(|e| panic!("resume: {e}\n{}", c.log()));
    assert_eq!(outcome.failed, 0, "{}", c.log());
    check_cells(&c, dir.path(), 6);
    assert_eq!(state(&c).await, before, "{}", c.log());
    // `restore --node` afterwards has nothing left to do.
    let path = dir.path().join("sim").join(journal::FILE);
    let client = c.harness_client().await.expect("client");
    let report = restore_from_journal(&client, &path, &settings(&p), &Shutdown::new())
        .await
        .expect("restore");
    assert!(report.undone.is_empty(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_mps_switch_then_restore_node_puts_back_only_what_the_harness_changed() {
    let mut spec = user_labelled(ClusterSpec::h100("gpu-1"));
    // The user had already installed manifests/device-plugin-config.yaml's exclusive key.
    if let Some(cm) = spec.configmap.as_mut() {
        cm.insert(
            objects::config_entry_name(Strategy::Exclusive, 1),
            objects::device_plugin_config(Strategy::Exclusive, 1),
        );
    }
    let c = start(spec).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "mps", "1,3");
    kill_when(&c, &p, |j| {
        j.labels_set
            .get(objects::LABEL_PLUGIN_CONFIG)
            .is_some_and(|v| v.last().map(String::as_str) == Some("gpushare-mps-3"))
    })
    .await;
    let path = dir.path().join("sim").join(journal::FILE);
    let j = journal::read(&path).expect("journal").expect("exists");
    assert!(
        !j.keys_added.contains_key("gpushare-exclusive"),
        "a key the user had is not the harness's: {j:?}"
    );
    let client = c.harness_client().await.expect("client");
    let report = restore_from_journal(&client, &path, &settings(&p), &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("restore: {e}\n{}", c.log()));
    assert!(!report.undone.is_empty());
    assert_eq!(state(&c).await, before, "{}", c.log());
    let again = restore_from_journal(&client, &path, &settings(&p), &Shutdown::new())
        .await
        .expect("second restore");
    assert!(again.undone.is_empty(), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_then_resumed_restores_at_the_end_of_the_resumed_run() {
    let c = start(user_labelled(ClusterSpec::h100("gpu-1"))).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "time-slicing,mps", "1,3");
    let shutdown = Shutdown::new();
    let s = session(&c, &p, false).await.expect("session");
    let result = run_with_source(
        s,
        &SteadyMetrics::default(),
        &StopAfterFirst(shutdown.clone()),
        &shutdown,
    )
    .await;
    assert!(matches!(&result, Err(e) if e.is_interrupt()), "{result:?}");
    assert_eq!(state(&c).await, before, "Ctrl-C restores\n{}", c.log());
    // The resumed run changes the node again, and must put it back again.
    sweep(&c, &p, true)
        .await
        .unwrap_or_else(|e| panic!("resume: {e}\n{}", c.log()));
    assert_eq!(state(&c).await, before, "the resumed run restores\n{}", c.log());
    let j = journal::read(&dir.path().join("sim").join(journal::FILE))
        .expect("journal")
        .expect("exists");
    assert!(j.restored && !j.has_changes(), "{j:?}");
}

/// An isolation run's plan on the node: every scenario under exclusive, time-slicing and
/// MPS, in wall-clock times (the node scales the pods' own flags to its clock).
fn isolation_plan(dir: &Path) -> SweepPlan {
    use crate::isolation::plan::{IsolationPlan, Scenario};
    let iso = IsolationPlan {
        scenarios: Scenario::ALL.to_vec(),
        victim_rate: 50.0,
        aggressors: vec![1, 3],
        event_after_s: 0.3,
        observe_s: 0.4,
        slo_s: None,
        aggressor_image: None,
    };
    let mut p = plan(dir, "exclusive,time-slicing,mps", "1");
    p.pods = iso.pod_counts();
    p.isolation = Some(iso);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_trials_run_as_two_deployments_and_kubernetes_restarts_the_victim() {
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let plan = isolation_plan(dir.path());
    let shutdown = Shutdown::new();
    let s = session(&c, &plan, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let trials = &mut crate::isolation::command::Trials;
    let finished = crate::sweep::runner::run_work_with_source(s, trials, &SteadyMetrics::default(), &Quiet, &shutdown)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let records = finished.store.isolation().to_vec();
    assert_eq!(records.len(), 18, "{records:#?}");
    let find = |s: Strategy, scenario: &str, k: u32| {
        records
            .iter()
            .find(|r| r.strategy == s && r.scenario == scenario && r.aggressors == k)
            .unwrap_or_else(|| panic!("{s} {scenario} × {k}: {records:#?}"))
    };
    for s in [Strategy::Exclusive, Strategy::TimeSlicing, Strategy::Mps] {
        let alone = find(s, "alone", 0);
        assert_eq!(
            alone.victim_status,
            crate::domain::CellStatus::Ok,
            "{alone:?}\n{}",
            c.log()
        );
        // The crash is the aggressor's own SIGKILL (shareProcessNamespace lets it
        // land); the kubelet restarts it in its pod; the victim serves on.
        if s != Strategy::Exclusive {
            let crash = find(s, "crash", 1);
            assert_eq!(crash.victim_status, crate::domain::CellStatus::Ok, "{crash:?}");
            assert!(
                crash.aggressor_outcome.contains("exit 137"),
                "{}\n{}",
                crash.aggressor_outcome,
                c.log()
            );
        }
    }
    // Exclusive: the victim was bound first (the harness waits for its binding before
    // it applies the aggressors) and holds the GPU; the aggressors wait.
    let ex = find(Strategy::Exclusive, "noisy-neighbour", 3);
    assert_eq!(ex.victim_status, crate::domain::CellStatus::Ok, "{ex:?}");
    assert_eq!((ex.survivors, ex.started), (1, 1), "{ex:?}");
    assert!(ex.aggressor_outcome.contains("pending"), "{ex:?}");
    // Time-slicing: a fault ends the faulting container only.
    let ts = find(Strategy::TimeSlicing, "fault", 1);
    assert_eq!(ts.victim_status, crate::domain::CellStatus::Ok, "{ts:?}");
    assert!(ts.aggressor_outcome.contains("exit 5"), "{ts:?}");
    assert!(ts.recovery.starts_with("not needed"), "{ts:?}");
    // MPS: one server for the node, one fault domain: the victim exits with the
    // aggressor, and the kubelet's restart serves again.
    let mps = find(Strategy::Mps, "fault", 1);
    assert_eq!(mps.victim_exit_code, Some(5), "{mps:?}\n{}", c.log());
    assert!(mps.recovery_s.is_some_and(|s| s > 0.0), "{mps:?}");
    // Every pod ran under its trial's own configuration.
    for (pod, f) in &c.node.facts() {
        let (strategy, n) = f.cell.rsplit_once('-').expect("cell label");
        let n: u32 = n.parse().expect("pods");
        match strategy {
            "mps" => assert_eq!(f.mps_enforced, Some(objects::sharing_replicas(n)), "{pod}"),
            "time-slicing" => assert_eq!(f.plugin_replicas, Some(4), "{pod}"),
            _ => assert_eq!(f.plugin_replicas, Some(1), "{pod}"),
        }
    }
    let left = c
        .kubectl(&["get", "deployments,pods", "-n", "gpushare-bench", "-o", "name"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(left.trim().is_empty(), "left behind: {left}");
    let j = journal::read(&journal::path_in(&dir.path().join("sim")))
        .expect("journal")
        .expect("journal");
    assert!(j.restored && j.deployments.len() == 2, "{j:?}");
    assert_eq!(
        state(&c).await,
        before,
        "node or ConfigMap not as they began\n{}",
        c.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_without_the_gpu_toleration_stay_pending_on_a_tainted_node() {
    // The node carries `nvidia.com/gpu:NoSchedule`; the pods tolerate another taint only.
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "exclusive", "1");
    let mut st = settings(&p);
    st.workload.tolerations = vec!["dedicated=ml:NoSchedule".into()];
    let s = session_with(&c, &p, false, st).await.expect("session");
    let outcome = run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .expect("sweep");
    assert_eq!(outcome.measured, 1);
    let rows = std::fs::read_to_string(dir.path().join("sim/cells.jsonl")).expect("cells");
    // The real scheduler's reason.
    assert!(
        rows.contains("\"status\":\"pending\"") && rows.contains("untolerated taint"),
        "{rows}"
    );
}

/// The error of opening a one-cell session on `c` ("(opened)" when it opens).
async fn open_error(c: &TestCluster) -> String {
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "exclusive", "1");
    match session(c, &p, false).await {
        Ok(_) => String::from("(opened)"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_gpu_node_and_a_cluster_policy_without_a_config_name_are_refused() {
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.gpus = 2;
    let err = open_error(&start(spec).await).await;
    assert!(err.contains("has 2 GPUs") && err.contains("distributedAlloc"), "{err}");
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.plugin_config = (String::new(), String::new());
    let err = open_error(&start(spec).await).await;
    assert!(
        err.contains("devicePlugin.config.name") && err.contains("does nothing"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_key_with_the_harness_name_and_other_content_is_refused_untouched() {
    let mut spec = ClusterSpec::h100("gpu-1");
    if let Some(cm) = spec.configmap.as_mut() {
        cm.insert("gpushare-time-slicing-3".into(), "version: v1\n# mine\n".into());
    }
    let c = start(spec).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "time-slicing", "1,3");
    let err = sweep(&c, &p, false)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("gpushare-time-slicing-3") && err.contains("never changes a key"),
        "{err}"
    );
    assert_eq!(state(&c).await, before);
}
