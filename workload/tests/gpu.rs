//! GPU kernels and forward passes against the CPU reference (`make test-gpu`, on a
//! machine with an NVIDIA GPU; these tests are ignored elsewhere).
//!
//! Error measure: relative L2 error ‖gpu − cpu‖ / ‖cpu‖ on random inputs (fresh seeds
//! per test, outputs poisoned with NaN before each run so unwritten elements fail).
//! Inputs of bf16 kernels are rounded to bf16 before the CPU sees them, so the
//! tolerance measures the kernel's own arithmetic. Tolerances:
//!
//! | what | fp32 | tf32 | bf16 |
//! |---|---|---|---|
//! | single kernels (norm, attention, products) | 1e-5 | 2e-3 | 1e-2 |
//! | products with the GELU epilogue (tanh form vs erf) | — | 3e-3 | 1e-2 |
//! | whole `tiny` / `minilm-l6` forward pass | 1e-4 | 1e-2 | 3e-2 |

use gpushare_workload::config::{Precision, Preset};
use gpushare_workload::cpu::{CpuModel, ops};
use gpushare_workload::cuda::gemm::{Epilogue, GemmShape};
use gpushare_workload::cuda::kernels::{AttentionMath, Dtype};
use gpushare_workload::cuda::{CudaModel, CudaRuntime, DeviceBuffer, Step};
use gpushare_workload::input::{InputBatch, SAMPLE_SENTENCES};
use gpushare_workload::rng::SplitMix64;
use gpushare_workload::weights::{LayerNormParams, Linear, ModelWeights, Tensor};

fn random(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| r.next_signed() * scale).collect()
}

fn round_bf16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| half::bf16::from_f32(*x).to_f32()).collect()
}

fn rel_err(gpu: &[f32], cpu: &[f32]) -> f64 {
    assert_eq!(gpu.len(), cpu.len());
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for (g, c) in gpu.iter().zip(cpu) {
        assert!(g.is_finite(), "GPU produced a non-finite value (unwritten or overflow)");
        num += (*g as f64 - *c as f64).powi(2);
        den += (*c as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

fn check(what: &str, gpu: &[f32], cpu: &[f32], tol: f64) {
    let e = rel_err(gpu, cpu);
    println!("{what:<48} rel err {e:.2e} (tol {tol:.0e})");
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.0e}");
}

struct Ctx {
    rt: CudaRuntime,
}

impl Ctx {
    fn new() -> Self {
        Self {
            rt: CudaRuntime::new(0).expect("a GPU (these tests run with `make test-gpu`)"),
        }
    }
    fn up(&self, v: &[f32], dt: Dtype) -> DeviceBuffer {
        match dt {
            Dtype::F32 => self.rt.gpu().upload_f32(v, "test input"),
            Dtype::Bf16 => self.rt.gpu().upload_bf16(v, "test input"),
        }
        .expect("upload")
    }
    fn out(&self, n: usize, dt: Dtype) -> DeviceBuffer {
        let b = self.rt.gpu().alloc(n * dt.size(), "test output").expect("alloc");
        self.rt.gpu().fill_bytes(&b, 0xFF).expect("poison");
        b
    }
    fn down(&self, b: &DeviceBuffer, n: usize, dt: Dtype) -> Vec<f32> {
        match dt {
            Dtype::F32 => self.rt.gpu().download_f32(b, n),
            Dtype::Bf16 => self.rt.gpu().download_bf16(b, n),
        }
        .expect("download")
    }
    fn run(&mut self, mut step: Step) {
        self.rt.run(&mut step).expect("launch");
        self.rt.gpu().synchronize().expect("kernel ran without a fault");
    }
}

fn dtypes() -> [(Dtype, f64); 2] {
    [(Dtype::F32, 1e-5), (Dtype::Bf16, 1e-2)]
}

fn maybe_round(v: Vec<f32>, dt: Dtype) -> Vec<f32> {
    if dt == Dtype::Bf16 { round_bf16(&v) } else { v }
}

#[test]
#[ignore = "needs GPU"]
fn add_layer_norm_matches_cpu() {
    let mut c = Ctx::new();
    // The yolos-small shape and the widest rows (the kernel's 4-column path), and rows of
    // a length that is not a multiple of 4 (its scalar path).
    for (rows, cols) in [(3401, 384), (37, 1024), (5, 1021)] {
        for (dt, tol) in dtypes() {
            for post in [false, true] {
                for with_delta in [false, true] {
                    let resid = random(rows * cols, 3.0, 1);
                    let delta = maybe_round(random(rows * cols, 2.0, 2), dt);
                    let ln = LayerNormParams {
                        gamma: Tensor {
                            shape: vec![cols],
                            data: random(cols, 1.0, 3),
                        },
                        beta: Tensor {
                            shape: vec![cols],
                            data: random(cols, 0.5, 4),
                        },
                    };
                    let (r_d, d_d) = (c.up(&resid, Dtype::F32), c.up(&delta, dt));
                    let (g_d, b_d) = (c.up(&ln.gamma.data, Dtype::F32), c.up(&ln.beta.data, Dtype::F32));
                    let out = c.out(rows * cols, dt);
                    let step =
                        c.rt.add_layer_norm(
                            "t",
                            dt,
                            &r_d,
                            with_delta.then_some(&d_d),
                            &g_d,
                            &b_d,
                            &out,
                            rows,
                            cols,
                            1e-12,
                            post,
                        )
                        .expect("step");
                    c.run(step);
                    let mut cpu_resid = resid.clone();
                    let mut cpu_out = vec![0.0; rows * cols];
                    ops::add_layer_norm(
                        &mut cpu_resid,
                        with_delta.then_some(&delta[..]),
                        cols,
                        &ln,
                        1e-12,
                        post,
                        &mut cpu_out,
                    );
                    let what = format!("add_layer_norm {rows}x{cols} {dt:?} post={post} delta={with_delta}");
                    check(&format!("{what} out"), &c.down(&out, rows * cols, dt), &cpu_out, tol);
                    check(
                        &format!("{what} resid"),
                        &c.down(&r_d, rows * cols, Dtype::F32),
                        &cpu_resid,
                        1e-5,
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs GPU"]
fn attention_matches_cpu() {
    let mut c = Ctx::new();
    // (batch, seq, heads, head_dim, masked): the YOLOS-small shape, a BERT-like batch with
    // padding, a sequence shorter than one tile, a padded batch over several key tiles at
    // head size 64 (the wgmma kernels' masking on Hopper), and a padded batch long enough
    // (8 tiles of 128 keys) to wrap the wgmma kernels' rings (bf16: 6 stages, TF32: 2).
    let cases = [
        (1, 3401, 6, 64, false),
        (3, 77, 12, 32, true),
        (2, 5, 2, 64, true),
        (2, 300, 2, 64, true),
        (2, 1000, 2, 64, true),
    ];
    for (math, tol) in [
        (AttentionMath::F32, 1e-5),
        // On Hopper Tf32 and Bf16 are the wgmma kernels for head size 64; Tf32Mma and
        // Bf16Mma the mma.sync ones.
        (AttentionMath::Tf32, 2e-3),
        (AttentionMath::Tf32Mma, 2e-3),
        (AttentionMath::Bf16, 1e-2),
        (AttentionMath::Bf16Mma, 1e-2),
    ] {
        let dt = if matches!(math, AttentionMath::Bf16 | AttentionMath::Bf16Mma) {
            Dtype::Bf16
        } else {
            Dtype::F32
        };
        for (i, &(batch, seq, heads, d, masked)) in cases.iter().enumerate() {
            let hidden = heads * d;
            // Scale 2.5 gives peaked softmax rows: a wrong key or a wrong scale shows.
            let qkv = maybe_round(random(batch * seq * 3 * hidden, 2.5, 10 + i as u64), dt);
            let lens: Vec<i32> = (0..batch)
                .map(|b| {
                    if masked {
                        (seq - b * seq / 4).max(1) as i32
                    } else {
                        seq as i32
                    }
                })
                .collect();
            let (q_d, l_d) = (c.up(&qkv, dt), c.rt.gpu().upload_i32(&lens, "lens").expect("lens"));
            let out = c.out(batch * seq * hidden, dt);
            let step =
                c.rt.attention("t", math, &q_d, &out, masked.then_some(&l_d), batch, seq, heads, d)
                    .expect("step");
            c.run(step);
            let mut cpu = vec![0.0; batch * seq * hidden];
            ops::attention(&qkv, batch, seq, heads, d, masked.then_some(&lens[..]), &mut cpu);
            let kernel = c.rt.attention_kernel(math, d).entry();
            // Hopper (9.0) runs the wgmma kernels for bf16 and TF32 at head size 64.
            if c.rt.gpu().info().compute_capability == (9, 0)
                && d == 64
                && matches!(math, AttentionMath::Bf16 | AttentionMath::Tf32)
            {
                assert!(
                    kernel.starts_with("attention_wgmma_"),
                    "{math:?} d{d} ran {kernel} on Hopper"
                );
            }
            check(
                &format!("attention {math:?} ({kernel}) b{batch} t{seq} h{heads} d{d} mask={masked}"),
                &c.down(&out, cpu.len(), dt),
                &cpu,
                tol,
            );
        }
    }
}

#[test]
#[ignore = "needs GPU"]
fn products_match_cpu() {
    let mut c = Ctx::new();
    let shapes = [
        GemmShape {
            rows: 3401,
            out: 1152,
            inp: 384,
        },
        GemmShape {
            rows: 100,
            out: 96,
            inp: 384,
        },
    ];
    for precision in [Precision::Fp32, Precision::Tf32, Precision::Bf16] {
        let dt = if precision == Precision::Bf16 {
            Dtype::Bf16
        } else {
            Dtype::F32
        };
        for (si, shape) in shapes.iter().enumerate() {
            for epi in [Epilogue::Bias, Epilogue::BiasRelu, Epilogue::BiasGelu] {
                if epi == Epilogue::BiasGelu && precision == Precision::Fp32 {
                    continue; // fp32 uses the exact GELU kernel instead
                }
                let seed = 100 + si as u64 * 10;
                let x = maybe_round(random(shape.rows * shape.inp, 1.0, seed), dt);
                let layer = Linear {
                    weight: Tensor {
                        shape: vec![shape.out, shape.inp],
                        data: maybe_round(random(shape.out * shape.inp, 0.1, seed + 1), dt),
                    },
                    bias: Tensor {
                        shape: vec![shape.out],
                        data: maybe_round(random(shape.out, 0.5, seed + 2), dt),
                    },
                };
                let (w, b, xi) = (c.up(&layer.weight.data, dt), c.up(&layer.bias.data, dt), c.up(&x, dt));
                let out = c.out(shape.rows * shape.out, dt);
                let step =
                    c.rt.linear("t", precision, &w, &b, &xi, &out, *shape, epi)
                        .expect("step");
                c.run(step);
                let mut cpu = vec![0.0; shape.rows * shape.out];
                ops::linear(&x, shape.rows, &layer, &mut cpu);
                match epi {
                    Epilogue::Bias => {}
                    Epilogue::BiasRelu => cpu.iter_mut().for_each(|v| *v = v.max(0.0)),
                    Epilogue::BiasGelu => cpu.iter_mut().for_each(|v| *v = ops::gelu(*v)),
                }
                let tol = match (precision, epi) {
                    (Precision::Fp32, _) => 1e-5,
                    (Precision::Tf32, Epilogue::BiasGelu) => 3e-3,
                    (Precision::Tf32, _) => 2e-3,
                    (Precision::Bf16, _) => 1e-2,
                };
                check(
                    &format!("linear {precision} {shape:?} {epi:?}"),
                    &c.down(&out, cpu.len(), dt),
                    &cpu,
                    tol,
                );
            }
        }
    }
}

#[test]
#[ignore = "needs GPU"]
fn elementwise_kernels_match_cpu() {
    let mut c = Ctx::new();
    let v = match Preset::YolosSmall.config().embedding {
        gpushare_workload::config::Embedding::Vision(v) => v,
        _ => unreachable!(),
    };
    let (batch, h) = (2, 384);
    for (dt, tol) in dtypes() {
        // im2col (exact: a copy, rounded once for bf16).
        let px = random(batch * 3 * v.image_h * v.image_w, 2.0, 20);
        let n = batch * v.patches() * v.patch_dim();
        let (px_d, out) = (c.up(&px, Dtype::F32), c.out(n, dt));
        let step = c.rt.im2col(dt, &px_d, &out, &v, batch).expect("step");
        c.run(step);
        let mut cpu = vec![0.0; n];
        ops::im2col(&px, &v, batch, &mut cpu);
        check(
            &format!("im2col {dt:?}"),
            &c.down(&out, n, dt),
            &maybe_round(cpu, dt),
            0.0,
        );

        // Token assembly.
        let patch_out = maybe_round(random(batch * v.patches() * h, 1.0, 21), dt);
        let (cls, det, pos) = (
            random(h, 1.0, 22),
            random(v.det_tokens * h, 1.0, 23),
            random(v.tokens() * h, 1.0, 24),
        );
        let x = c.out(batch * v.tokens() * h, Dtype::F32);
        let (p_d, c_d, d_d, pos_d) = (
            c.up(&patch_out, dt),
            c.up(&cls, Dtype::F32),
            c.up(&det, Dtype::F32),
            c.up(&pos, Dtype::F32),
        );
        let step =
            c.rt.assemble_vision(dt, &p_d, &c_d, &d_d, &pos_d, &x, &v, batch, h)
                .expect("step");
        c.run(step);
        let mut cpu = vec![0.0; batch * v.tokens() * h];
        ops::assemble_vision(&patch_out, &cls, &det, &pos, &v, batch, h, &mut cpu);
        check(
            &format!("assemble_vision {dt:?}"),
            &c.down(&x, cpu.len(), Dtype::F32),
            &cpu,
            1e-7,
        );

        // Exact GELU.
        let vals = maybe_round(random(100_000, 6.0, 25), dt);
        let g = c.up(&vals, dt);
        let step = c.rt.gelu("t", dt, &g, vals.len()).expect("step");
        c.run(step);
        let cpu: Vec<f32> = vals.iter().map(|v| ops::gelu(*v)).collect();
        check(&format!("gelu {dt:?}"), &c.down(&g, vals.len(), dt), &cpu, tol);

        // Detection-token gather and the output head.
        let src = maybe_round(random(batch * v.tokens() * h, 1.0, 26), dt);
        let (s_d, g_out) = (c.up(&src, dt), c.out(batch * v.det_tokens * h, dt));
        let step =
            c.rt.gather_rows(dt, &s_d, &g_out, batch, v.tokens(), 1 + v.patches(), v.det_tokens, h)
                .expect("step");
        c.run(step);
        let mut cpu = Vec::new();
        for b in 0..batch {
            let first = (b * v.tokens() + 1 + v.patches()) * h;
            cpu.extend_from_slice(&src[first..first + v.det_tokens * h]);
        }
        check(
            &format!("gather_rows {dt:?}"),
            &c.down(&g_out, cpu.len(), dt),
            &cpu,
            0.0,
        );

        // One head output row per token: logits at column 0, then (after padding) the 4
        // box values at column box_col, as the fused heads write them.
        let rows = batch * v.det_tokens;
        let box_col = v.classes.next_multiple_of(8);
        let stride = box_col + 8;
        let head = maybe_round(random(rows * stride, 4.0, 27), dt);
        let (h_d, o_d) = (c.up(&head, dt), c.out(rows * (v.classes + 4), Dtype::F32));
        let step =
            c.rt.vision_output(dt, &h_d, &o_d, rows, v.classes, stride, box_col)
                .expect("step");
        c.run(step);
        let mut cpu = Vec::new();
        for r in 0..rows {
            cpu.extend_from_slice(&head[r * stride..r * stride + v.classes]);
            cpu.extend(
                head[r * stride + box_col..r * stride + box_col + 4]
                    .iter()
                    .map(|x| ops::sigmoid(*x)),
            );
        }
        check(
            &format!("vision_output {dt:?}"),
            &c.down(&o_d, cpu.len(), Dtype::F32),
            &cpu,
            1e-6,
        );
    }

    // Text embeddings and pooling (f32 only).
    let (batch, seq, vocab) = (3, 17, 1000);
    let mut r = SplitMix64::new(30);
    let ids: Vec<i32> = (0..batch * seq).map(|_| (r.next_u64() % vocab as u64) as i32).collect();
    let (word, pos, type0) = (random(vocab * h, 1.0, 31), random(seq * h, 1.0, 32), random(h, 1.0, 33));
    let ids_d = c.rt.gpu().upload_i32(&ids, "ids").expect("ids");
    let (w_d, p_d, t_d) = (
        c.up(&word, Dtype::F32),
        c.up(&pos, Dtype::F32),
        c.up(&type0, Dtype::F32),
    );
    let x = c.out(batch * seq * h, Dtype::F32);
    let step =
        c.rt.embed_text(&ids_d, &w_d, &p_d, &t_d, &x, batch * seq, seq, h)
            .expect("step");
    c.run(step);
    let mut cpu = vec![0.0; batch * seq * h];
    ops::embed_text(&ids, seq, &word, &pos, &type0, h, &mut cpu);
    let gx = c.down(&x, cpu.len(), Dtype::F32);
    check("embed_text", &gx, &cpu, 1e-7);

    let lens = vec![17, 9, 1];
    let l_d = c.rt.gpu().upload_i32(&lens, "lens").expect("lens");
    let out = c.out(batch * h, Dtype::F32);
    let step = c.rt.mean_pool(&x, &l_d, &out, batch, seq, h).expect("step");
    c.run(step);
    let mut cpu_pool = vec![0.0; batch * h];
    ops::mean_pool_normalize(&cpu, batch, seq, &lens, h, &mut cpu_pool);
    check(
        "mean_pool_normalize",
        &c.down(&out, cpu_pool.len(), Dtype::F32),
        &cpu_pool,
        1e-6,
    );
}

fn forward_tolerance(p: Precision) -> f64 {
    match p {
        Precision::Fp32 => 1e-4,
        Precision::Tf32 => 1e-2,
        Precision::Bf16 => 3e-2,
    }
}

fn compare_forward(name: &str, weights: &ModelWeights, input: &InputBatch) {
    let cpu = CpuModel::new(weights.clone()).forward(input).expect("CPU forward");
    for precision in Precision::ALL {
        for graph in [false, true] {
            let rt = CudaRuntime::new(0).expect("GPU");
            let mut m = CudaModel::new(rt, weights, precision, input, 0, graph).expect("model on the GPU");
            // Two inferences: the second checks that a replay recomputes from scratch.
            m.infer().expect("inference");
            let gpu = m.infer().expect("inference").to_vec();
            check(
                &format!("{name} forward {precision} graph={graph}"),
                &gpu,
                &cpu,
                forward_tolerance(precision),
            );
        }
    }
}

#[test]
#[ignore = "needs GPU"]
fn tiny_forward_matches_cpu() {
    let c = Preset::Tiny.config();
    let v = gpushare_workload::weights::vision_shape(&c).expect("vision");
    for batch in [1, 3] {
        let weights = ModelWeights::seeded(&c, 5 + batch as u64);
        let input = InputBatch::sample_images(&v, batch, 6);
        compare_forward(&format!("tiny b{batch}"), &weights, &input);
    }
}

#[test]
#[ignore = "needs GPU"]
fn yolos_small_forward_matches_cpu() {
    // The full reference shape: 3401 tokens, 100 detection tokens, padded heads. The
    // CPU pass takes tens of seconds; it runs once for all precisions.
    let c = Preset::YolosSmall.config();
    let v = gpushare_workload::weights::vision_shape(&c).expect("vision");
    let weights = ModelWeights::seeded(&c, 77);
    let input = InputBatch::sample_images(&v, 1, 78);
    let t0 = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = CpuModel::new(weights.clone())
        .with_threads(threads)
        .forward(&input)
        .expect("CPU forward");
    println!("yolos-small CPU reference took {:.1} s", t0.elapsed().as_secs_f64());
    for precision in Precision::ALL {
        let rt = CudaRuntime::new(0).expect("GPU");
        let mut m = CudaModel::new(rt, &weights, precision, &input, 0, true).expect("model on the GPU");
        let gpu = m.infer().expect("inference").to_vec();
        check(
            &format!("yolos-small forward {precision}"),
            &gpu,
            &cpu,
            forward_tolerance(precision),
        );
    }
}

/// Real MiniLM weights (the bf16 copy, which both backends read alike): set
/// GPUSHARE_MINILM_DIR (`make test-gpu` does).
#[test]
#[ignore = "needs GPU and GPUSHARE_MINILM_DIR"]
fn minilm_forward_matches_cpu() {
    let dir = std::env::var("GPUSHARE_MINILM_DIR")
        .expect("GPUSHARE_MINILM_DIR must name the (bf16) MiniLM weights directory");
    let dir = std::path::PathBuf::from(dir);
    let c = Preset::MiniLmL6.config();
    let weights = ModelWeights::load_bert(&c, &dir).expect("weights");
    let input = InputBatch::from_sentences(&dir.join("tokenizer.json"), &SAMPLE_SENTENCES).expect("tokenizer");
    compare_forward("minilm-l6 (bf16 weights)", &weights, &input);
}

#[test]
#[ignore = "needs GPU"]
fn reserve_memory_is_counted_and_oom_is_reported() {
    let c = Preset::Tiny.config();
    let weights = ModelWeights::seeded(&c, 1);
    let input = InputBatch::sample_images(&gpushare_workload::weights::vision_shape(&c).expect("vision"), 1, 1);
    let rt = CudaRuntime::new(0).expect("GPU");
    let before = rt.gpu().allocated_bytes();
    let m = CudaModel::new(rt, &weights, Precision::Bf16, &input, 1 << 30, true).expect("1 GiB reserve fits");
    assert!(m.gpu().allocated_bytes() >= before + (1 << 30));
    drop(m);
    let rt = CudaRuntime::new(0).expect("GPU");
    let total = rt.gpu().info().memory_total_bytes;
    let err =
        CudaModel::new(rt, &weights, Precision::Bf16, &input, total * 2, true).expect_err("twice the memory fails");
    assert_eq!(err.exit_code(), 4, "{err}");
}

/// The UUID the workload publishes (`workload_info{device_uuid}`) is the one nvidia-smi
/// gives the GPU, so a pod's rows can be matched to the GPU it ran on.
#[test]
#[ignore = "needs GPU"]
fn the_device_uuid_is_the_one_nvidia_smi_names() {
    let ctx = Ctx::new();
    let uuid = &ctx.rt.gpu().info().uuid;
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=uuid", "--format=csv,noheader"])
        .output()
        .expect("nvidia-smi");
    let listed = String::from_utf8_lossy(&out.stdout);
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
    println!(
        "device_uuid {uuid}; nvidia-smi: {}; CUDA_VISIBLE_DEVICES={visible}",
        listed.trim()
    );
    assert!(
        listed.lines().any(|l| l.trim() == format!("GPU-{uuid}")),
        "GPU-{uuid} is not among nvidia-smi's GPUs:\n{listed}"
    );
    // Ordinal 0 of a process that sees one GPU by its UUID is that GPU.
    if let Some(v) = visible.strip_prefix("GPU-") {
        assert_eq!(uuid, v);
    }
}

/// A decoder's GPU kernels against the CPU reference on the same (bf16-rounded) weights,
/// teacher-forced: the prompt's prefill, then `steps` decode steps of the reference's
/// greedy tokens, comparing the logits after each (tolerance as a whole forward pass in
/// bf16: activations are rounded to bf16 between products, the KV cache is bf16).
fn compare_decoder(
    name: &str,
    config: gpushare_workload::decoder::DecoderConfig,
    prompt_len: usize,
    steps: usize,
    graphs: bool,
) -> Vec<Vec<f32>> {
    use gpushare_workload::cuda::decoder::CudaDecoder;
    use gpushare_workload::decoder::DecoderWeights;
    use gpushare_workload::decoder::cpu::{CpuDecoder, argmax};
    let weights = DecoderWeights::seeded(config, 11).map(|v| half::bf16::from_f32(v).to_f32());
    let mut cpu = CpuDecoder::new(weights.clone());
    let mut gpu = CudaDecoder::new(CudaRuntime::new(0).expect("a GPU"), &weights, graphs).expect("decoder on the GPU");
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|i| ((i * 7919 + 13) % config.vocab) as u32)
        .collect();
    let mut want = cpu.forward(&prompt).expect("cpu prefill");
    let got = gpu.forward(&prompt).expect("gpu prefill");
    check(&format!("{name}: prefill of {prompt_len}"), &got, &want, 3e-2);
    let mut all = vec![got];
    for step in 0..steps {
        let token = argmax(&want);
        want = cpu.forward(&[token]).expect("cpu step");
        let got = gpu.forward(&[token]).expect("gpu step");
        check(
            &format!("{name}: decode step {} (graph {graphs})", step + 1),
            &got,
            &want,
            3e-2,
        );
        all.push(got);
    }
    assert_eq!(gpu.cached(), prompt_len + steps);
    all
}

#[test]
#[ignore = "needs GPU"]
fn the_tiny_decoder_matches_the_cpu_reference() {
    use gpushare_workload::decoder::DecoderConfig;
    compare_decoder("decoder tiny", DecoderConfig::tiny(), 5, 8, true);
}

/// A generation starts each step before the host hands on the token before it: its
/// tokens are the greedy ones of one forward pass at a time, a stop returns the tokens
/// so far (after waiting for the step already started), and the next request starts
/// from an empty cache.
#[test]
#[ignore = "needs GPU"]
fn a_generation_runs_a_step_ahead_and_stops_where_told() {
    use gpushare_workload::cuda::decoder::CudaDecoder;
    use gpushare_workload::decoder::cpu::argmax;
    use gpushare_workload::decoder::{DecoderConfig, DecoderWeights};
    let weights = DecoderWeights::seeded(DecoderConfig::tiny(), 5);
    let mut gpu = CudaDecoder::new(CudaRuntime::new(0).expect("a GPU"), &weights, true).expect("decoder");
    let prompt = [3, 1, 4, 1, 5];
    let all = gpu.generate(&prompt, 8, |_| true).expect("generation");
    gpu.reset();
    let mut logits = gpu.forward(&prompt).expect("prefill");
    let mut want = Vec::new();
    while want.len() < 8 {
        want.push(argmax(&logits));
        if want.len() < 8 {
            logits = gpu.forward(&want[want.len() - 1..]).expect("step");
        }
    }
    assert_eq!(all, want);
    let mut heard = 0;
    let some = gpu
        .generate(&prompt, 8, |_| {
            heard += 1;
            heard < 3
        })
        .expect("stopped generation");
    assert_eq!(some, all[..3]);
    assert_eq!(
        gpu.cached(),
        prompt.len() + 3,
        "the step started for a fourth token ran"
    );
    assert_eq!(gpu.generate(&prompt, 8, |_| true).expect("again"), all);
}

#[test]
#[ignore = "needs GPU"]
fn a_prompt_longer_than_a_chunk_and_graph_or_not_give_the_same_logits() {
    use gpushare_workload::decoder::DecoderConfig;
    // Head width 64 and rows of 2,048 (the llm shape's), a prompt of two prefill chunks
    // (256 + 44 positions, the second padded to 64 rows).
    let mid = DecoderConfig {
        vocab: 1000,
        hidden: 512,
        layers: 2,
        heads: 8,
        kv_heads: 2,
        ffn: 2048,
        rope_theta: 500_000.0,
        eps: 1e-5,
        max_len: 400,
    };
    let graphed = compare_decoder("decoder mid", mid, 300, 4, true);
    let eager = compare_decoder("decoder mid", mid, 300, 4, false);
    assert_eq!(
        graphed, eager,
        "a replayed graph computes what its kernels do one by one"
    );
}

#[test]
#[ignore = "needs GPU"]
fn the_llm_decoder_matches_the_cpu_reference_and_its_step_is_timed() {
    use gpushare_workload::cuda::decoder::CudaDecoder;
    use gpushare_workload::decoder::{DecoderConfig, DecoderWeights};
    let c = DecoderConfig::llm();
    compare_decoder("decoder llm", c, 6, 2, true);
    // The decode step on the GPU alone at 128 positions, against reading every weight once.
    let weights = DecoderWeights::seeded(c, 11);
    let mut gpu = CudaDecoder::new(CudaRuntime::new(0).expect("a GPU"), &weights, true).expect("decoder");
    let name = gpu.runtime().gpu().info().name.clone();
    let prompt: Vec<u32> = (1..=128).collect();
    let first = gpu.generate(&prompt, 1, |_| true).expect("prefill");
    assert_eq!(first.len(), 1);
    let ms = gpu.time_step_ms(200).expect("timing");
    let bytes = (c.parameters() * 2) as f64;
    println!(
        "decoder llm on {name}: decode step {ms:.3} ms at 128-328 positions (fastest of 200), {:.0} GB/s of weights read",
        bytes / (ms as f64 * 1e-3) / 1e9
    );
    assert!(ms > 0.0);
}

/// Where the llm decode step's time goes (`make test-gpu` prints it): each kernel of the
/// step repeated 20 times as one graph, its mean, summed by kind and by the step's parts,
/// against the whole step timed the same way.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_llm_decode_step_split_by_kernel() {
    use gpushare_workload::cuda::decoder::CudaDecoder;
    use gpushare_workload::decoder::{DecoderConfig, DecoderWeights};
    let c = DecoderConfig::llm();
    let weights = DecoderWeights::seeded(c, 11);
    let mut gpu = CudaDecoder::new(CudaRuntime::new(0).expect("a GPU"), &weights, true).expect("decoder");
    let prompt: Vec<u32> = (1..=128).collect();
    gpu.generate(&prompt, 1, |_| true).expect("prefill");
    let whole = gpu.time_step_ms(50).expect("timing the step") as f64;
    let kernels = gpu.time_kernels(20).expect("timing the kernels");
    assert!(kernels.len() > 10, "{} kernels", kernels.len());
    // By the part of a layer (`layer3.qkv` → `qkv`) or the step's own name.
    let mut parts: Vec<(String, f64, usize)> = Vec::new();
    for k in &kernels {
        let part = k.name.split_once('.').map_or(k.name.as_str(), |(_, p)| p).to_string();
        let ms = k.time.as_secs_f64() * 1e3;
        match parts.iter_mut().find(|(p, _, _)| *p == part) {
            Some(e) => {
                e.1 += ms;
                e.2 += 1;
            }
            None => parts.push((part, ms, 1)),
        }
    }
    let sum: f64 = parts.iter().map(|p| p.1).sum();
    println!(
        "decoder llm step split: {} kernels, their sum {sum:.3} ms, the step {whole:.3} ms",
        kernels.len()
    );
    for (part, ms, n) in &parts {
        println!(
            "  {part:<12} {n:>3} × {:>7.4} ms = {ms:>6.3} ms ({:>4.1}%)",
            ms / *n as f64,
            100.0 * ms / sum
        );
    }
    assert!(sum > 0.0 && whole > 0.0);
}
