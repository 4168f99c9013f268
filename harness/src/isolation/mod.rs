//! Isolation: what one misbehaving pod does to its neighbours under each
//! strategy. A victim serves an open-loop load; aggressors load the GPU, take its
//! memory, fault (`gpushare-workload --inject-fault-after`) or are killed.
//!
//! Pure: [`plan`] makes the trials (each pod's name and workload arguments, which
//! `Backend::launch_pods` launches) and the recorded [`plan::IsolationPlan`]; [`record`]
//! makes what a trial comes to (the victim's latency, SLO attainment and inflation
//! against the victim alone, who survived, how soon a new victim was ready); the record
//! itself is `results::isolation` and the matrix `report::isolation_matrix`. I/O:
//! [`runner`] drives trials through any backend; [`command`] is the `isolation` command,
//! which runs them through the sweep's generic runner (same run directory, metrics
//! source, clean-up and `--resume`). The report's tables and chart are in
//! `report::isolation`. On Kubernetes a trial is two Deployments, the victim's and the
//! aggressors' (`backend::k8s::trial`).

pub mod command;
pub mod plan;
pub mod record;
pub mod runner;
#[cfg(test)]
mod runner_tests;
