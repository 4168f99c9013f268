//! Isolation (issue 14): what one misbehaving pod does to its neighbours under each
//! strategy. A victim serves an open-loop load; aggressors load the GPU, take its
//! memory, fault (`gpushare-workload --inject-fault-after`) or are killed.
//!
//! Built so far, all pure: [`plan`] makes the trials (each pod's name and workload
//! arguments, which `Backend::launch_pods` launches), and [`record`] makes what a trial
//! comes to (the victim's latency, SLO attainment and inflation against the victim
//! alone, who survived). The runner that drives trials through the sweep's backends and
//! the report's isolation matrix come next; `make fault-check` is the hand-run check of
//! the fault scenario meanwhile.

pub mod plan;
pub mod record;
