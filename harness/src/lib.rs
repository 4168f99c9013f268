//! gpushare-bench: switches a GPU node between sharing strategies (exclusive,
//! time-slicing, MPS, MIG), scales an inference workload to 1, 3, 5 and 7 pods, reads
//! their Prometheus latency histograms and reports what sharing costs.
//!
//! Pure core, thin shell: planning (`plan`, `strategy`), parsing (`promtext`) and
//! statistics (`stats`) are pure and unit-tested; processes (`local`, `mps`), HTTP
//! (`scrape`) and NVML (`gpu`) sit in small adapter modules driven by `sweep`.

pub mod backend;
pub mod cli;
pub mod doctor;
pub mod domain;
pub mod error;
pub mod gpu;
pub mod k8s;
pub mod local;
pub mod measure;
pub mod mps;
pub mod overhead;
pub mod plan;
pub mod progress;
pub mod prometheus;
pub mod promql;
pub mod promtext;
pub mod record;
pub mod report;
pub mod scrape;
pub mod stats;
pub mod store;
pub mod strategy;
pub mod sweep;

pub use error::{BenchError, Result};
