//! The summary export: one [`SummaryRecord`] per cell, its repeats combined, for
//! spreadsheets that want the interval beside each number.

use serde::Serialize;

use crate::domain::{CellStatus, Strategy};
use crate::error::{BenchError, Result};
use crate::report::RunData;
use crate::results::record::CellRecord;
use crate::stats::interval::Interval;

/// One cell of a run, over its repeats. A `_ci95` column is the half-width of the 95%
/// Student-t interval over the repeats that measured the cell (empty with fewer than
/// two); the number beside it is their mean.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryRecord {
    /// The run.
    pub run_id: String,
    /// Sharing strategy.
    pub strategy: Strategy,
    /// Pods requested.
    pub pods: u32,
    /// The combined status (`ok` when any repeat measured the cell).
    pub status: CellStatus,
    /// Repeats that measured the cell `ok`.
    pub repeats_ok: u32,
    /// Repeats on disk for the cell.
    pub repeats: u32,
    /// Mean latency, seconds.
    pub mean_s: Option<f64>,
    /// Its 95% half-width over repeats, seconds.
    pub mean_s_ci95: Option<f64>,
    /// Median latency, seconds.
    pub p50_s: Option<f64>,
    /// Its 95% half-width, seconds.
    pub p50_s_ci95: Option<f64>,
    /// 99th percentile latency, seconds.
    pub p99_s: Option<f64>,
    /// Its 95% half-width, seconds.
    pub p99_s_ci95: Option<f64>,
    /// The widest quantile resolution of the repeats (0.0219 = ±2.2%).
    pub quantile_resolution: Option<f64>,
    /// Aggregate throughput, inferences per second.
    pub throughput_per_s: Option<f64>,
    /// Its 95% half-width.
    pub throughput_per_s_ci95: Option<f64>,
    /// Aggregate throughput over the same repeat's 1-pod cell.
    pub speedup_vs_1pod: Option<f64>,
    /// Its 95% half-width.
    pub speedup_vs_1pod_ci95: Option<f64>,
    /// Jain's fairness index.
    pub fairness: Option<f64>,
    /// Its 95% half-width.
    pub fairness_ci95: Option<f64>,
    /// GPU energy per inference, joules.
    pub energy_j_per_inference: Option<f64>,
    /// Its 95% half-width.
    pub energy_j_per_inference_ci95: Option<f64>,
    /// GPU utilisation, percent.
    pub gpu_util_pct: Option<f64>,
    /// Its 95% half-width.
    pub gpu_util_pct_ci95: Option<f64>,
    /// Within-cell noise: window-to-window throughput spread, mean over repeats.
    pub throughput_spread: Option<f64>,
    /// Within-cell noise: window-to-window spread of the mean latency, mean over repeats.
    pub mean_spread: Option<f64>,
    /// Requests per second offered to the cell (`--load`).
    pub offered_per_s: Option<f64>,
    /// `--slo p50=…` attainment, mean over repeats.
    pub slo_p50_attainment: Option<f64>,
    /// `--slo p90=…` attainment, mean over repeats.
    pub slo_p90_attainment: Option<f64>,
    /// `--slo p99=…` attainment, mean over repeats.
    pub slo_p99_attainment: Option<f64>,
    /// The largest interpolation bound of the repeats' attainments.
    pub slo_attainment_bound: Option<f64>,
    /// Whether every SLO held in every repeat that judged it.
    pub slo_met: Option<bool>,
    /// Requests per second within the tightest threshold, mean over repeats.
    pub goodput_per_s: Option<f64>,
    /// Its 95% half-width.
    pub goodput_per_s_ci95: Option<f64>,
    /// Streamed answers: p50 time to first token, seconds, mean over repeats.
    pub ttft_p50_s: Option<f64>,
    /// p99 time to first token, seconds, mean over repeats.
    pub ttft_p99_s: Option<f64>,
    /// Its 95% half-width.
    pub ttft_p99_s_ci95: Option<f64>,
    /// p50 inter-token latency, seconds, mean over repeats.
    pub itl_p50_s: Option<f64>,
    /// p99 inter-token latency, seconds, mean over repeats.
    pub itl_p99_s: Option<f64>,
    /// Its 95% half-width.
    pub itl_p99_s_ci95: Option<f64>,
    /// Mean time per output token, seconds, mean over repeats.
    pub tpot_mean_s: Option<f64>,
    /// Output tokens per second of the cell's pods, mean over repeats.
    pub output_tokens_per_s: Option<f64>,
    /// Its 95% half-width.
    pub output_tokens_per_s_ci95: Option<f64>,
    /// `--slo ttft:…` attainment, mean over repeats.
    pub ttft_slo_attainment: Option<f64>,
    /// `--slo itl:…` attainment, mean over repeats.
    pub itl_slo_attainment: Option<f64>,
    /// `--slo tpot:…` attainment, mean over repeats.
    pub tpot_slo_attainment: Option<f64>,
    /// The combined note.
    pub note: String,
    /// What to read with care in the cell's numbers, and in its speed-up the 1-pod
    /// cell's (unsettled, a pod behind its load, an SLO undecided, throttled), "; "
    /// between; empty for a clean cell.
    pub read_with_care: String,
    /// Time-slicing through DRA: the claims' interval (empty otherwise).
    pub timeslice: Option<crate::domain::TimeSliceInterval>,
    /// MPS: each client's share of the SMs, where `--mps-threads` set one (empty: auto).
    pub mps_threads: Option<crate::domain::MpsThreads>,
    /// MPS: each client's pinned memory, where `--mps-memory` set one (empty: auto).
    pub mps_memory: Option<crate::domain::MpsMemory>,
}

/// (mean, half-width) of a metric over a cell's repeats.
fn with_ci(rows: &[&CellRecord], f: fn(&CellRecord) -> Option<f64>) -> (Option<f64>, Option<f64>) {
    match crate::results::repeats::interval(rows, f) {
        Some(Interval { mean, half_width, .. }) => (Some(mean), half_width),
        None => (None, None),
    }
}

/// The summary rows of a run, in plan order (cells not on disk left out).
pub fn records(data: &RunData) -> Vec<SummaryRecord> {
    let mut out = Vec::new();
    for s in data.arms() {
        for &p in &data.run.plan.pods {
            let rows = data.repeats(s, p);
            let Some(combined) = data.aggregate(s, p) else { continue };
            let (mean_s, mean_s_ci95) = with_ci(&rows, |r| r.mean_s);
            let (p50_s, p50_s_ci95) = with_ci(&rows, |r| r.p50_s);
            let (p99_s, p99_s_ci95) = with_ci(&rows, |r| r.p99_s);
            let (throughput_per_s, throughput_per_s_ci95) = with_ci(&rows, |r| r.throughput_per_s);
            let (speedup_vs_1pod, speedup_vs_1pod_ci95) = with_ci(&rows, |r| r.speedup_vs_1pod);
            let (fairness, fairness_ci95) = with_ci(&rows, |r| r.fairness);
            let (energy_j_per_inference, energy_j_per_inference_ci95) = with_ci(&rows, |r| r.energy_j_per_inference);
            let (gpu_util_pct, gpu_util_pct_ci95) = with_ci(&rows, |r| r.gpu_util_pct);
            let (goodput_per_s, goodput_per_s_ci95) = with_ci(&rows, |r| r.goodput_per_s);
            let (ttft_p99_s, ttft_p99_s_ci95) = with_ci(&rows, |r| r.ttft_p99_s);
            let (itl_p99_s, itl_p99_s_ci95) = with_ci(&rows, |r| r.itl_p99_s);
            let (output_tokens_per_s, output_tokens_per_s_ci95) = with_ci(&rows, |r| r.output_tokens_per_s);
            let judged: Vec<bool> = rows.iter().filter_map(|r| r.slo_met).collect();
            let mut care = data.flags(s, p);
            if p != 1 && speedup_vs_1pod.is_some() {
                care.extend(
                    data.flags(s, 1)
                        .into_iter()
                        .map(|f| format!("its speed-up's 1-pod cell: {f}")),
                );
            }
            out.push(SummaryRecord {
                run_id: data.run.run_id.clone(),
                strategy: s.strategy,
                pods: p,
                status: combined.status,
                repeats_ok: rows.iter().filter(|r| r.status == CellStatus::Ok).count() as u32,
                repeats: rows.len() as u32,
                mean_s,
                mean_s_ci95,
                p50_s,
                p50_s_ci95,
                p99_s,
                p99_s_ci95,
                quantile_resolution: rows.iter().filter_map(|r| r.quantile_resolution).reduce(f64::max),
                throughput_per_s,
                throughput_per_s_ci95,
                speedup_vs_1pod,
                speedup_vs_1pod_ci95,
                fairness,
                fairness_ci95,
                energy_j_per_inference,
                energy_j_per_inference_ci95,
                gpu_util_pct,
                gpu_util_pct_ci95,
                throughput_spread: with_ci(&rows, |r| r.throughput_spread).0,
                mean_spread: with_ci(&rows, |r| r.mean_spread).0,
                offered_per_s: combined.offered_per_s,
                slo_p50_attainment: with_ci(&rows, |r| r.slo_p50_attainment).0,
                slo_p90_attainment: with_ci(&rows, |r| r.slo_p90_attainment).0,
                slo_p99_attainment: with_ci(&rows, |r| r.slo_p99_attainment).0,
                slo_attainment_bound: rows.iter().filter_map(|r| r.slo_attainment_bound).reduce(f64::max),
                slo_met: (!judged.is_empty()).then(|| judged.iter().all(|m| *m)),
                goodput_per_s,
                goodput_per_s_ci95,
                ttft_p50_s: with_ci(&rows, |r| r.ttft_p50_s).0,
                ttft_p99_s,
                ttft_p99_s_ci95,
                itl_p50_s: with_ci(&rows, |r| r.itl_p50_s).0,
                itl_p99_s,
                itl_p99_s_ci95,
                tpot_mean_s: with_ci(&rows, |r| r.tpot_mean_s).0,
                output_tokens_per_s,
                output_tokens_per_s_ci95,
                ttft_slo_attainment: with_ci(&rows, |r| r.ttft_slo_attainment).0,
                itl_slo_attainment: with_ci(&rows, |r| r.itl_slo_attainment).0,
                tpot_slo_attainment: with_ci(&rows, |r| r.tpot_slo_attainment).0,
                note: combined.note.clone(),
                read_with_care: care.join("; "),
                timeslice: s.timeslice,
                mps_threads: Some(s.mps.threads).filter(|t| *t != crate::domain::MpsThreads::Auto),
                mps_memory: Some(s.mps.memory).filter(|m| *m != crate::domain::MpsMemory::Auto),
            });
        }
    }
    out
}

/// The summary as CSV (header from the struct; a run without cells gets none).
pub fn csv(data: &RunData) -> Result<Vec<u8>> {
    let fail = |e: &dyn std::fmt::Display| BenchError::Results {
        path: "summary.csv".into(),
        reason: e.to_string(),
    };
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in records(data) {
        w.serialize(r).map_err(|e| fail(&e))?;
    }
    w.into_inner().map_err(|e| fail(&e))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn fixture() -> RunData {
        RunData::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h100-run")).expect("fixture")
    }

    #[test]
    fn one_row_per_cell_with_intervals_only_over_repeats() {
        let once = fixture();
        let rows = records(&once);
        assert_eq!(rows.len(), 16);
        assert!(rows.iter().all(|r| r.repeats == 1 && r.mean_s_ci95.is_none()));
        let mps3 = rows
            .iter()
            .find(|r| r.strategy == Strategy::Mps && r.pods == 3)
            .expect("mps × 3");
        assert_eq!(mps3.mean_s, once.aggregate(Strategy::Mps, 3).and_then(|a| a.mean_s));

        // Three repeats at 0.98, 1.00 and 1.02 of the mean latency.
        let thrice = once.repeated(&[0.98, 1.0, 1.02], |c, f| c.mean_s = c.mean_s.map(|v| v * f));
        let rows = records(&thrice);
        assert_eq!(rows.len(), 16);
        let r = rows
            .iter()
            .find(|r| r.strategy == Strategy::Mps && r.pods == 3)
            .expect("mps × 3");
        let m = mps3.mean_s.expect("mean");
        assert_eq!((r.repeats, r.repeats_ok), (3, 3));
        assert!((r.mean_s.expect("mean") - m).abs() < 1e-12);
        // s = 0.02·m, half-width t(0.975, 2)·s/√3.
        let want = 4.3027 * 0.02 * m / 3f64.sqrt();
        assert!((r.mean_s_ci95.expect("ci") - want).abs() < 1e-9 * m, "{r:?}");
        assert_eq!(r.throughput_per_s_ci95, Some(0.0), "throughput did not move");
        let mig = rows.iter().find(|r| r.strategy == Strategy::Mig).expect("mig");
        assert_eq!(
            (mig.status, mig.repeats_ok, mig.mean_s),
            (CellStatus::Unavailable, 0, None)
        );
        let text = String::from_utf8(csv(&thrice).expect("csv")).expect("utf-8");
        assert!(
            text.starts_with("run_id,strategy,pods,status,repeats_ok,repeats,mean_s,mean_s_ci95,"),
            "{text:.200}"
        );
        assert_eq!(text.lines().count(), 17);
    }

    #[test]
    fn a_speed_up_over_an_unsettled_1_pod_cell_says_so() {
        let mut data = fixture();
        for c in data
            .cells
            .iter_mut()
            .filter(|c| c.strategy == Strategy::Mps && c.pods == 1 && c.is_aggregate())
        {
            c.note = "did not settle within 30 s (last 3 windows differ by more than 5%)".into();
            c.throughput_spread = Some(0.26);
        }
        let rows = records(&data);
        let at = |p: u32| {
            rows.iter()
                .find(|r| r.strategy == Strategy::Mps && r.pods == p)
                .expect("mps")
        };
        assert_eq!(at(1).read_with_care, "unsettled: windows differ by 26%");
        assert_eq!(
            at(7).read_with_care,
            "its speed-up's 1-pod cell: unsettled: windows differ by 26%"
        );
        let ts = rows
            .iter()
            .find(|r| r.strategy == Strategy::TimeSlicing && r.pods == 7)
            .expect("time-slicing");
        assert_eq!(ts.read_with_care, "");
    }
}
