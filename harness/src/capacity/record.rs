//! The capacity table of a run (pure): one [`CapacityRecord`] per strategy, from the
//! cells the search measured.

use serde::Serialize;

use crate::capacity::search::{Verdict, attainment, cell_verdict, limit, outcome};
use crate::domain::{CellStatus, Strategy};
use crate::error::{BenchError, Result};
use crate::results::record::{CellRecord, RunRecord};
use crate::stats::binomial::attainment_bounds;

/// What one strategy's search came to: the capacity table's row (`capacity.csv`,
/// `export --format capacity`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapacityRecord {
    /// The run.
    pub run_id: String,
    /// Sharing strategy.
    pub strategy: Strategy,
    /// Requests per second offered to each pod.
    pub offered_per_pod: Option<f64>,
    /// The objectives, e.g. `p99=25ms`.
    pub slos: String,
    /// The largest count the search could measure (`--max-pods`; 1 for exclusive).
    pub searched_to: u32,
    /// The capacity: the most pods that, with every smaller count, met the SLOs
    /// (empty: the strategy is unavailable here).
    pub pods_fit: Option<u32>,
    /// Requests per second offered to the pods that fit, all together.
    pub offered_per_s: Option<f64>,
    /// Requests per second completed within the tightest threshold, at that count.
    pub goodput_per_s: Option<f64>,
    /// Requests per second completed at that count.
    pub throughput_per_s: Option<f64>,
    /// The cell's p99 latency at that count, seconds (streamed: end to end).
    pub p99_s: Option<f64>,
    /// Streamed answers: the cell's p99 time to first token at that count, seconds.
    pub ttft_p99_s: Option<f64>,
    /// Streamed answers: its p99 inter-token latency, seconds.
    pub itl_p99_s: Option<f64>,
    /// Streamed answers: output tokens per second of all its pods (the GPU's).
    pub output_tokens_per_s: Option<f64>,
    /// Its resolution (0.0219 = ±2.2%).
    pub quantile_resolution: Option<f64>,
    /// The largest interpolation bound of an attainment at that count (pods' rows).
    pub slo_attainment_bound: Option<f64>,
    /// The fit's confidence: at that count, the lowest one-sided 95% lower bound of a
    /// pod's attainment of an SLO (`stats::binomial::attainment_bounds`), at least the SLO's
    /// percentile when the count fits.
    pub attainment_lower_bound: Option<f64>,
    /// Mean GPU utilisation at that count, percent.
    pub gpu_util_pct: Option<f64>,
    /// GPU energy per request at that count, joules.
    pub energy_j_per_request: Option<f64>,
    /// The first count that did not fit.
    pub first_miss_pods: Option<u32>,
    /// Why: `misses: …` (clearly) or `marginal: …` (neither shown at 95% confidence).
    pub first_miss: String,
    /// Every measured count and its verdict: `1 fits, 2 fits, 3 misses`.
    pub walk: String,
    /// Whether the search ended (false: the run stopped before it did; the capacity
    /// may then be higher only when there is no first miss yet).
    pub finished: bool,
    /// Why a strategy has no capacity (unavailable here).
    pub note: String,
    /// Time-slicing through DRA: the claims' interval (empty otherwise).
    pub timeslice: Option<crate::domain::TimeSliceInterval>,
    /// MPS with `--mps-threads`: each client's share of the SMs (empty: auto). Every
    /// record has the column: the CSV's header is the first record's.
    pub mps_threads: Option<crate::domain::MpsThreads>,
    /// MPS with `--mps-memory`: each client's pinned memory (empty: auto).
    pub mps_memory: Option<crate::domain::MpsMemory>,
}

impl CapacityRecord {
    /// The arm the row is for.
    pub fn arm(&self) -> crate::domain::Arm {
        crate::domain::Arm {
            strategy: self.strategy,
            timeslice: self.timeslice,
            mps: crate::domain::MpsLimits {
                threads: self.mps_threads.unwrap_or_default(),
                memory: self.mps_memory.unwrap_or_default(),
            },
        }
    }
}

fn verdict_word(v: &Verdict) -> &'static str {
    match v {
        Verdict::Fits => "fits",
        Verdict::Marginal(_) => "marginal",
        Verdict::Misses(_) => "misses",
    }
}

/// A pod row's one-sided 95% lower bound of its attainment of `slo`.
fn lower_bound(row: &CellRecord, slo: &crate::config::values::Slo) -> Option<f64> {
    let (a, n) = attainment(row, slo)?;
    Some(attainment_bounds(a, row.slo_attainment_bound.unwrap_or(0.0), n).0)
}

/// The capacity table of a capacity run (pure; empty for other runs).
pub fn records(run: &RunRecord, cells: &[CellRecord]) -> Vec<CapacityRecord> {
    let Some(cap) = run.kind.capacity() else {
        return Vec::new();
    };
    let slos = &run.plan.slos;
    let per_pod = run.plan.load.per_pod_rate(1);
    run.plan
        .arms()
        .into_iter()
        .map(|arm| {
            let limit = limit(arm.strategy, cap.max_pods);
            let mut o = outcome(limit, |n| cell_verdict(cells, arm, n, slos));
            let cell = |n: u32| {
                cells
                    .iter()
                    .find(|c| c.repeat == 1 && c.arm() == arm && c.pods == n && c.is_aggregate())
            };
            let unavailable = cell(1).filter(|c| c.status == CellStatus::Unavailable);
            if unavailable.is_some() {
                // Not a miss: nothing could be measured.
                o.first_miss = None;
            }
            let at_fit = (o.fits > 0).then(|| cell(o.fits)).flatten();
            let pods_at_fit: Vec<&CellRecord> = cells
                .iter()
                .filter(|c| o.fits > 0 && c.repeat == 1 && c.arm() == arm && c.pods == o.fits && c.is_pod())
                .collect();
            let bound = pods_at_fit
                .iter()
                .filter_map(|c| c.slo_attainment_bound)
                .reduce(f64::max);
            let lower = pods_at_fit
                .iter()
                .flat_map(|c| slos.iter().filter_map(|s| lower_bound(c, s)))
                .reduce(f64::min);
            CapacityRecord {
                run_id: run.run_id.clone(),
                strategy: arm.strategy,
                timeslice: arm.timeslice,
                mps_threads: Some(arm.mps.threads).filter(|t| *t != crate::domain::MpsThreads::Auto),
                mps_memory: Some(arm.mps.memory).filter(|m| *m != crate::domain::MpsMemory::Auto),
                offered_per_pod: per_pod,
                slos: slos.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                searched_to: limit,
                pods_fit: match (unavailable, o.walk.is_empty()) {
                    (Some(_), _) | (None, true) => None,
                    _ => Some(o.fits),
                },
                offered_per_s: at_fit.and_then(|c| c.offered_per_s),
                goodput_per_s: at_fit.and_then(|c| c.goodput_per_s),
                throughput_per_s: at_fit.and_then(|c| c.throughput_per_s),
                p99_s: at_fit.and_then(|c| c.p99_s),
                ttft_p99_s: at_fit.and_then(|c| c.ttft_p99_s),
                itl_p99_s: at_fit.and_then(|c| c.itl_p99_s),
                output_tokens_per_s: at_fit.and_then(|c| c.output_tokens_per_s),
                quantile_resolution: at_fit.and_then(|c| c.quantile_resolution),
                slo_attainment_bound: bound,
                attainment_lower_bound: lower,
                gpu_util_pct: at_fit.and_then(|c| c.gpu_util_pct),
                energy_j_per_request: at_fit.and_then(|c| c.energy_j_per_inference),
                first_miss_pods: o.first_miss.as_ref().map(|(n, _)| *n),
                first_miss: match &o.first_miss {
                    Some((_, Verdict::Misses(why))) => format!("misses: {why}"),
                    Some((_, Verdict::Marginal(why))) => format!("marginal: {why}"),
                    _ => String::new(),
                },
                walk: if unavailable.is_some() {
                    "1 unavailable".into()
                } else {
                    o.walk
                        .iter()
                        .map(|(n, v)| format!("{n} {}", verdict_word(v)))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                finished: o.finished,
                note: unavailable.map(|c| c.note.clone()).unwrap_or_default(),
            }
        })
        .collect()
}

/// The capacity table as CSV (header from the struct).
pub fn csv(records: &[CapacityRecord]) -> Result<Vec<u8>> {
    let fail = |e: &dyn std::fmt::Display| BenchError::Results {
        path: "capacity.csv".into(),
        reason: e.to_string(),
    };
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in records {
        w.serialize(r).map_err(|e| fail(&e))?;
    }
    w.into_inner().map_err(|e| fail(&e))
}
