// Experiments (not part of the project) beside the kept kernel, attention_wgmma_bf16_d64.
template <bool PIPE>
__device__ __forceinline__ void attention_tma(const TmaMap& map, bf16_t* __restrict__ out, const int* __restrict__ lens,
                                              int seq, int heads, float scale_log2) {
    constexpr int D = 64, BQ = 64, BK = 128, NT = BK / 8, TILE = BK * D * 2;
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[3];
    unsigned char* sQ = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    auto sK = [&](int i) { return sQ + BQ * D * 2 + (i & 1) * TILE; };
    auto sV = [&](int i) { return sQ + BQ * D * 2 + (2 + (i & 1)) * TILE; };

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hidden = heads * D;
    const int limit = lens != nullptr ? lens[b] : seq;
    const int ntiles = (limit + BK - 1) / BK;
    const u32 bq = smem_u32(&bars[0]), bkv = smem_u32(&bars[1]);
    if (tid == 0) {
        mbar_init(bq, 1);
        mbar_init(bkv, 1);
        mbar_init(bkv + 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    auto load_kv = [&](int t) {
        const u32 bar = bkv + 8 * (t & 1);
        mbar_expect_tx(bar, 2 * TILE);
        // Boxes of 64 rows (the map's, shared with Q): two per tile.
        tma_load(sK(t), &map, bar, hidden + h * D, t * BK, b);
        tma_load(sK(t) + TILE / 2, &map, bar, hidden + h * D, t * BK + 64, b);
        tma_load(sV(t), &map, bar, 2 * hidden + h * D, t * BK, b);
        tma_load(sV(t) + TILE / 2, &map, bar, 2 * hidden + h * D, t * BK + 64, b);
    };
    if (tid == 0) {
        mbar_expect_tx(bq, BQ * D * 2);
        tma_load(sQ, &map, bq, h * D, q0, b);
        load_kv(0);
        if (PIPE && ntiles > 1) load_kv(1);
    }

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u64 dq = wgmma_desc(sQ, 1024);
    mbar_wait(bq, 0);

    if constexpr (!PIPE) {
        for (int j = 0; j < ntiles; j++) {
            if (tid == 0 && j + 1 < ntiles) load_kv(j + 1);
            mbar_wait(bkv + 8 * (j & 1), (j >> 1) & 1);
            const u64 dk = wgmma_desc(sK(j), 1024);
            const u64 dv = wgmma_desc(sV(j), 1024);
            float s[NT][4];
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
            wgmma_commit();
            wgmma_wait0();
            online_softmax(s, o, m0, m1, l0, l1, scale_log2, j * BK, limit, lane);
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
    } else {
        float s[NT][4];
        mbar_wait(bkv, 0);
        {
            const u64 dk = wgmma_desc(sK(0), 1024);
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
            wgmma_commit();
            wgmma_wait0();
        }
        for (int j = 0; j < ntiles; j++) {
            online_softmax(s, o, m0, m1, l0, l1, scale_log2, j * BK, limit, lane);
            u32 p[BK / 16][4];
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
                p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
                p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
            const u64 dv = wgmma_desc(sV(j), 1024);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
                wgmma_rs_t(&o[0][0], p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv + (u64)(kk * 16 * 128 >> 4));
            if (j + 1 < ntiles) {
                mbar_wait(bkv + 8 * ((j + 1) & 1), ((j + 1) >> 1) & 1);
                const u64 dk = wgmma_desc(sK(j + 1), 1024);
#pragma unroll
                for (int kc = 0; kc < D / 16; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
            }
            wgmma_commit();
            wgmma_wait0();
            __syncthreads();
            if (tid == 0 && j + 2 < ntiles) load_kv(j + 2);
        }
    }
    finish_rows<D>(o, l0, l1, out, b, h, q0, seq, heads, warp, lane);
}

extern "C" __global__ void __launch_bounds__(128, 3)
attention_tma_v1(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
                 int heads, float scale_log2) {
    attention_tma<false>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(128, 3)
attention_tma_v2(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
                 int heads, float scale_log2) {
    attention_tma<true>(map, out, lens, seq, heads, scale_log2);
}

// ---- warp-specialised (FlashAttention-3 structure) ------------------------------------
// Warpgroup 0 is the producer: one thread issues every TMA load (Q once, then K/V tiles
// into a ring of ST stages, each freed by an mbarrier the consumers arrive on). Warpgroups
// 1..NC are consumers of 64 query rows each, sharing every K/V tile. Each consumer issues
// P·V(j) and S(j+1) together; with PP the issuing turns pass round the consumers by named
// barriers, so one consumer's products overlap another's softmax.
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

template <int NC, bool PP, int ST, int REGS, bool PIPE = true>
__device__ __forceinline__ void attention_ws(const TmaMap& map, bf16_t* __restrict__ out, const int* __restrict__ lens,
                                             int seq, int heads, float scale_log2) {
    constexpr int D = 64, BQ = 64 * NC, BK = 128, NT = BK / 8, TILE = BK * D * 2, QTILE = 64 * D * 2;
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[1 + 2 * ST];
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    auto sQ = [&](int c) { return sm + c * QTILE; };
    auto sK = [&](int s) { return sm + NC * QTILE + s * 2 * TILE; };
    auto sV = [&](int s) { return sm + NC * QTILE + s * 2 * TILE + TILE; };

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hidden = heads * D;
    const int limit = lens != nullptr ? lens[b] : seq;
    const int ntiles = (limit + BK - 1) / BK;
    const u32 bq = smem_u32(&bars[0]), bfull = bq + 8, bempty = bq + 8 + 8 * ST;
    if (tid == 0) {
        mbar_init(bq, 1);
        for (int s = 0; s < ST; s++) {
            mbar_init(bfull + 8 * s, 1);
            mbar_init(bempty + 8 * s, NC * 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        if (REGS) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 0) {
            mbar_expect_tx(bq, NC * QTILE);
            for (int c = 0; c < NC; c++) tma_load(sQ(c), &map, bq, h * D, q0 + 64 * c, b);
            for (int t = 0; t < ntiles; t++) {
                const int s = t % ST;
                if (t >= ST) mbar_wait(bempty + 8 * s, ((t / ST) - 1) & 1);
                const u32 bar = bfull + 8 * s;
                mbar_expect_tx(bar, 2 * TILE);
                tma_load(sK(s), &map, bar, hidden + h * D, t * BK, b);
                tma_load(sK(s) + TILE / 2, &map, bar, hidden + h * D, t * BK + 64, b);
                tma_load(sV(s), &map, bar, 2 * hidden + h * D, t * BK, b);
                tma_load(sV(s) + TILE / 2, &map, bar, 2 * hidden + h * D, t * BK + 64, b);
            }
        }
        return;
    }
    if (REGS) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS) : "memory");
    const int c = wg - 1;
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u64 dq = wgmma_desc(sQ(c), 1024);
    float s[NT][4];
    mbar_wait(bq, 0);
    if constexpr (!PIPE) {
        for (int j = 0; j < ntiles; j++) {
            const int st = j % ST;
            mbar_wait(bfull + 8 * st, (j / ST) & 1);
            const u64 dk = wgmma_desc(sK(st), 1024);
            const u64 dv = wgmma_desc(sV(st), 1024);
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
            wgmma_commit();
            wgmma_wait0();
            online_softmax(s, o, m0, m1, l0, l1, scale_log2, j * BK, limit, lane);
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
            if (lane == 0) mbar_arrive(bempty + 8 * st);
        }
        finish_rows<D>(o, l0, l1, out, b, h, q0 + 64 * c, seq, heads, warp, lane);
        return;
    }
    if (ntiles > 0) {
        if (PP && c == NC - 1) named_arrive(1, 256);
        mbar_wait(bfull, 0);
        if (PP) named_sync(1 + c, 256);
        {
            const u64 dk = wgmma_desc(sK(0), 1024);
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
            wgmma_commit();
        }
        if (PP) named_arrive(1 + (c + 1) % NC, 256);
        wgmma_wait0();
    }
    for (int j = 0; j < ntiles; j++) {
        online_softmax(s, o, m0, m1, l0, l1, scale_log2, j * BK, limit, lane);
        u32 p[BK / 16][4];
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
            p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
            p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
        const int st = j % ST;
        if (j + 1 < ntiles) mbar_wait(bfull + 8 * ((j + 1) % ST), ((j + 1) / ST) & 1);
        if (PP) named_sync(1 + c, 256);
        const u64 dv = wgmma_desc(sV(st), 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            wgmma_rs_t(&o[0][0], p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv + (u64)(kk * 16 * 128 >> 4));
        if (j + 1 < ntiles) {
            const u64 dk = wgmma_desc(sK((j + 1) % ST), 1024);
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        }
        wgmma_commit();
        if (PP && !(c == NC - 1 && j + 1 == ntiles)) named_arrive(1 + (c + 1) % NC, 256);
        wgmma_wait0();
        if (lane == 0) mbar_arrive(bempty + 8 * st);
    }
    finish_rows<D>(o, l0, l1, out, b, h, q0 + 64 * c, seq, heads, warp, lane);
}

extern "C" __global__ void __launch_bounds__(512, 1)
attention_ws3(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
              int heads, float scale_log2) {
    attention_ws<3, false, 4, 160, true>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
attention_ws3np(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
              int heads, float scale_log2) {
    attention_ws<3, false, 4, 160, false>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
attention_ws3s2(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
              int heads, float scale_log2) {
    attention_ws<3, false, 2, 160, true>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
attention_ws3s3(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
              int heads, float scale_log2) {
    attention_ws<3, false, 3, 160, true>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
attention_ws3s6(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
              int heads, float scale_log2) {
    attention_ws<3, false, 6, 160, true>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
attention_ws3nr(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
              int heads, float scale_log2) {
    attention_ws<3, false, 4, 0, true>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
attention_ws3pp(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
                int heads, float scale_log2) {
    attention_ws<3, true, 4, 160>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(384, 1)
attention_ws2pp(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
                int heads, float scale_log2) {
    attention_ws<2, true, 4, 240>(map, out, lens, seq, heads, scale_log2);
}

// The warp-specialised kernel with a stream-K split over (192-row query group,
// key tile) units, one block per SM; partial rows fold in block order (as in dbg3/sk.cuh).
__device__ __forceinline__ int wsk_worker_of(long long i, int G, long long T) { return (int)(((i + 1) * G - 1) / T); }

template <int NC, int ST, int REGS>
__device__ __forceinline__ void attention_wsk(const TmaMap& map, bf16_t* __restrict__ out, const int* __restrict__ lens,
                                              int seq, int heads, float scale_log2, int batch, float* __restrict__ ws,
                                              int* __restrict__ cnt) {
    constexpr int D = 64, BQ = 64 * NC, BK = 128, NT = BK / 8, TILE = BK * D * 2, QTILE = 64 * D * 2;
    constexpr int CT = NC * 128, SLOT = 36 * CT;
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[4 + 2 * ST];
    __shared__ int s_last;
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    auto sQ = [&](int k, int c) { return sm + ((k & 1) * NC + c) * QTILE; };
    auto sK = [&](int s) { return sm + 2 * NC * QTILE + s * 2 * TILE; };
    auto sV = [&](int s) { return sm + 2 * NC * QTILE + s * 2 * TILE + TILE; };

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int hidden = heads * D;
    const int QG = (seq + BQ - 1) / BQ, NTL = (seq + BK - 1) / BK;
    const int G = gridDim.x, w = blockIdx.x;
    const long long T = (long long)batch * heads * QG * NTL;
    const long long i0 = (long long)w * T / G, i1 = (long long)(w + 1) * T / G;
    const u32 bqf = smem_u32(&bars[0]), bqe = bqf + 16, bfull = bqf + 32, bempty = bfull + 8 * ST;
    if (tid == 0) {
        mbar_init(bqf, 1);
        mbar_init(bqf + 8, 1);
        mbar_init(bqe, NC * 4);
        mbar_init(bqe + 8, NC * 4);
        for (int s = 0; s < ST; s++) {
            mbar_init(bfull + 8 * s, 1);
            mbar_init(bempty + 8 * s, NC * 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 0) {
            int n = 0, k = 0;
            for (long long i = i0; i < i1; k++) {
                const int u = (int)(i / NTL), t0 = (int)(i % NTL);
                const int t1 = (int)min((long long)NTL, t0 + (i1 - i));
                i += t1 - t0;
                const int qg = u % QG, h = (u / QG) % heads, b = u / (QG * heads);
                const int limit = lens != nullptr ? lens[b] : seq;
                const int te = min(t1, (limit + BK - 1) / BK);
                if (k >= 2) mbar_wait(bqe + 8 * (k & 1), ((k >> 1) - 1) & 1);
                mbar_expect_tx(bqf + 8 * (k & 1), NC * QTILE);
                for (int c = 0; c < NC; c++) tma_load(sQ(k, c), &map, bqf + 8 * (k & 1), h * D, qg * BQ + 64 * c, b);
                for (int t = t0; t < te; t++, n++) {
                    const int s = n % ST;
                    if (n >= ST) mbar_wait(bempty + 8 * s, ((n / ST) - 1) & 1);
                    const u32 bar = bfull + 8 * s;
                    mbar_expect_tx(bar, 2 * TILE);
                    tma_load(sK(s), &map, bar, hidden + h * D, t * BK, b);
                    tma_load(sK(s) + TILE / 2, &map, bar, hidden + h * D, t * BK + 64, b);
                    tma_load(sV(s), &map, bar, 2 * hidden + h * D, t * BK, b);
                    tma_load(sV(s) + TILE / 2, &map, bar, 2 * hidden + h * D, t * BK + 64, b);
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS) : "memory");
    const int c = wg - 1, ct = tid - 128;
    int n = 0, k = 0;
    for (long long i = i0; i < i1; k++) {
        const int u = (int)(i / NTL), t0 = (int)(i % NTL);
        const int t1 = (int)min((long long)NTL, t0 + (i1 - i));
        i += t1 - t0;
        const int qg = u % QG, h = (u / QG) % heads, b = u / (QG * heads);
        const int limit = lens != nullptr ? lens[b] : seq;
        const int te = min(t1, (limit + BK - 1) / BK);
        float o[D / 8][4];
#pragma unroll
        for (int x = 0; x < D / 8; x++) o[x][0] = o[x][1] = o[x][2] = o[x][3] = 0.0f;
        float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
        const u64 dq = wgmma_desc(sQ(k, c), 1024);
        mbar_wait(bqf + 8 * (k & 1), (k >> 1) & 1);
        for (int j = t0; j < te; j++, n++) {
            const int st = n % ST;
            mbar_wait(bfull + 8 * st, (n / ST) & 1);
            const u64 dk = wgmma_desc(sK(st), 1024);
            const u64 dv = wgmma_desc(sV(st), 1024);
            float s[NT][4];
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
            wgmma_commit();
            wgmma_wait0();
            online_softmax(s, o, m0, m1, l0, l1, scale_log2, j * BK, limit, lane);
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
            if (lane == 0) mbar_arrive(bempty + 8 * st);
        }
        if (lane == 0) mbar_arrive(bqe + 8 * (k & 1));
        if (t0 != 0 || t1 != NTL) {
            const long long ub = (long long)u * NTL;
            const int w_lo = wsk_worker_of(ub, G, T), w_hi = wsk_worker_of(ub + NTL - 1, G, T);
            auto slot = [&](int wk) {
                const bool first = (long long)wk * T / G >= ub;
                return ws + ((long)wk * 2 + (first ? 0 : 1)) * SLOT + ct;
            };
            {
                float* p = slot(w);
#pragma unroll
                for (int x = 0; x < D / 8; x++)
#pragma unroll
                    for (int e = 0; e < 4; e++) __stcg(p + (x * 4 + e) * CT, o[x][e]);
                __stcg(p + 32 * CT, m0);
                __stcg(p + 33 * CT, m1);
                __stcg(p + 34 * CT, l0);
                __stcg(p + 35 * CT, l1);
            }
            __threadfence();
            named_sync(1, CT);
            if (ct == 0) {
                const int old = atomicAdd(&cnt[u], 1);
                s_last = old == w_hi - w_lo;
                if (s_last) cnt[u] = 0;
            }
            named_sync(1, CT);
            if (!s_last) continue;
            __threadfence();
            float M0 = NEG_INF, M1 = NEG_INF;
            for (int wk = w_lo; wk <= w_hi; wk++) {
                const float* p = slot(wk);
                M0 = fmaxf(M0, __ldcg(p + 32 * CT));
                M1 = fmaxf(M1, __ldcg(p + 33 * CT));
            }
#pragma unroll
            for (int x = 0; x < D / 8; x++) o[x][0] = o[x][1] = o[x][2] = o[x][3] = 0.0f;
            l0 = l1 = 0.0f;
            for (int wk = w_lo; wk <= w_hi; wk++) {
                const float* p = slot(wk);
                const float c0 = fast_exp2(__ldcg(p + 32 * CT) - M0), c1 = fast_exp2(__ldcg(p + 33 * CT) - M1);
                l0 += __ldcg(p + 34 * CT) * c0;
                l1 += __ldcg(p + 35 * CT) * c1;
#pragma unroll
                for (int x = 0; x < D / 8; x++) {
                    o[x][0] += __ldcg(p + (x * 4 + 0) * CT) * c0;
                    o[x][1] += __ldcg(p + (x * 4 + 1) * CT) * c0;
                    o[x][2] += __ldcg(p + (x * 4 + 2) * CT) * c1;
                    o[x][3] += __ldcg(p + (x * 4 + 3) * CT) * c1;
                }
            }
        }
        finish_rows<D>(o, l0, l1, out, b, h, qg * BQ + 64 * c, seq, heads, warp, lane);
    }
}

extern "C" __global__ void __launch_bounds__(512, 1)
attention_wsk3(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
               int heads, float scale_log2, int batch, float* ws, int* cnt) {
    attention_wsk<3, 5, 160>(map, out, lens, seq, heads, scale_log2, batch, ws, cnt);
}
extern "C" __global__ void __launch_bounds__(384, 1)
attention_wsk2(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens, int seq,
               int heads, float scale_log2, int batch, float* ws, int* cnt) {
    attention_wsk<2, 6, 240>(map, out, lens, seq, heads, scale_log2, batch, ws, cnt);
}

// Variants of the kept kernel (attention_wgmma_bf16_d64): SOUT stages the output tile in
// shared memory and stores 16-byte chunks, as the kept kernel does (finish_rows_staged);
// without it, finish_rows's 4-byte stores. SPLIT gives K and V their own full barriers.
template <bool SOUT, bool SPLIT, int ST>
__device__ __forceinline__ void attention_v(const TmaMap& map, bf16_t* __restrict__ out, const int* __restrict__ lens,
                                           int seq, int heads, float scale_log2) {
    constexpr int D = 64, NC = 3, BQ = 64 * NC, BK = 128, NT = BK / 8;
    constexpr int QTILE = 64 * D * 2, TILE = BK * D * 2; // bytes
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[1 + 3 * ST];
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    auto sK = [&](int s) { return sm + NC * QTILE + s * 2 * TILE; };
    auto sV = [&](int s) { return sm + NC * QTILE + s * 2 * TILE + TILE; };

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hidden = heads * D;
    const int limit = lens != nullptr ? min(lens[b], seq) : seq;
    const int ntiles = (limit + BK - 1) / BK;
    const u32 bq = smem_u32(&bars[0]), full = bq + 8, empty = full + 8 * ST, fullv = empty + 8 * ST;
    if (tid == 0) {
        mbar_init(bq, 1);
        for (int s = 0; s < ST; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(fullv + 8 * s, 1);
            mbar_init(empty + 8 * s, NC * 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 0) {
            mbar_expect_tx(bq, NC * QTILE);
            for (int c = 0; c < NC; c++) tma_load(sm + c * QTILE, &map, bq, h * D, q0 + 64 * c, b);
            for (int t = 0; t < ntiles; t++) {
                const int s = t % ST;
                if (t >= ST) mbar_wait(empty + 8 * s, (t / ST - 1) & 1);
                const u32 bar = full + 8 * s, barv = SPLIT ? fullv + 8 * s : bar;
                if (SPLIT) {
                    mbar_expect_tx(bar, TILE);
                    mbar_expect_tx(barv, TILE);
                } else {
                    mbar_expect_tx(bar, 2 * TILE);
                }
                tma_load(sK(s), &map, bar, hidden + h * D, t * BK, b);
                tma_load(sK(s) + TILE / 2, &map, bar, hidden + h * D, t * BK + 64, b);
                tma_load(sV(s), &map, barv, 2 * hidden + h * D, t * BK, b);
                tma_load(sV(s) + TILE / 2, &map, barv, 2 * hidden + h * D, t * BK + 64, b);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
    const int c = wg - 1;
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u64 dq = wgmma_desc(sm + c * QTILE, 1024);
    mbar_wait(bq, 0);
    for (int j = 0; j < ntiles; j++) {
        const int st = j % ST;
        mbar_wait(full + 8 * st, (j / ST) & 1);
        const u64 dk = wgmma_desc(sK(st), 1024);
        const u64 dv = wgmma_desc(sV(st), 1024);
        float s[NT][4];
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        wgmma_commit();
        wgmma_wait0();
        online_softmax(s, o, m0, m1, l0, l1, scale_log2, j * BK, limit, lane);
        if (SPLIT) mbar_wait(fullv + 8 * st, (j / ST) & 1);
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
        if (lane == 0) mbar_arrive(empty + 8 * st);
    }
    if constexpr (!SOUT) {
        finish_rows<D>(o, l0, l1, out, b, h, q0 + 64 * c, seq, heads, warp, lane);
    } else {
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
        unsigned char* so = sm + c * QTILE; // Q's tile, read by no wgmma any more
        const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            *(u32*)(so + r0 * 128 + ((i ^ (r0 & 7)) << 4) + (lane & 3) * 4) = pack_bf16x2(o[i][0] * inv0, o[i][1] * inv0);
            *(u32*)(so + r1 * 128 + ((i ^ (r1 & 7)) << 4) + (lane & 3) * 4) = pack_bf16x2(o[i][2] * inv1, o[i][3] * inv1);
        }
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
        const int ct = tid & 127, qc = q0 + 64 * c;
        bf16_t* ob = out + (long)b * seq * hidden + h * D;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int u = ct + 128 * k, r = u >> 3, ch = u & 7;
            if (qc + r < seq)
                *(uint4*)(ob + (long)(qc + r) * hidden + ch * 8) = *(const uint4*)(so + r * 128 + ((ch ^ (r & 7)) << 4));
        }
    }
}
#define VAR(NAME, A, B, C) \
extern "C" __global__ void __launch_bounds__(512, 1) NAME(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, \
    const int* __restrict__ lens, int seq, int heads, float scale_log2) { attention_v<A, B, C>(map, out, lens, seq, heads, scale_log2); }
VAR(attention_v_unstaged, false, false, 6)
VAR(attention_v_split, false, true, 6)
VAR(attention_v_both, true, true, 6)
VAR(attention_v_split5, false, true, 5)
