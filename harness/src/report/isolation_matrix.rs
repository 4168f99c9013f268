//! The isolation matrix (pure): one row per scenario (the noisy neighbour once per
//! aggressor count), one column per strategy, each cell what became of the victim —
//! its p99 against itself alone, its SLO attainment, and who was still serving — or why
//! it was not measured, with the reason in a numbered note.

use crate::domain::{CellStatus, Strategy};
use crate::isolation::plan::scenario_label;
use crate::report::outcome::outcome;
use crate::report::tables::{Cell, Table, note_number};
use crate::results::isolation::IsolationRecord;

/// The matrix and the notes its cells refer to.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    /// The table.
    pub table: Table,
    /// (number, "Strategy — scenario: reason").
    pub notes: Vec<(usize, String)>,
}

/// The scenario rows of a run's records, in trial order with the victim alone first:
/// (scenario as recorded, aggressors).
pub fn rows(records: &[IsolationRecord]) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = Vec::new();
    for r in records {
        if !out.iter().any(|(s, k)| *s == r.scenario && *k == r.aggressors) {
            out.push((r.scenario.clone(), r.aggressors));
        }
    }
    // The victim alone first, then (MPS) alone under each trial's limits.
    out.sort_by_key(|(s, _)| match s.as_str() {
        "alone" => 0,
        crate::isolation::plan::CAPPED => 1,
        _ => 2,
    });
    out
}

/// The record of one trial.
pub fn find<'a>(records: &'a [IsolationRecord], key: (Strategy, &str, u32)) -> Option<&'a IsolationRecord> {
    let (s, scenario, k) = key;
    records
        .iter()
        .find(|r| r.strategy == s && r.scenario == scenario && r.aggressors == k)
}

/// A table cell of one trial: `text` of its record, unavailable with the reason as a
/// numbered note, or missing (the trial is not in the run).
pub fn cell(
    records: &[IsolationRecord],
    notes: &mut Vec<(usize, String)>,
    key: (Strategy, &str, u32),
    text: impl Fn(&IsolationRecord) -> Option<String>,
) -> Cell {
    match find(records, key) {
        None => Cell::Missing,
        Some(r) if r.victim_status == CellStatus::Unavailable => Cell::Status(
            CellStatus::Unavailable,
            note_number(notes, format!("{} — unavailable: {}", key.0.title(), r.note)),
        ),
        Some(r) => text(r).map_or(Cell::Empty, Cell::Value),
    }
}

/// Builds the matrix from a run's records (the victim-alone rows are its reference and
/// not rows of their own).
pub fn matrix(records: &[IsolationRecord]) -> Matrix {
    let mut strategies: Vec<Strategy> = Vec::new();
    for r in records {
        if !strategies.contains(&r.strategy) {
            strategies.push(r.strategy);
        }
    }
    let mut notes: Vec<(usize, String)> = Vec::new();
    let table_rows = rows(records)
        .iter()
        .filter(|(scenario, _)| scenario != "alone" && scenario != crate::isolation::plan::CAPPED)
        .map(|(scenario, k)| {
            let cells = strategies
                .iter()
                .map(|&s| {
                    let key = (s, scenario.as_str(), *k);
                    match (
                        cell(records, &mut notes, key, |r| Some(r.outcome_text())),
                        find(records, key).and_then(outcome),
                    ) {
                        (Cell::Value(text), Some(o)) => Cell::Rated(text, o),
                        (c, _) => c,
                    }
                })
                .collect();
            (scenario_label(scenario, *k), cells)
        })
        .collect();
    Matrix {
        table: Table {
            title: "Isolation matrix: the victim beside its aggressors".into(),
            corner: "Scenario".into(),
            unit: "victim p99 over itself alone under the same strategy; SLO attainment: the share of its inferences within the run's latency target; pods still serving at the end".into(),
            columns: strategies.iter().map(|s| s.title().to_string()).collect(),
            rows: table_rows,
        },
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::outcome::Outcome;

    fn rec(strategy: Strategy, scenario: &str, k: u32) -> IsolationRecord {
        IsolationRecord {
            run_id: "r".into(),
            scenario: scenario.into(),
            strategy,
            aggressors: k,
            victim_status: CellStatus::Ok,
            victim_exit_code: None,
            victim_inferences: Some(1000),
            victim_mean_s: Some(0.002),
            victim_p50_s: Some(0.002),
            victim_p99_s: Some(0.004),
            victim_p50_low_s: None,
            victim_p50_high_s: None,
            victim_p99_low_s: None,
            victim_p99_high_s: None,
            quantile_resolution: Some(0.022),
            p99_inflation: Some(2.0),
            mean_inflation: Some(2.0),
            slo_s: Some(0.003),
            slo_attainment: Some(0.9),
            survivors: k + 1,
            started: k + 1,
            aggressor_outcome: String::new(),
            recovery_s: None,
            recovery: String::new(),
            mps_split: None,
            note: String::new(),
            victim_kept_up: None,
            victim_died_after_s: None,
            p99_over_capped: None,
        }
    }

    #[test]
    fn rows_are_scenarios_columns_strategies_and_outcomes_read_plainly() {
        let mut mps_fault = rec(Strategy::Mps, "fault", 1);
        mps_fault.victim_status = CellStatus::Failed;
        mps_fault.victim_exit_code = Some(5);
        mps_fault.p99_inflation = Some(1.01);
        mps_fault.slo_attainment = Some(1.0);
        mps_fault.survivors = 0;
        let mut mig = rec(Strategy::Mig, "fault", 1);
        mig.victim_status = CellStatus::Unavailable;
        mig.note = "MIG mode is Disabled".into();
        let records = vec![
            rec(Strategy::TimeSlicing, "alone", 0),
            rec(Strategy::TimeSlicing, "noisy-neighbour", 1),
            rec(Strategy::TimeSlicing, "noisy-neighbour", 3),
            rec(Strategy::TimeSlicing, "fault", 1),
            rec(Strategy::Mps, "alone", 0),
            rec(Strategy::Mps, "noisy-neighbour", 1),
            mps_fault,
            mig,
        ];
        let m = matrix(&records);
        assert_eq!(m.table.columns, ["Time-slicing", "MPS", "MIG"]);
        let labels: Vec<&str> = m.table.rows.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            labels,
            [
                "noisy neighbour × 1 aggressor",
                "noisy neighbour × 3 aggressors",
                "fault"
            ]
        );
        let fault = &m.table.rows[2].1;
        assert_eq!(
            fault[0],
            Cell::Rated("p99 ×2.00, SLO 90.0%, 2/2 serving".into(), Outcome::Degraded)
        );
        assert_eq!(
            fault[1],
            Cell::Rated(
                "victim failed (exit 5), p99 ×1.01, SLO 100.0%, 0/2 serving".into(),
                Outcome::Failed
            )
        );
        assert_eq!(fault[2], Cell::Status(CellStatus::Unavailable, 1));
        assert_eq!(m.notes, [(1, "MIG — unavailable: MIG mode is Disabled".to_string())]);
        let mut fine = rec(Strategy::Mig, "noisy-neighbour", 1);
        fine.slo_attainment = Some(0.995);
        assert_eq!(outcome(&fine), Some(Outcome::Protected));
        fine.slo_attainment = None;
        fine.p99_inflation = Some(1.6);
        assert_eq!(
            outcome(&fine),
            Some(Outcome::Degraded),
            "no target: the p99 over alone decides"
        );
        // MPS had no 3-aggressor trial: not run, not invented.
        assert_eq!(m.table.rows[1].1[1], Cell::Missing);
    }
}
