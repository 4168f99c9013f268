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
use crate::domain::Strategy;
use crate::error::{BenchError, Result};
use crate::shutdown::Shutdown;
use crate::telemetry::inventory::{GpuInfo, GpuInventory};

/// A `resource.k8s.io/v1` resource of the workload namespace, or cluster-wide.
fn resource_api(client: &Client, ns: Option<&str>, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// The kind of a claim resource's plural.
fn kind_of(plural: &str) -> Option<&'static str> {
    match plural {
        "resourceclaims" => Some("ResourceClaim"),
        "resourceclaimtemplates" => Some("ResourceClaimTemplate"),
        _ => None,
    }
}

/// The journal's entry for a cell's claim object (`resourceclaims/NAME`).
fn journal_entry(claims: &CellClaims, name: &str) -> String {
    match claims {
        CellClaims::PerPod => format!("resourceclaimtemplates/{name}"),
        CellClaims::Shared(_) => format!("resourceclaims/{name}"),
    }
}

/// Deletes a claim or claim template (`resourceclaims/NAME`) in `ns` and waits, at most
/// 120 s, until it is gone: a claim stays while pods reserve it (its finalizer goes
/// once the resourceclaim controller has deallocated it), and the next cell's claim can
/// have its device only then. A forced stop ends the wait.
pub async fn delete_claim(client: &Client, ns: &str, entry: &str, poll: Duration, shutdown: &Shutdown) -> Result<()> {
    let (plural, name) = entry
        .split_once('/')
        .filter(|(p, _)| kind_of(p).is_some())
        .ok_or_else(|| BenchError::kube(format!("internal: {entry:?} is not a claim of the journal")))?;
    let api = resource_api(client, Some(ns), kind_of(plural).unwrap_or_default(), plural);
    match api.delete(name, &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(kube_error(&format!("deleting {entry} in namespace {ns}"), e)),
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match api.get(name).await {
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
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

/// The node's GPUs as the driver's ResourceSlices publish them (pure): whole GPUs of
/// driver `gpu.nvidia.com` on `node`, their product name, UUID and memory capacity, and
/// the driver versions their attributes carry (J2).
pub fn inventory_from_slices(slices: &[Value], node: &str) -> GpuInventory {
    let mut gpus = Vec::new();
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
            if attr("type").as_deref() != Some("gpu") {
                continue;
            }
            driver_version = driver_version.or_else(|| attr("driverVersion"));
            cuda_driver_version = cuda_driver_version.or_else(|| attr("cudaDriverVersion"));
            gpus.push(GpuInfo {
                index: gpus.len() as u32,
                name: attr("productName").unwrap_or_else(|| "unknown GPU".into()),
                uuid: attr("uuid").unwrap_or_default(),
                memory_total_bytes: d["capacity"]["memory"]["value"]
                    .as_str()
                    .and_then(|q| q.parse::<crate::config::values::Quantity>().ok())
                    .map(|q| q.bytes),
                mig_enabled: None,
                compute_mode: None,
                mig_devices: Vec::new(),
            });
        }
    }
    GpuInventory {
        gpus,
        driver_version,
        cuda_driver_version,
        nvml: false,
    }
}

/// Pods on one Kubernetes node that get their GPU through DRA claims.
pub struct DraBackend {
    client: Client,
    s: KubeSettings,
    dra: DraSettings,
    journal_path: Option<PathBuf>,
    journal: Option<Journal>,
    /// Whole GPUs the node's slices publish.
    gpus: u32,
    /// Their memory (for MPS's default pinned-memory limit).
    gpu_memory: Option<u64>,
    cell: Option<(Strategy, u32)>,
    claims: Option<CellClaims>,
    launched_at: Option<Instant>,
    pods_ready_s: Option<f64>,
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
            gpu_memory: None,
            cell: None,
            claims: None,
            launched_at: None,
            pods_ready_s: None,
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
                "node {} publishes no GPU in a {} ResourceSlice: is the DRA driver's kubelet plugin running there (and MIG off on its GPUs)?",
                self.s.node,
                dra::DRIVER
            )));
        }
        self.gpus = inventory.gpus.len() as u32;
        self.gpu_memory = inventory.gpus.iter().filter_map(|g| g.memory_total_bytes).min();
        Ok(inventory)
    }

    /// Uses `dir`'s restore journal (resume: the claims a killed run left).
    pub fn attach_journal(&mut self, dir: &std::path::Path) -> Result<()> {
        let path = journal::path_in(dir);
        self.journal = journal::read(&path)?;
        if let Some(j) = &self.journal
            && j.node != self.s.node
        {
            return Err(BenchError::flag(
                "--node",
                &self.s.node,
                format!("this run used node {}; resume it with --node {}", j.node, j.node),
            ));
        }
        self.journal_path = Some(path);
        Ok(())
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
            Some((strategy, pods)) => k8s::list_cell_pods(&self.pods(), strategy, pods).await,
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
        if let (Some((strategy, pods)), Some(claims)) = (self.cell.take(), self.claims.as_ref()) {
            let entry = journal_entry(claims, &dra::claim_name(strategy, pods));
            delete_claim(&self.client, &ns, &entry, self.s.poll, shutdown).await?;
        }
        Ok(())
    }
}

impl Backend for DraBackend {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn prepare(&mut self, strategy: Strategy, shutdown: &Shutdown) -> Result<Prepared> {
        shutdown
            .guard(k8s::ensure_namespace(&self.client, &self.s.workload.namespace))
            .await?;
        if strategy == Strategy::Mig {
            return Ok(Prepared::Unavailable(format!(
                "MIG through DRA is not supported yet: the driver publishes MIG devices ({}) only where MIG is already on, and the harness changes no GPU setting",
                dra::MIG_CLASS
            )));
        }
        Ok(Prepared::Ready)
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
        shutdown: &Shutdown,
    ) -> Result<Vec<CellPod>> {
        let ns = self.s.workload.namespace.clone();
        let claims = dra::cell_claims(strategy, pods, &self.dra, self.gpu_memory);
        let name = dra::claim_name(strategy, pods);
        let entry = journal_entry(&claims, &name);
        // A claim left by a killed run has the same name but perhaps another spec, which
        // the API server keeps immutable: delete it first (it is in the journal).
        if self.journal.as_ref().is_some_and(|j| j.claims.contains(&entry)) {
            shutdown
                .guard(delete_claim(&self.client, &ns, &entry, self.s.poll, shutdown))
                .await?;
        }
        self.journal_change(|j| j.claims.insert(entry.clone()))?;
        let (plural, _) = entry.split_once('/').unwrap_or_default();
        let object = dra::claim_object(&ns, strategy, pods, &claims);
        resource_api(&self.client, Some(&ns), kind_of(plural).unwrap_or_default(), plural)
            .patch(
                &name,
                &PatchParams::apply(objects::FIELD_MANAGER).force(),
                &Patch::Apply(object),
            )
            .await
            .map_err(|e| kube_error(&format!("applying {entry} ({})", dra::describe(&claims)), e))?;
        self.claims = Some(claims.clone());
        self.cell = Some((strategy, pods));
        self.pods_ready_s = None;
        self.journal_change(|j| !std::mem::replace(&mut j.deployment, true))?;
        let mut deployment = objects::deployment(&self.s.workload, strategy, pods, "nvidia.com/gpu", args);
        dra::use_claim(&mut deployment, strategy, pods, &claims);
        let deps: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(self.client.clone(), &ns);
        deps.patch(
            objects::APP,
            &PatchParams::apply(objects::FIELD_MANAGER).force(),
            &Patch::Apply(deployment),
        )
        .await
        .map_err(|e| {
            kube_error(
                &format!("applying the workload Deployment ({} × {pods})", strategy.name()),
                e,
            )
        })?;
        self.launched_at = Some(Instant::now());
        self.cell_pods().await
    }

    async fn wait_ready(&mut self, timeout: Duration, shutdown: &Shutdown) -> Result<Vec<CellPod>> {
        let want = self.cell.map_or(0, |c| c.1) as usize;
        let per_pod = matches!(self.claims, Some(CellClaims::PerPod));
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
            let full = per_pod && running >= self.gpus as usize;
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
}
