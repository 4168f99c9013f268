//! One streamed request as the harness measured it (`--stream`): the serde record the
//! run keeps per request (`requests.jsonl`) and the token histograms a pod's snapshot
//! carries. The stream's rules are the client's (`client::stream`).

use serde::{Deserialize, Serialize};

use crate::stats::Histogram;

/// One request, streamed: one serde record per request in the run directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    /// When the request was due, seconds from the cell's start (its Poisson arrival,
    /// or when the last answer ended in a closed loop).
    pub arrival_s: f64,
    /// How long after its arrival it was sent (a client behind its schedule).
    pub send_delay_s: f64,
    /// Time to first token, from the arrival (None: no token came).
    pub ttft_s: Option<f64>,
    /// End to end, from the arrival to the last token (None: no token came).
    pub e2e_s: Option<f64>,
    /// Every gap between two steps, in order.
    pub itl_s: Vec<f64>,
    /// Output tokens: the server's `usage.completion_tokens`, else the steps with text
    /// counted (a step holding several tokens counts once: send
    /// `stream_options.include_usage` for the server's count).
    pub output_tokens: u64,
    /// Whether `output_tokens` is the server's count (`usage`) or the steps counted.
    pub tokens_from_usage: bool,
    /// The server's `usage.prompt_tokens`, when it said.
    pub prompt_tokens: Option<u64>,
    /// Time per output token after the first: (e2e − ttft) / (output_tokens − 1), as
    /// vLLM's benchmark defines TPOT (None with fewer than two tokens).
    pub tpot_s: Option<f64>,
    /// Why the request failed (None: it succeeded).
    pub error: Option<String>,
    /// The prompt's tokens as the harness wrote it (None: a body of the user's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_len: Option<u64>,
    /// The `max_tokens` it asked for (None: a body of the user's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
}

/// Seconds to whole microseconds, as every time of a record is kept: finer than a
/// frame's arrival can be read, and a record read back gives the same tallies.
pub fn micros(s: f64) -> f64 {
    (s * 1e6).round() / 1e6
}

/// A pod's token histograms so far (cumulative, as its latency histogram): what decides
/// whether a cell's token objectives are settled.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenHistograms {
    /// Time to first token.
    pub ttft: Histogram,
    /// Every gap between two tokens.
    pub itl: Histogram,
    /// Time per output token after the first, one per request.
    pub tpot: Histogram,
}
