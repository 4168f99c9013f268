//! Opening a sweep on a Kubernetes GPU node: the run record from the node's GPU labels,
//! metrics through the cluster's Prometheus (by URL, or a port-forward to its pod), GPU
//! telemetry from the DCGM exporter's series; and `--dry-run`.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::path::Path;

use super::base::{KubeSettings, RestoreReport, restore_from_journal};
use super::device_plugin::KubernetesBackend;
use super::journal;
use super::objects::{self, PluginConfigMap, WorkloadSpec};
use crate::backend::Session;
use crate::config::cli::RestoreArgs;
use crate::config::plan::{DraSettings, KubernetesPlan, PrometheusSetting, RunKind, SweepPlan};
use crate::domain::{DeviceKind, Strategy};
use crate::error::{BenchError, Result};
use crate::metrics::prometheus::PromClient;
use crate::results::lock::RunLock;
use crate::results::record::PlanRecord;
use crate::results::store::RunStore;
use crate::shutdown::Shutdown;
use crate::telemetry::dcgm::{DcgmTelemetry, GpuScope};
use crate::telemetry::{GpuInfo, GpuInventory, Telemetry, host};

/// The GPU as the node's GPU-feature-discovery labels describe it (pure).
pub fn inventory_from_labels(labels: &BTreeMap<String, String>) -> GpuInventory {
    let get = |k: &str| labels.get(k).cloned();
    let count: u32 = get(objects::LABEL_GPU_COUNT).and_then(|c| c.parse().ok()).unwrap_or(0);
    let gpus = (0..count)
        .map(|i| GpuInfo {
            index: i,
            name: get(objects::LABEL_PRODUCT).unwrap_or_else(|| "unknown GPU".into()),
            uuid: String::new(),
            memory_total_bytes: get("nvidia.com/gpu.memory")
                .and_then(|m| m.parse::<u64>().ok())
                .map(|mib| mib * 1024 * 1024),
            mig_enabled: match get(objects::LABEL_MIG_CAPABLE).as_deref() {
                Some("true") => Some(get(objects::LABEL_MIG_CONFIG).is_some_and(|c| c != "all-disabled")),
                _ => None,
            },
            compute_mode: get("nvidia.com/gpu.compute-mode"),
            ..GpuInfo::default()
        })
        .collect();
    GpuInventory {
        gpus,
        driver_version: get("nvidia.com/cuda.driver-version.full"),
        cuda_driver_version: get("nvidia.com/cuda.runtime-version.full"),
        nvml: false,
    }
}

/// What the cell's pods run, from the plan (pure).
pub(crate) fn workload_spec(plan: &SweepPlan, k: &KubernetesPlan, args: Vec<String>) -> WorkloadSpec {
    WorkloadSpec {
        namespace: k.namespace.clone(),
        image: k.image.clone(),
        node: k.node.clone(),
        args,
        tolerations: k.tolerations.clone(),
        pull_secrets: k.image_pull_secrets.clone(),
        server: own_server(plan.workload_cmd.as_deref(), k.server_args.as_deref(), &plan.ready_path),
    }
}

/// The container of `--workload-cmd` or of `--server-image`'s arguments, `{port}` the
/// metrics port (pure).
fn own_server(cmd: Option<&str>, server_args: Option<&[String]>, ready_path: &str) -> Option<objects::OwnServer> {
    let port = |text: &str| crate::backend::local::custom_command(text, objects::METRICS_PORT);
    let start = match (cmd, server_args) {
        (Some(cmd), _) => objects::ServerStart::Shell(port(cmd)),
        (None, Some(args)) => objects::ServerStart::Entrypoint(args.iter().map(|a| port(a)).collect()),
        (None, None) => return None,
    };
    Some(objects::OwnServer {
        start,
        ready_path: ready_path.to_string(),
    })
}

fn settings(plan: &SweepPlan, k: &KubernetesPlan, args: Vec<String>) -> KubeSettings {
    let mut s = KubeSettings::new(&k.node, workload_spec(plan, k, args));
    s.operator_namespace = k.operator_namespace.clone();
    s.mig_layout = k.mig_layout.clone();
    s.strategies = plan.strategies.clone();
    s.pods = plan.pods.clone();
    s
}

/// Every object and patch a sweep would apply, as YAML documents (pure). The ConfigMap
/// and namespace of the operator are the defaults; the sweep reads them from the
/// ClusterPolicy.
pub fn dry_run(plan: &SweepPlan, k: &KubernetesPlan) -> String {
    if let crate::config::plan::Sharing::Dra(_) = &k.sharing {
        return dry_run_dra(plan, k);
    }
    let node = &k.node;
    let record = PlanRecord::from_plan(plan, DeviceKind::Cuda, crate::domain::Source::Prometheus);
    let s = settings(plan, k, record.workload_args());
    let cm = PluginConfigMap::default();
    let doc = |title: String, v: serde_json::Value| {
        format!("# {title}\n{}---\n", serde_yaml_ng::to_string(&v).unwrap_or_default())
    };
    let mut out = format!(
        "# Reads ClusterPolicy devicePlugin.config (name and default) and mig.strategy; the ConfigMap below is the\n# default {}. On a node with several GPUs every cell fills them all: its Deployment has pods × GPUs replicas,\n# which the device plugin spreads over the GPUs, and each GPU gets its own rows. Every change is journaled in\n# the run directory (kubernetes-journal.json) before it is made; restore undoes exactly those.\n",
        cm.id()
    );
    let max = plan.pods.iter().copied().max().unwrap_or(1);
    let mut keys: Vec<(String, Option<String>)> = vec![(
        objects::config_entry_name(Strategy::Exclusive, 1),
        Some(objects::device_plugin_config(Strategy::Exclusive, 1)),
    )];
    for &strategy in &plan.strategies {
        let replicas: Vec<u32> = match strategy {
            Strategy::TimeSlicing => vec![objects::sharing_replicas(max)],
            Strategy::Mps => plan.pods.iter().map(|&p| objects::sharing_replicas(p)).collect(),
            _ => Vec::new(),
        };
        for r in replicas {
            let k = (
                objects::config_entry_name(strategy, r),
                Some(objects::device_plugin_config(strategy, r)),
            );
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    out += &doc(
        format!(
            "ConfigMap {}: merge patch adding the keys not already there with this content (a key with other content is refused); then wait {} s for the kubelet to project them",
            cm.id(),
            s.projection_wait.as_secs()
        ),
        objects::configmap_keys_patch(&keys),
    );
    let plugin = |strategy: Strategy, replicas: u32| {
        let entry = objects::config_entry_name(strategy, replicas);
        doc(
            format!(
                "node {node}: merge patch; then wait until {} and allocatable nvidia.com/gpu = {} hold for {} s",
                objects::expected_plugin_labels(strategy, replicas, "<product>")
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if strategy == Strategy::Exclusive { 1 } else { replicas },
                s.settle.as_secs()
            ),
            objects::node_label_patch(&[(objects::LABEL_PLUGIN_CONFIG, Some(&entry))]),
        )
    };
    let layout = s
        .mig_layout
        .clone()
        .unwrap_or_else(|| "all-1g.10gb (the product's smallest profile)".into());
    for &strategy in &plan.strategies {
        match strategy {
            Strategy::Exclusive => out += &plugin(strategy, 1),
            Strategy::TimeSlicing => out += &plugin(strategy, objects::sharing_replicas(max)),
            Strategy::Mig => {
                out += &plugin(Strategy::Exclusive, 1);
                out += &doc(
                    format!(
                        "node {node}: merge patch; then wait for {}=success, GFD's MIG labels, allocatable MIG devices and a fresh device-plugin pod",
                        objects::LABEL_MIG_STATE
                    ),
                    objects::node_label_patch(&[(objects::LABEL_MIG_CONFIG, Some(&layout))]),
                );
            }
            Strategy::Mps => {}
        }
        for &pods in &plan.pods {
            if strategy == Strategy::Mps {
                out += &format!(
                    "# MPS × {pods}: through {} while an MPS daemon runs (it takes a new replica count only when its pod is recreated), then:\n",
                    objects::config_entry_name(Strategy::Exclusive, 1)
                );
                out += &plugin(strategy, objects::sharing_replicas(pods));
            }
            let resource = objects::pod_resource(strategy, None, None);
            out += &doc(
                format!(
                    "{} × {pods}: Deployment (server-side apply), then deleted after the cell",
                    strategy.name()
                ),
                objects::deployment(&s.workload, strategy, pods, &resource, &plan.load.workload_args(pods)),
            );
        }
    }
    out += &doc(
        format!(
            "restore node {node} from the journal: each label the harness set, if it still holds the harness's value"
        ),
        objects::node_label_patch(&[
            (objects::LABEL_PLUGIN_CONFIG, Some("<original value or null>")),
            (
                objects::LABEL_MIG_CONFIG,
                Some("<original value or null, if MIG was changed>"),
            ),
        ]),
    );
    out + &format!(
        "# restore: remove from ConfigMap {} only the keys the harness added, if unchanged since (merge patch with null values)\n",
        cm.id()
    )
}

/// What a sweep through DRA claims would apply (pure): per cell, the claim or claim
/// template and the Deployment whose pods reference it; nothing on the node changes.
fn dry_run_dra(plan: &SweepPlan, k: &KubernetesPlan) -> String {
    use super::dra_claims as dra;
    let record = PlanRecord::from_plan(plan, DeviceKind::Cuda, crate::domain::Source::Prometheus);
    let s = settings(plan, k, record.workload_args());
    let doc = |title: String, v: serde_json::Value| {
        format!("# {title}\n{}---\n", serde_yaml_ng::to_string(&v).unwrap_or_default())
    };
    let mut out = format!(
        "# --sharing-api dra: no node label or ConfigMap changes. Needs Kubernetes 1.34+ (resource.k8s.io/v1) and NVIDIA's\n\
         # DRA driver ({driver}, DeviceClass {class}; types read at {version}). Each cell's claim is created before its\n\
         # Deployment and deleted after its pods are gone; every name is journaled first.\n",
        driver = dra::DRIVER,
        class = dra::GPU_CLASS,
        version = dra::DRIVER_VERSION_READ,
    );
    if plan
        .arms()
        .iter()
        .any(|a| a.strategy == Strategy::Mps && a.mps.memory == crate::domain::MpsMemory::Auto)
    {
        out += "# MPS: defaultPinnedDeviceMemoryLimit is the GPU's memory (its ResourceSlice's capacity) / max(2, pods),\n# unknown here, so the claims below leave it out.\n";
    }
    if plan.strategies.contains(&Strategy::Mig) {
        out += "# MIG: the driver publishes MIG devices only for a GPU in MIG mode with instances already made, and then\n\
                # no whole GPU (the harness changes neither). MIG cells ask for the profile the node's slices publish most of\n\
                # (read at start; the selector below is left out); on such a node the other strategies are unavailable.\n";
    }
    for arm in plan.arms() {
        let strategy = arm.strategy;
        for &pods in &plan.pods {
            let claims = dra::cell_claims(arm, pods, &Default::default());
            out += &doc(
                format!(
                    "{} × {pods}: {} (server-side apply)",
                    arm.name(),
                    dra::describe(&claims)
                ),
                dra::claim_object(&k.namespace, arm, pods, &claims),
            );
            let resource = objects::pod_resource(strategy, None, None);
            let mut d = objects::deployment(&s.workload, strategy, pods, &resource, &plan.load.workload_args(pods));
            dra::use_claim(&mut d, arm, pods, &claims);
            out += &doc(
                format!(
                    "{} × {pods}: Deployment (server-side apply); after the cell it is deleted, then the claim",
                    arm.name()
                ),
                d,
            );
        }
    }
    out
}

/// Opens a sweep on the node (a new run, or `resume`): reads the node's GPU labels,
/// opens the run directory, and reaches the cluster's Prometheus by URL or through a
/// port-forward to its pod.
pub async fn open(
    plan: &SweepPlan,
    k: &KubernetesPlan,
    resume: Option<&str>,
    shutdown: &Shutdown,
) -> Result<Session<KubernetesBackend>> {
    let node = &k.node;
    let mut backend = shutdown
        .guard(KubernetesBackend::connect(settings(plan, k, Vec::new())))
        .await?;
    let labels = shutdown.guard(backend.check_cluster()).await?;
    let inventory = inventory_from_labels(&labels);
    if inventory.gpus.is_empty() {
        return Err(BenchError::kube(format!(
            "node {node} has no {} label: is the NVIDIA GPU operator (GPU feature discovery) running there?",
            objects::LABEL_GPU_COUNT
        )));
    }
    let gpus = backend.gpus();
    if gpus > 1 {
        let what = match &plan.kind {
            RunKind::Isolation(_) => Some("an isolation run"),
            RunKind::Capacity(_) => Some("a capacity search"),
            RunKind::Sweep => None,
        };
        if let Some(what) = what {
            return Err(BenchError::kube(super::device_plugin::several_gpus_refused(
                node, gpus, what,
            )));
        }
    }
    let store = open_store(plan, k, resume, &inventory, gpus)?;
    backend.attach_journal(store.dir())?;
    let recorded = store.run().plan.clone();
    // The pods' arguments and server come from the recorded plan (it wins when
    // resuming; recorded_backend checked that the same --workload-cmd was given).
    backend.set_workload_args(recorded.workload_args());
    backend.set_server(recorded_server(&recorded));
    if let Some(image) = recorded_aggressor_image(&store) {
        backend.set_aggressor_image(image);
    }
    let scope = GpuScope::node();
    finish_session(backend, (plan, k, resume.is_some()), store, scope, shutdown).await
}

/// Opens a sweep whose pods get their GPU through DRA claims (`--sharing-api dra`): the
/// node's GPUs from the DRA driver's ResourceSlices; nothing on the node changes.
pub async fn open_dra(
    plan: &SweepPlan,
    k: &KubernetesPlan,
    dra: &DraSettings,
    resume: Option<&str>,
    shutdown: &Shutdown,
) -> Result<Session<super::dra::DraBackend>> {
    let node = &k.node;
    let mut backend = shutdown
        .guard(super::dra::DraBackend::connect(
            settings(plan, k, Vec::new()),
            dra.clone(),
        ))
        .await?;
    let inventory = shutdown.guard(backend.check_cluster()).await?;
    let driver = match backend.driver() {
        Some(Ok(d)) => d.describe(),
        Some(Err(why)) => format!("not read: {why}"),
        None => "not read".into(),
    };
    let env = || crate::results::record::Environment {
        dra_driver: Some(driver.clone()),
        ..host::environment(&inventory, &format!("image {} on node {node}", k.image), None)
    };
    let short = inventory.gpus.first().map_or("gpu".into(), |g| g.short_name());
    let store = RunStore::open_or_create(plan, resume, DeviceKind::Cuda, &short, env)?;
    backend.attach_journal(store.dir())?;
    let recorded = store.run().plan.clone();
    backend.set_workload_args(recorded.workload_args());
    backend.set_server(recorded_server(&recorded));
    let dra = recorded.dra.clone().unwrap_or_default();
    let mut warnings = vec![format!("DRA driver on {node}: {driver}")];
    if let Some(Ok(d)) = backend.driver() {
        warnings.extend(d.warnings(&recorded.strategies, &dra));
    }
    backend.set_dra(dra);
    if let Some(image) = recorded_aggressor_image(&store) {
        backend.set_aggressor_image(image);
    }
    let scope = backend.gpu_scope();
    let mut session = finish_session(backend, (plan, k, resume.is_some()), store, scope, shutdown).await?;
    session.notes.extend(warnings);
    Ok(session)
}

/// The image a recorded isolation run's aggressors run beside a server of the user's own.
fn recorded_aggressor_image(store: &RunStore) -> Option<&str> {
    store.run().kind.isolation()?.aggressor_image.as_deref()
}

/// The server of the user's own of a recorded plan.
fn recorded_server(recorded: &PlanRecord) -> Option<objects::OwnServer> {
    own_server(
        recorded.workload_cmd.as_deref(),
        recorded.server_args.as_deref(),
        &recorded.ready_path,
    )
}

/// The run directory for the node's GPUs (new, or the one resumed), whose cells fill
/// `gpus` GPUs. A resumed run must find the node with the GPUs its cells filled.
fn open_store(
    plan: &SweepPlan,
    k: &KubernetesPlan,
    resume: Option<&str>,
    inventory: &GpuInventory,
    gpus: u32,
) -> Result<RunStore> {
    let short = inventory.gpus.first().map_or("gpu".into(), |g| g.short_name());
    let env = || crate::results::record::Environment {
        gpus_filled: (gpus > 1).then_some(gpus),
        ..host::environment(inventory, &format!("image {} on node {}", k.image, k.node), None)
    };
    let store = RunStore::open_or_create(plan, resume, DeviceKind::Cuda, &short, env)?;
    let filled = store.run().environment.gpus_filled.unwrap_or(1);
    if filled != gpus {
        return Err(BenchError::kube(format!(
            "{} filled {filled} GPU(s) of node {} per cell, which now has {gpus}: resume it where it ran, or start a new run",
            store.dir().display(),
            k.node
        )));
    }
    Ok(store)
}

/// The rest of a session: what the user reads first, and the cluster's Prometheus (by
/// URL, or through a port-forward to its pod) for metrics and the DCGM exporter's series.
async fn finish_session<B>(
    backend: B,
    (plan, k, resumed): (&SweepPlan, &KubernetesPlan, bool),
    store: RunStore,
    scope: GpuScope,
    shutdown: &Shutdown,
) -> Result<Session<B>> {
    let recorded = store.run().plan.clone();
    let mut notes = Vec::new();
    if resumed {
        let (done, unit) = if store.run().kind.isolation().is_some() {
            (store.isolation().len(), "trials")
        } else {
            (store.cell_count(), "cells")
        };
        notes.push(format!(
            "resuming {} ({done} {unit} on disk); its recorded plan is used",
            store.dir().display()
        ));
    }
    let mut keep_alive: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    let url = match recorded.prometheus_setting() {
        PrometheusSetting::Url(u) => u,
        _ => {
            let (ns, selector) = &k.prometheus_pod;
            // The forward's stream idles between scrapes: a client without read timeout.
            let streaming = shutdown.guard(super::base::connect_streaming()).await?;
            let f = shutdown
                .guard(super::portforward::to_prometheus(streaming, ns, selector, 9090))
                .await?;
            notes.push(format!("Prometheus: port-forward {} → pod ({selector}) in {ns}", f.url));
            let url = f.url.clone();
            keep_alive.push(Box::new(f));
            url
        }
    };
    let telemetry: Arc<dyn Telemetry> = Arc::new(DcgmTelemetry::new(PromClient::new(&url), &k.node, scope));
    Ok(Session {
        backend,
        metrics: PrometheusSetting::Url(url),
        telemetry,
        settings: recorded.measure_settings(plan.measure.ready_timeout),
        store,
        notes,
        keep_alive,
    })
}

/// `gpushare-bench restore --node NODE [RUN_DIR]`: undoes a run's changes to the node
/// from its journal (the newest under `--out` with changes left on NODE when no run
/// directory is given). Refused while a sweep holds the run.
pub async fn restore_node(args: &RestoreArgs, shutdown: &Shutdown) -> Result<RestoreReport> {
    let path = match &args.run_dir {
        Some(dir) => journal::path_in(dir),
        None => journal::find_open(&args.out, &args.node)?.ok_or_else(|| {
            BenchError::flag(
                "--node",
                &args.node,
                format!(
                    "no run under {} has changes to undo on this node (pass the run directory)",
                    args.out.display()
                ),
            )
        })?,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let j = journal::read(&path)?.ok_or_else(|| BenchError::Results {
        path: path.clone(),
        reason: "no Kubernetes journal here: this run changed no cluster".into(),
    })?;
    if j.node != args.node {
        return Err(BenchError::flag(
            "--node",
            &args.node,
            format!("{} journals node {}, not this one", path.display(), j.node),
        ));
    }
    // A sweep running on this run directory holds its lock.
    let _lock = RunLock::acquire(dir)?;
    let workload = WorkloadSpec {
        namespace: j.workload_namespace.clone(),
        image: String::new(),
        node: j.node.clone(),
        args: Vec::new(),
        tolerations: Vec::new(),
        pull_secrets: Vec::new(),
        server: None,
    };
    let s = KubeSettings::new(&j.node, workload);
    let client = shutdown.guard(KubernetesBackend::connect(s.clone())).await?.client();
    restore_from_journal(&client, &path, &s, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inventory_from_gpu_feature_discovery_labels() {
        let labels: BTreeMap<String, String> = [
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia.com/gpu.count", "1"),
            ("nvidia.com/gpu.memory", "81559"),
            ("nvidia.com/mig.capable", "true"),
            ("nvidia.com/mig.config", "all-disabled"),
            ("nvidia.com/cuda.driver-version.full", "580.159.04"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let inv = inventory_from_labels(&labels);
        assert_eq!(inv.gpus.len(), 1);
        assert_eq!(inv.gpus[0].memory_total_bytes, Some(81559 * 1024 * 1024));
        assert_eq!(inv.gpus[0].mig_enabled, Some(false));
        assert_eq!(inv.gpus[0].short_name(), "h100");
        assert_eq!(inv.driver_version.as_deref(), Some("580.159.04"));
    }

    fn dra_plan() -> SweepPlan {
        let o: crate::config::options::SweepOptions = toml::from_str(
            "backend = \"kubernetes\"\nnode = \"gpu-1\"\nsharing_api = \"dra\"\ntimeslice = \"long,short\"\npods = \"1,3\"\n",
        )
        .expect("options");
        SweepPlan::from_options(o).expect("plan")
    }

    #[test]
    fn a_dra_dry_run_prints_each_cells_claim_and_no_node_change() {
        let p = dra_plan();
        let text = dry_run(&p, p.kubernetes().expect("kubernetes"));
        let docs: Vec<serde_json::Value> = text
            .split("\n---\n")
            .filter(|d| d.lines().any(|l| !l.starts_with('#') && !l.trim().is_empty()))
            .map(|d| serde_yaml_ng::from_str(d).expect("yaml"))
            .collect();
        let kinds: Vec<(String, String)> = docs
            .iter()
            .map(|d| {
                (
                    d["kind"].as_str().unwrap_or_default().to_string(),
                    d["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        let want = |k: &str, n: &str| (k.to_string(), n.to_string());
        for w in [
            want("ResourceClaimTemplate", "gpushare-exclusive-1"),
            want("ResourceClaimTemplate", "gpushare-exclusive-3"),
            want("ResourceClaim", "gpushare-time-slicing-long-3"),
            want("ResourceClaim", "gpushare-time-slicing-short-1"),
            want("ResourceClaim", "gpushare-mps-1"),
        ] {
            assert!(kinds.contains(&w), "{w:?} not in {kinds:?}");
        }
        // exclusive, time-slicing long and short, MPS, MIG: 5 arms × 2 pod counts.
        assert_eq!(kinds.iter().filter(|(k, _)| k == "Deployment").count(), 10, "{kinds:?}");
        let mig = docs
            .iter()
            .find(|d| d["metadata"]["name"] == "gpushare-mig-3")
            .expect("MIG template");
        assert_eq!(
            mig["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
            "mig.nvidia.com"
        );
        for (name, interval) in [
            ("gpushare-time-slicing-long-3", "Long"),
            ("gpushare-time-slicing-short-3", "Short"),
        ] {
            let ts = docs.iter().find(|d| d["metadata"]["name"] == name).expect("claim");
            assert_eq!(
                ts["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["timeSlicingConfig"]["interval"],
                interval
            );
        }
        assert!(text.contains("# MIG: the driver publishes MIG devices only"), "{text}");
    }
}
