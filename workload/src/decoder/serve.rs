//! `gpushare-workload llm`: the decoder behind an OpenAI-compatible streaming API, the
//! one language-model servers such as vLLM answer, so gpushare-bench's streaming client
//! (`--stream completions` or `chat`) measures it as it measures them.
//!
//! `POST /v1/completions` (the prompt as token ids, or text) and `/v1/chat/completions`
//! (the last message's text) with `"stream": true` answer with server-sent events: one
//! per token (`choices[0].text`, or `choices[0].delta.content` after a role-only first
//! event for chat), a usage event when `stream_options.include_usage` asks, then
//! `data: [DONE]`. Text becomes one token per word (its FNV-1a hash within the
//! vocabulary): there is no tokenizer, and a token's text is ` t<id>`. Every answer has
//! `max_tokens` tokens (greedy decoding of random weights has no end of sequence).
//! Requests are served one at a time in arrival order by one engine thread (batch 1);
//! one whose client went away stops at its next token. `GET /healthz` answers 200 once
//! the engine has run its warm-up requests.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::DecoderConfig;

/// The most bytes of a request body read.
const MAX_BODY: usize = 16 << 20;

/// A request the engine can run.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Chat (`delta.content`) or completions (`text`).
    pub chat: bool,
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Tokens to make.
    pub max_tokens: usize,
    /// Whether to send a usage event.
    pub usage: bool,
}

/// One token per word: FNV-1a of its bytes within the vocabulary.
pub fn word_ids(text: &str, vocab: usize) -> Vec<u32> {
    text.split_whitespace()
        .map(|w| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in w.bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            (h % vocab as u64) as u32
        })
        .collect()
}

/// Reads a request (pure): what to generate, or the status and reason to answer.
pub fn parse_request(path: &str, body: &[u8], config: &DecoderConfig) -> Result<Generation, (StatusCode, String)> {
    let chat = match path {
        "/v1/completions" => false,
        "/v1/chat/completions" => true,
        _ => {
            return Err((
                StatusCode::NOT_FOUND,
                "POST /v1/completions or /v1/chat/completions".into(),
            ));
        }
    };
    let bad = |why: String| (StatusCode::BAD_REQUEST, why);
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
    if v.get("stream") != Some(&Value::Bool(true)) {
        return Err(bad("this server streams: send \"stream\": true".into()));
    }
    let prompt = if chat {
        let text = v
            .get("messages")
            .and_then(Value::as_array)
            .and_then(|m| m.last())
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str)
            .ok_or_else(|| bad("\"messages\" must end with a message whose \"content\" is text".into()))?;
        word_ids(text, config.vocab)
    } else {
        match v.get("prompt") {
            Some(Value::String(s)) => word_ids(s, config.vocab),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|t| {
                    t.as_u64()
                        .filter(|t| (*t as usize) < config.vocab)
                        .map(|t| t as u32)
                        .ok_or_else(|| bad(format!("prompt token {t} is not an id below {}", config.vocab)))
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(bad("\"prompt\" must be text or a list of token ids".into())),
        }
    };
    let max_tokens = match v.get("max_tokens") {
        None => 16,
        Some(m) => m
            .as_u64()
            .filter(|m| *m >= 1)
            .ok_or_else(|| bad(format!("max_tokens {m} is not a count of tokens")))? as usize,
    };
    if prompt.is_empty() || prompt.len() + max_tokens > config.max_len {
        return Err(bad(format!(
            "a prompt of {} tokens and max_tokens {max_tokens}: both must fit 1 to {} tokens",
            prompt.len(),
            config.max_len
        )));
    }
    let usage = v
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Generation {
        chat,
        prompt,
        max_tokens,
        usage,
    })
}

fn event(payload: &Value) -> Bytes {
    Bytes::from(format!("data: {payload}\n\n"))
}

/// The events of the `made`-th token (from 1) of `g` (pure).
pub fn token_events(g: &Generation, made: usize, token: u32) -> Vec<Bytes> {
    let last = made == g.max_tokens;
    let finish = if last { json!("length") } else { Value::Null };
    let mut out = Vec::new();
    if g.chat {
        if made == 1 {
            out.push(event(&json!({"id": "gen", "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": null}]})));
        }
        out.push(event(&json!({"id": "gen", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": format!(" t{token}")}, "finish_reason": finish}]})));
    } else {
        out.push(event(&json!({"id": "gen", "object": "text_completion",
            "choices": [{"index": 0, "text": format!(" t{token}"), "finish_reason": finish}]})));
    }
    out
}

/// The events after the last token (pure): usage where asked, then `[DONE]`.
pub fn closing_events(g: &Generation, made: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    if g.usage {
        out.push(event(&json!({"id": "gen", "choices": [], "usage": {
            "prompt_tokens": g.prompt.len(), "completion_tokens": made,
            "total_tokens": g.prompt.len() + made}})));
    }
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

/// A request for the engine: what to make and where its events go.
pub struct Job {
    /// What to generate.
    pub generation: Generation,
    /// The answer's events; closed when the client went away.
    pub events: mpsc::UnboundedSender<Bytes>,
}

/// The body of a streamed answer: the engine's events as they come.
struct EventBody(mpsc::UnboundedReceiver<Bytes>);

impl hyper::body::Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

type Answer = Response<http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>>;

fn plain(status: StatusCode, text: String) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(text + "\n")).boxed_unsync());
    *r.status_mut() = status;
    r
}

async fn answer(
    req: Request<Incoming>,
    config: DecoderConfig,
    jobs: std::sync::mpsc::Sender<Job>,
    ready: Arc<AtomicBool>,
) -> Answer {
    let path = req.uri().path().to_string();
    match *req.method() {
        Method::GET if path == "/healthz" => {
            return if ready.load(Ordering::SeqCst) {
                plain(StatusCode::OK, "ok".into())
            } else {
                plain(StatusCode::SERVICE_UNAVAILABLE, "warming up".into())
            };
        }
        Method::POST => {}
        _ => {
            return plain(
                StatusCode::NOT_FOUND,
                "GET /healthz; POST /v1/completions or /v1/chat/completions".into(),
            );
        }
    }
    if !ready.load(Ordering::SeqCst) {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "warming up".into());
    }
    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
    };
    let generation = match parse_request(&path, &body, &config) {
        Ok(g) => g,
        Err((status, why)) => return plain(status, why),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    if jobs.send(Job { generation, events: tx }).is_err() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "the engine stopped".into());
    }
    let mut r = Response::new(EventBody(rx).boxed_unsync());
    if let Ok(v) = "text/event-stream".parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// Serves requests on `listener`, handing each to `jobs`, until the task is dropped.
pub async fn serve(
    listener: std::net::TcpListener,
    config: DecoderConfig,
    jobs: std::sync::mpsc::Sender<Job>,
    ready: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        // Each event leaves when written.
        let _ = stream.set_nodelay(true);
        let (jobs, ready) = (jobs.clone(), ready.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let (jobs, ready) = (jobs.clone(), ready.clone());
                async move { Ok::<_, Infallible>(answer(req, config, jobs, ready).await) }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

/// Runs one job on the engine `generate` (prompt, tokens, each token's callback that
/// says whether to go on): its events to the client, stopping when the client is gone.
pub fn run_job<E>(job: Job, generate: E)
where
    E: FnOnce(&[u32], usize, &mut dyn FnMut(u32) -> bool) -> Result<usize, String>,
{
    let g = &job.generation;
    let mut made = 0;
    let mut each = |token: u32| {
        made += 1;
        token_events(g, made, token)
            .into_iter()
            .all(|e| job.events.send(e).is_ok())
    };
    match generate(&g.prompt, g.max_tokens, &mut each) {
        Ok(n) => {
            for e in closing_events(g, n) {
                if job.events.send(e).is_err() {
                    return;
                }
            }
        }
        Err(why) => {
            let _ = job.events.send(event(&json!({"error": {"message": why}})));
        }
    }
}

/// The shapes `--shape` names.
pub fn shape(name: &str) -> Option<DecoderConfig> {
    match name {
        "llm" => Some(DecoderConfig::llm()),
        "tiny" => Some(DecoderConfig::tiny()),
        _ => None,
    }
}

/// `gpushare-workload llm`: binds `listen`, builds the decoder, runs `warmup` requests
/// of 16 tokens, turns ready and serves until SIGTERM or SIGINT.
pub fn run(args: &crate::cli::LlmArgs) -> crate::error::Result<()> {
    use crate::error::WorkloadError;
    let config = shape(&args.shape)
        .ok_or_else(|| WorkloadError::BadArgument(format!("unknown --shape `{}`: expected llm or tiny", args.shape)))?;
    let on_gpu = args.device.0 != crate::config::Device::Cpu;
    if on_gpu && let Some(p) = crate::cuda::decoder::gpu_problem(&config) {
        return Err(WorkloadError::BadArgument(format!(
            "--shape {} cannot run on the GPU: {p}",
            args.shape
        )));
    }
    let listener = crate::server::bind(&args.listen)?;
    let ready = Arc::new(AtomicBool::new(false));
    let (jobs_tx, jobs) = std::sync::mpsc::channel::<Job>();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("gpushare-llm-http")
        .build()
        .map_err(|source| WorkloadError::Io {
            what: "starting the runtime".into(),
            source,
        })?;
    let stop = Arc::new(AtomicBool::new(false));
    runtime.spawn(serve(listener, config, jobs_tx, ready.clone()));
    {
        let stop = stop.clone();
        runtime.spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            if let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                stop.store(true, Ordering::SeqCst);
            }
        });
    }
    tracing::info!(shape = %args.shape, parameters = config.parameters(), listen = %args.listen, "building the decoder");
    let weights = super::DecoderWeights::seeded(config, args.seed);
    let mut engine = if on_gpu {
        let rt = crate::cuda::CudaRuntime::new(0)?;
        tracing::info!(gpu = %rt.gpu().info().name, "uploading the weights");
        Engine::Gpu(Box::new(crate::cuda::decoder::CudaDecoder::new(
            rt,
            &weights,
            !args.no_graph,
        )?))
    } else {
        Engine::Cpu(Box::new(super::cpu::CpuDecoder::new(weights)))
    };
    let warm: Vec<u32> = (1..=16).collect();
    for _ in 0..args.warmup {
        engine.generate(&warm, 16, &mut |_| true)?;
    }
    ready.store(true, Ordering::SeqCst);
    tracing::info!(shape = %args.shape, device = if on_gpu { "cuda" } else { "cpu" }, "ready");
    // A request the decoder cannot run is answered with its reason; any other failure
    // (the GPU's) ends the server with it.
    let mut fatal = None;
    while !stop.load(Ordering::SeqCst) && fatal.is_none() {
        match jobs.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(job) => run_job(job, |prompt, n, each| match engine.generate(prompt, n, each) {
                Ok(t) => Ok(t.len()),
                Err(WorkloadError::BadArgument(why)) => Err(why),
                Err(e) => {
                    let why = e.to_string();
                    fatal = Some(e);
                    Err(why)
                }
            }),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    fatal.map_or(Ok(()), Err)
}

/// The decoder a server runs: the CPU reference or the GPU kernels.
enum Engine {
    Cpu(Box<super::cpu::CpuDecoder>),
    Gpu(Box<crate::cuda::decoder::CudaDecoder>),
}

impl Engine {
    fn generate(
        &mut self,
        prompt: &[u32],
        n: usize,
        each: &mut dyn FnMut(u32) -> bool,
    ) -> crate::error::Result<Vec<u32>> {
        match self {
            Engine::Cpu(d) => d
                .generate(prompt, n, each)
                .map_err(crate::error::WorkloadError::BadArgument),
            Engine::Gpu(d) => d.generate(prompt, n, each),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(events: &[Bytes]) -> String {
        events.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect()
    }

    #[test]
    fn requests_are_read_as_the_openai_api_writes_them() {
        let c = DecoderConfig::tiny();
        let g = parse_request(
            "/v1/completions",
            br#"{"prompt":[1,2,3],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}"#,
            &c,
        )
        .expect("completion");
        assert_eq!(
            (g.chat, g.prompt.clone(), g.max_tokens, g.usage),
            (false, vec![1, 2, 3], 4, true)
        );
        let g = parse_request(
            "/v1/chat/completions",
            br#"{"messages":[{"role":"user","content":"the time of day"}],"stream":true}"#,
            &c,
        )
        .expect("chat");
        assert_eq!((g.chat, g.prompt.len(), g.max_tokens, g.usage), (true, 4, 16, false));
        assert_eq!(g.prompt, word_ids("the  time of\nday", c.vocab), "one token per word");
        for (path, body, says) in [
            ("/v1/embeddings", &br#"{}"#[..], "POST /v1/completions"),
            ("/v1/completions", b"{", "not JSON"),
            ("/v1/completions", br#"{"prompt":[1]}"#, "send \"stream\": true"),
            (
                "/v1/completions",
                br#"{"prompt":[1,99999],"stream":true}"#,
                "not an id below 512",
            ),
            (
                "/v1/completions",
                br#"{"prompt":[1],"max_tokens":0,"stream":true}"#,
                "not a count",
            ),
            (
                "/v1/completions",
                br#"{"prompt":[1],"max_tokens":300,"stream":true}"#,
                "fit 1 to 256",
            ),
            ("/v1/completions", br#"{"prompt":"","stream":true}"#, "fit 1 to 256"),
            (
                "/v1/chat/completions",
                br#"{"messages":[],"stream":true}"#,
                "must end with a message",
            ),
        ] {
            let (_, why) = parse_request(path, body, &c).expect_err(path);
            assert!(why.contains(says), "{path} {}: {why}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn a_job_streams_each_token_then_usage_and_done_and_stops_for_a_client_gone() {
        let g = Generation {
            chat: true,
            prompt: vec![1, 2],
            max_tokens: 2,
            usage: true,
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        run_job(
            Job {
                generation: g.clone(),
                events: tx,
            },
            |_, n, each| {
                for t in 0..n {
                    if !each(40 + t as u32) {
                        return Ok(t);
                    }
                }
                Ok(n)
            },
        );
        let mut got = Vec::new();
        while let Ok(e) = rx.try_recv() {
            got.push(e);
        }
        let all = text(&got);
        // A role-only event, two tokens, usage, [DONE].
        assert_eq!(got.len(), 5, "{all}");
        assert!(all.contains(r#""delta":{"role":"assistant"}"#), "{all}");
        assert!(all.contains(r#"" t40""#) && all.contains(r#"" t41""#), "{all}");
        assert!(all.contains(r#""finish_reason":"length""#), "{all}");
        assert!(
            all.contains(r#""completion_tokens":2"#) && all.contains(r#""prompt_tokens":2"#),
            "{all}"
        );
        assert!(all.ends_with("data: [DONE]\n\n"), "{all}");
        // A client gone: generation stops at its next token.
        let (tx, rx) = mpsc::unbounded_channel();
        drop(rx);
        let mut asked = 0;
        run_job(
            Job {
                generation: Generation { max_tokens: 50, ..g },
                events: tx,
            },
            |_, n, each| {
                for t in 0..n {
                    asked += 1;
                    if !each(t as u32) {
                        return Ok(t);
                    }
                }
                Ok(n)
            },
        );
        assert_eq!(asked, 1);
    }
}
