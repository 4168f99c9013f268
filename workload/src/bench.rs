//! `gpushare-workload bench`: latency, throughput and TFLOP/s per model and precision,
//! measured the way the served workload runs (one inference = forward pass + copy of the
//! output to the host), and on the GPU the time split per kernel category.

use std::io::Write;
use std::time::Instant;

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
    /// Milliseconds per pass by kernel category and by product site, with TFLOP/s (GPU,
    /// --split), e.g. ("attention", 0.8): see [`split_table`].
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

/// One step's share of a pass, as the split table sums it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepShare {
    /// The step's name, e.g. `layer3.fc1` (site `fc1`) or `head.0` (its own site).
    pub name: String,
    /// Its category, e.g. `gemm`.
    pub kind: &'static str,
    /// Milliseconds per run.
    pub ms: f64,
    /// Floating-point operations per run (0 where not counted).
    pub flops: f64,
}

/// The split table: milliseconds per category (in category order), their sum, TFLOP/s per
/// category that counts FLOPs, then each product site over all layers (`gemm fc1`: every
/// `layerN.fc1` together; a step outside the layers is a site of its own), in order of
/// first appearance, with its TFLOP/s.
pub fn split_table(steps: &[StepShare]) -> Vec<(String, f64)> {
    // (name, ms, flops), in order of first appearance.
    fn add(groups: &mut Vec<(String, f64, f64)>, name: String, s: &StepShare) {
        match groups.iter_mut().find(|g| g.0 == name) {
            Some(g) => {
                g.1 += s.ms;
                g.2 += s.flops;
            }
            None => groups.push((name, s.ms, s.flops)),
        }
    }
    let (mut kinds, mut sites) = (Vec::new(), Vec::new());
    for s in steps {
        add(&mut kinds, s.kind.to_string(), s);
        if s.kind == "gemm" {
            let site = s
                .name
                .split_once('.')
                .filter(|(layer, _)| layer.strip_prefix("layer").is_some_and(|n| n.parse::<usize>().is_ok()))
                .map_or(s.name.as_str(), |(_, site)| site);
            add(&mut sites, format!("gemm {site}"), s);
        }
    }
    let tflops = |(name, ms, flops): &(String, f64, f64)| {
        (*flops > 0.0 && *ms > 0.0).then(|| (format!("{name} TFLOP/s"), flops / (ms / 1e3) / 1e12))
    };
    let mut out: Vec<(String, f64)> = kinds.iter().map(|(k, ms, _)| (k.clone(), *ms)).collect();
    out.push(("sum of kernels".into(), steps.iter().map(|s| s.ms).sum()));
    out.extend(kinds.iter().filter_map(tflops));
    for site in &sites {
        out.push((site.0.clone(), site.1));
        out.extend(tflops(site));
    }
    out
}

#[cfg(feature = "cuda")]
fn split_times(engine: &mut Engine) -> Result<Vec<(String, f64)>> {
    let Engine::Cuda { model, .. } = engine else {
        return Ok(Vec::new());
    };
    let mut steps = model.time_steps(20)?;
    // Categories in StepKind's order (gemm, attention, layernorm, elementwise); the sort is
    // stable, so each keeps its steps in pass order.
    steps.sort_by_key(|s| s.kind);
    let shares: Vec<_> = steps
        .into_iter()
        .map(|s| StepShare {
            name: s.name,
            kind: s.kind.name(),
            ms: s.time.as_secs_f64() * 1e3,
            flops: s.flops,
        })
        .collect();
    Ok(split_table(&shares))
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

    #[test]
    fn the_split_sums_categories_and_product_sites_over_layers() {
        let step = |name: &str, kind, ms, flops| StepShare {
            name: name.into(),
            kind,
            ms,
            flops,
        };
        let steps = [
            step("layer0.qkv", "gemm", 0.02, 4e9),
            step("layer1.qkv", "gemm", 0.03, 4e9),
            step("layer0.fc1", "gemm", 0.05, 5e9),
            step("patch_embed", "gemm", 0.01, 0.0),
            step("class_head.0", "gemm", 0.002, 1e6),
            step("bbox_head.0", "gemm", 0.003, 1e6),
            step("layer0.attention", "attention", 0.04, 8e9),
            step("layer0.norm1", "layernorm", 0.005, 0.0),
        ];
        let table = split_table(&steps);
        let get = |k: &str| {
            table
                .iter()
                .find(|(name, _)| name == k)
                .unwrap_or_else(|| panic!("no {k} in {table:?}"))
                .1
        };
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-9, "{a} != {b}");
        close(get("attention"), 0.04);
        close(get("gemm"), 0.115);
        close(get("sum of kernels"), 0.16);
        close(get("gemm TFLOP/s"), (13e9 + 2e6) / 0.115e-3 / 1e12);
        close(get("gemm qkv"), 0.05);
        close(get("gemm qkv TFLOP/s"), 8e9 / 0.05e-3 / 1e12);
        close(get("gemm fc1"), 0.05);
        close(get("gemm patch_embed"), 0.01);
        // No FLOPs, no rate; layer norms have no sites.
        assert!(
            table
                .iter()
                .all(|(k, _)| k != "gemm patch_embed TFLOP/s" && k != "layernorm TFLOP/s")
        );
        assert!(
            !table
                .iter()
                .any(|(k, _)| k.starts_with("layernorm ") || k.starts_with("gemm norm"))
        );
        let order: Vec<&str> = table.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            &order[..4],
            ["gemm", "attention", "layernorm", "sum of kernels"],
            "categories first, then their sum"
        );
        let sites: Vec<&str> = order
            .iter()
            .copied()
            .filter(|k| k.starts_with("gemm ") && !k.ends_with("TFLOP/s"))
            .collect();
        // The heads' products keep their whole names: their layer numbers are not layers.
        assert_eq!(
            sites,
            [
                "gemm qkv",
                "gemm fc1",
                "gemm patch_embed",
                "gemm class_head.0",
                "gemm bbox_head.0"
            ]
        );
    }
}
