//! GPU telemetry on Kubernetes: the DCGM exporter's series for the node, read through
//! the cluster's Prometheus. Read only.
//!
//! On a node with one GPU the node's series are that GPU's. On a node with several, a
//! DRA cell's claims were allocated some of them, and the backend narrows the
//! [`GpuScope`] to those GPUs' UUIDs, which the exporter puts on every series as the
//! `UUID` label (a MIG instance's series carry its parent GPU's UUID).

use std::sync::{Arc, Mutex};

use crate::metrics::prometheus::PromClient;
use crate::metrics::prometheus::query::Selector;
use crate::telemetry::{GpuSample, Telemetry};

/// Which of the node's GPUs the telemetry reads, shared between the backend that knows
/// a cell's devices and the telemetry that reads them.
#[derive(Debug, Clone, Default)]
pub struct GpuScope(Arc<Mutex<Option<Vec<String>>>>);

impl GpuScope {
    /// Every GPU of the node (the default: a node with one GPU).
    pub fn node() -> Self {
        Self::default()
    }

    /// Narrows the reading to the GPUs with these UUIDs (none: nothing is read, rather
    /// than another GPU's numbers), or widens it back to the node (`None`).
    pub fn set(&self, uuids: Option<Vec<String>>) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = uuids;
    }

    /// The UUIDs read (None: the whole node).
    pub fn get(&self) -> Option<Vec<String>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// The series selector of `node`'s GPUs in `scope` (pure): `{Hostname="gpu-1"}`, or with
/// `UUID=~"GPU-a|GPU-b"` (dcgm-exporter's label names); None for an empty scope.
pub fn selector(node: &str, scope: Option<&[String]>) -> Option<Selector> {
    let equal = vec![("Hostname".to_string(), node.to_string())];
    match scope {
        None => Some(Selector { equal, one_of: None }),
        Some([]) => None,
        Some(uuids) => Some(Selector {
            equal,
            one_of: Some(("UUID".into(), uuids.to_vec())),
        }),
    }
}

/// GPU telemetry from the DCGM exporter's series in Prometheus.
pub struct DcgmTelemetry {
    client: PromClient,
    node: String,
    scope: GpuScope,
    handle: tokio::runtime::Handle,
}

impl DcgmTelemetry {
    /// Reads the series of `node`'s GPUs in `scope` through `client`, on the current
    /// runtime.
    pub fn new(client: PromClient, node: &str, scope: GpuScope) -> Self {
        Self {
            client,
            node: node.to_string(),
            scope,
            handle: tokio::runtime::Handle::current(),
        }
    }
}

impl Telemetry for DcgmTelemetry {
    fn sample(&self) -> Option<GpuSample> {
        let sel = selector(&self.node, self.scope.get().as_deref())?.render();
        // Utilisation is the mean over the GPUs read; memory, power and energy their sum.
        // Power and energy are the whole GPU's, which every MIG instance's series repeats
        // (E9): counted once per GPU UUID.
        let q = |m: &str, agg: &str| format!("{agg}(DCGM_FI_DEV_{m}{sel})");
        let per_gpu = |m: &str| format!("sum(max by (UUID) (DCGM_FI_DEV_{m}{sel}))");
        self.handle.block_on(async {
            // DCGM_FI_DEV_GPU_UTIL is not supported on MIG instances (dcgm-exporter
            // maintainers, NVIDIA/dcgm-exporter#216, k8s-sim/UPSTREAM-RULES.md E8): there the
            // graphics-engine activity (a 0–1 ratio, in the operator's default
            // collectors) stands in for it.
            let util = match self.client.value(&q("GPU_UTIL", "avg")).await {
                Ok(u) => u,
                Err(_) => self
                    .client
                    .value(&format!("avg(DCGM_FI_PROF_GR_ENGINE_ACTIVE{sel}) * 100"))
                    .await
                    .ok()?,
            };
            let mem_mib = self.client.value(&q("FB_USED", "sum")).await.ok()?;
            let power = self.client.value(&per_gpu("POWER_USAGE")).await.ok()?;
            let energy = self.client.value(&per_gpu("TOTAL_ENERGY_CONSUMPTION")).await.ok();
            // Clocks and temperature are in the operator's default collectors (E8); the
            // clock event reasons are not, and are read where a user's collectors add
            // them (under DCGM's name since 3.3, or the older one).
            let gauge = |m: &str, agg: &str| format!("{agg}(max by (UUID) (DCGM_FI_DEV_{m}{sel}))");
            let sm_clock = self.client.value(&gauge("SM_CLOCK", "avg")).await.ok();
            let mem_clock = self.client.value(&gauge("MEM_CLOCK", "avg")).await.ok();
            let temp = self.client.value(&gauge("GPU_TEMP", "max")).await.ok();
            let reasons = self
                .client
                .query(
                    &format!(
                        "max by (UUID) (DCGM_FI_DEV_CLOCKS_EVENT_REASONS{sel}) or max by (UUID) (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{sel})"
                    ),
                    None,
                )
                .await
                .ok()
                .and_then(|v| union_of_masks(v.iter().map(|s| s.value)));
            Some(GpuSample {
                at_s: 0.0,
                util_pct: util,
                mem_used_bytes: (mem_mib * 1024.0 * 1024.0) as u64,
                power_w: power,
                energy_mj: energy.map(|e| e as u64),
                clock_reasons: reasons,
                sm_clock_mhz: sm_clock.filter(|v| v.is_finite()),
                mem_clock_mhz: mem_clock.filter(|v| v.is_finite()),
                temp_c: temp.filter(|v| v.is_finite()),
            })
        })
    }
}

/// The reasons any of the GPUs' masks holds (pure): None when there is no mask (the
/// series is not collected) or one is not a whole number.
pub fn union_of_masks(values: impl IntoIterator<Item = f64>) -> Option<u64> {
    let mut any = None;
    for v in values {
        if !(v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < u64::MAX as f64) {
            return None;
        }
        any = Some(any.unwrap_or(0) | v as u64);
    }
    any
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gpus_clock_event_masks_are_joined() {
        assert_eq!(super::union_of_masks([4.0, 64.0]), Some(0x44));
        assert_eq!(super::union_of_masks([0.0]), Some(0));
        assert_eq!(super::union_of_masks([]), None, "not collected: not read");
        assert_eq!(super::union_of_masks([4.5]), None);
        assert_eq!(super::union_of_masks([f64::NAN]), None);
    }

    use super::*;

    #[test]
    fn the_selector_is_the_node_or_the_cells_gpus_by_uuid() {
        let render = |s: Option<&[String]>| selector("gpu-1", s).map(|s| s.render());
        assert_eq!(render(None).as_deref(), Some("{Hostname=\"gpu-1\"}"));
        let two = ["GPU-a1".to_string(), "GPU-b2".to_string()];
        assert_eq!(
            render(Some(&two)).as_deref(),
            Some("{Hostname=\"gpu-1\",UUID=~\"GPU-a1|GPU-b2\"}")
        );
        assert_eq!(render(Some(&[])), None, "no GPU known: no reading, not the node's");
        let scope = GpuScope::node();
        scope.set(Some(two.to_vec()));
        assert_eq!(scope.clone().get(), Some(two.to_vec()), "clones share the scope");
        scope.set(None);
        assert_eq!(scope.get(), None);
    }
}
