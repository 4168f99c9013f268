//! The Prometheus server path: a client for the HTTP API (`/api/v1/query`,
//! `/api/v1/query_range`, `/api/v1/targets`) with timeouts and retries, a metrics source
//! that reads the raw cumulative series at their scrape times (so a cell from
//! Prometheus is computed exactly like one from a direct scrape), and a private server
//! for `--prometheus spawn`, stopped on every exit path.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::domain::Source;
use crate::error::{BenchError, Result};
use crate::promql::{self, Selector};
use crate::scrape::{HttpClient, MetricsSource, PodSnapshot, Target, http_client, http_get};
use crate::stats::Histogram;

/// One sample of an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorSample {
    /// Labels.
    pub metric: BTreeMap<String, String>,
    /// Evaluation time, seconds since the epoch.
    pub time: f64,
    /// Value (may be NaN).
    pub value: f64,
}

/// One series of a range query.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeSeries {
    /// Labels.
    pub metric: BTreeMap<String, String>,
    /// (time, value) points.
    pub points: Vec<(f64, f64)>,
}

/// A scrape target as Prometheus reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetHealth {
    /// e.g. http://127.0.0.1:9400/metrics.
    pub scrape_url: String,
    /// up, down or unknown.
    pub health: String,
    /// The last scrape error.
    pub last_error: String,
}

/// Percent-encodes a query-string component.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn parse_value(v: &serde_json::Value) -> Option<(f64, f64)> {
    let arr = v.as_array()?;
    let t = arr.first()?.as_f64()?;
    let x = crate::promtext::parse_value(arr.get(1)?.as_str()?)?;
    Some((t, x))
}

fn labels(v: &serde_json::Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Turns an API answer into its `data`, or the server's error message (pure).
pub fn api_data(status: u16, body: &str) -> std::result::Result<serde_json::Value, String> {
    let json: serde_json::Value = serde_json::from_str(body).map_err(|_| {
        let start: String = body.chars().take(120).collect();
        format!("HTTP {status}: not a Prometheus API answer: {start:?}")
    })?;
    if json["status"] == "success" && (200..300).contains(&status) {
        return Ok(json["data"].clone());
    }
    Err(format!(
        "HTTP {status}: {}: {}",
        json["errorType"].as_str().unwrap_or("error"),
        json["error"].as_str().unwrap_or("no message")
    ))
}

/// Parses an instant-vector `data` (pure).
pub fn parse_vector(data: &serde_json::Value) -> std::result::Result<Vec<VectorSample>, String> {
    match data["resultType"].as_str() {
        Some("vector") => {}
        Some("scalar") => {
            let (time, value) = parse_value(&data["result"]).ok_or("malformed scalar")?;
            return Ok(vec![VectorSample {
                metric: BTreeMap::new(),
                time,
                value,
            }]);
        }
        other => return Err(format!("expected an instant vector, got {other:?}")),
    }
    data["result"]
        .as_array()
        .ok_or("no result array")?
        .iter()
        .map(|r| {
            let (time, value) = parse_value(&r["value"]).ok_or("malformed sample")?;
            Ok(VectorSample {
                metric: labels(&r["metric"]),
                time,
                value,
            })
        })
        .collect()
}

/// A Prometheus HTTP API client.
#[derive(Debug, Clone)]
pub struct PromClient {
    base: String,
    http: HttpClient,
    timeout: Duration,
    attempts: u32,
}

impl PromClient {
    /// A client for the server at `base` (e.g. http://prometheus:9090).
    pub fn new(base: &str) -> Self {
        Self {
            base: base.trim_end_matches('/').to_string(),
            http: http_client(),
            timeout: Duration::from_secs(10),
            attempts: 3,
        }
    }

    /// The server's URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn fail(&self, reason: impl Into<String>) -> BenchError {
        BenchError::Prometheus {
            url: self.base.clone(),
            reason: reason.into(),
        }
    }

    /// GET with retries (backoff 0.2 s, 0.6 s) on no answer and 5xx; 4xx is final.
    async fn get_api(&self, path_and_query: &str) -> Result<serde_json::Value> {
        let url = format!("{}{path_and_query}", self.base);
        let mut last = String::new();
        for attempt in 0..self.attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * 3u64.pow(attempt - 1))).await;
            }
            match http_get(&self.http, &url, self.timeout).await {
                Ok((status, body)) if status < 500 => return api_data(status, &body).map_err(|e| self.fail(e)),
                Ok((status, body)) => {
                    last = api_data(status, &body)
                        .err()
                        .unwrap_or_else(|| format!("HTTP {status}"))
                }
                Err(e) => last = format!("cannot reach the server: {e}"),
            }
        }
        Err(self.fail(format!("{last} (after {} attempts)", self.attempts)))
    }

    /// An instant query at `time` (seconds since the epoch) or now.
    pub async fn query(&self, q: &str, time: Option<f64>) -> Result<Vec<VectorSample>> {
        let t = time.map(|t| format!("&time={t:.3}")).unwrap_or_default();
        let data = self.get_api(&format!("/api/v1/query?query={}{t}", encode(q))).await?;
        parse_vector(&data).map_err(|e| self.fail(format!("query {q}: {e}")))
    }

    /// A range query.
    pub async fn query_range(&self, q: &str, start: f64, end: f64, step: f64) -> Result<Vec<RangeSeries>> {
        let data = self
            .get_api(&format!(
                "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step}",
                encode(q)
            ))
            .await?;
        let series = data["result"]
            .as_array()
            .ok_or_else(|| self.fail(format!("query_range {q}: no result array")))?;
        Ok(series
            .iter()
            .map(|s| RangeSeries {
                metric: labels(&s["metric"]),
                points: s["values"]
                    .as_array()
                    .map(|v| v.iter().filter_map(parse_value).collect())
                    .unwrap_or_default(),
            })
            .collect())
    }

    /// The active targets and their health.
    pub async fn targets(&self) -> Result<Vec<TargetHealth>> {
        let data = self.get_api("/api/v1/targets?state=active").await?;
        Ok(data["activeTargets"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|t| TargetHealth {
                        scrape_url: t["scrapeUrl"].as_str().unwrap_or_default().to_string(),
                        health: t["health"].as_str().unwrap_or_default().to_string(),
                        last_error: t["lastError"].as_str().unwrap_or_default().to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// A single value: the one sample of an instant query (a clear error when empty).
    pub async fn value(&self, q: &str) -> Result<f64> {
        let v = self.query(q, None).await?;
        match v.as_slice() {
            [one] => Ok(one.value),
            [] => Err(self.fail(format!(
                "query {q} returned no data (has the server scraped the workload yet?)"
            ))),
            many => Err(self.fail(format!("query {q} returned {} series, expected one", many.len()))),
        }
    }
}

/// `host:port` of a metrics URL: what Prometheus puts in the `instance` label.
pub fn instance_of(url: &str) -> String {
    url.split("://")
        .nth(1)
        .unwrap_or(url)
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Builds per-instance snapshots from the raw series (pure): buckets, sums, counts and
/// errors by `instance`, and each instance's last scrape time.
pub fn snapshots_from_series(
    buckets: &[VectorSample],
    sums: &[VectorSample],
    counts: &[VectorSample],
    times: &[VectorSample],
    errors: &[VectorSample],
    now_epoch: f64,
    now: Instant,
) -> HashMap<String, PodSnapshot> {
    let inst = |s: &VectorSample| s.metric.get("instance").cloned().unwrap_or_default();
    let mut by: HashMap<String, Vec<(f64, f64)>> = HashMap::new();
    for b in buckets {
        if let Some(le) = b.metric.get("le").and_then(|l| crate::promtext::parse_value(l)) {
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
}

impl PrometheusSource {
    /// Uses an existing server (it must scrape the pods).
    pub fn connect(url: &str) -> Self {
        Self {
            client: PromClient::new(url),
            server: None,
            up_timeout: Duration::from_secs(60),
        }
    }

    /// Starts a private server for the run.
    pub async fn spawn(run_dir: &Path) -> Result<Self> {
        let server = PrometheusServer::start(run_dir).await?;
        Ok(Self {
            client: PromClient::new(&server.url),
            server: Some(server),
            up_timeout: Duration::from_secs(60),
        })
    }

    /// The API client.
    pub fn client(&self) -> &PromClient {
        &self.client
    }

    /// Stops a spawned server.
    pub async fn stop(&mut self) {
        if let Some(s) = self.server.as_mut() {
            s.stop().await;
        }
    }
}

impl MetricsSource for PrometheusSource {
    fn kind(&self) -> Source {
        Source::Prometheus
    }

    async fn prepare(&self, targets: &[Target]) -> Result<()> {
        if let Some(s) = &self.server {
            s.set_targets(targets)?;
        }
        // The first scrape of a new target can take ~10 s (file discovery + interval).
        let deadline = Instant::now() + self.up_timeout;
        loop {
            let health = self.client.targets().await?;
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
            tokio::time::sleep(Duration::from_millis(500)).await;
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
        let q = [
            promql::raw("inference_time_seconds_bucket", &sel),
            promql::raw("inference_time_seconds_sum", &sel),
            promql::raw("inference_time_seconds_count", &sel),
            promql::sample_time("inference_time_seconds_count", &sel),
            promql::raw("inference_errors_total", &sel),
        ];
        let (b, s, c, t, e) = tokio::join!(
            self.client.query(&q[0], None),
            self.client.query(&q[1], None),
            self.client.query(&q[2], None),
            self.client.query(&q[3], None),
            self.client.query(&q[4], None),
        );
        let snaps = snapshots_from_series(&b?, &s?, &c?, &t?, &e?, epoch_now(), Instant::now());
        Ok(targets
            .iter()
            .map(|t| {
                let r = snaps
                    .get(&instance_of(&t.url))
                    .cloned()
                    .ok_or_else(|| BenchError::MetricsContract {
                        source_name: format!("{} via {}", t.pod, self.client.base()),
                        reason: "no inference_time_seconds series for this pod".into(),
                    });
                (t.pod.clone(), r)
            })
            .collect())
    }
}

/// The `prometheus` binary, from PATH or Debian's location.
pub fn find_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| Some(PathBuf::from("/usr/bin/prometheus")).filter(|p| p.is_file()))
}

/// The configuration of a private server: every pod scraped each second, targets from
/// a file the harness rewrites per cell (pure).
pub fn server_config(targets_file: &Path) -> String {
    format!(
        "# Written by gpushare-bench for one run.\nglobal:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: gpushare-workload\n    metrics_path: /metrics\n    file_sd_configs:\n      - files: [\"{}\"]\n        refresh_interval: 1s\n",
        targets_file.display()
    )
}

/// A private Prometheus server: storage in the run directory, loopback only.
#[derive(Debug)]
pub struct PrometheusServer {
    child: Option<tokio::process::Child>,
    /// http://127.0.0.1:PORT
    pub url: String,
    targets_file: PathBuf,
}

impl PrometheusServer {
    /// Starts the server and waits until it is ready.
    pub async fn start(run_dir: &Path) -> Result<Self> {
        let bin = find_binary().ok_or_else(|| BenchError::Prometheus {
            url: "spawn".into(),
            reason: "no `prometheus` binary on PATH (`apt-get install prometheus`, or use --prometheus off)".into(),
        })?;
        let dir = run_dir.join("prometheus");
        std::fs::create_dir_all(dir.join("data")).map_err(BenchError::io(format!("creating {}", dir.display())))?;
        let targets_file = dir.join("targets.json");
        crate::store::write_atomic(&targets_file, b"[]\n")?;
        let config = dir.join("prometheus.yml");
        crate::store::write_atomic(&config, server_config(&targets_file).as_bytes())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(BenchError::io("finding a port for Prometheus"))?;
        let url = format!("http://127.0.0.1:{port}");
        let log_path = run_dir.join("logs").join("prometheus.log");
        std::fs::create_dir_all(run_dir.join("logs")).map_err(BenchError::io("creating logs/"))?;
        let log =
            std::fs::File::create(&log_path).map_err(BenchError::io(format!("creating {}", log_path.display())))?;
        let log2 = log.try_clone().map_err(BenchError::io("duplicating a log handle"))?;
        let child = tokio::process::Command::new(&bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--storage.tsdb.retention.time=2d")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| BenchError::Prometheus {
                url: url.clone(),
                reason: format!("cannot start {}: {e}", bin.display()),
            })?;
        let mut server = Self {
            child: Some(child),
            url,
            targets_file,
        };
        let http = http_client();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _)) = http_get(&http, &format!("{}/-/ready", server.url), Duration::from_secs(1)).await {
                return Ok(server);
            }
            let exited = server.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
                let last = tail.lines().last().unwrap_or("").to_string();
                server.stop().await;
                return Err(BenchError::Prometheus {
                    url: server.url.clone(),
                    reason: format!("did not become ready (see {}): {last}", log_path.display()),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Points the server at a cell's pods.
    pub fn set_targets(&self, targets: &[Target]) -> Result<()> {
        let list: Vec<String> = targets.iter().map(|t| instance_of(&t.url)).collect();
        let json = serde_json::json!([{ "targets": list, "labels": {} }]);
        crate::store::write_atomic(&self.targets_file, json.to_string().as_bytes())
    }

    /// Stops the server: SIGTERM, then SIGKILL after 5 s.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                // SAFETY: kill(2) on our own child.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_queries() {
        assert_eq!(
            encode("sum(rate(x{a=\"b\"}[5m]))"),
            "sum%28rate%28x%7Ba%3D%22b%22%7D%5B5m%5D%29%29"
        );
        assert_eq!(instance_of("http://127.0.0.1:9400/metrics"), "127.0.0.1:9400");
    }

    #[test]
    fn api_answers_become_data_or_clear_errors() {
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"pod":"p"},"value":[1700000000.5,"NaN"]},{"metric":{},"value":[1700000000.5,"0.25"]}]}}"#;
        let v = parse_vector(&api_data(200, ok).expect("success")).expect("vector");
        assert_eq!(v.len(), 2);
        assert!(v[0].value.is_nan());
        assert_eq!(v[0].metric.get("pod").map(String::as_str), Some("p"));
        assert_eq!((v[1].time, v[1].value), (1700000000.5, 0.25));
        let bad =
            r#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:5: parse error"}"#;
        assert_eq!(
            api_data(400, bad).err().as_deref(),
            Some("HTTP 400: bad_data: invalid parameter \"query\": 1:5: parse error")
        );
        assert!(
            api_data(502, "<html>bad gateway</html>")
                .err()
                .unwrap_or_default()
                .contains("not a Prometheus API answer")
        );
        let scalar = r#"{"status":"success","data":{"resultType":"scalar","result":[1700000000,"3"]}}"#;
        assert_eq!(
            parse_vector(&api_data(200, scalar).expect("ok")).expect("scalar")[0].value,
            3.0
        );
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(parse_vector(&api_data(200, matrix).expect("ok")).is_err());
    }

    #[test]
    fn snapshots_group_by_instance_and_date_by_scrape_time() {
        let s = |inst: &str, le: Option<&str>, v: f64| VectorSample {
            metric: [("instance".to_string(), inst.to_string())]
                .into_iter()
                .chain(le.map(|l| ("le".to_string(), l.to_string())))
                .collect(),
            time: 100.0,
            value: v,
        };
        let now = Instant::now();
        let snaps = snapshots_from_series(
            &[
                s("a:1", Some("0.1"), 3.0),
                s("a:1", Some("+Inf"), 4.0),
                s("b:2", Some("+Inf"), 9.0),
                s("b:2", Some("0.1"), 1.0),
            ],
            &[s("a:1", None, 0.2), s("b:2", None, 1.5)],
            &[s("a:1", None, 4.0), s("b:2", None, 9.0)],
            &[s("a:1", None, 98.0)],
            &[s("a:1", None, 1.0), s("a:1", None, 2.0)],
            100.0,
            now,
        );
        let a = &snaps["a:1"];
        assert_eq!(a.latency.buckets, vec![(0.1, 3.0), (f64::INFINITY, 4.0)]);
        assert_eq!((a.latency.sum, a.latency.count, a.errors), (0.2, 4.0, 3.0));
        assert_eq!(now - a.at, Duration::from_secs(2), "dated by the scrape, 2 s ago");
        assert_eq!(snaps["b:2"].latency.buckets[0], (0.1, 1.0));
    }

    #[test]
    fn config_scrapes_every_second_from_a_file() {
        let c = server_config(Path::new("/r/prometheus/targets.json"));
        assert!(c.contains("scrape_interval: 1s") && c.contains("files: [\"/r/prometheus/targets.json\"]"));
    }
}
