// Standalone experiment (not part of the project): stream-K split of the bf16 wgmma attention.
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cstring>
#ifndef __CUDA_ARCH_FEAT_SM90_ALL
#define __CUDA_ARCH_FEAT_SM90_ALL 1
#endif
#include "../../workload/src/cuda/kernels/prelude.cuh"
#include "../../workload/src/cuda/kernels/attention.cu"
#include "sk.cuh"

static unsigned short to_bf16(float f) { unsigned u; memcpy(&u, &f, 4); u += 0x7FFF + ((u >> 16) & 1); return (unsigned short)(u >> 16); }
static float from_bf16(unsigned short h) { unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f; }
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

static float* ws; static int* cnt;
static const int SMEM = 73 * 1024;
typedef void (*SK)(const bf16_t*, bf16_t*, const int*, int, int, float, int, float*, int*);
#define NV 7
static SK SKS[NV] = {nullptr, attention_wgmma_bf16_d64_sk, attention_wgmma_bf16_d64_sk2, attention_wgmma_bf16_d64_sk3, attention_sk_b64_o4, attention_sk_b64_o5, attention_sk_b64_o3};
static int NWS[NV] = {0, 1, 2, 3, 1, 1, 1};
static int BKS[NV] = {0, 128, 128, 128, 64, 64, 64};
static int NWV = 1;
static int sk_smem(int v) { return (8 * NWS[v] + BKS[v] / 2 + 1) * 1024; }
static long long sk_T(int v, int seq, int heads, int batch) { int bq = 64 * NWS[v]; return (long long)batch * heads * ((seq + bq - 1) / bq) * ((seq + BKS[v] - 1) / BKS[v]); }
static void run_sk(const bf16_t* d, bf16_t* o, const int* lens, int seq, int heads, int batch, int G, float sl) {
    long long T = sk_T(NWV, seq, heads, batch);
    if (G > T) G = (int)T;
    SKS[NWV]<<<G, 128 * NWS[NWV], sk_smem(NWV)>>>(d, o, lens, seq, heads, sl, batch, ws, cnt);
}
static void run_base(const bf16_t* d, bf16_t* o, const int* lens, int seq, int heads, int batch, float sl) {
    attention_wgmma_bf16_d64<<<dim3((seq + 63) / 64, heads, batch), 128, SMEM>>>(d, o, lens, seq, heads, sl);
}
static std::vector<unsigned short> get(const bf16_t* o, size_t n) { std::vector<unsigned short> v(n); CK(cudaMemcpy(v.data(), o, n * 2, cudaMemcpyDeviceToHost)); return v; }
static double relerr(const std::vector<unsigned short>& a, const std::vector<double>& w) {
    double num = 0, den = 0; for (size_t i = 0; i < a.size(); i++) { double df = from_bf16(a[i]) - w[i]; num += df * df; den += w[i] * w[i]; } return sqrt(num / den);
}

int main() {
    srand(11);
    CK(cudaFuncSetAttribute(attention_wgmma_bf16_d64, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int occs[NV];
    for (int nw = 1; nw < NV; nw++) {
        CK(cudaFuncSetAttribute(SKS[nw], cudaFuncAttributeMaxDynamicSharedMemorySize, sk_smem(nw)));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occs[nw], SKS[nw], 128 * NWS[nw], sk_smem(nw)));
        printf("SMs %d, sk%d blocks/SM %d\n", sms, nw, occs[nw]);
    }
    int occ = occs[1];
    CK(cudaMalloc(&ws, (size_t)4096 * 2 * 36 * 128 * 4));
    CK(cudaMalloc(&cnt, 1 << 20)); CK(cudaMemset(cnt, 0, 1 << 20));
    float sl = 1.4426950408889634f / 8.0f;
    {
        int seq = 1000, heads = 2, batch = 2, H = 128; size_t n = (size_t)batch * seq * 3 * H;
        std::vector<unsigned short> hb(n); std::vector<float> q(n);
        for (size_t i = 0; i < n; i++) { float x = ((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f; hb[i] = to_bf16(x); q[i] = from_bf16(hb[i]); }
        int hl[2] = {1000, 333};
        bf16_t *d, *o; int* dl; CK(cudaMalloc(&d, n * 2)); CK(cudaMalloc(&o, (size_t)batch * seq * H * 2)); CK(cudaMalloc(&dl, 8));
        CK(cudaMemcpy(d, hb.data(), n * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dl, hl, 8, cudaMemcpyHostToDevice));
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
            run_base(d, o, L, seq, heads, batch, sl); CK(cudaDeviceSynchronize());
            printf("ACC masked=%d base      rel err %.3e\n", masked, relerr(get(o, no), w));
            int Gs[6] = {100000, 512, 397, 64, 37, 5};
            for (NWV = 1; NWV < NV; NWV++)
            for (int g : Gs) {
                CK(cudaMemset(o, 0xff, no * 2));
                run_sk(d, o, L, seq, heads, batch, g, sl); CK(cudaDeviceSynchronize());
                auto a = get(o, no);
                run_sk(d, o, L, seq, heads, batch, g, sl); CK(cudaDeviceSynchronize());
                auto a2 = get(o, no);
                printf("ACC masked=%d sk%d G=%-6d rel err %.3e, repeat %s\n", masked, NWV, g, relerr(a, w), a == a2 ? "identical" : "DIFFERS");
            }
        }
        std::vector<int> hc(1 << 18); CK(cudaMemcpy(hc.data(), cnt, 1 << 20, cudaMemcpyDeviceToHost));
        int nz = 0; for (int x : hc) nz += x != 0; printf("counters left non-zero: %d\n", nz);
    }
    {
        int seq = 3401, heads = 6; size_t n = (size_t)seq * 3 * 384;
        std::vector<unsigned short> hb(n); for (auto& x : hb) x = to_bf16(((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f);
        bf16_t *d, *o, *o2; CK(cudaMalloc(&d, n * 2)); CK(cudaMalloc(&o, (size_t)seq * 384 * 2)); CK(cudaMalloc(&o2, (size_t)seq * 384 * 2));
        CK(cudaMemcpy(d, hb.data(), n * 2, cudaMemcpyHostToDevice));
        for (NWV = 1; NWV < NV; NWV++) {
            run_base(d, o, nullptr, seq, heads, 1, sl); run_sk(d, o2, nullptr, seq, heads, 1, occs[NWV] * sms, sl); CK(cudaDeviceSynchronize());
            auto a = get(o, (size_t)seq * 384), c = get(o2, (size_t)seq * 384); double mx = 0;
            for (size_t i = 0; i < a.size(); i++) mx = fmax(mx, fabs(from_bf16(a[i]) - from_bf16(c[i])));
            printf("3401x6: max |base - sk%d| %.3e\n", NWV, mx);
        }
        cudaEvent_t ea, eb; cudaEventCreate(&ea); cudaEventCreate(&eb);
        int Gs[11] = {0, occ * sms, sms, sms, 108, occs[4] * sms, occs[5] * sms, occs[6] * sms, 324, 324, 324};
        int Ns[11] = {1, 1, 2, 3, 3, 4, 5, 6, 4, 5, 6};
        for (int rep = 0; rep < 3; rep++)
        for (int gi = 0; gi < 11; gi++) {
            int g = Gs[gi]; NWV = Ns[gi];
            for (int i = 0; i < 20; i++) g ? run_sk(d, o, nullptr, seq, heads, 1, g, sl) : run_base(d, o, nullptr, seq, heads, 1, sl);
            cudaEventRecord(ea);
            for (int i = 0; i < 300; i++) g ? run_sk(d, o, nullptr, seq, heads, 1, g, sl) : run_base(d, o, nullptr, seq, heads, 1, sl);
            cudaEventRecord(eb); cudaEventSynchronize(eb);
            float ms; cudaEventElapsedTime(&ms, ea, eb);
            printf("TIME %s%d G=%d %.2f us (%s)\n", g ? "sk" : "base", NWV, g, ms * 1000 / 300, cudaGetErrorString(cudaGetLastError()));
        }
    }
    return 0;
}
