//! The tables of a report: one metric each, rows strategies, columns pod counts from
//! one up (the charts' order), cells that did not measure shown by
//! their status with the reason in a numbered note.

use std::fmt::Write;

use crate::domain::CellStatus;
use crate::results::record::CellRecord;

use super::RunData;

/// One metric of the aggregate row.
#[derive(Clone, Copy)]
pub struct Metric {
    /// Table title.
    pub title: &'static str,
    /// Unit for the caption.
    pub unit: &'static str,
    /// What it reads.
    pub value: fn(&CellRecord) -> Option<f64>,
    /// Decimals.
    pub decimals: usize,
    /// Shown only when some cell has a value (what only one backend records).
    pub optional: bool,
}

impl std::fmt::Debug for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.title)
    }
}

/// The p99 table's title: one measurement's p99 shows its sampling interval.
const P99_TITLE: &str = "p99 latency";
const P50_TITLE: &str = "Median (p50) latency";

/// The speed-up table's title: its numbers are built on the strategy's 1-pod cell too.
const SPEEDUP_TITLE: &str = "Speed-up vs 1 pod";

/// The report's tables, in order: mean latency first, as in the reference study.
pub const METRICS: [Metric; 37] = [
    Metric {
        title: "Mean inference latency",
        unit: "ms",
        value: |c| c.mean_s.map(|v| v * 1e3),
        decimals: 2,
        optional: false,
    },
    Metric {
        title: P50_TITLE,
        unit: "ms",
        value: |c| c.p50_s.map(|v| v * 1e3),
        decimals: 2,
        optional: false,
    },
    Metric {
        title: P99_TITLE,
        unit: "ms",
        value: |c| c.p99_s.map(|v| v * 1e3),
        decimals: 2,
        optional: false,
    },
    Metric {
        title: "Aggregate throughput",
        unit: "inferences/s",
        value: |c| c.throughput_per_s,
        decimals: 1,
        optional: false,
    },
    Metric {
        title: "Offered load",
        unit: "requests/s, all pods",
        value: |c| c.offered_per_s,
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "SLO attainment, p50",
        unit: "%",
        value: |c| c.slo_p50_attainment.map(|v| v * 100.0),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "SLO attainment, p90",
        unit: "%",
        value: |c| c.slo_p90_attainment.map(|v| v * 100.0),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "SLO attainment, p99",
        unit: "%",
        value: |c| c.slo_p99_attainment.map(|v| v * 100.0),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "Goodput within the SLO",
        unit: "requests/s completed within the tightest --slo threshold; streamed answers: requests/s that met every objective",
        value: |c| c.goodput_per_s,
        decimals: 1,
        optional: true,
    },
    Metric {
        title: "Time to first token, p50",
        unit: "ms from the scheduled arrival",
        value: |c| c.ttft_p50_s.map(|v| v * 1e3),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "Time to first token, p99",
        unit: "ms from the scheduled arrival",
        value: |c| c.ttft_p99_s.map(|v| v * 1e3),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "Inter-token latency, p50",
        unit: "ms, every gap between two tokens",
        value: |c| c.itl_p50_s.map(|v| v * 1e3),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "Inter-token latency, p99",
        unit: "ms, every gap between two tokens",
        value: |c| c.itl_p99_s.map(|v| v * 1e3),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "Time to first token, p50, the server's own histogram",
        unit: "ms from the server taking the request, interpolated within its buckets (--server-ttft-metric); beside the client's p50 above",
        value: |c| c.server_ttft_p50_s.map(|v| v * 1e3),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "Inter-token latency, p50, the server's own histogram",
        unit: "ms, interpolated within its buckets (--server-itl-metric); beside the client's p50 above",
        value: |c| c.server_itl_p50_s.map(|v| v * 1e3),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "Time per output token, mean",
        unit: "ms, (end to end − first token) / (tokens − 1) per request",
        value: |c| c.tpot_mean_s.map(|v| v * 1e3),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "Output tokens per second",
        unit: "tokens/s, all pods",
        value: |c| c.output_tokens_per_s,
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "SLO attainment, time to first token",
        unit: "% of requests within the ttft: threshold",
        value: |c| c.ttft_slo_attainment.map(|v| v * 100.0),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "SLO attainment, inter-token latency",
        unit: "% of gaps within the itl: threshold",
        value: |c| c.itl_slo_attainment.map(|v| v * 100.0),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: "SLO attainment, time per output token",
        unit: "% of requests within the tpot: threshold",
        value: |c| c.tpot_slo_attainment.map(|v| v * 100.0),
        decimals: 2,
        optional: true,
    },
    Metric {
        title: SPEEDUP_TITLE,
        unit: "× aggregate throughput",
        value: |c| c.speedup_vs_1pod,
        decimals: 2,
        optional: false,
    },
    Metric {
        title: "Fairness (Jain's index over pods)",
        unit: "1 = equal shares",
        value: |c| c.fairness,
        decimals: 3,
        optional: false,
    },
    Metric {
        title: "Energy per inference",
        unit: "J",
        value: |c| c.energy_j_per_inference,
        decimals: 3,
        optional: false,
    },
    Metric {
        title: "GPU utilisation",
        unit: "%",
        value: |c| c.gpu_util_pct,
        decimals: 0,
        optional: false,
    },
    Metric {
        title: "Power draw",
        unit: "W, mean of the once-a-second samples",
        value: |c| c.power_w,
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "SM clock",
        unit: "MHz, mean of the samples",
        value: |c| c.sm_clock_mhz,
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "SM clock, lowest sample",
        unit: "MHz",
        value: |c| c.sm_clock_min_mhz,
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "Memory clock",
        unit: "MHz, mean of the samples",
        value: |c| c.mem_clock_mhz,
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "GPU temperature, highest sample",
        unit: "°C",
        value: |c| c.temp_max_c,
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "Time throttled",
        unit: "% of samples with a thermal or hardware slowdown (NVML's clock event reasons)",
        value: |c| c.throttled_share.map(|v| v * 100.0),
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "Time at the power cap",
        unit: "% of samples with the clocks held at the board's power limit (not a slowdown)",
        value: |c| c.power_capped.map(|v| v * 100.0),
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "Within-cell throughput spread",
        unit: "%, (max − min) / mean over the cell's windows",
        value: |c| c.throughput_spread.map(|v| v * 100.0),
        decimals: 1,
        optional: false,
    },
    Metric {
        title: "Switch to the cell's configuration (Kubernetes)",
        unit: "s, first change to the node serving it",
        value: |c| c.switch_s,
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "MIG reconfiguration (Kubernetes)",
        unit: "s, of the switch",
        value: |c| c.mig_reconfigure_s,
        decimals: 0,
        optional: true,
    },
    Metric {
        title: "Pods ready after launch",
        unit: "s",
        value: |c| c.pods_ready_s,
        decimals: 1,
        optional: true,
    },
    Metric {
        title: "Warm-up",
        unit: "s, after the pods were ready",
        value: |c| c.warmup_s,
        decimals: 1,
        optional: true,
    },
    Metric {
        title: "Pods stopped",
        unit: "s",
        value: |c| c.stop_s,
        decimals: 1,
        optional: true,
    },
];

/// Where a run's time went, summed over its cells' aggregate rows (pure): switching
/// strategies, starting pods, warming up, measuring windows and stopping pods, with the
/// rest of the run's wall time (between cells, a run's own start and end). None for a
/// run recorded before its cells kept their phases.
pub fn time_spent(run: &crate::results::record::RunRecord, cells: &[CellRecord]) -> Option<String> {
    let agg: Vec<&CellRecord> = cells.iter().filter(|c| c.is_aggregate()).collect();
    if !agg.iter().any(|c| c.warmup_s.is_some() || c.stop_s.is_some()) {
        return None;
    }
    let sum = |f: fn(&CellRecord) -> Option<f64>| agg.iter().filter_map(|c| f(c)).sum::<f64>();
    let phases = [
        ("switching", sum(|c| c.switch_s)),
        ("starting pods", sum(|c| c.pods_ready_s)),
        ("warm-up", sum(|c| c.warmup_s)),
        ("windows", sum(|c| c.duration_s)),
        ("stopping pods", sum(|c| c.stop_s)),
    ];
    let counted: f64 = phases.iter().map(|(_, s)| s).sum();
    let measured = agg.iter().filter(|c| c.duration_s.is_some()).count();
    let secs = |s: f64| crate::sweep::progress::short_duration(std::time::Duration::from_secs_f64(s.max(0.0)));
    let wall = run.finished_at.as_deref().and_then(|end| {
        let a = humantime::parse_rfc3339(&run.started_at).ok()?;
        let b = humantime::parse_rfc3339(end).ok()?;
        b.duration_since(a).ok().map(|d| d.as_secs_f64())
    });
    let mut parts: Vec<String> = phases
        .iter()
        .filter(|(_, s)| *s > 0.0)
        .map(|(name, s)| format!("{name} {}", secs(*s)))
        .collect();
    // GPUs measured side by side (`--gpus`): their phases overlap in time.
    let mut gpus: Vec<u32> = agg.iter().filter_map(|c| c.gpu).collect();
    gpus.sort_unstable();
    gpus.dedup();
    if gpus.len() > 1 {
        return Some(format!(
            "{} over {measured} measured cells, summed over {} GPUs measuring side by side{}",
            parts.join(" · "),
            gpus.len(),
            wall.map_or(String::new(), |w| format!(" (wall time {})", secs(w)))
        ));
    }
    match wall {
        Some(w) => {
            parts.push(format!("other {}", secs((w - counted).max(0.0))));
            Some(format!(
                "{} of {} over {measured} measured cells",
                parts.join(" · "),
                secs(w)
            ))
        }
        None => Some(format!(
            "{} over {measured} measured cells (the run has no end time)",
            parts.join(" · ")
        )),
    }
}

/// The 95% sampling interval a single pass records for the quantile a table shows, in
/// seconds (the high end None when too few requests bound it); None for other tables.
fn sampling_interval(title: &str, row: &CellRecord) -> Option<(f64, Option<f64>)> {
    match title {
        P50_TITLE => Some((row.p50_low_s?, row.p50_high_s)),
        P99_TITLE => Some((row.p99_low_s?, row.p99_high_s)),
        _ => None,
    }
}

/// A table cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// A number, formatted.
    Value(String),
    /// A number built on a cell to read with care (unsettled, a pod that could not keep
    /// up): the number and the note that says why.
    Flagged(String, usize),
    /// A trial's outcome in words, coloured by what became of the victim.
    Rated(String, super::outcome::Outcome),
    /// Not measured: the status and the number of its note.
    Status(CellStatus, usize),
    /// Measured, but this metric has no value (e.g. no telemetry).
    Empty,
    /// The cell is not in the run (an unfinished run).
    Missing,
}

/// One table.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Title.
    pub title: String,
    /// Unit.
    pub unit: String,
    /// The heading of the row names' column ("Strategy").
    pub corner: String,
    /// Column headings ("1 pod", "3 pods" …).
    pub columns: Vec<String>,
    /// (strategy title, cells).
    pub rows: Vec<(String, Vec<Cell>)>,
}

/// All tables and the notes they refer to.
#[derive(Debug, Clone, PartialEq)]
pub struct Tables {
    /// The tables.
    pub tables: Vec<Table>,
    /// Notes: (number, "Strategy — status: reason").
    pub notes: Vec<(usize, String)>,
    /// How to read the tables (e.g. what the exclusive rows mean).
    pub reading: Vec<String>,
    /// What may make the numbers wrong, shown above the tables.
    pub warnings: Vec<String>,
}

/// What the exclusive baseline's rows mean.
pub const EXCLUSIVE_READING: &str = "Exclusive is the baseline without sharing: one pod gets the GPU and the other N−1 stay pending, so latency stays that of one pod, aggregate throughput does not grow, and fairness over the requested pods is 1/N.";

/// The number of the note reading `text`: its own if it is there, else the next one
/// (notes are numbered by first appearance, and a reason shared by many cells is one
/// note).
pub fn note_number(notes: &mut Vec<(usize, String)>, text: String) -> usize {
    if let Some((n, _)) = notes.iter().find(|(_, t)| *t == text) {
        return *n;
    }
    let n = notes.len() + 1;
    notes.push((n, text));
    n
}

/// The unit of an SLO attainment table: its threshold and target, and how far an
/// attainment can be off (None: not an attainment table).
fn slo_unit(data: &RunData, title: &str) -> Option<String> {
    let pct = title.strip_prefix("SLO attainment, p")?;
    let slo = data
        .run
        .plan
        .slos
        .iter()
        .find(|s| s.quantile.is_some_and(|q| format!("{}", (q * 100.0).round()) == pct))?;
    let bound = data
        .cells
        .iter()
        .filter(|c| c.is_aggregate())
        .filter_map(|c| c.slo_attainment_bound)
        .reduce(f64::max);
    Some(format!(
        "% of requests within {} (the SLO holds at ≥ {pct}%){}",
        humantime::format_duration(slo.threshold),
        bound.map_or(String::new(), |b| format!(", interpolation bound ±{:.2}%", b * 100.0))
    ))
}

/// How to read the rows of a DRA time-slice interval sweep (`--timeslice`).
pub const INTERVAL_READING: &str = "Time-slicing (default), (short), (medium) and (long) are time-slicing through one shared DRA claim whose GpuConfig asked NVIDIA's DRA driver for that time slice: it runs nvidia-smi compute-policy --set-timeslice 0 to 3 on the GPU when it prepares the claim and back to 0 when it unprepares it. Each interval has its own rows, and its speed-up and slow-down are against its own 1-pod cell.";

/// Builds every table (pure).
pub fn all(data: &RunData) -> Tables {
    let pods = data.pods_order();
    let mut notes: Vec<(usize, String)> = Vec::new();
    // Notes are numbered by first appearance; the reason alone (without the cell) is
    // what repeats, e.g. one MIG reason for four cells.
    let mut cell_notes = std::collections::HashMap::new();
    for s in data.arms() {
        for &p in &pods {
            if let Some(a) = data.aggregate(s, p)
                && a.status != CellStatus::Ok
            {
                let n = note_number(&mut notes, format!("{} — {}: {}", s.title(), a.status, a.note));
                cell_notes.insert((s, p), n);
            }
        }
    }
    // Measured cells to read with care: every number built on them carries the note.
    let mut flag_notes = std::collections::HashMap::new();
    for s in data.arms() {
        for &p in &pods {
            let repeats = data.repeats(s, p);
            let several = repeats.len() > 1;
            let flags: Vec<String> = repeats
                .iter()
                .filter(|r| r.status == CellStatus::Ok)
                .flat_map(|r| {
                    r.flags()
                        .into_iter()
                        .map(move |f| if several { format!("{f} (pass {})", r.repeat) } else { f })
                })
                .collect();
            if !flags.is_empty() {
                let text = format!(
                    "{} at {p} pod{} — read with care: {}",
                    s.title(),
                    if p == 1 { "" } else { "s" },
                    flags.join("; ")
                );
                flag_notes.insert((s, p), note_number(&mut notes, text));
            }
        }
    }
    // A speed-up is a ratio over the 1-pod cell: a 1-pod cell to read with care makes
    // every speed-up built on it one too (a cell with flags of its own shows those).
    let mut baseline_notes = std::collections::HashMap::new();
    for s in data.arms() {
        let why = flag_notes
            .get(&(s, 1))
            .map(|n| format!("is to be read with care (note {n})"));
        let built_on: Vec<u32> = pods
            .iter()
            .copied()
            .filter(|&p| p != 1 && data.aggregate(s, p).and_then(|a| a.speedup_vs_1pod).is_some())
            .collect();
        let Some(why) = why.filter(|_| !built_on.is_empty()) else {
            continue;
        };
        let text = format!(
            "{} — each speed-up is a ratio over the 1-pod cell, which {why}",
            s.title()
        );
        let n = note_number(&mut notes, text);
        for p in built_on {
            baseline_notes.insert((s, p), n);
        }
    }
    // The coarsest quantile resolution of the run's cells (None: an older run).
    let resolution = data
        .arms()
        .into_iter()
        .flat_map(|s| {
            pods.iter()
                .filter_map(move |&p| data.aggregate(s, p).and_then(|a| a.quantile_resolution))
        })
        .reduce(f64::max);
    // Whether a p99 shows its sampling interval (then a reading line says what it is).
    let bracketed = std::cell::Cell::new(false);
    let tables: Vec<Table> = METRICS
        .iter()
        .filter(|m| {
            !m.optional
                || data.arms().into_iter().any(|s| {
                    pods.iter()
                        .any(|&p| data.aggregate(s, p).and_then(|a| (m.value)(&a)).is_some())
                })
        })
        .map(|m| Table {
            corner: "Strategy".into(),
            title: m.title.to_string(),
            unit: match (resolution, slo_unit(data, m.title)) {
                (_, Some(unit)) => unit,
                (Some(r), None) if m.title.contains("p50") || m.title.contains("p99") => {
                    format!("{}, resolution ±{:.1}%", m.unit, r * 100.0)
                }
                _ => m.unit.to_string(),
            },
            columns: pods
                .iter()
                .map(|p| format!("{p} pod{}", if *p == 1 { "" } else { "s" }))
                .collect(),
            rows: data
                .arms()
                .into_iter()
                .map(|s| {
                    let cells = pods
                        .iter()
                        .map(|&p| match data.aggregate(s, p) {
                            None => Cell::Missing,
                            Some(a) if a.status != CellStatus::Ok => Cell::Status(a.status, cell_notes[&(s, p)]),
                            Some(a) => match (m.value)(&a) {
                                Some(v) if v.is_finite() => {
                                    let half = data.interval(s, p, m.value).and_then(|i| i.half_width);
                                    let text = match half {
                                        Some(h) if h.is_finite() => {
                                            format!("{v:.prec$} ± {h:.prec$}", prec = m.decimals)
                                        }
                                        // One measurement: a quantile's sampling interval.
                                        _ => match sampling_interval(m.title, &a) {
                                            Some((lo, hi)) => {
                                                bracketed.set(true);
                                                let hi = hi.map_or("?".to_string(), |hi| {
                                                    format!("{:.prec$}", hi * 1e3, prec = m.decimals)
                                                });
                                                format!("{v:.prec$} ({:.prec$}–{hi})", lo * 1e3, prec = m.decimals)
                                            }
                                            None => format!("{v:.prec$}", prec = m.decimals),
                                        },
                                    };
                                    let derived = if m.title == SPEEDUP_TITLE {
                                        baseline_notes.get(&(s, p))
                                    } else {
                                        None
                                    };
                                    match flag_notes.get(&(s, p)).or(derived) {
                                        Some(&n) => Cell::Flagged(text, n),
                                        None => Cell::Value(text),
                                    }
                                }
                                _ => Cell::Empty,
                            },
                        })
                        .collect();
                    (s.title().to_string(), cells)
                })
                .collect(),
        })
        .collect();
    let mut reading = if data.run.kind.capacity().is_none()
        && data.strategies().contains(&crate::domain::Strategy::Exclusive)
        && pods.iter().any(|p| *p > 1)
    {
        vec![EXCLUSIVE_READING.to_string()]
    } else {
        Vec::new()
    };
    if data.planned_repeats() > 1 {
        reading.push(format!(
            "The run made {} passes over the plan (--repeat), each in a rotated strategy order so that drift over time does not line up with one strategy. Each number is the {}; a cell measured in one repeat only shows its value alone. The within-cell throughput spread is the noise inside one measurement; the interval is the noise between repeats, usually the larger.",
            data.planned_repeats(),
            crate::stats::interval::METHOD
        ));
    }
    if data.arms().iter().any(|a| a.timeslice.is_some()) {
        reading.push(INTERVAL_READING.to_string());
    }
    if let Some(r) = resolution {
        reading.push(format!(
            "The p50 and p99 are interpolated inside the workload's histogram buckets: each can be off by up to {:.1}% of its value (the widest bucket they fell in; the `quantile_resolution` column gives it per cell). Differences smaller than that are not resolved.",
            r * 100.0
        ));
    }
    if bracketed.get() {
        reading.push("In the p50 and p99 tables, brackets give each quantile's 95% sampling interval: distribution-free, the order statistics at the binomial ranks around the 50th or 99th percentile, read from the histogram (\"?\": too few requests to bound it above; a p99 needs at least 368).".to_string());
    }
    let (gpus, warnings) = super::parallel::lines(data);
    reading.extend(gpus);
    let mut tables = tables;
    if let Some((per_gpu, how)) = per_gpu_tables(data) {
        tables.extend(per_gpu);
        reading.push(how);
    }
    Tables {
        tables,
        notes,
        reading,
        warnings,
    }
}

/// The GPU rows' metrics: throughput, p99 latency and fairness.
const PER_GPU: [Metric; 3] = [
    Metric {
        title: "Throughput on each GPU",
        unit: "inferences/s",
        value: |c| c.throughput_per_s,
        decimals: 1,
        optional: false,
    },
    Metric {
        title: "p99 latency on each GPU",
        unit: "ms",
        value: |c| c.p99_s.map(|v| v * 1e3),
        decimals: 2,
        optional: false,
    },
    Metric {
        title: "Fairness on each GPU",
        unit: "Jain's index over the pods that ran on it",
        value: |c| c.fairness,
        decimals: 3,
        optional: false,
    },
];

/// A run whose cells filled several GPUs of a node: a table per metric with a row per
/// cell and a column per GPU (its `gpu:<UUID>` rows of the first pass; the GPUs numbered
/// gpu:0, gpu:1, … in the order of their UUIDs over the whole run), and how to read them
/// (None: a run of one GPU).
fn per_gpu_tables(data: &RunData) -> Option<(Vec<Table>, String)> {
    let gpu_rows: Vec<&CellRecord> = data.cells.iter().filter(|c| c.is_gpu_row() && c.repeat == 1).collect();
    let filled = data.run.environment.gpus_filled?;
    let gpus: Vec<&str> = gpu_rows
        .iter()
        .filter_map(|c| c.gpu_uuid.as_deref())
        .collect::<std::collections::BTreeSet<&str>>()
        .into_iter()
        .collect();
    let cells: Vec<(crate::domain::Arm, u32)> = data
        .arms()
        .into_iter()
        .flat_map(|a| data.pods_order().into_iter().map(move |p| (a, p)))
        .filter(|(a, p)| gpu_rows.iter().any(|c| c.arm() == *a && c.pods == *p))
        .collect();
    let tables = PER_GPU
        .iter()
        .map(|m| Table {
            title: m.title.to_string(),
            unit: m.unit.to_string(),
            corner: "Cell (pods on each GPU)".into(),
            columns: (0..gpus.len()).map(|k| format!("gpu:{k}")).collect(),
            rows: cells
                .iter()
                .map(|&(arm, pods)| {
                    let row = gpus
                        .iter()
                        .map(|uuid| {
                            match gpu_rows
                                .iter()
                                .find(|c| c.arm() == arm && c.pods == pods && c.gpu_uuid.as_deref() == Some(*uuid))
                            {
                                None => Cell::Missing,
                                Some(c) => match (m.value)(c) {
                                    Some(v) if v.is_finite() => Cell::Value(format!("{v:.prec$}", prec = m.decimals)),
                                    _ => Cell::Empty,
                                },
                            }
                        })
                        .collect();
                    (format!("{} × {pods}", arm.title()), row)
                })
                .collect(),
        })
        .collect();
    let names: Vec<String> = gpus
        .iter()
        .enumerate()
        .map(|(k, uuid)| format!("gpu:{k} is {uuid}"))
        .collect();
    let how = format!(
        "This node has {filled} GPUs and the device plugin shares them all: each cell asked its pods on every GPU (a Deployment of pods × {filled}, which the plugin spreads, the least-used GPU first), so the tables above pool all {filled} GPUs. The per-GPU tables split each cell by the GPU its pods said they ran on (workload_info's device_uuid): {}. MIG cells have no GPU rows: each pod has an instance of its own.",
        if names.is_empty() {
            "no pod said".to_string()
        } else {
            names.join(", ")
        }
    );
    Some((if gpu_rows.is_empty() { Vec::new() } else { tables }, how))
}

/// Text from a run directory as Markdown text: on one line, and HTML's special
/// characters as entities, so that a label or a note (which may quote a pod's log)
/// renders as the text it is, never as markup.
fn md_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\n', " ")
}

/// The Markdown summary: heading, label, the tables, the notes.
pub fn markdown(data: &RunData, t: &Tables) -> String {
    let mut out = String::new();
    let p = &data.run.plan;
    let _ = writeln!(out, "# gpushare-bench run {}\n", data.run.run_id);
    if let Some(label) = data.label() {
        let _ = writeln!(out, "> **{}**\n", md_text(&label));
    }
    if let Some(partial) = data.partial() {
        let _ = writeln!(out, "> **{}**\n", md_text(&partial));
    }
    for w in &t.warnings {
        let _ = writeln!(out, "> **{}**\n", md_text(w));
    }
    let _ = writeln!(
        out,
        "{} · model {} · {} · batch {} · {} backend · source {} · {} → {}\n",
        data.device_name(),
        p.model,
        p.precision,
        p.batch,
        p.backend,
        match p.source {
            crate::domain::Source::Scrape => "scrape",
            crate::domain::Source::Prometheus => "prometheus",
            crate::domain::Source::Client => "client",
        },
        data.run.started_at,
        data.run.finished_at.as_deref().unwrap_or("unfinished")
    );
    let answer = super::verdict::lines(data);
    if !answer.is_empty() {
        let _ = writeln!(out, "## The answer\n");
        for line in &answer {
            let _ = writeln!(out, "- {}", md_text(line));
        }
        out.push('\n');
    }
    if let Some(line) = super::verdict::unavailable_line(data) {
        let _ = writeln!(out, "{}\n", md_text(&line));
    }
    let tag = data.short_label().map(|l| format!(" — {l}")).unwrap_or_default();
    for table in &t.tables {
        let _ = writeln!(out, "## {} ({}){tag}\n", table.title, table.unit);
        let _ = writeln!(out, "| | {} |", table.columns.join(" | "));
        let _ = writeln!(out, "|---|{}|", vec!["---:"; table.columns.len()].join("|"));
        for (name, cells) in &table.rows {
            let cells: Vec<String> = cells
                .iter()
                .map(|c| match c {
                    Cell::Value(v) => v.clone(),
                    Cell::Flagged(v, n) => format!("{v} ⚑[{n}]"),
                    Cell::Rated(v, o) => format!("**{}**: {v}", o.word()),
                    Cell::Status(s, n) => format!("{s} [{n}]"),
                    Cell::Empty => "–".into(),
                    Cell::Missing => "not run".into(),
                })
                .collect();
            let _ = writeln!(out, "| {name} | {} |", cells.join(" | "));
        }
        out.push('\n');
    }
    for r in &t.reading {
        let _ = writeln!(out, "{r}\n");
    }
    if !t.notes.is_empty() {
        let _ = writeln!(out, "## Notes\n");
        for (n, text) in &t.notes {
            let _ = writeln!(out, "{n}. {}", md_text(text));
        }
        out.push('\n');
    }
    out
}
