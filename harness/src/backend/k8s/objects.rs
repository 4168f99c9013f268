//! Every Kubernetes object and patch the harness applies, built by pure functions. The
//! files under `manifests/` are generated from the same functions
//! (`gpushare-bench manifests`), and a test fails when the two drift apart.

use serde_json::{Value, json};

pub use crate::config::values::{DEFAULT_TOLERATION, toleration};
use crate::domain::Strategy;
use crate::metrics::prometheus::query::{self as promql, Grouping, Selector};

/// Field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "gpushare-bench";
/// Node label that selects a named entry of the device-plugin ConfigMap.
pub const LABEL_PLUGIN_CONFIG: &str = "nvidia.com/device-plugin.config";
/// Node label GPU feature discovery sets to the active sharing strategy.
pub const LABEL_SHARING: &str = "nvidia.com/gpu.sharing-strategy";
/// Node label GPU feature discovery sets to the replicas per GPU.
pub const LABEL_REPLICAS: &str = "nvidia.com/gpu.replicas";
/// Node label the GPU operator's MIG manager reads.
pub const LABEL_MIG_CONFIG: &str = "nvidia.com/mig.config";
/// Node label the MIG manager sets to pending, success or failed.
pub const LABEL_MIG_STATE: &str = "nvidia.com/mig.config.state";
/// Node label: single or mixed MIG strategy of the device plugin.
pub const LABEL_MIG_STRATEGY: &str = "nvidia.com/mig.strategy";
/// Node label: whether the GPU supports MIG.
pub const LABEL_MIG_CAPABLE: &str = "nvidia.com/mig.capable";
/// Node label: the GPU product name.
pub const LABEL_PRODUCT: &str = "nvidia.com/gpu.product";
/// Node label: GPUs on the node.
pub const LABEL_GPU_COUNT: &str = "nvidia.com/gpu.count";
/// Node label GFD sets to whether the node's config is MPS (the MPS daemon's selector).
pub const LABEL_MPS_CAPABLE: &str = "nvidia.com/mps.capable";
/// The GPU operator's switch for the device plugin on a node (`false`: none runs there;
/// gpu-operator v25.10.1 `controllers/state_manager.go` deploy labels).
pub const LABEL_DEPLOY_PLUGIN: &str = "nvidia.com/gpu.deploy.device-plugin";
/// Pod label of the device plugin's DaemonSet (gpu-operator v25.10.1 assets).
pub const APP_PLUGIN: &str = "nvidia-device-plugin-daemonset";
/// Pod label of GPU feature discovery's DaemonSet.
pub const APP_GFD: &str = "gpu-feature-discovery";
/// Pod label of the MPS control daemon's DaemonSet.
pub const APP_MPS_DAEMON: &str = "nvidia-device-plugin-mps-control-daemon";
/// The MIG layout that turns MIG off (the operator's default).
pub const MIG_DISABLED: &str = "all-disabled";
/// Label of the workload's pods.
pub const APP_LABEL: &str = "app.kubernetes.io/name";
/// Its value.
pub const APP: &str = "gpushare-workload";
/// `app.kubernetes.io/name` of the in-cluster harness Job's pod: what the NetworkPolicy
/// that lets it reach Prometheus selects.
pub const HARNESS_APP: &str = "gpushare-bench-harness";
/// The pods of kube-prometheus's Prometheus (StatefulSet `prometheus-k8s`, 2 replicas),
/// the only ones the harness may port-forward to.
pub const PROMETHEUS_PODS: [&str; 2] = ["prometheus-k8s-0", "prometheus-k8s-1"];
/// The Role that lets kube-prometheus's Prometheus discover the DCGM exporter in the GPU
/// operator's namespace, where the operator puts the exporter's ServiceMonitor
/// (gpu-operator v25.10.1 `assets/state-dcgm-exporter/0500_service_monitor.yaml`; the
/// Role it makes for that, `0400_prom_role_openshift.yaml`, is OpenShift's only).
pub const DCGM_SCRAPE_ROLE: &str = "gpushare-bench-dcgm-scrape";
/// Label naming the cell a pod belongs to.
pub const CELL_LABEL: &str = "gpushare.dev/cell";
/// The workload's metrics port.
pub const METRICS_PORT: u16 = 9400;

/// Where the device plugin's configuration lives: the ConfigMap the ClusterPolicy names
/// in `devicePlugin.config`, in the operator's namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfigMap {
    /// Namespace of the GPU operator.
    pub namespace: String,
    /// ConfigMap named in ClusterPolicy `devicePlugin.config.name`.
    pub name: String,
    /// The key ClusterPolicy `devicePlugin.config.default` names (empty: none).
    pub default_key: String,
}

impl PluginConfigMap {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl Default for PluginConfigMap {
    fn default() -> Self {
        Self {
            namespace: "gpu-operator".into(),
            name: "device-plugin-config".into(),
            default_key: config_entry_name(Strategy::Exclusive, 1),
        }
    }
}

/// Replicas per GPU for a shared cell of `pods` pods: the device plugin rejects fewer
/// than 2 (k8s-device-plugin v0.18.1 `api/config/v1/replicas.go`), so a 1-pod cell runs
/// with 2 (under MPS the one pod then gets half the SMs and memory; its row says so).
pub fn sharing_replicas(pods: u32) -> u32 {
    pods.max(2)
}

/// The device-plugin config entry for a strategy and replica count.
pub fn config_entry_name(strategy: Strategy, replicas: u32) -> String {
    match strategy {
        Strategy::Exclusive => "gpushare-exclusive".into(),
        s => format!("gpushare-{}-{replicas}", s.name()),
    }
}

/// The device plugin's configuration file (YAML) for an entry.
pub fn device_plugin_config(strategy: Strategy, replicas: u32) -> String {
    let key = match strategy {
        Strategy::TimeSlicing => "timeSlicing",
        Strategy::Mps => "mps",
        Strategy::Exclusive | Strategy::Mig => return "version: v1\n".into(),
    };
    let extra = if strategy == Strategy::TimeSlicing {
        "    failRequestsGreaterThanOne: true\n"
    } else {
        ""
    };
    format!(
        "version: v1\nsharing:\n  {key}:\n    renameByDefault: false\n{extra}    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
    )
}

/// The node labels GPU feature discovery shows once an entry is active on a GPU named
/// `product` (k8s-device-plugin v0.18.1 `internal/lm/resource.go`: the strategy and the
/// `-SHARED` suffix only with replicas > 1).
pub fn expected_plugin_labels(strategy: Strategy, replicas: u32, product: &str) -> Vec<(&'static str, String)> {
    let (sharing, replicas) = match strategy {
        Strategy::TimeSlicing => ("time-slicing", replicas),
        Strategy::Mps => ("mps", replicas),
        _ => ("none", 1),
    };
    let base = product.trim_end_matches("-SHARED");
    let product = if replicas > 1 {
        format!("{base}-SHARED")
    } else {
        base.to_string()
    };
    vec![
        (LABEL_SHARING, sharing.into()),
        (LABEL_REPLICAS, replicas.to_string()),
        (LABEL_PRODUCT, product),
    ]
}

/// The MIG layout for a GPU product: seven of the smallest instance, as the GPU
/// operator's default mig-parted config names them (gpu-operator v25.10.1
/// `assets/state-mig-manager/0400_configmap.yaml`: `all-1g.10gb` gives seven instances
/// on the 80 GB H100/H800/A100/A800, selected by PCI id, and four on a 40 GB A100/A800;
/// H100 NVL and GH200 96 GB have 1g.12gb, H200 and GH200 144 GB 1g.18gb). Product names
/// are GFD's (`NVIDIA-H100-NVL`).
pub fn default_mig_layout(product: &str) -> Option<&'static str> {
    let p = product.to_uppercase();
    if p.contains("GH200") {
        Some(if p.contains("144") {
            "all-1g.18gb"
        } else {
            "all-1g.12gb"
        })
    } else if p.contains("H200") {
        Some("all-1g.18gb")
    } else if p.contains("H100") && (p.contains("NVL") || p.contains("94")) {
        Some("all-1g.12gb")
    } else if p.contains("H100") || p.contains("H800") || (p.contains("A100") && p.contains("80")) {
        Some("all-1g.10gb")
    } else if p.contains("A100") {
        Some("all-1g.5gb")
    } else if p.contains("A30") {
        Some("all-1g.6gb")
    } else {
        None
    }
}

/// Physical GPUs behind GFD's labels (pure): `nvidia.com/gpu.count`, or under the MIG
/// `single` strategy (where it counts MIG devices: product `<GPU>-MIG-<profile>`) that
/// count over [`mig_instances_per_gpu`] (k8s-sim/UPSTREAM-RULES.md F6).
pub fn physical_gpus(labels: &std::collections::BTreeMap<String, String>) -> u32 {
    let count: u32 = labels.get(LABEL_GPU_COUNT).and_then(|c| c.parse().ok()).unwrap_or(0);
    let product = labels.get(LABEL_PRODUCT).map(String::as_str).unwrap_or("");
    match product.trim_end_matches("-SHARED").split_once("-MIG-") {
        Some((gpu, profile)) => count.div_ceil(mig_instances_per_gpu(gpu, profile)),
        None => count,
    }
}

/// The smallest `1g` profile's memory (GB) on a GPU, from GFD's product name: the
/// profile seven of which fill the GPU.
fn smallest_1g_gb(gpu: &str) -> Option<u32> {
    let g = gpu.to_uppercase();
    let has = |s: &str| g.contains(s);
    Some(if has("GB300") {
        35
    } else if has("B300") {
        34
    } else if has("B200") {
        23
    } else if has("GH200") {
        if has("144") { 18 } else { 12 }
    } else if has("H200") {
        18
    } else if has("H20") || (has("H100") && (has("NVL") || has("96"))) {
        12
    } else if has("80GB") && (has("H100") || has("H800") || has("A100") || has("A800")) {
        10
    } else if has("A100") || has("A800") {
        5
    } else {
        return None;
    })
}

/// How many devices of a MIG profile fill one GPU (pure), as the GPU operator's default
/// mig-parted configuration lists them (gpu-operator v26.7.0 and v25.10.1
/// `assets/state-mig-manager/0400_configmap.yaml`, identical; read). `profile` is spelled
/// as GFD puts it in the product label, `+` turned into `.` (k8s-device-plugin v0.20.0
/// `internal/resource/nvml-mig-device.go`, read):
/// - a media-extension profile (`1g.10gb.me`, `1g.24gb.me.all`, `2g.12gb.me`): 1;
/// - `3g`: 2; `4g` and `7g`: 1;
/// - on the 4-slice A30 and RTX PRO: `1g` 4, `2g` 2;
/// - elsewhere `2g`: 3, and `1g`: 7 for the GPU's smallest 1g profile, 4 for one with
///   about twice its memory (`1g.20gb` on an 80 GB H100, `1g.10gb` on a 40 GB A100,
///   `1g.35gb` on an H200 but not on a GB300). A GPU this table does not know gets 7.
pub fn mig_instances_per_gpu(gpu: &str, profile: &str) -> u32 {
    let parts: Vec<&str> = profile.split('.').collect();
    if parts.get(2).is_some_and(|p| p.starts_with("me")) {
        return 1;
    }
    let g = gpu.to_uppercase();
    let four_slices = g.contains("A30") || g.contains("RTX-PRO") || g.contains("RTX PRO");
    let gb = || {
        parts
            .get(1)
            .and_then(|m| m.split("gb").next())
            .and_then(|m| m.parse::<u32>().ok())
    };
    match parts.first().copied().unwrap_or("") {
        "1g" if four_slices => 4,
        "1g" => match (gb(), smallest_1g_gb(gpu)) {
            (Some(m), Some(smallest)) if m >= smallest * 3 / 2 => 4,
            _ => 7,
        },
        "2g" if four_slices => 2,
        "2g" => 3,
        "3g" => 2,
        _ => 1,
    }
}

/// The MIG profile of a layout (`all-1g.10gb` → `1g.10gb`).
pub fn mig_profile(layout: &str) -> Option<&str> {
    layout
        .strip_prefix("all-")
        .filter(|p| *p != "disabled" && *p != "enabled")
}

/// The extended resource a workload pod requests: MIG "mixed" exposes each profile as
/// its own resource, every other case is `nvidia.com/gpu`.
pub fn pod_resource(strategy: Strategy, mig_strategy: Option<&str>, mig_layout: Option<&str>) -> String {
    match (strategy, mig_strategy, mig_layout.and_then(|l| l.strip_prefix("all-"))) {
        (Strategy::Mig, Some("mixed"), Some(profile)) => format!("nvidia.com/mig-{profile}"),
        _ => "nvidia.com/gpu".into(),
    }
}

/// A merge patch of the ConfigMap's keys (`None` removes the key). A merge patch, not
/// server-side apply: an apply that omits a key the same manager applied before removes
/// it (k8s-sim/UPSTREAM-RULES.md H1), and the harness touches only the keys it names.
pub fn configmap_keys_patch(keys: &[(String, Option<String>)]) -> Value {
    let mut map = serde_json::Map::new();
    for (k, v) in keys {
        map.insert(k.clone(), v.clone().map_or(Value::Null, Value::String));
    }
    json!({ "data": map })
}

/// A merge patch of node labels (`None` removes the label).
pub fn node_label_patch(labels: &[(&str, Option<&str>)]) -> Value {
    let mut map = serde_json::Map::new();
    for (k, v) in labels {
        map.insert((*k).to_string(), v.map_or(Value::Null, |v| Value::String(v.into())));
    }
    json!({ "metadata": { "labels": map } })
}

/// What a cell's pods run.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    /// Namespace.
    pub namespace: String,
    /// Container image.
    pub image: String,
    /// Node the pods are pinned to.
    pub node: String,
    /// Workload arguments (`--model …`).
    pub args: Vec<String>,
    /// Tolerations (`key[=value]:Effect`; default `nvidia.com/gpu:NoSchedule`, the taint
    /// GPU nodes commonly carry).
    pub tolerations: Vec<String>,
    /// Image pull secrets.
    pub pull_secrets: Vec<String>,
    /// A server of the user's own in `image` (`--workload-cmd` or `--server-image`): its
    /// container runs it instead of gpushare-workload's arguments.
    pub server: Option<OwnServer>,
}

/// The container of a server of the user's own.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnServer {
    /// How its container starts it.
    pub start: ServerStart,
    /// The path of its readiness probe.
    pub ready_path: String,
}

/// How a server of the user's own starts in its image, `{port}` already the metrics port.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerStart {
    /// A command line run by `/bin/sh -c` (`--workload-cmd`).
    Shell(String),
    /// The image's own entrypoint with these arguments (`--server-image` with
    /// `--workload-arg`): no shell needed, so distroless images run too.
    Entrypoint(Vec<String>),
}

/// `text` as the container must see it. The kubelet expands `$(NAME)` in a container's
/// command and args from its environment and turns `$$` into `$` (kubernetes
/// `pkg/kubelet/container/helpers.go` `ExpandContainerCommandAndArgs` with
/// `third_party/forked/golang/expansion/expand.go`, read at fde22c3f9aac), so every `$`
/// is doubled: a shell's `$(hostname)` or `$$` then reaches the shell as typed, as it
/// does on the local backend (pure).
pub fn literal(text: &str) -> String {
    text.replace('$', "$$")
}

/// The workload namespace, enforcing the `restricted` Pod Security Standard: every pod
/// the harness and its manifests make (workload, server of one's own, in-cluster Job,
/// results reader) passes it, and the API server refuses anything that would not.
pub fn namespace(ns: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns, "labels": {
        "app.kubernetes.io/part-of": "gpushare-bench",
        "pod-security.kubernetes.io/enforce": "restricted"
    } } })
}

/// The workload Deployment of one cell; `extra_args` (the cell's load) follow the run's.
pub fn deployment(spec: &WorkloadSpec, strategy: Strategy, pods: u32, resource: &str, extra_args: &[String]) -> Value {
    deployment_over_gpus(spec, strategy, (pods, 1), resource, extra_args)
}

/// The workload Deployment of a cell of `pods` on each of `gpus` GPUs: `pods × gpus`
/// replicas, which the device plugin spreads over the node's GPUs (its cell label says
/// `pods`, the count per GPU).
pub fn deployment_over_gpus(
    spec: &WorkloadSpec,
    strategy: Strategy,
    (pods, gpus): (u32, u32),
    resource: &str,
    extra_args: &[String],
) -> Value {
    workload_deployment(
        spec,
        strategy,
        resource,
        &Shape {
            name: APP,
            role: None,
            replicas: pods * gpus.max(1),
            pods,
            extra_args,
        },
    )
}

/// Label naming a pod's part in an isolation trial (`victim` or `aggressor`).
pub const ROLE_LABEL: &str = "gpushare.dev/role";

/// The Deployment of one part of an isolation trial: `role` (`victim` or `aggressor`),
/// named `gpushare-workload-<role>`, with `replicas` pods that add `extra_args` to the
/// run's workload arguments; `pods` is the trial's whole count (its cell label).
pub fn role_deployment(
    spec: &WorkloadSpec,
    strategy: Strategy,
    resource: &str,
    role: &str,
    replicas: u32,
    pods: u32,
    extra_args: &[String],
) -> Value {
    let name = role_deployment_name(role);
    workload_deployment(
        spec,
        strategy,
        resource,
        &Shape {
            name: &name,
            role: Some(role),
            replicas,
            pods,
            extra_args,
        },
    )
}

/// The name of an isolation role's Deployment.
pub fn role_deployment_name(role: &str) -> String {
    format!("{APP}-{role}")
}

/// The roles of an isolation trial's pods, in the order their Deployments are applied.
pub const ROLES: [&str; 2] = ["victim", "aggressor"];

/// What distinguishes one workload Deployment from another.
struct Shape<'a> {
    name: &'a str,
    role: Option<&'a str>,
    replicas: u32,
    pods: u32,
    extra_args: &'a [String],
}

fn workload_deployment(spec: &WorkloadSpec, strategy: Strategy, resource: &str, shape: &Shape<'_>) -> Value {
    let mut args = spec.args.clone();
    args.extend(shape.extra_args.iter().cloned());
    args.extend(["--listen".into(), format!("0.0.0.0:{METRICS_PORT}")]);
    let mut selector = json!({ APP_LABEL: APP });
    let mut labels = json!({
        APP_LABEL: APP,
        CELL_LABEL: format!("{}-{}", strategy.name(), shape.pods),
        "gpushare.dev/strategy": strategy.name()
    });
    if let Some(role) = shape.role {
        selector[ROLE_LABEL] = json!(role);
        labels[ROLE_LABEL] = json!(role);
    }
    let mut d = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": shape.name,
            "namespace": spec.namespace,
            "labels": { APP_LABEL: APP, "app.kubernetes.io/part-of": "gpushare-bench" }
        },
        "spec": {
            "replicas": shape.replicas,
            "selector": { "matchLabels": selector },
            "template": {
                "metadata": {
                    "labels": labels
                },
                "spec": {
                    // Pinned by the node object's name: `kubernetes.io/hostname` can differ from it.
                    "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{ "matchFields": [{ "key": "metadata.name", "operator": "In", "values": [spec.node] }] }]
                    } } },
                    "tolerations": spec.tolerations.iter().filter_map(|t| toleration(t).ok()).collect::<Vec<_>>(),
                    "imagePullSecrets": spec.pull_secrets.iter().map(|s| json!({ "name": s })).collect::<Vec<_>>(),
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": { "runAsNonRoot": true, "runAsUser": 10001, "runAsGroup": 10001, "seccompProfile": { "type": "RuntimeDefault" } },
                    "containers": [{
                        "name": "workload",
                        "image": spec.image,
                        "imagePullPolicy": "IfNotPresent",
                        "args": args.iter().map(|a| literal(a)).collect::<Vec<_>>(),
                        "env": [
                            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                            { "name": "GPUSHARE_STRATEGY", "value": strategy.name() }
                        ],
                        "ports": [{ "name": "metrics", "containerPort": METRICS_PORT }],
                        "readinessProbe": {
                            "httpGet": { "path": "/healthz", "port": "metrics" },
                            "periodSeconds": 1,
                            "failureThreshold": 600
                        },
                        "resources": { "requests": { resource: 1, "cpu": "1", "memory": "2Gi" }, "limits": { resource: 1, "memory": "8Gi" } },
                        "securityContext": { "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": { "drop": ["ALL"] } }
                    }]
                }
            }
        }
    });
    if let Some(own) = &spec.server {
        own_server(&mut d, own, strategy);
    }
    if shape.role.is_some() {
        // The pause container is then PID 1, so a workload's `--crash-after` SIGKILL to
        // itself is not dropped as a signal to its namespace's init.
        d["spec"]["template"]["spec"]["shareProcessNamespace"] = json!(true);
    }
    d
}

/// Turns the workload container into a server of the user's own: the command under
/// `/bin/sh -c`, or the image's entrypoint with the user's arguments, instead of
/// gpushare-workload's arguments; `PORT`, `POD` and `STRATEGY` in its environment as on
/// the local backend, its own readiness path, and a writable `/tmp` as `HOME` (the root
/// filesystem stays read-only; Python libraries keep caches under `$HOME`).
fn own_server(d: &mut Value, own: &OwnServer, strategy: Strategy) {
    let pod = &mut d["spec"]["template"]["spec"];
    pod["volumes"] = json!([{ "name": "tmp", "emptyDir": {} }]);
    let c = &mut pod["containers"][0];
    match &own.start {
        ServerStart::Shell(command) => {
            // Empty, not absent: the kubelet then runs the command alone (the image's
            // CMD is ignored once a command is given), and as a kustomize patch it
            // replaces the base's arguments instead of inheriting them.
            c["args"] = json!([]);
            c["command"] = json!(["/bin/sh", "-c", literal(command)]);
        }
        // No command: the image's ENTRYPOINT runs with these arguments in place of its
        // CMD (none given: the image runs as it is).
        ServerStart::Entrypoint(args) => c["args"] = json!(args.iter().map(|a| literal(a)).collect::<Vec<_>>()),
    }
    c["env"] = json!([
        { "name": "POD", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
        { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
        { "name": "STRATEGY", "value": strategy.name() },
        { "name": "GPUSHARE_STRATEGY", "value": strategy.name() },
        { "name": "PORT", "value": METRICS_PORT.to_string() },
        { "name": "HOME", "value": "/tmp" }
    ]);
    c["readinessProbe"]["httpGet"]["path"] = json!(own.ready_path);
    c["volumeMounts"] = json!([{ "name": "tmp", "mountPath": "/tmp" }]);
}

/// A Service in front of the pods (for people and ServiceMonitors; the harness reads pods).
pub fn service(ns: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": APP, "namespace": ns, "labels": { APP_LABEL: APP } },
        "spec": {
            "selector": { APP_LABEL: APP },
            "ports": [{ "name": "metrics", "port": METRICS_PORT, "targetPort": "metrics" }]
        }
    })
}

/// The PodMonitor that makes kube-prometheus scrape every workload pod each second,
/// keeping the workload's own `pod` and `strategy` labels.
pub fn pod_monitor(ns: &str) -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": { "name": APP, "namespace": ns, "labels": { APP_LABEL: APP } },
        "spec": {
            "selector": { "matchLabels": { APP_LABEL: APP } },
            "podMetricsEndpoints": [{ "port": "metrics", "path": "/metrics", "interval": "1s", "honorLabels": true }]
        }
    })
}

/// Least-privilege RBAC for the harness (its ServiceAccount `gpushare-bench`; bind the
/// same roles to a user to run it from outside): get and label nodes, read the
/// ClusterPolicy; in the workload namespace manage its Deployments (the sweep's, and an isolation trial's victim and aggressors) and read pods; in
/// the GPU operator's namespace edit the one device-plugin ConfigMap and list the
/// operand pods; in the monitoring namespace port-forward to Prometheus. Verbs follow the
/// API server's rules (k8s-sim/UPSTREAM-RULES.md A1, A2, A4, H5, H6): a server-side apply that
/// creates the Deployment is also a `create` (carrying its name, so resourceNames holds),
/// and kube-rs's WebSocket port-forward is a `get` (plus `create` from Kubernetes 1.35).
/// Last, kube-prometheus's Prometheus may discover pods in the workload namespace (its
/// own Roles cover only default, kube-system and monitoring: kube-prometheus v0.18.0
/// `manifests/prometheus-roleSpecificNamespaces.yaml`).
pub fn rbac(ns: &str, cm: &PluginConfigMap, monitoring_ns: &str, node: &str) -> Vec<Value> {
    let sa = json!({ "kind": "ServiceAccount", "name": "gpushare-bench", "namespace": ns });
    let role = |name: &str, rns: &str, rules: Value| json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": { "name": name, "namespace": rns }, "rules": rules });
    let binding = |name: &str, rns: &str, subject: &Value| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": name, "namespace": rns },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
            "subjects": [subject]
        })
    };
    let prometheus = json!({ "kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": monitoring_ns });
    // What Prometheus's service discovery reads (kube-prometheus v0.18.0
    // `prometheus-roleSpecificNamespaces.yaml`, with EndpointSlices).
    let discovery = json!([
        { "apiGroups": [""], "resources": ["services", "endpoints", "pods"], "verbs": ["get", "list", "watch"] },
        { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"] }
    ]);
    vec![
        json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": { "name": "gpushare-bench", "namespace": ns } }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": "gpushare-bench-nodes" },
            "rules": [
                // The GPU node only: its labels are what the harness switches.
                { "apiGroups": [""], "resources": ["nodes"], "resourceNames": [node], "verbs": ["get", "patch"] },
                { "apiGroups": [""], "resources": ["namespaces"], "resourceNames": [ns], "verbs": ["get"] },
                { "apiGroups": ["nvidia.com"], "resources": ["clusterpolicies"], "verbs": ["get", "list"] },
                // --sharing-api dra: the driver's DeviceClass and the node's ResourceSlices.
                { "apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses", "resourceslices"], "verbs": ["get", "list"] }
            ]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": "gpushare-bench-nodes" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpushare-bench-nodes" },
            "subjects": [sa]
        }),
        role(
            "gpushare-bench-workload",
            ns,
            json!([
                { "apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": [APP, role_deployment_name(ROLES[0]), role_deployment_name(ROLES[1])], "verbs": ["get", "create", "patch", "delete"] },
                { "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"] },
                // --sharing-api dra: each cell's claim or claim template (gpushare-<strategy>-<pods>).
                { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"], "verbs": ["get", "list", "create", "patch", "delete"] },
                // Why a pod stays in ContainerCreating (the kubelet's FailedPrepareDynamicResources event).
                { "apiGroups": [""], "resources": ["events"], "verbs": ["list"] },
                // `doctor --kubernetes`: is kube-prometheus's Role there?
                { "apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "resourceNames": ["prometheus-k8s"], "verbs": ["get"] }
            ]),
        ),
        binding("gpushare-bench-workload", ns, &sa),
        role(
            "gpushare-bench-device-plugin",
            &cm.namespace,
            json!([
                { "apiGroups": [""], "resources": ["configmaps"], "resourceNames": [cm.name], "verbs": ["get", "patch"] },
                { "apiGroups": [""], "resources": ["pods"], "verbs": ["list"] },
                { "apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["gpu-operator"], "verbs": ["get"] },
                // `doctor --kubernetes`: may Prometheus discover the DCGM exporter?
                { "apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "resourceNames": [DCGM_SCRAPE_ROLE], "verbs": ["get"] }
            ]),
        ),
        binding("gpushare-bench-device-plugin", &cm.namespace, &sa),
        role(
            "gpushare-bench-prometheus",
            monitoring_ns,
            json!([
                { "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"] },
                // Prometheus's own pods only (kube-prometheus v0.18.0 `prometheus-prometheus.yaml`:
                // Prometheus `k8s`, 2 replicas).
                { "apiGroups": [""], "resources": ["pods/portforward"], "resourceNames": PROMETHEUS_PODS, "verbs": ["get", "create"] }
            ]),
        ),
        binding("gpushare-bench-prometheus", monitoring_ns, &sa),
        role("prometheus-k8s", ns, discovery.clone()),
        binding("prometheus-k8s", ns, &prometheus),
        role(DCGM_SCRAPE_ROLE, &cm.namespace, discovery),
        binding(DCGM_SCRAPE_ROLE, &cm.namespace, &prometheus),
    ]
}

/// With `--sharing-api dra`, the harness reads the DRA driver's kubelet-plugin pods (its
/// image and feature gates) in the driver's namespace: a Role there, bound to the
/// harness's ServiceAccount in `ns` (`manifests/dra/rbac.yaml`; the base does not
/// carry it, since that namespace exists only where the driver is installed).
pub fn dra_rbac(ns: &str, driver_ns: &str) -> Vec<Value> {
    let name = "gpushare-bench-dra-driver";
    vec![
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": name, "namespace": driver_ns },
            "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["list"] }]
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": name, "namespace": driver_ns },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
            "subjects": [{ "kind": "ServiceAccount", "name": "gpushare-bench", "namespace": ns }]
        }),
    ]
}

/// The claim the in-cluster harness writes its runs to: they outlive the Job's pod.
pub const RESULTS_CLAIM: &str = "gpushare-bench-results";

/// The results claim of the in-cluster Job (1 GiB, the cluster's default storage class).
pub fn results_claim(ns: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": { "name": RESULTS_CLAIM, "namespace": ns },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": { "requests": { "storage": "1Gi" } }
        }
    })
}

/// A pod that holds the results claim read-only, to copy the runs out:
/// `kubectl cp NS/gpushare-bench-results:/results ./gpushare-results`. A ReadWriteOnce
/// claim attaches to one node, so it runs only where the Job's pod runs (apply it while the
/// Job runs), and a later Job prefers its node.
pub fn results_reader(ns: &str, image: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": RESULTS_CLAIM, "namespace": ns, "labels": { APP_LABEL: "gpushare-bench-results" } },
        "spec": {
            "securityContext": { "runAsNonRoot": true, "runAsUser": 10001, "fsGroup": 10001, "seccompProfile": { "type": "RuntimeDefault" } },
            "affinity": { "podAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": { "matchLabels": { APP_LABEL: HARNESS_APP } },
                "topologyKey": "kubernetes.io/hostname"
            }]}},
            "containers": [{
                "name": "results",
                "image": image,
                "command": ["sleep", "infinity"],
                "volumeMounts": [{ "name": "results", "mountPath": "/results", "readOnly": true }],
                "securityContext": { "allowPrivilegeEscalation": false, "capabilities": { "drop": ["ALL"] } }
            }],
            "volumes": [{ "name": "results", "persistentVolumeClaim": { "claimName": RESULTS_CLAIM, "readOnly": true } }]
        }
    })
}

/// The harness as an in-cluster Job; its runs land on the results claim
/// ([`results_claim`]), read through [`results_reader`].
pub fn harness_job(ns: &str, image: &str, node: &str) -> Value {
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": { "name": "gpushare-bench", "namespace": ns },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": { "labels": { APP_LABEL: HARNESS_APP } },
                "spec": {
                    "serviceAccountName": "gpushare-bench",
                    "restartPolicy": "Never",
                    "securityContext": { "runAsNonRoot": true, "runAsUser": 10001, "fsGroup": 10001, "seccompProfile": { "type": "RuntimeDefault" } },
                    // A run after the first: beside the reader, which holds the claim's node.
                    "affinity": { "podAffinity": { "preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": { "matchLabels": { APP_LABEL: "gpushare-bench-results" } },
                            "topologyKey": "kubernetes.io/hostname"
                        }
                    }]}},
                    "containers": [{
                        "name": "gpushare-bench",
                        "image": image,
                        "command": ["gpushare-bench"],
                        "args": ["sweep", "--backend", "kubernetes", "--node", "$(GPU_NODE)", "--namespace", ns,
                                 "--prometheus", "http://prometheus-k8s.monitoring.svc:9090", "--out", "/results", "--quiet"],
                        "env": [{ "name": "GPU_NODE", "value": node }],
                        "volumeMounts": [{ "name": "results", "mountPath": "/results" }],
                        "securityContext": { "allowPrivilegeEscalation": false, "capabilities": { "drop": ["ALL"] } }
                    }],
                    "volumes": [{ "name": "results", "persistentVolumeClaim": { "claimName": RESULTS_CLAIM } }]
                }
            }
        }
    })
}

/// Lets the in-cluster harness Job reach kube-prometheus's Prometheus. kube-prometheus
/// v0.18.0 `manifests/prometheus-networkPolicy.yaml` admits to port 9090 only pods of
/// Prometheus, prometheus-adapter and Grafana in its own namespace; NetworkPolicies add
/// up, so this one (the same pods selected) admits the Job's pod from the workload
/// namespace as well.
pub fn prometheus_ingress_policy(ns: &str, monitoring_ns: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": { "name": "gpushare-bench-harness", "namespace": monitoring_ns },
        "spec": {
            "podSelector": { "matchLabels": {
                "app.kubernetes.io/component": "prometheus",
                "app.kubernetes.io/instance": "k8s",
                "app.kubernetes.io/name": "prometheus",
                "app.kubernetes.io/part-of": "kube-prometheus"
            } },
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{
                    "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": ns } },
                    "podSelector": { "matchLabels": { APP_LABEL: HARNESS_APP } }
                }],
                "ports": [{ "port": 9090, "protocol": "TCP" }]
            }]
        }
    })
}

/// The device-plugin ConfigMap with an entry for every strategy and pod count of the
/// default sweep (what `kubectl apply` would install up front).
pub fn plugin_configmap(cm: &PluginConfigMap, pods: &[u32]) -> Value {
    let mut data = serde_json::Map::new();
    data.insert(
        config_entry_name(Strategy::Exclusive, 1),
        Value::String(device_plugin_config(Strategy::Exclusive, 1)),
    );
    for s in [Strategy::TimeSlicing, Strategy::Mps] {
        for &p in pods {
            let r = sharing_replicas(p);
            data.insert(config_entry_name(s, r), Value::String(device_plugin_config(s, r)));
        }
    }
    json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": cm.name, "namespace": cm.namespace }, "data": data })
}

/// The part of the GPU operator's ClusterPolicy the harness relies on.
pub fn cluster_policy_snippet(cm: &PluginConfigMap) -> Value {
    json!({
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": { "name": "cluster-policy" },
        "spec": {
            "devicePlugin": { "config": { "name": cm.name, "default": cm.default_key } },
            "gfd": { "enabled": true },
            "mig": { "strategy": "single" },
            "migManager": { "enabled": true },
            "dcgmExporter": { "enabled": true, "serviceMonitor": { "enabled": true } }
        }
    })
}

/// A Grafana dashboard of the workload's metrics, with the harness's own queries.
pub fn grafana_dashboard() -> Value {
    let sel = Selector {
        equal: vec![("strategy".into(), "$strategy".into())],
        one_of: None,
    };
    let panel = |id: u32, title: &str, unit: &str, expr: String, x: u32, y: u32| {
        json!({
            "id": id, "type": "timeseries", "title": title,
            "gridPos": { "h": 8, "w": 12, "x": x, "y": y },
            "datasource": { "type": "prometheus", "uid": "${datasource}" },
            "fieldConfig": { "defaults": { "unit": unit }, "overrides": [] },
            "targets": [{ "expr": expr, "legendFormat": "{{pod}}", "refId": "A" }]
        })
    };
    json!({
        "title": "gpushare-bench workload",
        "uid": "gpushare-workload",
        "schemaVersion": 39,
        "refresh": "5s",
        "time": { "from": "now-15m", "to": "now" },
        "templating": { "list": [
            { "name": "datasource", "type": "datasource", "query": "prometheus" },
            { "name": "strategy", "type": "query", "datasource": { "type": "prometheus", "uid": "${datasource}" },
              "query": "label_values(inference_time_seconds_count, strategy)", "refresh": 2 }
        ] },
        "panels": [
            panel(1, "Mean latency per pod", "s", promql::mean(&sel, "30s", Grouping::Pod), 0, 0),
            panel(2, "p99 latency per pod", "s", promql::quantile(0.99, &sel, "30s", Grouping::Pod), 12, 0),
            panel(3, "Throughput per pod", "reqps", promql::throughput(&sel, "30s", Grouping::Pod), 0, 8),
            panel(4, "Errors per pod", "short", promql::errors(&sel, "5m", Grouping::Pod), 12, 8),
            panel(5, "GPU memory allocated per pod", "bytes", format!("workload_gpu_memory_used_bytes{}", sel.render()), 0, 16),
            panel(6, "Reference study: mean latency", "s", promql::REFERENCE_STUDY_MEAN.to_string(), 12, 16)
        ]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_plugin_entries_follow_the_plugin_format() {
        assert_eq!(
            device_plugin_config(Strategy::Mps, 7),
            "version: v1\nsharing:\n  mps:\n    renameByDefault: false\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 7\n"
        );
        assert!(
            device_plugin_config(Strategy::TimeSlicing, 3)
                .contains("timeSlicing:\n    renameByDefault: false\n    failRequestsGreaterThanOne: true")
        );
        assert_eq!(device_plugin_config(Strategy::Exclusive, 5), "version: v1\n");
        assert_eq!(config_entry_name(Strategy::TimeSlicing, 5), "gpushare-time-slicing-5");
        assert_eq!(
            expected_plugin_labels(Strategy::Exclusive, 7, "NVIDIA-H100-80GB-HBM3"),
            vec![
                (LABEL_SHARING, "none".to_string()),
                (LABEL_REPLICAS, "1".to_string()),
                (LABEL_PRODUCT, "NVIDIA-H100-80GB-HBM3".to_string())
            ]
        );
        assert_eq!(
            expected_plugin_labels(Strategy::Mps, 3, "NVIDIA-H100-80GB-HBM3")[2].1,
            "NVIDIA-H100-80GB-HBM3-SHARED"
        );
        assert_eq!(sharing_replicas(1), 2, "the device plugin rejects replicas: 1");
    }

    #[test]
    fn physical_gpus_under_mig_single() {
        let l = |c: &str, p: &str| {
            [
                (LABEL_GPU_COUNT.to_string(), c.to_string()),
                (LABEL_PRODUCT.to_string(), p.to_string()),
            ]
            .into_iter()
            .collect()
        };
        assert_eq!(physical_gpus(&l("1", "NVIDIA-H100-80GB-HBM3")), 1);
        assert_eq!(physical_gpus(&l("7", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb")), 1);
        assert_eq!(physical_gpus(&l("14", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb")), 2);
        assert_eq!(physical_gpus(&l("8", "NVIDIA-A30-MIG-1g.6gb")), 2);
        assert_eq!(physical_gpus(&l("8", "NVIDIA-A100-SXM4-40GB-MIG-1g.10gb")), 2);
        assert_eq!(physical_gpus(&l("4", "NVIDIA-H100-80GB-HBM3-MIG-1g.20gb-SHARED")), 1);
        assert_eq!(physical_gpus(&l("2", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me")), 2);
    }

    #[test]
    fn mig_instances_follow_the_operators_default_mig_parted_config() {
        // (GFD product, profile as labelled, devices per GPU in the config's all-<profile>).
        for (gpu, profile, n) in [
            ("NVIDIA-A100-SXM4-40GB", "1g.5gb", 7),
            ("NVIDIA-A100-SXM4-40GB", "1g.5gb.me", 1),
            ("NVIDIA-A100-SXM4-40GB", "1g.10gb", 4),
            ("NVIDIA-A100-SXM4-40GB", "2g.10gb", 3),
            ("NVIDIA-A100-SXM4-80GB", "1g.10gb", 7),
            ("NVIDIA-H100-80GB-HBM3", "1g.10gb", 7),
            ("NVIDIA-H100-80GB-HBM3", "1g.20gb", 4),
            ("NVIDIA-H100-80GB-HBM3", "1g.10gb.me", 1),
            ("NVIDIA-H100-80GB-HBM3", "3g.40gb", 2),
            ("NVIDIA-H100-80GB-HBM3", "7g.80gb", 1),
            ("NVIDIA-H100-NVL", "1g.12gb", 7),
            ("NVIDIA-H100-NVL", "1g.24gb", 4),
            ("NVIDIA-GH200-480GB", "1g.12gb", 7),
            ("NVIDIA-GH200-480GB", "1g.24gb", 4),
            ("NVIDIA-H20", "1g.12gb", 7),
            ("NVIDIA-H200", "1g.18gb", 7),
            ("NVIDIA-H200", "1g.35gb", 4),
            ("NVIDIA-GH200-144G-HBM3e", "1g.36gb", 4),
            ("NVIDIA-B200", "1g.23gb", 7),
            ("NVIDIA-B200", "1g.45gb", 4),
            ("NVIDIA-GB200", "1g.47gb", 4),
            ("NVIDIA-B300-SXM6-AC", "1g.34gb", 7),
            ("NVIDIA-B300-SXM6-AC", "1g.67gb", 4),
            ("NVIDIA-GB300", "1g.35gb", 7),
            ("NVIDIA-GB300", "1g.70gb", 4),
            ("NVIDIA-A30", "1g.6gb", 4),
            ("NVIDIA-A30", "1g.6gb.me", 1),
            ("NVIDIA-A30", "2g.12gb", 2),
            ("NVIDIA-A30", "2g.12gb.me", 1),
            ("NVIDIA-A30", "4g.24gb", 1),
            ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "1g.24gb", 4),
            ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "1g.24gb.gfx", 4),
            ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "1g.24gb-me", 4),
            ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "1g.24gb.me.all", 1),
            ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "2g.48gb", 2),
            ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "4g.96gb", 1),
        ] {
            assert_eq!(mig_instances_per_gpu(gpu, profile), n, "{gpu} {profile}");
        }
    }

    #[test]
    fn mig_layouts_and_resources() {
        assert_eq!(default_mig_layout("NVIDIA-H200"), Some("all-1g.18gb"));
        assert_eq!(default_mig_layout("NVIDIA-H100-80GB-HBM3"), Some("all-1g.10gb"));
        assert_eq!(default_mig_layout("NVIDIA-A100-SXM4-40GB"), Some("all-1g.5gb"));
        assert_eq!(
            default_mig_layout("NVIDIA-H100-NVL"),
            Some("all-1g.12gb"),
            "no all-1g.10gb entry matches 0x2321"
        );
        assert_eq!(default_mig_layout("NVIDIA-GH200-480GB"), Some("all-1g.12gb"));
        assert_eq!(default_mig_layout("Tesla-T4"), None);
        assert_eq!(
            pod_resource(Strategy::Mig, Some("mixed"), Some("all-1g.10gb")),
            "nvidia.com/mig-1g.10gb"
        );
        assert_eq!(
            pod_resource(Strategy::Mig, Some("single"), Some("all-1g.10gb")),
            "nvidia.com/gpu"
        );
        assert_eq!(pod_resource(Strategy::Mps, None, None), "nvidia.com/gpu");
    }

    #[test]
    fn the_deployment_pins_the_node_and_requests_the_resource() {
        let spec = WorkloadSpec {
            namespace: "gb".into(),
            image: "img:1".into(),
            node: "gpu-1".into(),
            args: vec!["--model".into(), "tiny".into()],
            tolerations: vec![DEFAULT_TOLERATION.into()],
            pull_secrets: vec!["regcred".into()],
            server: None,
        };
        let d = deployment(&spec, Strategy::Mps, 5, "nvidia.com/gpu", &[]);
        assert_eq!(d["spec"]["replicas"], 5);
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"]
                [0]["values"][0],
            "gpu-1"
        );
        assert_eq!(
            pod["tolerations"][0],
            json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
        );
        assert_eq!(pod["imagePullSecrets"][0]["name"], "regcred");
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        assert_eq!(pod["containers"][0]["resources"]["requests"]["nvidia.com/gpu"], 1);
        assert_eq!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], 1);
        assert_eq!(
            pod["containers"][0]["args"],
            json!(["--model", "tiny", "--listen", "0.0.0.0:9400"])
        );
        assert_eq!(d["spec"]["template"]["metadata"]["labels"][CELL_LABEL], "mps-5");
        // A cell's load follows the run's arguments; the listen address comes last.
        let load = ["--load".to_string(), "poisson:20".to_string()];
        let open = deployment(&spec, Strategy::Mps, 5, "nvidia.com/gpu", &load);
        assert_eq!(
            open["spec"]["template"]["spec"]["containers"][0]["args"],
            json!(["--model", "tiny", "--load", "poisson:20", "--listen", "0.0.0.0:9400"])
        );
        assert!(open["spec"]["template"]["spec"]["shareProcessNamespace"].is_null());

        // A server of the user's own: its command, its probe, the local backend's
        // environment, and nothing of gpushare-workload's arguments or load.
        let own = WorkloadSpec {
            image: "registry.example/yolos-pytorch:1".into(),
            server: Some(OwnServer {
                start: ServerStart::Shell("python3 /app/server.py --host 0.0.0.0 --port 9400".into()),
                ready_path: "/ready".into(),
            }),
            ..spec.clone()
        };
        let d = deployment(&own, Strategy::TimeSlicing, 3, "nvidia.com/gpu", &load);
        let pod = &d["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(
            c["command"],
            json!(["/bin/sh", "-c", "python3 /app/server.py --host 0.0.0.0 --port 9400"])
        );
        assert_eq!(c["args"], json!([]), "gpushare-workload's arguments and load are gone");
        assert_eq!(
            c["readinessProbe"]["httpGet"],
            json!({"path": "/ready", "port": "metrics"})
        );
        let env = |k: &str| {
            c["env"]
                .as_array()
                .and_then(|e| e.iter().find(|v| v["name"] == k))
                .cloned()
        };
        assert_eq!(env("PORT").map(|v| v["value"].clone()), Some(json!("9400")));
        assert_eq!(env("STRATEGY").map(|v| v["value"].clone()), Some(json!("time-slicing")));
        assert_eq!(
            env("POD").map(|v| v["valueFrom"]["fieldRef"]["fieldPath"].clone()),
            Some(json!("metadata.name"))
        );
        assert_eq!(c["volumeMounts"][0]["mountPath"], "/tmp");
        assert_eq!(pod["volumes"][0], json!({"name": "tmp", "emptyDir": {}}));
        assert_eq!(
            c["resources"]["limits"]["nvidia.com/gpu"], 1,
            "the GPU request is the strategy's"
        );
        assert_eq!(
            node_label_patch(&[(LABEL_PLUGIN_CONFIG, None)]),
            json!({"metadata": {"labels": {LABEL_PLUGIN_CONFIG: null}}})
        );
    }
}
