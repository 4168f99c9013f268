//! Cumulative latency histograms as Prometheus exposes them, their differences between
//! two scrapes, and quantiles computed exactly as Prometheus' `histogram_quantile`
//! does (promql/quantile.go, `bucketQuantile`): linear interpolation inside the bucket
//! that holds the rank, the lowest bucket starting at 0, and the +Inf bucket answered
//! with the highest finite bound.

/// One cumulative histogram: `(upper bound, count of observations ≤ bound)` pairs in
/// increasing bound order ending with +Inf, plus the sum and count of observations.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Cumulative buckets, sorted by bound, the last one +Inf.
    pub buckets: Vec<(f64, f64)>,
    /// Sum of all observations.
    pub sum: f64,
    /// Number of observations.
    pub count: f64,
}

impl Histogram {
    /// Observations between an earlier snapshot and this one. `None` when the counters
    /// went backwards (the process restarted) or the bucket layouts differ.
    pub fn delta(&self, earlier: &Histogram) -> Option<Histogram> {
        if self.count < earlier.count || self.buckets.len() != earlier.buckets.len() {
            return None;
        }
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for (a, b) in self.buckets.iter().zip(&earlier.buckets) {
            if a.0 != b.0 || a.1 < b.1 {
                return None;
            }
            buckets.push((a.0, a.1 - b.1));
        }
        Some(Histogram {
            buckets,
            sum: self.sum - earlier.sum,
            count: self.count - earlier.count,
        })
    }

    /// Adds `h` to a pooled histogram, or starts the pool with it. False when `h`'s
    /// bucket bounds differ from the pool's: it is left out (the pool is unchanged).
    pub fn pool(pooled: &mut Option<Histogram>, h: Histogram) -> bool {
        match pooled {
            Some(p) => p.add(&h),
            None => {
                *pooled = Some(h);
                true
            }
        }
    }

    /// Adds another histogram with the same bounds (several pods → one cell).
    pub fn add(&mut self, other: &Histogram) -> bool {
        if self.buckets.len() != other.buckets.len() || self.buckets.iter().zip(&other.buckets).any(|(a, b)| a.0 != b.0)
        {
            return false;
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            a.1 += b.1;
        }
        self.sum += other.sum;
        self.count += other.count;
        true
    }

    /// The 95% sampling interval of the q-quantile (distribution-free, by order
    /// statistics: [`super::binomial::quantile_ranks`]), each end read from the histogram
    /// as a quantile at its rank; None for an end the observations cannot bound.
    pub fn quantile_interval(&self, q: f64) -> (Option<f64>, Option<f64>) {
        if self.count.is_nan() || self.count < 1.0 {
            return (None, None);
        }
        let n = self.count.round() as u64;
        let (r, s) = super::binomial::quantile_ranks(n, q, super::binomial::CONFIDENCE);
        // A rank above the last finite bucket lies in +Inf, where a quantile reads the
        // highest finite bound: that is no bound, so that end is left empty.
        let finite_count = self.buckets.iter().rev().find(|b| b.0.is_finite()).map_or(0.0, |b| b.1);
        let at = |rank: Option<u64>| {
            let rank = rank?;
            if rank as f64 > finite_count {
                return None;
            }
            let v = self.quantile(rank as f64 / n as f64);
            v.is_finite().then_some(v)
        };
        (at(r), at(s))
    }

    /// Exact mean: sum / count (NaN without observations).
    pub fn mean(&self) -> f64 {
        if self.count > 0.0 {
            self.sum / self.count
        } else {
            f64::NAN
        }
    }

    /// The resolution of the q-quantile: the relative width (upper / lower bound − 1)
    /// of the bucket it was interpolated in, so how far it can be from the true value.
    /// None when it falls in the first bucket or above the last finite bound.
    pub fn resolution_at(&self, q: f64) -> Option<f64> {
        let v = self.quantile(q);
        if !v.is_finite() {
            return None;
        }
        let b = &self.buckets;
        let i = b.iter().position(|(ub, _)| *ub >= v)?;
        if i == 0 || !b[i].0.is_finite() || b[i - 1].0 <= 0.0 {
            return None;
        }
        Some(b[i].0 / b[i - 1].0 - 1.0)
    }

    /// The bucket that holds `x` (the first whose upper bound is at least `x`): its lower
    /// bound and the count below it, then its upper bound and cumulative count; the
    /// lowest bucket starts at 0. None beyond the last bucket.
    fn bucket_holding(&self, x: f64) -> Option<((f64, f64), (f64, f64))> {
        let mut lower = (0.0, 0.0);
        for &(ub, cum) in &self.buckets {
            if x <= ub {
                return Some((lower, (ub, cum)));
            }
            lower = (ub, cum);
        }
        None
    }

    /// The fraction of observations at or below `x`, interpolated linearly inside the
    /// bucket that holds `x` with the same assumptions as [`quantile`](Self::quantile)
    /// (uniform within a bucket, the lowest bucket starting at 0): the SLO attainment of
    /// a latency target. Observations above the last finite bound count as above `x`.
    /// NaN without observations.
    pub fn fraction_at_most(&self, x: f64) -> f64 {
        if self.count <= 0.0 || x.is_nan() {
            return f64::NAN;
        }
        let Some((lower, (ub, cum))) = self.bucket_holding(x) else {
            return 1.0;
        };
        if !ub.is_finite() {
            // Above the last finite bound nothing is known: count none of it.
            return (lower.1 / self.count).min(1.0);
        }
        let width = ub - lower.0;
        let part = if width > 0.0 {
            (x - lower.0).max(0.0) / width
        } else {
            1.0
        };
        ((lower.1 + part * (cum - lower.1)) / self.count).clamp(0.0, 1.0)
    }

    /// The share of observations in the bucket that holds `x`: how far
    /// [`fraction_at_most`](Self::fraction_at_most) can be from the true share, since it
    /// splits that bucket by interpolation. 0 when `x` is a bucket bound; NaN without
    /// observations.
    pub fn fraction_bound(&self, x: f64) -> f64 {
        if self.count <= 0.0 || x.is_nan() {
            return f64::NAN;
        }
        match self.bucket_holding(x) {
            Some((_, (ub, _))) if x == ub => 0.0,
            Some((lower, (_, cum))) => ((cum - lower.1) / self.count).clamp(0.0, 1.0),
            None => 0.0,
        }
    }

    /// The coarsest resolution of the p50, p90 and p99 (what the rows' quantiles carry).
    pub fn quantile_resolution(&self) -> Option<f64> {
        [0.5, 0.9, 0.99]
            .iter()
            .filter_map(|&q| self.resolution_at(q))
            .reduce(f64::max)
    }

    /// The q-quantile as Prometheus' `histogram_quantile(q, …)` computes it.
    pub fn quantile(&self, q: f64) -> f64 {
        if q.is_nan() {
            return f64::NAN;
        }
        if q < 0.0 {
            return f64::NEG_INFINITY;
        }
        if q > 1.0 {
            return f64::INFINITY;
        }
        let b = &self.buckets;
        if b.len() < 2 || b.last().map(|x| x.0) != Some(f64::INFINITY) {
            return f64::NAN;
        }
        // Prometheus repairs non-monotonic cumulative counts by carrying the maximum.
        let mut counts: Vec<f64> = b.iter().map(|x| x.1).collect();
        for i in 1..counts.len() {
            counts[i] = counts[i].max(counts[i - 1]);
        }
        let total = counts[counts.len() - 1];
        if total == 0.0 {
            return f64::NAN;
        }
        let mut rank = q * total;
        // First bucket (excluding +Inf) whose cumulative count reaches the rank.
        let idx = counts[..counts.len() - 1]
            .iter()
            .position(|&c| c >= rank)
            .unwrap_or(counts.len() - 1);
        if idx == counts.len() - 1 {
            return b[b.len() - 2].0;
        }
        if idx == 0 && b[0].0 <= 0.0 {
            return b[0].0;
        }
        let (start, end) = (if idx == 0 { 0.0 } else { b[idx - 1].0 }, b[idx].0);
        let below = if idx == 0 { 0.0 } else { counts[idx - 1] };
        let in_bucket = counts[idx] - below;
        rank -= below;
        start + (end - start) * (rank / in_bucket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantile_states_the_width_of_the_bucket_it_fell_in() {
        // Buckets 1, 2, 4 ms (ratio 2) then +Inf: p50 in (1, 2] ms, resolution 100%.
        let h = Histogram {
            buckets: vec![(0.001, 0.0), (0.002, 10.0), (0.004, 10.0), (f64::INFINITY, 10.0)],
            sum: 0.015,
            count: 10.0,
        };
        assert_eq!(h.resolution_at(0.5), Some(1.0));
        assert_eq!(h.quantile_resolution(), Some(1.0));
        // All in the first bucket: no lower bound, no stated resolution.
        let first = Histogram {
            buckets: vec![(0.001, 5.0), (f64::INFINITY, 5.0)],
            sum: 0.004,
            count: 5.0,
        };
        assert_eq!(first.resolution_at(0.5), None);
    }

    fn h(buckets: &[(f64, f64)]) -> Histogram {
        Histogram {
            buckets: buckets.to_vec(),
            sum: 0.0,
            count: buckets.last().map_or(0.0, |b| b.1),
        }
    }

    #[test]
    fn a_p99_interval_end_in_the_inf_bucket_is_no_bound() {
        // 400 observations, 3 of them above the last finite bound: the high rank (400)
        // lies in +Inf, so the interval has no upper end; the low one (392) does not.
        let x = h(&[(1.0, 300.0), (2.0, 397.0), (f64::INFINITY, 400.0)]);
        let (lo, hi) = x.quantile_interval(0.99);
        assert!(lo.is_some_and(|v| v > 1.0 && v <= 2.0), "{lo:?}");
        assert_eq!(hi, None);
        let y = h(&[(1.0, 300.0), (2.0, 400.0), (f64::INFINITY, 400.0)]);
        assert!(y.quantile_interval(0.99).1.is_some_and(|v| v <= 2.0));
    }

    // Expected values worked by hand from promql/quantile.go's bucketQuantile, and
    // checked against a real Prometheus server in the PromQL integration test.
    #[test]
    fn quantiles_follow_histogram_quantile() {
        // 10 observations in (0, 1], 30 in (1, 2], 60 in (2, 4].
        let x = h(&[(1.0, 10.0), (2.0, 40.0), (4.0, 100.0), (f64::INFINITY, 100.0)]);
        assert_eq!(x.quantile(0.5), 2.0 + 2.0 * (10.0 / 60.0)); // rank 50: 10 into the 60 of (2,4]
        assert_eq!(x.quantile(0.1), 1.0); // rank 10 lands exactly on the first bound
        assert_eq!(x.quantile(0.05), 0.5); // lowest bucket starts at 0
        assert_eq!(x.quantile(0.25), 1.5);
        assert_eq!(x.quantile(1.0), 4.0);
        assert_eq!(x.quantile(0.0), 0.0);
        assert_eq!(x.quantile(-0.1), f64::NEG_INFINITY);
        assert_eq!(x.quantile(1.1), f64::INFINITY);
        // Observations beyond the last finite bound: answered with that bound.
        let tail = h(&[(1.0, 0.0), (2.0, 10.0), (f64::INFINITY, 100.0)]);
        assert_eq!(tail.quantile(0.99), 2.0);
        // No observations, or no +Inf bucket: NaN.
        assert!(h(&[(1.0, 0.0), (f64::INFINITY, 0.0)]).quantile(0.5).is_nan());
        assert!(h(&[(1.0, 3.0), (2.0, 3.0)]).quantile(0.5).is_nan());
        // Non-monotonic input is repaired by carrying the maximum.
        // Counts become [10, 10, 20, 20]: rank 10 ends the first bucket, rank 15 is half
        // way through (2, 3].
        let bumpy = h(&[(1.0, 10.0), (2.0, 5.0), (3.0, 20.0), (f64::INFINITY, 20.0)]);
        assert_eq!(bumpy.quantile(0.5), 1.0);
        assert_eq!(bumpy.quantile(0.75), 2.5);
    }

    #[test]
    fn the_fraction_at_most_a_latency_is_the_inverse_of_the_quantile() {
        let h = Histogram {
            buckets: vec![(0.1, 10.0), (0.2, 30.0), (0.4, 40.0), (f64::INFINITY, 40.0)],
            sum: 6.0,
            count: 40.0,
        };
        assert_eq!(h.fraction_at_most(0.1), 0.25);
        assert_eq!(h.fraction_at_most(h.quantile(0.5)), 0.5, "the inverse of quantile");
        assert_eq!(h.fraction_at_most(0.15), 0.5, "halfway up the second bucket");
        assert_eq!(h.fraction_at_most(0.05), 0.125, "the first bucket starts at 0");
        assert_eq!(h.fraction_at_most(0.4), 1.0);
        assert_eq!(h.fraction_at_most(9.0), 1.0);
        assert_eq!(h.fraction_at_most(0.0), 0.0);
        let empty = Histogram {
            count: 0.0,
            ..h.clone()
        };
        assert!(empty.fraction_at_most(0.1).is_nan());
    }

    #[test]
    fn delta_add_and_mean() {
        let early = Histogram {
            buckets: vec![(0.1, 1.0), (f64::INFINITY, 2.0)],
            sum: 0.3,
            count: 2.0,
        };
        let late = Histogram {
            buckets: vec![(0.1, 4.0), (f64::INFINITY, 6.0)],
            sum: 0.9,
            count: 6.0,
        };
        let d = late.delta(&early).expect("monotonic");
        assert_eq!(d.buckets, vec![(0.1, 3.0), (f64::INFINITY, 4.0)]);
        assert!((d.mean() - 0.15).abs() < 1e-12);
        assert!(early.delta(&late).is_none(), "a restart shows as counters going back");
        let mut total = d.clone();
        assert!(total.add(&d));
        assert_eq!(total.count, 8.0);
        assert_eq!(total.buckets[0].1, 6.0);
    }
}
