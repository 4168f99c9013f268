//! The CSV a reader gets (pure): the records' CSV with one convention for shares (a
//! fraction, 0.25 = 25%: a `_pct` column becomes its fraction, `_pct` dropped from its
//! name), every fractional number rounded to four significant digits (finer than any
//! measurement here resolves: a cell's windows differ by 0.1% at best, a quantile by its
//! bucket), and the name of the GPU the run measured on every row.

use crate::error::{BenchError, Result};

/// Significant digits of a fractional number in the CSV.
pub const SIGNIFICANT: i32 = 4;

/// The GPU names a CSV's rows carry: by the index in a row's `gpu` column (a `--gpus`
/// run), else the run's device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuNames {
    /// The run's device (its first GPU, or the CPU of a CPU run).
    pub default: String,
    /// (index, name) of each GPU the run recorded.
    pub by_index: Vec<(u32, String)>,
}

impl GpuNames {
    fn of_row(&self, gpu: Option<&str>) -> &str {
        gpu.and_then(|g| g.parse::<u32>().ok())
            .and_then(|i| self.by_index.iter().find(|(k, _)| *k == i))
            .map_or(self.default.as_str(), |(_, n)| n.as_str())
    }
}

/// Columns never rounded whatever they hold: names, not quantities.
const TEXT_COLUMNS: [&str; 1] = ["run_id"];

/// `bytes` (a CSV with a header) as the reader's CSV, with `gpu_name` as the last column
/// (`file` names the output in an error). Empty input (no records, no header) stays empty.
pub fn tidy(bytes: &[u8], gpus: &GpuNames, file: &str) -> Result<Vec<u8>> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let fail = |e: &dyn std::fmt::Display| BenchError::Results {
        path: file.into(),
        reason: e.to_string(),
    };
    let mut r = csv::Reader::from_reader(bytes);
    let header = r.headers().map_err(|e| fail(&e))?.clone();
    let rows: Vec<csv::StringRecord> = r
        .records()
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| fail(&e))?;
    // A column is a quantity when every value in it is a number (or empty).
    let numeric: Vec<bool> = header
        .iter()
        .enumerate()
        .map(|(i, h)| {
            !TEXT_COLUMNS.contains(&h)
                && rows
                    .iter()
                    .filter_map(|row| row.get(i))
                    .all(|v| v.is_empty() || v.parse::<f64>().is_ok())
        })
        .collect();
    let percent: Vec<bool> = header.iter().map(|h| h.contains("_pct")).collect();
    let gpu_column = header.iter().position(|h| h == "gpu");
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut names: Vec<String> = header
        .iter()
        .zip(&numeric)
        .map(|(h, &n)| if n { h.replacen("_pct", "", 1) } else { h.to_string() })
        .collect();
    names.push("gpu_name".into());
    w.write_record(&names).map_err(|e| fail(&e))?;
    for row in &rows {
        let mut out: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, v)| match numeric.get(i) {
                Some(true) => number(v, percent[i]).unwrap_or_else(|| v.to_string()),
                _ => v.to_string(),
            })
            .collect();
        out.push(gpus.of_row(gpu_column.and_then(|i| row.get(i))).to_string());
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
        let h100 = GpuNames {
            default: "NVIDIA H100 80GB HBM3".into(),
            by_index: Vec::new(),
        };
        let out = String::from_utf8(tidy(raw, &h100, "cells.csv").expect("tidy")).expect("utf-8");
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
        assert!(
            tidy(b"a,b\n1,2,3\n", &h100, "f.csv").is_err(),
            "a ragged row is an error"
        );
        assert!(
            tidy(b"", &h100, "f.csv").expect("empty").is_empty(),
            "nothing stays nothing"
        );
        // A run id that looks like a number, and a column of text, stay as written; each
        // row of a --gpus run names its own GPU.
        let two = GpuNames {
            default: "A".into(),
            by_index: vec![(0, "A".into()), (1, "B".into())],
        };
        let raw = b"run_id,model,gpu,mean_s\n1.10,1.50,1,0.0123456\n1.10,tiny,0,2.0\n";
        let out = String::from_utf8(tidy(raw, &two, "cells.csv").expect("tidy")).expect("utf-8");
        assert_eq!(
            out,
            "run_id,model,gpu,mean_s,gpu_name\n1.10,1.50,1,0.01235,B\n1.10,tiny,0,2,A\n"
        );
    }
}
