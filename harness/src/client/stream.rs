//! Streaming answers of OpenAI-compatible servers (`/v1/completions` and
//! `/v1/chat/completions` with `"stream": true`) read into one record per request:
//! time to first token, every gap between tokens, end-to-end latency and the tokens
//! counted. Pure: bytes in, as they arrive with the time they arrived, records out.
//!
//! The rules, as the serving benchmarks users know count them (vLLM's
//! `benchmarks/lib/endpoint_request_func.py`, v0.11): an answer is server-sent events
//! separated by a blank line; a `data:` payload of `[DONE]` ends it; lines starting with
//! `:` are comments (keep-alive pings). Each event whose `choices` is not empty is one
//! step of generation: the first fixes the time to first token, each later one adds an
//! inter-token gap, and the last one ends the request. An event without choices may
//! carry `usage` (`stream_options.include_usage`): its `completion_tokens` is the
//! output's length; without it, the steps that carry text are counted. Two differences,
//! on purpose: times count from the request's **scheduled** arrival, not from when it
//! was sent, so a client or a server that falls behind shows in the latency (no
//! coordinated omission); and an answer that closes without `[DONE]` failed (vLLM counts
//! it a success once a token came), since a server cut off mid-answer did not serve it.

pub use crate::config::request::Api;
pub use crate::metrics::requests::{TokenRecord, micros};

/// One event of the stream, as far as timing cares.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A `data:` payload (lines of one event joined by `\n`).
    Data(String),
    /// `data: [DONE]`: the answer is complete.
    Done,
}

/// Splits bytes, in whatever pieces the connection hands them over, into events, as the
/// server-sent events format reads them: lines end at CR, LF or CRLF; a blank line ends
/// an event; `data` fields (with or without a colon, one leading space dropped) are
/// joined by LF; lines starting with `:` are comments; other fields are ignored; a
/// UTF-8 byte order mark at the stream's start is skipped. A byte sequence split anywhere
/// gives the same events. Linear in the bytes: each is looked at once.
#[derive(Debug, Default, Clone)]
pub struct EventSplitter {
    /// The line being read.
    line: Vec<u8>,
    /// The data lines of the event being read.
    data: Vec<String>,
    /// Bytes held by `line` and `data`.
    held: usize,
    /// The last byte was a CR (a LF right after it ends nothing more).
    after_cr: bool,
    /// Bytes of the stream so far (the byte order mark is looked for in the first 3).
    seen: usize,
}

/// The longest event kept waiting for its end (a server that never sends a blank line
/// would otherwise grow it without bound).
pub const MAX_EVENT_BYTES: usize = 1 << 20;

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

impl EventSplitter {
    /// The events completed by `bytes`. An error names what is wrong: an event over
    /// [`MAX_EVENT_BYTES`], or a line that is not UTF-8.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Event>, String> {
        let mut events = Vec::new();
        for &b in bytes {
            self.seen += 1;
            // The mark's bytes wait in `line` until the third shows whether they are it.
            if self.seen == 3 && self.line.len() == 2 && [self.line[0], self.line[1], b] == BOM {
                self.line.clear();
                self.held -= 2;
                continue;
            }
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\r' | b'\n' => {
                    self.after_cr = b == b'\r';
                    if let Some(e) = self.end_line()? {
                        events.push(e);
                    }
                }
                _ => {
                    self.after_cr = false;
                    self.line.push(b);
                    self.held += 1;
                }
            }
            if self.held > MAX_EVENT_BYTES {
                return Err(format!(
                    "an event of the stream runs past {MAX_EVENT_BYTES} bytes without ending (no blank line)"
                ));
            }
        }
        Ok(events)
    }

    /// The event left when the connection closed without a blank line after it (some
    /// servers end the stream so), if it holds one.
    pub fn finish(mut self) -> Result<Option<Event>, String> {
        if !self.line.is_empty() {
            self.end_line()?;
        }
        Ok(self.dispatch())
    }

    /// A line ended: a field read, or at a blank line the event dispatched.
    fn end_line(&mut self) -> Result<Option<Event>, String> {
        if self.line.is_empty() {
            return Ok(self.dispatch());
        }
        let line = String::from_utf8(std::mem::take(&mut self.line))
            .map_err(|_| "a line of the stream is not UTF-8".to_string())?;
        if line.starts_with(':') {
            self.held -= line.len();
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        if field == "data" {
            let kept = value.len();
            self.held = self.held - line.len() + kept;
            self.data.push(value.to_string());
        } else {
            self.held -= line.len();
        }
        Ok(None)
    }

    /// The event read so far (None without data), and a fresh one begun.
    fn dispatch(&mut self) -> Option<Event> {
        self.held = 0;
        if self.data.is_empty() {
            return None;
        }
        let joined = std::mem::take(&mut self.data).join("\n");
        Some(if joined.trim() == "[DONE]" {
            Event::Done
        } else {
            Event::Data(joined)
        })
    }
}

/// What one data payload says.
#[derive(Debug, Clone, PartialEq)]
pub enum Chunk {
    /// A step of generation; `text` whether it carried any (a chat stream's first chunk
    /// names the role only, a special token may be empty).
    Step {
        /// The step's text is not empty.
        text: bool,
    },
    /// The usage summary.
    Usage {
        /// `prompt_tokens`, when given.
        prompt_tokens: Option<u64>,
        /// `completion_tokens`.
        completion_tokens: u64,
    },
    /// An error the server streamed (`{"error": …}`), its message.
    Error(String),
    /// Nothing timing cares about.
    Other,
}

/// Reads one data payload (pure). An error names what is malformed.
pub fn parse_chunk(api: Api, data: &str) -> Result<Chunk, String> {
    let v: serde_json::Value =
        serde_json::from_str(data).map_err(|e| format!("a streamed chunk is not JSON ({e}): {}", excerpt(data)))?;
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        let message = err
            .get("message")
            .and_then(serde_json::Value::as_str)
            .map_or_else(|| err.to_string(), str::to_string);
        return Ok(Chunk::Error(message));
    }
    if let Some(choices) = v.get("choices").and_then(serde_json::Value::as_array)
        && let Some(first) = choices.first()
    {
        let text = match api {
            Api::Completions => first.get("text"),
            Api::Chat => first.get("delta").and_then(|d| d.get("content")),
        };
        return match text {
            None | Some(serde_json::Value::Null) => Ok(Chunk::Step { text: false }),
            Some(serde_json::Value::String(t)) => Ok(Chunk::Step { text: !t.is_empty() }),
            Some(other) => Err(format!(
                "a streamed choice's {} is {other}, not text",
                match api {
                    Api::Completions => "text",
                    Api::Chat => "delta.content",
                }
            )),
        };
    }
    if let Some(usage) = v.get("usage").filter(|u| !u.is_null()) {
        let completion_tokens = usage
            .get("completion_tokens")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| format!("a usage chunk without a completion_tokens count: {}", excerpt(data)))?;
        return Ok(Chunk::Usage {
            prompt_tokens: usage.get("prompt_tokens").and_then(serde_json::Value::as_u64),
            completion_tokens,
        });
    }
    Ok(Chunk::Other)
}

fn excerpt(s: &str) -> String {
    let cut: String = s.chars().take(120).collect();
    if cut.len() < s.len() { format!("{cut}…") } else { cut }
}

/// The timeline of one request while its answer streams in; times in seconds on one
/// clock (the cell's).
#[derive(Debug, Clone)]
pub struct TokenTimer {
    api: Api,
    arrival: f64,
    sent: f64,
    first: Option<f64>,
    last: Option<f64>,
    gaps: Vec<f64>,
    /// Steps that carried text.
    steps: u64,
    /// Every step, empty ones too.
    chunks: u64,
    /// The `max_tokens` the request asked for (None: a body of the user's).
    max_tokens: Option<u64>,
    usage: Option<(Option<u64>, u64)>,
    done: bool,
    error: Option<String>,
}

impl TokenTimer {
    /// A request due at `arrival` and sent at `sent`.
    pub fn new(api: Api, arrival: f64, sent: f64) -> Self {
        // Every time on the microsecond grid the record keeps, so its gaps add up to
        // exactly its last token's time less its first's.
        Self {
            api,
            arrival: micros(arrival),
            sent: micros(sent),
            first: None,
            last: None,
            gaps: Vec::new(),
            steps: 0,
            chunks: 0,
            max_tokens: None,
            usage: None,
            done: false,
            error: None,
        }
    }

    /// The `max_tokens` the request asked for: an answer that streams more steps with
    /// text, or whose `usage` reports more tokens, fails.
    pub fn asking(mut self, max_tokens: Option<u64>) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Whether nothing more will be read: the answer is whole, or failed.
    pub fn is_over(&self) -> bool {
        self.done || self.error.is_some()
    }

    /// An event that arrived at `at`. Events after `[DONE]` or after an error are
    /// ignored; a malformed chunk fails the request.
    pub fn event(&mut self, at: f64, e: &Event) {
        if self.done || self.error.is_some() {
            return;
        }
        let at = micros(at);
        let data = match e {
            Event::Done => {
                self.done = true;
                return;
            }
            Event::Data(d) => d,
        };
        match parse_chunk(self.api, data) {
            Ok(Chunk::Step { text }) => {
                match self.last {
                    None => self.first = Some(at),
                    Some(prev) => self.gaps.push(micros((at - prev).max(0.0))),
                }
                self.last = Some(at);
                self.chunks += 1;
                if text {
                    self.steps += 1;
                }
                // Each step with text holds a token at least; a role step, a final
                // empty step and a few keep-alives come on top.
                if let Some(m) = self.max_tokens
                    && (self.steps > m || self.chunks > 2 * m + 16)
                {
                    self.error = Some(format!(
                        "the server streamed more than the {m} tokens asked (max_tokens): {} steps, {} with text",
                        self.chunks, self.steps
                    ));
                }
            }
            Ok(Chunk::Usage {
                prompt_tokens,
                completion_tokens,
            }) => self.usage = Some((prompt_tokens, completion_tokens)),
            Ok(Chunk::Error(m)) => self.error = Some(format!("the server streamed an error: {m}")),
            Ok(Chunk::Other) => {}
            Err(why) => self.error = Some(why),
        }
    }

    /// Whether `[DONE]` has arrived (the answer is whole).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Fails the request (a non-2xx answer, a broken connection, a timeout); an answer
    /// already whole stays a success.
    pub fn fail(&mut self, why: String) {
        if self.error.is_none() && !self.done {
            self.error = Some(why);
        }
    }

    /// The record. A stream that closed without `[DONE]`, that gave no token, or whose
    /// `usage` the stream contradicts (fewer tokens than its steps with text, more than
    /// `max_tokens`) is a failure; its timings up to then are kept.
    pub fn finish(mut self) -> TokenRecord {
        if self.error.is_none() {
            if self.first.is_none() {
                self.error = Some("the answer held no token".into());
            } else if !self.done {
                self.error = Some("the stream ended without data: [DONE]".into());
            } else if self.steps == 0 {
                self.error = Some(format!(
                    "the answer held no token: none of its {} steps carried text",
                    self.chunks
                ));
            } else if let Some((_, c)) = self.usage {
                if let Some(m) = self.max_tokens.filter(|m| c > *m) {
                    self.error = Some(format!(
                        "the server reported {c} output tokens (usage.completion_tokens) for max_tokens {m}"
                    ));
                } else if c < self.steps {
                    self.error = Some(format!(
                        "the server reported {c} output tokens (usage.completion_tokens) but streamed {} steps with text",
                        self.steps
                    ));
                }
            }
        }
        let (prompt_tokens, output_tokens, tokens_from_usage) = match self.usage {
            Some((p, c)) => (p, c, true),
            None => (None, self.steps, false),
        };
        let ttft = self.first.map(|f| micros(f - self.arrival));
        let e2e = self.last.map(|l| micros(l - self.arrival));
        let tpot = match (ttft, e2e) {
            (Some(t), Some(e)) if output_tokens > 1 => Some((e - t) / (output_tokens - 1) as f64),
            _ => None,
        };
        TokenRecord {
            arrival_s: micros(self.arrival),
            send_delay_s: micros((self.sent - self.arrival).max(0.0)),
            ttft_s: ttft,
            e2e_s: e2e,
            itl_s: self.gaps,
            output_tokens,
            tokens_from_usage,
            prompt_tokens,
            tpot_s: tpot,
            error: self.error,
            prompt_len: None,
            max_tokens: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMPLETION: &str = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"Hel\",\"finish_reason\":null}]}\n\n\
: ping\n\n\
data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"lo\",\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n\
data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n\
data: [DONE]\n\n";

    fn events_in_pieces(text: &[u8], piece: usize) -> Vec<Event> {
        let mut s = EventSplitter::default();
        let mut out = Vec::new();
        for c in text.chunks(piece) {
            out.extend(s.push(c).expect("push"));
        }
        out.extend(s.finish().expect("finish"));
        out
    }

    #[test]
    fn events_are_the_same_whatever_the_pieces() {
        let whole = events_in_pieces(COMPLETION.as_bytes(), COMPLETION.len());
        assert_eq!(whole.len(), 5, "the ping is a comment: {whole:?}");
        assert_eq!(whole.last(), Some(&Event::Done));
        for piece in [1, 2, 3, 7, 64] {
            assert_eq!(
                events_in_pieces(COMPLETION.as_bytes(), piece),
                whole,
                "pieces of {piece}"
            );
        }
        // CRLF line ends, a multi-line data event, other fields and a last event that
        // no blank line ends.
        let crlf = "event: x\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nid: 7\r\n\r\ndata: [DONE]";
        assert_eq!(
            events_in_pieces(crlf.as_bytes(), 3),
            [Event::Data("{\"a\":\n1}".into()), Event::Done]
        );
        // A character split across pieces stays whole.
        let text = "data: {\"choices\":[{\"text\":\"é\"}]}\n\n".as_bytes();
        assert_eq!(events_in_pieces(text, 1).len(), 1);
        // Lone CRs end lines; a bare `data` line adds an empty line; a byte order mark
        // at the start (split over pieces too) is no part of the first line.
        let cr = "data: a\rdata\rdata: b\r\rdata: [DONE]\r\r";
        assert_eq!(
            events_in_pieces(cr.as_bytes(), 2),
            [Event::Data("a\n\nb".into()), Event::Done]
        );
        let mut bom = vec![0xEF, 0xBB, 0xBF];
        bom.extend_from_slice(COMPLETION.as_bytes());
        for piece in [1, 2, 4] {
            assert_eq!(events_in_pieces(&bom, piece), whole, "a BOM, pieces of {piece}");
        }
    }

    #[test]
    fn a_runaway_event_or_bytes_that_are_not_text_are_errors() {
        let mut s = EventSplitter::default();
        let e = s.push(&vec![b'x'; MAX_EVENT_BYTES + 1]).expect_err("too long");
        assert!(e.contains("without ending"), "{e}");
        let mut s = EventSplitter::default();
        let e = s.push(b"data: \xff\xfe\n\n").expect_err("not utf-8");
        assert!(e.contains("not UTF-8"), "{e}");
    }

    /// Plays `text`'s events through a timer, event i arriving at `times[i]`.
    fn timed(api: Api, text: &str, arrival: f64, sent: f64, times: &[f64]) -> TokenRecord {
        let events = events_in_pieces(text.as_bytes(), 5);
        assert_eq!(events.len(), times.len(), "{events:?}");
        let mut t = TokenTimer::new(api, arrival, sent);
        for (e, at) in events.iter().zip(times) {
            t.event(*at, e);
        }
        t.finish()
    }

    #[test]
    fn times_count_from_the_scheduled_arrival_and_tokens_from_usage() {
        // Due at 10.000 s, sent 2 ms late; steps at 10.050, 10.070 and 10.095 s.
        let r = timed(
            Api::Completions,
            COMPLETION,
            10.0,
            10.002,
            &[10.050, 10.070, 10.095, 10.096, 10.097],
        );
        assert_eq!(r.error, None);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(r.send_delay_s, 0.002));
        assert!(close(r.ttft_s.expect("ttft"), 0.050));
        assert!(close(r.e2e_s.expect("e2e"), 0.095), "the usage chunk does not end it");
        assert_eq!(r.itl_s.len(), 2);
        assert!(close(r.itl_s[0], 0.020) && close(r.itl_s[1], 0.025));
        assert_eq!(
            (r.output_tokens, r.tokens_from_usage, r.prompt_tokens),
            (3, true, Some(5))
        );
        assert!(close(r.tpot_s.expect("tpot"), 0.045 / 2.0));
    }

    #[test]
    fn chat_deltas_are_steps_and_without_usage_the_steps_are_counted() {
        let chat = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"!\"},\"finish_reason\":\"stop\"}]}\n\n\
data: [DONE]\n\n";
        let r = timed(Api::Chat, chat, 0.0, 0.0, &[0.1, 0.2, 0.25, 0.3]);
        assert_eq!(r.error, None);
        // The role-only first chunk times the first step (as vLLM's client does) but
        // carries no token.
        assert_eq!((r.output_tokens, r.tokens_from_usage), (2, false));
        assert!((r.ttft_s.expect("ttft") - 0.1).abs() < 1e-9);
        assert_eq!(r.itl_s.len(), 2);
        assert!((r.e2e_s.expect("e2e") - 0.25).abs() < 1e-9);
    }

    #[test]
    fn token_counts_the_stream_cannot_have_given_fail_the_request() {
        let step = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
        let usage = |n: u64| format!("data: {{\"choices\":[],\"usage\":{{\"completion_tokens\":{n}}}}}\n\n");
        let play = |text: String| {
            let mut t = TokenTimer::new(Api::Completions, 0.0, 0.0).asking(Some(8));
            for (i, e) in events_in_pieces(text.as_bytes(), 7).iter().enumerate() {
                t.event(0.1 + i as f64 * 0.01, e);
            }
            t.finish()
        };
        let fails = |r: &TokenRecord, want: &str| r.error.as_deref().is_some_and(|e| e.contains(want));
        let r = play(format!("{step}{}data: [DONE]\n\n", usage(1_000_000)));
        assert!(
            fails(
                &r,
                "reported 1000000 output tokens (usage.completion_tokens) for max_tokens 8"
            ),
            "{r:?}"
        );
        let r = play(format!("{}{}data: [DONE]\n\n", step.repeat(3), usage(1)));
        assert!(fails(&r, "streamed 3 steps with text"), "{r:?}");
        let r = play(format!("{}data: [DONE]\n\n", step.repeat(200)));
        assert!(fails(&r, "more than the 8 tokens asked"), "{r:?}");
        assert_eq!(r.itl_s.len(), 8, "nothing read past the ninth token");
        let null = "data: {\"choices\":[{\"text\":null}]}\n\n";
        let r = play(format!("{}data: [DONE]\n\n", null.repeat(2)));
        assert!(fails(&r, "held no token"), "{r:?}");
        let r = play(format!("{}{}data: [DONE]\n\n", step.repeat(8), usage(8)));
        assert_eq!((r.error, r.output_tokens), (None, 8));
    }

    #[test]
    fn an_answer_cut_short_empty_or_malformed_fails_with_its_reason() {
        let cut = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
        let r = timed(Api::Completions, cut, 0.0, 0.0, &[0.1]);
        assert_eq!(r.error.as_deref(), Some("the stream ended without data: [DONE]"));
        assert_eq!(r.ttft_s, Some(0.1), "its timings up to then are kept");

        let empty = "data: [DONE]\n\n";
        let r = timed(Api::Completions, empty, 0.0, 0.0, &[0.1]);
        assert_eq!(r.error.as_deref(), Some("the answer held no token"));
        assert_eq!((r.ttft_s, r.tpot_s), (None, None));

        let bad = "data: {not json\n\ndata: [DONE]\n\n";
        let r = timed(Api::Completions, bad, 0.0, 0.0, &[0.1, 0.2]);
        assert!(
            r.error
                .as_deref()
                .is_some_and(|e| e.starts_with("a streamed chunk is not JSON")),
            "{r:?}"
        );

        let wrong = "data: {\"choices\":[{\"text\":5}]}\n\ndata: [DONE]\n\n";
        let r = timed(Api::Completions, wrong, 0.0, 0.0, &[0.1, 0.2]);
        assert!(r.error.as_deref().is_some_and(|e| e.contains("not text")), "{r:?}");

        let streamed = "data: {\"error\":{\"message\":\"out of KV cache\"}}\n\ndata: [DONE]\n\n";
        let r = timed(Api::Completions, streamed, 0.0, 0.0, &[0.1, 0.2]);
        assert_eq!(
            r.error.as_deref(),
            Some("the server streamed an error: out of KV cache")
        );

        let mut t = TokenTimer::new(Api::Chat, 0.0, 0.0);
        t.fail("HTTP 503".into());
        t.fail("later".into());
        assert_eq!(t.finish().error.as_deref(), Some("HTTP 503"), "the first reason stays");

        // `"error": null` is no error; a failure after [DONE] (a server that holds the
        // connection open) leaves the whole answer a success.
        let null = "data: {\"error\":null,\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n";
        let events = events_in_pieces(null.as_bytes(), 7);
        let mut t = TokenTimer::new(Api::Completions, 0.0, 0.0);
        for e in &events {
            t.event(0.1, e);
        }
        assert!(t.is_done());
        t.fail("timed out".into());
        let r = t.finish();
        assert_eq!((r.error, r.output_tokens), (None, 1));
    }

    #[test]
    fn a_record_round_trips_and_refuses_unknown_fields() {
        let r = timed(Api::Completions, COMPLETION, 1.0, 1.0, &[1.1, 1.2, 1.3, 1.3, 1.3]);
        let text = serde_json::to_string(&r).expect("json");
        assert_eq!(serde_json::from_str::<TokenRecord>(&text).expect("back"), r);
        let extra = text.replacen('{', "{\"x\":1,", 1);
        assert!(serde_json::from_str::<TokenRecord>(&extra).is_err());
    }
}
