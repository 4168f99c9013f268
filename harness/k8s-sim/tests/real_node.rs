//! A node made of the real components (kubelet, containerd, runc, the CNI bridge)
//! beside Kubernetes' own control plane: it registers and becomes Ready, a pod is a
//! container the kubelet started through the runtime with an address in the node's
//! pod range, a pod deleted is stopped and removed by the kubelet, and once the node is
//! stopped nothing of it is left: no process, no mount, no cgroup.

use std::time::{Duration, Instant};

use gpushare_k8s_sim::control_plane::ControlPlane;
use gpushare_k8s_sim::real_node::{PAUSE_IMAGE, RealNode, RealNodeSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

async fn wait_for<T>(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(start.elapsed() < limit, "no {what} after {} s", limit.as_secs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every line of the machine's mount table naming `dir`.
fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let d = dir.to_string_lossy();
    text.lines().filter(|l| l.contains(&*d)).map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_is_a_container_the_real_kubelet_starts_and_the_node_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = ControlPlane::start(&dir.path().join("cp")).unwrap_or_else(|e| panic!("{e}"));
    let admin = cp
        .client(&cp.admin_kubeconfig())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let node_dir = dir.path().join("node");
    let spec = RealNodeSpec {
        name: "gpu-1".into(),
        images: Vec::new(),
    };
    let mut node = RealNode::start(&cp, &admin, spec, &node_dir)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let log = node.kubelet_log();
    assert!(
        log.contains("\"Successfully registered node\" node=\"gpu-1\""),
        "the kubelet's own line: {log}"
    );

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sleeper"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "c", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
        }
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("create");
    let ip = wait_for("running pod", Duration::from_secs(90), async || {
        let p = pods.get("sleeper").await.ok()?;
        let s = p.status?;
        (s.phase.as_deref() == Some("Running")).then_some(())?;
        s.pod_ip
    })
    .await;
    assert!(ip.starts_with("198.19.0."), "an address in the node's pod range: {ip}");
    let p = pods.get("sleeper").await.expect("pod");
    let cs = &p.status.and_then(|s| s.container_statuses).expect("statuses")[0];
    assert!(
        cs.container_id
            .as_deref()
            .is_some_and(|id| id.starts_with("containerd://")),
        "{cs:?}"
    );

    // Deleted, the kubelet stops its container and makes the final delete.
    pods.delete("sleeper", &DeleteParams::default()).await.expect("delete");
    wait_for("pod removed", Duration::from_secs(60), async || {
        pods.get_opt("sleeper")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;

    let init = node.init_pid();
    let cgroup = node.cgroup_name().expect("cgroup").to_string();
    // The node's mounts are in its own mount namespace, never in the machine's.
    let inside = std::fs::read_to_string(format!("/proc/{init}/mountinfo")).expect("the node's mounts");
    assert!(
        inside.lines().any(|l| l.contains(" /var/lib ")),
        "the node's /var/lib is bound over: {inside}"
    );
    assert_eq!(mounts_under(&node_dir), Vec::<String>::new(), "the machine sees none");
    node.stop().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        !std::path::Path::new(&format!("/proc/{init}")).exists(),
        "the node's first process is gone"
    );
    let cgroups = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for line in cgroups.lines().filter(|l| l.contains(" cgroup")) {
        let at = line.split_whitespace().nth(1).expect("mount point");
        let d = std::path::Path::new(at).join(&cgroup);
        assert!(!d.exists(), "{} is left", d.display());
    }
    // No process of this machine has the node's directory in its command line.
    for p in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let cmd = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        assert!(
            !cmd.contains(&*node_dir.to_string_lossy()),
            "process {:?} outlived the node: {cmd}",
            p.file_name()
        );
    }
}
