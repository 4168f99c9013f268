//! One pod's streamed requests tallied per token metric, in gpushare-workload's fine
//! buckets (each a [`Tally`], so every quantile states the same ±2.2% resolution), and
//! goodput against objectives on several metrics at once. Pure.
//!
//! Goodput is vLLM's (`benchmarks/serve.py`, `--goodput`): the requests per second
//! that met every objective, each judged on its own numbers: its time to first token,
//! its time per output token after the first (TPOT, the per-request figure an
//! inter-token objective is judged on, as vLLM does) and its end-to-end latency. A
//! failed request meets none.

use super::Tally;
use super::stream::TokenRecord;
use crate::config::values::{Slo, SloMetric};
use crate::stats::Histogram;

/// What one request must meet to count in goodput (None: no objective on that metric).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestObjectives {
    /// Time to first token, seconds.
    pub ttft_s: Option<f64>,
    /// Time per output token after the first, seconds (a request with one token has
    /// none and meets it).
    pub tpot_s: Option<f64>,
    /// End to end, seconds.
    pub e2e_s: Option<f64>,
}

impl RequestObjectives {
    /// The objectives `--slo` sets on each request, as vLLM's `--goodput` judges them:
    /// per metric the tightest threshold given; an inter-token objective is judged on
    /// the request's TPOT (a TPOT objective given too takes its place).
    pub fn from_slos(slos: &[Slo]) -> Self {
        let tightest = |m: SloMetric| {
            slos.iter()
                .filter(|s| s.metric == m)
                .map(|s| s.threshold.as_secs_f64())
                .reduce(f64::min)
        };
        RequestObjectives {
            ttft_s: tightest(SloMetric::Ttft),
            tpot_s: tightest(SloMetric::Tpot).or(tightest(SloMetric::Itl)),
            e2e_s: tightest(SloMetric::Latency),
        }
    }

    /// Whether `r` met every objective.
    pub fn met_by(&self, r: &TokenRecord) -> bool {
        if r.error.is_some() {
            return false;
        }
        let within = |limit: Option<f64>, value: Option<f64>| match (limit, value) {
            (None, _) => true,
            (Some(l), Some(v)) => v <= l,
            (Some(_), None) => false,
        };
        // A request of one token has no TPOT: nothing to judge it on.
        let tpot_ok = match (self.tpot_s, r.tpot_s) {
            (Some(limit), Some(t)) => t <= limit,
            _ => true,
        };
        within(self.ttft_s, r.ttft_s) && within(self.e2e_s, r.e2e_s) && tpot_ok
    }
}

/// One pod's streamed requests so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenTally {
    /// Time to first token of every request that got one.
    pub ttft: Tally,
    /// Every gap between two tokens, of every request.
    pub itl: Tally,
    /// Time per output token after the first, one per request with two or more.
    pub tpot: Tally,
    /// End to end, of every request that got a token.
    pub e2e: Tally,
    /// Requests that completed without error.
    pub completed: u64,
    /// Output tokens of the completed requests.
    pub output_tokens: u64,
    /// Requests that met every objective (see [`RequestObjectives`]).
    pub good: u64,
}

impl TokenTally {
    /// The tally of `records`.
    pub fn of<'a>(records: impl IntoIterator<Item = &'a TokenRecord>, objectives: &RequestObjectives) -> Self {
        let mut t = Self::default();
        for r in records {
            t.add(r, objectives);
        }
        t
    }

    /// The histogram an objective on `metric` is judged on (latency: end to end).
    pub fn histogram(&self, metric: SloMetric) -> Histogram {
        match metric {
            SloMetric::Latency => self.e2e.histogram(),
            SloMetric::Ttft => self.ttft.histogram(),
            SloMetric::Itl => self.itl.histogram(),
            SloMetric::Tpot => self.tpot.histogram(),
        }
    }

    /// Adds one request. A failed request counts in `ttft.errors` (the tallies' error
    /// count is the pod's), its timings up to the failure not observed.
    pub fn add(&mut self, r: &TokenRecord, objectives: &RequestObjectives) {
        if r.error.is_some() {
            self.ttft.errors += 1;
            return;
        }
        if let Some(t) = r.ttft_s {
            self.ttft.observe(t);
        }
        for g in &r.itl_s {
            self.itl.observe(*g);
        }
        if let Some(t) = r.tpot_s {
            self.tpot.observe(t);
        }
        if let Some(e) = r.e2e_s {
            self.e2e.observe(e);
        }
        self.completed += 1;
        self.output_tokens += r.output_tokens;
        if objectives.met_by(r) {
            self.good += 1;
        }
    }

    /// Adds another pod's tally (the cell's pooled one).
    pub fn merge(&mut self, other: &TokenTally) {
        self.ttft.merge(&other.ttft);
        self.itl.merge(&other.itl);
        self.tpot.merge(&other.tpot);
        self.e2e.merge(&other.e2e);
        self.completed += other.completed;
        self.output_tokens += other.output_tokens;
        self.good += other.good;
    }

    /// Requests that failed.
    pub fn errors(&self) -> u64 {
        self.ttft.errors
    }

    /// Goodput over `seconds`: requests per second that met every objective.
    pub fn goodput_per_s(&self, seconds: f64) -> Option<f64> {
        (seconds > 0.0).then(|| self.good as f64 / seconds)
    }

    /// Output tokens per second over `seconds`.
    pub fn tokens_per_s(&self, seconds: f64) -> Option<f64> {
        (seconds > 0.0).then(|| self.output_tokens as f64 / seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ttft: f64, gaps: &[f64], error: Option<&str>) -> TokenRecord {
        let e2e = ttft + gaps.iter().sum::<f64>();
        let tokens = gaps.len() as u64 + 1;
        TokenRecord {
            arrival_s: 0.0,
            send_delay_s: 0.0,
            ttft_s: Some(ttft),
            e2e_s: Some(e2e),
            itl_s: gaps.to_vec(),
            output_tokens: tokens,
            tokens_from_usage: false,
            prompt_tokens: None,
            tpot_s: (tokens > 1).then(|| (e2e - ttft) / (tokens - 1) as f64),
            error: error.map(str::to_string),
            prompt_len: None,
            max_tokens: None,
        }
    }

    #[test]
    fn goodput_counts_the_requests_that_met_every_objective() {
        let objectives = RequestObjectives {
            ttft_s: Some(0.5),
            tpot_s: Some(0.05),
            e2e_s: None,
        };
        let mut t = TokenTally::default();
        // Meets both; misses TTFT; misses TPOT (mean gap 0.06 although one gap is
        // 0.04); one token only (no TPOT, meets it); failed.
        t.add(&record(0.2, &[0.04, 0.05], None), &objectives);
        t.add(&record(0.6, &[0.01], None), &objectives);
        t.add(&record(0.1, &[0.04, 0.08], None), &objectives);
        t.add(&record(0.3, &[], None), &objectives);
        t.add(&record(0.1, &[0.01], Some("HTTP 503")), &objectives);
        assert_eq!((t.completed, t.good, t.errors()), (4, 2, 1));
        assert_eq!(t.output_tokens, 3 + 2 + 3 + 1);
        assert_eq!(t.ttft.histogram().count, 4.0);
        assert_eq!(t.itl.histogram().count, 5.0, "every gap of every completed request");
        assert_eq!(t.tpot.histogram().count, 3.0, "one per request of two tokens or more");
        assert_eq!(t.goodput_per_s(2.0), Some(1.0));
        assert_eq!(t.tokens_per_s(3.0), Some(3.0));
        assert_eq!(t.goodput_per_s(0.0), None);
    }

    #[test]
    fn without_objectives_every_completed_request_is_good() {
        let mut t = TokenTally::default();
        t.add(&record(9.0, &[1.0], None), &RequestObjectives::default());
        t.add(&record(0.1, &[], Some("cut")), &RequestObjectives::default());
        assert_eq!((t.good, t.completed), (1, 1));
    }
}
