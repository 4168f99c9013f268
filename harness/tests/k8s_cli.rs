//! The real binary's Kubernetes commands against Kubernetes' own control plane with a
//! GPU node played through its API (`gpushare_k8s_sim::cluster`), through a kubeconfig
//! of the harness's service account: `restore --node` puts back a killed run's changes
//! from its journal (a second restore finds nothing to do, a wrong node is one clear
//! error); `doctor --kubernetes --node` passes on a ready cluster and names each missing
//! prerequisite with its fix.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpushare_bench::backend::Backend;
use gpushare_bench::backend::k8s::base::KubeSettings;
use gpushare_bench::backend::k8s::device_plugin::KubernetesBackend;
use gpushare_bench::backend::k8s::objects::{self, WorkloadSpec};
use gpushare_bench::domain::Strategy;
use gpushare_bench::shutdown::Shutdown;
use gpushare_k8s_sim::ClusterSpec;
use gpushare_k8s_sim::cluster::TestCluster;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;

/// Node seconds per wall-clock second.
const SPEED: f64 = 50.0;

/// A cluster of `spec` where the user generated the manifests for its node with the
/// binary (`gpushare-bench manifests --node gpu-1 --out DIR`) and applied the given
/// directories of them (`kubectl apply -k DIR/base` and `DIR/node`).
async fn cluster(spec: ClusterSpec, manifests: &[&str]) -> TestCluster {
    let c = TestCluster::start(spec, SPEED).await.unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tmp");
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare-bench"))
        .args(["manifests", "--node", "gpu-1", "--out"])
        .arg(dir.path())
        .output()
        .expect("run gpushare-bench manifests");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The base goes with the node's own directory, as the docs say.
    for m in manifests
        .iter()
        .flat_map(|m| if *m == "base" { vec!["base", "node"] } else { vec![*m] })
    {
        c.kubectl(&["apply", "-k", &dir.path().join(m).to_string_lossy()])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    c
}

/// A kubeconfig of the harness's service account, with a token from the API server.
fn harness_kubeconfig(c: &TestCluster) -> PathBuf {
    c.cp.service_account_kubeconfig("gpushare-bench", "gpushare-bench")
        .unwrap_or_else(|e| panic!("{e}"))
}

fn kubeconfig(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stalled\n  cluster:\n    server: {url}\nusers:\n- name: harness\n  user:\n    token: none\ncontexts:\n- name: stalled\n  context:\n    cluster: stalled\n    user: harness\n    namespace: default\ncurrent-context: stalled\n"
        ),
    )
    .expect("kubeconfig");
    path
}

/// Runs the binary (blocking, off the runtime).
async fn bench(args: Vec<String>, kubeconfig: PathBuf) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_gpushare-bench"))
            .args(&args)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("run gpushare-bench");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .expect("join")
}

/// The node's labels and the device-plugin ConfigMap, after the operator has settled.
async fn state(c: &TestCluster) -> (BTreeMap<String, String>, Option<BTreeMap<String, String>>) {
    c.node.settle(150.0).await;
    let node = Api::<Node>::all(c.admin.clone()).get("gpu-1").await.expect("node");
    let labels = node.metadata.labels.unwrap_or_default().into_iter().collect();
    let cms: Api<ConfigMap> = Api::namespaced(c.admin.clone(), "gpu-operator");
    let cm = cms
        .get_opt("device-plugin-config")
        .await
        .expect("ConfigMap")
        .map(|cm| cm.data.unwrap_or_default().into_iter().collect());
    (labels, cm)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_node_puts_back_a_killed_runs_changes_from_its_journal() {
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.timings.operator_reconcile = 1e9;
    let c = cluster(spec, &["base"]).await;
    let before = state(&c).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let run = tmp.path().join("run-1");
    std::fs::create_dir_all(&run).expect("run dir");
    let kc = harness_kubeconfig(&c);
    // A run switches the node to time-slicing, then dies without restoring.
    {
        let workload = WorkloadSpec {
            namespace: "gpushare-bench".into(),
            image: "gpushare-workload:test".into(),
            node: "gpu-1".into(),
            args: Vec::new(),
            tolerations: vec![objects::DEFAULT_TOLERATION.into()],
            pull_secrets: Vec::new(),
            server: None,
        };
        let mut s = KubeSettings::new("gpu-1", workload);
        s.strategies = vec![Strategy::TimeSlicing];
        s.pods = vec![1, 3];
        let client = c.cp.client(&kc).await.expect("client");
        let mut b = KubernetesBackend::new(client, s.faster(SPEED));
        b.check_cluster().await.expect("cluster");
        b.attach_journal(&run).expect("journal");
        b.prepare(Strategy::TimeSlicing.into(), &Shutdown::new())
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
    }
    let changed = state(&c).await;
    assert_eq!(
        changed.0.get(objects::LABEL_PLUGIN_CONFIG).map(String::as_str),
        Some("gpushare-time-slicing-3")
    );
    let out = tmp.path().display().to_string();
    let (code, stdout, stderr) = bench(
        vec![
            "restore".into(),
            "--node".into(),
            "gpu-1".into(),
            "--out".into(),
            out.clone(),
        ],
        kc.clone(),
    )
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", c.log());
    assert!(
        stdout.contains("undone: node gpu-1 label nvidia.com/device-plugin.config"),
        "{stdout}"
    );
    assert!(stdout.contains("removed the 2 keys the harness added"), "{stdout}");
    assert_eq!(state(&c).await, before, "{}", c.log());
    // Nothing left: a second restore of the same run says so.
    let (code, stdout, _) = bench(
        vec![
            "restore".into(),
            "--node".into(),
            "gpu-1".into(),
            run.display().to_string(),
        ],
        kc.clone(),
    )
    .await;
    assert_eq!((code, stdout.trim()), (0, "node gpu-1: nothing to undo"));
    let (code, _, stderr) = bench(
        vec![
            "restore".into(),
            "--node".into(),
            "gpu-2".into(),
            run.display().to_string(),
        ],
        kc,
    )
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--node") && stderr.contains("journals node gpu-1"),
        "{stderr}"
    );
}

async fn doctor(c: &TestCluster) -> (i32, String) {
    let (code, stdout, stderr) = bench(
        vec!["doctor".into(), "--kubernetes".into(), "--node".into(), "gpu-1".into()],
        harness_kubeconfig(c),
    )
    .await;
    (code, format!("{stdout}{stderr}"))
}

/// Sets the verbs of the workload Role's first rule to those of its version before
/// `create` was granted on Deployments.
fn old_workload_role(c: &TestCluster) {
    let patch = r#"[{"op": "replace", "path": "/rules/0/verbs", "value": ["get", "list", "patch", "delete"]}]"#;
    c.kubectl(&[
        "patch",
        "role",
        "-n",
        "gpushare-bench",
        "gpushare-bench-workload",
        "--type=json",
        "-p",
        patch,
    ])
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_kubernetes_passes_a_ready_cluster_and_names_what_is_missing() {
    let c = cluster(ClusterSpec::h100("gpu-1"), &["base"]).await;
    let (code, out) = doctor(&c).await;
    assert_eq!(code, 0, "{out}");
    for line in [
        "ok    cluster                API server v1.34.4",
        "ok    node                   gpu-1: 1 × NVIDIA-H100-80GB-HBM3; taints nvidia.com/gpu:NoSchedule",
        "ok    ClusterPolicy          devicePlugin.config.name device-plugin-config (default key any), mig.strategy single",
        "ok    GPU operator           nvcr.io/nvidia/gpu-operator:v25.10.1",
        "ok    Prometheus scrape      Role prometheus-k8s in gpushare-bench",
        "ok    DCGM scrape            ServiceMonitor on in the ClusterPolicy; Role gpushare-bench-dcgm-scrape in gpu-operator",
        "ok    permissions            all ",
        "warn  DRA driver             no DeviceClass gpu.nvidia.com (only --sharing-api dra needs it)",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    drop(c);
    // NVIDIA's DRA driver with its gates off (its chart's default) on a node without the
    // device plugin, read with the DRA overlay's RBAC: the doctor passes and says which
    // gates DRA sharing needs.
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.dra = Some(gpushare_k8s_sim::dra::Gates::default());
    spec.device_plugin = false;
    let c = cluster(spec, &["base", "dra"]).await;
    let (code, out) = doctor(&c).await;
    assert_eq!(code, 0, "{out}");
    for line in [
        "warn  device plugin          off on gpu-1 (nvidia.com/gpu.deploy.device-plugin=false): the default --sharing-api device-plugin cannot run there; --sharing-api dra can",
        "ok    DRA slices             1 GPU of gpu.nvidia.com on gpu-1",
        "warn  DRA driver             registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1; feature gates on: none; off: TimeSlicingSettings, MPSSupport",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    drop(c);
    // A 2-GPU node, no config name in the ClusterPolicy, the old workload Role.
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.gpus = 2;
    spec.plugin_config = (String::new(), String::new());
    let c = cluster(spec, &["base"]).await;
    old_workload_role(&c);
    let (code, out) = doctor(&c).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("ok    node                   gpu-1: 2 × NVIDIA-H100-80GB-HBM3 — the device plugin spreads pods over the 2 GPUs"),
        "{out}"
    );
    assert!(
        out.contains("FAIL  ClusterPolicy") && out.contains("devicePlugin.config.name"),
        "{out}"
    );
    drop(c);
    // No device-plugin ConfigMap; the old workload Role, whose missing `create` the
    // doctor finds by asking the API server (SelfSubjectAccessReview).
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.configmap = None;
    let c = cluster(spec, &["base"]).await;
    old_workload_role(&c);
    let (code, out) = doctor(&c).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  device-plugin config   ConfigMap gpu-operator/device-plugin-config does not exist"),
        "{out}"
    );
    assert!(
        out.contains(
            "FAIL  permission             denied: create apps/deployments gpushare-workload in gpushare-bench"
        ),
        "{out}"
    );
}

#[test]
fn a_stalled_api_server_ends_the_command_with_a_timeout_instead_of_hanging() {
    // An API server that accepts the connection and never answers (loopback, plain HTTP).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        while let Ok((conn, _)) = listener.accept() {
            open.push(conn);
            if open.len() > 8 {
                break;
            }
        }
    });
    let tmp = tempfile::tempdir().expect("tmp");
    let kc = kubeconfig(tmp.path(), &url);
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpushare-bench"))
        .args(["doctor", "--kubernetes", "--node", "gpu-1"])
        .env("KUBECONFIG", &kc)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run gpushare-bench");
    let limit = gpushare_bench::backend::k8s::base::API_TIMEOUT + std::time::Duration::from_secs(20);
    let start = std::time::Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!(
                "doctor still waiting on a stalled API server after {} s",
                limit.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let out = child.wait_with_output().expect("output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // The table, one line, and no client logs beside it.
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert!(
        lines[0].starts_with("FAIL  cluster")
            && lines[0]
                .contains("reaching the API server: no answer within 30 s: the API server is unreachable or stalled")
            && lines[0].ends_with("nothing else was checked"),
        "{stdout}"
    );
    assert!(stderr.is_empty(), "{stderr}");
    drop(held);
}

#[test]
fn without_a_kubeconfig_doctor_prints_its_table() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare-bench"))
        .args(["doctor", "--kubernetes", "--node", "gpu-1"])
        .env("KUBECONFIG", tmp.path().join("none"))
        .env("HOME", tmp.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run gpushare-bench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("FAIL  cluster"), "{stdout}");
    assert!(stdout.contains("nothing else was checked"), "{stdout}");
    assert!(stderr.is_empty(), "{stderr}");
}
