//! The direct scrape: each pod's `/metrics` over HTTP, turned into one
//! [`PodSnapshot`] per pod (the local default source).

use std::time::Duration;

use tokio::time::Instant;

use crate::domain::Source;
use crate::error::{BenchError, Result};
use crate::metrics::http::{HttpClient, http_client, http_get};
use crate::metrics::{MetricsSource, PodSnapshot, Target, snapshot_from_text};

/// Direct scrape over HTTP.
#[derive(Debug, Clone)]
pub struct ScrapeSource {
    client: HttpClient,
    timeout: Duration,
    metric: String,
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
            metric: crate::metrics::LATENCY_METRIC.to_string(),
        }
    }

    /// This scraper, reading the latency histogram `metric` (`--metric`).
    pub fn reading(mut self, metric: &str) -> Self {
        self.metric = metric.to_string();
        self
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
        snapshot_from_text(&format!("{} at {}", t.pod, t.url), &text, Instant::now(), &self.metric)
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
