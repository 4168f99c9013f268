//! The Kubernetes backend through DRA claims (`--sharing-api dra`): nothing on the node
//! changes; each cell's pods reference the cell's claim (`dra.rs`), which the harness
//! creates before their Deployment and deletes once its pods are gone. Every claim's
//! name is journaled before it is created, so `restore` and `--resume` delete what a
//! killed sweep left.
//!
//! What the cluster does with the claims (allocation, the driver's checks when the
//! kubelet prepares them) is Kubernetes' and the driver's: UPSTREAM-RULES.md J1 to J7,
//! played by the simulated cluster (`sim/dra.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;
use tokio::time::Instant;

use super::backend::{self as k8s, KubeSettings, kube_error};
use super::dra::{self, CellClaims, DraSettings};
use super::journal::{self, Journal};
use super::objects;
use crate::backend::{Backend, CellSetup, Pod as CellPod, PodState, Prepared};
use crate::domain::{Arm, Strategy};
use crate::error::{BenchError, Result};
use crate::shutdown::Shutdown;
use crate::telemetry::inventory::{GpuInfo, GpuInventory, MigDevice};

/// A `resource.k8s.io/v1` resource of the workload namespace, or cluster-wide.
fn resource_api(client: &Client, ns: Option<&str>, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// The claim resources the harness creates: (plural, kind).
const CLAIM_KINDS: [(&str, &str); 2] = [
    ("resourceclaims", "ResourceClaim"),
    ("resourceclaimtemplates", "ResourceClaimTemplate"),
];

/// The (plural, kind) of a cell's claim object.
fn claim_kind(claims: &CellClaims) -> (&'static str, &'static str) {
    match claims {
        CellClaims::PerPod | CellClaims::Mig(_) => CLAIM_KINDS[1],
        CellClaims::Shared(_) => CLAIM_KINDS[0],
    }
}

/// The journal's entry for a cell's claim object (`resourceclaims/NAME`).
fn journal_entry(claims: &CellClaims, name: &str) -> String {
    format!("{}/{name}", claim_kind(claims).0)
}

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
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match api.get(name).await {
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(true),
            Err(e) => return Err(kube_error(&format!("reading {entry} in namespace {ns}"), e)),
            Ok(o) => {
                if Instant::now() > deadline {
                    let reserved = o.data["status"]["reservedFor"].as_array().map_or(0, Vec::len);
                    return Err(BenchError::kube(format!(
                        "{entry} in namespace {ns} still exists 120 s after deletion ({reserved} pods reserve it)"
                    )));
                }
            }
        }
        if shutdown.is_forced() {
            return Err(BenchError::kube(format!(
                "forced stop: {entry} in namespace {ns} was still being deleted"
            )));
        }
        shutdown.grace(poll).await;
    }
}

/// The node's GPUs as the driver's ResourceSlices publish them (pure), in the order
/// they appear (J2, J8): a GPU with MIG off is a whole-GPU device (`type` `gpu`: product
/// name, UUID, memory capacity); a GPU in MIG mode publishes only its MIG devices (`type`
/// `mig`, grouped here by `parentUUID`, with their `profile` and `uuid`), and the
/// GPU is recorded as MIG-enabled without a memory size. The driver versions come from
/// the devices' attributes.
pub fn inventory_from_slices(slices: &[Value], node: &str) -> GpuInventory {
    let mut gpus: Vec<GpuInfo> = Vec::new();
    let mut driver_version = None;
    let mut cuda_driver_version = None;
    for slice in slices
        .iter()
        .filter(|s| s["spec"]["nodeName"] == node && s["spec"]["driver"] == dra::DRIVER)
    {
        for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
            let attr = |k: &str| {
                let a = &d["attributes"][k];
                a["string"]
                    .as_str()
                    .or_else(|| a["version"].as_str())
                    .map(str::to_string)
            };
            let kind = attr("type");
            if !matches!(kind.as_deref(), Some("gpu" | "mig")) {
                continue;
            }
            driver_version = driver_version.or_else(|| attr("driverVersion"));
            cuda_driver_version = cuda_driver_version.or_else(|| attr("cudaDriverVersion"));
            let name = attr("productName").unwrap_or_else(|| "unknown GPU".into());
            if kind.as_deref() == Some("gpu") {
                gpus.push(GpuInfo {
                    index: gpus.len() as u32,
                    name,
                    uuid: attr("uuid").unwrap_or_default(),
                    memory_total_bytes: d["capacity"]["memory"]["value"]
                        .as_str()
                        .and_then(|q| q.parse::<crate::config::values::Quantity>().ok())
                        .map(|q| q.bytes),
                    mig_enabled: Some(false),
                    compute_mode: None,
                    mig_devices: Vec::new(),
                });
                continue;
            }
            let parent = attr("parentUUID").unwrap_or_default();
            let device = MigDevice {
                profile: attr("profile").unwrap_or_default(),
                uuid: attr("uuid").unwrap_or_default(),
            };
            match gpus
                .iter_mut()
                .find(|g| g.uuid == parent && g.mig_enabled == Some(true))
            {
                Some(g) => g.mig_devices.push(device),
                None => gpus.push(GpuInfo {
                    index: gpus.len() as u32,
                    name,
                    uuid: parent,
                    memory_total_bytes: None,
                    mig_enabled: Some(true),
                    compute_mode: None,
                    mig_devices: vec![device],
                }),
            }
        }
    }
    GpuInventory {
        gpus,
        driver_version,
        cuda_driver_version,
        nvml: false,
    }
}

/// The MIG profile MIG cells ask for (pure): the one the GPU has most instances of
/// (ties: the first in name order), with that count; None without MIG devices.
pub fn mig_choice(gpu: &GpuInfo) -> Option<(String, u32)> {
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for d in &gpu.mig_devices {
        *counts.entry(d.profile.as_str()).or_default() += 1;
    }
    let most = counts.values().copied().max()?;
    counts
        .into_iter()
        .find(|(_, n)| *n == most)
        .map(|(p, n)| (p.to_string(), n))
}

/// The namespace the driver's documentation installs it in (`docs/install.md` at v0.4.1:
/// `helm install dra-driver-nvidia-gpu … --namespace dra-driver-nvidia-gpu`).
pub const DRIVER_NAMESPACE: &str = "dra-driver-nvidia-gpu";
/// Labels of the driver's kubelet-plugin pods: the chart's name, or the name the upgrade
/// path overrides it with, then `-component=kubelet-plugin` (chart
/// `templates/kubeletplugin.yaml` at v0.4.1).
pub const PLUGIN_SELECTORS: [&str; 2] = [
    "dra-driver-nvidia-gpu-component=kubelet-plugin",
    "nvidia-dra-driver-gpu-component=kubelet-plugin",
];

/// NVIDIA's DRA driver as its kubelet plugin's pod on the node shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverFacts {
    /// The `gpus` container's image (its tag is the driver version).
    pub image: String,
    /// Its `FEATURE_GATES` (absent: the chart's default, every gate off).
    pub gates: BTreeMap<String, bool>,
}

impl DriverFacts {
    /// Whether a gate is on.
    pub fn gate(&self, name: &str) -> bool {
        self.gates.get(name).copied().unwrap_or(false)
    }

    /// One line for run.json and the notes.
    pub fn describe(&self) -> String {
        let on: Vec<&str> = self
            .gates
            .iter()
            .filter(|(_, v)| **v)
            .map(|(k, _)| k.as_str())
            .collect();
        format!(
            "{}; feature gates on: {}",
            self.image,
            if on.is_empty() {
                "none".to_string()
            } else {
                on.join(", ")
            }
        )
    }

    /// Why cells of these strategies will fail when the kubelet prepares their claims:
    /// a `GpuConfig` whose gate is off (J5).
    pub fn warnings(&self, strategies: &[Strategy], s: &DraSettings) -> Vec<String> {
        let mut out = Vec::new();
        for (needed, gate) in [
            (strategies.contains(&Strategy::Mps), "MPSSupport"),
            (
                strategies.contains(&Strategy::TimeSlicing) && !s.timeslices.is_empty(),
                "TimeSlicingSettings",
            ),
        ] {
            if needed && !self.gate(gate) {
                out.push(format!(
                    "the DRA driver's feature gate {gate} is off, so its cells' pods will stay in ContainerCreating (helm upgrade … --set featureGates.{gate}=true)"
                ));
            }
        }
        if strategies.contains(&Strategy::Mps) && !self.gate("TimeSlicingSettings") {
            out.push(
                "an MPS claim leaves the GPU in compute mode EXCLUSIVE_PROCESS after it is gone (the driver resets it only with TimeSlicingSettings on): a time-slicing cell without --timeslice after it, in this run (--repeat rotates the order) or a later one, runs one pod and the others fail".into(),
            );
        }
        out
    }
}

/// `FEATURE_GATES` as the driver reads it (pure): `K=v,` items, empty ones skipped,
/// values booleans (`true`, `True`, `1`, ...); an item that is not `K=bool` is left out.
pub fn parse_gates(text: &str) -> BTreeMap<String, bool> {
    text.split(',')
        .filter_map(|item| {
            let (k, v) = item.trim().split_once('=')?;
            let v = match v.trim() {
                "1" | "t" | "T" | "true" | "TRUE" | "True" => true,
                "0" | "f" | "F" | "false" | "FALSE" | "False" => false,
                _ => return None,
            };
            Some((k.trim().to_string(), v))
        })
        .collect()
}

/// The driver's kubelet plugin on `node` among `pods` (pure): its `gpus` container.
pub fn driver_facts(pods: &[Pod], node: &str) -> Option<DriverFacts> {
    pods.iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .find_map(|p| {
            let c = p.spec.as_ref()?.containers.iter().find(|c| c.name == "gpus")?;
            let gates = c
                .env
                .iter()
                .flatten()
                .find(|e| e.name == "FEATURE_GATES")
                .and_then(|e| e.value.as_deref())
                .map(parse_gates)
                .unwrap_or_default();
            Some(DriverFacts {
                image: c.image.clone().unwrap_or_default(),
                gates,
            })
        })
}

/// Reads the driver's kubelet plugin on `node` from its pods in [`DRIVER_NAMESPACE`];
/// Err says why it could not be read.
pub async fn read_driver(client: &Client, node: &str) -> std::result::Result<DriverFacts, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), DRIVER_NAMESPACE);
    let mut found = Vec::new();
    for selector in PLUGIN_SELECTORS {
        match pods.list(&ListParams::default().labels(selector)).await {
            Ok(l) => found.extend(l.items),
            Err(e) => {
                return Err(kube_error(&format!("listing the DRA driver's pods in {DRIVER_NAMESPACE}"), e).to_string());
            }
        }
    }
    driver_facts(&found, node).ok_or_else(|| {
        format!("no kubelet-plugin pod of NVIDIA's DRA driver on node {node} in namespace {DRIVER_NAMESPACE}")
    })
}

/// Pods on one Kubernetes node that get their GPU through DRA claims.
pub struct DraBackend {
    client: Client,
    s: KubeSettings,
    dra: DraSettings,
    journal_path: Option<PathBuf>,
    journal: Option<Journal>,
    /// Whole GPUs the node's slices publish (0: its GPU is in MIG mode).
    gpus: u32,
    /// MIG devices of the profile MIG cells ask for.
    mig_devices: u32,
    /// The GPU's memory and MIG profile, for the cells' claims.
    node: dra::NodeDevices,
    /// The arm prepared last: its cells' claims carry its time-slice interval.
    arm: Option<Arm>,
    cell: Option<(Arm, u32)>,
    claims: Option<CellClaims>,
    launched_at: Option<Instant>,
    pods_ready_s: Option<f64>,
    /// The driver as its kubelet plugin shows it, or why it could not be read.
    driver: Option<std::result::Result<DriverFacts, String>>,
    /// The attached journal has changes a killed run left: undone before the first cell.
    leftovers: bool,
    /// Whether the start was cleaned ([`clean_start`](Self::clean_start)).
    started: bool,
}

impl std::fmt::Debug for DraBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DraBackend(node {})", self.s.node)
    }
}

impl DraBackend {
    /// A backend on an existing client (the kubeconfig's, or a simulated cluster's).
    pub fn new(client: Client, s: KubeSettings, dra: DraSettings) -> Self {
        Self {
            client,
            s,
            dra,
            journal_path: None,
            journal: None,
            gpus: 0,
            mig_devices: 0,
            node: dra::NodeDevices::default(),
            arm: None,
            cell: None,
            claims: None,
            launched_at: None,
            pods_ready_s: None,
            driver: None,
            leftovers: false,
            started: false,
        }
    }

    /// Connects with the local kubeconfig or the in-cluster service account.
    pub async fn connect(s: KubeSettings, dra: DraSettings) -> Result<Self> {
        let client = Client::try_default()
            .await
            .map_err(|e| kube_error("connecting to the cluster (kubeconfig or in-cluster config)", e))?;
        Ok(Self::new(client, s, dra))
    }

    /// The client (shared with the port-forward).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Sets the arguments of the workload pods.
    pub fn set_workload_args(&mut self, args: Vec<String>) {
        self.s.workload.args = args;
    }

    /// Sets the user's own server the pods run (the recorded one when resuming).
    pub fn set_server(&mut self, server: Option<objects::OwnServer>) {
        self.s.workload.server = server;
    }

    /// Sets the claims' settings (the recorded ones when resuming).
    pub fn set_dra(&mut self, dra: DraSettings) {
        self.dra = dra;
    }

    /// Reads what the sweep depends on: the driver's DeviceClass for whole GPUs and the
    /// GPUs the node's ResourceSlices publish. Refuses clearly what is missing.
    pub async fn check_cluster(&mut self) -> Result<GpuInventory> {
        let classes = resource_api(&self.client, None, "DeviceClass", "deviceclasses");
        match classes.get(dra::GPU_CLASS).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(BenchError::kube(format!(
                    "no DeviceClass {}: is NVIDIA's DRA driver for GPUs installed (Kubernetes 1.34+, helm chart dra-driver-nvidia-gpu)?",
                    dra::GPU_CLASS
                )));
            }
            Err(e) => return Err(kube_error(&format!("reading DeviceClass {}", dra::GPU_CLASS), e)),
        }
        let slices = resource_api(&self.client, None, "ResourceSlice", "resourceslices")
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error("listing ResourceSlices", e))?;
        let values: Vec<Value> = slices
            .items
            .iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .collect();
        let inventory = inventory_from_slices(&values, &self.s.node);
        if inventory.gpus.is_empty() {
            return Err(BenchError::kube(format!(
                "node {} publishes no GPU in a {} ResourceSlice: is the DRA driver's kubelet plugin running there (a GPU in MIG mode without MIG instances publishes nothing)?",
                self.s.node,
                dra::DRIVER
            )));
        }
        if inventory.gpus.len() > 1 {
            // A shared claim is one GPU, but the DCGM exporter's series the telemetry reads
            // are the node's: utilisation, memory and power would mix the other GPUs in.
            return Err(BenchError::kube(format!(
                "node {} publishes {} GPUs: a claim gets one, but the harness's GPU telemetry reads the whole node's DCGM series; use a node with one GPU for now",
                self.s.node,
                inventory.gpus.len()
            )));
        }
        let gpu = &inventory.gpus[0];
        self.gpus = u32::from(gpu.mig_enabled == Some(false));
        let mig = mig_choice(gpu);
        self.mig_devices = mig.as_ref().map_or(0, |m| m.1);
        self.node = dra::NodeDevices {
            memory_bytes: gpu.memory_total_bytes,
            mig_profile: mig.map(|m| m.0),
        };
        self.driver = Some(read_driver(&self.client, &self.s.node).await);
        Ok(inventory)
    }

    /// The driver's image and gates, or why they could not be read (after
    /// [`check_cluster`](Self::check_cluster)).
    pub fn driver(&self) -> Option<&std::result::Result<DriverFacts, String>> {
        self.driver.as_ref()
    }

    /// Uses `dir`'s restore journal (resume: what a killed run left is deleted before
    /// the first cell).
    pub fn attach_journal(&mut self, dir: &std::path::Path) -> Result<()> {
        let (path, j) = journal::attach(dir, &self.s.node)?;
        self.leftovers = j.as_ref().is_some_and(Journal::has_changes);
        self.journal = j;
        self.journal_path = Some(path);
        Ok(())
    }

    /// Before the first cell: deletes what a killed run of this directory left (its
    /// Deployment first, whose pods reserve its claims, then the claims), then refuses
    /// claims of the harness's that no journal of this run names (another run's, or the
    /// manifests' overlay): they would hold the GPU, or clash with a cell's claim of the
    /// same name, whose spec the API server keeps immutable (J3).
    async fn clean_start(&mut self, shutdown: &Shutdown) -> Result<()> {
        if std::mem::take(&mut self.leftovers)
            && let Some(path) = self.journal_path.clone()
        {
            let report = k8s::restore_from_journal(&self.client, &path, &self.s, shutdown).await?;
            for n in report.notices {
                tracing::warn!("{n}");
            }
            self.journal = journal::read(&path)?;
        }
        let ns = &self.s.workload.namespace;
        let mut foreign = Vec::new();
        for (plural, kind) in CLAIM_KINDS {
            let list = resource_api(&self.client, Some(ns), kind, plural)
                .list(&ListParams::default().labels("app.kubernetes.io/part-of=gpushare-bench"))
                .await
                .map_err(|e| kube_error(&format!("listing {plural} in namespace {ns}"), e))?;
            foreign.extend(
                list.items
                    .iter()
                    .filter_map(|o| o.metadata.name.as_ref())
                    .map(|n| format!("{plural}/{n}")),
            );
        }
        if !foreign.is_empty() {
            return Err(BenchError::kube(format!(
                "namespace {ns} already holds claims of gpushare-bench that this run did not make ({}): delete them (kubectl delete -k manifests/overlays/dra, or gpushare-bench restore --node {} RUN_DIR of the run that made them)",
                foreign.join(", "),
                self.s.node
            )));
        }
        Ok(())
    }

    /// Whether cells of `strategy` can run on the node's devices (J8): MIG needs MIG
    /// devices, which the driver publishes only for a GPU in MIG mode with instances
    /// made, and then no whole GPU, so the other strategies need MIG off. The harness
    /// changes neither.
    fn availability(&self, strategy: Strategy) -> Prepared {
        let node = &self.s.node;
        match (strategy, &self.node.mig_profile) {
            (Strategy::Mig, None) => Prepared::Unavailable(format!(
                "node {node}'s GPU publishes no MIG device ({}): the driver publishes them only for a GPU in MIG mode with instances already made, and the harness changes no GPU setting (make the instances, e.g. with nvidia-smi mig or mig-parted, then restart the driver's kubelet plugin: it lists devices at start)",
                dra::MIG_CLASS
            )),
            (Strategy::Mig, Some(_)) => Prepared::Ready,
            (_, _) if self.gpus == 0 => Prepared::Unavailable(format!(
                "node {node}'s GPU is in MIG mode, so the driver publishes only its MIG devices and no claim can have the whole GPU ({}); the harness changes no GPU setting",
                dra::GPU_CLASS
            )),
            _ => Prepared::Ready,
        }
    }

    /// Devices a claim of the current cell can have: MIG devices of its profile, or
    /// whole GPUs.
    fn devices(&self) -> u32 {
        match self.claims {
            Some(CellClaims::Mig(_)) => self.mig_devices,
            _ => self.gpus,
        }
    }

    /// Records `change` in the journal (created on first use) before it is made.
    fn journal_change(&mut self, change: impl FnOnce(&mut Journal) -> bool) -> Result<()> {
        let Some(path) = self.journal_path.clone() else {
            return Err(BenchError::kube("internal: no run directory for the restore journal"));
        };
        let j = self.journal.get_or_insert_with(|| {
            let mut j = Journal::new(&self.s.node, "", BTreeMap::new());
            j.workload_namespace = self.s.workload.namespace.clone();
            j
        });
        let changed = change(j);
        if changed || j.restored {
            j.restored = false;
            journal::write(&path, j)?;
        }
        Ok(())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.s.workload.namespace)
    }

    async fn cell_pods(&self) -> Result<Vec<CellPod>> {
        match self.cell {
            Some((arm, pods)) => k8s::list_cell_pods(&self.pods(), arm, pods).await,
            None => Ok(Vec::new()),
        }
    }

    /// The kubelet's `FailedPrepareDynamicResources` event of a pod, if any (J6): why a
    /// pod stays in ContainerCreating, e.g. a driver feature gate that is off.
    async fn prepare_failure(&self, pod: &str) -> Option<String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.s.workload.namespace);
        let list = events
            .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
            .await
            .ok()?;
        list.items
            .into_iter()
            .rev()
            .find(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources"))
            .and_then(|e| e.message)
    }

    /// Deletes the cell's Deployment, waits for its pods to go, then deletes its claim.
    async fn end_cell(&mut self, shutdown: &Shutdown) -> Result<()> {
        let ns = self.s.workload.namespace.clone();
        k8s::delete_workload(&self.client, &ns, &[objects::APP.to_string()], self.s.poll, shutdown).await?;
        // The claims stay known until the next launch: the cell's row reads them after.
        if let (Some((arm, pods)), Some(claims)) = (self.cell.take(), self.claims.as_ref()) {
            let entry = journal_entry(claims, &dra::claim_name(arm, pods));
            delete_claim(&self.client, &ns, &entry, self.s.poll, shutdown).await?;
        }
        Ok(())
    }
}

impl Backend for DraBackend {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn prepare(&mut self, arm: Arm, shutdown: &Shutdown) -> Result<Prepared> {
        let strategy = arm.strategy;
        self.arm = Some(arm);
        shutdown
            .guard(k8s::ensure_namespace(&self.client, &self.s.workload.namespace))
            .await?;
        if !self.started {
            self.clean_start(shutdown).await?;
            self.started = true;
        }
        Ok(self.availability(strategy))
    }

    fn cell_setup(&self) -> Option<CellSetup> {
        let claims = self.claims.as_ref()?;
        Some(CellSetup {
            switch_s: None,
            mig_reconfigure_s: None,
            pods_ready_s: self.pods_ready_s,
            note: Some(dra::describe(claims)),
        })
    }

    async fn launch(
        &mut self,
        strategy: Strategy,
        pods: u32,
        args: &[String],
        _shutdown: &Shutdown,
    ) -> Result<Vec<CellPod>> {
        let ns = self.s.workload.namespace.clone();
        // The prepared arm's interval, for a cell of its strategy.
        let arm = self.arm.filter(|a| a.strategy == strategy).unwrap_or(Arm::of(strategy));
        let claims = dra::cell_claims(arm, pods, &self.dra, &self.node);
        // This cell's row describes this cell's claims, even if their launch fails.
        self.claims = Some(claims.clone());
        self.pods_ready_s = None;
        let name = dra::claim_name(arm, pods);
        let entry = journal_entry(&claims, &name);
        self.journal_change(|j| j.claims.insert(entry.clone()))?;
        let object = dra::claim_object(&ns, arm, pods, &claims);
        let (plural, kind) = claim_kind(&claims);
        resource_api(&self.client, Some(&ns), kind, plural)
            .patch(
                &name,
                &PatchParams::apply(objects::FIELD_MANAGER).force(),
                &Patch::Apply(object),
            )
            .await
            .map_err(|e| kube_error(&format!("applying {entry} ({})", dra::describe(&claims)), e))?;
        self.cell = Some((arm, pods));
        self.journal_change(|j| !std::mem::replace(&mut j.deployment, true))?;
        let resource = objects::pod_resource(strategy, None, None);
        let mut deployment = objects::deployment(&self.s.workload, strategy, pods, &resource, args);
        dra::use_claim(&mut deployment, arm, pods, &claims);
        let deps: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(self.client.clone(), &ns);
        deps.patch(
            objects::APP,
            &PatchParams::apply(objects::FIELD_MANAGER).force(),
            &Patch::Apply(deployment),
        )
        .await
        .map_err(|e| {
            kube_error(
                &format!("applying the workload Deployment ({} × {pods})", arm.name()),
                e,
            )
        })?;
        self.launched_at = Some(Instant::now());
        self.cell_pods().await
    }

    async fn wait_ready(&mut self, timeout: Duration, shutdown: &Shutdown) -> Result<Vec<CellPod>> {
        let want = self.cell.map_or(0, |c| c.1) as usize;
        let per_pod = matches!(self.claims, Some(CellClaims::PerPod | CellClaims::Mig(_)));
        let deadline = Instant::now() + timeout;
        loop {
            let pods = shutdown.guard(self.cell_pods()).await?;
            let decided = pods.iter().all(|p| {
                matches!(
                    p.state,
                    PodState::Running | PodState::Exited { .. } | PodState::Pending(_)
                )
            });
            let pending = pods.iter().filter(|p| matches!(p.state, PodState::Pending(_))).count();
            let running = pods.iter().filter(|p| p.state == PodState::Running).count();
            // A pod that cannot get a GPU of its own once the others hold every one the
            // node publishes stays pending: that is the cell's outcome. A shared claim's
            // pods all fit once it is allocated, so their pending is a wait.
            let full = per_pod && running >= self.devices() as usize;
            if pods.len() >= want && decided && (pending == 0 || full) {
                if let Some(t) = self.launched_at {
                    self.pods_ready_s = Some(t.elapsed().as_secs_f64());
                }
                return Ok(pods);
            }
            if Instant::now() > deadline {
                let mut out = Vec::new();
                for mut p in pods {
                    if p.state == PodState::Starting {
                        let why = self.prepare_failure(&p.name).await;
                        p.state = PodState::Exited {
                            code: None,
                            detail: match why {
                                Some(w) => format!("not ready after {} s: {w}", timeout.as_secs()),
                                None => format!("not ready after {} s", timeout.as_secs()),
                            },
                        };
                    }
                    out.push(p);
                }
                return Ok(out);
            }
            shutdown.sleep(self.s.poll).await?;
        }
    }

    async fn poll(&mut self) -> Vec<CellPod> {
        self.cell_pods().await.unwrap_or_default()
    }

    async fn stop_pods(&mut self, shutdown: &Shutdown) -> Result<Vec<CellPod>> {
        let before = self.cell_pods().await.unwrap_or_default();
        self.end_cell(shutdown).await?;
        Ok(before)
    }

    async fn restore(&mut self, shutdown: &Shutdown) -> Result<()> {
        let Some(path) = self.journal_path.clone() else {
            return self.end_cell(shutdown).await;
        };
        let report = k8s::restore_from_journal(&self.client, &path, &self.s, shutdown).await?;
        for n in &report.notices {
            tracing::warn!("{n}");
        }
        self.journal = journal::read(&path)?;
        self.cell = None;
        self.claims = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inventory_is_the_nodes_whole_gpus_in_the_drivers_slices() {
        let slice = crate::backend::k8s::sim::dra::resource_slice("gpu-1", 2, "NVIDIA H100 80GB HBM3", 80 << 30);
        let other = crate::backend::k8s::sim::dra::resource_slice("gpu-2", 4, "NVIDIA H200", 141 << 30);
        let inv = inventory_from_slices(&[slice, other], "gpu-1");
        assert_eq!(inv.gpus.len(), 2);
        assert_eq!(inv.gpus[1].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(inv.gpus[0].memory_total_bytes, Some(80 << 30));
        assert_eq!(inv.driver_version.as_deref(), Some("580.159.4"));
        assert!(inventory_from_slices(&[], "gpu-1").gpus.is_empty());
    }

    #[test]
    fn feature_gates_read_as_the_driver_reads_them() {
        let g = parse_gates("MPSSupport=true,TimeSlicingSettings=False,,DynamicMIG=1,Bad=maybe,");
        assert_eq!(g.get("MPSSupport"), Some(&true));
        assert_eq!(g.get("TimeSlicingSettings"), Some(&false));
        assert_eq!(g.get("DynamicMIG"), Some(&true));
        assert!(!g.contains_key("Bad"));
        let facts = DriverFacts {
            image: "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1".into(),
            gates: g,
        };
        assert_eq!(
            facts.describe(),
            "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1; feature gates on: DynamicMIG, MPSSupport"
        );
        // Time-slicing needs its gate only with --timeslice (a config).
        let plain = DraSettings::default();
        assert!(facts.warnings(&[Strategy::TimeSlicing], &plain).is_empty());
        // MPS with TimeSlicingSettings off leaves EXCLUSIVE_PROCESS behind (J5).
        let w = facts.warnings(&[Strategy::TimeSlicing, Strategy::Mps], &plain);
        assert!(w.len() == 1 && w[0].contains("EXCLUSIVE_PROCESS"), "{w:?}");
        let long = DraSettings {
            timeslices: vec![dra::TimeSliceInterval::Long],
            ..DraSettings::default()
        };
        let w = facts.warnings(&[Strategy::TimeSlicing], &long);
        assert!(w.len() == 1 && w[0].contains("TimeSlicingSettings is off"), "{w:?}");
    }

    #[test]
    fn a_gpu_in_mig_mode_is_read_from_its_instances_and_its_most_common_profile_chosen() {
        let mut slice = crate::backend::k8s::sim::dra::resource_slice("gpu-1", 1, "NVIDIA H100 80GB HBM3", 80 << 30);
        let profiles = ["3g.40gb", "1g.10gb", "2g.20gb", "1g.10gb"].map(String::from);
        crate::backend::k8s::sim::dra::make_static_mig(&mut slice, &profiles);
        let inv = inventory_from_slices(&[slice], "gpu-1");
        assert_eq!(inv.gpus.len(), 1, "one parent, not four GPUs");
        let g = &inv.gpus[0];
        assert_eq!(
            (
                g.mig_enabled,
                g.uuid.as_str(),
                g.memory_total_bytes,
                g.mig_devices.len()
            ),
            (Some(true), "GPU-sim-0000", None, 4)
        );
        assert_eq!(mig_choice(g), Some(("1g.10gb".to_string(), 2)));
        let whole = inventory_from_slices(
            &[crate::backend::k8s::sim::dra::resource_slice(
                "gpu-1",
                1,
                "H100",
                80 << 30,
            )],
            "gpu-1",
        );
        assert_eq!(
            (whole.gpus[0].mig_enabled, mig_choice(&whole.gpus[0])),
            (Some(false), None)
        );
    }
}
