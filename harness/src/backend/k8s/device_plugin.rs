//! The Kubernetes backend: switches one single-GPU node between strategies through the
//! GPU operator (the device-plugin ConfigMap its ClusterPolicy names, the node's
//! `nvidia.com/device-plugin.config` and `nvidia.com/mig.config` labels), runs each cell
//! as the workload Deployment scaled to N and pinned to the node, and puts back exactly
//! what it changed, from the restore journal in the run directory.
//!
//! The switching rules come from the operator's components (k8s-sim/UPSTREAM-RULES.md): a shared
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
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;
use tokio::time::Instant;

pub use super::base::allocatable;
use super::base::{
    CellCount, KubeSettings, OperatorSetup, delete_workload, ensure_namespace, kube_error, labels_of, list_cell_pods,
    mig_shown, operator_setup, paused_note, restore_from_journal,
};
use super::journal::{self, Journal};
use super::objects::{self};
use super::trial::{self, TrialCell, trial_cell_pods, trial_pods, wait_victim_bound};
use crate::backend::{Backend, CellSetup, Pod as CellPod, PodSpec, PodState, Prepared};
use crate::domain::Strategy;
use crate::error::{BenchError, Result};
use crate::shutdown::{EndsOn, Poll, Shutdown};

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

/// Why a run whose pods must share one GPU cannot run on a node with several through the
/// device plugin (pure): the plugin, not the harness, picks each pod's GPU.
pub fn several_gpus_refused(node: &str, gpus: u32, what: &str) -> String {
    format!(
        "node {node} has {gpus} GPUs: {what} needs its pods on one GPU, but the device plugin spreads a node's pods over its GPUs, the least-used first (k8s-device-plugin v0.20.0 internal/rm/allocate.go); run it on a node with one GPU, or with --sharing-api dra, whose claims pick the GPU"
    )
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
    /// The node's GPUs (GFD's count): a cell's pods fill every one of them.
    gpus: u32,
}

impl std::fmt::Debug for KubernetesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KubernetesBackend(node {})", self.s.node)
    }
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
            gpus: 1,
        }
    }

    /// The node's GPUs, which every cell fills with its `pods` each (read by
    /// [`check_cluster`](Self::check_cluster)).
    pub fn gpus(&self) -> u32 {
        self.gpus
    }

    /// Connects with the local kubeconfig or the in-cluster service account.
    pub async fn connect(s: KubeSettings) -> Result<Self> {
        Ok(Self::new(super::base::connect().await?, s))
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
    /// ClusterPolicy's device-plugin ConfigMap (which must exist). Reads the node's GPUs
    /// ([`gpus`](Self::gpus)). Returns the node's labels.
    pub async fn check_cluster(&mut self) -> Result<BTreeMap<String, String>> {
        super::base::check_workload_deployments(&self.client, &self.s.workload.namespace).await?;
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
        let mut wait = Poll::unstoppable(self.s.poll, self.s.mig_timeout);
        let labels = loop {
            let labels = labels_of(&self.read_node().await?);
            let gfd_paused = labels
                .get("nvidia.com/gpu.deploy.gpu-feature-discovery")
                .is_some_and(|v| v == "paused-for-mig-change");
            let mig_pending = labels.get(objects::LABEL_MIG_STATE).is_some_and(|v| v == "pending");
            if labels.contains_key(objects::LABEL_GPU_COUNT) || !(gfd_paused || mig_pending) {
                break labels;
            }
            tracing::info!(
                "node {}: a MIG change is under way; waiting for GPU feature discovery's labels",
                self.s.node
            );
            if wait.next().await.is_err() {
                break labels;
            }
        };
        // The plugin shares every GPU of the node and spreads replicas over them, the
        // least-used GPU first (k8s-device-plugin v0.20.0 internal/rm/allocate.go
        // greedyAlloc, policy `distributed`; v0.14 to v0.19 distributedAlloc): a cell
        // of N pods per GPU is a Deployment of N × GPUs pods.
        self.gpus = objects::physical_gpus(&labels).max(1);
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
        let mut wait = shutdown.poll(EndsOn::Request, self.s.poll, timeout);
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
            if !wait.keep_waiting().await? {
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
        let gpus = self.gpus;
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
    async fn apply_deployment(&mut self, name: &str, object: Value, what: &str, shutdown: &Shutdown) -> Result<()> {
        super::base::ready_to_apply(&self.client, &self.s.workload.namespace, name, self.s.poll, shutdown).await?;
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
            None => list_cell_pods(&api, strategy, (pods, pods * self.gpus)).await,
        }
    }

    /// The workload namespace must exist: created when missing if the harness may.
    async fn ensure_namespace(&self) -> Result<()> {
        ensure_namespace(&self.client, &self.s.workload.namespace).await
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
        let object = objects::deployment_over_gpus(&self.s.workload, strategy, (pods, self.gpus), &resource, args);
        let what = match self.gpus {
            1 => format!("{} × {pods}", strategy.name()),
            g => format!("{} × {pods} on each of {g} GPUs", strategy.name()),
        };
        self.apply_deployment(objects::APP, object, &what, shutdown).await?;
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
        if self.gpus > 1 {
            return Err(BenchError::kube(several_gpus_refused(
                &self.s.node,
                self.gpus,
                "an isolation trial",
            )));
        }
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
            self.apply_deployment(&name, object, &what, shutdown).await?;
        }
        self.cell_pods().await
    }

    /// Nothing to start: the kubelet restarts an exited container in its pod, and a
    /// ReplicaSet replaces a pod that failed (k8s-sim/UPSTREAM-RULES.md I2). From now on
    /// the pod counts as running only once a container of it is ready again.
    fn set_mps_limits(&mut self, limits: crate::domain::MpsLimits) -> std::result::Result<(), String> {
        if limits.is_auto() {
            Ok(())
        } else {
            Err("the device plugin's MPS sharing splits the GPU among a node's replicas and sets nothing per client: the DRA path (--sharing-api dra) sets each claim's limits".into())
        }
    }

    async fn relaunch_pod(&mut self, name: &str, shutdown: &Shutdown) -> Result<()> {
        let list = shutdown.guard(self.trial_pods()).await?;
        trial::relaunch(self.trial.as_mut(), name, &list)
    }

    async fn wait_ready(&mut self, timeout: Duration, shutdown: &Shutdown) -> Result<Vec<CellPod>> {
        let want = self
            .cell
            .map_or(0, |c| c.1 * if self.trial.is_some() { 1 } else { self.gpus }) as usize;
        let mut wait = shutdown.poll(EndsOn::Request, self.s.poll, timeout);
        loop {
            let pods = shutdown.guard(self.cell_pods()).await?;
            // A pending pod keeps waiting while the node has room for it (the scheduler
            // retries when a restarting plugin re-registers); once the others hold every
            // allocatable device (exclusive × N) it stays pending, as the cell records.
            let count = CellCount::of(&pods);
            let full = if count.pending > 0 && count.decided {
                let node = shutdown.guard(self.read_node()).await?;
                allocatable(&node, &self.resource).is_some_and(|n| count.running >= n as usize)
            } else {
                false
            };
            let settled = pods.len() >= want && count.decided && (count.pending == 0 || full);
            if settled {
                if let Some(t) = self.launched_at {
                    self.cost.pods_ready_s = Some(t.elapsed().as_secs_f64());
                }
                return Ok(pods);
            }
            if !wait.keep_waiting().await? {
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
