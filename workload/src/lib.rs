//! `gpushare-workload`: the inference workload that every gpushare-bench experiment runs.
//!
//! A transformer encoder (the reference study's YOLOS-small shape, a real MiniLM-L6
//! sentence encoder, or a tiny model for CPUs and CI) computed by our own kernels: on
//! NVIDIA GPUs through cudarc (cuBLASLt GEMMs with fused epilogues, NVRTC kernels for
//! attention, layer norm and the rest, the whole pass replayed as one CUDA graph), and
//! on the CPU by a plain-Rust reference with the same math.
//!
//! [`decoder`] holds a Llama-style decoder for language-model experiments: its shape,
//! seeded weights and the CPU reference (prefill, decode against a KV cache, greedy).
//!
//! The binary serves Prometheus metrics over HTTP while it runs inferences in a closed
//! or open (Poisson) loop; the metric names are the only contract with the harness.

pub mod backend;
pub mod bench;
pub mod cli;
pub mod config;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod decoder;
pub mod error;
pub mod input;
pub mod load;
pub mod metrics;
pub mod rng;
pub mod serve;
pub mod server;
pub mod size;
pub mod weights;

pub use config::{Device, ModelConfig, Precision, Preset};
pub use error::WorkloadError;
