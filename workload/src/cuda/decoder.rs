//! The decoder on the GPU (`kernels/decoder.cu`), computing what [`crate::decoder::cpu`]
//! computes: bf16 weights, an f32 residual stream, bf16 activations between products and
//! a bf16 KV cache.
//!
//! A decode step (one token) is a chain of our own kernels, captured once as a CUDA graph
//! and replayed for every token: per block, the fused query/key/value product with the
//! RMSNorm, rotary embeddings and the cache write folded in, attention against the
//! cache, the output product adding into the residual stream, the gate/up product with
//! the norm and SwiGLU folded in, and the down product adding into the stream; then the
//! final norm with the output projection, and greedy sampling. Each product is one warp
//! per output row (or pair of rows) reading the weights once, 16 bytes per lane at a
//! time, with no more blocks than the GPU holds at once: every block issues its first
//! weight loads before it waits for the kernel before it, so a step is bound by reading
//! every weight once from memory. The position and the last token live on the device,
//! so the graph takes no parameters.
//!
//! A prompt is prefilled in chunks of up to [`PREFILL_ROWS`] positions: cuBLASLt
//! products (tensor cores) on the chunk's rows, padded to a multiple of
//! [`PREFILL_ALIGN`] so that few shapes are tuned, and the same attention kernel with a
//! causal limit per row.

use std::collections::HashMap;

use cudarc::driver::CudaGraph;
use cudarc::driver::result;
use cudarc::driver::sys::CUdeviceptr;

use super::gemm::{Epilogue, GemmShape};
use super::gpu::{DeviceBuffer, PinnedF32, capture_graph, cuda_error, time_min_ms};
use super::kernels::{Args, DecoderKernel, Kernel, Launch};
use super::ops::{CudaRuntime, Step, StepKind};
use crate::config::Precision;
use crate::decoder::cpu::request_problem;
use crate::decoder::{DecoderConfig, DecoderWeights};
use crate::error::{Result, WorkloadError};

/// The most positions one prefill chunk computes at once.
pub const PREFILL_ROWS: usize = 256;
/// A chunk's products run on its rows rounded up to a multiple of this.
pub const PREFILL_ALIGN: usize = 32;
/// Warps (output rows in flight) per block of the matrix-vector kernel.
const GEMV_WARPS: usize = 8;
/// Threads per block of the attention kernel.
const ATTENTION_THREADS: usize = 256;
/// The widest head the attention kernel takes (the widths its GPU tests cover).
const MAX_HEAD_DIM: usize = 128;
/// Shared memory a kernel may use without asking for more.
const SMEM_LIMIT: usize = 48 * 1024;

/// Why a shape cannot run on the GPU kernels (None: it can), beyond
/// [`DecoderConfig::problem`].
pub fn gpu_problem(c: &DecoderConfig) -> Option<String> {
    if let Some(p) = c.problem() {
        return Some(p);
    }
    let d = c.head_dim();
    if !d.is_multiple_of(16) || d > MAX_HEAD_DIM {
        return Some(format!(
            "head width {d}: the GPU attention needs a multiple of 16 up to {MAX_HEAD_DIM}"
        ));
    }
    if !c.hidden.is_multiple_of(8) || !c.ffn.is_multiple_of(8) {
        return Some(format!(
            "hidden {} and ffn {} must be multiples of 8 (16-byte rows)",
            c.hidden, c.ffn
        ));
    }
    // The input in shared memory, and the kernel's 32 floats of reductions.
    if c.hidden.max(c.ffn) * 4 + 128 > SMEM_LIMIT {
        return Some(format!(
            "an input of {} values does not fit the product kernel's shared memory",
            c.hidden.max(c.ffn)
        ));
    }
    if attention_smem(c) > SMEM_LIMIT {
        return Some(format!(
            "max_len {} does not fit the attention kernel's shared memory",
            c.max_len
        ));
    }
    None
}

/// The attention kernel's shared memory: the query, reductions, one score per position
/// and the partial outputs.
fn attention_smem(c: &DecoderConfig) -> usize {
    // The scores' region is rounded up to four floats, so the partial outputs after it
    // are 16-byte aligned.
    (c.head_dim() + 32 + c.max_len.next_multiple_of(4) + ATTENTION_THREADS * 8) * 4
}

/// Rows padded for a chunk's products.
pub fn padded_rows(rows: usize) -> usize {
    rows.div_ceil(PREFILL_ALIGN) * PREFILL_ALIGN
}

/// One block's weights and KV cache on the device.
#[derive(Debug)]
struct Block {
    attn_norm: DeviceBuffer,
    /// `[hidden + 2·kv_dim, hidden]`: the query, key and value projections stacked.
    qkv: DeviceBuffer,
    wo: DeviceBuffer,
    mlp_norm: DeviceBuffer,
    /// `[2·ffn, hidden]`: gate row j, then up row j.
    gate_up: DeviceBuffer,
    down: DeviceBuffer,
    k_cache: DeviceBuffer,
    v_cache: DeviceBuffer,
}

/// Activations for up to [`PREFILL_ROWS`] positions (a decode step uses row 0).
#[derive(Debug)]
struct Scratch {
    /// The prompt chunk's token ids (i32).
    tokens: DeviceBuffer,
    /// The residual stream, f32.
    x: DeviceBuffer,
    /// RMSNorm's output (prefill), bf16.
    normed: DeviceBuffer,
    /// Queries, keys and values, bf16.
    qkv: DeviceBuffer,
    /// Attention's output, bf16.
    attn: DeviceBuffer,
    /// A product's output before the residual add (prefill), bf16.
    proj: DeviceBuffer,
    /// Gate and up outputs, interleaved (prefill), bf16.
    gate_up: DeviceBuffer,
    /// SwiGLU's output, bf16.
    act: DeviceBuffer,
    /// Logits, f32.
    logits: DeviceBuffer,
    /// Zeros: the products' bias.
    zero_bias: DeviceBuffer,
}

/// The decoder on one GPU with its KV cache.
pub struct CudaDecoder {
    rt: CudaRuntime,
    config: DecoderConfig,
    embed: DeviceBuffer,
    blocks: Vec<Block>,
    norm: DeviceBuffer,
    lm_head: DeviceBuffer,
    s: Scratch,
    /// `[positions cached, last token, logits were not numbers, unused]`, i32.
    state: DeviceBuffer,
    readback: PinnedF32,
    /// Positions in the cache (the host's copy of `state[0]`).
    len: usize,
    graphs: bool,
    step: Vec<Step>,
    step_graph: Option<CudaGraph>,
    /// The products of a prefill chunk, per padded row count.
    prefill: HashMap<usize, Vec<[Step; 4]>>,
}

impl CudaDecoder {
    /// Uploads `w` (rounded to bf16) to the GPU of `rt`, with an empty KV cache of
    /// `max_len` positions; `graphs` replays each decode step as a CUDA graph.
    pub fn new(mut rt: CudaRuntime, w: &DecoderWeights, graphs: bool) -> Result<Self> {
        let c = w.config;
        if let Some(p) = gpu_problem(&c) {
            return Err(WorkloadError::BadArgument(format!(
                "this decoder shape cannot run on the GPU: {p}"
            )));
        }
        rt.tune_for_graphs(false);
        let gpu = rt.gpu();
        let (h, kv, f) = (c.hidden, c.kv_dim(), c.ffn);
        let bf16 = |v: &[f32], what: &str| gpu.upload_bf16(v, what);
        let blocks = w
            .blocks
            .iter()
            .map(|b| {
                let qkv: Vec<f32> = [&b.wq.data[..], &b.wk.data, &b.wv.data].concat();
                let mut gate_up = Vec::with_capacity(2 * f * h);
                for j in 0..f {
                    gate_up.extend_from_slice(b.gate.row(j));
                    gate_up.extend_from_slice(b.up.row(j));
                }
                Ok(Block {
                    attn_norm: bf16(&b.attn_norm, "a norm's gain")?,
                    qkv: bf16(&qkv, "query/key/value weights")?,
                    wo: bf16(&b.wo.data, "attention output weights")?,
                    mlp_norm: bf16(&b.mlp_norm, "a norm's gain")?,
                    gate_up: bf16(&gate_up, "gate/up weights")?,
                    down: bf16(&b.down.data, "down weights")?,
                    k_cache: gpu.alloc_zeroed(c.max_len * kv * 2, "the key cache")?,
                    v_cache: gpu.alloc_zeroed(c.max_len * kv * 2, "the value cache")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let rows = PREFILL_ROWS.min(padded_rows(c.max_len));
        let zeroed = |bytes: usize, what: &str| gpu.alloc_zeroed(bytes, what);
        let s = Scratch {
            tokens: zeroed(rows * 4, "prompt tokens")?,
            x: zeroed(rows * h * 4, "the residual stream")?,
            normed: zeroed(rows * h * 2, "normalised rows")?,
            qkv: zeroed(rows * (h + 2 * kv) * 2, "queries, keys and values")?,
            attn: zeroed(rows * h * 2, "attention outputs")?,
            proj: zeroed(rows * h * 2, "product outputs")?,
            gate_up: zeroed(rows * 2 * f * 2, "gate/up outputs")?,
            act: zeroed(rows * f * 2, "SwiGLU outputs")?,
            logits: zeroed(c.vocab * 4, "logits")?,
            zero_bias: zeroed((2 * f).max(h + 2 * kv) * 2, "a zero bias")?,
        };
        let state = zeroed(16, "the decoder's state")?;
        let readback = gpu.alloc_pinned_f32(4, "the decoder's state")?;
        let embed = bf16(&w.embed.data, "token embeddings")?;
        let norm = bf16(&w.norm, "the final norm's gain")?;
        let lm_head = bf16(&w.lm_head.data, "the output projection")?;
        let mut d = Self {
            rt,
            config: c,
            embed,
            blocks,
            norm,
            lm_head,
            s,
            state,
            readback,
            len: 0,
            graphs,
            step: Vec::new(),
            step_graph: None,
            prefill: HashMap::new(),
        };
        d.step = d.decode_steps()?;
        Ok(d)
    }

    /// The shape.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// Positions in the cache.
    pub fn cached(&self) -> usize {
        self.len
    }

    /// The runtime (its GPU's description).
    pub fn runtime(&self) -> &CudaRuntime {
        &self.rt
    }

    fn kernel(&mut self, name: &str, k: DecoderKernel, launch: Launch, args: Args) -> Result<Step> {
        let kind = match k {
            DecoderKernel::Gemv | DecoderKernel::GemvSwiglu | DecoderKernel::QkvRope => StepKind::Gemm,
            DecoderKernel::Attention => StepKind::Attention,
            DecoderKernel::RmsNorm => StepKind::LayerNorm,
            _ => StepKind::Elementwise,
        };
        self.rt.kernel_step(name, kind, Kernel::Decoder(k), launch, args)
    }

    fn grid_stride(&self, n: usize) -> Launch {
        Launch::elementwise(n, self.rt.gpu().info().sm_count)
    }

    /// A launch of one of the products for one token (`dec_gemv`, `dec_gemv_swiglu`,
    /// `dec_qkv_rope`): one warp per unit of rows, an input of `k` floats in shared
    /// memory, and no more blocks than fit on the GPU at once, so that every block's
    /// first loads are issued while the kernel before it finishes.
    fn product_launch(&mut self, kernel: DecoderKernel, units: usize, k: usize) -> Result<Launch> {
        let mut launch = Launch {
            grid: (1, 1, 1),
            block: ((GEMV_WARPS * 32) as u32, 1, 1),
            smem: (k * 4) as u32,
        };
        let sms = self.rt.gpu().info().sm_count as usize;
        let resident = self.rt.resident_blocks(Kernel::Decoder(kernel), &launch)?.max(1) as usize;
        launch.grid.0 = units.div_ceil(GEMV_WARPS).clamp(1, sms * resident) as u32;
        Ok(launch)
    }

    /// `out = W · norm(x)` for one token (see `dec_gemv`); `mode` 0, 1 or 3.
    #[allow(clippy::too_many_arguments)]
    fn gemv(
        &mut self,
        name: &str,
        w: CUdeviceptr,
        input: (Option<CUdeviceptr>, Option<CUdeviceptr>),
        gain: Option<CUdeviceptr>,
        out: CUdeviceptr,
        (rows, k): (usize, usize),
        mode: i32,
    ) -> Result<Step> {
        let launch = self.product_launch(DecoderKernel::Gemv, rows, k)?;
        let opt = |a: Args, p: Option<CUdeviceptr>| match p {
            Some(p) => a.ptr(p),
            None => a.null(),
        };
        let args = opt(opt(Args::new().ptr(w), input.0), input.1);
        let args = opt(args, gain)
            .f32(self.config.eps)
            .ptr(out)
            .i32(rows as i32)
            .i32(k as i32)
            .i32(mode);
        self.kernel(name, DecoderKernel::Gemv, launch, args)
    }

    /// Layer `l`'s gate/up product with its norm and SwiGLU, for the decode step.
    fn gate_up(&mut self, name: &str, l: usize) -> Result<Step> {
        let c = self.config;
        let launch = self.product_launch(DecoderKernel::GemvSwiglu, c.ffn, c.hidden)?;
        let args = Args::new()
            .ptr(self.blocks[l].gate_up.ptr())
            .ptr(self.s.x.ptr())
            .ptr(self.blocks[l].mlp_norm.ptr())
            .f32(c.eps)
            .ptr(self.s.act.ptr())
            .i32(c.ffn as i32)
            .i32(c.hidden as i32);
        self.kernel(name, DecoderKernel::GemvSwiglu, launch, args)
    }

    /// Layer `l`'s query/key/value product with its norm, rotary embeddings and the
    /// cache's write, for the decode step.
    fn qkv_rope(&mut self, name: &str, l: usize) -> Result<Step> {
        let c = self.config;
        let units = (c.hidden + 2 * c.kv_dim()) / 2;
        let launch = self.product_launch(DecoderKernel::QkvRope, units, c.hidden)?;
        let b = &self.blocks[l];
        let args = Args::new()
            .ptr(b.qkv.ptr())
            .ptr(self.s.x.ptr())
            .ptr(b.attn_norm.ptr())
            .f32(c.eps)
            .ptr(self.s.qkv.ptr())
            .ptr(b.k_cache.ptr())
            .ptr(b.v_cache.ptr())
            .ptr(self.state.ptr())
            .i32(c.heads as i32)
            .i32(c.kv_heads as i32)
            .i32(c.head_dim() as i32)
            .f32(c.rope_theta)
            .i32(c.hidden as i32);
        self.kernel(name, DecoderKernel::QkvRope, launch, args)
    }

    fn rope_cache(&mut self, name: &str, l: usize, rows: usize) -> Result<Step> {
        let c = self.config;
        let n = rows * (c.heads + c.kv_heads) * c.head_dim() / 2 + rows * c.kv_dim();
        let args = Args::new()
            .ptr(self.s.qkv.ptr())
            .ptr(self.blocks[l].k_cache.ptr())
            .ptr(self.blocks[l].v_cache.ptr())
            .ptr(self.state.ptr())
            .i32(rows as i32)
            .i32(c.heads as i32)
            .i32(c.kv_heads as i32)
            .i32(c.head_dim() as i32)
            .f32(c.rope_theta);
        let launch = self.grid_stride(n);
        self.kernel(name, DecoderKernel::RopeCache, launch, args)
    }

    fn attention(&mut self, name: &str, l: usize, rows: usize) -> Result<Step> {
        let c = self.config;
        let launch = Launch {
            grid: (c.heads as u32, rows as u32, 1),
            block: (ATTENTION_THREADS as u32, 1, 1),
            smem: attention_smem(&c) as u32,
        };
        let args = Args::new()
            .ptr(self.s.qkv.ptr())
            .ptr(self.blocks[l].k_cache.ptr())
            .ptr(self.blocks[l].v_cache.ptr())
            .ptr(self.s.attn.ptr())
            .ptr(self.state.ptr())
            .i32(c.heads as i32)
            .i32(c.kv_heads as i32)
            .i32(c.head_dim() as i32)
            .i32(c.max_len as i32);
        self.kernel(name, DecoderKernel::Attention, launch, args)
    }

    fn embed_step(&mut self, tokens: CUdeviceptr, rows: usize) -> Result<Step> {
        let h = self.config.hidden;
        let args = Args::new()
            .ptr(self.embed.ptr())
            .ptr(tokens)
            .ptr(self.s.x.ptr())
            .i32(rows as i32)
            .i32(h as i32);
        let launch = self.grid_stride(rows * h);
        self.kernel("embed", DecoderKernel::Embed, launch, args)
    }

    /// The output projection of the residual stream's row `row` with the final norm, then
    /// greedy sampling that moves the cached length on by `advance`.
    fn head_steps(&mut self, row: usize, advance: usize) -> Result<[Step; 2]> {
        let c = self.config;
        let x = self.s.x.ptr() + (row * c.hidden * 4) as u64;
        let (lm, norm, logits) = (self.lm_head.ptr(), self.norm.ptr(), self.s.logits.ptr());
        let head = self.gemv(
            "lm_head",
            lm,
            (Some(x), None),
            Some(norm),
            logits,
            (c.vocab, c.hidden),
            3,
        )?;
        let args = Args::new()
            .ptr(logits)
            .i32(c.vocab as i32)
            .ptr(self.state.ptr())
            .i32(advance as i32);
        let launch = Launch {
            grid: (1, 1, 1),
            block: (1024, 1, 1),
            smem: 0,
        };
        Ok([head, self.kernel("argmax", DecoderKernel::Argmax, launch, args)?])
    }

    /// One decode step: the token in `state[1]` at position `state[0]`.
    fn decode_steps(&mut self) -> Result<Vec<Step>> {
        let c = self.config;
        let (h, f) = (c.hidden, c.ffn);
        let (x, attn, act) = (self.s.x.ptr(), self.s.attn.ptr(), self.s.act.ptr());
        let mut steps = vec![self.embed_step(self.state.ptr() + 4, 1)?];
        for l in 0..c.layers {
            let (wo, down) = (self.blocks[l].wo.ptr(), self.blocks[l].down.ptr());
            steps.push(self.qkv_rope(&format!("layer{l}.qkv"), l)?);
            steps.push(self.attention(&format!("layer{l}.attention"), l, 1)?);
            steps.push(self.gemv(&format!("layer{l}.o"), wo, (None, Some(attn)), None, x, (h, h), 1)?);
            steps.push(self.gate_up(&format!("layer{l}.gate_up"), l)?);
            steps.push(self.gemv(&format!("layer{l}.down"), down, (None, Some(act)), None, x, (h, f), 1)?);
        }
        steps.extend(self.head_steps(0, 1)?);
        Ok(steps)
    }

    /// The chunk's products for `padded` rows, built (and tuned on first run) once per
    /// padded row count: per block, query/key/value, output, gate/up and down.
    fn products(&mut self, padded: usize) -> Result<Vec<[Step; 4]>> {
        if let Some(p) = self.prefill.remove(&padded) {
            return Ok(p);
        }
        (0..self.config.layers)
            .map(|l| {
                Ok([
                    self.product(l, 0, padded)?,
                    self.product(l, 1, padded)?,
                    self.product(l, 2, padded)?,
                    self.product(l, 3, padded)?,
                ])
            })
            .collect()
    }

    /// Block `l`'s product `site` (query/key/value, output, gate/up, down) on `padded` rows.
    fn product(&mut self, l: usize, site: usize, padded: usize) -> Result<Step> {
        let c = self.config;
        let (h, kv, f) = (c.hidden, c.kv_dim(), c.ffn);
        let (b, s) = (&self.blocks[l], &self.s);
        let (name, w, input, out, n, k) = match site {
            0 => ("qkv", &b.qkv, &s.normed, &s.qkv, h + 2 * kv, h),
            1 => ("o", &b.wo, &s.attn, &s.proj, h, h),
            2 => ("gate_up", &b.gate_up, &s.normed, &s.gate_up, 2 * f, h),
            _ => ("down", &b.down, &s.act, &s.proj, h, f),
        };
        let shape = GemmShape {
            rows: padded,
            out: n,
            inp: k,
        };
        self.rt.linear(
            &format!("layer{l}.{name}[{padded}]"),
            Precision::Bf16,
            w,
            &s.zero_bias,
            input,
            out,
            shape,
            Epilogue::Bias,
        )
    }

    /// Enqueues a prefill chunk of `rows` positions (its tokens uploaded, `state[0]` at its
    /// first position), ending with the output projection and sampling when `last`.
    fn prefill_chunk(&mut self, rows: usize, last: bool) -> Result<()> {
        let padded = padded_rows(rows);
        let mut products = self.products(padded)?;
        let ran = self.enqueue_chunk(rows, last, &mut products);
        self.prefill.insert(padded, products);
        ran
    }

    fn enqueue_chunk(&mut self, rows: usize, last: bool, products: &mut [[Step; 4]]) -> Result<()> {
        let c = self.config;
        let (h, f) = (c.hidden, c.ffn);
        let (x, normed, gu, act, proj) = (
            self.s.x.ptr(),
            self.s.normed.ptr(),
            self.s.gate_up.ptr(),
            self.s.act.ptr(),
            self.s.proj.ptr(),
        );
        let norm_launch = Launch {
            grid: (rows as u32, 1, 1),
            block: (256, 1, 1),
            smem: 0,
        };
        let (add_launch, swiglu_launch) = (self.grid_stride(rows * h), self.grid_stride(rows * f));
        let mut embed = self.embed_step(self.s.tokens.ptr(), rows)?;
        self.rt.run(&mut embed)?;
        for (l, [qkv, o, gate_up, down]) in products.iter_mut().enumerate() {
            let (an, mn) = (self.blocks[l].attn_norm.ptr(), self.blocks[l].mlp_norm.ptr());
            let norm = |g| Args::new().ptr(x).ptr(g).ptr(normed).i32(h as i32).f32(c.eps);
            let add = Args::new().ptr(x).ptr(proj).i64((rows * h) as i64);
            let swiglu = Args::new().ptr(gu).ptr(act).i32(rows as i32).i32(f as i32);
            let mut attn_norm = self.kernel("attn_norm", DecoderKernel::RmsNorm, norm_launch, norm(an))?;
            let mut rope = self.rope_cache("rope", l, rows)?;
            let mut attention = self.attention("attention", l, rows)?;
            let mut add1 = self.kernel("add", DecoderKernel::Add, add_launch, add.clone())?;
            let mut mlp_norm = self.kernel("mlp_norm", DecoderKernel::RmsNorm, norm_launch, norm(mn))?;
            let mut swi = self.kernel("swiglu", DecoderKernel::Swiglu, swiglu_launch, swiglu)?;
            let mut add2 = self.kernel("add", DecoderKernel::Add, add_launch, add)?;
            for s in [
                &mut attn_norm,
                qkv,
                &mut rope,
                &mut attention,
                o,
                &mut add1,
                &mut mlp_norm,
                gate_up,
                &mut swi,
                down,
                &mut add2,
            ] {
                self.rt.run(s)?;
            }
        }
        if last {
            for mut s in self.head_steps(rows - 1, rows)? {
                self.rt.run(&mut s)?;
            }
        }
        Ok(())
    }

    fn upload_i32(&self, dst: CUdeviceptr, values: &[i32]) -> Result<()> {
        // SAFETY: `dst` holds at least `values.len()` i32s (the callers' buffers); the
        // copy is ordered on the stream. `values` is pageable memory, which the driver
        // stages before cuMemcpyHtoDAsync returns, so it may go away at once (the callers
        // also wait for the stream on success).
        unsafe { result::memcpy_htod_async(dst, values, self.rt.gpu().stream().cu_stream()) }
            .map_err(cuda_error("uploading tokens"))
    }

    /// Waits for the pass and reads the chosen token back.
    fn read_token(&mut self) -> Result<u32> {
        let gpu = self.rt.gpu();
        gpu.download_f32_pinned(&self.state, &mut self.readback)?;
        // The state is i32; the pinned buffer carries its bits.
        let ints: Vec<i32> = self.readback.as_slice().iter().map(|v| v.to_bits() as i32).collect();
        if ints[2] != 0 {
            return Err(WorkloadError::Cuda {
                what: "sampling a token".into(),
                detail: "the logits are not numbers".into(),
            });
        }
        if ints[0] as usize != self.len {
            return Err(WorkloadError::Cuda {
                what: "decoding".into(),
                detail: format!("the device holds {} positions, the host expected {}", ints[0], self.len),
            });
        }
        Ok(ints[1] as u32)
    }

    /// Runs `tokens` after what is cached: a prompt (prefilled in chunks) or one decode
    /// step; returns the greedy choice after the last one.
    fn advance(&mut self, tokens: &[u32]) -> Result<u32> {
        if let Some(p) = request_problem(&self.config, self.len, tokens) {
            return Err(WorkloadError::BadArgument(p));
        }
        if tokens.len() == 1 && self.len > 0 {
            let token = [tokens[0] as i32];
            self.upload_i32(self.state.ptr() + 4, &token)?;
            return self.step_once();
        }
        let chunks: Vec<&[u32]> = tokens.chunks(PREFILL_ROWS).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            let ids: Vec<i32> = chunk.iter().map(|t| *t as i32).collect();
            let state = [self.len as i32, 0, 0, 0];
            self.upload_i32(self.state.ptr(), &state)?;
            self.upload_i32(self.s.tokens.ptr(), &ids)?;
            self.prefill_chunk(chunk.len(), last)?;
            self.len += chunk.len();
            // The uploads' sources live until the stream has taken them.
            self.rt.gpu().synchronize()?;
        }
        self.read_token()
    }

    /// One decode step of the token in `state[1]`.
    fn step_once(&mut self) -> Result<u32> {
        self.launch_step()?;
        self.read_token()
    }

    /// Starts one decode step of the token in `state[1]` (the one the step before chose)
    /// without waiting for it.
    fn launch_step(&mut self) -> Result<()> {
        if self.graphs && self.step_graph.is_none() {
            let stream = self.rt.gpu().stream().clone();
            let mut steps = std::mem::take(&mut self.step);
            let rt = &mut self.rt;
            let captured = capture_graph(&stream, "capturing the decode step", || {
                steps.iter_mut().try_for_each(|s| rt.run(s))
            });
            self.step = steps;
            self.step_graph = captured?;
        }
        match &self.step_graph {
            Some(g) => g.launch().map_err(cuda_error("running the decode step"))?,
            None => {
                let mut steps = std::mem::take(&mut self.step);
                let ran = steps.iter_mut().try_for_each(|s| self.rt.run(s));
                self.step = steps;
                ran?
            }
        }
        self.len += 1;
        Ok(())
    }

    /// Runs `tokens` after what is cached and returns the logits after the last one (the
    /// GPU tests compare them with the CPU reference's).
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.advance(tokens)?;
        self.rt.gpu().download_f32(&self.s.logits, self.config.vocab)
    }

    /// Empties the cache (a new request).
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Greedy generation of `n` tokens after `prompt`, from an empty cache; `each` is
    /// told every token as it is known, and stops the generation by answering false.
    /// The step that follows a token reads it on the device, so it is started before
    /// `each` hears of the token: the GPU computes the next token while the host hands
    /// this one on (a stop then waits for that one step and drops what it made).
    pub fn generate(&mut self, prompt: &[u32], n: usize, mut each: impl FnMut(u32) -> bool) -> Result<Vec<u32>> {
        self.reset();
        if n == 0 {
            return Ok(Vec::new());
        }
        if let Some(p) = request_problem(&self.config, 0, &[prompt, &vec![0; n - 1]].concat()) {
            return Err(WorkloadError::BadArgument(p));
        }
        let mut out = Vec::with_capacity(n);
        let mut token = self.advance(prompt)?;
        loop {
            out.push(token);
            let more = out.len() < n;
            let launched = if more { self.launch_step() } else { Ok(()) };
            // The token is handed on even when its next step could not start.
            let go_on = each(token);
            launched?;
            if !more {
                return Ok(out);
            }
            if !go_on {
                // A step nobody asked for: wait for it and keep nothing of it (not even
                // a failed sampling); a lost GPU still ends the generation.
                self.rt.gpu().synchronize()?;
                return Ok(out);
            }
            token = self.read_token()?;
        }
    }

    /// The fastest of `rounds` timings of one decode step on the GPU alone (CUDA events
    /// around the graph), milliseconds; the cache must hold a prompt, and each round adds
    /// one position.
    pub fn time_step_ms(&mut self, rounds: usize) -> Result<f32> {
        // One step to capture the graph, then `rounds`: each adds a position.
        if self.len == 0 || self.len + rounds + 1 > self.config.max_len {
            return Err(WorkloadError::BadArgument(format!(
                "timing {rounds} steps needs a prompt in the cache and room after it ({} of {} cached)",
                self.len, self.config.max_len
            )));
        }
        // Capture (or warm) the step first.
        self.step_once()?;
        let gpu = self.rt.gpu();
        let (start, end) = (gpu.timing_event()?, gpu.timing_event()?);
        let stream = gpu.stream().clone();
        let mut steps = std::mem::take(&mut self.step);
        let rt = &mut self.rt;
        let ms = time_min_ms(
            &stream,
            (&start, &end),
            "timing the decode step",
            self.step_graph.as_ref(),
            || steps.iter_mut().try_for_each(|s| rt.run(s)),
            rounds,
        );
        self.step = steps;
        self.len += rounds;
        let ms = ms?;
        self.read_token()?;
        Ok(ms)
    }

    /// Where a decode step's time goes: each of its kernels run `runs` times in a row
    /// (captured as one graph where the step is, so launches cost what they cost in the
    /// step), its mean per run, in the step's order. The repeats turn the same values
    /// over and over (the residual stream, the cache's newest row), so the decoder is
    /// consumed: its cache means nothing afterwards. Needs a prompt in the cache.
    pub fn time_kernels(mut self, runs: usize) -> Result<Vec<super::model::StepTiming>> {
        if self.len == 0 || self.len + 2 > self.config.max_len || runs == 0 {
            return Err(WorkloadError::BadArgument(format!(
                "timing the step's kernels needs a prompt in the cache, room for a step and at least one run ({} of {} cached, {runs} runs)",
                self.len, self.config.max_len
            )));
        }
        self.step_once()?;
        super::model::time_each_step(&mut self.rt, &mut self.step, self.graphs, runs, 3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes_run_on_the_gpu_and_a_shape_that_cannot_is_named() {
        assert_eq!(gpu_problem(&DecoderConfig::llm()), None);
        assert_eq!(gpu_problem(&DecoderConfig::tiny()), None);
        // The llm shape's attention: 64 + 32 + 4096 + 2048 floats, within 48 KiB.
        assert_eq!(attention_smem(&DecoderConfig::llm()), 24_960);
        let with = |f: fn(&mut DecoderConfig)| {
            let mut c = DecoderConfig::llm();
            f(&mut c);
            gpu_problem(&c)
        };
        assert!(with(|c| c.heads = 8).is_some_and(|p| p.contains("head width 256")));
        assert!(with(|c| c.ffn = 8196).is_some_and(|p| p.contains("multiples of 8")));
        assert!(with(|c| c.ffn = 16_384).is_some_and(|p| p.contains("shared memory")));
        assert!(with(|c| c.max_len = 16_384).is_some_and(|p| p.contains("max_len 16384")));
        assert!(with(|c| c.kv_heads = 3).is_some_and(|p| p.contains("kv_heads")));
    }

    #[test]
    fn a_chunk_is_padded_to_the_next_multiple_of_32_rows() {
        assert_eq!([1, 31, 32, 33, 128, 256].map(padded_rows), [32, 32, 32, 64, 128, 256]);
    }
}
