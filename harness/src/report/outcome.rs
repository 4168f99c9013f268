//! What became of the isolation victim in one trial (pure): protected, degraded or
//! failed, by the rule the report states. The matrix colours its cells by it and the
//! answer counts it.

use crate::domain::CellStatus;
use crate::results::isolation::IsolationRecord;

/// What became of the victim in one trial, as the matrix colours it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Served, with at least [`PROTECTED_ATTAINMENT`] of its inferences within the
    /// latency target (without one: its p99 within [`PROTECTED_INFLATION`] of alone).
    Protected,
    /// Served, but slower than that.
    Degraded,
    /// Did not serve to the end (failed, out of memory, killed; a victim that was never
    /// scheduled is not rated).
    Failed,
}

/// The share of the victim's inferences within its target that counts as protected
/// (the target: `--slo`, else 1.5 × its p99 alone).
pub const PROTECTED_ATTAINMENT: f64 = 0.99;
/// Without a target: the p99 over alone that counts as protected.
pub const PROTECTED_INFLATION: f64 = 1.5;

impl Outcome {
    /// The word a reader sees beside the colour.
    pub fn word(self) -> &'static str {
        match self {
            Outcome::Protected => "protected",
            Outcome::Degraded => "degraded",
            Outcome::Failed => "failed",
        }
    }

    /// How the matrix decides, in one sentence.
    pub fn rule() -> String {
        format!(
            "Colours: protected (green) when the victim served to the end with at least {:.0}% of its inferences within its latency target (or, without one, a p99 within {PROTECTED_INFLATION}× of alone); degraded (amber) when it served but slower; failed (red) when it did not serve to the end.",
            PROTECTED_ATTAINMENT * 100.0
        )
    }
}

/// The outcome of a trial (None: not measured).
pub fn outcome(r: &IsolationRecord) -> Option<Outcome> {
    match r.victim_status {
        // Never measured, or never scheduled: nothing the aggressors did.
        CellStatus::Unavailable | CellStatus::Pending => None,
        CellStatus::Ok => {
            let ok = match (r.slo_attainment, r.p99_inflation) {
                (Some(a), _) => a >= PROTECTED_ATTAINMENT,
                (None, Some(x)) => x <= PROTECTED_INFLATION,
                (None, None) => return None,
            };
            Some(if ok { Outcome::Protected } else { Outcome::Degraded })
        }
        _ => Some(Outcome::Failed),
    }
}
