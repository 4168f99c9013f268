//! A client for the Prometheus HTTP API (`/api/v1/query`, `/api/v1/query_range`,
//! `/api/v1/targets`): typed answers (serde structs of the API's JSON), timeouts, and a
//! few retries with backoff on no answer and 5xx.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{BenchError, Result};
use crate::metrics::exposition;
use crate::metrics::http::{HttpClient, http_client, http_get};

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
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TargetHealth {
    /// e.g. http://127.0.0.1:9400/metrics.
    #[serde(rename = "scrapeUrl", default)]
    pub scrape_url: String,
    /// up, down or unknown.
    #[serde(default)]
    pub health: String,
    /// The last scrape error.
    #[serde(rename = "lastError", default)]
    pub last_error: String,
}

/// The envelope of every API answer (`prometheus/web/api/v1/api.go`, `Response`).
#[derive(Debug, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
enum Envelope<T> {
    Success {
        data: T,
    },
    Error {
        #[serde(rename = "errorType", default)]
        error_type: String,
        #[serde(default)]
        error: String,
    },
}

/// A sample as the API writes it: `[unix seconds, "value"]`.
#[derive(Debug, Clone, Deserialize)]
struct WireValue(f64, String);

impl WireValue {
    fn point(&self) -> std::result::Result<(f64, f64), String> {
        exposition::parse_value(&self.1)
            .map(|v| (self.0, v))
            .ok_or_else(|| format!("sample value {:?} is not a number", self.1))
    }
}

#[derive(Debug, Deserialize)]
struct WireInstant {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: WireValue,
}

#[derive(Debug, Deserialize)]
struct WireRange {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<WireValue>,
}

/// `data` of a query answer, by `resultType`.
#[derive(Debug, Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum QueryData {
    Vector(Vec<WireInstant>),
    Scalar(WireValue),
    Matrix(Vec<WireRange>),
    String(serde::de::IgnoredAny),
}

impl QueryData {
    fn kind(&self) -> &'static str {
        match self {
            QueryData::Vector(_) => "vector",
            QueryData::Scalar(_) => "scalar",
            QueryData::Matrix(_) => "matrix",
            QueryData::String(_) => "string",
        }
    }
}

#[derive(Debug, Deserialize)]
struct TargetsData {
    #[serde(rename = "activeTargets", default)]
    active_targets: Vec<TargetHealth>,
}

/// Turns an API answer into its typed `data`, or the server's error in words (pure).
fn parse_answer<T: serde::de::DeserializeOwned>(status: u16, body: &str) -> std::result::Result<T, String> {
    let envelope: Envelope<T> = serde_json::from_str(body).map_err(|e| {
        let start: String = body.chars().take(120).collect();
        format!("HTTP {status}: not a Prometheus API answer ({e}): {start:?}")
    })?;
    match envelope {
        Envelope::Success { data } if (200..300).contains(&status) => Ok(data),
        Envelope::Success { .. } => Err(format!("HTTP {status}: success status on an error code")),
        Envelope::Error { error_type, error } => Err(format!(
            "HTTP {status}: {}: {}",
            if error_type.is_empty() { "error" } else { &error_type },
            if error.is_empty() { "no message" } else { &error }
        )),
    }
}

/// Parses an instant-query answer into samples (pure); a scalar becomes one sample
/// without labels.
pub fn parse_vector(status: u16, body: &str) -> std::result::Result<Vec<VectorSample>, String> {
    match parse_answer::<QueryData>(status, body)? {
        QueryData::Vector(v) => v
            .into_iter()
            .map(|s| {
                let (time, value) = s.value.point()?;
                Ok(VectorSample {
                    metric: s.metric,
                    time,
                    value,
                })
            })
            .collect(),
        QueryData::Scalar(v) => {
            let (time, value) = v.point()?;
            Ok(vec![VectorSample {
                metric: BTreeMap::new(),
                time,
                value,
            }])
        }
        other => Err(format!("expected an instant vector, got a {}", other.kind())),
    }
}

/// Parses a range-query answer (pure).
pub fn parse_matrix(status: u16, body: &str) -> std::result::Result<Vec<RangeSeries>, String> {
    match parse_answer::<QueryData>(status, body)? {
        QueryData::Matrix(m) => m
            .into_iter()
            .map(|s| {
                Ok(RangeSeries {
                    metric: s.metric,
                    points: s
                        .values
                        .iter()
                        .map(WireValue::point)
                        .collect::<std::result::Result<_, String>>()?,
                })
            })
            .collect(),
        other => Err(format!("expected a range vector, got a {}", other.kind())),
    }
}

/// Parses a targets answer (pure).
pub fn parse_targets(status: u16, body: &str) -> std::result::Result<Vec<TargetHealth>, String> {
    parse_answer::<TargetsData>(status, body).map(|d| d.active_targets)
}

/// Names the query in an error about its answer (the server's own errors name it already).
fn about(q: &str, e: String) -> String {
    if e.starts_with("HTTP ") {
        e
    } else {
        format!("query {q}: {e}")
    }
}

/// A query string from `(name, value)` pairs, form-encoded.
pub fn query_string(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
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

    pub(crate) fn fail(&self, reason: impl Into<String>) -> BenchError {
        BenchError::Prometheus {
            url: self.base.clone(),
            reason: reason.into(),
        }
    }

    /// GET with retries (backoff 0.2 s, 0.6 s) on no answer and 5xx; 4xx is final. The
    /// answer is parsed by `parse`.
    async fn get_api<T>(
        &self,
        path: &str,
        pairs: &[(&str, &str)],
        parse: impl Fn(u16, &str) -> std::result::Result<T, String>,
    ) -> Result<T> {
        let path_and_query = format!("{path}?{}", query_string(pairs));
        let url = format!("{}{path_and_query}", self.base);
        let mut last = String::new();
        for attempt in 0..self.attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * 3u64.pow(attempt - 1))).await;
            }
            match http_get(&self.http, &url, self.timeout).await {
                Ok((status, body)) if status < 500 => return parse(status, &body).map_err(|e| self.fail(e)),
                Ok((status, body)) => last = parse(status, &body).err().unwrap_or_else(|| format!("HTTP {status}")),
                Err(e) => last = format!("cannot reach the server: {e}"),
            }
        }
        Err(self.fail(format!("{last} (after {} attempts)", self.attempts)))
    }

    /// An instant query at `time` (seconds since the epoch) or now.
    pub async fn query(&self, q: &str, time: Option<f64>) -> Result<Vec<VectorSample>> {
        let t = time.map(|t| format!("{t:.3}"));
        let mut pairs = vec![("query", q)];
        if let Some(t) = &t {
            pairs.push(("time", t));
        }
        self.get_api("/api/v1/query", &pairs, |st, b| {
            parse_vector(st, b).map_err(|e| about(q, e))
        })
        .await
    }

    /// A range query.
    pub async fn query_range(&self, q: &str, start: f64, end: f64, step: f64) -> Result<Vec<RangeSeries>> {
        let (start, end, step) = (format!("{start:.3}"), format!("{end:.3}"), step.to_string());
        self.get_api(
            "/api/v1/query_range",
            &[("query", q), ("start", &start), ("end", &end), ("step", &step)],
            |st, b| parse_matrix(st, b).map_err(|e| about(q, e)),
        )
        .await
    }

    /// The active targets and their health.
    pub async fn targets(&self) -> Result<Vec<TargetHealth>> {
        self.get_api("/api/v1/targets", &[("state", "active")], parse_targets)
            .await
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
