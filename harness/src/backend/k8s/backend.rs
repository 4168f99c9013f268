//! The Kubernetes backend: switches one single-GPU node between strategies through the
//! GPU operator (the device-plugin ConfigMap its ClusterPolicy names, the node's
//! `nvidia.com/device-plugin.config` and `nvidia.com/mig.config` labels), runs each cell
//! as the workload Deployment scaled to N and pinned to the node, and puts back exactly
//! what it changed, from the restore journal in the run directory.
//!
//! The switching rules come from the operator's components (UPSTREAM-RULES.md): a shared
//! entry needs ≥ 2 replicas (B2); a new ConfigMap key reaches the config-managers only
//! after the kubelet projects it (A5, D4), so every key is added up front and relabelling
//! waits for the projection; a switch is done when GFD's labels and the allocatable GPUs
//! show the entry and stay so (C1, H12); the MPS daemon only takes a new replica count
//! when its pod is recreated (H10), so MPS cells pass through a non-MPS entry; MIG is
//! done when mig-parted says `success` *and* GFD shows the MIG devices and a fresh device
//! plugin serves them (F2, C2, C3), and is turned off (`all-disabled`) before any other
//! strategy (B6).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;
use tokio::time::Instant;

use super::journal::{self, Journal};
use super::objects::{self, PluginConfigMap, WorkloadSpec};
use super::trial::{self, TrialCell};
use crate::backend::{Backend, CellSetup, Pod as CellPod, PodSpec, PodState, Prepared};
use crate::domain::Strategy;
use crate::error::{BenchError, Result};
use crate::shutdown::Shutdown;

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

/// Turns a kube error into one line naming what was being done.
pub fn kube_error(what: &str, e: kube::Error) -> BenchError {
    let detail = match &e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "forbidden: {} (the harness's user or service account lacks RBAC permission; manifests/base/rbac.yaml lists what it needs, `gpushare-bench doctor --kubernetes --node NODE` checks it)",
            s.message
        ),
        kube::Error::Api(s) if s.code == 404 => format!("not found: {}", s.message),
        kube::Error::Api(s) => format!("{} ({}): {}", s.code, s.reason, s.message),
        other => other.to_string(),
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

fn labels_of(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

/// The node's allocatable count of an extended resource (pure).
pub fn allocatable(node: &Node, resource: &str) -> Option<u32> {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(resource))
        .and_then(|q| q.0.parse().ok())
}

/// Whether the node serves a device-plugin entry (pure): GFD's labels for it
/// ([`objects::expected_plugin_labels`]) and `gpus × replicas` allocatable GPUs.
pub fn plugin_switched(node: &Node, strategy: Strategy, replicas: u32, gpus: u32) -> bool {
    let labels = labels_of(node);
    let product = labels.get(objects::LABEL_PRODUCT).cloned().unwrap_or_default();
    if product.contains("-MIG-") {
        return false;
    }
    let expected = objects::expected_plugin_labels(strategy, replicas, &product);
    let per_gpu = if matches!(strategy, Strategy::TimeSlicing | Strategy::Mps) {
        replicas
    } else {
        1
    };
    expected.iter().all(|(k, v)| labels.get(*k) == Some(v))
        && allocatable(node, "nvidia.com/gpu") == Some(gpus * per_gpu)
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

/// How long the last switch took, for the cell's row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SwitchCost {
    /// The device-plugin entry the cell ran under (or the MIG layout).
    pub config: String,
    /// Time from the first change to the node serving it, seconds (0: already set).
    pub switch_s: Option<f64>,
    /// Of which the MIG reconfiguration, seconds.
    pub mig_s: Option<f64>,
    /// Time from launch to every pod ready, seconds.
    pub pods_ready_s: Option<f64>,
}

/// Where the node is.
#[derive(Debug, Clone, PartialEq)]
enum Target {
    Plugin(Strategy, u32),
    Mig(String),
}

/// Pods on one Kubernetes GPU node.
pub struct KubernetesBackend {
    client: Client,
    s: KubeSettings,
    setup: Option<OperatorSetup>,
    journal_path: Option<PathBuf>,
    journal: Option<Journal>,
    keys_ready: bool,
    configured: Option<Target>,
    cell: Option<(Strategy, u32)>,
    cell_launched: Option<(Strategy, u32)>,
    launched_at: Option<Instant>,
    cost: SwitchCost,
    /// Whether `cost` was already recorded for a cell.
    cost_used: bool,
    /// The extended resource the cell's pods request.
    resource: String,
    /// The isolation trial launched (pods with their own arguments), if any.
    trial: Option<TrialCell>,
    /// The workload Deployments the current cell applied.
    applied: Vec<String>,
}

impl std::fmt::Debug for KubernetesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KubernetesBackend(node {})", self.s.node)
    }
}

/// The ClusterPolicy resource (nvidia.com/v1, cluster-scoped).
fn cluster_policies(client: Client) -> Api<DynamicObject> {
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

impl KubernetesBackend {
    /// A backend on an existing client (the kubeconfig's, or a simulated cluster's).
    pub fn new(client: Client, s: KubeSettings) -> Self {
        Self {
            client,
            s,
            setup: None,
            journal_path: None,
            journal: None,
            keys_ready: false,
            configured: None,
            cell: None,
            cell_launched: None,
            launched_at: None,
            cost: SwitchCost::default(),
            cost_used: false,
            resource: String::new(),
            trial: None,
            applied: Vec::new(),
        }
    }

    /// Connects with the local kubeconfig or the in-cluster service account.
    pub async fn connect(s: KubeSettings) -> Result<Self> {
        let client = Client::try_default()
            .await
            .map_err(|e| kube_error("connecting to the cluster (kubeconfig or in-cluster config)", e))?;
        Ok(Self::new(client, s))
    }

    /// Sets the arguments of the workload pods.
    pub fn set_workload_args(&mut self, args: Vec<String>) {
        self.s.workload.args = args;
    }

    /// Sets the user's own server the pods run (the recorded one when resuming).
    pub fn set_server(&mut self, server: Option<super::objects::OwnServer>) {
        self.s.workload.server = server;
    }

    /// Sets the image an isolation trial's aggressors run beside a server of the user's
    /// own (the recorded one when resuming).
    pub fn set_aggressor_image(&mut self, image: &str) {
        self.s.aggressor_image = image.to_string();
    }

    /// The client (shared with the port-forward).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The last switch's cost.
    pub fn switch_cost(&self) -> &SwitchCost {
        &self.cost
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.s.workload.namespace)
    }

    fn setup(&self) -> Result<&OperatorSetup> {
        self.setup
            .as_ref()
            .ok_or_else(|| BenchError::kube("internal: the operator set-up was not read before the sweep"))
    }

    /// Reads what the sweep depends on and refuses clearly what it cannot handle: the
    /// ClusterPolicy's device-plugin ConfigMap (which must exist), and a node with
    /// exactly one GPU. Returns the node's labels.
    pub async fn check_cluster(&mut self) -> Result<BTreeMap<String, String>> {
        let setup = operator_setup(self.client.clone(), &self.s.operator_namespace).await?;
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &setup.plugin.namespace);
        match cms.get(&setup.plugin.name).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(BenchError::kube(format!(
                    "the ClusterPolicy names device-plugin ConfigMap {}, which does not exist; create it (kubectl apply -f manifests/device-plugin-config.yaml) or pass --operator-namespace",
                    setup.plugin.id()
                )));
            }
            Err(e) => return Err(kube_error(&format!("reading ConfigMap {}", setup.plugin.id()), e)),
        }
        self.setup = Some(setup);
        // GFD's labels are gone while GFD is down (a MIG change pauses it; NFD drops the
        // labels of a GFD that exited): wait for them while that is why.
        let deadline = Instant::now() + self.s.mig_timeout;
        let labels = loop {
            let labels = labels_of(&self.read_node().await?);
            let gfd_paused = labels
                .get("nvidia.com/gpu.deploy.gpu-feature-discovery")
                .is_some_and(|v| v == "paused-for-mig-change");
            let mig_pending = labels.get(objects::LABEL_MIG_STATE).is_some_and(|v| v == "pending");
            if labels.contains_key(objects::LABEL_GPU_COUNT)
                || !(gfd_paused || mig_pending)
                || Instant::now() > deadline
            {
                break labels;
            }
            tracing::info!(
                "node {}: a MIG change is under way; waiting for GPU feature discovery's labels",
                self.s.node
            );
            tokio::time::sleep(self.s.poll).await;
        };
        let gpus = objects::physical_gpus(&labels);
        if gpus > 1 {
            return Err(BenchError::kube(format!(
                "node {} has {gpus} GPUs: the device plugin shares every GPU of a node and spreads replicas across them (k8s-device-plugin v0.18.1 internal/rm/allocate.go distributedAlloc), so N pods would not share one GPU; use a node with one GPU",
                self.s.node
            )));
        }
        Ok(labels)
    }

    /// Uses `dir`'s restore journal (resume: the originals recorded by the first run).
    pub fn attach_journal(&mut self, dir: &std::path::Path) -> Result<()> {
        let (path, j) = journal::attach(dir, &self.s.node)?;
        self.journal = j;
        self.journal_path = Some(path);
        Ok(())
    }

    async fn read_node(&self) -> Result<Node> {
        self.nodes()
            .get(&self.s.node)
            .await
            .map_err(|e| kube_error(&format!("reading node {}", self.s.node), e))
    }

    /// The journal, created (and written) from the node's current labels on first use.
    async fn journal(&mut self) -> Result<&mut Journal> {
        if self.journal.is_none() {
            let labels = labels_of(&self.read_node().await?);
            let original = [objects::LABEL_PLUGIN_CONFIG, objects::LABEL_MIG_CONFIG]
                .iter()
                .map(|k| ((*k).to_string(), labels.get(*k).cloned()))
                .collect();
            let mut j = Journal::new(&self.s.node, &self.setup()?.plugin.id(), original);
            j.workload_namespace = self.s.workload.namespace.clone();
            self.write_journal_value(&j)?;
            self.journal = Some(j);
        }
        self.journal
            .as_mut()
            .ok_or_else(|| BenchError::kube("internal: no journal"))
    }

    fn write_journal_value(&self, j: &Journal) -> Result<()> {
        match &self.journal_path {
            Some(p) => journal::write(p, j),
            None => Err(BenchError::kube("internal: no run directory for the restore journal")),
        }
    }

    fn save_journal(&self) -> Result<()> {
        match &self.journal {
            Some(j) => self.write_journal_value(j),
            None => Ok(()),
        }
    }

    /// Sets a node label, journaled before the patch.
    async fn set_label(&mut self, key: &str, value: &str) -> Result<()> {
        let j = self.journal().await?;
        j.restored = false;
        let values = j.labels_set.entry(key.into()).or_default();
        if !values.iter().any(|v| v == value) {
            values.push(value.into());
        }
        self.save_journal()?;
        self.nodes()
            .patch(
                &self.s.node,
                &PatchParams::default(),
                &Patch::Merge(objects::node_label_patch(&[(key, Some(value))])),
            )
            .await
            .map(|_| ())
            .map_err(|e| kube_error(&format!("labelling node {} {key}={value}", self.s.node), e))
    }

    /// The entries (key, content) the sweep needs.
    fn entries(&self) -> Vec<(String, String)> {
        let mut out = vec![(
            objects::config_entry_name(Strategy::Exclusive, 1),
            objects::device_plugin_config(Strategy::Exclusive, 1),
        )];
        let max = self.s.pods.iter().copied().max().unwrap_or(1);
        for &strategy in &self.s.strategies {
            let replicas: Vec<u32> = match strategy {
                Strategy::TimeSlicing => vec![objects::sharing_replicas(max)],
                Strategy::Mps => self.s.pods.iter().map(|&p| objects::sharing_replicas(p)).collect(),
                _ => Vec::new(),
            };
            for r in replicas {
                let e = (
                    objects::config_entry_name(strategy, r),
                    objects::device_plugin_config(strategy, r),
                );
                if !out.contains(&e) {
                    out.push(e);
                }
            }
        }
        out
    }

    /// Adds every entry the sweep needs to the ConfigMap in one patch, before the first
    /// relabel, then waits for the kubelet to project them (a config-manager that sees a
    /// label before its file exits and backs off, D4). A key that exists with the same
    /// content is used as is; one with other content is the user's: refused, never
    /// overwritten.
    async fn ensure_entries(&mut self, shutdown: &Shutdown) -> Result<()> {
        if self.keys_ready {
            return Ok(());
        }
        let plugin = self.setup()?.plugin.clone();
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &plugin.namespace);
        let cm = cms
            .get(&plugin.name)
            .await
            .map_err(|e| kube_error(&format!("reading ConfigMap {}", plugin.id()), e))?;
        let data = cm.data.unwrap_or_default();
        let mut add = Vec::new();
        for (key, content) in self.entries() {
            match data.get(&key) {
                Some(have) if *have == content => {}
                Some(_) => {
                    return Err(BenchError::kube(format!(
                        "ConfigMap {} already has a key {key} with other content; the harness never changes a key it did not add (rename or remove yours)",
                        plugin.id()
                    )));
                }
                None => add.push((key, content)),
            }
        }
        if !add.is_empty() {
            let j = self.journal().await?;
            j.restored = false;
            for (k, v) in &add {
                j.keys_added.insert(k.clone(), v.clone());
            }
            self.save_journal()?;
            let patch: Vec<(String, Option<String>)> = add.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
            cms.patch(
                &plugin.name,
                &PatchParams::default(),
                &Patch::Merge(objects::configmap_keys_patch(&patch)),
            )
            .await
            .map_err(|e| kube_error(&format!("adding {} entries to ConfigMap {}", add.len(), plugin.id()), e))?;
            tracing::info!(
                "added {} entries to {}; waiting {} s for the kubelet to project them",
                add.len(),
                plugin.id(),
                self.s.projection_wait.as_secs()
            );
            shutdown.sleep(self.s.projection_wait).await?;
        }
        self.keys_ready = true;
        Ok(())
    }

    /// Operand pods of the node with `app=<app>` in the operator's namespace:
    /// (uid, running and ready).
    async fn operand_pods(&self, app: &str) -> Result<Vec<(String, bool)>> {
        let ns = &self.setup()?.plugin.namespace;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let list = pods
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .map_err(|e| kube_error(&format!("listing {app} pods in {ns}"), e))?;
        Ok(list
            .items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.s.node.as_str()))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| {
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                (p.metadata.uid.clone().unwrap_or_default(), ready)
            })
            .collect())
    }

    /// Polls until `done` has held for `settle` (or the node fails), at most `timeout`.
    async fn wait_until<F>(
        &self,
        what: &str,
        timeout: Duration,
        settle: Duration,
        shutdown: &Shutdown,
        mut done: F,
    ) -> Result<()>
    where
        F: AsyncFnMut(&Node) -> Result<bool>,
    {
        let start = Instant::now();
        let mut held_since: Option<Instant> = None;
        loop {
            let node = shutdown.guard(self.read_node()).await?;
            if done(&node).await? {
                let since = *held_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= settle {
                    return Ok(());
                }
            } else {
                held_since = None;
            }
            if start.elapsed() > timeout {
                let labels = labels_of(&node);
                let shown: Vec<String> = labels
                    .iter()
                    .filter(|(k, _)| k.starts_with("nvidia.com/") && !k.starts_with("nvidia.com/gpu.deploy."))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let operands = self.operand_summary().await;
                return Err(BenchError::kube(format!(
                    "node {} did not {what} within {} s (allocatable nvidia.com/gpu {}; its nvidia.com labels: {}){operands}",
                    self.s.node,
                    timeout.as_secs(),
                    allocatable(&node, "nvidia.com/gpu").map_or("absent".into(), |n| n.to_string()),
                    shown.join(", ")
                )));
            }
            shutdown.sleep(self.s.poll).await?;
        }
    }

    /// The operator's pods on the node that are not ready, and why (for timeouts).
    async fn operand_summary(&self) -> String {
        let Ok(setup) = self.setup() else { return String::new() };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &setup.plugin.namespace);
        let Ok(list) = pods.list(&ListParams::default()).await else {
            return String::new();
        };
        let bad: Vec<String> = list
            .items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.s.node.as_str()))
            .filter_map(|p| {
                let cs = p.status.as_ref()?.container_statuses.as_ref()?;
                let w = cs.iter().find_map(|c| c.state.as_ref()?.waiting.clone())?;
                Some(format!(
                    "{}: {} {}",
                    p.metadata.name.clone().unwrap_or_default(),
                    w.reason.unwrap_or_default(),
                    w.message.unwrap_or_default()
                ))
            })
            .collect();
        if bad.is_empty() {
            String::new()
        } else {
            format!("; operator pods not ready: {}", bad.join("; "))
        }
    }

    fn current_entry(labels: &BTreeMap<String, String>) -> Option<String> {
        labels.get(objects::LABEL_PLUGIN_CONFIG).cloned()
    }

    fn mig_active(labels: &BTreeMap<String, String>) -> bool {
        labels
            .get(objects::LABEL_MIG_CONFIG)
            .is_some_and(|v| v != objects::MIG_DISABLED)
            || labels.get(objects::LABEL_PRODUCT).is_some_and(|p| p.contains("-MIG-"))
    }

    /// Switches the node's device plugin to `strategy` with `replicas` per GPU: MIG off
    /// first, and for MPS through a non-MPS entry when an MPS daemon is running (it only
    /// takes a new replica count when its pod is recreated, H10).
    async fn switch_plugin(&mut self, strategy: Strategy, replicas: u32, shutdown: &Shutdown) -> Result<()> {
        let target = Target::Plugin(strategy, replicas);
        if self.configured.as_ref() == Some(&target) {
            self.cost = SwitchCost {
                config: objects::config_entry_name(strategy, replicas),
                switch_s: Some(0.0),
                ..SwitchCost::default()
            };
            self.cost_used = false;
            return Ok(());
        }
        let start = Instant::now();
        self.ensure_entries(shutdown).await?;
        let labels = labels_of(&self.read_node().await?);
        let mut mig_s = None;
        if Self::mig_active(&labels) {
            let t = Instant::now();
            self.switch_mig(objects::MIG_DISABLED, shutdown).await?;
            mig_s = Some(t.elapsed().as_secs_f64());
        }
        if strategy == Strategy::Mps && !self.operand_pods(objects::APP_MPS_DAEMON).await?.is_empty() {
            self.plugin_entry(Strategy::Exclusive, 1, shutdown).await?;
        }
        self.plugin_entry(strategy, replicas, shutdown).await?;
        self.configured = Some(target);
        self.cost = SwitchCost {
            config: objects::config_entry_name(strategy, replicas),
            switch_s: Some(start.elapsed().as_secs_f64()),
            mig_s,
            pods_ready_s: None,
        };
        self.cost_used = false;
        Ok(())
    }

    /// Points the node at one entry and waits until it is served (and, for MPS, by a
    /// freshly started daemon; after MPS, until the daemon pod is gone).
    async fn plugin_entry(&mut self, strategy: Strategy, replicas: u32, shutdown: &Shutdown) -> Result<()> {
        let entry = objects::config_entry_name(strategy, replicas);
        let daemons_before: BTreeSet<String> = self
            .operand_pods(objects::APP_MPS_DAEMON)
            .await?
            .into_iter()
            .map(|(uid, _)| uid)
            .collect();
        let labels = labels_of(&self.read_node().await?);
        if Self::current_entry(&labels).as_deref() != Some(entry.as_str()) {
            self.set_label(objects::LABEL_PLUGIN_CONFIG, &entry).await?;
        }
        let gpus = 1;
        let what = format!("switch to {entry} ({} with {replicas} replica(s))", strategy.name());
        let settle = self.s.settle;
        self.wait_until(&what, self.s.switch_timeout, settle, shutdown, async |n: &Node| {
            if !plugin_switched(n, strategy, replicas, gpus) {
                return Ok(false);
            }
            let daemons = self.operand_pods(objects::APP_MPS_DAEMON).await?;
            Ok(if strategy == Strategy::Mps {
                daemons
                    .iter()
                    .any(|(uid, ready)| *ready && !daemons_before.contains(uid))
            } else {
                daemons.is_empty()
            })
        })
        .await
    }

    /// Sets the MIG layout and waits until mig-parted reports `success`, GFD shows the
    /// layout and a device-plugin pod started after the change serves it.
    async fn switch_mig(&mut self, layout: &str, shutdown: &Shutdown) -> Result<()> {
        let uids = |pods: Vec<(String, bool)>| -> BTreeSet<String> { pods.into_iter().map(|(uid, _)| uid).collect() };
        let plugins_before = uids(self.operand_pods(objects::APP_PLUGIN).await?);
        let gfd_before = uids(self.operand_pods(objects::APP_GFD).await?);
        let before = self.read_node().await?;
        let labels = labels_of(&before);
        // Already in the layout: mig-parted answers `success` at once and restarts nothing.
        let already = mig_shown(&before, layout, &self.setup()?.mig_strategy);
        let changed = labels.get(objects::LABEL_MIG_CONFIG).map(String::as_str) != Some(layout) && !already;
        // mig-parted reports `success` with nothing changed when no entry of the layout
        // matches the GPU (F4): fresh operands that still show whole GPUs say so.
        let mut unsplit_since: Option<Instant> = None;
        let give_up_after = self.s.settle * 3;
        if labels.get(objects::LABEL_MIG_CONFIG).map(String::as_str) != Some(layout) {
            self.set_label(objects::LABEL_MIG_CONFIG, layout).await?;
        }
        let node = self.s.node.clone();
        let strategy = self.setup()?.mig_strategy.clone();
        let what = format!("apply MIG layout {layout} (mig-parted, then GFD and the device plugin)");
        self.wait_until(&what, self.s.mig_timeout, self.s.settle, shutdown, async |n: &Node| {
            let labels = labels_of(n);
            match labels.get(objects::LABEL_MIG_STATE).map(String::as_str) {
                Some("failed") if labels.get(objects::LABEL_MIG_CONFIG).map(String::as_str) == Some(layout) => {
                    return Err(BenchError::kube(format!(
                        "the MIG manager could not apply {layout} on node {node} ({}=failed; its log says why: kubectl -n {} logs -l app=nvidia-mig-manager){}",
                        objects::LABEL_MIG_STATE,
                        self.s.operator_namespace,
                        paused_note(&labels)
                    )));
                }
                Some("success") => {}
                _ => return Ok(false),
            }
            let plugins = self.operand_pods(objects::APP_PLUGIN).await?;
            let fresh_plugin = plugins.iter().any(|(uid, ready)| *ready && (!changed || !plugins_before.contains(uid)));
            if !mig_shown(n, layout, &strategy) {
                let product = labels.get(objects::LABEL_PRODUCT).cloned().unwrap_or_default();
                let gfd = self.operand_pods(objects::APP_GFD).await?;
                let fresh_gfd = gfd.iter().any(|(uid, ready)| *ready && !gfd_before.contains(uid));
                if changed && objects::mig_profile(layout).is_some() && fresh_plugin && fresh_gfd && !product.is_empty() && !product.contains("-MIG-") {
                    let since = *unsplit_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > give_up_after {
                        return Err(BenchError::kube(format!(
                            "the MIG manager reported success for {layout} on node {node}, but its GPUs are still whole ({product}): no entry of that layout matches this GPU (mig-parted applies nothing then); pass --mig-layout with a layout for it (H100 NVL and GH200: all-1g.12gb, H200: all-1g.18gb)"
                        )));
                    }
                } else {
                    unsplit_since = None;
                }
                return Ok(false);
            }
            Ok(fresh_plugin)
        })
        .await
    }

    fn mig_layout(&self, labels: &BTreeMap<String, String>) -> Option<String> {
        self.s.mig_layout.clone().or_else(|| {
            labels
                .get(objects::LABEL_PRODUCT)
                .and_then(|p| objects::default_mig_layout(p.split("-MIG-").next().unwrap_or(p)))
                .map(String::from)
        })
    }

    /// Deletes the cell's Deployments and waits (at most 120 s; a forced stop ends the
    /// wait) until their pods are gone.
    async fn delete_deployment(&mut self, shutdown: &Shutdown) -> Result<()> {
        let names = if self.applied.is_empty() {
            vec![objects::APP.to_string()]
        } else {
            self.applied.clone()
        };
        delete_workload(&self.client, &self.s.workload.namespace, &names, self.s.poll, shutdown).await?;
        self.applied.clear();
        Ok(())
    }

    /// Readies the node for a cell of `pods` pods under `strategy` (MPS: the entry for
    /// their count) and returns the extended resource they request.
    async fn begin_cell(&mut self, strategy: Strategy, pods: u32, shutdown: &Shutdown) -> Result<String> {
        self.cell_launched = Some((strategy, pods));
        if strategy == Strategy::Mps {
            self.switch_plugin(strategy, objects::sharing_replicas(pods), shutdown)
                .await?;
        } else if self.cost_used {
            // Prepared once for the strategy: this cell did not switch.
            self.cost.switch_s = Some(0.0);
            self.cost.mig_s = None;
        }
        self.cost_used = true;
        self.cost.pods_ready_s = None;
        let layout = match &self.configured {
            Some(Target::Mig(l)) => Some(l.clone()),
            _ => None,
        };
        let resource = objects::pod_resource(strategy, Some(self.setup()?.mig_strategy.as_str()), layout.as_deref());
        self.resource = resource.clone();
        Ok(resource)
    }

    /// Applies one workload Deployment by server-side apply, journaled first.
    async fn apply_deployment(&mut self, name: &str, object: Value, what: &str) -> Result<()> {
        let j = self.journal().await?;
        let sweep = name == objects::APP;
        let known = if sweep {
            j.deployment
        } else {
            j.deployments.contains(name)
        };
        if !known || j.restored {
            if sweep {
                j.deployment = true;
            } else {
                j.deployments.insert(name.to_string());
            }
            j.restored = false;
            self.save_journal()?;
        }
        if !self.applied.iter().any(|n| n == name) {
            self.applied.push(name.to_string());
        }
        let deps: Api<Deployment> = Api::namespaced(self.client.clone(), &self.s.workload.namespace);
        deps.patch(
            name,
            &PatchParams::apply(objects::FIELD_MANAGER).force(),
            &Patch::Apply(object),
        )
        .await
        .map(|_| ())
        .map_err(|e| kube_error(&format!("applying the workload Deployment {name} ({what})"), e))
    }

    /// The trial's pods in the namespace, not terminating.
    async fn trial_pods(&self) -> Result<Vec<Pod>> {
        trial_pods(&self.pods()).await
    }

    async fn cell_pods(&mut self) -> Result<Vec<CellPod>> {
        let Some((strategy, pods)) = self.cell else {
            return Ok(Vec::new());
        };
        let api = self.pods();
        match self.trial.as_mut() {
            Some(t) => trial_cell_pods(&api, t).await,
            None => list_cell_pods(&api, strategy, pods).await,
        }
    }

    /// The workload namespace must exist: created when missing if the harness may.
    async fn ensure_namespace(&self) -> Result<()> {
        ensure_namespace(&self.client, &self.s.workload.namespace).await
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
pub async fn list_cell_pods(api: &Api<Pod>, arm: impl Into<crate::domain::Arm>, pods: u32) -> Result<Vec<CellPod>> {
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
    if active >= pods as usize {
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

/// An isolation trial's pods in `pods`' namespace, not terminating.
pub async fn trial_pods(pods: &Api<Pod>) -> Result<Vec<Pod>> {
    let selector = format!("{}={},{}", objects::APP_LABEL, objects::APP, objects::ROLE_LABEL);
    let mut list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| kube_error("listing the trial's pods", e))?
        .items;
    list.retain(|p| p.metadata.deletion_timestamp.is_none());
    Ok(list)
}

/// The trial's pods by the trial's names (each Kubernetes pod named when first seen).
pub async fn trial_cell_pods(pods: &Api<Pod>, t: &mut TrialCell) -> Result<Vec<CellPod>> {
    let list = trial_pods(pods).await?;
    t.name_pods(&list);
    Ok(t.cell_pods(&list))
}

/// Waits until the victim's pod is bound to the node, or cannot be (unschedulable,
/// rejected), at most `limit`: the scheduler takes pods of equal priority in the order
/// they entered its queue, which is not the order the ReplicaSets create them
/// (UPSTREAM-RULES.md I1), so the aggressors are applied only after this.
pub async fn wait_victim_bound(pods: &Api<Pod>, s: &KubeSettings, limit: Duration, shutdown: &Shutdown) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let list = shutdown.guard(trial_pods(pods)).await?;
        let decided = list.iter().any(|p| {
            let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            bound || matches!(pod_state(p), PodState::Pending(_) | PodState::Exited { .. })
        });
        if decided {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Spawn {
                pod: "victim".into(),
                reason: format!(
                    "its pod was not bound to node {} within {} s, so the aggressors were not started (the scheduler could give them the GPU first)",
                    s.node,
                    limit.as_secs()
                ),
            });
        }
        shutdown.sleep(s.poll).await?;
    }
}

/// Deletes the named workload Deployments in `ns` and waits (at most 120 s; a forced
/// stop ends the wait) until every workload pod is gone.
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
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = pods
            .list(&ListParams::default().labels(&format!("{}={}", objects::APP_LABEL, objects::APP)))
            .await
            .map_err(|e| kube_error("listing workload pods", e))?;
        if left.items.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::kube(format!(
                "{} workload pods still exist 120 s after deletion",
                left.items.len()
            )));
        }
        if shutdown.is_forced() {
            return Err(BenchError::kube(format!(
                "forced stop: {} workload pods were still terminating",
                left.items.len()
            )));
        }
        shutdown.grace(poll).await;
    }
}

impl Backend for KubernetesBackend {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn prepare(&mut self, arm: crate::domain::Arm, shutdown: &Shutdown) -> Result<Prepared> {
        // A time-slice interval is DRA's: the plan gives one to no other backend.
        let strategy = arm.strategy;
        shutdown.guard(self.ensure_namespace()).await?;
        let labels = labels_of(&shutdown.guard(self.read_node()).await?);
        match strategy {
            Strategy::Mig => {
                if labels.get(objects::LABEL_MIG_CAPABLE).map(String::as_str) != Some("true") {
                    return Ok(Prepared::Unavailable(format!(
                        "node {} has no MIG-capable GPU ({}={})",
                        self.s.node,
                        objects::LABEL_MIG_CAPABLE,
                        labels.get(objects::LABEL_MIG_CAPABLE).map_or("absent", String::as_str)
                    )));
                }
                let Some(layout) = self.mig_layout(&labels) else {
                    return Ok(Prepared::Unavailable(format!(
                        "no default MIG layout for {}; pass --mig-layout",
                        labels.get(objects::LABEL_PRODUCT).map_or("this GPU", String::as_str)
                    )));
                };
                if self.configured.as_ref() == Some(&Target::Mig(layout.clone())) {
                    return Ok(Prepared::Ready);
                }
                let start = Instant::now();
                self.ensure_entries(shutdown).await?;
                // No MPS daemon may hold the GPU, and the plugin must serve plain GPUs
                // while the MIG manager works (B6: MPS is fatal on MIG devices).
                self.switch_plugin(Strategy::Exclusive, 1, shutdown).await?;
                let t = Instant::now();
                self.switch_mig(&layout, shutdown).await?;
                self.configured = Some(Target::Mig(layout.clone()));
                self.cost = SwitchCost {
                    config: layout,
                    switch_s: Some(start.elapsed().as_secs_f64()),
                    mig_s: Some(t.elapsed().as_secs_f64()),
                    pods_ready_s: None,
                };
                self.cost_used = false;
            }
            Strategy::TimeSlicing => {
                let max = self.s.pods.iter().copied().max().unwrap_or(1);
                self.switch_plugin(strategy, objects::sharing_replicas(max), shutdown)
                    .await?;
            }
            Strategy::Exclusive => self.switch_plugin(strategy, 1, shutdown).await?,
            // MPS splits threads and memory by replicas: configured per cell in launch.
            Strategy::Mps => {}
        }
        Ok(Prepared::Ready)
    }

    fn cell_setup(&self) -> Option<CellSetup> {
        let (strategy, pods) = self.cell_launched?;
        let note = match (strategy, &self.configured) {
            (Strategy::Mps, Some(Target::Plugin(_, r))) if *r != pods => format!(
                "device-plugin entry {} ({r} MPS replicas: the plugin rejects fewer than 2, so each pod was limited to 1/{r} of the SMs and memory)",
                self.cost.config
            ),
            (Strategy::TimeSlicing, Some(Target::Plugin(_, r))) => {
                format!("device-plugin entry {} ({r} time-slicing replicas)", self.cost.config)
            }
            (Strategy::Mig, _) => format!("MIG layout {}", self.cost.config),
            _ => format!("device-plugin entry {}", self.cost.config),
        };
        Some(CellSetup {
            switch_s: self.cost.switch_s,
            mig_reconfigure_s: self.cost.mig_s,
            pods_ready_s: self.cost.pods_ready_s,
            note: Some(note),
            mps_split: None,
        })
    }

    async fn launch(
        &mut self,
        strategy: Strategy,
        pods: u32,
        args: &[String],
        shutdown: &Shutdown,
    ) -> Result<Vec<CellPod>> {
        let resource = self.begin_cell(strategy, pods, shutdown).await?;
        self.trial = None;
        let object = objects::deployment(&self.s.workload, strategy, pods, &resource, args);
        self.apply_deployment(objects::APP, object, &format!("{} × {pods}", strategy.name()))
            .await?;
        self.cell = Some((strategy, pods));
        self.launched_at = Some(Instant::now());
        self.cell_pods().await
    }

    /// The victim as one Deployment, then (once it is bound) the aggressors as another.
    async fn launch_pods(
        &mut self,
        strategy: Strategy,
        specs: &[PodSpec],
        shutdown: &Shutdown,
    ) -> Result<Vec<CellPod>> {
        let parts = trial::deployments(specs)?;
        let pods = specs.len() as u32;
        let resource = self.begin_cell(strategy, pods, shutdown).await?;
        self.trial = Some(TrialCell::new(specs));
        self.cell = Some((strategy, pods));
        self.launched_at = Some(Instant::now());
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                wait_victim_bound(&self.pods(), &self.s, Duration::from_secs(120), shutdown).await?;
            }
            let (name, object, what) = trial::part_deployment(&self.s, strategy.into(), &resource, part, pods);
            self.apply_deployment(&name, object, &what).await?;
        }
        self.cell_pods().await
    }

    /// Nothing to start: the kubelet restarts an exited container in its pod, and a
    /// ReplicaSet replaces a pod that failed (UPSTREAM-RULES.md I2). From now on
    /// the pod counts as running only once a container of it is ready again.
    async fn relaunch_pod(&mut self, name: &str, shutdown: &Shutdown) -> Result<()> {
        let list = shutdown.guard(self.trial_pods()).await?;
        trial::relaunch(self.trial.as_mut(), name, &list)
    }

    async fn wait_ready(&mut self, timeout: Duration, shutdown: &Shutdown) -> Result<Vec<CellPod>> {
        let want = self.cell.map_or(0, |c| c.1) as usize;
        let deadline = Instant::now() + timeout;
        loop {
            let pods = shutdown.guard(self.cell_pods()).await?;
            // A pending pod keeps waiting while the node has room for it (the scheduler
            // retries when a restarting plugin re-registers); once the others hold every
            // allocatable device (exclusive × N) it stays pending, as the cell records.
            let others_settled = pods.iter().all(|p| {
                matches!(
                    p.state,
                    PodState::Running | PodState::Exited { .. } | PodState::Pending(_)
                )
            });
            let pending = pods.iter().filter(|p| matches!(p.state, PodState::Pending(_))).count();
            let full = if pending > 0 && others_settled {
                let node = shutdown.guard(self.read_node()).await?;
                let running = pods.iter().filter(|p| p.state == PodState::Running).count();
                allocatable(&node, &self.resource).is_some_and(|n| running >= n as usize)
            } else {
                false
            };
            let settled = pods.len() >= want && others_settled && (pending == 0 || full);
            if settled {
                if let Some(t) = self.launched_at {
                    self.cost.pods_ready_s = Some(t.elapsed().as_secs_f64());
                }
                return Ok(pods);
            }
            if Instant::now() > deadline {
                return Ok(pods
                    .into_iter()
                    .map(|mut p| {
                        if p.state == PodState::Starting {
                            p.state = PodState::Exited {
                                code: None,
                                detail: format!("not ready after {} s", timeout.as_secs()),
                            };
                        }
                        p
                    })
                    .collect());
            }
            shutdown.sleep(self.s.poll).await?;
        }
    }

    async fn poll(&mut self) -> Vec<CellPod> {
        self.cell_pods().await.unwrap_or_default()
    }

    async fn stop_pods(&mut self, shutdown: &Shutdown) -> Result<Vec<CellPod>> {
        let before = self.cell_pods().await.unwrap_or_default();
        self.cell = None;
        self.trial = None;
        self.delete_deployment(shutdown).await?;
        Ok(before)
    }

    async fn restore(&mut self, shutdown: &Shutdown) -> Result<()> {
        let Some(path) = self.journal_path.clone() else {
            return self.delete_deployment(shutdown).await;
        };
        let report = restore_from_journal(&self.client, &path, &self.s, shutdown).await?;
        for n in &report.notices {
            tracing::warn!("{n}");
        }
        self.journal = journal::read(&path)?;
        self.configured = None;
        self.keys_ready = false;
        Ok(())
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

/// Undoes what a run's journal says the harness changed, and nothing else: deletes the
/// workload Deployments it applied, puts back each label that still holds the value the harness set
/// (waiting for the MIG manager when the MIG layout goes back), removes each ConfigMap
/// key the harness added whose content is still what it added, and marks the journal
/// restored. A second restore finds nothing to do.
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
        match super::dra_backend::delete_claim(client, &ns, &claim, s.poll, shutdown).await {
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
    let labels = labels_of(&node);
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
    if !patch.is_empty() {
        let refs: Vec<(&str, Option<&str>)> = patch.iter().map(|(k, v)| (*k, v.as_deref())).collect();
        nodes
            .patch(
                &j.node,
                &PatchParams::default(),
                &Patch::Merge(objects::node_label_patch(&refs)),
            )
            .await
            .map_err(|e| kube_error(&format!("restoring the labels of node {}", j.node), e))?;
    }
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
    // A MIG layout going back is done when mig-parted says so *after* seeing it (a
    // `success` or `failed` left from before is stale), GFD shows it and a device-plugin
    // pod started after the change serves it.
    if let Some(layout) = mig_back {
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
        let already = mig_shown(&node, &layout, &mig_strategy);
        let deadline = Instant::now() + s.mig_timeout;
        let mut saw_pending = false;
        loop {
            let n = nodes
                .get(&j.node)
                .await
                .map_err(|e| kube_error(&format!("reading node {}", j.node), e))?;
            let l = labels_of(&n);
            let state = l.get(objects::LABEL_MIG_STATE).map(String::as_str);
            saw_pending |= state == Some("pending");
            if state == Some("success") && mig_shown(&n, &layout, &mig_strategy) {
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
            if Instant::now() > deadline {
                problems.push(format!(
                    "node {} has not finished going back to MIG layout {layout} after {} s (state {}){}",
                    j.node,
                    s.mig_timeout.as_secs(),
                    state.unwrap_or("absent"),
                    paused_note(&l)
                ));
                break;
            }
            if shutdown.is_forced() {
                problems.push(format!(
                    "forced stop while node {} was going back to MIG layout {layout}",
                    j.node
                ));
                break;
            }
            shutdown.grace(s.poll).await;
        }
    }
    if problems.is_empty() {
        j.restored = true;
        journal::write(path, &j)?;
    }
    finish(report, problems, &j.node)
}

/// Deploy labels mig-parted left paused (v0.13.1 `reconfigure.go`: after its first
/// successful change a later failure no longer restores them, `NoRestartK8sDaemonsetsOnExit`).
fn paused_note(labels: &BTreeMap<String, String>) -> String {
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
