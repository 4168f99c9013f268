//! The harness's own workload Deployment on a node made of the real components (the
//! kubelet, containerd and runc, the CNI bridge, NVIDIA's device plugin behind the mock
//! NVML): in the harness's namespace, which enforces the restricted Pod Security Standard,
//! the real kubelet starts `gpushare-workload` (the CPU `tiny` model) as a container of the
//! workload image, as UID 10001 under the runtime's default seccomp profile, with the GPU
//! the plugin's `Allocate` gave it, and the pod turns Ready when the kubelet's own
//! readiness probe reaches it over the pod network.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

use super::objects::{self, WorkloadSpec};
use crate::domain::Strategy;
use gpushare_k8s_sim::real_node::device_plugin::{self, PluginLayout};
use gpushare_k8s_sim::real_node::{Image, RealCluster, RealNode, RealNodeSpec};

/// The workload binary of this build (`make test` builds the workspace first).
fn workload_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe.parent().and_then(Path::parent).expect("target directory");
    let bin = dir.join("gpushare-workload");
    assert!(bin.is_file(), "{} missing: build the workspace first", bin.display());
    bin
}

/// The name the CRI looks an image up by (a bare `name:tag` is Docker Hub's library).
fn normalized(image: &str) -> String {
    let first = image.split('/').next().unwrap_or_default();
    let has_registry = image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    match (has_registry, image.contains('/')) {
        (true, _) => image.to_string(),
        (false, true) => format!("docker.io/{image}"),
        (false, false) => format!("docker.io/library/{image}"),
    }
}

/// The pid of a process of the node (in its cgroup) whose program is `program`.
fn process_of(node: &RealNode, program: &str) -> Option<u32> {
    let cgroup = format!("/{}/", node.cgroup_name()?);
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
        let pid: u32 = p.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(p.path().join("cmdline")).ok()?;
        let arg0 = cmd.split(|b| *b == 0).next()?;
        let ours = std::fs::read_to_string(p.path().join("cgroup")).ok()?.contains(&cgroup);
        (ours && String::from_utf8_lossy(arg0).ends_with(program)).then_some(pid)
    })
}

/// The value of `key:` in `/proc/PID/status`.
fn status_field(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workload_runs_as_a_restricted_container_the_real_kubelet_started_with_the_plugins_gpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = crate::config::plan::DEFAULT_IMAGE;
    let spec = RealNodeSpec {
        name: "gpu-1".into(),
        images: vec![
            Image::device_plugin(),
            Image::of_program(&normalized(image), &workload_binary()),
        ],
        gpus: vec!["H100_SXM5_80GB".into()],
    };
    let c = RealCluster::start(dir.path(), spec)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (node, admin) = (&c.node, c.admin.clone());
    let layout = PluginLayout {
        namespace: "gpu-operator".into(),
        configmap: ("plugin-config".into(), vec![("default".into(), "version: v1\n".into())]),
        default: "default".into(),
        mig_strategy: "none".into(),
    };
    let workload = WorkloadSpec {
        namespace: "gpushare-bench".into(),
        image: image.to_string(),
        node: "gpu-1".into(),
        args: ["--model", "tiny", "--device", "cpu", "--precision", "fp32"]
            .map(String::from)
            .to_vec(),
        tolerations: vec!["nvidia.com/gpu:NoSchedule".into()],
        pull_secrets: Vec::new(),
        server: None,
    };
    let mut items = device_plugin::objects(&layout);
    items.push(objects::namespace(&workload.namespace));
    items.push(objects::deployment(
        &workload,
        Strategy::TimeSlicing,
        1,
        "nvidia.com/gpu",
        &[],
    ));
    c.apply(items).unwrap_or_else(|e| panic!("{e}"));
    let nodes: Api<Node> = Api::all(admin.clone());
    let deploy = serde_json::json!({"metadata": {"labels": {"nvidia.com/gpu.deploy.device-plugin": "true"}}});
    nodes
        .patch("gpu-1", &PatchParams::default(), &Patch::Merge(&deploy))
        .await
        .expect("the operator's deploy label");

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "gpushare-bench");
    let start = Instant::now();
    let ready = loop {
        let list = pods.list(&ListParams::default()).await.expect("pods");
        let ready = list.items.iter().find(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        if let Some(p) = ready {
            break p.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(150),
            "no Ready workload pod after 150 s: {:?}\n{}",
            list.items.iter().map(|p| &p.status).collect::<Vec<_>>(),
            node.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let ip = ready.status.and_then(|s| s.pod_ip).expect("pod IP");
    assert!(ip.starts_with("198.19.0."), "{ip}");

    // The container's process, seen from this machine: the image's user, the runtime's
    // default seccomp filter, the device the plugin allocated.
    let pid = process_of(node, "gpushare-workload").expect("the workload's process");
    let uid = status_field(pid, "Uid");
    assert_eq!(uid, "10001", "runs as the pod's runAsUser");
    assert_eq!(
        status_field(pid, "Seccomp"),
        "2",
        "a seccomp filter (RuntimeDefault) is on"
    );
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    let visible = String::from_utf8_lossy(&environ)
        .split('\0')
        .find_map(|kv| kv.strip_prefix("NVIDIA_VISIBLE_DEVICES=").map(str::to_string))
        .expect("NVIDIA_VISIBLE_DEVICES from the plugin's Allocate");
    assert!(visible.starts_with("GPU-"), "{visible}");
}
