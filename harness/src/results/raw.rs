//! The raw measurements behind a run's rows: for every measured cell, each pod's
//! latency-histogram increments per window, sparse (only the buckets that grew), with
//! the window's time, count, sum, errors and backlog (`windows.jsonl`, one line per cell), and
//! the bucket bounds they count in (`bucket-layouts.json`, each layout once per run).
//! From them `verify` recomputes every pod's row and the cell's pooled row; anyone can
//! recompute them with Prometheus' own rules (`histogram_quantile` over the summed
//! increments).
//!
//! A line of `windows.jsonl`:
//! `{"repeat":1,"strategy":"mps","pods":3,"measured_s":15.0,"windows":3,"series":[{"pod":
//! "pod-0","layout":0,"windows":[{"window":1,"at_s":5.0,"count":620.0,"sum":1.41,"errors":
//! 0.0,"from":12,"counts":[3,510,107]}]}]}`. `layout` indexes `bucket-layouts.json`'s
//! `layouts`, each the finite upper bounds in seconds, increasing (the +Inf bucket is
//! implied, index `bounds.len()`); `counts` are the observations that fell in each
//! bucket alone during the window (not cumulative), from bucket `from` to the last that
//! grew; `at_s` counts from the pod's first snapshot. A cell measured on a GPU also keeps
//! the GPU's samples (`gpu_samples`: utilisation, memory, power, energy counter, clock
//! event reasons, clocks and temperature, a sample a second), from which `verify`
//! recomputes the row's GPU columns.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::domain::{Arm, Strategy, TimeSliceInterval};
use crate::error::{BenchError, Result};
use crate::results::jsonl::{check_count, check_seconds, read_jsonl, to_jsonl};
use crate::stats::Histogram;
use crate::telemetry::GpuSample;

/// The file beside cells.jsonl.
pub const RAW_FILE: &str = "windows.jsonl";

/// The bucket layouts the windows count in.
pub const LAYOUTS_FILE: &str = "bucket-layouts.json";

/// `bucket-layouts.json`: every bucket layout of the run's pods, once each.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layouts {
    /// Finite upper bounds, seconds, increasing; a series' `layout` is its index here.
    pub layouts: Vec<Vec<f64>>,
}

impl Layouts {
    /// The index of `bounds`, added when new.
    pub fn index_of(&mut self, bounds: &[f64]) -> u32 {
        let i = match self.layouts.iter().position(|l| l == bounds) {
            Some(i) => i,
            None => {
                self.layouts.push(bounds.to_vec());
                self.layouts.len() - 1
            }
        };
        i as u32
    }
}

/// A cell's windows as measured: the record, and each series' bucket bounds (to be
/// given layout indices when saved).
#[derive(Debug, Clone, PartialEq)]
pub struct CellWindows {
    /// The record, its series' `layout` not yet set.
    pub cell: RawCell,
    /// Each series' finite bucket bounds, in the order of `cell.series`.
    pub bounds: Vec<Vec<f64>>,
    /// Streamed answers: each pod's requests that ended while measured.
    pub requests: Vec<crate::results::requests::RequestLine>,
}

/// One cell's raw measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCell {
    /// Which pass over the plan, from 1.
    pub repeat: u32,
    /// Strategy.
    pub strategy: Strategy,
    /// Time-slicing through DRA: the claims' interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeslice: Option<TimeSliceInterval>,
    /// MPS with `--mps-threads`: each client's share of the SMs (absent: auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_threads: Option<crate::domain::MpsThreads>,
    /// MPS with `--mps-memory`: each client's pinned memory (absent: auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_memory: Option<crate::domain::MpsMemory>,
    /// Pods requested.
    pub pods: u32,
    /// The measured time, seconds: the cell's time base (its aggregate's `duration_s`).
    pub measured_s: f64,
    /// Windows measured (a window where no pod could be read has no pod's increments).
    pub windows: u32,
    /// Each pod measured, in the cell's order.
    pub series: Vec<RawPod>,
    /// The GPU's telemetry over the measurement, a sample a second (NVML locally, the
    /// DCGM exporter's series on Kubernetes): what the row's GPU columns summarise.
    /// Empty where nothing was read (the CPU, or runs made before samples were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_samples: Vec<GpuSample>,
    /// A steady warm-up's probes, in order: what ended it (or not) before the
    /// windows. Empty for a fixed warm-up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warmup: Vec<WarmupProbe>,
}

/// One probe of a steady warm-up: the cell's pods summed over about a second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupProbe {
    /// Seconds since the warm-up began, at the probe's end.
    pub at_s: f64,
    /// Requests per second over the probe.
    pub throughput: f64,
    /// Mean latency over the probe, seconds (None: no request ended in it).
    pub mean_s: Option<f64>,
}

impl RawCell {
    /// The arm it measured.
    pub fn arm(&self) -> Arm {
        Arm {
            strategy: self.strategy,
            timeslice: self.timeslice,
            mps: crate::domain::MpsLimits {
                threads: self.mps_threads.unwrap_or_default(),
                memory: self.mps_memory.unwrap_or_default(),
            },
        }
    }
}

/// One pod's windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPod {
    /// The pod's name, as its row names it.
    pub pod: String,
    /// Its bucket bounds: an index into [`Layouts::layouts`].
    pub layout: u32,
    /// Requests it held waiting at its first snapshot, where it reports a backlog
    /// (`workload_queue_depth`, or the harness's count of requests in flight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog_start: Option<f64>,
    /// Its windows, in order.
    pub windows: Vec<RawWindow>,
    /// Streamed answers with `--server-ttft-metric` or `--server-itl-metric`: the
    /// increments of the server's own histograms over the pod's measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<RawServer>,
}

/// The increments of a streaming server's own histograms over a pod's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Time to first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft: Option<RawHistogram>,
    /// Inter-token latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl: Option<RawHistogram>,
    /// Why one that was asked for is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// A histogram in JSON: its finite bucket bounds and cumulative counts at each, its +Inf
/// bucket, count and sum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHistogram {
    /// Finite upper bounds, seconds, increasing.
    pub bounds: Vec<f64>,
    /// Observations at most each bound.
    pub cumulative: Vec<f64>,
    /// Observations in all (the +Inf bucket).
    pub inf: f64,
    /// Observations (`_count`).
    pub count: f64,
    /// Their sum, seconds.
    pub sum: f64,
}

impl RawHistogram {
    /// The JSON form of `h` (pure).
    pub fn of(h: &Histogram) -> Self {
        let finite: Vec<&(f64, f64)> = h.buckets.iter().filter(|b| b.0.is_finite()).collect();
        Self {
            bounds: finite.iter().map(|b| b.0).collect(),
            cumulative: finite.iter().map(|b| b.1).collect(),
            inf: h.buckets.last().map_or(h.count, |b| b.1),
            count: h.count,
            sum: h.sum,
        }
    }

    /// The histogram again (None: bounds and counts of different lengths).
    pub fn histogram(&self) -> Option<Histogram> {
        (self.bounds.len() == self.cumulative.len()).then(|| Histogram {
            buckets: self
                .bounds
                .iter()
                .copied()
                .zip(self.cumulative.iter().copied())
                .chain([(f64::INFINITY, self.inf)])
                .collect(),
            sum: self.sum,
            count: self.count,
        })
    }
}

impl RawServer {
    /// The JSON form of a server's increments (pure).
    pub fn of(s: &crate::metrics::ServerHistograms) -> Self {
        Self {
            ttft: s.ttft.as_ref().map(RawHistogram::of),
            itl: s.itl.as_ref().map(RawHistogram::of),
            problem: s.problem.clone(),
        }
    }

    /// The increments again (a histogram whose form is broken is left out).
    pub fn histograms(&self) -> crate::metrics::ServerHistograms {
        crate::metrics::ServerHistograms {
            ttft: self.ttft.as_ref().and_then(RawHistogram::histogram),
            itl: self.itl.as_ref().and_then(RawHistogram::histogram),
            problem: self.problem.clone(),
        }
    }
}

/// A pod's increments over one window (since its previous snapshot that was read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWindow {
    /// The cell's window it ended in, from 1.
    pub window: u32,
    /// Seconds from the pod's first snapshot to this one.
    pub at_s: f64,
    /// Requests completed.
    pub count: f64,
    /// Their latencies added, seconds.
    pub sum: f64,
    /// Failed requests.
    pub errors: f64,
    /// Requests it held waiting at the window's end, where it reports a backlog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<f64>,
    /// The index of the first bucket that grew (0 when none did).
    pub from: u32,
    /// Requests in each bucket alone, from bucket `from` to the last that grew.
    #[serde(serialize_with = "whole_numbers")]
    pub counts: Vec<f64>,
}

/// Writes counts that are whole numbers without a fraction (`3`, not `3.0`): windows
/// hold thousands of them.
fn whole_numbers<S: serde::Serializer>(values: &[f64], s: S) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(values.len()))?;
    for &v in values {
        if v.fract() == 0.0 && v.abs() < 9.0e15 {
            seq.serialize_element(&(v as i64))?;
        } else {
            seq.serialize_element(&v)?;
        }
    }
    seq.end()
}

impl RawPod {
    /// A pod's series, no window yet (its layout set when saved).
    pub fn new(pod: &str, backlog_start: Option<f64>) -> Self {
        Self {
            pod: pod.to_string(),
            layout: 0,
            backlog_start,
            windows: Vec::new(),
            server: None,
        }
    }

    /// Its backlog at the first snapshot and after each window, as far as it reported
    /// one: what the keep-up rule reads (`sweep::cell::fell_behind`).
    pub fn backlog(&self) -> Vec<f64> {
        self.backlog_start
            .into_iter()
            .chain(self.windows.iter().filter_map(|w| w.backlog))
            .collect()
    }

    /// The finite bucket bounds of a histogram.
    pub fn bounds_of(h: &Histogram) -> Vec<f64> {
        h.buckets.iter().map(|b| b.0).filter(|b| b.is_finite()).collect()
    }

    /// Appends the increments `d` (a histogram delta with this pod's bounds), its
    /// errors and its backlog at the window's end.
    pub fn push(&mut self, window: u32, at_s: f64, d: &Histogram, errors: f64, backlog: Option<f64>) {
        let mut below = 0.0;
        let own: Vec<f64> = d
            .buckets
            .iter()
            .map(|(_, cumulative)| {
                let own = cumulative - below;
                below = *cumulative;
                own
            })
            .collect();
        let first = own.iter().position(|&c| c != 0.0);
        let last = own.iter().rposition(|&c| c != 0.0);
        let (from, counts) = match (first, last) {
            (Some(a), Some(b)) => (a as u32, own[a..=b].to_vec()),
            _ => (0, Vec::new()),
        };
        self.windows.push(RawWindow {
            window,
            at_s,
            count: d.count,
            sum: d.sum,
            errors,
            backlog,
            from,
            counts,
        });
    }

    /// The increments of `windows` (all when None) as one cumulative histogram over
    /// `bounds`; None when a bucket index lies outside them.
    pub fn histogram(&self, bounds: &[f64], windows: Option<&[&RawWindow]>) -> Option<Histogram> {
        let all: Vec<&RawWindow>;
        let windows = match windows {
            Some(w) => w,
            None => {
                all = self.windows.iter().collect();
                &all
            }
        };
        let n = bounds.len() + 1;
        let mut own = vec![0.0; n];
        let (mut sum, mut count) = (0.0, 0.0);
        for w in windows {
            for (i, &c) in w.counts.iter().enumerate() {
                *own.get_mut(w.from as usize + i)? += c;
            }
            sum += w.sum;
            count += w.count;
        }
        let mut below = 0.0;
        let buckets = bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(own)
            .map(|(b, c)| {
                below += c;
                (b, below)
            })
            .collect();
        Some(Histogram { buckets, sum, count })
    }
}

/// The most windows one cell may record: 100,000 windows of 1 s are 28 hours.
pub const MAX_WINDOWS: u32 = 100_000;
/// The most buckets a layout may have (Prometheus' native histograms at schema 8 span
/// a nanosecond to a day in under 12,000).
pub const MAX_BUCKETS: usize = 100_000;

impl RawCell {
    /// Whether the record is one a sweep could have written: every count whole and
    /// bounded, every time finite, windows numbered within the cell and in order (pure).
    /// What it refuses would make `verify` spin, exhaust memory or compute from
    /// nonsense.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.windows > MAX_WINDOWS {
            return Err(format!(
                "windows is {}: a cell records at most {MAX_WINDOWS}",
                self.windows
            ));
        }
        check_seconds("measured_s", self.measured_s)?;
        for s in &self.series {
            let at = |what: &str| format!("pod {}: {what}", s.pod);
            if let Some(b) = s.backlog_start {
                check_count(&at("backlog_start"), b)?;
            }
            let (mut last_window, mut last_at) = (0u32, 0.0f64);
            for w in &s.windows {
                let here = |what: &str| at(&format!("window {}: {what}", w.window));
                if w.window <= last_window || w.window > self.windows {
                    return Err(here(&format!(
                        "out of order or outside the cell's {} windows",
                        self.windows
                    )));
                }
                check_seconds(&here("at_s"), w.at_s)?;
                if w.at_s < last_at {
                    return Err(here("at_s is earlier than the window before"));
                }
                check_count(&here("count"), w.count)?;
                check_count(&here("errors"), w.errors)?;
                if let Some(b) = w.backlog {
                    check_count(&here("backlog"), b)?;
                }
                if !w.sum.is_finite() || w.sum < 0.0 {
                    return Err(here(&format!(
                        "sum is {}: latencies add up to a finite sum from 0",
                        w.sum
                    )));
                }
                if w.from as usize + w.counts.len() > MAX_BUCKETS + 1 {
                    return Err(here("counts reach past the most buckets a layout may have"));
                }
                for &c in &w.counts {
                    check_count(&here("a bucket's count"), c)?;
                }
                let in_buckets: f64 = w.counts.iter().sum();
                if in_buckets > w.count {
                    return Err(here(&format!(
                        "its buckets hold {in_buckets} requests, more than its count {}",
                        w.count
                    )));
                }
                (last_window, last_at) = (w.window, w.at_s);
            }
        }
        for p in &self.warmup {
            check_seconds("a warm-up probe's at_s", p.at_s)?;
            if !p.throughput.is_finite() || p.throughput < 0.0 || p.mean_s.is_some_and(|m| !m.is_finite() || m < 0.0) {
                return Err("a warm-up probe's throughput or mean is not a finite number from 0".into());
            }
        }
        Ok(())
    }
}

impl Layouts {
    /// Whether each layout is finite bounds, positive and increasing, and not absurdly
    /// many (pure).
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.layouts.len() > MAX_BUCKETS {
            return Err(format!(
                "{} layouts: a run has at most {MAX_BUCKETS}",
                self.layouts.len()
            ));
        }
        for (i, l) in self.layouts.iter().enumerate() {
            if l.len() > MAX_BUCKETS {
                return Err(format!("layout {i} has {} bounds, more than {MAX_BUCKETS}", l.len()));
            }
            if l.iter().any(|b| !b.is_finite() || *b <= 0.0) || l.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!(
                    "layout {i}: bucket bounds are finite seconds above 0, increasing"
                ));
            }
        }
        Ok(())
    }
}

/// The raw cells as JSON lines (pure).
pub fn raw_jsonl(cells: &[RawCell]) -> Vec<u8> {
    to_jsonl(cells)
}

/// Reads a run's `bucket-layouts.json` (missing: none yet).
pub fn read_layouts(dir: &Path) -> Result<Layouts> {
    let path = dir.join(LAYOUTS_FILE);
    match crate::files::read_text(&path, crate::files::limits::RECORD) {
        Ok(t) => {
            let layouts: Layouts = serde_json::from_str(&t).map_err(|e| BenchError::RunDir {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            layouts.check().map_err(|reason| BenchError::RunDir { path, reason })?;
            Ok(layouts)
        }
        Err(crate::files::ReadError::Missing) => Ok(Layouts::default()),
        Err(e) => Err(crate::files::unreadable(&path, e)),
    }
}

/// Reads a run's `windows.jsonl` (missing: a run made before raw windows were kept, or
/// one that measured nothing yet: none). A line that does not parse is an error
/// naming the file and line.
pub fn read_raw(dir: &Path) -> Result<Vec<RawCell>> {
    let path = dir.join(RAW_FILE);
    let cells: Vec<RawCell> = read_jsonl(&path, RawCell::check)?;
    // One line a cell: a second would be counted twice.
    let mut seen = std::collections::HashSet::new();
    for c in &cells {
        if !seen.insert((c.repeat, c.arm(), c.pods)) {
            return Err(BenchError::RunDir {
                path,
                reason: format!(
                    "two lines for {} × {} (repeat {}): a cell has one",
                    c.arm(),
                    c.pods,
                    c.repeat
                ),
            });
        }
    }
    Ok(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(cumulative: &[f64], sum: f64) -> Histogram {
        let bounds = [0.001, 0.002, 0.005, f64::INFINITY];
        Histogram {
            buckets: bounds.iter().copied().zip(cumulative.iter().copied()).collect(),
            sum,
            count: *cumulative.last().expect("buckets"),
        }
    }

    #[test]
    fn windows_are_sparse_and_add_up_to_the_whole_delta() {
        let a = hist(&[0.0, 5.0, 5.0, 5.0], 0.008);
        let b = hist(&[1.0, 1.0, 4.0, 6.0], 0.03);
        let bounds = RawPod::bounds_of(&a);
        assert_eq!(bounds, [0.001, 0.002, 0.005]);
        let mut pod = RawPod::new("pod-0", Some(2.0));
        pod.push(1, 1.0, &a, 0.0, Some(3.0));
        pod.push(2, 2.0, &b, 1.0, Some(1.0));
        assert_eq!(pod.backlog(), [2.0, 3.0, 1.0]);
        assert_eq!((pod.windows[0].from, &pod.windows[0].counts[..]), (1, &[5.0][..]));
        assert_eq!(
            (pod.windows[1].from, &pod.windows[1].counts[..]),
            (0, &[1.0, 0.0, 3.0, 2.0][..])
        );
        let mut whole = a.clone();
        assert!(whole.add(&b));
        assert_eq!(pod.histogram(&bounds, None), Some(whole));
        let cell = RawCell {
            repeat: 1,
            strategy: Strategy::Mps,
            timeslice: None,
            mps_threads: None,
            mps_memory: None,
            pods: 1,
            measured_s: 2.0,
            windows: 2,
            series: vec![pod],
            gpu_samples: Vec::new(),
            warmup: vec![WarmupProbe {
                at_s: 1.0,
                throughput: 3.0,
                mean_s: None,
            }],
        };
        let text = raw_jsonl(std::slice::from_ref(&cell));
        assert!(String::from_utf8_lossy(&text).contains(r#""from":0,"counts":[1,0,3,2]"#));
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join(RAW_FILE), &text).expect("write");
        assert_eq!(read_raw(dir.path()).expect("read"), [cell]);
        std::fs::write(dir.path().join(RAW_FILE), b"{\"repeat\":1}\n").expect("write");
        let e = read_raw(dir.path()).expect_err("bad line").to_string();
        assert!(e.contains("windows.jsonl") && e.contains("line 1:"), "{e}");
        let mut layouts = Layouts::default();
        assert_eq!(
            (
                layouts.index_of(&bounds),
                layouts.index_of(&[1.0]),
                layouts.index_of(&bounds)
            ),
            (0, 1, 0)
        );
    }

    #[test]
    fn a_bucket_outside_the_bounds_is_no_histogram() {
        let mut pod = RawPod::new("pod-0", None);
        pod.windows.push(RawWindow {
            window: 1,
            at_s: 1.0,
            count: 1.0,
            sum: 0.001,
            errors: 0.0,
            backlog: None,
            from: 9,
            counts: vec![1.0],
        });
        assert_eq!(pod.histogram(&[0.001, 0.002], None), None);
    }
}
