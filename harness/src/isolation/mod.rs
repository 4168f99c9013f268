//! Isolation (issue 14): what one misbehaving pod does to its neighbours under each
//! strategy. A victim serves an open-loop load; aggressors load the GPU, take its
//! memory, fault (`gpushare-workload --inject-fault-after`) or are killed.
//!
//! Built so far, all pure: [`plan`] makes the trials (each pod's name and workload
//! arguments, which `Backend::launch_pods` launches), and [`record`] makes what a trial
//! comes to (the victim's latency, SLO attainment and inflation against the victim
//! alone, who survived), and [`matrix`] the isolation matrix of a run's records.
//! [`runner`] drives trials through any backend (I/O). The `isolation` command (flags,
//! run directory, resume), the matrix in the HTML report with a victim-latency chart,
//! and the Kubernetes backend's per-pod launches come next; `make fault-check` is the
//! hand-run check of the fault scenario meanwhile.

pub mod command;
pub mod matrix;
pub mod plan;
pub mod record;
pub mod runner;
#[cfg(test)]
mod runner_tests;
