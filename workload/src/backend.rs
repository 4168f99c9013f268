//! The engine a workload process runs: the CPU reference or the CUDA backend behind one
//! interface, built from a [`ModelPlan`].

use std::path::PathBuf;

use crate::config::{Device, Precision, Preset};
use crate::cpu::CpuModel;
use crate::error::{Result, WorkloadError};
use crate::input::InputBatch;
use crate::weights::ModelWeights;

/// Seed of the weights and inputs of the shape presets.
pub const DEFAULT_SEED: u64 = 0x5EED_6A5E;

/// Everything needed to build an engine.
#[derive(Debug, Clone)]
pub struct ModelPlan {
    /// The model.
    pub preset: Preset,
    /// CPU or GPU.
    pub device: Device,
    /// Arithmetic precision (the CPU computes fp32 only).
    pub precision: Precision,
    /// Samples per inference.
    pub batch: usize,
    /// Directory with real weights (minilm-l6).
    pub weights: Option<PathBuf>,
    /// Seed for seeded weights and inputs.
    pub seed: u64,
    /// Extra device memory to allocate and touch.
    pub reserve_bytes: u64,
    /// Replay the forward pass as a CUDA graph.
    pub use_graph: bool,
}

impl ModelPlan {
    /// Checks combinations that cannot work, naming the flag to change.
    pub fn validate(&self) -> Result<()> {
        if self.batch == 0 || self.batch > 4096 {
            return Err(WorkloadError::BadArgument(format!(
                "--batch {} is outside 1..=4096",
                self.batch
            )));
        }
        if self.device == Device::Cpu && self.precision != Precision::Fp32 {
            return Err(WorkloadError::BadArgument(format!(
                "--precision {} needs --device cuda; the CPU backend computes fp32",
                self.precision
            )));
        }
        if self.device == Device::Cpu && self.reserve_bytes > 0 {
            return Err(WorkloadError::BadArgument(
                "--reserve-memory reserves GPU memory; it needs --device cuda".into(),
            ));
        }
        match (self.preset, &self.weights) {
            (Preset::MiniLmL6, None) => Err(WorkloadError::BadArgument(
                "minilm-l6 needs --weights DIR (a directory with model.safetensors, config.json and tokenizer.json; `make weights` installs them under .deps/)".into(),
            )),
            (Preset::YolosSmall | Preset::Tiny, Some(_)) => Err(WorkloadError::BadArgument(format!(
                "--weights is only for minilm-l6; {} uses seeded weights",
                self.preset
            ))),
            _ => Ok(()),
        }
    }

    /// The model's weights.
    pub fn load_weights(&self) -> Result<ModelWeights> {
        let config = self.preset.config();
        match &self.weights {
            Some(dir) => ModelWeights::load_bert(&config, dir),
            None => Ok(ModelWeights::seeded(&config, self.seed)),
        }
    }

    /// The serving input.
    pub fn input(&self) -> Result<InputBatch> {
        InputBatch::for_serving(
            &self.preset.config(),
            self.batch,
            self.weights.as_deref(),
            self.seed ^ 0x1A9E,
        )
    }
}

/// What the metrics say about the device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// cuda or cpu.
    pub device: Device,
    /// GPU or CPU model name.
    pub name: String,
    /// Streaming multiprocessors (GPU only).
    pub sm_count: Option<u32>,
    /// Device memory (GPU only).
    pub memory_total_bytes: Option<u64>,
    /// The device's UUID (GPU only; a MIG instance's own inside one).
    pub uuid: Option<String>,
}

/// A ready model and its input.
#[derive(Debug)]
pub enum Engine {
    /// Plain-Rust reference.
    Cpu {
        /// The model.
        model: Box<CpuModel>,
        /// Its fixed input.
        input: InputBatch,
        /// The last output.
        output: Vec<f32>,
        /// Description of the CPU.
        info: DeviceInfo,
        /// Host memory taken by `--grow-memory`.
        grown: Vec<Vec<u8>>,
    },
    /// CUDA.
    #[cfg(feature = "cuda")]
    Cuda {
        /// The model on the GPU.
        model: Box<crate::cuda::CudaModel>,
        /// Description of the GPU.
        info: DeviceInfo,
    },
}

impl Engine {
    /// Loads weights and input and prepares the device (for CUDA: opens the GPU,
    /// compiles kernels, uploads, runs one pass and captures the graph).
    pub fn build(plan: &ModelPlan) -> Result<Self> {
        plan.validate()?;
        match plan.device {
            Device::Cpu => {
                let weights = plan.load_weights()?;
                let input = plan.input()?;
                input.check(&weights.config)?;
                Ok(Engine::Cpu {
                    model: Box::new(CpuModel::new(weights)),
                    input,
                    output: Vec::new(),
                    grown: Vec::new(),
                    info: DeviceInfo {
                        device: Device::Cpu,
                        name: cpu_name(),
                        sm_count: None,
                        memory_total_bytes: None,
                        uuid: None,
                    },
                })
            }
            #[cfg(feature = "cuda")]
            Device::Cuda => {
                // Open the GPU first: a machine without one should say so before any
                // time goes into loading weights.
                let rt = crate::cuda::CudaRuntime::new(0)?;
                let weights = plan.load_weights()?;
                let input = plan.input()?;
                let model = crate::cuda::CudaModel::new(
                    rt,
                    &weights,
                    plan.precision,
                    &input,
                    plan.reserve_bytes,
                    plan.use_graph,
                )?;
                let g = model.gpu().info().clone();
                Ok(Engine::Cuda {
                    model: Box::new(model),
                    info: DeviceInfo {
                        device: Device::Cuda,
                        name: g.name,
                        sm_count: Some(g.sm_count),
                        memory_total_bytes: Some(g.memory_total_bytes),
                        uuid: Some(g.uuid),
                    },
                })
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda => Err(WorkloadError::NoDriver(
                "this build has no CUDA backend (built without the `cuda` feature)".into(),
            )),
        }
    }

    /// Lets `flag` abandon an inference in progress: once it is true, [`infer`](Self::infer)
    /// returns [`WorkloadError::Cancelled`] within milliseconds on the CPU, leaving the
    /// last output as it was. A CUDA pass is milliseconds long and cannot be interrupted
    /// safely mid-graph; the serving loop sees the flag before the next one (and its
    /// watchdog ends the process if a pass never returns).
    pub fn set_cancel(&mut self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        match self {
            Engine::Cpu { model, .. } => model.set_cancel(flag),
            #[cfg(feature = "cuda")]
            Engine::Cuda { .. } => {}
        }
    }

    /// Runs one inference, output copied to the host.
    pub fn infer(&mut self) -> Result<()> {
        match self {
            Engine::Cpu {
                model, input, output, ..
            } => {
                *output = model.forward(input)?;
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Engine::Cuda { model, .. } => model.infer().map(|_| ()),
        }
    }

    /// Takes `bytes` more memory and touches it (`--grow-memory`): device memory on the
    /// GPU, host memory on the CPU. Too little is [`WorkloadError::OutOfMemory`].
    pub fn grow(&mut self, bytes: u64) -> Result<()> {
        match self {
            Engine::Cpu { grown, .. } => {
                let n = usize::try_from(bytes).unwrap_or(usize::MAX);
                let mut v: Vec<u8> = Vec::new();
                v.try_reserve_exact(n).map_err(|_| WorkloadError::OutOfMemory {
                    what: "--grow-memory (host memory on the CPU)".into(),
                    requested: n,
                    free: 0,
                    total: 0,
                })?;
                v.resize(n, 1);
                grown.push(v);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Engine::Cuda { model, .. } => model.grow(bytes),
        }
    }

    /// Faults on purpose (`--inject-fault-after`). On the GPU a kernel writes through an
    /// unmapped address: the returned error ends the context (exit code 5) and needs no
    /// GPU reset. On the CPU, whose threads share nothing with other processes, the
    /// stand-in is aborting the process (SIGABRT), said on stderr first.
    pub fn inject_fault(&mut self) -> WorkloadError {
        match self {
            Engine::Cpu { .. } => {
                eprintln!(
                    "gpushare-workload: --inject-fault-after on the CPU: aborting the process (SIGABRT), the CPU stand-in for a GPU fault"
                );
                std::process::abort()
            }
            #[cfg(feature = "cuda")]
            Engine::Cuda { model, .. } => model.inject_fault(),
        }
    }

    /// The last output.
    pub fn output(&self) -> &[f32] {
        match self {
            Engine::Cpu { output, .. } => output,
            #[cfg(feature = "cuda")]
            Engine::Cuda { model, .. } => model.output(),
        }
    }

    /// The device description.
    pub fn info(&self) -> &DeviceInfo {
        match self {
            Engine::Cpu { info, .. } => info,
            #[cfg(feature = "cuda")]
            Engine::Cuda { info, .. } => info,
        }
    }

    /// Device memory this process allocated (0 on the CPU).
    pub fn gpu_memory_used(&self) -> u64 {
        match self {
            Engine::Cpu { .. } => 0,
            #[cfg(feature = "cuda")]
            Engine::Cuda { model, .. } => model.gpu().allocated_bytes() as u64,
        }
    }

    /// Floating-point operations of one inference.
    pub fn flops(&self) -> f64 {
        match self {
            Engine::Cpu { model, input, .. } => {
                let c = &model.weights().config;
                c.flops_per_sample(input.tokens_per_sample(c)) * input.batch() as f64
            }
            #[cfg(feature = "cuda")]
            Engine::Cuda { model, .. } => model.flops(),
        }
    }
}

/// The CPU's model name from /proc/cpuinfo, or the architecture.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> ModelPlan {
        ModelPlan {
            preset: Preset::Tiny,
            device: Device::Cpu,
            precision: Precision::Fp32,
            batch: 1,
            weights: None,
            seed: 1,
            reserve_bytes: 0,
            use_graph: true,
        }
    }

    #[test]
    fn cpu_rejects_gpu_only_settings() {
        let mut p = plan();
        p.precision = Precision::Bf16;
        assert!(p.validate().is_err());
        let mut p = plan();
        p.reserve_bytes = 1;
        assert!(p.validate().is_err());
        let mut p = plan();
        p.preset = Preset::MiniLmL6;
        let msg = p.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("--weights"), "{msg}");
        assert!(plan().validate().is_ok());
    }

    #[test]
    fn cpu_engine_infers_tiny() {
        let mut e = Engine::build(&plan()).expect("tiny on the CPU builds");
        e.infer().expect("inference runs");
        // 4 detection tokens × (8 classes + 4 box values).
        assert_eq!(e.output().len(), 48);
        assert!(e.output().iter().all(|v| v.is_finite()));
        assert_eq!(e.gpu_memory_used(), 0);
    }
}
