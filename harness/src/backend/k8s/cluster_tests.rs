//! The Kubernetes backend against Kubernetes' own control plane (v1.34: API server,
//! scheduler, controllers) with a GPU node played through its API
//! (`gpushare_k8s_sim::cluster`): whole sweeps as the service account of
//! `manifests/base/rbac.yaml` and `manifests/node/rbac.yaml` (generated for the node), after the user's `kubectl apply -k`
//! of that base; kills
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
pub(super) const SPEED: f64 = 50.0;

pub(super) fn settings(plan: &SweepPlan) -> KubeSettings {
    common_tests::settings(plan, SPEED)
}

pub(super) fn sim_measure() -> MeasureSettings {
    common_tests::measure(SPEED)
}

/// Opens a session as `k8s::session::open` does (check the cluster, create or reopen
/// the run, attach its journal) on the simulator's client.
pub(super) async fn session(c: &TestCluster, plan: &SweepPlan, resume: bool) -> Result<Session<KubernetesBackend>> {
    session_with(c, plan, resume, settings(plan)).await
}

/// [`session`] with the backend's settings given.
pub(super) async fn session_with(
    c: &TestCluster,
    plan: &SweepPlan,
    resume: bool,
    settings: KubeSettings,
) -> Result<Session<KubernetesBackend>> {
    let client = c.harness_client().await.expect("the harness's service account");
    let mut backend = KubernetesBackend::new(client, settings);
    backend.check_cluster().await?;
    let store = common_tests::run_store_filling(plan, resume, backend.gpus())?;
    backend.attach_journal(store.dir())?;
    Ok(common_tests::session_of(backend, store, sim_measure()))
}

pub(super) async fn sweep(c: &TestCluster, plan: &SweepPlan, resume: bool) -> Result<SweepOutcome> {
    let shutdown = Shutdown::new();
    let s = session(c, plan, resume).await?;
    run_with_source(s, &SteadyMetrics::default(), &Quiet, &shutdown).await
}

/// The error a fresh sweep of `plan` ends with (empty when it succeeds).
async fn sweep_error(c: &TestCluster, plan: &SweepPlan) -> String {
    sweep(c, plan, false)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

/// Runs the isolation trials of session `s` to their end and returns their records.
pub(super) async fn trial_records<B: crate::backend::Backend>(
    c: &TestCluster,
    s: Session<B>,
) -> Vec<crate::results::isolation::IsolationRecord> {
    let trials = &mut crate::isolation::command::Trials;
    crate::sweep::runner::run_work_with_source(s, trials, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()))
        .store
        .isolation()
        .to_vec()
}

/// The label mig-parted adds when a node without it goes through a MIG change: it
/// pauses `nvidia.com/gpu.deploy.nvsm` and sets it back to `true` whatever it was, unless
/// `false` (mig-parted v0.13.1 `pkg/mig/reconfigure/reconfigure.go` `maybeSetPaused`,
/// `maybeSetTrue`). The harness did not set it and does not remove it.
const MIG_MANAGER_ADDS: &str = "nvidia.com/gpu.deploy.nvsm";

/// The node's labels and the device-plugin ConfigMap, after the operator has settled.
pub(super) async fn state(c: &TestCluster) -> NodeState {
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

/// The node's labels and the device plugin's ConfigMap, as [`state`] reads them.
pub(super) type NodeState = (BTreeMap<String, String>, Option<BTreeMap<String, String>>);

/// What differs between two [`state`]s, one line per key (empty when they agree).
pub(super) fn state_diff(before: &NodeState, after: &NodeState) -> String {
    fn diff(what: &str, a: &BTreeMap<String, String>, b: &BTreeMap<String, String>, out: &mut Vec<String>) {
        let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        for k in keys {
            let (x, y) = (a.get(k), b.get(k));
            if x != y {
                out.push(format!("{what} {k}: {x:?} before, {y:?} after"));
            }
        }
    }
    let mut out = Vec::new();
    diff("label", &before.0, &after.0, &mut out);
    match (&before.1, &after.1) {
        (Some(a), Some(b)) => diff("ConfigMap key", a, b, &mut out),
        (None, None) => {}
        (a, b) => out.push(format!(
            "ConfigMap device-plugin-config: {} before, {} after",
            if a.is_some() { "present" } else { "absent" },
            if b.is_some() { "present" } else { "absent" }
        )),
    }
    out.join("\n")
}

/// Fails with what differs first (then the cluster's log) when the node or the
/// ConfigMap is not as it was in `before`.
pub(super) async fn assert_state(c: &TestCluster, before: &NodeState, what: &str) {
    let diff = state_diff(before, &state(c).await);
    assert!(
        diff.is_empty(),
        "{what}: the node is not as it began:\n{diff}\n{}",
        c.log()
    );
}

/// A cluster where the user applied the base manifests generated for its node, as the
/// docs say (`gpushare-bench manifests --node gpu-1 --out DIR`, `kubectl apply -k DIR/base`, `-k DIR/node`). The
/// operator's periodic relabelling is off, so that a label the harness wrongly removed
/// stays removed.
pub(super) async fn start(spec: ClusterSpec) -> TestCluster {
    let mut spec = spec;
    spec.timings.operator_reconcile = 1e9;
    spec.workload_time_scale = SPEED;
    let c = TestCluster::start(spec, SPEED).await.unwrap_or_else(|e| panic!("{e}"));
    apply_base(&c);
    c
}

/// `kubectl apply -k base` and `-k node` of the manifests the user generated for the
/// cluster's node (`gpushare-bench manifests --node gpu-1`: the harness may read and label
/// that node only).
pub(super) fn apply_base(c: &TestCluster) {
    let files = super::manifests::files(super::manifests::DEFAULT_IMAGE, &c.node.name);
    for dir in ["base", "node"] {
        c.apply_files(&files, dir).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Checks every cell was measured (not pending or failed) and what the pods ran on.
pub(super) fn check_cells(c: &TestCluster, dir: &Path, cells: usize) {
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
    assert_state(&c, &before, "refused before any change").await;
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

/// The rows of the run `sim` under `dir`.
pub(super) fn sim_rows(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("sim/cells.jsonl")).expect("cells");
    text.lines().map(|l| serde_json::from_str(l).expect("row")).collect()
}

pub(super) async fn journal_shows(path: &Path, f: impl Fn(&journal::Journal) -> bool) {
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
pub(super) async fn kill_when(c: &TestCluster, plan: &SweepPlan, when: impl Fn(&journal::Journal) -> bool) {
    let path = plan.out.join("sim").join(journal::FILE);
    tokio::select! {
        r = sweep(c, plan, false) => panic!("the sweep ended before the kill: {r:?}\n{}", c.log()),
        () = journal_shows(&path, when) => {}
    }
    // The label patch that follows the journal entry reaches the cluster or not; either
    // way the node is mid-switch now. Dropping the sweep does not recall a request it
    // had already handed to the client's connection: that request still lands, as a
    // killed process's last write does, but here it could land after the restore that
    // follows. A killed harness is restored by a new process, seconds later at the
    // least, so the test lets the last write land first.
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// A node whose user had chosen a device-plugin config entry of their own.
pub(super) fn user_labelled(spec: ClusterSpec) -> ClusterSpec {
    let mut spec = spec;
    spec.labels.insert(objects::LABEL_PLUGIN_CONFIG.into(), "any".into());
    spec
}

pub(super) async fn node_labels(c: &TestCluster) -> BTreeMap<String, String> {
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
    assert_state(&c, &before, "after the run").await;
    // `restore --node` afterwards has nothing left to do.
    let path = dir.path().join("sim").join(journal::FILE);
    let client = c.harness_client().await.expect("client");
    let report = restore_from_journal(&client, &path, &settings(&p), &Shutdown::new())
        .await
        .expect("restore");
    assert!(report.undone.is_empty(), "{report:?}");
}

/// A node the user never labelled for the device plugin: restoring after a MIG change
/// puts the MIG layout back first, with the harness's config label still on the node, so
/// that the operand pods the MIG manager recreates start with a label; only then is the
/// label removed. In one patch, those pods' config-manager init containers would start on
/// an unlabelled node, where v0.18.1's can block for ever (D5), and the node would end up
/// advertising no GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_after_mig_on_an_unlabelled_node_ends_with_its_gpus_advertised() {
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&c).await;
    assert!(
        !before.0.contains_key(objects::LABEL_PLUGIN_CONFIG),
        "unlabelled: {before:?}"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "mig,exclusive", "1");
    // Killed once the MIG manager has applied the run's layout.
    let nodes = Api::<Node>::all(c.admin.clone());
    let mig_applied = async {
        loop {
            let l = node_labels(&c).await;
            if l.get(objects::LABEL_MIG_STATE).map(String::as_str) == Some("success")
                && l.get(objects::LABEL_MIG_CONFIG)
                    .is_some_and(|v| v != objects::MIG_DISABLED)
                && l.get(objects::LABEL_PRODUCT).is_some_and(|p| p.contains("-MIG-"))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        r = sweep(&c, &p, false) => panic!("the sweep ended before MIG was applied: {r:?}\n{}", c.log()),
        () = mig_applied => {}
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.node.lose_config_manager_race();
    let path = dir.path().join("sim").join(journal::FILE);
    let client = c.harness_client().await.expect("client");
    let report = restore_from_journal(&client, &path, &settings(&p), &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("restore: {e}\n{}", c.log()));
    assert!(!report.undone.is_empty(), "{report:?}");
    assert_state(&c, &before, "after restore").await;
    let node = nodes.get("gpu-1").await.expect("node");
    let gpus = node
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get("nvidia.com/gpu").map(|q| q.0.clone()));
    assert_eq!(gpus.as_deref(), Some("1"), "the GPU is advertised again\n{}", c.log());
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
    assert_state(&c, &before, "after the run").await;
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
    assert_state(&c, &before, "Ctrl-C restores").await;
    // The resumed run changes the node again, and must put it back again.
    sweep(&c, &p, true)
        .await
        .unwrap_or_else(|e| panic!("resume: {e}\n{}", c.log()));
    assert_state(&c, &before, "the resumed run restores").await;
    let j = journal::read(&dir.path().join("sim").join(journal::FILE))
        .expect("journal")
        .expect("exists");
    assert!(j.restored && !j.has_changes(), "{j:?}");
}

/// An isolation run's plan on the node: every scenario under exclusive, time-slicing and
/// MPS, in wall-clock times (the node scales the pods' own flags to its clock).
pub(super) fn isolation_plan(dir: &Path) -> SweepPlan {
    use crate::isolation::plan::{IsolationPlan, Scenario};
    let iso = IsolationPlan {
        scenarios: Scenario::ALL.to_vec(),
        victim_rate: 50.0,
        aggressors: vec![1, 3],
        event_after_s: 0.3,
        // The margin after the events covers the node's pass, its status write and the
        // harness's poll, which take longer on a loaded machine.
        observe_s: 1.0,
        slo_s: None,
        aggressor_image: None,
    };
    let mut p = plan(dir, "exclusive,time-slicing,mps", "1");
    p.pods = iso.pod_counts();
    p.kind = crate::config::plan::RunKind::Isolation(iso);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_trials_run_as_two_deployments_and_kubernetes_restarts_the_victim() {
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let plan = isolation_plan(dir.path());
    let s = session(&c, &plan, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let records = trial_records(&c, s).await;
    assert_eq!(records.len(), 20, "{records:#?}");
    let find = |s: Strategy, scenario: &str, k: u32| {
        records
            .iter()
            .find(|r| r.strategy == s && r.scenario == scenario && r.aggressors == k)
            .unwrap_or_else(|| panic!("{s} {scenario} × {k}: {records:#?}"))
    };
    // The device plugin cannot cap one client as among several: MPS's victim alone
    // under a trial's limits is unavailable here, and says why.
    for k in [1, 3] {
        let capped = find(Strategy::Mps, crate::isolation::plan::CAPPED, k);
        assert_eq!(
            capped.victim_status,
            crate::domain::CellStatus::Unavailable,
            "{capped:?}"
        );
        assert!(capped.note.contains("--sharing-api dra"), "{capped:?}");
    }
    // MPS itself was measured: the run does not call it unavailable.
    let run = crate::results::store::read_run(&dir.path().join("sim/run.json")).expect("run.json");
    assert!(
        run.unavailable.iter().all(|u| u.strategy != Strategy::Mps),
        "{:?}",
        run.unavailable
    );
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
async fn on_a_node_with_two_gpus_every_cell_fills_both_and_each_gpu_gets_its_rows() {
    use crate::results::record::CellRecord;
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.gpus = 2;
    let c = start(spec).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "exclusive,time-slicing,mps,mig", "1,3");
    // The pods say which GPU they run on (workload_info{device_uuid}), as the node's
    // device plugin placed them.
    let metrics = SteadyMetrics::reporting_devices(Box::new(c.node.device_uuids()));
    let s = session(&c, &p, false).await.unwrap_or_else(|e| panic!("{e}"));
    let outcome = run_with_source(s, &metrics, &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    assert_eq!((outcome.measured, outcome.failed), (8, 0), "{}", c.log());
    // The plugin's allocator put `pods` on each GPU (exclusive × 3: one each, the rest pending).
    let facts = c.node.facts();
    for (cell, per_gpu) in [
        ("exclusive-1", 1),
        ("time-slicing-1", 1),
        ("time-slicing-3", 3),
        ("mps-3", 3),
    ] {
        let on = |g: u32| facts.values().filter(|f| f.cell == cell && f.gpu == Some(g)).count();
        assert_eq!((on(0), on(1)), (per_gpu, per_gpu), "{cell}\n{}", c.log());
    }
    assert!(facts.values().any(|f| f.cell == "mps-3" && f.mps_enforced == Some(3)));
    assert_eq!(facts.values().filter(|f| f.cell == "mig-3" && f.mig).count(), 6);
    let rows = crate::results::store::read_cells(&dir.path().join("sim/cells.jsonl")).expect("cells");
    let of = |cell: &str| -> Vec<&CellRecord> {
        rows.iter()
            .filter(|r| format!("{}-{}", r.strategy.name(), r.pods) == cell)
            .collect()
    };
    for cell in ["time-slicing-3", "mps-3"] {
        let rows = of(cell);
        assert_eq!(rows.iter().filter(|r| r.is_pod()).count(), 6, "{cell}");
        let gpu_rows: Vec<&&CellRecord> = rows.iter().filter(|r| r.is_gpu_row()).collect();
        let uuids: Vec<String> = (0..2).map(gpushare_k8s_sim::spec::gpu_uuid).collect();
        assert_eq!(gpu_rows.len(), 2, "{cell}");
        for (k, g) in gpu_rows.iter().enumerate() {
            assert_eq!(g.pod, format!("gpu:{}", uuids[k]));
            assert_eq!(g.gpu_uuid.as_ref(), Some(&uuids[k]), "{cell}");
            assert!(
                g.note.starts_with(&format!("3 pods on GPU {}", uuids[k])),
                "{cell}: {}",
                g.note
            );
        }
        let all = rows.iter().find(|r| r.is_aggregate()).expect("aggregate");
        assert_eq!(all.gpus, Some(2));
        let by_gpu: u64 = gpu_rows.iter().filter_map(|g| g.inferences).sum();
        assert_eq!(
            all.inferences,
            Some(by_gpu),
            "{cell}: the pooled row is the GPUs' together"
        );
    }
    let ex3 = of("exclusive-3");
    let all = ex3.iter().find(|r| r.is_aggregate()).expect("aggregate");
    assert!(all.note.contains("2 of 6 pods ran; 4 pending"), "{}", all.note);
    assert_eq!(ex3.iter().filter(|r| r.is_gpu_row()).count(), 2);
    // MIG instances are devices of their own: no GPU rows.
    assert!(of("mig-3").iter().all(|r| !r.is_gpu_row()));
    assert_state(&c, &before, "after the run").await;
    // The report pools the GPUs in its tables and splits them in its per-GPU ones.
    let data = crate::report::RunData::load(&dir.path().join("sim")).expect("run");
    let report = crate::report::render(&data).expect("report");
    for text in [&report.html, &report.markdown] {
        assert!(text.contains("Throughput on each GPU") && text.contains("Fairness on each GPU"));
        assert!(text.contains(&format!("gpu:1 is {}", gpushare_k8s_sim::spec::gpu_uuid(1))));
        assert!(text.contains("This node has 2 GPUs"));
    }
    let pods_csv = &report.csv.iter().find(|(n, _)| n == "pods.csv").expect("pods.csv").1;
    assert!(
        !String::from_utf8_lossy(pods_csv).contains("gpu:0"),
        "pods.csv holds pods only"
    );
    // An isolation trial needs its pods on one GPU, which the plugin does not promise here.
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "time-slicing", "1");
    let mut s = session(&c, &p, false).await.expect("session");
    let spec = |name: &str| crate::backend::PodSpec {
        name: name.into(),
        args: Vec::new(),
        group: String::new(),
        builtin: false,
    };
    let err = crate::backend::Backend::launch_pods(
        &mut s.backend,
        Strategy::TimeSlicing,
        &[spec("victim"), spec("aggressor")],
        &Shutdown::new(),
    )
    .await
    .expect_err("refused")
    .to_string();
    assert!(err.contains("has 2 GPUs") && err.contains("--sharing-api dra"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_policy_without_a_config_name_is_refused() {
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
    let err = sweep_error(&c, &p).await;
    assert!(
        err.contains("gpushare-time-slicing-3") && err.contains("never changes a key"),
        "{err}"
    );
    assert_eq!(state(&c).await, before);
}

/// The workload namespace's Deployments and pods, once the controllers have had time to
/// finish deleting.
async fn workload_leftovers(c: &TestCluster) -> Vec<String> {
    c.node.settle(100.0).await;
    let out = c
        .kubectl(&["get", "deployments,pods", "-n", "gpushare-bench", "-o", "name"])
        .unwrap_or_else(|e| panic!("{e}"));
    out.lines().map(str::to_string).collect()
}

/// Sweeps a server of the user's own (time-slicing and MPS × 1, 3) given by `server`
/// (config-file lines) and returns the command and args its containers ran, as the
/// kubelet received them from the API server; the node and ConfigMap end as they began
/// and no workload object is left.
async fn own_server_sweep(server: &str) -> (Vec<String>, Vec<String>) {
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let o: SweepOptions = toml::from_str(&format!(
        "backend = \"kubernetes\"\nnode = \"gpu-1\"\nstrategies = \"time-slicing,mps\"\npods = \"1,3\"\n\
         run_id = \"sim\"\nout = \"{}\"\n{server}\n\
         metric = \"my_latency_seconds\"\nready_path = \"/ready\"\n",
        dir.path().display()
    ))
    .expect("options");
    let p = SweepPlan::from_options(o).expect("plan");
    // The workload the real session makes from this plan (session::settings).
    let own = super::session::workload_spec(&p, common_tests::kube(&p), Vec::new());
    assert_eq!(own.server.as_ref().map(|o| o.ready_path.as_str()), Some("/ready"));
    let mut k = settings(&p);
    k.workload = own;
    let s = session_with(&c, &p, false, k).await.expect("session");
    let outcome = run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    assert_eq!((outcome.measured, outcome.failed), (4, 0), "{}", c.log());
    let text = std::fs::read_to_string(dir.path().join("sim/cells.jsonl")).expect("cells");
    assert!(text.lines().all(|l| l.contains("\"model\":\"custom\"")), "{text}");
    let run = crate::results::store::read_run(&dir.path().join("sim/run.json")).expect("run.json");
    assert_eq!(run.plan.server_args.as_ref(), p.server_args(), "recorded for --resume");
    assert_state(&c, &before, "after the run").await;
    let left = workload_leftovers(&c).await;
    assert!(left.is_empty(), "{left:?}");
    let mut ran: Vec<(String, Vec<String>, Vec<String>)> = c
        .node
        .facts()
        .into_values()
        .map(|f| (f.image, f.command, f.args))
        .collect();
    ran.dedup();
    assert_eq!(ran.len(), 1, "every pod ran the same: {ran:?}");
    assert_eq!(ran[0].0, "me/yolos-pytorch:1");
    (ran[0].1.clone(), ran[0].2.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_of_ones_own_is_swept_through_the_cluster_and_leaves_nothing() {
    // `$(PORT)` and `$$` are the shell's: the kubelet would expand the first and halve
    // the second were they not escaped (I6).
    let (command, args) = own_server_sweep(
        "image = \"me/yolos-pytorch:1\"\n\
         workload_cmd = \"python3 /app/server.py --host 0.0.0.0 --port {port} --tag $(PORT)-$$\"",
    )
    .await;
    assert_eq!(
        command,
        [
            "/bin/sh",
            "-c",
            "python3 /app/server.py --host 0.0.0.0 --port 9400 --tag $(PORT)-$$"
        ]
    );
    assert!(args.is_empty(), "{args:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_image_runs_its_entrypoint_with_the_workload_args() {
    // --server-image: no command (the image's ENTRYPOINT), the --workload-arg values as
    // args with {port} the metrics port, and `$(POD)` reaching the server as typed.
    let (command, args) = own_server_sweep(
        "server_image = \"me/yolos-pytorch:1\"\n\
         workload_args = [\"--port={port}\", \"--precision\", \"bf16\", \"--tag=$(POD)\"]",
    )
    .await;
    assert!(command.is_empty(), "{command:?}");
    assert_eq!(args, ["--port=9400", "--precision", "bf16", "--tag=$(POD)"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_config_name_is_followed_when_rbac_allows_it() {
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.plugin_config = ("time-slicing-config".into(), "any".into());
    // The committed manifests grant device-plugin-config only: the API server's 403.
    let c = start(spec).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "exclusive,time-slicing", "1,3");
    let err = sweep_error(&c, &p).await;
    assert!(
        err.contains("time-slicing-config") && err.contains("forbidden"),
        "{err}"
    );
    assert_state(&c, &before, "refused before any change").await;
    // RBAC written for that name (`objects::rbac` with the ClusterPolicy's ConfigMap).
    let cm = objects::PluginConfigMap {
        namespace: "gpu-operator".into(),
        name: "time-slicing-config".into(),
        default_key: "any".into(),
    };
    c.apply_objects(&objects::rbac("gpushare-bench", &cm, "monitoring", "gpu-1"))
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "exclusive,time-slicing", "1,3");
    sweep(&c, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    check_cells(&c, dir.path(), 4);
    assert_state(&c, &before, "after the run").await;
}

/// Sets the verbs of rule `rule` of Role `role` in `ns`, as an administrator editing the
/// applied manifests would.
fn set_role_verbs(c: &TestCluster, ns: &str, role: &str, rule: usize, verbs: &[&str]) {
    let patch = serde_json::json!([{"op": "replace", "path": format!("/rules/{rule}/verbs"), "value": verbs}]);
    c.kubectl(&["patch", "role", "-n", ns, role, "--type=json", "-p", &patch.to_string()])
        .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_workload_role_cannot_create_the_deployment_by_server_side_apply() {
    // manifests/base/rbac.yaml before `create` was granted on deployments.
    let c = start(ClusterSpec::h100("gpu-1")).await;
    set_role_verbs(
        &c,
        "gpushare-bench",
        "gpushare-bench-workload",
        0,
        &["get", "list", "patch", "delete"],
    );
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "exclusive", "1");
    // The cell fails with the API server's message in its row; the sweep goes on.
    let outcome = sweep(&c, &p, false).await.expect("sweep");
    assert_eq!(outcome.failed, 1, "{}", c.log());
    let rows = std::fs::read_to_string(dir.path().join("sim/cells.jsonl")).expect("cells");
    assert!(
        rows.contains("deployments.apps \\\"gpushare-workload\\\" is forbidden") && rows.contains("cannot create"),
        "{rows}"
    );
}

/// A Prometheus pod of kube-prometheus's labels in `monitoring`, bound to the node and
/// Running; the error of a port-forward to it as the harness (empty if none).
async fn port_forward_error(c: &TestCluster) -> String {
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "prometheus-k8s-0", "namespace": "monitoring",
                     "labels": {"app.kubernetes.io/name": "prometheus"}},
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "prometheus", "image": "quay.io/prometheus/prometheus:v3.5.0"}],
                 "tolerations": [{"operator": "Exists"}]}
    });
    c.apply_objects(&[pod]).unwrap_or_else(|e| panic!("{e}"));
    let running = "jsonpath={.status.phase}";
    for _ in 0..200 {
        let phase = c
            .kubectl(&["get", "pod", "-n", "monitoring", "prometheus-k8s-0", "-o", running])
            .unwrap_or_default();
        if phase.trim() == "Running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = c.harness_client().await.expect("client");
    super::portforward::to_prometheus(client, "monitoring", "app.kubernetes.io/name=prometheus", 9090)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_forward_the_role_does_not_grant_fails_with_the_rbac_message() {
    let c = start(ClusterSpec::h100("gpu-1")).await;
    // The committed Role passes the API server's authorization: what fails then is the
    // node's streaming server, which the test node does not run.
    let err = port_forward_error(&c).await;
    assert!(!err.contains("forbidden") && !err.contains("no running"), "{err}");
    // The Role before `get` was granted: `create` only, which kube-rs's WebSocket GET
    // never uses.
    set_role_verbs(&c, "monitoring", "gpushare-bench-prometheus", 1, &["create"]);
    let err = port_forward_error(&c).await;
    assert!(
        err.contains("forbidden") && err.contains("cannot get resource \"pods/portforward\""),
        "{err}"
    );
}

fn mig_plan(dir: &Path, layout: Option<&str>) -> SweepPlan {
    let layout = layout.map(|l| format!("mig_layout = \"{l}\"\n")).unwrap_or_default();
    let o: SweepOptions = toml::from_str(&format!(
        "backend = \"kubernetes\"\nnode = \"gpu-1\"\nstrategies = \"mig\"\npods = \"1,3\"\nrun_id = \"sim\"\nout = \"{}\"\n{layout}",
        dir.display()
    ))
    .expect("options");
    SweepPlan::from_options(o).expect("plan")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h100_nvl_gets_its_own_layout_and_a_layout_that_matches_nothing_is_named() {
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.gpu = gpushare_k8s_sim::gpu::GpuModel::h100_nvl();
    // The default layout for NVIDIA-H100-NVL is all-1g.12gb (no all-1g.10gb entry matches 0x2321).
    let c = start(spec).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = mig_plan(dir.path(), None);
    sweep(&c, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    check_cells(&c, dir.path(), 2);
    assert_state(&c, &before, "after the run").await;
    // all-1g.10gb on an NVL: mig-parted says success and changes nothing (F4).
    let dir = tempfile::tempdir().expect("tmp");
    let p = mig_plan(dir.path(), Some("all-1g.10gb"));
    let t = std::time::Instant::now();
    let err = sweep_error(&c, &p).await;
    assert!(
        err.contains("still whole") && err.contains("no entry of that layout matches"),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs_f64(1800.0 / SPEED),
        "named before the MIG timeout"
    );
    assert_state(&c, &before, "restored after the failure").await;
}

/// Every change the journal records is a point where a SIGKILL can land: between the
/// journal entry and its patch, or after the patch. Killed at each, then `restore --node`
/// (its library function), the node ends as it began; one cluster carries on from each
/// restore to the next kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_journaled_change_restore_puts_the_node_back() {
    // How many changes a whole run journals.
    let count = |j: &journal::Journal| {
        j.labels_set.values().map(Vec::len).sum::<usize>() + j.keys_added.len() + usize::from(j.deployment)
    };
    let c = start(user_labelled(ClusterSpec::h100("gpu-1"))).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "mps,mig,time-slicing", "1,3");
    sweep(&c, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let full = journal::read(&dir.path().join("sim").join(journal::FILE))
        .expect("journal")
        .expect("exists");
    let total = count(&full);
    assert!(total >= 5, "{full:?}");
    let client = c.harness_client().await.expect("client");
    for k in 1..=total {
        let dir = tempfile::tempdir().expect("tmp");
        let p = plan(dir.path(), "mps,mig,time-slicing", "1,3");
        kill_when(&c, &p, |j| count(j) >= k).await;
        let path = dir.path().join("sim").join(journal::FILE);
        restore_from_journal(&client, &path, &settings(&p), &Shutdown::new())
            .await
            .unwrap_or_else(|e| panic!("kill after change {k}: restore: {e}\n{}", c.log()));
        assert_state(&c, &before, &format!("kill after change {k} of {total}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_switch_the_node_in_each_rotated_order_and_leave_it_as_it_began() {
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = SweepPlan {
        repeat: 2,
        ..plan(dir.path(), "time-slicing,mps,mig", "1,3")
    };
    let outcome = sweep(&c, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    assert_eq!((outcome.measured, outcome.failed), (12, 0), "{}", c.log());
    check_cells(&c, dir.path(), 12);
    let data = crate::report::RunData::load(&dir.path().join("sim")).expect("run data");
    for s in [Strategy::TimeSlicing, Strategy::Mps, Strategy::Mig] {
        for n in [1, 3] {
            let reps: Vec<u32> = data.repeats(s, n).iter().map(|r| r.repeat).collect();
            assert_eq!(reps, [1, 2], "{s} × {n}");
        }
    }
    // The second pass began with MPS, after the first ended on MIG: the node went from
    // a MIG layout straight to an MPS configuration and back again.
    let first_mps_of_pass_2 = data
        .repeats(Strategy::Mps, 1)
        .iter()
        .find(|r| r.repeat == 2)
        .map(|r| r.started_at.clone())
        .expect("mps × 1, pass 2");
    let last_mig_of_pass_1 = data
        .repeats(Strategy::Mig, 3)
        .iter()
        .find(|r| r.repeat == 1)
        .map(|r| r.started_at.clone())
        .expect("mig × 3, pass 1");
    assert!(last_mig_of_pass_1 <= first_mps_of_pass_2);
    assert_eq!(
        state(&c).await,
        before,
        "node or ConfigMap not as they began\n{}",
        c.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_of_ones_own_is_the_victim_and_gpushare_workload_the_aggressors() {
    use crate::isolation::plan::Scenario;
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let mut p = isolation_plan(dir.path());
    p.strategies = vec![Strategy::TimeSlicing];
    p.kubernetes_mut().image = "me/yolos-pytorch:1".into();
    p.workload_cmd = Some("python3 /app/server.py --port {port}".into());
    let aggressor_image = "registry.local/gpushare-workload:0.1.0";
    if let crate::config::plan::RunKind::Isolation(iso) = &mut p.kind {
        iso.scenarios = vec![Scenario::NoisyNeighbour, Scenario::Crash];
        iso.aggressors = vec![2];
        iso.aggressor_image = Some(aggressor_image.into());
        p.pods = iso.pod_counts();
    }
    // What the real session makes of this plan (session::settings, set_aggressor_image).
    let mut k = settings(&p);
    k.workload = super::session::workload_spec(&p, common_tests::kube(&p), k.workload.args.clone());
    k.aggressor_image = aggressor_image.into();
    let s = session_with(&c, &p, false, k)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let records = trial_records(&c, s).await;
    assert_eq!(records.len(), 3, "{records:#?}");
    let victims: Vec<(&str, crate::domain::CellStatus, &str)> = records
        .iter()
        .map(|r| (r.scenario.as_str(), r.victim_status, r.note.as_str()))
        .collect();
    assert!(
        records.iter().all(|r| r.victim_status == crate::domain::CellStatus::Ok),
        "{}\nthe victims: {victims:?}",
        c.log()
    );
    // The crash is the aggressor's (gpushare-workload's --crash-after); the user's
    // server, which knows no such flag, serves on.
    let crash = records.iter().find(|r| r.scenario == "crash").expect("crash");
    assert!(
        crash.aggressor_outcome.contains("exit 137"),
        "{}\nthe crash trial's aggressors: {}",
        c.log(),
        crash.aggressor_outcome
    );
    let mut seen: Vec<(String, String)> = c.node.facts().into_values().map(|f| (f.role, f.image)).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen,
        [
            ("aggressor".to_string(), aggressor_image.to_string()),
            ("victim".to_string(), "me/yolos-pytorch:1".to_string())
        ]
    );
    assert_eq!(
        state(&c).await,
        before,
        "{}\nthe node or ConfigMap is not as it began",
        c.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_without_a_shared_process_namespace_is_the_workloads_exit_1() {
    // The kernel drops a SIGKILL that PID 1 sends itself: without the pause container
    // as init, `--crash-after` cannot crash the workload, which says so with exit 1.
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let ns = "gpushare-bench";
    let spec = objects::WorkloadSpec {
        namespace: ns.into(),
        image: "img".into(),
        node: "gpu-1".into(),
        args: Vec::new(),
        tolerations: vec![objects::DEFAULT_TOLERATION.into()],
        pull_secrets: Vec::new(),
        server: None,
    };
    let args = ["--crash-after".to_string(), "50ms".to_string()];
    let exit_code = "jsonpath={.items[0].status.containerStatuses[0].lastState.terminated.exitCode}";
    let mut codes = Vec::new();
    for shared in [true, false] {
        let mut d = objects::role_deployment(&spec, Strategy::Exclusive, "nvidia.com/gpu", "aggressor", 1, 1, &args);
        assert_eq!(d["spec"]["template"]["spec"]["shareProcessNamespace"], true);
        d["spec"]["template"]["spec"]["shareProcessNamespace"] = serde_json::json!(shared);
        c.apply_objects(&[d]).unwrap_or_else(|e| panic!("{e}"));
        let mut code = None;
        for _ in 0..400 {
            let out = c
                .kubectl(&["get", "pods", "-n", ns, "-o", exit_code])
                .unwrap_or_default();
            if let Ok(n) = out.trim().parse::<i64>() {
                code = Some(n);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        codes.push((shared, code));
        c.kubectl(&[
            "delete",
            "deployment",
            "-n",
            ns,
            "gpushare-workload-aggressor",
            "--wait=true",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..400 {
            if workload_leftovers(&c).await.is_empty() {
                break;
            }
        }
    }
    assert_eq!(codes, [(true, Some(137)), (false, Some(1))], "{}", c.log());
}

/// A capacity search on the cluster: the operator's default MIG layout on an H100 has
/// seven 1g.10gb instances (k8s-sim/UPSTREAM-RULES.md F6), so the real scheduler leaves
/// an eighth pod pending and the walk ends there; the node ends as it began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_capacity_search_fits_one_pod_per_instance_and_the_eighth_stays_pending() {
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let mut p = plan(dir.path(), "mig", "1");
    p.load = crate::config::values::Load::PerPod(100.0);
    p.slos = vec!["p90=20ms".parse().expect("slo")];
    p.pods = (1..=8).collect();
    p.kind = crate::config::plan::RunKind::Capacity(crate::config::plan::CapacityPlan { max_pods: 8 });
    let s = session(&c, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let finished = crate::sweep::runner::run_work_with_source(
        s,
        &mut crate::capacity::command::Search,
        &SteadyMetrics::default(),
        &Quiet,
        &Shutdown::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    assert_eq!(finished.ran, 8);
    let table = crate::capacity::record::records(finished.store.run(), finished.store.cells());
    assert_eq!(table.len(), 1);
    let mig = &table[0];
    assert_eq!((mig.pods_fit, mig.first_miss_pods), (Some(7), Some(8)), "{mig:?}");
    assert!(mig.first_miss.contains("is pending"), "{}", mig.first_miss);
    assert_state(&c, &before, "after the run").await;
}
