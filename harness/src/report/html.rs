//! The HTML page: self-contained (inline CSS, inline SVG, no script, nothing fetched).

use std::fmt::Write;

use super::RunData;
use super::tables::{Cell, Tables};

/// Escapes text for HTML content and attributes.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1100px;padding:0 1rem;color:#111;line-height:1.45}\
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ccc;padding-bottom:.2rem}\
.banner{background:#fff3cd;border:2px solid #b58900;padding:.8rem 1rem;font-weight:700;margin:1rem 0}\
table{border-collapse:collapse;margin:.5rem 0 1rem}th,td{border:1px solid #bbb;padding:.3rem .7rem}td.num{text-align:right;font-variant-numeric:tabular-nums}\
th{background:#f2f2f2}td.status{color:#8a1c1c;font-style:italic;text-align:center;cursor:help}caption{text-align:left;font-weight:600;padding:.3rem 0}\
.charts svg{max-width:100%;height:auto;border:1px solid #ddd;margin:.5rem 0}dl{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem}dt{font-weight:600}\
.muted{color:#555}";

/// The whole page.
pub fn page(data: &RunData, tables: &Tables, charts: &[(String, String)]) -> String {
    let mut h = String::new();
    let run = &data.run;
    let p = &run.plan;
    let title = format!("gpushare-bench — {}", run.run_id);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{}</title><style>{CSS}</style></head><body>\n",
        esc(&title)
    );
    let _ = writeln!(h, "<h1>{}</h1>", esc(&title));
    let _ = writeln!(
        h,
        "<p class=\"muted\">{} · {} · {} · batch {} · {} backend · run {} → {}</p>",
        esc(&data.device_name()),
        esc(&p.model),
        esc(&p.precision),
        p.batch,
        esc(&p.backend),
        esc(&run.started_at),
        esc(run.finished_at.as_deref().unwrap_or("unfinished"))
    );
    if let Some(label) = data.label() {
        let _ = writeln!(h, "<div class=\"banner\" role=\"alert\">{}</div>", esc(&label));
    }
    let tag = data.short_label().map(|l| format!(" — {l}")).unwrap_or_default();
    let _ = writeln!(h, "<h2>Results</h2>");
    for t in &tables.tables {
        let _ = write!(
            h,
            "<table><caption>{} ({}){}</caption><thead><tr><th>Strategy</th>",
            esc(&t.title),
            esc(&t.unit),
            esc(&tag)
        );
        for c in &t.columns {
            let _ = write!(h, "<th>{}</th>", esc(c));
        }
        h.push_str("</tr></thead><tbody>\n");
        for (name, cells) in &t.rows {
            let _ = write!(h, "<tr><th scope=\"row\">{}</th>", esc(name));
            for c in cells {
                match c {
                    Cell::Value(v) => {
                        let _ = write!(h, "<td class=\"num\">{}</td>", esc(v));
                    }
                    Cell::Status(s, n) => {
                        let reason = tables
                            .notes
                            .iter()
                            .find(|(k, _)| k == n)
                            .map(|(_, t)| t.as_str())
                            .unwrap_or("");
                        let _ = write!(
                            h,
                            "<td class=\"status\" title=\"{}\">{s} <sup>{n}</sup></td>",
                            esc(reason)
                        );
                    }
                    Cell::Empty => h.push_str("<td class=\"num\">–</td>"),
                    Cell::Missing => {
                        h.push_str("<td class=\"status\" title=\"this cell is not in the run\">not run</td>")
                    }
                }
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</tbody></table>\n");
    }
    for r in &tables.reading {
        let _ = writeln!(h, "<p>{}</p>", esc(r));
    }
    if !tables.notes.is_empty() {
        let _ = writeln!(h, "<h2>Notes</h2><ol>");
        for (_, text) in &tables.notes {
            let _ = writeln!(h, "<li>{}</li>", esc(text));
        }
        h.push_str("</ol>\n");
    }
    let _ = writeln!(h, "<h2>Charts</h2><div class=\"charts\">");
    for (name, svg) in charts {
        // The SVG's own XML prolog is not valid inside HTML; the element itself is.
        let body = svg.find("<svg").map_or(svg.as_str(), |i| &svg[i..]);
        let _ = writeln!(
            h,
            "<figure id=\"{}\">{body}</figure>",
            esc(name.trim_end_matches(".svg"))
        );
    }
    h.push_str("</div>\n");
    let env = &run.environment;
    let _ = writeln!(h, "<h2>Environment</h2><dl>");
    let mut row = |k: &str, v: String| {
        let _ = writeln!(h, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(&v));
    };
    for g in &env.gpus {
        row(
            &format!("GPU {}", g.index),
            format!(
                "{} ({}; {} GiB; MIG {}; compute mode {})",
                g.name,
                g.uuid,
                g.memory_total_bytes
                    .map_or("?".into(), |b| format!("{:.1}", b as f64 / (1u64 << 30) as f64)),
                g.mig_mode.as_deref().unwrap_or("not supported"),
                g.compute_mode.as_deref().unwrap_or("?")
            ),
        );
        for m in &g.mig_devices {
            row("MIG device", m.clone());
        }
    }
    row(
        "Driver / CUDA",
        format!(
            "{} / {}",
            env.driver_version.as_deref().unwrap_or("none"),
            env.cuda_driver_version.as_deref().unwrap_or("none")
        ),
    );
    row(
        "Host",
        format!("{} — {} — {} ({} CPUs)", env.hostname, env.os, env.cpu, env.cpus),
    );
    row(
        "Workload",
        format!(
            "{} · model {} · precision {} · batch {}",
            env.workload, p.model, p.precision, p.batch
        ),
    );
    row(
        "Harness",
        format!(
            "{} · git {}",
            env.harness,
            env.git_revision.as_deref().unwrap_or("not recorded")
        ),
    );
    row(
        "Measurement",
        format!(
            "warm-up {} s, windows of {} s until {} agree within {}% (at most {} s), source {}",
            p.warmup_s,
            p.window_s,
            p.stable_windows,
            p.tolerance * 100.0,
            p.max_cell_s,
            match p.source {
                crate::domain::Source::Scrape => "direct scrape",
                crate::domain::Source::Prometheus => "Prometheus",
            }
        ),
    );
    row(
        "MPS control",
        env.mps_control.clone().unwrap_or_else(|| "not found".into()),
    );
    h.push_str("</dl>\n");
    if !run.unavailable.is_empty() {
        let _ = writeln!(h, "<h2>Unavailable strategies</h2><ul>");
        for u in &run.unavailable {
            let _ = writeln!(
                h,
                "<li><strong>{}</strong>: {}</li>",
                esc(u.strategy.title()),
                esc(&u.reason)
            );
        }
        h.push_str("</ul>\n");
    }
    h.push_str("<p class=\"muted\">Generated by gpushare-bench report. Numbers: mean = Δsum/Δcount of the inference_time_seconds histogram; quantiles as Prometheus' histogram_quantile; fairness = Jain's index over the requested pods.</p>\n</body></html>\n");
    h
}
