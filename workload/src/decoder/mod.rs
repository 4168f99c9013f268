//! A Llama-style decoder for language-model experiments: its shape ([`DecoderConfig`]),
//! seeded random weights (speed does not depend on their values) and the plain-Rust
//! reference ([`cpu::CpuDecoder`]) that computes it on the CPU and that GPU kernels are
//! tested against.
//!
//! The block is Llama's: RMSNorm before attention and before the MLP, rotary position
//! embeddings on queries and keys (the rotate-half pairing of Hugging Face's
//! `LlamaRotaryEmbedding`: element i turns with element i + d/2), grouped-query
//! attention (each key/value head shared by `heads / kv_heads` query heads), causal,
//! scaled by 1/√d, a SwiGLU MLP (`down(silu(gate(x)) · up(x))`), a final RMSNorm and
//! an untied output projection. Linear layers have no bias.

pub mod cpu;
pub mod serve;

use crate::rng::SplitMix64;

/// The shape of a decoder.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderConfig {
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention: `heads` is a multiple of it).
    pub kv_heads: usize,
    /// Width of the MLP's gate and up projections.
    pub ffn: usize,
    /// Rotary base θ.
    pub rope_theta: f32,
    /// RMSNorm's ε.
    pub eps: f32,
    /// The longest prompt plus answer (the KV cache's length).
    pub max_len: usize,
}

impl DecoderConfig {
    /// The default language model: Llama 3.2 1B's body (hidden 2048, 16 layers, 32
    /// query and 8 key/value heads, MLP 8192, θ 500,000) with a vocabulary of 32,000
    /// and an untied output: 1.10 B parameters, 2.2 GB in bf16. The same shape as the
    /// PyTorch example's `llm_model.py`.
    pub fn llm() -> Self {
        Self {
            vocab: 32_000,
            hidden: 2048,
            layers: 16,
            heads: 32,
            kv_heads: 8,
            ffn: 8192,
            rope_theta: 500_000.0,
            eps: 1e-5,
            max_len: 4096,
        }
    }

    /// A decoder small enough for a CPU and CI, with every part of the large one
    /// (grouped-query attention of 2 query heads per key/value head).
    pub fn tiny() -> Self {
        Self {
            vocab: 512,
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            ffn: 128,
            rope_theta: 10_000.0,
            eps: 1e-5,
            max_len: 256,
        }
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim()
    }

    /// Parameters: embedding, per block the four attention projections, the three MLP
    /// projections and two norms, the final norm and the output projection.
    pub fn parameters(&self) -> u64 {
        let (h, kv, f, v) = (
            self.hidden as u64,
            self.kv_dim() as u64,
            self.ffn as u64,
            self.vocab as u64,
        );
        let block = h * h * 2 + h * kv * 2 + 3 * h * f + 2 * h;
        v * h + self.layers as u64 * block + h + v * h
    }

    /// Why the shape cannot be computed (None: it can).
    pub fn problem(&self) -> Option<String> {
        if [
            self.vocab,
            self.hidden,
            self.layers,
            self.heads,
            self.kv_heads,
            self.ffn,
            self.max_len,
        ]
        .contains(&0)
        {
            return Some("every size must be at least 1".into());
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Some(format!(
                "hidden {} is not a multiple of heads {}",
                self.hidden, self.heads
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Some(format!(
                "heads {} is not a multiple of kv_heads {}",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Some(format!(
                "head width {} is odd: rotary embeddings turn pairs",
                self.head_dim()
            ));
        }
        None
    }
}

/// A matrix of `rows × cols`, row-major: a linear layer's weight (`out × in`, as PyTorch
/// stores it) or an embedding table (`vocab × hidden`).
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// `rows · cols` values.
    pub data: Vec<f32>,
}

impl Matrix {
    /// Uniform in ±`scale`, from `rng`.
    fn random(rows: usize, cols: usize, scale: f32, rng: &mut SplitMix64) -> Self {
        let data = (0..rows * cols).map(|_| rng.next_signed() * scale).collect();
        Self { rows, cols, data }
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    fn map(&self, f: impl Fn(f32) -> f32) -> Self {
        Self {
            rows: self.rows,
            cols: self.cols,
            data: self.data.iter().map(|v| f(*v)).collect(),
        }
    }
}

/// One block's weights.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockWeights {
    /// RMSNorm before attention.
    pub attn_norm: Vec<f32>,
    /// Query projection, `hidden × hidden`.
    pub wq: Matrix,
    /// Key projection, `kv_dim × hidden`.
    pub wk: Matrix,
    /// Value projection, `kv_dim × hidden`.
    pub wv: Matrix,
    /// Output projection, `hidden × hidden`.
    pub wo: Matrix,
    /// RMSNorm before the MLP.
    pub mlp_norm: Vec<f32>,
    /// Gate projection, `ffn × hidden`.
    pub gate: Matrix,
    /// Up projection, `ffn × hidden`.
    pub up: Matrix,
    /// Down projection, `hidden × ffn`.
    pub down: Matrix,
}

/// A decoder's weights.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderWeights {
    /// The shape.
    pub config: DecoderConfig,
    /// Token embeddings, `vocab × hidden`.
    pub embed: Matrix,
    /// The blocks.
    pub blocks: Vec<BlockWeights>,
    /// The final RMSNorm.
    pub norm: Vec<f32>,
    /// The output projection, `vocab × hidden`.
    pub lm_head: Matrix,
}

impl DecoderWeights {
    /// Seeded random weights: each matrix uniform in ±1/√(its input width) (a
    /// residual stream that neither grows nor vanishes through the blocks), norms'
    /// gains 1 ± 0.1; the same for a seed on every machine.
    pub fn seeded(config: DecoderConfig, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let (h, kv, f, v) = (config.hidden, config.kv_dim(), config.ffn, config.vocab);
        let scale = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        let gains = |n: usize, rng: &mut SplitMix64| (0..n).map(|_| 1.0 + 0.1 * rng.next_signed()).collect();
        let embed = Matrix::random(v, h, 1.0, &mut rng.fork(1));
        let blocks = (0..config.layers)
            .map(|l| {
                let mut r = rng.fork(100 + l as u64);
                BlockWeights {
                    attn_norm: gains(h, &mut r),
                    wq: Matrix::random(h, h, scale(h), &mut r),
                    wk: Matrix::random(kv, h, scale(h), &mut r),
                    wv: Matrix::random(kv, h, scale(h), &mut r),
                    wo: Matrix::random(h, h, scale(h), &mut r),
                    mlp_norm: gains(h, &mut r),
                    gate: Matrix::random(f, h, scale(h), &mut r),
                    up: Matrix::random(f, h, scale(h), &mut r),
                    down: Matrix::random(h, f, scale(f), &mut r),
                }
            })
            .collect();
        let mut r = rng.fork(2);
        Self {
            config,
            embed,
            blocks,
            norm: gains(h, &mut r),
            lm_head: Matrix::random(v, h, scale(h), &mut r),
        }
    }

    /// Every weight passed through `f` (e.g. rounded to bf16, as the GPU stores them, so
    /// that the CPU reference computes with the very weights the GPU reads).
    pub fn map(&self, f: impl Fn(f32) -> f32 + Copy) -> Self {
        let gains = |g: &[f32]| g.iter().map(|v| f(*v)).collect();
        Self {
            config: self.config,
            embed: self.embed.map(f),
            blocks: self
                .blocks
                .iter()
                .map(|b| BlockWeights {
                    attn_norm: gains(&b.attn_norm),
                    wq: b.wq.map(f),
                    wk: b.wk.map(f),
                    wv: b.wv.map(f),
                    wo: b.wo.map(f),
                    mlp_norm: gains(&b.mlp_norm),
                    gate: b.gate.map(f),
                    up: b.up.map(f),
                    down: b.down.map(f),
                })
                .collect(),
            norm: gains(&self.norm),
            lm_head: self.lm_head.map(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_llm_shape_has_1_1_billion_parameters() {
        let c = DecoderConfig::llm();
        assert_eq!(c.problem(), None);
        assert_eq!((c.head_dim(), c.kv_dim()), (64, 512));
        // Per block: 2·2048² + 2·2048·512 + 3·2048·8192 + 2·2048 = 60,821,504.
        assert_eq!(c.parameters(), 2 * 32_000 * 2048 + 16 * 60_821_504 + 2048);
        assert_eq!(c.parameters(), 1_104_218_112);
        assert_eq!(DecoderConfig::tiny().problem(), None);
    }

    #[test]
    fn a_shape_that_cannot_be_computed_is_named() {
        let bad = |f: fn(&mut DecoderConfig)| {
            let mut c = DecoderConfig::tiny();
            f(&mut c);
            c.problem().expect("a problem")
        };
        assert!(bad(|c| c.heads = 3).contains("not a multiple of heads"));
        assert!(bad(|c| c.kv_heads = 3).contains("not a multiple of kv_heads"));
        assert!(bad(|c| c.layers = 0).contains("at least 1"));
        assert!(
            bad(|c| {
                c.hidden = 12;
                c.heads = 4;
                c.kv_heads = 4;
            })
            .contains("odd")
        );
    }

    #[test]
    fn seeded_weights_repeat_with_their_seed() {
        let a = DecoderWeights::seeded(DecoderConfig::tiny(), 7);
        assert_eq!(a, DecoderWeights::seeded(DecoderConfig::tiny(), 7));
        assert_ne!(
            a.blocks[0].wq,
            DecoderWeights::seeded(DecoderConfig::tiny(), 8).blocks[0].wq
        );
        assert_eq!(a.blocks[1].wk.rows, DecoderConfig::tiny().kv_dim());
        let bound = 1.0 / 64f32.sqrt();
        assert!(a.blocks[0].wq.data.iter().all(|w| w.abs() <= bound));
    }
}
