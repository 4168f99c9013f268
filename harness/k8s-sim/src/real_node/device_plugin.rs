//! NVIDIA's device plugin on the real test node, laid out as the GPU operator lays it out
//! (gpu-operator v25.10.1, commit 846018752b8a: `assets/state-device-plugin/0500_daemonset.yaml`
//! and `controllers/object_controls.go` `handleDevicePluginConfig`,
//! `addSharedMountsForPluginConfig`, `setRuntimeClass`): its service account with `get`,
//! `list` and `watch` on nodes; a DaemonSet on the nodes labelled
//! `nvidia.com/gpu.deploy.device-plugin=true` whose pod shares its process namespace, runs
//! `config-manager` once as an init container (the node label
//! `nvidia.com/device-plugin.config` picks a key of the ConfigMap, which
//! `/config/config.yaml` becomes a link to; `DEFAULT_CONFIG` the ClusterPolicy's default,
//! `FALLBACK_STRATEGIES=empty`), then `nvidia-device-plugin` beside a `config-manager` that
//! relinks the file and sends the plugin SIGHUP when the label changes; the driver root
//! `/run/nvidia/driver` mounted at `/driver-root`; the `nvidia` RuntimeClass.
//!
//! Where the test node differs, and why: the `nvidia` runtime handler is plain runc (the
//! NVIDIA container runtime needs a driver); `PASS_DEVICE_SPECS` is false (the operator sets
//! true, which makes the kubelet pass `/dev/nvidia*` device nodes this machine does not
//! have); the `toolkit-validation` init container and the entrypoint script's wait for the
//! validator's `driver-ready` file are left out (no validator runs here), so the plugin is
//! the container's command itself, as the script's `exec nvidia-device-plugin` leaves it;
//! the host-root, CDI and MPS mounts are left out (no CDI, no MPS daemon here); the driver
//! root holds the mock `libnvidia-ml.so.1` ([`super::nvml_mock`]).

use serde_json::{Value, json};

/// The plugin's image: the three binaries of k8s-device-plugin v0.18.1 built by
/// `.ci/deps.sh`, in `/usr/bin` as the release image has them.
pub const IMAGE: &str = "localhost/gpushare-test/k8s-device-plugin:v0.18.1";

/// The DaemonSet's name, the operator's.
pub const DAEMONSET: &str = "nvidia-device-plugin-daemonset";

/// The node label the config manager reads.
pub const CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";

/// What to install: the operator's namespace, the ConfigMap of plugin configs and the
/// default key, and the MIG strategy.
#[derive(Debug, Clone)]
pub struct PluginLayout {
    /// The operator's namespace, e.g. `gpu-operator`.
    pub namespace: String,
    /// The ConfigMap's name and its data (key: a plugin config file).
    pub configmap: (String, Vec<(String, String)>),
    /// `DEFAULT_CONFIG`: the key used while the node has no label.
    pub default: String,
    /// `MIG_STRATEGY`: none, single or mixed.
    pub mig_strategy: String,
}

/// The objects the operator creates for the device plugin, as a `kubectl apply` list.
pub fn objects(l: &PluginLayout) -> Vec<Value> {
    let ns = l.namespace.as_str();
    let data: serde_json::Map<String, Value> = l.configmap.1.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    let env = |pairs: &[(&str, &str)]| -> Vec<Value> {
        pairs
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .chain(std::iter::once(
                json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
            ))
            .collect()
    };
    let manager_env = |oneshot: &str, signal: &str| {
        env(&[
            ("ONESHOT", oneshot),
            ("KUBECONFIG", ""),
            ("NODE_LABEL", CONFIG_LABEL),
            ("CONFIG_FILE_SRCDIR", "/available-configs"),
            ("CONFIG_FILE_DST", "/config/config.yaml"),
            ("DEFAULT_CONFIG", &l.default),
            ("FALLBACK_STRATEGIES", "empty"),
            ("SEND_SIGNAL", signal),
            ("SIGNAL", "1"),
            ("PROCESS_TO_SIGNAL", "nvidia-device-plugin"),
        ])
    };
    // `addSharedMountsForPluginConfig`: every container that reads or writes the config
    // mounts the emptyDir at /config and the ConfigMap (its volume named as it is) at
    // /available-configs, where the config manager's symlink points.
    let config_mounts = json!([
        {"name": "config", "mountPath": "/config"},
        {"name": l.configmap.0, "mountPath": "/available-configs"},
    ]);
    let privileged = json!({"privileged": true});
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
               "metadata": {"name": "nvidia"}, "handler": "nvidia"}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "nvidia-device-plugin", "namespace": ns}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "nvidia-device-plugin"},
               "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "nvidia-device-plugin"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nvidia-device-plugin"},
               "subjects": [{"kind": "ServiceAccount", "name": "nvidia-device-plugin", "namespace": ns}]}),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": l.configmap.0, "namespace": ns}, "data": data}),
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": DAEMONSET, "namespace": ns, "labels": {"app": "nvidia-device-plugin-daemonset"}},
            "spec": {
                "selector": {"matchLabels": {"app": "nvidia-device-plugin-daemonset"}},
                "template": {
                    "metadata": {"labels": {"app": "nvidia-device-plugin-daemonset"}},
                    "spec": {
                        "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                        "priorityClassName": "system-node-critical",
                        "serviceAccountName": "nvidia-device-plugin",
                        "runtimeClassName": "nvidia",
                        "shareProcessNamespace": true,
                        "initContainers": [{
                            "name": "config-manager-init", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["config-manager"],
                            "env": manager_env("true", "false"),
                            "securityContext": privileged,
                            "volumeMounts": config_mounts,
                        }],
                        "containers": [
                            {
                                "name": "nvidia-device-plugin", "image": IMAGE, "imagePullPolicy": "Never",
                                "command": ["nvidia-device-plugin"],
                                "env": env(&[
                                    ("PASS_DEVICE_SPECS", "false"),
                                    ("FAIL_ON_INIT_ERROR", "true"),
                                    ("DEVICE_LIST_STRATEGY", "envvar"),
                                    ("DEVICE_ID_STRATEGY", "uuid"),
                                    ("NVIDIA_VISIBLE_DEVICES", "all"),
                                    ("NVIDIA_DRIVER_CAPABILITIES", "all"),
                                    ("MPS_ROOT", "/run/nvidia/mps"),
                                    ("MIG_STRATEGY", &l.mig_strategy),
                                    ("NVIDIA_MIG_MONITOR_DEVICES", "all"),
                                    ("CONFIG_FILE", "/config/config.yaml"),
                                ]),
                                "securityContext": privileged,
                                "volumeMounts": [
                                    {"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"},
                                    {"name": "driver-install-dir", "mountPath": "/driver-root", "mountPropagation": "HostToContainer"},
                                    {"name": "config", "mountPath": "/config"},
                                    {"name": l.configmap.0, "mountPath": "/available-configs"},
                                ],
                            },
                            {
                                "name": "config-manager", "image": IMAGE, "imagePullPolicy": "Never",
                                "command": ["config-manager"],
                                "env": manager_env("false", "true"),
                                "securityContext": privileged,
                                "volumeMounts": config_mounts,
                            },
                        ],
                        "volumes": [
                            {"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}},
                            {"name": "driver-install-dir", "hostPath": {"path": "/run/nvidia/driver", "type": "DirectoryOrCreate"}},
                            {"name": l.configmap.0, "configMap": {"name": l.configmap.0}},
                            {"name": "config", "emptyDir": {}},
                        ],
                    }
                }
            }
        }),
    ]
}
