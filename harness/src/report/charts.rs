//! Charts with plotters' SVG backend (no fonts or bitmaps needed): latency vs pods per
//! strategy (mean line, p50–p99 band), aggregate throughput, per-pod throughput
//! (fairness), GPU utilisation and energy per inference; with repeats, every point is
//! the mean over them with its 95% interval as an error bar. Each strategy has its own
//! colour, marker and dash pattern, so the charts survive greyscale printing.

use std::borrow::Cow;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::domain::{Arm, CellStatus, MpsMemory, MpsThreads, Strategy, TimeSliceInterval};
use crate::error::{BenchError, Result};
use crate::results::record::CellRecord;

use super::RunData;

/// Chart size in pixels: wide enough to read at the report's page width.
pub(crate) const W: u32 = 1040;
pub(crate) const H: u32 = 480;
/// A y axis whose values span more than this factor is drawn on a log scale.
const LOG_SPAN: f64 = 10.0;

/// Colour, marker and dash of an arm (Okabe–Ito colours of distinct lightness): each
/// strategy its own; time-slicing's DRA intervals its triangle with a colour and dash
/// each (plain time-slicing and the default interval share blue: a run has one or the
/// other); MPS's client limits its square in a darker or lighter shade and a dash each.
pub(crate) fn look(a: impl Into<Arm>) -> (RGBColor, usize, Option<(u32, u32)>) {
    let a = a.into();
    match (a.strategy, a.timeslice) {
        (Strategy::Exclusive, _) => (RGBColor(0, 0, 0), 0, None),
        (Strategy::TimeSlicing, None | Some(TimeSliceInterval::Default)) => (RGBColor(0, 114, 178), 1, Some((10, 5))),
        (Strategy::TimeSlicing, Some(TimeSliceInterval::Short)) => (RGBColor(86, 180, 233), 1, Some((4, 3))),
        (Strategy::TimeSlicing, Some(TimeSliceInterval::Medium)) => (RGBColor(204, 121, 167), 1, Some((7, 4))),
        (Strategy::TimeSlicing, Some(TimeSliceInterval::Long)) => (RGBColor(230, 159, 0), 1, Some((18, 5))),
        // MPS's square in vermilion; other client limits in a shade by the share of
        // the SMs (darker: more) and a dash by the memory limit, one look per arm.
        (Strategy::Mps, _) if a.mps.is_auto() => (RGBColor(213, 94, 0), 2, Some((3, 4))),
        (Strategy::Mps, _) => {
            let red = match a.mps.threads {
                MpsThreads::Auto => 245,
                MpsThreads::Percent(p) => 250 - 2 * u32::from(p.min(100)),
            };
            let dash = match a.mps.memory {
                MpsMemory::Auto => Some((12, 3)),
                MpsMemory::Unlimited => None,
                MpsMemory::Mebibytes(m) => Some((2 + (m / 4096) % 10, 2)),
            };
            let c = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
            (RGBColor(c(red), c(red * 94 / 213), 0), 2, dash)
        }
        (Strategy::Mig, _) => (RGBColor(0, 158, 115), 3, Some((14, 4))),
    }
}

pub(crate) fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Results {
        path: "report".into(),
        reason: format!("drawing a chart: {e}"),
    }
}

/// Draws markers of shape `mk` (circle, triangle, square, cross) and returns the series
/// annotation for the legend.
macro_rules! draw_markers {
    ($c:expr, $pts:expr, $mk:expr, $col:expr) => {{
        let (pts, col) = ($pts, $col);
        match $mk {
            0 => $c.draw_series(pts.iter().map(move |&p| Circle::new(p, 4, col.filled()))),
            1 => $c.draw_series(pts.iter().map(move |&p| TriangleMarker::new(p, 5, col.filled()))),
            2 => $c.draw_series(
                pts.iter()
                    .map(move |&p| EmptyElement::at(p) + Rectangle::new([(-4, -4), (4, 4)], col.filled())),
            ),
            _ => $c.draw_series(pts.iter().map(move |&p| Cross::new(p, 5, col.stroke_width(2)))),
        }
        .map_err(err)?
    }};
}
pub(crate) use draw_markers;

/// The legend entry of a strategy: its marker, with a line segment for line charts.
macro_rules! legend_entry {
    ($mk:expr, $col:expr, $line:expr) => {{
        let (mk, col, line) = ($mk, $col, $line);
        move |(x, y): (i32, i32)| {
            let m = match mk {
                0 => Circle::new((10, 0), 4, col.filled()).into_dyn(),
                1 => TriangleMarker::new((10, 0), 5, col.filled()).into_dyn(),
                2 => Rectangle::new([(6, -4), (14, 4)], col.filled()).into_dyn(),
                _ => Cross::new((10, 0), 5, col.stroke_width(2)).into_dyn(),
            };
            let width = if line { 20 } else { 0 };
            EmptyElement::at((x, y)) + PathElement::new(vec![(0, 0), (width, 0)], col.stroke_width(2)) + m
        }
    }};
}
pub(crate) use legend_entry;

/// A strategy's line (its colour and dash) with its markers and legend entry.
macro_rules! draw_line {
    ($c:expr, $s:expr, $pts:expr) => {{
        let (s, pts) = ($s, $pts);
        let (col, mk, dash) = look(s);
        let style = col.stroke_width(2);
        match dash {
            None => $c.draw_series(LineSeries::new(pts.clone(), style)).map_err(err)?,
            Some((len, gap)) => $c
                .draw_series(DashedLineSeries::new(pts.clone(), len, gap, style))
                .map_err(err)?,
        };
        draw_markers!($c, pts, mk, col)
            .label(s.title())
            .legend(legend_entry!(mk, col, true));
    }};
}
pub(crate) use draw_line;

/// The legend box every chart draws: upper left, on a translucent white ground.
pub(crate) fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    c: &mut ChartContext<'a, DB, CT>,
) -> Result<()> {
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(err)
}

/// (pods, p50, p99) points of a latency band.
type Band = Vec<(f64, f64, f64)>;

/// One line chart over pod counts: `series(strategy) -> [(pods, value)]`, optional band.
struct LineChart<'a> {
    file: &'a str,
    title: String,
    y_label: &'a str,
    series: Vec<(Arm, Vec<(f64, f64)>)>,
    /// (pods, low, high) of the 95% interval over repeats at each point of a series.
    errors: Vec<(Arm, Band)>,
    bands: Vec<(Arm, Band)>,
    scatter: Vec<(Arm, Vec<(f64, f64)>)>,
}

fn draw(data: &RunData, chart: LineChart<'_>) -> Result<Option<(String, String)>> {
    let points: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|p| p.1))
        .chain(chart.bands.iter().flat_map(|(_, v)| v.iter().flat_map(|p| [p.1, p.2])))
        .chain(chart.errors.iter().flat_map(|(_, v)| v.iter().flat_map(|p| [p.1, p.2])))
        .chain(chart.scatter.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)))
        .filter(|v| v.is_finite())
        .collect();
    if points.is_empty() {
        return Ok(None);
    }
    let hi = points.iter().cloned().fold(0.0, f64::max);
    let lo = points.iter().cloned().fold(f64::INFINITY, f64::min);
    // Values spanning more than ten times (a 500 ms cell beside 2 ms ones) would flatten
    // every other line on a linear axis.
    // Every drawn value counts, band and error-bar ends included; one at or below zero
    // keeps the axis linear.
    let log = lo > 0.0 && hi / lo > LOG_SPAN;
    // The counts the run measured (a capacity run's search stops early).
    let pods = data.pods_order();
    let max_pods = pods.iter().copied().max().unwrap_or(1) as f64;
    let mut svg = String::new();
    {
        let root: DrawingArea<SVGBackend<'_>, Shift> = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let title = match data.short_label() {
            Some(l) => format!("{} ({l})", chart.title),
            None => chart.title.clone(),
        };
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(72);
        let x_range = 0.0..max_pods + 1.0;
        let x_labels = |x: &f64| {
            let r = x.round();
            if (x - r).abs() < 1e-6 && pods.contains(&(r as u32)) {
                format!("{r}")
            } else {
                String::new()
            }
        };
        // The same drawing on either y axis (their coordinate types differ).
        macro_rules! plot {
            ($c:expr, $y_desc:expr) => {{
                let c = $c;
                c.configure_mesh()
                    .x_desc("pods sharing one GPU")
                    .y_desc($y_desc)
                    .x_labels((max_pods as usize + 2).min(40))
                    .x_label_formatter(&x_labels)
                    .y_label_formatter(&|y: &f64| axis_number(*y))
                    .light_line_style(RGBColor(235, 235, 235))
                    .draw()
                    .map_err(err)?;
                for (s, band) in &chart.bands {
                    let (col, _, _) = look(*s);
                    let mut poly: Vec<(f64, f64)> = band.iter().map(|p| (p.0, p.1)).collect();
                    poly.extend(band.iter().rev().map(|p| (p.0, p.2)));
                    if poly.len() >= 3 {
                        c.draw_series(std::iter::once(Polygon::new(poly, col.mix(0.15).filled())))
                            .map_err(err)?;
                    }
                }
                for (s, pts) in &chart.series {
                    draw_line!(c, *s, pts);
                }
                for (s, bars) in &chart.errors {
                    let (col, _, _) = look(*s);
                    c.draw_series(bars.iter().map(|&(x, lo, hi)| {
                        ErrorBar::new_vertical(x, lo, (lo + hi) / 2.0, hi, col.stroke_width(1), 8)
                    }))
                    .map_err(err)?;
                }
                for (s, pts) in &chart.scatter {
                    let (col, mk, _) = look(*s);
                    draw_markers!(c, pts, mk, col)
                        .label(s.title())
                        .legend(legend_entry!(mk, col, false));
                }
                draw_legend(c)?;
            }};
        }
        if log {
            let mut c = builder
                .build_cartesian_2d(x_range, (lo * 0.8..hi * 1.25).log_scale())
                .map_err(err)?;
            plot!(&mut c, format!("{} (log scale)", chart.y_label));
        } else {
            let mut c = builder
                .build_cartesian_2d(x_range, 0.0..hi.max(f64::MIN_POSITIVE) * 1.15)
                .map_err(err)?;
            plot!(&mut c, chart.y_label.to_string());
        }
        root.present().map_err(err)?;
    }
    Ok(Some((chart.file.to_string(), svg)))
}

/// An axis tick: 0.5, 2, 20, 1500, without float noise.
pub(crate) fn axis_number(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 || a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{:.1}", v).trim_end_matches(".0").to_string()
    } else {
        let digits = (-a.log10().floor()) as usize + 1;
        format!("{v:.digits$}")
    }
}

/// The cells of a strategy that measured, by pod count (combined over repeats).
fn ok_aggregates(data: &RunData, s: Arm) -> Vec<Cow<'_, CellRecord>> {
    let mut pods = data.run.plan.pods.clone();
    pods.sort_unstable();
    pods.into_iter()
        .filter_map(|p| data.aggregate(s, p))
        .filter(|c| c.status == CellStatus::Ok)
        .collect()
}

fn series(data: &RunData, f: fn(&CellRecord) -> Option<f64>) -> Vec<(Arm, Vec<(f64, f64)>)> {
    data.arms()
        .into_iter()
        .map(|s| {
            (
                s,
                ok_aggregates(data, s)
                    .iter()
                    .filter_map(|c| f(c).map(|v| (c.pods as f64, v)))
                    .collect::<Vec<_>>(),
            )
        })
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// The 95% intervals over repeats of a series' points (none in a run of one repeat).
fn error_bars(data: &RunData, f: fn(&CellRecord) -> Option<f64>) -> Vec<(Arm, Band)> {
    data.arms()
        .into_iter()
        .map(|s| {
            let bars: Band = ok_aggregates(data, s)
                .iter()
                .filter_map(|c| {
                    let i = data.interval(s, c.pods, f)?;
                    let h = i.half_width?;
                    Some((c.pods as f64, i.mean - h, i.mean + h))
                })
                .collect();
            (s, bars)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// Every chart that has data, as (file name, SVG).
pub fn all(data: &RunData) -> Result<Vec<(String, String)>> {
    let strategies = data.arms();
    let n = strategies.len().max(1) as f64;
    let mut out = Vec::new();
    let bands = strategies
        .iter()
        .map(|&s| {
            let pts: Band = ok_aggregates(data, s)
                .iter()
                .filter_map(|c| Some((c.pods as f64, c.p50_s? * 1e3, c.p99_s? * 1e3)))
                .collect();
            (s, pts)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let charts = [
        LineChart {
            file: "latency.svg",
            title: "Inference latency vs pods: mean (line), p50–p99 (band)".into(),
            y_label: "latency per inference (ms)",
            series: series(data, |c| c.mean_s.map(|v| v * 1e3)),
            errors: error_bars(data, |c| c.mean_s.map(|v| v * 1e3)),
            bands,
            scatter: Vec::new(),
        },
        LineChart {
            file: "throughput.svg",
            title: "Aggregate throughput vs pods".into(),
            y_label: "inferences per second (all pods)",
            series: series(data, |c| c.throughput_per_s),
            errors: error_bars(data, |c| c.throughput_per_s),
            bands: Vec::new(),
            scatter: Vec::new(),
        },
        LineChart {
            file: "per-pod-throughput.svg",
            title: "Per-pod throughput (spread = unfairness)".into(),
            y_label: "inferences per second (one pod)",
            series: Vec::new(),
            errors: Vec::new(),
            bands: Vec::new(),
            scatter: strategies
                .iter()
                .enumerate()
                .map(|(i, &s)| {
                    let off = (i as f64 - (n - 1.0) / 2.0) * 0.12;
                    let pts = data
                        .cells
                        .iter()
                        .filter(|c| c.arm() == s && c.is_pod() && c.status == CellStatus::Ok)
                        .filter_map(|c| c.throughput_per_s.map(|t| (c.pods as f64 + off, t)))
                        .collect::<Vec<_>>();
                    (s, pts)
                })
                .filter(|(_, v)| !v.is_empty())
                .collect(),
        },
        LineChart {
            file: "gpu-utilisation.svg",
            title: "GPU utilisation vs pods".into(),
            y_label: "GPU utilisation (%)",
            series: series(data, |c| c.gpu_util_pct),
            errors: error_bars(data, |c| c.gpu_util_pct),
            bands: Vec::new(),
            scatter: Vec::new(),
        },
        LineChart {
            file: "energy.svg",
            title: "GPU energy per inference vs pods".into(),
            y_label: "energy per inference (J)",
            series: series(data, |c| c.energy_j_per_inference),
            errors: error_bars(data, |c| c.energy_j_per_inference),
            bands: Vec::new(),
            scatter: Vec::new(),
        },
    ];
    for chart in charts {
        if let Some(c) = draw(data, chart)? {
            out.push(c);
        }
    }
    Ok(out)
}
