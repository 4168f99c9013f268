//! A model on the GPU: weights uploaded once, activations allocated once, the forward
//! pass built as a list of steps, run eagerly the first time (which also tunes every
//! product) and then replayed as one CUDA graph per inference.

use std::time::Duration;

use cudarc::driver::CudaGraph;

use super::gemm::{Epilogue, GemmShape};
use super::gpu::{DeviceBuffer, Gpu, PinnedF32, capture_graph, cuda_error, time_min_ms};
use super::kernels::Dtype;
use super::ops::{CudaRuntime, Step, StepKind, act_dtype, attention_math};
use crate::config::{Embedding, ModelConfig, NormPlacement, Precision};
use crate::error::{Result, WorkloadError};
use crate::input::InputBatch;
use crate::weights::{EmbeddingWeights, HeadWeights, LayerNormParams, Linear, ModelWeights};

struct DeviceLinear {
    weight: DeviceBuffer,
    bias: DeviceBuffer,
    out: usize,
    inp: usize,
}

struct DeviceNorm {
    gamma: DeviceBuffer,
    beta: DeviceBuffer,
}

struct DeviceLayer {
    qkv: DeviceLinear,
    out: DeviceLinear,
    ln1: DeviceNorm,
    ln2: DeviceNorm,
    fc1: DeviceLinear,
    fc2: DeviceLinear,
}

fn upload_linear(gpu: &Gpu, l: &Linear, dt: Dtype, what: &str) -> Result<DeviceLinear> {
    upload_linear_padded(gpu, l, dt, what, l.out_features())
}

/// Uploads a layer with its output features padded with zero rows to `out` (cuBLASLt
/// wants 16-byte-aligned leading dimensions: the YOLOS heads have 92 and 4 outputs).
fn upload_linear_padded(gpu: &Gpu, l: &Linear, dt: Dtype, what: &str, out: usize) -> Result<DeviceLinear> {
    let k = l.in_features();
    let mut weight = l.weight.data.clone();
    weight.resize(out * k, 0.0);
    let mut bias = l.bias.data.clone();
    bias.resize(out, 0.0);
    let up = |data: &[f32], w: &str| match dt {
        Dtype::F32 => gpu.upload_f32(data, w),
        Dtype::Bf16 => gpu.upload_bf16(data, w),
    };
    Ok(DeviceLinear {
        weight: up(&weight, what)?,
        bias: up(&bias, what)?,
        out,
        inp: k,
    })
}

fn upload_norm(gpu: &Gpu, n: &LayerNormParams, what: &str) -> Result<DeviceNorm> {
    Ok(DeviceNorm {
        gamma: gpu.upload_f32(&n.gamma.data, what)?,
        beta: gpu.upload_f32(&n.beta.data, what)?,
    })
}

/// Per-step time of one forward pass (the per-kernel split of `bench`).
#[derive(Debug, Clone)]
pub struct StepTiming {
    /// Step name.
    pub name: String,
    /// Its category.
    pub kind: StepKind,
    /// Mean time per run.
    pub time: Duration,
    /// Floating-point operations of the step.
    pub flops: f64,
}

/// Each of `steps` run `runs` times in a row (captured as one graph where `graphs`, so
/// launches cost what they cost in a pass), after one run to warm it: its mean per run,
/// the fastest of `rounds` timings, in order. Repeating a step repeats its writes, so
/// the buffers mean nothing afterwards.
pub(crate) fn time_each_step(
    rt: &mut CudaRuntime,
    steps: &mut [Step],
    graphs: bool,
    runs: usize,
    rounds: usize,
) -> Result<Vec<StepTiming>> {
    let what = "timing steps";
    let stream = rt.gpu().stream().clone();
    let mut out = Vec::with_capacity(steps.len());
    let start = rt.gpu().timing_event()?;
    let end = rt.gpu().timing_event()?;
    for step in steps.iter_mut() {
        rt.run(step)?;
        let graph = if graphs {
            capture_graph(&stream, what, || (0..runs).try_for_each(|_| rt.run(step)))?
        } else {
            None
        };
        if let Some(g) = &graph {
            g.launch().map_err(cuda_error(what))?;
        }
        let eager = || (0..runs).try_for_each(|_| rt.run(step));
        let ms = time_min_ms(&stream, (&start, &end), what, graph.as_ref(), eager, rounds)? as f64 / runs as f64;
        out.push(StepTiming {
            name: step.name.clone(),
            kind: step.kind,
            time: Duration::from_secs_f64(ms / 1e3),
            flops: step.flops,
        });
    }
    Ok(out)
}

/// A model ready to infer on one GPU. Field order is drop order: the graph and the
/// steps go before the buffers they point at, and the runtime (context) last.
pub struct CudaModel {
    graph: Option<CudaGraph>,
    steps: Vec<Step>,
    output_host: PinnedF32,
    output: DeviceBuffer,
    _activations: Vec<DeviceBuffer>,
    _weights: Vec<DeviceBuffer>,
    _reserve: Option<DeviceBuffer>,
    grown: Vec<DeviceBuffer>,
    flops: f64,
    rt: CudaRuntime,
}

impl std::fmt::Debug for CudaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModel")
            .field("steps", &self.steps.len())
            .field("graph", &self.graph.is_some())
            .finish()
    }
}

impl CudaModel {
    /// Uploads `weights`, allocates everything for `input`, reserves `reserve_bytes` of
    /// extra device memory (touched, so it is really backed), and runs one eager pass.
    /// With `use_graph`, later inferences replay a CUDA graph of the pass.
    pub fn new(
        mut rt: CudaRuntime,
        weights: &ModelWeights,
        precision: Precision,
        input: &InputBatch,
        reserve_bytes: u64,
        use_graph: bool,
    ) -> Result<Self> {
        let c: &ModelConfig = &weights.config;
        input.check(c)?;
        let dt = act_dtype(precision);
        let es = dt.size();
        let h = c.hidden;
        let batch = input.batch();
        let seq = input.tokens_per_sample(c);
        let rows = batch * seq;
        let post = c.norm == NormPlacement::Post;
        let eps = c.layer_norm_eps;
        let gpu_alloc = |rt: &CudaRuntime, bytes: usize, what: &str| rt.gpu().alloc_zeroed(bytes, what);

        let reserve = if reserve_bytes > 0 {
            Some(gpu_alloc(&rt, reserve_bytes as usize, "--reserve-memory")?)
        } else {
            None
        };

        // Activations shared by every layer.
        let x = gpu_alloc(&rt, rows * h * 4, "residual stream")?;
        let a = gpu_alloc(&rt, rows * h * es, "normalised activations")?;
        let qkv = gpu_alloc(&rt, rows * 3 * h * es, "QKV")?;
        let attn = gpu_alloc(&rt, rows * h * es, "attention output")?;
        let proj = gpu_alloc(&rt, rows * h * es, "projection output")?;
        let inner = gpu_alloc(&rt, rows * c.mlp * es, "MLP activations")?;
        let mut acts = Vec::new();
        let mut wbufs = Vec::new();
        let mut steps = Vec::new();
        let gpu = rt.gpu();

        // Input side.
        let (first_ln, lens, output, output_len) = match (&weights.embedding, input, c.embedding) {
            (
                EmbeddingWeights::Vision { patch, cls, det, pos },
                InputBatch::Images { pixels, .. },
                Embedding::Vision(v),
            ) => {
                let pixels = gpu.upload_f32(pixels, "input images")?;
                let patches = gpu_alloc(&rt, batch * v.patches() * v.patch_dim() * es, "patches")?;
                let patch_out = gpu_alloc(&rt, batch * v.patches() * h * es, "patch embeddings")?;
                let patch = upload_linear(rt.gpu(), patch, dt, "patch embedding")?;
                let cls = rt.gpu().upload_f32(&cls.data, "[CLS] token")?;
                let det = rt.gpu().upload_f32(&det.data, "detection tokens")?;
                let pos = rt.gpu().upload_f32(&pos.data, "position embeddings")?;
                steps.push(rt.im2col(dt, &pixels, &patches, &v, batch)?);
                let shape = GemmShape {
                    rows: batch * v.patches(),
                    out: h,
                    inp: v.patch_dim(),
                };
                steps.push(rt.linear(
                    "patch_embed",
                    precision,
                    &patch.weight,
                    &patch.bias,
                    &patches,
                    &patch_out,
                    shape,
                    Epilogue::Bias,
                )?);
                steps.push(rt.assemble_vision(dt, &patch_out, &cls, &det, &pos, &x, &v, batch, h)?);
                let out_len = batch * v.output_per_image();
                let output = gpu_alloc(&rt, out_len * 4, "output")?;
                acts.extend([pixels, patches, patch_out]);
                wbufs.extend([patch.weight, patch.bias, cls, det, pos]);
                (
                    upload_norm(rt.gpu(), &weights.layers[0].ln1, "layer norm")?,
                    None,
                    output,
                    out_len,
                )
            }
            (
                EmbeddingWeights::Text {
                    word,
                    pos,
                    token_type,
                    ln,
                },
                InputBatch::Tokens { ids, lens, .. },
                Embedding::Text(_),
            ) => {
                let ids = gpu.upload_i32(ids, "token ids")?;
                let lens = rt.gpu().upload_i32(lens, "sentence lengths")?;
                let word = rt.gpu().upload_f32(&word.data, "word embeddings")?;
                let pos = rt.gpu().upload_f32(&pos.data[..seq * h], "position embeddings")?;
                let type0 = rt.gpu().upload_f32(&token_type.data[..h], "token type embedding")?;
                steps.push(rt.embed_text(&ids, &word, &pos, &type0, &x, rows, seq, h)?);
                let out_len = batch * h;
                let output = gpu_alloc(&rt, out_len * 4, "output")?;
                acts.push(ids);
                wbufs.extend([word, pos, type0]);
                (
                    upload_norm(rt.gpu(), ln, "embedding layer norm")?,
                    Some(lens),
                    output,
                    out_len,
                )
            }
            _ => unreachable!("checked by input.check"),
        };
        steps.push(rt.add_layer_norm(
            "embed_norm",
            dt,
            &x,
            None,
            &first_ln.gamma,
            &first_ln.beta,
            &a,
            rows,
            h,
            eps,
            post,
        )?);
        wbufs.extend([first_ln.gamma, first_ln.beta]);

        // Encoder layers.
        let layers: Vec<DeviceLayer> = weights
            .layers
            .iter()
            .map(|l| {
                Ok(DeviceLayer {
                    qkv: upload_linear(rt.gpu(), &l.qkv, dt, "QKV weights")?,
                    out: upload_linear(rt.gpu(), &l.out, dt, "projection weights")?,
                    ln1: upload_norm(rt.gpu(), &l.ln1, "layer norm")?,
                    ln2: upload_norm(rt.gpu(), &l.ln2, "layer norm")?,
                    fc1: upload_linear(rt.gpu(), &l.fc1, dt, "MLP weights")?,
                    fc2: upload_linear(rt.gpu(), &l.fc2, dt, "MLP weights")?,
                })
            })
            .collect::<Result<_>>()?;
        let final_ln = match &weights.head {
            HeadWeights::Vision { final_ln, .. } => Some(upload_norm(rt.gpu(), final_ln, "final layer norm")?),
            HeadWeights::Text => None,
        };
        let gemm = |l: &DeviceLinear| GemmShape {
            rows,
            out: l.out,
            inp: l.inp,
        };
        let fused_gelu = precision != Precision::Fp32;
        for (i, l) in layers.iter().enumerate() {
            let p = format!("layer{i}");
            steps.push(rt.linear(
                &format!("{p}.qkv"),
                precision,
                &l.qkv.weight,
                &l.qkv.bias,
                &a,
                &qkv,
                gemm(&l.qkv),
                Epilogue::Bias,
            )?);
            steps.push(rt.attention(
                &format!("{p}.attention"),
                attention_math(precision),
                &qkv,
                &attn,
                lens.as_ref(),
                batch,
                seq,
                c.heads,
                c.head_dim(),
            )?);
            steps.push(rt.linear(
                &format!("{p}.proj"),
                precision,
                &l.out.weight,
                &l.out.bias,
                &attn,
                &proj,
                gemm(&l.out),
                Epilogue::Bias,
            )?);
            let mid = if post { &l.ln1 } else { &l.ln2 };
            steps.push(rt.add_layer_norm(
                &format!("{p}.norm1"),
                dt,
                &x,
                Some(&proj),
                &mid.gamma,
                &mid.beta,
                &a,
                rows,
                h,
                eps,
                post,
            )?);
            let epi = if fused_gelu { Epilogue::BiasGelu } else { Epilogue::Bias };
            steps.push(rt.linear(
                &format!("{p}.fc1"),
                precision,
                &l.fc1.weight,
                &l.fc1.bias,
                &a,
                &inner,
                gemm(&l.fc1),
                epi,
            )?);
            if !fused_gelu {
                steps.push(rt.gelu(&format!("{p}.gelu"), dt, &inner, rows * c.mlp)?);
            }
            steps.push(rt.linear(
                &format!("{p}.fc2"),
                precision,
                &l.fc2.weight,
                &l.fc2.bias,
                &inner,
                &proj,
                gemm(&l.fc2),
                Epilogue::Bias,
            )?);
            let end = match (post, layers.get(i + 1), &final_ln) {
                (true, _, _) => &l.ln2,
                (false, Some(next), _) => &next.ln1,
                (false, None, Some(f)) => f,
                (false, None, None) => &l.ln2,
            };
            steps.push(rt.add_layer_norm(
                &format!("{p}.norm2"),
                dt,
                &x,
                Some(&proj),
                &end.gamma,
                &end.beta,
                &a,
                rows,
                h,
                eps,
                post,
            )?);
        }

        // Output side.
        match (&weights.head, c.embedding) {
            (HeadWeights::Vision { class, bbox, .. }, Embedding::Vision(v)) => {
                let det_rows = batch * v.det_tokens;
                let det = gpu_alloc(&rt, det_rows * h * es, "detection tokens")?;
                // The class and box MLPs run side by side as one 3-product MLP: the
                // first layers stacked (h → 2h), then block-diagonal layers over the two
                // halves (2h → 2h, then 2h → the logits padded to a multiple of 8 and
                // the 4 box values padded to 8). Three products of 100 rows instead of
                // six: each takes a few µs whatever its width. (`--split` counts the
                // zero blocks in head.1's and head.2's FLOPs: twice the useful work.)
                let (class_width, box_width) = (v.classes.next_multiple_of(8), 8);
                let width = class_width + box_width;
                let fused = [
                    Linear::stack_outputs(&[&class[0], &bbox[0]]),
                    Linear::block_diagonal(&class[1], class[1].out_features(), &bbox[1]),
                    Linear::block_diagonal(&class[2], class_width, &bbox[2]),
                ];
                let h1 = gpu_alloc(&rt, det_rows * fused[0].out_features() * es, "head activations")?;
                let h2 = gpu_alloc(&rt, det_rows * fused[1].out_features() * es, "head activations")?;
                let head_out = gpu_alloc(&rt, det_rows * width * es, "head outputs")?;
                steps.push(rt.gather_rows(dt, &a, &det, batch, seq, 1 + v.patches(), v.det_tokens, h)?);
                let dl = [
                    upload_linear(rt.gpu(), &fused[0], dt, "head weights")?,
                    upload_linear(rt.gpu(), &fused[1], dt, "head weights")?,
                    upload_linear_padded(rt.gpu(), &fused[2], dt, "head weights", width)?,
                ];
                for (i, (l, inp, out, epi)) in [
                    (&dl[0], &det, &h1, Epilogue::BiasRelu),
                    (&dl[1], &h1, &h2, Epilogue::BiasRelu),
                    (&dl[2], &h2, &head_out, Epilogue::Bias),
                ]
                .into_iter()
                .enumerate()
                {
                    let shape = GemmShape {
                        rows: det_rows,
                        out: l.out,
                        inp: l.inp,
                    };
                    steps.push(rt.linear(
                        &format!("head.{i}"),
                        precision,
                        &l.weight,
                        &l.bias,
                        inp,
                        out,
                        shape,
                        epi,
                    )?);
                }
                for l in dl {
                    wbufs.extend([l.weight, l.bias]);
                }
                steps.push(rt.vision_output(dt, &head_out, &output, det_rows, v.classes, width, class_width)?);
                acts.extend([det, h1, h2, head_out]);
            }
            (HeadWeights::Text, _) => {
                let lens = lens
                    .as_ref()
                    .ok_or_else(|| crate::error::WorkloadError::BadArgument("text model without lengths".into()))?;
                steps.push(rt.mean_pool(&x, lens, &output, batch, seq, h)?);
            }
            _ => unreachable!("weights and config agree"),
        }

        for l in layers {
            for lin in [l.qkv, l.out, l.fc1, l.fc2] {
                wbufs.extend([lin.weight, lin.bias]);
            }
            for n in [l.ln1, l.ln2] {
                wbufs.extend([n.gamma, n.beta]);
            }
        }
        if let Some(f) = final_ln {
            wbufs.extend([f.gamma, f.beta]);
        }
        if let Some(l) = lens {
            acts.push(l);
        }
        acts.extend([x, a, qkv, attn, proj, inner]);

        let flops = c.flops_per_sample(seq) * batch as f64;
        let mut model = Self {
            graph: None,
            steps,
            output_host: rt.gpu().alloc_pinned_f32(output_len, "the output's host copy")?,
            output,
            _activations: acts,
            _weights: wbufs,
            _reserve: reserve,
            grown: Vec::new(),
            flops,
            rt,
        };
        // The eager pass tunes every product and surfaces any kernel fault now.
        model.rt.tune_for_graphs(use_graph);
        model.run_eager()?;
        model.rt.gpu().synchronize()?;
        if use_graph {
            model.capture()?;
        }
        Ok(model)
    }

    fn run_eager(&mut self) -> Result<()> {
        for step in &mut self.steps {
            self.rt.run(step)?;
        }
        Ok(())
    }

    fn capture(&mut self) -> Result<()> {
        let stream = self.rt.gpu().stream().clone();
        self.graph = capture_graph(&stream, "capturing the forward pass as a CUDA graph", || {
            self.run_eager()
        })?;
        Ok(())
    }

    /// Runs one inference and copies its output to the host.
    pub fn infer(&mut self) -> Result<&[f32]> {
        match &self.graph {
            Some(g) => g.launch().map_err(cuda_error("launching the forward graph"))?,
            None => self.run_eager()?,
        }
        self.rt.gpu().download_f32_pinned(&self.output, &mut self.output_host)?;
        Ok(self.output_host.as_slice())
    }

    /// The last output.
    pub fn output(&self) -> &[f32] {
        self.output_host.as_slice()
    }

    /// Allocates and touches `bytes` more device memory, kept until the process ends
    /// (`--grow-memory`).
    pub fn grow(&mut self, bytes: u64) -> Result<()> {
        let buf = self.rt.gpu().alloc_zeroed(bytes as usize, "--grow-memory")?;
        self.grown.push(buf);
        Ok(())
    }

    /// Faults on purpose (`--inject-fault-after`): the error that ended the context.
    pub fn inject_fault(&mut self) -> WorkloadError {
        self.rt.inject_fault()
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        self.rt.gpu()
    }

    /// Floating-point operations of one inference.
    pub fn flops(&self) -> f64 {
        self.flops
    }

    /// Times every step separately, `runs` times each, events around each. Where the pass
    /// runs as a graph, so do the runs: one graph of `runs` launches of the step, timed on
    /// the GPU alone. Enqueued one by one instead, the short steps (products of a few µs
    /// through cuBLASLt, layer norms) carry the host's enqueue cost: on an H100 they read
    /// 16-18% higher that way, above the whole inference in sum, and the projection's share
    /// spread over 24% between runs against 12% as graphs
    /// (results/20261126-h100-split-clocks at commit 6358458).
    pub fn time_steps(&mut self, runs: usize) -> Result<Vec<StepTiming>> {
        time_each_step(&mut self.rt, &mut self.steps, self.graph.is_some(), runs, 1)
    }
}
