//! The real binary's Kubernetes commands against the simulated cluster
//! (`backend::k8s::sim`) through a kubeconfig: `restore --node` puts back a killed run's
//! changes from its journal (a second restore finds nothing to do, a wrong node is one
//! clear error); `doctor --kubernetes --node` passes on a ready cluster and names each
//! missing prerequisite with its fix.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use gpushare_bench::backend::Backend;
use gpushare_bench::backend::k8s::base::KubeSettings;
use gpushare_bench::backend::k8s::device_plugin::KubernetesBackend;
use gpushare_bench::backend::k8s::objects::{self, WorkloadSpec};
use gpushare_bench::domain::Strategy;
use gpushare_bench::shutdown::Shutdown;
use gpushare_k8s_sim::rbac::{objects_from_yaml, with_rule_verbs};
use gpushare_k8s_sim::{ClusterSpec, HARNESS_TOKEN, SimCluster};
use serde_json::Value;

const SPEED: f64 = 200.0;

fn rbac() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/base/rbac.yaml");
    let text = std::fs::read_to_string(path).expect("rbac.yaml");
    objects_from_yaml(&text).expect("YAML documents")
}

fn kubeconfig(dir: &Path, url: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {url}\nusers:\n- name: harness\n  user:\n    token: {HARNESS_TOKEN}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: harness\n    namespace: default\ncurrent-context: sim\n"
        ),
    )
    .expect("kubeconfig");
    path
}

/// Runs the binary (blocking, off the runtime that serves the simulated API).
async fn bench(args: Vec<String>, kubeconfig: std::path::PathBuf) -> (i32, String, String) {
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

fn state(sim: &SimCluster) -> (BTreeMap<String, String>, Option<BTreeMap<String, String>>) {
    sim.with(|w| {
        w.settle(900.0);
        (w.node_labels(), w.configmap())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_node_puts_back_a_killed_runs_changes_from_its_journal() {
    let sim = SimCluster::start(ClusterSpec::h100("gpu-1"), &rbac(), SPEED)
        .await
        .expect("simulator");
    sim.with(|w| w.add_namespace("gpushare-bench"));
    let before = state(&sim);
    let tmp = tempfile::tempdir().expect("tmp");
    let run = tmp.path().join("run-1");
    std::fs::create_dir_all(&run).expect("run dir");
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
        let mut b = KubernetesBackend::new(sim.client(), s.faster(SPEED));
        b.check_cluster().await.expect("cluster");
        b.attach_journal(&run).expect("journal");
        b.prepare(Strategy::TimeSlicing.into(), &Shutdown::new())
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    }
    let changed = state(&sim);
    assert_eq!(
        changed.0.get(objects::LABEL_PLUGIN_CONFIG).map(String::as_str),
        Some("gpushare-time-slicing-3")
    );
    let kc = kubeconfig(tmp.path(), &sim.url());
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
    assert_eq!(code, 0, "{stdout}{stderr}\n{}", sim.log());
    assert!(
        stdout.contains("undone: node gpu-1 label nvidia.com/device-plugin.config"),
        "{stdout}"
    );
    assert!(stdout.contains("removed the 2 keys the harness added"), "{stdout}");
    assert_eq!(state(&sim), before, "{}", sim.log());
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

async fn doctor(sim: &SimCluster, tmp: &Path) -> (i32, String) {
    let kc = kubeconfig(tmp, &sim.url());
    let (code, stdout, stderr) = bench(
        vec!["doctor".into(), "--kubernetes".into(), "--node".into(), "gpu-1".into()],
        kc,
    )
    .await;
    (code, format!("{stdout}{stderr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_kubernetes_passes_a_ready_cluster_and_names_what_is_missing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let sim = SimCluster::start(ClusterSpec::h100("gpu-1"), &rbac(), SPEED)
        .await
        .expect("simulator");
    sim.with(|w| w.add_namespace("gpushare-bench"));
    let (code, out) = doctor(&sim, tmp.path()).await;
    assert_eq!(code, 0, "{out}");
    for line in [
        "ok    cluster                API server v1.34.0-sim",
        "ok    node                   gpu-1: 1 × NVIDIA-H100-80GB-HBM3; taints nvidia.com/gpu:NoSchedule",
        "ok    ClusterPolicy          devicePlugin.config.name device-plugin-config (default key any), mig.strategy single",
        "ok    GPU operator           nvcr.io/nvidia/gpu-operator:v25.10.1",
        "ok    Prometheus scrape      Role prometheus-k8s in gpushare-bench",
        "ok    permissions            all ",
        "warn  DRA driver             no DeviceClass gpu.nvidia.com (only --sharing-api dra needs it)",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    // NVIDIA's DRA driver with its gates off (its chart's default), read with the DRA
    // overlay's RBAC: the doctor passes and says which gates DRA sharing needs.
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.dra = Some(gpushare_k8s_sim::dra::Gates::default());
    let overlay = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/dra/rbac.yaml");
    let overlay = objects_from_yaml(&std::fs::read_to_string(overlay).expect("overlay")).expect("YAML");
    let dra = SimCluster::start(spec, &[rbac(), overlay].concat(), SPEED)
        .await
        .expect("simulator");
    dra.with(|w| w.add_namespace("gpushare-bench"));
    let (code, out) = doctor(&dra, tmp.path()).await;
    assert_eq!(code, 0, "{out}");
    for line in [
        "ok    DRA slices             1 GPU of gpu.nvidia.com on gpu-1",
        "warn  DRA driver             registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1; feature gates on: none; off: TimeSlicingSettings, MPSSupport",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    // A 2-GPU node, no config name in the ClusterPolicy, the old workload Role.
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.gpus = 2;
    spec.plugin_config = (String::new(), String::new());
    let old = with_rule_verbs(
        rbac(),
        "gpushare-bench-workload",
        0,
        &["get", "list", "patch", "delete"],
    );
    let sim = SimCluster::start(spec, &old, SPEED).await.expect("simulator");
    let (code, out) = doctor(&sim, tmp.path()).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  node                   gpu-1: 2 × NVIDIA-H100-80GB-HBM3 — 2 GPUs"),
        "{out}"
    );
    assert!(
        out.contains("FAIL  ClusterPolicy") && out.contains("devicePlugin.config.name"),
        "{out}"
    );
    let mut spec = ClusterSpec::h100("gpu-1");
    spec.configmap = None;
    let sim = SimCluster::start(spec, &old, SPEED).await.expect("simulator");
    let (code, out) = doctor(&sim, tmp.path()).await;
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
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("reaching the API server: no answer within 30 s: the API server is unreachable or stalled"),
        "{text}"
    );
    drop(held);
}
