//! Criterion benches of our kernels: the CPU reference (runs anywhere) and, on a machine
//! with an NVIDIA GPU, the GPU kernels at the YOLOS-small shape — throughput shown as
//! FLOP/s ("elem/s" = FLOP/s) for products and attention, bytes/s for layer norm.
//! Without a GPU the GPU group says so and measures nothing.

use criterion::{Criterion, criterion_group, criterion_main};
use gpushare_workload::cpu::ops;
use gpushare_workload::rng::SplitMix64;
use gpushare_workload::weights::{LayerNormParams, Linear, Tensor};

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| r.next_signed()).collect()
}

fn bench_cpu(c: &mut Criterion) {
    let (rows, h) = (128, 384);
    let x = random(rows * h, 1);
    let layer = Linear {
        weight: Tensor {
            shape: vec![h, h],
            data: random(h * h, 2),
        },
        bias: Tensor {
            shape: vec![h],
            data: random(h, 3),
        },
    };
    let mut out = vec![0.0; rows * h];
    c.bench_function("cpu linear 128x384x384", |b| {
        b.iter(|| ops::linear(&x, rows, &layer, &mut out))
    });

    let ln = LayerNormParams {
        gamma: Tensor {
            shape: vec![h],
            data: random(h, 4),
        },
        beta: Tensor {
            shape: vec![h],
            data: random(h, 5),
        },
    };
    let mut resid = x.clone();
    c.bench_function("cpu add_layer_norm 128x384", |b| {
        b.iter(|| ops::add_layer_norm(&mut resid, Some(&x), h, &ln, 1e-12, false, &mut out))
    });

    let (seq, heads, d) = (128, 6, 64);
    let qkv = random(seq * 3 * heads * d, 6);
    let mut attn = vec![0.0; seq * heads * d];
    c.bench_function("cpu attention 128 tokens 6x64", |b| {
        b.iter(|| ops::attention(&qkv, 1, seq, heads, d, None, &mut attn))
    });
}

#[cfg(feature = "cuda")]
fn bench_gpu(c: &mut Criterion) {
    use criterion::Throughput;
    use gpushare_workload::config::Precision;
    use gpushare_workload::cuda::CudaRuntime;
    use gpushare_workload::cuda::gemm::{Epilogue, GemmShape};
    use gpushare_workload::cuda::kernels::{AttentionMath, Dtype};

    let mut rt = match CudaRuntime::new(0) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("GPU benches skipped: {e}");
            return;
        }
    };
    let (seq, heads, d) = (3401usize, 6usize, 64usize);
    let h = heads * d;
    let up = |rt: &CudaRuntime, n: usize, dt: Dtype, seed: u64| {
        let v = random(n, seed);
        match dt {
            Dtype::F32 => rt.gpu().upload_f32(&v, "bench"),
            Dtype::Bf16 => rt.gpu().upload_bf16(&v, "bench"),
        }
        .expect("upload")
    };
    let mut g = c.benchmark_group("gpu");
    g.sample_size(30);
    for (math, dt, name) in [
        (AttentionMath::Bf16, Dtype::Bf16, "bf16"),
        (AttentionMath::Bf16Mma, Dtype::Bf16, "bf16 mma.sync"),
        (AttentionMath::Tf32, Dtype::F32, "tf32"),
        (AttentionMath::Tf32Mma, Dtype::F32, "tf32 mma.sync"),
        (AttentionMath::F32, Dtype::F32, "f32"),
    ] {
        let qkv = up(&rt, seq * 3 * h, dt, 1);
        let out = up(&rt, seq * h, dt, 2);
        let mut step = rt
            .attention("bench", math, &qkv, &out, None, 1, seq, heads, d)
            .expect("step");
        g.throughput(Throughput::Elements(step.flops as u64));
        let kernel = rt.attention_kernel(math, d).entry();
        g.bench_function(
            format!("attention {name} ({kernel}) 3401 tokens 6x64 (elem = FLOP)"),
            |b| {
                b.iter(|| {
                    rt.run(&mut step).expect("launch");
                    rt.gpu().synchronize().expect("sync");
                })
            },
        );
        // The kernel's own time: launches back to back and one synchronize per sample, so
        // each launch's latency hides behind the kernel before it, as inside the model's
        // CUDA graph. The bench above counts launch and synchronize too.
        g.bench_function(
            format!("attention {name} ({kernel}) 3401 tokens 6x64 back-to-back (elem = FLOP)"),
            |b| {
                b.iter_custom(|iters| {
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        rt.run(&mut step).expect("launch");
                    }
                    rt.gpu().synchronize().expect("sync");
                    start.elapsed()
                })
            },
        );
    }
    for (precision, dt) in [(Precision::Bf16, Dtype::Bf16), (Precision::Tf32, Dtype::F32)] {
        let shape = GemmShape {
            rows: seq,
            out: 4 * h,
            inp: h,
        };
        let (w, bias, x, y) = (
            up(&rt, shape.out * shape.inp, dt, 3),
            up(&rt, shape.out, dt, 4),
            up(&rt, seq * h, dt, 5),
            up(&rt, seq * shape.out, dt, 6),
        );
        let mut step = rt
            .linear("bench", precision, &w, &bias, &x, &y, shape, Epilogue::BiasGelu)
            .expect("step");
        rt.run(&mut step).expect("tune");
        g.throughput(Throughput::Elements(shape.flops() as u64));
        g.bench_function(format!("fc1 {precision} 3401x1536x384 bias+gelu (elem = FLOP)"), |b| {
            b.iter(|| {
                rt.run(&mut step).expect("launch");
                rt.gpu().synchronize().expect("sync");
            })
        });
    }
    for dt in [Dtype::Bf16, Dtype::F32] {
        let (resid, delta, out) = (
            up(&rt, seq * h, Dtype::F32, 7),
            up(&rt, seq * h, dt, 8),
            up(&rt, seq * h, dt, 9),
        );
        let (gamma, beta) = (up(&rt, h, Dtype::F32, 10), up(&rt, h, Dtype::F32, 11));
        let mut step = rt
            .add_layer_norm(
                "bench",
                dt,
                &resid,
                Some(&delta),
                &gamma,
                &beta,
                &out,
                seq,
                h,
                1e-12,
                false,
            )
            .expect("step");
        // Reads the residual and the delta, writes the residual and the output.
        g.throughput(Throughput::Bytes((seq * h * (4 + dt.size() + 4 + dt.size())) as u64));
        g.bench_function(format!("add_layernorm {dt:?} 3401x384"), |b| {
            b.iter(|| {
                rt.run(&mut step).expect("launch");
                rt.gpu().synchronize().expect("sync");
            })
        });
    }
    g.finish();
}

#[cfg(not(feature = "cuda"))]
fn bench_gpu(_: &mut Criterion) {}

criterion_group!(benches, bench_cpu, bench_gpu);
criterion_main!(benches);
