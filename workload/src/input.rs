//! The input of one inference: a batch of images (seeded pixels, the reference study's
//! "sample input image") or a batch of tokenised sentences.

use std::path::Path;

use crate::config::{Embedding, ModelConfig, VisionShape};
use crate::error::{Result, WorkloadError};
use crate::rng::SplitMix64;

/// Sentences that `minilm-l6` embeds while it serves (a batch cycles through them).
pub const SAMPLE_SENTENCES: [&str; 8] = [
    "GPU sharing lets several inference pods use one accelerator.",
    "Time-slicing interleaves contexts; each pod gets the whole GPU in turn.",
    "MPS runs kernels from several processes at the same time.",
    "MIG splits the GPU into isolated instances with their own memory.",
    "The cat sat on the mat.",
    "Latency percentiles tell more than the mean.",
    "A closed loop sends the next request when the last one returns.",
    "Prometheus scrapes the metrics endpoint every few seconds.",
];

/// Longest sequence all-MiniLM-L6-v2 is used with (sentence-transformers' max_seq_length).
pub const MAX_TEXT_TOKENS: usize = 256;

/// One batch of model input.
#[derive(Debug, Clone, PartialEq)]
pub enum InputBatch {
    /// `[batch, channels, height, width]` normalised pixels.
    Images {
        /// Images in the batch.
        batch: usize,
        /// The pixels.
        pixels: Vec<f32>,
    },
    /// Token ids, right-padded to the longest sentence.
    Tokens {
        /// Sentences in the batch.
        batch: usize,
        /// Tokens per sentence after padding.
        seq_len: usize,
        /// `[batch, seq_len]` word-piece ids (0 = padding).
        ids: Vec<i32>,
        /// Real tokens per sentence (the attention mask is `position < len`).
        lens: Vec<i32>,
    },
}

impl InputBatch {
    /// Seeded pixels in [-2, 2), the range of ImageNet-normalised images.
    pub fn sample_images(shape: &VisionShape, batch: usize, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let n = batch * shape.channels * shape.image_h * shape.image_w;
        Self::Images {
            batch,
            pixels: (0..n).map(|_| 2.0 * rng.next_signed()).collect(),
        }
    }

    /// Tokenises `sentences` with a Hugging Face `tokenizer.json` ([CLS] … [SEP],
    /// truncated to [`MAX_TEXT_TOKENS`]) and pads them to the longest.
    pub fn from_sentences(tokenizer: &Path, sentences: &[&str]) -> Result<Self> {
        let tok_err = |reason: String| WorkloadError::Tokenizer {
            path: tokenizer.to_path_buf(),
            reason,
        };
        if sentences.is_empty() {
            return Err(WorkloadError::BadArgument("no sentences to embed".into()));
        }
        let mut tk = tokenizers::Tokenizer::from_file(tokenizer).map_err(|e| tok_err(e.to_string()))?;
        // tokenizer.json may carry padding and truncation settings of its own; we pad to
        // the batch's longest sentence and truncate to MAX_TEXT_TOKENS ourselves, as
        // sentence-transformers does.
        tk.with_padding(None);
        tk.with_truncation(None).map_err(|e| tok_err(e.to_string()))?;
        let mut rows = Vec::with_capacity(sentences.len());
        for s in sentences {
            let enc = tk.encode(*s, true).map_err(|e| tok_err(e.to_string()))?;
            let mut ids: Vec<i32> = enc.get_ids().iter().map(|&i| i as i32).collect();
            if ids.len() > MAX_TEXT_TOKENS {
                // Keep [SEP] last, as the Python tokenizer's truncation does.
                let sep = ids[ids.len() - 1];
                ids.truncate(MAX_TEXT_TOKENS);
                ids[MAX_TEXT_TOKENS - 1] = sep;
            }
            rows.push(ids);
        }
        Ok(Self::pad(rows))
    }

    /// Right-pads token rows with id 0.
    pub fn pad(rows: Vec<Vec<i32>>) -> Self {
        let batch = rows.len();
        let seq_len = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(batch * seq_len);
        let mut lens = Vec::with_capacity(batch);
        for row in rows {
            lens.push(row.len() as i32);
            ids.extend_from_slice(&row);
            ids.resize(ids.len() + seq_len - row.len(), 0);
        }
        Self::Tokens {
            batch,
            seq_len,
            ids,
            lens,
        }
    }

    /// The serving input for a model: seeded images, or the sample sentences cycled to
    /// `batch` (text models need the tokenizer in `weights_dir`).
    pub fn for_serving(config: &ModelConfig, batch: usize, weights_dir: Option<&Path>, seed: u64) -> Result<Self> {
        match config.embedding {
            Embedding::Vision(v) => Ok(Self::sample_images(&v, batch, seed)),
            Embedding::Text(_) => {
                let dir = weights_dir
                    .ok_or_else(|| WorkloadError::BadArgument(format!("{} needs --weights DIR", config.preset)))?;
                let sentences: Vec<&str> = SAMPLE_SENTENCES.iter().copied().cycle().take(batch).collect();
                Self::from_sentences(&dir.join("tokenizer.json"), &sentences)
            }
        }
    }

    /// Samples (images or sentences) in the batch.
    pub fn batch(&self) -> usize {
        match self {
            InputBatch::Images { batch, .. } | InputBatch::Tokens { batch, .. } => *batch,
        }
    }

    /// Tokens per sample the encoder sees.
    pub fn tokens_per_sample(&self, config: &ModelConfig) -> usize {
        match (self, config.embedding) {
            (InputBatch::Tokens { seq_len, .. }, _) => *seq_len,
            (InputBatch::Images { .. }, Embedding::Vision(v)) => v.tokens(),
            (InputBatch::Images { .. }, Embedding::Text(_)) => 0,
        }
    }

    /// Checks that the input fits the model, naming the mismatch.
    pub fn check(&self, config: &ModelConfig) -> Result<()> {
        match (self, config.embedding) {
            (InputBatch::Images { batch, pixels }, Embedding::Vision(v)) => {
                let want = batch * v.channels * v.image_h * v.image_w;
                if pixels.len() != want || *batch == 0 {
                    return Err(WorkloadError::BadArgument(format!(
                        "image batch has {} values, {} needs {want} for batch {batch}",
                        pixels.len(),
                        config.preset
                    )));
                }
                Ok(())
            }
            (
                InputBatch::Tokens {
                    batch,
                    seq_len,
                    ids,
                    lens,
                },
                Embedding::Text(t),
            ) => {
                if *batch == 0 || ids.len() != batch * seq_len || lens.len() != *batch {
                    return Err(WorkloadError::BadArgument("token batch is inconsistent".into()));
                }
                if *seq_len > t.max_positions {
                    return Err(WorkloadError::BadArgument(format!(
                        "sequence of {seq_len} tokens is longer than the model's {} positions",
                        t.max_positions
                    )));
                }
                if let Some(bad) = ids.iter().find(|&&i| i < 0 || i as usize >= t.vocab) {
                    return Err(WorkloadError::BadArgument(format!(
                        "token id {bad} is outside the vocabulary of {}",
                        t.vocab
                    )));
                }
                if lens.iter().any(|&l| l < 1 || l as usize > *seq_len) {
                    return Err(WorkloadError::BadArgument("a sentence has no tokens".into()));
                }
                Ok(())
            }
            _ => Err(WorkloadError::BadArgument(format!(
                "input kind does not match model {}",
                config.preset
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_to_the_longest_row() {
        let b = InputBatch::pad(vec![vec![101, 7, 102], vec![101, 102]]);
        assert_eq!(
            b,
            InputBatch::Tokens {
                batch: 2,
                seq_len: 3,
                ids: vec![101, 7, 102, 101, 102, 0],
                lens: vec![3, 2],
            }
        );
    }

    #[test]
    fn check_names_out_of_vocabulary_ids() {
        let c = crate::config::Preset::MiniLmL6.config();
        let b = InputBatch::pad(vec![vec![101, 40000, 102]]);
        let err = b.check(&c).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("40000"), "{err}");
    }
}
