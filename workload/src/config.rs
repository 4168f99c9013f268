//! Model presets, precisions and devices: what one workload process computes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::WorkloadError;

/// A named model shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// The reference study's YOLOS-small: ViT encoder on an 800×1066 image (3401 tokens).
    YolosSmall,
    /// all-MiniLM-L6-v2 sentence encoder with its real weights.
    #[serde(rename = "minilm-l6")]
    MiniLmL6,
    /// A few MFLOP of the YOLOS architecture, for CPUs and CI.
    Tiny,
}

impl Preset {
    /// Every preset, in the order help texts list them.
    pub const ALL: [Preset; 3] = [Preset::YolosSmall, Preset::MiniLmL6, Preset::Tiny];

    /// The name used on the command line and in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Preset::YolosSmall => "yolos-small",
            Preset::MiniLmL6 => "minilm-l6",
            Preset::Tiny => "tiny",
        }
    }

    /// The model shape of this preset.
    pub fn config(self) -> ModelConfig {
        match self {
            // hustvl/yolos-small: DeiT-S backbone, 100 detection tokens, 91 COCO
            // classes + "no object"; the reference study fed it 800×1066 images.
            Preset::YolosSmall => ModelConfig {
                preset: self,
                layers: 12,
                hidden: 384,
                heads: 6,
                mlp: 1536,
                layer_norm_eps: 1e-12,
                norm: NormPlacement::Pre,
                embedding: Embedding::Vision(VisionShape {
                    channels: 3,
                    image_h: 800,
                    image_w: 1066,
                    patch: 16,
                    det_tokens: 100,
                    classes: 92,
                }),
            },
            // sentence-transformers/all-MiniLM-L6-v2 (BERT, post-norm).
            Preset::MiniLmL6 => ModelConfig {
                preset: self,
                layers: 6,
                hidden: 384,
                heads: 12,
                mlp: 1536,
                layer_norm_eps: 1e-12,
                norm: NormPlacement::Post,
                embedding: Embedding::Text(TextShape {
                    vocab: 30522,
                    max_positions: 512,
                    type_vocab: 2,
                }),
            },
            Preset::Tiny => ModelConfig {
                preset: self,
                layers: 2,
                hidden: 64,
                heads: 2,
                mlp: 256,
                layer_norm_eps: 1e-12,
                norm: NormPlacement::Pre,
                embedding: Embedding::Vision(VisionShape {
                    channels: 3,
                    image_h: 64,
                    image_w: 96,
                    patch: 16,
                    det_tokens: 4,
                    classes: 8,
                }),
            },
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| WorkloadError::UnknownPreset(s.to_string()))
    }
}

/// Arithmetic precision of the GPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// IEEE fp32 everywhere, no tensor cores: the accuracy reference on the GPU.
    Fp32,
    /// fp32 storage, matrix products on tensor cores in TF32.
    Tf32,
    /// bf16 weights and activations, fp32 accumulation, fp32 residual stream.
    Bf16,
}

impl Precision {
    /// Every precision.
    pub const ALL: [Precision; 3] = [Precision::Fp32, Precision::Tf32, Precision::Bf16];

    /// The name used on the command line and in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| WorkloadError::UnknownPrecision(s.to_string()))
    }
}

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
    /// The plain-Rust reference backend.
    Cpu,
}

impl Device {
    /// The name used on the command line and in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Device::Cuda => "cuda",
            Device::Cpu => "cpu",
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Device {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cuda" => Ok(Device::Cuda),
            "cpu" => Ok(Device::Cpu),
            other => Err(WorkloadError::UnknownDevice(other.to_string())),
        }
    }
}

/// Where layer norm sits in each encoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// ViT: `x + f(LN(x))`, plus a final layer norm.
    Pre,
    /// BERT: `LN(x + f(x))`, plus a layer norm on the embeddings.
    Post,
}

/// Image-side shape of a ViT/YOLOS model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VisionShape {
    /// Input channels (3).
    pub channels: usize,
    /// Image height in pixels.
    pub image_h: usize,
    /// Image width in pixels.
    pub image_w: usize,
    /// Square patch side in pixels (the patch-embedding convolution's kernel and stride).
    pub patch: usize,
    /// YOLOS detection tokens appended after the patches.
    pub det_tokens: usize,
    /// Classifier outputs per detection token (classes + "no object").
    pub classes: usize,
}

impl VisionShape {
    /// Patches along the height (the convolution drops the remainder, as PyTorch does).
    pub fn patches_h(&self) -> usize {
        self.image_h / self.patch
    }
    /// Patches along the width.
    pub fn patches_w(&self) -> usize {
        self.image_w / self.patch
    }
    /// Patches per image.
    pub fn patches(&self) -> usize {
        self.patches_h() * self.patches_w()
    }
    /// Values per flattened patch (channels × patch × patch).
    pub fn patch_dim(&self) -> usize {
        self.channels * self.patch * self.patch
    }
    /// Tokens per image: [CLS], the patches, the detection tokens.
    pub fn tokens(&self) -> usize {
        1 + self.patches() + self.det_tokens
    }
    /// Floats per image in the output: class logits and 4 box coordinates per detection token.
    pub fn output_per_image(&self) -> usize {
        self.det_tokens * (self.classes + 4)
    }
}

/// Text-side shape of a BERT model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextShape {
    /// Word-piece vocabulary size.
    pub vocab: usize,
    /// Learned positions (longest sequence).
    pub max_positions: usize,
    /// Token types (segments).
    pub type_vocab: usize,
}

/// What feeds the encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedding {
    /// Image patches (ViT/YOLOS).
    Vision(VisionShape),
    /// Word pieces (BERT).
    Text(TextShape),
}

/// The shape of one transformer encoder model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    /// The preset this shape came from.
    pub preset: Preset,
    /// Encoder layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// MLP inner size.
    pub mlp: usize,
    /// Layer-norm epsilon.
    pub layer_norm_eps: f32,
    /// Pre- or post-norm layers.
    pub norm: NormPlacement,
    /// Input side.
    pub embedding: Embedding,
}

impl ModelConfig {
    /// Size of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Floating-point operations of one forward pass over one sample of `tokens` tokens
    /// (multiply and add counted as two), matrix products and attention only: the
    /// element-wise work is a rounding error next to them.
    pub fn flops_per_sample(&self, tokens: usize) -> f64 {
        let t = tokens as f64;
        let h = self.hidden as f64;
        let per_layer = 2.0 * t * h * 3.0 * h // QKV projection
            + 2.0 * 2.0 * t * t * h // QK^T and PV over all heads
            + 2.0 * t * h * h // output projection
            + 2.0 * 2.0 * t * h * self.mlp as f64; // the two MLP products
        let mut total = per_layer * self.layers as f64;
        if let Embedding::Vision(v) = self.embedding {
            total += 2.0 * v.patches() as f64 * v.patch_dim() as f64 * h;
            // Class and box heads: three layers each on every detection token.
            let d = v.det_tokens as f64;
            total += d * 2.0 * (2.0 * h * h + h * v.classes as f64);
            total += d * 2.0 * (2.0 * h * h + h * 4.0);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yolos_small_has_the_reference_shape() {
        let c = Preset::YolosSmall.config();
        let Embedding::Vision(v) = c.embedding else {
            panic!("yolos-small is a vision model")
        };
        assert_eq!(v.patches_h(), 50);
        assert_eq!(v.patches_w(), 66);
        assert_eq!(v.tokens(), 3401);
        assert_eq!(c.head_dim(), 64);
        // docs/workload.md: about 360 GFLOP per inference.
        let gflop = c.flops_per_sample(v.tokens()) / 1e9;
        assert!((355.0..365.0).contains(&gflop), "{gflop}");
    }

    #[test]
    fn names_round_trip_and_bad_names_are_named() {
        for p in Preset::ALL {
            assert_eq!(p.name().parse::<Preset>().ok(), Some(p));
        }
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>().ok(), Some(p));
        }
        let err = "yolos".parse::<Preset>().err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("unknown model `yolos`: expected one of yolos-small, minilm-l6, tiny")
        );
        assert!("fp16".parse::<Precision>().is_err());
        assert!("gpu".parse::<Device>().is_err());
    }

    #[test]
    fn minilm_heads_are_32_wide() {
        assert_eq!(Preset::MiniLmL6.config().head_dim(), 32);
        assert_eq!(Preset::Tiny.config().head_dim(), 32);
    }
}
