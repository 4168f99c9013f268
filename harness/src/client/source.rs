//! The load generator as a metrics source: `prepare` starts one generator per ready
//! pod (ending the last cell's), `snapshot` reads their tallies. Generators end with
//! the next cell's `prepare` and when the source is dropped: every request task lives
//! in a `JoinSet`, aborted with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::prompt::Bodies;
use crate::client::stream_http::{self, Sink, StreamRequest};
use crate::client::tokens::{RequestObjectives, TokenTally};
use crate::client::{Arrivals, RequestPlan, Tally};
use crate::config::values::Load;
use crate::domain::Source;
use crate::error::{BenchError, Result};
use crate::metrics::requests::{TokenHistograms, TokenRecord};
use crate::metrics::{MetricsSource, PodSnapshot, ServerHistograms, Target};
use crate::shutdown::Shutdown;

type PostClient = Client<HttpConnector, Full<Bytes>>;

/// The most requests in flight per pod under an open load; an arrival beyond it is
/// dropped and counted as an error (the server is that far behind).
pub const MAX_IN_FLIGHT: usize = 256;
/// The longest a request may take before it counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// A closed loop's pause after a failed request, so a dead server is not hammered.
const RETRY_PAUSE: Duration = stream_http::RETRY_PAUSE;

/// A pod's state as a streamed load's sink: each ended request is kept, tallied per
/// token metric, and its end to end observed as the pod's latency.
struct StreamSink(Arc<Mutex<PodLoad>>);

impl Sink for StreamSink {
    fn arrived(&self) {
        if let Some(b) = locked(&self.0).backlog.as_mut() {
            *b += 1;
        }
    }

    fn ended(&self, r: TokenRecord) {
        let mut p = locked(&self.0);
        if let Some(b) = p.backlog.as_mut() {
            *b = b.saturating_sub(1);
        }
        record_streamed(&mut p, r);
    }

    fn dropped(&self, r: TokenRecord) {
        record_streamed(&mut locked(&self.0), r);
    }
}

/// Keeps an ended streamed request: its end to end observed as the pod's latency (or
/// its failure counted), its token metrics tallied, the record kept.
fn record_streamed(p: &mut PodLoad, r: TokenRecord) {
    match (&r.error, r.e2e_s) {
        (None, Some(e2e)) => p.tally.observe(e2e),
        (Some(why), _) => {
            p.tally.errors += 1;
            p.last_error = Some(why.clone());
        }
        (None, None) => {}
    }
    let (records, tally) = p.streamed.get_or_insert_with(Default::default);
    tally.add(&r, &RequestObjectives::default());
    records.push(r);
}

/// What every request is.
#[derive(Debug)]
struct Request {
    body: Option<Bytes>,
    content_type: &'static str,
}

/// One pod's generator state, shared with its tasks.
#[derive(Debug, Default)]
struct PodLoad {
    /// Latencies (a streamed answer's end to end) and failures.
    tally: Tally,
    /// Streamed answers: every request ended so far, and their token tallies.
    streamed: Option<(Vec<TokenRecord>, TokenTally)>,
    seed: Option<u64>,
    /// Open loop: requests arrived and not yet answered (None: a closed loop, whose
    /// backlog is one request by construction).
    backlog: Option<u64>,
    /// Why the last failed request failed.
    last_error: Option<String>,
}

/// Requests to every pod of a cell, timed by the harness.
#[derive(Debug)]
pub struct RequestSource {
    plan: RequestPlan,
    request: Arc<Request>,
    load: Load,
    client: PostClient,
    running: Mutex<Running>,
    /// Reads the server's own histograms (`--server-ttft-metric`, `--server-itl-metric`).
    server_metrics: Option<Box<crate::metrics::scrape::ScrapeSource>>,
}

/// The longest a streamed answer may take before it counts as failed: below the
/// tallies' highest finite bucket (64 s), so every time a row reads is resolved.
pub const STREAM_TIMEOUT: Duration = REQUEST_TIMEOUT;

#[derive(Debug, Default)]
struct Running {
    pods: HashMap<String, Arc<Mutex<PodLoad>>>,
    /// Held, not read: dropping it aborts the generators.
    _tasks: Option<JoinSet<()>>,
}

impl RequestSource {
    /// A source for `plan` under `load`; reads the body now (a missing or changed file
    /// is an error before any pod starts).
    pub fn new(plan: &RequestPlan, load: Load) -> Result<Self> {
        let body = plan
            .read_body()
            .map_err(|reason| {
                let path = plan.body.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
                BenchError::flag("--body", &path, reason)
            })?
            .map(Bytes::from);
        Ok(Self {
            request: Arc::new(Request {
                body,
                content_type: plan.content_type(),
            }),
            plan: plan.clone(),
            load,
            client: {
                // A request's headers and body may leave in two writes: without
                // TCP_NODELAY the second waits for the server's delayed ACK.
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                Client::builder(TokioExecutor::new()).build(connector)
            },
            running: Mutex::new(Running::default()),
            server_metrics: plan
                .stream
                .as_ref()
                .filter(|s| s.server_ttft_metric.is_some() || s.server_itl_metric.is_some())
                // Short: the client's snapshot waits for it.
                .map(|_| Box::new(crate::metrics::scrape::ScrapeSource::new(Duration::from_secs(1)))),
        })
    }

    /// Each target's server histograms, where they are asked for (None otherwise).
    async fn server_histograms(&self, targets: &[Target]) -> Vec<Option<ServerHistograms>> {
        let (Some(scraper), Some(stream)) = (&self.server_metrics, &self.plan.stream) else {
            return vec![None; targets.len()];
        };
        let (ttft, itl) = (
            stream.server_ttft_metric.as_deref(),
            stream.server_itl_metric.as_deref(),
        );
        let reads = targets.iter().map(|t| async move {
            Some(match scraper.get(&t.url).await {
                Ok(text) => ServerHistograms::from_text(&text, ttft, itl),
                Err(why) => ServerHistograms {
                    problem: Some(format!("its /metrics could not be read: {why}")),
                    ..ServerHistograms::default()
                },
            })
        });
        futures_util::future::join_all(reads).await
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Running> {
        locked(&self.running)
    }
}

/// The port of a pod's metrics URL (`http://127.0.0.1:PORT/metrics`).
fn port_of(url: &str) -> Option<u16> {
    url.parse::<hyper::Uri>().ok()?.port_u16()
}

/// One request: Ok once a 2xx answer was read whole, else why not.
async fn send(client: &PostClient, url: &str, req: &Request) -> std::result::Result<(), String> {
    let mut builder = hyper::Request::builder().uri(url);
    let body = match &req.body {
        Some(b) => {
            builder = builder.method("POST").header("content-type", req.content_type);
            Full::new(b.clone())
        }
        None => Full::new(Bytes::new()),
    };
    let request = builder.body(body).map_err(|e| format!("bad request: {e}"))?;
    let answer = async {
        let resp = client.request(request).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        resp.into_body().collect().await.map_err(|e| e.to_string())?;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {status}"))
        }
    };
    tokio::time::timeout(REQUEST_TIMEOUT, answer)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

fn record(pod: &Mutex<PodLoad>, outcome: std::result::Result<(), String>, took: Duration) {
    let mut p = locked(pod);
    if let Some(b) = p.backlog.as_mut() {
        *b = b.saturating_sub(1);
    }
    match outcome {
        Ok(()) => p.tally.observe(took.as_secs_f64()),
        Err(why) => {
            p.tally.errors += 1;
            p.last_error = Some(why);
        }
    }
}

/// Back to back: the next request when the last one is answered.
async fn closed_loop(client: PostClient, url: String, req: Arc<Request>, pod: Arc<Mutex<PodLoad>>) {
    loop {
        let start = Instant::now();
        let outcome = send(&client, &url, &req).await;
        let failed = outcome.is_err();
        record(&pod, outcome, start.elapsed());
        if failed {
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

/// Poisson arrivals: each request timed from its scheduled arrival, so a slow server
/// is charged for the queue it builds (no coordinated omission).
async fn open_loop(
    client: PostClient,
    url: String,
    req: Arc<Request>,
    pod: Arc<Mutex<PodLoad>>,
    mut arrivals: Arrivals,
) {
    let mut in_flight = JoinSet::new();
    let mut next = Instant::now();
    loop {
        // At most a day: a tiny --load rate would overflow the clock.
        next += Duration::from_secs_f64(arrivals.gap().min(86_400.0));
        tokio::time::sleep_until(next).await;
        while in_flight.try_join_next().is_some() {}
        if in_flight.len() >= MAX_IN_FLIGHT {
            let mut p = locked(&pod);
            p.tally.errors += 1;
            p.last_error = Some(format!("dropped: {MAX_IN_FLIGHT} requests already in flight"));
            continue;
        }
        if let Some(b) = locked(&pod).backlog.as_mut() {
            *b += 1;
        }
        let (client, url, req, pod, arrival) = (client.clone(), url.clone(), req.clone(), pod.clone(), next);
        in_flight.spawn(async move {
            let outcome = send(&client, &url, &req).await;
            record(&pod, outcome, arrival.elapsed());
        });
    }
}

/// A mutex's value, also after a task panicked while holding it (a tally stays valid).
fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl MetricsSource for RequestSource {
    fn kind(&self) -> Source {
        Source::Client
    }

    async fn prepare(&self, targets: &[Target], _shutdown: &Shutdown) -> Result<()> {
        let mut tasks = JoinSet::new();
        let mut pods = HashMap::new();
        let rate = self.load.per_pod_rate(targets.len() as u32);
        for (index, t) in targets.iter().enumerate() {
            let port = port_of(&t.url).ok_or_else(|| BenchError::Scrape {
                pod: t.pod.clone(),
                url: t.url.clone(),
                reason: "no port in its URL to send --request to".into(),
            })?;
            let url = self.plan.url_for(port);
            let pod = Arc::new(Mutex::new(PodLoad::default()));
            let (client, req) = (self.client.clone(), self.request.clone());
            if let Some(stream) = &self.plan.stream {
                let seed = crate::client::fresh_seed(index as u32);
                let template = StreamRequest {
                    url: url.as_str().into(),
                    body: Bytes::new(),
                    api: stream.api,
                    origin: Instant::now(),
                    due: Instant::now(),
                    timeout: STREAM_TIMEOUT,
                    max_tokens: None,
                };
                let bodies = Some(Bodies::new(stream.clone(), seed));
                let sink = Arc::new(StreamSink(pod.clone()));
                let mut p = locked(&pod);
                p.seed = Some(seed);
                p.streamed = Some(Default::default());
                p.backlog = rate.map(|_| 0);
                drop(p);
                match rate {
                    None => {
                        tasks.spawn(stream_http::closed_loop(client, template, bodies, sink));
                    }
                    Some(rate) => {
                        let stop = stream_http::Stop::default();
                        let arrivals = Arrivals::new(seed, rate);
                        tasks.spawn(stream_http::open_loop(client, template, bodies, arrivals, stop, sink));
                    }
                }
                pods.insert(t.pod.clone(), pod);
                continue;
            }
            match rate {
                None => {
                    tasks.spawn(closed_loop(client, url, req, pod.clone()));
                }
                Some(rate) => {
                    let seed = crate::client::fresh_seed(index as u32);
                    let mut p = locked(&pod);
                    p.seed = Some(seed);
                    p.backlog = Some(0);
                    drop(p);
                    tasks.spawn(open_loop(client, url, req, pod.clone(), Arrivals::new(seed, rate)));
                }
            }
            pods.insert(t.pod.clone(), pod);
        }
        // The last cell's generators end here (dropping a JoinSet aborts its tasks).
        *self.running() = Running {
            pods,
            _tasks: Some(tasks),
        };
        Ok(())
    }

    /// Ends every generator of the cell (also done by the next `prepare` and on drop).
    fn release(&self) {
        *self.running() = Running::default();
    }

    fn streamed(&self, pod: &str, from: usize, to: usize) -> Vec<TokenRecord> {
        let running = self.running();
        let Some(p) = running.pods.get(pod) else {
            return Vec::new();
        };
        let p = locked(p);
        p.streamed
            .as_ref()
            .and_then(|(r, _)| r.get(from..to.min(r.len())))
            .map(<[TokenRecord]>::to_vec)
            .unwrap_or_default()
    }

    async fn snapshot(&self, targets: &[Target]) -> Result<Vec<(String, Result<PodSnapshot>)>> {
        // The server's counters are read first, within milliseconds of the client's: a
        // cell compares the two over the same seconds.
        let mut servers = self.server_histograms(targets).await.into_iter();
        let at = Instant::now();
        let running = self.running();
        Ok(targets
            .iter()
            .map(|t| {
                let server = servers.next().flatten();
                let snap = match running.pods.get(&t.pod) {
                    Some(p) => {
                        let p = locked(p);
                        Ok(PodSnapshot {
                            at,
                            latency: p.tally.histogram(),
                            errors: p.tally.errors as f64,
                            backlog: p.backlog.map(|b| b as f64),
                            load_seed: p.seed,
                            device_uuid: None,
                            last_error: p.last_error.clone(),
                            streamed: p.streamed.as_ref().map(|(r, _)| r.len()),
                            tokens: p.streamed.as_ref().map(|(_, t)| TokenHistograms {
                                ttft: t.ttft.histogram(),
                                itl: t.itl.histogram(),
                                tpot: t.tpot.histogram(),
                            }),
                            server,
                        })
                    }
                    None => Err(BenchError::Scrape {
                        pod: t.pod.clone(),
                        url: t.url.clone(),
                        reason: "no requests were sent to it (not prepared)".into(),
                    }),
                };
                (t.pod.clone(), snap)
            })
            .collect())
    }
}
