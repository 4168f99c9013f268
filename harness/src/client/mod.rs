//! The harness's own load generator for a server that waits for requests
//! (`--request URL --body FILE` with `--workload-cmd`): per pod, requests in a closed
//! loop or at Poisson arrivals (`--load`), each timed by the harness into a histogram
//! with gpushare-workload's bucket bounds, read as the cell's statistics in place of a
//! scrape ([`source::RequestSource`]). Rows then say `source = client`.
//!
//! This module is the pure part: the bucket layout, the tally of one pod and the arrival
//! gaps (the recorded plan is `config::request::RequestPlan`). For servers that stream
//! tokens (OpenAI-compatible completions), [`stream`] reads an answer's events into one
//! record per request (time to first token, the gaps between tokens, end to end) and
//! [`tokens`] tallies them per metric, with goodput against objectives on several
//! metrics at once; [`stream_http`] sends streamed requests (one, or a pod's Poisson
//! arrivals) and times each answer as it arrives.

pub mod prompt;
pub mod source;
pub mod stream;
pub mod stream_http;
pub mod tokens;

pub use crate::config::request::RequestPlan;
use crate::stats::Histogram;

/// Bucket bounds per doubling, as gpushare-workload's histogram (the bounds of a native
/// histogram of schema 5): a quantile is off by at most 2^(1/32) − 1 = 2.2%.
const PER_DOUBLING: i32 = 32;
/// The lowest bound, 2^-17 s (7.6 µs), and the highest, 2^6 s (64 s), then +Inf.
const LOWEST: i32 = -17 * PER_DOUBLING;
const HIGHEST: i32 = 6 * PER_DOUBLING;

fn bound(k: i32) -> f64 {
    2f64.powf(f64::from(k) / f64::from(PER_DOUBLING))
}

/// One pod's requests so far: latencies in gpushare-workload's buckets, and failures.
#[derive(Debug, Clone, PartialEq)]
pub struct Tally {
    /// Observations per bucket (not cumulative); the last is +Inf.
    counts: Vec<u64>,
    sum: f64,
    /// Requests that failed (no answer, a non-2xx answer, a timeout) or arrivals
    /// dropped because too many were in flight.
    pub errors: u64,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            counts: vec![0; (HIGHEST - LOWEST + 2) as usize],
            sum: 0.0,
            errors: 0,
        }
    }
}

impl Tally {
    /// Records one answered request of `seconds`.
    pub fn observe(&mut self, seconds: f64) {
        let s = seconds.max(0.0);
        // The first bound ≥ s (`le` semantics), corrected for rounding of log2.
        let mut k = (s.log2() * f64::from(PER_DOUBLING))
            .ceil()
            .clamp(f64::from(LOWEST), f64::from(HIGHEST + 1)) as i32;
        while k > LOWEST && bound(k - 1) >= s {
            k -= 1;
        }
        while k <= HIGHEST && bound(k) < s {
            k += 1;
        }
        self.counts[(k - LOWEST) as usize] += 1;
        self.sum += s;
    }

    /// Adds another tally's observations.
    pub fn merge(&mut self, other: &Tally) {
        for (c, o) in self.counts.iter_mut().zip(&other.counts) {
            *c += o;
        }
        self.sum += other.sum;
        self.errors += other.errors;
    }

    /// The cumulative histogram, as a scrape would read it.
    pub fn histogram(&self) -> Histogram {
        let mut total = 0u64;
        let buckets = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                total += c;
                let k = LOWEST + i as i32;
                let le = if k > HIGHEST { f64::INFINITY } else { bound(k) };
                (le, total as f64)
            })
            .collect();
        Histogram {
            buckets,
            sum: self.sum,
            count: total as f64,
        }
    }
}

/// SplitMix64: the harness's seeded random numbers (arrival gaps, token counts).
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// Numbers from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A whole number from `low` to `high`, both included (uniform but for a bias
    /// below 2^-32 for the ranges used here).
    pub fn between(&mut self, low: u32, high: u32) -> u32 {
        let span = u64::from(high.saturating_sub(low)) + 1;
        low + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as u32
    }
}

/// Poisson arrival gaps, seeded per pod and recorded (as gpushare-workload's
/// `load_seed`).
#[derive(Debug, Clone)]
pub struct Arrivals {
    rng: SplitMix,
    rate: f64,
}

impl Arrivals {
    /// Poisson arrivals at `rate` per second from `seed`.
    pub fn new(seed: u64, rate: f64) -> Self {
        Self {
            rng: SplitMix::new(seed),
            rate,
        }
    }

    /// The seconds to the next arrival: exponential with mean 1/rate.
    pub fn gap(&mut self) -> f64 {
        // u in (0, 1]: 53 random bits, never 0 so the logarithm is finite.
        let u = ((self.rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        -u.ln() / self.rate
    }
}

/// A new random seed (std's per-process random hasher keys, the clock and the pod's
/// index): different for every launch, recorded by the pod (`workload_info{load_seed}`)
/// or by the harness's own request generator.
pub fn fresh_seed(index: u32) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(index);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_workloads_buckets_with_le_semantics() {
        let mut t = Tally::default();
        // Exact bounds go to their own bucket; a hair above goes to the next.
        t.observe(0.5); // 2^-1, k = -32
        t.observe(0.5 * 1.0001);
        t.observe(1e-9); // below the lowest bound
        t.observe(1000.0); // above the highest: +Inf
        let h = t.histogram();
        assert_eq!(h.buckets.len(), 738, "737 bounds and +Inf, as the workload");
        assert_eq!(h.count, 4.0);
        let at = |le: f64| h.buckets.iter().find(|b| b.0 == le).expect("bound").1;
        assert_eq!(at(bound(LOWEST)), 1.0, "the tiny one");
        assert_eq!(at(0.5), 2.0, "0.5 itself is ≤ 0.5");
        assert_eq!(at(bound(-31)), 3.0, "the one just above 0.5");
        assert_eq!(at(64.0), 3.0);
        assert_eq!(h.buckets.last().map(|b| b.1), Some(4.0));
        assert!(h.buckets.last().is_some_and(|b| b.0.is_infinite()));
        assert!((h.sum - (0.5 + 0.50005 + 1e-9 + 1000.0)).abs() < 1e-9);
        // The same bounds as gpushare-workload (workload/src/metrics.rs): 2^(k/32).
        assert_eq!(h.buckets[0].0, 2f64.powf(-17.0));
        assert_eq!(h.buckets[736].0, 64.0);
    }

    #[test]
    fn quantiles_of_the_tally_are_within_a_bucket_of_the_truth() {
        let mut t = Tally::default();
        for i in 1..=1000 {
            t.observe(f64::from(i) * 1e-5); // 10 µs … 10 ms, uniform
        }
        let h = t.histogram();
        let p50 = h.quantile(0.5);
        assert!((p50 / 0.005 - 1.0).abs() < 0.022, "{p50}");
        assert!((h.mean() - 0.005005).abs() < 1e-9);
    }

    #[test]
    fn arrival_gaps_have_the_rates_mean_and_repeat_with_the_seed() {
        let mut a = Arrivals::new(7, 200.0);
        let n = 20_000;
        let gaps: Vec<f64> = (0..n).map(|_| a.gap()).collect();
        let mean = gaps.iter().sum::<f64>() / f64::from(n);
        // Exponential: mean 1/rate = 5 ms, standard error 5 ms/√n = 0.035 ms.
        assert!((mean - 0.005).abs() < 0.0002, "{mean}");
        assert!(gaps.iter().all(|g| g.is_finite() && *g >= 0.0));
        let mut again = Arrivals::new(7, 200.0);
        assert_eq!(again.gap(), gaps[0]);
        assert_ne!(Arrivals::new(8, 200.0).gap(), gaps[0]);
    }

    #[test]
    fn the_plan_names_the_bad_flag() {
        let err = |url: &str| RequestPlan::new(url, None).expect_err(url);
        assert_eq!(err("https://127.0.0.1:{port}/infer").0, "--request");
        assert!(err("http://127.0.0.1:9400/infer").2.contains("{port}"));
        assert!(err("http://:{port}/x").2.contains("needs a host"));
        assert!(err("http://127.0.0.1:8000/x?p={port}").2.contains("{port} as its port"));
        let ok = RequestPlan::new("http://127.0.0.1:{port}/infer", None).expect("ok");
        assert_eq!(ok.url_for(9401), "http://127.0.0.1:9401/infer");
        assert_eq!(ok.read_body(), Ok(None));

        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope.json");
        let e = RequestPlan::new("http://127.0.0.1:{port}/infer", Some(&missing)).expect_err("missing");
        assert_eq!(e.0, "--body");
        assert!(e.2.starts_with("cannot read"), "{}", e.2);
        let e = RequestPlan::new("http://127.0.0.1:{port}/infer", Some(dir.path())).expect_err("a directory");
        assert_eq!(e.2, "not a file");

        let body = dir.path().join("req.json");
        std::fs::write(&body, b"{\"x\": 1}").expect("write");
        let p = RequestPlan::new("http://127.0.0.1:{port}/infer", Some(&body)).expect("ok");
        assert_eq!((p.body_bytes, p.content_type()), (8, "application/json"));
        assert_eq!(p.read_body(), Ok(Some(b"{\"x\": 1}".to_vec())));
        std::fs::write(&body, b"{}").expect("write");
        assert!(
            p.read_body()
                .expect_err("changed")
                .contains("2 bytes now, 8 when the run began")
        );
    }
}
