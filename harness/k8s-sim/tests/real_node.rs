//! A node made of the real components (kubelet, containerd, runc, the CNI bridge)
//! beside Kubernetes' own control plane: it registers and becomes Ready, a pod is a
//! container the kubelet started through the runtime with an address in the node's
//! pod range, a pod deleted is stopped and removed by the kubelet, and once the node is
//! stopped nothing of it is left: no process, no mount, no cgroup.

use std::time::{Duration, Instant};

use gpushare_k8s_sim::real_node::device_plugin::{self, CONFIG_LABEL, PluginLayout};
use gpushare_k8s_sim::real_node::{Image, PAUSE_IMAGE, RealCluster, RealNode, RealNodeSpec, SHELL_IMAGE};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

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

/// A node with no GPU and no image but the pause image.
fn bare(name: &str) -> RealNodeSpec {
    RealNodeSpec {
        name: name.into(),
        images: Vec::new(),
        gpus: Vec::new(),
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
    let node_dir = dir.path().join("node");
    let mut c = RealCluster::start(dir.path(), bare("gpu-1"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (node, admin) = (&mut c.node, c.admin.clone());
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

/// The node's `nvidia.com/gpu` allocatable, as the kubelet posts it.
async fn allocatable_gpus(nodes: &Api<Node>, name: &str) -> Option<String> {
    let n = nodes.get(name).await.ok()?;
    n.status?.allocatable?.get("nvidia.com/gpu").map(|q| q.0.clone())
}

/// Every container log line the kubelet wrote for pods whose name starts with `pod`
/// (the node's `/var/log/pods`).
fn container_logs(node: &RealNode, ns: &str, pod: &str) -> String {
    let mut text = String::new();
    let root = node.dir().join("var-log/pods");
    for d in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&format!("{ns}_{pod}")) {
            continue;
        }
        for c in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
                text.push_str(&std::fs::read_to_string(f.path()).unwrap_or_default());
            }
        }
    }
    text
}

/// NVIDIA's device plugin v0.18.1, unmodified, in the operator's DaemonSet on the real
/// node: its config manager reads the node label the test sets, the plugin finds the
/// mock NVML's H100 and registers with the real kubelet, which advertises one
/// `nvidia.com/gpu`, then four replicas once the label names a time-slicing config (the
/// config manager's SIGHUP); a pod asking for one is given the GPU's UUID by the plugin's
/// `Allocate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidias_device_plugin_advertises_the_gpus_its_config_manager_chose_through_the_real_kubelet() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = RealNodeSpec {
        name: "gpu-1".into(),
        images: vec![Image::device_plugin(), Image::shell()],
        gpus: vec!["H100_SXM5_80GB".into()],
    };
    let c = RealCluster::start(dir.path(), spec)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (node, admin) = (&c.node, c.admin.clone());
    let layout = PluginLayout {
        namespace: "gpu-operator".into(),
        configmap: (
            "plugin-config".into(),
            vec![
                ("default".into(), "version: v1\n".into()),
                (
                    "ts-4".into(),
                    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
                        .into(),
                ),
            ],
        ),
        default: "default".into(),
        mig_strategy: "none".into(),
    };
    c.apply(device_plugin::objects(&layout))
        .unwrap_or_else(|e| panic!("{e}"));
    // The operator's deploy label, which the operator's reconcile (played) sets.
    let nodes: Api<Node> = Api::all(admin.clone());
    let label = |k: &str, v: &str| {
        let patch = serde_json::json!({"metadata": {"labels": {k: v}}});
        let nodes = nodes.clone();
        async move {
            nodes
                .patch("gpu-1", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("label the node");
        }
    };
    label("nvidia.com/gpu.deploy.device-plugin", "true").await;
    let plugin_log = || container_logs(node, "gpu-operator", device_plugin::DAEMONSET);
    let one = wait_for_or("one GPU advertised", Duration::from_secs(120), async || {
        allocatable_gpus(&nodes, "gpu-1").await.filter(|n| n == "1")
    })
    .await;
    if let Err(e) = one {
        panic!("{e}\n--- plugin pod ---\n{}\n{}", plugin_log(), node.log());
    }

    // The harness's label: the config manager writes ts-4 and signals the plugin.
    label(CONFIG_LABEL, "ts-4").await;
    let four = wait_for_or("four replicas advertised", Duration::from_secs(120), async || {
        allocatable_gpus(&nodes, "gpu-1").await.filter(|n| n == "4")
    })
    .await;
    if let Err(e) = four {
        panic!("{e}\n--- plugin pod ---\n{}\n{}", plugin_log(), node.log());
    }
    let log = plugin_log();
    let registered: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Registered device plugin for 'nvidia.com/gpu' with Kubelet"))
        .collect();
    assert!(
        registered.len() >= 2,
        "registered at start and after the SIGHUP:\n{log}"
    );
    let kubelet = node.kubelet_log();
    let kubelet_lines: Vec<&str> = kubelet
        .lines()
        .filter(|l| l.contains("nvidia.com/gpu") && l.contains("egistration"))
        .collect();
    assert!(
        !kubelet_lines.is_empty(),
        "the kubelet's registration lines:\n{kubelet}"
    );
    println!(
        "device plugin: {}\nkubelet: {}",
        registered.join("\n"),
        kubelet_lines.join("\n")
    );

    // A pod asking for one replica: the plugin's Allocate gives it the GPU's UUID.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gpu-user"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "c", "image": SHELL_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "env; exec sleep 600"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }],
        }
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("create");
    let visible = wait_for_or(
        "NVIDIA_VISIBLE_DEVICES in the container",
        Duration::from_secs(60),
        async || {
            container_logs(node, "default", "gpu-user")
                .lines()
                .find_map(|l| l.split("NVIDIA_VISIBLE_DEVICES=").nth(1).map(str::to_string))
        },
    )
    .await;
    let visible = visible.unwrap_or_else(|e| panic!("{e}\n{}", node.log()));
    assert!(visible.starts_with("GPU-") && !visible.contains("::"), "{visible}");
}

async fn wait_for_or<T>(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> Result<T, String> {
    let start = Instant::now();
    loop {
        if let Some(t) = f().await {
            return Ok(t);
        }
        if start.elapsed() > limit {
            return Err(format!("no {what} after {} s", limit.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Not a test of its own: the process [`a_node_whose_test_process_is_killed_leaves_nothing_running`]
/// starts and kills. It starts a control plane and a node in `GPUSHARE_NODE_DIR`, says
/// so in a file there, and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by a_node_whose_test_process_is_killed_leaves_nothing_running"]
async fn node_to_be_killed() {
    let Some(dir) = std::env::var_os("GPUSHARE_NODE_DIR").map(std::path::PathBuf::from) else {
        return;
    };
    let c = RealCluster::start(&dir, bare("gpu-1"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let facts = format!("{} {}", c.node.init_pid(), c.node.cgroup_name().unwrap_or_default());
    std::fs::write(dir.join("started"), facts).expect("write");
    tokio::time::sleep(Duration::from_secs(300)).await;
}

/// A test process killed with SIGKILL (no destructor runs) takes its node with it: the
/// node's namespaces die with their first process, and the next node removes the dead
/// test's cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_test_process_is_killed_leaves_nothing_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "node_to_be_killed", "--ignored", "--nocapture"])
        .env("GPUSHARE_NODE_DIR", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the node's process");
    let started = dir.path().join("started");
    let begun = Instant::now();
    while !started.exists() {
        assert!(begun.elapsed() < Duration::from_secs(120), "the node never started");
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the node's process ended first: {status}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let facts = std::fs::read_to_string(&started).expect("facts");
    let (init, cgroup) = facts.split_once(' ').expect("pid and cgroup");
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    // The namespace's first process, and with it every process of the node.
    let gone = Instant::now();
    while std::path::Path::new(&format!("/proc/{init}")).exists() {
        assert!(
            gone.elapsed() < Duration::from_secs(20),
            "the node outlived its test process"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Nor does any process of its control plane or node (all name the test's directory).
    let test_dir = dir.path().to_string_lossy().into_owned();
    let settle = Instant::now();
    loop {
        let left: Vec<String> = std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .map(|p| String::from_utf8_lossy(&std::fs::read(p.path().join("cmdline")).unwrap_or_default()).into_owned())
            .filter(|cmd| cmd.contains(&test_dir))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            settle.elapsed() < Duration::from_secs(10),
            "outlived the test process: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The next node removes the dead test's cgroup before making its own.
    let mut next = RealCluster::start(&dir.path().join("next"), bare("gpu-2"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for line in mounts.lines().filter(|l| l.contains(" cgroup")) {
        let at = line.split_whitespace().nth(1).expect("mount point");
        let d = std::path::Path::new(at).join(cgroup);
        assert!(!d.exists(), "{} is left", d.display());
    }
    next.node.stop().unwrap_or_else(|e| panic!("{e}"));
}
