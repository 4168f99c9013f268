//! When to stop measuring a cell: the last `n` windows agree within a tolerance on
//! throughput and mean latency (max − min ≤ tol × mean, for each). Both are exact
//! (counts over time, Δsum/Δcount); a median read from histogram buckets moves in bucket
//! steps and could hardly fail the test.

/// What one measurement window of a cell saw, summed over its pods.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowStat {
    /// Inferences per second in the window.
    pub throughput: f64,
    /// Mean latency in the window (Δsum/Δcount), seconds.
    pub mean: f64,
    /// Median latency in the window, seconds (shown, not judged).
    pub p50: f64,
}

/// (max − min) / mean of the values; 0 for fewer than two, NaN when not finite.
pub fn relative_spread(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let max = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    if !mean.is_finite() || mean == 0.0 {
        return f64::NAN;
    }
    (max - min) / mean
}

/// Whether the last `n` windows agree within `tol` (0.05 = 5%) on throughput and mean.
pub fn stable(windows: &[WindowStat], n: usize, tol: f64) -> bool {
    if n == 0 || windows.len() < n {
        return false;
    }
    let last = &windows[windows.len() - n..];
    let tput: Vec<f64> = last.iter().map(|w| w.throughput).collect();
    let mean: Vec<f64> = last.iter().map(|w| w.mean).collect();
    let ok = |v: &[f64]| {
        let s = relative_spread(v);
        s.is_finite() && s <= tol
    };
    ok(&tput) && ok(&mean)
}

/// How often a steady warm-up probes the pods.
pub const WARMUP_PROBE: std::time::Duration = std::time::Duration::from_secs(1);
/// Probes in a row that must agree for the pods to count as steady.
pub const WARMUP_PROBES: usize = 3;
/// How closely they must agree: 2%, tighter than the measurement's 5%, because a
/// warm-up that ends too early biases every window after it.
pub const WARMUP_TOLERANCE: f64 = 0.02;

/// Whether a warm-up may end (pure): its last [`WARMUP_PROBES`] probes, each the pods'
/// summed throughput and mean latency over one [`WARMUP_PROBE`], agree within
/// [`WARMUP_TOLERANCE`]. A probe that saw no request (NaN mean) is never steady, so
/// an open load too light to fill a probe warms up for the whole `--warmup`.
pub fn steady(probes: &[WindowStat]) -> bool {
    stable(probes, WARMUP_PROBES, WARMUP_TOLERANCE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(t: f64, m: f64) -> WindowStat {
        WindowStat {
            throughput: t,
            mean: m,
            p50: f64::NAN,
        }
    }

    #[test]
    fn needs_n_agreeing_windows() {
        let steady = [w(100.0, 0.010), w(101.0, 0.0101), w(99.0, 0.0099)];
        assert!(stable(&steady, 3, 0.05));
        assert!(!stable(&steady[..2], 3, 0.05), "too few windows");
        // Throughput agrees, latency does not (10% apart).
        let jumpy = [w(100.0, 0.010), w(100.0, 0.011), w(100.0, 0.010)];
        assert!(!stable(&jumpy, 3, 0.05));
        // A median that jumps a bucket while the exact mean holds is stable.
        let bucket_step = [
            WindowStat {
                throughput: 100.0,
                mean: 0.0100,
                p50: 0.0098,
            },
            WindowStat {
                throughput: 100.0,
                mean: 0.0101,
                p50: 0.0108,
            },
            WindowStat {
                throughput: 100.0,
                mean: 0.0100,
                p50: 0.0098,
            },
        ];
        assert!(stable(&bucket_step, 3, 0.05));
        // Only the last n count.
        let settling = [w(50.0, 0.02), w(100.0, 0.010), w(101.0, 0.0101), w(99.0, 0.0099)];
        assert!(stable(&settling, 3, 0.05));
        // NaN latency (no inferences) is never stable.
        assert!(!stable(
            &[w(0.0, f64::NAN), w(0.0, f64::NAN), w(0.0, f64::NAN)],
            3,
            0.05
        ));
    }

    #[test]
    fn a_warm_up_ends_on_three_probes_within_two_percent() {
        // A ramp (first-call compilation, clocks rising) then a plateau.
        let ramp = [
            w(300.0, 0.0030),
            w(850.0, 0.00118),
            w(893.0, 0.00112),
            w(896.0, 0.001115),
        ];
        assert!(!steady(&ramp[..3]), "the ramp's probes differ by far more than 2%");
        assert!(!steady(&ramp[..2]), "too few probes");
        assert!(!steady(&ramp), "850 against 896 is 5% apart");
        let plateau = [w(893.0, 0.00112), w(896.0, 0.001115), w(890.0, 0.001118)];
        assert!(steady(&plateau));
        // 3% apart passes the measurement's 5% but not the warm-up's 2%.
        let near = [w(100.0, 0.0100), w(103.0, 0.0100), w(100.0, 0.0100)];
        assert!(stable(&near, 3, 0.05) && !steady(&near));
        // An open load too light for a probe: never steady.
        assert!(!steady(&[w(0.0, f64::NAN), w(2.0, 0.01), w(2.0, 0.01)]));
    }

    #[test]
    fn spread_by_hand() {
        assert!((relative_spread(&[90.0, 100.0, 110.0]) - 0.2).abs() < 1e-12);
        assert_eq!(relative_spread(&[5.0]), 0.0);
    }
}
