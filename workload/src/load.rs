//! Load patterns: the reference study's closed loop (the next inference starts when the
//! last one returns) or an open loop with Poisson arrivals, where latency includes the
//! time a request waits in the queue.

use std::fmt;
use std::str::FromStr;

use crate::error::WorkloadError;
use crate::rng::SplitMix64;

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadPattern {
    /// Back to back.
    Closed,
    /// Poisson arrivals at `rate` per second.
    Poisson {
        /// Mean arrivals per second.
        rate: f64,
    },
}

impl FromStr for LoadPattern {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| WorkloadError::BadLoad {
            value: s.to_string(),
            reason: reason.to_string(),
        };
        if s == "closed" {
            return Ok(LoadPattern::Closed);
        }
        let Some(rate) = s.strip_prefix("poisson:") else {
            return Err(bad("unknown pattern"));
        };
        let rate: f64 = rate.parse().map_err(|_| bad("RATE is not a number"))?;
        if !rate.is_finite() || rate <= 0.0 {
            return Err(bad("RATE must be a positive number"));
        }
        if rate > 1e6 {
            return Err(bad("RATE above 1000000 per second"));
        }
        Ok(LoadPattern::Poisson { rate })
    }
}

impl fmt::Display for LoadPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadPattern::Closed => f.write_str("closed"),
            LoadPattern::Poisson { rate } => write!(f, "poisson:{rate}"),
        }
    }
}

/// The seed of a pod's arrival times when none is given (pure): `seed` (the model's)
/// mixed with the pod's name, so pods of one cell draw independent arrivals, and a pod
/// of the same name and seed draws the same ones again.
pub fn arrival_seed(seed: u64, pod: &str) -> u64 {
    // FNV-1a over the name, then one SplitMix64 step over both.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in pod.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    SplitMix64::new(seed ^ h).next_u64()
}

/// Arrival times of a Poisson process, in seconds from the start: exponential gaps
/// drawn from a seeded generator, so a run can be repeated exactly.
#[derive(Debug, Clone)]
pub struct ArrivalSchedule {
    rng: SplitMix64,
    rate: f64,
    next: f64,
}

impl ArrivalSchedule {
    /// Starts at time 0.
    pub fn new(rate: f64, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let next = rng.next_exponential(rate);
        Self { rng, rate, next }
    }

    /// When the next request arrives.
    pub fn peek(&self) -> f64 {
        self.next
    }

    /// Takes the next arrival time and draws the one after.
    pub fn pop(&mut self) -> f64 {
        let t = self.next;
        self.next += self.rng.next_exponential(self.rate);
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_draw_independent_arrivals_and_a_long_run_meets_its_rate() {
        let (a, b) = (arrival_seed(7, "pod-0"), arrival_seed(7, "pod-1"));
        assert_ne!(a, b);
        assert_eq!(a, arrival_seed(7, "pod-0"), "the same name and seed, the same stream");
        assert_ne!(a, arrival_seed(8, "pod-0"));
        let (mut x, mut y) = (ArrivalSchedule::new(100.0, a), ArrivalSchedule::new(100.0, b));
        let xs: Vec<f64> = (0..1000).map(|_| x.pop()).collect();
        let ys: Vec<f64> = (0..1000).map(|_| y.pop()).collect();
        let same = xs.iter().zip(&ys).filter(|(p, q)| (*p - *q).abs() < 1e-9).count();
        assert_eq!(same, 0, "no arrival at the same instant");
        // 200 000 arrivals at 100/s: the achieved rate is within 1% of the offered one
        // (its standard error is 100/sqrt(200000) = 0.22/s).
        let mut long = ArrivalSchedule::new(100.0, a);
        let mut last = 0.0;
        for _ in 0..200_000 {
            last = long.pop();
        }
        let achieved = 200_000.0 / last;
        assert!((achieved - 100.0).abs() < 1.0, "{achieved}");
    }

    #[test]
    fn parses_patterns_and_names_bad_ones() {
        assert_eq!("closed".parse::<LoadPattern>().ok(), Some(LoadPattern::Closed));
        assert_eq!(
            "poisson:12.5".parse::<LoadPattern>().ok(),
            Some(LoadPattern::Poisson { rate: 12.5 })
        );
        for bad in [
            "open",
            "poisson:",
            "poisson:-3",
            "poisson:abc",
            "poisson:0",
            "poisson:inf",
        ] {
            let msg = bad
                .parse::<LoadPattern>()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(msg.contains(&format!("`{bad}`")), "{bad}: {msg}");
        }
    }

    #[test]
    fn arrivals_come_at_the_requested_rate() {
        let mut s = ArrivalSchedule::new(200.0, 9);
        let mut last = 0.0;
        let n = 20_000;
        for _ in 0..n {
            let t = s.pop();
            assert!(t >= last);
            last = t;
        }
        // n arrivals at 200/s take about 100 s (±1% at this n).
        assert!((last - 100.0).abs() < 1.5, "{last}");
    }
}
