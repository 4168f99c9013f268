//! `verify RUN_DIR`: recomputes a run's rows from its raw windows (`windows.jsonl`,
//! [`crate::results::raw`]) and names every number that differs (pure but for reading
//! the run). Per pod: inferences, throughput, mean, p50, p90, p99, their 95% intervals
//! and resolution, errors, measured time, the backlog's growth and, with SLOs, each attainment, its interpolation bound,
//! whether every SLO held and the goodput. Per cell: the pooled quantiles and mean,
//! inferences, throughput over the cell's time base, the number of windows and the
//! window-to-window spreads. The capacity verdicts, the intervals over repeats and the
//! comparisons are computed from rows when read; besides the numbers verified here they
//! read the rows' statuses and notes (a pod pending, failed, out of memory), which
//! come from the pods' states, not from histograms, and are not recomputed. Neither
//! are a cell's GPU rows (several GPUs per cell), its fairness, its errors or its
//! attainments. A cell that kept its GPU samples has its telemetry columns recomputed
//! from them (utilisation, memory, power, energy per inference, clock slowdowns and
//! power cap, clocks, temperature). Every cell's speed-up and slowdown are recomputed
//! against its own pass's 1-pod cell.

use std::path::Path;

use crate::client::tokens::TokenTally;
use crate::domain::CellStatus;
use crate::error::{BenchError, Result};
use crate::metrics::ServerHistograms;
use crate::metrics::requests::TokenRecord;
use crate::results::raw::{Layouts, RAW_FILE, RawCell, RawPod, RawServer, read_layouts, read_raw};
use crate::results::record::CellRecord;
use crate::results::requests::{REQUESTS_FILE, RequestLine, read_requests};
use crate::stats::{Histogram, relative_spread};
use crate::sweep::cell::{
    SloHistograms, add_server, against_one_pod, aggregate_status, fell_behind, finite, judge_slos, own_baseline,
    set_server_columns, set_telemetry, set_token_columns, shortfall, tally_streamed,
};
use crate::telemetry::summarise;

use super::RunData;

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verification {
    /// Cells whose rows were recomputed.
    pub cells: usize,
    /// Numbers compared.
    pub numbers: usize,
    /// Every number that differs, and every cell without its windows: one line each.
    pub mismatches: Vec<String>,
}

/// Two numbers agree when within a billionth of each other (relative) or 1e-12.
fn agree(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12_f64.max(1e-9 * a.abs().max(b.abs()))
}

/// Compares the recorded `field` of a row with what the windows give.
struct Checker<'a> {
    out: &'a mut Verification,
    what: String,
    /// The raw file the numbers are recomputed from.
    from: &'static str,
}

impl Checker<'_> {
    fn number(&mut self, field: &str, recorded: Option<f64>, computed: Option<f64>) {
        self.out.numbers += 1;
        let same = match (recorded, computed) {
            (Some(a), Some(b)) => agree(a, b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            let show = |v: Option<f64>| v.map_or("nothing".to_string(), |v| format!("{v}"));
            self.out.mismatches.push(format!(
                "{}: {field} is {} in cells.jsonl, {} from {}",
                self.what,
                show(recorded),
                show(computed),
                self.from
            ));
        }
    }

    fn count(&mut self, field: &str, recorded: Option<u64>, computed: Option<u64>) {
        self.number(field, recorded.map(|v| v as f64), computed.map(|v| v as f64));
    }
}

/// Verifies the run in `dir`: an error when it cannot be read or keeps no raw windows.
pub fn verify_dir(dir: &Path) -> Result<Verification> {
    // An equal-load run: each of its sweeps on disk, its lines named by the sweep.
    if super::equal_load::is_equal_load(dir) {
        let run = super::equal_load::load(dir)?;
        let mut out = Verification::default();
        // A sweep stopped before its first cell has nothing to verify.
        let measured = |s: &super::equal_load::Sweep| s.data.as_ref().is_some_and(|d| !d.cells.is_empty());
        for s in run.sweeps.iter().filter(|s| measured(s)) {
            let v = verify_dir(&dir.join(&s.name))?;
            out.cells += v.cells;
            out.numbers += v.numbers;
            out.mismatches
                .extend(v.mismatches.into_iter().map(|m| format!("{}: {m}", s.name)));
        }
        return Ok(out);
    }
    let data = RunData::load(dir)?;
    if !dir.join(RAW_FILE).is_file() {
        return Err(BenchError::RunDir {
            path: dir.join(RAW_FILE),
            reason: "missing: nothing to verify from (a run made before runs kept their raw windows: its rows cannot be rechecked)".into(),
        });
    }
    let raw = read_raw(dir)?;
    let layouts = read_layouts(dir)?;
    check_layouts(dir, &raw, &layouts)?;
    let requests = read_requests(dir)?;
    let streamed = data.run.plan.request.as_ref().is_some_and(|r| r.stream.is_some());
    if streamed && !dir.join(REQUESTS_FILE).is_file() && !raw.is_empty() {
        return Err(BenchError::RunDir {
            path: dir.join(REQUESTS_FILE),
            reason: "missing: a run of streamed answers keeps every request measured there, and its token columns are recomputed from them".into(),
        });
    }
    let mut out = verify(&data, &raw, &layouts, &requests);
    csv_matches(&mut out, dir, &data.cells)?;
    Ok(out)
}

/// Refuses raw windows whose bucket layout is not in `bucket-layouts.json` (a missing
/// file included) or whose buckets reach past it: the numbers would not be recomputed
/// but skipped.
fn check_layouts(dir: &Path, raw: &[RawCell], layouts: &Layouts) -> Result<()> {
    for c in raw {
        for s in &c.series {
            let at = format!("{} × {} (repeat {}), {}", c.arm(), c.pods, c.repeat, s.pod);
            let Some(bounds) = layouts.layouts.get(s.layout as usize) else {
                let path = dir.join(crate::results::raw::LAYOUTS_FILE);
                let how = if path.is_file() {
                    "does not hold it"
                } else {
                    "is missing"
                };
                return Err(BenchError::RunDir {
                    path,
                    reason: format!("{at} counts in layout {}, and the file {how}", s.layout),
                });
            };
            if s.histogram(bounds, None).is_none() {
                return Err(BenchError::RunDir {
                    path: dir.join(RAW_FILE),
                    reason: format!("{at}: a bucket beyond its layout's {} bounds", bounds.len()),
                });
            }
        }
    }
    Ok(())
}

/// Recomputes every cell of `data` that `raw` has windows for, and names each measured
/// cell without them (pure). A run of streamed answers has its token columns
/// recomputed from `requests`.
pub fn verify(data: &RunData, raw: &[RawCell], layouts: &Layouts, requests: &[RequestLine]) -> Verification {
    let mut out = Verification::default();
    let slos = &data.run.plan.slos;
    let streamed = data.run.plan.request.as_ref().is_some_and(|r| r.stream.is_some());
    // A run made since rows carry a quantile's interval has it on every row with
    // enough requests for it; older runs record none.
    let intervals = Intervals {
        p50: data.cells.iter().any(|c| c.p50_low_s.is_some()),
        p90: data.cells.iter().any(|c| c.p90_low_s.is_some()),
        p99: data.cells.iter().any(|c| c.p99_low_s.is_some()),
    };
    for cell in raw {
        let rows: Vec<&CellRecord> = data
            .cells
            .iter()
            .filter(|c| c.repeat == cell.repeat && c.arm() == cell.arm() && c.pods == cell.pods)
            .collect();
        let title = format!("{} × {} (repeat {})", cell.arm(), cell.pods, cell.repeat);
        let Some(agg) = rows.iter().find(|c| c.is_aggregate()) else {
            out.mismatches
                .push(format!("{title}: windows for a cell cells.jsonl lacks"));
            continue;
        };
        out.cells += 1;
        for row in rows
            .iter()
            .filter(|r| r.is_pod() && r.inferences.is_some_and(|n| n > 0))
        {
            if !cell.series.iter().any(|s| s.pod == row.pod) {
                out.mismatches
                    .push(format!("{title}, {}: completed requests, but has no windows", row.pod));
            }
        }
        let mut pooled: Option<Histogram> = None;
        let mut pooled_tokens: Option<TokenTally> = None;
        let mut pooled_server: Option<ServerHistograms> = None;
        let mut inferences = 0u64;
        for series in &cell.series {
            let what = format!("{title}, {}", series.pod);
            let tally = streamed.then(|| {
                let records: Vec<TokenRecord> = requests
                    .iter()
                    .filter(|r| {
                        r.repeat == cell.repeat && r.arm() == cell.arm() && r.pods == cell.pods && r.pod == series.pod
                    })
                    .map(|r| r.request.clone())
                    .collect();
                tally_streamed(&records, slos)
            });
            let Some(bounds) = layouts.layouts.get(series.layout as usize) else {
                out.mismatches.push(format!(
                    "{what}: layout {} is not in bucket-layouts.json",
                    series.layout
                ));
                continue;
            };
            let Some(h) = series.histogram(bounds, None) else {
                out.mismatches
                    .push(format!("{what}: a bucket index beyond its {} bounds", bounds.len()));
                continue;
            };
            match rows.iter().find(|r| r.pod == series.pod) {
                Some(row) => pod_row(
                    &mut Checker {
                        out: &mut out,
                        what,
                        from: RAW_FILE,
                    },
                    row,
                    series,
                    (&h, tally.as_ref()),
                    (slos, intervals),
                ),
                None => out.mismatches.push(format!("{what}: windows for a pod without a row")),
            }
            if let Some(server) = series
                .server
                .as_ref()
                .map(RawServer::histograms)
                .filter(|_| h.count > 0.0)
            {
                if let Some(row) = rows.iter().find(|r| r.pod == series.pod) {
                    server_columns(
                        &mut Checker {
                            out: &mut out,
                            what: format!("{title}, {}", series.pod),
                            from: RAW_FILE,
                        },
                        row,
                        &server,
                    );
                }
                add_server(&mut pooled_server, &server);
            }
            if let Some(t) = tally.filter(|_| h.count > 0.0) {
                match pooled_tokens.as_mut() {
                    Some(p) => p.merge(&t),
                    None => pooled_tokens = Some(t),
                }
            }
            if h.count > 0.0 {
                inferences += h.count as u64;
                // Other bucket bounds are left out of the cell's numbers, as measured.
                Histogram::pool(&mut pooled, h);
            }
        }
        let mut c = Checker {
            out: &mut out,
            what: format!("{title}, all pods"),
            from: RAW_FILE,
        };
        if let Some(h) = pooled.filter(|h| h.count > 0.0) {
            c.count("inferences", agg.inferences, Some(inferences));
            let secs = cell.measured_s;
            c.number("duration_s", agg.duration_s, Some(secs));
            if secs > 0.0 {
                c.number("throughput_per_s", agg.throughput_per_s, Some(inferences as f64 / secs));
            }
            quantiles(&mut c, agg, &h, intervals);
            spreads(&mut c, agg, cell, layouts);
            if let Some(t) = &pooled_tokens {
                tokens(&mut c, agg, t, if secs > 0.0 { secs } else { 1.0 });
            }
            if let Some(s) = &pooled_server {
                server_columns(&mut c, agg, s);
            }
        }
        if !cell.gpu_samples.is_empty() {
            telemetry(&mut c, agg, cell);
        }
    }
    for agg in data.cells.iter().filter(|c| c.is_aggregate() && c.inferences.is_some()) {
        let has = raw
            .iter()
            .any(|r| r.repeat == agg.repeat && r.arm() == agg.arm() && r.pods == agg.pods);
        if !has {
            out.mismatches.push(format!(
                "{} × {} (repeat {}): measured, but {RAW_FILE} has no windows for it",
                agg.arm(),
                agg.pods,
                agg.repeat
            ));
        }
    }
    speedups(&mut out, &data.cells);
    statuses(&mut out, &data.cells);
    out
}

/// Every cell's status against its pods' rows: the aggregate's is what its pods' give
/// ([`aggregate_status`]), a pod not `ok` says why in its note, and an `ok` pod completed
/// requests (a sweep records one that completed none as failed).
fn statuses(out: &mut Verification, cells: &[CellRecord]) {
    for agg in cells.iter().filter(|c| c.is_aggregate()) {
        let pods: Vec<&CellRecord> = cells
            .iter()
            .filter(|c| c.is_pod() && c.repeat == agg.repeat && c.arm() == agg.arm() && c.pods == agg.pods)
            .collect();
        // A cell that could not start has its aggregate row alone.
        if pods.is_empty() {
            continue;
        }
        let what = format!("{} × {} (repeat {})", agg.arm(), agg.pods, agg.repeat);
        out.numbers += 1;
        let want = aggregate_status(&pods.iter().map(|p| p.status).collect::<Vec<_>>());
        if agg.status != want {
            out.mismatches.push(format!(
                "{what}, all pods: status is {} in cells.jsonl, {want} from its pods' rows",
                agg.status
            ));
        }
        for p in &pods {
            if p.status != CellStatus::Ok && p.note.trim().is_empty() {
                out.mismatches.push(format!(
                    "{what}, {}: status {} without a note saying why",
                    p.pod, p.status
                ));
            }
            if p.status == CellStatus::Ok && p.inferences.is_none_or(|n| n == 0) {
                out.mismatches.push(format!(
                    "{what}, {}: ok, but completed no request (a sweep records it failed)",
                    p.pod
                ));
            }
        }
    }
}

/// `cells.csv` against `cells.jsonl`: the same bytes a sweep writes from the rows, or,
/// for a run written with another set of columns, every column equal to its row's
/// field.
fn csv_matches(out: &mut Verification, dir: &Path, cells: &[CellRecord]) -> Result<()> {
    use crate::files::{ReadError, limits, read_bytes, unreadable};
    let path = dir.join("cells.csv");
    let got = match read_bytes(&path, limits::ROWS) {
        Ok(b) => b,
        Err(ReadError::Missing) => {
            out.mismatches
                .push("cells.csv: missing (a sweep writes it beside cells.jsonl)".into());
            return Ok(());
        }
        Err(e) => return Err(unreadable(&path, e)),
    };
    out.numbers += 1;
    let want = crate::results::record::cells_csv(cells)?;
    if got == want {
        return Ok(());
    }
    let bad = |e: csv::Error| BenchError::RunDir {
        path: path.clone(),
        reason: e.to_string(),
    };
    let table = |bytes: &[u8]| -> Result<(csv::StringRecord, Vec<csv::StringRecord>)> {
        let mut r = csv::Reader::from_reader(bytes);
        let header = r.headers().map_err(bad)?.clone();
        let rows = r.records().collect::<std::result::Result<Vec<_>, _>>().map_err(bad)?;
        Ok((header, rows))
    };
    let ((gh, gr), (wh, wr)) = (table(&got)?, table(&want)?);
    if gr.len() != wr.len() {
        out.mismatches
            .push(format!("cells.csv has {} rows, cells.jsonl {}", gr.len(), wr.len()));
        return Ok(());
    }
    for (i, name) in gh.iter().enumerate() {
        let Some(j) = wh.iter().position(|h| h == name) else {
            out.mismatches
                .push(format!("cells.csv: column {name} is not a row's field"));
            continue;
        };
        for (n, (a, b)) in gr.iter().zip(&wr).enumerate() {
            let (a, b) = (a.get(i).unwrap_or(""), b.get(j).unwrap_or(""));
            let same = a == b || matches!((a.parse::<f64>(), b.parse::<f64>()), (Ok(x), Ok(y)) if agree(x, y));
            if !same {
                out.mismatches.push(format!(
                    "cells.csv line {}: {name} is {a:?}, {b:?} in cells.jsonl",
                    n + 2
                ));
            }
        }
    }
    Ok(())
}

/// Rewrites the speed-ups of the run in `dir` by [`against_one_pod`] (its lock held),
/// returning each change. The run must not be running.
pub fn rederive(dir: &Path) -> Result<Vec<String>> {
    let abs = dir
        .canonicalize()
        .map_err(BenchError::io(format!("reading {}", dir.display())))?;
    let (Some(out), Some(id)) = (abs.parent(), abs.file_name().and_then(|n| n.to_str())) else {
        return Err(BenchError::RunDir {
            path: dir.to_path_buf(),
            reason: "not a run directory".into(),
        });
    };
    let mut store = crate::results::store::RunStore::open(out, id)?;
    store.rederive_speedups(|cells, agg| against_one_pod(agg, own_baseline(cells, agg.repeat, agg.arm(), agg.pods)))
}

/// Every aggregate's speed-up and slowdown against its own pass's 1-pod cell
/// ([`against_one_pod`]): a 1-pod cell is 1, a cell whose 1-pod cell failed has none.
fn speedups(out: &mut Verification, cells: &[CellRecord]) {
    for agg in cells.iter().filter(|c| c.is_aggregate()) {
        let (speedup, slowdown) = against_one_pod(agg, own_baseline(cells, agg.repeat, agg.arm(), agg.pods));
        let mut c = Checker {
            out: &mut *out,
            what: format!("{} × {} (repeat {}), all pods", agg.arm(), agg.pods, agg.repeat),
            from: "its pass's 1-pod row",
        };
        c.number("speedup_vs_1pod", agg.speedup_vs_1pod, speedup);
        c.number("slowdown_vs_1pod", agg.slowdown_vs_1pod, slowdown);
    }
}

/// Which quantiles' sampling intervals a run records (runs made before a quantile
/// carried its interval record none for it: nothing to compare).
#[derive(Debug, Clone, Copy)]
struct Intervals {
    p50: bool,
    p90: bool,
    p99: bool,
}

/// The mean, quantiles and resolution of `h` against a row, and the quantiles'
/// intervals the run records.
fn quantiles(c: &mut Checker, row: &CellRecord, h: &Histogram, intervals: Intervals) {
    c.number("mean_s", row.mean_s, finite(h.mean()));
    c.number("p50_s", row.p50_s, finite(h.quantile(0.5)));
    c.number("p90_s", row.p90_s, finite(h.quantile(0.9)));
    c.number("p99_s", row.p99_s, finite(h.quantile(0.99)));
    c.number("quantile_resolution", row.quantile_resolution, h.quantile_resolution());
    for (on, q, (name_low, low), (name_high, high)) in [
        (
            intervals.p50,
            0.5,
            ("p50_low_s", row.p50_low_s),
            ("p50_high_s", row.p50_high_s),
        ),
        (
            intervals.p90,
            0.9,
            ("p90_low_s", row.p90_low_s),
            ("p90_high_s", row.p90_high_s),
        ),
        (
            intervals.p99,
            0.99,
            ("p99_low_s", row.p99_low_s),
            ("p99_high_s", row.p99_high_s),
        ),
    ] {
        if on {
            let (l, h) = h.quantile_interval(q);
            c.number(name_low, low, l);
            c.number(name_high, high, h);
        }
    }
}

/// One pod's row against its windows.
fn pod_row(
    c: &mut Checker,
    row: &CellRecord,
    series: &RawPod,
    (h, tally): (&Histogram, Option<&TokenTally>),
    (slos, intervals): (&[crate::config::values::Slo], Intervals),
) {
    if h.count <= 0.0 {
        c.count("inferences", row.inferences.filter(|&n| n > 0), None);
        return;
    }
    let secs = series.windows.last().map_or(0.0, |w| w.at_s);
    let errors: f64 = series.windows.iter().map(|w| w.errors).sum();
    c.count("inferences", row.inferences, Some(h.count as u64));
    c.number("throughput_per_s", row.throughput_per_s, Some(h.count / secs));
    c.number("duration_s", row.duration_s, Some(secs));
    c.count("errors", row.errors, Some(errors.max(0.0) as u64));
    quantiles(c, row, h, intervals);
    // A pod that fell behind its load gets no attainment (its latency is its queue's);
    // whether it fell behind follows from its errors and backlog (or, where it reports
    // none, its rate), and the attainments from its histogram, by the rules the run
    // applied (`sweep::cell`).
    let rate = h.count / secs;
    let backlog = series.backlog();
    let growth = (row.offered_per_s.is_some() && backlog.len() >= 2).then(|| backlog[backlog.len() - 1] - backlog[0]);
    c.number("backlog_growth", row.backlog_growth, growth);
    // Runs made before keeping up was judged on the backlog and failures (they record
    // no p50 interval, which came with it) were judged on their rate alone.
    let behind = row.offered_per_s.and_then(|o| {
        if intervals.p50 {
            fell_behind(o, rate, secs, &backlog, errors.max(0.0))
        } else {
            shortfall(o, rate, secs)
        }
    });
    let mut expect = row.clone();
    (
        expect.slo_p50_attainment,
        expect.slo_p90_attainment,
        expect.slo_p99_attainment,
    ) = (None, None, None);
    (expect.slo_attainment_bound, expect.slo_met, expect.goodput_per_s) = (None, None, None);
    if let Some(t) = tally {
        tokens(c, row, t, secs);
    }
    (
        expect.ttft_slo_attainment,
        expect.itl_slo_attainment,
        expect.tpot_slo_attainment,
    ) = (None, None, None);
    if behind.is_none() {
        let (hs, good) = match tally {
            Some(t) => (SloHistograms::with_tally(h, t), t.goodput_per_s(secs)),
            None => (SloHistograms::latency(h), None),
        };
        judge_slos(&mut expect, &hs, rate, slos, good);
    }
    let flag = |m: Option<bool>| m.map(|m| f64::from(u8::from(m)));
    for (field, recorded, computed) in [
        ("slo_p50_attainment", row.slo_p50_attainment, expect.slo_p50_attainment),
        ("slo_p90_attainment", row.slo_p90_attainment, expect.slo_p90_attainment),
        ("slo_p99_attainment", row.slo_p99_attainment, expect.slo_p99_attainment),
        (
            "ttft_slo_attainment",
            row.ttft_slo_attainment,
            expect.ttft_slo_attainment,
        ),
        ("itl_slo_attainment", row.itl_slo_attainment, expect.itl_slo_attainment),
        (
            "tpot_slo_attainment",
            row.tpot_slo_attainment,
            expect.tpot_slo_attainment,
        ),
        (
            "slo_attainment_bound",
            row.slo_attainment_bound,
            expect.slo_attainment_bound,
        ),
        ("slo_met", flag(row.slo_met), flag(expect.slo_met)),
        ("goodput_per_s", row.goodput_per_s, expect.goodput_per_s),
    ] {
        c.number(field, recorded, computed);
    }
}

/// A row's token columns against the tally of its streamed requests over `secs`.
fn tokens(c: &mut Checker, row: &CellRecord, t: &TokenTally, secs: f64) {
    let from = std::mem::replace(&mut c.from, REQUESTS_FILE);
    // The requests that completed are the ones the latency windows counted.
    c.count("inferences", row.inferences, Some(t.completed));
    let mut expect = row.clone();
    set_token_columns(&mut expect, t, secs);
    c.count("output_tokens", row.output_tokens, expect.output_tokens);
    c.count("itl_count", row.itl_count, expect.itl_count);
    c.count("tpot_count", row.tpot_count, expect.tpot_count);
    for (field, recorded, computed) in [
        (
            "output_tokens_per_s",
            row.output_tokens_per_s,
            expect.output_tokens_per_s,
        ),
        ("ttft_mean_s", row.ttft_mean_s, expect.ttft_mean_s),
        ("ttft_p50_s", row.ttft_p50_s, expect.ttft_p50_s),
        ("ttft_p90_s", row.ttft_p90_s, expect.ttft_p90_s),
        ("ttft_p99_s", row.ttft_p99_s, expect.ttft_p99_s),
        ("itl_mean_s", row.itl_mean_s, expect.itl_mean_s),
        ("itl_p50_s", row.itl_p50_s, expect.itl_p50_s),
        ("itl_p90_s", row.itl_p90_s, expect.itl_p90_s),
        ("itl_p99_s", row.itl_p99_s, expect.itl_p99_s),
        ("tpot_mean_s", row.tpot_mean_s, expect.tpot_mean_s),
        ("tpot_p99_s", row.tpot_p99_s, expect.tpot_p99_s),
    ] {
        c.number(field, recorded, computed);
    }
    c.from = from;
}

/// A row's server columns against the server's histograms' increments.
fn server_columns(c: &mut Checker, row: &CellRecord, s: &ServerHistograms) {
    // Every server column is recomputed (a histogram not in the windows leaves its
    // columns empty, so a row that holds them anyway differs).
    let mut expect = row.clone();
    set_server_columns(&mut expect, s);
    c.count("server_ttft_count", row.server_ttft_count, expect.server_ttft_count);
    c.count("server_itl_count", row.server_itl_count, expect.server_itl_count);
    for (field, recorded, computed) in [
        ("server_ttft_mean_s", row.server_ttft_mean_s, expect.server_ttft_mean_s),
        ("server_ttft_p50_s", row.server_ttft_p50_s, expect.server_ttft_p50_s),
        ("server_ttft_p99_s", row.server_ttft_p99_s, expect.server_ttft_p99_s),
        ("server_itl_mean_s", row.server_itl_mean_s, expect.server_itl_mean_s),
        ("server_itl_p50_s", row.server_itl_p50_s, expect.server_itl_p50_s),
        ("server_itl_p99_s", row.server_itl_p99_s, expect.server_itl_p99_s),
    ] {
        c.number(field, recorded, computed);
    }
}

/// The cell's windows: their count and the spreads of throughput, mean and median.
/// The aggregate's GPU columns against its cell's GPU samples.
fn telemetry(c: &mut Checker, agg: &CellRecord, cell: &RawCell) {
    let mut want = agg.clone();
    set_telemetry(&mut want, &summarise(&cell.gpu_samples), agg.inferences.unwrap_or(0));
    c.number("gpu_util_pct", agg.gpu_util_pct, want.gpu_util_pct);
    c.count("gpu_mem_bytes", agg.gpu_mem_bytes, want.gpu_mem_bytes);
    c.number("power_w", agg.power_w, want.power_w);
    c.number(
        "energy_j_per_inference",
        agg.energy_j_per_inference,
        want.energy_j_per_inference,
    );
    c.number("power_capped", agg.power_capped, want.power_capped);
    c.number("throttled_share", agg.throttled_share, want.throttled_share);
    c.number("sm_clock_mhz", agg.sm_clock_mhz, want.sm_clock_mhz);
    c.number("sm_clock_min_mhz", agg.sm_clock_min_mhz, want.sm_clock_min_mhz);
    c.number("mem_clock_mhz", agg.mem_clock_mhz, want.mem_clock_mhz);
    c.number("mem_clock_min_mhz", agg.mem_clock_min_mhz, want.mem_clock_min_mhz);
    c.number("temp_c", agg.temp_c, want.temp_c);
    c.number("temp_max_c", agg.temp_max_c, want.temp_max_c);
    c.out.numbers += 1;
    if agg.clock_slowdown != want.clock_slowdown {
        c.out.mismatches.push(format!(
            "{}: clock_slowdown is {:?} in cells.jsonl, {:?} from {RAW_FILE}",
            c.what, agg.clock_slowdown, want.clock_slowdown
        ));
    }
}

fn spreads(c: &mut Checker, agg: &CellRecord, cell: &RawCell, layouts: &Layouts) {
    let last = cell.windows;
    c.count("windows", agg.windows.map(u64::from), Some(u64::from(last)));
    let (mut tputs, mut means, mut p50s) = (Vec::new(), Vec::new(), Vec::new());
    for k in 1..=last {
        let mut h: Option<Histogram> = None;
        let mut tput = 0.0;
        for s in &cell.series {
            // Windows are in order (`RawCell::check`): a search, not a scan per window.
            let Ok(i) = s.windows.binary_search_by_key(&k, |w| w.window) else {
                continue;
            };
            let w = &s.windows[i];
            let before = if i == 0 { 0.0 } else { s.windows[i - 1].at_s };
            tput += w.count / (w.at_s - before).max(1e-9);
            let Some(d) = layouts
                .layouts
                .get(s.layout as usize)
                .and_then(|b| s.histogram(b, Some(&[w])))
            else {
                continue;
            };
            Histogram::pool(&mut h, d);
        }
        tputs.push(tput);
        means.push(h.as_ref().map_or(f64::NAN, Histogram::mean));
        p50s.push(h.as_ref().map_or(f64::NAN, |h| h.quantile(0.5)));
    }
    c.number(
        "throughput_spread",
        agg.throughput_spread,
        finite(relative_spread(&tputs)),
    );
    c.number("mean_spread", agg.mean_spread, finite(relative_spread(&means)));
    c.number("p50_spread", agg.p50_spread, finite(relative_spread(&p50s)));
}
