//! The HTML page: self-contained (inline CSS, inline SVG, no script, nothing fetched).
//!
//! Built with `maud`, so every interpolated string is escaped by construction; only
//! the inline CSS and the plotters SVGs are inserted raw ([`PreEscaped`]).

use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::RunData;
use super::tables::{Cell, Table, Tables};

pub(super) const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1100px;padding:0 1rem;color:#111;line-height:1.45}\
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ccc;padding-bottom:.2rem}\
.banner{background:#fff3cd;border:2px solid #b58900;padding:.8rem 1rem;font-weight:700;margin:1rem 0}\
table{border-collapse:collapse;margin:.5rem 0 1rem}th,td{border:1px solid #bbb;padding:.3rem .7rem}td.num{text-align:right;font-variant-numeric:tabular-nums}\
th{background:#f2f2f2}td.status{color:#8a1c1c;font-style:italic;text-align:center;cursor:help}td.flagged{background:#fff7e0;cursor:help}td.flagged sup{color:#9a5b00}td.rated{font-size:.95rem}td.protected{background:#d8f0dc}td.degraded{background:#fde9b8}td.failed{background:#f6cccc}caption{text-align:left;font-weight:600;padding:.3rem 0}\
.charts svg{max-width:100%;height:auto;border:1px solid #ddd;margin:.5rem 0}dl{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem}dt{font-weight:600}\
.muted{color:#555}.answer li{font-size:1.05rem;margin:.35rem 0}.unavailable{background:#eef2f7;border-left:4px solid #6b7b8c;padding:.5rem .8rem;margin:1rem 0}";

/// The whole page.
pub fn page(data: &RunData, tables: &Tables, charts: &[(String, String)]) -> String {
    let run = &data.run;
    let p = &run.plan;
    let title = format!("gpushare-bench — {}", run.run_id);
    let tag = data.short_label().map(|l| format!(" — {l}")).unwrap_or_default();
    html! {
        (DOCTYPE) "\n"
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) }
                style { (PreEscaped(CSS)) }
            }
            body {
                "\n"
                h1 { (title) } "\n"
                p.muted {
                    (data.device_name()) " · " (p.model) " · " (p.precision) " · batch " (p.batch)
                    " · " (p.backend) " backend · run " (run.started_at) " → "
                    (run.finished_at.as_deref().unwrap_or("unfinished"))
                } "\n"
                @if let Some(label) = data.label() {
                    div.banner role="alert" { (label) } "\n"
                }
                @if let Some(partial) = data.partial() {
                    div.banner.partial role="alert" { (partial) } "\n"
                }
                @for w in &tables.warnings {
                    div.banner.warning role="alert" { (w) } "\n"
                }
                @let answer = super::verdict::lines(data);
                @if !answer.is_empty() {
                    h2 { "The answer" } "\n"
                    ul.answer {
                        "\n"
                        @for line in &answer {
                            li { (line) } "\n"
                        }
                    } "\n"
                }
                @if let Some(line) = super::verdict::unavailable_line(data) {
                    div.unavailable role="note" { (line) } "\n"
                }
                h2 { "Charts" }
                div.charts {
                    "\n"
                    @for (name, svg) in charts {
                        // The SVG's own XML prolog is not valid inside HTML; the element
                        // itself is.
                        figure id=(name.trim_end_matches(".svg")) {
                            (PreEscaped(svg.find("<svg").map_or(svg.as_str(), |i| &svg[i..])))
                        } "\n"
                    }
                } "\n"
                h2 { "Results" } "\n"
                @for t in &tables.tables {
                    (table(t, tables, &tag))
                }
                @for r in &tables.reading {
                    p { (r) } "\n"
                }
                @if !tables.notes.is_empty() {
                    h2 { "Notes" }
                    ol {
                        "\n"
                        @for (_, text) in &tables.notes {
                            li { (text) } "\n"
                        }
                    } "\n"
                }
                h2 { "Environment" }
                dl {
                    "\n"
                    @for (k, v) in environment(data) {
                        dt { (k) } dd { (v) } "\n"
                    }
                } "\n"
                @if !run.unavailable.is_empty() {
                    h2 { "Unavailable strategies" }
                    ul {
                        "\n"
                        @for u in &run.unavailable {
                            li { strong { (u.strategy.title()) } ": " (u.reason) } "\n"
                        }
                    } "\n"
                }
                p.muted {
                    "Generated by gpushare-bench report. Numbers: mean = Δsum/Δcount of the inference_time_seconds histogram; quantiles as Prometheus' histogram_quantile; fairness = Jain's index over the requested pods."
                } "\n"
            }
        } "\n"
    }
    .into_string()
}

/// One results table; a status cell carries its note's text on hover.
pub(super) fn table(t: &Table, tables: &Tables, tag: &str) -> Markup {
    html! {
        table {
            caption { (t.title) " (" (t.unit) ")" (tag) }
            thead {
                tr {
                    th { (t.corner) }
                    @for c in &t.columns {
                        th { (c) }
                    }
                }
            }
            tbody {
                "\n"
                @for (name, cells) in &t.rows {
                    tr {
                        th scope="row" { (name) }
                        @for c in cells {
                            @match c {
                                Cell::Value(v) => td.num { (v) },
                                Cell::Rated(v, o) => td.rated.(o.word()) { strong { (o.word()) } ": " (v) },
                                Cell::Flagged(v, n) => {
                                    td.num.flagged title=(note_text(tables, *n)) {
                                        (v) " " sup { "⚑" (n) }
                                    }
                                }
                                Cell::Status(s, n) => {
                                    td.status title=(note_text(tables, *n)) { (s.to_string()) " " sup { (n) } }
                                }
                                Cell::Empty => td.num { "–" },
                                Cell::Missing => td.status title="this cell is not in the run" { "not run" },
                            }
                        }
                    } "\n"
                }
            }
        } "\n"
    }
}

/// The text of note `n` (empty if there is none).
fn note_text(tables: &Tables, n: usize) -> &str {
    tables
        .notes
        .iter()
        .find(|(k, _)| *k == n)
        .map_or("", |(_, t)| t.as_str())
}

/// The environment section's (term, description) rows.
pub(super) fn environment(data: &RunData) -> Vec<(String, String)> {
    let env = &data.run.environment;
    let p = &data.run.plan;
    let mut rows = Vec::new();
    for g in &env.gpus {
        rows.push((
            format!("GPU {}", g.index),
            format!(
                "{} ({}{}; {} GiB; MIG {}; compute mode {})",
                g.name,
                g.uuid,
                g.pci_bus_id.as_deref().map_or(String::new(), |b| format!(", bus {b}")),
                g.memory_total_bytes
                    .map_or("?".into(), |b| format!("{:.1}", b as f64 / (1u64 << 30) as f64)),
                g.mig_mode.as_deref().unwrap_or("not supported"),
                g.compute_mode.as_deref().unwrap_or("?")
            ),
        ));
        for m in &g.mig_devices {
            rows.push(("MIG device".into(), m.clone()));
        }
    }
    for o in &env.other_gpus {
        rows.push(("Not measured".into(), o.clone()));
    }
    if !env.gpu_processes.is_empty() {
        rows.push((
            "Busy GPU".into(),
            format!(
                "measured beside processes not the run's (--allow-busy-gpu): {}",
                env.gpu_processes.join(", ")
            ),
        ));
    }
    rows.push((
        "Driver / CUDA".into(),
        format!(
            "{} / {}",
            env.driver_version.as_deref().unwrap_or("none"),
            env.cuda_driver_version.as_deref().unwrap_or("none")
        ),
    ));
    rows.push((
        "Host".into(),
        format!("{} — {} — {} ({} CPUs)", env.hostname, env.os, env.cpu, env.cpus),
    ));
    rows.push((
        "Workload".into(),
        format!(
            "{} · model {} · precision {} · batch {}",
            env.workload, p.model, p.precision, p.batch
        ),
    ));
    rows.push((
        "Harness".into(),
        format!(
            "{} · git {}",
            env.harness,
            env.git_revision.as_deref().unwrap_or("not recorded")
        ),
    ));
    let source = match p.source {
        crate::domain::Source::Scrape => "direct scrape",
        crate::domain::Source::Prometheus => "Prometheus",
        crate::domain::Source::Client => "the harness's own requests, timed by the harness",
    };
    let measurement = match data.run.kind.isolation() {
        Some(iso) => format!(
            "per trial: warm-up {} s, then the victim followed to {} s after readiness (events at {} s); source {source}",
            p.warmup_s,
            iso.event_after_s + iso.observe_s,
            iso.event_after_s,
        ),
        None => format!(
            "warm-up {} s, windows of {} s until {} agree within {}% (at most {} s), source {source}",
            p.warmup_s,
            p.window_s,
            p.stable_windows,
            p.tolerance * 100.0,
            p.max_cell_s,
        ),
    };
    rows.push(("Measurement".into(), measurement));
    if let Some(d) = &p.dra {
        rows.push((
            "Sharing API".into(),
            format!(
                "DRA: ResourceClaims with NVIDIA's DRA driver's GpuConfig (time-slice interval {}; MPS's client limits {})",
                if d.timeslices.is_empty() {
                    "none: the GPU as the node had it".into()
                } else {
                    format!(
                        "{}, each its own rows",
                        crate::config::values::List(d.timeslices.clone())
                    )
                },
                match (d.former_mps_thread_percentage, d.former_mps_memory_limit.as_deref()) {
                    (None, None) => "as each MPS row says, auto: 100/max(2, N)% of the SMs and the GPU's memory/max(2, N)".to_string(),
                    (threads, memory) => format!(
                        "on every MPS claim: {} of the SMs, {} pinned (--mps-thread-percentage and --mps-memory-limit)",
                        threads.map_or("100/max(2, N)%".into(), |t| format!("{t}%")),
                        memory.unwrap_or("the GPU's memory/max(2, N)")
                    ),
                }
            ),
        ));
    } else if p.backend == crate::config::values::BackendKind::Kubernetes {
        rows.push((
            "Sharing API".into(),
            "device plugin: the GPU operator's node configuration".into(),
        ));
    }
    rows.push((
        "MPS control".into(),
        env.mps_control.clone().unwrap_or_else(|| "not found".into()),
    ));
    rows
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::domain::{CellStatus, Strategy};
    use crate::report::tables;

    /// The real H100 fixture run, with a cell note and an unavailable reason that try to
    /// inject a script.
    fn hostile_run() -> RunData {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h100-run");
        let mut data = RunData::load(&dir).expect("fixture");
        let cell = data
            .cells
            .iter_mut()
            .find(|c| c.is_aggregate() && c.strategy == Strategy::Mig && c.status != CellStatus::Ok)
            .expect("a cell that did not measure");
        cell.note = "<script>alert(1)</script> & \"quoted\"".into();
        let u = data.run.unavailable.first_mut().expect("an unavailable strategy");
        u.reason = "<script>alert(1)</script>".into();
        data.run.environment.hostname = "<script>alert(1)</script>".into();
        data
    }

    #[test]
    fn interpolated_text_is_escaped() {
        let data = hostile_run();
        let t = tables::all(&data);
        assert!(t.notes.iter().any(|(_, n)| n.contains("<script>")), "{:?}", t.notes);
        let charts = vec![("x.svg".to_string(), "<?xml version=\"1.0\"?>\n<svg></svg>".to_string())];
        let h = page(&data, &t, &charts);
        assert!(!h.contains("<script"), "a script tag got through");
        assert!(h.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        // In the status cell's title attribute, in the notes, and as the unavailable
        // reason.
        assert!(
            h.contains("title=\"MIG — unavailable: &lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;quoted&quot;\"")
        );
        assert!(h.contains("<li>MIG — unavailable: &lt;script&gt;"));
        assert!(h.contains("<li><strong>MIG</strong>: &lt;script&gt;alert(1)&lt;/script&gt;</li>"));
        // The SVG goes in raw, without its XML prolog.
        assert!(h.contains("<figure id=\"x\"><svg></svg></figure>"));
        assert!(!h.contains("<?xml"));
    }

    #[test]
    fn the_measured_gpu_its_bus_the_others_and_a_busy_start_are_shown() {
        let mut data = hostile_run();
        let env = &mut data.run.environment;
        env.gpus[0].index = 5;
        env.gpus[0].pci_bus_id = Some("00000000:68:00.0".into());
        env.other_gpus = vec!["GPU 0: NVIDIA H100 80GB HBM3 (GPU-0a1e, bus 00000000:18:00.0)".into()];
        env.gpu_processes = vec!["4242 python3 (3072 MiB)".into()];
        let rows = environment(&data);
        let find = |k: &str| rows.iter().find(|(a, _)| a == k).map(|(_, b)| b.as_str());
        assert!(
            find("GPU 5").is_some_and(|d| d.contains(", bus 00000000:68:00.0;")),
            "{rows:?}"
        );
        assert_eq!(
            find("Not measured"),
            Some("GPU 0: NVIDIA H100 80GB HBM3 (GPU-0a1e, bus 00000000:18:00.0)")
        );
        assert!(
            find("Busy GPU").is_some_and(|d| d.contains("4242 python3 (3072 MiB)")),
            "{rows:?}"
        );
    }
}
