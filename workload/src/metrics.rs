//! The metrics contract (docs/metrics-contract.md), the only coupling between workload and harness:
//! `inference_time_seconds` (histogram), `inference_errors_total{kind}`,
//! `workload_info{...} 1`, `workload_gpu_memory_used_bytes`, `workload_ready`, all with
//! constant labels `pod` and `strategy`.

use std::collections::HashMap;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::backend::DeviceInfo;
use crate::config::{Precision, Preset};
use crate::error::{Result, WorkloadError};
use crate::load::LoadPattern;

/// Buckets per doubling: the bounds are those of a Prometheus native histogram of
/// schema 5, 2^(k/32), so a native-histogram user sees the same edges. Neighbouring
/// bounds differ by 2^(1/32) = 1.0219: a quantile interpolated inside its bucket is off
/// by at most 2.2% of its value.
pub const BUCKETS_PER_DOUBLING: i32 = 32;
/// Smallest bucket bound: 2^-17 s = 7.6 µs.
pub const MIN_BUCKET_EXP2: i32 = -17;
/// Largest bucket bound: 2^6 s = 64 s (then +Inf).
pub const MAX_BUCKET_EXP2: i32 = 6;

/// The relative width of every bucket, upper / lower bound − 1 (the quantiles'
/// resolution).
pub fn bucket_resolution() -> f64 {
    2f64.powf(1.0 / BUCKETS_PER_DOUBLING as f64) - 1.0
}

/// Upper bounds 2^(k/32) from 2^-17 s to 2^6 s (737 buckets before +Inf), exact powers
/// of two at every 32nd.
pub fn latency_buckets() -> Vec<f64> {
    let (lo, hi) = (
        MIN_BUCKET_EXP2 * BUCKETS_PER_DOUBLING,
        MAX_BUCKET_EXP2 * BUCKETS_PER_DOUBLING,
    );
    (lo..=hi)
        .map(|k| 2f64.powf(k as f64 / BUCKETS_PER_DOUBLING as f64))
        .collect()
}

/// Who this process is, from the environment: `GPUSHARE_POD` (else `POD_NAME`, the
/// Kubernetes downward API, else the host name) and `GPUSHARE_STRATEGY` (else `none`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The `pod` label.
    pub pod: String,
    /// The `strategy` label.
    pub strategy: String,
}

impl Identity {
    /// Reads the identity from environment variables.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let pod = var("GPUSHARE_POD")
            .or_else(|| var("POD_NAME"))
            .or_else(|| var("HOSTNAME"))
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|s| s.trim().to_string())
            })
            .unwrap_or_else(|| "local".into());
        let strategy = var("GPUSHARE_STRATEGY").unwrap_or_else(|| "none".into());
        Self { pod, strategy }
    }
}

/// The workload's registry and its metrics.
#[derive(Debug, Clone)]
pub struct WorkloadMetrics {
    registry: Registry,
    /// Seconds per inference (open loop: from arrival to completion).
    pub inference_time: Histogram,
    /// Failed or dropped inferences by kind.
    pub errors: IntCounterVec,
    /// Device memory this process allocated.
    pub gpu_memory_used: IntGauge,
    /// 1 once warmed up and serving.
    pub ready: IntGauge,
    /// Open loop: arrivals waiting for the engine.
    pub queue_depth: IntGauge,
    info: IntGaugeVec,
}

fn reg_err(e: prometheus::Error) -> WorkloadError {
    WorkloadError::BadArgument(format!("metrics: {e}"))
}

impl WorkloadMetrics {
    /// Registers every metric with the identity as constant labels.
    pub fn new(id: &Identity) -> Result<Self> {
        let mut labels = HashMap::new();
        labels.insert("pod".to_string(), id.pod.clone());
        labels.insert("strategy".to_string(), id.strategy.clone());
        let registry = Registry::new_custom(None, Some(labels)).map_err(reg_err)?;
        let inference_time = Histogram::with_opts(
            HistogramOpts::new(
                "inference_time_seconds",
                "Seconds per inference (open loop: arrival to completion).",
            )
            .buckets(latency_buckets()),
        )
        .map_err(reg_err)?;
        let errors = IntCounterVec::new(
            Opts::new(
                "inference_errors_total",
                "Inferences that failed or were dropped, by kind.",
            ),
            &["kind"],
        )
        .map_err(reg_err)?;
        let info = IntGaugeVec::new(
            Opts::new(
                "workload_info",
                "The model, precision and device of this workload (value 1).",
            ),
            &[
                "model",
                "precision",
                "device",
                "device_name",
                "sm_count",
                "memory_total_bytes",
                "load",
                "load_seed",
                "device_uuid",
            ],
        )
        .map_err(reg_err)?;
        let gpu_memory_used = IntGauge::new(
            "workload_gpu_memory_used_bytes",
            "Device memory this process allocated (weights, activations, workspace, reserve).",
        )
        .map_err(reg_err)?;
        let ready = IntGauge::new(
            "workload_ready",
            "1 once the model is warm and inferences are being measured.",
        )
        .map_err(reg_err)?;
        let queue_depth = IntGauge::new(
            "workload_queue_depth",
            "Open loop: requests that arrived and wait for the engine.",
        )
        .map_err(reg_err)?;
        for c in [
            Box::new(inference_time.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(errors.clone()),
            Box::new(info.clone()),
            Box::new(gpu_memory_used.clone()),
            Box::new(ready.clone()),
            Box::new(queue_depth.clone()),
        ] {
            registry.register(c).map_err(reg_err)?;
        }
        // The error kinds exist from the start, at 0, so rate() works before the first error.
        for kind in ["dropped", "failed"] {
            errors.with_label_values(&[kind]);
        }
        Ok(Self {
            registry,
            inference_time,
            errors,
            gpu_memory_used,
            ready,
            queue_depth,
            info,
        })
    }

    /// Publishes the `workload_info` series: the model, the device, the load pattern and
    /// its arrivals' seed (empty for the closed loop, which has none).
    pub fn set_info(&self, preset: Preset, precision: Precision, device: &DeviceInfo, load: (&LoadPattern, u64)) {
        let sm = device.sm_count.map(|v| v.to_string()).unwrap_or_default();
        let mem = device.memory_total_bytes.map(|v| v.to_string()).unwrap_or_default();
        let uuid = device.uuid.clone().unwrap_or_default();
        let pattern = load.0.to_string();
        let seed = match load.0 {
            LoadPattern::Closed => String::new(),
            LoadPattern::Poisson { .. } => load.1.to_string(),
        };
        self.info
            .with_label_values(&[
                preset.name(),
                precision.name(),
                device.device.name(),
                &device.name,
                &sm,
                &mem,
                &pattern,
                &seed,
                &uuid,
            ])
            .set(1);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding our own registry into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_native_histogram_schema_5_bounds() {
        let b = latency_buckets();
        assert_eq!(b.first().copied(), Some(2f64.powi(-17)));
        assert_eq!(b.last().copied(), Some(64.0));
        assert_eq!(b.len(), 737);
        assert!(b.contains(&1.0) && b.contains(&0.001953125), "powers of two are exact");
        for w in b.windows(2) {
            let ratio = w[1] / w[0];
            assert!(
                (ratio - 1.0 - bucket_resolution()).abs() < 1e-9,
                "{} → {} ratio {ratio}",
                w[0],
                w[1]
            );
        }
        assert!(bucket_resolution() < 0.025);
    }

    #[test]
    fn exposition_carries_the_contract() {
        let id = Identity {
            pod: "pod-3".into(),
            strategy: "mps".into(),
        };
        let m = WorkloadMetrics::new(&id).expect("registry");
        m.set_info(
            Preset::Tiny,
            Precision::Fp32,
            &DeviceInfo {
                device: crate::config::Device::Cpu,
                name: "Test \"CPU\"".into(),
                sm_count: None,
                memory_total_bytes: None,
                uuid: None,
            },
            (&LoadPattern::Poisson { rate: 50.0 }, 42),
        );
        m.inference_time.observe(0.0123);
        m.ready.set(1);
        let text = m.render();
        // Label order inside braces is not fixed; look for a line with all of them.
        let has = |name: &str, labels: &[&str], value: &str| {
            text.lines().any(|l| {
                l.starts_with(&format!("{name}{{"))
                    && labels.iter().all(|lab| l.contains(lab))
                    && l.ends_with(&format!(" {value}"))
            })
        };
        let id = [r#"pod="pod-3""#, r#"strategy="mps""#];
        assert!(text.contains("# TYPE inference_time_seconds histogram"), "{text}");
        assert!(has("inference_time_seconds_count", &id, "1"), "{text}");
        assert!(
            has(
                "inference_time_seconds_bucket",
                &[id[0], id[1], r#"le="0.012312350352405363""#],
                "1"
            ),
            "{text}"
        );
        assert!(
            has("inference_time_seconds_bucket", &[r#"le="0.012048522073499537""#], "0"),
            "{text}"
        );
        assert!(
            has("inference_errors_total", &[id[0], r#"kind="dropped""#], "0"),
            "{text}"
        );
        assert!(
            has(
                "workload_info",
                &[
                    r#"device_name="Test \"CPU\"""#,
                    r#"model="tiny""#,
                    r#"load="poisson:50""#,
                    r#"load_seed="42""#,
                    r#"device_uuid="""#,
                ],
                "1"
            ),
            "{text}"
        );
        assert!(has("workload_ready", &id, "1"), "{text}");
    }

    #[test]
    fn a_gpus_uuid_is_in_workload_info() {
        let id = Identity {
            pod: "pod-1".into(),
            strategy: "time-slicing".into(),
        };
        let m = WorkloadMetrics::new(&id).expect("registry");
        m.set_info(
            Preset::Tiny,
            Precision::Bf16,
            &DeviceInfo {
                device: crate::config::Device::Cuda,
                name: "NVIDIA H100 80GB HBM3".into(),
                sm_count: Some(132),
                memory_total_bytes: Some(85_045_346_304),
                uuid: Some("5c6f2a1e-0b7d-4c1a-9e3f-0123456789ab".into()),
            },
            (&LoadPattern::Closed, 0),
        );
        let text = m.render();
        assert!(
            text.lines().any(|l| l.starts_with("workload_info{")
                && l.contains(r#"device_uuid="5c6f2a1e-0b7d-4c1a-9e3f-0123456789ab""#)
                && l.contains(r#"sm_count="132""#)),
            "{text}"
        );
    }
}
