//! Between-host noise (pure but for reading runs): the same sweep run on several GPUs of
//! one model, each on its own host, measures how much a cell's numbers move from one
//! card to another. `host-noise RUN_DIR…` computes it; the committed
//! `results/host-noise.jsonl` holds one [`HostNoise`] per GPU model, and `compare` uses
//! it as the least noise of runs made on different GPUs.
//!
//! Per metric (mean latency, p99, aggregate throughput) and per cell measured in every
//! run, each run's first pass gives a relative sample standard deviation over the hosts;
//! these are pooled over the cells (root mean square). A card's offset is shared by all
//! its cells, so the cells are not independent draws: the degrees of freedom are those
//! of the hosts, hosts − 1. Two single runs on two hosts differ by two independent host
//! draws, so the band a change between them is judged against is t(0.975, hosts − 1) ·
//! s · √2.

use serde::{Deserialize, Serialize};

use crate::domain::CellStatus;
use crate::error::{BenchError, Result};
use crate::results::record::CellRecord;
use crate::stats::interval::t975;

use super::RunData;

/// The committed measurements, one line per GPU model (`results/host-noise.jsonl`).
pub const COMMITTED: &str = include_str!("../../../results/host-noise.jsonl");

/// How the band is computed, as the methodology page and `compare` say it.
pub const METHOD: &str = "per cell measured on every host, the relative standard deviation over the hosts of each run's first pass; pooled over the cells (root mean square); the band of a change between two hosts is t(0.975, hosts − 1) · s · √2 (a card's offset is shared by its cells, so the hosts, not the cells, are the independent draws)";

/// One run that went into a measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostRun {
    /// Its run id.
    pub run_id: String,
    /// The GPU it ran on.
    pub gpu_uuid: String,
}

/// Between-host noise of one GPU model: one line of `results/host-noise.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostNoise {
    /// The GPU model, as the runs record it ("NVIDIA H200").
    pub gpu_name: String,
    /// The runs, one per GPU.
    pub runs: Vec<HostRun>,
    /// Cells measured on every host.
    pub cells: usize,
    /// The band of a change of the mean latency between two hosts (0.01 = ±1%).
    pub mean: f64,
    /// Of p99.
    pub p99: f64,
    /// Of aggregate throughput.
    pub throughput: f64,
    /// How the bands were computed ([`METHOD`]).
    pub method: String,
}

/// The GPUs a run measured on, sorted (empty: it recorded none).
pub fn gpu_uuids(data: &RunData) -> Vec<String> {
    let mut ids: Vec<String> = data.run.environment.gpus.iter().map(|g| g.uuid.clone()).collect();
    ids.sort();
    ids
}

/// The GPU model a run measured on (None: it recorded none).
pub fn gpu_name(data: &RunData) -> Option<String> {
    data.run.environment.gpus.first().map(|g| g.name.clone())
}

/// The between-host noise of `runs`: at least three runs, each on a GPU of the same
/// model and a GPU of its own. That they measured the same plan is the caller's to check
/// (`compare::check_comparable`, as the `host-noise` command does).
pub fn measure(runs: &[RunData]) -> Result<HostNoise> {
    let bad = |reason: String| BenchError::Results {
        path: "host-noise".into(),
        reason,
    };
    if runs.len() < 3 {
        return Err(bad(format!(
            "needs at least three runs of the same sweep on different GPUs, got {}",
            runs.len()
        )));
    }
    let first = &runs[0];
    let name = gpu_name(first).ok_or_else(|| bad(format!("{} records no GPU", first.dir.display())))?;
    let mut seen: Vec<Vec<String>> = Vec::new();
    for r in runs {
        if gpu_name(r).as_deref() != Some(name.as_str()) {
            return Err(bad(format!(
                "{} ran on {}, not {name}: one GPU model per measurement",
                r.dir.display(),
                gpu_name(r).unwrap_or_else(|| "no recorded GPU".into())
            )));
        }
        let ids = gpu_uuids(r);
        if seen.contains(&ids) {
            return Err(bad(format!(
                "{} ran on a GPU another run used ({}): one run per GPU",
                r.dir.display(),
                ids.join(", ")
            )));
        }
        seen.push(ids);
    }
    let metrics: [fn(&CellRecord) -> Option<f64>; 3] = [|c| c.mean_s, |c| c.p99_s, |c| c.throughput_per_s];
    let mut sum_sq = [0.0f64; 3];
    let mut cells = 0usize;
    for arm in first.arms() {
        for &pods in &first.run.plan.pods {
            let measured = runs
                .iter()
                .all(|r| r.aggregate(arm, pods).is_some_and(|a| a.status == CellStatus::Ok));
            if !measured {
                continue;
            }
            let mut rel_var = [0.0f64; 3];
            let mut complete = true;
            for (k, f) in metrics.iter().enumerate() {
                // One pass per host, so that every value is a draw of the same kind.
                let values: Option<Vec<f64>> = runs
                    .iter()
                    .map(|r| {
                        r.repeats(arm, pods)
                            .first()
                            .filter(|a| a.status == CellStatus::Ok)
                            .and_then(|a| f(a))
                    })
                    .collect();
                let Some(i) = values.as_deref().and_then(crate::stats::interval::Interval::of) else {
                    complete = false;
                    break;
                };
                if i.mean <= 0.0 {
                    complete = false;
                    break;
                }
                rel_var[k] = i.variance / (i.mean * i.mean);
            }
            if complete {
                cells += 1;
                for k in 0..3 {
                    sum_sq[k] += rel_var[k];
                }
            }
        }
    }
    if cells == 0 {
        return Err(bad("no cell was measured in every run".into()));
    }
    let df = (runs.len() - 1) as f64;
    let band = |k: usize| t975(df) * (sum_sq[k] / cells as f64).sqrt() * std::f64::consts::SQRT_2;
    Ok(HostNoise {
        gpu_name: name,
        runs: runs
            .iter()
            .map(|r| HostRun {
                run_id: r.run.run_id.clone(),
                gpu_uuid: gpu_uuids(r).join(","),
            })
            .collect(),
        cells,
        mean: band(0),
        p99: band(1),
        throughput: band(2),
        method: METHOD.to_string(),
    })
}

/// Reads host-noise lines (`results/host-noise.jsonl` or a file of one's own); `source`
/// names it in an error.
pub fn parse(text: &str, source: &str) -> Result<Vec<HostNoise>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let bad = |reason: String| BenchError::RunDir {
                path: source.into(),
                reason: format!("line {}: {reason}", i + 1),
            };
            let h: HostNoise = serde_json::from_str(l).map_err(|e| bad(e.to_string()))?;
            h.check().map_err(bad)?;
            Ok(h)
        })
        .collect()
}

impl HostNoise {
    /// Whether the measurement is one `host-noise` could have made: at least three runs
    /// on cards of their own, a cell measured, and each band a finite share from 0 to 1
    /// (a band of 1e308 would pass every change as noise).
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.runs.len() < 3 {
            return Err(format!("{} runs: a measurement needs at least three", self.runs.len()));
        }
        if self.cells == 0 {
            return Err("no cell measured on every host".into());
        }
        for (what, band) in [("mean", self.mean), ("p99", self.p99), ("throughput", self.throughput)] {
            if !(band.is_finite() && (0.0..=1.0).contains(&band)) {
                return Err(format!("{what} is {band}: a band is a share from 0 to 1 (0.01 = ±1%)"));
            }
        }
        Ok(())
    }
}

/// Whether two runs ran on different cards: each records its GPUs and they share none
/// (a run on GPUs 0 and 1 against one on GPU 0 of the same host shares a card).
pub fn on_different_gpus(base: &RunData, cand: &RunData) -> bool {
    let (b, c) = (gpu_uuids(base), gpu_uuids(cand));
    !b.is_empty() && !c.is_empty() && !b.iter().any(|u| c.contains(u))
}

/// The measurement for the GPU model both runs used, when they ran on different cards
/// (None: a shared card, a run that records none, or no measurement for the model).
pub fn between<'a>(base: &RunData, cand: &RunData, known: &'a [HostNoise]) -> Option<&'a HostNoise> {
    if !on_different_gpus(base, cand) {
        return None;
    }
    let name = gpu_name(base)?;
    known.iter().find(|h| h.gpu_name == name)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn fixture() -> RunData {
        RunData::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h100-run")).expect("fixture")
    }

    /// The fixture as run on GPU `uuid`, every latency × `f` and throughput ÷ `f`.
    fn on(uuid: &str, f: f64) -> RunData {
        let mut d = fixture();
        for g in &mut d.run.environment.gpus {
            g.uuid = uuid.to_string();
        }
        for c in &mut d.cells {
            c.mean_s = c.mean_s.map(|v| v * f);
            c.p99_s = c.p99_s.map(|v| v * f);
            c.throughput_per_s = c.throughput_per_s.map(|v| v / f);
        }
        d
    }

    #[test]
    fn a_measurement_file_with_bands_no_host_noise_could_give_is_bad_input() {
        let line = COMMITTED
            .lines()
            .find(|l| !l.trim().is_empty())
            .expect("a committed line");
        assert!(parse(line, "f").is_ok());
        let edited = |field: &str, v: serde_json::Value| {
            let mut h: serde_json::Value = serde_json::from_str(line).expect("json");
            h[field] = v;
            parse(&h.to_string(), "f")
                .map_err(|e| (e.exit_code(), e.to_string()))
                .err()
        };
        for (field, v, want) in [
            ("mean", 1e308.into(), "mean is 100000000"),
            ("p99", (-0.2).into(), "p99 is -0.2"),
            ("throughput", 1.5.into(), "a band is a share from 0 to 1"),
            ("cells", 0.into(), "no cell"),
            ("runs", serde_json::json!([]), "0 runs"),
        ] {
            let (code, e) = edited(field, v).expect("refused");
            assert_eq!(code, 2, "{e}");
            assert!(e.contains("line 1") && e.contains(want), "{e}");
        }
        let garbage = parse("{not json", "f").expect_err("garbage");
        assert_eq!(garbage.exit_code(), 2, "{garbage}");
    }

    #[test]
    fn three_hosts_give_a_pooled_band_and_fewer_or_the_same_gpu_are_refused() {
        let runs = [on("GPU-a", 0.99), on("GPU-b", 1.0), on("GPU-c", 1.01)];
        let h = measure(&runs).expect("three hosts");
        // Every measured cell moves ±1% in mean: s = 1% of the mean, df = hosts − 1 = 2.
        let want = t975(2.0) * 0.01 * std::f64::consts::SQRT_2;
        assert!((h.mean - want).abs() < 1e-9 && (h.p99 - want).abs() < 1e-9, "{h:?}");
        assert!(h.throughput > 0.0 && h.cells == 12, "{h:?}");
        assert_eq!(h.runs[2].gpu_uuid, "GPU-c");
        let two = measure(&runs[..2]).expect_err("two").to_string();
        assert!(two.contains("at least three runs"), "{two}");
        let same = measure(&[on("GPU-a", 0.99), on("GPU-b", 1.0), on("GPU-a", 1.01)])
            .expect_err("same GPU twice")
            .to_string();
        assert!(same.contains("one run per GPU"), "{same}");
        // Only runs on different GPUs of a measured model are judged by it.
        let known = [h];
        assert!(between(&runs[0], &runs[1], &known).is_some());
        assert!(between(&runs[0], &on("GPU-a", 1.0), &known).is_none());
        // Two GPUs of a host against one of them: a shared card, no host noise.
        let mut pair = on("GPU-a", 1.0);
        let mut second = pair.run.environment.gpus[0].clone();
        second.uuid = "GPU-z".into();
        pair.run.environment.gpus.push(second);
        assert!(!on_different_gpus(&runs[0], &pair) && on_different_gpus(&runs[1], &pair));
    }

    #[test]
    fn the_committed_measurements_read() {
        let all = parse(COMMITTED, "results/host-noise.jsonl").expect("committed");
        assert!(!all.is_empty());
        for h in &all {
            assert!(h.runs.len() >= 3 && h.cells > 0, "{h:?}");
            assert!([h.mean, h.p99, h.throughput].iter().all(|b| b.is_finite() && *b >= 0.0));
        }
        let e = parse("{\"gpu_name\":1}\n", "f.jsonl").expect_err("bad").to_string();
        assert!(e.contains("f.jsonl") && e.contains("line 1"), "{e}");
    }
}
