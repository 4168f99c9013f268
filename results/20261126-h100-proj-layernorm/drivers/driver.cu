// Standalone driver (not part of the project): the fused product + residual + layer norm of
// proj_ln.cuh against what the workload runs today, cuBLASLt's product with its bias
// epilogue (the fastest of up to 32 heuristic candidates, timed here as gemm.rs does) and
// add_layernorm_bf16 (norm.cu), at the yolos-small shapes: 3401 rows, 384 outputs, K = 384
// (the attention projection) and K = 1536 (the MLP's second product). Outputs against a
// double reference on the CPU, then times (300 launches, five rounds).
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cstring>
#include <algorithm>
#include <cuda.h>
#include <cublasLt.h>
#ifndef __CUDA_ARCH_FEAT_SM90_ALL
#define __CUDA_ARCH_FEAT_SM90_ALL 1
#endif
#include "../../../workload/src/cuda/kernels/prelude.cuh"
#include "../../../workload/src/cuda/kernels/norm.cu"
#include "../../../workload/src/cuda/kernels/attention.cu"
#include "proj_ln.cuh"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
#define LT(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { printf("cuBLASLt %d at %d\n", (int)s_, __LINE__); exit(1); } } while (0)

static unsigned short to_bf16(float f) { unsigned u; memcpy(&u, &f, 4); u += 0x7FFF + ((u >> 16) & 1); return (unsigned short)(u >> 16); }
static float from_bf16(unsigned short h) { unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f; }
static float rnd(float s) { return ((rand() / (float)RAND_MAX) * 2 - 1) * s; }

static TmaMap map2(const void* p, int cols, int rows, int box_rows) {
    CUtensorMap m;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)cols * 2};
    cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, es[2] = {1, 1};
    CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void*)p, dims, strides, box, es,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { printf("cuTensorMapEncodeTiled %d\n", (int)r); exit(1); }
    TmaMap t; memcpy(&t, &m, sizeof t); return t;
}

struct Gemm {
    cublasLtHandle_t h; cublasLtMatmulDesc_t d; cublasLtMatrixLayout_t a, b, c; cublasLtMatmulAlgo_t algo; void* ws; size_t wsb = 32 << 20;
    const void *W, *X; void* D;
    void run(cudaStream_t st = 0) {
        float al = 1, be = 0;
        LT(cublasLtMatmul(h, d, &al, W, a, X, b, &be, D, c, D, c, &algo, ws, wsb, st));
    }
};
static Gemm make_gemm(int M, int N, int K, const void* W, const void* X, void* D, const void* bias) {
    Gemm g; g.W = W; g.X = X; g.D = D;
    LT(cublasLtCreate(&g.h)); CK(cudaMalloc(&g.ws, g.wsb));
    LT(cublasLtMatmulDescCreate(&g.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T; cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    LT(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LT(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    LT(cublasLtMatmulDescSetAttribute(g.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    LT(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16BF, K, N, K));
    LT(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16BF, K, M, K));
    LT(cublasLtMatrixLayoutCreate(&g.c, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t p; LT(cublasLtMatmulPreferenceCreate(&p));
    LT(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g.wsb, sizeof g.wsb));
    cublasLtMatmulHeuristicResult_t res[32]; int n = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(g.h, g.d, g.a, g.b, g.c, g.c, p, 32, res, &n));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    float best = 1e30f; int bi = -1;
    for (int i = 0; i < n; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        g.algo = res[i].algo; g.run();
        cudaEventRecord(e0); for (int r = 0; r < 10; r++) g.run(); cudaEventRecord(e1); cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        if (ms < best) { best = ms; bi = i; }
    }
    g.algo = res[bi].algo;
    printf("cuBLASLt %dx%dx%d: %d candidates, best %d at %.2f us\n", M, N, K, n, bi, best * 100);
    return g;
}

template <typename F> static void timeit(const char* name, F f, double flops) {
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int i = 0; i < 20; i++) f();
    cudaEventRecord(e0); for (int i = 0; i < 300; i++) f(); cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    const double us = ms * 1000 / 300;
    printf("TIME %-28s %7.2f us  %6.1f TFLOP/s (%s)\n", name, us, flops / us * 1e-6, cudaGetErrorString(cudaGetLastError()));
}

typedef decltype(&proj_ln_k384) KT;
struct Variant { const char* name; KT kern; int cl; };
template <int K> static void shape(std::vector<Variant> vs) {
    const int M = 3401, N = 384; const float eps = 1e-12f;
    printf("== M %d N %d K %d\n", M, N, K);
    std::vector<unsigned short> A((size_t)M * K), W((size_t)N * K), B(N);
    std::vector<float> R((size_t)M * N), G(N), Be(N);
    for (auto& x : A) x = to_bf16(rnd(2.0f));
    for (auto& x : W) x = to_bf16(rnd(1.0f / sqrtf((float)K)));
    for (auto& x : B) x = to_bf16(rnd(0.5f));
    for (auto& x : R) x = rnd(3.0f);
    for (auto& x : G) x = 1.0f + rnd(0.2f);
    for (auto& x : Be) x = rnd(0.1f);
    bf16_t *dA, *dW, *dB, *dDelta, *dOut1, *dOut2; float *dR, *dR1, *dR2, *dG, *dBe;
    CK(cudaMalloc(&dA, A.size() * 2)); CK(cudaMalloc(&dW, W.size() * 2)); CK(cudaMalloc(&dB, N * 2));
    CK(cudaMalloc(&dDelta, (size_t)M * N * 2)); CK(cudaMalloc(&dOut1, (size_t)M * N * 2)); CK(cudaMalloc(&dOut2, (size_t)M * N * 2));
    CK(cudaMalloc(&dR, R.size() * 4)); CK(cudaMalloc(&dR1, R.size() * 4)); CK(cudaMalloc(&dR2, R.size() * 4));
    CK(cudaMalloc(&dG, N * 4)); CK(cudaMalloc(&dBe, N * 4));
    CK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dW, W.data(), W.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B.data(), N * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dR, R.data(), R.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dG, G.data(), N * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dBe, Be.data(), N * 4, cudaMemcpyHostToDevice));
    Gemm g = make_gemm(M, N, K, dW, dA, dDelta, dB);
    TmaMap am = map2(dA, K, M, 64);
    const int SM = (3 * (64 * 64 * 2 + 384 * 64 * 2) + 1024);
    auto base = [&](float* r, bf16_t* o, int post) { g.run(); add_layernorm_bf16<<<(M + 3) / 4, 128>>>(r, dDelta, dG, dBe, o, M, N, eps, post); };
    for (auto& vr : vs) CK(cudaFuncSetAttribute(vr.kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SM));
    std::vector<TmaMap> wms;
    for (auto& vr : vs) wms.push_back(map2(dW, K, N, vr.cl == 1 ? 128 : N / vr.cl));
    auto fused_v = [&](int i, float* r, bf16_t* o, int post) {
        const int cl = vs[i].cl, blocks = ((M + 63) / 64 + cl - 1) / cl * cl;
        vs[i].kern<<<blocks, 512, SM>>>(am, wms[i], dB, r, dG, dBe, o, M, eps, post);
    };
    for (size_t vi = 0; vi < vs.size(); vi++)
    for (int post = 0; post < 2; post++) {
        auto fused = [&](float* r, bf16_t* o, int p) { fused_v(vi, r, o, p); };
        CK(cudaMemcpy(dR1, dR, R.size() * 4, cudaMemcpyDeviceToDevice)); CK(cudaMemcpy(dR2, dR, R.size() * 4, cudaMemcpyDeviceToDevice));
        base(dR1, dOut1, post); fused(dR2, dOut2, post); CK(cudaDeviceSynchronize());
        std::vector<unsigned short> o1((size_t)M * N), o2((size_t)M * N); std::vector<float> r1(R.size()), r2(R.size());
        CK(cudaMemcpy(o1.data(), dOut1, o1.size() * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(o2.data(), dOut2, o2.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(r1.data(), dR1, r1.size() * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(r2.data(), dR2, r2.size() * 4, cudaMemcpyDeviceToHost));
        // Double reference: delta rounded to bf16 as the product's output is.
        double n1 = 0, n2 = 0, d2 = 0, rn1 = 0, rn2 = 0, rd = 0; size_t same = 0;
        std::vector<double> v(N);
        for (int i = 0; i < M; i++) {
            double mean = 0;
            for (int j = 0; j < N; j++) {
                double a = 0; for (int k = 0; k < K; k++) a += (double)from_bf16(A[(size_t)i * K + k]) * from_bf16(W[(size_t)j * K + k]);
                v[j] = R[(size_t)i * N + j] + from_bf16(to_bf16((float)(a + from_bf16(B[j]))));
                mean += v[j];
            }
            mean /= N; double var = 0; for (int j = 0; j < N; j++) var += (v[j] - mean) * (v[j] - mean); var /= N;
            for (int j = 0; j < N; j++) {
                const double n = (v[j] - mean) / sqrt(var + eps) * G[j] + Be[j], rr = post ? n : v[j];
                const size_t x = (size_t)i * N + j;
                n1 += (from_bf16(o1[x]) - n) * (from_bf16(o1[x]) - n); n2 += (from_bf16(o2[x]) - n) * (from_bf16(o2[x]) - n); d2 += n * n;
                rn1 += (r1[x] - rr) * (r1[x] - rr); rn2 += (r2[x] - rr) * (r2[x] - rr); rd += rr * rr;
                same += o1[x] == o2[x];
            }
        }
        printf("ACC %s K=%d post=%d: out rel err cuBLASLt+LN %.3e, fused %.3e; resid rel err %.3e, %.3e; %zu of %zu outputs identical\n",
               vs[vi].name, K, post, sqrt(n1 / d2), sqrt(n2 / d2), sqrt(rn1 / rd), sqrt(rn2 / rd), same, o1.size());
    }
    const double fl = 2.0 * M * N * K;
    for (int rep = 0; rep < 5; rep++) {
        timeit("cuBLASLt product", [&] { g.run(); }, fl);
        timeit("add_layernorm_bf16", [&] { add_layernorm_bf16<<<(M + 3) / 4, 128>>>(dR1, dDelta, dG, dBe, dOut1, M, N, eps, 0); }, 0);
        timeit("product + layer norm", [&] { base(dR1, dOut1, 0); }, fl);
        for (size_t vi = 0; vi < vs.size(); vi++) timeit(vs[vi].name, [&] { fused_v(vi, dR2, dOut2, 0); }, fl);
    }
}

int main() {
    srand(5);
    shape<384>({{"fused", proj_ln_k384, 1}, {"fused, clusters of 2", proj_ln_k384_c2, 2}, {"fused, clusters of 4", proj_ln_k384_c4, 4}});
    shape<1536>({{"fused", proj_ln_k1536, 1}, {"fused, clusters of 2", proj_ln_k1536_c2, 2}, {"fused, clusters of 4", proj_ln_k1536_c4, 4}});
    return 0;
}
