//! What both Kubernetes sharing paths (the device plugin's and DRA claims') stand on:
//! how the harness reaches the cluster ([`KubeSettings`], [`kube_error`]), a pod's state,
//! the workload namespace, a cell's pods, deleting the workload and claims, the GPU
//! operator's setup, and undoing a run's journal ([`restore_from_journal`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};

use super::journal::{self, Journal};
use super::objects::{self, PluginConfigMap, WorkloadSpec};
use crate::backend::{Pod as CellPod, PodState};
use crate::domain::Strategy;
use crate::error::{BenchError, Result};
use crate::shutdown::{EndsOn, Shutdown, Unmet};

/// How the backend talks to the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeSettings {
    /// The GPU node.
    pub node: String,
    /// What the pods run.
    pub workload: WorkloadSpec,
    /// The GPU operator's namespace (where the device-plugin ConfigMap and operands live).
    pub operator_namespace: String,
    /// MIG layout label value (None: chosen from the GPU product).
    pub mig_layout: Option<String>,
    /// Strategies of the sweep (their ConfigMap keys are added up front).
    pub strategies: Vec<Strategy>,
    /// Pod counts of the sweep (time-slicing is configured once for the largest).
    pub pods: Vec<u32>,
    /// Longest wait for a device-plugin switch (config-manager back-off, projection).
    pub switch_timeout: Duration,
    /// Longest wait for a MIG reconfiguration (mig-parted waits up to 5 min for each of
    /// four operands before it starts, then changes the mode and applies the layout).
    pub mig_timeout: Duration,
    /// Wait after adding ConfigMap keys before relabelling: the kubelet projects a
    /// changed ConfigMap into pods after its sync period plus cache delay (A5).
    pub projection_wait: Duration,
    /// How long a switched node's labels and allocatable must hold before it counts as
    /// switched (a SIGHUPed plugin re-registers a few seconds after the label changes).
    pub settle: Duration,
    /// Time between polls.
    pub poll: Duration,
    /// The image an isolation trial's aggressors run where the pods are a server of the
    /// user's own (`--aggressor-image`; gpushare-workload's, whose flags make them
    /// misbehave).
    pub aggressor_image: String,
}

impl KubeSettings {
    /// The production timings for a node and workload.
    pub fn new(node: &str, workload: WorkloadSpec) -> Self {
        Self {
            node: node.into(),
            workload,
            operator_namespace: "gpu-operator".into(),
            mig_layout: None,
            strategies: Strategy::ALL.to_vec(),
            pods: vec![1, 3, 5, 7],
            switch_timeout: Duration::from_secs(900),
            mig_timeout: Duration::from_secs(1800),
            projection_wait: Duration::from_secs(120),
            settle: Duration::from_secs(15),
            poll: Duration::from_secs(2),
            aggressor_image: crate::config::plan::DEFAULT_IMAGE.into(),
        }
    }

    /// What a pod that runs gpushare-workload runs ([`crate::backend::PodSpec::builtin`]):
    /// the run's workload, or where that is a server of the user's own, gpushare-workload
    /// in the aggressor image with the run's workload arguments.
    pub fn builtin_workload(&self) -> WorkloadSpec {
        match self.workload.server {
            None => self.workload.clone(),
            Some(_) => WorkloadSpec {
                image: self.aggressor_image.clone(),
                server: None,
                ..self.workload.clone()
            },
        }
    }

    /// Every duration divided by `factor` (tests on a simulated cluster running faster
    /// than the wall clock).
    pub fn faster(mut self, factor: f64) -> Self {
        for d in [
            &mut self.switch_timeout,
            &mut self.mig_timeout,
            &mut self.projection_wait,
            &mut self.settle,
            &mut self.poll,
        ] {
            *d = d.div_f64(factor);
        }
        self
    }
}

/// How long the harness waits for the API server's answer to one request: kube's client
/// sets no read timeout by default, and one stalled request would hang a sweep.
pub const API_TIMEOUT: Duration = Duration::from_secs(30);

/// A client from the local kubeconfig or the in-cluster service account, each answer
/// waited for at most [`API_TIMEOUT`].
pub async fn connect() -> Result<Client> {
    let config = kube::Config::infer().await.map_err(|e| BenchError::Kubernetes {
        what: "connecting to the cluster (kubeconfig or in-cluster config)".into(),
        detail: Some(e.to_string()),
        source: None,
    })?;
    client_from(config, Some(API_TIMEOUT))
}

/// A client for the port-forward's stream, which may sit idle between scrapes longer
/// than a request may take: no read timeout.
pub async fn connect_streaming() -> Result<Client> {
    let config = kube::Config::infer().await.map_err(|e| BenchError::Kubernetes {
        what: "connecting to the cluster (kubeconfig or in-cluster config)".into(),
        detail: Some(e.to_string()),
        source: None,
    })?;
    client_from(config, None)
}

/// A client of `config` whose requests fail after `read_timeout` without an answer
/// (counted from the request's last write, not from when its pooled connection went idle).
pub fn client_from(mut config: kube::Config, read_timeout: Option<Duration>) -> Result<Client> {
    config.read_timeout = read_timeout;
    config.reset_reader_on_write = read_timeout.is_some();
    Client::try_from(config).map_err(|e| kube_error("connecting to the cluster", e))
}

/// Turns a kube error into one line naming what was being done.
pub fn kube_error(what: &str, e: kube::Error) -> BenchError {
    let detail = match &e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "forbidden: {} (the harness's user or service account lacks RBAC permission; manifests/base/rbac.yaml and manifests/node/rbac.yaml list what it needs, `gpushare-bench doctor --kubernetes --node NODE` checks it)",
            s.message
        ),
        kube::Error::Api(s) if s.code == 404 => format!("not found: {}", s.message),
        kube::Error::Api(s) => format!("{} ({}): {}", s.code, s.reason, s.message),
        other => {
            // The causes say what happened (a refused connection, a timeout).
            let mut chain = vec![other.to_string()];
            let mut timed_out = false;
            let mut cause = std::error::Error::source(other);
            while let Some(c) = cause {
                timed_out |= c
                    .downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
                chain.push(c.to_string());
                cause = c.source();
            }
            chain.dedup();
            if timed_out {
                format!(
                    "no answer within {} s: the API server is unreachable or stalled ({})",
                    API_TIMEOUT.as_secs(),
                    chain.join(": ")
                )
            } else {
                chain.join(": ")
            }
        }
    };
    BenchError::Kubernetes {
        what: what.to_string(),
        detail: Some(detail),
        source: Some(Box::new(e)),
    }
}

/// The state of a workload pod (pure).
pub fn pod_state(pod: &Pod) -> PodState {
    let status = pod.status.as_ref();
    // Rejected at admission (the device plugin's Allocate failed): Failed, never retried.
    if status.and_then(|s| s.phase.as_deref()) == Some("Failed") {
        let s = status.map(|s| (s.reason.clone(), s.message.clone()));
        let (reason, message) = s.unwrap_or_default();
        return PodState::Exited {
            code: None,
            detail: format!(
                "{}: {}",
                reason.as_deref().unwrap_or("Failed"),
                message.as_deref().unwrap_or("the pod failed")
            ),
        };
    }
    let conditions = status.and_then(|s| s.conditions.as_ref());
    let cond = |t: &str| conditions.and_then(|c| c.iter().find(|c| c.type_ == t));
    if let Some(c) = cond("PodScheduled")
        && c.status == "False"
    {
        return PodState::Pending(format!(
            "{}: {}",
            c.reason.as_deref().unwrap_or("Unschedulable"),
            c.message.as_deref().unwrap_or("")
        ));
    }
    if let Some(cs) = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|v| v.first())
    {
        let last = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        let now_term = cs.state.as_ref().and_then(|s| s.terminated.as_ref());
        if let Some(t) = now_term.or(last) {
            let reason = t.reason.as_deref().unwrap_or("Error");
            let waiting = cs
                .state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.clone());
            return PodState::Exited {
                code: Some(t.exit_code),
                detail: format!(
                    "{reason} (exit code {}, {} restarts){}{}",
                    t.exit_code,
                    cs.restart_count,
                    waiting.map(|w| format!(", now {w}")).unwrap_or_default(),
                    t.message
                        .as_deref()
                        .map(|m| format!(": {}", m.trim()))
                        .unwrap_or_default()
                ),
            };
        }
    }
    match cond("Ready") {
        Some(c) if c.status == "True" => PodState::Running,
        _ => PodState::Starting,
    }
}

/// The node's allocatable count of an extended resource (pure).
pub fn allocatable(node: &Node, resource: &str) -> Option<u32> {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(resource))
        .and_then(|q| q.0.parse().ok())
}

/// The node's labels (none: empty).
pub fn labels_of(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

/// Whether GFD shows the node's GPUs split by `layout` (pure): with MIG strategy
/// `single` the product ends in `-MIG-<profile>` and its count is allocatable as
/// `nvidia.com/gpu`; with `mixed` `nvidia.com/mig-<profile>.count` is allocatable as
/// `nvidia.com/mig-<profile>` (k8s-device-plugin v0.18.1 `internal/lm/mig-strategy.go`).
/// `all-disabled`: no MIG labels, and GPUs allocatable again.
pub fn mig_shown(node: &Node, layout: &str, mig_strategy: &str) -> bool {
    let labels = labels_of(node);
    let product = labels.get(objects::LABEL_PRODUCT).map(String::as_str).unwrap_or("");
    let count = |k: &str| labels.get(k).and_then(|c| c.parse::<u32>().ok()).unwrap_or(0);
    match objects::mig_profile(layout) {
        None => {
            !product.contains("-MIG-")
                && !labels
                    .keys()
                    .any(|k| k.starts_with("nvidia.com/mig-") && k.ends_with(".count"))
                && allocatable(node, "nvidia.com/gpu").is_some_and(|n| n >= 1)
        }
        Some(profile) if mig_strategy == "mixed" => {
            let n = count(&format!("nvidia.com/mig-{profile}.count"));
            n >= 1 && allocatable(node, &format!("nvidia.com/mig-{profile}")) == Some(n)
        }
        Some(profile) => {
            let n = count(objects::LABEL_GPU_COUNT);
            product
                .trim_end_matches("-SHARED")
                .ends_with(&format!("-MIG-{profile}"))
                && n >= 1
                && allocatable(node, "nvidia.com/gpu") == Some(n)
        }
    }
}

/// What the cluster's GPU operator is set up as (read at open).
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorSetup {
    /// The device-plugin ConfigMap (from the ClusterPolicy).
    pub plugin: PluginConfigMap,
    /// ClusterPolicy `mig.strategy` (single, mixed or none).
    pub mig_strategy: String,
}

/// The ClusterPolicy resource (nvidia.com/v1, cluster-scoped).
pub fn cluster_policies(client: Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy");
    Api::all_with(client, &ApiResource::from_gvk_with_plural(&gvk, "clusterpolicies"))
}

/// Reads the GPU operator's ClusterPolicy: the device-plugin ConfigMap it names and its
/// MIG strategy. No `devicePlugin.config.name` means the operator runs no config-manager
/// (gpu-operator v25.10.1 `object_controls.go` `handleDevicePluginConfig`): the node label
/// would do nothing, so that is an error with the fix.
pub async fn operator_setup(client: Client, operator_namespace: &str) -> Result<OperatorSetup> {
    let list = cluster_policies(client)
        .list(&ListParams::default())
        .await
        .map_err(|e| kube_error("reading the GPU operator's ClusterPolicy (nvidia.com/v1)", e))?;
    let cp = match list.items.as_slice() {
        [cp] => cp,
        [] => {
            return Err(BenchError::kube(
                "no ClusterPolicy (nvidia.com/v1) found: is the NVIDIA GPU operator installed?",
            ));
        }
        many => {
            return Err(BenchError::kube(format!(
                "{} ClusterPolicies found; the GPU operator uses one",
                many.len()
            )));
        }
    };
    let cp_name = cp.metadata.name.clone().unwrap_or_default();
    let config = &cp.data["spec"]["devicePlugin"]["config"];
    let name = config["name"].as_str().unwrap_or_default().to_string();
    if name.is_empty() {
        return Err(BenchError::kube(format!(
            "ClusterPolicy {cp_name} sets no devicePlugin.config.name: the GPU operator then runs no config-manager and the node label nvidia.com/device-plugin.config does nothing; set it (manifests/gpu-operator-clusterpolicy.yaml, or `helm upgrade … --set devicePlugin.config.name=device-plugin-config`)"
        )));
    }
    let default_key = config["default"].as_str().unwrap_or_default().to_string();
    let mig_strategy = cp.data["spec"]["mig"]["strategy"]
        .as_str()
        .unwrap_or("single")
        .to_string();
    let plugin = PluginConfigMap {
        namespace: operator_namespace.into(),
        name,
        default_key,
    };
    Ok(OperatorSetup { plugin, mig_strategy })
}

/// Where a cell's pods stand, as both sharing paths' readiness waits read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellCount {
    /// Every pod has come to a state: running, exited or pending.
    pub decided: bool,
    /// Pods pending.
    pub pending: usize,
    /// Pods running.
    pub running: usize,
}

impl CellCount {
    /// Counts `pods`.
    pub fn of(pods: &[CellPod]) -> Self {
        Self {
            decided: pods.iter().all(|p| {
                matches!(
                    p.state,
                    PodState::Running | PodState::Exited { .. } | PodState::Pending(_)
                )
            }),
            pending: pods.iter().filter(|p| matches!(p.state, PodState::Pending(_))).count(),
            running: pods.iter().filter(|p| p.state == PodState::Running).count(),
        }
    }
}

/// The workload namespace `ns` must exist: created when missing if the harness may.
pub async fn ensure_namespace(client: &Client, ns: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    match api.get(ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let obj: Namespace = serde_json::from_value(objects::namespace(ns))
                .map_err(|e| BenchError::kube(format!("internal: namespace object: {e}")))?;
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 403 => Err(BenchError::kube(format!(
                    "namespace {ns} does not exist and the harness may not create it: kubectl create namespace {ns} (or kubectl apply -k manifests/base)"
                ))),
                Err(e) => Err(kube_error(&format!("creating namespace {ns}"), e)),
            }
        }
        Err(e) => Err(kube_error(&format!("reading namespace {ns}"), e)),
    }
}

/// The pods of a sweep's cell (`strategy` × `pods`), not terminating, by name.
pub async fn list_cell_pods(
    api: &Api<Pod>,
    arm: impl Into<crate::domain::Arm>,
    (pods, asked): (u32, u32),
) -> Result<Vec<CellPod>> {
    let selector = format!("{}={}-{pods}", objects::CELL_LABEL, arm.into().name());
    let mut list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| kube_error("listing workload pods", e))?
        .items;
    list.retain(|p| p.metadata.deletion_timestamp.is_none());
    // The ReplicaSet replaces a pod rejected at admission (Failed pods are not
    // active): the rejected one counts only while its replacement is missing.
    let failed = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
    let active = list.iter().filter(|p| !failed(p)).count();
    if active >= asked as usize {
        list.retain(|p| !failed(p));
    }
    list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(list
        .iter()
        .map(|p| CellPod {
            name: p.metadata.name.clone().unwrap_or_default(),
            metrics_url: p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_ref())
                .map(|ip| format!("http://{ip}:{}/metrics", objects::METRICS_PORT)),
            state: pod_state(p),
        })
        .collect())
}

/// Deletes the named workload Deployments in `ns` and waits (at most 120 s; a forced
/// stop ends the wait) until every workload pod and the Deployments themselves are gone.
/// Foreground deletion removes the Deployment only after its ReplicaSets and pods: an
/// apply of the same name before then would land on the terminating object, which the
/// Deployment controller no longer scales, and the next cell would get no pods.
pub async fn delete_workload(
    client: &Client,
    ns: &str,
    names: &[String],
    poll: Duration,
    shutdown: &Shutdown,
) -> Result<()> {
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for name in names {
        match deps.delete(name, &DeleteParams::foreground()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_error(&format!("deleting the workload Deployment {name}"), e)),
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut wait = shutdown.poll(EndsOn::Force, poll, Duration::from_secs(120));
    loop {
        let left = pods
            .list(&ListParams::default().labels(&format!("{}={}", objects::APP_LABEL, objects::APP)))
            .await
            .map_err(|e| kube_error("listing workload pods", e))?;
        let mut deployments = Vec::new();
        for name in names {
            if deps
                .get_opt(name)
                .await
                .map_err(|e| kube_error(&format!("reading the workload Deployment {name}"), e))?
                .is_some()
            {
                deployments.push(name.as_str());
            }
        }
        if left.items.is_empty() && deployments.is_empty() {
            return Ok(());
        }
        let what = || {
            let mut parts = Vec::new();
            if !left.items.is_empty() {
                parts.push(format!("{} workload pods", left.items.len()));
            }
            if !deployments.is_empty() {
                parts.push(format!("Deployment {}", deployments.join(", ")));
            }
            parts.join(" and ")
        };
        match wait.next().await {
            Ok(()) => {}
            Err(Unmet::TimedOut) => {
                return Err(BenchError::kube(format!("{} still exist 120 s after deletion", what())));
            }
            Err(Unmet::Stopped) => {
                return Err(BenchError::kube(format!(
                    "forced stop: {} were still terminating",
                    what()
                )));
            }
        }
    }
}

/// Field managers that may have written a Deployment the harness applies: the harness
/// itself and the Deployment controller (its revision annotation).
const OWN_MANAGERS: [&str; 2] = [objects::FIELD_MANAGER, "kube-controller-manager"];

/// The managers other than the harness's own that wrote a Deployment's spec or metadata.
fn foreign_managers(d: &Deployment) -> BTreeSet<String> {
    d.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref().unwrap_or_default().is_empty())
        .filter_map(|m| m.manager.clone())
        .filter(|m| !OWN_MANAGERS.contains(&m.as_str()))
        .collect()
}

fn foreign_refusal(ns: &str, name: &str, managers: BTreeSet<String>) -> BenchError {
    BenchError::kube(format!(
        "Deployment {ns}/{name} exists with fields written by {} (kubectl apply -k manifests/workload or an overlay, say): the harness makes and deletes this Deployment itself and would not own those fields, so its pods would keep them; delete it first (kubectl delete deployment -n {ns} {name})",
        managers.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// Refuses, before any change, a workload Deployment of one of the harness's names that
/// another manager wrote (see [`ready_to_apply`]).
pub async fn check_workload_deployments(client: &Client, ns: &str) -> Result<()> {
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let names = std::iter::once(objects::APP.to_string())
        .chain(objects::ROLES.iter().map(|r| objects::role_deployment_name(r)));
    for name in names {
        if let Some(d) = deps
            .get_opt(&name)
            .await
            .map_err(|e| kube_error(&format!("reading the workload Deployment {name}"), e))?
        {
            let foreign = foreign_managers(&d);
            if !foreign.is_empty() {
                return Err(foreign_refusal(ns, &name, foreign));
            }
        }
    }
    Ok(())
}

/// Makes sure the harness may apply the workload Deployment `name`: one being deleted is
/// waited out (at most 120 s), and one whose spec another manager wrote (say
/// `kubectl apply -k` of a Deployment by the same name) is refused. Server-side apply
/// removes only fields the same manager applied before (structured-merge-diff
/// `merge/update.go`), so the other manager's fields would stay in the harness's pods (a
/// `nvidia.com/gpu` request beside a DRA claim), and the Deployment is not the harness's
/// to delete.
pub async fn ready_to_apply(client: &Client, ns: &str, name: &str, poll: Duration, shutdown: &Shutdown) -> Result<()> {
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let mut wait = shutdown.poll(EndsOn::Force, poll, Duration::from_secs(120));
    loop {
        let Some(d) = deps
            .get_opt(name)
            .await
            .map_err(|e| kube_error(&format!("reading the workload Deployment {name}"), e))?
        else {
            return Ok(());
        };
        if d.metadata.deletion_timestamp.is_none() {
            let foreign = foreign_managers(&d);
            if foreign.is_empty() {
                return Ok(());
            }
            return Err(foreign_refusal(ns, name, foreign));
        }
        match wait.next().await {
            Ok(()) => {}
            Err(Unmet::TimedOut) => {
                return Err(BenchError::kube(format!(
                    "Deployment {ns}/{name} is still being deleted after 120 s"
                )));
            }
            Err(Unmet::Stopped) => return Err(shutdown.interrupted()),
        }
    }
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RestoreReport {
    /// One line per change undone.
    pub undone: Vec<String>,
    /// Things left alone, and why.
    pub notices: Vec<String>,
}

impl RestoreReport {
    /// What `restore` prints: one line per change undone and per thing left alone, or
    /// that there was nothing to undo on `node`.
    pub fn render(&self, node: &str) -> String {
        let mut text = String::new();
        for line in &self.undone {
            text += &format!("undone: {line}\n");
        }
        for line in &self.notices {
            text += &format!("left alone: {line}\n");
        }
        if text.is_empty() {
            text = format!("node {node}: nothing to undo\n");
        }
        text
    }
}

/// Undoes what a run's journal says the harness changed, and nothing else: deletes the
/// workload Deployments it applied, puts back each label that still holds the value the harness set
/// (waiting for the MIG manager when the MIG layout goes back, and only then removing a
/// device-plugin config label the node did not have), removes each ConfigMap key the
/// harness added whose content is still what it added, and marks the journal restored. A
/// second restore finds nothing to do.
pub async fn restore_from_journal(
    client: &Client,
    path: &std::path::Path,
    s: &KubeSettings,
    shutdown: &Shutdown,
) -> Result<RestoreReport> {
    let mut report = RestoreReport::default();
    let Some(mut j) = journal::read(path)? else {
        return Ok(report);
    };
    let mut problems = Vec::new();
    let ns = if j.workload_namespace.is_empty() {
        s.workload.namespace.clone()
    } else {
        j.workload_namespace.clone()
    };
    if !j.has_changes() {
        return finish(report, problems, &j.node);
    }
    if !j.workload_deployments().is_empty()
        && let Err(e) = delete_workload(client, &ns, &j.workload_deployments(), s.poll, shutdown).await
    {
        problems.push(e.to_string());
    }
    for claim in j.claims.clone() {
        match delete_claim(client, &ns, &claim, s.poll, shutdown).await {
            Err(e) => problems.push(e.to_string()),
            Ok(true) => report.undone.push(format!("deleted {claim} in namespace {ns}")),
            Ok(false) => {}
        }
    }
    if j.labels_set.is_empty() && j.keys_added.is_empty() {
        // Nothing on the node or in the ConfigMap (a sweep through DRA claims).
        if problems.is_empty() {
            j.restored = true;
            journal::write(path, &j)?;
        }
        return finish(report, problems, &j.node);
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .get(&j.node)
        .await
        .map_err(|e| kube_error(&format!("reading node {}", j.node), e))?;
    let restored = restore_labels(&nodes, &node, &j, &mut report).await?;
    if let Some(layout) = &restored.mig_back {
        // The operand pods the MIG manager recreates start with the harness's config
        // label and its ConfigMap keys still in place: a config-manager that starts on an
        // unlabelled node can block for ever in k8s-device-plugin v0.18.1 (UPSTREAM-RULES
        // D5), and one whose label names a removed key fails. Only once the layout is back
        // is the label removed (the running sidecars take that) and then the keys.
        let cm_ns = j.configmap.split_once('/').map_or("gpu-operator", |(ns, _)| ns);
        wait_mig_back(
            client,
            cm_ns,
            &node,
            layout,
            &j,
            s,
            shutdown,
            &mut report,
            &mut problems,
        )
        .await?;
    }
    if !restored.deferred.is_empty() {
        let refs: Vec<(&str, Option<&str>)> = restored.deferred.iter().map(|k| (k.as_str(), None)).collect();
        patch_labels(&nodes, &j.node, &refs, "removing the labels the harness added to").await?;
    }
    remove_added_keys(client, &j, &mut report, &mut problems).await;
    if problems.is_empty() {
        j.restored = true;
        journal::write(path, &j)?;
    }
    finish(report, problems, &j.node)
}

/// What [`restore_labels`] did and left for later.
struct LabelsRestored {
    /// The MIG layout going back, if the MIG label is one of the labels put back.
    mig_back: Option<String>,
    /// The device-plugin config label, to be removed once the MIG layout is back (it
    /// had none before the run).
    deferred: Vec<String>,
}

/// Puts back each label the journal says the harness set and still holds its value. When
/// the MIG layout goes back, a device-plugin config label the node did not have before
/// stays until the layout is back ([`LabelsRestored::deferred`]).
async fn restore_labels(
    nodes: &Api<Node>,
    node: &Node,
    j: &Journal,
    report: &mut RestoreReport,
) -> Result<LabelsRestored> {
    let labels = labels_of(node);
    let mut patch: Vec<(&str, Option<String>)> = Vec::new();
    let mut mig_back: Option<String> = None;
    for (key, set) in &j.labels_set {
        let original = j.original_labels.get(key).cloned().flatten();
        let (action, notice) = journal::label_action(original.as_deref(), set, labels.get(key).map(String::as_str));
        if let Some(n) = notice {
            report.notices.push(format!("node {} label {key} {n}", j.node));
        }
        if let Some(target) = action {
            report.undone.push(format!(
                "node {} label {key}: {} → {}",
                j.node,
                labels.get(key).map_or("(absent)", String::as_str),
                target.as_deref().unwrap_or("(removed)")
            ));
            if key == objects::LABEL_MIG_CONFIG {
                mig_back = Some(target.clone().unwrap_or_else(|| objects::MIG_DISABLED.into()));
            }
            patch.push((key.as_str(), target));
        }
    }
    let mut deferred = Vec::new();
    if mig_back.is_some() {
        patch.retain(|(k, v)| {
            let later = *k == objects::LABEL_PLUGIN_CONFIG && v.is_none();
            if later {
                deferred.push(k.to_string());
            }
            !later
        });
    }
    if !patch.is_empty() {
        let refs: Vec<(&str, Option<&str>)> = patch.iter().map(|(k, v)| (*k, v.as_deref())).collect();
        patch_labels(nodes, &j.node, &refs, "restoring the labels of").await?;
    }
    Ok(LabelsRestored { mig_back, deferred })
}

/// Sets (`Some`) or removes (`None`) labels of `node` in one merge patch; `what` begins
/// the error's message ("… node NAME").
async fn patch_labels(nodes: &Api<Node>, node: &str, labels: &[(&str, Option<&str>)], what: &str) -> Result<()> {
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(objects::node_label_patch(labels)),
        )
        .await
        .map(|_| ())
        .map_err(|e| kube_error(&format!("{what} node {node}"), e))
}

/// Removes the ConfigMap keys the harness added that still hold what it added; returns
/// the operator's namespace (the ConfigMap's).
async fn remove_added_keys(client: &Client, j: &Journal, report: &mut RestoreReport, problems: &mut Vec<String>) {
    // ConfigMap keys the harness added, still as it added them.
    let (cm_ns, cm_name) = j
        .configmap
        .split_once('/')
        .unwrap_or(("gpu-operator", j.configmap.as_str()));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), cm_ns);
    match cms.get(cm_name).await {
        Ok(cm) => {
            let data = cm.data.unwrap_or_default();
            let mut remove = Vec::new();
            for (key, added) in &j.keys_added {
                match data.get(key) {
                    Some(now) if now == added => remove.push((key.clone(), None)),
                    Some(_) => report.notices.push(format!(
                        "ConfigMap {} key {key} was changed since the harness added it; left alone",
                        j.configmap
                    )),
                    None => {}
                }
            }
            if !remove.is_empty() {
                match cms
                    .patch(
                        cm_name,
                        &PatchParams::default(),
                        &Patch::Merge(objects::configmap_keys_patch(&remove)),
                    )
                    .await
                {
                    Ok(_) => report.undone.push(format!(
                        "ConfigMap {}: removed the {} keys the harness added",
                        j.configmap,
                        remove.len()
                    )),
                    Err(e) => problems
                        .push(kube_error(&format!("removing the harness's keys from {}", j.configmap), e).to_string()),
                }
            }
        }
        Err(kube::Error::Api(st)) if st.code == 404 => {}
        Err(e) => problems.push(kube_error(&format!("reading ConfigMap {}", j.configmap), e).to_string()),
    }
}

/// A MIG layout going back is done when mig-parted says so *after* seeing it (a
/// `success` or `failed` left from before is stale), GFD shows it and a device-plugin
/// pod started after the change serves it.
#[allow(clippy::too_many_arguments)]
async fn wait_mig_back(
    client: &Client,
    cm_ns: &str,
    node: &Node,
    layout: &str,
    j: &Journal,
    s: &KubeSettings,
    shutdown: &Shutdown,
    report: &mut RestoreReport,
    problems: &mut Vec<String>,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mig_strategy = operator_setup(client.clone(), cm_ns)
        .await
        .map(|o| o.mig_strategy)
        .unwrap_or_else(|_| "single".into());
    let fresh = |list: &[Pod]| -> Vec<String> {
        list.iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(j.node.as_str()))
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|p| p.metadata.uid.clone())
            .collect()
    };
    let operands: Api<Pod> = Api::namespaced(client.clone(), cm_ns);
    let plugin_pods = ListParams::default().labels(&format!("app={}", objects::APP_PLUGIN));
    let before: Vec<String> = operands
        .list(&plugin_pods)
        .await
        .map(|l| fresh(&l.items))
        .unwrap_or_default();
    // GPUs already in the layout (the harness's change never took): nothing restarts.
    let already = mig_shown(node, layout, &mig_strategy);
    let mut wait = shutdown.poll(EndsOn::Force, s.poll, s.mig_timeout);
    let mut saw_pending = false;
    loop {
        let n = nodes
            .get(&j.node)
            .await
            .map_err(|e| kube_error(&format!("reading node {}", j.node), e))?;
        let l = labels_of(&n);
        let state = l.get(objects::LABEL_MIG_STATE).map(String::as_str);
        saw_pending |= state == Some("pending");
        if state == Some("success") && mig_shown(&n, layout, &mig_strategy) {
            let now: Vec<String> = operands
                .list(&plugin_pods)
                .await
                .map(|l| fresh(&l.items))
                .unwrap_or_default();
            if already || now.iter().any(|u| !before.contains(u)) {
                report
                    .undone
                    .push(format!("node {}: MIG layout {layout} applied again", j.node));
                break;
            }
        }
        if state == Some("failed") && saw_pending {
            problems.push(format!(
                "the MIG manager failed to put layout {layout} back on node {} (kubectl -n {cm_ns} logs -l app=nvidia-mig-manager){}",
                j.node,
                paused_note(&l)
            ));
            break;
        }
        match wait.next().await {
            Ok(()) => {}
            Err(Unmet::TimedOut) => {
                problems.push(format!(
                    "node {} has not finished going back to MIG layout {layout} after {} s (state {}){}",
                    j.node,
                    s.mig_timeout.as_secs(),
                    state.unwrap_or("absent"),
                    paused_note(&l)
                ));
                break;
            }
            Err(Unmet::Stopped) => {
                problems.push(format!(
                    "forced stop while node {} was going back to MIG layout {layout}",
                    j.node
                ));
                break;
            }
        }
    }
    Ok(())
}

/// Deploy labels mig-parted left paused (v0.13.1 `reconfigure.go`: after its first
/// successful change a later failure no longer restores them, `NoRestartK8sDaemonsetsOnExit`).
pub fn paused_note(labels: &BTreeMap<String, String>) -> String {
    let paused: Vec<&str> = labels
        .iter()
        .filter(|(k, v)| k.starts_with("nvidia.com/gpu.deploy.") && v.as_str() == "paused-for-mig-change")
        .map(|(k, _)| k.as_str())
        .collect();
    if paused.is_empty() {
        String::new()
    } else {
        format!(
            "; {} still paused-for-mig-change: the device plugin and GFD stay down until they are set back to true",
            paused.join(", ")
        )
    }
}

fn finish(report: RestoreReport, problems: Vec<String>, node: &str) -> Result<RestoreReport> {
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(BenchError::kube(format!(
            "restoring node {node}: {}",
            problems.join("; ")
        )))
    }
}

/// A `resource.k8s.io/v1` resource of the workload namespace, or cluster-wide.
pub fn resource_api(client: &Client, ns: Option<&str>, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// The claim resources the harness creates: (plural, kind).
pub const CLAIM_KINDS: [(&str, &str); 2] = [
    ("resourceclaims", "ResourceClaim"),
    ("resourceclaimtemplates", "ResourceClaimTemplate"),
];

/// Deletes a claim or claim template (`resourceclaims/NAME`) in `ns` and waits, at most
/// 120 s, until it is gone: a claim stays while pods reserve it (its finalizer goes
/// once the resourceclaim controller has deallocated it), and the next cell's claim can
/// have its device only then. A forced stop ends the wait. Ok(false): it was not there.
pub async fn delete_claim(client: &Client, ns: &str, entry: &str, poll: Duration, shutdown: &Shutdown) -> Result<bool> {
    let (plural, name) = entry
        .split_once('/')
        .ok_or_else(|| BenchError::kube(format!("internal: {entry:?} is not a claim of the journal")))?;
    let Some((_, kind)) = CLAIM_KINDS.iter().find(|(p, _)| *p == plural) else {
        return Err(BenchError::kube(format!(
            "internal: {entry:?} is not a claim of the journal"
        )));
    };
    let api = resource_api(client, Some(ns), kind, plural);
    match api.delete(name, &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
        Err(e) => return Err(kube_error(&format!("deleting {entry} in namespace {ns}"), e)),
    }
    let mut wait = shutdown.poll(EndsOn::Force, poll, Duration::from_secs(120));
    loop {
        let reserved = match api.get(name).await {
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(true),
            Err(e) => return Err(kube_error(&format!("reading {entry} in namespace {ns}"), e)),
            Ok(o) => o.data["status"]["reservedFor"].as_array().map_or(0, Vec::len),
        };
        match wait.next().await {
            Ok(()) => {}
            Err(Unmet::TimedOut) => {
                return Err(BenchError::kube(format!(
                    "{entry} in namespace {ns} still exists 120 s after deletion ({reserved} pods reserve it)"
                )));
            }
            Err(Unmet::Stopped) => {
                return Err(BenchError::kube(format!(
                    "forced stop: {entry} in namespace {ns} was still being deleted"
                )));
            }
        }
    }
}
