//! Sharing through DRA claims (`--sharing-api dra`) against Kubernetes' own control
//! plane: the real scheduler allocates the claims from the node's ResourceSlice (CEL
//! selectors, devices other claims hold), the resource-claim controller makes and
//! deletes the per-pod claims, and the node's DRA kubelet plugin (played through the
//! API, `gpushare_k8s_sim::node`) prepares them by NVIDIA's driver's rules
//! (k8s-sim/UPSTREAM-RULES.md J). The harness runs as its service account, with the Role
//! of `manifests/dra` for reading the driver's pods.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};

use super::base::restore_from_journal;
use super::cluster_tests::{settings, sim_measure, sim_rows, start, state};
use super::common_tests::{self, SteadyMetrics};
use super::journal;
use crate::backend::Session;
use crate::config::options::SweepOptions;
use crate::config::plan::SweepPlan;
use crate::domain::{CellStatus, Strategy};
use crate::error::Result;
use crate::results::store::RunStore;
use crate::shutdown::Shutdown;
use crate::sweep::progress::Quiet;
use crate::sweep::runner::run_with_source;
use gpushare_k8s_sim::cluster::TestCluster;
use gpushare_k8s_sim::dra::Sharing;
use gpushare_k8s_sim::{ClusterSpec, PodFacts};

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
pub(super) async fn dra_session(c: &TestCluster, plan: &SweepPlan) -> Result<Session<super::dra::DraBackend>> {
    let client = c.harness_client().await.expect("the harness's service account");
    let mut backend = super::dra::DraBackend::new(client, settings(plan), super::common_tests::dra_of(plan));
    backend.check_cluster().await?;
    let store = common_tests::run_store(plan, false)?;
    backend.attach_journal(store.dir())?;
    Ok(common_tests::session_of(backend, store, sim_measure()))
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

/// Runs the DRA session `s` to its end.
async fn run(c: &TestCluster, s: Session<super::dra::DraBackend>) -> crate::sweep::SweepOutcome {
    run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()))
}

/// The node's facts for the pods of `cell`.
fn cell_facts(c: &TestCluster, cell: &str) -> Vec<PodFacts> {
    c.node.facts().into_values().filter(|f| f.cell == cell).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_sweep_on_a_gpu_in_mig_mode_gives_each_pod_an_instance_of_one_profile() {
    // Static MIG (J8): three 1g.10gb instances and one 3g.40gb made before the driver
    // started; it publishes those and no whole GPU.
    let mut spec = dra_node(false, false);
    spec.dra_mig = ["1g.10gb", "3g.40gb", "1g.10gb", "1g.10gb"].map(String::from).to_vec();
    let c = start_dra(spec).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "exclusive,mig", "1,3,4", "");
    let s = dra_session(&c, &p).await.unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let outcome = run(&c, s).await;
    let rows = sim_rows(dir.path());
    assert_eq!(
        (outcome.measured, outcome.unavailable),
        (3, 3),
        "{rows:#?}\n{}",
        c.log()
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
    // Three instances of the profile: the real scheduler finds none for the fourth pod's
    // claim (the 3g.40gb does not match the claim's CEL selector).
    let mig4: Vec<&Value> = rows
        .iter()
        .filter(|r| r["strategy"] == "mig" && r["pods"] == 4 && r["pod"] != "all")
        .collect();
    assert_eq!(mig4.iter().filter(|r| r["status"] == "pending").count(), 1, "{mig4:#?}");
    let facts = cell_facts(&c, "mig-3");
    assert!(
        facts.len() == 3 && facts.iter().all(|f| f.mig && f.dra_sharing.is_none()),
        "{facts:?}"
    );
    let left = dra_leftovers(&c).await;
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(state(&c).await, before, "nothing on the node changes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_gate_that_is_off_fails_the_cell_with_the_drivers_reason() {
    // The driver's gates are alpha and off by default: its MPS config is refused when the
    // kubelet prepares the claim, and the pods stay in ContainerCreating (J5, J6).
    let c = start_dra(dra_node(false, false)).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps,time-slicing", "3", "");
    let s = dra_session(&c, &p).await.unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    // The driver's pod shows the gate off before any cell runs.
    let facts = s.backend.driver().cloned().expect("read").expect("readable");
    assert!(
        !facts.gate("MPSSupport") && facts.image.ends_with(":v0.4.1"),
        "{facts:?}"
    );
    assert_eq!(
        facts.warnings(&p.strategies, &super::common_tests::dra_of(&p)).len(),
        2,
        "MPSSupport off; EXCLUSIVE_PROCESS left"
    );
    let outcome = run(&c, s).await;
    // Time-slicing without --timeslice carries no config, which needs no gate.
    assert_eq!((outcome.measured, outcome.failed), (1, 1), "{}", c.log());
    let row = agg_row(&sim_rows(dir.path()), "mps", 3);
    let note = row["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("Failed to prepare dynamic resources: ")
            && note.contains("error validating GPU config: \"MPS\" is selected as the GPU sharing strategy, but the \"MPSSupport\" feature gate is not enabled"),
        "{note}"
    );
    let left = dra_leftovers(&c).await;
    assert!(left.is_empty(), "{left:?}");
}

/// Runs a DRA sweep until its journal shows the Deployment and a claim, then drops it
/// as SIGKILL would.
async fn kill_dra_mid_cell(c: &TestCluster, p: &SweepPlan) {
    let path = p.out.join("sim").join(journal::FILE);
    let s = dra_session(c, p).await.unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let (metrics, shutdown) = (SteadyMetrics::default(), Shutdown::new());
    tokio::select! {
        r = run_with_source(s, &metrics, &Quiet, &shutdown) => panic!("ended first: {r:?}\n{}", c.log()),
        () = super::cluster_tests::journal_shows(&path, |j| j.deployment && !j.claims.is_empty()) => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_dra_sweep_leaves_its_claim_to_restore_and_a_resumed_one_deletes_it_first() {
    let c = start_dra(dra_node(true, true)).await;
    // Killed, then `restore --node` (its library function).
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps", "3", "");
    kill_dra_mid_cell(&c, &p).await;
    let claims = c
        .kubectl(&["get", "resourceclaims", "-n", "gpushare-bench", "-o", "name"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        claims.contains("resourceclaim.resource.k8s.io/gpushare-mps-3"),
        "{claims}"
    );
    let client = c.harness_client().await.expect("client");
    let path = p.out.join("sim").join(journal::FILE);
    let report = restore_from_journal(&client, &path, &settings(&p), &Shutdown::new())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    assert!(
        report
            .undone
            .iter()
            .any(|u| u == "deleted resourceclaims/gpushare-mps-3 in namespace gpushare-bench"),
        "{report:?}"
    );
    let left = dra_leftovers(&c).await;
    assert!(left.is_empty(), "{left:?}\n{}", c.log());

    // Killed, then resumed: the killed run's pods still reserve its claim; the resumed
    // run deletes its Deployment first, then the claim, and measures every cell.
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps", "1,3", "");
    kill_dra_mid_cell(&c, &p).await;
    let mut backend = super::dra::DraBackend::new(client, settings(&p), super::common_tests::dra_of(&p));
    backend.check_cluster().await.expect("cluster");
    let store = RunStore::open(&p.out, "sim").expect("run");
    backend.attach_journal(store.dir()).expect("journal");
    let s = common_tests::session_of(backend, store, sim_measure());
    let outcome = run(&c, s).await;
    assert_eq!((outcome.measured, outcome.failed), (2, 0), "{}", c.log());
    let left = dra_leftovers(&c).await;
    assert!(left.is_empty(), "{left:?}\n{}", c.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_dra_driver_is_named() {
    // The user applied `manifests/base` only: `manifests/dra` cannot be applied without
    // the driver's namespace.
    let c = start(ClusterSpec::h100("gpu-1")).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps", "3", "");
    let e = dra_session(&c, &p)
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
async fn an_mps_claim_leaves_exclusive_process_for_a_later_plain_time_slicing_cell() {
    // Driver v0.4.1: MPS sets EXCLUSIVE_PROCESS; without TimeSlicingSettings nothing
    // sets it back (J5), so three pods of a shared claim without config get one context.
    for (ts_gate, want_failed) in [(false, 1), (true, 0)] {
        let c = start_dra(dra_node(ts_gate, true)).await;
        let dir = tempfile::tempdir().expect("tmp");
        let p = dra_plan(dir.path(), "mps,time-slicing", "3", "");
        let s = dra_session(&c, &p).await.unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
        let outcome = run(&c, s).await;
        assert_eq!(outcome.failed, want_failed, "gate {ts_gate}\n{}", c.log());
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
    let c = start_dra(dra_node(true, true)).await;
    // A claim of the harness's name and labels that no run of this directory made (one
    // applied by hand from `manifests/overlays/dra`, say).
    let claims = super::dra_claims::cell_claims(Strategy::Mps, 7, &Default::default());
    let claim = super::dra_claims::claim_object("gpushare-bench", Strategy::Mps, 7, &claims);
    c.apply_objects(&[claim]).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "mps", "7", "");
    let s = dra_session(&c, &p).await.expect("session");
    let e = run_with_source(s, &SteadyMetrics::default(), &Quiet, &Shutdown::new())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("already holds claims of gpushare-bench that this run did not make (resourceclaims/gpushare-mps-7)"),
        "{e}"
    );
    c.kubectl(&["get", "resourceclaim", "-n", "gpushare-bench", "gpushare-mps-7"])
        .unwrap_or_else(|e| panic!("the user's claim is gone: {e}"));
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
            ..crate::telemetry::GpuSample::default()
        })
    }
}

/// Another team's Deployment in namespace `tenant` whose pod holds a whole GPU through
/// a claim of its own.
fn tenant_objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant"}}),
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "team-a-gpu", "namespace": "tenant"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
        }),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "team-a", "namespace": "tenant"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "team-a"}},
                     "template": {"metadata": {"labels": {"app": "team-a"}},
                                  "spec": {"containers": [{"name": "server", "image": "team-a:1"}],
                                           "resourceClaims": [{"name": "gpu", "resourceClaimName": "team-a-gpu"}],
                                           "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}}
        }),
    ]
}

/// The device the real scheduler allocated to the tenant's claim, once it has.
async fn tenant_device(c: &TestCluster) -> String {
    let path = "jsonpath={.status.allocation.devices.results[0].device}";
    for _ in 0..200 {
        let out = c
            .kubectl(&["get", "resourceclaim", "-n", "tenant", "team-a-gpu", "-o", path])
            .unwrap_or_default();
        if !out.trim().is_empty() {
            return out.trim().to_string();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the tenant's claim was never allocated\n{}", c.log())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_node_with_two_gpus_each_cell_is_measured_on_the_gpu_its_claims_were_given() {
    let mut two = dra_node(true, true);
    two.gpus = 2;
    let c = start_dra(two).await;
    // Another team's pod holds a GPU through a claim of its own (the real allocator
    // skips devices that other claims hold).
    c.apply_objects(&tenant_objects()).unwrap_or_else(|e| panic!("{e}"));
    let held = tenant_device(&c).await;
    let (held_uuid, free, free_uuid) = match held.as_str() {
        "gpu-0" => ("GPU-sim-0000", "gpu-1", "GPU-sim-0001"),
        "gpu-1" => ("GPU-sim-0001", "gpu-0", "GPU-sim-0000"),
        other => panic!("the tenant got {other}"),
    };
    let util = |uuid: &str| if uuid == "GPU-sim-0000" { 10.0 } else { 20.0 };
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "exclusive,time-slicing,mps", "1,3", "");
    let mut s = dra_session(&c, &p).await.unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    s.telemetry = Arc::new(ScopeProbe(s.backend.gpu_scope()));
    run(&c, s).await;
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
        assert_eq!(
            r["gpu_util_pct"],
            json!(util(free_uuid)),
            "{strategy} × {pods} (tenant on {held_uuid}): {r}"
        );
        assert!(
            r["note"].as_str().is_some_and(|n| n.ends_with(&format!("; on {free}"))),
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
    assert_eq!(pending, 2, "{rows:#?}");
    let free_index: u32 = free.trim_start_matches("gpu-").parse().expect("index");
    for cell in ["time-slicing-3", "mps-3"] {
        let facts = cell_facts(&c, cell);
        assert!(
            facts.len() == 3 && facts.iter().all(|f| f.gpu == Some(free_index)),
            "{cell}: {facts:?}"
        );
    }
    let left = dra_leftovers(&c).await;
    assert!(left.is_empty(), "{left:?}");

    // The tenant gone (its claim with it), one exclusive pod gets a GPU, and two get a
    // GPU each, the cell reading both (the probe sums what the scope holds).
    c.kubectl(&["delete", "namespace", "tenant", "--wait=true", "--timeout=60s"])
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(dir.path(), "exclusive", "1,2", "");
    let mut s = dra_session(&c, &p).await.expect("session");
    s.telemetry = Arc::new(ScopeProbe(s.backend.gpu_scope()));
    run(&c, s).await;
    let rows = sim_rows(dir.path());
    let one = agg_row(&rows, "exclusive", 1);
    assert!(
        [json!(10.0), json!(20.0)].contains(&one["gpu_util_pct"]),
        "one GPU's series: {one}"
    );
    let two = agg_row(&rows, "exclusive", 2);
    assert_eq!(two["gpu_util_pct"], json!(30.0), "{two}");
    assert!(
        two["note"].as_str().is_some_and(|n| n.ends_with("; on gpu-0, gpu-1")),
        "{two}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_trials_through_dra_claims_share_the_victims_claim_and_leave_nothing() {
    use crate::isolation::plan::{IsolationPlan, Scenario};
    let c = start_dra(dra_node(true, true)).await;
    let before = state(&c).await;
    let dir = tempfile::tempdir().expect("tmp");
    let mut p = dra_plan(dir.path(), "exclusive,time-slicing,mps", "1", "timeslice = \"long\"\n");
    let iso = IsolationPlan {
        scenarios: vec![Scenario::NoisyNeighbour, Scenario::Fault],
        victim_rate: 50.0,
        aggressors: vec![1],
        event_after_s: 0.3,
        observe_s: 1.0,
        slo_s: None,
        aggressor_image: None,
    };
    p.pods = iso.pod_counts();
    p.kind = crate::config::plan::RunKind::Isolation(iso);
    let s = dra_session(&c, &p).await.unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let records = super::cluster_tests::trial_records(&c, s).await;
    let find = |s: Strategy, scenario: &str| {
        records
            .iter()
            .find(|r| r.strategy == s && r.scenario == scenario)
            .unwrap_or_else(|| panic!("{s} {scenario}: {records:#?}"))
    };
    for s in [Strategy::Exclusive, Strategy::TimeSlicing, Strategy::Mps] {
        let alone = find(s, "alone");
        assert_eq!(alone.victim_status, CellStatus::Ok, "{alone:?}\n{}", c.log());
    }
    // Exclusive: a claim per pod; the victim was bound first and holds the one GPU, so
    // the real scheduler finds no device for the aggressor's claim.
    let ex = find(Strategy::Exclusive, "noisy-neighbour");
    assert_eq!(ex.victim_status, CellStatus::Ok, "{ex:?}");
    assert!(ex.aggressor_outcome.contains("pending"), "{ex:?}");
    // Time-slicing: a fault ends the faulting container only.
    let ts = find(Strategy::TimeSlicing, "fault");
    assert_eq!(ts.victim_status, CellStatus::Ok, "{ts:?}");
    assert!(ts.aggressor_outcome.contains("exit 5"), "{ts:?}");
    // Victim and aggressors of a shared trial reference one claim, with the run's one
    // interval, and the driver applied it to both.
    for (cell, claim) in [
        ("time-slicing-long-2", "gpushare-time-slicing-long-2"),
        ("mps-2", "gpushare-mps-2"),
    ] {
        let facts = cell_facts(&c, cell);
        let roles: BTreeSet<&str> = facts.iter().map(|f| f.role.as_str()).collect();
        assert!(
            roles.contains("victim") && roles.contains("aggressor"),
            "{cell}: {facts:?}"
        );
        assert!(facts.iter().all(|f| f.claim == claim), "{cell}: {facts:?}");
    }
    let ts = cell_facts(&c, "time-slicing-long-2");
    assert!(
        ts.iter()
            .all(|f| f.dra_sharing == Some(Sharing::TimeSlicing("Long".into()))),
        "{ts:?}"
    );
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
    // MPS's victim alone again under the fault trial's limits: its own claim carries
    // them explicitly, and the driver applied them.
    let capped = find(Strategy::Mps, crate::isolation::plan::CAPPED);
    assert_eq!(
        (capped.victim_status, capped.aggressors),
        (CellStatus::Ok, 1),
        "{capped:?}\n{}",
        c.log()
    );
    assert!(
        capped
            .mps_split
            .as_deref()
            .is_some_and(|m| m.starts_with("50% of the SMs")),
        "{capped:?}"
    );
    let capped_facts: Vec<gpushare_k8s_sim::PodFacts> = c
        .node
        .facts()
        .into_values()
        .filter(|f| f.cell.starts_with("mps-threads50"))
        .collect();
    assert!(
        !capped_facts.is_empty()
            && capped_facts.iter().all(|f| matches!(
                f.dra_sharing,
                Some(Sharing::Mps {
                    thread_percentage: Some(50),
                    ..
                })
            )),
        "{capped_facts:?}"
    );
    // The neighbours' part of the noisy trial: its p99 over the capped victim's alone.
    let noisy = find(Strategy::Mps, "noisy-neighbour");
    let over = noisy.p99_over_capped.expect("a ratio to the capped victim alone");
    assert!(
        (over - noisy.victim_p99_s.expect("p99") / capped.victim_p99_s.expect("p99")).abs() < 1e-12,
        "{noisy:?}"
    );
    let left = dra_leftovers(&c).await;
    assert!(left.is_empty(), "{left:?}\n{}", c.log());
    assert_eq!(state(&c).await, before, "nothing on the node changes\n{}", c.log());
    let j = journal::read(&dir.path().join("sim").join(journal::FILE))
        .expect("journal")
        .expect("exists");
    assert!(
        j.restored && j.deployments.len() == 2 && j.claims.contains("resourceclaims/gpushare-mps-2"),
        "{j:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_mps_limit_is_its_own_claims_config_and_rows() {
    let c = start_dra(dra_node(false, true)).await;
    let dir = tempfile::tempdir().expect("tmp");
    let p = dra_plan(
        dir.path(),
        "mps",
        "2",
        "mps_threads = \"auto,100\"\nmps_memory = \"none\"\n",
    );
    let s = dra_session(&c, &p).await.unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    let outcome = run(&c, s).await;
    assert_eq!((outcome.measured, outcome.failed), (2, 0), "{}", c.log());
    // What the driver applied to each arm's pods: the claim's own limits.
    let facts = c.node.facts();
    for (cell, threads) in [("mps-memory-none-2", 50), ("mps-threads100-memory-none-2", 100)] {
        let of_cell: Vec<&gpushare_k8s_sim::PodFacts> = facts.values().filter(|f| f.cell == cell).collect();
        assert_eq!(of_cell.len(), 2, "{cell}: {facts:#?}");
        let want = Some(gpushare_k8s_sim::dra::Sharing::Mps {
            thread_percentage: Some(threads),
            pinned_limit: None,
        });
        assert!(
            of_cell
                .iter()
                .all(|f| f.claim == format!("gpushare-{cell}") && f.dra_sharing == want),
            "{cell}: {of_cell:?}"
        );
    }
    let data = crate::report::RunData::load(&dir.path().join("sim")).expect("run data");
    let notes: Vec<(String, String)> = data
        .cells
        .iter()
        .filter(|r| r.is_aggregate())
        .map(|r| (r.arm().name(), r.note.clone()))
        .collect();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[1].0 == "mps-threads100-memory-none"
            && notes[1]
                .1
                .contains("GpuConfig MPS (100% of the threads, pinned memory unlimited"),
        "{notes:?}"
    );
    let left = dra_leftovers(&c).await;
    assert!(left.is_empty(), "{left:?}\n{}", c.log());
}
