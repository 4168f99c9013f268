//! Capacity at an SLO: at R requests/s per pod and a latency objective, how
//! many pods fit on one GPU under each strategy.
//!
//! Pure: [`search`] judges a measured pod count against the SLOs and picks the next
//! count to measure (the rule is written there once); [`record`] makes the capacity
//! table of a run's cells. I/O: [`command`] is the `capacity` command, which measures
//! the cells the search asks for through the sweep's generic runner and cell code
//! (same run directory, metrics source, clean-up and `--resume`). The report's table
//! and knee chart are in `report::capacity`.

pub mod command;
pub mod record;
pub mod search;
