//! The answer a report opens with (pure). A sweep: at the largest pod count that two or
//! more strategies measured, which serves the most, which keeps the tail lowest and which
//! shares most evenly, each number with its noise and the cells to read with care. An
//! isolation run: under which strategy the victim was protected in how many scenarios. A
//! capacity run: how many pods each strategy fits at the SLO. The strategies that could
//! not run, in one line.

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
    fairness: Option<f64>,
    /// What to read with care in this cell (empty: nothing).
    flags: Vec<String>,
}

impl Measured {
    /// Its name, marked when its numbers are to be read with care.
    fn label(&self) -> String {
        if self.flags.is_empty() {
            self.name.clone()
        } else {
            format!("{} ⚑", self.name)
        }
    }
}

/// The report's first lines: the answer to the question the run's kind asks (empty when
/// the run holds too little to compare).
pub fn lines(data: &RunData) -> Vec<String> {
    match &data.run.kind {
        RunKind::Sweep => sweep_lines(data),
        RunKind::Isolation(_) => isolation_lines(data),
        RunKind::Capacity(_) => capacity_lines(data).into_iter().collect(),
    }
}

/// A sweep's answer, at the largest pod count that two or more strategies measured.
fn sweep_lines(data: &RunData) -> Vec<String> {
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
    if let Some(line) = fairness_line(&pods_text, cells.iter().filter(|c| c.fairness.is_some()).collect()) {
        out.push(line);
    }
    let care: Vec<String> = cells
        .iter()
        .filter(|c| !c.flags.is_empty())
        .map(|c| format!("{} ({})", c.name, c.flags.join("; ")))
        .collect();
    if !care.is_empty() {
        out.push(format!(
            "⚑ Read with care at {pods_text}: {}. The numbers above include them; the tables flag every number built on them.",
            care.join("; ")
        ));
    }
    out
}

/// "Fairness at 7 pods (Jain's index over the pods, 1 = equal shares): …", most even first.
fn fairness_line(pods: &str, mut cells: Vec<&Measured>) -> Option<String> {
    if cells.len() < 2 {
        return None;
    }
    cells.sort_by(|a, b| b.fairness.unwrap_or(0.0).total_cmp(&a.fairness.unwrap_or(0.0)));
    let parts: Vec<String> = cells
        .iter()
        .filter_map(|c| Some(format!("{} {:.3}", c.label(), c.fairness?)))
        .collect();
    Some(format!(
        "Fairness at {pods}, most even first (Jain's index over the requested pods, 1 = equal shares): {}.",
        parts.join("; ")
    ))
}

/// An isolation run's answer: per strategy, in how many scenarios the victim was
/// protected, and which ones degraded or failed it; most protective first.
fn isolation_lines(data: &RunData) -> Vec<String> {
    use super::outcome::{Outcome, outcome};
    let mut per: Vec<(String, usize, usize, String)> = Vec::new();
    for s in data.strategies() {
        let (mut protected, mut total, mut degraded) = (0, 0, 0);
        let mut failed = Vec::new();
        for r in data
            .isolation
            .iter()
            .filter(|r| r.strategy == s && r.scenario != "alone" && r.scenario != crate::isolation::plan::CAPPED)
        {
            let Some(o) = outcome(r) else { continue };
            total += 1;
            match o {
                Outcome::Protected => protected += 1,
                Outcome::Degraded => degraded += 1,
                Outcome::Failed => failed.push(crate::isolation::plan::scenario_label(&r.scenario, r.aggressors)),
            }
        }
        let mut harmed = Vec::new();
        if !failed.is_empty() {
            harmed.push(format!("failed: {}", failed.join(", ")));
        }
        if degraded > 0 {
            harmed.push(format!("degraded in {degraded}"));
        }
        if s == crate::domain::Strategy::Exclusive {
            harmed.push("the reference: its aggressors stay pending".into());
        }
        if total > 0 {
            per.push((s.title().to_string(), protected, total, harmed.join("; ")));
        }
    }
    if per.is_empty() {
        return Vec::new();
    }
    per.sort_by(|a, b| (b.1 * a.2).cmp(&(a.1 * b.2)));
    let parts: Vec<String> = per
        .iter()
        .map(|(name, protected, total, harmed)| {
            let rest = if harmed.is_empty() {
                String::new()
            } else {
                format!(" ({harmed})")
            };
            format!("{name} {protected} of {total}{rest}")
        })
        .collect();
    vec![format!(
        "Scenarios in which the victim was protected, most first: {}. (Protected: it served with at least {:.0}% of its inferences within its latency target; the matrix below colours each trial.)",
        parts.join("; "),
        super::outcome::PROTECTED_ATTAINMENT * 100.0
    )]
}

/// A capacity run's answer: the pods each strategy fits at the run's load and SLOs,
/// most first.
fn capacity_lines(data: &RunData) -> Option<String> {
    let mut recs: Vec<_> = crate::capacity::record::records(&data.run, &data.cells)
        .into_iter()
        .filter(|r| r.pods_fit.is_some())
        .collect();
    let first = recs.first()?;
    let (slos, rate) = (first.slos.clone(), first.offered_per_pod);
    recs.sort_by_key(|r| std::cmp::Reverse(r.pods_fit));
    let parts: Vec<String> = recs
        .iter()
        .map(|r| {
            let fits = r.pods_fit.unwrap_or(0);
            // Without a miss the capacity is at least what was searched.
            let open = if r.first_miss_pods.is_some() { "" } else { "≥ " };
            let sure = r
                .attainment_lower_bound
                .map(|l| format!(" (≥ {:.2}%)", l * 100.0))
                .unwrap_or_default();
            format!("{} {open}{fits}{sure}", r.arm().title())
        })
        .collect();
    Some(format!(
        "Pods per GPU that meet {slos}{}, most first: {}. (A count fits when every pod's attainment clears its percentile at 95% confidence: in brackets, the lowest one-sided 95% lower bound at that count, the histogram's interpolation included; one measurement per count.)",
        rate.map_or(String::new(), |r| format!(" at {} requests/s each", rate_text(r))),
        parts.join("; "),
    ))
}

fn rate_text(r: f64) -> String {
    if r >= 100.0 {
        rate(r)
    } else if r.fract() == 0.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.2}")
    }
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
            0 => format!("{} {} inferences/s", c.label(), rate(c.throughput)),
            _ => format!(
                "{} {} ({})",
                c.label(),
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
                0 => format!("{} {:.2} ms", c.label(), v * 1e3),
                _ => format!("{} {:.2} ms ({})", c.label(), v * 1e3, percent(v / best - 1.0)),
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
            let flags = data
                .repeats(arm, pods)
                .iter()
                .filter(|r| r.status == CellStatus::Ok)
                .flat_map(|r| r.flags())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            Some(Measured {
                name,
                throughput,
                throughput_ci: ci,
                throughput_spread: agg.throughput_spread,
                p99: agg.p99_s,
                resolution: agg.quantile_resolution,
                fairness: agg.fairness,
                flags,
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
    // Whole percents, but a gap under ten percent keeps its first decimal (never "−0%").
    let decimals = usize::from(p.abs() < 9.95);
    if p < 0.0 {
        format!("−{:.decimals$}%", -p)
    } else {
        format!("+{p:.decimals$}%")
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
        assert_eq!(lines.len(), 3, "{lines:#?}");
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
        assert_eq!(percent(-0.003), "−0.3%");
        assert_eq!(percent(0.0996), "+10%");
        assert_eq!(
            lines[2],
            "Fairness at 7 pods, most even first (Jain's index over the requested pods, 1 = equal shares): Time-slicing 1.000; MPS 1.000; Exclusive (1 of 7 pods ran) 0.143."
        );
        // A cell whose windows did not settle is marked, and said why.
        let mut data = fixture("h100-run");
        for c in data.cells.iter_mut().filter(|c| c.is_aggregate() && c.pods == 7) {
            if c.strategy == crate::domain::Strategy::Mps {
                c.note = "did not settle within 30 s".into();
                c.throughput_spread = Some(0.59);
            }
        }
        let flagged = super::lines(&data);
        assert!(
            flagged[0].starts_with("Throughput at 7 pods, most first: MPS ⚑ 618"),
            "{}",
            flagged[0]
        );
        assert_eq!(
            flagged[3],
            "⚑ Read with care at 7 pods: MPS (unsettled: windows differ by 59%). The numbers above include them; the tables flag every number built on them."
        );
    }

    #[test]
    fn isolation_and_capacity_runs_answer_their_own_question() {
        assert_eq!(
            lines(&fixture("h100-isolation")),
            [
                "Scenarios in which the victim was protected, most first: Exclusive 6 of 6 (the reference: its aggressors stay pending); Time-slicing 0 of 6 (failed: memory pressure; degraded in 5); MPS 0 of 6 (failed: fault; degraded in 5). (Protected: it served with at least 99% of its inferences within its latency target; the matrix below colours each trial.)"
            ]
        );
        assert_eq!(
            lines(&fixture("runs/20261123-h100-capacity-again")),
            [
                "Pods per GPU that meet p99=25ms at 125 requests/s each, most first: Time-slicing 2 (≥ 99.88%); MPS 2 (≥ 99.88%). (A count fits when every pod's attainment clears its percentile at 95% confidence: in brackets, the lowest one-sided 95% lower bound at that count, the histogram's interpolation included; one measurement per count.)"
            ]
        );
    }
}
