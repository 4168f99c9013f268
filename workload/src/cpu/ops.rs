//! CPU kernels: the plain-Rust reference that every GPU kernel is tested against.
//!
//! Row-major f32 slices; shapes are passed explicitly. Accumulation is f32 except where
//! a comment says otherwise.

use crate::config::VisionShape;
use crate::weights::{LayerNormParams, Linear};

/// `out[r, n] = Σ_k x[r, k] · w[n, k] + b[n]` for `rows` rows (a PyTorch `Linear`).
pub fn linear(x: &[f32], rows: usize, layer: &Linear, out: &mut [f32]) {
    let (n_out, k) = (layer.out_features(), layer.in_features());
    debug_assert_eq!(x.len(), rows * k);
    debug_assert_eq!(out.len(), rows * n_out);
    let w = &layer.weight.data;
    let b = &layer.bias.data;
    for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(n_out)) {
        for (n, o) in or.iter_mut().enumerate() {
            *o = dot(xr, &w[n * k..(n + 1) * k]) + b[n];
        }
    }
}

/// Dot product with eight independent partial sums (vectorises, and sums in a fixed
/// order so results do not depend on the build).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for i in 0..chunks {
        for l in 0..8 {
            acc[l] += a[i * 8 + l] * b[i * 8 + l];
        }
    }
    let mut tail = 0.0;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Layer norm of one row: `(x - mean) / sqrt(var + eps) · γ + β`, biased variance as
/// PyTorch computes it; two passes over the row for accuracy.
pub fn layer_norm_row(x: &[f32], ln: &LayerNormParams, eps: f32, out: &mut [f32]) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for (((o, v), g), b) in out.iter_mut().zip(x).zip(&ln.gamma.data).zip(&ln.beta.data) {
        *o = (v - mean) * inv * g + b;
    }
}

/// The residual step shared by both norm placements, row by row:
/// `v = resid + delta`; `normed = LN(v)`; `resid = if post { normed } else { v }`;
/// `out = normed`. Pre-norm layers keep the un-normalised sum as the residual stream,
/// post-norm (BERT) layers carry the normalised one.
pub fn add_layer_norm(
    resid: &mut [f32],
    delta: Option<&[f32]>,
    cols: usize,
    ln: &LayerNormParams,
    eps: f32,
    post: bool,
    out: &mut [f32],
) {
    let mut row = vec![0.0f32; cols];
    for (r, (res, o)) in resid.chunks_exact_mut(cols).zip(out.chunks_exact_mut(cols)).enumerate() {
        match delta {
            Some(d) => {
                for ((v, a), b) in row.iter_mut().zip(res.iter()).zip(&d[r * cols..(r + 1) * cols]) {
                    *v = a + b;
                }
            }
            None => row.copy_from_slice(res),
        }
        layer_norm_row(&row, ln, eps, o);
        if post {
            res.copy_from_slice(o);
        } else {
            res.copy_from_slice(&row);
        }
    }
}

/// Exact GELU, `x · Φ(x) = ½x(1 + erf(x/√2))` (BERT's and ViT's "gelu").
pub fn gelu(x: f32) -> f32 {
    (0.5 * x as f64 * (1.0 + libm::erf(x as f64 / std::f64::consts::SQRT_2))) as f32
}

/// Logistic sigmoid.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// In-place softmax of one row, max-subtracted.
pub fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in row.iter_mut() {
        *v /= sum;
    }
}

/// Multi-head self-attention over a fused `[batch·seq, 3H]` QKV matrix (per row: all
/// query heads, then key heads, then value heads), writing `[batch·seq, H]`.
/// Keys at positions `≥ valid[b]` are masked out (BERT padding); `valid = None` keeps all.
pub fn attention(
    qkv: &[f32],
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    valid: Option<&[i32]>,
    out: &mut [f32],
) {
    attention_rows(qkv, seq, heads, head_dim, valid, 0..batch * seq, out);
}

/// [`attention`] for the query rows `rows` (global row indices) only, writing their
/// outputs to `out` (`rows.len() × H`): rows are independent, so callers may split
/// them across threads.
pub fn attention_rows(
    qkv: &[f32],
    seq: usize,
    heads: usize,
    head_dim: usize,
    valid: Option<&[i32]>,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let hidden = heads * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut scores = vec![0.0f32; seq];
    for (r, o_row) in rows.zip(out.chunks_exact_mut(hidden)) {
        let (b, i) = (r / seq, r % seq);
        let keys = valid.map_or(seq, |v| v[b] as usize);
        let base = b * seq;
        for h in 0..heads {
            let q = &qkv[(base + i) * 3 * hidden + h * head_dim..][..head_dim];
            for (j, s) in scores[..keys].iter_mut().enumerate() {
                let k = &qkv[(base + j) * 3 * hidden + hidden + h * head_dim..][..head_dim];
                *s = dot(q, k) * scale;
            }
            softmax(&mut scores[..keys]);
            let o = &mut o_row[h * head_dim..][..head_dim];
            o.fill(0.0);
            for (j, p) in scores[..keys].iter().enumerate() {
                let v = &qkv[(base + j) * 3 * hidden + 2 * hidden + h * head_dim..][..head_dim];
                for (od, vd) in o.iter_mut().zip(v) {
                    *od += p * vd;
                }
            }
        }
    }
}

/// Cuts images `[batch, C, H, W]` into flattened patches `[batch·P, C·p·p]`, patches in
/// row-major order and values in `(channel, y, x)` order: the layout that makes the
/// stride-`p` convolution one matrix product with its `[H, C, p, p]` weight.
pub fn im2col(pixels: &[f32], shape: &VisionShape, batch: usize, out: &mut [f32]) {
    let (c, ih, iw, p) = (shape.channels, shape.image_h, shape.image_w, shape.patch);
    let (ph, pw) = (shape.patches_h(), shape.patches_w());
    let dim = shape.patch_dim();
    for b in 0..batch {
        for py in 0..ph {
            for px in 0..pw {
                let row = &mut out[((b * ph + py) * pw + px) * dim..][..dim];
                for ch in 0..c {
                    for y in 0..p {
                        let src = ((b * c + ch) * ih + py * p + y) * iw + px * p;
                        row[(ch * p + y) * p..][..p].copy_from_slice(&pixels[src..src + p]);
                    }
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
/// YOLOS token assembly: `[CLS] + pos₀`, `patchᵢ + pos₁₊ᵢ`, `detⱼ + pos₁₊P₊ⱼ` per image.
pub fn assemble_vision(
    patch_out: &[f32],
    cls: &[f32],
    det: &[f32],
    pos: &[f32],
    shape: &VisionShape,
    batch: usize,
    hidden: usize,
    out: &mut [f32],
) {
    let (np, t) = (shape.patches(), shape.tokens());
    for b in 0..batch {
        for tok in 0..t {
            let src: &[f32] = if tok == 0 {
                cls
            } else if tok <= np {
                &patch_out[(b * np + tok - 1) * hidden..][..hidden]
            } else {
                &det[(tok - 1 - np) * hidden..][..hidden]
            };
            let o = &mut out[(b * t + tok) * hidden..][..hidden];
            for ((o, s), p) in o.iter_mut().zip(src).zip(&pos[tok * hidden..][..hidden]) {
                *o = s + p;
            }
        }
    }
}

/// BERT embeddings before their layer norm: `word[id] + pos[position] + type[0]`.
pub fn embed_text(
    ids: &[i32],
    seq: usize,
    word: &[f32],
    pos: &[f32],
    token_type: &[f32],
    hidden: usize,
    out: &mut [f32],
) {
    for (t, id) in ids.iter().enumerate() {
        let w = &word[*id as usize * hidden..][..hidden];
        let p = &pos[(t % seq) * hidden..][..hidden];
        for (d, o) in out[t * hidden..][..hidden].iter_mut().enumerate() {
            *o = w[d] + p[d] + token_type[d];
        }
    }
}

/// Sentence embeddings: mean over the first `lens[b]` tokens, then L2-normalised
/// (sentence-transformers' Pooling(mean) + Normalize). Sums in f64.
pub fn mean_pool_normalize(x: &[f32], batch: usize, seq: usize, lens: &[i32], hidden: usize, out: &mut [f32]) {
    for b in 0..batch {
        let n = lens[b] as usize;
        let mut acc = vec![0.0f64; hidden];
        for t in 0..n {
            for (a, v) in acc.iter_mut().zip(&x[(b * seq + t) * hidden..][..hidden]) {
                *a += *v as f64;
            }
        }
        let norm = acc
            .iter()
            .map(|a| (a / n as f64).powi(2))
            .sum::<f64>()
            .sqrt()
            .max(1e-12);
        for (o, a) in out[b * hidden..][..hidden].iter_mut().zip(&acc) {
            *o = (a / n as f64 / norm) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::Tensor;

    fn ln(gamma: Vec<f32>, beta: Vec<f32>) -> LayerNormParams {
        LayerNormParams {
            gamma: Tensor {
                shape: vec![gamma.len()],
                data: gamma,
            },
            beta: Tensor {
                shape: vec![beta.len()],
                data: beta,
            },
        }
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol, "index {i}: {x} vs {y}");
        }
    }

    #[test]
    fn layer_norm_by_hand() {
        // x = [1, 2, 3, 4]: mean 2.5, biased variance 1.25, 1/sqrt(1.25) = 0.894427.
        let mut out = [0.0; 4];
        layer_norm_row(
            &[1.0, 2.0, 3.0, 4.0],
            &ln(vec![1.0, 2.0, 1.0, 1.0], vec![0.0, 0.0, 0.5, 0.0]),
            0.0,
            &mut out,
        );
        close(&out, &[-1.341641, -0.894427, 0.947214, 1.341641], 1e-6);
    }

    #[test]
    fn softmax_by_hand() {
        // exp([0, ln 2, ln 5]) = [1, 2, 5] → /8.
        let mut row = [0.0, 2f32.ln(), 5f32.ln()];
        softmax(&mut row);
        close(&row, &[0.125, 0.25, 0.625], 1e-7);
        // Large values must not overflow.
        let mut big = [1000.0, 1000.0];
        softmax(&mut big);
        close(&big, &[0.5, 0.5], 0.0);
    }

    #[test]
    fn gelu_by_hand() {
        // Φ(1) = 0.8413447, Φ(-2) = 0.0227501.
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu(-2.0) + 0.045_500_26).abs() < 1e-6);
        assert_eq!(gelu(0.0), 0.0);
    }

    #[test]
    fn attention_by_hand() {
        // One head of width 2, two tokens. q0 = [1, 0], k0 = [1, 0], k1 = [0, 1];
        // scores for token 0: [1, 0]/√2 → softmax [0.669762, 0.330238];
        // v0 = [1, 2], v1 = [3, 4] → out0 = [1.660477, 2.660477].
        // Token 1 has q1 = [0, 0]: uniform weights → [2, 3].
        let qkv = [
            1.0, 0.0, 1.0, 0.0, 1.0, 2.0, //
            0.0, 0.0, 0.0, 1.0, 3.0, 4.0,
        ];
        let mut out = [0.0; 4];
        attention(&qkv, 1, 2, 1, 2, None, &mut out);
        close(&out, &[1.660_477, 2.660_477, 2.0, 3.0], 1e-5);
        // Masking the second key leaves only v0.
        attention(&qkv, 1, 2, 1, 2, Some(&[1]), &mut out);
        close(&out, &[1.0, 2.0, 1.0, 2.0], 0.0);
    }

    #[test]
    fn add_layer_norm_keeps_the_right_residual() {
        let params = ln(vec![1.0, 1.0], vec![0.0, 0.0]);
        let mut resid = [1.0, 3.0];
        let mut out = [0.0; 2];
        add_layer_norm(&mut resid, Some(&[1.0, 1.0]), 2, &params, 0.0, false, &mut out);
        close(&resid, &[2.0, 4.0], 0.0);
        close(&out, &[-1.0, 1.0], 1e-6);
        add_layer_norm(&mut resid, None, 2, &params, 0.0, true, &mut out);
        close(&resid, &[-1.0, 1.0], 1e-6);
    }

    #[test]
    fn im2col_orders_channel_row_column() {
        // One 2-channel 2×4 image, patch 2 → two patches of 8 values.
        let shape = VisionShape {
            channels: 2,
            image_h: 2,
            image_w: 4,
            patch: 2,
            det_tokens: 0,
            classes: 1,
        };
        let pixels: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let mut out = vec![0.0; 16];
        im2col(&pixels, &shape, 1, &mut out);
        assert_eq!(&out[..8], &[0.0, 1.0, 4.0, 5.0, 8.0, 9.0, 12.0, 13.0]);
        assert_eq!(&out[8..], &[2.0, 3.0, 6.0, 7.0, 10.0, 11.0, 14.0, 15.0]);
    }

    #[test]
    fn mean_pool_ignores_padding_and_normalises() {
        // Tokens [3, 4] and [100, 100] (padding): mean [3, 4], norm 5.
        let x = [3.0, 4.0, 100.0, 100.0];
        let mut out = [0.0; 2];
        mean_pool_normalize(&x, 1, 2, &[1], 2, &mut out);
        close(&out, &[0.6, 0.8], 1e-7);
    }

    #[test]
    fn linear_by_hand() {
        let layer = Linear {
            weight: Tensor {
                shape: vec![2, 3],
                data: vec![1.0, 0.0, -1.0, 0.5, 0.5, 0.5],
            },
            bias: Tensor {
                shape: vec![2],
                data: vec![0.25, -1.0],
            },
        };
        let mut out = [0.0; 4];
        linear(&[1.0, 2.0, 3.0, -2.0, 0.0, 4.0], 2, &layer, &mut out);
        close(&out, &[-1.75, 2.0, -5.75, 0.0], 0.0);
    }
}
