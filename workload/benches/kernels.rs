//! Criterion benches of the CPU kernels (run anywhere). GPU kernel timings come from
//! `gpushare-workload bench --split` (`make bench-workload`).

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

criterion_group!(benches, bench_cpu);
criterion_main!(benches);
