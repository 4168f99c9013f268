//! Statistics of a cell: histogram deltas and quantiles, fairness, window stability;
//! and between cells: intervals over repeats.

pub mod binomial;
pub mod fairness;
pub mod histogram;
pub mod interval;
pub mod stability;

pub use fairness::jain_index;
pub use histogram::Histogram;
pub use stability::{WindowStat, relative_spread, stable, steady};
