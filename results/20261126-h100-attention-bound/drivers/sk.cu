// Standalone driver (not part of the project): the stream-K kernel
// (attention_wgmma_bf16_d64_sk) against the kept one, for accuracy (a padded batch, many
// grid sizes, repeat runs) and time (the yolos-small shape, 3401 tokens, 6 heads × 64).
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cstring>
#include <algorithm>
#include <string>
#include <cuda.h>
#ifndef __CUDA_ARCH_FEAT_SM90_ALL
#define __CUDA_ARCH_FEAT_SM90_ALL 1
#endif
#include "../../../workload/src/cuda/kernels/prelude.cuh"
__device__ unsigned long long* g_times;
#include "gen/attention.cu" // attention.cu with timer stamps (timed.py)
#include "variants.cuh"
#include "gen/streamk.cuh" // streamk.cuh with timer stamps (timed.py)
#include "overlap.cuh"
#include "rowsum.cuh"

static unsigned short to_bf16(float f) { unsigned u; memcpy(&u, &f, 4); u += 0x7FFF + ((u >> 16) & 1); return (unsigned short)(u >> 16); }
static float from_bf16(unsigned short h) { unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f; }
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

static TmaMap make_map(const bf16_t* qkv, int seq, int heads, int batch) {
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
static const int SMEM = 217 * 1024, SKSMEM = 209 * 1024;
static float* ws; static int* cnt;
static void kept(const TmaMap& m, bf16_t* o, const int* L, int seq, int heads, int batch, float sl, int gx = 0) {
    attention_wgmma_bf16_d64<<<dim3(gx ? gx : (seq + 191) / 192, heads, batch), 512, SMEM>>>(m, o, L, seq, heads, sl);
}
static void frozen(const TmaMap& m, bf16_t* o, const int* L, int seq, int heads, int batch, float sl) {
    att_copy<<<dim3((seq + 191) / 192, heads, batch), 512, SMEM>>>(m, o, L, seq, heads, sl);
}
static void sk(int G, const TmaMap& m, bf16_t* o, const int* L, int seq, int heads, int batch, float sl) {
    attention_wgmma_bf16_d64_sk<<<G, 512, SKSMEM>>>(m, o, L, seq, heads, sl, batch, ws, cnt);
}
static std::vector<unsigned short> get(const bf16_t* o, size_t n) { std::vector<unsigned short> v(n); CK(cudaMemcpy(v.data(), o, n * 2, cudaMemcpyDeviceToHost)); return v; }
static double relerr(const std::vector<unsigned short>& a, const std::vector<double>& w) {
    double num = 0, den = 0; for (size_t i = 0; i < a.size(); i++) { double df = from_bf16(a[i]) - w[i]; num += df * df; den += w[i] * w[i]; } return sqrt(num / den);
}
static void diff(const char* what, const std::vector<unsigned short>& a, const std::vector<unsigned short>& c) {
    double mx = 0; size_t n = 0; bool nan = false;
    for (size_t i = 0; i < a.size(); i++) { float x = from_bf16(a[i]), y = from_bf16(c[i]); if (std::isnan(y)) nan = true; mx = fmax(mx, fabs(x - y)); n += a[i] != c[i]; }
    printf("%s: max |kept - sk| %.3e, %zu of %zu differ%s\n", what, mx, n, a.size(), nan ? ", NaN PRESENT" : "");
}

static bool counts_clear() {
    std::vector<int> h(4096); CK(cudaMemcpy(h.data(), cnt, 4096 * 4, cudaMemcpyDeviceToHost));
    for (int x : h) if (x) return false;
    return true;
}
// One launch with the timer stamps on: per block, the span of its key tiles and of what
// follows (its output, or its pieces and folds), and the whole launch.
template <class F> static void timeline(const char* what, int blocks, F f) {
    unsigned long long* dt; CK(cudaMalloc(&dt, (size_t)blocks * 4 * 8)); CK(cudaMemset(dt, 0, (size_t)blocks * 4 * 8));
    CK(cudaMemcpyToSymbol(g_times, &dt, sizeof dt));
    f(); CK(cudaDeviceSynchronize());
    std::vector<unsigned long long> t((size_t)blocks * 4); CK(cudaMemcpy(t.data(), dt, t.size() * 8, cudaMemcpyDeviceToHost));
    unsigned long long* nul = nullptr; CK(cudaMemcpyToSymbol(g_times, &nul, sizeof nul)); CK(cudaFree(dt));
    unsigned long long t0 = ~0ull, t1 = 0; std::vector<double> st, tiles, tail, dur;
    for (int i = 0; i < blocks; i++) { t0 = std::min(t0, t[4 * i]); t1 = std::max(t1, t[4 * i + 2]); }
    for (int i = 0; i < blocks; i++) { st.push_back((t[4*i] - t0) / 1e3); tiles.push_back((t[4*i+1] - t[4*i]) / 1e3); tail.push_back((t[4*i+2] - t[4*i+1]) / 1e3); dur.push_back((t[4*i+2] - t[4*i]) / 1e3); }
    auto q = [](std::vector<double> v) { std::sort(v.begin(), v.end()); char b[96]; snprintf(b, sizeof b, "min %.2f med %.2f max %.2f", v[0], v[v.size() / 2], v.back()); return std::string(b); };
    printf("TIMELINE %s: %d blocks, first start to last end %.2f us\n", what, blocks, (t1 - t0) / 1e3);
    printf("  start offset %s\n  key tiles    %s\n  after tiles  %s\n  block        %s\n", q(st).c_str(), q(tiles).c_str(), q(tail).c_str(), q(dur).c_str());
}

int main(int argc, char** argv) {
    if (argc > 1 && !strcmp(argv[1], "ncu")) {
        CK(cudaFuncSetAttribute(attention_wgmma_bf16_d64, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
        CK(cudaFuncSetAttribute(attention_wgmma_bf16_d64_sk, cudaFuncAttributeMaxDynamicSharedMemorySize, SKSMEM));
        int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        CK(cudaMalloc(&ws, (size_t)400 * 2 * 36 * 384 * 4)); CK(cudaMalloc(&cnt, 4096 * 4)); CK(cudaMemset(cnt, 0, 4096 * 4));
        int seq = 3401, heads = 6; size_t n = (size_t)seq * 3 * 384;
        bf16_t *d, *o; CK(cudaMalloc(&d, n * 2)); CK(cudaMemset(d, 0x3c, n * 2)); CK(cudaMalloc(&o, (size_t)seq * 384 * 2));
        TmaMap m = make_map(d, seq, heads, 1); const float sl = 1.4426950408889634f / 8.0f;
        for (int i = 0; i < 3; i++) { kept(m, o, nullptr, seq, heads, 1, sl); sk(sms, m, o, nullptr, seq, heads, 1, sl); }
        CK(cudaDeviceSynchronize());
        return 0;
    }
    srand(11);
    CK(cudaFuncSetAttribute(attention_wgmma_bf16_d64, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(att_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(attention_wgmma_bf16_d64_sk, cudaFuncAttributeMaxDynamicSharedMemorySize, SKSMEM));
    CK(cudaFuncSetAttribute(att_ovl6, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(att_st5, cudaFuncAttributeMaxDynamicSharedMemorySize, SKSMEM));
    CK(cudaFuncSetAttribute(att_rs6, cudaFuncAttributeMaxDynamicSharedMemorySize, 219 * 1024));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&ws, (size_t)400 * 2 * 36 * 384 * 4));
    CK(cudaMalloc(&cnt, 4096 * 4)); CK(cudaMemset(cnt, 0, 4096 * 4));
    const float sl = 1.4426950408889634f / 8.0f;
    int bad = 0;
    { // a padded batch: 2 samples × 1000 tokens × 2 heads, lens 1000 and 333; U = 24 row blocks
        int seq = 1000, heads = 2, batch = 2, H = 128; size_t n = (size_t)batch * seq * 3 * H;
        std::vector<unsigned short> hb(n); std::vector<float> q(n);
        for (size_t i = 0; i < n; i++) { hb[i] = to_bf16(((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f); q[i] = from_bf16(hb[i]); }
        int hl[2] = {1000, 333};
        bf16_t *d, *o; int* dl; CK(cudaMalloc(&d, n * 2)); CK(cudaMalloc(&o, (size_t)batch * seq * H * 2)); CK(cudaMalloc(&dl, 8));
        CK(cudaMemcpy(d, hb.data(), n * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dl, hl, 8, cudaMemcpyHostToDevice));
        TmaMap m = make_map(d, seq, heads, batch);
        size_t no = (size_t)batch * seq * H;
        for (int masked = 0; masked < 2; masked++) {
            std::vector<double> w(no);
            for (int bb = 0; bb < batch; bb++) {
                int lim = masked ? hl[bb] : seq; const float* qb = q.data() + (size_t)bb * seq * 3 * H;
                for (int h = 0; h < heads; h++) for (int i = 0; i < seq; i++) {
                    std::vector<double> sc(lim); double mx = -1e30;
                    for (int j = 0; j < lim; j++) { double a = 0; for (int dd = 0; dd < 64; dd++) a += qb[(size_t)i*3*H+h*64+dd] * qb[(size_t)j*3*H+H+h*64+dd]; sc[j] = a / 8.0; mx = fmax(mx, sc[j]); }
                    double l = 0; for (int j = 0; j < lim; j++) { sc[j] = exp(sc[j] - mx); l += sc[j]; }
                    for (int dd = 0; dd < 64; dd++) { double a = 0; for (int j = 0; j < lim; j++) a += sc[j] * qb[(size_t)j*3*H+2*H+h*64+dd]; w[((size_t)bb*seq+i)*H+h*64+dd] = a / l; }
                }
            }
            const int* L = masked ? dl : nullptr;
            CK(cudaMemset(o, 0xff, no * 2)); kept(m, o, L, seq, heads, batch, sl); CK(cudaDeviceSynchronize());
            auto a = get(o, no);
            printf("ACC masked=%d kept         rel err %.3e\n", masked, relerr(a, w));
            for (int g : {24, 25, 31, 37, 64, 100, 132, 191, 192}) { // U = 24 <= G <= T = 192
                CK(cudaMemset(o, 0xff, no * 2)); sk(g, m, o, L, seq, heads, batch, sl);
                cudaError_t e = cudaDeviceSynchronize();
                if (e != cudaSuccess) { printf("ACC sk G=%d: %s\n", g, cudaGetErrorString(e)); return 1; }
                auto c = get(o, no);
                CK(cudaMemset(o, 0xff, no * 2)); sk(g, m, o, L, seq, heads, batch, sl); CK(cudaDeviceSynchronize());
                bool same = c == get(o, no), clear = counts_clear();
                double re = relerr(c, w);
                if (!(re < 4e-3) || !same || !clear) bad++;
                printf("ACC masked=%d sk G=%-4d rel err %.3e, repeat %s, counts %s\n", masked, g, re, same ? "identical" : "DIFFERS", clear ? "back to 0" : "LEFT NONZERO");
            }
        }
    }
    int seq = 3401, heads = 6; size_t n = (size_t)seq * 3 * 384, no = (size_t)seq * 384;
    std::vector<unsigned short> hb(n); for (auto& x : hb) x = to_bf16(((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f);
    bf16_t *d, *o; CK(cudaMalloc(&d, n * 2)); CK(cudaMalloc(&o, no * 2));
    CK(cudaMemcpy(d, hb.data(), n * 2, cudaMemcpyHostToDevice));
    TmaMap m = make_map(d, seq, heads, 1);
    frozen(m, o, nullptr, seq, heads, 1, sl); CK(cudaDeviceSynchronize());
    auto a = get(o, no);
    kept(m, o, nullptr, seq, heads, 1, sl); CK(cudaDeviceSynchronize());
    printf("3401x6: kept %s the frozen copy of the kernel before this change\n", a == get(o, no) ? "bit-identical to" : "DIFFERS from");
    for (int g : {sms, 120, 200, 264}) {
        CK(cudaMemset(o, 0xff, no * 2)); sk(g, m, o, nullptr, seq, heads, 1, sl); CK(cudaDeviceSynchronize());
        char w[48]; snprintf(w, sizeof w, "3401x6 G=%d (counts %s)", g, counts_clear() ? "back to 0" : "LEFT NONZERO"); diff(w, a, get(o, no));
    }
    for (int i = 0; i < 50; i++) { kept(m, o, nullptr, seq, heads, 1, sl); sk(sms, m, o, nullptr, seq, heads, 1, sl); }
    for (int r = 0; r < 2; r++) {
        timeline("kept", 108, [&] { kept(m, o, nullptr, seq, heads, 1, sl); });
        timeline("sk G=SMs", sms, [&] { sk(sms, m, o, nullptr, seq, heads, 1, sl); });
    }
    cudaEvent_t ea, eb; cudaEventCreate(&ea); cudaEventCreate(&eb);
    auto timeit = [&](auto f) {
        for (int i = 0; i < 20; i++) f();
        cudaEventRecord(ea);
        for (int i = 0; i < 300; i++) f();
        cudaEventRecord(eb); cudaEventSynchronize(eb);
        float ms; cudaEventElapsedTime(&ms, ea, eb);
        return ms * 1000 / 300;
    };
    for (int rep = 0; rep < 4; rep++) {
        printf("TIME frozen      %.2f us\n", timeit([&] { frozen(m, o, nullptr, seq, heads, 1, sl); }));
        printf("TIME kept        %.2f us\n", timeit([&] { kept(m, o, nullptr, seq, heads, 1, sl); }));
        for (int g : {sms, 120, 128})
            printf("TIME sk G=%-4d   %.2f us\n", g, timeit([&] { sk(g, m, o, nullptr, seq, heads, 1, sl); }));
        // The kept kernel with 2 or 4 more blocks per head past the sequence (their Q rows
        // are zero-filled, their output not stored; each still reads every K/V tile).
        for (int gx : {20, 22})
            printf("TIME kept %3d blocks %.2f us\n", gx * heads, timeit([&] { kept(m, o, nullptr, seq, heads, 1, sl, gx); }));
        printf("TIME sk G=108    %.2f us\n", timeit([&] { sk(108, m, o, nullptr, seq, heads, 1, sl); }));
        printf("TIME kept ST=5   %.2f us\n", timeit([&] { att_st5<<<dim3(18, heads, 1), 512, SKSMEM>>>(m, o, nullptr, seq, heads, sl); }));
        printf("TIME ovl6        %.2f us\n", timeit([&] { att_ovl6<<<dim3(18, heads, 1), 512, SMEM>>>(m, o, nullptr, seq, heads, sl); }));
        printf("TIME rs6         %.2f us\n", timeit([&] { att_rs6<<<dim3(18, heads, 1), 512, 219 * 1024>>>(m, o, nullptr, seq, heads, sl); }));
    }
    printf("%s: %d accuracy failures\n", bad ? "FAIL" : "ok", bad);
    return bad != 0;
}
