//! The Kubernetes backend through the simulated cluster (`sim`): whole sweeps with the
//! RBAC of `manifests/base/rbac.yaml`, kills mid-switch, resume and restore, refused
//! set-ups. Metrics are synthetic (the simulated pods serve none): these tests are about
//! what the harness does to the cluster, not about numbers.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::base::{KubeSettings, restore_from_journal};
use super::common_tests::{self, SteadyMetrics, plan};
use super::device_plugin::KubernetesBackend;
use super::journal;
use super::objects::{self, WorkloadSpec};
use crate::backend::Session;
use crate::config::options::SweepOptions;
use crate::config::plan::{MeasureSettings, SweepPlan};
use crate::domain::Strategy;
use crate::error::Result;
use crate::results::store::RunStore;
use crate::shutdown::Shutdown;
use crate::sweep::SweepOutcome;
use crate::sweep::progress::Quiet;
use crate::sweep::runner::run_with_source;
use crate::telemetry::NoTelemetry;
use gpushare_k8s_sim::rbac::with_rule_verbs;
use gpushare_k8s_sim::{ClusterSpec, SimCluster};

/// Virtual seconds per wall-clock second.
const SPEED: f64 = 200.0;

fn settings(plan: &SweepPlan) -> KubeSettings {
    common_tests::settings(plan, SPEED)
}

fn sim_measure() -> MeasureSettings {
    common_tests::measure(SPEED)
}

/// The RBAC objects of `manifests/base/rbac.yaml` (the committed file, which a test keeps
/// equal to what `gpushare-bench manifests` writes).
fn manifest_rbac() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/base/rbac.yaml");
    let text = std::fs::read_to_string(&path).expect("manifests/base/rbac.yaml");
    gpushare_k8s_sim::rbac::objects_from_yaml(&text).expect("YAML documents")
}

/// Opens a session as `k8s::session::open` does (check the cluster, create or reopen
/// the run, attach its journal) on the simulator's client.
async fn session(sim: &SimCluster, plan: &SweepPlan, resume: bool) -> Result<Session<KubernetesBackend>> {
    session_with(sim, plan, resume, settings(plan)).await
}

/// [`session`] with the backend's settings given.
async fn session_with(
    sim: &SimCluster,
    plan: &SweepPlan,
    resume: bool,
    settings: KubeSettings,
) -> Result<Session<KubernetesBackend>> {
    let mut backend = KubernetesBackend::new(sim.client(), settings);
    backend.check_cluster().await?;
    let store = common_tests::run_store(plan, resume)?;
    backend.attach_journal(store.dir())?;
    Ok(common_tests::session_of(backend, store, sim_measure()))
}

async fn sweep(sim: &SimCluster, plan: &SweepPlan, resume: bool) -> Result<SweepOutcome> {
    let shutdown = Shutdown::new();
    let s = session(sim, plan, resume).await?;
    run_with_source(s, &SteadyMetrics::default(), &Quiet, &shutdown).await
}

/// The label mig-parted adds when a node without it goes through a MIG change: it
/// pauses `nvidia.com/gpu.deploy.nvsm` and sets it back to `true` whatever it was, unless
/// `false` (mig-parted v0.13.1 `pkg/mig/reconfigure/reconfigure.go` `maybeSetPaused`,
/// `maybeSetTrue`). The harness did not set it and does not remove it.
const MIG_MANAGER_ADDS: &str = "nvidia.com/gpu.deploy.nvsm";

/// The node's labels and the device-plugin ConfigMap, after the operator has settled.
fn state(sim: &SimCluster) -> (BTreeMap<String, String>, Option<BTreeMap<String, String>>) {
    sim.with(|w| {
        w.settle(900.0);
        let mut labels = w.node_labels();
        if labels.get(MIG_MANAGER_ADDS).map(String::as_str) == Some("true") {
            labels.remove(MIG_MANAGER_ADDS);
        }
        (labels, w.configmap())
    })
}

/// A cluster where `kubectl apply -k manifests/base` has run (namespace and RBAC). The
/// operator's periodic relabelling is off, so that a label the harness wrongly removed
/// stays removed.
async fn start(spec: ClusterSpec) -> SimCluster {
    let mut spec = spec;
    spec.timings.operator_reconcile = 1e9;
    spec.workload_time_scale = SPEED;
    let sim = SimCluster::start(spec, &manifest_rbac(), SPEED)
        .await
        .expect("simulator");
    sim.with(|w| w.add_namespace("gpushare-bench"));
    sim
}

/// Checks every cell was measured (not pending or failed) and what the pods ran on.
fn check_cells(sim: &SimCluster, dir: &Path, cells: usize) {
    let text = std::fs::read_to_string(dir.join("sim/cells.jsonl")).expect("cells");
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("row")).collect();
    let agg: Vec<&Value> = rows.iter().filter(|r| r["pod"] == "all").collect();
    assert_eq!(agg.len(), cells, "{}", sim.log());
    for r in &agg {
        assert_eq!(r["status"], "ok", "{r}\n{}", sim.log());
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
    let max = sim.with(|w| {
        w.pod_facts
            .values()
            .filter_map(|f| f.cell.rsplit_once('-').and_then(|(_, n)| n.parse::<u32>().ok()))
            .max()
            .unwrap_or(1)
    });
    sim.with(|w| {
        for (pod, f) in &w.pod_facts {
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
    });
    // Keys were projected before the relabel: no config-manager ever missed its file.
    let log = sim.log();
    assert!(!log.contains("does not exist"), "{log}");
}

/// Sweeps a server of the user's own (time-slicing and MPS × 1, 3) given by `server`
/// (config-file lines) through the simulated cluster, and returns the command and args
/// its containers ran as the kubelet expands them (rule I6); the node and ConfigMap end
/// as they began and no workload object is left.
async fn own_server_sweep(server: &str) -> (Vec<String>, Vec<String>) {
    let sim = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&sim);
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
    let own = super::session::workload_spec(&p, "gpu-1", Vec::new());
    assert_eq!(own.server.as_ref().map(|o| o.ready_path.as_str()), Some("/ready"));
    let mut k = settings(&p);
    k.workload = own;
    let s = session_with(&sim, &p, false, k).await.expect("session");
    let outcome = run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    assert_eq!((outcome.measured, outcome.failed), (4, 0), "{}", sim.log());
    let text = std::fs::read_to_string(dir.path().join("sim/cells.jsonl")).expect("cells");
    assert!(text.lines().all(|l| l.contains("\"model\":\"custom\"")), "{text}");
    let run = crate::results::store::read_run(&dir.path().join("sim/run.json")).expect("run.json");
    assert_eq!(run.plan.server_args, p.server_args, "recorded for --resume");
    assert_eq!(state(&sim), before, "{}", sim.log());
    let left: Vec<String> = sim.with(|w| {
        w.objects
            .keys()
            .filter(|k| k.namespace == "gpushare-bench" && matches!(k.resource.as_str(), "deployments" | "pods"))
            .map(|k| format!("{}/{}", k.resource, k.name))
            .collect()
    });
    assert!(left.is_empty(), "{left:?}");
    sim.with(|w| {
        let mut ran: Vec<(String, Vec<String>, Vec<String>)> = w
            .pod_facts
            .values()
            .map(|f| (f.image.clone(), f.command.clone(), f.args.clone()))
            .collect();
        ran.dedup();
        assert_eq!(ran.len(), 1, "every pod ran the same: {ran:?}");
        assert_eq!(ran[0].0, "me/yolos-pytorch:1");
        (ran[0].1.clone(), ran[0].2.clone())
    })
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

/// Resolves when the run's journal satisfies `f` (the harness journals each change
/// before making it).
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
async fn kill_when(sim: &SimCluster, plan: &SweepPlan, when: impl Fn(&journal::Journal) -> bool) {
    let path = plan.out.join("sim").join(journal::FILE);
    tokio::select! {
        r = sweep(sim, plan, false) => panic!("the sweep ended before the kill: {r:?}\n{}", sim.log()),
        () = journal_shows(&path, when) => {}
    }
    // The label patch that follows the journal entry reaches the cluster or not; either
    // way the node is mid-switch now.
}

fn user_labelled(spec: ClusterSpec) -> ClusterSpec {
    let mut spec = spec;
    spec.labels.insert(objects::LABEL_PLUGIN_CONFIG.into(), "any".into());
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_config_name_is_followed_when_rbac_allows_it() {
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.plugin_config = ("time-slicing-config".into(), "any".into());
    // The committed manifests grant device-plugin-config only: a clear 403.
    let sim = start(spec.clone()).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "exclusive,time-slicing", "1,3");
    let err = sweep(&sim, &p, false)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("time-slicing-config") && err.contains("forbidden"),
        "{err}"
    );
    // RBAC written for that name (`objects::rbac` with the ClusterPolicy's ConfigMap).
    let cm = objects::PluginConfigMap {
        namespace: "gpu-operator".into(),
        name: "time-slicing-config".into(),
        default_key: "any".into(),
    };
    let sim = SimCluster::start(spec, &objects::rbac("gpushare-bench", &cm, "monitoring"), SPEED)
        .await
        .expect("simulator");
    sim.with(|w| w.add_namespace("gpushare-bench"));
    let before = state(&sim);
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "exclusive,time-slicing", "1,3");
    sweep(&sim, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    check_cells(&sim, dir.path(), 4);
    assert_eq!(state(&sim), before, "{}", sim.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_workload_role_cannot_create_the_deployment_by_server_side_apply() {
    // manifests/base/rbac.yaml before this change: no `create` on deployments.
    let rbac = with_rule_verbs(
        manifest_rbac(),
        "gpushare-bench-workload",
        0,
        &["get", "list", "patch", "delete"],
    );
    let sim = SimCluster::start(ClusterSpec::h100("gpu-1"), &rbac, SPEED)
        .await
        .expect("simulator");
    sim.with(|w| w.add_namespace("gpushare-bench"));
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "exclusive", "1");
    // The cell fails with the API server's message in its row; the sweep goes on.
    let outcome = sweep(&sim, &p, false).await.expect("sweep");
    assert_eq!(outcome.failed, 1);
    let rows = std::fs::read_to_string(dir.path().join("sim/cells.jsonl")).expect("cells");
    assert!(
        rows.contains("deployments.apps \\\"gpushare-workload\\\" is forbidden") && rows.contains("cannot create"),
        "{rows}"
    );
}

#[test]
fn kube_prometheus_can_discover_the_workload_pods_only_with_the_manifests_role() {
    use gpushare_k8s_sim::rbac::{Attributes, Authorizer, service_account_user};
    // kube-prometheus v0.18.0 grants prometheus-k8s these namespaces only
    // (manifests/prometheus-roleSpecificNamespaces.yaml, …RoleBindingSpecificNamespaces.yaml).
    let stock: Vec<Value> = ["default", "kube-system", "monitoring"]
        .iter()
        .flat_map(|ns| {
            [
                serde_json::json!({"kind": "Role", "metadata": {"name": "prometheus-k8s", "namespace": ns},
                    "rules": [{"apiGroups": [""], "resources": ["services", "endpoints", "pods"], "verbs": ["get", "list", "watch"]}]}),
                serde_json::json!({"kind": "RoleBinding", "metadata": {"name": "prometheus-k8s", "namespace": ns},
                    "roleRef": {"kind": "Role", "name": "prometheus-k8s"},
                    "subjects": [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}]}),
            ]
        })
        .collect();
    let list_pods = Attributes {
        verb: "list".into(),
        group: String::new(),
        resource: "pods".into(),
        subresource: String::new(),
        namespace: "gpushare-bench".into(),
        name: String::new(),
    };
    let prom = service_account_user("monitoring", "prometheus-k8s");
    assert!(!Authorizer::from_objects(&stock).allows(&prom, &[], &list_pods));
    let with_ours: Vec<Value> = stock.into_iter().chain(manifest_rbac()).collect();
    assert!(Authorizer::from_objects(&with_ours).allows(&prom, &[], &list_pods));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_forward_the_role_does_not_grant_fails_with_the_rbac_message() {
    // The Role before this change: `create` only, which kube-rs's WebSocket GET never uses.
    let rbac = with_rule_verbs(manifest_rbac(), "gpushare-bench-prometheus", 1, &["create"]);
    let sim = SimCluster::start(ClusterSpec::h100("gpu-1"), &rbac, SPEED)
        .await
        .expect("simulator");
    let err = port_forward_error(&sim).await;
    assert!(
        err.contains("forbidden") && err.contains("cannot get resource \"pods/portforward\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_kubernetes_1_35_the_port_forward_also_needs_create() {
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.minor_version = 35;
    let rbac = with_rule_verbs(manifest_rbac(), "gpushare-bench-prometheus", 1, &["get"]);
    let sim = SimCluster::start(spec, &rbac, SPEED).await.expect("simulator");
    let err = port_forward_error(&sim).await;
    assert!(err.contains("cannot create resource \"pods/portforward\""), "{err}");
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
    let sim = start(spec.clone()).await;
    let before = state(&sim);
    let dir = tempfile::tempdir().expect("tmp");
    let p = mig_plan(dir.path(), None);
    sweep(&sim, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    check_cells(&sim, dir.path(), 2);
    assert_eq!(state(&sim), before, "{}", sim.log());
    // all-1g.10gb on an NVL: mig-parted says success and changes nothing (F4).
    let sim = start(spec).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = mig_plan(dir.path(), Some("all-1g.10gb"));
    let before = state(&sim);
    let t = std::time::Instant::now();
    let err = sweep(&sim, &p, false)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("still whole") && err.contains("no entry of that layout matches"),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs_f64(1800.0 / SPEED),
        "named before the MIG timeout"
    );
    assert_eq!(state(&sim), before, "restored after the failure\n{}", sim.log());
}

/// Every change the journal records is a point where a SIGKILL can land: between the
/// journal entry and its patch, or after the patch. Killed at each, then `restore --node`
/// (its library function), the node ends as it began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_journaled_change_restore_puts_the_node_back() {
    // How many changes a whole run journals.
    let count = |j: &journal::Journal| {
        j.labels_set.values().map(Vec::len).sum::<usize>() + j.keys_added.len() + usize::from(j.deployment)
    };
    let sim = start(user_labelled(ClusterSpec::h100("gpu-1"))).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = plan(dir.path(), "mps,mig,time-slicing", "1,3");
    sweep(&sim, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    let full = journal::read(&dir.path().join("sim").join(journal::FILE))
        .expect("journal")
        .expect("exists");
    let total = count(&full);
    assert!(total >= 5, "{full:?}");
    for k in 1..=total {
        let sim = start(user_labelled(ClusterSpec::h100("gpu-1"))).await;
        let before = state(&sim);
        let dir = tempfile::tempdir().expect("tmp");
        let p = plan(dir.path(), "mps,mig,time-slicing", "1,3");
        kill_when(&sim, &p, |j| count(j) >= k).await;
        let path = dir.path().join("sim").join(journal::FILE);
        restore_from_journal(&sim.client(), &path, &settings(&p), &Shutdown::new())
            .await
            .unwrap_or_else(|e| panic!("kill after change {k}: restore: {e}\n{}", sim.log()));
        assert_eq!(state(&sim), before, "kill after change {k} of {total}\n{}", sim.log());
    }
}

/// The error of a port-forward to a running Prometheus pod in `monitoring` (empty if none).
async fn port_forward_error(sim: &SimCluster) -> String {
    sim.with(|w| {
        w.add_running_pod(
            "monitoring",
            "prometheus-k8s-0",
            serde_json::json!({"app.kubernetes.io/name": "prometheus"}),
        )
    });
    super::portforward::to_prometheus(sim.client(), "monitoring", "app.kubernetes.io/name=prometheus", 9090)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_switch_the_node_in_each_rotated_order_and_leave_it_as_it_began() {
    let sim = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&sim);
    let dir = tempfile::tempdir().expect("tmp");
    let p = SweepPlan {
        repeat: 2,
        ..plan(dir.path(), "time-slicing,mps,mig", "1,3")
    };
    let outcome = sweep(&sim, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    assert_eq!((outcome.measured, outcome.failed), (12, 0), "{}", sim.log());
    check_cells(&sim, dir.path(), 12);
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
        state(&sim),
        before,
        "node or ConfigMap not as they began\n{}",
        sim.log()
    );
}

/// An isolation run's plan on the node: every scenario under exclusive, time-slicing and
/// MPS, in wall-clock times (the simulator scales the pods' own flags to its clock).
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

/// [`isolation`] with the backend's settings given.
async fn isolation_with(
    sim: &SimCluster,
    plan: &SweepPlan,
    k: KubeSettings,
) -> Result<Vec<crate::results::isolation::IsolationRecord>> {
    let shutdown = Shutdown::new();
    let s = session_with(sim, plan, false, k).await?;
    let trials = &mut crate::isolation::command::Trials;
    let finished =
        crate::sweep::runner::run_work_with_source(s, trials, &SteadyMetrics::default(), &Quiet, &shutdown).await?;
    Ok(finished.store.isolation().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_of_ones_own_is_the_victim_and_gpushare_workload_the_aggressors() {
    use crate::isolation::plan::Scenario;
    let sim = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&sim);
    let dir = tempfile::tempdir().expect("tmp");
    let mut p = isolation_plan(dir.path());
    p.strategies = vec![Strategy::TimeSlicing];
    p.image = "me/yolos-pytorch:1".into();
    p.workload_cmd = Some("python3 /app/server.py --port {port}".into());
    let aggressor_image = "registry.local/gpushare-workload:0.1.0";
    if let Some(iso) = p.isolation.as_mut() {
        iso.scenarios = vec![Scenario::NoisyNeighbour, Scenario::Crash];
        iso.aggressors = vec![2];
        iso.aggressor_image = Some(aggressor_image.into());
        p.pods = iso.pod_counts();
    }
    // What the real session makes of this plan (session::settings, set_aggressor_image).
    let mut k = settings(&p);
    k.workload = super::session::workload_spec(&p, "gpu-1", k.workload.args.clone());
    k.aggressor_image = aggressor_image.into();
    let records = isolation_with(&sim, &p, k)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    assert_eq!(records.len(), 3, "{records:#?}");
    assert!(
        records.iter().all(|r| r.victim_status == crate::domain::CellStatus::Ok),
        "{records:#?}\n{}",
        sim.log()
    );
    // The crash is the aggressor's (gpushare-workload's --crash-after); the user's
    // server, which knows no such flag, serves on.
    let crash = records.iter().find(|r| r.scenario == "crash").expect("crash");
    assert!(crash.aggressor_outcome.contains("exit 137"), "{crash:?}");
    sim.with(|w| {
        let mut seen: Vec<(String, String)> = w
            .pod_facts
            .values()
            .map(|f| (f.role.clone(), f.image.clone()))
            .collect();
        seen.sort();
        seen.dedup();
        assert_eq!(
            seen,
            [
                ("aggressor".to_string(), aggressor_image.to_string()),
                ("victim".to_string(), "me/yolos-pytorch:1".to_string())
            ]
        );
    });
    assert_eq!(state(&sim), before, "{}", sim.log());
}

/// What an isolation trial's Deployments run in these tests.
fn trial_workload(ns: &str) -> WorkloadSpec {
    WorkloadSpec {
        namespace: ns.into(),
        image: "img".into(),
        node: "gpu-1".into(),
        args: Vec::new(),
        tolerations: vec![objects::DEFAULT_TOLERATION.into()],
        pull_secrets: Vec::new(),
        server: None,
    }
}

/// Stores a Deployment as if applied (its controllers run on the next event).
fn put_deployment(w: &mut gpushare_k8s_sim::World, key: &gpushare_k8s_sim::world::Key, value: Value) {
    w.objects.insert(
        key.clone(),
        gpushare_k8s_sim::world::Object {
            value,
            managed: Default::default(),
        },
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_without_a_shared_process_namespace_is_the_workloads_exit_1() {
    // The kernel drops a SIGKILL that PID 1 sends itself: without the pause container
    // as init, `--crash-after` cannot crash the workload, which says so with exit 1.
    let sim = start(ClusterSpec::h100("gpu-1")).await;
    let ns = "gpushare-bench";
    let spec = trial_workload(ns);
    let args = ["--crash-after".to_string(), "50ms".to_string()];
    let mut codes = Vec::new();
    for shared in [true, false] {
        let mut d = objects::role_deployment(&spec, Strategy::Exclusive, "nvidia.com/gpu", "aggressor", 1, 1, &args);
        assert_eq!(d["spec"]["template"]["spec"]["shareProcessNamespace"], true);
        d["spec"]["template"]["spec"]["shareProcessNamespace"] = serde_json::json!(shared);
        let key = gpushare_k8s_sim::world::Key::new("deployments", ns, "gpushare-workload-aggressor");
        let code = sim.with(|w| {
            put_deployment(w, &key, d);
            w.controllers();
            w.settle(60.0);
            let code = w
                .objects
                .iter()
                .filter(|(k, _)| k.resource == "pods" && k.namespace == ns)
                .find_map(|(_, o)| {
                    let cs = &o.value["status"]["containerStatuses"][0];
                    cs["lastState"]["terminated"]["exitCode"].as_i64()
                });
            w.objects.remove(&key);
            w.controllers();
            w.settle(30.0);
            code
        });
        codes.push((shared, code));
    }
    assert_eq!(codes, [(true, Some(137)), (false, Some(1))], "{}", sim.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_applied_together_may_give_an_exclusive_gpu_to_the_aggressor() {
    // What the harness's wait for the victim's binding prevents (k8s-sim/UPSTREAM-RULES.md I1):
    // pods that reach the scheduler's queue together tie, and here the aggressor's name
    // sorts first, so it takes the node's one GPU and the victim stays Pending.
    let sim = start(ClusterSpec::h100("gpu-1")).await;
    let ns = "gpushare-bench";
    let spec = trial_workload(ns);
    let bound = sim.with(|w| {
        for role in objects::ROLES {
            let d = objects::role_deployment(&spec, Strategy::Exclusive, "nvidia.com/gpu", role, 1, 2, &[]);
            let key = gpushare_k8s_sim::world::Key::new("deployments", ns, &objects::role_deployment_name(role));
            put_deployment(w, &key, d);
        }
        w.controllers();
        w.settle(60.0);
        let mut roles: Vec<(String, bool)> = w
            .objects
            .iter()
            .filter(|(k, _)| k.resource == "pods" && k.namespace == ns)
            .map(|(_, o)| {
                (
                    o.value["metadata"]["labels"][objects::ROLE_LABEL]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    !o.value["spec"]["nodeName"].is_null(),
                )
            })
            .collect();
        roles.sort();
        roles
    });
    assert_eq!(
        bound,
        [("aggressor".to_string(), true), ("victim".to_string(), false)],
        "{}",
        sim.log()
    );
}

/// A capacity search on the simulated cluster: the operator's default MIG layout on an
/// H100 has seven 1g.10gb instances (k8s-sim/UPSTREAM-RULES.md F6), so an eighth pod stays pending
/// and the walk ends there; the node ends as it began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_capacity_search_fits_one_pod_per_instance_and_the_eighth_stays_pending() {
    let sim = start(ClusterSpec::h100("gpu-1")).await;
    let before = state(&sim);
    let dir = tempfile::tempdir().expect("tmp");
    let mut p = plan(dir.path(), "mig", "1");
    p.load = crate::config::values::Load::PerPod(100.0);
    p.slos = vec!["p99=20ms".parse().expect("slo")];
    p.pods = (1..=8).collect();
    p.capacity = Some(crate::config::plan::CapacityPlan { max_pods: 8 });
    let s = session(&sim, &p, false)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    let finished = crate::sweep::runner::run_work_with_source(
        s,
        &mut crate::capacity::command::Search,
        &SteadyMetrics::default(),
        &Quiet,
        &Shutdown::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    assert_eq!(finished.ran, 8);
    let table = crate::capacity::record::records(finished.store.run(), finished.store.cells());
    assert_eq!(table.len(), 1);
    let mig = &table[0];
    assert_eq!((mig.pods_fit, mig.first_miss_pods), (Some(7), Some(8)), "{mig:?}");
    assert!(mig.first_miss.contains("is pending"), "{}", mig.first_miss);
    assert_eq!(state(&sim), before, "{}", sim.log());
}

// ---- Sharing through DRA claims (`--sharing-api dra`, k8s-sim/UPSTREAM-RULES.md J) ----

/// An H100 node with NVIDIA's DRA driver, its gates as given.
fn dra_node(time_slicing: bool, mps: bool) -> ClusterSpec {
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.dra = Some(gpushare_k8s_sim::dra::Gates { time_slicing, mps });
    spec.device_plugin = false;
    spec
}

fn dra_plan(dir: &Path, strategies: &str, pods: &str, more: &str) -> SweepPlan {
    let o: SweepOptions = toml::from_str(&format!(
        "backend = \"kubernetes\"\nnode = \"gpu-1\"\nsharing_api = \"dra\"\nstrategies = \"{strategies}\"\npods = \"{pods}\"\nrun_id = \"sim\"\nout = \"{}\"\n{more}",
        dir.display()
    ))
    .expect("options");
    SweepPlan::from_options(o).expect("plan")
}

/// Opens a session as `k8s::session::open_dra` does, on the simulator's client.
async fn dra_session(sim: &SimCluster, plan: &SweepPlan) -> Result<Session<super::dra::DraBackend>> {
    let mut backend = super::dra::DraBackend::new(sim.client(), settings(plan), plan.dra.clone());
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

/// The workload namespace's claims, claim templates, Deployments and pods.
fn dra_leftovers(sim: &SimCluster) -> Vec<String> {
    sim.with(|w| {
        w.settle(300.0);
        w.objects
            .keys()
            .filter(|k| {
                k.namespace == "gpushare-bench"
                    && matches!(
                        k.resource.as_str(),
                        "resourceclaims" | "resourceclaimtemplates" | "deployments" | "pods"
                    )
            })
            .map(|k| format!("{}/{}", k.resource, k.name))
            .collect()
    })
}

/// A simulated cluster with the DRA driver and the RBAC of the base and the DRA overlay
/// (`manifests/dra/rbac.yaml`, which a test keeps equal to `objects::dra_rbac`).
async fn start_dra(spec: ClusterSpec) -> SimCluster {
    let mut spec = spec;
    spec.timings.operator_reconcile = 1e9;
    spec.workload_time_scale = SPEED;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/dra/rbac.yaml");
    let overlay = gpushare_k8s_sim::rbac::objects_from_yaml(&std::fs::read_to_string(path).expect("overlay rbac"))
        .expect("YAML documents");
    let sim = SimCluster::start(spec, &[manifest_rbac(), overlay].concat(), SPEED)
        .await
        .expect("simulator");
    sim.with(|w| w.add_namespace("gpushare-bench"));
    sim
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_sweep_on_a_gpu_in_mig_mode_gives_each_pod_an_instance_of_one_profile() {
    // Static MIG (J8): three 1g.10gb instances and one 3g.40gb made before the driver
    // started; it publishes those and no whole GPU.
    let mut spec = dra_node(false, false);
    spec.dra_mig = ["1g.10gb", "3g.40gb", "1g.10gb", "1g.10gb"].map(String::from).to_vec();
    let sim = start_dra(spec).await;
    let before = state(&sim);
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "exclusive,mig", "1,3,4", "");
    let s = dra_session(&sim, &p)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    let outcome = run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    let rows = sim_rows(dir.path());
    assert_eq!(
        (outcome.measured, outcome.unavailable),
        (3, 3),
        "{rows:?}\n{}",
        sim.log()
    );
    let ex = agg_row(&rows, "exclusive", 1);
    assert!(
        ex["note"].as_str().is_some_and(|n| n.contains("is in MIG mode")),
        "{ex}"
    );
    for n in [1, 3, 4] {
        let r = agg_row(&rows, "mig", n);
        assert!(
            r["note"]
                .as_str()
                .is_some_and(|t| t.contains("MIG device of profile 1g.10gb")),
            "{r}"
        );
    }
    // Three instances of the profile: the fourth pod's claim finds none (the 3g.40gb is
    // not of the profile asked for).
    let mig4: Vec<&Value> = rows
        .iter()
        .filter(|r| r["strategy"] == "mig" && r["pods"] == 4 && r["pod"] != "all")
        .collect();
    assert_eq!(mig4.iter().filter(|r| r["status"] == "pending").count(), 1, "{mig4:?}");
    sim.with(|w| {
        let facts: Vec<&gpushare_k8s_sim::PodFacts> = w.pod_facts.values().filter(|f| f.cell == "mig-3").collect();
        assert!(
            facts.len() == 3 && facts.iter().all(|f| f.mig && f.dra_sharing.is_none()),
            "{facts:?}"
        );
    });
    assert!(dra_leftovers(&sim).is_empty(), "{:?}", dra_leftovers(&sim));
    assert_eq!(state(&sim), before, "nothing on the node changes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_gate_that_is_off_fails_the_cell_with_the_drivers_reason() {
    // The driver's gates are alpha and off by default: its MPS config is refused when the
    // kubelet prepares the claim, and the pods stay in ContainerCreating (J5, J6).
    let sim = start_dra(dra_node(false, false)).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps,time-slicing", "3", "");
    let s = dra_session(&sim, &p)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    // The driver's pod shows the gate off before any cell runs.
    let facts = s.backend.driver().cloned().expect("read").expect("readable");
    assert!(
        !facts.gate("MPSSupport") && facts.image.ends_with(":v0.4.1"),
        "{facts:?}"
    );
    assert_eq!(
        facts.warnings(&p.strategies, &p.dra).len(),
        2,
        "MPSSupport off; EXCLUSIVE_PROCESS left"
    );
    let outcome = run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    // Time-slicing without --timeslice carries no config, which needs no gate.
    assert_eq!((outcome.measured, outcome.failed), (1, 1), "{}", sim.log());
    let row = agg_row(&sim_rows(dir.path()), "mps", 3);
    let note = row["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("not ready after 3 s: Failed to prepare dynamic resources: ")
            && note.contains("error validating GPU config: \"MPS\" is selected as the GPU sharing strategy, but the \"MPSSupport\" feature gate is not enabled"),
        "{note}"
    );
    assert!(dra_leftovers(&sim).is_empty(), "{:?}", dra_leftovers(&sim));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_dra_sweep_leaves_its_claim_to_restore() {
    let sim = start(dra_node(true, true)).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps", "3", "");
    let path = p.out.join("sim").join(journal::FILE);
    let s = dra_session(&sim, &p).await.expect("session");
    let (metrics, shutdown) = (SteadyMetrics::default(), Shutdown::new());
    tokio::select! {
        r = run_with_source(s, &metrics, &Quiet, &shutdown) => panic!("ended first: {r:?}"),
        () = journal_shows(&path, |j| j.deployment && !j.claims.is_empty()) => {}
    }
    // Dropped as by SIGKILL: the claim (and perhaps the Deployment) stay.
    let left = dra_leftovers(&sim);
    assert!(left.contains(&"resourceclaims/gpushare-mps-3".to_string()), "{left:?}");
    let report = restore_from_journal(&sim.client(), &path, &settings(&p), &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    assert!(
        report
            .undone
            .iter()
            .any(|u| u == "deleted resourceclaims/gpushare-mps-3 in namespace gpushare-bench"),
        "{report:?}"
    );
    assert!(dra_leftovers(&sim).is_empty(), "{:?}", dra_leftovers(&sim));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_dra_driver_is_named() {
    let sim = start(ClusterSpec::h100("gpu-1")).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps", "3", "");
    let e = dra_session(&sim, &p)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("no DeviceClass gpu.nvidia.com: is NVIDIA's DRA driver for GPUs installed"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_dra_sweep_resumes_after_deleting_what_it_left() {
    let sim = start_dra(dra_node(true, true)).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps", "1,3", "");
    let path = p.out.join("sim").join(journal::FILE);
    let s = dra_session(&sim, &p).await.expect("session");
    let (metrics, shutdown) = (SteadyMetrics::default(), Shutdown::new());
    tokio::select! {
        r = run_with_source(s, &metrics, &Quiet, &shutdown) => panic!("ended first: {r:?}"),
        () = journal_shows(&path, |j| j.deployment && !j.claims.is_empty()) => {}
    }
    // The killed run's pods still reserve its claim; the resumed run deletes its
    // Deployment first, then the claim, and measures every cell.
    let mut backend = super::dra::DraBackend::new(sim.client(), settings(&p), p.dra.clone());
    backend.check_cluster().await.expect("cluster");
    let store = RunStore::open(&p.out, "sim").expect("run");
    backend.attach_journal(store.dir()).expect("journal");
    let s = Session {
        backend,
        settings: sim_measure(),
        metrics: crate::config::plan::PrometheusSetting::Off,
        store,
        telemetry: Arc::new(NoTelemetry),
        notes: Vec::new(),
        keep_alive: Vec::new(),
    };
    let outcome = run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    assert_eq!((outcome.measured, outcome.failed), (2, 0), "{}", sim.log());
    assert!(dra_leftovers(&sim).is_empty(), "{:?}", dra_leftovers(&sim));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_claim_leaves_exclusive_process_for_a_later_plain_time_slicing_cell() {
    // Driver v0.4.1: MPS sets EXCLUSIVE_PROCESS; without TimeSlicingSettings nothing
    // sets it back (J5), so three pods of a shared claim without config get one context.
    for (ts_gate, want_failed) in [(false, 1), (true, 0)] {
        let sim = start_dra(dra_node(ts_gate, true)).await;
        let dir = tempfile::tempdir().expect("tmp");
        let p = dra_plan(dir.path(), "mps,time-slicing", "3", "");
        let s = dra_session(&sim, &p).await.expect("session");
        let outcome = run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
        assert_eq!(outcome.failed, want_failed, "gate {ts_gate}\n{}", sim.log());
        if want_failed == 1 {
            let ts = agg_row(&sim_rows(dir.path()), "time-slicing", 3);
            assert!(
                ts["status"] == "failed" && ts["note"].as_str().is_some_and(|n| n.contains("exit code 3")),
                "{ts}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_the_run_did_not_make_are_refused() {
    let sim = start_dra(dra_node(true, true)).await;
    // The claim `manifests/overlays/dra` makes, left in the namespace.
    let claims = super::dra_claims::cell_claims(Strategy::Mps, 7, &Default::default(), &Default::default());
    let claim = super::dra_claims::claim_object("gpushare-bench", Strategy::Mps, 7, &claims);
    sim.with(|w| {
        w.objects.insert(
            gpushare_k8s_sim::world::Key::new("resourceclaims", "gpushare-bench", "gpushare-mps-7"),
            gpushare_k8s_sim::world::Object {
                value: claim,
                managed: Default::default(),
            },
        );
    });
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps", "7", "");
    let s = dra_session(&sim, &p).await.expect("session");
    let e = run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("already holds claims of gpushare-bench that this run did not make (resourceclaims/gpushare-mps-7)"),
        "{e}"
    );
}

/// GPU telemetry that says which GPUs the backend's scope holds: 10 for GPU-sim-0000,
/// 20 for GPU-sim-0001, summed; nothing for the whole node or an empty scope.
struct ScopeProbe(crate::telemetry::dcgm::GpuScope);

impl crate::telemetry::Telemetry for ScopeProbe {
    fn sample(&self) -> Option<crate::telemetry::GpuSample> {
        let uuids = self.0.get().filter(|u| !u.is_empty())?;
        let util = uuids
            .iter()
            .map(|u| match u.as_str() {
                "GPU-sim-0000" => 10.0,
                "GPU-sim-0001" => 20.0,
                _ => 1000.0,
            })
            .sum();
        Some(crate::telemetry::GpuSample {
            util_pct: util,
            mem_used_bytes: 0,
            power_w: 0.0,
            energy_mj: None,
        })
    }
}

/// Another team's Deployment in namespace `tenant` whose pod holds a whole GPU through
/// a claim of its own.
fn tenant_on_a_gpu(w: &mut gpushare_k8s_sim::world::World) {
    use gpushare_k8s_sim::world::{Key, Object};
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "team-a-gpu", "namespace": "tenant", "uid": "tenant-claim"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
    });
    let deployment = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "team-a", "namespace": "tenant"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "team-a"}},
                 "template": {"metadata": {"labels": {"app": "team-a"}},
                              "spec": {"containers": [{"name": "server", "image": "team-a:1"}],
                                       "resourceClaims": [{"name": "gpu", "resourceClaimName": "team-a-gpu"}],
                                       "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}}
    });
    w.add_namespace("tenant");
    for (resource, name, value) in [
        ("resourceclaims", "team-a-gpu", claim),
        ("deployments", "team-a", deployment),
    ] {
        w.objects.insert(
            Key::new(resource, "tenant", name),
            Object {
                value,
                managed: Default::default(),
            },
        );
    }
    // Written behind the API server's back: the controllers run as after a write.
    w.controllers();
    w.settle(60.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_node_with_two_gpus_each_cell_is_measured_on_the_gpu_its_claims_were_given() {
    let mut two = dra_node(true, true);
    two.gpus = 2;
    let sim = start_dra(two).await;
    // Another team's pod holds gpu-0 through a claim of its own (J4: the allocator skips
    // devices other claims hold).
    sim.with(tenant_on_a_gpu);
    let tenant_device = sim.with(|w| {
        w.objects
            .get(&gpushare_k8s_sim::world::Key::new(
                "resourceclaims",
                "tenant",
                "team-a-gpu",
            ))
            .map(|o| o.value["status"]["allocation"]["devices"]["results"][0]["device"].clone())
    });
    assert_eq!(tenant_device, Some(serde_json::json!("gpu-0")), "{}", sim.log());
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "exclusive,time-slicing,mps", "1,3", "");
    let mut s = dra_session(&sim, &p)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    s.telemetry = Arc::new(ScopeProbe(s.backend.gpu_scope()));
    run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    let rows = sim_rows(dir.path());
    for (strategy, pods) in [
        ("exclusive", 1),
        ("exclusive", 3),
        ("time-slicing", 1),
        ("time-slicing", 3),
        ("mps", 1),
        ("mps", 3),
    ] {
        let r = agg_row(&rows, strategy, pods);
        // The free GPU, and only its series: the tenant's GPU is not the cell's.
        assert_eq!(r["gpu_util_pct"], serde_json::json!(20.0), "{strategy} × {pods}: {r}");
        assert!(
            r["note"].as_str().is_some_and(|n| n.ends_with("; on gpu-1")),
            "{strategy} × {pods}: {r}"
        );
    }
    // Exclusive × 3: one claim gets the free GPU; the scheduler finds no device for the
    // other two (the tenant holds one), which settles the cell without the ready timeout.
    let ex3 = agg_row(&rows, "exclusive", 3);
    assert!(ex3["pods_ready_s"].is_number(), "{ex3}");
    let pending = rows
        .iter()
        .filter(|r| r["strategy"] == "exclusive" && r["pods"] == 3 && r["status"] == "pending")
        .count();
    assert_eq!(pending, 2, "{rows:?}");
    sim.with(|w| {
        for cell in ["time-slicing-3", "mps-3"] {
            let facts: Vec<&gpushare_k8s_sim::PodFacts> = w.pod_facts.values().filter(|f| f.cell == cell).collect();
            assert!(
                facts.len() == 3 && facts.iter().all(|f| f.gpu == Some(1)),
                "{cell}: {facts:?}"
            );
        }
    });
    assert!(dra_leftovers(&sim).is_empty(), "{:?}", dra_leftovers(&sim));

    // The tenant gone, one exclusive pod gets gpu-0, and two get a GPU each, the cell
    // reading both (the probe sums what the scope holds).
    sim.with(|w| {
        w.objects
            .remove(&gpushare_k8s_sim::world::Key::new("deployments", "tenant", "team-a"));
        w.controllers();
        w.settle(120.0);
    });
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "exclusive", "1,2", "");
    let mut s = dra_session(&sim, &p).await.expect("session");
    s.telemetry = Arc::new(ScopeProbe(s.backend.gpu_scope()));
    run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    let rows = sim_rows(dir.path());
    for (pods, util, on) in [(1, 10.0, "; on gpu-0"), (2, 30.0, "; on gpu-0, gpu-1")] {
        let r = agg_row(&rows, "exclusive", pods);
        assert_eq!(r["gpu_util_pct"], serde_json::json!(util), "{r}");
        assert!(r["note"].as_str().is_some_and(|n| n.ends_with(on)), "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_trials_through_dra_claims_share_the_victims_claim_and_leave_nothing() {
    use crate::isolation::plan::{IsolationPlan, Scenario};
    let sim = start_dra(dra_node(true, true)).await;
    let before = state(&sim);
    let dir = tempfile::tempdir().expect("tmp");
    let mut p = dra_plan(dir.path(), "exclusive,time-slicing,mps", "1", "timeslice = \"long\"\n");
    let iso = IsolationPlan {
        scenarios: vec![Scenario::NoisyNeighbour, Scenario::Fault],
        victim_rate: 50.0,
        aggressors: vec![1],
        event_after_s: 0.3,
        observe_s: 0.4,
        slo_s: None,
        aggressor_image: None,
    };
    p.pods = iso.pod_counts();
    p.isolation = Some(iso);
    let s = dra_session(&sim, &p)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    let finished = crate::sweep::runner::run_work_with_source(
        s,
        &mut crate::isolation::command::Trials,
        &SteadyMetrics::default(),
        &Quiet,
        &Shutdown::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    let records = finished.store.isolation().to_vec();
    let find = |s: Strategy, scenario: &str| {
        records
            .iter()
            .find(|r| r.strategy == s && r.scenario == scenario)
            .unwrap_or_else(|| panic!("{s} {scenario}: {records:#?}"))
    };
    for s in [Strategy::Exclusive, Strategy::TimeSlicing, Strategy::Mps] {
        let alone = find(s, "alone");
        assert_eq!(
            alone.victim_status,
            crate::domain::CellStatus::Ok,
            "{alone:?}\n{}",
            sim.log()
        );
    }
    // Exclusive: a claim per pod; the victim was bound first and holds the one GPU, so
    // the aggressor's claim finds no device (J4).
    let ex = find(Strategy::Exclusive, "noisy-neighbour");
    assert_eq!(ex.victim_status, crate::domain::CellStatus::Ok, "{ex:?}");
    assert!(ex.aggressor_outcome.contains("pending"), "{ex:?}");
    // Time-slicing: a fault ends the faulting container only.
    let ts = find(Strategy::TimeSlicing, "fault");
    assert_eq!(ts.victim_status, crate::domain::CellStatus::Ok, "{ts:?}");
    assert!(ts.aggressor_outcome.contains("exit 5"), "{ts:?}");
    sim.with(|w| {
        // Victim and aggressors of a shared trial reference one claim, with the run's
        // one interval, and the driver applied it to both.
        for (cell, claim) in [
            ("time-slicing-long-2", "gpushare-time-slicing-long-2"),
            ("mps-2", "gpushare-mps-2"),
        ] {
            let facts: Vec<&gpushare_k8s_sim::PodFacts> = w.pod_facts.values().filter(|f| f.cell == cell).collect();
            let roles: std::collections::BTreeSet<&str> = facts.iter().map(|f| f.role.as_str()).collect();
            assert!(
                roles.contains("victim") && roles.contains("aggressor"),
                "{cell}: {facts:?}"
            );
            assert!(facts.iter().all(|f| f.claim == claim), "{cell}: {facts:?}");
        }
        let ts: Vec<&gpushare_k8s_sim::PodFacts> = w
            .pod_facts
            .values()
            .filter(|f| f.cell == "time-slicing-long-2")
            .collect();
        assert!(
            ts.iter()
                .all(|f| f.dra_sharing == Some(gpushare_k8s_sim::dra::Sharing::TimeSlicing("Long".into()))),
            "{ts:?}"
        );
    });
    // Each trial's record names the device its claims were given.
    for r in &records {
        assert!(r.note.contains("; on gpu-0"), "{r:?}");
    }
    // The victim alone under MPS got the claim's half (100/max(2, 1)), not all of it.
    let mps = find(Strategy::Mps, "alone");
    assert!(
        mps.mps_split
            .as_deref()
            .is_some_and(|m| m.starts_with("50% of the SMs and 40779Mi pinned per client (1 client")),
        "{mps:?}"
    );
    assert!(
        dra_leftovers(&sim).is_empty(),
        "{:?}\n{}",
        dra_leftovers(&sim),
        sim.log()
    );
    assert_eq!(state(&sim), before, "nothing on the node changes\n{}", sim.log());
    let j = journal::read(&dir.path().join("sim").join(journal::FILE))
        .expect("journal")
        .expect("exists");
    assert!(
        j.restored && j.deployments.len() == 2 && j.claims.contains("resourceclaims/gpushare-mps-2"),
        "{j:?}"
    );
}
