//! `gpushare-bench doctor --kubernetes --node NODE`: one line per prerequisite of a
//! Kubernetes sweep, each failure with its fix. Facts are gathered from the cluster
//! ([`gather`], the thin shell); the verdicts are a pure function of them ([`checks`]).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::Value;

use super::doctor::{Check, Verdict};
use crate::backend::k8s::base::{kube_error, operator_setup};
use crate::backend::k8s::objects::{self, PluginConfigMap};

/// Where to look.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The GPU node.
    pub node: String,
    /// The GPU operator's namespace.
    pub operator_namespace: String,
    /// The workload namespace.
    pub namespace: String,
    /// kube-prometheus's namespace.
    pub monitoring_namespace: String,
}

/// One permission the sweep needs, and whether the user has it.
#[derive(Debug, Clone, PartialEq)]
pub struct Permission {
    /// `verb resource[/name] in namespace`.
    pub what: String,
    /// Allowed (or why it could not be asked).
    pub allowed: Result<bool, String>,
}

/// What the cluster says.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// Where.
    pub target: Target,
    /// The API server's version.
    pub server: Result<String, String>,
    /// The device-plugin ConfigMap the ClusterPolicy names (or why not), with its keys.
    pub plugin_config: Result<(PluginConfigMap, Option<Vec<String>>), String>,
    /// ClusterPolicy spec (None: none readable).
    pub cluster_policy: Option<Value>,
    /// The operator Deployment's image.
    pub operator_image: Result<Option<String>, String>,
    /// Images of the device-plugin pods on the node.
    pub plugin_images: Result<Vec<String>, String>,
    /// Pods on the node by app label: MIG manager, DCGM exporter.
    pub operand_pods: BTreeMap<String, Result<usize, String>>,
    /// Whether the Role kube-prometheus needs exists in the workload namespace.
    pub prometheus_role: Result<bool, String>,
    /// Whether the Role that lets Prometheus discover the DCGM exporter exists in the
    /// operator's namespace.
    pub dcgm_scrape_role: Result<bool, String>,
    /// Every permission the sweep uses.
    pub permissions: Vec<Permission>,
    /// The node's labels and taints.
    pub node: Result<(BTreeMap<String, String>, Vec<String>), String>,
    /// What `--sharing-api dra` needs.
    pub dra: DraFacts,
}

/// NVIDIA's DRA driver, as `--sharing-api dra` needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct DraFacts {
    /// Whether the DeviceClass `gpu.nvidia.com` exists.
    pub class: Result<bool, String>,
    /// GPUs the driver's ResourceSlices publish for the node (an error: they could not
    /// be listed, or the node's whole GPUs are of different products).
    pub gpus: Result<usize, String>,
    /// The driver's kubelet plugin on the node: image and feature gates.
    pub driver: Result<crate::backend::k8s::dra::DriverFacts, String>,
}

/// The permissions the sweep needs: the rules `manifests/base/rbac.yaml` and
/// `manifests/node/rbac.yaml` grant the
/// harness (pure), as (verb, group, resource, subresource, namespace, name).
pub fn required(t: &Target, cm: &PluginConfigMap) -> Vec<(String, String, String, String, String, String)> {
    let mut out = Vec::new();
    for o in objects::rbac(&t.namespace, cm, &t.monitoring_namespace, &t.node) {
        let kind = o["kind"].as_str().unwrap_or_default();
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        // kube-prometheus's Role is not the harness's.
        if o["metadata"]["name"] == "prometheus-k8s" || o["metadata"]["name"] == objects::DCGM_SCRAPE_ROLE {
            continue;
        }
        let ns = o["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        for rule in o["rules"].as_array().into_iter().flatten() {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                    .unwrap_or_default()
            };
            let names = list("resourceNames");
            for group in list("apiGroups") {
                for resource in list("resources") {
                    let (res, sub) = resource.split_once('/').unwrap_or((&resource, ""));
                    for verb in list("verbs") {
                        let name = if res == "nodes" {
                            t.node.clone()
                        } else {
                            names.first().cloned().unwrap_or_default()
                        };
                        out.push((verb, group.clone(), res.to_string(), sub.to_string(), ns.clone(), name));
                    }
                }
            }
        }
    }
    out
}

fn version_of(image: &str) -> &str {
    image.rsplit_once(':').map_or("", |(_, v)| v)
}

/// The verdicts (pure).
pub fn checks(f: &Facts) -> Vec<Check> {
    use Verdict::{Fail, Warn};
    let c = |name, verdict, detail: String| Check { name, verdict, detail };
    let t = &f.target;
    let mut out = Vec::new();
    out.push(match &f.server {
        Ok(v) => c("cluster", Verdict::Ok, format!("API server {v}")),
        Err(e) => c("cluster", Fail, format!("{e} (check KUBECONFIG / the current context)")),
    });
    out.push(match &f.node {
        Ok((labels, taints)) => {
            let gpus = objects::physical_gpus(labels);
            let product = labels.get(objects::LABEL_PRODUCT).cloned().unwrap_or_default();
            let verdict = if gpus >= 1 { Verdict::Ok } else { Fail };
            let hint = match gpus {
                0 => " — no nvidia.com/gpu.count label: is GPU feature discovery running there?".to_string(),
                1 => String::new(),
                n => format!(" — the device plugin spreads pods over the {n} GPUs: a sweep's cells fill them all (N pods on each, a row per GPU); isolation and capacity need a 1-GPU node or --sharing-api dra"),
            };
            let taint = if taints.is_empty() {
                String::new()
            } else {
                format!("; taints {} (the pods tolerate {})", taints.join(", "), objects::DEFAULT_TOLERATION)
            };
            c("node", verdict, format!("{}: {gpus} × {product}{hint}{taint}", t.node))
        }
        Err(e) => c("node", Fail, e.clone()),
    });
    match &f.plugin_config {
        Ok((cm, keys)) => {
            out.push(c(
                "ClusterPolicy",
                Verdict::Ok,
                format!(
                    "devicePlugin.config.name {} (default key {}), mig.strategy {}",
                    cm.name,
                    if cm.default_key.is_empty() {
                        "none"
                    } else {
                        cm.default_key.as_str()
                    },
                    f.cluster_policy
                        .as_ref()
                        .and_then(|p| p["mig"]["strategy"].as_str())
                        .unwrap_or("single")
                ),
            ));
            out.push(match keys {
                None => c(
                    "device-plugin config",
                    Fail,
                    format!("ConfigMap {} does not exist: kubectl apply -f manifests/device-plugin-config.yaml", cm.id()),
                ),
                Some(keys) if !cm.default_key.is_empty() && !keys.contains(&cm.default_key) => c(
                    "device-plugin config",
                    Fail,
                    format!(
                        "ConfigMap {} lacks the default key {}: config-manager-init fails on every GPU node at its next start; add the key",
                        cm.id(),
                        cm.default_key
                    ),
                ),
                Some(keys) => c(
                    "device-plugin config",
                    Verdict::Ok,
                    format!("ConfigMap {} with {} key(s)", cm.id(), keys.len()),
                ),
            });
        }
        Err(e) => out.push(c("ClusterPolicy", Fail, e.clone())),
    }
    out.push(match &f.operator_image {
        Ok(Some(image)) => {
            let v = version_of(image);
            c(
                "GPU operator",
                if v.starts_with("v25.") || v.starts_with("v26.") {
                    Verdict::Ok
                } else {
                    Warn
                },
                format!("{image} (the rules the harness follows were read from v25.10.1)"),
            )
        }
        Ok(None) => c(
            "GPU operator",
            Warn,
            format!(
                "no Deployment gpu-operator in {}: version unknown (pass --operator-namespace)",
                t.operator_namespace
            ),
        ),
        Err(e) => c("GPU operator", Warn, e.clone()),
    });
    // The operator's deploy label for the plugin, as the user set it (a node for NVIDIA's
    // DRA driver has it `false`: the driver's chart refuses to install beside the plugin).
    let plugin_off = f
        .node
        .as_ref()
        .is_ok_and(|(labels, _)| labels.get(objects::LABEL_DEPLOY_PLUGIN).map(String::as_str) == Some("false"));
    let dra_gpus = matches!(f.dra.gpus, Ok(n) if n > 0);
    out.push(match &f.plugin_images {
        Ok(images) if images.is_empty() && plugin_off => c(
            "device plugin",
            Warn,
            format!(
                "off on {} ({}=false): the default --sharing-api device-plugin cannot run there; --sharing-api dra can",
                t.node,
                objects::LABEL_DEPLOY_PLUGIN
            ),
        ),
        Ok(images) if images.is_empty() => c(
            "device plugin",
            Fail,
            format!(
                "no {} pod on {}: is the node labelled {}=true?",
                objects::APP_PLUGIN,
                t.node,
                objects::LABEL_DEPLOY_PLUGIN
            ),
        ),
        Ok(images) if dra_gpus => c(
            "device plugin",
            Warn,
            format!(
                "{} beside NVIDIA's DRA driver, which also publishes {}'s GPUs: both would hand out the same GPU, so a --sharing-api dra run is refused there (label the node {}=false for one)",
                images.join(", "),
                t.node,
                objects::LABEL_DEPLOY_PLUGIN
            ),
        ),
        Ok(images) => c(
            "device plugin",
            Verdict::Ok,
            format!("{} (rules read from v0.18.1)", images.join(", ")),
        ),
        Err(e) => c("device plugin", Fail, e.clone()),
    });
    for (app, name, what) in [
        ("nvidia-mig-manager", "MIG manager", "MIG cells will be unavailable"),
        ("nvidia-dcgm-exporter", "DCGM exporter", "GPU telemetry will be empty"),
    ] {
        out.push(match f.operand_pods.get(app) {
            Some(Ok(n)) if *n > 0 => c(name, Verdict::Ok, format!("{n} pod(s) on {}", t.node)),
            Some(Ok(_)) => c(name, Warn, format!("no {app} pod on {}: {what}", t.node)),
            Some(Err(e)) => c(name, Warn, e.clone()),
            None => c(name, Warn, "not checked".into()),
        });
    }
    out.push(match &f.prometheus_role {
        Ok(true) => c("Prometheus scrape", Verdict::Ok, format!("Role prometheus-k8s in {}", t.namespace)),
        Ok(false) => c(
            "Prometheus scrape",
            Fail,
            format!(
                "no Role prometheus-k8s in {}: kube-prometheus may only discover pods in default, kube-system and monitoring; kubectl apply -f manifests/base/rbac.yaml",
                t.namespace
            ),
        ),
        Err(e) => c("Prometheus scrape", Warn, e.clone()),
    });
    out.push(dcgm_scrape_check(f));
    out.extend(dra_checks(&f.dra, &t.node));
    let denied: Vec<&Permission> = f.permissions.iter().filter(|p| p.allowed != Ok(true)).collect();
    if f.permissions.is_empty() {
        out.push(c("permissions", Warn, "not checked (no ClusterPolicy read)".into()));
    } else if denied.is_empty() {
        out.push(c(
            "permissions",
            Verdict::Ok,
            format!("all {} the sweep uses", f.permissions.len()),
        ));
    } else {
        for p in denied {
            out.push(c(
                "permission",
                Fail,
                match &p.allowed {
                    Ok(_) => format!(
                        "denied: {} (the manifests grant it: gpushare-bench manifests --node {} --out DIR, then kubectl apply -k DIR/base and kubectl apply -k DIR/node)",
                        p.what, t.node
                    ),
                    Err(e) => format!("{}: {e}", p.what),
                },
            ));
        }
    }
    out
}

/// Whether Prometheus will scrape the DCGM exporter (pure): the operator makes its
/// ServiceMonitor only with `dcgmExporter.serviceMonitor.enabled` (gpu-operator v25.10.1
/// `api/nvidia/v1/clusterpolicy_types.go` `DCGMExporterServiceMonitorConfig`), in its own
/// namespace, where kube-prometheus's Prometheus may not look without a Role. A warning
/// at worst: without it the sweep runs, with empty GPU telemetry.
fn dcgm_scrape_check(f: &Facts) -> Check {
    let name = "DCGM scrape";
    let ns = &f.target.operator_namespace;
    let enabled = f
        .cluster_policy
        .as_ref()
        .map(|spec| spec["dcgmExporter"]["serviceMonitor"]["enabled"] == Value::Bool(true));
    let warn = |detail: String| Check {
        name,
        verdict: Verdict::Warn,
        detail: format!("{detail}: GPU telemetry will be empty"),
    };
    match (enabled, &f.dcgm_scrape_role) {
        (Some(false), _) => warn(
            "the ClusterPolicy does not set dcgmExporter.serviceMonitor.enabled=true, so the operator makes no ServiceMonitor for the exporter (manifests/gpu-operator-clusterpolicy.yaml sets it)".into(),
        ),
        (_, Ok(false)) => warn(format!(
            "no Role {} in {ns}: kube-prometheus's Prometheus may not discover the exporter there (kubectl apply -k manifests/base)",
            objects::DCGM_SCRAPE_ROLE
        )),
        (_, Err(e)) => warn(e.clone()),
        (None, Ok(true)) => warn("no ClusterPolicy read: whether the operator makes the exporter's ServiceMonitor is unknown".into()),
        (Some(true), Ok(true)) => Check {
            name,
            verdict: Verdict::Ok,
            detail: format!(
                "ServiceMonitor on in the ClusterPolicy; Role {} in {ns}",
                objects::DCGM_SCRAPE_ROLE
            ),
        },
    }
}

/// The DRA lines (pure): warnings at worst, since only `--sharing-api dra` needs them.
fn dra_checks(d: &DraFacts, node: &str) -> Vec<Check> {
    use crate::backend::k8s::dra_claims;
    let c = |name, verdict, detail: String| Check { name, verdict, detail };
    let only = "only --sharing-api dra needs it";
    match &d.class {
        Ok(false) => {
            return vec![c(
                "DRA driver",
                Verdict::Warn,
                format!(
                    "no DeviceClass {} ({only}): NVIDIA's DRA driver is not installed",
                    dra_claims::GPU_CLASS
                ),
            )];
        }
        Err(e) => return vec![c("DRA driver", Verdict::Warn, format!("{e} ({only})"))],
        Ok(true) => {}
    }
    let mut out = vec![match &d.gpus {
        Ok(1) => c(
            "DRA slices",
            Verdict::Ok,
            format!("1 GPU of {} on {node}", dra_claims::DRIVER),
        ),
        Ok(0) => c(
            "DRA slices",
            Verdict::Warn,
            format!(
                "no GPU of {} published for {node}: is the driver's kubelet plugin running there?",
                dra_claims::DRIVER
            ),
        ),
        Ok(n) => c(
            "DRA slices",
            Verdict::Ok,
            format!(
                "{n} GPUs of {} on {node}: the scheduler gives each cell's claims some of them, which its note names and its telemetry reads",
                dra_claims::DRIVER
            ),
        ),
        Err(e) => c("DRA slices", Verdict::Warn, e.clone()),
    }];
    out.push(match &d.driver {
        Ok(f) => {
            let off: Vec<&str> = ["TimeSlicingSettings", "MPSSupport"]
                .into_iter()
                .filter(|g| !f.gate(g))
                .collect();
            if off.is_empty() {
                c("DRA driver", Verdict::Ok, f.describe())
            } else {
                c(
                    "DRA driver",
                    Verdict::Warn,
                    format!(
                        "{}; off: {} (MPS, and time-slicing with --timeslice, need them: helm upgrade … --set featureGates.NAME=true)",
                        f.describe(),
                        off.join(", ")
                    ),
                )
            }
        }
        Err(e) => c("DRA driver", Verdict::Warn, format!("feature gates unknown: {e}")),
    });
    out
}

async fn may(client: &Client, r: &(String, String, String, String, String, String)) -> Permission {
    let (verb, group, resource, sub, ns, name) = r;
    let what = format!(
        "{verb} {}{}{}{}",
        if group.is_empty() {
            String::new()
        } else {
            format!("{group}/")
        },
        resource,
        if sub.is_empty() {
            String::new()
        } else {
            format!("/{sub}")
        },
        if name.is_empty() {
            String::new()
        } else {
            format!(" {name}")
        }
    ) + &if ns.is_empty() {
        String::new()
    } else {
        format!(" in {ns}")
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.clone()),
                group: Some(group.clone()),
                resource: Some(resource.clone()),
                subresource: (!sub.is_empty()).then(|| sub.clone()),
                namespace: (!ns.is_empty()).then(|| ns.clone()),
                name: (!name.is_empty()).then(|| name.clone()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let allowed = api
        .create(&PostParams::default(), &review)
        .await
        .map(|r| r.status.is_some_and(|s| s.allowed))
        .map_err(|e| kube_error("asking a SelfSubjectAccessReview", e).to_string());
    Permission { what, allowed }
}

/// `doctor --kubernetes`: connects with the kubeconfig (or in-cluster config) and checks
/// every prerequisite of a run on `--node`.
pub async fn run(
    args: &crate::config::cli::DoctorArgs,
    shutdown: &crate::shutdown::Shutdown,
) -> crate::error::Result<Vec<Check>> {
    let target = Target {
        node: args.node.clone().unwrap_or_default(),
        operator_namespace: args.operator_namespace.clone(),
        namespace: args.namespace.clone(),
        monitoring_namespace: args.monitoring_namespace.clone(),
    };
    // No cluster to talk to (no kubeconfig, a server that does not answer) is the table's
    // first line and its only one: nothing else can be checked, and probing on would
    // only repeat the same failure.
    let unreachable = |e: crate::error::BenchError| {
        vec![Check {
            name: "cluster",
            verdict: Verdict::Fail,
            detail: format!(
                "{} (check KUBECONFIG / the current context); nothing else was checked",
                e.to_string().trim_start_matches("Kubernetes: ")
            ),
        }]
    };
    let client = match shutdown.guard(crate::backend::k8s::base::connect()).await {
        Ok(c) => c,
        Err(e @ crate::error::BenchError::Interrupted { .. }) => return Err(e),
        Err(e) => return Ok(unreachable(e)),
    };
    let reached = shutdown
        .guard(async {
            client
                .apiserver_version()
                .await
                .map_err(|e| kube_error("reaching the API server", e))
        })
        .await;
    match reached {
        Ok(_) => {}
        Err(e @ crate::error::BenchError::Interrupted { .. }) => return Err(e),
        Err(e) => return Ok(unreachable(e)),
    }
    let facts = shutdown.guard(async { Ok(gather(&client, &target).await) }).await?;
    Ok(checks(&facts))
}

/// Gathers the facts (each failure is a fact, not an error).
pub async fn gather(client: &Client, t: &Target) -> Facts {
    let err = |what: &str, e: kube::Error| kube_error(what, e).to_string();
    let server = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .map_err(|e| err("reaching the API server", e));
    let node = Api::<Node>::all(client.clone())
        .get(&t.node)
        .await
        .map(|n| {
            let labels = n.metadata.labels.unwrap_or_default();
            let taints = n
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect();
            (labels, taints)
        })
        .map_err(|e| err(&format!("reading node {}", t.node), e));
    let plugin_config = match operator_setup(client.clone(), &t.operator_namespace).await {
        Ok(setup) => {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &setup.plugin.namespace);
            match cms.get(&setup.plugin.name).await {
                Ok(cm) => Ok((setup.plugin, Some(cm.data.unwrap_or_default().into_keys().collect()))),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok((setup.plugin, None)),
                Err(e) => Err(err(&format!("reading ConfigMap {}", setup.plugin.id()), e)),
            }
        }
        Err(e) => Err(e.to_string().trim_start_matches("Kubernetes: ").to_string()),
    };
    let cluster_policy = kube::Api::<kube::core::DynamicObject>::all_with(
        client.clone(),
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy"),
            "clusterpolicies",
        ),
    )
    .list(&ListParams::default())
    .await
    .ok()
    .and_then(|l| l.items.into_iter().next())
    .map(|cp| cp.data["spec"].clone());
    let operator_image = match Api::<Deployment>::namespaced(client.clone(), &t.operator_namespace)
        .get("gpu-operator")
        .await
    {
        Ok(d) => Ok(d
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers.first().and_then(|c| c.image.clone()))),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(err("reading the gpu-operator Deployment", e)),
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &t.operator_namespace);
    let on_node = |list: Vec<Pod>| -> Vec<Pod> {
        list.into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(t.node.as_str()))
            .collect()
    };
    let plugin_images = pods
        .list(&ListParams::default().labels(&format!("app={}", objects::APP_PLUGIN)))
        .await
        .map(|l| {
            on_node(l.items)
                .iter()
                .filter_map(|p| p.spec.as_ref()?.containers.first()?.image.clone())
                .collect()
        })
        .map_err(|e| err("listing device-plugin pods", e));
    let mut operand_pods = BTreeMap::new();
    for app in ["nvidia-mig-manager", "nvidia-dcgm-exporter"] {
        let n = pods
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .map(|l| on_node(l.items).len())
            .map_err(|e| err(&format!("listing {app} pods"), e));
        operand_pods.insert(app.to_string(), n);
    }
    let prometheus_role = match Api::<Role>::namespaced(client.clone(), &t.namespace)
        .get("prometheus-k8s")
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(err(&format!("reading Role prometheus-k8s in {}", t.namespace), e)),
    };
    let dcgm_scrape_role = match Api::<Role>::namespaced(client.clone(), &t.operator_namespace)
        .get(objects::DCGM_SCRAPE_ROLE)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(err(
            &format!("reading Role {} in {}", objects::DCGM_SCRAPE_ROLE, t.operator_namespace),
            e,
        )),
    };
    // Without a readable ClusterPolicy the permissions are asked for the default ConfigMap.
    let cm = match &plugin_config {
        Ok((cm, _)) => cm.clone(),
        Err(_) => PluginConfigMap {
            namespace: t.operator_namespace.clone(),
            ..PluginConfigMap::default()
        },
    };
    let mut permissions = Vec::new();
    for r in required(t, &cm) {
        permissions.push(may(client, &r).await);
    }
    let dra = gather_dra(client, &t.node).await;
    Facts {
        target: t.clone(),
        server,
        plugin_config,
        cluster_policy,
        operator_image,
        plugin_images,
        operand_pods,
        prometheus_role,
        dcgm_scrape_role,
        permissions,
        node,
        dra,
    }
}

async fn gather_dra(client: &Client, node: &str) -> DraFacts {
    use crate::backend::k8s::{dra, dra_claims};
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let api = |kind: &str, plural: &str| {
        Api::<DynamicObject>::all_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("resource.k8s.io", "v1", kind), plural),
        )
    };
    let class = match api("DeviceClass", "deviceclasses").get(dra_claims::GPU_CLASS).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(kube_error(&format!("reading DeviceClass {}", dra_claims::GPU_CLASS), e).to_string()),
    };
    let gpus = api("ResourceSlice", "resourceslices")
        .list(&ListParams::default())
        .await
        .map_err(|e| kube_error("listing ResourceSlices", e).to_string())
        .and_then(|l| {
            let values: Vec<Value> = l.items.iter().filter_map(|o| serde_json::to_value(o).ok()).collect();
            let inventory = dra::inventory_from_slices(&values, node);
            dra::whole_gpu_product(&inventory, node).map_err(|e| e.to_string())?;
            Ok(inventory.gpus.len())
        });
    let driver = dra::read_driver(client, node).await;
    DraFacts { class, gpus, driver }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::k8s::dra::{DriverFacts, inventory_from_slices, whole_gpu_product};
    use gpushare_k8s_sim::dra::resource_slice;

    fn slices_check(gpus: Result<usize, String>) -> Check {
        let d = DraFacts {
            class: Ok(true),
            gpus,
            driver: Ok(DriverFacts {
                image: "dra-driver-nvidia-gpu:v0.4.1".into(),
                gates: Default::default(),
            }),
        };
        dra_checks(&d, "gpu-1")
            .into_iter()
            .find(|c| c.name == "DRA slices")
            .expect("a DRA slices line")
    }

    /// The doctor's device-plugin line for a node with these labels, plugin pods and
    /// GPUs published by the DRA driver.
    fn plugin_check(labels: &[(&str, &str)], images: &[&str], dra_gpus: usize) -> Check {
        checks(&facts_with(labels, images, dra_gpus))
            .into_iter()
            .find(|c| c.name == "device plugin")
            .expect("a device plugin line")
    }

    /// What the doctor gathers from a node with these labels, plugin pods and GPUs
    /// published by the DRA driver (the rest ready).
    fn facts_with(labels: &[(&str, &str)], images: &[&str], dra_gpus: usize) -> Facts {
        Facts {
            target: Target {
                node: "gpu-1".into(),
                operator_namespace: "gpu-operator".into(),
                namespace: "gpushare-bench".into(),
                monitoring_namespace: "monitoring".into(),
            },
            server: Ok("v1.34.4".into()),
            plugin_config: Err("not read".into()),
            cluster_policy: None,
            operator_image: Ok(None),
            plugin_images: Ok(images.iter().map(|s| s.to_string()).collect()),
            operand_pods: BTreeMap::new(),
            prometheus_role: Ok(true),
            dcgm_scrape_role: Ok(true),
            permissions: Vec::new(),
            node: Ok((
                labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                Vec::new(),
            )),
            dra: DraFacts {
                class: Ok(dra_gpus > 0),
                gpus: Ok(dra_gpus),
                driver: Err("not read".into()),
            },
        }
    }

    #[test]
    fn a_device_plugin_turned_off_for_dra_warns_and_one_beside_the_driver_is_named() {
        let plugin = "nvcr.io/nvidia/k8s-device-plugin:v0.18.1";
        let missing = plugin_check(&[], &[], 0);
        assert_eq!(missing.verdict, Verdict::Fail, "{}", missing.detail);
        let off = plugin_check(&[(objects::LABEL_DEPLOY_PLUGIN, "false")], &[], 1);
        assert_eq!(off.verdict, Verdict::Warn, "{}", off.detail);
        assert!(off.detail.contains("--sharing-api dra can"), "{}", off.detail);
        let both = plugin_check(&[], &[plugin], 1);
        assert_eq!(both.verdict, Verdict::Warn, "{}", both.detail);
        assert!(
            both.detail.contains("a --sharing-api dra run is refused"),
            "{}",
            both.detail
        );
        assert_eq!(plugin_check(&[], &[plugin], 0).verdict, Verdict::Ok);
    }

    #[test]
    fn gpu_telemetry_needs_the_service_monitor_and_the_role_in_the_operator_namespace() {
        let mut f = facts_with(&[], &[], 0);
        let line = |f: &Facts| dcgm_scrape_check(f);
        f.cluster_policy = Some(serde_json::json!({"dcgmExporter": {"serviceMonitor": {"enabled": true}}}));
        assert_eq!(line(&f).verdict, Verdict::Ok, "{}", line(&f).detail);
        f.dcgm_scrape_role = Ok(false);
        assert!(
            line(&f).verdict == Verdict::Warn
                && line(&f)
                    .detail
                    .contains("no Role gpushare-bench-dcgm-scrape in gpu-operator"),
            "{}",
            line(&f).detail
        );
        f.dcgm_scrape_role = Ok(true);
        f.cluster_policy = Some(serde_json::json!({"dcgmExporter": {"enabled": true}}));
        assert!(
            line(&f).verdict == Verdict::Warn && line(&f).detail.contains("dcgmExporter.serviceMonitor.enabled=true"),
            "{}",
            line(&f).detail
        );
    }

    #[test]
    fn several_alike_gpus_pass_and_mixed_products_are_named() {
        let two = slices_check(Ok(2));
        assert_eq!(two.verdict, Verdict::Ok, "{}", two.detail);
        assert!(
            two.detail.starts_with("2 GPUs of gpu.nvidia.com on gpu-1"),
            "{}",
            two.detail
        );
        // What gather_dra makes of a node whose whole GPUs differ.
        let mut inv = inventory_from_slices(
            &[resource_slice("gpu-1", 2, "NVIDIA H100 80GB HBM3", 80 << 30)],
            "gpu-1",
        );
        inv.gpus[1].name = "NVIDIA H200".into();
        let e = whole_gpu_product(&inv, "gpu-1").map(|_| 2).map_err(|e| e.to_string());
        let mixed = slices_check(e);
        assert_eq!(mixed.verdict, Verdict::Warn);
        assert!(
            mixed.detail.contains("whole GPUs of different products"),
            "{}",
            mixed.detail
        );
    }
}
