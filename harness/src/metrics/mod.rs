//! Reading the workload's metrics: the exposition-format parser ([`exposition`]), the
//! direct scrape of each pod ([`scrape`]) and the Prometheus HTTP API path
//! ([`prometheus`]). Both sources turn pods' counters into the same snapshots.

pub mod exposition;
pub mod http;
pub mod prometheus;
pub mod requests;
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
/// The requests a pod has accepted and not yet answered (gpushare-workload's open loop:
/// its queue), read to judge whether it keeps up with an open load.
pub const BACKLOG_METRIC: &str = "workload_queue_depth";
/// The workload's description (value 1); its `load_seed` label is the seed of an open
/// loop's arrival times.
pub const INFO_METRIC: &str = "workload_info";

/// The `load_seed` label of a `workload_info` series (None: absent or empty, as for the
/// closed loop or a workload that does not say).
pub fn load_seed(label: Option<&str>) -> Option<u64> {
    label.and_then(|v| v.parse().ok())
}

/// The `device_uuid` label of a `workload_info` series: the UUID of the GPU the pod
/// runs on, as CUDA reports it (None: absent or empty, as on the CPU or for a workload
/// that does not say).
pub fn device_uuid(label: Option<&str>) -> Option<String> {
    label.map(str::trim).filter(|v| !v.is_empty()).map(str::to_string)
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
    /// Requests accepted and not yet answered, where the pod says
    /// ([`BACKLOG_METRIC`]) or the harness sends the requests itself.
    pub backlog: Option<f64>,
    /// The seed of the pod's open-loop arrivals, as it says (`workload_info`).
    pub load_seed: Option<u64>,
    /// The UUID of the GPU it runs on, as it says (`workload_info{device_uuid}`).
    pub device_uuid: Option<String>,
    /// Why the last failed request failed, where the harness sent the requests
    /// (`--request`): "HTTP 500 Internal Server Error", "timed out", a connection error.
    pub last_error: Option<String>,
    /// Streamed answers (`--stream`): the requests that have ended so far (the records
    /// [`MetricsSource::streamed`] gives between two snapshots).
    pub streamed: Option<usize>,
    /// Streamed answers: the token histograms so far.
    pub tokens: Option<requests::TokenHistograms>,
    /// Streamed answers with `--server-ttft-metric` or `--server-itl-metric`: the
    /// server's own histograms so far.
    pub server: Option<ServerHistograms>,
}

/// A streaming server's own histograms, cumulative, as its `/metrics` exposes them
/// (vLLM's `vllm:time_to_first_token_seconds` and `vllm:inter_token_latency_seconds`):
/// the server's view of what the client times, beside the client's.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServerHistograms {
    /// Time to first token.
    pub ttft: Option<Histogram>,
    /// Inter-token latency.
    pub itl: Option<Histogram>,
    /// Why one that was asked for is missing, in words.
    pub problem: Option<String>,
}

impl ServerHistograms {
    /// Reads the histograms `ttft` and `itl` (where named) from a server's exposition text
    /// (pure); one that cannot be read is left out with its reason.
    pub fn from_text(text: &str, ttft: Option<&str>, itl: Option<&str>) -> Self {
        let mut out = Self::default();
        let mut problems = Vec::new();
        let exp = match exposition::parse(text) {
            Ok(exp) => exp,
            Err(e) => {
                out.problem = Some(format!("its /metrics does not parse: line {}: {}", e.line, e.reason));
                return out;
            }
        };
        let mut read = |name: Option<&str>| {
            let name = name?;
            match latency(&exp, name) {
                Ok(h) => Some(h),
                Err(e) => {
                    problems.push(e.reason().to_string());
                    None
                }
            }
        };
        out.ttft = read(ttft);
        out.itl = read(itl);
        if !problems.is_empty() {
            out.problem = Some(problems.join("; "));
        }
        out
    }

    /// The observations between `earlier` and this (None where either lacks one, or the
    /// counters went back).
    pub fn delta(&self, earlier: &ServerHistograms) -> ServerHistograms {
        let d = |a: &Option<Histogram>, b: &Option<Histogram>| a.as_ref()?.delta(b.as_ref()?);
        ServerHistograms {
            ttft: d(&self.ttft, &earlier.ttft),
            itl: d(&self.itl, &earlier.itl),
            problem: self.problem.clone().or_else(|| earlier.problem.clone()),
        }
    }
}

/// Why a pod's metrics give no latency histogram, in words.
#[derive(Debug, Clone, PartialEq)]
pub enum NoLatency {
    /// There is none (yet: a server may register it late).
    Missing(String),
    /// There is something that will not mend itself: text that does not parse, a
    /// metric of that name of another kind, a malformed histogram.
    Unusable(String),
}

impl NoLatency {
    /// The words.
    pub fn reason(&self) -> &str {
        match self {
            NoLatency::Missing(r) | NoLatency::Unusable(r) => r,
        }
    }
}

/// The latency histogram `metric` of parsed metrics (pure).
fn latency(exp: &exposition::Exposition, metric: &str) -> std::result::Result<Histogram, NoLatency> {
    exposition::histogram(exp, metric, &[]).map_err(|e| match e {
        HistogramError::Missing => match exp.samples.iter().find(|s| s.name == metric) {
            // A gauge or counter of that name: the wrong kind, not missing.
            Some(_) => NoLatency::Unusable(format!("{metric} is not a histogram (no {metric}_bucket series, but a plain {metric} sample): give --metric a histogram of latencies in seconds")),
            None if metric == LATENCY_METRIC => NoLatency::Missing(format!(
                "no {metric} histogram (is this a gpushare-workload? --metric names another)"
            )),
            None => NoLatency::Missing(format!("no {metric} histogram in its metrics")),
        },
        HistogramError::Malformed(r) => NoLatency::Unusable(format!("{metric}: {r}")),
    })
}

/// The latency histogram `metric` of a pod's exposition text (pure): what readiness by
/// the first observation reads.
pub fn latency_from_text(text: &str, metric: &str) -> std::result::Result<Histogram, NoLatency> {
    let exp = exposition::parse(text).map_err(|e| NoLatency::Unusable(format!("line {}: {}", e.line, e.reason)))?;
    latency(&exp, metric)
}

/// Builds a snapshot from a pod's exposition text, its latency from the histogram
/// `metric`.
pub fn snapshot_from_text(pod: &str, text: &str, at: Instant, metric: &str) -> Result<PodSnapshot> {
    let exp = exposition::parse(text).map_err(|e| BenchError::MetricsText {
        source_name: pod.to_string(),
        line: e.line,
        reason: e.reason,
    })?;
    let latency = latency(&exp, metric).map_err(|e| BenchError::MetricsContract {
        source_name: pod.to_string(),
        reason: e.reason().to_string(),
    })?;
    let errors = exp
        .samples
        .iter()
        .filter(|s| s.name == ERRORS_METRIC)
        .map(|s| s.value)
        .sum();
    let info = || exp.samples.iter().filter(|s| s.name == INFO_METRIC);
    let backlog = exp
        .samples
        .iter()
        .filter(|s| s.name == BACKLOG_METRIC)
        .map(|s| s.value)
        .reduce(|a, b| a + b)
        .filter(|v| v.is_finite() && *v >= 0.0);
    Ok(PodSnapshot {
        at,
        latency,
        errors,
        backlog,
        load_seed: info().find_map(|s| load_seed(s.label("load_seed"))),
        device_uuid: info().find_map(|s| device_uuid(s.label("device_uuid"))),
        last_error: None,
        streamed: None,
        tokens: None,
        server: None,
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
    /// The cell is over, on every path out of it: what `prepare` started for it stops
    /// (the harness's request generators) before its pods go.
    fn release(&self) {}
    /// The streamed requests of `pod` that ended from its snapshot's `streamed` count
    /// `from` to `to`, where the harness sends them (`--stream`); none otherwise.
    fn streamed(&self, _pod: &str, _from: usize, _to: usize) -> Vec<requests::TokenRecord> {
        Vec::new()
    }
}

/// Calls [`MetricsSource::release`] when dropped.
pub struct Release<'a, S: MetricsSource>(pub &'a S);

impl<S: MetricsSource> Drop for Release<'_, S> {
    fn drop(&mut self) {
        self.0.release();
    }
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
                    inference_errors_total{kind=\"failed\",pod=\"p\"} 1\n\
                    workload_queue_depth{pod=\"p\"} 7\n";
        let s = snapshot_from_text("p", text, Instant::now(), LATENCY_METRIC).expect("valid");
        assert_eq!(s.latency.count, 4.0);
        assert_eq!(s.errors, 3.0);
        assert_eq!(s.backlog, Some(7.0));
        let none = snapshot_from_text(
            "p",
            &text.replace("workload_queue_depth", "other"),
            Instant::now(),
            LATENCY_METRIC,
        );
        assert_eq!(
            none.map(|s| s.backlog).ok(),
            Some(None),
            "a pod that does not say has no backlog"
        );
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

    #[test]
    fn a_missing_histogram_may_come_later_and_a_wrong_one_will_not() {
        let ok = "h_bucket{le=\"0.01\"} 2\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.01\nh_count 2\n";
        assert_eq!(latency_from_text(ok, "h").map(|h| h.count), Ok(2.0));
        assert!(matches!(latency_from_text("up 1\n", "h"), Err(NoLatency::Missing(_))));
        assert!(
            matches!(latency_from_text("h 0.004\n", "h"), Err(NoLatency::Unusable(r)) if r.starts_with("h is not a histogram"))
        );
        assert!(matches!(latency_from_text("h{ 1\n", "h"), Err(NoLatency::Unusable(r)) if r.starts_with("line 1:")));
    }
}
