//! The Kubernetes backend: switches one GPU node between strategies through the NVIDIA
//! device plugin's ConfigMap and node labels (or the GPU operator's MIG manager), runs
//! each cell as the workload Deployment scaled to N and pinned to the node, and puts the
//! node's labels and ConfigMap back at the end, on failure and on Ctrl-C.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use super::objects::{self, PluginConfigMap, WorkloadSpec};
use crate::backend::{Backend, Pod as CellPod, PodState, Prepared};
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
    /// The device plugin's ConfigMap.
    pub plugin: PluginConfigMap,
    /// MIG layout label value (None: chosen from the GPU product).
    pub mig_layout: Option<String>,
    /// Pod counts of the sweep (time-slicing is configured once for the largest).
    pub pods: Vec<u32>,
    /// Longest wait for the node to switch strategy.
    pub switch_timeout: Duration,
    /// Time between polls.
    pub poll: Duration,
}

/// Turns a kube error into one line naming what was being done.
pub fn kube_error(what: &str, e: kube::Error) -> BenchError {
    let detail = match &e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "forbidden: {} (the harness's user or service account lacks RBAC permission; manifests/base/rbac.yaml lists what it needs)",
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

/// Whether a node shows the expected labels and allocatable GPUs (pure): Ok(true) done,
/// Ok(false) keep waiting.
pub fn node_switched(node: &Node, expected: &[(&str, String)], allocatable: Option<u32>) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let labels_ok = expected.iter().all(|(k, v)| labels.get(*k) == Some(v));
    let alloc_ok = allocatable.is_none_or(|want| {
        node.status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("nvidia.com/gpu"))
            .is_some_and(|q| q.0 == want.to_string())
    });
    labels_ok && alloc_ok
}

/// The node's labels we may change, as we found them.
#[derive(Debug, Clone, PartialEq)]
struct Original {
    plugin_config: Option<String>,
    mig_config: Option<String>,
}

/// Pods on one Kubernetes GPU node.
pub struct KubernetesBackend {
    client: Client,
    s: KubeSettings,
    original: Option<Original>,
    node_labels: BTreeMap<String, String>,
    configured: Option<(Strategy, u32)>,
    entries: Vec<String>,
    mig_touched: bool,
    cell: Option<(Strategy, u32)>,
}

impl std::fmt::Debug for KubernetesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KubernetesBackend(node {})", self.s.node)
    }
}

impl KubernetesBackend {
    /// A backend on an existing client (the kubeconfig's or a test's mock).
    pub fn new(client: Client, s: KubeSettings) -> Self {
        Self {
            client,
            s,
            original: None,
            node_labels: BTreeMap::new(),
            configured: None,
            entries: Vec::new(),
            mig_touched: false,
            cell: None,
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

    /// The client (shared with the port-forward).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.s.workload.namespace)
    }

    /// The GPU node's labels (read on first use; the first read also records the
    /// labels to restore).
    pub async fn node_labels(&mut self) -> Result<BTreeMap<String, String>> {
        let node = self
            .nodes()
            .get(&self.s.node)
            .await
            .map_err(|e| kube_error(&format!("reading node {}", self.s.node), e))?;
        let labels = node.metadata.labels.unwrap_or_default();
        if self.original.is_none() {
            self.original = Some(Original {
                plugin_config: labels.get(objects::LABEL_PLUGIN_CONFIG).cloned(),
                mig_config: labels.get(objects::LABEL_MIG_CONFIG).cloned(),
            });
        }
        self.node_labels = labels.clone();
        Ok(labels)
    }

    async fn label_node(&self, labels: &[(&str, Option<&str>)]) -> Result<()> {
        self.nodes()
            .patch(
                &self.s.node,
                &PatchParams::default(),
                &Patch::Merge(objects::node_label_patch(labels)),
            )
            .await
            .map(|_| ())
            .map_err(|e| kube_error(&format!("labelling node {}", self.s.node), e))
    }

    async fn wait_node(&self, what: &str, shutdown: &Shutdown, done: impl Fn(&Node) -> Result<bool>) -> Result<()> {
        let deadline = Instant::now() + self.s.switch_timeout;
        loop {
            let node = shutdown
                .guard(async {
                    self.nodes()
                        .get(&self.s.node)
                        .await
                        .map_err(|e| kube_error(&format!("reading node {}", self.s.node), e))
                })
                .await?;
            if done(&node)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                let labels = node.metadata.labels.unwrap_or_default();
                let shown: Vec<String> = labels
                    .iter()
                    .filter(|(k, _)| k.starts_with("nvidia.com/"))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                return Err(BenchError::kube(format!(
                    "node {} did not {what} within {} s (its nvidia.com labels: {})",
                    self.s.node,
                    self.s.switch_timeout.as_secs(),
                    shown.join(", ")
                )));
            }
            shutdown.sleep(self.s.poll).await?;
        }
    }

    /// Switches the node's device plugin to `strategy` with `replicas` per GPU.
    async fn configure_plugin(&mut self, strategy: Strategy, replicas: u32, shutdown: &Shutdown) -> Result<()> {
        if self.configured == Some((strategy, replicas)) {
            return Ok(());
        }
        let entry = objects::config_entry_name(strategy, replicas);
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.s.plugin.namespace);
        cms.patch(
            &self.s.plugin.name,
            &PatchParams::apply(objects::FIELD_MANAGER),
            &Patch::Apply(objects::plugin_entry_patch(&self.s.plugin, strategy, replicas)),
        )
        .await
        .map_err(|e| {
            kube_error(
                &format!(
                    "adding entry {entry} to ConfigMap {}/{}",
                    self.s.plugin.namespace, self.s.plugin.name
                ),
                e,
            )
        })?;
        if !self.entries.contains(&entry) {
            self.entries.push(entry.clone());
        }
        self.label_node(&[(objects::LABEL_PLUGIN_CONFIG, Some(&entry))]).await?;
        let expected = objects::expected_sharing_labels(strategy, replicas);
        let gpus: u32 = self
            .node_labels
            .get(objects::LABEL_GPU_COUNT)
            .and_then(|c| c.parse().ok())
            .unwrap_or(1);
        let want = gpus * if strategy == Strategy::Exclusive { 1 } else { replicas };
        self.wait_node(
            &format!("switch to {} with {replicas} replica(s)", strategy.name()),
            shutdown,
            |n| Ok(node_switched(n, &expected, Some(want))),
        )
        .await?;
        self.configured = Some((strategy, replicas));
        Ok(())
    }

    async fn configure_mig(&mut self, layout: &str, shutdown: &Shutdown) -> Result<()> {
        self.label_node(&[(objects::LABEL_MIG_CONFIG, Some(layout))]).await?;
        self.mig_touched = true;
        let node = self.s.node.clone();
        self.wait_node(&format!("apply MIG layout {layout}"), shutdown, |n| {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            match labels.get(objects::LABEL_MIG_STATE).map(String::as_str) {
                Some("success") if labels.get(objects::LABEL_MIG_CONFIG).map(String::as_str) == Some(layout) => Ok(true),
                Some("failed") => Err(BenchError::kube(format!(
                    "MIG reconfiguration of node {node} to {layout} failed ({}=failed; see the nvidia-mig-manager logs)",
                    objects::LABEL_MIG_STATE
                ))),
                _ => Ok(false),
            }
        })
        .await?;
        self.configured = Some((Strategy::Mig, 0));
        Ok(())
    }

    fn mig_layout(&self) -> Option<String> {
        self.s.mig_layout.clone().or_else(|| {
            self.node_labels
                .get(objects::LABEL_PRODUCT)
                .and_then(|p| objects::default_mig_layout(p))
                .map(String::from)
        })
    }

    /// Deletes the cell's Deployment and waits (at most 120 s; a forced stop ends the
    /// wait) until its pods are gone.
    async fn delete_deployment(&self, shutdown: &Shutdown) -> Result<()> {
        let deps: Api<Deployment> = Api::namespaced(self.client.clone(), &self.s.workload.namespace);
        match deps.delete(objects::APP, &DeleteParams::foreground()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_error("deleting the workload Deployment", e)),
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = self
                .pods()
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
            shutdown.grace(self.s.poll).await;
        }
    }

    async fn cell_pods(&self) -> Result<Vec<CellPod>> {
        let Some((strategy, pods)) = self.cell else {
            return Ok(Vec::new());
        };
        let selector = format!("{}={}-{pods}", objects::CELL_LABEL, strategy.name());
        let mut list = self
            .pods()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| kube_error("listing workload pods", e))?
            .items;
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
}

impl Backend for KubernetesBackend {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn prepare(&mut self, strategy: Strategy, shutdown: &Shutdown) -> Result<Prepared> {
        let labels = shutdown.guard(self.node_labels()).await?;
        let ns: Api<Namespace> = Api::all(self.client.clone());
        ns.patch(
            &self.s.workload.namespace,
            &PatchParams::apply(objects::FIELD_MANAGER),
            &Patch::Apply(objects::namespace(&self.s.workload.namespace)),
        )
        .await
        .map_err(|e| kube_error(&format!("creating namespace {}", self.s.workload.namespace), e))?;
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
                let Some(layout) = self.mig_layout() else {
                    return Ok(Prepared::Unavailable(format!(
                        "no default MIG layout for {}; pass --mig-layout",
                        labels.get(objects::LABEL_PRODUCT).map_or("this GPU", String::as_str)
                    )));
                };
                // The device plugin must expose plain GPUs while the MIG manager works.
                self.configure_plugin(Strategy::Exclusive, 1, shutdown).await?;
                self.configure_mig(&layout, shutdown).await?;
            }
            Strategy::TimeSlicing => {
                let max = self.s.pods.iter().copied().max().unwrap_or(1);
                self.configure_plugin(strategy, max, shutdown).await?;
            }
            Strategy::Exclusive => self.configure_plugin(strategy, 1, shutdown).await?,
            // MPS splits threads and memory by replicas: configured per cell in launch.
            Strategy::Mps => {}
        }
        Ok(Prepared::Ready)
    }

    async fn launch(&mut self, strategy: Strategy, pods: u32, shutdown: &Shutdown) -> Result<Vec<CellPod>> {
        if strategy == Strategy::Mps {
            self.configure_plugin(strategy, pods, shutdown).await?;
        }
        let layout = self.mig_layout();
        let resource = objects::pod_resource(
            strategy,
            self.node_labels.get(objects::LABEL_MIG_STRATEGY).map(String::as_str),
            layout.as_deref(),
        );
        let deps: Api<Deployment> = Api::namespaced(self.client.clone(), &self.s.workload.namespace);
        deps.patch(
            objects::APP,
            &PatchParams::apply(objects::FIELD_MANAGER).force(),
            &Patch::Apply(objects::deployment(&self.s.workload, strategy, pods, &resource)),
        )
        .await
        .map_err(|e| {
            kube_error(
                &format!("applying the workload Deployment ({} × {pods})", strategy.name()),
                e,
            )
        })?;
        self.cell = Some((strategy, pods));
        self.cell_pods().await
    }

    async fn wait_ready(&mut self, timeout: Duration, shutdown: &Shutdown) -> Result<Vec<CellPod>> {
        let want = self.cell.map_or(0, |c| c.1) as usize;
        let deadline = Instant::now() + timeout;
        loop {
            let pods = shutdown.guard(self.cell_pods()).await?;
            let settled = pods.len() >= want && pods.iter().all(|p| p.state != PodState::Starting);
            if settled {
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
        self.delete_deployment(shutdown).await?;
        Ok(before)
    }

    async fn restore(&mut self, shutdown: &Shutdown) -> Result<()> {
        let mut problems = Vec::new();
        if let Err(e) = self.delete_deployment(shutdown).await {
            problems.push(e.to_string());
        }
        if let Some(orig) = self.original.clone() {
            if self.configured.is_some() || self.mig_touched {
                let mut labels = vec![(objects::LABEL_PLUGIN_CONFIG, orig.plugin_config.as_deref())];
                if self.mig_touched {
                    labels.push((objects::LABEL_MIG_CONFIG, orig.mig_config.as_deref()));
                }
                if let Err(e) = self.label_node(&labels).await {
                    problems.push(e.to_string());
                }
            }
            if !self.entries.is_empty() {
                let mut data = serde_json::Map::new();
                for e in &self.entries {
                    data.insert(e.clone(), Value::Null);
                }
                let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.s.plugin.namespace);
                if let Err(e) = cms
                    .patch(
                        &self.s.plugin.name,
                        &PatchParams::default(),
                        &Patch::Merge(serde_json::json!({ "data": data })),
                    )
                    .await
                {
                    problems.push(kube_error("removing our entries from the device-plugin ConfigMap", e).to_string());
                }
            }
        }
        self.configured = None;
        self.entries.clear();
        self.mig_touched = false;
        if problems.is_empty() {
            Ok(())
        } else {
            Err(BenchError::kube(format!(
                "restoring node {}: {}",
                self.s.node,
                problems.join("; ")
            )))
        }
    }
}
