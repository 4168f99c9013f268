//! Our CUDA kernels: sources (one `.cu` per family), NVRTC compilation, a cache of
//! loaded functions keyed by a typed [`Kernel`] id, and the launch primitive.
//!
//! Compilation needs NVRTC only, not a GPU, so CI compiles every family for sm_90 to
//! catch kernel errors before anyone spends GPU time on them.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUdeviceptr, CUfunction_attribute_enum, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchConfig, CUtensorMap,
};
use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::gpu::{Gpu, cuda_error};
use crate::error::{Result, WorkloadError};

const PRELUDE: &str = include_str!("kernels/prelude.cuh");

/// A kernel source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `elementwise.cu`: im2col, token assembly, embeddings, gathers, GELU, pooling.
    Elementwise,
    /// `norm.cu`: residual add + layer norm.
    Norm,
    /// `attention.cu`: fused attention.
    Attention,
    /// `decoder.cu`: the language-model decoder's kernels.
    Decoder,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 4] = [Family::Elementwise, Family::Norm, Family::Attention, Family::Decoder];

    /// The source file's name.
    pub fn file(self) -> &'static str {
        match self {
            Family::Elementwise => "elementwise.cu",
            Family::Norm => "norm.cu",
            Family::Attention => "attention.cu",
            Family::Decoder => "decoder.cu",
        }
    }

    /// The full source NVRTC compiles: the prelude, then the family's file.
    pub fn source(self) -> String {
        let body = match self {
            Family::Elementwise => include_str!("kernels/elementwise.cu"),
            Family::Norm => include_str!("kernels/norm.cu"),
            Family::Attention => include_str!("kernels/attention.cu"),
            Family::Decoder => include_str!("kernels/decoder.cu"),
        };
        format!("{PRELUDE}\n{body}")
    }
}

/// Element type of activations in a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
    fn suffix(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }
}

/// How the attention kernel multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttentionMath {
    /// bf16 tensor cores, the fastest kernel the GPU has: wgmma on Hopper (sm_90a) for
    /// head size 64, mma.m16n8k16 elsewhere.
    Bf16,
    /// bf16 on mma.m16n8k16 whatever the GPU (the path for GPUs before Hopper; tests and
    /// benches compare it with wgmma).
    Bf16Mma,
    /// TF32 tensor cores on f32 data: wgmma on Hopper (sm_90a) for head size 64,
    /// mma.m16n8k8 elsewhere.
    Tf32,
    /// TF32 on mma.m16n8k8 whatever the GPU (as [`AttentionMath::Bf16Mma`] for bf16).
    Tf32Mma,
    /// Plain f32 FMA.
    F32,
}

/// One kernel entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Images to patch rows.
    Im2col(Dtype),
    /// [CLS] + patches + detection tokens + positions.
    AssembleVision(Dtype),
    /// BERT word + position + type embeddings.
    EmbedText,
    /// Copy a run of rows per sample.
    GatherRows(Dtype),
    /// Logits and sigmoid boxes to f32.
    VisionOutput(Dtype),
    /// Exact GELU in place.
    Gelu(Dtype),
    /// Masked mean pooling + L2 normalisation.
    MeanPoolNormalize,
    /// Residual add + layer norm.
    AddLayerNorm(Dtype),
    /// Fused attention for a head size (32 or 64).
    Attention(AttentionMath, usize),
    /// Fused bf16 attention for head size 64 on wgmma (sm_90a only).
    AttentionWgmma,
    /// Fused TF32 attention for head size 64 on wgmma (sm_90a only).
    AttentionWgmmaTf32,
    /// A write through an invalid address (`--inject-fault-after`).
    InjectFault,
    /// One of the decoder's kernels.
    Decoder(DecoderKernel),
}

/// The decoder's kernels (`decoder.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecoderKernel {
    /// Token embeddings of a row of token ids.
    Embed,
    /// RMSNorm of rows, to bf16.
    RmsNorm,
    /// One token's matrix-vector product, RMSNorm and residual add fused.
    Gemv,
    /// One token's gate/up product with RMSNorm and SwiGLU fused.
    GemvSwiglu,
    /// One token's query/key/value product with RMSNorm, rotary embeddings and the KV
    /// cache's write fused.
    QkvRope,
    /// Rotary embeddings and the KV cache's write.
    RopeCache,
    /// Causal grouped-query attention against the KV cache.
    Attention,
    /// A bf16 residual added to the f32 stream.
    Add,
    /// SwiGLU of interleaved gate/up rows.
    Swiglu,
    /// Greedy sampling into the decoder's state.
    Argmax,
}

impl DecoderKernel {
    /// Every decoder kernel.
    pub const ALL: [DecoderKernel; 10] = [
        DecoderKernel::Embed,
        DecoderKernel::RmsNorm,
        DecoderKernel::Gemv,
        DecoderKernel::GemvSwiglu,
        DecoderKernel::QkvRope,
        DecoderKernel::RopeCache,
        DecoderKernel::Attention,
        DecoderKernel::Add,
        DecoderKernel::Swiglu,
        DecoderKernel::Argmax,
    ];

    fn entry(self) -> &'static str {
        match self {
            DecoderKernel::Embed => "dec_embed",
            DecoderKernel::RmsNorm => "dec_rms_norm",
            DecoderKernel::Gemv => "dec_gemv",
            DecoderKernel::GemvSwiglu => "dec_gemv_swiglu",
            DecoderKernel::QkvRope => "dec_qkv_rope",
            DecoderKernel::RopeCache => "dec_rope_cache",
            DecoderKernel::Attention => "dec_attention",
            DecoderKernel::Add => "dec_add",
            DecoderKernel::Swiglu => "dec_swiglu",
            DecoderKernel::Argmax => "dec_argmax",
        }
    }
}

impl Kernel {
    /// The source file that defines it.
    pub fn family(self) -> Family {
        match self {
            Kernel::AddLayerNorm(_) => Family::Norm,
            Kernel::Decoder(_) => Family::Decoder,
            Kernel::Attention(..) | Kernel::AttentionWgmma | Kernel::AttentionWgmmaTf32 => Family::Attention,
            _ => Family::Elementwise,
        }
    }

    /// The `extern "C"` name, `{op}_{dtype}`.
    pub fn entry(self) -> String {
        match self {
            Kernel::Im2col(d) => format!("im2col_{}", d.suffix()),
            Kernel::AssembleVision(d) => format!("assemble_vision_{}", d.suffix()),
            Kernel::EmbedText => "embed_text_f32".into(),
            Kernel::GatherRows(d) => format!("gather_rows_{}", d.suffix()),
            Kernel::VisionOutput(d) => format!("vision_output_{}", d.suffix()),
            Kernel::Gelu(d) => format!("gelu_{}", d.suffix()),
            Kernel::MeanPoolNormalize => "mean_pool_normalize_f32".into(),
            Kernel::InjectFault => "inject_fault".into(),
            Kernel::AddLayerNorm(d) => format!("add_layernorm_{}", d.suffix()),
            Kernel::Attention(m, d) => {
                let m = match m {
                    AttentionMath::Bf16 | AttentionMath::Bf16Mma => "bf16",
                    AttentionMath::Tf32 | AttentionMath::Tf32Mma => "tf32",
                    AttentionMath::F32 => "f32",
                };
                format!("attention_{m}_d{d}")
            }
            Kernel::AttentionWgmma => "attention_wgmma_bf16_d64".into(),
            Kernel::AttentionWgmmaTf32 => "attention_wgmma_tf32_d64".into(),
            Kernel::Decoder(k) => k.entry().into(),
        }
    }

    /// Dynamic shared memory a launch needs, bytes (the kernel's `extern __shared__`
    /// array). Above 48 KiB the function's limit is raised when it is loaded.
    pub fn dynamic_smem(self) -> u32 {
        match self {
            // Three Q tiles of 64 rows (24 KiB) and a ring of six K + V stages of 128 keys
            // (192 KiB), 1 KiB to align them: one block per multiprocessor.
            Kernel::AttentionWgmma => 217 * 1024,
            // Three Q tiles of 64 rows (48 KiB), two stages of K and transposed V of 128 keys
            // (128 KiB) and one V tile as it lands (32 KiB) in f32, 1 KiB to align them.
            Kernel::AttentionWgmmaTf32 => 209 * 1024,
            _ => 0,
        }
    }

    /// Query rows and threads of one block of an attention kernel.
    pub fn attention_block(self) -> (usize, u32) {
        match self {
            // A producer warpgroup and three consumers of 64 rows each.
            Kernel::AttentionWgmma | Kernel::AttentionWgmmaTf32 => (192, 512),
            Kernel::Attention(AttentionMath::F32, _) => (64, 256),
            _ => (64, 128),
        }
    }

    /// The entry points only a Hopper build (`sm_90a`) defines.
    pub fn hopper() -> Vec<Kernel> {
        vec![Kernel::AttentionWgmma, Kernel::AttentionWgmmaTf32]
    }

    /// Every entry point the sources define (for the compile test).
    pub fn all() -> Vec<Kernel> {
        let mut all = vec![Kernel::EmbedText, Kernel::MeanPoolNormalize, Kernel::InjectFault];
        all.extend(DecoderKernel::ALL.map(Kernel::Decoder));
        for d in [Dtype::F32, Dtype::Bf16] {
            all.extend([
                Kernel::Im2col(d),
                Kernel::AssembleVision(d),
                Kernel::GatherRows(d),
                Kernel::VisionOutput(d),
                Kernel::Gelu(d),
                Kernel::AddLayerNorm(d),
            ]);
        }
        for m in [AttentionMath::Bf16, AttentionMath::Tf32, AttentionMath::F32] {
            for d in [32, 64] {
                all.push(Kernel::Attention(m, d));
            }
        }
        all
    }
}

/// Compiled code for one family.
#[derive(Debug, Clone)]
pub struct CompiledFamily {
    /// The family.
    pub family: Family,
    /// A CUBIN for `sm_XX` targets.
    pub image: Vec<u8>,
    /// NVRTC's log (ptxas resource usage when `verbose`).
    pub log: String,
}

/// NVRTC's version, or a clear error when libnvrtc is missing.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    nvrtc_present()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| WorkloadError::KernelCompile {
            module: "nvrtc".into(),
            log: format!("{e:?}"),
        })?;
    Ok((major, minor))
}

fn nvrtc_present() -> Result<()> {
    // SAFETY: only tries to dlopen the library.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(WorkloadError::MissingLibrary {
            library: "libnvrtc.so.13".into(),
            hint: "install the CUDA 13 toolkit's NVRTC (or the PyPI wheel nvidia-cuda-nvrtc) and add its lib directory to LD_LIBRARY_PATH".into(),
        })
    }
}

/// Compiles one family to a CUBIN for `arch` (e.g. `sm_90`). Needs NVRTC, not a GPU.
pub fn compile_family(family: Family, arch: &str, verbose: bool) -> Result<CompiledFamily> {
    use cudarc::nvrtc::sys;
    nvrtc_present()?;
    let fail = |log: String| WorkloadError::KernelCompile {
        module: family.file().into(),
        log,
    };
    let src = CString::new(family.source()).map_err(|_| fail("source contains a NUL byte".into()))?;
    let name = CString::new(family.file()).map_err(|_| fail("bad name".into()))?;
    let prog = cudarc::nvrtc::result::create_program(&src, Some(&name)).map_err(|e| fail(format!("{e:?}")))?;
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--fmad=true".to_string(),
    ];
    if verbose {
        options.push("--ptxas-options=-v".into());
    }
    // SAFETY: `prog` is a live program; the options outlive the call.
    let compiled = unsafe { cudarc::nvrtc::result::compile_program(prog, &options) };
    // SAFETY: as above.
    let log = unsafe { cudarc::nvrtc::result::get_program_log(prog) }
        .map(|raw| {
            // SAFETY: NVRTC returns a NUL-terminated string.
            unsafe { CStr::from_ptr(raw.as_ptr()) }.to_string_lossy().into_owned()
        })
        .unwrap_or_default();
    let result = compiled.map_err(|e| fail(format!("{e:?}\n{log}"))).and_then(|()| {
        let mut size = 0usize;
        // SAFETY: `prog` compiled successfully; `image` has `size` bytes.
        unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
            .result()
            .map_err(|e| fail(format!("no CUBIN for {arch}: {e:?}")))?;
        let mut image = vec![0u8; size];
        // SAFETY: as above.
        unsafe { sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()) }
            .result()
            .map_err(|e| fail(format!("{e:?}")))?;
        Ok(image)
    });
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
    Ok(CompiledFamily {
        family,
        image: result?,
        log,
    })
}

/// The NVRTC target for a GPU of compute capability `cc` (pure): Hopper's
/// architecture-specific `sm_90a`, whose wgmma the bf16 and TF32 attention use, else `sm_XY`.
pub fn target_arch(cc: (i32, i32)) -> String {
    match cc {
        (9, 0) => "sm_90a".into(),
        (major, minor) => format!("sm_{major}{minor}"),
    }
}

/// Loaded kernel modules and their functions, on one GPU.
#[derive(Debug)]
pub struct KernelCache {
    modules: HashMap<Family, Arc<CudaModule>>,
    functions: HashMap<Kernel, CudaFunction>,
    arch: String,
}

impl KernelCache {
    /// Compiles every family for this GPU's architecture and loads it.
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let arch = target_arch(gpu.info().compute_capability);
        let mut modules = HashMap::new();
        for family in Family::ALL {
            let compiled = compile_family(family, &arch, false)?;
            let module = gpu
                .context()
                .load_module(Ptx::from_binary(compiled.image))
                .map_err(cuda_error(format!("loading kernels {}", family.file())))?;
            modules.insert(family, module);
        }
        Ok(Self {
            modules,
            functions: HashMap::new(),
            arch,
        })
    }

    /// Whether the kernels were built with Hopper's wgmma ([`Kernel::hopper`]).
    pub fn wgmma(&self) -> bool {
        self.arch == "sm_90a"
    }

    /// The function for `kernel`, loaded on first use.
    pub fn get(&mut self, kernel: Kernel) -> Result<CudaFunction> {
        if let Some(f) = self.functions.get(&kernel) {
            return Ok(f.clone());
        }
        let module = &self.modules[&kernel.family()];
        let f = module
            .load_function(&kernel.entry())
            .map_err(cuda_error(format!("finding kernel {}", kernel.entry())))?;
        let smem = kernel.dynamic_smem();
        if smem > 48 * 1024 {
            f.set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(cuda_error(format!(
                "allowing {} {smem} bytes of shared memory",
                kernel.entry()
            )))?;
        }
        self.functions.insert(kernel, f.clone());
        Ok(f)
    }
}

/// Kernel parameters, each in 8-byte slots (the driver reads as many bytes as the
/// parameter's type has, from its first slot's start: little-endian values fit).
#[derive(Debug, Default, Clone)]
pub struct Args {
    slots: Vec<u64>,
    /// The first slot of each parameter.
    starts: Vec<usize>,
}

impl Args {
    /// No parameters yet.
    pub fn new() -> Self {
        Self::default()
    }
    /// One parameter of `slots.len()` 8-byte slots.
    fn push(mut self, slots: &[u64]) -> Self {
        self.starts.push(self.slots.len());
        self.slots.extend_from_slice(slots);
        self
    }
    /// A device pointer.
    pub fn ptr(self, p: CUdeviceptr) -> Self {
        self.push(&[p])
    }
    /// A TMA tensor map, passed by value (a `__grid_constant__` parameter).
    pub fn tensor_map(self, map: &CUtensorMap) -> Self {
        self.push(&map.opaque)
    }
    /// A null pointer.
    pub fn null(self) -> Self {
        self.ptr(0)
    }
    /// An `int`.
    pub fn i32(self, v: i32) -> Self {
        self.push(&[v as u32 as u64])
    }
    /// A `long`.
    pub fn i64(self, v: i64) -> Self {
        self.push(&[v as u64])
    }
    /// A `float`.
    pub fn f32(self, v: f32) -> Self {
        self.push(&[v.to_bits() as u64])
    }
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    /// Blocks.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory, bytes ([`Kernel::dynamic_smem`]).
    pub smem: u32,
}

impl Launch {
    /// A grid-stride launch over `n` elements: 256 threads a block, at most 32 blocks
    /// per multiprocessor.
    pub fn elementwise(n: usize, sm_count: u32) -> Self {
        let blocks = n.div_ceil(256).clamp(1, sm_count as usize * 32) as u32;
        Self {
            grid: (blocks, 1, 1),
            block: (256, 1, 1),
            smem: 0,
        }
    }
}

/// Enqueues `f` on the GPU's stream. On compute capability 9.0 and later it goes with
/// programmatic stream serialization ([`programmatic_launch`]): the kernel may be
/// scheduled while the kernel before it drains, and waits for it in its first
/// instruction (`wait_prior_grid` in `prelude.cuh`, which every entry point calls).
pub fn launch(gpu: &Gpu, f: &CudaFunction, cfg: Launch, args: &Args, name: &str) -> Result<()> {
    let mut params: Vec<*mut c_void> = args
        .starts
        .iter()
        .map(|&i| &args.slots[i] as *const u64 as *mut c_void)
        .collect();
    let mut attrs = [programmatic_attribute()];
    let pdl = programmatic_launch(gpu.info().compute_capability);
    let config = CUlaunchConfig {
        gridDimX: cfg.grid.0,
        gridDimY: cfg.grid.1,
        gridDimZ: cfg.grid.2,
        blockDimX: cfg.block.0,
        blockDimY: cfg.block.1,
        blockDimZ: cfg.block.2,
        sharedMemBytes: cfg.smem,
        hStream: gpu.stream().cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: u32::from(pdl),
    };
    // SAFETY: `f` belongs to a module held by the KernelCache, alive for the call; each
    // parameter points at a slot that lives until cuLaunchKernelEx returns (it copies
    // them), and so do `config` and the attribute it points at; the kernel's signature
    // matches the Args built by its one caller in `ops.rs`, which also checks every
    // buffer's size against the launch's extent.
    unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .map_err(cuda_error(format!("launching {name}")))
}

/// Whether kernels on a GPU of this compute capability are launched with programmatic
/// stream serialization: from Hopper (9.0), where `griddepcontrol.wait` exists.
pub fn programmatic_launch(compute_capability: (i32, i32)) -> bool {
    compute_capability.0 >= 9
}

/// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, allowed.
fn programmatic_attribute() -> CUlaunchAttribute {
    // SAFETY: CUlaunchAttribute is plain C data (an id, padding, a union of integers and
    // plain structs), for which all-zero bytes are a valid value.
    let mut a: CUlaunchAttribute = unsafe { std::mem::zeroed() };
    a.id = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    a.value.programmaticStreamSerializationAllowed = 1;
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_follow_op_dtype() {
        assert_eq!(Kernel::AddLayerNorm(Dtype::Bf16).entry(), "add_layernorm_bf16");
        assert_eq!(Kernel::Attention(AttentionMath::Tf32, 64).entry(), "attention_tf32_d64");
        assert_eq!(Kernel::Im2col(Dtype::F32).family(), Family::Elementwise);
    }

    #[test]
    fn programmatic_launch_starts_at_hopper() {
        assert!(!programmatic_launch((8, 9)));
        assert!(programmatic_launch((9, 0)));
        assert!(programmatic_launch((10, 0)));
        let a = programmatic_attribute();
        assert_eq!(
            a.id,
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        );
        // SAFETY: the field was the one written.
        assert_eq!(unsafe { a.value.programmaticStreamSerializationAllowed }, 1);
    }

    #[test]
    fn args_pack_little_endian_slots() {
        let a = Args::new().ptr(0x1000).i32(-1).f32(1.5).i64(7);
        assert_eq!(a.slots, vec![0x1000, 0xffff_ffff, 1.5f32.to_bits() as u64, 7]);
        assert_eq!(a.starts, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_tensor_map_is_one_parameter_of_sixteen_slots() {
        let map = CUtensorMap {
            opaque: std::array::from_fn(|i| i as u64),
        };
        let a = Args::new().tensor_map(&map).ptr(0x2000).i32(3);
        assert_eq!(a.starts, vec![0, 16, 17]);
        assert_eq!(&a.slots[..16], &map.opaque);
        assert_eq!(a.slots[16..], [0x2000, 3]);
    }
}
