//! A `--gpus` run's report lines: which GPU measured which strategy, and what measuring
//! on several GPUs at once cost. The cell that ran beside the most other GPUs' cells
//! was measured again with them idle (`alone.jsonl`); the changes of its mean latency,
//! p99 and throughput are judged against the noise the two measurements recorded, as
//! `compare` judges a single run's cells: the larger window-to-window spread of the two,
//! and for p99 also the two quantile resolutions added; a run that repeated the cell
//! widens it to the spread of one measurement between the repeats (t·s) where that is
//! larger. As in `compare`, a change must
//! also pass its default threshold, 5%: window spreads are the noise inside one
//! measurement and understate that between two measurements minutes apart (on two
//! H100s, `results/20261125-h100x2-gpus01` against `…-gpu0-alone`, the same cells
//! differed by up to 1.6% in mean where the window spreads were 0.3%).

use crate::results::record::CellRecord;

use super::RunData;
use super::compare::{Noise, rel, window_noise};

/// The smallest change that is warned about: `compare`'s default `--threshold`.
pub const THRESHOLD: f64 = 0.05;

/// One cell measured beside the other GPUs' cells and again alone.
#[derive(Debug, Clone, PartialEq)]
pub struct ParallelCost {
    /// The aggregate row measured beside the others.
    pub beside: CellRecord,
    /// The aggregate row measured alone.
    pub alone: CellRecord,
    /// Relative change of the mean latency beside the others (+0.1 = 10% slower).
    pub mean: Option<f64>,
    /// Relative change of p99.
    pub p99: Option<f64>,
    /// Relative change of aggregate throughput.
    pub throughput: Option<f64>,
    /// The noise each change is judged against.
    pub noise: Noise,
}

impl ParallelCost {
    /// The two measurements of one cell compared (pure).
    pub fn of(beside: &CellRecord, alone: &CellRecord) -> Self {
        Self {
            mean: rel(alone.mean_s, beside.mean_s),
            p99: rel(alone.p99_s, beside.p99_s),
            throughput: rel(alone.throughput_per_s, beside.throughput_per_s),
            noise: window_noise(alone, beside),
            beside: beside.clone(),
            alone: alone.clone(),
        }
    }

    /// The changes larger than their noise (p99: also than the resolution) and than
    /// [`THRESHOLD`], said.
    pub fn beyond_noise(&self) -> Vec<String> {
        let n = &self.noise;
        [
            ("mean latency", self.mean, n.mean),
            ("p99 latency", self.p99, n.p99.max(n.resolution)),
            ("throughput", self.throughput, n.throughput),
        ]
        .into_iter()
        .filter_map(|(what, change, noise)| {
            let x = change?;
            (x.abs() > noise && x.abs() > THRESHOLD).then(|| {
                format!(
                    "{what} {:+.1}% (noise ±{:.1}%, threshold {:.0}%)",
                    x * 100.0,
                    noise * 100.0,
                    THRESHOLD * 100.0
                )
            })
        })
        .collect()
    }

    fn cell(&self) -> String {
        format!(
            "{} × {} pod{} on GPU {}",
            self.beside.arm().title(),
            self.beside.pods,
            if self.beside.pods == 1 { "" } else { "s" },
            self.beside.gpu.map_or("?".into(), |g| g.to_string())
        )
    }

    /// The paragraph that sets the two measurements side by side.
    pub fn reading(&self) -> String {
        let side = |r: &CellRecord| {
            format!(
                "mean {}, p99 {}, {} inferences/s",
                ms(r.mean_s),
                ms(r.p99_s),
                r.throughput_per_s.map_or("–".into(), |t| format!("{t:.1}"))
            )
        };
        let pct = |x: Option<f64>| x.map_or("–".into(), |x| format!("{:+.1}%", x * 100.0));
        let n = &self.noise;
        format!(
            "Beside the other GPUs and alone: {}, measured while {} other GPU(s) ran cells on average: {}; again with the other GPUs idle: {}. Beside them: mean {}, p99 {}, throughput {}; the noise is ±{:.1}% (mean), ±{:.1}% (p99, with the quantiles' resolution), ±{:.1}% (throughput): the larger window-to-window spread of the two measurements, or with --repeat the spread of one measurement between repeats where larger. A change is warned about beyond its noise and 5%.",
            self.cell(),
            self.beside.other_gpus_busy.map_or("?".into(), |b| format!("{b:.2}")),
            side(&self.beside),
            side(&self.alone),
            pct(self.mean),
            pct(self.p99),
            pct(self.throughput),
            n.mean * 100.0,
            n.p99.max(n.resolution) * 100.0,
            n.throughput * 100.0
        )
    }

    /// The warning when a change is beyond its noise.
    pub fn warning(&self) -> Option<String> {
        let beyond = self.beyond_noise();
        (!beyond.is_empty()).then(|| {
            format!(
                "Measuring on several GPUs at once changed {} beyond its noise: {}. The GPUs share the host's CPUs, PCIe and power; read this run's cells with that in mind, or measure one GPU at a time (--gpu).",
                self.cell(),
                beyond.join(", ")
            )
        })
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{:.3} ms", v * 1e3))
}

/// The cell measured beside the others and alone, when the run has both. A run that
/// repeated the cell (`--repeat`) widens each noise to the spread of one measurement
/// between its repeats where that is larger ([`one_value_noise`]).
pub fn parallel_cost(data: &RunData) -> Option<ParallelCost> {
    let alone = data.alone.iter().find(|r| r.is_aggregate())?;
    let beside = data
        .cells
        .iter()
        .find(|r| r.is_aggregate() && r.repeat == alone.repeat && r.arm() == alone.arm() && r.pods == alone.pods)?;
    let mut cost = ParallelCost::of(beside, alone);
    if data.planned_repeats() > 1 {
        let between = |f: fn(&CellRecord) -> Option<f64>| {
            data.interval(beside.arm(), beside.pods, f)
                .and_then(|i| one_value_noise(&i))
                .unwrap_or(0.0)
        };
        let n = &mut cost.noise;
        n.mean = n.mean.max(between(|r| r.mean_s));
        n.p99 = n.p99.max(between(|r| r.p99_s));
        n.throughput = n.throughput.max(between(|r| r.throughput_per_s));
    }
    Some(cost)
}

/// How far one measurement of a repeated cell strays from the repeats' mean, relative
/// to it (pure): t·s, the half-width of the 95% interval of the mean times √n (the
/// interval of [`crate::stats::interval`]). None with fewer than two repeats.
pub fn one_value_noise(i: &crate::stats::interval::Interval) -> Option<f64> {
    let h = i.half_width?;
    (i.mean > 0.0).then(|| h * (i.n as f64).sqrt() / i.mean)
}

/// A `--gpus` run's reading lines and warnings (none for a run of one GPU).
pub fn lines(data: &RunData) -> (Vec<String>, Vec<String>) {
    let gpus = &data.run.plan.gpus;
    if gpus.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let mut reading = Vec::new();
    let mut by_gpu: Vec<(u32, Vec<String>)> = Vec::new();
    for r in data.cells.iter().filter(|r| r.is_aggregate()) {
        let (Some(g), title) = (r.gpu, r.arm().title()) else {
            continue;
        };
        match by_gpu.iter_mut().find(|(x, _)| *x == g) {
            Some((_, arms)) if !arms.contains(&title) => arms.push(title),
            Some(_) => {}
            None => by_gpu.push((g, vec![title])),
        }
    }
    by_gpu.sort_by_key(|(g, _)| *g);
    let placed: Vec<String> = by_gpu
        .iter()
        .map(|(g, arms)| format!("GPU {g} measured {}", arms.join(", ")))
        .collect();
    reading.push(format!(
        "The cells ran on {} GPUs at once (--gpus), one cell per GPU at a time, each strategy on one GPU: {}. Each row names its GPU (column gpu) and how many other GPUs ran a cell beside it on average (other_gpus_busy).",
        gpus.len(),
        if placed.is_empty() {
            "none measured yet".to_string()
        } else {
            placed.join("; ")
        }
    ));
    let mut warnings = Vec::new();
    match parallel_cost(data) {
        Some(cost) => {
            reading.push(cost.reading());
            warnings.extend(cost.warning());
        }
        None => reading.push(
            "No cell was measured again with the other GPUs idle (the run ended before, or no cell ran beside another GPU's): the cost of measuring in parallel is unknown for this run.".into(),
        ),
    }
    (reading, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{CellStatus, DeviceKind, Source, Strategy};
    use crate::results::record::ALL_PODS;

    fn row(mean_ms: f64, p99_ms: f64, throughput: f64, spread: f64, beside: f64) -> CellRecord {
        CellRecord {
            mean_s: Some(mean_ms / 1e3),
            p99_s: Some(p99_ms / 1e3),
            throughput_per_s: Some(throughput),
            mean_spread: Some(spread),
            throughput_spread: Some(spread),
            quantile_resolution: Some(0.0125),
            gpu: Some(1),
            other_gpus_busy: Some(beside),
            ..CellRecord::unmeasured(
                Strategy::Mps,
                3,
                ALL_PODS,
                CellStatus::Ok,
                Source::Scrape,
                DeviceKind::Cuda,
            )
        }
    }

    #[test]
    fn with_repeats_the_spread_between_them_is_the_noise_when_larger() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h100-run");
        let base = RunData::load(&path).expect("fixture");
        // MPS × 3 measured in three repeats, 0.9, 1.0 and 1.1 times the fixture's mean.
        let mut data = base.repeated(&[0.9, 1.0, 1.1], |c, f| {
            c.mean_s = c.mean_s.map(|v| v * f);
        });
        data.run.plan.gpus = vec![
            crate::telemetry::inventory::GpuSelector::Index(0),
            crate::telemetry::inventory::GpuSelector::Index(1),
        ];
        let beside = data
            .cells
            .iter()
            .find(|r| r.is_aggregate() && r.strategy == Strategy::Mps && r.pods == 3 && r.repeat == 2)
            .cloned()
            .expect("MPS × 3, repeat 2");
        // Alone, 8% faster than the middle repeat: beyond the window spreads and 5%,
        // but one repeat alone strays t·s = 4.303 × 0.1 = 43% from their mean.
        let alone = CellRecord {
            mean_s: beside.mean_s.map(|m| m / 1.08),
            ..beside.clone()
        };
        data.alone = vec![alone.clone()];
        let c = parallel_cost(&data).expect("the cell");
        assert!((c.noise.mean - 4.3027 * 0.1).abs() < 1e-9, "{}", c.noise.mean);
        assert_eq!(c.warning(), None);
        // Without the repeats, the same two measurements warn.
        let once = ParallelCost::of(&beside, &alone);
        assert!(once.warning().is_some(), "{:?}", once.noise);
        assert_eq!(
            one_value_noise(&crate::stats::interval::Interval::of(&[2.0]).expect("one")),
            None
        );
    }

    #[test]
    fn a_change_within_the_noise_is_reported_without_a_warning() {
        let c = ParallelCost::of(&row(4.04, 5.0, 740.0, 0.02, 0.95), &row(4.0, 5.0, 750.0, 0.01, 0.0));
        assert!((c.mean.expect("mean") - 0.01).abs() < 1e-9);
        assert!((c.throughput.expect("t") + 1.0 / 75.0).abs() < 1e-9);
        assert_eq!(c.noise.mean, 0.02, "the larger spread of the two");
        assert_eq!(c.noise.resolution, 0.025);
        assert!(c.beyond_noise().is_empty());
        assert_eq!(c.warning(), None);
        let r = c.reading();
        assert!(
            r.contains("MPS × 3 pods on GPU 1, measured while 0.95 other GPU(s) ran cells"),
            "{r}"
        );
        assert!(
            r.contains("Beside them: mean +1.0%, p99 +0.0%, throughput -1.3%"),
            "{r}"
        );
    }

    #[test]
    fn a_change_beyond_the_noise_warns_and_names_it() {
        // 8% slower and 9% less throughput against 2% spreads; p99 +2% is within ±2.5%.
        let c = ParallelCost::of(&row(4.32, 5.1, 682.5, 0.02, 1.0), &row(4.0, 5.0, 750.0, 0.01, 0.0));
        assert_eq!(
            c.beyond_noise(),
            [
                "mean latency +8.0% (noise ±2.0%, threshold 5%)",
                "throughput -9.0% (noise ±2.0%, threshold 5%)"
            ]
        );
        let w = c.warning().expect("warning");
        assert!(
            w.starts_with(
                "Measuring on several GPUs at once changed MPS × 3 pods on GPU 1 beyond its noise: mean latency +8.0%"
            ),
            "{w}"
        );
        // Faster beside the others is as much a difference as slower.
        let faster = ParallelCost::of(&row(3.6, 5.0, 750.0, 0.01, 1.0), &row(4.0, 5.0, 750.0, 0.01, 0.0));
        assert_eq!(
            faster.beyond_noise(),
            ["mean latency -10.0% (noise ±1.0%, threshold 5%)"]
        );
        // Beyond a tight window spread but under 5% (the H100 pair's exclusive × 5 cell:
        // -0.4% and +0.4% against ±0.3%): no warning.
        let small = ParallelCost::of(
            &row(1.358, 1.441, 736.1, 0.003, 1.0),
            &row(1.363, 1.441, 733.4, 0.003, 0.0),
        );
        assert!(small.mean.is_some_and(|m| m.abs() > small.noise.mean));
        assert_eq!(small.warning(), None);
        // 6% slower against a 7% spread: within the noise, no warning either.
        let noisy = ParallelCost::of(&row(4.24, 5.0, 750.0, 0.07, 1.0), &row(4.0, 5.0, 750.0, 0.01, 0.0));
        assert_eq!(noisy.warning(), None);
    }
}
