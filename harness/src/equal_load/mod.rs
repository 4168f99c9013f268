//! Equal offered load: the strategies side by side at the same aggregate request rate,
//! a share of one exclusive pod's closed-loop capacity.
//!
//! The run is a directory of sweeps. [`command`] (the shell) measures the closed sweep,
//! takes its exclusive × 1 throughput as the base (`results::equal_load::base_of`,
//! pure), then one `--load total:RATE` sweep per level, each through `sweep::run` (its
//! own run directory, clean-up and `--resume`). The record is
//! `results::equal_load::EqualLoadRecord`; the report's tables are in
//! `report::equal_load`.

pub mod command;
