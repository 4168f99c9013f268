//! The Kubernetes backend through DRA claims (`--sharing-api dra`): nothing on the node
//! changes; each cell's pods reference the cell's claim (`dra.rs`), which the harness
//! creates before their Deployment and deletes once its pods are gone. Every claim's
//! name is journaled before it is created, so `restore` and `--resume` delete what a
//! killed sweep left.
//!
//! What the cluster does with the claims (allocation, the driver's checks when the
//! kubelet prepares them) is Kubernetes' and the driver's: k8s-sim/UPSTREAM-RULES.md J1 to J7,
//! played by the simulated cluster (`harness/k8s-sim/src/dra.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;
use tokio::time::Instant;

use super::base::{self as k8s, CLAIM_KINDS, CellCount, KubeSettings, delete_claim, kube_error, resource_api};
use super::dra_claims::{self, CellClaims, DraSettings};
use super::journal::{self, Journal};
use super::objects;
use super::trial::{self, TrialCell};
use crate::backend::{Backend, CellSetup, Pod as CellPod, PodState, Prepared};
use crate::domain::{Arm, Strategy};
use crate::error::{BenchError, Result};
use crate::shutdown::{EndsOn, Shutdown, Unmet};
use crate::telemetry::dcgm::GpuScope;
use crate::telemetry::inventory::{GpuInfo, GpuInventory, MigDevice};

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

/// Waits, at most 120 s, until no claim in `ns` is owned by a pod: the claims the
/// resourceclaim controller made from a cell's template go after their pods, not with
/// them (J7), and until they are gone the scheduler counts their devices as taken, so
/// the next cell's pods would read "cannot allocate all claims" that is not theirs.
pub async fn wait_generated_claims_gone(client: &Client, ns: &str, poll: Duration, shutdown: &Shutdown) -> Result<()> {
    let api = resource_api(client, Some(ns), "ResourceClaim", "resourceclaims");
    let mut wait = shutdown.poll(EndsOn::Force, poll, Duration::from_secs(120));
    loop {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error(&format!("listing resourceclaims in namespace {ns}"), e))?;
        let left: Vec<String> = list
            .items
            .iter()
            .filter(|c| c.metadata.owner_references.iter().flatten().any(|o| o.kind == "Pod"))
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if let Err(unmet) = wait.next().await {
            return Err(BenchError::kube(format!(
                "the claims made for the cell's pods ({}) in namespace {ns} were still there {} after the pods",
                left.join(", "),
                match unmet {
                    Unmet::Stopped => "at a forced stop",
                    Unmet::TimedOut => "120 s",
                }
            )));
        }
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
    for d in slice_devices(slices, node) {
        let attr = |k: &str| attribute(d, k);
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
                ..GpuInfo::default()
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
                mig_devices: vec![device],
                ..GpuInfo::default()
            }),
        }
    }
    GpuInventory {
        gpus,
        driver_version,
        cuda_driver_version,
        nvml: false,
    }
}

/// The devices the driver's slices publish for `node` (J2, J8).
fn slice_devices<'a>(slices: &'a [Value], node: &'a str) -> impl Iterator<Item = &'a Value> {
    slices
        .iter()
        .filter(move |s| s["spec"]["nodeName"] == node && s["spec"]["driver"] == dra_claims::DRIVER)
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
}

/// A device's string or version attribute.
fn attribute(device: &Value, key: &str) -> Option<String> {
    let a = &device["attributes"][key];
    a["string"]
        .as_str()
        .or_else(|| a["version"].as_str())
        .map(str::to_string)
}

/// Each device the driver publishes for `node`, with the UUID of the GPU it is on
/// (pure): a whole GPU's `uuid`, a MIG device's `parentUUID` (J2, J8). The DCGM
/// exporter labels a GPU's series, and its MIG instances', with that UUID.
pub fn device_gpus(slices: &[Value], node: &str) -> BTreeMap<String, String> {
    slice_devices(slices, node)
        .filter_map(|d| {
            let gpu = match attribute(d, "type").as_deref() {
                Some("gpu") => attribute(d, "uuid"),
                Some("mig") => attribute(d, "parentUUID"),
                _ => None,
            }?;
            Some((d["name"].as_str()?.to_string(), gpu))
        })
        .collect()
}

/// The devices of `node`'s pool allocated to the claims reserved for `pods` (pure,
/// sorted): a cell's GPUs or MIG devices, from each claim's
/// `status.allocation.devices.results` and `status.reservedFor` (J4).
pub fn allocated_devices(claims: &[Value], pods: &[String], node: &str) -> Vec<String> {
    let mut out: Vec<String> = claims
        .iter()
        .filter(|c| {
            c["status"]["reservedFor"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["resource"] == "pods" && r["name"].as_str().is_some_and(|n| pods.iter().any(|p| p == n)))
        })
        .flat_map(|c| {
            c["status"]["allocation"]["devices"]["results"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter(|r| r["driver"] == dra_claims::DRIVER && r["pool"] == node)
        .filter_map(|r| r["device"].as_str().map(str::to_string))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The product of the node's whole GPUs (pure): a run compares cells, so they must be
/// measured on one product, whichever of the node's GPUs a claim is allocated. None when
/// every GPU is in MIG mode.
pub fn whole_gpu_product<'a>(inventory: &'a GpuInventory, node: &str) -> Result<Option<&'a GpuInfo>> {
    let whole: Vec<&GpuInfo> = inventory.gpus.iter().filter(|g| g.mig_enabled == Some(false)).collect();
    let mut products: Vec<String> = whole
        .iter()
        .map(|g| match g.memory_total_bytes {
            Some(b) => format!("{} ({} MiB)", g.name, b >> 20),
            None => g.name.clone(),
        })
        .collect();
    products.sort();
    products.dedup();
    if products.len() > 1 {
        return Err(BenchError::kube(format!(
            "node {node} publishes whole GPUs of different products ({}): a claim may be allocated any of them, and a run's cells must be measured on one product; use a node whose GPUs are alike",
            products.join(", ")
        )));
    }
    Ok(whole.first().copied())
}

/// The MIG profile MIG cells ask for (pure): the one the node has most instances of
/// (ties: the first in name order), with that count; None without MIG devices.
pub fn mig_choice<'a>(devices: impl IntoIterator<Item = &'a MigDevice>) -> Option<(String, u32)> {
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for d in devices {
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
    /// Whole GPUs the node's slices publish (0: every GPU is in MIG mode).
    gpus: u32,
    /// Each device the slices publish, with its GPU's UUID (DCGM's `UUID` label).
    device_gpus: BTreeMap<String, String>,
    /// The node has several GPUs: telemetry follows each cell's devices.
    several: bool,
    /// What the telemetry reads: the node, or the cell's GPUs.
    scope: GpuScope,
    /// The devices the current cell's claims were allocated.
    allocated: Vec<String>,
    /// MIG devices of the profile MIG cells ask for.
    mig_devices: u32,
    /// The GPU's memory and MIG profile, for the cells' claims.
    node: dra_claims::NodeDevices,
    /// The arm prepared last: its cells' claims carry its time-slice interval.
    arm: Option<Arm>,
    cell: Option<(Arm, u32)>,
    claims: Option<CellClaims>,
    /// The isolation trial launched (pods with their own arguments), if any.
    trial: Option<TrialCell>,
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
            device_gpus: BTreeMap::new(),
            several: false,
            scope: GpuScope::node(),
            allocated: Vec::new(),
            mig_devices: 0,
            node: dra_claims::NodeDevices::default(),
            arm: None,
            cell: None,
            claims: None,
            trial: None,
            launched_at: None,
            pods_ready_s: None,
            driver: None,
            leftovers: false,
            started: false,
        }
    }

    /// Connects with the local kubeconfig or the in-cluster service account.
    pub async fn connect(s: KubeSettings, dra: DraSettings) -> Result<Self> {
        Ok(Self::new(k8s::connect().await?, s, dra))
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

    /// Sets the image an isolation trial's aggressors run beside a server of the user's
    /// own (the recorded one when resuming).
    pub fn set_aggressor_image(&mut self, image: &str) {
        self.s.aggressor_image = image.to_string();
    }

    /// Sets the claims' settings (the recorded ones when resuming).
    pub fn set_dra(&mut self, dra: DraSettings) {
        self.dra = dra;
    }

    /// Reads what the sweep depends on: the driver's DeviceClass for whole GPUs and the
    /// GPUs the node's ResourceSlices publish. Refuses clearly what is missing.
    pub async fn check_cluster(&mut self) -> Result<GpuInventory> {
        k8s::check_workload_deployments(&self.client, &self.s.workload.namespace).await?;
        let classes = resource_api(&self.client, None, "DeviceClass", "deviceclasses");
        match classes.get(dra_claims::GPU_CLASS).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(BenchError::kube(format!(
                    "no DeviceClass {}: is NVIDIA's DRA driver for GPUs installed (Kubernetes 1.34+, helm chart dra-driver-nvidia-gpu)?",
                    dra_claims::GPU_CLASS
                )));
            }
            Err(e) => return Err(kube_error(&format!("reading DeviceClass {}", dra_claims::GPU_CLASS), e)),
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
                dra_claims::DRIVER
            )));
        }
        self.check_no_device_plugin().await?;
        // On a node with several GPUs a claim is allocated one of them (a shared claim,
        // one for all the cell's pods); the telemetry then reads that GPU's series.
        let whole = whole_gpu_product(&inventory, &self.s.node)?;
        self.gpus = inventory.gpus.iter().filter(|g| g.mig_enabled == Some(false)).count() as u32;
        self.several = inventory.gpus.len() > 1;
        self.device_gpus = device_gpus(&values, &self.s.node);
        let mig = mig_choice(inventory.gpus.iter().flat_map(|g| &g.mig_devices));
        self.mig_devices = mig.as_ref().map_or(0, |m| m.1);
        self.node = dra_claims::NodeDevices {
            memory_bytes: whole.and_then(|g| g.memory_total_bytes),
            mig_profile: mig.map(|m| m.0),
        };
        self.driver = Some(read_driver(&self.client, &self.s.node).await);
        Ok(inventory)
    }

    /// Refuses a node where NVIDIA's device plugin also hands out the GPUs: its
    /// `nvidia.com/…` allocatable, or its MPS control daemon (which puts the GPU in
    /// EXCLUSIVE_PROCESS for everyone). The DRA driver's chart refuses to install beside
    /// the plugin for this reason (dra-driver-nvidia-gpu v0.4.1
    /// `deployments/helm/dra-driver-nvidia-gpu/templates/validation.yaml`, unless
    /// `gpuResourcesEnabledOverride`): both would give the same GPU to different pods.
    async fn check_no_device_plugin(&self) -> Result<()> {
        let node = Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
            .get(&self.s.node)
            .await
            .map_err(|e| kube_error(&format!("reading node {}", self.s.node), e))?;
        let advertised: Vec<String> = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .into_iter()
            .flatten()
            .filter(|(r, _)| r.starts_with("nvidia.com/"))
            .filter_map(|(r, q)| q.0.parse::<u32>().ok().filter(|n| *n > 0).map(|n| format!("{r}: {n}")))
            .collect();
        let labels = k8s::labels_of(&node);
        let mps = labels.get("nvidia.com/mps.capable").is_some_and(|v| v == "true");
        if advertised.is_empty() && !mps {
            return Ok(());
        }
        let what = match (advertised.is_empty(), mps) {
            (false, true) => format!("advertises {} and runs its MPS control daemon", advertised.join(", ")),
            (false, false) => format!("advertises {}", advertised.join(", ")),
            _ => "runs its MPS control daemon (nvidia.com/mps.capable=true), which holds the GPU in EXCLUSIVE_PROCESS"
                .into(),
        };
        Err(BenchError::kube(format!(
            "node {} also has NVIDIA's device plugin, which {what}: it would give the same GPU to pods the DRA driver does not know about (the driver's chart refuses to install beside it). Turn the device plugin off on this node for a --sharing-api dra run (label nvidia.com/gpu.deploy.device-plugin=false, or ClusterPolicy devicePlugin.enabled=false), or run without --sharing-api dra",
            self.s.node
        )))
    }

    /// The driver's image and gates, or why they could not be read (after
    /// [`check_cluster`](Self::check_cluster)).
    pub fn driver(&self) -> Option<&std::result::Result<DriverFacts, String>> {
        self.driver.as_ref()
    }

    /// What the GPU telemetry reads: the node, or on a node with several GPUs the
    /// current cell's (set once its pods are placed).
    pub fn gpu_scope(&self) -> GpuScope {
        self.scope.clone()
    }

    /// Reads which devices the cell's claims were allocated (for its note, and on a
    /// node with several GPUs for the telemetry: the UUIDs of their GPUs).
    async fn read_allocation(&mut self, pods: &[CellPod]) {
        let ns = &self.s.workload.namespace;
        // A trial's pods go by the trial's names (`victim`); claims name Kubernetes'.
        let names: Vec<String> = match &self.trial {
            Some(t) => t.names.keys().cloned().collect(),
            None => pods.iter().map(|p| p.name.clone()).collect(),
        };
        let claims = resource_api(&self.client, Some(ns), "ResourceClaim", "resourceclaims")
            .list(&ListParams::default())
            .await;
        self.allocated = match claims {
            Ok(list) => {
                let values: Vec<Value> = list.items.iter().filter_map(|o| serde_json::to_value(o).ok()).collect();
                allocated_devices(&values, &names, &self.s.node)
            }
            Err(e) => {
                tracing::warn!("reading the cell's claims in namespace {ns}: {e}");
                Vec::new()
            }
        };
        if self.several {
            let mut uuids: Vec<String> = self
                .allocated
                .iter()
                .filter_map(|d| self.device_gpus.get(d).cloned())
                .collect();
            uuids.sort();
            uuids.dedup();
            self.scope.set(Some(uuids));
        }
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
                "namespace {ns} already holds claims of gpushare-bench that this run did not make ({}): delete them (kubectl delete -k manifests/overlays/dra, which deletes only the Deployment and claim it made, or gpushare-bench restore --node {} RUN_DIR of the run that made them)",
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
                dra_claims::MIG_CLASS
            )),
            (Strategy::Mig, Some(_)) => Prepared::Ready,
            (_, _) if self.gpus == 0 => Prepared::Unavailable(format!(
                "node {node}'s GPU is in MIG mode, so the driver publishes only its MIG devices and no claim can have the whole GPU ({}); the harness changes no GPU setting",
                dra_claims::GPU_CLASS
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

    async fn cell_pods(&mut self) -> Result<Vec<CellPod>> {
        let Some((arm, pods)) = self.cell else {
            return Ok(Vec::new());
        };
        let api = self.pods();
        match self.trial.as_mut() {
            Some(t) => trial::trial_cell_pods(&api, t).await,
            None => k8s::list_cell_pods(&api, arm, (pods, pods)).await,
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

    /// Applies the claim of a cell of `pods` pods under `strategy` (of the prepared arm),
    /// journaled first; returns the arm and its claims.
    async fn apply_claim(&mut self, strategy: Strategy, pods: u32) -> Result<(Arm, CellClaims)> {
        let ns = self.s.workload.namespace.clone();
        // The prepared arm's interval, for a cell of its strategy.
        let arm = self.arm.filter(|a| a.strategy == strategy).unwrap_or(Arm::of(strategy));
        let claims = dra_claims::cell_claims(arm, pods, &self.node);
        // This cell's row describes this cell's claims, even if their launch fails.
        self.claims = Some(claims.clone());
        self.pods_ready_s = None;
        self.allocated.clear();
        if self.several {
            // Until the cell's devices are known, no other GPU's numbers.
            self.scope.set(Some(Vec::new()));
        }
        let name = dra_claims::claim_name(arm, pods);
        let entry = journal_entry(&claims, &name);
        self.journal_change(|j| j.claims.insert(entry.clone()))?;
        let object = dra_claims::claim_object(&ns, arm, pods, &claims);
        let (plural, kind) = claim_kind(&claims);
        resource_api(&self.client, Some(&ns), kind, plural)
            .patch(
                &name,
                &PatchParams::apply(objects::FIELD_MANAGER).force(),
                &Patch::Apply(object),
            )
            .await
            .map_err(|e| kube_error(&format!("applying {entry} ({})", dra_claims::describe(&claims)), e))?;
        self.cell = Some((arm, pods));
        Ok((arm, claims))
    }

    /// Applies a workload Deployment (`name`) whose pods reference the cell's claims,
    /// journaled first.
    async fn apply_workload(
        &mut self,
        name: &str,
        mut deployment: Value,
        claims: &CellClaims,
        what: &str,
        shutdown: &Shutdown,
    ) -> Result<()> {
        k8s::ready_to_apply(&self.client, &self.s.workload.namespace, name, self.s.poll, shutdown).await?;
        let Some((arm, pods)) = self.cell else {
            return Err(BenchError::kube(
                "internal: a workload Deployment without its cell's claim",
            ));
        };
        self.journal_change(|j| match name == objects::APP {
            true => !std::mem::replace(&mut j.deployment, true),
            false => j.deployments.insert(name.to_string()),
        })?;
        dra_claims::use_claim(&mut deployment, arm, pods, claims);
        let deps: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.client.clone(), &self.s.workload.namespace);
        deps.patch(
            name,
            &PatchParams::apply(objects::FIELD_MANAGER).force(),
            &Patch::Apply(deployment),
        )
        .await
        .map(|_| ())
        .map_err(|e| kube_error(&format!("applying the workload Deployment {name} ({what})"), e))
    }

    /// Deletes the cell's Deployments (a sweep's, or a trial's two), waits for their pods
    /// to go, then deletes its claim.
    async fn end_cell(&mut self, shutdown: &Shutdown) -> Result<()> {
        let ns = self.s.workload.namespace.clone();
        let names: Vec<String> = std::iter::once(objects::APP.to_string())
            .chain(objects::ROLES.iter().map(|r| objects::role_deployment_name(r)))
            .collect();
        k8s::delete_workload(&self.client, &ns, &names, self.s.poll, shutdown).await?;
        self.trial = None;
        if matches!(self.claims, Some(CellClaims::PerPod | CellClaims::Mig(_))) {
            wait_generated_claims_gone(&self.client, &ns, self.s.poll, shutdown).await?;
        }
        // The claims stay known until the next launch: the cell's row reads them after.
        if let (Some((arm, pods)), Some(claims)) = (self.cell.take(), self.claims.as_ref()) {
            let entry = journal_entry(claims, &dra_claims::claim_name(arm, pods));
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
        // An isolation run prepares each strategy once, as a plain arm: time-slicing
        // then takes the run's one --timeslice interval, if any.
        self.arm = Some(match (arm.timeslice, self.dra.timeslices.as_slice()) {
            (None, [one]) if strategy == Strategy::TimeSlicing => Arm {
                timeslice: Some(*one),
                ..arm
            },
            _ => arm,
        });
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
            note: Some(match self.allocated.as_slice() {
                [] => dra_claims::describe(claims),
                devices => format!("{}; on {}", dra_claims::describe(claims), devices.join(", ")),
            }),
            mps_split: dra_claims::mps_split(claims, self.cell.map_or(1, |c| c.1)),
        })
    }

    async fn launch(
        &mut self,
        strategy: Strategy,
        pods: u32,
        args: &[String],
        shutdown: &Shutdown,
    ) -> Result<Vec<CellPod>> {
        let (arm, claims) = self.apply_claim(strategy, pods).await?;
        self.trial = None;
        let resource = objects::pod_resource(strategy, None, None);
        let deployment = objects::deployment(&self.s.workload, strategy, pods, &resource, args);
        let what = format!("{} × {pods}", arm.name());
        self.apply_workload(objects::APP, deployment, &claims, &what, shutdown)
            .await?;
        self.launched_at = Some(Instant::now());
        self.cell_pods().await
    }

    /// An isolation trial: the cell's claim, then the victim's Deployment and, once the
    /// victim is bound (so the scheduler cannot give an aggressor the victim's device
    /// first), the aggressors', both referencing the claim.
    async fn launch_pods(
        &mut self,
        strategy: Strategy,
        specs: &[crate::backend::PodSpec],
        shutdown: &Shutdown,
    ) -> Result<Vec<CellPod>> {
        let parts = trial::deployments(specs)?;
        let pods = specs.len() as u32;
        let (arm, claims) = self.apply_claim(strategy, pods).await?;
        self.trial = Some(TrialCell::new(specs));
        self.launched_at = Some(Instant::now());
        let resource = objects::pod_resource(strategy, None, None);
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                trial::wait_victim_bound(&self.pods(), &self.s, Duration::from_secs(120), shutdown).await?;
            }
            let (name, object, what) = trial::part_deployment(&self.s, arm, &resource, part, pods);
            self.apply_workload(&name, object, &claims, &what, shutdown).await?;
        }
        self.cell_pods().await
    }

    /// Nothing to start: the kubelet restarts an exited container in its pod, and a
    /// ReplicaSet replaces a failed pod (k8s-sim/UPSTREAM-RULES.md I2), whose claim stays.
    fn set_mps_limits(&mut self, limits: crate::domain::MpsLimits) -> std::result::Result<(), String> {
        // The next cell's claim carries them in its GpuConfig.
        match self.arm.as_mut() {
            Some(arm) if arm.strategy == Strategy::Mps => {
                arm.mps = limits;
                Ok(())
            }
            _ if limits.is_auto() => Ok(()),
            _ => Err("MPS's client limits need an MPS arm prepared first".into()),
        }
    }

    async fn relaunch_pod(&mut self, name: &str, shutdown: &Shutdown) -> Result<()> {
        let list = shutdown.guard(trial::trial_pods(&self.pods())).await?;
        trial::relaunch(self.trial.as_mut(), name, &list)
    }

    async fn wait_ready(&mut self, timeout: Duration, shutdown: &Shutdown) -> Result<Vec<CellPod>> {
        let want = self.cell.map_or(0, |c| c.1) as usize;
        let per_pod = matches!(self.claims, Some(CellClaims::PerPod | CellClaims::Mig(_)));
        let mut wait = shutdown.poll(EndsOn::Request, self.s.poll, timeout);
        loop {
            let pods = shutdown.guard(self.cell_pods()).await?;
            let count = CellCount::of(&pods);
            // A pod that cannot get a GPU of its own once the others hold every one the
            // node publishes stays pending: that is the cell's outcome, and so is the
            // scheduler's verdict that no free device is left for its claim (J4), which
            // also counts devices other tenants hold. A shared claim's pods all fit once
            // it is allocated, so their pending is a wait.
            let no_device = pods.iter().all(|p| match &p.state {
                PodState::Pending(why) => why.contains(dra_claims::NO_FREE_DEVICE),
                _ => true,
            });
            let full = per_pod && (count.running >= self.devices() as usize || no_device);
            if pods.len() >= want && count.decided && (count.pending == 0 || full) {
                if let Some(t) = self.launched_at {
                    self.pods_ready_s = Some(t.elapsed().as_secs_f64());
                }
                self.read_allocation(&pods).await;
                return Ok(pods);
            }
            if !wait.keep_waiting().await? {
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
                self.read_allocation(&out).await;
                return Ok(out);
            }
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
        let slice = gpushare_k8s_sim::dra::resource_slice("gpu-1", 2, "NVIDIA H100 80GB HBM3", 80 << 30);
        let other = gpushare_k8s_sim::dra::resource_slice("gpu-2", 4, "NVIDIA H200", 141 << 30);
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
            timeslices: vec![dra_claims::TimeSliceInterval::Long],
            ..DraSettings::default()
        };
        let w = facts.warnings(&[Strategy::TimeSlicing], &long);
        assert!(w.len() == 1 && w[0].contains("TimeSlicingSettings is off"), "{w:?}");
    }

    #[test]
    fn a_gpu_in_mig_mode_is_read_from_its_instances_and_its_most_common_profile_chosen() {
        let mut slice = gpushare_k8s_sim::dra::resource_slice("gpu-1", 1, "NVIDIA H100 80GB HBM3", 80 << 30);
        let profiles = ["3g.40gb", "1g.10gb", "2g.20gb", "1g.10gb"].map(String::from);
        gpushare_k8s_sim::dra::make_static_mig(&mut slice, &profiles);
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
        assert_eq!(mig_choice(&g.mig_devices), Some(("1g.10gb".to_string(), 2)));
        let whole = inventory_from_slices(
            &[gpushare_k8s_sim::dra::resource_slice("gpu-1", 1, "H100", 80 << 30)],
            "gpu-1",
        );
        assert_eq!(
            (whole.gpus[0].mig_enabled, mig_choice(&whole.gpus[0].mig_devices)),
            (Some(false), None)
        );
    }

    #[test]
    fn a_cells_devices_are_those_of_the_claims_reserved_for_its_pods_and_map_to_their_gpus() {
        use gpushare_k8s_sim::dra::{make_static_mig, resource_slice};
        let mut slice = resource_slice("gpu-1", 3, "NVIDIA H100 80GB HBM3", 80 << 30);
        make_static_mig(&mut slice, &["1g.10gb".to_string(), "1g.10gb".to_string()]);
        let map = device_gpus(&[slice], "gpu-1");
        // GPU 0 in MIG mode: its instances carry the parent's UUID, and no whole gpu-0.
        assert!(!map.contains_key("gpu-0"), "{map:?}");
        let migs: Vec<(&String, &String)> = map.iter().filter(|(d, _)| d.contains("-mig-")).collect();
        assert!(
            migs.len() == 2 && migs.iter().all(|(_, g)| g.as_str() == "GPU-sim-0000"),
            "{map:?}"
        );
        assert_eq!(map.get("gpu-2").map(String::as_str), Some("GPU-sim-0002"));
        let claim = |reserved: &[&str], devices: &[(&str, &str)]| {
            serde_json::json!({"status": {
                "reservedFor": reserved.iter().map(|n| serde_json::json!({"resource": "pods", "name": n, "uid": "u"})).collect::<Vec<_>>(),
                "allocation": {"devices": {"results": devices.iter().map(|(pool, d)| serde_json::json!({"request": "gpu", "driver": dra_claims::DRIVER, "pool": pool, "device": d})).collect::<Vec<_>>()}}
            }})
        };
        let claims = [
            claim(&["w-a", "w-b"], &[("gpu-1", "gpu-2")]),
            claim(&["w-c"], &[("gpu-1", "gpu-1")]),
            claim(&["other"], &[("gpu-1", "gpu-0")]),
            claim(&["w-d"], &[("gpu-9", "gpu-3")]),
            serde_json::json!({"status": {}}),
        ];
        let pods = ["w-a", "w-b", "w-c", "w-d"].map(String::from);
        // Sorted, once each; another pod's claim and another node's pool are not the cell's.
        assert_eq!(allocated_devices(&claims, &pods, "gpu-1"), ["gpu-1", "gpu-2"]);
        assert!(allocated_devices(&claims, &[], "gpu-1").is_empty());
    }

    #[test]
    fn whole_gpus_of_different_products_are_refused_and_alike_ones_give_their_memory() {
        use gpushare_k8s_sim::dra::resource_slice;
        let two = inventory_from_slices(&[resource_slice("n", 2, "NVIDIA H100 80GB HBM3", 80 << 30)], "n");
        let g = whole_gpu_product(&two, "n").expect("alike").expect("a whole GPU");
        assert_eq!(g.memory_total_bytes, Some(80 << 30));
        let mut mixed = two.clone();
        mixed.gpus[1].name = "NVIDIA H200".into();
        mixed.gpus[1].memory_total_bytes = Some(141 << 30);
        let e = whole_gpu_product(&mixed, "n").expect_err("mixed").to_string();
        assert!(
            e.contains("node n publishes whole GPUs of different products (NVIDIA H100 80GB HBM3 (81920 MiB), NVIDIA H200 (144384 MiB))"),
            "{e}"
        );
        let mut mig = two;
        for g in &mut mig.gpus {
            g.mig_enabled = Some(true);
        }
        assert!(whole_gpu_product(&mig, "n").expect("MIG only").is_none());
    }
}
