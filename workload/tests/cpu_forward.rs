//! The CPU backend's whole `tiny` forward pass against an independent, deliberately
//! naive version written here in f64: a direct convolution instead of im2col, separate
//! Q/K/V products per head, explicit softmax, no fused residual/norm step.

// Index loops on purpose: the naive version should read like the formulas.
#![allow(clippy::needless_range_loop)]

use gpushare_workload::config::{Embedding, Preset};
use gpushare_workload::cpu::CpuModel;
use gpushare_workload::input::InputBatch;
use gpushare_workload::weights::{EmbeddingWeights, HeadWeights, LayerNormParams, Linear, ModelWeights};

fn lin(x: &[f64], l: &Linear) -> Vec<f64> {
    let (n, k) = (l.weight.shape[0], l.weight.shape[1]);
    (0..n)
        .map(|o| l.bias.data[o] as f64 + (0..k).map(|i| x[i] * l.weight.data[o * k + i] as f64).sum::<f64>())
        .collect()
}

fn norm(x: &[f64], p: &LayerNormParams, eps: f64) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    x.iter()
        .enumerate()
        .map(|(i, v)| (v - mean) / (var + eps).sqrt() * p.gamma.data[i] as f64 + p.beta.data[i] as f64)
        .collect()
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn naive_vit(w: &ModelWeights, pixels: &[f32], batch: usize) -> Vec<f64> {
    let c = &w.config;
    let Embedding::Vision(v) = c.embedding else {
        panic!("vision model")
    };
    let EmbeddingWeights::Vision { patch, cls, det, pos } = &w.embedding else {
        panic!("vision weights")
    };
    let HeadWeights::Vision { final_ln, class, bbox } = &w.head else {
        panic!("vision head")
    };
    let (h, heads, hd) = (c.hidden, c.heads, c.head_dim());
    let eps = c.layer_norm_eps as f64;
    let mut out = Vec::new();
    for b in 0..batch {
        // Tokens: [CLS], patches by direct convolution, detection tokens; plus positions.
        let mut x: Vec<Vec<f64>> = vec![cls.data.iter().map(|&v| v as f64).collect()];
        for py in 0..v.patches_h() {
            for px in 0..v.patches_w() {
                let mut t = vec![0.0; h];
                for (o, slot) in t.iter_mut().enumerate() {
                    let mut acc = patch.bias.data[o] as f64;
                    for ch in 0..v.channels {
                        for ky in 0..v.patch {
                            for kx in 0..v.patch {
                                let pix = pixels[((b * v.channels + ch) * v.image_h + py * v.patch + ky) * v.image_w
                                    + px * v.patch
                                    + kx];
                                let wgt = patch.weight.data[o * v.patch_dim() + (ch * v.patch + ky) * v.patch + kx];
                                acc += pix as f64 * wgt as f64;
                            }
                        }
                    }
                    *slot = acc;
                }
                x.push(t);
            }
        }
        for d in 0..v.det_tokens {
            x.push(det.data[d * h..(d + 1) * h].iter().map(|&v| v as f64).collect());
        }
        for (t, row) in x.iter_mut().enumerate() {
            for (i, val) in row.iter_mut().enumerate() {
                *val += pos.data[t * h + i] as f64;
            }
        }
        let n = x.len();
        for layer in &w.layers {
            let a: Vec<Vec<f64>> = x.iter().map(|r| norm(r, &layer.ln1, eps)).collect();
            let qkv: Vec<Vec<f64>> = a.iter().map(|r| lin(r, &layer.qkv)).collect();
            let mut attn = vec![vec![0.0; h]; n];
            for head in 0..heads {
                let q = |t: usize, d: usize| qkv[t][head * hd + d];
                let k = |t: usize, d: usize| qkv[t][h + head * hd + d];
                let val = |t: usize, d: usize| qkv[t][2 * h + head * hd + d];
                for i in 0..n {
                    let scores: Vec<f64> = (0..n)
                        .map(|j| (0..hd).map(|d| q(i, d) * k(j, d)).sum::<f64>() / (hd as f64).sqrt())
                        .collect();
                    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hd {
                        attn[i][head * hd + d] = (0..n).map(|j| e[j] / z * val(j, d)).sum();
                    }
                }
            }
            for i in 0..n {
                let p = lin(&attn[i], &layer.out);
                for (xv, pv) in x[i].iter_mut().zip(p) {
                    *xv += pv;
                }
                let hmid: Vec<f64> = lin(&norm(&x[i], &layer.ln2, eps), &layer.fc1)
                    .into_iter()
                    .map(gelu)
                    .collect();
                for (xv, pv) in x[i].iter_mut().zip(lin(&hmid, &layer.fc2)) {
                    *xv += pv;
                }
            }
        }
        for t in 1 + v.patches()..n {
            let f = norm(&x[t], final_ln, eps);
            let mlp = |m: &[Linear; 3]| {
                let r1: Vec<f64> = lin(&f, &m[0]).into_iter().map(|v| v.max(0.0)).collect();
                let r2: Vec<f64> = lin(&r1, &m[1]).into_iter().map(|v| v.max(0.0)).collect();
                lin(&r2, &m[2])
            };
            out.extend(mlp(class));
            out.extend(mlp(bbox).into_iter().map(|v| 1.0 / (1.0 + (-v).exp())));
        }
    }
    out
}

#[test]
fn tiny_forward_matches_an_independent_naive_version() {
    let c = Preset::Tiny.config();
    let Embedding::Vision(v) = c.embedding else {
        panic!("vision")
    };
    for (batch, seed) in [(1, 11), (2, 12)] {
        let weights = ModelWeights::seeded(&c, seed);
        let InputBatch::Images { pixels, .. } = InputBatch::sample_images(&v, batch, seed + 100) else {
            panic!("images")
        };
        let input = InputBatch::Images {
            batch,
            pixels: pixels.clone(),
        };
        let ours = CpuModel::new(weights.clone()).forward(&input).expect("forward");
        let naive = naive_vit(&weights, &pixels, batch);
        assert_eq!(ours.len(), naive.len());
        assert_eq!(ours.len(), batch * v.det_tokens * (v.classes + 4));
        let max_err = ours
            .iter()
            .zip(&naive)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0.0, f64::max);
        let spread = naive.iter().map(|v| v.abs()).fold(0.0, f64::max);
        assert!(spread > 0.1, "outputs should not be trivially small: {spread}");
        assert!(max_err <= 1e-4, "batch {batch}: max abs error {max_err:e}");
    }
}

#[test]
fn the_batch_dimension_does_not_mix_samples() {
    let c = Preset::Tiny.config();
    let Embedding::Vision(v) = c.embedding else {
        panic!("vision")
    };
    let w = ModelWeights::seeded(&c, 3);
    let m = CpuModel::new(w);
    let InputBatch::Images { pixels: two, .. } = InputBatch::sample_images(&v, 2, 4) else {
        panic!()
    };
    let per_image = v.channels * v.image_h * v.image_w;
    let both = m
        .forward(&InputBatch::Images {
            batch: 2,
            pixels: two.clone(),
        })
        .expect("forward");
    let second = m
        .forward(&InputBatch::Images {
            batch: 1,
            pixels: two[per_image..].to_vec(),
        })
        .expect("forward");
    assert_eq!(&both[both.len() / 2..], &second[..]);
}

#[test]
fn threads_do_not_change_the_result() {
    let c = Preset::Tiny.config();
    let Embedding::Vision(v) = c.embedding else {
        panic!("vision")
    };
    let w = ModelWeights::seeded(&c, 8);
    let input = InputBatch::sample_images(&v, 3, 9);
    let one = CpuModel::new(w.clone()).forward(&input).expect("forward");
    let four = CpuModel::new(w).with_threads(4).forward(&input).expect("forward");
    assert_eq!(one, four);
}
