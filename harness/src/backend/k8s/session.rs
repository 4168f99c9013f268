//! Opening a sweep on a Kubernetes GPU node: the run record from the node's GPU labels,
//! metrics through the cluster's Prometheus (by URL, or a port-forward to its pod), GPU
//! telemetry from the DCGM exporter's series; and `--dry-run`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::backend::{KubeSettings, KubernetesBackend};
use super::objects::{self, PluginConfigMap, WorkloadSpec};
use crate::backend::Session;
use crate::config::plan::{PrometheusSetting, SweepPlan};
use crate::domain::{DeviceKind, Strategy};
use crate::error::{BenchError, Result};
use crate::metrics::prometheus::PromClient;
use crate::results::record::PlanRecord;
use crate::results::store::RunStore;
use crate::shutdown::Shutdown;
use crate::telemetry::dcgm::DcgmTelemetry;
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
            mig_devices: Vec::new(),
        })
        .collect();
    GpuInventory {
        gpus,
        driver_version: get("nvidia.com/cuda.driver-version.full"),
        cuda_driver_version: get("nvidia.com/cuda.runtime-version.full"),
        nvml: false,
    }
}

fn settings(plan: &SweepPlan, node: &str, args: Vec<String>) -> KubeSettings {
    KubeSettings {
        node: node.to_string(),
        workload: WorkloadSpec {
            namespace: plan.namespace.clone(),
            image: plan.image.clone(),
            node: node.to_string(),
            args,
        },
        plugin: PluginConfigMap::default(),
        mig_layout: plan.mig_layout.clone(),
        pods: plan.pods.clone(),
        switch_timeout: Duration::from_secs(300),
        poll: Duration::from_secs(2),
    }
}

/// Every object and patch a sweep would apply, as YAML documents (pure).
pub fn dry_run(plan: &SweepPlan) -> String {
    let node = plan.node.clone().unwrap_or_else(|| "NODE".into());
    let record = PlanRecord::from_plan(plan, DeviceKind::Cuda, crate::domain::Source::Prometheus);
    let s = settings(plan, &node, record.workload_args());
    let doc = |title: String, v: serde_json::Value| {
        format!("# {title}\n{}---\n", serde_yaml_ng::to_string(&v).unwrap_or_default())
    };
    let mut out = doc(
        format!("namespace {} (server-side apply)", s.workload.namespace),
        objects::namespace(&s.workload.namespace),
    );
    let layout = s
        .mig_layout
        .clone()
        .unwrap_or_else(|| "all-1g.10gb (or the product's smallest profile)".into());
    let plugin = |strategy: Strategy, replicas: u32| {
        let entry = objects::config_entry_name(strategy, replicas);
        doc(
            format!(
                "ConfigMap {}/{}: add entry {entry} (server-side apply, field manager {})",
                s.plugin.namespace,
                s.plugin.name,
                objects::FIELD_MANAGER
            ),
            objects::plugin_entry_patch(&s.plugin, strategy, replicas),
        ) + &doc(
            format!(
                "node {node}: merge patch; then wait for {}",
                objects::expected_sharing_labels(strategy, replicas)
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            objects::node_label_patch(&[(objects::LABEL_PLUGIN_CONFIG, Some(&entry))]),
        )
    };
    for &strategy in &plan.strategies {
        match strategy {
            Strategy::Exclusive => out += &plugin(strategy, 1),
            Strategy::TimeSlicing => out += &plugin(strategy, plan.pods.iter().copied().max().unwrap_or(1)),
            Strategy::Mig => {
                out += &plugin(Strategy::Exclusive, 1);
                out += &doc(
                    format!(
                        "node {node}: merge patch; then wait for {}=success",
                        objects::LABEL_MIG_STATE
                    ),
                    objects::node_label_patch(&[(objects::LABEL_MIG_CONFIG, Some(&layout))]),
                );
            }
            Strategy::Mps => {}
        }
        for &pods in &plan.pods {
            if strategy == Strategy::Mps {
                out += &plugin(strategy, pods);
            }
            let resource = objects::pod_resource(strategy, None, None);
            out += &doc(
                format!(
                    "{} × {pods}: Deployment (server-side apply), then deleted after the cell",
                    strategy.name()
                ),
                objects::deployment(&s.workload, strategy, pods, &resource),
            );
        }
    }
    out += &doc(
        format!("restore node {node}: the labels as they were (null = remove)"),
        objects::node_label_patch(&[
            (objects::LABEL_PLUGIN_CONFIG, Some("<original value or null>")),
            (
                objects::LABEL_MIG_CONFIG,
                Some("<original value or null, if MIG was changed>"),
            ),
        ]),
    );
    out + &format!(
        "# restore: remove the entries above from ConfigMap {}/{} (merge patch with null values)\n",
        s.plugin.namespace, s.plugin.name
    )
}

/// Opens a sweep on the node (a new run, or `resume`): reads the node's GPU labels,
/// opens the run directory, and reaches the cluster's Prometheus by URL or through a
/// port-forward to its pod.
pub async fn open(plan: &SweepPlan, resume: Option<&str>, shutdown: &Shutdown) -> Result<Session<KubernetesBackend>> {
    let node = plan
        .node
        .clone()
        .ok_or_else(|| BenchError::flag("--node", "", "the Kubernetes backend needs the GPU node's name"))?;
    let mut backend = shutdown
        .guard(KubernetesBackend::connect(settings(plan, &node, Vec::new())))
        .await?;
    let labels = shutdown.guard(backend.node_labels()).await?;
    let inventory = inventory_from_labels(&labels);
    if inventory.gpus.is_empty() {
        return Err(BenchError::kube(format!(
            "node {node} has no {} label: is the NVIDIA GPU operator (GPU feature discovery) running there?",
            objects::LABEL_GPU_COUNT
        )));
    }
    let short = inventory.gpus.first().map_or("gpu".into(), |g| g.short_name());
    let env = || host::environment(&inventory, &format!("image {} on node {node}", plan.image), None);
    let store = RunStore::open_or_create(plan, resume, DeviceKind::Cuda, &short, env)?;
    let recorded = store.run().plan.clone();
    let mut notes = Vec::new();
    if resume.is_some() {
        notes.push(format!(
            "resuming {} ({} cells on disk); its recorded plan is used",
            store.dir().display(),
            store.cell_count()
        ));
    }
    // The pods' arguments come from the recorded plan (it wins when resuming).
    backend.set_workload_args(recorded.workload_args());
    // The cluster's Prometheus: by URL, or through a port-forward to its pod.
    let mut keep_alive: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    let url = match recorded.prometheus_setting() {
        PrometheusSetting::Url(u) => u,
        _ => {
            let (ns, selector) = &plan.prometheus_pod;
            let f = shutdown
                .guard(super::portforward::to_prometheus(backend.client(), ns, selector, 9090))
                .await?;
            notes.push(format!("Prometheus: port-forward {} → pod ({selector}) in {ns}", f.url));
            let url = f.url.clone();
            keep_alive.push(Box::new(f));
            url
        }
    };
    let telemetry: Arc<dyn Telemetry> = Arc::new(DcgmTelemetry::new(PromClient::new(&url), &node));
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
}
