//! Streamed answers' raw records (`--stream`): every request each pod ended while its
//! cell was measured, one line each (`requests.jsonl`), with the cell and pod it
//! belongs to. The token columns of a row are the tally of its pod's lines (`verify`
//! recomputes them from here); the pod's latency windows in `windows.jsonl` hold the
//! same requests' end-to-end latencies.
//!
//! A line: `{"repeat":1,"strategy":"mps","pods":3,"pod":"pod-0","request":{"arrival_s":
//! 12.5,"send_delay_s":0.0,"ttft_s":0.052,"e2e_s":0.61,"itl_s":[0.0044,…],
//! "output_tokens":128,"tokens_from_usage":true,"prompt_tokens":256,"tpot_s":0.0044,
//! "error":null,"prompt_len":256,"max_tokens":128}}`; times in seconds from the cell's
//! start, to the microsecond.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::domain::{Arm, MpsMemory, MpsThreads, Strategy, TimeSliceInterval};
use crate::error::Result;
use crate::metrics::requests::TokenRecord;

/// The file beside windows.jsonl.
pub const REQUESTS_FILE: &str = "requests.jsonl";

/// One streamed request of one pod of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestLine {
    /// Which pass over the plan, from 1.
    pub repeat: u32,
    /// Strategy.
    pub strategy: Strategy,
    /// Time-slicing through DRA: the claims' interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeslice: Option<TimeSliceInterval>,
    /// MPS with `--mps-threads` (absent: auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_threads: Option<MpsThreads>,
    /// MPS with `--mps-memory` (absent: auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_memory: Option<MpsMemory>,
    /// Pods requested.
    pub pods: u32,
    /// The pod, as its row names it.
    pub pod: String,
    /// The request.
    pub request: TokenRecord,
}

impl RequestLine {
    /// A line of the cell `arm` × `pods` (repeat `repeat`).
    pub fn new(repeat: u32, arm: Arm, pods: u32, pod: &str, request: TokenRecord) -> Self {
        Self {
            repeat,
            strategy: arm.strategy,
            timeslice: arm.timeslice,
            mps_threads: Some(arm.mps.threads).filter(|t| *t != MpsThreads::Auto),
            mps_memory: Some(arm.mps.memory).filter(|m| *m != MpsMemory::Auto),
            pods,
            pod: pod.to_string(),
            request,
        }
    }

    /// The arm it measured.
    pub fn arm(&self) -> Arm {
        Arm {
            strategy: self.strategy,
            timeslice: self.timeslice,
            mps: crate::domain::MpsLimits {
                threads: self.mps_threads.unwrap_or_default(),
                memory: self.mps_memory.unwrap_or_default(),
            },
        }
    }
}

/// The most tokens one request may record (a million-token answer).
pub const MAX_TOKENS: u64 = 1 << 20;

impl RequestLine {
    /// Whether the line is one a run could have written: times finite and from 0, the
    /// end no earlier than the first token, token counts bounded (pure).
    pub fn check(&self) -> std::result::Result<(), String> {
        use crate::results::jsonl::{MAX_SECONDS, check_seconds};
        let r = &self.request;
        let at = |what: &str| format!("pod {}: {what}", self.pod);
        check_seconds(&at("arrival_s"), r.arrival_s)?;
        check_seconds(&at("send_delay_s"), r.send_delay_s)?;
        for (what, v) in [("ttft_s", r.ttft_s), ("e2e_s", r.e2e_s), ("tpot_s", r.tpot_s)] {
            if let Some(v) = v {
                check_seconds(&at(what), v)?;
            }
        }
        if let (Some(ttft), Some(e2e)) = (r.ttft_s, r.e2e_s)
            && e2e < ttft
        {
            return Err(at(&format!("e2e_s {e2e} is before its first token (ttft_s {ttft})")));
        }
        let counts = [Some(r.output_tokens), r.prompt_tokens, r.prompt_len, r.max_tokens];
        if counts.into_iter().flatten().any(|n| n > MAX_TOKENS) || r.itl_s.len() as u64 > MAX_TOKENS {
            return Err(at(&format!("a token count above {MAX_TOKENS}")));
        }
        if r.itl_s
            .iter()
            .any(|&g| !g.is_finite() || !(0.0..=MAX_SECONDS).contains(&g))
        {
            return Err(at("an inter-token gap that is not seconds from 0"));
        }
        Ok(())
    }
}

/// The lines as JSON lines (pure).
pub fn requests_jsonl(lines: &[RequestLine]) -> Vec<u8> {
    crate::results::jsonl::to_jsonl(lines)
}

/// Reads a run's `requests.jsonl` (missing: a run whose answers were not streamed, or
/// that measured nothing yet: none). A line that does not parse is an error naming the
/// file and line.
pub fn read_requests(dir: &Path) -> Result<Vec<RequestLine>> {
    crate::results::jsonl::read_jsonl(&dir.join(REQUESTS_FILE), RequestLine::check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back_as_written_and_a_bad_line_is_named() {
        let record = TokenRecord {
            arrival_s: 1.5,
            send_delay_s: 0.0,
            ttft_s: Some(0.052),
            e2e_s: Some(0.061),
            itl_s: vec![0.004, 0.005],
            output_tokens: 3,
            tokens_from_usage: true,
            prompt_tokens: Some(16),
            tpot_s: Some(0.0045),
            error: None,
            prompt_len: Some(16),
            max_tokens: Some(3),
        };
        let arm = Arm::from(Strategy::Mps);
        let lines = vec![RequestLine::new(1, arm, 3, "pod-0", record)];
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(REQUESTS_FILE), requests_jsonl(&lines)).expect("write");
        assert_eq!(read_requests(dir.path()).expect("read"), lines);
        assert_eq!(lines[0].arm(), arm);
        std::fs::write(dir.path().join(REQUESTS_FILE), b"{\"repeat\":1}\n").expect("write");
        let e = read_requests(dir.path()).expect_err("bad").to_string();
        assert!(e.contains("requests.jsonl") && e.contains("line 1"), "{e}");
        assert_eq!(read_requests(&dir.path().join("none")).expect("missing"), Vec::new());
    }
}
