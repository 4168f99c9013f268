//! Uncertainty between repeats: the 95% Student-t interval of a mean over repeats, and
//! Welch's 95% interval of the difference of two such means (what `compare` judges a
//! change against). Pure arithmetic; the t quantiles are tabulated to df 30 and follow
//! the Cornish–Fisher expansion beyond.

/// How a cell's interval over repeats is computed, in the words the report prints.
pub const METHOD: &str = "mean over repeats ± the 95% Student-t interval, t(0.975, n−1)·s/√n, where s is the standard deviation of the n per-repeat values";

/// The 0.975 quantile of Student's t distribution for df = 1 … 30 (4 decimals, as in
/// every statistics table).
const T975: [f64; 30] = [
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604, 2.1448,
    2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484,
    2.0452, 2.0423,
];

/// The standard normal 0.975 quantile.
const Z975: f64 = 1.959_963_984_540_054;

/// t(0.975, df): tabulated for integer df ≤ 30, linear in 1/df between them (Welch's df
/// is fractional), the Cornish–Fisher expansion above 30; df below 1 counts as 1.
pub fn t975(df: f64) -> f64 {
    let df = if df.is_finite() { df.max(1.0) } else { f64::INFINITY };
    if df > 30.0 {
        let z = Z975;
        let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
        return z
            + (z3 + z) / (4.0 * df)
            + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * df * df)
            + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * df.powi(3));
    }
    let lo = df.floor();
    let hi = df.ceil();
    let at = |d: f64| T975[d as usize - 1];
    if lo == hi {
        return at(lo);
    }
    // Interpolate in 1/df, in which t is nearly linear.
    let w = (1.0 / lo - 1.0 / df) / (1.0 / lo - 1.0 / hi);
    at(lo) + w * (at(hi) - at(lo))
}

/// A mean over repeats and its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// The mean of the values.
    pub mean: f64,
    /// Half the width of the 95% interval (None: fewer than two values).
    pub half_width: Option<f64>,
    /// How many values.
    pub n: usize,
    /// Their sample variance (n − 1 in the denominator; 0 for one value).
    pub variance: f64,
}

impl Interval {
    /// The interval of `values` (None when there are none or one is not finite).
    pub fn of(values: &[f64]) -> Option<Interval> {
        if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let n = values.len();
        let mean = values.iter().sum::<f64>() / n as f64;
        if n < 2 {
            return Some(Interval {
                mean,
                half_width: None,
                n,
                variance: 0.0,
            });
        }
        let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        Some(Interval {
            mean,
            half_width: Some(t975((n - 1) as f64) * (variance / n as f64).sqrt()),
            n,
            variance,
        })
    }

    /// The half-width relative to the mean (0.02 = ±2%).
    pub fn relative(&self) -> Option<f64> {
        let h = self.half_width?;
        (self.mean != 0.0).then(|| h / self.mean.abs())
    }
}

/// Half the width of Welch's 95% interval of `b.mean − a.mean` (None unless both have
/// at least two values): t(0.975, ν)·√(s²a/na + s²b/nb), ν by Welch–Satterthwaite.
pub fn welch_half_width(a: &Interval, b: &Interval) -> Option<f64> {
    if a.n < 2 || b.n < 2 {
        return None;
    }
    let (va, vb) = (a.variance / a.n as f64, b.variance / b.n as f64);
    let se2 = va + vb;
    if se2 == 0.0 {
        return Some(0.0);
    }
    let df = se2 * se2 / (va * va / (a.n - 1) as f64 + vb * vb / (b.n - 1) as f64);
    Some(t975(df) * se2.sqrt())
}

/// Half the width of the 95% interval of `b.mean − a.mean` when at least one side was
/// repeated: Welch's when both were ([`welch_half_width`]); when only one was, its
/// variance stands for both (the other is one draw of the same process):
/// t(0.975, n − 1)·s·√(1/na + 1/nb). None when neither was repeated.
pub fn difference_half_width(a: &Interval, b: &Interval) -> Option<f64> {
    if a.n >= 2 && b.n >= 2 {
        return welch_half_width(a, b);
    }
    let known = [a, b].into_iter().find(|i| i.n >= 2)?;
    Some(t975((known.n - 1) as f64) * (known.variance * (1.0 / a.n as f64 + 1.0 / b.n as f64)).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_match_the_tables_and_join_the_normal() {
        assert_eq!(t975(1.0), 12.7062);
        assert_eq!(t975(2.0), 4.3027);
        assert_eq!(t975(0.3), 12.7062, "df below 1 counts as 1");
        // Beyond the table: the published values for df 35, 40, 50 and 100.
        for (df, want) in [(35.0, 2.0301), (40.0, 2.0211), (50.0, 2.0086), (100.0, 1.9840)] {
            assert!((t975(df) - want).abs() < 5e-4, "df {df}: {} vs {want}", t975(df));
        }
        // The expansion continues the table without a step at 30.
        assert!((t975(30.000_001) - 2.0423).abs() < 5e-4);
        assert!((t975(f64::INFINITY) - Z975).abs() < 1e-12);
        // Fractional df lie between their neighbours, and t falls as df grows.
        let t = t975(2.5);
        assert!(t < 4.3027 && t > 3.1824, "{t}");
        let mut last = f64::INFINITY;
        for i in 1..400 {
            let v = t975(i as f64 / 4.0);
            assert!(v <= last, "not monotone at df {}", i as f64 / 4.0);
            last = v;
        }
    }

    #[test]
    fn intervals_over_repeats() {
        // 10, 12, 14: mean 12, s = 2, half-width 4.3027 · 2 / √3.
        let i = Interval::of(&[10.0, 12.0, 14.0]).expect("interval");
        assert_eq!((i.mean, i.n, i.variance), (12.0, 3, 4.0));
        let h = i.half_width.expect("n = 3");
        assert!((h - 4.3027 * 2.0 / 3f64.sqrt()).abs() < 1e-9, "{h}");
        assert!((i.relative().expect("relative") - h / 12.0).abs() < 1e-12);
        let one = Interval::of(&[5.0]).expect("one value");
        assert_eq!((one.mean, one.half_width), (5.0, None));
        assert!(Interval::of(&[]).is_none());
        assert!(Interval::of(&[1.0, f64::NAN]).is_none());
        assert_eq!(Interval::of(&[3.0, 3.0]).and_then(|i| i.half_width), Some(0.0));
    }

    #[test]
    fn welch_interval_of_a_difference() {
        let a = Interval::of(&[10.0, 12.0, 14.0]).expect("a");
        let b = Interval::of(&[11.0, 12.0, 13.0]).expect("b");
        // s²a/na = 4/3, s²b/nb = 1/3; ν = (5/3)² / ((4/3)²/2 + (1/3)²/2) = 2.94…
        let df = (5.0f64 / 3.0).powi(2) / ((16.0 / 9.0) / 2.0 + (1.0 / 9.0) / 2.0);
        let want = t975(df) * (5.0f64 / 3.0).sqrt();
        assert!((welch_half_width(&a, &b).expect("both n ≥ 2") - want).abs() < 1e-12);
        assert!(df > 2.9 && df < 3.0, "{df}");
        // Equal variances and sizes: ν = 2(n − 1).
        let c = Interval::of(&[1.0, 2.0, 3.0]).expect("c");
        let d = Interval::of(&[2.0, 3.0, 4.0]).expect("d");
        let want = t975(4.0) * (2.0f64 / 3.0).sqrt();
        assert!((welch_half_width(&c, &d).expect("n = 3") - want).abs() < 1e-12);
        assert_eq!(welch_half_width(&Interval::of(&[1.0]).expect("one"), &c), None);
    }

    #[test]
    fn a_single_run_against_repeats_borrows_their_variance() {
        let one = Interval::of(&[10.0]).expect("one");
        let three = Interval::of(&[10.0, 12.0, 14.0]).expect("three");
        // s = 2: t(0.975, 2) · 2 · √(1 + 1/3), in either order.
        let want = 4.3027 * 2.0 * (4.0f64 / 3.0).sqrt();
        for (a, b) in [(&one, &three), (&three, &one)] {
            assert!((difference_half_width(a, b).expect("one side repeated") - want).abs() < 1e-9);
        }
        assert_eq!(difference_half_width(&one, &one), None);
        assert_eq!(difference_half_width(&three, &three), welch_half_width(&three, &three));
    }
}
