// Stream-K variant of attention_wgmma_bf16_d64 (experiment).
__device__ __forceinline__ int sk_worker_of(long long i, int G, long long T) { return (int)(((i + 1) * G - 1) / T); }

template <int NW, int BK>
__device__ __forceinline__ void attention_sk(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ out, const int* __restrict__ lens,
                            int seq, int heads, float scale_log2, int batch, float* __restrict__ ws,
                            int* __restrict__ cnt) {
    constexpr int D = 64, BQ = 64 * NW, THREADS = 128 * NW, CH = D / 8, NT = BK / 8, SLOT = 36 * THREADS;
    constexpr int CT = NW == 3 ? 256 : THREADS; // threads that copy K/V tiles
    extern __shared__ unsigned char smem_raw[];
    __shared__ int s_last;
    bf16_t* sQ = (bf16_t*)(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
    bf16_t* sKV = sQ + BQ * D;
    auto sK = [&](int i) { return sKV + (i & 1) * BK * D; };
    auto sV = [&](int i) { return sKV + (2 + (i & 1)) * BK * D; };

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = tid >> 7;
    const int hidden = heads * D;
    const long stride = 3L * hidden;
    const int QT = (seq + BQ - 1) / BQ, NTL = (seq + BK - 1) / BK;
    const int G = gridDim.x, w = blockIdx.x;
    const long long T = (long long)batch * heads * QT * NTL;
    const long long i0 = (long long)w * T / G, i1 = (long long)(w + 1) * T / G;
    const u64 dq = wgmma_desc(sQ + wg * 64 * D, 1024);

    for (long long i = i0; i < i1;) {
        const int u = (int)(i / NTL), t0 = (int)(i % NTL);
        const int t1 = (int)min((long long)NTL, t0 + (i1 - i));
        i += t1 - t0;
        const int qt = u % QT, h = (u / QT) % heads, b = u / (QT * heads);
        const int q0 = qt * BQ;
        const bf16_t* base = qkv + (long)b * seq * stride + h * D;
        const int limit = lens != nullptr ? lens[b] : seq;
        const int te = min(t1, (limit + BK - 1) / BK);

        float o[D / 8][4];
#pragma unroll
        for (int k = 0; k < D / 8; k++) o[k][0] = o[k][1] = o[k][2] = o[k][3] = 0.0f;
        float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
        if (t0 < te) {
            for (int k = tid; k < BQ * CH; k += THREADS) {
                int r = k / CH, c = k % CH, t = q0 + r;
                cp_async16(&sQ[swz<D>(r, c)], base + (long)min(t, seq - 1) * stride + c * 8, t < seq);
            }
            const KvCopy<bf16_t, D, BK, CT> kv(base, stride, hidden, seq, limit, tid);
            if (tid < CT) kv.load(sK(t0), sV(t0), t0);
            cp_async_commit();
            for (int j = t0; j < te; j++) {
                if (j + 1 < te && tid < CT) kv.load(sK(j + 1), sV(j + 1), j + 1);
                cp_async_commit();
                cp_async_wait<1>();
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                __syncthreads();
                const u64 dk = wgmma_desc(sK(j), 1024);
                const u64 dv = wgmma_desc(sV(j), 1024);
                float s[NT][4];
                wgmma_fence();
#pragma unroll
                for (int kc = 0; kc < D / 16; kc++) {
                    if constexpr (BK == 128) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
                    else wgmma_ss(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
                }
                wgmma_commit();
                wgmma_wait0();
                float a0, a1;
                online_softmax<NT>(s, m0, m1, l0, l1, a0, a1, scale_log2, j * BK, limit, lane);
#pragma unroll
                for (int k = 0; k < D / 8; k++) {
                    o[k][0] *= a0;
                    o[k][1] *= a0;
                    o[k][2] *= a1;
                    o[k][3] *= a1;
                }
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++) {
                    u32 p0 = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
                    u32 p1 = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
                    u32 p2 = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    u32 p3 = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                    wgmma_rs_t(&o[0][0], p0, p1, p2, p3, dv + (u64)(kk * 16 * 128 >> 4));
                }
                wgmma_commit();
                wgmma_wait0();
                __syncthreads();
            }
        }
        if (t0 != 0 || t1 != NTL) {
            // A piece of the unit: the workers w_lo..w_hi share it; each parks its partial
            // (this thread's o, m, l) in its slot, and the last to arrive folds them all, in
            // worker order, so the sum does not depend on who finishes last.
            const long long ub = (long long)u * NTL;
            const int w_lo = sk_worker_of(ub, G, T), w_hi = sk_worker_of(ub + NTL - 1, G, T);
            auto slot = [&](int wk) {
                const bool first = (long long)wk * T / G >= ub; // the unit is wk's first (wk starts in it)
                return ws + ((long)wk * 2 + (first ? 0 : 1)) * SLOT + tid;
            };
            {
                float* p = slot(w);
#pragma unroll
                for (int k = 0; k < D / 8; k++)
#pragma unroll
                    for (int e = 0; e < 4; e++) __stcg(p + (k * 4 + e) * THREADS, o[k][e]);
                __stcg(p + 32 * THREADS, m0);
                __stcg(p + 33 * THREADS, m1);
                __stcg(p + 34 * THREADS, l0);
                __stcg(p + 35 * THREADS, l1);
            }
            __threadfence();
            __syncthreads();
            if (tid == 0) {
                const int old = atomicAdd(&cnt[u], 1);
                s_last = old == w_hi - w_lo;
                if (s_last) cnt[u] = 0;
            }
            __syncthreads();
            if (!s_last) continue;
            __threadfence();
            float M0 = NEG_INF, M1 = NEG_INF;
            for (int wk = w_lo; wk <= w_hi; wk++) {
                const float* p = slot(wk);
                M0 = fmaxf(M0, __ldcg(p + 32 * THREADS));
                M1 = fmaxf(M1, __ldcg(p + 33 * THREADS));
            }
#pragma unroll
            for (int k = 0; k < D / 8; k++) o[k][0] = o[k][1] = o[k][2] = o[k][3] = 0.0f;
            l0 = l1 = 0.0f;
            for (int wk = w_lo; wk <= w_hi; wk++) {
                const float* p = slot(wk);
                const float c0 = fast_exp2(__ldcg(p + 32 * THREADS) - M0), c1 = fast_exp2(__ldcg(p + 33 * THREADS) - M1);
                l0 += __ldcg(p + 34 * THREADS) * c0;
                l1 += __ldcg(p + 35 * THREADS) * c1;
#pragma unroll
                for (int k = 0; k < D / 8; k++) {
                    o[k][0] += __ldcg(p + (k * 4 + 0) * THREADS) * c0;
                    o[k][1] += __ldcg(p + (k * 4 + 1) * THREADS) * c0;
                    o[k][2] += __ldcg(p + (k * 4 + 2) * THREADS) * c1;
                    o[k][3] += __ldcg(p + (k * 4 + 3) * THREADS) * c1;
                }
            }
        }
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
        const int r0 = q0 + warp * 16 + (lane >> 2), r1 = r0 + 8; // warp counts across warpgroups
        bf16_t* ob = out + (long)b * seq * hidden + h * D + (lane & 3) * 2;
#pragma unroll
        for (int k = 0; k < D / 8; k++) {
            if (r0 < seq) *(u32*)&ob[(long)r0 * hidden + k * 8] = pack_bf16x2(o[k][0] * inv0, o[k][1] * inv0);
            if (r1 < seq) *(u32*)&ob[(long)r1 * hidden + k * 8] = pack_bf16x2(o[k][2] * inv1, o[k][3] * inv1);
        }
    }
}

extern "C" __global__ void __launch_bounds__(128, 3)
attention_wgmma_bf16_d64_sk(const bf16_t* qkv, bf16_t* out, const int* lens, int seq, int heads, float scale_log2, int batch, float* ws, int* cnt) {
    attention_sk<1, 128>(qkv, out, lens, seq, heads, scale_log2, batch, ws, cnt);
}
extern "C" __global__ void __launch_bounds__(256, 1)
attention_wgmma_bf16_d64_sk2(const bf16_t* qkv, bf16_t* out, const int* lens, int seq, int heads, float scale_log2, int batch, float* ws, int* cnt) {
    attention_sk<2, 128>(qkv, out, lens, seq, heads, scale_log2, batch, ws, cnt);
}
extern "C" __global__ void __launch_bounds__(384, 1)
attention_wgmma_bf16_d64_sk3(const bf16_t* qkv, bf16_t* out, const int* lens, int seq, int heads, float scale_log2, int batch, float* ws, int* cnt) {
    attention_sk<3, 128>(qkv, out, lens, seq, heads, scale_log2, batch, ws, cnt);
}

extern "C" __global__ void __launch_bounds__(128, 4)
attention_sk_b64_o4(const bf16_t* qkv, bf16_t* out, const int* lens, int seq, int heads, float scale_log2, int batch, float* ws, int* cnt) {
    attention_sk<1, 64>(qkv, out, lens, seq, heads, scale_log2, batch, ws, cnt);
}
extern "C" __global__ void __launch_bounds__(128, 5)
attention_sk_b64_o5(const bf16_t* qkv, bf16_t* out, const int* lens, int seq, int heads, float scale_log2, int batch, float* ws, int* cnt) {
    attention_sk<1, 64>(qkv, out, lens, seq, heads, scale_log2, batch, ws, cnt);
}
extern "C" __global__ void __launch_bounds__(128, 3)
attention_sk_b64_o3(const bf16_t* qkv, bf16_t* out, const int* lens, int seq, int heads, float scale_log2, int batch, float* ws, int* cnt) {
    attention_sk<1, 64>(qkv, out, lens, seq, heads, scale_log2, batch, ws, cnt);
}
