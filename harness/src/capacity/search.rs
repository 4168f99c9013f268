//! The capacity search (pure): how a measured pod count stands against the SLOs
//! ([`judge`]), which count to measure next ([`next`]), and what a strategy's counts
//! come to ([`outcome`]).
//!
//! The rule, as `capacity --help` and the report state it:
//! - Each pod's attainment of each SLO (the share of its n measured requests within the
//!   threshold) is a binomial proportion seen through a histogram: it can be off by the
//!   row's interpolation bound (the share of requests in the bucket holding the
//!   threshold; with several SLOs the largest over their thresholds), and n requests
//!   only estimate the pod's true share. Its **95% bounds** are the one-sided
//!   Clopper–Pearson lower bound of the lowest reading the bucket allows and the upper
//!   bound of the highest ([`binomial::attainment_bounds`]).
//! - A count **fits** when its cell measured (`ok`) and every pod kept up with its
//!   offered load (no request failed or dropped, its backlog did not grow beyond its
//!   own window-to-window variation, and it served its rate: see
//!   `sweep::cell::fell_behind`) and, for every SLO, the lower bound of its
//!   attainment is at least the percentile (p99 needs 99%): at least 299 requests, all
//!   within the threshold, can show that.
//! - It **misses clearly** when the cell did not measure (failed, out of memory, a pod
//!   pending or the strategy unavailable), a pod could not keep up, or an upper bound
//!   is below its percentile.
//! - Otherwise it is **marginal**: the bounds straddle the percentile, so neither a fit
//!   nor a miss is shown at 95%.
//! - Counts are walked upwards from 1 (latency is not assumed monotone in pods, so no
//!   bisection). The walk stops at the first clear miss, at the second miss in a row,
//!   or at the limit: `--max-pods`, or 1 for exclusive (a second pod stays pending).
//! - The capacity is the largest count such that it and every smaller count fit.

use crate::config::values::{Slo, SloMetric};
use crate::domain::{Arm, CellStatus, Strategy};
use crate::results::record::CellRecord;
use crate::stats::binomial;

/// How one measured pod count stands against the SLOs.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every pod served its load and met every SLO.
    Fits,
    /// Neither shown to fit nor to miss at 95% confidence: the reason.
    Marginal(String),
    /// Missed clearly: the reason.
    Misses(String),
}

impl Verdict {
    /// Whether the count fits.
    pub fn fits(&self) -> bool {
        matches!(self, Verdict::Fits)
    }
}

/// The attainment a row records for an objective, and the number of independent
/// observations its confidence is judged on: its requests. An `itl:` attainment is a
/// share of gaps, but the gaps of one request share its contention, so they count as
/// one request's worth of evidence, not as many (the judgement is then conservative).
/// None: no such objective on the row.
pub fn attainment(row: &CellRecord, slo: &Slo) -> Option<(f64, f64)> {
    let q = slo.quantile?;
    let requests = row.inferences.map(|n| n as f64);
    match slo.metric {
        SloMetric::Latency => {
            let a = match (q * 100.0).round() as u32 {
                50 => row.slo_p50_attainment,
                90 => row.slo_p90_attainment,
                99 => row.slo_p99_attainment,
                _ => None,
            }?;
            Some((a, requests?))
        }
        SloMetric::Ttft => Some((row.ttft_slo_attainment?, requests?)),
        SloMetric::Itl => Some((row.itl_slo_attainment?, requests?)),
        SloMetric::Tpot => Some((row.tpot_slo_attainment?, row.tpot_count? as f64)),
    }
}

/// Judges one cell: its aggregate row and its pods' rows (pure).
pub fn judge(aggregate: &CellRecord, pods: &[&CellRecord], slos: &[Slo]) -> Verdict {
    if aggregate.status != CellStatus::Ok {
        let why = if aggregate.note.is_empty() {
            String::new()
        } else {
            format!(": {}", aggregate.note)
        };
        return Verdict::Misses(format!("the cell is {}{why}", aggregate.status));
    }
    if pods.is_empty() {
        return Verdict::Misses("the cell has no pod rows".into());
    }
    // (how far below its percentile, pod, what) of every miss.
    let mut clear: Vec<(f64, &str, String)> = Vec::new();
    let mut marginal = Vec::new();
    for row in pods {
        if row.status != CellStatus::Ok {
            return Verdict::Misses(format!("{} is {}", row.pod, row.status));
        }
        // A pod that served nothing, or fell behind its offered load, has no attainment
        // (`sweep::cell` leaves it empty): its latency is its queue's.
        if row.slo_met.is_none() && row.inferences.unwrap_or(0) == 0 {
            return Verdict::Misses(format!("{} completed no request while measured", row.pod));
        }
        if row.slo_met.is_none() {
            return Verdict::Misses(format!(
                "{} could not keep up with its offered load{}",
                row.pod,
                match (row.throughput_per_s, row.offered_per_s, row.backlog_growth) {
                    (Some(t), Some(o), Some(g)) => format!(" (served {t:.1}/s of {o}/s; its backlog grew by {g})"),
                    (Some(t), Some(o), None) => format!(" (served {t:.1}/s of {o}/s)"),
                    _ => String::new(),
                }
            ));
        }
        let bound = row.slo_attainment_bound.unwrap_or(0.0);
        for slo in slos {
            let Some(q) = slo.quantile else { continue };
            let Some((a, n)) = attainment(row, slo) else {
                return Verdict::Misses(format!("{} has no attainment for {slo}", row.pod));
            };
            let of = match (slo.metric, row.itl_count) {
                (SloMetric::Itl, Some(gaps)) => format!("{gaps} itl gaps of {} requests", n as u64),
                (m, _) if m.is_token() => format!("{} {} requests", n as u64, m.prefix()),
                _ => format!("{} requests", n as u64),
            };
            let (lo, hi) = binomial::attainment_bounds(a, bound, n);
            if lo >= q {
                continue;
            }
            let what = format!(
                "{}: {:.2}% of {of} within {} (needs {:.0}%; 95% bounds {:.2}%–{:.2}%)",
                row.pod,
                a * 100.0,
                humantime::format_duration(slo.threshold),
                q * 100.0,
                lo * 100.0,
                hi * 100.0
            );
            if hi < q {
                clear.push((a - q, &row.pod, what));
                continue;
            }
            // Too few requests to show the percentile met even if all were within it:
            // the cell, not the strategy, left it open.
            let needs = binomial::requests_to_show(q, binomial::CONFIDENCE);
            if n < needs as f64 {
                marginal.push(format!(
                    "{what}: undecided, the cell held {} requests where {needs} all within the objective are needed to show it met (a longer --max-cell or a higher rate decides it)",
                    n as u64
                ));
                continue;
            }
            marginal.push(what);
        }
    }
    clear.sort_by(|x, y| x.0.total_cmp(&y.0));
    if let Some((_, _, worst)) = clear.first() {
        let mut missing: Vec<&str> = clear.iter().map(|c| c.1).collect();
        missing.sort_unstable();
        missing.dedup();
        return Verdict::Misses(match missing.len() {
            1 => worst.clone(),
            n => format!("{n} of {} pods miss, the worst {worst}", pods.len()),
        });
    }
    if marginal.is_empty() {
        Verdict::Fits
    } else {
        Verdict::Marginal(marginal.join("; "))
    }
}

/// The verdict of a cell among a run's rows (pure; None: the cell is not on disk).
/// A capacity run has one repeat.
pub fn cell_verdict(rows: &[CellRecord], arm: Arm, pods: u32, slos: &[Slo]) -> Option<Verdict> {
    let same = |c: &&CellRecord| c.repeat == 1 && c.arm() == arm && c.pods == pods;
    let aggregate = rows.iter().filter(same).find(|c| c.is_aggregate())?;
    let pod_rows: Vec<&CellRecord> = rows.iter().filter(same).filter(|c| c.is_pod()).collect();
    Some(judge(aggregate, &pod_rows, slos))
}

/// The largest count the search measures for a strategy.
pub fn limit(strategy: Strategy, max_pods: u32) -> u32 {
    match strategy {
        Strategy::Exclusive => 1,
        _ => max_pods.max(1),
    }
}

/// The search's next step for one strategy.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Measure this pod count.
    Measure(u32),
    /// The walk is over.
    Done,
}

/// The next count to measure, given the verdicts of the counts measured so far
/// (`verdict(n)`: None when n is not measured yet). Pure; a resumed run replays it
/// from the cells on disk.
pub fn next(limit: u32, verdict: impl Fn(u32) -> Option<Verdict>) -> Step {
    let mut misses_in_a_row = 0;
    for n in 1..=limit {
        match verdict(n) {
            None => return Step::Measure(n),
            Some(Verdict::Fits) => misses_in_a_row = 0,
            Some(Verdict::Misses(_)) => return Step::Done,
            Some(Verdict::Marginal(_)) => {
                misses_in_a_row += 1;
                if misses_in_a_row >= 2 {
                    return Step::Done;
                }
            }
        }
    }
    Step::Done
}

/// What a strategy's walk came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The capacity: the largest count that, with every smaller one, fits (0: none).
    pub fits: u32,
    /// The first count that did not fit, and why.
    pub first_miss: Option<(u32, Verdict)>,
    /// Every measured count with its verdict, in order.
    pub walk: Vec<(u32, Verdict)>,
    /// Whether the walk is over (false: a run that stopped before it ended).
    pub finished: bool,
}

/// The outcome of a strategy's walk over its measured counts (pure).
pub fn outcome(limit: u32, verdict: impl Fn(u32) -> Option<Verdict>) -> Outcome {
    let walk: Vec<(u32, Verdict)> = (1..=limit).map_while(|n| verdict(n).map(|v| (n, v))).collect();
    let fits = walk.iter().take_while(|(_, v)| v.fits()).count() as u32;
    let first_miss = walk.iter().find(|(_, v)| !v.fits()).cloned();
    let finished = next(limit, &verdict) == Step::Done;
    Outcome {
        fits,
        first_miss,
        walk,
        finished,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::{DeviceKind, Source};
    use crate::results::record::ALL_PODS;

    fn test_row(strategy: Strategy, pods: u32, pod: &str) -> CellRecord {
        CellRecord::unmeasured(strategy, pods, pod, CellStatus::Ok, Source::Scrape, DeviceKind::Cpu)
    }

    fn p99(ms: u64) -> Vec<Slo> {
        vec![Slo {
            metric: crate::config::values::SloMetric::Latency,
            quantile: Some(0.99),
            threshold: Duration::from_millis(ms),
        }]
    }

    /// A pod's row with a p99 attainment and bound, over 20,000 requests.
    fn pod(name: &str, attained: Option<f64>, bound: f64) -> CellRecord {
        of(name, attained, bound, 20_000)
    }

    /// A pod's row with a p99 attainment and bound over `n` requests.
    fn of(name: &str, attained: Option<f64>, bound: f64, n: u64) -> CellRecord {
        let mut r = test_row(Strategy::Mps, 3, name);
        r.status = CellStatus::Ok;
        r.slo_p99_attainment = attained;
        r.slo_attainment_bound = attained.map(|_| bound);
        r.slo_met = attained.map(|a| a >= 0.99);
        r.throughput_per_s = Some(90.0);
        r.inferences = Some(n);
        r.offered_per_s = Some(100.0);
        r
    }

    fn agg(status: CellStatus) -> CellRecord {
        let mut r = test_row(Strategy::Mps, 3, ALL_PODS);
        r.status = status;
        r.note = "pod-2 oom: out of memory".into();
        r
    }

    #[test]
    fn a_count_fits_only_when_every_pod_meets_every_slo_at_95_percent_confidence() {
        let (a, b) = (pod("pod-1", Some(0.995), 0.001), of("pod-2", Some(1.0), 0.0, 400));
        assert_eq!(judge(&agg(CellStatus::Ok), &[&a, &b], &p99(25)), Verdict::Fits);
        // 98.4% of 20,000 with 0.2% in the threshold's bucket: clearly below 99%.
        let c = pod("pod-3", Some(0.984), 0.002);
        match judge(&agg(CellStatus::Ok), &[&a, &c], &p99(25)) {
            Verdict::Misses(why) => assert!(
                why.starts_with("pod-3: 98.40% of 20000 requests within 25ms (needs 99%; 95% bounds 98.0"),
                "{why}"
            ),
            v => panic!("{v:?}"),
        }
        // Several pods below: the count and the worst.
        let e = pod("pod-4", Some(0.95), 0.001);
        match judge(&agg(CellStatus::Ok), &[&c, &a, &e], &p99(25)) {
            Verdict::Misses(why) => assert!(
                why.starts_with("2 of 3 pods miss, the worst pod-4: 95.00% of 20000 requests"),
                "{why}"
            ),
            v => panic!("{v:?}"),
        }
        // 98.9% with 0.2% in the bucket: the histogram cannot tell.
        let d = pod("pod-3", Some(0.989), 0.002);
        assert!(matches!(
            judge(&agg(CellStatus::Ok), &[&a, &d], &p99(25)),
            Verdict::Marginal(_)
        ));
    }

    #[test]
    fn a_cell_too_short_for_its_percentile_is_undecided_and_says_why() {
        // 28 requests, every one within: a p99 needs 299 to be shown met at 95%.
        let short = of("pod-0", Some(1.0), 0.0, 28);
        match judge(&agg(CellStatus::Ok), &[&short], &p99(25)) {
            Verdict::Marginal(why) => assert!(
                why.contains("undecided, the cell held 28 requests where 299 all within the objective are needed"),
                "{why}"
            ),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn an_inter_token_objective_is_judged_over_requests_not_gaps() {
        let slos: Vec<Slo> = ["ttft:p99=500ms", "itl:p99=50ms"]
            .iter()
            .map(|t| t.parse().expect("slo"))
            .collect();
        // 20,000 requests, all first tokens within; 99.5% of 200,000 gaps within.
        let mut r = of("pod-1", None, 0.0, 20_000);
        r.slo_met = Some(true);
        r.slo_attainment_bound = Some(0.0);
        (r.ttft_slo_attainment, r.itl_slo_attainment) = (Some(1.0), Some(0.995));
        r.itl_count = Some(200_000);
        assert_eq!(judge(&agg(CellStatus::Ok), &[&r], &slos), Verdict::Fits);
        // 400 requests of 100 gaps each: 40,000 gaps would show 99%, 400 requests cannot.
        r.inferences = Some(400);
        r.itl_count = Some(40_000);
        match judge(&agg(CellStatus::Ok), &[&r], &slos) {
            Verdict::Marginal(why) => assert!(
                why.starts_with("pod-1: 99.50% of 40000 itl gaps of 400 requests within 50ms"),
                "{why}"
            ),
            v => panic!("{v:?}"),
        }
        // A row without the column (not streamed) has no attainment for it.
        r.itl_slo_attainment = None;
        match judge(&agg(CellStatus::Ok), &[&r], &slos) {
            Verdict::Misses(why) => assert_eq!(why, "pod-1 has no attainment for itl:p99=50ms"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn an_attainment_above_the_percentile_by_a_few_requests_is_not_a_fit() {
        // 13 of 1,817 requests over the threshold: 99.28%, above 99%, but seeing ≤ 13
        // misses is 13% likely when the true miss rate is exactly 1%.
        let thin = of("pod-1", Some(1804.0 / 1817.0), 0.0, 1817);
        match judge(&agg(CellStatus::Ok), &[&thin], &p99(25)) {
            Verdict::Marginal(why) => assert!(
                why.starts_with("pod-1: 99.28% of 1817 requests within 25ms (needs 99%; 95% bounds 98.8"),
                "{why}"
            ),
            v => panic!("{v:?}"),
        }
        // Every one of 200 requests within: too few to show 99% (299 are needed).
        let few = of("pod-1", Some(1.0), 0.0, 200);
        assert!(matches!(
            judge(&agg(CellStatus::Ok), &[&few], &p99(25)),
            Verdict::Marginal(_)
        ));
        let enough = of("pod-1", Some(1.0), 0.0, 299);
        assert_eq!(judge(&agg(CellStatus::Ok), &[&enough], &p99(25)), Verdict::Fits);
        // A fit only inside the interpolation bound is marginal too.
        let bucket = pod("pod-1", Some(0.9905), 0.002);
        assert!(matches!(
            judge(&agg(CellStatus::Ok), &[&bucket], &p99(25)),
            Verdict::Marginal(_)
        ));
    }

    #[test]
    fn a_cell_that_did_not_measure_or_a_pod_that_fell_behind_misses_clearly() {
        let a = pod("pod-1", Some(1.0), 0.0);
        match judge(&agg(CellStatus::Oom), &[&a], &p99(25)) {
            Verdict::Misses(why) => assert_eq!(why, "the cell is oom: pod-2 oom: out of memory"),
            v => panic!("{v:?}"),
        }
        let short = pod("pod-2", None, 0.0);
        match judge(&agg(CellStatus::Ok), &[&a, &short], &p99(25)) {
            Verdict::Misses(why) => assert_eq!(
                why,
                "pod-2 could not keep up with its offered load (served 90.0/s of 100/s)"
            ),
            v => panic!("{v:?}"),
        }
        assert!(matches!(judge(&agg(CellStatus::Ok), &[], &p99(25)), Verdict::Misses(_)));
        let idle = CellRecord {
            inferences: Some(0),
            ..short
        };
        match judge(&agg(CellStatus::Ok), &[&a, &idle], &p99(25)) {
            Verdict::Misses(why) => assert_eq!(why, "pod-2 completed no request while measured"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn the_walk_goes_up_from_one_and_stops_at_a_clear_miss_or_two_misses_in_a_row() {
        let m = |w: &'static [char]| {
            move |n: u32| {
                w.get(n as usize - 1).map(|c| match c {
                    'f' => Verdict::Fits,
                    'm' => Verdict::Marginal("m".into()),
                    _ => Verdict::Misses("x".into()),
                })
            }
        };
        assert_eq!(next(7, m(&[])), Step::Measure(1));
        assert_eq!(next(7, m(&['f', 'f'])), Step::Measure(3));
        assert_eq!(next(7, m(&['f', 'x'])), Step::Done);
        // One marginal miss: the next count decides.
        assert_eq!(next(7, m(&['f', 'm'])), Step::Measure(3));
        assert_eq!(next(7, m(&['f', 'm', 'm'])), Step::Done);
        assert_eq!(next(7, m(&['f', 'm', 'f'])), Step::Measure(4));
        assert_eq!(next(2, m(&['f', 'f'])), Step::Done);
        assert_eq!(next(limit(Strategy::Exclusive, 7), m(&['f'])), Step::Done);

        let o = outcome(7, m(&['f', 'f', 'm', 'f', 'x']));
        // A marginal miss ends the capacity even when a larger count fits again.
        assert_eq!(o.fits, 2);
        assert_eq!(o.first_miss, Some((3, Verdict::Marginal("m".into()))));
        assert_eq!(o.walk.len(), 5);
        assert!(o.finished);
        let o = outcome(7, m(&['f', 'f']));
        assert_eq!((o.fits, o.first_miss, o.finished), (2, None, false));
        let o = outcome(7, m(&['x']));
        assert_eq!((o.fits, o.finished), (0, true));
    }
}
