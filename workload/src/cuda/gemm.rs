//! Matrix products through cuBLASLt, with bias, GELU and ReLU fused as epilogues.
//!
//! One helper owns the row-major ↔ column-major translation. We store activations
//! row-major `X[M, K]` and weights as PyTorch does, `W[N, K]`, and want `Y = X Wᵀ + b`,
//! row-major `[M, N]`. Read column-major, `Y` is `Yᵀ` (N×M, ld N), `W` is `Wᵀ` (K×N,
//! ld K) and `X` is `Xᵀ` (K×M, ld K), so cuBLASLt computes `D = op(A)·B` with A = the
//! weight buffer transposed and B = the activations as they are: the "TN" layout, and
//! the bias is per row of D, i.e. per output feature.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdeviceptr;

use super::gpu::{DeviceBuffer, Gpu, capture_graph, time_min_ms};
use crate::config::Precision;
use crate::error::{Result, WorkloadError};

/// Scratch space cuBLASLt may use per product.
const WORKSPACE_BYTES: usize = 32 << 20;

/// How many algorithms cuBLASLt's heuristic may propose per product, and how many timed
/// runs each gets when there are several.
const CANDIDATES: usize = 32;
const TIMED_RUNS: usize = 10;
/// Launches of those runs timed per candidate; the fastest counts.
const TIMED_ROUNDS: usize = 3;

/// What is fused after the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// `+ bias`.
    Bias,
    /// `GELU(· + bias)`, cuBLASLt's tanh approximation.
    BiasGelu,
    /// `ReLU(· + bias)`.
    BiasRelu,
}

/// Rows × output features × input features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// M: rows of activations (tokens).
    pub rows: usize,
    /// N: output features.
    pub out: usize,
    /// K: input features.
    pub inp: usize,
}

impl GemmShape {
    /// 2·M·N·K.
    pub fn flops(&self) -> f64 {
        2.0 * self.rows as f64 * self.out as f64 * self.inp as f64
    }
}

fn lt_error(what: &str) -> impl FnOnce(lt::CublasError) -> WorkloadError + '_ {
    move |e| WorkloadError::Cuda {
        what: what.to_string(),
        detail: format!("cuBLASLt {:?}", e.0),
    }
}

/// A cuBLASLt handle, its workspace, and the fastest algorithm found per problem.
#[derive(Debug)]
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: DeviceBuffer,
    tuned: HashMap<(GemmShape, Epilogue, Precision), sys::cublasLtMatmulAlgo_t>,
    /// Whether the pass replays a CUDA graph, so candidates are timed as graphs too.
    graphs: bool,
}

impl Lt {
    /// Opens cuBLASLt (exit code 3 when the library is missing).
    pub fn new(gpu: &Gpu) -> Result<Self> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(WorkloadError::MissingLibrary {
                library: "libcublasLt.so.13".into(),
                hint: "install CUDA 13's cuBLAS (e.g. /usr/local/cuda/lib64) and add it to LD_LIBRARY_PATH".into(),
            });
        }
        let handle = lt::create_handle().map_err(lt_error("creating a cuBLASLt handle"))?;
        let workspace = gpu.alloc(WORKSPACE_BYTES, "cuBLASLt workspace")?;
        Ok(Self {
            handle,
            workspace,
            tuned: HashMap::new(),
            graphs: true,
        })
    }

    /// Times candidates as the pass will run: as graphs (the default) or enqueued one by
    /// one (`--no-graph`).
    pub fn set_graphs(&mut self, graphs: bool) {
        self.graphs = graphs;
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// One product site of the model: its descriptors, bias and chosen algorithm.
#[derive(Debug)]
pub struct GemmPlan {
    shape: GemmShape,
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

// SAFETY: the descriptors are plain heap objects of cuBLASLt, used from one thread at a time.
unsafe impl Send for GemmPlan {}

impl Drop for GemmPlan {
    fn drop(&mut self) {
        // SAFETY: each was created once in `GemmPlan::new` and is destroyed once here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn types(precision: Precision) -> (sys::cudaDataType, sys::cublasComputeType_t) {
    match precision {
        Precision::Fp32 => (
            sys::cudaDataType::CUDA_R_32F,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        Precision::Tf32 => (
            sys::cudaDataType::CUDA_R_32F,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        ),
        Precision::Bf16 => (
            sys::cudaDataType::CUDA_R_16BF,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
    }
}

impl GemmPlan {
    /// Describes `out = epilogue(input · weightᵀ + bias)` for one site; `bias` must stay
    /// allocated as long as the plan (it is baked into the descriptor).
    pub fn new(shape: GemmShape, precision: Precision, epilogue: Epilogue, bias: CUdeviceptr) -> Result<Self> {
        let what = "describing a matrix product";
        let (dt, compute) = types(precision);
        let desc = lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F).map_err(lt_error(what))?;
        let (m, n, k) = (shape.rows as u64, shape.out as u64, shape.inp as u64);
        let a = lt::create_matrix_layout(dt, k, n, k as i64).map_err(lt_error(what))?;
        let b = lt::create_matrix_layout(dt, k, m, k as i64).map_err(lt_error(what))?;
        let d = lt::create_matrix_layout(dt, n, m, n as i64).map_err(lt_error(what))?;
        let plan = Self {
            shape,
            desc,
            a,
            b,
            d,
            // Replaced by `tune` before first use.
            // SAFETY: an all-zero algo struct is a valid "unset" value (plain integers).
            algo: unsafe { std::mem::zeroed() },
        };
        // cublasOperation_t: CUBLAS_OP_T = 1.
        let transa: i32 = 1;
        let epi = match epilogue {
            Epilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::BiasGelu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
            Epilogue::BiasRelu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
        };
        use sys::cublasLtMatmulDescAttributes_t as A;
        // SAFETY: `desc` is live; each buffer has the attribute's documented type and size.
        unsafe {
            set_attr(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &transa)?;
            set_attr(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
            set_attr(desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
        }
        Ok(plan)
    }

    /// The problem size.
    pub fn shape(&self) -> GemmShape {
        self.shape
    }

    /// Picks the algorithm: cuBLASLt's heuristic proposes up to [`CANDIDATES`], and the fastest
    /// on these very buffers wins. After a warm-up run, each candidate's [`TIMED_RUNS`] runs
    /// are timed with events [`TIMED_ROUNDS`] times (the fastest counts): captured as one
    /// CUDA graph where the pass replays one, enqueued one by one where it does not.
    /// Results are cached per shape, epilogue and precision.
    pub fn tune(
        &mut self,
        gpu: &Gpu,
        lt: &mut Lt,
        key: (Epilogue, Precision),
        weight: CUdeviceptr,
        input: CUdeviceptr,
        out: CUdeviceptr,
    ) -> Result<()> {
        let cache_key = (self.shape, key.0, key.1);
        if let Some(algo) = lt.tuned.get(&cache_key) {
            self.algo = *algo;
            return Ok(());
        }
        let what = "choosing a matrix-product algorithm";
        let pref = lt::create_matmul_pref().map_err(lt_error(what))?;
        let ws = WORKSPACE_BYTES as u64;
        // SAFETY: a plain C struct of integers and floats; all-zero is a valid value.
        let mut found: [sys::cublasLtMatmulHeuristicResult_t; CANDIDATES] = unsafe { std::mem::zeroed() };
        let mut count = 0i32;
        // SAFETY: every descriptor is live; `found` has room for CANDIDATES results.
        let status = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                8,
            )
            .and_then(|()| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    lt.handle,
                    self.desc,
                    self.a,
                    self.b,
                    self.d,
                    self.d,
                    pref,
                    found.len() as i32,
                    found.as_mut_ptr(),
                    &mut count,
                )
                .result()
            })
        };
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        status.map_err(lt_error(what))?;
        let candidates: Vec<_> = found[..count.max(0) as usize]
            .iter()
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
            .collect();
        if candidates.is_empty() {
            return Err(WorkloadError::Cuda {
                what: what.into(),
                detail: format!("cuBLASLt has no algorithm for {:?} {:?} {:?}", self.shape, key.0, key.1),
            });
        }
        let mut best = (f32::INFINITY, candidates[0]);
        if candidates.len() > 1 {
            let start = gpu.timing_event()?;
            let end = gpu.timing_event()?;
            let stream = gpu.stream().clone();
            let runs = |plan: &Self| (0..TIMED_RUNS).try_for_each(|_| plan.enqueue(gpu, lt, weight, input, out));
            for algo in &candidates {
                self.algo = *algo;
                self.enqueue(gpu, lt, weight, input, out)?;
                // As the pass runs them: where it replays a graph, the runs as one graph, timed
                // on the GPU alone, not with the host's cost of enqueueing each, which is of the
                // order of a short product's run (results/20261126-h100-split-clocks at commit 6358458). A
                // candidate that cannot be captured is passed over, unless the context is lost.
                let graph = if lt.graphs {
                    match capture_graph(&stream, what, || runs(self)) {
                        Ok(Some(g)) => Some(g),
                        Ok(None) | Err(WorkloadError::Cuda { .. }) => continue,
                        Err(e) => return Err(e),
                    }
                } else {
                    None
                };
                let ms = time_min_ms(
                    &stream,
                    (&start, &end),
                    what,
                    graph.as_ref(),
                    || runs(self),
                    TIMED_ROUNDS,
                )?;
                if ms < best.0 {
                    best = (ms, *algo);
                }
            }
        }
        self.algo = best.1;
        lt.tuned.insert(cache_key, best.1);
        Ok(())
    }

    /// Enqueues the product on the GPU's stream.
    pub fn enqueue(&self, gpu: &Gpu, lt: &Lt, weight: CUdeviceptr, input: CUdeviceptr, out: CUdeviceptr) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: layouts match the buffers' sizes (checked by the caller in ops.rs);
        // the workspace is ours for the duration; C = D with beta = 0 (C is not read).
        unsafe {
            lt::matmul(
                lt.handle,
                self.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                weight as *const c_void,
                self.a,
                input as *const c_void,
                self.b,
                out as *const c_void,
                self.d,
                out as *mut c_void,
                self.d,
                &self.algo,
                lt.workspace.ptr() as *mut c_void,
                lt.workspace.bytes(),
                gpu.stream().cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(lt_error("running a matrix product"))
    }
}

/// Sets one descriptor attribute from a typed value.
///
/// # Safety
/// `desc` must be live and `T` the attribute's documented type.
unsafe fn set_attr<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { lt::set_matmul_desc_attribute(desc, attr, (value as *const T).cast(), std::mem::size_of::<T>()) }
        .map_err(lt_error("describing a matrix product"))
}
