// Standalone driver (not part of the project): the TF32 wgmma attention it replaced
// (base.cuh) against the warp-specialised variants (variants.cuh) and the kept kernel
// (attention_wgmma_tf32_d64 of the workload's attention.cu): outputs against a double
// reference and against each other, then time at the yolos-small shape (3401 tokens, 6 heads).
// Built and run by run.sh on the GPU machine.
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cstring>
#include <cuda.h>
#ifndef __CUDA_ARCH_FEAT_SM90_ALL
#define __CUDA_ARCH_FEAT_SM90_ALL 1
#endif
#include "../../../workload/src/cuda/kernels/prelude.cuh"
#include "../../../workload/src/cuda/kernels/attention.cu"
#include "base.cuh"
#include "variants.cuh"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

static TmaMap make_map(const float* qkv, int seq, int heads, int batch) {
    static_assert(sizeof(TmaMap) == sizeof(CUtensorMap), "tensor map size");
    CUtensorMap m;
    const cuuint64_t H3 = 3ull * heads * 64;
    cuuint64_t dims[3] = {H3, (cuuint64_t)seq, (cuuint64_t)batch};
    cuuint64_t strides[2] = {H3 * 4, H3 * 4 * seq};
    cuuint32_t box[3] = {32, 64, 1}, es[3] = {1, 1, 1};
    CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, (void*)qkv, dims, strides, box, es,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { printf("cuTensorMapEncodeTiled %d\n", (int)r); exit(1); }
    TmaMap t; memcpy(&t, &m, sizeof t); return t;
}

typedef void (*KT)(const TmaMap, float*, const int*, int, int, float);
#define NK 11
static const char* NAMES[NK + 1] = {"base", "ws_4_2", "ws_5_1", "ws_3_2", "ws_4_3", "ws_2_2", "ws_3_1", "ws128_2_1", "kept", "ws128_so", "ws128_rk", "ws128_so_rk"};
static KT KS[NK] = {ws_4_2, ws_5_1, ws_3_2, ws_4_3, ws_2_2, ws_3_1, ws128_2_1, attention_wgmma_tf32_d64, ws128_so, ws128_rk, ws128_so_rk};
static int ST_[NK] = {4, 5, 3, 4, 2, 3, 4, 4, 4, 4, 4}, RV_[NK] = {2, 1, 2, 3, 2, 1, 2, 2, 2, 2, 2}; // in 64-key tiles
static int smem(int i) { return (48 + 32 * ST_[i] + 16 * RV_[i] + 1) * 1024; }

static void run(int k, const float* d, const TmaMap& m, float* o, const int* lens, int seq, int heads, int batch, float sl) {
    if (k == 0) { attention_base_tf32<<<dim3((seq + 63) / 64, heads, batch), 128, 65 * 1024>>>(d, o, lens, seq, heads, sl); return; }
    int i = k - 1;
    KS[i]<<<dim3((seq + 191) / 192, heads, batch), 512, smem(i)>>>(m, o, lens, seq, heads, sl);
}
static std::vector<float> get(const float* o, size_t n) { std::vector<float> v(n); CK(cudaMemcpy(v.data(), o, n * 4, cudaMemcpyDeviceToHost)); return v; }
static double relerr(const std::vector<float>& a, const std::vector<double>& w) {
    double num = 0, den = 0; for (size_t i = 0; i < a.size(); i++) { double df = a[i] - w[i]; num += df * df; den += w[i] * w[i]; } return sqrt(num / den);
}

static void accuracy(int seq, int heads, int batch, const int* hl) {
    const int H = heads * 64; size_t n = (size_t)batch * seq * 3 * H;
    std::vector<float> q(n);
    for (size_t i = 0; i < n; i++) q[i] = ((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f;
    float *d, *o; int* dl; CK(cudaMalloc(&d, n * 4)); CK(cudaMalloc(&o, (size_t)batch * seq * H * 4)); CK(cudaMalloc(&dl, 4 * batch));
    CK(cudaMemcpy(d, q.data(), n * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dl, hl, 4 * batch, cudaMemcpyHostToDevice));
    TmaMap m = make_map(d, seq, heads, batch);
    for (int masked = 0; masked < 2; masked++) {
        std::vector<double> w((size_t)batch * seq * H);
        for (int bb = 0; bb < batch; bb++) {
            int lim = masked ? std::min(hl[bb], seq) : seq; const float* qb = q.data() + (size_t)bb * seq * 3 * H;
            for (int h = 0; h < heads; h++) for (int i = 0; i < seq; i++) {
                std::vector<double> sc(lim); double mx = -1e30;
                for (int j = 0; j < lim; j++) { double a = 0; for (int dd = 0; dd < 64; dd++) a += (double)qb[(size_t)i*3*H+h*64+dd] * qb[(size_t)j*3*H+H+h*64+dd]; sc[j] = a / 8.0; mx = fmax(mx, sc[j]); }
                double l = 0; for (int j = 0; j < lim; j++) { sc[j] = exp(sc[j] - mx); l += sc[j]; }
                for (int dd = 0; dd < 64; dd++) { double a = 0; for (int j = 0; j < lim; j++) a += sc[j] * qb[(size_t)j*3*H+2*H+h*64+dd]; w[((size_t)bb*seq+i)*H+h*64+dd] = a / l; }
            }
        }
        const int* L = masked ? dl : nullptr;
        size_t no = (size_t)batch * seq * H;
        std::vector<float> base;
        for (int k = 0; k <= NK; k++) {
            CK(cudaMemset(o, 0xff, no * 4));
            run(k, d, m, o, L, seq, heads, batch, 1.4426950408889634f / 8.0f);
            cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess) { printf("ACC %s: %s\n", NAMES[k], cudaGetErrorString(e)); exit(1); }
            auto a = get(o, no);
            if (k == 0) base = a;
            size_t diff = 0; for (size_t i = 0; i < no; i++) diff += memcmp(&a[i], &base[i], 4) != 0;
            printf("ACC seq=%d heads=%d batch=%d masked=%d %-7s rel err %.3e, %zu of %zu differ from base\n", seq, heads, batch, masked, NAMES[k], relerr(a, w), diff, no);
        }
    }
    CK(cudaFree(d)); CK(cudaFree(o)); CK(cudaFree(dl));
}

int main() {
    srand(11);
    CK(cudaFuncSetAttribute(attention_base_tf32, cudaFuncAttributeMaxDynamicSharedMemorySize, 65 * 1024));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (int i = 0; i < NK; i++) {
        CK(cudaFuncSetAttribute(KS[i], cudaFuncAttributeMaxDynamicSharedMemorySize, smem(i)));
        int occ; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, KS[i], 512, smem(i)));
        printf("SMs %d, %s: %d KiB, blocks/SM %d\n", sms, NAMES[i + 1], smem(i) / 1024, occ);
    }
    { int hl[2] = {1000, 333}; accuracy(1000, 2, 2, hl); }
    { int hl[3] = {70, 1, 64}; accuracy(70, 1, 3, hl); }
    {
        int seq = 3401, heads = 6; size_t n = (size_t)seq * 3 * 384, no = (size_t)seq * 384;
        std::vector<float> hq(n); for (auto& x : hq) x = ((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f;
        float *d, *o; CK(cudaMalloc(&d, n * 4)); CK(cudaMalloc(&o, no * 4));
        CK(cudaMemcpy(d, hq.data(), n * 4, cudaMemcpyHostToDevice));
        TmaMap m = make_map(d, seq, heads, 1);
        const float sl = 1.4426950408889634f / 8.0f;
        run(0, d, m, o, nullptr, seq, heads, 1, sl); CK(cudaDeviceSynchronize());
        auto a = get(o, no);
        std::vector<float> prev;
        for (int k = 1; k <= NK; k++) {
            run(k, d, m, o, nullptr, seq, heads, 1, sl); CK(cudaDeviceSynchronize());
            auto c = get(o, no); double mx = 0; size_t diff = 0;
            for (size_t i = 0; i < no; i++) { mx = fmax(mx, fabs(a[i] - c[i])); diff += memcmp(&a[i], &c[i], 4) != 0; }
            printf("3401x6: %-7s max |base - k| %.3e, %zu of %zu differ\n", NAMES[k], mx, diff, no);
            // 7 ws128_2_1, 8 kept, 9 ws128_so: each against the one before.
            if (k == 8 || k == 9)
                printf("3401x6: %s %s %s\n", NAMES[k], memcmp(c.data(), prev.data(), no * 4) == 0 ? "is bit-identical to" : "DIFFERS from", NAMES[k - 1]);
            prev = c;
        }
        cudaEvent_t ea, eb; cudaEventCreate(&ea); cudaEventCreate(&eb);
        for (int rep = 0; rep < 5; rep++)
            for (int k = 0; k <= NK; k++) {
                for (int i = 0; i < 20; i++) run(k, d, m, o, nullptr, seq, heads, 1, sl);
                cudaEventRecord(ea);
                for (int i = 0; i < 300; i++) run(k, d, m, o, nullptr, seq, heads, 1, sl);
                cudaEventRecord(eb); cudaEventSynchronize(eb);
                float ms; cudaEventElapsedTime(&ms, ea, eb);
                const double us = ms * 1000 / 300;
                printf("TIME %-7s %.2f us = %.1f TFLOP/s (%s)\n", NAMES[k], us, 4.0 * seq * seq * 384 / us * 1e-6, cudaGetErrorString(cudaGetLastError()));
            }
    }
    return 0;
}
