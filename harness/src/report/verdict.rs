//! The answer a sweep's report opens with (pure): at the largest pod count that two or
//! more strategies measured, which serves the most and which keeps the tail lowest, each
//! number with its noise, and the strategies that could not run in one line.

use super::RunData;
use crate::config::plan::RunKind;
use crate::domain::{Arm, CellStatus};

/// One strategy's numbers at the compared pod count.
struct Measured {
    name: String,
    throughput: f64,
    /// ± half-width of the 95% interval over repeats, relative (a run of several passes).
    throughput_ci: Option<f64>,
    /// Window-to-window spread inside the cell, relative.
    throughput_spread: Option<f64>,
    p99: Option<f64>,
    resolution: Option<f64>,
}

/// The report's first lines for a sweep (empty for an isolation or capacity run, and for
/// a sweep where fewer than two strategies measured one pod count).
pub fn lines(data: &RunData) -> Vec<String> {
    if data.run.kind != RunKind::Sweep {
        return Vec::new();
    }
    let arms = data.arms();
    let Some((pods, cells)) = data
        .run
        .plan
        .pods
        .iter()
        .copied()
        .map(|p| (p, measured(data, &arms, p)))
        .filter(|(_, m)| m.len() >= 2)
        .max_by_key(|(p, _)| *p)
    else {
        return Vec::new();
    };
    let pods_text = format!("{pods} pod{}", if pods == 1 { "" } else { "s" });
    let mut out = vec![throughput_line(&pods_text, cells.iter().collect())];
    if let Some(line) = p99_line(&pods_text, cells.iter().filter(|c| c.p99.is_some()).collect()) {
        out.push(line);
    }
    out
}

/// "Throughput at 7 pods: MPS 1,050 inferences/s; Time-slicing 870 (−17%); …", with
/// the noise the numbers carry.
fn throughput_line(pods: &str, mut cells: Vec<&Measured>) -> String {
    cells.sort_by(|a, b| b.throughput.total_cmp(&a.throughput));
    let best = cells[0].throughput;
    let parts: Vec<String> = cells
        .iter()
        .enumerate()
        .map(|(i, c)| match i {
            0 => format!("{} {} inferences/s", c.name, rate(c.throughput)),
            _ => format!(
                "{} {} ({})",
                c.name,
                rate(c.throughput),
                percent(c.throughput / best - 1.0)
            ),
        })
        .collect();
    let noise = match cells.iter().filter_map(|c| c.throughput_ci).reduce(f64::max) {
        Some(ci) => format!("95% intervals over the passes within ±{:.1}%", ci * 100.0),
        None => match cells.iter().filter_map(|c| c.throughput_spread).reduce(f64::max) {
            Some(s) => format!("one pass; each cell's windows agreed within {:.1}%", s * 100.0),
            None => "one pass".to_string(),
        },
    };
    format!("Throughput at {pods}, most first: {}. ({noise}.)", parts.join("; "))
}

/// "p99 latency at 7 pods, lowest first: …" with the quantiles' resolution.
fn p99_line(pods: &str, mut cells: Vec<&Measured>) -> Option<String> {
    if cells.len() < 2 {
        return None;
    }
    cells.sort_by(|a, b| a.p99.unwrap_or(f64::MAX).total_cmp(&b.p99.unwrap_or(f64::MAX)));
    let best = cells[0].p99?;
    let parts: Vec<String> = cells
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let v = c.p99?;
            Some(match i {
                0 => format!("{} {:.2} ms", c.name, v * 1e3),
                _ => format!("{} {:.2} ms ({})", c.name, v * 1e3, percent(v / best - 1.0)),
            })
        })
        .collect();
    let resolution = match cells.iter().filter_map(|c| c.resolution).reduce(f64::max) {
        Some(r) => format!("each within ±{:.1}%, its histogram bucket", r * 100.0),
        None => "the run records no quantile resolution".to_string(),
    };
    Some(format!(
        "p99 latency at {pods}, lowest first: {}. ({resolution}.)",
        parts.join("; ")
    ))
}

/// The strategies measured at `pods`: ok cells with a throughput.
fn measured(data: &RunData, arms: &[Arm], pods: u32) -> Vec<Measured> {
    arms.iter()
        .filter_map(|&arm| {
            let agg = data.aggregate(arm, pods)?;
            if agg.status != CellStatus::Ok {
                return None;
            }
            let throughput = agg.throughput_per_s.filter(|t| *t > 0.0)?;
            let ci = data
                .interval(arm, pods, |c| c.throughput_per_s)
                .and_then(|i| i.half_width.map(|h| h / i.mean));
            // Exclusive beside pending pods measures the one that ran: say so.
            let name = match agg.note.split(';').next().filter(|n| n.contains(" pods ran")) {
                Some(ran) => format!("{} ({})", arm.title(), ran.trim()),
                None => arm.title(),
            };
            Some(Measured {
                name,
                throughput,
                throughput_ci: ci,
                throughput_spread: agg.throughput_spread,
                p99: agg.p99_s,
                resolution: agg.quantile_resolution,
            })
        })
        .collect()
}

/// 1,050 or 87.5.
fn rate(v: f64) -> String {
    if v >= 100.0 {
        let whole = format!("{v:.0}");
        let mut out = String::new();
        for (i, ch) in whole.chars().enumerate() {
            if i > 0 && (whole.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(ch);
        }
        out
    } else {
        format!("{v:.1}")
    }
}

/// "+21%", "−17%".
fn percent(x: f64) -> String {
    let p = x * 100.0;
    if p < 0.0 {
        format!("−{:.0}%", -p)
    } else {
        format!("+{p:.0}%")
    }
}

/// The strategies that could not run, in one line: "Not measured here: MIG (MIG mode is
/// Disabled …)".
pub fn unavailable_line(data: &RunData) -> Option<String> {
    if data.run.unavailable.is_empty() {
        return None;
    }
    let parts: Vec<String> = data
        .run
        .unavailable
        .iter()
        .map(|u| {
            let reason = u.reason.split(['.', ';']).next().unwrap_or(&u.reason).trim();
            format!("{} ({reason})", u.strategy.title())
        })
        .collect();
    Some(format!(
        "Not measured here: {}. Their cells say unavailable; the reasons are at the end.",
        parts.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> RunData {
        RunData::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(name),
        )
        .expect("fixture")
    }

    #[test]
    fn a_sweep_opens_with_throughput_and_p99_at_its_largest_count() {
        let lines = lines(&fixture("h100-run"));
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            lines[0].starts_with("Throughput at 7 pods, most first: "),
            "{}",
            lines[0]
        );
        assert!(lines[0].ends_with(".)") && lines[0].contains("one pass; each cell's windows agreed within"));
        assert!(
            lines[1].starts_with("p99 latency at 7 pods, lowest first: "),
            "{}",
            lines[1]
        );
        // The fixture's numbers (one pass of the H100 default sweep).
        assert_eq!(
            lines[0],
            "Throughput at 7 pods, most first: MPS 618 inferences/s; Exclusive (1 of 7 pods ran) 504 (−18%); Time-slicing 489 (−21%). (one pass; each cell's windows agreed within 0.4%.)"
        );
        assert_eq!(
            lines[1],
            "p99 latency at 7 pods, lowest first: Exclusive (1 of 7 pods ran) 2.15 ms; MPS 12.01 ms (+458%); Time-slicing 14.76 ms (+585%). (the run records no quantile resolution.)"
        );
        assert_eq!(rate(1050.4), "1,050");
        assert_eq!(rate(87.46), "87.5");
        assert_eq!(percent(-0.171), "−17%");
        // An isolation run answers with its matrix instead.
        assert!(super::lines(&fixture("h100-isolation")).is_empty());
    }
}
