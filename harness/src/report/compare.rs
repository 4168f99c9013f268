//! `compare BASELINE CANDIDATE`: per cell, the change in mean latency, p99 and aggregate
//! throughput, flagged as a regression only when it is worse by more than the threshold
//! *and* by more than the window-to-window noise either run saw in that cell.

use crate::domain::{CellStatus, Strategy};
use crate::error::{BenchError, Result};
use crate::results::record::CellRecord;

use super::RunData;

/// One compared cell.
#[derive(Debug, Clone, PartialEq)]
pub struct CellComparison {
    /// Strategy.
    pub strategy: Strategy,
    /// Pods.
    pub pods: u32,
    /// Relative change of the mean latency (+0.1 = 10% slower).
    pub mean: Option<f64>,
    /// Relative change of p99.
    pub p99: Option<f64>,
    /// Relative change of aggregate throughput (−0.1 = 10% fewer inferences/s).
    pub throughput: Option<f64>,
    /// Noise: the larger window-to-window spread of the two runs (latency, throughput).
    pub noise: (f64, f64),
    /// Why this cell regressed (empty: it did not).
    pub regressions: Vec<String>,
    /// Status change, e.g. "ok → oom".
    pub status: Option<String>,
}

/// Parses "5%", "5" (percent) or "0.05".
pub fn parse_threshold(text: &str) -> Result<f64> {
    let t = text.trim();
    let v: f64 = t
        .trim_end_matches('%')
        .trim()
        .parse()
        .map_err(|_| BenchError::flag("--threshold", text, "expected a percentage such as 5%"))?;
    let frac = if t.ends_with('%') || v >= 1.0 { v / 100.0 } else { v };
    if !(0.0..1.0).contains(&frac) || frac == 0.0 {
        return Err(BenchError::flag(
            "--threshold",
            text,
            "expected a percentage between 0 and 100",
        ));
    }
    Ok(frac)
}

fn rel(base: Option<f64>, cand: Option<f64>) -> Option<f64> {
    match (base, cand) {
        (Some(b), Some(c)) if b > 0.0 && b.is_finite() && c.is_finite() => Some(c / b - 1.0),
        _ => None,
    }
}

fn compare_cell(b: &CellRecord, c: &CellRecord, threshold: f64) -> CellComparison {
    let noise_lat = b.p50_spread.unwrap_or(0.0).max(c.p50_spread.unwrap_or(0.0));
    let noise_tput = b
        .throughput_spread
        .unwrap_or(0.0)
        .max(c.throughput_spread.unwrap_or(0.0));
    let mut out = CellComparison {
        strategy: b.strategy,
        pods: b.pods,
        mean: rel(b.mean_s, c.mean_s),
        p99: rel(b.p99_s, c.p99_s),
        throughput: rel(b.throughput_per_s, c.throughput_per_s),
        noise: (noise_lat, noise_tput),
        regressions: Vec::new(),
        status: (b.status != c.status).then(|| format!("{} → {}", b.status, c.status)),
    };
    if b.status == CellStatus::Ok && c.status != CellStatus::Ok {
        out.regressions
            .push(format!("status {} → {}: {}", b.status, c.status, c.note));
        return out;
    }
    let worse = |change: Option<f64>, noise: f64, what: &str, out: &mut Vec<String>| {
        if let Some(x) = change
            && x > threshold
            && x > noise
        {
            out.push(format!(
                "{what} {:+.1}% (threshold {:.1}%, noise {:.1}%)",
                x * 100.0,
                threshold * 100.0,
                noise * 100.0
            ));
        }
    };
    let mut r = Vec::new();
    worse(out.mean, noise_lat, "mean latency", &mut r);
    worse(out.p99, noise_lat, "p99 latency", &mut r);
    worse(out.throughput.map(|t| -t), noise_tput, "throughput drop", &mut r);
    out.regressions = r;
    out
}

/// Compares every cell present in both runs.
pub fn compare(base: &RunData, cand: &RunData, threshold: f64) -> Vec<CellComparison> {
    let mut out = Vec::new();
    for b in base.cells.iter().filter(|c| c.is_aggregate()) {
        if let Some(c) = cand.aggregate(b.strategy, b.pods) {
            out.push(compare_cell(b, c, threshold));
        }
    }
    out
}

/// The comparison as a text table.
pub fn render(rows: &[CellComparison]) -> String {
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{:+.1}%", x * 100.0));
    let mut s = format!(
        "{:<13} {:>4}  {:>9} {:>9} {:>11} {:>9}  verdict\n",
        "strategy", "pods", "mean", "p99", "throughput", "noise"
    );
    for r in rows {
        let verdict = if !r.regressions.is_empty() {
            format!("REGRESSION: {}", r.regressions.join("; "))
        } else if let Some(st) = &r.status {
            format!("status {st}")
        } else {
            "ok".into()
        };
        s.push_str(&format!(
            "{:<13} {:>4}  {:>9} {:>9} {:>11} {:>8.1}%  {verdict}\n",
            r.strategy.title(),
            r.pods,
            pct(r.mean),
            pct(r.p99),
            pct(r.throughput),
            r.noise.0.max(r.noise.1) * 100.0
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds() {
        assert_eq!(parse_threshold("5%").ok(), Some(0.05));
        assert_eq!(parse_threshold("0.05").ok(), Some(0.05));
        assert_eq!(parse_threshold("12.5").ok(), Some(0.125));
        assert!(parse_threshold("-3%").is_err());
        assert!(parse_threshold("lots").is_err());
    }
}
