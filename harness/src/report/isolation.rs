//! The report of an isolation run (pure): the isolation matrix, the victim's latency
//! per scenario and strategy, what the event did to each pod and how soon the victim
//! served again, and a chart of the victim's p50–p99 beside the victim alone.

use plotters::prelude::*;

use crate::domain::{CellStatus, Strategy};
use crate::error::Result;
use crate::isolation::plan::{
    AGGRESSOR_MEMORY, CPU_AGGRESSOR_BYTES, CPU_VICTIM_BYTES, Scenario, VICTIM_GROWS_AFTER, VICTIM_MEMORY,
    scenario_label,
};
use crate::report::RunData;
use crate::report::charts::{draw_legend, draw_markers, err, legend_entry, look};
use crate::report::isolation_matrix::{cell, find, matrix, rows};
use crate::report::tables::{Cell, Table, Tables, note_number};
use crate::results::isolation::IsolationRecord;

/// A short axis label of a row.
fn short_label(scenario: &str, aggressors: u32) -> String {
    match scenario {
        "alone" => "alone".into(),
        crate::isolation::plan::CAPPED => format!("capped as ×{aggressors}"),
        "noisy-neighbour" => format!("noisy ×{aggressors}"),
        "memory-pressure" => "memory".into(),
        other => other.to_string(),
    }
}

/// One pod's outcome, short: "aggressor-1 exit 5", "aggressor-1 killed by signal 9".
fn short_outcome(part: &str) -> String {
    let mut it = part.splitn(3, ": ");
    let first = it.next().unwrap_or("");
    if first.contains(" exit ") || first.ends_with(" serving") || first.ends_with(" pending") {
        return first.to_string();
    }
    match it.next() {
        Some(second) => format!("{first} {second}"),
        None => first.to_string(),
    }
}

/// What the event did: who exited, and how soon the victim served again.
fn event_text(r: &IsolationRecord) -> String {
    let mut parts = vec![match (r.victim_status, r.victim_exit_code) {
        (CellStatus::Ok, _) => "victim serving".to_string(),
        (status, Some(c)) => format!("victim {status} (exit {c})"),
        (status, None) => format!("victim {status}"),
    }];
    parts.extend(
        r.aggressor_outcome
            .split("; ")
            .filter(|p| !p.is_empty())
            .map(short_outcome),
    );
    if let Some(s) = r.recovery_s {
        parts.push(format!("a new victim ready {s:.1} s later"));
    } else if r.recovery.starts_with("a new victim did not serve") {
        parts.push("a new victim did not serve".into());
    }
    parts.join("; ")
}

/// The latency target in words (pure): `--slo`'s, the run's one target for every
/// strategy, or, where the records hold different targets, each strategy's own.
fn target_text(slo_flag: Option<f64>, records: &[IsolationRecord]) -> String {
    let factor = crate::isolation::record::DEFAULT_SLO_FACTOR;
    if let Some(s) = slo_flag {
        return format!("{:.2} ms for every strategy (--slo)", s * 1e3);
    }
    let mut targets: Vec<f64> = records.iter().filter_map(|r| r.slo_s).collect();
    targets.dedup_by(|a, b| (*a - *b).abs() <= 1e-12 * b.abs().max(1e-12));
    // The reference: the victim alone whose p99 set the target.
    let reference = |target: f64| {
        records
            .iter()
            .filter(|r| r.scenario == "alone")
            .find(|r| {
                r.victim_p99_s
                    .is_some_and(|p| (p * factor - target).abs() <= 1e-9 * target)
            })
            .map(|r| r.strategy.title())
    };
    match targets.as_slice() {
        [] => "not set (the victim alone under the first strategy was not measured, and no --slo given)".into(),
        [one] => match reference(*one) {
            Some(strategy) => format!(
                "{:.2} ms for every strategy: {factor} × the victim's p99 alone under {strategy}",
                one * 1e3
            ),
            None => format!("{:.2} ms for every strategy", one * 1e3),
        },
        _ => format!("{factor} × the victim's p99 alone under each strategy, so the strategies' targets differ"),
    }
}

/// The tables and notes of an isolation run.
pub fn tables(data: &RunData) -> Tables {
    let Some(plan) = data.run.kind.isolation() else {
        return Tables {
            tables: Vec::new(),
            notes: Vec::new(),
            reading: Vec::new(),
            warnings: Vec::new(),
        };
    };
    let records = &data.isolation;
    let m = matrix(records);
    let mut notes = m.notes.clone();
    let strategies = data.strategies();
    let columns: Vec<String> = strategies.iter().map(|s| s.title().to_string()).collect();
    let all_rows = rows(records);
    let resolution = data
        .isolation
        .iter()
        .filter_map(|r| r.quantile_resolution)
        .reduce(f64::max);
    let latency = Table {
        title: "Victim latency".into(),
        unit: match resolution {
            Some(r) => format!(
                "ms, p50 / p99 (p99's 95% sampling interval where recorded), resolution ±{:.1}%",
                r * 100.0
            ),
            None => "ms, p50 / p99 (p99's 95% sampling interval where recorded)".into(),
        },
        corner: "Scenario".into(),
        columns: columns.clone(),
        rows: all_rows
            .iter()
            .map(|(scenario, k)| {
                let cells = strategies
                    .iter()
                    .map(|&s| {
                        cell(records, &mut notes, (s, scenario, *k), |r| {
                            let p99 = r.victim_p99_s? * 1e3;
                            // p99's 95% sampling interval where the victim served enough.
                            let interval = match (r.victim_p99_low_s, r.victim_p99_high_s) {
                                (Some(lo), Some(hi)) => format!(" ({:.2}–{:.2})", lo * 1e3, hi * 1e3),
                                (Some(lo), None) => format!(" ({:.2}–?)", lo * 1e3),
                                _ => String::new(),
                            };
                            // Numbers of a victim that exited or fell behind say so.
                            let mark = if r.victim_died_after_s.is_some() {
                                " (until it exited)"
                            } else if r.victim_kept_up == Some(false) {
                                " (behind its load)"
                            } else {
                                ""
                            };
                            Some(format!("{:.2} / {p99:.2}{interval}{mark}", r.victim_p50_s? * 1e3))
                        })
                    })
                    .collect();
                (scenario_label(scenario, *k), cells)
            })
            .collect(),
    };
    let events = Table {
        title: "After the event: who exited, and how soon a new victim was ready".into(),
        unit: "exit 4 = out of GPU memory, 5 = GPU fault; a kill is SIGKILL (signal 9)".into(),
        corner: "Scenario".into(),
        columns,
        rows: all_rows
            .iter()
            .filter(|(scenario, _)| matches!(scenario.as_str(), "memory-pressure" | "fault" | "crash"))
            .map(|(scenario, k)| {
                let label = scenario_label(scenario, *k);
                let cells = strategies
                    .iter()
                    .map(|&s| {
                        let key = (s, scenario.as_str(), *k);
                        let c = cell(records, &mut notes, key, |r| Some(event_text(r)));
                        // What the victim's log or the MPS server said, as a numbered note.
                        match (c, find(records, key)) {
                            (Cell::Value(text), Some(r)) if !r.note.is_empty() => {
                                let n = note_number(&mut notes, format!("{} — {label}: {}", s.title(), r.note));
                                Cell::Value(format!("{text} [{n}]"))
                            }
                            (c, _) => c,
                        }
                    })
                    .collect();
                (label, cells)
            })
            .collect(),
    };
    let mut reading = vec![
        crate::report::outcome::Outcome::rule(),
        format!(
            "Each trial runs one victim pod {} beside its aggressors, from the pods' readiness for {} s (the first {} s are a discarded warm-up); an aggressor grows, faults or is killed {} s after readiness. Inflation is the victim's p99 over its own p99 alone under the same strategy; the SLO is {}.",
            match (data.run.plan.own_server(), &data.run.plan.request) {
                (true, None) => "(your server), under the load it makes itself,".to_string(),
                (true, Some(_)) => format!(
                    "(your server), sent an open-loop Poisson load of {} requests/s by the harness,",
                    plan.victim_rate
                ),
                (false, _) => format!("serving an open-loop Poisson load of {} inferences/s", plan.victim_rate),
            },
            plan.event_after_s + plan.observe_s,
            data.run.plan.warmup_s,
            plan.event_after_s,
            target_text(plan.slo_s, records)
        ),
    ];
    let scenarios = plan.scenarios.as_slice();
    if let Some(server) = data.run.plan.own_server_text() {
        let load = match &data.run.plan.request {
            Some(req) => format!(
                "the harness sends it the Poisson load ({} {}) and times each answer",
                if req.body.is_some() { "POST" } else { "GET" },
                req.url
            ),
            None => format!(
                "it makes its own load, and its histogram ({}) is read",
                data.run.plan.metric
            ),
        };
        reading.push(format!(
            "The victim is a server of your own ({server}): {load}. It runs as it is, so in the memory-pressure scenario it asks for no more memory. The aggressors are gpushare-workload ({}), whose flags make them load the GPU, take its memory, fault or die.",
            data.run.plan.model
        ));
    }
    if strategies.contains(&Strategy::Exclusive) {
        reading.push("Exclusive is the reference: the victim holds the GPU and every aggressor stays pending, so its rows are the victim alone measured again; their spread around ×1.00 is the trial-to-trial noise of the inflation.".into());
    }
    if scenarios.contains(&Scenario::MemoryPressure) {
        reading.push(match data.run.gpu_memory_bytes() {
            Some(_) if data.run.plan.own_server() => format!(
                "The memory-pressure aggressor takes {:.0}% of the GPU's memory; your server, the victim, asks for no more.",
                AGGRESSOR_MEMORY * 100.0
            ),
            Some(_) => format!(
                "The memory-pressure aggressor takes {:.0}% of the GPU's memory, and {} s later the victim asks for {:.0}%: together more than the GPU has, each less than half.",
                AGGRESSOR_MEMORY * 100.0,
                VICTIM_GROWS_AFTER.as_secs(),
                VICTIM_MEMORY * 100.0
            ),
            None => format!(
                "On the CPU the memory-pressure pods take host memory ({} MiB and {} MiB): a test of the pipeline, not of a GPU's limits.",
                CPU_AGGRESSOR_BYTES >> 20,
                CPU_VICTIM_BYTES >> 20
            ),
        });
    }
    if scenarios.contains(&Scenario::Fault) {
        reading.push(match data.run.gpu_memory_bytes() {
            Some(_) => "The fault scenario's aggressor launches a kernel that writes through an unmapped address (gpushare-workload --inject-fault-after): an ordinary CUDA illegal-address error in its own process. Under MPS the server handles such an error for every client on the device; its log is in the run directory (mps/).".to_string(),
            None => "On the CPU the fault scenario's aggressor aborts (SIGABRT), the CPU stand-in for a GPU fault.".to_string(),
        });
    }
    if scenarios.contains(&Scenario::Crash) {
        reading.push("The crash scenario's aggressor is killed with SIGKILL.".into());
    }
    let splits: Vec<String> = data
        .isolation
        .iter()
        .filter_map(|r| r.mps_split.clone())
        .fold(Vec::new(), |mut v, s| {
            if !v.contains(&s) {
                v.push(s);
            }
            v
        });
    if !splits.is_empty() {
        reading.push(format!(
            "MPS clients got the device plugin's equal split of the trial's pods: {}.",
            splits.join("; ")
        ));
    }
    if let Some(r) = resolution {
        reading.push(format!(
            "The p50 and p99 are interpolated inside the workload's histogram buckets: each can be off by up to {:.1}% of its value.",
            r * 100.0
        ));
    }
    let mut tables = vec![m.table, latency, events];
    if let Some(cap) = mps_cap_table(records) {
        reading.push("Under MPS each client is capped (its share of the SMs and of the memory), so the victim's inflation beside aggressors mixes two costs. The victim is measured alone again under the limits each trial gives it: its p99 there over its p99 alone is the cap's cost, its p99 beside the aggressors over that is the neighbours'.".into());
        tables.push(cap);
    }
    Tables {
        tables,
        notes,
        reading,
        warnings: Vec::new(),
    }
}

/// MPS's victim per trial (pure): p99 alone, alone under the trial's limits (the cap's
/// cost) and beside the aggressors (the neighbours'). None without capped trials.
fn mps_cap_table(records: &[IsolationRecord]) -> Option<Table> {
    let capped = |k: u32| {
        records
            .iter()
            .find(|r| r.strategy == Strategy::Mps && r.scenario == crate::isolation::plan::CAPPED && r.aggressors == k)
    };
    let alone = records
        .iter()
        .find(|r| r.strategy == Strategy::Mps && r.scenario == "alone")
        .and_then(|r| r.victim_p99_s);
    let ms = |p: Option<f64>| p.map_or(Cell::Empty, |p| Cell::Value(format!("{:.2}", p * 1e3)));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Cell::Value(format!("×{:.2}", a / b)),
        _ => Cell::Empty,
    };
    let rows: Vec<(String, Vec<Cell>)> = records
        .iter()
        .filter(|r| {
            r.strategy == Strategy::Mps && !matches!(r.scenario.as_str(), "alone" | crate::isolation::plan::CAPPED)
        })
        .filter_map(|r| {
            let c = capped(r.aggressors).filter(|c| c.victim_status == CellStatus::Ok)?;
            let capped_p99 = c.victim_p99_s;
            Some((
                scenario_label(&r.scenario, r.aggressors),
                vec![
                    ms(alone),
                    ms(capped_p99),
                    ratio(capped_p99, alone),
                    ms(r.victim_p99_s),
                    ratio(r.victim_p99_s, capped_p99),
                ],
            ))
        })
        .collect();
    (!rows.is_empty()).then(|| Table {
        title: "MPS: the cap's cost and the neighbours'".into(),
        unit: "victim p99, ms; alone, alone under the trial's limits, beside the aggressors".into(),
        corner: "Trial".into(),
        columns: vec![
            "p99 alone".into(),
            "alone, capped".into(),
            "cap's cost".into(),
            "beside aggressors".into(),
            "neighbours' cost".into(),
        ],
        rows,
    })
}

/// The victim's p50–p99 per scenario (x) and strategy (colour), log scale: one marker
/// at the p99 on a line down to the p50.
pub fn chart(data: &RunData) -> Result<Option<(String, String)>> {
    let rows = rows(&data.isolation);
    let strategies = data.strategies();
    let mut points: Vec<(Strategy, f64, f64, f64)> = Vec::new();
    let n = strategies.len().max(1) as f64;
    for (x, (scenario, k)) in rows.iter().enumerate() {
        for (i, &s) in strategies.iter().enumerate() {
            if let Some(r) = find(&data.isolation, (s, scenario, *k))
                && let (Some(p50), Some(p99)) = (r.victim_p50_s, r.victim_p99_s)
                && p50 > 0.0
                && p99 > 0.0
            {
                let off = (i as f64 - (n - 1.0) / 2.0) * 0.15;
                points.push((s, x as f64 + off, p50 * 1e3, p99 * 1e3));
            }
        }
    }
    if points.is_empty() {
        return Ok(None);
    }
    let lo = points.iter().map(|p| p.2).fold(f64::INFINITY, f64::min) * 0.7;
    let hi = points.iter().map(|p| p.3).fold(0.0, f64::max) * 1.5;
    let labels: Vec<String> = rows.iter().map(|(s, k)| short_label(s, *k)).collect();
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (crate::report::charts::W, crate::report::charts::H)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let title = match data.short_label() {
            Some(l) => format!("The victim's latency beside its aggressors ({l})"),
            None => "The victim's latency beside its aggressors".to_string(),
        };
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(-0.5..rows.len() as f64 - 0.5, (lo..hi).log_scale())
            .map_err(err)?;
        c.configure_mesh()
            .x_desc("scenario")
            .y_desc("victim latency, p50 to p99 (ms, log scale)")
            .x_labels(rows.len() * 2 + 1)
            .y_labels(12)
            .y_label_formatter(&|y| crate::report::charts::axis_number(*y))
            .x_label_formatter(&|x| {
                let r = x.round();
                if (x - r).abs() < 1e-6 && r >= 0.0 {
                    labels.get(r as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        for &s in &strategies {
            let (col, mk, _) = look(s);
            let mine: Vec<&(Strategy, f64, f64, f64)> = points.iter().filter(|p| p.0 == s).collect();
            if mine.is_empty() {
                continue;
            }
            c.draw_series(
                mine.iter()
                    .map(|p| PathElement::new(vec![(p.1, p.2), (p.1, p.3)], col.stroke_width(2))),
            )
            .map_err(err)?;
            let tops: Vec<(f64, f64)> = mine.iter().map(|p| (p.1, p.3)).collect();
            draw_markers!(c, tops, mk, col)
                .label(s.title())
                .legend(legend_entry!(mk, col, false));
        }
        draw_legend(&mut c)?;
        root.present().map_err(err)?;
    }
    Ok(Some(("isolation-latency.svg".to_string(), svg)))
}
