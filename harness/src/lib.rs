//! gpushare-bench: switches a GPU node between sharing strategies (exclusive,
//! time-slicing, MPS, MIG), scales an inference workload to 1, 3, 5 and 7 pods, reads
//! their Prometheus latency histograms and reports what sharing costs.
//!
//! One folder per concern. Pure (no I/O): [`config`] (options → validated plan),
//! [`stats`], [`results::record`], [`report`], [`metrics::exposition`],
//! [`metrics::prometheus::query`], [`backend::k8s::objects`], [`backend::local::strategy`],
//! [`sweep::cell`], [`isolation::plan`], [`capacity::search`] and [`capacity::record`].
//! I/O happens in the [`sweep`] runner and the backend sessions ([`backend::local`],
//! [`backend::k8s`]) and the adapters they call ([`metrics`], [`telemetry`],
//! [`results::store`]). A module uses only its own layer and those below, bottom to top:
//! `error`/`domain`/`shutdown`/`files`/`clock`/`stats`/`console` → `process` → `metrics` →
//! `telemetry` → `config` → `client` → `results` → `backend` → `sweep` →
//! `capacity`/`isolation`/`equal_load` → `report` → `tools` (docs/architecture.md; held by
//! `harness/tests/layers.rs`).

pub mod backend;
pub mod capacity;
pub mod client;
pub mod clock;
pub mod config;
pub mod console;
pub mod domain;
pub mod equal_load;
pub mod error;
pub mod files;
pub mod isolation;
pub mod metrics;
pub mod process;
pub mod report;
pub mod results;
pub mod shutdown;
pub mod stats;
pub mod sweep;
pub mod telemetry;
pub mod tools;

pub use error::{BenchError, Result};
