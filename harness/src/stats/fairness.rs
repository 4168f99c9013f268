//! Jain's fairness index (Jain, Chiu & Hawe, "A Quantitative Measure of Fairness and
//! Discrimination for Resource Allocation in Shared Computer Systems", DEC-TR-301,
//! 1984): `J = (Σx)² / (n·Σx²)`, 1 when every pod gets the same throughput, 1/n when
//! one pod gets everything.

/// Jain's index over per-pod throughputs (pods that got nothing count as 0).
/// `None` for no pods or all zeros.
pub fn jain_index(xs: &[f64]) -> Option<f64> {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq == 0.0 {
        return None;
    }
    Some(sum * sum / (n * sq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_by_hand() {
        assert_eq!(jain_index(&[5.0, 5.0, 5.0]), Some(1.0));
        assert_eq!(jain_index(&[9.0, 0.0, 0.0]), Some(1.0 / 3.0));
        // (1+2+3)² / (3·(1+4+9)) = 36/42.
        assert!((jain_index(&[1.0, 2.0, 3.0]).unwrap_or(0.0) - 36.0 / 42.0).abs() < 1e-12);
        assert_eq!(jain_index(&[]), None);
        assert_eq!(jain_index(&[0.0, 0.0]), None);
    }
}
