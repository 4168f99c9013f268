//! The simulated cluster's state and its actors, as a discrete-event simulation on a
//! virtual clock: the API objects (with their field managers), one GPU node, the GPU
//! operator's operands on it (device plugin, GPU feature discovery, MPS control daemon,
//! each with its config-manager), the MIG manager, the operator's own label rules, and
//! the Deployment controller, scheduler and kubelet for the workload's pods.
//!
//! Every actor's rule names the upstream file it reproduces (versions as in
//! UPSTREAM-RULES.md: GPU operator v25.10.1, k8s-device-plugin v0.18.1, mig-parted
//! v0.13.1). Events are processed in virtual-time order whenever the API is called, so
//! a harness that sleeps through a chain of crashes and restarts sees the same end state
//! as one that polled through it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use serde_json::{Value, json};

use super::fields::Managed;
use super::gpu::{self, GpuModel, GpuState, PluginConfig, Sharing};
pub use crate::key::Key;

/// Virtual seconds.
pub type Secs = f64;

/// How long things take, in virtual seconds. The defaults follow the upstream constants
/// where there is one (named) and a plausible value where there is not (said so).
#[derive(Debug, Clone, PartialEq)]
pub struct Timings {
    /// Informer delay from a label change to the config-manager or MIG manager seeing it.
    pub informer: Secs,
    /// Kubelet's projection of a changed ConfigMap into the plugin pod's volume (A5: sync
    /// period 60 s + cache TTL); GFD's and the MPS daemon's pods lag by their own offsets.
    pub projection: [Secs; 3],
    /// Container restart back-off after the second exit in a row, doubling, capped
    /// (`initialCrashLoopBackOff` 10 s and `MaxCrashLoopBackOff` 300 s; the first restart
    /// is immediate: UPSTREAM-RULES.md I2).
    pub backoff: (Secs, Secs),
    /// Plugin stop, reload and register with the kubelet after a SIGHUP.
    pub plugin_restart: Secs,
    /// GFD's relabel after a SIGHUP, through NFD (NFD's latency not read: assumed).
    pub gfd_relabel: Secs,
    /// GFD's periodic relabel (`GFD_SLEEP_INTERVAL=60s` in the operator's asset).
    pub gfd_interval: Secs,
    /// MPS control daemon start (compute mode, daemons, limits, `.ready`).
    pub mps_start: Secs,
    /// The plugin's retry while the MPS daemon is not healthy (`restartTimeout` 30 s).
    pub mps_retry: Secs,
    /// A new operand pod until its main container runs.
    pub operand_start: Secs,
    /// Operand pod termination.
    pub operand_stop: Secs,
    /// The operator's reconcile period (labels it adds when absent).
    pub operator_reconcile: Secs,
    /// mig-parted: validate and persist the config, then set `pending`.
    pub mig_validate: Secs,
    /// mig-parted: MIG mode change.
    pub mig_mode: Secs,
    /// mig-parted: create the GPU and compute instances.
    pub mig_apply: Secs,
    /// A new workload pod until the scheduler's queue has it (informers, queue; not read:
    /// a plausible second). Pods that join at one pass tie and go in name order.
    pub scheduler_queue: Secs,
    /// A workload pod from bound to ready (image present, model loaded).
    pub pod_ready: Secs,
    /// A workload pod's termination.
    pub pod_stop: Secs,
    /// A claim made from a template, from its pod's removal until the claim is gone
    /// (J7: the resourceclaim controller's queue, its delete, the deallocation that lets
    /// the finalizer go; not measured: a plausible few seconds). Its device stays taken
    /// until then.
    pub claim_gc: Secs,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            informer: 1.0,
            projection: [60.0, 75.0, 90.0],
            backoff: (10.0, 300.0),
            plugin_restart: 5.0,
            gfd_relabel: 5.0,
            gfd_interval: 60.0,
            mps_start: 8.0,
            mps_retry: 30.0,
            operand_start: 15.0,
            operand_stop: 5.0,
            operator_reconcile: 30.0,
            mig_validate: 2.0,
            mig_mode: 40.0,
            mig_apply: 20.0,
            scheduler_queue: 1.0,
            pod_ready: 20.0,
            pod_stop: 5.0,
            claim_gc: 3.0,
        }
    }
}

/// What the simulated cluster starts with.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpec {
    /// The GPU node's name.
    pub node: String,
    /// Its GPUs.
    pub gpu: GpuModel,
    /// How many.
    pub gpus: u32,
    /// The operator's namespace.
    pub operator_namespace: String,
    /// ClusterPolicy `devicePlugin.config` (name, default); name empty: no config-manager.
    pub plugin_config: (String, String),
    /// ClusterPolicy `mig.strategy`.
    pub mig_strategy: String,
    /// The device-plugin ConfigMap's data at the start (None: no ConfigMap).
    pub configmap: Option<BTreeMap<String, String>>,
    /// Node labels the user had set (e.g. `nvidia.com/device-plugin.config`).
    pub labels: BTreeMap<String, String>,
    /// Whether the node carries the `nvidia.com/gpu:NoSchedule` taint.
    pub gpu_taint: bool,
    /// Whether the MIG manager may reboot the node (`WITH_REBOOT`).
    pub with_reboot: bool,
    /// Durations.
    pub timings: Timings,
    /// Kubernetes minor version (1.35 asks `create` on pods/portforward too).
    pub minor_version: u32,
    /// NVIDIA's DRA driver on the node, with its feature gates (None: not installed):
    /// its DeviceClasses and the node's ResourceSlice exist, and claims are allocated
    /// and prepared by its rules (`sim/dra.rs`).
    pub dra: Option<super::dra::Gates>,
    /// DRA: MIG instances made on GPU 0 before the driver started, by profile (static
    /// MIG; empty: MIG off): the driver then publishes these and no whole GPU (J8).
    pub dra_mig: Vec<String>,
    /// Whether NVIDIA's device plugin runs on the node (the GPU operator's default). A
    /// node for NVIDIA's DRA driver has it off (`nvidia.com/gpu.deploy.device-plugin=false`):
    /// the driver's chart refuses to install beside it.
    pub device_plugin: bool,
    /// Virtual seconds per second of a workload's own flags (`--inject-fault-after`,
    /// `--crash-after`): the harness's wall-clock times and the pods' flags agree when
    /// this is the simulator's speed.
    pub workload_time_scale: f64,
}

impl ClusterSpec {
    /// One H100 80GB node (tainted `nvidia.com/gpu:NoSchedule`) under GPU operator
    /// v25.10.1, set up as its time-slicing guide does: ClusterPolicy
    /// `devicePlugin.config {name: device-plugin-config, default: any}` and a ConfigMap
    /// with the user's key `any` (no sharing).
    pub fn h100(node: &str) -> Self {
        Self {
            node: node.into(),
            gpu: GpuModel::h100_80gb(),
            gpus: 1,
            operator_namespace: "gpu-operator".into(),
            plugin_config: ("device-plugin-config".into(), "any".into()),
            mig_strategy: "single".into(),
            configmap: Some(BTreeMap::from([("any".to_string(), "version: v1\n".to_string())])),
            labels: BTreeMap::new(),
            gpu_taint: true,
            with_reboot: false,
            timings: Timings::default(),
            minor_version: 34,
            device_plugin: true,
            workload_time_scale: 1.0,
            dra: None,
            dra_mig: Vec::new(),
        }
    }
}

/// A stored object.
#[derive(Debug, Clone)]
pub struct Object {
    /// Its JSON.
    pub value: Value,
    /// Its field managers.
    pub managed: Managed,
}

/// The operator's operands on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OperandKind {
    /// `nvidia-device-plugin-daemonset`.
    Plugin,
    /// `gpu-feature-discovery`.
    Gfd,
    /// `nvidia-device-plugin-mps-control-daemon`.
    Mps,
}

impl OperandKind {
    pub(crate) fn app(self) -> &'static str {
        match self {
            Self::Plugin => "nvidia-device-plugin-daemonset",
            Self::Gfd => "gpu-feature-discovery",
            Self::Mps => "nvidia-device-plugin-mps-control-daemon",
        }
    }

    /// The main container's name (gpu-operator v25.10.1 assets, H14).
    pub(crate) fn container(self) -> &'static str {
        match self {
            Self::Plugin => "nvidia-device-plugin",
            Self::Gfd => "gpu-feature-discovery",
            Self::Mps => "mps-control-daemon-ctr",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// The main process of an operand pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Process {
    /// Starting (until the time), with the config it will load.
    Starting,
    /// Running with this config.
    Running(PluginConfig),
    /// Exited with this error; restarts at the time.
    Crashed(String),
}

/// One operand pod and its config-manager.
#[derive(Debug, Clone, PartialEq)]
pub struct Operand {
    /// Which.
    pub kind: OperandKind,
    /// Pod name.
    pub pod: String,
    /// Created at.
    pub created: Secs,
    /// The entry its config symlink points to (None: not yet, `Some("")`: /dev/null).
    pub linked: Option<String>,
    /// The config-manager sidecar's last error (it is crash-looping).
    pub manager_error: Option<String>,
    /// Consecutive config-manager failures (backoff).
    pub manager_failures: u32,
    /// Consecutive process failures (backoff).
    pub process_failures: u32,
    /// The main process.
    pub process: Process,
    /// Plugin: registered with the kubelet (its resources are advertised).
    pub registered: bool,
    /// Being deleted.
    pub terminating: bool,
    /// Container restarts that left no error state (the MPS sidecar's panic, H10).
    pub restarts: u32,
}

/// Events on the virtual clock.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A config-manager (sidecar or init) reads the label and links the config.
    ConfigManager(OperandKind, String),
    /// The main process (re)loads the linked config.
    Load(OperandKind, String),
    /// The plugin registers its resources.
    Register(String),
    /// GFD writes its labels (through NFD).
    Relabel(String),
    /// GFD's periodic relabel.
    GfdTick,
    /// NFD drops GFD's labels after GFD exited (it removes its features.d file).
    GfdLabelsGone,
    /// The operator's reconcile.
    OperatorTick,
    /// An operand pod is gone.
    OperandGone(OperandKind, String),
    /// The MIG manager sees the label value.
    MigLabel(String),
    /// The next step of the MIG manager's run.
    MigStep(u64),
    /// A workload pod's container (its start number) finishes starting.
    PodReady(String, u32),
    /// A workload container (its start number) does what its arguments say, at the time
    /// they say: fault (`--inject-fault-after`) or SIGKILL itself (`--crash-after`).
    Workload(String, u32, WorkloadAct),
    /// The kubelet starts an exited workload container again (its next start number).
    Restart(String, u32),
    /// The scheduler takes the workload pods created since its last pass into its queue.
    SchedulerQueue,
    /// A workload pod finishes terminating.
    PodGone(String),
    /// A claim made for a pod that is gone is deleted at last.
    ClaimGone(Key),
}

/// What a workload container does on its own, from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WorkloadAct {
    /// `--inject-fault-after`: a kernel writes through an unmapped address.
    Fault,
    /// `--crash-after`: SIGKILL to itself.
    Crash,
}

/// Where the MIG manager's run is.
#[derive(Debug, Clone, PartialEq)]
enum MigRun {
    Idle,
    /// Waiting for operand pods to go (since when), for this layout.
    WaitOperands {
        layout: String,
        since: Secs,
        id: u64,
    },
    ModeChange {
        layout: String,
        id: u64,
    },
    Apply {
        layout: String,
        id: u64,
    },
}

/// Something a test may want to know about a workload pod that the API does not show.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodFacts {
    /// Index of the GPU (or MIG parent) its device is on.
    pub gpu: Option<u32>,
    /// Replicas the plugin advertised when it was allocated.
    pub plugin_replicas: Option<u32>,
    /// Replicas the MPS daemon enforced then (1/replicas of the SMs and memory).
    pub mps_enforced: Option<u32>,
    /// Whether its device was a MIG slice.
    pub mig: bool,
    /// Its `gpushare.dev/cell` label (`mps-3`).
    pub cell: String,
    /// Its container's image.
    pub image: String,
    /// Its `gpushare.dev/role` label in an isolation trial (`victim`, `aggressor`).
    pub role: String,
    /// Its container's command as the kubelet runs it (`$(NAME)` expanded, I6); empty:
    /// the image's ENTRYPOINT.
    pub command: Vec<String>,
    /// Its container's args as the kubelet passes them (I6); empty: the image's CMD.
    pub args: Vec<String>,
    /// The DRA claim its GPU came through (empty: the device plugin's resource).
    pub claim: String,
    /// What NVIDIA's DRA driver applied when it prepared that claim (J5).
    pub dra_sharing: Option<super::dra::Sharing>,
    /// The extended resources (`nvidia.com/…`) its container's limits ask for.
    pub gpu_resources: Vec<String>,
}

/// The whole simulated cluster.
#[derive(Debug)]
pub struct World {
    /// The spec it started from.
    pub spec: ClusterSpec,
    /// Virtual time now.
    pub now: Secs,
    /// API objects.
    pub objects: BTreeMap<Key, Object>,
    /// resourceVersion counter.
    pub rv: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    /// Operand pods (live and terminating).
    pub operands: Vec<Operand>,
    /// ConfigMap data history: (time, data).
    cm_history: Vec<(Secs, BTreeMap<String, String>)>,
    /// The GPUs' MIG state.
    pub gpu_state: GpuState,
    mig: MigRun,
    /// A label value that arrived while a run was going (handled after it).
    mig_queued: bool,
    /// mig-parted's package global `NoRestartK8sDaemonsetsOnExit`: set by the first
    /// successful restart of the operands and never reset in the manager's process, so a
    /// later failure leaves the deploy labels paused (v0.13.1 `reconfigure.go`).
    mig_no_restart: bool,
    mig_seq: u64,
    /// What happened, with virtual times (for failing tests' messages).
    pub log: Vec<String>,
    /// Facts about workload pods.
    pub pod_facts: BTreeMap<String, PodFacts>,
    /// Pod name counter.
    names: u64,
    /// Workload pods bound and holding a device: pod → (resource, GPU index).
    allocations: BTreeMap<String, (String, u32)>,
    /// Workload pods in the scheduler's queue (the others were created since its last
    /// pass, which comes `informer` seconds after a pod's creation).
    queued: BTreeSet<String>,
    /// Whether a pass of the scheduler's queue is due.
    queue_due: bool,
    /// GPUs NVIDIA's DRA driver left in compute mode EXCLUSIVE_PROCESS (J5: an MPS claim
    /// sets it; only a TimeSlicing config, or unprepare with the TimeSlicingSettings gate
    /// on, sets it back to DEFAULT).
    exclusive_process: BTreeSet<u32>,
}

fn ms(t: Secs) -> u64 {
    (t * 1000.0).round().max(0.0) as u64
}

/// The GPU operator's operand label values a MIG change pauses (mig-parted v0.13.1
/// `reconfigure.go`, step 7).
pub(crate) const PAUSED: &str = "paused-for-mig-change";
pub(crate) const DEPLOY_PAUSED: [&str; 5] = [
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.nvsm",
];
/// Labels the operator adds when absent (gpu-operator v25.10.1 `state_manager.go`
/// `addGPUStateLabels`), with `mig-manager` on MIG-capable nodes.
pub(crate) const DEPLOY_LABELS: [&str; 9] = [
    "nvidia.com/gpu.deploy.driver",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.container-toolkit",
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.node-status-exporter",
    "nvidia.com/gpu.deploy.operator-validator",
    "nvidia.com/gpu.deploy.mig-manager",
];
/// The label the config-managers watch.
pub const PLUGIN_LABEL: &str = "nvidia.com/device-plugin.config";
/// The label the MIG manager watches.
pub const MIG_LABEL: &str = "nvidia.com/mig.config";
/// The MIG manager's state label.
pub const MIG_STATE: &str = "nvidia.com/mig.config.state";
/// Field manager of the simulated operator components.
pub const OPERATOR: &str = "gpu-operator";

impl World {
    /// A cluster as the spec says, with the operands up and settled.
    pub fn new(spec: ClusterSpec) -> Self {
        let mut w = Self {
            now: 0.0,
            objects: BTreeMap::new(),
            rv: 1,
            events: BinaryHeap::new(),
            seq: 0,
            operands: Vec::new(),
            cm_history: Vec::new(),
            gpu_state: GpuState { mig: None },
            mig: MigRun::Idle,
            mig_queued: false,
            mig_no_restart: false,
            mig_seq: 0,
            log: Vec::new(),
            pod_facts: BTreeMap::new(),
            names: 0,
            allocations: BTreeMap::new(),
            queued: BTreeSet::new(),
            queue_due: false,
            exclusive_process: BTreeSet::new(),
            spec,
        };
        let s = w.spec.clone();
        let ns = s.operator_namespace.clone();
        for n in [ns.as_str(), "default", "kube-system", "monitoring"] {
            w.put(
                Key::new("namespaces", "", n),
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}),
            );
        }
        w.put(
            Key::new("clusterpolicies", "", "cluster-policy"),
            json!({
                "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                "metadata": {"name": "cluster-policy"},
                "spec": {
                    "devicePlugin": {"config": {"name": s.plugin_config.0, "default": s.plugin_config.1}},
                    "mig": {"strategy": s.mig_strategy},
                    "migManager": {"enabled": true, "config": {"name": "default-mig-parted-config", "default": "all-disabled"}}
                },
                "status": {"state": "ready", "namespace": ns}
            }),
        );
        if let Some(data) = &s.configmap
            && !s.plugin_config.0.is_empty()
        {
            w.put(
                Key::new("configmaps", &ns, &s.plugin_config.0),
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": s.plugin_config.0, "namespace": ns}, "data": data}),
            );
            w.cm_history.push((0.0, data.clone()));
        }
        let mut labels: BTreeMap<String, String> = s.labels.clone();
        labels.insert("kubernetes.io/hostname".into(), s.node.clone());
        if !s.device_plugin {
            labels.insert("nvidia.com/gpu.deploy.device-plugin".into(), "false".into());
        }
        let taints = if s.gpu_taint {
            json!([{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
        } else {
            json!([])
        };
        w.put(
            Key::new("nodes", "", &s.node),
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": s.node, "labels": labels},
                "spec": {"taints": taints},
                "status": {"capacity": {"cpu": "64", "memory": "512Gi"}, "allocatable": {"cpu": "64", "memory": "512Gi"}}
            }),
        );
        // The operator itself, and its node-level operands other than the plugin's three.
        let node = s.node.clone();
        w.put(
            Key::new("deployments", &ns, "gpu-operator"),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gpu-operator", "namespace": ns},
                   "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "gpu-operator", "image": "nvcr.io/nvidia/gpu-operator:v25.10.1"}]}}}}),
        );
        for app in ["nvidia-mig-manager", "nvidia-dcgm-exporter"] {
            w.put(
                Key::new("pods", &ns, &format!("{app}-sim0")),
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("{app}-sim0"), "namespace": ns, "labels": {"app": app}},
                       "spec": {"nodeName": node, "containers": [{"name": app, "image": format!("nvcr.io/nvidia/{app}:sim")}]},
                       "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
            );
        }
        if s.dra.is_some() {
            for c in super::dra::device_classes() {
                let name = c["metadata"]["name"].as_str().unwrap_or_default().to_string();
                w.put(Key::new("deviceclasses", "", &name), c);
            }
            let mut slice = super::dra::resource_slice(&s.node, s.gpus, &s.gpu.product, s.gpu.memory_mib << 20);
            if !s.dra_mig.is_empty() {
                super::dra::make_static_mig(&mut slice, &s.dra_mig);
            }
            let name = slice["metadata"]["name"].as_str().unwrap_or_default().to_string();
            w.put(Key::new("resourceslices", "", &name), slice);
            if let Some(gates) = &s.dra {
                let (key, pod) = super::dra::kubelet_plugin_pod(&s.node, gates);
                w.add_namespace(&key.namespace);
                w.put(key, pod);
            }
        }
        // The operator's labels, then the operands as they would be after start-up.
        w.operator_reconcile();
        w.daemonsets();
        w.settle(600.0);
        w.log.clear();
        w
    }

    /// Creates a namespace (as `kubectl apply -k manifests/base` would).
    pub fn add_namespace(&mut self, name: &str) {
        self.put(
            Key::new("namespaces", "", name),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        );
    }

    /// Creates a running, ready pod (Prometheus, say) on the node.
    pub fn add_running_pod(&mut self, ns: &str, name: &str, labels: Value) {
        let node = self.spec.node.clone();
        self.put(
            Key::new("pods", ns, name),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
                   "spec": {"nodeName": node},
                   "status": {"phase": "Running", "podIP": "10.0.9.9", "conditions": [{"type": "Ready", "status": "True"}]}}),
        );
    }

    /// Stores RBAC objects (Roles, RoleBindings…) so that they can be read back.
    pub fn add_rbac(&mut self, objects: &[Value]) {
        for o in objects {
            let resource = match o["kind"].as_str() {
                Some("Role") => "roles",
                Some("RoleBinding") => "rolebindings",
                _ => continue,
            };
            let ns = o["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
            let name = o["metadata"]["name"].as_str().unwrap_or_default().to_string();
            self.put(Key::new(resource, &ns, &name), o.clone());
        }
    }

    /// Stores an object as the operator would create it.
    fn put(&mut self, key: Key, value: Value) {
        self.rv += 1;
        let mut value = value;
        value["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        value["metadata"]["creationTimestamp"] = json!(self.timestamp());
        value["metadata"]["uid"] = json!(format!("uid-{}", self.rv));
        let mut managed = Managed::default();
        let value = managed.merge_patch(&json!({}), &value, OPERATOR);
        self.objects.insert(key, Object { value, managed });
    }

    /// RFC 3339 of a virtual time (the simulation starts 2026-01-01T00:00:00Z).
    pub fn timestamp(&self) -> String {
        let s = self.now.max(0.0) as u64;
        format!("2026-01-01T{:02}:{:02}:{:02}Z", (s / 3600) % 24, (s / 60) % 60, s % 60)
    }

    fn at(&mut self, delay: Secs, e: Event) {
        self.seq += 1;
        self.events.push(Reverse((ms(self.now + delay), self.seq, e)));
    }

    fn note(&mut self, what: String) {
        self.log.push(format!("t={:.1}s {what}", self.now));
    }

    /// Runs every event due up to `until`, in order.
    pub fn advance(&mut self, until: Secs) {
        while let Some(Reverse((t, _, _))) = self.events.peek() {
            let t = *t as f64 / 1000.0;
            if t > until {
                break;
            }
            let Some(Reverse((_, _, e))) = self.events.pop() else {
                break;
            };
            self.now = self.now.max(t);
            self.handle(e);
            self.controllers();
        }
        self.now = self.now.max(until);
    }

    /// Lets `secs` of virtual time pass.
    pub fn settle(&mut self, secs: Secs) {
        self.advance(self.now + secs);
    }

    // ----- node -----

    /// The node's labels.
    pub fn node_labels(&self) -> BTreeMap<String, String> {
        self.objects
            .get(&Key::new("nodes", "", &self.spec.node))
            .and_then(|o| o.value["metadata"]["labels"].as_object())
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn label(&self, k: &str) -> Option<String> {
        self.node_labels().get(k).cloned()
    }

    /// Sets (Some) or removes (None) node labels as `manager` (a merge patch), and lets
    /// the watchers react.
    pub fn set_labels(&mut self, manager: &str, changes: &[(&str, Option<String>)]) {
        let key = Key::new("nodes", "", &self.spec.node);
        let before = self.node_labels();
        let mut patch = serde_json::Map::new();
        for (k, v) in changes {
            patch.insert((*k).into(), v.clone().map_or(Value::Null, Value::String));
        }
        self.patch_object(&key, &json!({"metadata": {"labels": patch}}), manager);
        self.labels_changed(&before);
    }

    /// Applies a merge patch to a stored object as `manager`.
    pub fn patch_object(&mut self, key: &Key, patch: &Value, manager: &str) {
        self.rv += 1;
        let rv = self.rv;
        if let Some(o) = self.objects.get_mut(key) {
            o.value = o.managed.merge_patch(&o.value, patch, manager);
            o.value["metadata"]["resourceVersion"] = json!(rv.to_string());
        }
    }

    /// Reacts to a change of the node's labels (informers: config-managers and the MIG
    /// manager only on a change of their label's value, k8s-device-plugin v0.18.1
    /// `cmd/config-manager/main.go` `continuouslySyncConfigChanges`, mig-parted v0.13.1
    /// `cmd/nvidia-mig-manager/main.go` `ContinuouslySyncMigConfigChanges`).
    pub fn labels_changed(&mut self, before: &BTreeMap<String, String>) {
        let after = self.node_labels();
        let changed = |k: &str| before.get(k) != after.get(k);
        if changed(PLUGIN_LABEL) && self.config_managers_run() {
            let delay = self.spec.timings.informer;
            for o in self.operands.clone() {
                if !o.terminating && o.manager_error.is_none() {
                    self.at(delay, Event::ConfigManager(o.kind, o.pod.clone()));
                }
            }
        }
        if changed(MIG_LABEL)
            && let Some(v) = after.get(MIG_LABEL).filter(|v| !v.is_empty())
        {
            let delay = self.spec.timings.informer;
            self.at(delay, Event::MigLabel(v.clone()));
        }
        self.controllers();
    }

    /// Whether the ClusterPolicy names a device-plugin config (gpu-operator v25.10.1
    /// `controllers/object_controls.go` `handleDevicePluginConfig`: otherwise the
    /// config-manager containers are removed from the operands).
    fn config_managers_run(&self) -> bool {
        !self.spec.plugin_config.0.is_empty()
    }

    /// The node's allocatable extended resources.
    pub fn allocatable(&self) -> BTreeMap<String, u32> {
        self.objects
            .get(&Key::new("nodes", "", &self.spec.node))
            .and_then(|o| o.value["status"]["allocatable"].as_object())
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| k.starts_with("nvidia.com/"))
                    .map(|(k, v)| (k.clone(), v.as_str().and_then(|s| s.parse().ok()).unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn set_allocatable(&mut self, res: BTreeMap<String, u32>) {
        if self.allocatable() == res {
            return;
        }
        // H12: a plugin that goes makes its devices unhealthy (allocatable 0, capacity
        // kept); a registration replaces both.
        let key = Key::new("nodes", "", &self.spec.node);
        let mut status = json!({"cpu": "64", "memory": "512Gi"});
        for (k, v) in &res {
            status[k] = json!(v.to_string());
        }
        let gone: Vec<String> = self
            .allocatable()
            .into_keys()
            .filter(|k| !res.contains_key(k))
            .collect();
        for k in &gone {
            status[k] = json!("0");
        }
        if let Some(o) = self.objects.get_mut(&key) {
            o.value["status"]["allocatable"] = status.clone();
            if !res.is_empty() {
                o.value["status"]["capacity"] = status;
            }
        }
        self.rv += 1;
        self.note(format!("allocatable {res:?}"));
    }

    // ----- ConfigMap as each operand pod sees it -----

    /// The ConfigMap's data now.
    pub fn configmap(&self) -> Option<BTreeMap<String, String>> {
        let key = Key::new("configmaps", &self.spec.operator_namespace, &self.spec.plugin_config.0);
        self.objects.get(&key).map(|o| {
            o.value["data"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default()
        })
    }

    /// Records a change of the ConfigMap (kubelet projects it into pods later).
    pub fn configmap_changed(&mut self) {
        if let Some(data) = self.configmap()
            && self.cm_history.last().map(|(_, d)| d) != Some(&data)
        {
            self.note(format!("ConfigMap keys now {:?}", data.keys().collect::<Vec<_>>()));
            self.cm_history.push((self.now, data));
        }
    }

    /// The files an operand pod's `/available-configs` volume holds now: the ConfigMap as
    /// of one projection delay ago, or as of the pod's start (A5: a new pod mounts the
    /// current content; later changes arrive with the kubelet's sync).
    fn projected(&self, o: &Operand) -> BTreeMap<String, String> {
        let seen_at = (self.now - self.spec.timings.projection[o.kind.index()]).max(o.created);
        self.cm_history
            .iter()
            .rev()
            .find(|(t, _)| *t <= seen_at)
            .map(|(_, d)| d.clone())
            .unwrap_or_default()
    }

    // ----- events -----

    fn operand(&self, kind: OperandKind, pod: &str) -> Option<usize> {
        self.operands.iter().position(|o| o.kind == kind && o.pod == pod)
    }

    fn handle(&mut self, e: Event) {
        match e {
            Event::ConfigManager(kind, pod) => self.config_manager(kind, &pod),
            Event::Load(kind, pod) => self.load(kind, &pod),
            Event::Register(pod) => {
                if let Some(i) = self.operand(OperandKind::Plugin, &pod)
                    && matches!(self.operands[i].process, Process::Running(_))
                {
                    self.register(i);
                }
            }
            Event::Relabel(pod) => self.relabel(&pod),
            Event::GfdTick => {
                if let Some(o) = self
                    .operands
                    .iter()
                    .find(|o| o.kind == OperandKind::Gfd && !o.terminating)
                {
                    let pod = o.pod.clone();
                    self.relabel(&pod);
                }
                let every = self.spec.timings.gfd_interval;
                self.at(every, Event::GfdTick);
            }
            Event::OperatorTick => {
                self.operator_reconcile();
                let every = self.spec.timings.operator_reconcile;
                self.at(every, Event::OperatorTick);
            }
            Event::GfdLabelsGone => {
                let gfd_running = self
                    .operands
                    .iter()
                    .any(|o| o.kind == OperandKind::Gfd && !o.terminating && matches!(o.process, Process::Running(_)));
                if !gfd_running {
                    let gone: Vec<String> = self.node_labels().into_keys().filter(|k| is_gfd_label(k)).collect();
                    if !gone.is_empty() {
                        self.note("NFD: GFD's labels removed (GFD is not running)".into());
                        let changes: Vec<(&str, Option<String>)> = gone.iter().map(|k| (k.as_str(), None)).collect();
                        self.set_labels("nfd-master", &changes);
                    }
                }
            }
            Event::OperandGone(kind, pod) => {
                if kind == OperandKind::Gfd {
                    let d = self.spec.timings.gfd_relabel;
                    self.at(d, Event::GfdLabelsGone);
                }
                if let Some(i) = self.operand(kind, &pod) {
                    self.operands.remove(i);
                    self.objects
                        .remove(&Key::new("pods", &self.spec.operator_namespace.clone(), &pod));
                    self.note(format!("{} pod {pod} gone", kind.app()));
                    if kind == OperandKind::Plugin {
                        self.set_allocatable(BTreeMap::new());
                    }
                }
            }
            Event::MigLabel(v) => self.mig_start(v),
            Event::MigStep(id) => self.mig_step(id),
            Event::PodReady(name, start) => self.pod_ready(&name, start),
            Event::Workload(name, start, act) => self.workload_act(&name, start, act),
            Event::Restart(name, start) => self.restart_container(&name, start),
            Event::SchedulerQueue => {
                self.queue_due = false;
                let pending: Vec<String> = self
                    .objects
                    .iter()
                    .filter(|(k, o)| k.resource == "pods" && o.value["spec"]["nodeName"].is_null())
                    .map(|(k, _)| k.name.clone())
                    .collect();
                self.queued.extend(pending);
            }
            Event::PodGone(name) => {
                self.queued.remove(&name);
                let ns = self.workload_namespace_of(&name);
                if let Some(ns) = ns {
                    self.objects.remove(&Key::new("pods", &ns, &name));
                    self.allocations.remove(&name);
                }
            }
            Event::ClaimGone(key) => {
                self.objects.remove(&key);
            }
        }
    }

    /// The config-manager of an operand pod runs (at pod start as `config-manager-init`,
    /// then as the sidecar on each label change). k8s-device-plugin v0.18.1
    /// `cmd/config-manager/main.go`: `updateConfigName` (label → file in the mounted
    /// ConfigMap: `no configuration files available`, `specified config X does not
    /// exist`; empty label → `DEFAULT_CONFIG`, else fallback `empty` → /dev/null),
    /// `updateSymlink` (unchanged target: "Already configured", no signal), then SIGHUP.
    /// An error exits the container: it restarts with the kubelet's backoff.
    fn config_manager(&mut self, kind: OperandKind, pod: &str) {
        let Some(i) = self.operand(kind, pod) else { return };
        if self.operands[i].terminating {
            return;
        }
        let label = self.label(PLUGIN_LABEL).unwrap_or_default();
        let files = self.projected(&self.operands[i]);
        let default = self.spec.plugin_config.1.clone();
        let chosen: Result<String, String> = if files.is_empty() {
            Err("no configuration files available".into())
        } else if !label.is_empty() {
            if files.contains_key(&label) {
                Ok(label.clone())
            } else {
                Err(format!("specified config {label} does not exist"))
            }
        } else if !default.is_empty() {
            if files.contains_key(&default) {
                Ok(default)
            } else {
                Err("specified config  does not exist".into())
            }
        } else {
            Ok(String::new())
        };
        match chosen {
            Err(e) => {
                let o = &mut self.operands[i];
                o.manager_failures += 1;
                o.manager_error = Some(e.clone());
                let n = o.manager_failures;
                let delay = self.backoff(n);
                self.note(format!(
                    "{} config-manager in {pod}: {e} (restart in {delay:.0} s)",
                    kind.app()
                ));
                self.at(delay, Event::ConfigManager(kind, pod.to_string()));
                self.update_operand_pod(kind, pod);
            }
            Ok(name) => {
                let o = &mut self.operands[i];
                o.manager_error = None;
                o.manager_failures = 0;
                let first = o.linked.is_none();
                let changed = o.linked.as_deref() != Some(name.as_str());
                o.linked = Some(name.clone());
                if changed && kind == OperandKind::Mps && !first {
                    // v0.18.1: the MPS pod's sidecar switches the link, then panics in
                    // `findPidToSignal` on a kernel thread's empty cmdline (hostPID), and
                    // after its restart finds "Already configured": the daemon keeps the
                    // config it started with until its pod is recreated (H10).
                    o.restarts += 1;
                    self.note(format!(
                        "{} config-manager in {pod}: Updating to config: {name}; panic: index out of range [0] with length 0 (daemon keeps its old config)",
                        kind.app()
                    ));
                } else if changed && !first && matches!(o.process, Process::Crashed(_)) {
                    // The link switches, then `findPidToSignal` finds no process: the
                    // sidecar exits and, restarted, finds "Already configured". The
                    // process takes the new file at its own crash-loop restart.
                    o.restarts += 1;
                    self.note(format!(
                        "{} config-manager in {pod}: Updating to config: {name}; error finding pid: no process found",
                        kind.app()
                    ));
                } else if changed {
                    self.note(format!(
                        "{} config-manager in {pod}: Updating to config: {name}",
                        kind.app()
                    ));
                    // SIGHUP (or the first start after config-manager-init).
                    self.at(0.0, Event::Load(kind, pod.to_string()));
                }
                self.update_operand_pod(kind, pod);
            }
        }
    }

    /// The kubelet's wait before starting a container that exited for the
    /// `failures`-th time in a row (UPSTREAM-RULES.md I2): none after the first exit,
    /// then the first back-off doubling to the cap, counted from the exit.
    fn backoff(&self, failures: u32) -> Secs {
        let (base, cap) = self.spec.timings.backoff;
        match failures {
            0 | 1 => 0.0,
            n => (base * 2f64.powi((n - 2).min(16) as i32)).min(cap),
        }
    }

    /// The main process (re)loads its config: `cmd/nvidia-device-plugin/main.go`
    /// `startPlugins`/`loadConfig` (an invalid config exits 1: CrashLoopBackOff),
    /// `cmd/gpu-feature-discovery/main.go` `start`, `cmd/mps-control-daemon/main.go`
    /// `startDaemons` (not MPS: "skipping", no daemon).
    fn load(&mut self, kind: OperandKind, pod: &str) {
        let Some(i) = self.operand(kind, pod) else { return };
        if self.operands[i].terminating {
            return;
        }
        let linked = self.operands[i].linked.clone().unwrap_or_default();
        let text = if linked.is_empty() {
            String::new()
        } else {
            self.projected(&self.operands[i])
                .get(&linked)
                .cloned()
                .unwrap_or_default()
        };
        let mig_enabled = self.gpu_state.mig.is_some();
        let strategy = self.spec.mig_strategy.clone();
        let parsed = gpu::parse_plugin_config(&text)
            .and_then(|c| gpu::check_against_gpus(&c, mig_enabled, &strategy).map(|()| c));
        if kind == OperandKind::Plugin {
            self.operands[i].registered = false;
            self.set_allocatable(BTreeMap::new());
        }
        match parsed {
            Err(e) => {
                let o = &mut self.operands[i];
                o.process_failures += 1;
                o.process = Process::Crashed(e.clone());
                let n = o.process_failures;
                let delay = self.backoff(n);
                self.note(format!("{} {pod} exited: {e} (restart in {delay:.0} s)", kind.app()));
                self.at(delay, Event::Load(kind, pod.to_string()));
                if kind == OperandKind::Gfd {
                    let d = self.spec.timings.gfd_relabel;
                    self.at(d, Event::GfdLabelsGone);
                }
            }
            Ok(c) => {
                let o = &mut self.operands[i];
                o.process_failures = 0;
                o.process = Process::Running(c.clone());
                let t = self.spec.timings.clone();
                match kind {
                    OperandKind::Plugin => self.at(t.plugin_restart, Event::Register(pod.to_string())),
                    OperandKind::Gfd => self.at(t.gfd_relabel, Event::Relabel(pod.to_string())),
                    OperandKind::Mps => {
                        let what = match c.sharing {
                            Sharing::Mps { replicas } => format!("MPS daemon enforcing {replicas} replicas"),
                            _ => "Sharing strategy is not MPS; skipping".into(),
                        };
                        self.note(format!("{pod}: {what}"));
                    }
                }
            }
        }
        self.update_operand_pod(kind, pod);
    }

    /// The MPS daemon's enforced replicas, when it is up and serving MPS
    /// (`cmd/mps-control-daemon/mps/daemon.go` `Start`: ready after start-up).
    pub fn mps_enforced(&self) -> Option<u32> {
        self.operands
            .iter()
            .find_map(|o| match (&o.process, o.kind, o.terminating) {
                (Process::Running(c), OperandKind::Mps, false) => match c.sharing {
                    Sharing::Mps { replicas } => Some(replicas),
                    _ => None,
                },
                _ => None,
            })
    }

    /// The plugin registers: with MPS only once the daemon answers (`internal/plugin/mps.go`
    /// `waitForDaemon`; else "Retrying in 30s").
    fn register(&mut self, i: usize) {
        let Process::Running(config) = self.operands[i].process.clone() else {
            return;
        };
        let pod = self.operands[i].pod.clone();
        if matches!(config.sharing, Sharing::Mps { .. }) && self.mps_enforced().is_none() {
            self.note(format!("device plugin {pod}: MPS daemon not healthy; Retrying in 30s"));
            let retry = self.spec.timings.mps_retry;
            self.at(retry, Event::Register(pod));
            return;
        }
        self.operands[i].registered = true;
        let strategy = self.spec.mig_strategy.clone();
        let adv = gpu::advertised(self.spec.gpus, &self.gpu_state, &config, &strategy);
        self.set_allocatable(adv);
    }

    /// The config GFD runs with, if it runs.
    fn gfd_config(&self, pod: &str) -> Option<PluginConfig> {
        self.operands
            .iter()
            .find_map(|o| match (&o.process, o.kind == OperandKind::Gfd && o.pod == pod) {
                (Process::Running(c), true) => Some(c.clone()),
                _ => None,
            })
    }

    fn relabel(&mut self, pod: &str) {
        let Some(config) = self.gfd_config(pod) else { return };
        let strategy = self.spec.mig_strategy.clone();
        let labels = gpu::gfd_labels(&self.spec.gpu, self.spec.gpus, &self.gpu_state, &config, &strategy);
        let current = self.node_labels();
        let mut changes: Vec<(&str, Option<String>)> = Vec::new();
        // NFD replaces GFD's label set: old MIG-mixed labels go.
        for k in current.keys() {
            if is_gfd_label(k) && !labels.contains_key(k) {
                changes.push((k.as_str(), None));
            }
        }
        for (k, v) in &labels {
            if current.get(k) != Some(v) {
                changes.push((k.as_str(), Some(v.clone())));
            }
        }
        if changes.is_empty() {
            return;
        }
        let owned: Vec<(String, Option<String>)> = changes.iter().map(|(k, v)| ((*k).to_string(), v.clone())).collect();
        let refs: Vec<(&str, Option<String>)> = owned.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        self.note(format!(
            "GFD labels: {}",
            owned
                .iter()
                .map(|(k, v)| format!(
                    "{}={}",
                    k.trim_start_matches("nvidia.com/"),
                    v.as_deref().unwrap_or("-")
                ))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        self.set_labels("nfd-master", &refs);
    }

    /// The operator's node labels: the deploy labels when absent, and `mig.config`
    /// `all-disabled` on MIG-capable nodes that have none (gpu-operator v25.10.1
    /// `controllers/state_manager.go`).
    fn operator_reconcile(&mut self) {
        let labels = self.node_labels();
        let mut changes: Vec<(&str, Option<String>)> = Vec::new();
        let mig_capable = !self.spec.gpu.mig_profiles.is_empty();
        for k in DEPLOY_LABELS {
            if k.ends_with("mig-manager") && !mig_capable {
                continue;
            }
            if !labels.contains_key(k) {
                changes.push((k, Some("true".into())));
            }
        }
        if mig_capable && labels.get(MIG_LABEL).is_none_or(String::is_empty) {
            changes.push((MIG_LABEL, Some("all-disabled".into())));
        }
        if !changes.is_empty() {
            self.set_labels(OPERATOR, &changes);
        }
        if self.events.iter().all(|Reverse((_, _, e))| *e != Event::OperatorTick) {
            let every = self.spec.timings.operator_reconcile;
            self.at(every, Event::OperatorTick);
            let every = self.spec.timings.gfd_interval;
            self.at(every, Event::GfdTick);
        }
    }

    // ----- DaemonSets: operand pods follow the node's labels -----

    /// Operand pods exist while their DaemonSet's node selector matches: the plugin and
    /// GFD on `nvidia.com/gpu.deploy.{device-plugin,gpu-feature-discovery}=true`, the MPS
    /// daemon also on `nvidia.com/mps.capable=true` (gpu-operator v25.10.1
    /// `assets/state-mps-control-daemon/0400_daemonset.yaml`).
    fn daemonsets(&mut self) {
        let labels = self.node_labels();
        let is_true = |k: &str| labels.get(k).map(String::as_str) == Some("true");
        let want = [
            (OperandKind::Plugin, is_true("nvidia.com/gpu.deploy.device-plugin")),
            (OperandKind::Gfd, is_true("nvidia.com/gpu.deploy.gpu-feature-discovery")),
            (
                OperandKind::Mps,
                is_true("nvidia.com/gpu.deploy.device-plugin") && is_true("nvidia.com/mps.capable"),
            ),
        ];
        for (kind, wanted) in want {
            let live = self.operands.iter().position(|o| o.kind == kind && !o.terminating);
            match (live, wanted) {
                (None, true) => {
                    self.names += 1;
                    let pod = format!("{}-{:05x}", kind.app(), self.names * 7919 % 0xfffff);
                    self.operands.push(Operand {
                        kind,
                        pod: pod.clone(),
                        created: self.now,
                        linked: None,
                        manager_error: None,
                        manager_failures: 0,
                        process_failures: 0,
                        process: Process::Starting,
                        registered: false,
                        terminating: false,
                        restarts: 0,
                    });
                    let ns = self.spec.operator_namespace.clone();
                    let node = self.spec.node.clone();
                    self.put(
                        Key::new("pods", &ns, &pod),
                        json!({
                            "apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": pod, "namespace": ns, "labels": {"app": kind.app()}},
                            "spec": {"nodeName": node, "containers": [{"name": kind.container(), "image": "nvcr.io/nvidia/k8s-device-plugin:v0.18.1"}]},
                            "status": {"phase": "Pending"}
                        }),
                    );
                    self.note(format!("{} pod {pod} created", kind.app()));
                    let start = self.spec.timings.operand_start;
                    if self.config_managers_run() {
                        self.at(start, Event::ConfigManager(kind, pod));
                    } else {
                        // No config-manager: the process reads no config file.
                        if let Some(i) = self.operand(kind, &pod) {
                            self.operands[i].linked = Some(String::new());
                        }
                        self.at(start, Event::Load(kind, pod));
                    }
                }
                (Some(i), false) => {
                    self.operands[i].terminating = true;
                    self.operands[i].registered = false;
                    let pod = self.operands[i].pod.clone();
                    if kind == OperandKind::Plugin {
                        self.set_allocatable(BTreeMap::new());
                    }
                    let stop = self.spec.timings.operand_stop;
                    self.note(format!("{} pod {pod} terminating", kind.app()));
                    self.at(stop, Event::OperandGone(kind, pod));
                }
                _ => {}
            }
        }
    }

    fn update_operand_pod(&mut self, kind: OperandKind, pod: &str) {
        let Some(i) = self.operand(kind, pod) else { return };
        let o = self.operands[i].clone();
        let (phase, ready, waiting) = match (&o.manager_error, &o.process) {
            (Some(e), _) if o.linked.is_none() => ("Pending", false, Some(("Init:CrashLoopBackOff", e.clone()))),
            (Some(e), _) => ("Running", false, Some(("CrashLoopBackOff", e.clone()))),
            (None, Process::Crashed(e)) => ("Running", false, Some(("CrashLoopBackOff", e.clone()))),
            (None, Process::Running(_)) => ("Running", true, None),
            (None, Process::Starting) => ("Pending", false, None),
        };
        let ns = self.spec.operator_namespace.clone();
        let key = Key::new("pods", &ns, pod);
        let mut status = json!({
            "phase": phase,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        });
        if let Some((reason, message)) = waiting {
            status["containerStatuses"] = json!([{"name": "main", "ready": false, "restartCount": o.process_failures + o.manager_failures + o.restarts,
                "state": {"waiting": {"reason": reason, "message": message}}}]);
        }
        if let Some(obj) = self.objects.get_mut(&key) {
            obj.value["status"] = status;
        }
    }

    // ----- MIG manager (mig-parted v0.13.1 pkg/mig/reconfigure/reconfigure.go `Run`) -----

    /// `nvidia-mig-parted assert`: every GPU matching the layout's device filter is in
    /// the layout (a layout no GPU matches fails the assert, F4).
    fn mig_asserts(&self, layout: &str) -> bool {
        let Some((filter, profile)) = gpu::mig_layout(layout) else {
            return false;
        };
        if !filter.is_empty() && !filter.contains(&self.spec.gpu.pci_device_id) {
            return false;
        }
        self.gpu_state.mig.as_ref().map(|(p, _)| p.as_str()) == profile
    }

    /// The MIG manager's loop handles one label value at a time: a value that arrives
    /// during a run waits for it (`main.go`: `migConfig.Get()` then `reconfigure`), and
    /// the latest value is what runs next.
    fn mig_start(&mut self, layout: String) {
        if self.mig != MigRun::Idle {
            self.mig_queued = true;
            return;
        }
        if self.label(MIG_LABEL).as_deref() != Some(layout.as_str()) {
            return; // superseded
        }
        // `assert --valid-config`: the name must exist in the mig-parted config.
        if gpu::mig_layout(&layout).is_none() {
            self.note(format!("mig-manager: {layout} is not in the mig-parted config: failed"));
            self.set_labels("nvidia-mig-manager", &[(MIG_STATE, Some("failed".into()))]);
            return;
        }
        // Already applied: success at once, no `pending` (step 3).
        if self.mig_asserts(&layout) {
            self.set_labels("nvidia-mig-manager", &[(MIG_STATE, Some("success".into()))]);
            return;
        }
        self.mig_seq += 1;
        let id = self.mig_seq;
        // Step 6 comes after validation and persisting: until then the old state shows.
        self.mig = MigRun::WaitOperands {
            layout,
            since: self.now + self.spec.timings.mig_validate,
            id,
        };
        let d = self.spec.timings.mig_validate;
        self.at(d, Event::MigStep(id));
    }

    /// A run ended: the value that arrived meanwhile is next.
    fn mig_done(&mut self) {
        self.mig = MigRun::Idle;
        if std::mem::take(&mut self.mig_queued)
            && let Some(v) = self.label(MIG_LABEL).filter(|v| !v.is_empty())
        {
            self.at(0.0, Event::MigLabel(v));
        }
    }

    fn mig_step(&mut self, id: u64) {
        let labels = self.node_labels();
        match self.mig.clone() {
            MigRun::WaitOperands { layout, since, id: run } if run == id => {
                if labels.get(MIG_STATE).map(String::as_str) != Some("pending") {
                    self.note(format!("mig-manager: applying {layout}: pending"));
                    let mut changes: Vec<(&str, Option<String>)> = vec![(MIG_STATE, Some("pending".into()))];
                    for k in DEPLOY_PAUSED {
                        if labels.get(k).map(String::as_str) != Some("false") {
                            changes.push((k, Some(PAUSED.into())));
                        }
                    }
                    self.set_labels("nvidia-mig-manager", &changes);
                }
                let gone = !self
                    .operands
                    .iter()
                    .any(|o| matches!(o.kind, OperandKind::Plugin | OperandKind::Gfd));
                if gone {
                    self.mig = MigRun::ModeChange { layout, id };
                    self.at(0.0, Event::MigStep(id));
                } else if self.now - since > 300.0 {
                    // Timeout: returns without a state; the node stays pending, paused.
                    self.note(
                        "mig-manager: operand pods did not go within 5 min; giving up (state stays pending)".into(),
                    );
                    self.mig = MigRun::Idle;
                } else {
                    self.at(1.0, Event::MigStep(id));
                }
            }
            MigRun::ModeChange { layout, id: run } if run == id => {
                let busy = !self.allocations.is_empty();
                let (_, profile) = gpu::mig_layout(&layout).unwrap_or_default();
                let want_enabled = profile.is_some();
                if want_enabled != self.gpu_state.mig.is_some() && busy {
                    // The mode change fails on a GPU in use (F3); without reboot the
                    // run goes on to apply, which fails too.
                    self.mig_fail(&format!("{layout}: GPU in use by workload pods"));
                    return;
                }
                self.mig = MigRun::Apply { layout, id };
                let d = if want_enabled != self.gpu_state.mig.is_some() {
                    self.spec.timings.mig_mode
                } else {
                    0.0
                };
                self.at(d, Event::MigStep(id));
            }
            MigRun::Apply { layout, id: run } if run == id => {
                let (filter, profile) = gpu::mig_layout(&layout).unwrap_or_default();
                let matches = filter.is_empty() || filter.contains(&self.spec.gpu.pci_device_id);
                if matches {
                    match profile {
                        None => self.gpu_state.mig = None,
                        Some(p) => {
                            let Some(count) = self
                                .spec
                                .gpu
                                .mig_profiles
                                .iter()
                                .find(|(name, _)| name == p)
                                .map(|(_, c)| *c)
                            else {
                                self.mig_fail(&format!(
                                    "error setting MIGConfig: profile {p} is not supported by this GPU"
                                ));
                                return;
                            };
                            self.gpu_state.mig = Some((p.to_string(), count));
                        }
                    }
                }
                // F4: no matching entry → nothing applied, yet success.
                self.note(format!(
                    "mig-manager: {layout} applied (GPUs now {:?}): success",
                    self.gpu_state.mig
                ));
                let mut changes: Vec<(&str, Option<String>)> = Vec::new();
                for k in DEPLOY_PAUSED {
                    if labels.get(k).map(String::as_str) == Some(PAUSED) {
                        changes.push((k, Some("true".into())));
                    }
                }
                changes.push((MIG_STATE, Some("success".into())));
                self.mig_no_restart = true;
                self.set_labels("nvidia-mig-manager", &changes);
                self.mig_done();
            }
            _ => {}
        }
    }

    fn mig_fail(&mut self, why: &str) {
        self.note(format!("mig-manager: {why}: failed"));
        let labels = self.node_labels();
        let mut changes: Vec<(&str, Option<String>)> = Vec::new();
        if !self.mig_no_restart {
            for k in DEPLOY_PAUSED {
                if labels.get(k).map(String::as_str) == Some(PAUSED) {
                    changes.push((k, Some("true".into())));
                }
            }
        }
        changes.push((MIG_STATE, Some("failed".into())));
        self.set_labels("nvidia-mig-manager", &changes);
        self.mig_done();
    }

    // ----- workload: Deployment controller, scheduler, kubelet -----

    fn workload_namespace_of(&self, pod: &str) -> Option<String> {
        self.objects
            .keys()
            .find(|k| k.resource == "pods" && k.name == pod)
            .map(|k| k.namespace.clone())
    }

    /// Level-triggered controllers, run after every event and every API write. The
    /// Deployment controller is reduced to one ReplicaSet per template hash that replaces
    /// stale pods and pods that are not active: kubernetes/kubernetes
    /// `pkg/controller/controller_utils.go` `IsPodActive` (read at commit 1f8996f8; the
    /// same function stands in release-1.32): phase neither Succeeded nor Failed, and no
    /// deletion timestamp. The rest of the ReplicaSet controller was not read.
    pub fn controllers(&mut self) {
        self.daemonsets();
        self.deployments();
        self.resource_claims();
        self.schedule();
    }

    /// Devices every allocated claim holds (J4: a device goes to one claim at a time).
    fn devices_taken(&self) -> BTreeSet<super::dra::Allocated> {
        self.objects
            .iter()
            .filter(|(k, _)| k.resource == "resourceclaims")
            .flat_map(|(_, o)| {
                o.value["status"]["allocation"]["devices"]["results"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|r| super::dra::Allocated {
                driver: r["driver"].as_str().unwrap_or_default().into(),
                pool: r["pool"].as_str().unwrap_or_default().into(),
                device: r["device"].as_str().unwrap_or_default().into(),
            })
            .collect()
    }

    /// The resourceclaim controller and the garbage collector for claims (J7: kubernetes
    /// `pkg/controller/resourceclaim/controller.go` `handleClaim`, `syncClaim`): a claim
    /// per pod for each template reference (`<pod>-<name>-<5 chars>`, owned by the pod,
    /// annotated `resource.kubernetes.io/pod-claim-name`, recorded in the pod's
    /// `status.resourceClaimStatuses`); reservations of pods that are gone dropped; a
    /// claim that no pod reserves any more deallocated (its allocation and finalizer
    /// cleared); a deleted claim removed once it has no finalizer; a pod's own claims
    /// deleted with it.
    fn resource_claims(&mut self) {
        let pods: Vec<(Key, Value)> = self
            .objects
            .iter()
            .filter(|(k, o)| {
                k.resource == "pods"
                    && o.value["metadata"]["deletionTimestamp"].is_null()
                    && o.value["status"]["resourceClaimStatuses"].is_null()
                    && o.value["spec"]["resourceClaims"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["resourceClaimTemplateName"].is_string()))
            })
            .map(|(k, o)| (k.clone(), o.value.clone()))
            .collect();
        for (key, pod) in pods {
            let mut statuses = Vec::new();
            let mut missing = false;
            for rc in pod["spec"]["resourceClaims"].as_array().into_iter().flatten() {
                let pod_claim = rc["name"].as_str().unwrap_or_default();
                let Some(template) = rc["resourceClaimTemplateName"].as_str() else {
                    continue;
                };
                let Some(t) = self
                    .objects
                    .get(&Key::new("resourceclaimtemplates", &key.namespace, template))
                    .map(|o| o.value.clone())
                else {
                    missing = true;
                    continue;
                };
                self.names += 1;
                let name = format!("{}-{pod_claim}-{:05x}", key.name, self.names * 7919 % 0xfffff);
                self.put(
                    Key::new("resourceclaims", &key.namespace, &name),
                    json!({
                        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": name, "namespace": key.namespace,
                                     "labels": t["spec"]["metadata"]["labels"],
                                     "annotations": {"resource.kubernetes.io/pod-claim-name": pod_claim},
                                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": key.name,
                                                          "uid": pod["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]},
                        "spec": t["spec"]["spec"]
                    }),
                );
                statuses.push(json!({"name": pod_claim, "resourceClaimName": name}));
            }
            if !missing && let Some(o) = self.objects.get_mut(&key) {
                o.value["status"]["resourceClaimStatuses"] = json!(statuses);
            }
        }
        let live: BTreeSet<(String, String)> = self
            .objects
            .keys()
            .filter(|k| k.resource == "pods")
            .map(|k| (k.namespace.clone(), k.name.clone()))
            .collect();
        let claims: Vec<Key> = self
            .objects
            .keys()
            .filter(|k| k.resource == "resourceclaims")
            .cloned()
            .collect();
        let ts = self.timestamp();
        for key in claims {
            let Some(o) = self.objects.get_mut(&key) else { continue };
            let owner = &o.value["metadata"]["ownerReferences"][0];
            if owner["kind"] == json!("Pod")
                && !live.contains(&(
                    key.namespace.clone(),
                    owner["name"].as_str().unwrap_or_default().to_string(),
                ))
            {
                // Deleted, still allocated, gone `claim_gc` later.
                if o.value["metadata"]["deletionTimestamp"].is_null() {
                    o.value["metadata"]["deletionTimestamp"] = json!(ts);
                    let d = self.spec.timings.claim_gc;
                    self.at(d, Event::ClaimGone(key.clone()));
                }
                continue;
            }
            let reserved = o.value["status"]["reservedFor"].as_array().cloned().unwrap_or_default();
            let kept: Vec<Value> = reserved
                .iter()
                .filter(|r| {
                    live.contains(&(
                        key.namespace.clone(),
                        r["name"].as_str().unwrap_or_default().to_string(),
                    ))
                })
                .cloned()
                .collect();
            if kept.len() != reserved.len() {
                o.value["status"]["reservedFor"] = json!(kept);
                if kept.is_empty() {
                    // Unprepare: with TimeSlicingSettings on the driver resets the GPU's
                    // compute mode and time slice to their defaults (J5).
                    if self.spec.dra.as_ref().is_some_and(|g| g.time_slicing)
                        && let Some(i) = o.value["status"]["allocation"]["devices"]["results"][0]["device"]
                            .as_str()
                            .and_then(|d| d.strip_prefix("gpu-"))
                            .and_then(|i| i.parse::<u32>().ok())
                    {
                        self.exclusive_process.remove(&i);
                    }
                    o.value["status"]["allocation"] = Value::Null;
                    o.value["status"]["reservedFor"] = Value::Null;
                    o.value["metadata"]["finalizers"] = Value::Null;
                }
            }
            let unreserved = o.value["status"]["reservedFor"].as_array().is_none_or(Vec::is_empty);
            if !o.value["metadata"]["deletionTimestamp"].is_null() && unreserved {
                // Nothing reserves it: its allocation goes with the finalizer, and the
                // deletion completes.
                self.objects.remove(&key);
            }
        }
    }

    /// Scheduling a pod with DRA claims (J4): each claim exists, is not being deleted, and
    /// is allocated already or can be now. Ok: the claims' keys with the allocations to
    /// write (None: allocated before).
    #[allow(clippy::type_complexity)]
    fn claims_fit(
        &self,
        pod_key: &Key,
        pod: &Value,
    ) -> Result<Vec<(Key, Option<(Value, Vec<super::dra::Allocated>)>)>, String> {
        let classes: BTreeMap<String, Value> = self
            .objects
            .iter()
            .filter(|(k, _)| k.resource == "deviceclasses")
            .map(|(k, o)| (k.name.clone(), o.value.clone()))
            .collect();
        let slices: Vec<Value> = self
            .objects
            .iter()
            .filter(|(k, _)| k.resource == "resourceslices")
            .map(|(_, o)| o.value.clone())
            .collect();
        let mut taken = self.devices_taken();
        let mut out = Vec::new();
        for rc in pod["spec"]["resourceClaims"].as_array().into_iter().flatten() {
            let pod_claim = rc["name"].as_str().unwrap_or_default();
            let name = match (
                rc["resourceClaimName"].as_str(),
                rc["resourceClaimTemplateName"].is_string(),
            ) {
                (Some(n), _) => n.to_string(),
                (None, true) => pod["status"]["resourceClaimStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|s| s["name"] == json!(pod_claim))
                    .and_then(|s| s["resourceClaimName"].as_str())
                    .map(str::to_string)
                    .ok_or_else(|| {
                        format!(
                            "pod \"{}/{}\": ResourceClaim not created yet",
                            pod_key.namespace, pod_key.name
                        )
                    })?,
                (None, false) => continue,
            };
            let key = Key::new("resourceclaims", &pod_key.namespace, &name);
            let Some(claim) = self.objects.get(&key) else {
                return Err(format!("resourceclaim \"{name}\" not found"));
            };
            if !claim.value["metadata"]["deletionTimestamp"].is_null() {
                return Err(format!(
                    "0/1 nodes are available: resourceclaim \"{name}\" is being deleted."
                ));
            }
            if !claim.value["status"]["allocation"].is_null() {
                out.push((key, None));
                continue;
            }
            let (allocation, devices) = super::dra::allocate(&claim.value, &classes, &slices, &taken, &self.spec.node)
                .map_err(|r| super::dra::unschedulable(&r))?;
            taken.extend(devices.iter().cloned());
            out.push((key, Some((allocation, devices))));
        }
        Ok(out)
    }

    fn deployments(&mut self) {
        let deps: Vec<(Key, Value)> = self
            .objects
            .iter()
            .filter(|(k, _)| k.resource == "deployments")
            .map(|(k, o)| (k.clone(), o.value.clone()))
            .collect();
        for (key, d) in &deps {
            let template = &d["spec"]["template"];
            let hash = format!("{:08x}", fnv(&template.to_string()));
            let want = d["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
            let mine: Vec<(String, Value)> = self
                .objects
                .iter()
                .filter(|(k, o)| {
                    k.resource == "pods"
                        && k.namespace == key.namespace
                        && o.value["metadata"]["ownerReferences"][0]["name"] == json!(key.name)
                        && o.value["metadata"]["deletionTimestamp"].is_null()
                        // `IsPodActive`: a Succeeded or Failed pod is replaced, not counted.
                        && o.value["status"]["phase"] != json!("Failed")
                        && o.value["status"]["phase"] != json!("Succeeded")
                })
                .map(|(k, o)| (k.name.clone(), o.value.clone()))
                .collect();
            let (current, stale): (Vec<_>, Vec<_>) = mine
                .into_iter()
                .partition(|(_, p)| p["metadata"]["labels"]["pod-template-hash"] == json!(hash));
            for (name, _) in stale {
                self.terminate_pod(&key.namespace, &name);
            }
            for (name, _) in current.iter().skip(want) {
                self.terminate_pod(&key.namespace, name);
            }
            for _ in current.len()..want {
                self.names += 1;
                let name = format!("{}-{hash}-{:05x}", key.name, self.names * 104729 % 0xfffff);
                let mut labels = template["metadata"]["labels"].clone();
                labels["pod-template-hash"] = json!(hash);
                if !self.queue_due {
                    self.queue_due = true;
                    let d = self.spec.timings.scheduler_queue;
                    self.at(d, Event::SchedulerQueue);
                }
                self.put(
                    Key::new("pods", &key.namespace, &name),
                    json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name, "namespace": key.namespace, "labels": labels,
                                     "ownerReferences": [{"kind": "ReplicaSet", "name": key.name}]},
                        "spec": template["spec"].clone(),
                        "status": {"phase": "Pending"}
                    }),
                );
            }
        }
        // Pods whose Deployment is gone (garbage collection).
        let orphans: Vec<Key> = self
            .objects
            .iter()
            .filter(|(k, o)| {
                k.resource == "pods"
                    && o.value["metadata"]["ownerReferences"][0]["kind"] == json!("ReplicaSet")
                    && o.value["metadata"]["deletionTimestamp"].is_null()
                    && !deps.iter().any(|(dk, _)| {
                        dk.namespace == k.namespace
                            && o.value["metadata"]["ownerReferences"][0]["name"] == json!(dk.name)
                    })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in orphans {
            self.terminate_pod(&k.namespace, &k.name);
        }
    }

    /// Starts a pod's termination (graceful: it goes after `pod_stop`).
    pub fn terminate_pod(&mut self, ns: &str, name: &str) {
        let ts = self.timestamp();
        let key = Key::new("pods", ns, name);
        let Some(o) = self.objects.get_mut(&key) else { return };
        if !o.value["metadata"]["deletionTimestamp"].is_null() {
            return;
        }
        o.value["metadata"]["deletionTimestamp"] = json!(ts);
        let bound = !o.value["spec"]["nodeName"].is_null();
        let d = if bound { self.spec.timings.pod_stop } else { 0.0 };
        self.at(d, Event::PodGone(name.to_string()));
    }

    /// The scheduler and the kubelet's admission for unbound workload pods: node
    /// selector, node affinity (`matchFields metadata.name`), taints and tolerations, and
    /// the extended resource against allocatable minus what bound pods hold. These are
    /// the documented Kubernetes semantics; kube-scheduler's plugins were not read, and
    /// the Unschedulable messages follow their usual form, not their source. Admission
    /// runs the device plugin's `Allocate` (k8s-device-plugin v0.18.1 `internal/rm/rm.go`
    /// `ValidateRequest`: more than one shared device → UnexpectedAdmissionError, pod
    /// Failed) and picks a device (`internal/rm/allocate.go` `distributedAlloc`: the GPU
    /// with the fewest replicas in use).
    ///
    /// Only pods in the scheduler's queue are tried: a pod joins it at the first pass
    /// `scheduler_queue` seconds after its creation, and pods that join together are tried in
    /// name order, since their queue timestamps tie (`PrioritySort.Less`, UPSTREAM-RULES.md
    /// I1): two Deployments applied at once may see either's pod bound first.
    fn schedule(&mut self) {
        let node = self.spec.node.clone();
        let labels = self.node_labels();
        let alloc = self.allocatable();
        let pending: Vec<(Key, Value)> = self
            .objects
            .iter()
            .filter(|(k, o)| {
                k.resource == "pods"
                    && self.queued.contains(&k.name)
                    && o.value["metadata"]["ownerReferences"][0]["kind"] == json!("ReplicaSet")
                    && o.value["spec"]["nodeName"].is_null()
                    && o.value["metadata"]["deletionTimestamp"].is_null()
                    && o.value["status"]["phase"] == json!("Pending")
            })
            .map(|(k, o)| (k.clone(), o.value.clone()))
            .collect();
        for (key, pod) in pending {
            let spec = &pod["spec"];
            let selector_ok = spec["nodeSelector"]
                .as_object()
                .is_none_or(|m| m.iter().all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str()));
            let affinity_ok =
                spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                    .as_array()
                    .is_none_or(|terms| {
                        terms.iter().any(|t| {
                            t["matchFields"].as_array().into_iter().flatten().all(|f| {
                                f["key"] == json!("metadata.name")
                                    && f["operator"] == json!("In")
                                    && f["values"].as_array().is_some_and(|v| v.contains(&json!(node)))
                            }) && t["matchExpressions"].as_array().into_iter().flatten().all(|e| {
                                let have = labels.get(e["key"].as_str().unwrap_or_default());
                                let values = e["values"].as_array().cloned().unwrap_or_default();
                                match e["operator"].as_str() {
                                    Some("In") => have.is_some_and(|h| values.contains(&json!(h))),
                                    Some("Exists") => have.is_some(),
                                    _ => false,
                                }
                            })
                        })
                    });
            let tolerated = !self.spec.gpu_taint
                || spec["tolerations"]
                    .as_array()
                    .is_some_and(|ts| ts.iter().any(tolerates_gpu_taint));
            let limits = spec["containers"][0]["resources"]["limits"].clone();
            let (resource, want) = limits
                .as_object()
                .and_then(|m| m.iter().find(|(k, _)| k.starts_with("nvidia.com/")))
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_u64()
                            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                            .unwrap_or(1),
                    )
                })
                .unwrap_or_default();
            let used = self.allocations.values().filter(|(r, _)| *r == resource).count() as u64;
            let free = u64::from(alloc.get(&resource).copied().unwrap_or(0)).saturating_sub(used);
            let dra_pod = spec["resourceClaims"].as_array().is_some_and(|c| !c.is_empty());
            let claims = if dra_pod {
                self.claims_fit(&key, &pod)
            } else {
                Ok(Vec::new())
            };
            let why = if !selector_ok || !affinity_ok {
                Some("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.".to_string())
            } else if !tolerated {
                Some("0/1 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: }.".to_string())
            } else if !resource.is_empty() && free < want {
                Some(format!("0/1 nodes are available: 1 Insufficient {resource}."))
            } else if let Err(why) = &claims {
                Some(why.clone())
            } else {
                None
            };
            let ts = self.timestamp();
            let Some(obj) = self.objects.get_mut(&key) else {
                continue;
            };
            if let Some(why) = why {
                obj.value["status"]["conditions"] =
                    json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}]);
                continue;
            }
            obj.value["spec"]["nodeName"] = json!(node);
            if dra_pod {
                let claims = claims.unwrap_or_default();
                self.bind_with_claims(&key, &pod, claims, &ts);
                continue;
            }
            // Admission: the plugin's Allocate.
            let config = self
                .operands
                .iter()
                .find_map(|o| match (&o.process, o.kind, o.registered) {
                    (Process::Running(c), OperandKind::Plugin, true) => Some(c.clone()),
                    _ => None,
                });
            let rejected = match &config {
                None => Some(format!(
                    "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices {resource}, which is unexpected"
                )),
                Some(c) => {
                    let shared_strict = match c.sharing {
                        Sharing::Mps { .. } => true,
                        Sharing::TimeSlicing { fail_gt_one, .. } => fail_gt_one,
                        Sharing::None => false,
                    };
                    (shared_strict && want > 1).then(|| {
                        format!(
                            "Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = invalid allocation request for \"{resource}\": invalid request: maximum request size for shared resources is 1; found {want}, which is unexpected"
                        )
                    })
                }
            };
            if let Some(message) = rejected {
                // H13: kubelet `rejectPod`, no retry.
                obj.value["status"] =
                    json!({"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message});
                continue;
            }
            obj.value["status"] = json!({
                "phase": "Running",
                "podIP": format!("10.0.0.{}", 10 + self.allocations.len()),
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": "workload", "ready": false, "restartCount": 0, "state": {"running": {"startedAt": ts}}}]
            });
            // distributedAlloc: the GPU with the fewest replicas allocated.
            let per_gpu = |g: u32| self.allocations.values().filter(|(_, i)| *i == g).count();
            let gpu = (0..self.spec.gpus).min_by_key(|g| per_gpu(*g)).unwrap_or(0);
            self.allocations.insert(key.name.clone(), (resource.clone(), gpu));
            let (command, args) = super::kubelet::command_and_args(&obj.value);
            let facts = PodFacts {
                gpu_resources: Vec::new(),
                command,
                args,
                claim: String::new(),
                dra_sharing: None,
                gpu: Some(gpu),
                plugin_replicas: config.as_ref().map(PluginConfig::replicas),
                mps_enforced: match config.as_ref().map(|c| &c.sharing) {
                    Some(Sharing::Mps { .. }) => self.mps_enforced(),
                    _ => None,
                },
                mig: self.gpu_state.mig.is_some(),
                cell: pod["metadata"]["labels"]["gpushare.dev/cell"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                image: pod["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                role: pod["metadata"]["labels"]["gpushare.dev/role"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            };
            self.pod_facts.insert(key.name.clone(), facts);
            let d = self.spec.timings.pod_ready;
            self.at(d, Event::PodReady(key.name.clone(), 0));
        }
    }

    /// Binds a pod whose GPU comes through claims (J4: the scheduler writes each new
    /// allocation with the delete-protection finalizer, then reserves the claim for the
    /// pod), then the kubelet prepares them (J5, J6): the driver checks each claim's
    /// `GpuConfig`; on an error the pod stays in ContainerCreating with a
    /// `FailedPrepareDynamicResources` event, otherwise its container starts.
    #[allow(clippy::type_complexity)]
    fn bind_with_claims(
        &mut self,
        key: &Key,
        pod: &Value,
        claims: Vec<(Key, Option<(Value, Vec<super::dra::Allocated>)>)>,
        ts: &str,
    ) {
        let gates = self.spec.dra.clone().unwrap_or_default();
        let uid = pod["metadata"]["uid"].clone();
        let mut failure = None;
        let mut sharing = None;
        let mut device = None;
        let mut mig_device = false;
        let mut claim_name = String::new();
        for (ck, allocation) in claims {
            let Some(c) = self.objects.get_mut(&ck) else { continue };
            if let Some((a, _)) = allocation {
                c.value["status"]["allocation"] = a;
                c.value["metadata"]["finalizers"] = json!([super::dra::FINALIZER]);
            }
            let mut reserved = c.value["status"]["reservedFor"].as_array().cloned().unwrap_or_default();
            reserved.push(json!({"resource": "pods", "name": key.name, "uid": uid}));
            c.value["status"]["reservedFor"] = json!(reserved);
            let a = c.value["status"]["allocation"].clone();
            claim_name = ck.name.clone();
            // `gpu-<minor>`, or `gpu-<minor>-mig-…` (J8).
            let name = a["devices"]["results"][0]["device"].as_str().unwrap_or_default();
            mig_device = name.contains("-mig-");
            device = name
                .strip_prefix("gpu-")
                .and_then(|i| i.split('-').next())
                .and_then(|i| i.parse::<u32>().ok());
            let request = a["devices"]["results"][0]["request"].as_str().unwrap_or_default();
            let cuid = c.value["metadata"]["uid"].as_str().unwrap_or_default().to_string();
            let prepared = match super::dra::config_for(&a, request) {
                Some(params) => super::dra::prepare_config(params, &gates, &cuid),
                None => Ok(None),
            };
            match prepared {
                Ok(s) => sharing = s,
                Err(e) => failure = Some(super::dra::prepare_failed_event(&ck.namespace, &ck.name, &cuid, &e)),
            }
        }
        let Some(obj) = self.objects.get_mut(key) else { return };
        if let Some(message) = failure {
            obj.value["status"] = json!({
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
                "resourceClaimStatuses": obj.value["status"]["resourceClaimStatuses"].clone(),
                "containerStatuses": [{"name": "workload", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]
            });
            self.names += 1;
            let event = format!("{}.{:x}", key.name, self.names);
            self.note(format!("kubelet: {message}"));
            self.put(
                Key::new("events", &key.namespace, &event),
                json!({"apiVersion": "v1", "kind": "Event",
                       "metadata": {"name": event, "namespace": key.namespace},
                       "involvedObject": {"kind": "Pod", "name": key.name, "namespace": key.namespace},
                       "reason": "FailedPrepareDynamicResources", "type": "Warning", "message": message}),
            );
            return;
        }
        let statuses = obj.value["status"]["resourceClaimStatuses"].clone();
        obj.value["status"] = json!({
            "phase": "Running",
            "podIP": format!("10.0.0.{}", 10 + self.allocations.len()),
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "workload", "ready": false, "restartCount": 0, "state": {"running": {"startedAt": ts}}}]
        });
        if !statuses.is_null() {
            obj.value["status"]["resourceClaimStatuses"] = statuses;
        }
        let gpu = device.unwrap_or(0);
        match &sharing {
            Some(super::dra::Sharing::Mps { .. }) => {
                self.exclusive_process.insert(gpu);
            }
            Some(super::dra::Sharing::TimeSlicing(_)) => {
                self.exclusive_process.remove(&gpu);
            }
            None => {}
        }
        self.allocations.insert(key.name.clone(), (String::new(), gpu));
        let (command, args) = super::kubelet::command_and_args(&obj.value);
        let mps = match &sharing {
            Some(super::dra::Sharing::Mps { thread_percentage, .. }) => {
                Some(100 / thread_percentage.unwrap_or(100).max(1))
            }
            _ => None,
        };
        let label = |l: &str| pod["metadata"]["labels"][l].as_str().unwrap_or_default().to_string();
        let facts = PodFacts {
            gpu_resources: Vec::new(),
            gpu: Some(gpu),
            plugin_replicas: None,
            mps_enforced: mps,
            mig: mig_device,
            cell: label("gpushare.dev/cell"),
            image: pod["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            role: label("gpushare.dev/role"),
            command,
            args,
            claim: claim_name,
            dra_sharing: sharing,
        };
        self.pod_facts.insert(key.name.clone(), facts);
        let d = self.spec.timings.pod_ready;
        self.at(d, Event::PodReady(key.name.clone(), 0));
    }

    /// Whether a workload pod's container is ready.
    fn workload_ready(&self, name: &str) -> bool {
        self.workload_namespace_of(name)
            .and_then(|ns| self.objects.get(&Key::new("pods", &ns, name)))
            .is_some_and(|o| o.value["status"]["containerStatuses"][0]["ready"] == json!(true))
    }

    fn workload_pod(&mut self, name: &str) -> Option<&mut Value> {
        let ns = self.workload_namespace_of(name)?;
        self.objects.get_mut(&Key::new("pods", &ns, name)).map(|o| &mut o.value)
    }

    /// The container's start number (its restart count) and whether it runs now.
    fn container(&self, name: &str) -> Option<(u32, bool)> {
        let ns = self.workload_namespace_of(name)?;
        let cs = &self.objects.get(&Key::new("pods", &ns, name))?.value["status"]["containerStatuses"][0];
        let start = cs["restartCount"].as_u64().unwrap_or(0) as u32;
        Some((start, !cs["state"]["running"].is_null()))
    }

    fn pod_ready(&mut self, name: &str, start: u32) {
        if self.container(name) != Some((start, true)) {
            return;
        }
        // A GPU in EXCLUSIVE_PROCESS takes one CUDA context (MPS clients go through the
        // MPS server's): a second plain process on it fails to create its own.
        let facts = self.pod_facts.get(name).cloned().unwrap_or_default();
        let plain = !matches!(facts.dra_sharing, Some(super::dra::Sharing::Mps { .. }));
        if plain
            && facts.gpu.is_some_and(|g| self.exclusive_process.contains(&g))
            && self.pod_facts.iter().any(|(other, f)| {
                other != name
                    && f.gpu == facts.gpu
                    && self.container(other).is_some_and(|(_, running)| running)
                    && self.workload_ready(other)
            })
        {
            self.container_exit(
                name,
                3,
                "CUDA_ERROR_DEVICES_UNAVAILABLE: the GPU is in compute mode EXCLUSIVE_PROCESS and another process holds it",
            );
            return;
        }
        let args = match self.workload_pod(name) {
            Some(o) if o["status"]["phase"] == json!("Running") => {
                o["status"]["conditions"][1]["status"] = json!("True");
                o["status"]["containerStatuses"][0]["ready"] = json!(true);
                o["spec"]["containers"][0]["args"].clone()
            }
            _ => return,
        };
        // The workload counts its events from readiness, in each container anew.
        for (flag, act) in [
            ("--inject-fault-after", WorkloadAct::Fault),
            ("--crash-after", WorkloadAct::Crash),
        ] {
            if let Some(after) = arg_duration(&args, flag) {
                let after = after * self.spec.workload_time_scale;
                self.at(after, Event::Workload(name.to_string(), start, act));
            }
        }
    }

    /// A workload container faults or kills itself.
    ///
    /// - A fault under MPS reaches every client on that GPU of the MPS server, of which
    ///   there is one per node (k8s-device-plugin v0.20.0 `cmd/mps-control-daemon/mps/manager.go`,
    ///   read): each exits with the workload's code 5 (NVIDIA's MPS documentation, "Error
    ///   containment": a fatal exception is reported to all clients of the server; not
    ///   source). Elsewhere only the faulting container exits. The GPU stays healthy: the
    ///   device plugin ignores the illegal-address Xids (`internal/rm/health.go`, read).
    /// - `--crash-after` SIGKILLs the process: exit 137, unless the process is its PID
    ///   namespace's init (no `shareProcessNamespace`), where the kernel drops the signal
    ///   and the workload exits 1 instead (Linux `kernel/signal.c` `sig_task_ignored`
    ///   with `SIGNAL_UNKILLABLE`; the workload's own `--crash-after` says so).
    fn workload_act(&mut self, name: &str, start: u32, act: WorkloadAct) {
        if self.container(name) != Some((start, true)) {
            return;
        }
        match act {
            WorkloadAct::Crash => {
                let shared = self
                    .workload_pod(name)
                    .is_some_and(|o| o["spec"]["shareProcessNamespace"] == json!(true));
                if shared {
                    self.container_exit(name, 137, "killed by SIGKILL (--crash-after)");
                } else {
                    self.container_exit(
                        name,
                        1,
                        "--crash-after: SIGKILL was ignored: this process is its PID namespace's init",
                    );
                }
            }
            WorkloadAct::Fault => {
                let facts = self.pod_facts.get(name).cloned().unwrap_or_default();
                let mut hit = vec![name.to_string()];
                if facts.mps_enforced.is_some() {
                    let clients: Vec<String> = self
                        .allocations
                        .iter()
                        .filter(|(n, (_, g))| {
                            n.as_str() != name
                                && Some(*g) == facts.gpu
                                && self.pod_facts.get(*n).is_some_and(|f| f.mps_enforced.is_some())
                        })
                        .map(|(n, _)| n.clone())
                        .collect();
                    hit.extend(
                        clients
                            .into_iter()
                            .filter(|n| self.container(n).is_some_and(|(_, r)| r)),
                    );
                    self.note(format!(
                        "MPS: a fatal fault in {name} ends every client of the server: {}",
                        hit.join(", ")
                    ));
                }
                for n in hit {
                    self.container_exit(&n, 5, "a GPU fault lost the CUDA context");
                }
            }
        }
    }

    /// A workload container exits: the pod is not ready, its container terminated, and
    /// the kubelet starts it again (`restartPolicy: Always`): at once after its first
    /// exit, then after 10 s doubling to 300 s from the exit (kubernetes
    /// `pkg/kubelet/kuberuntime/kuberuntime_manager.go` `doBackOff`, UPSTREAM-RULES.md I2).
    fn container_exit(&mut self, name: &str, code: i32, message: &str) {
        let ts = self.timestamp();
        let Some((start, true)) = self.container(name) else {
            return;
        };
        if let Some(o) = self.workload_pod(name) {
            o["status"]["conditions"][1]["status"] = json!("False");
            let cs = &mut o["status"]["containerStatuses"][0];
            cs["ready"] = json!(false);
            // No message: the pod sets no terminationMessagePolicy and the workload
            // writes no /dev/termination-log.
            cs["state"] = json!({"terminated": {"exitCode": code, "reason": "Error", "finishedAt": ts}});
        }
        self.note(format!(
            "workload pod {name}: container exited with code {code} ({message})"
        ));
        let delay = self.backoff(start + 1);
        if delay > 0.0
            && let Some(o) = self.workload_pod(name)
        {
            let cs = &mut o["status"]["containerStatuses"][0];
            cs["lastState"] = cs["state"].clone();
            cs["state"] = json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off {delay}s restarting failed container=workload")}});
        }
        self.at(delay, Event::Restart(name.to_string(), start + 1));
    }

    fn restart_container(&mut self, name: &str, start: u32) {
        let ts = self.timestamp();
        let Some(o) = self.workload_pod(name) else { return };
        if !o["metadata"]["deletionTimestamp"].is_null() || o["status"]["phase"] != json!("Running") {
            return;
        }
        let cs = &mut o["status"]["containerStatuses"][0];
        if cs["restartCount"].as_u64() != Some(u64::from(start - 1)) {
            return;
        }
        if !cs["state"]["terminated"].is_null() {
            cs["lastState"] = cs["state"].clone();
        }
        cs["state"] = json!({"running": {"startedAt": ts}});
        cs["restartCount"] = json!(start);
        let d = self.spec.timings.pod_ready;
        self.at(d, Event::PodReady(name.to_string(), start));
    }

    /// Workload pods holding a device now.
    pub fn allocated(&self) -> BTreeSet<String> {
        self.allocations.keys().cloned().collect()
    }
}

/// Whether a node label is one GFD publishes (k8s-device-plugin v0.18.1 `internal/lm`);
/// GFD removes its features file on exit (`cmd/gpu-feature-discovery/main.go` `run`), so
/// NFD drops them while GFD is down.
pub(crate) fn is_gfd_label(k: &str) -> bool {
    (k.starts_with("nvidia.com/gpu.") && !k.starts_with("nvidia.com/gpu.deploy."))
        || k.starts_with("nvidia.com/mig-")
        || matches!(
            k,
            "nvidia.com/mig.capable" | "nvidia.com/mps.capable" | "nvidia.com/mig.strategy"
        )
}

/// A workload flag's duration from a container's arguments (`15000ms`, `5s`).
pub(crate) fn arg_duration(args: &Value, flag: &str) -> Option<Secs> {
    let args = args.as_array()?;
    let i = args.iter().position(|a| a == flag)?;
    let v = args.get(i + 1)?.as_str()?;
    match v.strip_suffix("ms") {
        Some(ms) => ms.parse::<f64>().ok().map(|m| m / 1000.0),
        None => v.strip_suffix('s')?.parse().ok(),
    }
}

fn fnv(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Whether a pod's toleration tolerates the GPU node's taint `nvidia.com/gpu` (no
/// value, effect NoSchedule), as `Toleration.ToleratesTaint` decides
/// (kubernetes/kubernetes `staging/src/k8s.io/api/core/v1/toleration.go`, commit
/// 37d8bd8f, read): an empty effect matches every effect, else it must equal the
/// taint's; an empty key matches every key, else it must equal the taint's; the
/// operator `Exists` matches any value, `Equal` or none matches an equal value (here
/// empty), any other operator nothing.
fn tolerates_gpu_taint(t: &Value) -> bool {
    let field = |k: &str| t[k].as_str().unwrap_or_default();
    (field("effect").is_empty() || field("effect") == "NoSchedule")
        && (field("key").is_empty() || field("key") == "nvidia.com/gpu")
        && match field("operator") {
            "Exists" => true,
            "" | "Equal" => field("value").is_empty(),
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(replicas: u32) -> String {
        format!(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
        )
    }

    fn add_key(w: &mut World, key: &str, text: &str) {
        let k = Key::new("configmaps", "gpu-operator", "device-plugin-config");
        w.patch_object(&k, &json!({"data": {key: text}}), "test");
        w.configmap_changed();
    }

    #[test]
    fn a_fresh_node_is_exclusive_with_mig_disabled() {
        let w = World::new(ClusterSpec::h100("gpu-1"));
        let l = w.node_labels();
        assert_eq!(l["nvidia.com/gpu.sharing-strategy"], "none");
        assert_eq!(l["nvidia.com/gpu.replicas"], "1");
        assert_eq!(l[MIG_LABEL], "all-disabled");
        assert_eq!(l[MIG_STATE], "success");
        assert_eq!(w.allocatable()["nvidia.com/gpu"], 1);
    }

    #[test]
    fn one_replica_crash_loops_the_plugin_and_a_new_key_waits_for_the_kubelet() {
        let mut w = World::new(ClusterSpec::h100("gpu-1"));
        add_key(&mut w, "ts-1", &ts(1));
        w.settle(120.0);
        w.set_labels("harness", &[(PLUGIN_LABEL, Some("ts-1".into()))]);
        w.settle(600.0);
        assert_eq!(w.allocatable()["nvidia.com/gpu"], 0, "{}", w.log.join("\n"));
        assert!(w.log.iter().any(|l| l.contains("number of replicas must be >= 2")));
        // GFD crash-loops too and removes its features file: NFD drops its labels.
        assert_eq!(w.node_labels().get("nvidia.com/gpu.sharing-strategy"), None);
        // Add and relabel at once: the sidecars fail until the file is projected.
        w.log.clear();
        add_key(&mut w, "ts-4", &ts(4));
        w.set_labels("harness", &[(PLUGIN_LABEL, Some("ts-4".into()))]);
        w.settle(30.0);
        assert!(
            w.log.iter().any(|l| l.contains("specified config ts-4 does not exist")),
            "{}",
            w.log.join("\n")
        );
        w.settle(600.0);
        assert_eq!(w.allocatable()["nvidia.com/gpu"], 4, "{}", w.log.join("\n"));
        assert_eq!(
            w.node_labels()["nvidia.com/gpu.product"],
            "NVIDIA-H100-80GB-HBM3-SHARED"
        );
    }

    #[test]
    fn mig_success_comes_before_the_plugin_is_back() {
        let mut w = World::new(ClusterSpec::h100("gpu-1"));
        w.set_labels("harness", &[(MIG_LABEL, Some("all-1g.10gb".into()))]);
        w.settle(1.5);
        assert_eq!(w.node_labels()[MIG_STATE], "success", "stale success until validation");
        let mut saw_pending = false;
        let mut success_before_alloc = false;
        for _ in 0..600 {
            w.settle(1.0);
            let l = w.node_labels();
            saw_pending |= l[MIG_STATE] == "pending";
            if saw_pending && l[MIG_STATE] == "success" && w.allocatable().get("nvidia.com/gpu").copied() != Some(7) {
                success_before_alloc = true;
            }
        }
        assert!(saw_pending && success_before_alloc, "{}", w.log.join("\n"));
        assert_eq!(w.allocatable()["nvidia.com/gpu"], 7, "{}", w.log.join("\n"));
        assert_eq!(
            w.node_labels()["nvidia.com/gpu.product"],
            "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
        );
    }

    #[test]
    fn tolerations_match_the_gpu_taint_as_tolerates_taint_does() {
        for (t, want) in [
            (
                json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
                true,
            ),
            (json!({"key": "nvidia.com/gpu", "operator": "Exists"}), true),
            (json!({"key": "nvidia.com/gpu"}), true),
            (json!({"key": "nvidia.com/gpu", "operator": "Equal", "value": ""}), true),
            (
                json!({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}),
                false,
            ),
            (json!({"key": "nvidia.com/gpu", "value": "present"}), false),
            (
                json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}),
                false,
            ),
            (json!({"key": "dedicated", "operator": "Exists"}), false),
            (json!({"operator": "Exists"}), true),
            (json!({"key": "nvidia.com/gpu", "operator": "Gt", "value": "1"}), false),
        ] {
            assert_eq!(tolerates_gpu_taint(&t), want, "{t}");
        }
    }
}
