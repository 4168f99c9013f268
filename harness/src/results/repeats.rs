//! A cell measured in several repeats (`--repeat N`) as one row: what the report's
//! tables and charts, `compare` and the summary export show. Every number is the mean
//! over the repeats that measured the cell `ok`; the spread between them is an
//! [`Interval`] per metric ([`interval`]).

use crate::domain::CellStatus;
use crate::results::record::CellRecord;
use crate::stats::interval::Interval;

/// The `repeat` of a combined row: it stands for all of them.
pub const COMBINED: u32 = 0;

/// One row for a cell's per-repeat aggregate rows (in repeat order): a single row as it
/// is; several combined. Every number of the record, by its serde name (so a field
/// added later is combined too), is the mean over the repeats whose status is `ok`
/// (integers rounded); labels come from the first of them and `repeat` is
/// [`COMBINED`]. When no repeat measured the cell, the first row stands; when some did
/// not, the note says which. None for no rows.
pub fn combine(rows: &[&CellRecord]) -> Option<CellRecord> {
    let first = *rows.first()?;
    if rows.len() == 1 {
        return Some(first.clone());
    }
    let ok: Vec<&CellRecord> = rows.iter().copied().filter(|r| r.status == CellStatus::Ok).collect();
    let Some(&base) = ok.first() else {
        let mut row = first.clone();
        row.repeat = COMBINED;
        return Some(row);
    };
    let values: Vec<serde_json::Map<String, serde_json::Value>> = ok
        .iter()
        .filter_map(|r| match serde_json::to_value(r) {
            Ok(serde_json::Value::Object(m)) => Some(m),
            _ => None,
        })
        .collect();
    let mut out = values.first().cloned().unwrap_or_default();
    for (field, v) in out.iter_mut() {
        if !v.is_number() {
            continue;
        }
        let xs: Vec<f64> = values.iter().filter_map(|m| m.get(field)?.as_f64()).collect();
        let Some(i) = Interval::of(&xs) else { continue };
        *v = if v.is_f64() {
            serde_json::json!(i.mean)
        } else {
            serde_json::json!(i.mean.round() as u64)
        };
    }
    let mut row: CellRecord = serde_json::from_value(serde_json::Value::Object(out)).unwrap_or_else(|_| base.clone());
    row.repeat = COMBINED;
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r.status != CellStatus::Ok)
        .map(|r| format!("repeat {} {}: {}", r.repeat, r.status, r.note))
        .collect();
    if !failed.is_empty() {
        let head = format!("{} of {} repeats measured", ok.len(), rows.len());
        row.note = [head.as_str(), &failed.join("; "), row.note.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("; ");
    }
    Some(row)
}

/// The interval of one metric over the repeats that measured the cell `ok` (None when
/// none has a value).
pub fn interval(rows: &[&CellRecord], metric: impl Fn(&CellRecord) -> Option<f64>) -> Option<Interval> {
    let xs: Vec<f64> = rows
        .iter()
        .filter(|r| r.status == CellStatus::Ok)
        .filter_map(|r| metric(r))
        .collect();
    Interval::of(&xs)
}

/// The widest relative 95% half-width of a cell's mean latency and throughput over its
/// passes (pure): what a precision target (`--target`) judges. None with fewer than two
/// measured passes or without values.
pub fn widest_relative(rows: &[&CellRecord]) -> Option<f64> {
    let mean = interval(rows, |r| r.mean_s)?.relative()?;
    let throughput = interval(rows, |r| r.throughput_per_s)?.relative()?;
    Some(mean.max(throughput))
}

/// How many passes of a cell a precision target lets fail before it stops trying: a
/// failure gets another pass, a second says the cell fails for a reason of its own (out
/// of memory, never ready) that more passes would not mend.
pub const FAILED_PASSES_TO_GIVE_UP: usize = 2;

/// Where a cell stands under a precision target (pure), judged on its `ok` passes.
#[derive(Debug, Clone, PartialEq)]
pub enum Precision {
    /// Its `ok` passes pin mean latency and throughput within the target, or the
    /// strategy is unavailable: no further pass.
    Settled,
    /// It failed [`FAILED_PASSES_TO_GIVE_UP`] passes: no further pass, and not within.
    GaveUp {
        /// Passes not `ok`.
        failed: usize,
        /// Passes in all.
        passes: usize,
    },
    /// Another pass would help: its widest relative half-width over its `ok` passes
    /// (None: fewer than two), and its passes not `ok`.
    Open {
        /// The widest half-width.
        widest: Option<f64>,
        /// Passes not `ok`.
        failed: usize,
    },
}

/// Where the cell of `rows` (one aggregate row per pass) stands under `target` (pure).
pub fn precision(rows: &[&CellRecord], target: f64) -> Precision {
    if rows.iter().any(|r| r.status == CellStatus::Unavailable) {
        return Precision::Settled;
    }
    let ok: Vec<&CellRecord> = rows.iter().copied().filter(|r| r.status == CellStatus::Ok).collect();
    let failed = rows.len() - ok.len();
    let widest = widest_relative(&ok);
    if widest.is_some_and(|w| w <= target) {
        Precision::Settled
    } else if failed >= FAILED_PASSES_TO_GIVE_UP {
        Precision::GaveUp {
            failed,
            passes: rows.len(),
        }
    } else {
        Precision::Open { widest, failed }
    }
}

/// Whether a cell needs no further pass under a precision target (pure): settled, or
/// given up after its failures.
pub fn settled(rows: &[&CellRecord], target: f64) -> bool {
    !matches!(precision(rows, target), Precision::Open { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DeviceKind, Source, Strategy};
    use crate::results::record::ALL_PODS;

    fn row(repeat: u32, status: CellStatus, mean_ms: f64, inferences: u64) -> CellRecord {
        CellRecord {
            repeat,
            mean_s: Some(mean_ms / 1e3),
            inferences: Some(inferences),
            throughput_per_s: Some(inferences as f64 / 15.0),
            note: if status == CellStatus::Ok {
                String::new()
            } else {
                "pod-1 crashed".into()
            },
            run_id: "r".into(),
            ..CellRecord::unmeasured(Strategy::Mps, 3, ALL_PODS, status, Source::Scrape, DeviceKind::Cuda)
        }
    }

    #[test]
    fn numbers_are_means_over_the_ok_repeats() {
        let rows = [
            row(1, CellStatus::Ok, 2.0, 100),
            row(2, CellStatus::Failed, 9.0, 7),
            row(3, CellStatus::Ok, 3.0, 201),
        ];
        let refs: Vec<&CellRecord> = rows.iter().collect();
        let c = combine(&refs).expect("rows");
        assert_eq!(
            (c.status, c.repeat, c.pods, c.strategy),
            (CellStatus::Ok, COMBINED, 3, Strategy::Mps)
        );
        assert!((c.mean_s.expect("mean") - 0.0025).abs() < 1e-15);
        assert_eq!(c.inferences, Some(151), "integers are rounded means");
        assert_eq!(c.p99_s, None, "no repeat had it");
        assert_eq!(c.note, "2 of 3 repeats measured; repeat 2 failed: pod-1 crashed");
        let i = interval(&refs, |r| r.mean_s).expect("interval");
        assert_eq!(i.n, 2);
        assert!(i.half_width.is_some());
    }

    #[test]
    fn one_row_stands_as_it_is_and_unmeasured_cells_keep_their_status() {
        let one = row(1, CellStatus::Ok, 2.0, 100);
        assert_eq!(combine(&[&one]), Some(one.clone()));
        assert_eq!(combine(&[]), None);
        let (a, b) = (row(1, CellStatus::Failed, 1.0, 1), row(2, CellStatus::Failed, 1.0, 1));
        let c = combine(&[&a, &b]).expect("rows");
        assert_eq!(
            (c.status, c.repeat, c.note.as_str()),
            (CellStatus::Failed, COMBINED, "pod-1 crashed")
        );
        assert_eq!(interval(&[&a, &b], |r| r.mean_s), None);
    }
}
