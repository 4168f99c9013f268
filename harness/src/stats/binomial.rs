//! Confidence for a share of requests: the one-sided Clopper–Pearson bounds of a
//! binomial proportion (Clopper and Pearson, Biometrika 26(4), 1934), the exact
//! binomial rule of the kind MLPerf Inference's early stopping applies to a tail
//! latency. Pure arithmetic: the regularized incomplete beta function by its continued
//! fraction (Lentz's method), inverted by bisection. Counts may be fractional (an
//! attainment interpolated inside a histogram bucket), which the beta form allows.

/// The confidence of every bound the capacity rule uses: one-sided 95%.
pub const CONFIDENCE: f64 = 0.95;

/// How the bounds are computed, in the words the report and docs print.
pub const METHOD: &str = "one-sided 95% Clopper–Pearson bounds of each pod's attainment (an exact binomial rule, as in MLPerf Inference's early stopping)";

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms: relative error below 1e-13).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1−x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let sum = G[1..]
        .iter()
        .enumerate()
        .fold(G[0], |acc, (i, g)| acc + g / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// The continued fraction of the incomplete beta function (modified Lentz).
fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..=10_000 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        d = if d.abs() < TINY { TINY } else { d };
        c = 1.0 + aa / c;
        c = if c.abs() < TINY { TINY } else { c };
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        d = if d.abs() < TINY { TINY } else { d };
        c = 1.0 + aa / c;
        c = if c.abs() < TINY { TINY } else { c };
        d = 1.0 / d;
        let step = d * c;
        h *= step;
        if (step - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// The regularized incomplete beta function I_x(a, b), for a, b > 0 and x in [0, 1].
pub fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    let front = ln_front.exp();
    // The fraction converges fast for x below (a+1)/(a+b+2); use the symmetry above it.
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(x, a, b) / a
    } else {
        1.0 - front * beta_fraction(1.0 - x, b, a) / b
    }
}

/// The p in [0, 1] where I_p(a, b) = target (bisection: I is increasing in p).
fn inverse_beta(target: f64, a: f64, b: f64) -> f64 {
    let (mut lo, mut hi) = (0.0_f64, 1.0_f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if incomplete_beta(mid, a, b) < target {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo < 1e-12 {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// The one-sided lower bound, at `confidence`, of a proportion seen as `successes` of
/// `trials`: the p at which seeing at least that many has probability 1 − confidence.
/// 0 with no success or no trial.
pub fn lower_bound(successes: f64, trials: f64, confidence: f64) -> f64 {
    if trials.is_nan() || successes.is_nan() || trials <= 0.0 || successes <= 0.0 {
        return 0.0;
    }
    let k = successes.min(trials);
    inverse_beta(1.0 - confidence, k, trials - k + 1.0)
}

/// The one-sided upper bound, at `confidence`, of a proportion seen as `successes` of
/// `trials`: the p at which seeing at most that many has probability 1 − confidence.
/// 1 when every trial succeeded or there was none.
pub fn upper_bound(successes: f64, trials: f64, confidence: f64) -> f64 {
    if trials.is_nan() || trials <= 0.0 || successes >= trials {
        return 1.0;
    }
    let k = successes.max(0.0);
    inverse_beta(confidence, k + 1.0, trials - k)
}

/// The one-sided bounds, at [`CONFIDENCE`], of an attainment `a` of `n` requests read
/// from a histogram that may be off by `bound` (pure): the lower bound of the lowest
/// reading, the upper bound of the highest. Without a count, only the interpolation
/// bound.
pub fn attainment_bounds(a: f64, bound: f64, n: f64) -> (f64, f64) {
    let (worst, best) = ((a - bound).max(0.0), (a + bound).min(1.0));
    if n.is_nan() || n <= 0.0 {
        return (worst, best);
    }
    (
        lower_bound(worst * n, n, CONFIDENCE),
        upper_bound(best * n, n, CONFIDENCE),
    )
}

/// P(X ≤ k) for X ~ Binomial(n, p) (k and n whole numbers, as f64).
pub fn binomial_cdf(k: f64, n: f64, p: f64) -> f64 {
    if k < 0.0 {
        0.0
    } else if k >= n {
        1.0
    } else {
        1.0 - incomplete_beta(p, k + 1.0, n - k)
    }
}

/// The ranks (1-based order statistics) that bracket the `q`-quantile of `n` samples
/// with `confidence` (pure), distribution-free: the r-th and s-th smallest samples
/// cover the true quantile with probability at least `confidence`, where r is the
/// largest rank with P(B < r) ≤ (1 − confidence)/2 and s the smallest with
/// P(B < s) ≥ (1 + confidence)/2, B ~ Binomial(n, q) the samples below it. None for
/// a side that needs a rank outside 1…n (too few samples to bound it).
pub fn quantile_ranks(n: u64, q: f64, confidence: f64) -> (Option<u64>, Option<u64>) {
    let tail = (1.0 - confidence) / 2.0;
    let nf = n as f64;
    let below = |r: u64| binomial_cdf(r as f64 - 1.0, nf, q);
    // The largest r in 1..=n with P(B ≤ r−1) ≤ tail (P is increasing in r).
    // Midpoints as lo + half the gap: no sum of two ranks can overflow.
    let (mut lo, mut hi) = (0u64, n);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if below(mid) <= tail { lo = mid } else { hi = mid - 1 }
    }
    let r = (lo >= 1).then_some(lo);
    // The smallest s in 1..=n with P(B ≤ s−1) ≥ 1 − tail.
    let (mut lo, mut hi) = (1u64, n.saturating_add(1));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if below(mid) >= 1.0 - tail {
            hi = mid
        } else {
            lo = mid + 1
        }
    }
    let s = (lo <= n).then_some(lo);
    (r, s)
}

/// The fewest requests a pod must complete, all within its threshold, for the lower
/// bound of its attainment to reach `quantile`: (1 − confidence)^(1/n) ≥ quantile.
/// A p99 needs 299 at 95% confidence; a pod with any miss needs more.
pub fn requests_to_show(quantile: f64, confidence: f64) -> u64 {
    if quantile.is_nan() || quantile <= 0.0 || quantile >= 1.0 {
        return 1;
    }
    ((1.0 - confidence).ln() / quantile.ln()).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P(X ≤ k) for X ~ Binomial(n, p), summed term by term in logs.
    fn binomial_cdf(k: u64, n: u64, p: f64) -> f64 {
        let ln_choose = |i: u64| ln_gamma(n as f64 + 1.0) - ln_gamma(i as f64 + 1.0) - ln_gamma((n - i) as f64 + 1.0);
        (0..=k)
            .map(|i| (ln_choose(i) + i as f64 * p.ln() + (n - i) as f64 * (1.0 - p).ln()).exp())
            .sum()
    }

    #[test]
    fn ln_gamma_matches_factorials() {
        for (x, f) in [(1.0, 1.0f64), (2.0, 1.0), (5.0, 24.0), (11.0, 3_628_800.0)] {
            assert!((ln_gamma(x) - f.ln()).abs() < 1e-10, "{x}");
        }
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-10);
    }

    #[test]
    fn the_incomplete_beta_is_the_binomial_tail() {
        // P(X ≤ k) = 1 − I_p(k+1, n−k).
        for (k, n, p) in [(13u64, 1817u64, 0.01), (0, 10, 0.3), (7, 20, 0.5), (290, 300, 0.98)] {
            let by_sum = binomial_cdf(k, n, p);
            let by_beta = 1.0 - incomplete_beta(p, k as f64 + 1.0, (n - k) as f64);
            assert!((by_sum - by_beta).abs() < 1e-9, "{k}/{n} at {p}: {by_sum} vs {by_beta}");
        }
    }

    #[test]
    fn bounds_are_where_the_binomial_tails_reach_five_percent() {
        let (n, k) = (1817u64, 1804u64);
        let lo = lower_bound(k as f64, n as f64, CONFIDENCE);
        let hi = upper_bound(k as f64, n as f64, CONFIDENCE);
        // At the lower bound of the success share, seeing ≥ k successes is 5% likely,
        // i.e. seeing ≤ n−k misses when the miss rate is 1 − lo.
        assert!((binomial_cdf(n - k, n, 1.0 - lo) - 0.05).abs() < 1e-6, "{lo}");
        // At the upper bound, seeing ≤ k successes is 5% likely: ≥ n−k misses.
        assert!((1.0 - binomial_cdf(n - k - 1, n, 1.0 - hi) - 0.05).abs() < 1e-6, "{hi}");
        assert!(lo < 1804.0 / 1817.0 && 1804.0 / 1817.0 < hi);
        // No success, no trial, all successes.
        assert_eq!(lower_bound(0.0, 10.0, CONFIDENCE), 0.0);
        assert_eq!(upper_bound(10.0, 10.0, CONFIDENCE), 1.0);
        assert_eq!(
            (lower_bound(1.0, 0.0, CONFIDENCE), upper_bound(0.0, 0.0, CONFIDENCE)),
            (0.0, 1.0)
        );
        // All n successes: the lower bound is 0.05^(1/n).
        assert!((lower_bound(300.0, 300.0, CONFIDENCE) - 0.05f64.powf(1.0 / 300.0)).abs() < 1e-9);
    }

    #[test]
    fn a_quantiles_interval_is_the_order_statistics_the_binomial_brackets() {
        // The median of 100 samples: ranks 40 and 61 (every table's values).
        assert_eq!(quantile_ranks(100, 0.5, 0.95), (Some(40), Some(61)));
        // p99 of 1,000: ranks 983 and 997 (the 18th and 4th largest samples).
        let (r, s) = quantile_ranks(1000, 0.99, 0.95);
        let (r, s) = (r.expect("r"), s.expect("s"));
        assert!(super::binomial_cdf(r as f64 - 1.0, 1000.0, 0.99) <= 0.025);
        assert!(super::binomial_cdf(r as f64, 1000.0, 0.99) > 0.025);
        assert!(super::binomial_cdf(s as f64 - 1.0, 1000.0, 0.99) >= 0.975);
        assert!(super::binomial_cdf(s as f64 - 2.0, 1000.0, 0.99) < 0.975);
        assert_eq!((r, s), (983, 997));
        // p99 cannot be bounded above below 368 samples: 0.99^n must fall under 2.5%.
        assert_eq!(quantile_ranks(367, 0.99, 0.95).1, None);
        assert_eq!(quantile_ranks(368, 0.99, 0.95).1, Some(368));
        assert_eq!(quantile_ranks(0, 0.99, 0.95), (None, None));
    }

    #[test]
    fn the_largest_count_ends_its_search_with_ranks_inside_it() {
        // A search of u64's whole range: no rank sum overflows (a debug build panics
        // on one, a release build wraps and searches for ever).
        let (r, s) = quantile_ranks(u64::MAX, 0.99, 0.95);
        if let (Some(r), Some(s)) = (r, s) {
            assert!(r <= s, "ranks {r} and {s}");
        }
    }

    #[test]
    fn a_p99_needs_299_clean_requests_to_be_shown_at_95_percent() {
        assert_eq!(requests_to_show(0.99, CONFIDENCE), 299);
        assert!(lower_bound(299.0, 299.0, CONFIDENCE) >= 0.99);
        assert!(lower_bound(298.0, 298.0, CONFIDENCE) < 0.99);
        assert_eq!(requests_to_show(0.5, CONFIDENCE), 5);
    }
}
