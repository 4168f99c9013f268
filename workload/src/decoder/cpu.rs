//! The decoder on the CPU: the reference its GPU kernels are tested against. Prefill
//! runs a prompt's tokens through every block at once with causal attention and fills
//! the KV cache; each decode step runs one token against the cache. f32 throughout.

use super::{DecoderConfig, DecoderWeights, Matrix};
use crate::cpu::ops::dot;

/// `out[n] = Σ_k x[k] · w[n, k]` (a bias-free `Linear`).
fn matvec(w: &Matrix, x: &[f32], out: &mut [f32]) {
    debug_assert_eq!(x.len(), w.cols);
    debug_assert_eq!(out.len(), w.rows);
    for (n, o) in out.iter_mut().enumerate() {
        *o = dot(w.row(n), x);
    }
}

/// RMSNorm of one row: `x / √(mean(x²) + ε) · g`.
pub fn rms_norm(x: &[f32], gain: &[f32], eps: f32, out: &mut [f32]) {
    let mean_square = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (mean_square + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(gain) {
        *o = v * inv * g;
    }
}

/// Rotary embedding of one head at `pos`, in place: element i (i < d/2) turns with
/// element i + d/2 by the angle pos · θ^(−2i/d).
pub fn rope(head: &mut [f32], pos: usize, theta: f32) {
    let d = head.len();
    let half = d / 2;
    for i in 0..half {
        let freq = theta.powf(-2.0 * i as f32 / d as f32);
        let (sin, cos) = (pos as f32 * freq).sin_cos();
        let (a, b) = (head[i], head[i + half]);
        head[i] = a * cos - b * sin;
        head[i + half] = b * cos + a * sin;
    }
}

/// SiLU: x · σ(x).
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The index of the largest logit (the first of equals): greedy sampling.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Why a request cannot be run (None: it can).
pub fn request_problem(config: &DecoderConfig, cached: usize, tokens: &[u32]) -> Option<String> {
    if tokens.is_empty() {
        return Some("no tokens".into());
    }
    if let Some(t) = tokens.iter().find(|t| **t as usize >= config.vocab) {
        return Some(format!("token {t} is outside the vocabulary of {}", config.vocab));
    }
    if cached + tokens.len() > config.max_len {
        return Some(format!(
            "{} tokens after {cached} cached exceed the longest sequence, {}",
            tokens.len(),
            config.max_len
        ));
    }
    None
}

/// A decoder with its KV cache.
#[derive(Debug, Clone)]
pub struct CpuDecoder {
    w: DecoderWeights,
    /// Per block: keys and values of every position so far, `len × kv_dim` each.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
}

impl CpuDecoder {
    /// A decoder of `w` with an empty cache.
    pub fn new(w: DecoderWeights) -> Self {
        let layers = w.config.layers;
        Self {
            w,
            keys: vec![Vec::new(); layers],
            values: vec![Vec::new(); layers],
            len: 0,
        }
    }

    /// The shape.
    pub fn config(&self) -> &DecoderConfig {
        &self.w.config
    }

    /// Positions in the cache.
    pub fn cached(&self) -> usize {
        self.len
    }

    /// Empties the cache (a new request).
    pub fn reset(&mut self) {
        for k in self.keys.iter_mut().chain(self.values.iter_mut()) {
            k.clear();
        }
        self.len = 0;
    }

    /// Runs `tokens` after what is cached (a prompt's prefill, or one decode step),
    /// adds them to the cache and returns the logits after the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, String> {
        let c = self.w.config;
        if let Some(p) = request_problem(&c, self.len, tokens) {
            return Err(p);
        }
        let (h, d, kv) = (c.hidden, c.head_dim(), c.kv_dim());
        let group = c.heads / c.kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let t = tokens.len();
        let mut x: Vec<f32> = tokens
            .iter()
            .flat_map(|&tok| self.w.embed.row(tok as usize).to_vec())
            .collect();
        let (mut normed, mut q, mut attn, mut proj) = (vec![0.0; h], vec![0.0; t * h], vec![0.0; h], vec![0.0; h]);
        let (mut gate, mut up) = (vec![0.0; c.ffn], vec![0.0; c.ffn]);
        let mut scores = Vec::with_capacity(self.len + t);
        for (l, b) in self.w.blocks.iter().enumerate() {
            // Queries, keys and values of the new positions; keys and values cached.
            for i in 0..t {
                let pos = self.len + i;
                rms_norm(&x[i * h..(i + 1) * h], &b.attn_norm, c.eps, &mut normed);
                let qi = &mut q[i * h..(i + 1) * h];
                matvec(&b.wq, &normed, qi);
                let (mut k, mut v) = (vec![0.0; kv], vec![0.0; kv]);
                matvec(&b.wk, &normed, &mut k);
                matvec(&b.wv, &normed, &mut v);
                for head in qi.chunks_exact_mut(d) {
                    rope(head, pos, c.rope_theta);
                }
                for head in k.chunks_exact_mut(d) {
                    rope(head, pos, c.rope_theta);
                }
                self.keys[l].extend_from_slice(&k);
                self.values[l].extend_from_slice(&v);
            }
            // Causal attention: position i sees the cache up to itself.
            for i in 0..t {
                let seen = self.len + i + 1;
                for head in 0..c.heads {
                    let kvh = head / group;
                    let qh = &q[i * h + head * d..i * h + (head + 1) * d];
                    scores.clear();
                    scores.extend(
                        (0..seen).map(|p| dot(qh, &self.keys[l][p * kv + kvh * d..p * kv + (kvh + 1) * d]) * scale),
                    );
                    let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0.0;
                    for s in scores.iter_mut() {
                        *s = (*s - max).exp();
                        sum += *s;
                    }
                    let out = &mut attn[head * d..(head + 1) * d];
                    out.fill(0.0);
                    for (p, s) in scores.iter().enumerate() {
                        let v = &self.values[l][p * kv + kvh * d..p * kv + (kvh + 1) * d];
                        for (o, vv) in out.iter_mut().zip(v) {
                            *o += s / sum * vv;
                        }
                    }
                }
                matvec(&b.wo, &attn, &mut proj);
                for (xv, pv) in x[i * h..(i + 1) * h].iter_mut().zip(&proj) {
                    *xv += pv;
                }
            }
            // The MLP of each new position.
            for i in 0..t {
                rms_norm(&x[i * h..(i + 1) * h], &b.mlp_norm, c.eps, &mut normed);
                matvec(&b.gate, &normed, &mut gate);
                matvec(&b.up, &normed, &mut up);
                for (g, u) in gate.iter_mut().zip(&up) {
                    *g = silu(*g) * u;
                }
                matvec(&b.down, &gate, &mut proj);
                for (xv, pv) in x[i * h..(i + 1) * h].iter_mut().zip(&proj) {
                    *xv += pv;
                }
            }
        }
        self.len += t;
        rms_norm(&x[(t - 1) * h..t * h], &self.w.norm, c.eps, &mut normed);
        let mut logits = vec![0.0; c.vocab];
        matvec(&self.w.lm_head, &normed, &mut logits);
        Ok(logits)
    }

    /// Greedy generation of `n` tokens after `prompt`, from an empty cache; `each` is
    /// told every token as it is known, and stops the generation by answering false.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n: usize,
        mut each: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>, String> {
        self.reset();
        if n == 0 {
            return Ok(Vec::new());
        }
        if let Some(p) = request_problem(self.config(), 0, &[prompt, &vec![0; n - 1]].concat()) {
            return Err(p);
        }
        let mut out = Vec::with_capacity(n);
        let mut logits = self.forward(prompt)?;
        loop {
            let token = argmax(&logits);
            out.push(token);
            if !each(token) || out.len() == n {
                return Ok(out);
            }
            logits = self.forward(&[token])?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoder::DecoderConfig;

    fn tiny(seed: u64) -> CpuDecoder {
        CpuDecoder::new(DecoderWeights::seeded(DecoderConfig::tiny(), seed))
    }

    fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
    }

    #[test]
    fn rms_norm_and_silu_by_hand() {
        let mut out = [0.0; 2];
        // mean square of (3, 4) is 12.5.
        rms_norm(&[3.0, 4.0], &[1.0, 2.0], 0.0, &mut out);
        let inv = 1.0 / 12.5f32.sqrt();
        assert_eq!(out, [3.0 * inv, 8.0 * inv]);
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-7);
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn rotary_embeddings_turn_pairs_and_depend_on_relative_position() {
        let q: Vec<f32> = (0..8).map(|i| i as f32 * 0.3 - 1.0).collect();
        let k: Vec<f32> = (0..8).map(|i| 0.5 - i as f32 * 0.2).collect();
        let at = |v: &[f32], pos| {
            let mut v = v.to_vec();
            rope(&mut v, pos, 10_000.0);
            v
        };
        assert_eq!(at(&q, 0), q, "position 0 turns nothing");
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>();
        assert!(
            (norm(&at(&q, 37)) - norm(&q)).abs() < 1e-4,
            "a rotation keeps the length"
        );
        // Element 0 turns with element 4 (rotate-half), at frequency 1 for i = 0.
        let turned = at(&q, 1);
        let (s, c) = 1f32.sin_cos();
        assert!((turned[0] - (q[0] * c - q[4] * s)).abs() < 1e-6);
        assert!((turned[4] - (q[4] * c + q[0] * s)).abs() < 1e-6);
        // q·k depends on the positions' difference only.
        let a = dot(&at(&q, 5), &at(&k, 2));
        let b = dot(&at(&q, 13), &at(&k, 10));
        assert!((a - b).abs() < 1e-4, "{a} {b}");
    }

    #[test]
    fn decoding_against_the_cache_equals_prefilling_the_whole_sequence() {
        let prompt = [5, 17, 300, 2, 99, 42];
        let mut whole = tiny(3);
        let all = whole.forward(&[&prompt[..], &[7, 8]].concat()).expect("prefill");
        let mut stepwise = tiny(3);
        stepwise.forward(&prompt).expect("prefill");
        stepwise.forward(&[7]).expect("step");
        let last = stepwise.forward(&[8]).expect("step");
        assert!(
            close(&last, &all, 1e-4),
            "the cache gives what a full recomputation gives"
        );
        assert_eq!(stepwise.cached(), 8);
        // Causality: what comes later does not change an earlier position's logits.
        let mut short = tiny(3);
        let first = short.forward(&prompt[..3]).expect("prefill");
        let mut longer = tiny(3);
        let three = longer.forward(&prompt[..3]).expect("prefill");
        assert_eq!(first, three);
    }

    #[test]
    fn grouped_query_attention_is_attention_with_each_kv_head_repeated() {
        // The same decoder with every key/value head written out once per query head
        // that reads it (an ordinary multi-head decoder) computes the same logits.
        let grouped = DecoderWeights::seeded(DecoderConfig::tiny(), 11);
        let c = grouped.config;
        let (d, group) = (c.head_dim(), c.heads / c.kv_heads);
        let mut full = grouped.clone();
        full.config.kv_heads = c.heads;
        for b in &mut full.blocks {
            for m in [&mut b.wk, &mut b.wv] {
                let mut data = Vec::new();
                for head in 0..c.heads {
                    let kvh = head / group;
                    data.extend_from_slice(&m.data[kvh * d * m.cols..(kvh + 1) * d * m.cols]);
                }
                *m = Matrix {
                    rows: c.hidden,
                    cols: m.cols,
                    data,
                };
            }
        }
        let tokens = [1, 2, 3, 400, 5];
        let a = CpuDecoder::new(grouped).forward(&tokens).expect("grouped");
        let b = CpuDecoder::new(full).forward(&tokens).expect("full");
        assert!(close(&a, &b, 1e-5));
    }

    #[test]
    fn greedy_generation_is_deterministic_and_streams_each_token() {
        let mut seen = Vec::new();
        let out = tiny(5)
            .generate(&[10, 20, 30], 6, |t| {
                seen.push(t);
                true
            })
            .expect("generate");
        assert_eq!(out.len(), 6);
        assert_eq!(seen, out);
        assert!(out.iter().all(|t| (*t as usize) < DecoderConfig::tiny().vocab));
        assert_eq!(tiny(5).generate(&[10, 20, 30], 6, |_| true).expect("again"), out);
        // Told to stop, it stops.
        assert_eq!(
            tiny(5).generate(&[10, 20, 30], 6, |_| false).expect("stopped"),
            out[..1]
        );
        // The first token is the argmax after the prompt.
        let first = argmax(&tiny(5).forward(&[10, 20, 30]).expect("prefill"));
        assert_eq!(out[0], first);
    }

    #[test]
    fn a_request_that_cannot_run_is_named() {
        let mut d = tiny(1);
        assert_eq!(d.forward(&[]), Err("no tokens".into()));
        assert!(
            d.forward(&[512])
                .expect_err("outside")
                .contains("outside the vocabulary of 512")
        );
        let long = vec![1; 250];
        assert!(
            d.generate(&long, 10, |_| true)
                .expect_err("too long")
                .contains("exceed the longest sequence, 256")
        );
        assert_eq!(d.generate(&[1], 0, |_| true), Ok(Vec::new()));
    }
}
