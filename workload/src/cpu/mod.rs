//! The CPU backend: the whole forward pass in plain Rust on one thread, the reference
//! for the GPU backend and the engine of the CPU smoke pipeline.

pub mod ops;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::{Embedding, NormPlacement};
use crate::error::{Result, WorkloadError};
use crate::input::InputBatch;
use crate::weights::{EmbeddingWeights, HeadWeights, ModelWeights};

/// A model ready to run on the CPU.
#[derive(Debug, Clone)]
pub struct CpuModel {
    weights: ModelWeights,
    threads: usize,
    /// Once true, a forward pass in progress gives up with [`WorkloadError::Cancelled`].
    cancel: Option<Arc<AtomicBool>>,
}

/// Rows computed between two looks at the cancellation flag. A row of the largest
/// product (YOLOS-small attention over 3401 tokens) is about 5 MFLOP, so a block is a
/// few tens of milliseconds even in a debug build; one atomic load per block is free.
const ROWS_PER_CHECK: usize = 16;

fn is_set(cancel: Option<&AtomicBool>) -> bool {
    cancel.is_some_and(|c| c.load(Ordering::Relaxed))
}

/// Runs `f` over `rows` (global indices, outputs in `out`, `width` per row) in blocks of
/// [`ROWS_PER_CHECK`] rows, stopping early once `cancel` is set. Rows are independent,
/// so the blocks give the same results as one call. `true` when it stopped early.
fn rows_in_blocks(
    rows: std::ops::Range<usize>,
    width: usize,
    out: &mut [f32],
    cancel: Option<&AtomicBool>,
    f: &(impl Fn(std::ops::Range<usize>, &mut [f32]) + Sync),
) -> bool {
    for (i, block) in out.chunks_mut(ROWS_PER_CHECK * width.max(1)).enumerate() {
        if is_set(cancel) {
            return true;
        }
        let start = rows.start + i * ROWS_PER_CHECK;
        f(start..start + block.len() / width.max(1), block);
    }
    false
}

/// Runs `f(row_range, out_rows)` over `rows` rows of `width` outputs, split into
/// contiguous blocks across `threads` scoped threads (rows are independent). Gives
/// [`WorkloadError::Cancelled`] when `cancel` is set before every row is computed.
fn par_rows(
    threads: usize,
    rows: usize,
    width: usize,
    out: &mut [f32],
    cancel: Option<&AtomicBool>,
    f: impl Fn(std::ops::Range<usize>, &mut [f32]) + Sync,
) -> Result<()> {
    let per = rows.div_ceil(threads.max(1)).max(1);
    let stopped = if threads <= 1 || rows < 64 {
        rows_in_blocks(0..rows, width, out, cancel, &f)
    } else {
        std::thread::scope(|s| {
            let workers: Vec<_> = out
                .chunks_mut(per * width)
                .enumerate()
                .map(|(i, chunk)| {
                    let f = &f;
                    s.spawn(move || rows_in_blocks(i * per..i * per + chunk.len() / width, width, chunk, cancel, f))
                })
                .collect();
            // Join every worker; one that panicked passes its panic on.
            workers.into_iter().fold(false, |stopped, w| match w.join() {
                Ok(s) => s || stopped,
                Err(panic) => std::panic::resume_unwind(panic),
            })
        })
    };
    if stopped { Err(WorkloadError::Cancelled) } else { Ok(()) }
}

impl CpuModel {
    /// Wraps host weights; one thread (each workload pod is one thread on the CPU).
    pub fn new(weights: ModelWeights) -> Self {
        Self {
            weights,
            threads: 1,
            cancel: None,
        }
    }

    /// Splits the matrix products and attention across `threads` threads (tests use
    /// this to compute large references quickly; results are identical).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Makes [`forward`](Self::forward) give up with [`WorkloadError::Cancelled`] soon
    /// after `flag` turns true (within one block of rows: milliseconds), leaving the
    /// model as it was. The serving loop passes its stop flag here.
    pub fn set_cancel(&mut self, flag: Arc<AtomicBool>) {
        self.cancel = Some(flag);
    }

    /// `Err(Cancelled)` once the cancellation flag is set.
    fn check_cancel(&self) -> Result<()> {
        if is_set(self.cancel.as_deref()) {
            Err(WorkloadError::Cancelled)
        } else {
            Ok(())
        }
    }

    fn linear(&self, x: &[f32], rows: usize, layer: &crate::weights::Linear, out: &mut [f32]) -> Result<()> {
        let (k, n) = (layer.in_features(), layer.out_features());
        par_rows(self.threads, rows, n, out, self.cancel.as_deref(), |r, o| {
            ops::linear(&x[r.start * k..r.end * k], r.len(), layer, o)
        })
    }

    /// The weights.
    pub fn weights(&self) -> &ModelWeights {
        &self.weights
    }

    /// One forward pass. Vision models return per detection token the class logits and
    /// the 4 sigmoid box coordinates (`[batch·det, classes + 4]`); text models return the
    /// normalised sentence embeddings (`[batch, H]`). With a cancellation flag
    /// ([`set_cancel`](Self::set_cancel)) it may instead give up with
    /// [`WorkloadError::Cancelled`].
    pub fn forward(&self, input: &InputBatch) -> Result<Vec<f32>> {
        self.check_cancel()?;
        let w = &self.weights;
        let c = &w.config;
        input.check(c)?;
        let h = c.hidden;
        let batch = input.batch();
        let seq = input.tokens_per_sample(c);
        let rows = batch * seq;
        let post = c.norm == NormPlacement::Post;

        // The residual stream and the normalised activations that feed each product.
        let mut x = vec![0.0f32; rows * h];
        let mut a = vec![0.0f32; rows * h];
        let (first_ln, valid): (_, Option<&[i32]>) = match (&w.embedding, input) {
            (EmbeddingWeights::Vision { patch, cls, det, pos }, InputBatch::Images { pixels, .. }) => {
                let Embedding::Vision(v) = c.embedding else {
                    unreachable!("checked by input.check")
                };
                let mut patches = vec![0.0f32; batch * v.patches() * v.patch_dim()];
                ops::im2col(pixels, &v, batch, &mut patches);
                let mut patch_out = vec![0.0f32; batch * v.patches() * h];
                self.linear(&patches, batch * v.patches(), patch, &mut patch_out)?;
                ops::assemble_vision(&patch_out, &cls.data, &det.data, &pos.data, &v, batch, h, &mut x);
                (&w.layers[0].ln1, None)
            }
            (
                EmbeddingWeights::Text {
                    word,
                    pos,
                    token_type,
                    ln,
                },
                InputBatch::Tokens { ids, lens, .. },
            ) => {
                ops::embed_text(ids, seq, &word.data, &pos.data, &token_type.data[..h], h, &mut x);
                (ln, Some(lens.as_slice()))
            }
            _ => unreachable!("checked by input.check"),
        };
        ops::add_layer_norm(&mut x, None, h, first_ln, c.layer_norm_eps, post, &mut a);

        let mut qkv = vec![0.0f32; rows * 3 * h];
        let mut attn = vec![0.0f32; rows * h];
        let mut proj = vec![0.0f32; rows * h];
        let mut inner = vec![0.0f32; rows * c.mlp];
        for (i, layer) in w.layers.iter().enumerate() {
            self.linear(&a, rows, &layer.qkv, &mut qkv)?;
            par_rows(self.threads, rows, h, &mut attn, self.cancel.as_deref(), |r, o| {
                ops::attention_rows(&qkv, seq, c.heads, c.head_dim(), valid, r, o)
            })?;
            self.linear(&attn, rows, &layer.out, &mut proj)?;
            // Pre-norm: x += proj, a = LN2(x). Post-norm: x = LN1(x + proj), a = x.
            let mid_ln = if post { &layer.ln1 } else { &layer.ln2 };
            ops::add_layer_norm(&mut x, Some(&proj), h, mid_ln, c.layer_norm_eps, post, &mut a);
            self.linear(&a, rows, &layer.fc1, &mut inner)?;
            self.check_cancel()?;
            inner.iter_mut().for_each(|v| *v = ops::gelu(*v));
            self.linear(&inner, rows, &layer.fc2, &mut proj)?;
            // Pre-norm: the next layer's LN1 (or the final LN). Post-norm: this layer's LN2.
            let end_ln = match (post, w.layers.get(i + 1), &w.head) {
                (true, _, _) => &layer.ln2,
                (false, Some(next), _) => &next.ln1,
                (false, None, HeadWeights::Vision { final_ln, .. }) => final_ln,
                (false, None, HeadWeights::Text) => &layer.ln2,
            };
            ops::add_layer_norm(&mut x, Some(&proj), h, end_ln, c.layer_norm_eps, post, &mut a);
        }

        self.check_cancel()?;
        match (&w.head, c.embedding, input) {
            (HeadWeights::Vision { class, bbox, .. }, Embedding::Vision(v), _) => {
                let det_rows = batch * v.det_tokens;
                let mut det = Vec::with_capacity(det_rows * h);
                for b in 0..batch {
                    let first = b * seq + 1 + v.patches();
                    det.extend_from_slice(&a[first * h..(first + v.det_tokens) * h]);
                }
                let logits = mlp3(&det, det_rows, class);
                let boxes = mlp3(&det, det_rows, bbox);
                let width = v.classes + 4;
                let mut out = vec![0.0f32; det_rows * width];
                for r in 0..det_rows {
                    out[r * width..r * width + v.classes].copy_from_slice(&logits[r * v.classes..(r + 1) * v.classes]);
                    for k in 0..4 {
                        out[r * width + v.classes + k] = ops::sigmoid(boxes[r * 4 + k]);
                    }
                }
                Ok(out)
            }
            (HeadWeights::Text, _, InputBatch::Tokens { lens, .. }) => {
                let mut out = vec![0.0f32; batch * h];
                ops::mean_pool_normalize(&x, batch, seq, lens, h, &mut out);
                Ok(out)
            }
            _ => unreachable!("weights and input kinds agree (input.check)"),
        }
    }
}

/// Three linear layers with ReLU between (YOLOS' MLP prediction heads).
fn mlp3(x: &[f32], rows: usize, layers: &[crate::weights::Linear; 3]) -> Vec<f32> {
    let mut h1 = vec![0.0f32; rows * layers[0].out_features()];
    ops::linear(x, rows, &layers[0], &mut h1);
    h1.iter_mut().for_each(|v| *v = v.max(0.0));
    let mut h2 = vec![0.0f32; rows * layers[1].out_features()];
    ops::linear(&h1, rows, &layers[1], &mut h2);
    h2.iter_mut().for_each(|v| *v = v.max(0.0));
    let mut out = vec![0.0f32; rows * layers[2].out_features()];
    ops::linear(&h2, rows, &layers[2], &mut out);
    out
}
