//! The objects a GPU node and the GPU operator have in a cluster before anyone runs a
//! benchmark: the Node (as the kubelet registers it), its Lease, the ClusterPolicy and
//! its CRD, the device-plugin ConfigMap, the operator's Deployment and DaemonSets, and,
//! with NVIDIA's DRA driver, its DeviceClasses, the node's ResourceSlice and its
//! kubelet-plugin pod. Created through the API as an administrator; the control plane
//! validates each.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::operand::OperandKind;
use crate::spec::ClusterSpec;

/// The ClusterPolicy CRD, reduced to what the harness reads: group `nvidia.com`, version
/// `v1`, cluster-scoped, plural `clusterpolicies`, a status subresource (as the
/// operator's `deployments/gpu-operator/crds/nvidia.com_clusterpolicies.yaml` at v25.10.1
/// declares them); the schema keeps every field instead of spelling them out.
pub const CLUSTER_POLICY_CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "clusterpolicies.nvidia.com"},
  "spec": {
    "group": "nvidia.com", "scope": "Cluster",
    "names": {"kind": "ClusterPolicy", "listKind": "ClusterPolicyList", "plural": "clusterpolicies", "singular": "clusterpolicy"},
    "versions": [{"name": "v1", "served": true, "storage": true,
      "subresources": {"status": {}},
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]
  }
}"#;

/// kube-prometheus's PodMonitor CRD, reduced the same way (`monitoring.coreos.com/v1`,
/// namespaced, plural `podmonitors`): `kubectl apply -k manifests/base` needs the kind.
pub const POD_MONITOR_CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "podmonitors.monitoring.coreos.com"},
  "spec": {
    "group": "monitoring.coreos.com", "scope": "Namespaced",
    "names": {"kind": "PodMonitor", "listKind": "PodMonitorList", "plural": "podmonitors", "singular": "podmonitor"},
    "versions": [{"name": "v1", "served": true, "storage": true,
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]
  }
}"#;

fn typed<T: DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// Creates an object, or leaves the one that exists.
async fn create_or_keep<T>(api: &Api<T>, obj: Value) -> Result<T, String>
where
    T: kube::Resource + Clone + std::fmt::Debug + DeserializeOwned + serde::Serialize,
{
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let typed: T = typed(obj)?;
    match api.create(&PostParams::default(), &typed).await {
        Ok(o) => Ok(o),
        Err(kube::Error::Api(s)) if s.code == 409 => api.get(&name).await.map_err(|e| e.to_string()),
        Err(e) => Err(format!("creating {name}: {e}")),
    }
}

/// Installs a CRD and waits until it is served.
pub async fn install_crd(admin: &Client, text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let name = v["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    create_or_keep(&crds, v).await?;
    for _ in 0..200 {
        let crd = crds.get(&name).await.map_err(|e| e.to_string())?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"));
        if established {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("CRD {name} not established in 10 s"))
}

/// Now as RFC 3339 with microseconds (a MicroTime).
pub fn rfc3339_now() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// The kubelet's heartbeat: the node's Lease in `kube-node-lease`, renewed (the
/// documented node-heartbeat behaviour; `pkg/kubelet/nodelease` was not read).
pub async fn renew_lease(admin: &Client, node: &str) -> Result<(), String> {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let body = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": rfc3339_now()}
    });
    let pp = PatchParams::apply("kubelet").force();
    leases
        .patch(node, &pp, &Patch::Apply(body))
        .await
        .map(|_| ())
        .map_err(|e| format!("renewing node {node}'s lease: {e}"))
}

fn daemonset(ns: &str, app: &str, container: &str, image: &str, selector: &[&str]) -> Value {
    let node_selector: serde_json::Map<String, Value> =
        selector.iter().map(|k| ((*k).to_string(), json!("true"))).collect();
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": app, "namespace": ns, "labels": {"app": app}},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {
                    "nodeSelector": node_selector,
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": container, "image": image}]
                }
            }
        }
    })
}

/// Creates what the node and the operator have before a benchmark.
pub async fn create_all(admin: &Client, s: &ClusterSpec) -> Result<(), String> {
    install_crd(admin, CLUSTER_POLICY_CRD).await?;
    install_crd(admin, POD_MONITOR_CRD).await?;
    let ns = s.operator_namespace.as_str();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    for n in [ns, "monitoring"] {
        create_or_keep(&namespaces, json!({"metadata": {"name": n}})).await?;
    }
    let gvk = GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy");
    let policies: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "clusterpolicies"),
    );
    let policy = json!({
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {
            "devicePlugin": {"config": {"name": s.plugin_config.0, "default": s.plugin_config.1}},
            "dcgmExporter": {"enabled": true, "serviceMonitor": {"enabled": s.dcgm_service_monitor}},
            "mig": {"strategy": s.mig_strategy},
            "migManager": {"enabled": true, "config": {"name": "default-mig-parted-config", "default": "all-disabled"}}
        }
    });
    create_or_keep(&policies, policy).await?;
    policies
        .patch_status(
            "cluster-policy",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"state": "ready", "namespace": ns}})),
        )
        .await
        .map_err(|e| format!("ClusterPolicy status: {e}"))?;
    if let Some(data) = &s.configmap
        && !s.plugin_config.0.is_empty()
    {
        let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
        create_or_keep(
            &cms,
            json!({"metadata": {"name": s.plugin_config.0, "namespace": ns}, "data": data}),
        )
        .await?;
    }
    // The node as a kubelet registers it (the documented fields; the kubelet's
    // `kubelet_node_status.go` was not read): what the scheduler and the node-lifecycle
    // controller of the tests' v1.34.4 control plane accept as a ready node.
    let mut labels = s.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), s.node.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), "amd64".into());
    if !s.device_plugin {
        labels.insert("nvidia.com/gpu.deploy.device-plugin".into(), "false".into());
    }
    let taints = if s.gpu_taint {
        json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    let nodes: Api<Node> = Api::all(admin.clone());
    create_or_keep(
        &nodes,
        json!({"metadata": {"name": s.node, "labels": labels}, "spec": {"taints": taints}}),
    )
    .await?;
    let base = json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
    nodes
        .patch_status(
            &s.node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": base, "allocatable": base,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                                "lastHeartbeatTime": rfc3339_now(), "lastTransitionTime": rfc3339_now()}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": s.node}],
                "nodeInfo": {"kubeletVersion": "v1.34.4", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
                             "containerRuntimeVersion": "sim://1", "kernelVersion": "", "osImage": "", "machineID": "", "systemUUID": "", "bootID": ""}
            }})),
        )
        .await
        .map_err(|e| format!("node status: {e}"))?;
    renew_lease(admin, &s.node).await?;
    // The operator and its operands' DaemonSets (gpu-operator v25.10.1 `assets/state-*`):
    // the DaemonSet controller creates and deletes their pods as the node's deploy labels
    // come and go.
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    create_or_keep(
        &deployments,
        json!({"metadata": {"name": "gpu-operator", "namespace": ns, "labels": {"app": "gpu-operator"}},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "gpu-operator"}},
                        "template": {"metadata": {"labels": {"app": "gpu-operator"}},
                                     "spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                                              "containers": [{"name": "gpu-operator", "image": "nvcr.io/nvidia/gpu-operator:v25.10.1"}]}}}}),
    )
    .await?;
    let plugin_image = "nvcr.io/nvidia/k8s-device-plugin:v0.18.1";
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), ns);
    for (kind, selector) in [
        (OperandKind::Plugin, &["nvidia.com/gpu.deploy.device-plugin"][..]),
        (OperandKind::Gfd, &["nvidia.com/gpu.deploy.gpu-feature-discovery"][..]),
        (
            OperandKind::Mps,
            &["nvidia.com/gpu.deploy.device-plugin", "nvidia.com/mps.capable"][..],
        ),
    ] {
        create_or_keep(
            &daemonsets,
            daemonset(ns, kind.app(), kind.container(), plugin_image, selector),
        )
        .await?;
    }
    create_or_keep(
        &daemonsets,
        daemonset(
            ns,
            "nvidia-mig-manager",
            "nvidia-mig-manager",
            "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.13.1",
            &["nvidia.com/gpu.deploy.mig-manager"],
        ),
    )
    .await?;
    create_or_keep(
        &daemonsets,
        daemonset(
            ns,
            "nvidia-dcgm-exporter",
            "nvidia-dcgm-exporter",
            "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04",
            &["nvidia.com/gpu.deploy.dcgm-exporter"],
        ),
    )
    .await?;
    if let Some(gates) = &s.dra {
        let classes: Api<DynamicObject> = Api::all_with(
            admin.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("resource.k8s.io", "v1", "DeviceClass"),
                "deviceclasses",
            ),
        );
        for c in crate::dra::device_classes() {
            create_or_keep(&classes, c).await?;
        }
        let mut slice = crate::dra::resource_slice(&s.node, s.gpus, &s.gpu.product, s.gpu.memory_mib << 20);
        if !s.dra_mig.is_empty() {
            crate::dra::make_static_mig(&mut slice, &s.dra_mig);
        }
        let slices: Api<DynamicObject> = Api::all_with(
            admin.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice"),
                "resourceslices",
            ),
        );
        create_or_keep(&slices, slice).await?;
        let pod = crate::dra::kubelet_plugin_pod(&s.node, gates);
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        create_or_keep(&namespaces, json!({"metadata": {"name": ns}})).await?;
        let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
        create_or_keep(&pods, pod).await?;
    }
    Ok(())
}

/// ResourceClaims of a namespace.
pub fn claims_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceClaim");
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "resourceclaims"),
    )
}
