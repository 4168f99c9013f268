//! The GPU operations of the model, each built once into a [`Step`]: a kernel with its
//! launch shape and arguments, or a cuBLASLt product with its plan. Builders check every
//! buffer against the extent the kernel will touch, so a launch never runs off a buffer.
//! A forward pass is a list of steps; it is replayed eagerly (first run, per-step
//! timing) or captured once into a CUDA graph.

use cudarc::driver::CudaFunction;
use cudarc::driver::sys::{CUdeviceptr, CUtensorMap};

use super::gemm::{Epilogue, GemmPlan, GemmShape, Lt};
use super::gpu::{DeviceBuffer, Gpu, cuda_error};
use super::kernels::{Args, AttentionMath, Dtype, Kernel, KernelCache, Launch, launch};
use crate::config::{Precision, VisionShape};
use crate::error::{Result, WorkloadError};

/// What a step spends its time on (the per-kernel split of `bench`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StepKind {
    /// cuBLASLt products (with their fused epilogues).
    Gemm,
    /// Fused attention.
    Attention,
    /// Residual add + layer norm.
    LayerNorm,
    /// Everything else: im2col, embeddings, GELU, gathers, heads, pooling.
    Elementwise,
}

impl StepKind {
    /// Name for tables.
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Gemm => "gemm",
            StepKind::Attention => "attention",
            StepKind::LayerNorm => "layernorm",
            StepKind::Elementwise => "elementwise",
        }
    }
}

#[derive(Debug)]
enum Action {
    Kernel {
        func: CudaFunction,
        launch: Launch,
        args: Args,
    },
    Gemm {
        plan: GemmPlan,
        key: (Epilogue, Precision),
        tuned: bool,
        weight: CUdeviceptr,
        input: CUdeviceptr,
        out: CUdeviceptr,
    },
}

/// One enqueueable operation.
#[derive(Debug)]
pub struct Step {
    /// What it is, e.g. `layer3.fc1`.
    pub name: String,
    /// Its category.
    pub kind: StepKind,
    /// Floating-point operations (products and attention only; 0 for the rest).
    pub flops: f64,
    action: Action,
}

/// The GPU, our kernels and cuBLASLt: everything needed to build and run steps.
#[derive(Debug)]
pub struct CudaRuntime {
    kernels: KernelCache,
    lt: Lt,
    gpu: Gpu,
}

fn need(buf: &DeviceBuffer, bytes: usize, what: &str) -> Result<()> {
    if buf.bytes() < bytes {
        return Err(WorkloadError::Cuda {
            what: format!("preparing {what}"),
            detail: format!("buffer of {} bytes, the kernel touches {bytes}", buf.bytes()),
        });
    }
    Ok(())
}

fn i32_arg(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| WorkloadError::BadArgument(format!("{what} = {v} is too large for the GPU kernels")))
}

impl CudaRuntime {
    /// Launches the fault kernel (one thread writing to the bottom page, which no
    /// allocation has) and waits: the error that ends the context, as the workload
    /// reports it.
    pub fn inject_fault(&mut self) -> WorkloadError {
        const UNMAPPED: u64 = 0x10;
        let f = match self.kernels.get(Kernel::InjectFault) {
            Ok(f) => f,
            Err(e) => return e,
        };
        let cfg = Launch {
            grid: (1, 1, 1),
            block: (1, 1, 1),
            smem: 0,
        };
        if let Err(e) = launch(&self.gpu, &f, cfg, &Args::new().ptr(UNMAPPED), "inject_fault") {
            return e;
        }
        match self.gpu.synchronize() {
            Err(e) => e,
            Ok(()) => WorkloadError::Cuda {
                what: "injecting a fault".into(),
                detail: "a write through an unmapped address returned without a fault".into(),
            },
        }
    }

    /// Opens GPU `ordinal`, compiles and loads our kernels, and opens cuBLASLt.
    pub fn new(ordinal: usize) -> Result<Self> {
        let gpu = Gpu::open(ordinal)?;
        let kernels = KernelCache::load(&gpu)?;
        let lt = Lt::new(&gpu)?;
        Ok(Self { kernels, lt, gpu })
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Whether the products are tuned for a pass replayed as a CUDA graph.
    pub fn tune_for_graphs(&mut self, graphs: bool) {
        self.lt.set_graphs(graphs);
    }

    /// Enqueues a step; a product is tuned on its first run (then run once more).
    pub fn run(&mut self, step: &mut Step) -> Result<()> {
        match &mut step.action {
            Action::Kernel {
                func,
                launch: cfg,
                args,
            } => launch(&self.gpu, func, *cfg, args, &step.name),
            Action::Gemm {
                plan,
                key,
                tuned,
                weight,
                input,
                out,
            } => {
                if !*tuned {
                    plan.tune(&self.gpu, &mut self.lt, *key, *weight, *input, *out)?;
                    *tuned = true;
                }
                plan.enqueue(&self.gpu, &self.lt, *weight, *input, *out)
            }
        }
    }

    /// How many blocks of `kernel`, launched as `launch`, fit on one multiprocessor at
    /// once (registers, shared memory and threads allowing).
    pub(crate) fn resident_blocks(&mut self, kernel: Kernel, launch: &Launch) -> Result<u32> {
        let f = self.kernels.get(kernel)?;
        let threads = launch.block.0 * launch.block.1 * launch.block.2;
        f.occupancy_max_active_blocks_per_multiprocessor(threads, launch.smem as usize, None)
            .map_err(cuda_error(format!("asking the occupancy of {}", kernel.entry())))
    }

    pub(crate) fn kernel_step(
        &mut self,
        name: &str,
        kind: StepKind,
        kernel: Kernel,
        launch: Launch,
        args: Args,
    ) -> Result<Step> {
        Ok(Step {
            name: name.to_string(),
            kind,
            flops: 0.0,
            action: Action::Kernel {
                func: self.kernels.get(kernel)?,
                launch,
                args,
            },
        })
    }

    fn elementwise(&self, n: usize) -> Launch {
        Launch::elementwise(n, self.gpu.info().sm_count)
    }

    /// `out = epilogue(input · weightᵀ + bias)`; buffers in the precision's activation type.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &mut self,
        name: &str,
        precision: Precision,
        weight: &DeviceBuffer,
        bias: &DeviceBuffer,
        input: &DeviceBuffer,
        out: &DeviceBuffer,
        shape: GemmShape,
        epilogue: Epilogue,
    ) -> Result<Step> {
        let es = act_dtype(precision).size();
        need(weight, shape.out * shape.inp * es, name)?;
        need(bias, shape.out * es, name)?;
        need(input, shape.rows * shape.inp * es, name)?;
        need(out, shape.rows * shape.out * es, name)?;
        let plan = GemmPlan::new(shape, precision, epilogue, bias.ptr())?;
        Ok(Step {
            name: name.to_string(),
            kind: StepKind::Gemm,
            flops: shape.flops(),
            action: Action::Gemm {
                plan,
                key: (epilogue, precision),
                tuned: false,
                weight: weight.ptr(),
                input: input.ptr(),
                out: out.ptr(),
            },
        })
    }

    /// Images (f32) to patch rows (activation type).
    pub fn im2col(
        &mut self,
        dt: Dtype,
        pixels: &DeviceBuffer,
        out: &DeviceBuffer,
        v: &VisionShape,
        batch: usize,
    ) -> Result<Step> {
        let n = batch * v.patches() * v.patch_dim();
        need(pixels, batch * v.channels * v.image_h * v.image_w * 4, "im2col input")?;
        need(out, n * dt.size(), "im2col output")?;
        let args = Args::new()
            .ptr(pixels.ptr())
            .ptr(out.ptr())
            .i32(i32_arg(batch, "batch")?)
            .i32(v.channels as i32)
            .i32(v.image_h as i32)
            .i32(v.image_w as i32)
            .i32(v.patch as i32)
            .i32(v.patches_h() as i32)
            .i32(v.patches_w() as i32);
        let cfg = self.elementwise(n);
        self.kernel_step("im2col", StepKind::Elementwise, Kernel::Im2col(dt), cfg, args)
    }

    /// Builds the residual stream from [CLS], patch embeddings, detection tokens and positions.
    #[allow(clippy::too_many_arguments)]
    pub fn assemble_vision(
        &mut self,
        dt: Dtype,
        patch_out: &DeviceBuffer,
        cls: &DeviceBuffer,
        det: &DeviceBuffer,
        pos: &DeviceBuffer,
        x: &DeviceBuffer,
        v: &VisionShape,
        batch: usize,
        hidden: usize,
    ) -> Result<Step> {
        let n = batch * v.tokens() * hidden;
        need(patch_out, batch * v.patches() * hidden * dt.size(), "patch embeddings")?;
        need(cls, hidden * 4, "[CLS] token")?;
        need(det, v.det_tokens * hidden * 4, "detection tokens")?;
        need(pos, v.tokens() * hidden * 4, "position embeddings")?;
        need(x, n * 4, "residual stream")?;
        let args = Args::new()
            .ptr(patch_out.ptr())
            .ptr(cls.ptr())
            .ptr(det.ptr())
            .ptr(pos.ptr())
            .ptr(x.ptr())
            .i32(i32_arg(batch, "batch")?)
            .i32(v.patches() as i32)
            .i32(v.det_tokens as i32)
            .i32(hidden as i32);
        let cfg = self.elementwise(n);
        self.kernel_step(
            "assemble_vision",
            StepKind::Elementwise,
            Kernel::AssembleVision(dt),
            cfg,
            args,
        )
    }

    /// BERT embeddings (before their layer norm) into the residual stream.
    #[allow(clippy::too_many_arguments)]
    pub fn embed_text(
        &mut self,
        ids: &DeviceBuffer,
        word: &DeviceBuffer,
        pos: &DeviceBuffer,
        type0: &DeviceBuffer,
        x: &DeviceBuffer,
        rows: usize,
        seq: usize,
        hidden: usize,
    ) -> Result<Step> {
        need(ids, rows * 4, "token ids")?;
        need(pos, seq * hidden * 4, "position embeddings")?;
        need(type0, hidden * 4, "token type embedding")?;
        need(x, rows * hidden * 4, "residual stream")?;
        // Ids were range-checked against the vocabulary on the host (InputBatch::check).
        let _ = word;
        let args = Args::new()
            .ptr(ids.ptr())
            .ptr(word.ptr())
            .ptr(pos.ptr())
            .ptr(type0.ptr())
            .ptr(x.ptr())
            .i32(i32_arg(rows, "rows")?)
            .i32(seq as i32)
            .i32(hidden as i32);
        let cfg = self.elementwise(rows * hidden);
        self.kernel_step("embed_text", StepKind::Elementwise, Kernel::EmbedText, cfg, args)
    }

    /// Residual add + layer norm (see `norm.cu`).
    #[allow(clippy::too_many_arguments)]
    pub fn add_layer_norm(
        &mut self,
        name: &str,
        dt: Dtype,
        resid: &DeviceBuffer,
        delta: Option<&DeviceBuffer>,
        gamma: &DeviceBuffer,
        beta: &DeviceBuffer,
        out: &DeviceBuffer,
        rows: usize,
        cols: usize,
        eps: f32,
        post: bool,
    ) -> Result<Step> {
        if cols > 1024 {
            return Err(WorkloadError::BadArgument(format!(
                "layer norm over {cols} > 1024 columns"
            )));
        }
        need(resid, rows * cols * 4, name)?;
        if let Some(d) = delta {
            need(d, rows * cols * dt.size(), name)?;
        }
        need(gamma, cols * 4, name)?;
        need(beta, cols * 4, name)?;
        need(out, rows * cols * dt.size(), name)?;
        let args = Args::new()
            .ptr(resid.ptr())
            .ptr(delta.map_or(0, DeviceBuffer::ptr))
            .ptr(gamma.ptr())
            .ptr(beta.ptr())
            .ptr(out.ptr())
            .i32(i32_arg(rows, "rows")?)
            .i32(cols as i32)
            .f32(eps)
            .i32(post as i32);
        // Four rows (warps) per block.
        let cfg = Launch {
            grid: (rows.div_ceil(4) as u32, 1, 1),
            block: (128, 1, 1),
            smem: 0,
        };
        self.kernel_step(name, StepKind::LayerNorm, Kernel::AddLayerNorm(dt), cfg, args)
    }

    /// Fused attention over `[batch·seq, 3H]` QKV into `[batch·seq, H]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &mut self,
        name: &str,
        math: AttentionMath,
        qkv: &DeviceBuffer,
        out: &DeviceBuffer,
        lens: Option<&DeviceBuffer>,
        batch: usize,
        seq: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<Step> {
        if head_dim != 32 && head_dim != 64 {
            return Err(WorkloadError::BadArgument(format!(
                "the GPU attention kernels support head sizes 32 and 64, not {head_dim}"
            )));
        }
        let dt = if matches!(math, AttentionMath::Bf16 | AttentionMath::Bf16Mma) {
            Dtype::Bf16
        } else {
            Dtype::F32
        };
        let es = dt.size();
        let hidden = heads * head_dim;
        need(qkv, batch * seq * 3 * hidden * es, name)?;
        need(out, batch * seq * hidden * es, name)?;
        if let Some(l) = lens {
            need(l, batch * 4, name)?;
        }
        let scale_log2 = std::f32::consts::LOG2_E / (head_dim as f32).sqrt();
        let kernel = self.attention_kernel(math, head_dim);
        let args = match kernel {
            Kernel::AttentionWgmma | Kernel::AttentionWgmmaTf32 => {
                Args::new().tensor_map(&qkv_tensor_map(qkv, batch, seq, hidden, dt)?)
            }
            _ => Args::new().ptr(qkv.ptr()),
        };
        let args = args
            .ptr(out.ptr())
            .ptr(lens.map_or(0, DeviceBuffer::ptr))
            .i32(i32_arg(seq, "sequence length")?)
            .i32(heads as i32)
            .f32(scale_log2);
        let (rows, threads) = kernel.attention_block();
        let cfg = Launch {
            grid: (seq.div_ceil(rows) as u32, heads as u32, i32_arg(batch, "batch")? as u32),
            block: (threads, 1, 1),
            smem: kernel.dynamic_smem(),
        };
        let mut step = self.kernel_step(name, StepKind::Attention, kernel, cfg, args)?;
        step.flops = 4.0 * batch as f64 * seq as f64 * seq as f64 * hidden as f64;
        Ok(step)
    }

    /// The attention kernel `math` runs on this GPU: bf16 and TF32 with head size 64 on
    /// wgmma where the kernels were built for Hopper, otherwise the named one.
    pub fn attention_kernel(&self, math: AttentionMath, head_dim: usize) -> Kernel {
        match math {
            AttentionMath::Bf16 if head_dim == 64 && self.kernels.wgmma() => Kernel::AttentionWgmma,
            AttentionMath::Tf32 if head_dim == 64 && self.kernels.wgmma() => Kernel::AttentionWgmmaTf32,
            m => Kernel::Attention(m, head_dim),
        }
    }

    /// Exact GELU in place over `n` values.
    pub fn gelu(&mut self, name: &str, dt: Dtype, x: &DeviceBuffer, n: usize) -> Result<Step> {
        need(x, n * dt.size(), name)?;
        let args = Args::new().ptr(x.ptr()).i64(n as i64);
        let cfg = self.elementwise(n);
        self.kernel_step(name, StepKind::Elementwise, Kernel::Gelu(dt), cfg, args)
    }

    /// Copies `count` rows from `first` of every sample of `rows_per_sample` rows.
    #[allow(clippy::too_many_arguments)]
    pub fn gather_rows(
        &mut self,
        dt: Dtype,
        src: &DeviceBuffer,
        dst: &DeviceBuffer,
        batch: usize,
        rows_per_sample: usize,
        first: usize,
        count: usize,
        cols: usize,
    ) -> Result<Step> {
        need(src, batch * rows_per_sample * cols * dt.size(), "gather source")?;
        need(dst, batch * count * cols * dt.size(), "gather destination")?;
        if first + count > rows_per_sample {
            return Err(WorkloadError::BadArgument("gathered rows run past the sample".into()));
        }
        let args = Args::new()
            .ptr(src.ptr())
            .ptr(dst.ptr())
            .i32(i32_arg(batch, "batch")?)
            .i32(rows_per_sample as i32)
            .i32(first as i32)
            .i32(count as i32)
            .i32(cols as i32);
        let cfg = self.elementwise(batch * count * cols);
        self.kernel_step(
            "gather_det_tokens",
            StepKind::Elementwise,
            Kernel::GatherRows(dt),
            cfg,
            args,
        )
    }

    /// Detection output: logits and sigmoid boxes as f32 `[rows, classes + 4]`, from the
    /// heads' output rows, `stride` wide: the logits at column 0, the 4 box values at
    /// column `box_col`.
    #[allow(clippy::too_many_arguments)]
    pub fn vision_output(
        &mut self,
        dt: Dtype,
        head: &DeviceBuffer,
        out: &DeviceBuffer,
        rows: usize,
        classes: usize,
        stride: usize,
        box_col: usize,
    ) -> Result<Step> {
        if box_col < classes || box_col + 4 > stride {
            return Err(WorkloadError::BadArgument(format!(
                "head output rows of {stride} cannot hold {classes} logits and 4 box values at column {box_col}"
            )));
        }
        need(head, rows * stride * dt.size(), "head outputs")?;
        need(out, rows * (classes + 4) * 4, "output")?;
        let args = Args::new()
            .ptr(head.ptr())
            .ptr(out.ptr())
            .i32(i32_arg(rows, "rows")?)
            .i32(classes as i32)
            .i32(stride as i32)
            .i32(box_col as i32);
        let cfg = self.elementwise(rows * (classes + 4));
        self.kernel_step(
            "vision_output",
            StepKind::Elementwise,
            Kernel::VisionOutput(dt),
            cfg,
            args,
        )
    }

    /// Sentence embeddings from the f32 residual stream.
    pub fn mean_pool(
        &mut self,
        x: &DeviceBuffer,
        lens: &DeviceBuffer,
        out: &DeviceBuffer,
        batch: usize,
        seq: usize,
        hidden: usize,
    ) -> Result<Step> {
        if hidden > 1024 {
            return Err(WorkloadError::BadArgument(format!(
                "pooling over {hidden} > 1024 columns"
            )));
        }
        need(x, batch * seq * hidden * 4, "pooling input")?;
        need(lens, batch * 4, "sentence lengths")?;
        need(out, batch * hidden * 4, "embeddings")?;
        let args = Args::new()
            .ptr(x.ptr())
            .ptr(lens.ptr())
            .ptr(out.ptr())
            .i32(i32_arg(seq, "sequence length")?)
            .i32(hidden as i32);
        let cfg = Launch {
            grid: (i32_arg(batch, "batch")? as u32, 1, 1),
            block: (hidden.div_ceil(32) as u32 * 32, 1, 1),
            smem: 0,
        };
        self.kernel_step(
            "mean_pool_normalize",
            StepKind::Elementwise,
            Kernel::MeanPoolNormalize,
            cfg,
            args,
        )
    }
}

/// The activation type of a precision.
pub fn act_dtype(precision: Precision) -> Dtype {
    match precision {
        Precision::Bf16 => Dtype::Bf16,
        Precision::Fp32 | Precision::Tf32 => Dtype::F32,
    }
}

/// The attention kernel of a precision.
pub fn attention_math(precision: Precision) -> AttentionMath {
    match precision {
        Precision::Bf16 => AttentionMath::Bf16,
        Precision::Tf32 => AttentionMath::Tf32,
        Precision::Fp32 => AttentionMath::F32,
    }
}

/// The TMA tensor map the wgmma attention kernels read Q, K and V through: the fused QKV
/// matrix as 3·hidden columns × `seq` tokens × `batch` samples of `dt`, boxes of 128 bytes
/// (64 bf16 or 32 f32, one atom of the 128-byte swizzle wgmma reads) × 64 tokens; rows
/// past `seq` read as zeros.
fn qkv_tensor_map(qkv: &DeviceBuffer, batch: usize, seq: usize, hidden: usize, dt: Dtype) -> Result<CUtensorMap> {
    use cudarc::driver::sys::{
        CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion,
        CUtensorMapSwizzle, cuTensorMapEncodeTiled,
    };
    let es = dt.size() as u64;
    let row = 3 * hidden as u64 * es; // bytes
    if !qkv.ptr().is_multiple_of(16) || !row.is_multiple_of(16) {
        return Err(WorkloadError::BadArgument(format!(
            "the TMA attention needs a 16-byte aligned QKV matrix with rows a multiple of 16 bytes (address {:#x}, {row}-byte rows)",
            qkv.ptr()
        )));
    }
    let dims = [3 * hidden as u64, seq as u64, batch as u64];
    let strides = [row, row * seq as u64];
    let boxes = [128 / es as u32, 64, 1];
    let steps = [1u32; 3];
    let mut map = CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer is to a live local array of the rank (3) the call is given
    // (strides: rank - 1); the driver only encodes them into `map`, reading no device
    // memory. The address is the QKV buffer's, which outlives every launch of the step.
    unsafe {
        cuTensorMapEncodeTiled(
            &mut map,
            match dt {
                Dtype::Bf16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                Dtype::F32 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            },
            3,
            qkv.ptr() as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(cuda_error(format!(
        "encoding the attention's TMA tensor map ({batch} × {seq} tokens × {} columns)",
        3 * hidden
    )))?;
    Ok(map)
}
