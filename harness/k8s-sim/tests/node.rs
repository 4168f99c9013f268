//! The GPU node played through Kubernetes' own control plane: it registers, the GPU
//! operator's DaemonSets run on it, and of two pods asking for its one GPU the real
//! scheduler binds one, which the node runs.

use std::time::{Duration, Instant};

use gpushare_k8s_sim::ClusterSpec;
use gpushare_k8s_sim::cluster::TestCluster;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_registers_runs_the_operands_and_the_scheduler_gives_its_gpu_to_one_pod() {
    let c = TestCluster::start(ClusterSpec::h100("gpu-1"), 50.0)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let node = Api::<Node>::all(c.admin.clone()).get("gpu-1").await.expect("node");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("nvidia.com/gpu.product").map(String::as_str),
        Some("NVIDIA-H100-80GB-HBM3"),
        "{}",
        c.log()
    );
    let alloc = node.status.and_then(|s| s.allocatable).unwrap_or_default();
    assert_eq!(
        alloc.get("nvidia.com/gpu").map(|q| q.0.as_str()),
        Some("1"),
        "{}",
        c.log()
    );
    // Two pods asking for the one GPU: the real scheduler binds one, our kubelet runs it.
    let pods: Api<Pod> = Api::namespaced(c.admin.clone(), "default");
    for name in ["gpu-a", "gpu-b"] {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
        }))
        .expect("pod");
        pods.create(&Default::default(), &pod).await.expect("create");
    }
    let start = Instant::now();
    loop {
        let list = pods.list(&ListParams::default()).await.expect("pods");
        let ready: Vec<&str> = list
            .items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        let unschedulable = list.items.iter().any(|p| {
            p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                c.iter().any(|c| {
                    c.reason.as_deref() == Some("Unschedulable")
                        && c.message
                            .as_deref()
                            .is_some_and(|m| m.contains("Insufficient nvidia.com/gpu"))
                })
            })
        });
        if ready.len() == 1 && unschedulable {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "want one pod ready and one Insufficient: {:#?}\n{}",
            list.items.iter().map(|p| &p.status).collect::<Vec<_>>(),
            c.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(c.node.facts().len(), 1, "{}", c.log());
}
