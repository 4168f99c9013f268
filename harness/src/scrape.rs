//! Reading pods' metrics: the direct scrape of each pod's `/metrics` (the local
//! default), turned into one [`PodSnapshot`] per pod. The Prometheus HTTP API source
//! produces the same snapshots (see `promql.rs`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::domain::Source;
use crate::error::{BenchError, Result};
use crate::promtext;
use crate::stats::Histogram;
use crate::stats::histogram::HistogramError;

/// The latency histogram of the metrics contract.
pub const LATENCY_METRIC: &str = "inference_time_seconds";
/// The error counter of the metrics contract.
pub const ERRORS_METRIC: &str = "inference_errors_total";

/// A pod's counters at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSnapshot {
    /// When the values were taken.
    pub at: Instant,
    /// Cumulative latency histogram.
    pub latency: Histogram,
    /// Cumulative errors (all kinds).
    pub errors: f64,
}

/// Builds a snapshot from a pod's exposition text.
pub fn snapshot_from_text(pod: &str, text: &str, at: Instant) -> Result<PodSnapshot> {
    let exp = promtext::parse(text).map_err(|e| BenchError::MetricsText {
        source_name: pod.to_string(),
        line: e.line,
        reason: e.reason,
    })?;
    let latency = Histogram::from_exposition(&exp, LATENCY_METRIC, &[]).map_err(|e| BenchError::MetricsContract {
        source_name: pod.to_string(),
        reason: match e {
            HistogramError::Missing => format!("no {LATENCY_METRIC} histogram (is this a gpushare-workload?)"),
            HistogramError::Malformed(r) => r,
        },
    })?;
    let errors = exp
        .samples
        .iter()
        .filter(|s| s.name == ERRORS_METRIC)
        .map(|s| s.value)
        .sum();
    Ok(PodSnapshot { at, latency, errors })
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
    /// Readies the source for a cell's targets (a Prometheus server: scraping them).
    async fn prepare(&self, _targets: &[Target]) -> Result<()> {
        Ok(())
    }
    /// One snapshot per target, taken as close together as possible. The outer error
    /// means the source itself failed (fatal); inner ones concern single pods.
    async fn snapshot(&self, targets: &[Target]) -> Result<Vec<(String, Result<PodSnapshot>)>>;
}

/// Direct scrape over HTTP.
#[derive(Debug, Clone)]
pub struct ScrapeSource {
    client: HttpClient,
    timeout: Duration,
}

impl Default for ScrapeSource {
    fn default() -> Self {
        Self::new(Duration::from_secs(3))
    }
}

impl ScrapeSource {
    /// A scraper with a per-request timeout.
    pub fn new(timeout: Duration) -> Self {
        Self {
            client: http_client(),
            timeout,
        }
    }

    /// GETs a URL, returning the body of a 200 answer.
    pub async fn get(&self, url: &str) -> std::result::Result<String, String> {
        match http_get(&self.client, url, self.timeout).await? {
            (200..=299, body) => Ok(body),
            (status, _) => Err(format!("HTTP {status}")),
        }
    }

    /// Scrapes one target.
    pub async fn scrape(&self, t: &Target) -> Result<PodSnapshot> {
        let text = self.get(&t.url).await.map_err(|reason| BenchError::Scrape {
            pod: t.pod.clone(),
            url: t.url.clone(),
            reason,
        })?;
        snapshot_from_text(&t.pod, &text, Instant::now())
    }
}

impl MetricsSource for ScrapeSource {
    fn kind(&self) -> Source {
        Source::Scrape
    }

    async fn snapshot(&self, targets: &[Target]) -> Result<Vec<(String, Result<PodSnapshot>)>> {
        let futs = targets
            .iter()
            .map(|t| async move { (t.pod.clone(), self.scrape(t).await) });
        Ok(futures_util::future::join_all(futs).await)
    }
}

/// A plain HTTP client with connection reuse.
pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// A new HTTP client.
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// GETs a URL within `timeout`: (status, body), or why there was no answer.
pub async fn http_get(client: &HttpClient, url: &str, timeout: Duration) -> std::result::Result<(u16, String), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    let fut = async {
        let resp = client.get(uri).await.map_err(|e| {
            // hyper-util's error hides the cause (connection refused, DNS) one level down.
            let cause = std::error::Error::source(&e)
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            format!("{e}{cause}")
        })?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
            .to_bytes();
        let text = String::from_utf8(body.to_vec()).map_err(|_| "the body is not UTF-8".to_string())?;
        Ok((status, text))
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} s", timeout.as_secs_f64())),
    }
}

/// Whether a pod on this machine answers `/healthz` with 200.
pub async fn healthz(port: u16) -> bool {
    let client = ScrapeSource::new(Duration::from_secs(1));
    client.get(&format!("http://127.0.0.1:{port}/healthz")).await.is_ok()
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
        let s = snapshot_from_text("p", text, Instant::now()).expect("valid");
        assert_eq!(s.latency.count, 4.0);
        assert_eq!(s.errors, 3.0);
        let err = snapshot_from_text("pod-1", "up 1\n", Instant::now())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("pod-1") && err.contains("no inference_time_seconds histogram"),
            "{err}"
        );
        let err = snapshot_from_text("pod-2", "up{ 1\n", Instant::now())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.starts_with("metrics from pod-2, line 1:"), "{err}");
    }
}
