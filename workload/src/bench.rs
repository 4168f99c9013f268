//! `gpushare-workload bench`: latency, throughput and TFLOP/s per model and precision,
//! measured the way the served workload runs (one inference = forward pass + copy of the
//! output to the host), and on the GPU the time split per kernel category.

use std::io::Write;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::{Engine, ModelPlan};
use crate::cli::BenchArgs;
use crate::config::{Device, Precision};
use crate::error::{Result, WorkloadError};

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRecord {
    /// Model preset.
    pub model: String,
    /// cuda or cpu.
    pub device: String,
    /// GPU or CPU name.
    pub device_name: String,
    /// Arithmetic precision.
    pub precision: String,
    /// Samples per inference.
    pub batch: usize,
    /// Whether the pass was replayed as a CUDA graph.
    pub cuda_graph: bool,
    /// Timed inferences.
    pub iters: usize,
    /// Mean milliseconds per inference.
    pub mean_ms: f64,
    /// Median milliseconds.
    pub p50_ms: f64,
    /// 99th percentile milliseconds (nearest rank).
    pub p99_ms: f64,
    /// Inferences per second (1 / mean).
    pub inferences_per_s: f64,
    /// Model FLOPs per inference / mean time.
    pub tflops: f64,
    /// Milliseconds per pass by kernel category (GPU, --split), e.g. ("attention", 0.8).
    pub split_ms: Vec<(String, f64)>,
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Measures one configuration.
pub fn measure(plan: &ModelPlan, warmup: usize, iters: usize, split: bool) -> Result<BenchRecord> {
    let mut engine = Engine::build(plan)?;
    for _ in 0..warmup {
        engine.infer()?;
    }
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        engine.infer()?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    times.sort_by(f64::total_cmp);
    let split_ms = if split { split_times(&mut engine)? } else { Vec::new() };
    Ok(BenchRecord {
        model: plan.preset.name().into(),
        device: plan.device.name().into(),
        device_name: engine.info().name.clone(),
        precision: plan.precision.name().into(),
        batch: plan.batch,
        cuda_graph: plan.device == Device::Cuda && plan.use_graph,
        iters,
        mean_ms: mean,
        p50_ms: percentile(&times, 0.5),
        p99_ms: percentile(&times, 0.99),
        inferences_per_s: 1e3 / mean,
        tflops: engine.flops() / (mean / 1e3) / 1e12,
        split_ms,
    })
}

#[cfg(feature = "cuda")]
fn split_times(engine: &mut Engine) -> Result<Vec<(String, f64)>> {
    let Engine::Cuda { model, .. } = engine else {
        return Ok(Vec::new());
    };
    let steps = model.time_steps(20)?;
    let mut by_kind: std::collections::BTreeMap<crate::cuda::StepKind, (Duration, f64)> = Default::default();
    for s in &steps {
        let e = by_kind.entry(s.kind).or_default();
        e.0 += s.time;
        e.1 += s.flops;
    }
    let total: Duration = steps.iter().map(|s| s.time).sum();
    let mut out: Vec<(String, f64)> = by_kind
        .iter()
        .map(|(k, (t, _))| (k.name().to_string(), t.as_secs_f64() * 1e3))
        .collect();
    out.push(("sum of kernels".into(), total.as_secs_f64() * 1e3));
    for (k, (t, flops)) in &by_kind {
        if *flops > 0.0 {
            out.push((format!("{} TFLOP/s", k.name()), flops / t.as_secs_f64() / 1e12));
        }
    }
    Ok(out)
}

#[cfg(not(feature = "cuda"))]
fn split_times(_engine: &mut Engine) -> Result<Vec<(String, f64)>> {
    Ok(Vec::new())
}

/// Runs every requested configuration and prints a table (and JSON lines on request).
pub fn run(args: &BenchArgs) -> Result<()> {
    let device = args.device.0;
    let precisions: Vec<Precision> = if args.precisions.is_empty() {
        match device {
            Device::Cuda => Precision::ALL.to_vec(),
            Device::Cpu => vec![Precision::Fp32],
        }
    } else {
        args.precisions.iter().map(|p| p.0).collect()
    };
    if args.iters == 0 {
        return Err(WorkloadError::BadArgument("--iters must be at least 1".into()));
    }
    let mut json = match &args.json {
        Some(path) => Some(std::fs::File::create(path).map_err(|source| WorkloadError::Io {
            what: format!("creating {}", path.display()),
            source,
        })?),
        None => None,
    };
    println!(
        "{:<12} {:<5} {:<5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>8}  device",
        "model", "dev", "prec", "batch", "mean_ms", "p50_ms", "p99_ms", "inf/s", "TFLOP/s"
    );
    for model in &args.models {
        for &precision in &precisions {
            let plan = ModelPlan {
                preset: model.0,
                device,
                precision,
                batch: args.batch,
                weights: if model.0 == crate::config::Preset::MiniLmL6 {
                    args.weights.clone()
                } else {
                    None
                },
                seed: crate::backend::DEFAULT_SEED,
                reserve_bytes: 0,
                use_graph: !args.no_graph,
            };
            let r = measure(&plan, args.warmup, args.iters, args.split)?;
            println!(
                "{:<12} {:<5} {:<5} {:>5} {:>9.3} {:>9.3} {:>9.3} {:>9.1} {:>8.1}  {}",
                r.model,
                r.device,
                r.precision,
                r.batch,
                r.mean_ms,
                r.p50_ms,
                r.p99_ms,
                r.inferences_per_s,
                r.tflops,
                r.device_name
            );
            for (k, v) in &r.split_ms {
                println!("    {k:<24} {v:>9.3}");
            }
            if let Some(f) = json.as_mut() {
                let line = serde_json::to_string(&r).unwrap_or_default();
                writeln!(f, "{line}").map_err(|source| WorkloadError::Io {
                    what: "writing bench results".into(),
                    source,
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
    }
}
