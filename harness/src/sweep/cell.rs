//! A cell's rows from what was measured (pure): per-pod statuses from their last states,
//! per-pod and aggregate numbers from histogram deltas (the mean exactly as Δsum/Δcount,
//! quantiles as Prometheus' histogram_quantile), fairness, speed-up against the 1-pod
//! cell, and the one-line summary the terminal shows.

use std::collections::HashMap;
use std::time::Duration;

use crate::backend::PodState;
use crate::client::tokens::{RequestObjectives, TokenTally};
use crate::clock::now_rfc3339;
use crate::config::plan::{MeasureSettings, Slo};
use crate::config::values::SloMetric;
use crate::domain::{Arm, CellStatus, DeviceKind, MpsMemory, MpsThreads, Source};
use crate::metrics::requests::{TokenHistograms, TokenRecord};
use crate::metrics::{PodSnapshot, ServerHistograms};
use crate::results::record::{ALL_PODS, CellRecord, GPU_ROW_PREFIX};
use crate::stats::{Histogram, WindowStat, binomial, jain_index, relative_spread, stable};
use crate::telemetry::TelemetrySummary;

/// What the rows of a cell need besides measurements.
#[derive(Debug, Clone)]
pub struct CellLabels {
    /// Run id.
    pub run_id: String,
    /// Strategy, and time-slicing's DRA interval.
    pub arm: Arm,
    /// Pods requested (on each GPU the cell fills).
    pub pods: u32,
    /// GPUs the cell fills with `pods` each (a Kubernetes node with several GPUs on the
    /// device-plugin path); 1 otherwise.
    pub gpus: u32,
    /// Which pass over the plan, from 1.
    pub repeat: u32,
    /// Model preset.
    pub model: String,
    /// Precision.
    pub precision: String,
    /// cuda or cpu.
    pub device: DeviceKind,
    /// Requests per second offered to each pod (None: closed loop).
    pub offered_per_pod: Option<f64>,
    /// The latency objectives the rows are judged against (`--slo`).
    pub slos: Vec<Slo>,
}

/// The histograms a row's objectives are judged on: its latency's (a streamed answer's
/// end to end) and, with streamed answers, each token metric's.
#[derive(Debug, Clone, PartialEq)]
pub struct SloHistograms {
    /// Latency.
    pub latency: Histogram,
    /// Time to first token, inter-token gaps, time per output token (None: not
    /// streamed).
    pub tokens: Option<TokenHistograms>,
}

impl SloHistograms {
    /// Latency only.
    pub fn latency(h: &Histogram) -> Self {
        Self {
            latency: h.clone(),
            tokens: None,
        }
    }

    /// Latency and the token metrics of `t`.
    pub fn with_tally(h: &Histogram, t: &TokenTally) -> Self {
        Self {
            latency: h.clone(),
            tokens: Some(TokenHistograms {
                ttft: t.ttft.histogram(),
                itl: t.itl.histogram(),
                tpot: t.tpot.histogram(),
            }),
        }
    }

    /// The histogram of `metric` (None: a token metric of answers not streamed).
    pub fn of(&self, metric: SloMetric) -> Option<&Histogram> {
        match (metric, &self.tokens) {
            (SloMetric::Latency, _) => Some(&self.latency),
            (SloMetric::Ttft, Some(t)) => Some(&t.ttft),
            (SloMetric::Itl, Some(t)) => Some(&t.itl),
            (SloMetric::Tpot, Some(t)) => Some(&t.tpot),
            _ => None,
        }
    }
}

/// A row's SLO columns from its histograms and completed requests per second (pure):
/// each objective's attainment (the share of requests, or of gaps for `itl:`, within
/// its threshold, interpolated inside the bucket that holds it), how far that can be
/// off, and whether every SLO held. Goodput: `good_per_s` where the requests were
/// judged one by one (streamed answers, as vLLM counts it), else the requests/s within
/// the tightest latency threshold.
pub fn judge_slos(row: &mut CellRecord, hs: &SloHistograms, throughput: f64, slos: &[Slo], good_per_s: Option<f64>) {
    if slos.is_empty() || hs.latency.count <= 0.0 {
        return;
    }
    let mut met = true;
    let mut bound: f64 = 0.0;
    for slo in slos {
        let x = slo.threshold.as_secs_f64();
        let Some(h) = hs.of(slo.metric) else {
            // An objective on tokens of answers that were not streamed cannot hold.
            met = false;
            continue;
        };
        let share = h.fraction_at_most(x);
        bound = bound.max(h.fraction_bound(x));
        let Some(q) = slo.quantile else { continue };
        met &= share >= q;
        let column = match (slo.metric, (q * 100.0).round() as u32) {
            (SloMetric::Ttft, _) => &mut row.ttft_slo_attainment,
            (SloMetric::Itl, _) => &mut row.itl_slo_attainment,
            (SloMetric::Tpot, _) => &mut row.tpot_slo_attainment,
            (SloMetric::Latency, 50) => &mut row.slo_p50_attainment,
            (SloMetric::Latency, 90) => &mut row.slo_p90_attainment,
            (SloMetric::Latency, _) => &mut row.slo_p99_attainment,
        };
        *column = finite(share);
    }
    row.slo_attainment_bound = finite(bound);
    row.slo_met = Some(met);
    row.goodput_per_s = match good_per_s {
        Some(g) => finite(g),
        None => slos
            .iter()
            .filter(|s| s.metric == SloMetric::Latency)
            .map(|s| s.threshold)
            .min()
            .and_then(|t| finite(throughput * hs.latency.fraction_at_most(t.as_secs_f64()))),
    };
}

/// The SLOs whose attainment a pod's histograms `hs` decide neither way yet (pure):
/// the one-sided 95% bounds ([`binomial::attainment_bounds`], widened by the largest
/// bucket share over the SLOs' thresholds, as the row records it) straddle the
/// percentile, each said with its count and bounds. A cell with SLOs runs on until none
/// is left, or to `--max-cell`; a pod that completed nothing has none.
pub fn undecided_slos(hs: &SloHistograms, slos: &[Slo]) -> Vec<String> {
    if hs.latency.count.is_nan() || hs.latency.count <= 0.0 {
        // Nothing completed: nothing to decide (the pod's row fails it).
        return Vec::new();
    }
    // The bound the row records and the capacity rule reads: the largest over the SLOs'
    // thresholds (`judge_slos`).
    let bound = slos
        .iter()
        .filter_map(|s| Some(hs.of(s.metric)?.fraction_bound(s.threshold.as_secs_f64())))
        .filter(|b| b.is_finite())
        .fold(0.0, f64::max);
    slos.iter()
        .filter_map(|slo| {
            let q = slo.quantile?;
            let h = hs.of(slo.metric)?;
            if h.count.is_nan() || h.count <= 0.0 {
                return None;
            }
            let x = slo.threshold.as_secs_f64();
            let a = h.fraction_at_most(x);
            let (lo, hi) = binomial::attainment_bounds(a, bound, h.count);
            let what = if slo.metric == SloMetric::Itl {
                "gaps"
            } else {
                "requests"
            };
            (lo < q && hi >= q).then(|| {
                format!(
                    "{slo} undecided at 95% after {} {what}: {:.2}% within, bounds {:.2}%–{:.2}% straddle {:.0}%",
                    h.count as u64,
                    a * 100.0,
                    lo * 100.0,
                    hi * 100.0,
                    q * 100.0
                )
            })
        })
        .collect()
}

/// A row's token columns from the tally of its streamed requests over `secs` (pure):
/// output tokens and their rate, time to first token, inter-token latency and time per
/// output token (mean and percentiles, in the fine buckets: ±2.2%).
pub fn set_token_columns(row: &mut CellRecord, t: &TokenTally, secs: f64) {
    row.output_tokens = Some(t.output_tokens);
    row.output_tokens_per_s = t.tokens_per_s(secs);
    let ttft = t.ttft.histogram();
    let itl = t.itl.histogram();
    let tpot = t.tpot.histogram();
    let q = |h: &Histogram, q: f64| if h.count > 0.0 { finite(h.quantile(q)) } else { None };
    let mean = |h: &Histogram| if h.count > 0.0 { finite(h.mean()) } else { None };
    (row.ttft_mean_s, row.ttft_p50_s, row.ttft_p90_s, row.ttft_p99_s) =
        (mean(&ttft), q(&ttft, 0.5), q(&ttft, 0.9), q(&ttft, 0.99));
    (row.itl_mean_s, row.itl_p50_s, row.itl_p90_s, row.itl_p99_s) =
        (mean(&itl), q(&itl, 0.5), q(&itl, 0.9), q(&itl, 0.99));
    row.itl_count = Some(itl.count as u64);
    (row.tpot_mean_s, row.tpot_p99_s) = (mean(&tpot), q(&tpot, 0.99));
    row.tpot_count = Some(tpot.count as u64);
}

/// A row's server columns from the increments of the streaming server's own histograms
/// over the cell (pure; `verify` recomputes them): quantiles interpolated within the
/// server's buckets, as Prometheus' `histogram_quantile` does.
pub fn set_server_columns(row: &mut CellRecord, s: &ServerHistograms) {
    let q = |h: &Histogram, q: f64| if h.count > 0.0 { finite(h.quantile(q)) } else { None };
    let mean = |h: &Histogram| if h.count > 0.0 { finite(h.mean()) } else { None };
    // Every column from `s` alone: a histogram it lacks leaves its columns empty.
    let of = |h: &Option<Histogram>| match h {
        Some(h) => (mean(h), q(h, 0.5), q(h, 0.99), Some(h.count as u64)),
        None => (None, None, None, None),
    };
    (
        row.server_ttft_mean_s,
        row.server_ttft_p50_s,
        row.server_ttft_p99_s,
        row.server_ttft_count,
    ) = of(&s.ttft);
    (
        row.server_itl_mean_s,
        row.server_itl_p50_s,
        row.server_itl_p99_s,
        row.server_itl_count,
    ) = of(&s.itl);
}

/// Adds `s`'s histograms into `total` (a layout that differs leaves that histogram out
/// of the total).
pub fn add_server(total: &mut Option<ServerHistograms>, s: &ServerHistograms) {
    let Some(t) = total else {
        *total = Some(s.clone());
        return;
    };
    let add = |a: &mut Option<Histogram>, b: &Option<Histogram>| {
        let added = match (a.as_mut(), b) {
            (Some(x), Some(y)) => x.add(y),
            _ => false,
        };
        if !added {
            *a = None;
        }
    };
    add(&mut t.ttft, &s.ttft);
    add(&mut t.itl, &s.itl);
}

/// The server's histograms' increments over a pod's measurement (None: not read).
pub fn server_delta(t: &Tracked) -> Option<ServerHistograms> {
    let first = t.first.as_ref()?.server.as_ref()?;
    Some(t.last.as_ref()?.server.as_ref()?.delta(first))
}

/// The tally of a pod's streamed requests, each judged against the objectives `slos`
/// set on it (pure; `verify` recomputes rows with it).
pub fn tally_streamed(records: &[TokenRecord], slos: &[Slo]) -> TokenTally {
    TokenTally::of(records, &RequestObjectives::from_slos(slos))
}

/// The most a pod's backlog may grow over its measurement and still count as kept up
/// (pure): three standard deviations of its window-to-window change, plus one request.
/// A queue that keeps up wanders around its mean, so its growth over the cell is no
/// larger than its changes between windows; one that falls behind grows by about the
/// same amount every window, its changes vary little, and its growth stands out. The
/// deviation is taken as at least a Poisson count's at the mean depth, √(2 · mean): a
/// stable queue varies at least that much, and a few windows can by chance change
/// alike (with one window there is nothing else to go by).
pub fn backlog_limit(samples: &[f64]) -> f64 {
    let changes: Vec<f64> = samples.windows(2).map(|w| w[1] - w[0]).collect();
    let of_changes = if changes.len() >= 2 {
        let n = changes.len() as f64;
        let mean = changes.iter().sum::<f64>() / n;
        (changes.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    let mean_depth = samples.iter().sum::<f64>() / (samples.len().max(1) as f64);
    3.0 * of_changes.max((2.0 * mean_depth.max(0.0)).sqrt()) + 1.0
}

/// Whether a pod kept up with the open load it was offered (pure), judged on what the
/// server shows over the measurement: `backlog` is the requests it held waiting at the
/// first snapshot and after each window (`workload_queue_depth`, or the harness's own
/// count of requests in flight), `errors` the requests that failed or were dropped.
/// It fell behind when any request failed or was dropped, or its backlog grew by more
/// than [`backlog_limit`]; as a cross-check, and alone for a server that reports no
/// backlog (its reason says so), when it served less than its rate allows
/// ([`shortfall`]). The reason goes in its row: its latency is then its queue's, and it
/// gets no SLO attainment.
pub fn fell_behind(offered: f64, achieved: f64, secs: f64, backlog: &[f64], errors: f64) -> Option<String> {
    if errors > 0.0 {
        return Some(format!(
            "{errors} of its requests failed or were dropped while measured: it could not keep up with its offered load"
        ));
    }
    if let (Some(&first), Some(&last)) = (backlog.first(), backlog.last())
        && backlog.len() >= 2
    {
        let limit = backlog_limit(backlog);
        if last - first > limit {
            return Some(format!(
                "its backlog grew from {first} to {last} requests while measured (more than {limit:.1}: three standard deviations of its change between windows, plus one): it could not keep up, so its latency is its queue's"
            ));
        }
    }
    let why = shortfall(offered, achieved, secs)?;
    Some(match backlog.len() {
        0 => format!("{why} (judged by throughput: it reports no backlog)"),
        1 => format!("{why} (judged by throughput: it reported its backlog once)"),
        _ => why,
    })
}

/// Whether a pod served the load it was offered, for a server that reports no backlog
/// (pure): its completed requests per second may fall short of the offered rate by at
/// most 5% or three standard deviations of a Poisson count over the measured time,
/// whichever is more. Otherwise the reason, for its row.
pub fn shortfall(offered: f64, achieved: f64, secs: f64) -> Option<String> {
    let arrivals = offered * secs;
    if arrivals.is_nan() || arrivals <= 0.0 {
        return None;
    }
    let tolerance = (3.0 / arrivals.sqrt()).max(0.05);
    (achieved < offered * (1.0 - tolerance)).then(|| {
        format!(
            "served {achieved:.1}/s of the {offered}/s offered (more than {:.1}% short): it could not keep up, so its latency is its queue's",
            tolerance * 100.0
        )
    })
}

/// The 1-pod aggregate row of a cell's own pass (pure; None for a 1-pod cell): what its
/// speed-up is against. Never another pass's: passes minutes apart drift.
pub fn own_baseline(rows: &[CellRecord], repeat: u32, arm: Arm, pods: u32) -> Option<&CellRecord> {
    if pods == 1 {
        return None;
    }
    rows.iter()
        .find(|c| c.repeat == repeat && c.arm() == arm && c.pods == 1 && c.is_aggregate())
}

/// A cell's speed-up (aggregate throughput over its pass's 1-pod cell's) and slowdown
/// (mean latency over its) against `base`, that 1-pod aggregate row (pure): 1 for a
/// 1-pod cell; None without a throughput, or without an `ok` base to divide by.
pub fn against_one_pod(agg: &CellRecord, base: Option<&CellRecord>) -> (Option<f64>, Option<f64>) {
    if agg.throughput_per_s.is_none() {
        return (None, None);
    }
    if agg.pods == 1 {
        return (Some(1.0), Some(1.0));
    }
    let Some(b) = base.filter(|b| b.status == CellStatus::Ok) else {
        return (None, None);
    };
    let speedup = b
        .throughput_per_s
        .filter(|&t| t > 0.0)
        .zip(agg.throughput_per_s)
        .map(|(b, t)| t / b);
    let slowdown = match (agg.mean_s, b.mean_s) {
        (Some(m), Some(b)) if b > 0.0 => Some(m / b),
        _ => None,
    };
    (speedup, slowdown)
}

/// The largest share of a pod's measured requests that may fail (errors, drops
/// included, over completed + errors) before the pod fails: its latency would describe
/// the few requests that were served, not the service.
pub const MAX_ERROR_SHARE: f64 = 0.05;

/// Why a pod failed through its errors (pure); None within [`MAX_ERROR_SHARE`].
pub fn error_share(completed: f64, errors: f64) -> Option<String> {
    let all = completed + errors;
    if all.is_nan() || all <= 0.0 {
        return None;
    }
    let share = errors / all;
    (share > MAX_ERROR_SHARE).then(|| {
        format!(
            "{errors} of its {all} requests failed or were dropped ({:.1}%, more than the {:.0}% a pod may lose)",
            share * 100.0,
            MAX_ERROR_SHARE * 100.0
        )
    })
}

/// The three quantiles of `h` with their resolution and 95% sampling intervals, into a
/// row.
pub fn set_quantiles(row: &mut CellRecord, h: &Histogram) {
    row.mean_s = finite(h.mean());
    row.p50_s = finite(h.quantile(0.5));
    row.p90_s = finite(h.quantile(0.9));
    row.p99_s = finite(h.quantile(0.99));
    row.quantile_resolution = h.quantile_resolution();
    (row.p50_low_s, row.p50_high_s) = h.quantile_interval(0.5);
    (row.p90_low_s, row.p90_high_s) = h.quantile_interval(0.9);
    (row.p99_low_s, row.p99_high_s) = h.quantile_interval(0.99);
}

/// Adds `more` to a row's note, after "; " when it has one already.
pub fn add_note(note: &mut String, more: &str) {
    if !note.is_empty() {
        note.push_str("; ");
    }
    note.push_str(more);
}

/// A row with the cell's labels and nothing measured.
pub fn empty_row(l: &CellLabels, pod: &str, status: CellStatus, source: Source, note: String) -> CellRecord {
    // A cell's aggregate row says how many GPUs it filled, and offers their pods' load.
    let (gpus, offered) = if pod == ALL_PODS {
        (
            (l.gpus > 1).then_some(l.gpus),
            l.offered_per_pod.map(|o| o * f64::from(l.pods * l.gpus.max(1))),
        )
    } else {
        (None, l.offered_per_pod)
    };
    CellRecord {
        gpus,
        run_id: l.run_id.clone(),
        note,
        model: l.model.clone(),
        precision: l.precision.clone(),
        started_at: now_rfc3339(),
        repeat: l.repeat,
        offered_per_s: offered,
        timeslice: l.arm.timeslice,
        mps_threads: Some(l.arm.mps.threads).filter(|t| *t != MpsThreads::Auto),
        mps_memory: Some(l.arm.mps.memory).filter(|m| *m != MpsMemory::Auto),
        ..CellRecord::unmeasured(l.arm.strategy, l.pods, pod, status, source, l.device)
    }
}

/// A cell whose strategy cannot run: one aggregate row with the reason.
pub fn unavailable_rows(l: &CellLabels, source: Source, reason: &str) -> Vec<CellRecord> {
    vec![empty_row(
        l,
        ALL_PODS,
        CellStatus::Unavailable,
        source,
        reason.to_string(),
    )]
}

/// Per-pod bookkeeping during a cell.
#[derive(Debug, Clone)]
pub struct Tracked {
    /// The snapshot at the start of the measurement.
    pub first: Option<PodSnapshot>,
    /// The latest snapshot.
    pub last: Option<PodSnapshot>,
    /// The pod's state as the backend last saw it.
    pub state: PodState,
    /// Why its numbers cannot be trusted (a scrape error, a counter reset).
    pub problem: Option<String>,
    /// Its backlog at the first snapshot and after each window, where it reports one.
    pub backlog: Vec<f64>,
    /// Streamed answers (`--stream`): the requests that ended while measured.
    pub streamed: Option<Vec<TokenRecord>>,
}

/// The value when it is a finite number.
pub fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// Status of a pod from its last state.
pub fn pod_status(state: &PodState, problem: &Option<String>) -> (CellStatus, Option<i32>, String) {
    match state {
        PodState::Pending(reason) => (CellStatus::Pending, None, reason.clone()),
        PodState::Exited { code: Some(4), detail } => {
            (CellStatus::Oom, Some(4), format!("out of GPU memory: {detail}"))
        }
        // Kubernetes killed the container for exceeding its memory limit.
        PodState::Exited { code, detail } if detail.starts_with("OOMKilled") => {
            (CellStatus::Oom, *code, detail.clone())
        }
        PodState::Exited { code, detail } => (CellStatus::Failed, *code, detail.clone()),
        PodState::Starting => (CellStatus::Failed, None, "never became ready".into()),
        PodState::Running => match problem {
            Some(p) => (CellStatus::Failed, None, p.clone()),
            None => (CellStatus::Ok, None, String::new()),
        },
    }
}

/// The aggregate status of a cell (docs/methodology.md: any OOM or failure shows, pending
/// alone is an expected outcome of the exclusive baseline).
pub fn aggregate_status(statuses: &[CellStatus]) -> CellStatus {
    if statuses.contains(&CellStatus::Oom) {
        CellStatus::Oom
    } else if statuses.contains(&CellStatus::Failed) {
        CellStatus::Failed
    } else if statuses.contains(&CellStatus::Ok) {
        CellStatus::Ok
    } else {
        CellStatus::Pending
    }
}

/// A cell that could not be measured at all: one failed aggregate row with the reason.
pub fn failed_rows(l: &CellLabels, source: Source, reason: &str) -> Vec<CellRecord> {
    vec![empty_row(l, ALL_PODS, CellStatus::Failed, source, reason.to_string())]
}

/// One line per finished cell for the terminal.
pub fn cell_summary(rows: &[CellRecord]) -> String {
    let Some(agg) = rows.iter().find(|r| r.is_aggregate()) else {
        return String::new();
    };
    let head = format!(
        "{:<13} {} pod{}",
        agg.arm().title(),
        agg.pods,
        if agg.pods == 1 { " " } else { "s" }
    );
    match (agg.status, agg.mean_s, agg.throughput_per_s) {
        (CellStatus::Ok, Some(mean), Some(tput)) => format!(
            "{head}  mean {:>8.2} ms  p99 {:>8.2} ms  {:>8.1} inf/s  fairness {}{}",
            mean * 1e3,
            agg.p99_s.unwrap_or(f64::NAN) * 1e3,
            tput,
            agg.fairness.map_or("-".into(), |f| format!("{f:.3}")),
            agg.flags().iter().map(|f| format!("  [{f}]")).collect::<String>()
        ),
        (status, _, _) => format!("{head}  {status}: {}", agg.note),
    }
}

/// Everything a cell's measurement produced, before it becomes rows.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Pod names in launch order.
    pub order: Vec<String>,
    /// Per-pod bookkeeping, by name.
    pub tracked: HashMap<String, Tracked>,
    /// The measurement windows.
    pub windows: Vec<WindowStat>,
    /// Length of the measurement (after warm-up).
    pub measured: Duration,
    /// GPU telemetry over the measurement.
    pub summary: TelemetrySummary,
    /// When the measurement started (RFC 3339).
    pub started_at: String,
}

/// The rows of a measured cell (pure): one per requested pod, then the aggregate.
/// `baseline` is the strategy's 1-pod aggregate row.
pub fn cell_rows(
    m: &Measured,
    labels: &CellLabels,
    src: Source,
    settings: &MeasureSettings,
    baseline: Option<&CellRecord>,
) -> Vec<CellRecord> {
    let Measured {
        order,
        tracked,
        windows,
        measured,
        summary,
        started_at,
    } = m;
    let cell_secs = measured.as_secs_f64();
    let mut rows = Vec::new();
    let mut total: Option<Histogram> = None;
    let (mut total_tput, mut total_errors, mut total_inf) = (0.0, 0.0, 0u64);
    let mut effective = Vec::new();
    let mut statuses = Vec::new();
    let mut layout_mismatch = Vec::new();
    let mut short = Vec::new();
    // Pods whose SLO attainment the cell ended without deciding at 95%.
    let mut undecided = Vec::new();
    // Per pod row: its histogram delta (its inferences per second of the cell are in
    // `effective`, row for row).
    let mut deltas: Vec<Option<Histogram>> = Vec::new();
    // Streamed answers: every pod's token tallies pooled.
    let mut total_tokens: Option<TokenTally> = None;
    let mut total_server: Option<ServerHistograms> = None;
    for name in order {
        let t = &tracked[name];
        let (status, exit_code, note) = pod_status(&t.state, &t.problem);
        statuses.push(status);
        let mut row = empty_row(labels, name, status, src, note);
        row.exit_code = exit_code;
        row.started_at = started_at.clone();
        row.load_seed = t.last.as_ref().or(t.first.as_ref()).and_then(|s| s.load_seed);
        row.gpu_uuid = t.last.as_ref().or(t.first.as_ref()).and_then(|s| s.device_uuid.clone());
        let delta = match (&t.first, &t.last) {
            (Some(a), Some(b)) => b
                .latency
                .delta(&a.latency)
                .map(|d| (d, b.at - a.at, b.errors - a.errors)),
            _ => None,
        };
        match delta {
            Some((d, dt, errs)) if d.count > 0.0 => {
                let secs = dt.as_secs_f64();
                row.inferences = Some(d.count as u64);
                row.throughput_per_s = Some(d.count / secs);
                set_quantiles(&mut row, &d);
                row.errors = Some(errs.max(0.0) as u64);
                row.duration_s = Some(secs);
                if let Some(lost) = error_share(d.count, errs.max(0.0))
                    && status == CellStatus::Ok
                {
                    row.status = CellStatus::Failed;
                    if let Some(s) = statuses.last_mut() {
                        *s = CellStatus::Failed;
                    }
                    add_note(&mut row.note, &lost);
                }
                if labels.offered_per_pod.is_some() && t.backlog.len() >= 2 {
                    row.backlog_growth = Some(t.backlog[t.backlog.len() - 1] - t.backlog[0]);
                }
                let why = labels
                    .offered_per_pod
                    .and_then(|o| fell_behind(o, d.count / secs, secs, &t.backlog, errs.max(0.0)));
                let tally = t.streamed.as_deref().map(|r| tally_streamed(r, &labels.slos));
                if let Some(tally) = &tally {
                    set_token_columns(&mut row, tally, secs);
                    match total_tokens.as_mut() {
                        Some(all) => all.merge(tally),
                        None => total_tokens = Some(tally.clone()),
                    }
                }
                if let Some(server) = server_delta(t) {
                    set_server_columns(&mut row, &server);
                    add_server(&mut total_server, &server);
                    if let Some(p) = &server.problem {
                        add_note(&mut row.note, &format!("the server's own histograms: {p}"));
                    }
                }
                let hs = match &tally {
                    Some(tally) => SloHistograms::with_tally(&d, tally),
                    None => SloHistograms::latency(&d),
                };
                if why.is_none() {
                    let good = tally.as_ref().and_then(|t| t.goodput_per_s(secs));
                    judge_slos(&mut row, &hs, d.count / secs, &labels.slos, good);
                    let open = undecided_slos(&hs, &labels.slos);
                    if !open.is_empty() {
                        undecided.push(name.clone());
                    }
                    for slo in open {
                        add_note(&mut row.note, &slo);
                    }
                }
                if let Some(why) = why {
                    short.push(name.clone());
                    add_note(&mut row.note, &why);
                }
                total_tput += d.count / secs;
                total_errors += errs.max(0.0);
                total_inf += d.count as u64;
                effective.push(if cell_secs > 0.0 { d.count / cell_secs } else { 0.0 });
                deltas.push(Some(d.clone()));
                // Histograms with other bucket bounds cannot be summed: the pod's own row
                // keeps its quantiles; the cell's leave it out, and say so.
                if !Histogram::pool(&mut total, d) {
                    layout_mismatch.push(name.clone());
                    add_note(
                        &mut row.note,
                        "its histogram has other bucket bounds than the cell's first pod: left out of the cell's quantiles and mean",
                    );
                }
            }
            _ => {
                // Nothing completed, but what failed is still counted (a server that
                // answers every request with an error).
                let mut why = "completed no request while measured".to_string();
                if let (Some(a), Some(b)) = (&t.first, &t.last) {
                    let errs = (b.errors - a.errors).max(0.0);
                    if errs > 0.0 {
                        row.errors = Some(errs as u64);
                        total_errors += errs;
                        why += &format!("; {errs} errors");
                        if let Some(last) = &b.last_error {
                            why += &format!(", the last: {last}");
                        }
                    }
                }
                // A pod that ran and completed nothing measured nothing: the cell failed.
                if status == CellStatus::Ok {
                    row.status = CellStatus::Failed;
                    if let Some(s) = statuses.last_mut() {
                        *s = CellStatus::Failed;
                    }
                }
                add_note(&mut row.note, &why);
                effective.push(0.0);
                deltas.push(None);
            }
        }
        rows.push(row);
    }
    let status = aggregate_status(&statuses);
    let ran = statuses.iter().filter(|s| **s == CellStatus::Ok).count();
    let mut notes = Vec::new();
    let pending = statuses.iter().filter(|s| **s == CellStatus::Pending).count();
    let asked = labels.pods * labels.gpus.max(1);
    if pending > 0 {
        notes.push(format!("{ran} of {asked} pods ran; {pending} pending"));
    }
    for r in rows
        .iter()
        .filter(|r| matches!(r.status, CellStatus::Failed | CellStatus::Oom))
    {
        notes.push(format!("{} {}: {}", r.pod, r.status, r.note));
    }
    if !short.is_empty() {
        notes.push(format!(
            "{} could not keep up with the offered load (their rows say by how much)",
            short.join(", ")
        ));
    }
    if !undecided.is_empty() {
        notes.push(format!(
            "{} left an SLO undecided at 95% when the cell ended (their rows say with how many requests)",
            undecided.join(", ")
        ));
    }
    if !layout_mismatch.is_empty() {
        notes.push(format!(
            "{} left out of the cell's quantiles and mean: other histogram bucket bounds",
            layout_mismatch.join(", ")
        ));
    }
    // Settling is a measured cell's question: a failed one, or one that completed
    // nothing, did not "differ by 0%".
    let measured_ok = status == CellStatus::Ok && total.as_ref().is_some_and(|h| h.count > 0.0);
    if measured_ok && !windows.is_empty() && !stable(windows, settings.stable_windows, settings.tolerance) {
        notes.push(format!(
            "did not settle within {} s (last {} windows differ by more than {}%)",
            settings.max_cell.as_secs(),
            settings.stable_windows,
            settings.tolerance * 100.0
        ));
    }
    let mut agg = empty_row(labels, ALL_PODS, status, src, notes.join("; "));
    // Failures count even where nothing completed (a server that answers only errors).
    if total.as_ref().is_some_and(|h| h.count > 0.0) || total_errors > 0.0 {
        agg.errors = Some(total_errors as u64);
    }
    agg.started_at = started_at.clone();
    // A MIG instance is a device of its own (its UUID is the instance's): its pods
    // share no GPU, so they get no GPU rows.
    let per_gpu = if labels.gpus > 1 && labels.arm.strategy != crate::domain::Strategy::Mig {
        let (per_gpu, unreported) = gpu_rows(labels, &rows, (&deltas, &effective), &short, cell_secs);
        if unreported > 0 {
            add_note(
                &mut agg.note,
                &format!(
                    "pods that did not say which GPU they ran on (workload_info{{device_uuid}}), in no GPU's row: {unreported}"
                ),
            );
        }
        per_gpu
    } else {
        Vec::new()
    };
    if !labels.slos.is_empty() && !short.is_empty() {
        add_note(
            &mut agg.note,
            "no SLO attainment: a pod that cannot keep up measures its queue",
        );
    }
    if let Some(h) = total.filter(|h| h.count > 0.0) {
        agg.inferences = Some(total_inf);
        // One time base for the cell: every pod's inferences over the cell's measured
        // time, as fairness counts them (a pod that died mid-cell adds only what it did).
        agg.throughput_per_s = Some(if cell_secs > 0.0 {
            total_inf as f64 / cell_secs
        } else {
            total_tput
        });
        set_quantiles(&mut agg, &h);
        let secs = if cell_secs > 0.0 { cell_secs } else { 1.0 };
        if let Some(tokens) = &total_tokens {
            set_token_columns(&mut agg, tokens, secs);
        }
        if let Some(server) = &total_server {
            set_server_columns(&mut agg, server);
        }
        if short.is_empty() {
            let tput = agg.throughput_per_s.unwrap_or(0.0);
            let (hs, good) = match &total_tokens {
                Some(t) => (SloHistograms::with_tally(&h, t), t.goodput_per_s(secs)),
                None => (SloHistograms::latency(&h), None),
            };
            judge_slos(&mut agg, &hs, tput, &labels.slos, good);
        }
        agg.fairness = jain_index(&effective);
        agg.duration_s = Some(cell_secs);
        agg.windows = Some(windows.len() as u32);
        let tputs: Vec<f64> = windows.iter().map(|w| w.throughput).collect();
        let p50s: Vec<f64> = windows.iter().map(|w| w.p50).collect();
        let means: Vec<f64> = windows.iter().map(|w| w.mean).collect();
        agg.mean_spread = finite(relative_spread(&means));
        agg.throughput_spread = finite(relative_spread(&tputs));
        agg.p50_spread = finite(relative_spread(&p50s));
        set_telemetry(&mut agg, summary, total_inf);
        (agg.speedup_vs_1pod, agg.slowdown_vs_1pod) = against_one_pod(&agg, baseline);
    }
    rows.extend(per_gpu);
    rows.push(agg);
    rows
}

/// The GPU's telemetry over the measurement on an aggregate row of `inferences` (pure):
/// utilisation, memory, power, energy per inference, what held the clocks down and how
/// often, the clocks and the temperature. Every column is set (empty where nothing read
/// it): `verify` recomputes a row's columns from its samples with it.
pub fn set_telemetry(agg: &mut CellRecord, summary: &TelemetrySummary, inferences: u64) {
    agg.gpu_util_pct = summary.util_pct;
    agg.gpu_mem_bytes = summary.mem_bytes;
    agg.power_w = summary.power_w;
    agg.energy_j_per_inference = summary.energy_j.map(|e| e / inferences.max(1) as f64);
    let share = |c: &crate::telemetry::ClockLimits, n: u32| f64::from(n) / f64::from(c.samples.max(1));
    agg.clock_slowdown = summary.clocks.map(|c| c.describe());
    agg.power_capped = summary.clocks.map(|c| share(&c, c.power_capped));
    agg.throttled_share = summary.clocks.map(|c| share(&c, c.slowed));
    agg.sm_clock_mhz = summary.sm_clock_mhz.map(|g| g.mean);
    agg.sm_clock_min_mhz = summary.sm_clock_mhz.map(|g| g.min);
    agg.mem_clock_mhz = summary.mem_clock_mhz.map(|g| g.mean);
    agg.mem_clock_min_mhz = summary.mem_clock_mhz.map(|g| g.min);
    agg.temp_c = summary.temp_c.map(|g| g.mean);
    agg.temp_max_c = summary.temp_c.map(|g| g.max);
}

/// A cell's rows for each GPU its pods said they ran on (pure): the GPU's pods pooled
/// as the cell's aggregate pools them all (histograms summed, throughput over the cell's
/// measured time, fairness among the pods that ran there), named `gpu:<its UUID>` (the
/// same in every cell of the run), in the order of their UUIDs. Also how many pod rows
/// that ran said no GPU.
fn gpu_rows(
    labels: &CellLabels,
    pod_rows: &[CellRecord],
    (deltas, effective): (&[Option<Histogram>], &[f64]),
    short: &[String],
    cell_secs: f64,
) -> (Vec<CellRecord>, usize) {
    let mut by_gpu: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    let mut unreported = 0;
    for (i, row) in pod_rows.iter().enumerate() {
        match row.gpu_uuid.as_deref() {
            Some(uuid) => by_gpu.entry(uuid).or_default().push(i),
            // A pending pod never ran: it has no GPU to say.
            None if row.status != CellStatus::Pending => unreported += 1,
            None => {}
        }
    }
    let rows = by_gpu
        .into_iter()
        .map(|(uuid, members)| {
            let statuses: Vec<CellStatus> = members.iter().map(|&i| pod_rows[i].status).collect();
            let mut note = match members.len() {
                1 => format!("1 pod on GPU {uuid}"),
                n => format!("{n} pods on GPU {uuid}"),
            };
            if members.len() != labels.pods as usize {
                note += &format!(" ({} asked on each GPU)", labels.pods);
            }
            let first = &pod_rows[members[0]];
            let mut row = empty_row(
                labels,
                &format!("{GPU_ROW_PREFIX}{uuid}"),
                aggregate_status(&statuses),
                first.source,
                note,
            );
            row.started_at = first.started_at.clone();
            row.gpu_uuid = Some(uuid.to_string());
            row.offered_per_s = labels.offered_per_pod.map(|o| o * members.len() as f64);
            let errors: u64 = members.iter().filter_map(|&i| pod_rows[i].errors).sum();
            let mut total: Option<Histogram> = None;
            for d in members.iter().filter_map(|&i| deltas[i].as_ref()) {
                // Other bucket bounds: left out, as of the cell's aggregate.
                Histogram::pool(&mut total, d.clone());
            }
            if members.iter().any(|&i| pod_rows[i].errors.is_some()) {
                row.errors = Some(errors);
            }
            if let Some(h) = total.filter(|h| h.count > 0.0) {
                let inferences: u64 = members.iter().filter_map(|&i| pod_rows[i].inferences).sum();
                let tput = if cell_secs > 0.0 {
                    inferences as f64 / cell_secs
                } else {
                    members.iter().filter_map(|&i| pod_rows[i].throughput_per_s).sum()
                };
                row.inferences = Some(inferences);
                row.throughput_per_s = Some(tput);
                set_quantiles(&mut row, &h);
                row.duration_s = Some(cell_secs);
                let shares: Vec<f64> = members.iter().map(|&i| effective[i]).collect();
                row.fairness = jain_index(&shares);
                if !members.iter().any(|&i| short.contains(&pod_rows[i].pod)) {
                    judge_slos(&mut row, &SloHistograms::latency(&h), tput, &labels.slos, None);
                }
            }
            row
        })
        .collect();
    (rows, unreported)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Strategy;

    #[test]
    fn a_cells_terminal_line_flags_what_makes_its_numbers_doubtful() {
        let mut agg = CellRecord::unmeasured(
            Strategy::TimeSlicing,
            1,
            crate::results::record::ALL_PODS,
            CellStatus::Ok,
            Source::Scrape,
            DeviceKind::Cpu,
        );
        (agg.mean_s, agg.p99_s, agg.throughput_per_s) = (Some(0.002), Some(0.003), Some(500.0));
        assert!(!cell_summary(std::slice::from_ref(&agg)).contains('['));
        agg.note = "did not settle within 30 s (last 3 windows differ by more than 5%)".into();
        (agg.mean_spread, agg.throughput_spread) = (Some(0.59), Some(0.2));
        let line = cell_summary(std::slice::from_ref(&agg));
        assert!(line.ends_with("  [unsettled: windows differ by 59%]"), "{line}");
        agg.note += "; pod-0 could not keep up with the offered load (their rows say by how much)";
        let line = cell_summary(std::slice::from_ref(&agg));
        assert!(
            line.ends_with("[unsettled: windows differ by 59%]  [a pod could not keep up with its load]"),
            "{line}"
        );
        // Clocks slowed by heat are flagged; "none" and the power cap are not.
        agg.note.clear();
        agg.clock_slowdown = Some("none".into());
        agg.power_capped = Some(0.8);
        assert!(!cell_summary(std::slice::from_ref(&agg)).contains('['));
        agg.clock_slowdown = Some("hardware thermal slowdown in 12 of 30 samples".into());
        let line = cell_summary(std::slice::from_ref(&agg));
        assert!(
            line.ends_with("  [throttled: hardware thermal slowdown in 12 of 30 samples]"),
            "{line}"
        );
    }

    fn snap(at: tokio::time::Instant, bounds: &[f64], count: f64) -> PodSnapshot {
        PodSnapshot {
            at,
            latency: Histogram {
                buckets: bounds
                    .iter()
                    .map(|&b| (b, count))
                    .chain([(f64::INFINITY, count)])
                    .collect(),
                sum: count * 0.001,
                count,
            },
            errors: 0.0,
            backlog: None,
            load_seed: Some(7),
            device_uuid: None,
            last_error: None,
            streamed: None,
            tokens: None,
            server: None,
        }
    }

    fn measured(pods: &[(&str, f64, f64, &[f64])]) -> Measured {
        // (name, seconds between its first and last snapshot, inferences, bucket bounds)
        let t0 = tokio::time::Instant::now();
        let tracked = pods
            .iter()
            .map(|(n, secs, count, bounds)| {
                (
                    n.to_string(),
                    Tracked {
                        first: Some(snap(t0, bounds, 0.0)),
                        last: Some(snap(t0 + Duration::from_secs_f64(*secs), bounds, *count)),
                        state: PodState::Running,
                        problem: None,
                        backlog: Vec::new(),
                        streamed: None,
                    },
                )
            })
            .collect();
        Measured {
            order: pods.iter().map(|p| p.0.to_string()).collect(),
            tracked,
            windows: Vec::new(),
            measured: Duration::from_secs(10),
            summary: TelemetrySummary::default(),
            started_at: String::new(),
        }
    }

    fn labels() -> CellLabels {
        CellLabels {
            run_id: "r".into(),
            arm: Strategy::Mps.into(),
            pods: 2,
            gpus: 1,
            repeat: 1,
            model: "tiny".into(),
            precision: "fp32".into(),
            device: DeviceKind::Cpu,
            offered_per_pod: None,
            slos: Vec::new(),
        }
    }

    fn streamed(ttft: f64, gaps: &[f64]) -> TokenRecord {
        let e2e = ttft + gaps.iter().sum::<f64>();
        let tokens = gaps.len() as u64 + 1;
        TokenRecord {
            arrival_s: 0.0,
            send_delay_s: 0.0,
            ttft_s: Some(ttft),
            e2e_s: Some(e2e),
            itl_s: gaps.to_vec(),
            output_tokens: tokens,
            tokens_from_usage: true,
            prompt_tokens: Some(8),
            tpot_s: (tokens > 1).then(|| (e2e - ttft) / (tokens - 1) as f64),
            error: None,
            prompt_len: Some(8),
            max_tokens: Some(tokens),
        }
    }

    #[test]
    fn token_objectives_are_judged_on_their_own_histograms_and_goodput_per_request() {
        let slo = |t: &str| t.parse::<Slo>().expect("slo");
        // Four requests: first tokens at 0.1, 0.2, 0.3 and 0.9 s; gaps of 10 ms but for
        // one request's three of 80 ms.
        let records = [
            streamed(0.1, &[0.01, 0.01, 0.01]),
            streamed(0.2, &[0.01, 0.01, 0.01]),
            streamed(0.3, &[0.08, 0.08, 0.08]),
            streamed(0.9, &[0.01, 0.01, 0.01]),
        ];
        let slos = [slo("ttft:p50=0.5s"), slo("itl:p50=20ms"), slo("p99=10s")];
        let tally = tally_streamed(&records, &slos);
        let latency = tally.e2e.histogram();
        let mut row = CellRecord::unmeasured(
            Strategy::Mps,
            1,
            "pod-0",
            CellStatus::Ok,
            Source::Client,
            DeviceKind::Cpu,
        );
        set_token_columns(&mut row, &tally, 2.0);
        assert_eq!(
            (row.output_tokens, row.itl_count, row.tpot_count),
            (Some(16), Some(12), Some(4))
        );
        assert_eq!(row.output_tokens_per_s, Some(8.0));
        let hs = SloHistograms::with_tally(&latency, &tally);
        judge_slos(&mut row, &hs, 2.0, &slos, tally.goodput_per_s(2.0));
        // 3 of 4 first tokens within 0.5 s; 9 of 12 gaps within 20 ms: both p50s hold.
        let near = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 0.03);
        assert!(near(row.ttft_slo_attainment, 0.75), "{:?}", row.ttft_slo_attainment);
        assert!(near(row.itl_slo_attainment, 0.75), "{:?}", row.itl_slo_attainment);
        assert_eq!(row.slo_p99_attainment, Some(1.0));
        assert_eq!(row.slo_met, Some(true));
        // Goodput counts the requests that met every objective on their own numbers:
        // not the slow first token, not the one of 80 ms per token.
        assert_eq!(row.goodput_per_s, Some(1.0), "2 good requests over 2 s");
        // A p90 on first tokens fails where the p50 held.
        judge_slos(&mut row, &hs, 2.0, &[slo("ttft:p90=0.5s")], None);
        assert_eq!(row.slo_met, Some(false));
        // Undecided at 4 requests: named by its metric and counted in its own units.
        let open = undecided_slos(&hs, &[slo("itl:p50=20ms")]);
        assert_eq!(open.len(), 1, "{open:?}");
        assert!(
            open[0].starts_with("itl:p50=20ms undecided at 95% after 12 gaps"),
            "{}",
            open[0]
        );
        // An objective on tokens of answers that were not streamed cannot hold.
        judge_slos(
            &mut row,
            &SloHistograms::latency(&latency),
            2.0,
            &[slo("ttft:p50=1s")],
            None,
        );
        assert_eq!(row.slo_met, Some(false));
    }

    #[test]
    fn slo_attainment_from_a_hand_computed_histogram() {
        // 100 requests: 60 within 10 ms, 90 within 20 ms, all within 40 ms.
        let h = Histogram {
            buckets: vec![(0.01, 60.0), (0.02, 90.0), (0.04, 100.0), (f64::INFINITY, 100.0)],
            sum: 1.0,
            count: 100.0,
        };
        let slo = |t: &str| t.parse::<Slo>().expect("slo");
        let mut row = CellRecord::unmeasured(
            Strategy::Mps,
            1,
            "pod-0",
            CellStatus::Ok,
            Source::Scrape,
            DeviceKind::Cpu,
        );
        // At bucket bounds: exact (bound 0).
        judge_slos(
            &mut row,
            &SloHistograms::latency(&h),
            50.0,
            &[slo("p50=10ms"), slo("p90=20ms")],
            None,
        );
        assert_eq!((row.slo_p50_attainment, row.slo_p90_attainment), (Some(0.6), Some(0.9)));
        assert_eq!((row.slo_attainment_bound, row.slo_met), (Some(0.0), Some(true)));
        assert_eq!(row.goodput_per_s, Some(30.0), "50/s × 60% within 10 ms");
        // 15 ms is halfway through the 10–20 ms bucket: 75%, ± the bucket's 30%.
        judge_slos(&mut row, &SloHistograms::latency(&h), 50.0, &[slo("p99=15ms")], None);
        assert_eq!(row.slo_p99_attainment, Some(0.75));
        assert_eq!(row.slo_attainment_bound, Some(0.3));
        assert_eq!(row.slo_met, Some(false));
        assert_eq!(row.goodput_per_s, Some(37.5));
    }

    #[test]
    fn a_cell_ended_with_an_slo_undecided_is_flagged() {
        // 200 requests all within: p99 undecided (299 would show it); 400: decided.
        let m = measured(&[("a", 10.0, 200.0, &[0.002]), ("b", 10.0, 400.0, &[0.002])]);
        let l = CellLabels {
            slos: vec!["p99=20ms".parse().expect("slo")],
            ..labels()
        };
        let rows = cell_rows(&m, &l, Source::Scrape, &settings(), None);
        assert!(
            rows[0].note.contains("undecided at 95% after 200 requests"),
            "{:?}",
            rows[0]
        );
        assert!(!rows[1].note.contains("undecided"), "{:?}", rows[1]);
        let agg = rows.iter().find(|r| r.is_aggregate()).expect("aggregate");
        assert!(agg.note.contains("a left an SLO undecided at 95%"), "{}", agg.note);
        assert!(
            agg.flags()
                .contains(&"an SLO undecided at 95% when the cell ended".to_string()),
            "{:?}",
            agg.flags()
        );
    }

    #[test]
    fn an_slo_is_undecided_until_its_requests_show_it_and_a_pod_without_any_has_none() {
        let slo = |t: &str| t.parse::<Slo>().expect("slo");
        let clean = |n: f64| Histogram {
            buckets: vec![(0.01, n), (0.02, n), (f64::INFINITY, n)],
            sum: n * 0.005,
            count: n,
        };
        // Every request within: 200 cannot show p99 at 95%, 299 can.
        let open = undecided_slos(&SloHistograms::latency(&clean(200.0)), &[slo("p99=20ms")]);
        assert_eq!(open.len(), 1);
        assert!(
            open[0].starts_with("p99=20ms undecided at 95% after 200 requests"),
            "{open:?}"
        );
        assert!(undecided_slos(&SloHistograms::latency(&clean(299.0)), &[slo("p99=20ms")]).is_empty());
        assert!(undecided_slos(&SloHistograms::latency(&clean(0.0)), &[slo("p99=20ms")]).is_empty());
    }

    #[test]
    fn a_pod_is_behind_when_it_fails_drops_or_its_backlog_grows_beyond_its_variation() {
        // A queue that wanders: growth 2, changes 4, −3, 1 (sd 3.6): kept up.
        assert_eq!(fell_behind(100.0, 98.0, 15.0, &[5.0, 9.0, 6.0, 7.0], 0.0), None);
        // The same backlog beside a rate far short of the load: the cross-check catches it.
        let why = fell_behind(100.0, 50.0, 15.0, &[5.0, 9.0, 6.0, 7.0], 0.0).expect("short");
        assert!(
            why.starts_with("served 50.0/s of the 100/s offered") && !why.contains("judged by"),
            "{why}"
        );
        // One that grows by about the same each window.
        let why = fell_behind(125.0, 122.0, 15.0, &[20.0, 33.0, 51.0, 63.0], 0.0).expect("behind");
        assert!(
            why.contains("grew from 20 to 63 requests") && why.contains("could not keep up"),
            "{why}"
        );
        // Its changes (13, 18, 12) vary by 3.2, less than a Poisson count at its mean
        // depth of 41.75 (√83.5 = 9.1): the limit is 3 × 9.1 + 1.
        assert!((backlog_limit(&[20.0, 33.0, 51.0, 63.0]) - (3.0 * 83.5f64.sqrt() + 1.0)).abs() < 1e-9);
        // Changes that vary more than that set the limit.
        assert!((backlog_limit(&[0.0, 10.0, 0.0, 10.0]) - (3.0 * (400.0f64 / 3.0).sqrt() + 1.0)).abs() < 1e-9);
        // One window: a Poisson count's variation at the mean depth.
        assert_eq!(backlog_limit(&[0.0, 8.0]), 3.0 * 8f64.sqrt() + 1.0);
        assert_eq!(fell_behind(100.0, 100.0, 5.0, &[0.0, 10.0], 0.0), None);
        assert!(fell_behind(100.0, 100.0, 5.0, &[0.0, 11.0], 0.0).is_some());
        // An empty queue throughout keeps up.
        assert_eq!(fell_behind(100.0, 100.0, 15.0, &[0.0; 4], 0.0), None);
        // A failed or dropped request: not served, whatever the backlog.
        let why = fell_behind(100.0, 100.0, 15.0, &[0.0; 4], 2.0).expect("errors");
        assert!(why.starts_with("2 of its requests failed or were dropped"), "{why}");
        // No backlog reported: judged by throughput, and said so.
        let why = fell_behind(100.0, 90.0, 10.0, &[], 0.0).expect("short");
        assert!(why.ends_with("(judged by throughput: it reports no backlog)"), "{why}");
        assert_eq!(fell_behind(100.0, 91.0, 10.0, &[3.0], 0.0), None);
        let why = fell_behind(100.0, 90.0, 10.0, &[3.0], 0.0).expect("short");
        assert!(
            why.ends_with("(judged by throughput: it reported its backlog once)"),
            "{why}"
        );
    }

    /// The depth of a single-server FIFO queue (Poisson arrivals at `rate`, exponential
    /// service at `rate / utilisation`) after 5 s of warm-up and then every 5 s, over
    /// `windows` windows: what a pod's backlog samples look like.
    fn simulated_backlog(seed: u64, rate: f64, utilisation: f64, windows: usize) -> Vec<f64> {
        let mut arrivals = crate::client::Arrivals::new(seed, rate);
        let mut service = crate::client::Arrivals::new(seed ^ 0x5DEE_CE66_D1CE_4E5B, rate / utilisation);
        let (mut next_arrival, mut next_departure, mut depth) = (arrivals.gap(), f64::INFINITY, 0u64);
        let mut samples = Vec::new();
        for k in 0..=windows {
            let at = 5.0 + 5.0 * k as f64;
            while next_arrival.min(next_departure) <= at {
                if next_arrival <= next_departure {
                    depth += 1;
                    if depth == 1 {
                        next_departure = next_arrival + service.gap();
                    }
                    next_arrival += arrivals.gap();
                } else {
                    depth -= 1;
                    next_departure = if depth > 0 {
                        next_departure + service.gap()
                    } else {
                        f64::INFINITY
                    };
                }
            }
            samples.push(depth as f64);
        }
        samples
    }

    #[test]
    fn the_backlog_rule_rarely_calls_a_stable_queue_behind_and_catches_a_clear_overload() {
        // 400 simulated pods at 125 requests/s, 3 windows of 5 s (a short cell).
        let share_behind = |utilisation: f64| {
            let behind = (0..400u64)
                .filter(|&seed| {
                    let b = simulated_backlog(seed * 7919 + 1, 125.0, utilisation, 3);
                    fell_behind(125.0, 125.0, 15.0, &b, 0.0).is_some()
                })
                .count();
            behind as f64 / 400.0
        };
        let (at_80, at_90, at_110) = (share_behind(0.8), share_behind(0.9), share_behind(1.1));
        assert!(at_80 <= 0.02, "false alarms at 80% utilisation: {at_80}");
        assert!(at_90 <= 0.04, "false alarms at 90% utilisation: {at_90}");
        assert!(at_110 >= 0.75, "a 10% overload caught in: {at_110}");
    }

    #[test]
    fn a_pod_short_of_its_offered_rate_is_named() {
        // 100/s for 10 s: 1000 arrivals, 3 standard deviations are 9.5%.
        assert_eq!(shortfall(100.0, 91.0, 10.0), None);
        let why = shortfall(100.0, 90.0, 10.0).expect("short");
        assert!(
            why.contains("90.0/s of the 100/s offered") && why.contains("9.5%"),
            "{why}"
        );
        // 1000/s for 60 s: the 5% floor.
        assert_eq!(shortfall(1000.0, 951.0, 60.0), None);
        assert!(shortfall(1000.0, 949.0, 60.0).is_some());
        assert_eq!(shortfall(0.0, 0.0, 10.0), None);
        // In a cell: the pod's row says so, and the aggregate names it.
        let m = measured(&[("a", 10.0, 1000.0, &[0.002]), ("b", 10.0, 500.0, &[0.002])]);
        let l = CellLabels {
            offered_per_pod: Some(100.0),
            ..labels()
        };
        let rows = cell_rows(&m, &l, Source::Scrape, &settings(), None);
        assert_eq!(rows[0].offered_per_s, Some(100.0));
        assert!(rows[0].note.is_empty(), "{}", rows[0].note);
        assert!(rows[1].note.contains("could not keep up"), "{}", rows[1].note);
        let agg = rows.last().expect("aggregate");
        assert_eq!(agg.offered_per_s, Some(200.0));
        assert!(agg.note.contains("b could not keep up"), "{}", agg.note);
    }

    #[test]
    fn a_pod_whose_requests_fail_beyond_five_percent_fails_and_so_does_its_cell() {
        assert_eq!(error_share(95.0, 5.0), None);
        assert_eq!(error_share(0.0, 0.0), None);
        let mut m = measured(&[("a", 10.0, 1000.0, &[0.002]), ("b", 10.0, 8.0, &[0.002])]);
        m.tracked.get_mut("b").and_then(|t| t.last.as_mut()).expect("b").errors = 222.0;
        let rows = cell_rows(&m, &labels(), Source::Scrape, &settings(), None);
        assert_eq!((rows[0].status, rows[1].status), (CellStatus::Ok, CellStatus::Failed));
        assert!(
            rows[1].note.contains("222 of its 230 requests failed"),
            "{}",
            rows[1].note
        );
        let agg = rows.last().expect("aggregate");
        assert_eq!(agg.status, CellStatus::Failed);
        assert!(agg.note.contains("b failed: 222 of its 230"), "{}", agg.note);
        // 4% lost: still the pod's measurement.
        let mut m = measured(&[("a", 10.0, 960.0, &[0.002])]);
        m.tracked.get_mut("a").and_then(|t| t.last.as_mut()).expect("a").errors = 40.0;
        assert_eq!(
            cell_rows(&m, &labels(), Source::Scrape, &settings(), None)[0].status,
            CellStatus::Ok
        );
    }

    #[test]
    fn a_cell_that_completed_nothing_says_nothing_about_settling() {
        let mut m = measured(&[("a", 10.0, 0.0, &[0.002])]);
        let w = crate::stats::WindowStat {
            throughput: 0.0,
            mean: f64::NAN,
            p50: f64::NAN,
        };
        m.windows = vec![w; 3];
        let agg = cell_rows(&m, &labels(), Source::Scrape, &settings(), None)
            .pop()
            .expect("aggregate");
        assert_eq!(agg.status, CellStatus::Failed);
        assert!(
            !agg.note.contains("did not settle") && agg.flags().is_empty(),
            "{}",
            agg.note
        );
    }

    #[test]
    fn the_clocks_limits_go_into_the_aggregate_row_and_its_flags() {
        let mut m = measured(&[("a", 10.0, 1000.0, &[0.002])]);
        m.summary.clocks = Some(crate::telemetry::ClockLimits::of([0x40, 0x4, 0x4, 0x0]));
        let rows = cell_rows(&m, &labels(), Source::Scrape, &settings(), None);
        let agg = rows.last().expect("aggregate");
        assert_eq!(
            agg.clock_slowdown.as_deref(),
            Some("hardware thermal slowdown in 1 of 4 samples")
        );
        assert_eq!(agg.power_capped, Some(0.5));
        assert!(agg.flags().iter().any(|f| f.starts_with("throttled: ")));
        assert_eq!(rows[0].clock_slowdown, None, "a pod's row has no telemetry");
    }

    #[test]
    fn a_cell_on_two_gpus_has_a_row_per_gpu_and_the_pooled_aggregate() {
        // Two pods per GPU on two GPUs, a fifth that said no GPU; GPU "b…" has the faster pods.
        let mut m = measured(&[
            ("p1", 10.0, 100.0, &[0.002]),
            ("p2", 10.0, 300.0, &[0.002]),
            ("p3", 10.0, 1000.0, &[0.002]),
            ("p4", 10.0, 1000.0, &[0.002]),
            ("p5", 10.0, 100.0, &[0.002]),
        ]);
        for (pod, uuid) in [("p1", "aaaa"), ("p2", "aaaa"), ("p3", "bbbb"), ("p4", "bbbb")] {
            let t = m.tracked.get_mut(pod).expect("pod");
            for s in [t.first.as_mut(), t.last.as_mut()].into_iter().flatten() {
                s.device_uuid = Some(uuid.into());
            }
        }
        let l = CellLabels {
            pods: 2,
            gpus: 2,
            offered_per_pod: None,
            ..labels()
        };
        let rows = cell_rows(&m, &l, Source::Scrape, &settings(), None);
        let pods: Vec<&str> = rows.iter().map(|r| r.pod.as_str()).collect();
        assert_eq!(pods, ["p1", "p2", "p3", "p4", "p5", "gpu:aaaa", "gpu:bbbb", "all"]);
        assert_eq!(rows[0].gpu_uuid.as_deref(), Some("aaaa"));
        assert!(rows[0].is_pod() && !rows[5].is_pod() && rows[5].is_gpu_row());
        let (g0, g1, all) = (&rows[5], &rows[6], &rows[7]);
        assert_eq!(g0.gpu_uuid.as_deref(), Some("aaaa"));
        assert_eq!(
            (g0.inferences, g1.inferences, all.inferences),
            (Some(400), Some(2000), Some(2500))
        );
        assert_eq!((g0.throughput_per_s, g1.throughput_per_s), (Some(40.0), Some(200.0)));
        // Fairness among a GPU's own pods: 10/s and 30/s → (40²)/(2·(100+900)) = 0.8.
        assert!((g0.fairness.expect("fairness") - 0.8).abs() < 1e-9);
        assert_eq!(g1.fairness, Some(1.0));
        assert!(g0.note.starts_with("2 pods on GPU aaaa"), "{}", g0.note);
        assert_eq!(all.gpus, Some(2));
        assert_eq!(all.pods_asked(), 4);
        assert!(all.note.contains("in no GPU's row: 1"), "{}", all.note);
        // Every aggregate of such a cell, measured or not, says how many GPUs it filled and
        // offers all their pods' load.
        let offered = CellLabels {
            offered_per_pod: Some(10.0),
            ..l.clone()
        };
        let agg = cell_rows(&m, &offered, Source::Scrape, &settings(), None)
            .pop()
            .expect("agg");
        assert_eq!((agg.gpus, agg.offered_per_s), (Some(2), Some(40.0)));
        let skipped = unavailable_rows(&offered, Source::Scrape, "no MIG").pop().expect("row");
        assert_eq!(
            (skipped.gpus, skipped.offered_per_s, skipped.pods_asked()),
            (Some(2), Some(40.0), 4)
        );
        // One GPU, as every run but a multi-GPU node's: no GPU rows.
        let rows = cell_rows(&m, &labels(), Source::Scrape, &settings(), None);
        assert!(rows.iter().all(|r| !r.is_gpu_row()) && rows.last().expect("agg").gpus.is_none());
    }

    fn settings() -> MeasureSettings {
        MeasureSettings {
            ready_timeout: Duration::from_secs(1),
            warmup: Duration::ZERO,
            steady_warmup: false,
            window: Duration::from_secs(1),
            max_cell: Duration::from_secs(10),
            stable_windows: 3,
            tolerance: 0.05,
        }
    }

    #[test]
    fn the_cell_throughput_and_fairness_share_one_time_base() {
        // Two pods at 100/s; one was only measured for 2 of the cell's 10 s.
        let m = measured(&[("a", 10.0, 1000.0, &[0.002]), ("b", 2.0, 200.0, &[0.002])]);
        let rows = cell_rows(&m, &labels(), Source::Scrape, &settings(), None);
        let agg = rows.last().expect("aggregate");
        assert_eq!(
            agg.throughput_per_s,
            Some(120.0),
            "1200 inferences in 10 s, not 100 + 100"
        );
        assert_eq!(
            rows[1].throughput_per_s,
            Some(100.0),
            "the pod's own row keeps its own rate"
        );
        // Each pod's row carries the arrival seed it reported; the cell's has none.
        assert_eq!(
            (rows[0].load_seed, rows[1].load_seed, agg.load_seed),
            (Some(7), Some(7), None)
        );
    }

    #[test]
    fn a_pod_with_other_buckets_is_named_not_silently_dropped() {
        let m = measured(&[("a", 10.0, 1000.0, &[0.002]), ("b", 10.0, 1000.0, &[0.001, 0.002])]);
        let rows = cell_rows(&m, &labels(), Source::Scrape, &settings(), None);
        assert!(rows[1].note.contains("other bucket bounds"), "{}", rows[1].note);
        let agg = rows.last().expect("aggregate");
        assert!(agg.note.contains("b left out of the cell's quantiles"), "{}", agg.note);
        assert_eq!(agg.throughput_per_s, Some(200.0), "its inferences still count");
    }

    #[test]
    fn aggregate_status_rules() {
        use CellStatus::*;
        assert_eq!(aggregate_status(&[Ok, Pending, Pending]), Ok);
        assert_eq!(aggregate_status(&[Ok, Oom, Failed]), Oom);
        assert_eq!(aggregate_status(&[Ok, Failed]), Failed);
        assert_eq!(aggregate_status(&[Pending]), Pending);
    }

    #[test]
    fn pod_status_maps_exit_code_4_to_oom() {
        let (s, code, note) = pod_status(
            &PodState::Exited {
                code: Some(4),
                detail: "x".into(),
            },
            &None,
        );
        assert_eq!((s, code), (CellStatus::Oom, Some(4)));
        assert!(note.contains("out of GPU memory"));
        let (s, code, _) = pod_status(
            &PodState::Exited {
                code: Some(1),
                detail: "x".into(),
            },
            &None,
        );
        assert_eq!((s, code), (CellStatus::Failed, Some(1)));
        assert_eq!(
            pod_status(&PodState::Running, &Some("scrape".into())).0,
            CellStatus::Failed
        );
    }
}
