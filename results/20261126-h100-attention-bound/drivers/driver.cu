// Standalone driver (not part of the project): where is the kept bf16 attention kernel's
// bound? Times it against variants (variants.cuh) and against itself on fewer heads
// (fewer blocks in flight), at the yolos-small shape (3401 tokens, 6 heads × 64, batch 1).
// Modes: "time" (default), "ncu" (five launches of the kept kernel, for Nsight Compute),
// "loop SECONDS" (the kept kernel back to back, for nvidia-smi's clock samples).
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cstring>
#include <chrono>
#include <cuda.h>
#ifndef __CUDA_ARCH_FEAT_SM90_ALL
#define __CUDA_ARCH_FEAT_SM90_ALL 1
#endif
#include "../../../workload/src/cuda/kernels/prelude.cuh"
#include "../../../workload/src/cuda/kernels/attention.cu"
#include "variants.cuh"

static unsigned short to_bf16(float f) { unsigned u; memcpy(&u, &f, 4); u += 0x7FFF + ((u >> 16) & 1); return (unsigned short)(u >> 16); }
static float from_bf16(unsigned short h) { unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f; }
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

static TmaMap make_map(const bf16_t* qkv, int seq, int heads, int batch) {
    static_assert(sizeof(TmaMap) == sizeof(CUtensorMap), "tensor map size");
    CUtensorMap m;
    const cuuint64_t H3 = 3ull * heads * 64;
    cuuint64_t dims[3] = {H3, (cuuint64_t)seq, (cuuint64_t)batch};
    cuuint64_t strides[2] = {H3 * 2, H3 * 2 * seq};
    cuuint32_t box[3] = {64, 64, 1}, es[3] = {1, 1, 1};
    CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void*)qkv, dims, strides, box, es,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { printf("cuTensorMapEncodeTiled %d\n", (int)r); exit(1); }
    TmaMap t; memcpy(&t, &m, sizeof t); return t;
}

typedef void (*KT)(const TmaMap, bf16_t*, const int*, int, int, float);
#define NK 6
static const char* NAMES[NK] = {"kept", "copy", "rot", "noexp", "head0", "rot_head0"};
static KT KS[NK] = {attention_wgmma_bf16_d64, att_copy, att_rot, att_noexp, att_head0, att_rot_head0};
static const int SMEM = (24 + 192 + 1) * 1024, THR = 512, BQ = 192;
static void run(int k, const TmaMap& m, bf16_t* o, const int* lens, int seq, int heads, int batch, float sl, int gy = 0) {
    KS[k]<<<dim3((seq + BQ - 1) / BQ, gy ? gy : heads, batch), THR, SMEM>>>(m, o, lens, seq, heads, sl);
}
static std::vector<unsigned short> get(const bf16_t* o, size_t n) { std::vector<unsigned short> v(n); CK(cudaMemcpy(v.data(), o, n * 2, cudaMemcpyDeviceToHost)); return v; }
static void diff(const char* what, const std::vector<unsigned short>& a, const std::vector<unsigned short>& c) {
    double mx = 0; size_t n = 0; bool nan = false;
    for (size_t i = 0; i < a.size(); i++) { float x = from_bf16(a[i]), y = from_bf16(c[i]); if (std::isnan(y)) nan = true; mx = fmax(mx, fabs(x - y)); n += a[i] != c[i]; }
    printf("%s: max |kept - variant| %.3e, %zu of %zu differ%s\n", what, mx, n, a.size(), nan ? ", NaN present" : "");
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "time";
    srand(11);
    for (int i = 0; i < NK; i++) CK(cudaFuncSetAttribute(KS[i], cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const float sl = 1.4426950408889634f / 8.0f;
    if (!strcmp(mode, "time")) { // masked batch: rot against kept
        int seq = 1000, heads = 2, batch = 2, H = 128; size_t n = (size_t)batch * seq * 3 * H;
        std::vector<unsigned short> hb(n);
        for (auto& x : hb) x = to_bf16(((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f);
        int hl[2] = {1000, 333};
        bf16_t *d, *o; int* dl; CK(cudaMalloc(&d, n * 2)); CK(cudaMalloc(&o, (size_t)batch * seq * H * 2)); CK(cudaMalloc(&dl, 8));
        CK(cudaMemcpy(d, hb.data(), n * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dl, hl, 8, cudaMemcpyHostToDevice));
        TmaMap m = make_map(d, seq, heads, batch);
        size_t no = (size_t)batch * seq * H;
        for (int masked = 0; masked < 2; masked++) {
            const int* L = masked ? dl : nullptr;
            CK(cudaMemset(o, 0xff, no * 2)); run(0, m, o, L, seq, heads, batch, sl); CK(cudaDeviceSynchronize());
            auto a = get(o, no);
            for (int k : {1, 2}) {
                CK(cudaMemset(o, 0xff, no * 2)); run(k, m, o, L, seq, heads, batch, sl); CK(cudaDeviceSynchronize());
                char w[64]; snprintf(w, sizeof w, "2x1000 masked=%d %s", masked, NAMES[k]); diff(w, a, get(o, no));
            }
        }
    }
    int seq = 3401, heads = 6; size_t n = (size_t)seq * 3 * 384;
    std::vector<unsigned short> hb(n); for (auto& x : hb) x = to_bf16(((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f);
    bf16_t *d, *o, *o2; CK(cudaMalloc(&d, n * 2)); CK(cudaMalloc(&o, (size_t)seq * 384 * 2)); CK(cudaMalloc(&o2, (size_t)seq * 384 * 2));
    CK(cudaMemcpy(d, hb.data(), n * 2, cudaMemcpyHostToDevice));
    TmaMap m = make_map(d, seq, heads, 1);
    if (!strcmp(mode, "ncu")) {
        for (int i = 0; i < 5; i++) run(0, m, o, nullptr, seq, heads, 1, sl);
        CK(cudaDeviceSynchronize());
        return 0;
    }
    if (!strcmp(mode, "loop")) {
        double secs = argc > 2 ? atof(argv[2]) : 3.0; long launches = 0;
        auto t0 = std::chrono::steady_clock::now();
        while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < secs) {
            for (int i = 0; i < 1000; i++) run(0, m, o, nullptr, seq, heads, 1, sl);
            CK(cudaDeviceSynchronize()); launches += 1000;
        }
        double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("loop: %ld launches in %.2f s, %.2f us each\n", launches, el, el * 1e6 / launches);
        return 0;
    }
    run(0, m, o, nullptr, seq, heads, 1, sl); CK(cudaDeviceSynchronize());
    auto a = get(o, (size_t)seq * 384);
    for (int k = 1; k < NK; k++) {
        run(k, m, o2, nullptr, seq, heads, 1, sl); CK(cudaDeviceSynchronize());
        char w[64]; snprintf(w, sizeof w, "3401x6 %s", NAMES[k]); diff(w, a, get(o2, (size_t)seq * 384));
    }
    cudaEvent_t ea, eb; cudaEventCreate(&ea); cudaEventCreate(&eb);
    auto timeit = [&](int k, int gy) {
        for (int i = 0; i < 20; i++) run(k, m, o, nullptr, seq, heads, 1, sl, gy);
        cudaEventRecord(ea);
        for (int i = 0; i < 300; i++) run(k, m, o, nullptr, seq, heads, 1, sl, gy);
        cudaEventRecord(eb); cudaEventSynchronize(eb);
        float ms; cudaEventElapsedTime(&ms, ea, eb);
        return ms * 1000 / 300;
    };
    printf("SMs %d\n", sms);
    for (int rep = 0; rep < 3; rep++) {
        for (int k = 0; k < NK; k++) printf("TIME %-10s %.2f us (%s)\n", NAMES[k], timeit(k, 0), cudaGetErrorString(cudaGetLastError()));
        for (int gy = 1; gy <= 6; gy++) printf("TIME kept heads=%d (%3d blocks) %.2f us\n", gy, 18 * gy, timeit(0, gy));
    }
    return 0;
}
