//! The CSV a reader gets (pure): the records' CSV with one convention for shares (a
//! fraction, 0.25 = 25%: a `_pct` column becomes its fraction, `_pct` dropped from its
//! name), every fractional number rounded to four significant digits (finer than any
//! measurement here resolves: a cell's windows differ by 0.1% at best, a quantile by its
//! bucket), and the name of the GPU the run measured on every row.

use crate::error::{BenchError, Result};

/// Significant digits of a fractional number in the CSV.
pub const SIGNIFICANT: i32 = 4;

/// `bytes` (a CSV with a header) as the reader's CSV, with `gpu_name` as the last column
/// (`file` names the output in an error).
pub fn tidy(bytes: &[u8], gpu_name: &str, file: &str) -> Result<Vec<u8>> {
    let fail = |e: &dyn std::fmt::Display| BenchError::Results {
        path: file.into(),
        reason: e.to_string(),
    };
    let mut r = csv::Reader::from_reader(bytes);
    let header = r.headers().map_err(|e| fail(&e))?.clone();
    let percent: Vec<bool> = header.iter().map(|h| h.contains("_pct")).collect();
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut names: Vec<String> = header.iter().map(|h| h.replacen("_pct", "", 1)).collect();
    names.push("gpu_name".into());
    w.write_record(&names).map_err(|e| fail(&e))?;
    for row in r.records() {
        let row = row.map_err(|e| fail(&e))?;
        let mut out: Vec<String> = row
            .iter()
            .zip(&percent)
            .map(|(v, &pct)| number(v, pct).unwrap_or_else(|| v.to_string()))
            .collect();
        out.push(gpu_name.to_string());
        w.write_record(&out).map_err(|e| fail(&e))?;
    }
    w.into_inner().map_err(|e| fail(&e))
}

/// A fractional number rounded (a percentage as its fraction); None: leave the field as
/// it is (text, an integer, empty).
fn number(v: &str, pct: bool) -> Option<String> {
    let fractional = v.contains(['.', 'e', 'E']);
    if !(fractional || pct) {
        return None;
    }
    let x: f64 = v.parse().ok().filter(|x: &f64| x.is_finite())?;
    Some(round(if pct { x / 100.0 } else { x }))
}

/// `x` to [`SIGNIFICANT`] digits, in plain notation, without trailing zeros.
pub fn round(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let magnitude = x.abs().log10().floor() as i32;
    let decimals = (SIGNIFICANT - 1 - magnitude).max(0) as usize;
    let text = format!("{x:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_fractions_numbers_are_rounded_and_the_gpu_is_named() {
        let raw = b"pod,mean_s,gpu_util_pct,throughput_spread,inferences,started_at,note\n\
all,0.0019938096306976803,98.17647058823529,0.001169361964652149,7525,2026-11-22T04:33:05Z,\"a, b\"\n\
pod-0,,100,1.0,0,,\n";
        let out = String::from_utf8(tidy(raw, "NVIDIA H100 80GB HBM3", "cells.csv").expect("tidy")).expect("utf-8");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "pod,mean_s,gpu_util,throughput_spread,inferences,started_at,note,gpu_name"
        );
        assert_eq!(
            lines[1],
            "all,0.001994,0.9818,0.001169,7525,2026-11-22T04:33:05Z,\"a, b\",NVIDIA H100 80GB HBM3"
        );
        assert_eq!(lines[2], "pod-0,,1,1,0,,,NVIDIA H100 80GB HBM3");
        assert_eq!(round(501.4563577), "501.5");
        assert_eq!(round(15.006434), "15.01");
        assert_eq!(round(123456.7), "123457");
        assert_eq!(round(-0.0123456), "-0.01235");
        assert!(tidy(b"a,b\n1,2,3\n", "x", "f.csv").is_err(), "a ragged row is an error");
    }
}
