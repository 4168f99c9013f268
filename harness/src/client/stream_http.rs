//! One streamed request over HTTP (I/O): POST the body, read the answer frame by frame
//! as the connection delivers it, each frame timed on arrival, and hand the events to a
//! [`TokenTimer`](super::stream::TokenTimer). The rules of the stream are in
//! [`super::stream`]; this is only the wire.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::time::Instant;

use std::sync::Arc;

use super::prompt::{Bodies, Body};
use super::stream::{Api, EventSplitter, TokenRecord, TokenTimer};

/// The client every streamed request goes through.
pub type StreamClient = Client<HttpConnector, Full<Bytes>>;

/// One request: where, what, and when it was due.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    /// The endpoint (`http://127.0.0.1:PORT/v1/completions`).
    pub url: std::sync::Arc<str>,
    /// The JSON body (`"stream": true` in it).
    pub body: Bytes,
    /// Which API answers.
    pub api: Api,
    /// The clock every time counts from (the cell's start).
    pub origin: Instant,
    /// When the request was due (its scheduled arrival).
    pub due: Instant,
    /// The longest the whole answer may take.
    pub timeout: Duration,
    /// The `max_tokens` the body asks for (None: a body of the user's).
    pub max_tokens: Option<u64>,
}

fn secs(origin: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(origin).as_secs_f64()
}

/// Sends `req` now and times its answer. Never an error: a failure (refused, non-2xx,
/// cut, malformed, timed out) is the record's `error`, with the timings up to it.
pub async fn send(client: &StreamClient, req: StreamRequest) -> TokenRecord {
    let sent = Instant::now();
    let mut timer = TokenTimer::new(req.api, secs(req.origin, req.due), secs(req.origin, sent)).asking(req.max_tokens);
    let request = hyper::Request::builder()
        .method("POST")
        .uri(&*req.url)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(Full::new(req.body.clone()));
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            timer.fail(format!("bad request: {e}"));
            return timer.finish();
        }
    };
    let answer = async {
        let resp = client.request(request).await.map_err(|e| format!("no answer: {e}"))?;
        if !resp.status().is_success() {
            let status = resp.status();
            return Err(match first_bytes(resp.into_body()).await {
                Some(text) => format!("HTTP {status}: {text}"),
                None => format!("HTTP {status}"),
            });
        }
        let mut body = resp.into_body();
        let mut splitter = EventSplitter::default();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("the stream broke: {e}"))?;
            let at = secs(req.origin, Instant::now());
            if let Some(data) = frame.data_ref() {
                for e in splitter.push(data)? {
                    timer.event(at, &e);
                }
            }
            // The answer is whole, or failed: what the server sends after is not read.
            if timer.is_over() {
                return Ok(());
            }
        }
        // A last event no blank line ended, timed when the connection closed (the
        // earliest it was known to be whole).
        if let Some(e) = splitter.finish()? {
            timer.event(secs(req.origin, Instant::now()), &e);
        }
        Ok(())
    };
    let outcome = match tokio::time::timeout(req.timeout, answer).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {:?}", req.timeout)),
    };
    if let Err(why) = outcome {
        timer.fail(why);
    }
    timer.finish()
}

/// The first 200 bytes of an error answer, on one line (None: empty or unreadable):
/// what a server says is wrong (vLLM: "The model `x` does not exist").
async fn first_bytes(mut body: hyper::body::Incoming) -> Option<String> {
    let mut held = Vec::new();
    while held.len() < 200 {
        match body.frame().await {
            Some(Ok(f)) => held.extend(f.data_ref().map(|d| d.to_vec()).unwrap_or_default()),
            _ => break,
        }
    }
    let text: String = String::from_utf8_lossy(&held)
        .chars()
        .take(200)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// The most streamed requests in flight per pod; an arrival beyond it is dropped and
/// recorded as failed (the server is that far behind).
pub const MAX_STREAMS_IN_FLIGHT: usize = 256;

/// Where a pod's loop hands its records: told of each arrival and each ended request.
pub trait Sink: Send + Sync + 'static {
    /// A request arrived and was sent (an open loop's backlog grows by one).
    fn arrived(&self) {}
    /// A request that was sent ended: its record.
    fn ended(&self, r: TokenRecord);
    /// An arrival was dropped unsent (too many in flight): its failed record. It never
    /// `arrived`.
    fn dropped(&self, r: TokenRecord) {
        self.ended(r);
    }
}

/// The records of one pod's streamed load, in the order they ended.
#[derive(Debug, Default)]
pub struct PodStreams {
    /// The records.
    pub records: Vec<TokenRecord>,
}

impl Sink for std::sync::Mutex<PodStreams> {
    fn ended(&self, r: TokenRecord) {
        self.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .records
            .push(r);
    }
}

/// When a pod's arrivals stop: after `count` arrivals or at `until`, whichever comes
/// first (both None: never, until the task is dropped, when requests still in flight
/// leave no record).
#[derive(Debug, Clone, Copy, Default)]
pub struct Stop {
    /// Arrivals, dropped ones included.
    pub count: Option<u64>,
    /// No arrival at or after this instant.
    pub until: Option<Instant>,
}

/// The request due at `due`: the template's, with the next body where the harness
/// writes them (the record then says what it asked for).
fn next_request(template: &StreamRequest, bodies: &mut Option<Bodies>, due: Instant) -> (StreamRequest, Option<Body>) {
    let body = bodies.as_mut().map(Bodies::next_body);
    let req = StreamRequest {
        due,
        body: body.as_ref().map_or_else(|| template.body.clone(), |b| b.bytes.clone()),
        max_tokens: body.as_ref().map(|b| u64::from(b.max_tokens)),
        ..template.clone()
    };
    (req, body)
}

/// `send`, the record saying what the harness's body asked for.
async fn send_body(client: &StreamClient, req: StreamRequest, body: Option<Body>) -> TokenRecord {
    let mut r = send(client, req).await;
    if let Some(b) = body {
        r.prompt_len = Some(u64::from(b.prompt_len));
        r.max_tokens = Some(u64::from(b.max_tokens));
    }
    r
}

/// Poisson arrivals to one pod, each sent at its scheduled arrival and timed from it (a
/// request the client could not send on time carries its `send_delay_s`; latency still
/// counts from the arrival). Each body is the template's, or the next of `bodies`.
/// Records go to `sink` as requests end. Once arrivals stop, the requests in flight are
/// waited for (each within its timeout), so the slowest answers are recorded too.
pub async fn open_loop<S: Sink>(
    client: StreamClient,
    template: StreamRequest,
    mut bodies: Option<Bodies>,
    mut arrivals: super::Arrivals,
    stop: Stop,
    sink: Arc<S>,
) {
    let mut in_flight = tokio::task::JoinSet::new();
    let mut next = template.origin;
    let mut arrived = 0u64;
    loop {
        // At most a day: a tiny rate would overflow the clock.
        next += Duration::from_secs_f64(arrivals.gap().min(86_400.0));
        if stop.count.is_some_and(|c| arrived >= c) || stop.until.is_some_and(|u| next >= u) {
            break;
        }
        tokio::time::sleep_until(next).await;
        arrived += 1;
        while in_flight.try_join_next().is_some() {}
        let (req, body) = next_request(&template, &mut bodies, next);
        if in_flight.len() >= MAX_STREAMS_IN_FLIGHT {
            let mut t = TokenTimer::new(template.api, secs(template.origin, next), secs(template.origin, next));
            t.fail(format!("dropped: {MAX_STREAMS_IN_FLIGHT} requests already in flight"));
            let mut r = t.finish();
            r.prompt_len = body.as_ref().map(|b| u64::from(b.prompt_len));
            r.max_tokens = body.as_ref().map(|b| u64::from(b.max_tokens));
            sink.dropped(r);
            continue;
        }
        sink.arrived();
        let (client, sink) = (client.clone(), sink.clone());
        in_flight.spawn(async move {
            let r = send_body(&client, req, body).await;
            sink.ended(r);
        });
    }
    while in_flight.join_next().await.is_some() {}
}

/// A closed loop: the next request as the last one ended, each timed from when it was
/// sent; after a failed one, a pause of [`RETRY_PAUSE`] so a dead server is not
/// hammered. Runs until dropped.
pub async fn closed_loop<S: Sink>(
    client: StreamClient,
    template: StreamRequest,
    mut bodies: Option<Bodies>,
    sink: Arc<S>,
) {
    loop {
        let (req, body) = next_request(&template, &mut bodies, Instant::now());
        let r = send_body(&client, req, body).await;
        let failed = r.error.is_some();
        sink.ended(r);
        if failed {
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

/// A closed loop's pause after a failed request.
pub const RETRY_PAUSE: Duration = Duration::from_millis(10);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A loopback server answering one request with `status` and, for 200, each of
    /// `events` as its own HTTP chunk after its pause (a chunked, streamed answer).
    async fn server(status: u16, events: Vec<(u64, &'static str)>, close_early: bool) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.expect("accept");
            if !read_request(&mut sock).await {
                return;
            }
            if status != 200 {
                let says = "{\"message\": \"The model `m` does not exist.\"}\n";
                let head = format!(
                    "HTTP/1.1 {status} Busy\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{says}",
                    says.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                return;
            }
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
            sock.write_all(head.as_bytes()).await.expect("head");
            for (pause_ms, text) in events {
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                let chunk = format!("{:x}\r\n{text}\r\n", text.len());
                if sock.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
            }
            if !close_early {
                let _ = sock.write_all(b"0\r\n\r\n").await;
            }
        });
        format!("http://{addr}/v1/completions")
    }

    /// A completions request to `url`, due at `origin`.
    fn request(url: &str, body: &'static [u8], origin: Instant, timeout: Duration) -> StreamRequest {
        StreamRequest {
            url: url.into(),
            body: Bytes::from_static(body),
            api: Api::Completions,
            origin,
            due: origin,
            timeout,
            max_tokens: None,
        }
    }

    fn client() -> StreamClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector)
    }

    /// Reads a request's head and its body (by its content-length) from `sock`.
    async fn read_request(sock: &mut tokio::net::TcpStream) -> bool {
        let mut buf = vec![0u8; 8192];
        let mut got = Vec::new();
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    return true;
                }
            }
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    }

    async fn one(url: &str, late: Duration) -> TokenRecord {
        let origin = Instant::now();
        tokio::time::sleep(late).await;
        send(
            &client(),
            request(
                url,
                b"{\"prompt\":\"hi\",\"max_tokens\":3,\"stream\":true}",
                origin,
                Duration::from_secs(5),
            ),
        )
        .await
    }

    const STEP: &str = "data: {\"choices\":[{\"text\":\"x\"}]}\n\n";

    #[tokio::test]
    async fn tokens_are_timed_as_they_arrive_from_the_due_time() {
        // The first token 60 ms after the request, then two 40 ms apart; sent 20 ms
        // after it was due.
        let url = server(
            200,
            vec![(60, STEP), (40, STEP), (40, STEP), (0, "data: [DONE]\n\n")],
            false,
        )
        .await;
        let r = one(&url, Duration::from_millis(20)).await;
        assert_eq!(r.error, None, "{r:?}");
        assert_eq!(r.output_tokens, 3);
        assert!(r.send_delay_s >= 0.020, "{r:?}");
        // Lower bounds are when the server wrote (no token can arrive before it is
        // sent); upper ones leave room for a busy host. A single gap has no firm lower
        // bound (the token before it may have been read late), their sum has.
        let ttft = r.ttft_s.expect("ttft");
        let e2e = r.e2e_s.expect("e2e");
        assert!((0.080..2.0).contains(&ttft), "ttft {ttft} counts from the due time");
        assert!((0.160..3.0).contains(&e2e), "e2e {e2e}");
        assert_eq!(r.itl_s.len(), 2);
        assert!(r.itl_s.iter().all(|g| (0.0..2.0).contains(g)), "{:?}", r.itl_s);
        let gaps: f64 = r.itl_s.iter().sum();
        assert!(
            (gaps - (e2e - ttft)).abs() < 1e-9,
            "the gaps span first to last token: {r:?}"
        );
    }

    #[tokio::test]
    async fn a_refusal_a_cut_stream_and_a_timeout_are_the_records_errors() {
        let url = server(503, vec![], false).await;
        assert_eq!(
            one(&url, Duration::ZERO).await.error.as_deref(),
            Some("HTTP 503 Service Unavailable: {\"message\": \"The model `m` does not exist.\"}")
        );

        let url = server(200, vec![(0, STEP), (10, STEP)], true).await;
        let r = one(&url, Duration::ZERO).await;
        assert!(r.error.is_some(), "a stream cut before [DONE]: {r:?}");
        assert_eq!(r.output_tokens, 2, "the tokens before the cut are kept");

        let url = server(200, vec![(0, STEP), (30_000, STEP)], false).await;
        let origin = Instant::now();
        let r = send(&client(), request(&url, b"{}", origin, Duration::from_secs(2))).await;
        assert_eq!(r.error.as_deref(), Some("timed out after 2s"));
        assert!(r.ttft_s.is_some());

        let r = one("http://127.0.0.1:1/v1/completions", Duration::ZERO).await;
        assert!(r.error.as_deref().is_some_and(|e| e.starts_with("no answer")), "{r:?}");
    }

    /// A loopback server answering every request on its own connection: two tokens
    /// 5 ms apart, then [DONE].
    async fn busy_server() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if !read_request(&mut sock).await {
                        return;
                    }
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
                    let _ = sock.write_all(head.as_bytes()).await;
                    for (pause, text) in [(1, STEP), (5, STEP), (0, "data: [DONE]\n\n")] {
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                        let _ = sock
                            .write_all(format!("{:x}\r\n{text}\r\n", text.len()).as_bytes())
                            .await;
                    }
                    let _ = sock.write_all(b"0\r\n\r\n").await;
                });
            }
        });
        format!("http://{addr}/v1/completions")
    }

    #[tokio::test]
    async fn the_open_loop_sends_at_the_seeded_arrivals_and_times_from_them() {
        let url = busy_server().await;
        let sink = std::sync::Arc::new(std::sync::Mutex::new(PodStreams::default()));
        let origin = Instant::now();
        let template = request(
            &url,
            b"{\"prompt\":\"hi\",\"stream\":true}",
            origin,
            Duration::from_secs(5),
        );
        let n = 20;
        let stop = Stop {
            count: Some(n),
            until: None,
        };
        open_loop(
            client(),
            template,
            None,
            crate::client::Arrivals::new(7, 100.0),
            stop,
            sink.clone(),
        )
        .await;
        let mut records = std::mem::take(&mut sink.lock().expect("sink").records);
        assert_eq!(
            records.len(),
            n as usize,
            "every request in flight at the end was waited for"
        );
        // Sent on time, give or take a busy host.
        let mut delays: Vec<f64> = records.iter().map(|r| r.send_delay_s).collect();
        delays.sort_by(f64::total_cmp);
        assert!(delays[delays.len() / 2] < 0.5, "{delays:?}");
        assert!(
            records.iter().all(|r| r.error.is_none() && r.output_tokens == 2),
            "{records:?}"
        );
        // The arrivals are the seed's, whenever each request was actually sent.
        records.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
        let mut a = crate::client::Arrivals::new(7, 100.0);
        let mut due = Duration::ZERO;
        for r in &records {
            due += Duration::from_secs_f64(a.gap());
            assert!(
                (r.arrival_s - due.as_secs_f64()).abs() < 1e-6,
                "{} vs {:?}",
                r.arrival_s,
                due
            );
            assert!(r.ttft_s.is_some_and(|t| t >= 0.001) && r.e2e_s.is_some_and(|e| e >= 0.006));
        }
    }

    #[tokio::test]
    async fn arrivals_stop_at_the_deadline() {
        let url = busy_server().await;
        let sink = std::sync::Arc::new(std::sync::Mutex::new(PodStreams::default()));
        let origin = Instant::now();
        let template = request(&url, b"{}", origin, Duration::from_secs(5));
        let stop = Stop {
            count: None,
            until: Some(origin + Duration::from_millis(300)),
        };
        open_loop(
            client(),
            template,
            None,
            crate::client::Arrivals::new(3, 50.0),
            stop,
            sink.clone(),
        )
        .await;
        let records = std::mem::take(&mut sink.lock().expect("sink").records);
        // The seed's arrivals before 300 ms, each answered.
        let mut a = crate::client::Arrivals::new(3, 50.0);
        let mut due = Duration::ZERO;
        let mut expected = 0;
        loop {
            due += Duration::from_secs_f64(a.gap());
            if due >= Duration::from_millis(300) {
                break;
            }
            expected += 1;
        }
        assert_eq!(records.len(), expected);
        assert!(records.iter().all(|r| r.error.is_none() && r.arrival_s < 0.3));
    }
}
