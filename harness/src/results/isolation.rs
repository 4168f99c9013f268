//! One [`IsolationRecord`] per trial of an isolation run, as `isolation.jsonl` and
//! `isolation.csv` hold it: parsed as strictly as flags, rendered from the one struct.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::domain::{CellStatus, Strategy};
use crate::error::{BenchError, Result};
use crate::results::record::{RunRecord, check_numbers};

/// The scenario name of the MPS victim alone under the limits it has in a trial beside
/// aggressors: what the cap alone costs it.
pub const CAPPED: &str = "alone-capped";

/// One trial of an isolation run. Numbers not measured are empty, never zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IsolationRecord {
    /// The run.
    pub run_id: String,
    /// The scenario, or `alone` for the victim alone.
    pub scenario: String,
    /// Sharing strategy.
    pub strategy: Strategy,
    /// Aggressors beside the victim.
    pub aggressors: u32,
    /// The victim's outcome.
    pub victim_status: CellStatus,
    /// The victim's exit code when it stopped on its own.
    pub victim_exit_code: Option<i32>,
    /// Victim inferences measured.
    pub victim_inferences: Option<u64>,
    /// Exact mean latency of the victim, seconds.
    pub victim_mean_s: Option<f64>,
    /// Victim p50, seconds.
    pub victim_p50_s: Option<f64>,
    /// Victim p99, seconds.
    pub victim_p99_s: Option<f64>,
    /// The 95% sampling interval of the victim's p50, seconds (order statistics read
    /// from its histogram; empty: too few requests).
    #[serde(default)]
    pub victim_p50_low_s: Option<f64>,
    /// Its high end, seconds.
    #[serde(default)]
    pub victim_p50_high_s: Option<f64>,
    /// The 95% sampling interval of the victim's p99, seconds (empty: too few requests;
    /// the high end needs at least 368).
    #[serde(default)]
    pub victim_p99_low_s: Option<f64>,
    /// Its high end, seconds.
    #[serde(default)]
    pub victim_p99_high_s: Option<f64>,
    /// Resolution of the victim's quantiles (0.022 = ±2.2%).
    pub quantile_resolution: Option<f64>,
    /// The victim's p99 over its p99 alone under the same strategy.
    pub p99_inflation: Option<f64>,
    /// The victim's mean over its mean alone.
    pub mean_inflation: Option<f64>,
    /// The latency target, seconds: one for every strategy of the run (`--slo`, else
    /// 1.5 × the exclusive victim's p99 alone; empty: neither was there).
    pub slo_s: Option<f64>,
    /// The fraction of the victim's inferences within the target.
    pub slo_attainment: Option<f64>,
    /// Pods that were serving at the end.
    pub survivors: u32,
    /// Pods started (pending ones not counted).
    pub started: u32,
    /// What became of the aggressors, e.g. "aggressor-1 exit 5: GPU fault …".
    pub aggressor_outcome: String,
    /// Seconds from the victim's exit being seen (pods are polled every 250 ms) to a
    /// replacement victim ready (its warm-up inferences ran), on the same strategy
    /// set-up (fault and crash).
    pub recovery_s: Option<f64>,
    /// How the strategy served again, or why not (empty: not a scenario that recovers).
    pub recovery: String,
    /// MPS: the thread and memory split the clients got.
    pub mps_split: Option<String>,
    /// Anything else a reader should know.
    pub note: String,
    /// Whether the victim kept up with the load it was offered, judged as a sweep's
    /// pods are (its backlog, its errors, its rate; the reason is in `note`). Empty:
    /// not judged (nothing measured, or a server of the user's own making its own load).
    #[serde(default)]
    pub victim_kept_up: Option<bool>,
    /// A victim that exited: seconds from the start of its measurement to its exit being
    /// seen. Its numbers cover that time only.
    #[serde(default)]
    pub victim_died_after_s: Option<f64>,
    /// MPS: the victim's p99 over its p99 alone under the same limits (the
    /// `alone-capped` trial of its aggressor count): the neighbours' part of the
    /// inflation, the cap's taken out.
    #[serde(default)]
    pub p99_over_capped: Option<f64>,
}

/// Parses `isolation.jsonl` and checks every record as strictly as flags: numbers
/// finite and non-negative (but the exit code), its strategy and scenario in `run`'s
/// plans, no two records of one trial. Errors name `path`, the line and the field.
pub fn parse_isolation_jsonl(text: &str, path: &Path, run: &RunRecord) -> Result<Vec<IsolationRecord>> {
    let at = |line: usize, reason: String| BenchError::RunDir {
        path: path.to_path_buf(),
        reason: format!("line {line}: {reason}"),
    };
    let scenarios: Vec<&str> = run
        .kind
        .isolation()
        .iter()
        .flat_map(|p| p.scenarios.iter().map(|s| s.name()))
        .chain(["alone", CAPPED])
        .collect();
    let mut out: Vec<IsolationRecord> = Vec::new();
    for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line = i + 1;
        let r: IsolationRecord = serde_json::from_str(l).map_err(|e| at(line, e.to_string()))?;
        check_numbers(&r, &["victim_exit_code"]).map_err(|reason| at(line, reason))?;
        if !run.plan.strategies.contains(&r.strategy) {
            return Err(at(line, format!("strategy {} is not in run.json's plan", r.strategy)));
        }
        if !scenarios.contains(&r.scenario.as_str()) {
            return Err(at(
                line,
                format!(
                    "scenario {:?} is not in run.json's isolation plan ({})",
                    r.scenario,
                    scenarios.join(", ")
                ),
            ));
        }
        if r.aggressors > 63 {
            return Err(at(line, format!("aggressors {} is outside 0 to 63", r.aggressors)));
        }
        // The trials the plan makes: the victim alone, the noisy neighbour beside each
        // planned count, every other scenario beside one aggressor.
        let noisy = || run.kind.isolation().map_or(Vec::new(), |p| p.aggressors.clone());
        let planned: Vec<u32> = match r.scenario.as_str() {
            "alone" => vec![0],
            "noisy-neighbour" => noisy(),
            // The MPS victim alone under a trial's limits: a noisy count, or one.
            CAPPED if r.strategy == Strategy::Mps => {
                let mut k = noisy();
                k.push(1);
                k
            }
            CAPPED => Vec::new(),
            _ => vec![1],
        };
        if !planned.contains(&r.aggressors) {
            return Err(at(
                line,
                format!(
                    "aggressors {} is not in run.json's isolation plan for {} ({})",
                    r.aggressors,
                    r.scenario,
                    planned.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        if let Some(a) = r.slo_attainment.filter(|a| *a > 1.0 + 1e-9) {
            return Err(at(line, format!("slo_attainment {a} is above 1 (a share of requests)")));
        }
        if r.survivors > r.started || r.started > r.aggressors + 1 {
            return Err(at(
                line,
                format!(
                    "{} survivors and {} started of {} pods",
                    r.survivors,
                    r.started,
                    r.aggressors + 1
                ),
            ));
        }
        if let (Some(p50), Some(p99)) = (r.victim_p50_s, r.victim_p99_s)
            && p50 > p99
        {
            return Err(at(line, format!("victim_p50_s {p50} is above victim_p99_s {p99}")));
        }
        if out.iter().any(|o| o.same_trial(&r)) {
            return Err(at(
                line,
                format!("a second record of {} {} × {}", r.strategy, r.scenario, r.aggressors),
            ));
        }
        out.push(r);
    }
    Ok(out)
}

impl IsolationRecord {
    /// What became of the victim, in the matrix's words: "victim failed (exit 5), p99 ×1.01,
    /// SLO 100.0%, 0/2 serving".
    pub fn outcome_text(&self) -> String {
        let r = self;
        if r.victim_status == CellStatus::Unavailable {
            return format!("unavailable: {}", r.note);
        }
        let serving = format!("{}/{} serving", r.survivors, r.started);
        let mut parts = Vec::new();
        if r.victim_status != CellStatus::Ok {
            let after = r
                .victim_died_after_s
                .map(|t| format!(" {t:.1} s in, numbers until then"))
                .unwrap_or_default();
            parts.push(match r.victim_exit_code {
                Some(c) => format!("victim {} (exit {c}){after}", r.victim_status),
                None => format!("victim {}{after}", r.victim_status),
            });
        }
        if r.victim_kept_up == Some(false) {
            parts.push("victim fell behind its load".into());
        }
        if let Some(x) = r.p99_inflation {
            parts.push(format!("p99 ×{x:.2}"));
        }
        if let Some(a) = r.slo_attainment {
            parts.push(format!("SLO {:.1}%", a * 100.0));
        }
        parts.push(serving);
        parts.join(", ")
    }

    /// Whether `other` records the same trial (strategy, scenario, aggressors).
    pub fn same_trial(&self, other: &IsolationRecord) -> bool {
        self.strategy == other.strategy && self.scenario == other.scenario && self.aggressors == other.aggressors
    }
}

/// Renders records as JSON lines (`isolation.jsonl`).
pub fn isolation_jsonl(records: &[IsolationRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        // Serialising our own plain struct cannot fail.
        out.extend(serde_json::to_vec(r).unwrap_or_default());
        out.push(b'\n');
    }
    out
}

/// Renders records as CSV, the header from the struct's fields.
pub fn isolation_csv(records: &[IsolationRecord]) -> Result<Vec<u8>> {
    let err = |e: &dyn std::fmt::Display| BenchError::Results {
        path: "isolation.csv".into(),
        reason: e.to_string(),
    };
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in records {
        w.serialize(r).map_err(|e| err(&e))?;
    }
    w.into_inner().map_err(|e| err(&e))
}
