//! Statistics of a cell: histogram deltas and quantiles, fairness, window stability.

pub mod fairness;
pub mod histogram;
pub mod stability;

pub use fairness::jain_index;
pub use histogram::Histogram;
pub use stability::{WindowStat, relative_spread, stable};
