//! A GPU node under the NVIDIA GPU operator, played through a real API server, as KWOK
//! plays nodes: the node object, its lease and status as a kubelet posts them, the
//! operator's operands (device plugin, GPU feature discovery and MPS control daemon, each
//! with its config-manager), the MIG manager, NVIDIA's DRA kubelet plugin, and a kubelet
//! for the pods the real scheduler binds to the node.
//!
//! Nothing here answers an API request or decides what the control plane decides: the
//! API server stores and validates, the scheduler binds (and allocates DRA claims), the
//! Deployment, ReplicaSet, DaemonSet, garbage-collector and resource-claim controllers
//! create and delete. The agent reads the API (every 50 ms) and writes only what a node's
//! own components write: node labels (as `nfd-master`, `nvidia-mig-manager`,
//! `gpu-operator`), node status, pod status, pod deletion after termination (the
//! kubelet's final delete), events, the lease and the ResourceSlice.
//!
//! Time runs `speed` times faster on the node than on the wall clock: the operator's
//! delays (config projection, restarts, MIG changes) are those of [`Timings`], in node
//! seconds. Every rule names its upstream file and version (UPSTREAM-RULES.md).

mod kubelet;
mod operand;
mod operator;
pub(crate) mod process;
mod setup;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};

use self::operand::{Operand, OperandKind, WorkloadAct};
use crate::gpu::GpuState;
use crate::spec::{ClusterSpec, PodFacts, Secs};

pub use crate::spec::ProcessSpec;
pub use setup::{CLUSTER_POLICY_CRD, POD_MONITOR_CRD};

/// How often the agent reads the API (wall clock).
const TICK: Duration = Duration::from_millis(50);

/// What a test can see of the node beyond the API.
#[derive(Debug, Default)]
struct Shared {
    facts: BTreeMap<String, PodFacts>,
    log: Vec<String>,
    error: Option<String>,
    /// The agent's passes so far, and the node time of the last (a stalled agent shows).
    passes: (u64, Secs),
    /// Config-manager init containers that start with the label unset lose v0.18.1's race
    /// (UPSTREAM-RULES.md D5) from now on.
    race_lost: bool,
}

/// The running node agent; stops when dropped.
#[derive(Debug)]
pub struct GpuNode {
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
    speed: f64,
    /// The node's name.
    pub name: String,
}

impl Drop for GpuNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GpuNode {
    /// Creates the node and the operator's objects through `admin` (cluster-admin) and
    /// starts the agent; returns once the operands have settled (the node advertises its
    /// GPUs and GFD has labelled it).
    pub async fn start(admin: Client, spec: ClusterSpec, speed: f64) -> Result<Self, String> {
        setup::create_all(&admin, &spec).await?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let name = spec.node.clone();
        let plugin = spec.device_plugin;
        // A ClusterPolicy that names a ConfigMap which does not exist: the operands'
        // config-managers fail and restart with back-off, and the node never advertises
        // a GPU (k8s-device-plugin v0.18.1 `cmd/config-manager/main.go`
        // `updateConfigName`); it has settled once they have tried.
        let no_configmap = !spec.plugin_config.0.is_empty() && spec.configmap.is_none();
        let agent = Agent::new(admin.clone(), spec, speed, shared.clone());
        let task = tokio::spawn(agent.run());
        let node = Self {
            shared,
            task,
            speed,
            name,
        };
        node.wait_settled(&admin, plugin, no_configmap).await?;
        node.shared.lock().expect("node state").log.clear();
        Ok(node)
    }

    async fn wait_settled(&self, admin: &Client, plugin: bool, no_configmap: bool) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(admin.clone());
        let start = Instant::now();
        loop {
            if let Some(e) = self.error() {
                return Err(e);
            }
            let node = nodes.get(&self.name).await.map_err(|e| e.to_string())?;
            let labels = node.metadata.labels.unwrap_or_default();
            let advertised = node
                .status
                .and_then(|s| s.allocatable)
                .is_some_and(|a| a.keys().any(|k| k.starts_with("nvidia.com/")));
            if (advertised || !plugin) && labels.contains_key("nvidia.com/gpu.product") {
                return Ok(());
            }
            if no_configmap && self.log().contains("no configuration files available") {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(60) {
                let (passes, at) = self.shared.lock().expect("node state").passes;
                return Err(format!(
                    "node {} did not settle in 60 s ({passes} agent passes, the last at node time {at:.1} s; labels {labels:?}):\n{}",
                    self.name,
                    self.log()
                ));
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// Facts about the GPU pods the kubelet started (by pod name).
    pub fn facts(&self) -> BTreeMap<String, PodFacts> {
        self.shared.lock().expect("node state").facts.clone()
    }

    /// What a pod's own metrics would say of its GPU: the UUID CUDA reports inside it
    /// (`PodFacts::device_uuid`), looked up by pod name as long as the node lives.
    pub fn device_uuids(&self) -> impl Fn(&str) -> Option<String> + Send + Sync + 'static {
        let shared = self.shared.clone();
        move |pod| {
            shared
                .lock()
                .expect("node state")
                .facts
                .get(pod)
                .and_then(|f| f.device_uuid.clone())
        }
    }

    /// From now on, a config-manager init container that starts while the node has no
    /// `nvidia.com/device-plugin.config` label loses k8s-device-plugin v0.18.1's race
    /// (`cmd/config-manager/main.go` `SyncableConfig.Get` waits while `lastRead ==
    /// current == ""`, fixed in v0.18.2 commit 09d51359c): it blocks until the label gets a
    /// value, and its pod's plugin never starts. A race is a race: on a real node it is
    /// lost now and then; a test chooses when.
    pub fn lose_config_manager_race(&self) {
        self.shared.lock().expect("node state").race_lost = true;
    }

    /// What happened on the node, with node times.
    pub fn log(&self) -> String {
        self.shared.lock().expect("node state").log.join("\n")
    }

    /// The agent's failure, if it stopped.
    pub fn error(&self) -> Option<String> {
        self.shared.lock().expect("node state").error.clone()
    }

    /// Lets `secs` node seconds pass.
    pub async fn settle(&self, secs: Secs) {
        tokio::time::sleep(Duration::from_secs_f64(secs / self.speed)).await;
    }

    /// Wall-clock time of `secs` node seconds.
    pub fn wall(&self, secs: Secs) -> Duration {
        Duration::from_secs_f64(secs / self.speed)
    }
}

/// A write the node's components make, applied in order at the end of a step.
#[derive(Debug, Clone)]
enum Write {
    /// Node labels set (Some) or removed (None) by a field manager.
    Labels(String, Vec<(String, Option<String>)>),
    /// The node's allocatable and capacity extended resources.
    Allocatable(Value),
    /// A pod's status (merge patch of the status subresource).
    PodStatus { ns: String, name: String, status: Value },
    /// The kubelet's final delete of a terminated pod.
    DeletePod { ns: String, name: String, uid: String },
    /// An event about a pod.
    Event {
        ns: String,
        pod: String,
        reason: String,
        message: String,
    },
}

/// Events on the node's clock.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    ConfigManager(OperandKind, String),
    Load(OperandKind, String),
    Register(String),
    Relabel(String),
    GfdTick,
    GfdLabelsGone,
    OperatorTick,
    OperandGone(OperandKind, String),
    MigLabel(String),
    MigStep(u64),
    /// A pod's container (its start number) finishes starting.
    PodReady(PodKey, u32),
    /// A workload container acts on its own flags.
    Workload(PodKey, u32, WorkloadAct),
    /// The kubelet starts an exited container again (its next start number).
    Restart(PodKey, u32),
    /// A terminating pod's containers are gone.
    PodGone(PodKey),
}

/// Namespace and name of a pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct PodKey {
    ns: String,
    name: String,
}

/// A pod the kubelet runs.
#[derive(Debug, Clone)]
struct PodRun {
    uid: String,
    /// The pod as it was admitted.
    pod: Value,
    /// The status the kubelet reports.
    status: Value,
    /// Whether `status` changed since it was written.
    dirty: bool,
    /// The device it holds: (resource, GPU index); None for pods without a GPU.
    device: Option<(String, u32)>,
    terminating: bool,
}

pub(crate) struct Agent {
    spec: ClusterSpec,
    speed: f64,
    began: Instant,
    now: Secs,
    client: Client,
    shared: Arc<Mutex<Shared>>,
    due: BinaryHeap<Reverse<(u64, u64, Due)>>,
    seq: u64,
    /// The node's labels: as last read, with the agent's own writes since.
    labels: BTreeMap<String, String>,
    /// The labels as read at the previous step (what the informers saw).
    seen: Option<BTreeMap<String, String>>,
    allocatable: BTreeMap<String, u32>,
    operands: Vec<Operand>,
    cm_history: Vec<(Secs, BTreeMap<String, String>)>,
    gpu_state: GpuState,
    mig: operator::MigRun,
    mig_queued: bool,
    mig_no_restart: bool,
    mig_seq: u64,
    pods: BTreeMap<PodKey, PodRun>,
    /// Pods the kubelet has deleted (by UID): they may linger for their finalizers.
    gone: BTreeSet<String>,
    /// Operand pods' UIDs (for the kubelet's final delete).
    operand_uids: BTreeMap<String, String>,
    /// GPUs the DRA driver left in compute mode EXCLUSIVE_PROCESS (J5).
    exclusive_process: BTreeSet<u32>,
    writes: Vec<Write>,
    ips: u32,
    /// The second octet of this node's loopback /16 for process pods (given on first use).
    loopback: Option<u8>,
    last_lease: Option<Instant>,
    /// Containers that run as local processes (`ClusterSpec::processes`).
    processes: process::Processes,
}

/// The next loopback /16 (127.10 to 127.249) for a node whose pods run processes.
static NEXT_LOOPBACK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Agent {
    /// This node's loopback /16, its second octet: one per node in this process, so
    /// that nodes side by side never hand out the same pod address.
    fn loopback_net(&mut self) -> u8 {
        *self.loopback.get_or_insert_with(|| {
            let n = NEXT_LOOPBACK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            10 + (n % 240) as u8
        })
    }
}

fn ms(t: Secs) -> u64 {
    (t * 1000.0).round().max(0.0) as u64
}

impl Agent {
    fn new(client: Client, spec: ClusterSpec, speed: f64, shared: Arc<Mutex<Shared>>) -> Self {
        Self {
            spec,
            speed,
            began: Instant::now(),
            now: 0.0,
            client,
            shared,
            due: BinaryHeap::new(),
            seq: 0,
            labels: BTreeMap::new(),
            seen: None,
            allocatable: BTreeMap::new(),
            operands: Vec::new(),
            cm_history: Vec::new(),
            gpu_state: GpuState { mig: None },
            mig: operator::MigRun::Idle,
            mig_queued: false,
            mig_no_restart: false,
            mig_seq: 0,
            pods: BTreeMap::new(),
            operand_uids: BTreeMap::new(),
            gone: BTreeSet::new(),
            exclusive_process: BTreeSet::new(),
            writes: Vec::new(),
            ips: 0,
            loopback: None,
            last_lease: None,
            processes: process::Processes::default(),
        }
    }

    async fn run(mut self) {
        if !self.spec.dra_mig.is_empty() {
            // Static MIG made before the driver started (J8).
            self.gpu_state.mig = Some((self.spec.dra_mig[0].clone(), self.spec.dra_mig.len() as u32));
        }
        loop {
            let result = self.step().await;
            {
                let mut s = self.shared.lock().expect("node state");
                s.passes = (s.passes.0 + 1, self.now);
            }
            if let Err(e) = result {
                let mut s = self.shared.lock().expect("node state");
                s.log.push(format!("node agent stopped: {e}"));
                s.error = Some(e);
                return;
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// One pass: read what the node's components watch, react, run what is due, write.
    async fn step(&mut self) -> Result<(), String> {
        self.now = self.began.elapsed().as_secs_f64() * self.speed;
        self.renew_lease().await?;
        let node = self.read_node().await?;
        let before = self.seen.replace(node.clone());
        self.labels = node;
        if let Some(before) = before {
            self.labels_changed(&before);
        } else {
            self.operator_reconcile();
        }
        self.read_configmap().await?;
        let pods = self.read_pods().await?;
        self.sync_operands(&pods);
        self.sync_pods(&pods).await?;
        self.reap_processes();
        self.flush().await?;
        while let Some(Reverse((t, _, _))) = self.due.peek() {
            if *t > ms(self.now) {
                break;
            }
            let Some(Reverse((_, _, e))) = self.due.pop() else {
                break;
            };
            self.handle(e).await?;
            self.flush().await?;
        }
        self.write_pod_statuses();
        self.flush().await
    }

    fn at(&mut self, delay: Secs, e: Due) {
        self.seq += 1;
        self.due.push(Reverse((ms(self.now + delay), self.seq, e)));
    }

    fn note(&mut self, what: String) {
        let line = format!("t={:.1}s {what}", self.now);
        self.shared.lock().expect("node state").log.push(line);
    }

    fn label(&self, k: &str) -> Option<String> {
        self.labels.get(k).cloned()
    }

    /// Sets (Some) or removes (None) node labels as `manager`.
    fn set_labels(&mut self, manager: &str, changes: &[(&str, Option<String>)]) {
        for (k, v) in changes {
            match v {
                Some(v) => self.labels.insert((*k).to_string(), v.clone()),
                None => self.labels.remove(*k),
            };
        }
        self.writes.push(Write::Labels(
            manager.to_string(),
            changes.iter().map(|(k, v)| ((*k).to_string(), v.clone())).collect(),
        ));
    }

    /// The node's allocatable extended resources change (H12: a plugin that goes makes
    /// its devices unhealthy: allocatable 0, capacity kept; a registration replaces both).
    fn set_allocatable(&mut self, res: BTreeMap<String, u32>) {
        if self.allocatable == res {
            return;
        }
        let mut alloc = serde_json::Map::new();
        for (k, v) in &res {
            alloc.insert(k.clone(), json!(v.to_string()));
        }
        for k in self.allocatable.keys().filter(|k| !res.contains_key(*k)) {
            alloc.insert(k.clone(), json!("0"));
        }
        let mut status = json!({"allocatable": alloc});
        if !res.is_empty() {
            status["capacity"] = Value::Object(alloc);
        }
        self.note(format!("allocatable {res:?}"));
        self.allocatable = res;
        self.writes.push(Write::Allocatable(status));
    }

    async fn renew_lease(&mut self) -> Result<(), String> {
        if self.last_lease.is_some_and(|t| t.elapsed() < Duration::from_secs(2)) {
            return Ok(());
        }
        self.last_lease = Some(Instant::now());
        setup::renew_lease(&self.client, &self.spec.node).await
    }

    async fn read_node(&mut self) -> Result<BTreeMap<String, String>, String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes
            .get(&self.spec.node)
            .await
            .map_err(|e| format!("reading node {}: {e}", self.spec.node))?;
        if let Some(a) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
            self.allocatable = a
                .iter()
                .filter(|(k, _)| k.starts_with("nvidia.com/"))
                .map(|(k, v)| (k.clone(), v.0.parse().unwrap_or(0)))
                .filter(|(_, v)| *v > 0)
                .collect();
        }
        Ok(node.metadata.labels.unwrap_or_default().into_iter().collect())
    }

    /// Records the device-plugin ConfigMap's data when it changed (the kubelet projects
    /// it into the operand pods later, [`Timings::projection`]).
    async fn read_configmap(&mut self) -> Result<(), String> {
        let (name, _) = &self.spec.plugin_config;
        if name.is_empty() {
            return Ok(());
        }
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.spec.operator_namespace);
        let data: BTreeMap<String, String> = match cms.get_opt(name).await {
            Ok(Some(cm)) => cm.data.unwrap_or_default().into_iter().collect(),
            Ok(None) => BTreeMap::new(),
            Err(e) => return Err(format!("reading ConfigMap {name}: {e}")),
        };
        if self.cm_history.last().map(|(_, d)| d) != Some(&data) {
            if !self.cm_history.is_empty() {
                self.note(format!("ConfigMap keys now {:?}", data.keys().collect::<Vec<_>>()));
            }
            let at = if self.cm_history.is_empty() { 0.0 } else { self.now };
            self.cm_history.push((at, data));
        }
        Ok(())
    }

    async fn read_pods(&self) -> Result<Vec<Value>, String> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.spec.node)))
            .await
            .map_err(|e| format!("listing the node's pods: {e}"))?;
        list.items
            .into_iter()
            .map(|p| serde_json::to_value(p).map_err(|e| e.to_string()))
            .collect()
    }

    async fn flush(&mut self) -> Result<(), String> {
        for w in std::mem::take(&mut self.writes) {
            self.apply(w).await?;
        }
        Ok(())
    }

    async fn apply(&self, w: Write) -> Result<(), String> {
        let node = &self.spec.node;
        match w {
            Write::Labels(manager, changes) => {
                let mut labels = serde_json::Map::new();
                for (k, v) in changes {
                    labels.insert(k, v.map_or(Value::Null, Value::String));
                }
                let nodes: Api<Node> = Api::all(self.client.clone());
                let pp = PatchParams {
                    field_manager: Some(manager.clone()),
                    ..PatchParams::default()
                };
                nodes
                    .patch(node, &pp, &Patch::Merge(json!({"metadata": {"labels": labels}})))
                    .await
                    .map_err(|e| format!("{manager} labelling node {node}: {e}"))?;
            }
            Write::Allocatable(status) => {
                let nodes: Api<Node> = Api::all(self.client.clone());
                let pp = PatchParams {
                    field_manager: Some("kubelet".into()),
                    ..PatchParams::default()
                };
                nodes
                    .patch_status(node, &pp, &Patch::Merge(json!({ "status": status })))
                    .await
                    .map_err(|e| format!("kubelet updating node {node}'s status: {e}"))?;
            }
            Write::PodStatus { ns, name, status } => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                let pp = PatchParams {
                    field_manager: Some("kubelet".into()),
                    ..PatchParams::default()
                };
                match pods
                    .patch_status(&name, &pp, &Patch::Merge(json!({ "status": status })))
                    .await
                {
                    Ok(_) => {}
                    // Deleted meanwhile: nothing left to report on.
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(format!("kubelet updating pod {ns}/{name}'s status: {e}")),
                }
            }
            Write::DeletePod { ns, name, uid } => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match pods.delete(&name, &dp).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => return Err(format!("kubelet deleting pod {ns}/{name}: {e}")),
                }
            }
            Write::Event {
                ns,
                pod,
                reason,
                message,
            } => {
                let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(self.client.clone(), &ns);
                let event: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
                    "metadata": {"generateName": format!("{pod}.")},
                    "involvedObject": {"kind": "Pod", "name": pod, "namespace": ns},
                    "reason": reason, "type": "Warning", "message": message,
                    "source": {"component": "kubelet", "host": node},
                    "firstTimestamp": crate::node::setup::rfc3339_now(),
                    "lastTimestamp": crate::node::setup::rfc3339_now(),
                    "count": 1
                }))
                .map_err(|e| e.to_string())?;
                events
                    .create(&PostParams::default(), &event)
                    .await
                    .map_err(|e| format!("kubelet recording an event on {ns}/{pod}: {e}"))?;
            }
        }
        Ok(())
    }

    async fn handle(&mut self, e: Due) -> Result<(), String> {
        match e {
            Due::ConfigManager(kind, pod) => self.config_manager(kind, &pod),
            Due::Load(kind, pod) => self.load(kind, &pod),
            Due::Register(pod) => self.register_due(&pod),
            Due::Relabel(pod) => self.relabel(&pod),
            Due::GfdTick => self.gfd_tick(),
            Due::OperatorTick => {
                self.operator_reconcile();
                let every = self.spec.timings.operator_reconcile;
                self.at(every, Due::OperatorTick);
            }
            Due::GfdLabelsGone => self.gfd_labels_gone(),
            Due::OperandGone(kind, pod) => self.operand_gone(kind, &pod),
            Due::MigLabel(v) => self.mig_start(v),
            Due::MigStep(id) => self.mig_step(id),
            Due::PodReady(key, start) => self.pod_ready(&key, start).await,
            Due::Workload(key, start, act) => self.workload_act(&key, start, act),
            Due::Restart(key, start) => self.restart_container(&key, start),
            Due::PodGone(key) => self.pod_gone(&key),
        }
        Ok(())
    }
}
