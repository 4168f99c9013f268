//! A capacity run's report (pure): the capacity table (strategy → pods that fit at the
//! run's per-pod load and SLOs) and the latency-vs-offered-load chart (the knee), with
//! the search's rule in words. The cells' own tables follow as in a sweep.

use plotters::prelude::*;

use crate::capacity::record::{CapacityRecord, records};
use crate::capacity::search::limit;
use crate::domain::CellStatus;
use crate::error::Result;

use super::RunData;
use super::charts::{draw_legend, draw_line, draw_markers, err, legend_entry, look};
use super::tables::{Cell, Table, note_number};

/// The search's rule, as the report states it.
pub const RULE: &str = "How the capacity was found: per strategy, pod counts were measured upwards from 1. Each pod's attainment of an SLO (p99=25ms: the share of its requests within 25 ms, read from its histogram) is judged with sampling confidence: its one-sided 95% Clopper–Pearson bounds, widened by the histogram's interpolation bound (the share of requests in the bucket holding the threshold). A count fits when every pod kept up with its offered load (no request failed or was dropped, the backlog it reports grew by no more than three standard deviations of its change between windows, plus one, and it served its rate within 5% or three Poisson standard deviations, which alone judges a server that reports no backlog) and the lower bound of every attainment is at least its percentile (a p99 needs at least 299 requests, all within, to show that). It misses clearly when a pod failed, ran out of memory, stayed pending or fell behind, or an upper bound is below its percentile; otherwise it is marginal: the bounds straddle the percentile. A count whose cell failed (a pod crashed or never became ready) ends the search too: its note says why. The walk stops at the first clear miss, a second marginal or missed count in a row, or --max-pods (exclusive: at 1, since a second pod stays pending). The capacity is the largest count that fits with every smaller one. The table's lower bound is the lowest over the pods and SLOs at that count; each count is one measurement, so the bounds are sampling confidence, not run-to-run noise.";

fn num(v: Option<f64>, decimals: usize) -> Cell {
    match v {
        Some(v) if v.is_finite() => Cell::Value(format!("{v:.decimals$}")),
        _ => Cell::Empty,
    }
}

/// The capacity table (None: not a capacity run). Unavailable strategies show their
/// status with the reason as a note.
pub fn table(data: &RunData, notes: &mut Vec<(usize, String)>) -> Option<Table> {
    let cap = data.run.kind.capacity()?;
    let recs = records(&data.run, &data.cells);
    let slos = recs.first().map(|r| r.slos.clone()).unwrap_or_default();
    let rate = data.run.plan.load.per_pod_rate(1);
    let streamed = data.run.plan.request.as_ref().is_some_and(|r| r.stream.is_some());
    let mut columns: Vec<String> = [
        "Pods that fit",
        "Offered (req/s)",
        "Goodput (req/s)",
        if streamed { "p99 end to end (ms)" } else { "p99 (ms)" },
    ]
    .map(String::from)
    .to_vec();
    if streamed {
        columns.extend(
            ["TTFT p99 (ms)", "ITL p99 (ms)", "Output tokens/s"]
                .map(String::from)
                .to_vec(),
        );
    }
    columns.extend(
        [
            "Attainment, 95% lower bound (%)",
            "GPU utilisation (%)",
            "Energy per request (J)",
            "First miss",
        ]
        .map(String::from)
        .to_vec(),
    );
    Some(Table {
        title: format!(
            "Capacity: pods per GPU at {} per pod, {slos}",
            rate.map_or("?".into(), |r| format!("{r} requests/s"))
        ),
        unit: format!("searched 1 to {} pods", cap.max_pods),
        corner: "Strategy".into(),
        rows: recs
            .iter()
            .map(|r| (r.arm().title(), row(r, streamed, columns.len(), notes)))
            .collect(),
        columns,
    })
}

fn row(r: &CapacityRecord, streamed: bool, width: usize, notes: &mut Vec<(usize, String)>) -> Vec<Cell> {
    let Some(fits) = r.pods_fit else {
        if r.note.is_empty() {
            // Never reached: a run that stopped before this strategy.
            return std::iter::once(Cell::Missing)
                .chain(std::iter::repeat_n(Cell::Empty, width - 1))
                .collect();
        }
        let n = note_number(notes, format!("{} — unavailable: {}", r.arm().title(), r.note));
        return std::iter::once(Cell::Status(CellStatus::Unavailable, n))
            .chain(std::iter::repeat_n(Cell::Empty, width - 1))
            .collect();
    };
    // A run that stopped before its first miss: the capacity may be higher.
    let fits_text = if r.finished || r.first_miss_pods.is_some() {
        fits.to_string()
    } else {
        format!("≥ {fits} (unfinished)")
    };
    let miss = match r.first_miss_pods {
        Some(n) => Cell::Value(format!(
            "{n} pod{}: {}",
            if n == 1 { "" } else { "s" },
            r.first_miss.strip_prefix("misses: ").unwrap_or(&r.first_miss)
        )),
        None if r.finished && fits == r.searched_to => Cell::Value(format!("none (searched to {})", r.searched_to)),
        None => Cell::Empty,
    };
    let mut cells = vec![
        Cell::Value(fits_text),
        num(r.offered_per_s, 0),
        num(r.goodput_per_s, 1),
        num(r.p99_s.map(|v| v * 1e3), 2),
    ];
    if streamed {
        cells.extend([
            num(r.ttft_p99_s.map(|v| v * 1e3), 2),
            num(r.itl_p99_s.map(|v| v * 1e3), 2),
            num(r.output_tokens_per_s, 0),
        ]);
    }
    cells.extend([
        num(r.attainment_lower_bound.map(|v| v * 100.0), 2),
        num(r.gpu_util_pct, 0),
        num(r.energy_j_per_request, 3),
        miss,
    ]);
    cells
}

/// The reading lines of a capacity run: the rule, and what exclusive's row means.
pub fn reading(data: &RunData) -> Vec<String> {
    let Some(cap) = data.run.kind.capacity() else {
        return Vec::new();
    };
    let mut out = vec![RULE.to_string()];
    if data.strategies().iter().any(|&s| limit(s, cap.max_pods) < cap.max_pods) {
        out.push("Exclusive gives the GPU to one pod, so its capacity is 1 or 0.".to_string());
    }
    out.push("In the tables below, – marks a count the search did not measure.".to_string());
    out
}

/// The knee: each strategy's cell latency (at the first SLO's percentile) against the
/// offered load of all its pods, with the SLO threshold as a horizontal line.
pub fn chart(data: &RunData) -> Result<Option<(String, String)>> {
    let Some(slo) = data.run.plan.slos.iter().find(|s| s.quantile.is_some()) else {
        return Ok(None);
    };
    let q = slo.quantile.unwrap_or(0.99);
    let threshold_ms = slo.threshold.as_secs_f64() * 1e3;
    let quantile = |c: &crate::results::record::CellRecord| match (q * 100.0).round() as u32 {
        50 => c.p50_s,
        90 => c.p90_s,
        _ => c.p99_s,
    };
    let series: Vec<_> = data
        .arms()
        .into_iter()
        .map(|s| {
            let mut pts: Vec<(f64, f64)> = data
                .cells
                .iter()
                .filter(|c| c.arm() == s && c.is_aggregate() && c.status == CellStatus::Ok)
                .filter_map(|c| Some((c.offered_per_s?, quantile(c)? * 1e3)))
                .filter(|(x, y)| x.is_finite() && *x > 0.0 && y.is_finite() && *y > 0.0)
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (s, pts)
        })
        .filter(|(_, p)| !p.is_empty())
        .collect();
    if series.is_empty() {
        return Ok(None);
    }
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|v| v.0))
        .fold(0.0, f64::max)
        * 1.1;
    let y_hi = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|v| v.1))
        .fold(threshold_ms, f64::max)
        * 2.0;
    let y_lo = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|v| v.1))
        .fold(threshold_ms, f64::min)
        * 0.5;
    let name = format!("p{}", (q * 100.0).round());
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (super::charts::W, super::charts::H)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let caption = format!("{name} latency vs offered load: where each strategy's knee is");
        let caption = match data.short_label() {
            Some(l) => format!("{caption} ({l})"),
            None => caption,
        };
        let mut c = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, (y_lo..y_hi).log_scale())
            .map_err(err)?;
        c.configure_mesh()
            .x_desc("offered load, all pods (requests/s)")
            .y_desc(format!("{name} latency of the cell (ms, log scale)"))
            .y_labels(12)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| super::charts::axis_number(*y))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        c.draw_series(DashedLineSeries::new(
            vec![(0.0, threshold_ms), (x_max, threshold_ms)],
            6,
            4,
            RGBColor(180, 30, 30).stroke_width(1),
        ))
        .map_err(err)?
        .label(format!("SLO {slo}"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(180, 30, 30).stroke_width(1)));
        for (s, pts) in &series {
            draw_line!(c, *s, pts);
        }
        draw_legend(&mut c)?;
        root.present().map_err(err)?;
    }
    Ok(Some(("capacity-knee.svg".to_string(), svg)))
}
