//! Isolation (issue 14): what one misbehaving pod does to its neighbours under each
//! strategy. A victim serves an open-loop load; aggressors load the GPU, take its
//! memory, fault (`gpushare-workload --inject-fault-after`) or are killed. [`plan`]
//! makes the trials (pure). The runner that launches them through the sweep's backends,
//! the records and the report's isolation matrix come next; `make fault-check` is the
//! hand-run check of the fault scenario meanwhile.

pub mod plan;
