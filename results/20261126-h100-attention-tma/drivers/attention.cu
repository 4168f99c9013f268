// Standalone driver (not part of the project): the kept TMA, warp-specialised bf16 attention
// (attention_wgmma_bf16_d64), the kernel it replaced (base.cuh) and the variants tried.
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

static const int SMEM = 73 * 1024;
typedef void (*KT)(const TmaMap, bf16_t*, const int*, int, int, float);
#define NK 15
static const char* NAMES[NK + 1] = {"base", "tma_v1", "tma_v2", "ws3", "ws3np", "ws3s2", "ws3s3", "ws3s6", "ws3nr", "ws3pp", "ws2pp", "unstaged", "split", "splitst", "split5", "kept"};
static KT KS[NK] = {attention_tma_v1, attention_tma_v2, attention_ws3, attention_ws3np, attention_ws3s2, attention_ws3s3, attention_ws3s6, attention_ws3nr, attention_ws3pp, attention_ws2pp, attention_v_unstaged, attention_v_split, attention_v_both, attention_v_split5, attention_wgmma_bf16_d64};
static int THR[NK] = {128, 128, 512, 512, 512, 512, 512, 512, 512, 384, 512, 512, 512, 512, 512};
static int BQS[NK] = {64, 64, 192, 192, 192, 192, 192, 192, 192, 128, 192, 192, 192, 192, 192};
static int SM_[NK] = {73 * 1024, 73 * 1024, (24 + 128 + 1) * 1024, (24 + 128 + 1) * 1024, (24 + 64 + 1) * 1024, (24 + 96 + 1) * 1024, (24 + 192 + 1) * 1024, (24 + 128 + 1) * 1024, (24 + 128 + 1) * 1024, (16 + 128 + 1) * 1024, (24 + 192 + 1) * 1024, (24 + 192 + 1) * 1024, (24 + 192 + 1) * 1024, (24 + 160 + 1) * 1024, (24 + 192 + 1) * 1024};

typedef void (*SKT)(const TmaMap, bf16_t*, const int*, int, int, float, int, float*, int*);
static SKT SKK[2] = {attention_wsk3, attention_wsk2};
static int SKTHR[2] = {512, 384}, SKSM[2] = {209 * 1024, 225 * 1024};
static float* wsp; static int* cntp;
static void run_sk(int v, int G, const TmaMap& m, bf16_t* o, const int* lens, int seq, int heads, int batch, float sl) {
    SKK[v]<<<G, SKTHR[v], SKSM[v]>>>(m, o, lens, seq, heads, sl, batch, wsp, cntp);
}
static void run(int k, const bf16_t* d, const TmaMap& m, bf16_t* o, const int* lens, int seq, int heads, int batch, float sl) {
    if (k == 0) { attention_base<<<dim3((seq + 63) / 64, heads, batch), 128, SMEM>>>(d, o, lens, seq, heads, sl); return; }
    int i = k - 1;
    KS[i]<<<dim3((seq + BQS[i] - 1) / BQS[i], heads, batch), THR[i], SM_[i]>>>(m, o, lens, seq, heads, sl);
}
static std::vector<unsigned short> get(const bf16_t* o, size_t n) { std::vector<unsigned short> v(n); CK(cudaMemcpy(v.data(), o, n * 2, cudaMemcpyDeviceToHost)); return v; }
static double relerr(const std::vector<unsigned short>& a, const std::vector<double>& w) {
    double num = 0, den = 0; for (size_t i = 0; i < a.size(); i++) { double df = from_bf16(a[i]) - w[i]; num += df * df; den += w[i] * w[i]; } return sqrt(num / den);
}

int main(int argc, char** argv) {
    srand(11);
    CK(cudaFuncSetAttribute(attention_base, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (int i = 0; i < NK; i++) {
        CK(cudaFuncSetAttribute(KS[i], cudaFuncAttributeMaxDynamicSharedMemorySize, SM_[i]));
        int occ; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, KS[i], THR[i], SM_[i]));
        printf("SMs %d, %s blocks/SM %d\n", sms, NAMES[i + 1], occ);
    }
    float sl = 1.4426950408889634f / 8.0f;
    for (int v = 0; v < 2; v++) CK(cudaFuncSetAttribute(SKK[v], cudaFuncAttributeMaxDynamicSharedMemorySize, SKSM[v]));
    CK(cudaMalloc(&wsp, (size_t)600 * 2 * 36 * 384 * 4));
    CK(cudaMalloc(&cntp, 1 << 20)); CK(cudaMemset(cntp, 0, 1 << 20));
    {
        int seq = 1000, heads = 2, batch = 2, H = 128; size_t n = (size_t)batch * seq * 3 * H;
        std::vector<unsigned short> hb(n); std::vector<float> q(n);
        for (size_t i = 0; i < n; i++) { float x = ((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f; hb[i] = to_bf16(x); q[i] = from_bf16(hb[i]); }
        int hl[2] = {1000, 333};
        bf16_t *d, *o; int* dl; CK(cudaMalloc(&d, n * 2)); CK(cudaMalloc(&o, (size_t)batch * seq * H * 2)); CK(cudaMalloc(&dl, 8));
        CK(cudaMemcpy(d, hb.data(), n * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dl, hl, 8, cudaMemcpyHostToDevice));
        TmaMap m = make_map(d, seq, heads, batch);
        for (int masked = 0; masked < 2; masked++) {
            std::vector<double> w((size_t)batch * seq * H);
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
            size_t no = (size_t)batch * seq * H;
            for (int k = 0; k <= NK; k++) {
                CK(cudaMemset(o, 0xff, no * 2));
                run(k, d, m, o, L, seq, heads, batch, sl);
                cudaError_t e = cudaDeviceSynchronize();
                if (e != cudaSuccess) { printf("ACC %s: %s\n", NAMES[k], cudaGetErrorString(e)); return 1; }
                printf("ACC masked=%d %-8s rel err %.3e\n", masked, NAMES[k], relerr(get(o, no), w));
            }
            int Gs[6] = {132, 5, 37, 64, 100, 264};
            for (int v = 0; v < 2; v++) for (int g : Gs) {
                CK(cudaMemset(o, 0xff, no * 2));
                run_sk(v, g, m, o, L, seq, heads, batch, sl);
                cudaError_t e = cudaDeviceSynchronize();
                if (e != cudaSuccess) { printf("ACC wsk%d: %s\n", 3 - v, cudaGetErrorString(e)); return 1; }
                auto a = get(o, no);
                run_sk(v, g, m, o, L, seq, heads, batch, sl); CK(cudaDeviceSynchronize());
                printf("ACC masked=%d wsk%d G=%-4d rel err %.3e, repeat %s\n", masked, 3 - v, g, relerr(a, w), a == get(o, no) ? "identical" : "DIFFERS");
            }
        }
    }
    {
        int seq = 3401, heads = 6; size_t n = (size_t)seq * 3 * 384;
        std::vector<unsigned short> hb(n); for (auto& x : hb) x = to_bf16(((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f);
        bf16_t *d, *o, *o2; CK(cudaMalloc(&d, n * 2)); CK(cudaMalloc(&o, (size_t)seq * 384 * 2)); CK(cudaMalloc(&o2, (size_t)seq * 384 * 2));
        CK(cudaMemcpy(d, hb.data(), n * 2, cudaMemcpyHostToDevice));
        TmaMap m = make_map(d, seq, heads, 1);
        run(0, d, m, o, nullptr, seq, heads, 1, sl); CK(cudaDeviceSynchronize());
        auto a = get(o, (size_t)seq * 384);
        for (int k = 1; k <= NK; k++) {
            run(k, d, m, o2, nullptr, seq, heads, 1, sl); CK(cudaDeviceSynchronize());
            auto c = get(o2, (size_t)seq * 384); double mx = 0; size_t diff = 0;
            for (size_t i = 0; i < a.size(); i++) { mx = fmax(mx, fabs(from_bf16(a[i]) - from_bf16(c[i]))); diff += a[i] != c[i]; }
            printf("3401x6: %-8s max |base - k| %.3e, %zu of %zu differ\n", NAMES[k], mx, diff, a.size());
        }
        for (int v = 0; v < 2; v++) {
            run_sk(v, sms, m, o2, nullptr, seq, heads, 1, sl); CK(cudaDeviceSynchronize());
            auto c = get(o2, (size_t)seq * 384); double mx = 0; size_t diff = 0;
            for (size_t i = 0; i < a.size(); i++) { mx = fmax(mx, fabs(from_bf16(a[i]) - from_bf16(c[i]))); diff += a[i] != c[i]; }
            printf("3401x6: wsk%d max |base - k| %.3e, %zu of %zu differ\n", 3 - v, mx, diff, a.size());
        }
        cudaEvent_t ea, eb; cudaEventCreate(&ea); cudaEventCreate(&eb);
        for (int rep = 0; rep < 3; rep++)
        for (int k = 0; k <= NK; k++) {
            for (int i = 0; i < 20; i++) run(k, d, m, o, nullptr, seq, heads, 1, sl);
            cudaEventRecord(ea);
            for (int i = 0; i < 300; i++) run(k, d, m, o, nullptr, seq, heads, 1, sl);
            cudaEventRecord(eb); cudaEventSynchronize(eb);
            float ms; cudaEventElapsedTime(&ms, ea, eb);
            printf("TIME %-8s %.2f us (%s)\n", NAMES[k], ms * 1000 / 300, cudaGetErrorString(cudaGetLastError()));
        }
        for (int rep = 0; rep < 3; rep++)
        for (int v = 0; v < 2; v++) for (int g : {sms, 126, 120, 108}) {
            for (int i = 0; i < 20; i++) run_sk(v, g, m, o, nullptr, seq, heads, 1, sl);
            cudaEventRecord(ea);
            for (int i = 0; i < 300; i++) run_sk(v, g, m, o, nullptr, seq, heads, 1, sl);
            cudaEventRecord(eb); cudaEventSynchronize(eb);
            float ms; cudaEventElapsedTime(&ms, ea, eb);
            printf("TIME wsk%d G=%d %.2f us (%s)\n", 3 - v, g, ms * 1000 / 300, cudaGetErrorString(cudaGetLastError()));
        }
    }
    return 0;
}
