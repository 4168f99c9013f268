//! Reading the workload's metrics: the exposition-format parser ([`exposition`]), the
//! direct scrape of each pod ([`scrape`]) and the Prometheus HTTP API path
//! ([`prometheus`]). Both sources turn pods' counters into the same snapshots.

pub mod exposition;
pub mod http;
pub mod prometheus;
pub mod scrape;

use tokio::time::Instant;

use crate::domain::Source;
use crate::error::{BenchError, Result};
use crate::metrics::exposition::HistogramError;
use crate::shutdown::Shutdown;
use crate::stats::Histogram;

/// The latency histogram of the metrics contract.
pub const LATENCY_METRIC: &str = "inference_time_seconds";
/// The error counter of the metrics contract.
pub const ERRORS_METRIC: &str = "inference_errors_total";
/// The workload's description (value 1); its `load_seed` label is the seed of an open
/// loop's arrival times.
pub const INFO_METRIC: &str = "workload_info";

/// The `load_seed` label of a `workload_info` series (None: absent or empty, as for the
/// closed loop or a workload that does not say).
pub fn load_seed(label: Option<&str>) -> Option<u64> {
    label.and_then(|v| v.parse().ok())
}

/// A pod's counters at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSnapshot {
    /// When the values were taken.
    pub at: Instant,
    /// Cumulative latency histogram.
    pub latency: Histogram,
    /// Cumulative errors (all kinds).
    pub errors: f64,
    /// The seed of the pod's open-loop arrivals, as it says (`workload_info`).
    pub load_seed: Option<u64>,
}

/// Builds a snapshot from a pod's exposition text, its latency from the histogram
/// `metric`.
pub fn snapshot_from_text(pod: &str, text: &str, at: Instant, metric: &str) -> Result<PodSnapshot> {
    let exp = exposition::parse(text).map_err(|e| BenchError::MetricsText {
        source_name: pod.to_string(),
        line: e.line,
        reason: e.reason,
    })?;
    let latency = exposition::histogram(&exp, metric, &[]).map_err(|e| BenchError::MetricsContract {
        source_name: pod.to_string(),
        reason: match e {
            HistogramError::Missing => match exp.samples.iter().find(|s| s.name == metric) {
                // A gauge or counter of that name: the wrong kind, not missing.
                Some(_) => format!("{metric} is not a histogram (no {metric}_bucket series, but a plain {metric} sample): give --metric a histogram of latencies in seconds"),
                None if metric == LATENCY_METRIC => {
                    format!("no {metric} histogram (is this a gpushare-workload? --metric names another)")
                }
                None => format!("no {metric} histogram in its metrics"),
            },
            HistogramError::Malformed(r) => format!("{metric}: {r}"),
        },
    })?;
    let errors = exp
        .samples
        .iter()
        .filter(|s| s.name == ERRORS_METRIC)
        .map(|s| s.value)
        .sum();
    let load_seed = exp
        .samples
        .iter()
        .filter(|s| s.name == INFO_METRIC)
        .find_map(|s| load_seed(s.label("load_seed")));
    Ok(PodSnapshot {
        at,
        latency,
        errors,
        load_seed,
    })
}

/// A metrics endpoint to read.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The pod label.
    pub pod: String,
    /// Its metrics URL.
    pub url: String,
}

/// Where snapshots come from.
#[allow(async_fn_in_trait)]
pub trait MetricsSource {
    /// Recorded in every row.
    fn kind(&self) -> Source;
    /// Readies the source for a cell's targets (a Prometheus server: scraping them); a
    /// stop request ends the wait.
    async fn prepare(&self, _targets: &[Target], _shutdown: &Shutdown) -> Result<()> {
        Ok(())
    }
    /// One snapshot per target, taken as close together as possible. The outer error
    /// means the source itself failed (fatal); inner ones concern single pods.
    async fn snapshot(&self, targets: &[Target]) -> Result<Vec<(String, Result<PodSnapshot>)>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reads_the_contract_and_names_missing_parts() {
        let text = "inference_time_seconds_bucket{pod=\"p\",le=\"0.01\"} 3\n\
                    inference_time_seconds_bucket{pod=\"p\",le=\"+Inf\"} 4\n\
                    inference_time_seconds_sum{pod=\"p\"} 0.05\n\
                    inference_time_seconds_count{pod=\"p\"} 4\n\
                    inference_errors_total{kind=\"dropped\",pod=\"p\"} 2\n\
                    inference_errors_total{kind=\"failed\",pod=\"p\"} 1\n";
        let s = snapshot_from_text("p", text, Instant::now(), LATENCY_METRIC).expect("valid");
        assert_eq!(s.latency.count, 4.0);
        assert_eq!(s.errors, 3.0);
        let err = snapshot_from_text("pod-1", "up 1\n", Instant::now(), LATENCY_METRIC)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("pod-1") && err.contains("no inference_time_seconds histogram"),
            "{err}"
        );
        let err = snapshot_from_text("pod-2", "up{ 1\n", Instant::now(), LATENCY_METRIC)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.starts_with("metrics from pod-2, line 1:"), "{err}");
    }
}
