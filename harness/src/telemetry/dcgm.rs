//! GPU telemetry on Kubernetes: the DCGM exporter's series for the node, read through
//! the cluster's Prometheus. Read only.

use crate::metrics::prometheus::PromClient;
use crate::telemetry::{GpuSample, Telemetry};

/// GPU telemetry from the DCGM exporter's series in Prometheus.
pub struct DcgmTelemetry {
    client: PromClient,
    node: String,
    handle: tokio::runtime::Handle,
}

impl DcgmTelemetry {
    /// Reads the series of `node` through `client`, on the current runtime.
    pub fn new(client: PromClient, node: &str) -> Self {
        Self {
            client,
            node: node.to_string(),
            handle: tokio::runtime::Handle::current(),
        }
    }
}

impl Telemetry for DcgmTelemetry {
    fn sample(&self) -> Option<GpuSample> {
        let sel = format!(
            "{{Hostname=\"{}\"}}",
            crate::metrics::prometheus::query::escape_value(&self.node)
        );
        let q = |m: &str, agg: &str| format!("{agg}(DCGM_FI_DEV_{m}{sel})");
        self.handle.block_on(async {
            // DCGM_FI_DEV_GPU_UTIL is not supported on MIG instances (dcgm-exporter
            // maintainers, NVIDIA/dcgm-exporter#216, UPSTREAM-RULES.md E8): there the
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
            let power = self.client.value(&q("POWER_USAGE", "sum")).await.ok()?;
            let energy = self.client.value(&q("TOTAL_ENERGY_CONSUMPTION", "sum")).await.ok();
            Some(GpuSample {
                util_pct: util,
                mem_used_bytes: (mem_mib * 1024.0 * 1024.0) as u64,
                power_w: power,
                energy_mj: energy.map(|e| e as u64),
            })
        })
    }
}
