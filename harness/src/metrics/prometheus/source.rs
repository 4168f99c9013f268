//! Metrics through a Prometheus server: the raw cumulative series read at their scrape
//! times, so a cell from Prometheus is computed exactly like one from a direct scrape.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::domain::Source;
use crate::error::{BenchError, Result};
use crate::metrics::exposition;
use crate::metrics::prometheus::client::{PromClient, VectorSample};
use crate::metrics::prometheus::query::{self as promql, Selector, instance_of};
use crate::metrics::prometheus::server::PrometheusServer;
use crate::metrics::{MetricsSource, PodSnapshot, Target};
use crate::shutdown::Shutdown;
use crate::stats::Histogram;

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The raw series of one snapshot query, each by `instance`.
#[derive(Debug, Clone, Copy)]
pub struct Series<'a> {
    /// `<metric>_bucket` (`inference_time_seconds` unless `--metric` says).
    pub buckets: &'a [VectorSample],
    /// `<metric>_sum`.
    pub sums: &'a [VectorSample],
    /// `<metric>_count`.
    pub counts: &'a [VectorSample],
    /// When each count was last scraped.
    pub times: &'a [VectorSample],
    /// `inference_errors_total`.
    pub errors: &'a [VectorSample],
    /// `workload_info`.
    pub info: &'a [VectorSample],
}

/// Builds per-instance snapshots from the raw series (pure): buckets, sums, counts,
/// errors and the load seed by `instance`, and each instance's last scrape time.
pub fn snapshots_from_series(series: Series<'_>, now_epoch: f64, now: Instant) -> HashMap<String, PodSnapshot> {
    let Series {
        buckets,
        sums,
        counts,
        times,
        errors,
        info,
    } = series;
    let inst = |s: &VectorSample| s.metric.get("instance").cloned().unwrap_or_default();
    let mut by: HashMap<String, Vec<(f64, f64)>> = HashMap::new();
    for b in buckets {
        if let Some(le) = b.metric.get("le").and_then(|l| exposition::parse_value(l)) {
            by.entry(inst(b)).or_default().push((le, b.value));
        }
    }
    let mut out = HashMap::new();
    for (instance, mut bk) in by {
        bk.sort_by(|a, b| a.0.total_cmp(&b.0));
        let find = |v: &[VectorSample]| v.iter().filter(|s| inst(s) == instance).map(|s| s.value).sum::<f64>();
        let sampled = times
            .iter()
            .find(|s| inst(s) == instance)
            .map_or(now_epoch, |s| s.value);
        let age = Duration::from_secs_f64((now_epoch - sampled).max(0.0));
        out.insert(
            instance.clone(),
            PodSnapshot {
                at: now.checked_sub(age).unwrap_or(now),
                latency: Histogram {
                    buckets: bk,
                    sum: find(sums),
                    count: find(counts),
                },
                errors: find(errors),
                load_seed: info
                    .iter()
                    .filter(|s| inst(s) == instance)
                    .find_map(|s| crate::metrics::load_seed(s.metric.get("load_seed").map(String::as_str))),
            },
        );
    }
    out
}

/// Metrics through a Prometheus server.
#[derive(Debug)]
pub struct PrometheusSource {
    client: PromClient,
    server: Option<PrometheusServer>,
    up_timeout: Duration,
    metric: String,
}

impl PrometheusSource {
    /// Uses an existing server (it must scrape the pods).
    pub fn connect(url: &str) -> Self {
        Self {
            client: PromClient::new(url),
            server: None,
            up_timeout: Duration::from_secs(60),
            metric: crate::metrics::LATENCY_METRIC.to_string(),
        }
    }

    /// Starts a private server for the run.
    pub async fn spawn(run_dir: &Path, shutdown: &Shutdown) -> Result<Self> {
        let server = PrometheusServer::start(run_dir, shutdown).await?;
        Ok(Self {
            client: PromClient::new(&server.url),
            server: Some(server),
            up_timeout: Duration::from_secs(60),
            metric: crate::metrics::LATENCY_METRIC.to_string(),
        })
    }

    /// This source, reading the latency histogram `metric` (`--metric`).
    pub fn reading(mut self, metric: &str) -> Self {
        self.metric = metric.to_string();
        self
    }

    /// The API client.
    pub fn client(&self) -> &PromClient {
        &self.client
    }

    /// Stops a spawned server.
    pub async fn stop(&mut self, shutdown: &Shutdown) {
        if let Some(s) = self.server.as_mut() {
            s.stop(shutdown).await;
        }
    }
}

impl MetricsSource for PrometheusSource {
    fn kind(&self) -> Source {
        Source::Prometheus
    }

    async fn prepare(&self, targets: &[Target], shutdown: &Shutdown) -> Result<()> {
        if let Some(s) = &self.server {
            s.set_targets(targets)?;
        }
        // The first scrape of a new target can take ~10 s (file discovery + interval).
        let deadline = Instant::now() + self.up_timeout;
        loop {
            let health = shutdown.guard(self.client.targets()).await?;
            let missing: Vec<String> = targets
                .iter()
                .filter(|t| !health.iter().any(|h| h.scrape_url == t.url && h.health == "up"))
                .map(|t| {
                    let why = health
                        .iter()
                        .find(|h| h.scrape_url == t.url)
                        .map_or("not a target of this server".to_string(), |h| {
                            format!("{} {}", h.health, h.last_error).trim().to_string()
                        });
                    format!("{} ({why})", t.url)
                })
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.client.fail(format!(
                    "does not scrape {} after {} s; with an existing server, add the pods to its scrape configuration (fixed ports: --base-port), or use --prometheus spawn",
                    missing.join(", "),
                    self.up_timeout.as_secs()
                )));
            }
            shutdown.sleep(Duration::from_millis(500)).await?;
        }
    }

    async fn snapshot(&self, targets: &[Target]) -> Result<Vec<(String, Result<PodSnapshot>)>> {
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let sel = Selector {
            equal: Vec::new(),
            one_of: Some(("instance".into(), targets.iter().map(|t| instance_of(&t.url)).collect())),
        };
        let m = &self.metric;
        let q = [
            promql::raw(&format!("{m}_bucket"), &sel),
            promql::raw(&format!("{m}_sum"), &sel),
            promql::raw(&format!("{m}_count"), &sel),
            promql::sample_time(&format!("{m}_count"), &sel),
            promql::raw("inference_errors_total", &sel),
            promql::raw(crate::metrics::INFO_METRIC, &sel),
        ];
        // One evaluation time for every series: queried concurrently without it, the
        // buckets, sum and count could come from two different scrapes.
        let at = epoch_now();
        let (b, s, c, t, e, i) = tokio::join!(
            self.client.query(&q[0], Some(at)),
            self.client.query(&q[1], Some(at)),
            self.client.query(&q[2], Some(at)),
            self.client.query(&q[3], Some(at)),
            self.client.query(&q[4], Some(at)),
            self.client.query(&q[5], Some(at)),
        );
        let (b, s, c, t, e, i) = (b?, s?, c?, t?, e?, i?);
        let series = Series {
            buckets: &b,
            sums: &s,
            counts: &c,
            times: &t,
            errors: &e,
            info: &i,
        };
        let snaps = snapshots_from_series(series, at, Instant::now());
        Ok(targets
            .iter()
            .map(|t| {
                let r = snaps
                    .get(&instance_of(&t.url))
                    .cloned()
                    .ok_or_else(|| BenchError::MetricsContract {
                        source_name: format!("{} via {}", t.pod, self.client.base()),
                        reason: format!("no {m}_bucket series for this pod (is {m} a histogram it exports?)"),
                    });
                (t.pod.clone(), r)
            })
            .collect())
    }
}

#[cfg(test)]
mod evaluation_time_tests {
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    use super::*;

    #[tokio::test]
    async fn every_series_of_a_snapshot_is_read_at_one_evaluation_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let times: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let seen = times.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let time = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                            .find(|(k, _)| k == "time")
                            .map(|(_, v)| v.into_owned());
                        seen.lock().expect("lock").push(time);
                        async {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                                br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
                            ))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        let source = PrometheusSource::connect(&url);
        let targets = [Target {
            pod: "pod-0".into(),
            url: "http://127.0.0.1:9/metrics".into(),
        }];
        let snaps = source.snapshot(&targets).await.expect("the source answers");
        assert!(snaps[0].1.is_err(), "no series for the pod is a per-pod error");
        let times = times.lock().expect("lock").clone();
        assert_eq!(
            times.len(),
            6,
            "buckets, sum, count, sample time, errors, workload_info"
        );
        assert!(times[0].is_some() && times.iter().all(|t| *t == times[0]), "{times:?}");
    }
}
