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
use crate::shutdown::{EndsOn, Shutdown};
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
    /// `workload_queue_depth`.
    pub backlog: &'a [VectorSample],
}

/// The name the snapshot query gives the count's scrape times.
const SCRAPED: &str = "gpushare_bench_scraped_at";

/// Splits one query's samples by metric name into `names`' order (pure); samples of
/// other names are dropped.
pub fn split_by_name<const N: usize>(samples: Vec<VectorSample>, names: &[String; N]) -> [Vec<VectorSample>; N] {
    let mut out: [Vec<VectorSample>; N] = std::array::from_fn(|_| Vec::new());
    for s in samples {
        let name = s.metric.get("__name__").map(String::as_str).unwrap_or_default();
        if let Some(k) = names.iter().position(|n| n == name) {
            out[k].push(s);
        }
    }
    out
}

/// Builds per-instance snapshots from the raw series (pure): buckets, sums, counts,
/// errors and the load seed by `instance`, each dated by its last scrape (an instance with
/// buckets but no scrape time is an error, not dated by the query).
pub fn snapshots_from_series(
    series: Series<'_>,
    now_epoch: f64,
    now: Instant,
) -> HashMap<String, std::result::Result<PodSnapshot, String>> {
    let Series {
        buckets,
        sums,
        counts,
        times,
        errors,
        info,
        backlog,
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
        // A snapshot is dated by its scrape; without that time it would be dated by the
        // query, and the rates over it would be wrong by up to a scrape interval.
        let Some(sampled) = times.iter().find(|s| inst(s) == instance).map(|s| s.value) else {
            out.insert(instance, Err("buckets but no scrape time for them".to_string()));
            continue;
        };
        let age = Duration::from_secs_f64((now_epoch - sampled).max(0.0));
        out.insert(
            instance.clone(),
            Ok(PodSnapshot {
                at: now.checked_sub(age).unwrap_or(now),
                latency: Histogram {
                    buckets: bk,
                    sum: find(sums),
                    count: find(counts),
                },
                errors: find(errors),
                backlog: backlog
                    .iter()
                    .filter(|s| inst(s) == instance)
                    .map(|s| s.value)
                    .reduce(|a, b| a + b)
                    .filter(|v| v.is_finite() && *v >= 0.0),
                load_seed: info
                    .iter()
                    .filter(|s| inst(s) == instance)
                    .find_map(|s| crate::metrics::load_seed(s.metric.get("load_seed").map(String::as_str))),
                device_uuid: info
                    .iter()
                    .filter(|s| inst(s) == instance)
                    .find_map(|s| crate::metrics::device_uuid(s.metric.get("device_uuid").map(String::as_str))),
                last_error: None,
                streamed: None,
                tokens: None,
                server: None,
            }),
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

    /// This source, waiting up to `timeout` for the server to scrape a cell's pods
    /// (`--ready-timeout`; 60 s unless given).
    pub fn waiting_up_to(mut self, timeout: Duration) -> Self {
        self.up_timeout = timeout;
        self
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
        let mut wait = shutdown.poll(EndsOn::Request, Duration::from_millis(500), self.up_timeout);
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
            if !wait.keep_waiting().await? {
                return Err(self.client.fail(format!(
                    "does not scrape {} after {} s; with an existing server, add the pods to its scrape configuration (fixed ports: --base-port), or use --prometheus spawn",
                    missing.join(", "),
                    self.up_timeout.as_secs()
                )));
            }
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
        let names = [
            format!("{m}_bucket"),
            format!("{m}_sum"),
            format!("{m}_count"),
            SCRAPED.to_string(),
            "inference_errors_total".to_string(),
            crate::metrics::INFO_METRIC.to_string(),
            crate::metrics::BACKLOG_METRIC.to_string(),
        ];
        let raw: Vec<&str> = [0, 1, 2, 4, 5, 6].iter().map(|&i| names[i].as_str()).collect();
        // Every series in one query, so that they all come from one scrape of each pod.
        let q = promql::raw_with_time(&raw, &names[2], SCRAPED, &sel);
        let at = epoch_now();
        let all = self.client.query(&q, Some(at)).await?;
        let [b, s, c, t, e, i, q] = split_by_name(all, &names);
        let series = Series {
            buckets: &b,
            sums: &s,
            counts: &c,
            times: &t,
            errors: &e,
            info: &i,
            backlog: &q,
        };
        let snaps = snapshots_from_series(series, at, Instant::now());
        Ok(targets
            .iter()
            .map(|t| {
                let fail = |reason: String| BenchError::MetricsContract {
                    source_name: format!("{} via {}", t.pod, self.client.base()),
                    reason,
                };
                let r = match snaps.get(&instance_of(&t.url)) {
                    Some(Ok(snap)) => Ok(snap.clone()),
                    Some(Err(reason)) => Err(fail(format!("{m}: {reason}"))),
                    None => Err(fail(format!(
                        "no {m}_bucket series for this pod (is {m} a histogram it exports?)"
                    ))),
                };
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
    async fn a_snapshot_is_one_query_at_one_evaluation_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        // (query, evaluation time) of each request
        type Asked = Vec<(Option<String>, Option<String>)>;
        let asked: Arc<Mutex<Asked>> = Arc::default();
        let seen = asked.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let pairs: Vec<(String, String)> =
                            form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                                .collect();
                        let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
                        seen.lock().expect("lock").push((get("query"), get("time")));
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
        let asked = asked.lock().expect("lock").clone();
        // Separate queries, even at one evaluation time, can straddle a scrape being
        // ingested; one query sees each scrape whole or not at all.
        assert_eq!(asked.len(), 1, "one query for every series: {asked:?}");
        let (query, time) = &asked[0];
        assert!(time.is_some(), "an evaluation time is given");
        let query = query.as_deref().unwrap_or_default();
        for part in [
            "inference_time_seconds_bucket|inference_time_seconds_sum|inference_time_seconds_count|inference_errors_total|workload_info|workload_queue_depth",
            "instance=~\"127\\\\.0\\\\.0\\\\.1:9\"",
            "or on(__name__) label_replace(timestamp(inference_time_seconds_count{",
        ] {
            assert!(query.contains(part), "{part} in {query}");
        }
    }
}
