//! `compare BASELINE CANDIDATE`: per cell, the change in mean latency, p99 and aggregate
//! throughput, flagged as a regression only when it is worse by more than the threshold
//! *and* by more than the noise *and*, for p99, by more than the quantiles' resolution.
//!
//! The noise is the between-run noise when a run repeated the cell (`--repeat`): half
//! the width of the 95% interval of the difference of the two means — Welch's when both
//! repeated it, else with the repeated run's variance standing for both. Otherwise it is
//! what the runs recorded: the larger window-to-window spread of the two cells (of the
//! exact per-window mean for latency, of throughput). The resolution of a p99 change is
//! the sum of the two cells' quantile resolutions: each p99 can be off by its own. A
//! run that records no resolution (made before the workload's finer buckets) has p99
//! values that are bucket bounds up to 9.6% apart: its p99 changes are shown, never
//! judged, and a notice says so.
//!
//! A cell of the baseline that the candidate lacks fails as `missing`; runs of different
//! models, precisions, batches, devices or GPUs are not compared at all.

use std::ops::Deref;
use std::path::Path;

use crate::domain::{Arm, CellStatus};
use crate::error::{BenchError, Result};
use crate::results::record::CellRecord;
use crate::stats::interval::difference_half_width;

use super::RunData;

/// What a compared cell amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Measured in both runs, no regression.
    Ok,
    /// Worse beyond threshold and noise, or a measured cell that no longer measures.
    Regression,
    /// In the baseline, not in the candidate: a failure.
    Missing,
    /// The status changed without a loss (e.g. unavailable → ok).
    StatusChanged,
    /// Not measured in either run (e.g. MIG unavailable in both): nothing to compare.
    NotMeasured,
}

/// Where a cell's noise comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoiseSource {
    /// A run repeated the cell: the 95% interval of the difference of means over repeats.
    Repeats,
    /// A run measured the cell once: the window-to-window spreads the two runs recorded.
    Windows,
    /// The runs ran on different GPUs: the between-host noise measured for the model
    /// (`results/host-noise.jsonl`) where it is wider than the runs' own.
    Hosts,
}

/// The noise of one cell's changes, relative to the baseline (0.02 = 2%).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Noise {
    /// Of the mean latency.
    pub mean: f64,
    /// Of p99 (noise, not resolution).
    pub p99: f64,
    /// Of aggregate throughput.
    pub throughput: f64,
    /// Of p99: the two cells' quantile resolutions added (0 when a run records none).
    pub resolution: f64,
    /// Where the noise comes from.
    pub source: NoiseSource,
}

impl Noise {
    /// The band a change of `metric` is judged against: its own noise, and for p99 the
    /// resolution where that is wider.
    pub fn band(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Mean => self.mean,
            Metric::P99 => self.p99.max(self.resolution),
            Metric::Throughput => self.throughput,
        }
    }
}

/// A metric `compare` judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Mean latency.
    Mean,
    /// p99 latency.
    P99,
    /// Aggregate throughput.
    Throughput,
}

impl Metric {
    /// All three, in the table's order.
    pub const ALL: [Metric; 3] = [Metric::Mean, Metric::P99, Metric::Throughput];

    /// Its name in a verdict.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Mean => "mean latency",
            Metric::P99 => "p99 latency",
            Metric::Throughput => "throughput",
        }
    }
}

/// One compared cell.
#[derive(Debug, Clone, PartialEq)]
pub struct CellComparison {
    /// Strategy, and time-slicing's DRA interval.
    pub arm: Arm,
    /// Pods.
    pub pods: u32,
    /// Relative change of the mean latency (+0.1 = 10% slower).
    pub mean: Option<f64>,
    /// Relative change of p99.
    pub p99: Option<f64>,
    /// Relative change of aggregate throughput (−0.1 = 10% fewer inferences/s).
    pub throughput: Option<f64>,
    /// The noise each change is judged against.
    pub noise: Noise,
    /// Why this cell fails: its regressions, or that the candidate lacks it (empty: it
    /// passes).
    pub regressions: Vec<String>,
    /// Status change, e.g. "ok → oom".
    pub status: Option<String>,
    /// The verdict column.
    pub verdict: Verdict,
    /// What to read with care in either run's cell (unsettled, a pod behind its load,
    /// an SLO undecided, throttled): the changes are built on it. Empty: nothing.
    pub care: Vec<String>,
}

impl CellComparison {
    /// Whether this cell makes `compare` fail (a regression or a missing cell).
    pub fn is_failure(&self) -> bool {
        !self.regressions.is_empty()
    }

    /// The relative change of `metric`.
    pub fn change(&self, metric: Metric) -> Option<f64> {
        match metric {
            Metric::Mean => self.mean,
            Metric::P99 => self.p99,
            Metric::Throughput => self.throughput,
        }
    }

    /// Whether the change of `metric` is inside its own noise band (None: no change to
    /// judge, or a p99 of a run that records no resolution, which is not judged).
    pub fn within_noise(&self, metric: Metric) -> Option<bool> {
        let x = self.change(metric)?;
        if metric == Metric::P99 && self.noise.resolution == 0.0 {
            return None;
        }
        Some(x.abs() <= self.noise.band(metric))
    }

    /// The changes, better or worse, larger than their own noise band: "mean latency
    /// +2.1% (noise ±0.3%)".
    pub fn beyond_noise(&self) -> Vec<String> {
        Metric::ALL
            .into_iter()
            .filter(|&m| self.within_noise(m) == Some(false))
            .filter_map(|m| {
                let x = self.change(m)?;
                Some(format!(
                    "{} {:+.1}% (noise ±{:.1}%)",
                    m.name(),
                    x * 100.0,
                    self.noise.band(m) * 100.0
                ))
            })
            .collect()
    }
}

/// A comparison of two runs: one row per baseline cell, and the notices a reader must
/// see before trusting it (a partial candidate), one line each.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// One row per cell of the baseline, in its order.
    pub rows: Vec<CellComparison>,
    /// Lines for stderr, e.g. that the candidate is partial.
    pub notices: Vec<String>,
}

impl Comparison {
    /// Why nothing could be judged: the baseline measured none of its cells (each failed,
    /// was unavailable or pending), so no change can pass or fail (None: some was).
    pub fn nothing_compared(&self) -> Option<String> {
        let judged = |r: &CellComparison| matches!(r.verdict, Verdict::Ok | Verdict::Regression | Verdict::Missing);
        (!self.rows.iter().any(judged)).then(|| {
            format!(
                "the baseline measured none of its {} cells (each failed, was unavailable or pending): no change can be judged",
                self.rows.len()
            )
        })
    }

    /// Rows that fail (regressions and missing cells).
    pub fn failures(&self) -> usize {
        self.rows.iter().filter(|r| r.is_failure()).count()
    }

    /// When a row fails, the line that says how many regressed and how many are missing.
    pub fn failure_summary(&self) -> Option<String> {
        let regressed = self.rows.iter().filter(|r| r.verdict == Verdict::Regression).count();
        let missing = self.rows.iter().filter(|r| r.verdict == Verdict::Missing).count();
        (regressed + missing > 0).then(|| {
            format!(
                "{regressed} of {} cells regressed, {missing} missing from the candidate",
                self.rows.len()
            )
        })
    }
}

/// `compare BASELINE CANDIDATE --threshold T`: loads both run directories and compares
/// them; runs that share no cell are an error naming both.
pub fn compare_dirs(
    baseline: &Path,
    candidate: &Path,
    threshold: &str,
    host_noise: Option<&Path>,
) -> Result<Comparison> {
    let threshold = parse_threshold(threshold)?;
    let hosts = match host_noise {
        Some(path) => {
            let text = crate::files::read_text(path, crate::files::limits::RECORD)
                .map_err(|e| BenchError::flag("--host-noise", &path.display().to_string(), e.to_string()))?;
            super::host_noise::parse(&text, &path.display().to_string())?
        }
        None => super::host_noise::parse(super::host_noise::COMMITTED, "results/host-noise.jsonl")?,
    };
    let base = RunData::load(baseline)?;
    let cand = RunData::load(candidate)?;
    let cmp = compare_runs_with(&base, &cand, threshold, &hosts)?;
    if cmp.rows.is_empty() {
        return Err(BenchError::RunDir {
            path: candidate.to_path_buf(),
            reason: format!("shares no cell with {}", baseline.display()),
        });
    }
    if let Some(reason) = cmp.nothing_compared() {
        return Err(BenchError::RunDir {
            path: baseline.to_path_buf(),
            reason,
        });
    }
    Ok(cmp)
}

impl Deref for Comparison {
    type Target = [CellComparison];
    fn deref(&self) -> &[CellComparison] {
        &self.rows
    }
}

/// The largest threshold accepted: 1000%.
pub const MAX_THRESHOLD: f64 = 10.0;

/// Parses "5%" or "0.5%" (a bare number is refused: it could mean a fraction or percent); accepts more than 0% and
/// at most 1000%.
pub fn parse_threshold(text: &str) -> Result<f64> {
    let t = text.trim();
    // A bare number is refused: 0.5 read as a fraction is 50%, read as percent 0.5%,
    // and a band a hundred times too loose passes every regression.
    let Some(number) = t.strip_suffix('%') else {
        return Err(BenchError::flag(
            "--threshold",
            text,
            format!("write the percent sign, e.g. {t}% (a bare number could mean a fraction or percent)"),
        ));
    };
    let v: f64 = number
        .trim()
        .parse()
        .map_err(|_| BenchError::flag("--threshold", text, "expected a percentage such as 5%"))?;
    let frac = v / 100.0;
    if !(frac > 0.0 && frac <= MAX_THRESHOLD) {
        return Err(BenchError::flag(
            "--threshold",
            text,
            "expected a percentage above 0% and at most 1000%",
        ));
    }
    Ok(frac)
}

pub(crate) fn rel(base: Option<f64>, cand: Option<f64>) -> Option<f64> {
    match (base, cand) {
        (Some(b), Some(c)) if b > 0.0 && b.is_finite() && c.is_finite() => Some(c / b - 1.0),
        _ => None,
    }
}

/// A cell's recorded window-to-window latency noise: of the exact per-window mean, or
/// of the median in runs recorded before it.
fn latency_spread(r: &CellRecord) -> f64 {
    r.mean_spread.or(r.p50_spread).unwrap_or(0.0)
}

/// The noise of a cell's changes: between repeats when both runs repeated it, else the
/// window spreads the two cells recorded; the p99 resolution either way.
fn noise(base: &RunData, cand: &RunData, b: &CellRecord, c: &CellRecord) -> Noise {
    let (s, p) = (b.arm(), b.pods);
    let resolution = b.quantile_resolution.unwrap_or(0.0) + c.quantile_resolution.unwrap_or(0.0);
    let between = |f: fn(&CellRecord) -> Option<f64>| -> Option<f64> {
        let (ib, ic) = (base.interval(s, p, f)?, cand.interval(s, p, f)?);
        let h = difference_half_width(&ib, &ic)?;
        (ib.mean > 0.0).then(|| h / ib.mean)
    };
    if let (Some(mean), Some(p99), Some(throughput)) = (
        between(|r| r.mean_s),
        between(|r| r.p99_s),
        between(|r| r.throughput_per_s),
    ) {
        return Noise {
            mean,
            p99,
            throughput,
            resolution,
            source: NoiseSource::Repeats,
        };
    }
    window_noise(b, c)
}

/// A cell's noise widened to the between-host bands where the runs ran on different
/// GPUs of a measured model (pure): each metric's noise is at least its band, and the
/// source says hosts when any band was the wider.
fn with_hosts(noise: Noise, host: Option<&super::host_noise::HostNoise>) -> Noise {
    let Some(h) = host else { return noise };
    let wider = h.mean > noise.mean || h.p99 > noise.p99 || h.throughput > noise.throughput;
    Noise {
        mean: noise.mean.max(h.mean),
        p99: noise.p99.max(h.p99),
        throughput: noise.throughput.max(h.throughput),
        resolution: noise.resolution,
        source: if wider { NoiseSource::Hosts } else { noise.source },
    }
}

/// The half-width of a row's p99 95% sampling interval, seconds (None: the row records
/// no bounded interval).
fn p99_half_width(r: &CellRecord) -> Option<f64> {
    let (lo, hi) = (r.p99_low_s?, r.p99_high_s?);
    (hi >= lo).then(|| (hi - lo) / 2.0)
}

/// The sampling noise of a change between two p99s, relative to the baseline's p99 (as
/// the change is): their 95% half-widths combined (root sum of squares, as for
/// independent estimates); None unless both have one.
fn p99_sampling_noise(b: &CellRecord, c: &CellRecord) -> Option<f64> {
    let (hb, hc, base) = (p99_half_width(b)?, p99_half_width(c)?, b.p99_s?);
    (base > 0.0).then(|| (hb * hb + hc * hc).sqrt() / base)
}

/// The noise of the changes between two single measurements of a cell (pure): the
/// larger window-to-window spread of the two (for p99, the two p99s' sampling
/// intervals combined where both rows record one), and their quantile resolutions added.
pub(crate) fn window_noise(b: &CellRecord, c: &CellRecord) -> Noise {
    let lat = latency_spread;
    let latency = lat(b).max(lat(c));
    Noise {
        mean: latency,
        p99: p99_sampling_noise(b, c).unwrap_or(latency),
        throughput: b
            .throughput_spread
            .unwrap_or(0.0)
            .max(c.throughput_spread.unwrap_or(0.0)),
        resolution: b.quantile_resolution.unwrap_or(0.0) + c.quantile_resolution.unwrap_or(0.0),
        source: NoiseSource::Windows,
    }
}

fn compare_cell(
    base: &RunData,
    cand: &RunData,
    b: &CellRecord,
    c: &CellRecord,
    threshold: f64,
    host: Option<&super::host_noise::HostNoise>,
) -> CellComparison {
    let noise = with_hosts(noise(base, cand, b, c), host);
    let mut out = CellComparison {
        arm: b.arm(),
        pods: b.pods,
        mean: rel(b.mean_s, c.mean_s),
        p99: rel(b.p99_s, c.p99_s),
        throughput: rel(b.throughput_per_s, c.throughput_per_s),
        noise,
        regressions: Vec::new(),
        status: (b.status != c.status).then(|| format!("{} → {}", b.status, c.status)),
        verdict: Verdict::Ok,
        care: care(base, b, "baseline")
            .into_iter()
            .chain(care(cand, c, "candidate"))
            .collect(),
    };
    if b.status == CellStatus::Ok && c.status != CellStatus::Ok {
        out.regressions
            .push(format!("status {} → {}: {}", b.status, c.status, c.note));
        out.verdict = Verdict::Regression;
        return out;
    }
    if b.status != CellStatus::Ok && c.status != CellStatus::Ok {
        // Nothing was measured in either run: no change to judge, nor an "ok" to claim.
        out.verdict = if b.status == c.status {
            Verdict::NotMeasured
        } else {
            Verdict::StatusChanged
        };
        return out;
    }
    if out.status.is_some() {
        out.verdict = Verdict::StatusChanged;
    }
    if let Some(why) = measured_less(b, c) {
        out.regressions.push(why);
        out.verdict = Verdict::Regression;
        return out;
    }
    let source = match noise.source {
        NoiseSource::Repeats => "between repeats",
        NoiseSource::Windows => "within cells",
        NoiseSource::Hosts => "between hosts",
    };
    let worse = |change: Option<f64>, noise: f64, resolution: f64, what: &str, out: &mut Vec<String>| {
        if let Some(x) = change
            && x > threshold
            && x > noise
            && x > resolution
        {
            let res = if resolution > 0.0 {
                format!(", resolution ±{:.1}%", resolution * 100.0)
            } else {
                String::new()
            };
            out.push(format!(
                "{what} {:+.1}% (threshold {:.1}%, noise ±{:.1}% {source}{res})",
                x * 100.0,
                threshold * 100.0,
                noise * 100.0
            ));
        }
    };
    let mut r = Vec::new();
    worse(out.mean, noise.mean, 0.0, "mean latency", &mut r);
    if b.quantile_resolution.is_some() && c.quantile_resolution.is_some() {
        worse(out.p99, noise.p99, noise.resolution, "p99 latency", &mut r);
    }
    worse(
        out.throughput.map(|t| -t),
        noise.throughput,
        0.0,
        "throughput drop",
        &mut r,
    );
    if !r.is_empty() {
        out.verdict = Verdict::Regression;
    }
    out.regressions = r;
    out
}

/// Why a candidate cell that says `ok` has less to judge than its baseline: it completed
/// no inference, or lost a number the baseline measured (None: it has them all).
fn measured_less(b: &CellRecord, c: &CellRecord) -> Option<String> {
    let errors = match c.errors {
        Some(n) if n > 0 => format!(" ({n} errors)"),
        _ => String::new(),
    };
    if c.mean_s.is_none() && c.throughput_per_s.is_none_or(|t| t <= 0.0) {
        return Some(format!("measured nothing: no inference completed{errors}"));
    }
    let lost: Vec<&str> = [
        ("mean latency", b.mean_s, c.mean_s),
        ("p99 latency", b.p99_s, c.p99_s),
        ("throughput", b.throughput_per_s, c.throughput_per_s),
    ]
    .into_iter()
    .filter(|(_, base, cand)| base.is_some() && cand.is_none())
    .map(|(what, ..)| what)
    .collect();
    (!lost.is_empty()).then(|| format!("lost its {}{errors}", lost.join(", ")))
}

/// The flags of a run's measured passes of a cell, each named by the run ("baseline:
/// unsettled: windows differ by 26%").
fn care(data: &RunData, row: &CellRecord, which: &str) -> Vec<String> {
    data.flags(row.arm(), row.pods)
        .into_iter()
        .map(|f| format!("{which}: {f}"))
        .collect()
}

/// The row of a baseline cell the candidate lacks: a failure.
fn missing_cell(b: &CellRecord, cand: &RunData) -> CellComparison {
    let why = if cand.run.is_complete() {
        "missing: not in the candidate run".to_string()
    } else {
        format!("missing: not in the candidate run (its state is {:?})", cand.run.state)
    };
    CellComparison {
        arm: b.arm(),
        pods: b.pods,
        mean: None,
        p99: None,
        throughput: None,
        noise: Noise {
            mean: latency_spread(b),
            p99: latency_spread(b),
            throughput: b.throughput_spread.unwrap_or(0.0),
            resolution: b.quantile_resolution.unwrap_or(0.0),
            source: NoiseSource::Windows,
        },
        regressions: vec![why],
        status: None,
        verdict: Verdict::Missing,
        care: Vec::new(),
    }
}

/// Refuses to compare runs that measured different things: the kind of run (a sweep, a
/// capacity search, an isolation run), model, precision, batch, load, SLOs, device (cuda
/// vs cpu), GPU, or the GPUs each cell filled. The error names the candidate's run.json and both values of every
/// field that differs.
pub fn check_comparable(base: &RunData, cand: &RunData) -> Result<()> {
    let (b, c) = (&base.run.plan, &cand.run.plan);
    let mut differ = Vec::new();
    let mut field = |name: &str, bv: String, cv: String| {
        if bv != cv {
            differ.push(format!("{name} {bv} (baseline) vs {cv} (candidate)"));
        }
    };
    field("kind", base.run.kind.command().into(), cand.run.kind.command().into());
    field("model", b.model.clone(), c.model.clone());
    field("precision", b.precision.clone(), c.precision.clone());
    field("batch", b.batch.to_string(), c.batch.to_string());
    field("load", b.load.to_string(), c.load.to_string());
    let slos = |p: &crate::results::record::PlanRecord| {
        let l: Vec<String> = p.slos.iter().map(ToString::to_string).collect();
        if l.is_empty() { "none".to_string() } else { l.join(",") }
    };
    field("SLOs", slos(b), slos(c));
    field("device", b.device.name().into(), c.device.name().into());
    // A node's cells that filled several GPUs pool them: not comparable with one GPU's.
    let filled = |r: &RunData| r.run.environment.gpus_filled.unwrap_or(1).to_string();
    field("GPUs filled per cell", filled(base), filled(cand));
    // GPUs only when both runs name one: a run without NVML records none.
    if let (Some(bg), Some(cg)) = (base.run.environment.gpus.first(), cand.run.environment.gpus.first())
        && b.device == c.device
    {
        field("GPU", format!("{:?}", bg.name), format!("{:?}", cg.name));
    }
    if differ.is_empty() {
        return Ok(());
    }
    Err(BenchError::RunDir {
        path: cand.dir.join("run.json"),
        reason: format!(
            "cannot compare with baseline {}: {}",
            base.dir.display(),
            differ.join("; ")
        ),
    })
}

/// Compares two runs: refuses runs that are not comparable ([`check_comparable`]), then
/// one row per baseline cell, with a notice when the candidate is partial.
pub fn compare_runs(base: &RunData, cand: &RunData, threshold: f64) -> Result<Comparison> {
    let hosts = super::host_noise::parse(super::host_noise::COMMITTED, "results/host-noise.jsonl")?;
    compare_runs_with(base, cand, threshold, &hosts)
}

/// [`compare_runs`] with the between-host noise measurements `hosts`: when the runs
/// ran on different GPUs of a model measured there, each metric's noise is at least
/// that model's between-host band.
pub fn compare_runs_with(
    base: &RunData,
    cand: &RunData,
    threshold: f64,
    hosts: &[super::host_noise::HostNoise],
) -> Result<Comparison> {
    check_comparable(base, cand)?;
    let mut notices = Vec::new();
    let (b_gpus, c_gpus) = (super::host_noise::gpu_uuids(base), super::host_noise::gpu_uuids(cand));
    let host = super::host_noise::between(base, cand, hosts);
    if super::host_noise::on_different_gpus(base, cand) {
        match host {
            Some(h) => notices.push(format!(
                "the runs ran on different GPUs ({} and {}): each change is judged against at least the between-host noise measured on {} {} GPUs (mean ±{:.1}%, p99 ±{:.1}%, throughput ±{:.1}%)",
                b_gpus.join(","),
                c_gpus.join(","),
                h.runs.len(),
                h.gpu_name,
                h.mean * 100.0,
                h.p99 * 100.0,
                h.throughput * 100.0
            )),
            None => notices.push(format!(
                "the runs ran on different GPUs ({} and {}), and no between-host noise is measured for this GPU model: the bands are the runs' own, which understate the difference between cards",
                b_gpus.join(","),
                c_gpus.join(",")
            )),
        }
    }
    for (which, run) in [("baseline", base), ("candidate", cand)] {
        if !run.run.is_complete() {
            notices.push(format!(
                "{which} {} is a partial run (state {:?}, not \"complete\"): cells it lacks were never measured",
                run.dir.display(),
                run.run.state
            ));
        }
    }
    let rows = rows(base, cand, threshold, host);
    for (which, run) in [("baseline", base), ("candidate", cand)] {
        let unresolved = run.cells.iter().any(|c| {
            c.is_aggregate() && c.status == CellStatus::Ok && c.p99_s.is_some() && c.quantile_resolution.is_none()
        });
        if unresolved {
            notices.push(format!(
                "p99 changes are not judged: the {which} {} records no quantile resolution (a run made before the workload's schema-5 buckets, whose p99 are bucket bounds up to 9.6% apart)",
                run.dir.display()
            ));
        }
    }
    Ok(Comparison { rows, notices })
}

/// One row per cell of the baseline (in its plan's order; repeats combined): compared
/// when the candidate has it, `missing` (a failure) when it does not.
fn rows(
    base: &RunData,
    cand: &RunData,
    threshold: f64,
    host: Option<&super::host_noise::HostNoise>,
) -> Vec<CellComparison> {
    base.arms()
        .into_iter()
        .flat_map(|s| base.run.plan.pods.iter().map(move |&p| (s, p)))
        .filter_map(|(s, p)| base.aggregate(s, p))
        .map(|b| match cand.aggregate(b.arm(), b.pods) {
            Some(c) => compare_cell(base, cand, &b, &c, threshold, host),
            None => missing_cell(&b, cand),
        })
        .collect()
}

/// The rows of [`compare_runs`], or none when the runs are not comparable (then the
/// caller's "shares no cell" refusal applies; [`compare_runs`] says why).
pub fn compare(base: &RunData, cand: &RunData, threshold: f64) -> Vec<CellComparison> {
    compare_runs(base, cand, threshold).map_or_else(|_| Vec::new(), |c| c.rows)
}

/// The comparison as a text table: each metric's change beside its own noise band
/// (p99's: its noise or the resolution, whichever is wider), and a verdict that names
/// every change beyond its band, regression or not.
pub fn render(rows: &[CellComparison]) -> String {
    let cell = |r: &CellComparison, m: Metric| match r.change(m) {
        None => "-".to_string(),
        Some(x) if m == Metric::P99 && r.noise.resolution == 0.0 => format!("{:+.1}% ±?", x * 100.0),
        Some(x) => format!("{:+.1}% ±{:.1}%", x * 100.0, r.noise.band(m) * 100.0),
    };
    let mut s = format!(
        "{:<13} {:>4}  {:>15} {:>15} {:>15}  verdict\n",
        "strategy", "pods", "mean", "p99", "throughput"
    );
    for r in rows {
        let verdict = match r.verdict {
            Verdict::Regression => format!("REGRESSION: {}", r.regressions.join("; ")),
            Verdict::Missing => r.regressions.join("; "),
            Verdict::StatusChanged => format!("status {}", r.status.as_deref().unwrap_or("changed")),
            Verdict::NotMeasured => "—".into(),
            Verdict::Ok => match r.beyond_noise() {
                b if b.is_empty() => "ok, within noise".into(),
                b => format!("ok; beyond noise: {}", b.join(", ")),
            },
        };
        // The changes are built on these cells: say so beside every verdict.
        let verdict = if r.care.is_empty() {
            verdict
        } else {
            format!("{verdict} ⚑ read with care: {}", r.care.join("; "))
        };
        s.push_str(&format!(
            "{:<13} {:>4}  {:>15} {:>15} {:>15}  {verdict}\n",
            r.arm.title(),
            r.pods,
            cell(r, Metric::Mean),
            cell(r, Metric::P99),
            cell(r, Metric::Throughput),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::domain::Strategy;

    fn fixture(name: &str) -> RunData {
        RunData::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)).expect("fixture")
    }

    #[test]
    fn thresholds() {
        assert_eq!(parse_threshold("5%").ok(), Some(0.05));
        assert_eq!(parse_threshold("0.5%").ok(), Some(0.005));
        assert_eq!(parse_threshold("12.5%").ok(), Some(0.125));
        // A bare number is ambiguous (0.99 meant 99%, 1 meant 1%): refused.
        for bare in ["0.99", "1", "0.5", "5"] {
            let e = parse_threshold(bare).map_err(|e| e.to_string()).err();
            assert!(
                e.as_deref().is_some_and(|e| e.contains("write the percent sign")),
                "{bare}: {e:?}"
            );
        }
        assert_eq!(parse_threshold("100%").ok(), Some(1.0));
        assert_eq!(parse_threshold("1000%").ok(), Some(10.0));
        for bad in ["-3%", "lots", "0%", "0", "1000.5%", "NaN%", "inf", ""] {
            assert!(parse_threshold(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(
            parse_threshold("0%").map_err(|e| e.to_string()).err().as_deref(),
            Some("bad --threshold `0%`: expected a percentage above 0% and at most 1000%")
        );
    }

    #[test]
    fn runs_whose_cells_all_failed_have_nothing_to_compare() {
        let mut failed = fixture("h100-run");
        for r in failed.cells.iter_mut().filter(|r| r.status == CellStatus::Ok) {
            r.status = CellStatus::Failed;
        }
        let c = compare_runs(&failed, &failed, 0.05).expect("comparable");
        assert_eq!(c.failures(), 0, "nothing fails: the old exit 0");
        let why = c.nothing_compared().expect("nothing judged");
        assert!(why.contains("measured none of its"), "{why}");
        let ok = fixture("h100-run");
        assert_eq!(compare_runs(&ok, &ok, 0.05).expect("ok").nothing_compared(), None);
    }

    #[test]
    fn identical_runs_pass_and_cells_measured_in_neither_are_a_dash() {
        let base = fixture("h100-run");
        let c = compare_runs(&base, &base, 0.05).expect("comparable");
        assert_eq!((c.rows.len(), c.failures(), c.notices.len()), (16, 0, 2));
        // The fixture was made before quantile resolutions were recorded.
        assert!(
            c.notices[0].starts_with("p99 changes are not judged: the baseline ")
                && c.notices[1].starts_with("p99 changes are not judged: the candidate "),
            "{:?}",
            c.notices
        );
        let mig: Vec<_> = c.rows.iter().filter(|r| r.arm.strategy == Strategy::Mig).collect();
        assert_eq!(mig.len(), 4);
        assert!(mig.iter().all(|r| r.verdict == Verdict::NotMeasured));
        let text = render(&c);
        for l in text.lines().filter(|l| l.starts_with("MIG")) {
            assert!(l.ends_with("  —"), "{l}");
        }
        assert_eq!(
            text.lines().filter(|l| l.ends_with("  ok, within noise")).count(),
            12,
            "{text}"
        );
    }

    #[test]
    fn cells_the_candidate_lacks_fail_as_missing() {
        let base = fixture("h100-run");
        let mut cand = base.clone();
        cand.cells.retain(|c| !(c.strategy == Strategy::Mps && c.pods == 5));
        let c = compare_runs(&base, &cand, 0.05).expect("comparable");
        assert_eq!(c.failures(), 1);
        let row = c
            .rows
            .iter()
            .find(|r| r.verdict == Verdict::Missing)
            .expect("missing row");
        assert_eq!((row.arm.strategy, row.pods, row.is_failure()), (Strategy::Mps, 5, true));
        let line = render(&c)
            .lines()
            .find(|l| l.starts_with("MPS") && l.contains(" 5 "))
            .map(str::to_string);
        assert!(
            line.as_deref()
                .is_some_and(|l| l.ends_with("missing: not in the candidate run")),
            "{line:?}"
        );
        // The same through the binary's `compare`: counted as a failure.
        assert_eq!(
            compare(&base, &cand, 0.05)
                .iter()
                .filter(|r| !r.regressions.is_empty())
                .count(),
            1
        );
    }

    #[test]
    fn a_partial_candidate_is_noticed_and_its_gaps_flagged() {
        let base = fixture("h100-run");
        let mut cand = base.clone();
        cand.run.state = "interrupted".into();
        cand.cells.retain(|c| c.strategy != Strategy::Mig);
        let c = compare_runs(&base, &cand, 0.05).expect("comparable");
        assert_eq!(c.failures(), 4);
        let partial: Vec<&String> = c.notices.iter().filter(|n| n.contains("partial")).collect();
        assert_eq!(partial.len(), 1);
        assert!(
            partial[0].starts_with("candidate ") && partial[0].contains("is a partial run (state \"interrupted\""),
            "{:?}",
            c.notices
        );
        assert!(
            c.rows
                .iter()
                .filter(|r| r.verdict == Verdict::Missing)
                .all(|r| { r.regressions == ["missing: not in the candidate run (its state is \"interrupted\")"] })
        );
    }

    #[test]
    fn a_candidate_that_measured_nothing_or_lost_a_number_fails() {
        let base = fixture("h100-run");
        let cell = |r: &CellRecord| r.strategy == Strategy::TimeSlicing && r.pods == 1;
        let mut nothing = base.clone();
        for r in nothing.cells.iter_mut().filter(|r| cell(r)) {
            (r.mean_s, r.p50_s, r.p90_s, r.p99_s) = (None, None, None, None);
            (r.throughput_per_s, r.inferences, r.errors) = (None, None, Some(260));
        }
        let mut no_p99 = base.clone();
        for r in no_p99.cells.iter_mut().filter(|r| cell(r)) {
            r.p99_s = None;
        }
        for (cand, why) in [
            (nothing, "measured nothing: no inference completed (260 errors)"),
            (no_p99, "lost its p99 latency"),
        ] {
            let c = compare_runs(&base, &cand, 0.05).expect("comparable");
            let row = c
                .rows
                .iter()
                .find(|r| r.arm.strategy == Strategy::TimeSlicing && r.pods == 1);
            assert_eq!(
                row.map(|r| (r.verdict, r.regressions.clone())),
                Some((Verdict::Regression, vec![why.to_string()]))
            );
            assert_eq!(c.failures(), 1, "{why}");
        }
    }

    #[test]
    fn runs_of_another_kind_load_or_slos_are_refused() {
        let base = fixture("h100-run");
        let mut open = base.clone();
        open.run.plan.load = crate::config::values::Load::PerPod(50.0);
        open.run.plan.slos = vec!["p99=25ms".parse().expect("slo")];
        let e = compare_runs(&base, &open, 0.05).expect_err("other load").to_string();
        for want in [
            "load closed (baseline) vs poisson:50 (candidate)",
            "SLOs none (baseline) vs p99=25ms (candidate)",
        ] {
            assert!(e.contains(want), "{want:?} not in {e}");
        }
        let mut search = open.clone();
        search.run.kind = crate::config::plan::RunKind::Capacity(crate::config::plan::CapacityPlan { max_pods: 7 });
        let e = compare_runs(&open, &search, 0.05).expect_err("a search").to_string();
        assert!(e.contains("kind sweep (baseline) vs capacity (candidate)"), "{e}");
    }

    #[test]
    fn runs_of_different_models_devices_or_gpus_are_refused() {
        let h100 = fixture("h100-run");
        let cpu = fixture("cpu-run");
        let e = compare_runs(&h100, &cpu, 0.05).expect_err("h100 vs cpu").to_string();
        assert!(e.contains("cpu-run/run.json: cannot compare with baseline "), "{e}");
        for want in [
            "model yolos-small (baseline) vs tiny (candidate)",
            "precision bf16 (baseline) vs fp32 (candidate)",
            "device cuda (baseline) vs cpu (candidate)",
        ] {
            assert!(e.contains(want), "{want:?} not in {e}");
        }
        assert!(!e.contains('\n'));
        // The unchecked rows are none, so the binary refuses rather than compares.
        assert!(compare(&h100, &cpu, 0.05).is_empty());
        let mut h200 = h100.clone();
        h200.run.environment.gpus[0].name = "NVIDIA H200".into();
        let e = compare_runs(&h100, &h200, 0.05).expect_err("other GPU").to_string();
        assert!(
            e.ends_with("GPU \"NVIDIA H100 80GB HBM3\" (baseline) vs \"NVIDIA H200\" (candidate)"),
            "{e}"
        );
        let mut bf = h100.clone();
        bf.run.plan.precision = "fp32".into();
        assert!(compare_runs(&h100, &bf, 0.05).is_err());
        // A node's run whose cells filled two GPUs pools twice the pods.
        let mut node = h100.clone();
        node.run.environment.gpus_filled = Some(2);
        let e = compare_runs(&h100, &node, 0.05)
            .expect_err("two GPUs filled")
            .to_string();
        assert!(e.contains("GPUs filled per cell 1 (baseline) vs 2 (candidate)"), "{e}");
    }

    /// The fixture as a run of three repeats: latencies times `factors[r]`, throughput
    /// divided by it.
    fn repeated(data: &RunData, factors: [f64; 3]) -> RunData {
        data.repeated(&factors, |c, f| {
            c.mean_s = c.mean_s.map(|v| v * f);
            c.p99_s = c.p99_s.map(|v| v * f);
            c.throughput_per_s = c.throughput_per_s.map(|v| v / f);
        })
    }

    #[test]
    fn with_repeats_the_between_run_interval_decides() {
        let base = repeated(&fixture("h100-run"), [1.0, 1.01, 0.99]);
        let same = repeated(&fixture("h100-run"), [1.005, 0.995, 1.0]);
        let c = compare_runs(&base, &same, 0.05).expect("comparable");
        assert_eq!(c.failures(), 0, "{}", render(&c));
        assert!(
            c.rows
                .iter()
                .filter(|r| r.verdict == Verdict::Ok)
                .all(|r| r.noise.source == NoiseSource::Repeats)
        );
        // A planted 10% slowdown is flagged against a ±~2% interval, both directions
        // of the same pair pass.
        let slow = repeated(&fixture("h100-run"), [1.10, 1.11, 1.09]);
        let c = compare_runs(&base, &slow, 0.05).expect("comparable");
        assert_eq!(c.failures(), 12, "{}", render(&c));
        let text = render(&c);
        assert!(
            text.contains("REGRESSION: mean latency +10.0% (threshold 5.0%, noise ±"),
            "{text}"
        );
        assert!(text.contains("% between repeats)"), "{text}");
        assert_eq!(compare_runs(&slow, &base, 0.05).expect("comparable").failures(), 0);
        // The same 10% inside repeats that scatter by ±30% is not a regression.
        let wild = repeated(&fixture("h100-run"), [0.7, 1.0, 1.3]);
        let wilder = repeated(&fixture("h100-run"), [0.8, 1.1, 1.4]);
        let c = compare_runs(&wild, &wilder, 0.05).expect("comparable");
        assert_eq!(c.failures(), 0, "{}", render(&c));
    }

    #[test]
    fn a_p99_without_a_recorded_resolution_is_shown_but_not_judged() {
        let base = fixture("h100-run");
        let mut cand = base.clone();
        for c in &mut cand.cells {
            c.p99_s = c.p99_s.map(|v| v * 1.3);
            c.quantile_resolution = Some(0.022);
        }
        let c = compare_runs(&base, &cand, 0.05).expect("comparable");
        assert_eq!(c.failures(), 0, "{}", render(&c));
        assert!(c.rows.iter().filter_map(|r| r.p99).all(|x| (x - 0.3).abs() < 1e-9));
        assert_eq!(c.notices.len(), 1, "{:?}", c.notices);
    }

    #[test]
    fn a_single_run_against_a_repeated_one_borrows_its_variance() {
        let once = fixture("h100-run");
        let thrice = repeated(&once, [0.99, 1.0, 1.01]);
        let c = compare_runs(&once, &thrice, 0.05).expect("comparable");
        let row = c
            .rows
            .iter()
            .find(|r| r.arm.strategy == Strategy::Mps && r.pods == 3)
            .expect("row");
        assert_eq!(row.noise.source, NoiseSource::Repeats);
        // s = 1% of the mean: t(0.975, 2) · 1% · √(1 + 1/3) ≈ 4.97%.
        assert!(
            (row.noise.mean - 0.043027 * (4.0f64 / 3.0).sqrt()).abs() < 1e-4,
            "{:?}",
            row.noise
        );
    }

    #[test]
    fn a_single_pass_p99_is_judged_against_the_two_p99s_sampling_intervals() {
        let mut base = fixture("h100-run");
        for c in &mut base.cells {
            c.quantile_resolution = Some(0.022);
            c.mean_spread = Some(0.001);
            if let Some(p) = c.p99_s {
                // ±6% and ±8% of the baseline's p99: combined ±10%.
                (c.p99_low_s, c.p99_high_s) = (Some(p * 0.94), Some(p * 1.06));
            }
        }
        let mut cand = base.clone();
        for c in &mut cand.cells {
            if let Some(p) = c.p99_s {
                c.p99_s = Some(p * 1.08);
                (c.p99_low_s, c.p99_high_s) = (Some(p * 1.08 - p * 0.08), Some(p * 1.08 + p * 0.08));
            }
        }
        let c = compare_runs(&base, &cand, 0.05).expect("comparable");
        assert_eq!(c.failures(), 0, "{}", render(&c));
        let row = c.rows.iter().find(|r| r.p99.is_some()).expect("a p99");
        assert!((row.noise.p99 - 0.1).abs() < 1e-9, "{:?}", row.noise);
        assert!(render(&c).contains("+8.0% ±10.0%"), "{}", render(&c));
    }

    #[test]
    fn runs_on_different_gpus_are_judged_against_the_between_host_noise() {
        let base = fixture("h100-run");
        let mut cand = base.clone();
        for g in &mut cand.run.environment.gpus {
            g.uuid = "GPU-another".into();
        }
        for c in &mut cand.cells {
            c.mean_s = c.mean_s.map(|v| v * 1.06);
        }
        let host = crate::report::host_noise::HostNoise {
            gpu_name: base.run.environment.gpus[0].name.clone(),
            runs: Vec::new(),
            cells: 12,
            mean: 0.07,
            p99: 0.0,
            throughput: 0.0,
            method: String::new(),
        };
        // 6% slower: a regression against one host's noise, not against 7% between hosts.
        let alone = compare_runs_with(&base, &cand, 0.05, &[]).expect("comparable");
        assert!(alone.failures() > 0, "{}", render(&alone));
        assert!(
            alone
                .notices
                .iter()
                .any(|n| n.contains("no between-host noise is measured")),
            "{:?}",
            alone.notices
        );
        let hosts = compare_runs_with(&base, &cand, 0.05, std::slice::from_ref(&host)).expect("comparable");
        assert_eq!(hosts.failures(), 0, "{}", render(&hosts));
        let row = hosts.rows.iter().find(|r| r.mean.is_some()).expect("a row");
        assert_eq!((row.noise.source, row.noise.mean), (NoiseSource::Hosts, 0.07));
        assert!(render(&hosts).contains("+6.0% ±7.0%"), "{}", render(&hosts));
        assert!(
            hosts
                .notices
                .iter()
                .any(|n| n.contains("between-host noise measured on")),
            "{:?}",
            hosts.notices
        );
        // The same GPU: the runs' own noise.
        let same = compare_runs_with(&base, &base, 0.05, std::slice::from_ref(&host)).expect("comparable");
        assert!(same.rows.iter().all(|r| r.noise.source != NoiseSource::Hosts));
    }

    #[test]
    fn a_change_built_on_a_cell_to_read_with_care_is_marked() {
        let base = fixture("h100-run");
        let mut cand = base.clone();
        for c in cand
            .cells
            .iter_mut()
            .filter(|c| c.strategy == Strategy::Mps && c.pods == 3 && c.is_aggregate())
        {
            c.note =
                "pod-1 left an SLO undecided at 95% when the cell ended (their rows say with how many requests)".into();
        }
        let c = compare_runs(&base, &cand, 0.05).expect("comparable");
        let text = render(&c.rows);
        let line = text
            .lines()
            .find(|l| l.starts_with("MPS") && l.contains("   3 "))
            .unwrap_or_default();
        assert!(
            line.ends_with("⚑ read with care: candidate: an SLO undecided at 95% when the cell ended"),
            "{text}"
        );
        assert_eq!(text.matches('⚑').count(), 1, "{text}");
    }

    #[test]
    fn a_p99_change_inside_the_quantile_resolution_is_not_a_regression() {
        let mut base = fixture("h100-run");
        for c in &mut base.cells {
            c.quantile_resolution = Some(0.05);
            c.mean_spread = Some(0.001);
        }
        let mut cand = base.clone();
        for c in &mut cand.cells {
            c.p99_s = c.p99_s.map(|v| v * 1.08);
        }
        // 8% is above the 5% threshold and the 0.1% noise, but inside ±5% + ±5%.
        let c = compare_runs(&base, &cand, 0.05).expect("comparable");
        assert_eq!(c.failures(), 0, "{}", render(&c));
        for c in &mut cand.cells {
            c.p99_s = c.p99_s.map(|v| v * 1.1);
        }
        let c = compare_runs(&base, &cand, 0.05).expect("comparable");
        assert_eq!(c.failures(), 12, "{}", render(&c));
        assert!(
            render(&c).contains("p99 latency +18.8% (threshold 5.0%, noise ±0.1% within cells, resolution ±10.0%)")
        );
    }
}
