// FlashAttention-3's intra-warpgroup overlap for the kept kernel's consumers: each
// iteration issues S(j) = Q·K(j)ᵀ and then O += P(j-1)·V(j-1) (P from registers), waits for
// S(j) only, runs the softmax of S(j) while P·V still runs, then waits for it and rescales O.
// The operations on O come in the same order as in the kept kernel (rescale, then add the
// next tile's P·V), so the output is meant to be bit-identical.
// softmax_scores: online_softmax without the O rescale, which it leaves to the caller
// through alpha0/alpha1.
// 2^x for x <= 0 on the FMA and integer pipes, not the special-function unit
// (FlashAttention-4's trick): x = n + f with n = round(x) (the 1.5 · 2^23 addition leaves n
// in the low mantissa bits), f in [-0.5, 0.5]; 2^f by a degree-3 polynomial (least squares
// on Chebyshev nodes, relative error 7.7e-5), then n added to its exponent field.
// x is clamped at -125, so a masked score gives 2^-125, not 0.
__device__ __forceinline__ float exp2_fma(float x) {
    x = fmaxf(x, -125.0f);
    const float t = x + 12582912.0f;
    const float f = x - (t - 12582912.0f);
    float p = fmaf(0.055088684f, f, 0.242604047f);
    p = fmaf(p, f, 0.693276227f);
    p = fmaf(p, f, 0.999928951f);
    return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}
template <int EMU8 = 0> __device__ __forceinline__ float exp2_mix(float x, int nt) {
    return (nt & 7) < EMU8 ? exp2_fma(x) : fast_exp2(x);
}

template <int NT, int EMU8 = 0>
__device__ __forceinline__ void softmax_scores(float (&s)[NT][4], float& m0, float& m1, float& l0, float& l1,
                                               float& alpha0, float& alpha1, float scale_log2, int key0, int limit,
                                               int lane) {
    if (key0 + NT * 8 > limit) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (key0 + nt * 8 + (lane & 3) * 2 + (e & 1) >= limit) s[nt][e] = NEG_INF;
    }
    float mx0 = fmaxf(s[0][0], s[0][1]), mx1 = fmaxf(s[0][2], s[0][3]);
#pragma unroll
    for (int nt = 1; nt < NT; nt++) {
        mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    mx0 = fmaxf(m0, mx0 * scale_log2);
    mx1 = fmaxf(m1, mx1 * scale_log2);
    alpha0 = fast_exp2(m0 - mx0);
    alpha1 = fast_exp2(m1 - mx1);
    m0 = mx0;
    m1 = mx1;
    float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        s[nt][0] = exp2_mix<EMU8>(s[nt][0] * scale_log2 - mx0, nt);
        s[nt][1] = exp2_mix<EMU8>(s[nt][1] * scale_log2 - mx0, nt);
        s[nt][2] = exp2_mix<EMU8>(s[nt][2] * scale_log2 - mx1, nt);
        s[nt][3] = exp2_mix<EMU8>(s[nt][3] * scale_log2 - mx1, nt);
        r0 += s[nt][0] + s[nt][1];
        r1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * alpha0 + r0;
    l1 = l1 * alpha1 + r1;
}
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

template <int ST, int EMU8>
__device__ __forceinline__ void consume_overlap(float (&o)[8][4], float& m0, float& m1, float& l0, float& l1, u64 dq,
                                                unsigned char* ring, u32 full, u32 empty, int& n, int t0, int te,
                                                int limit, float scale_log2, int lane) {
    constexpr int BK = 128, NT = BK / 8, TILE = BK * 64 * 2;
    if (t0 >= te) return;
    float s[NT][4];
    u32 p[BK / 16][4];
    float a0, a1;
    // First tile: S, softmax, P.
    int st = n % ST;
    mbar_wait(full + 8 * st, (n / ST) & 1);
    {
        const u64 dk = wgmma_desc(ring + st * 2 * TILE, 1024);
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        wgmma_commit();
        wgmma_wait0();
    }
    softmax_scores<NT, EMU8>(s, m0, m1, l0, l1, a0, a1, scale_log2, t0 * BK, limit, lane);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        o[i][0] *= a0; o[i][1] *= a0; o[i][2] *= a1; o[i][3] *= a1;
    }
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
        p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
        p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
        p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    for (int t = t0 + 1; t < te; t++) {
        const int prev = st;
        n++;
        st = n % ST;
        mbar_wait(full + 8 * st, (n / ST) & 1);
        const u64 dk = wgmma_desc(ring + st * 2 * TILE, 1024);
        const u64 dv = wgmma_desc(ring + prev * 2 * TILE + TILE, 1024);
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            wgmma_rs_t(&o[0][0], p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv + (u64)(kk * 16 * 128 >> 4));
        wgmma_commit();
        wgmma_wait1();
        softmax_scores<NT, EMU8>(s, m0, m1, l0, l1, a0, a1, scale_log2, t * BK, limit, lane);
        wgmma_wait0();
        if (lane == 0) mbar_arrive(empty + 8 * prev);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            o[i][0] *= a0; o[i][1] *= a0; o[i][2] *= a1; o[i][3] *= a1;
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
            p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
            p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
    }
    {
        const u64 dv = wgmma_desc(ring + st * 2 * TILE + TILE, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            wgmma_rs_t(&o[0][0], p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv + (u64)(kk * 16 * 128 >> 4));
        wgmma_commit();
        wgmma_wait0();
        if (lane == 0) mbar_arrive(empty + 8 * st);
    }
    n++;
}

// The kept kernel's loop with P packed before the fence, so that ptxas need not inject a
// warpgroup.arrive before each P·V wgmma (it does, 7 times, in the kept kernel).
template <int ST>
__device__ __forceinline__ void consume_packfirst(float (&o)[8][4], float& m0, float& m1, float& l0, float& l1,
                                                  u64 dq, unsigned char* ring, u32 full, u32 empty, int& n, int t0,
                                                  int te, int limit, float scale_log2, int lane) {
    constexpr int BK = 128, NT = BK / 8, TILE = BK * 64 * 2;
    for (int t = t0; t < te; t++, n++) {
        const int st = n % ST;
        mbar_wait(full + 8 * st, (n / ST) & 1);
        const u64 dk = wgmma_desc(ring + st * 2 * TILE, 1024);
        const u64 dv = wgmma_desc(ring + st * 2 * TILE + TILE, 1024);
        float s[NT][4];
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        wgmma_commit();
        wgmma_wait0();
        online_softmax(s, o, m0, m1, l0, l1, scale_log2, t * BK, limit, lane);
        u32 p[BK / 16][4];
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
            p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
            p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            wgmma_rs_t(&o[0][0], p[kk][0], p[kk][1], p[kk][2], p[kk][3], dv + (u64)(kk * 16 * 128 >> 4));
        wgmma_commit();
        wgmma_wait0();
        if (lane == 0) mbar_arrive(empty + 8 * st);
    }
}

template <int ST, int MODE, int EMU8 = 0>
__device__ __forceinline__ void att_ovl(const TmaMap& map, bf16_t* __restrict__ out, const int* __restrict__ lens,
                                        int seq, int heads, float scale_log2) {
    constexpr int D = 64, NC = 3, BQ = 64 * NC, BK = 128;
    constexpr int QTILE = 64 * D * 2, TILE = BK * D * 2;
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[1 + 2 * ST];
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* ring = sm + NC * QTILE;
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hidden = heads * D;
    const int limit = lens != nullptr ? min(lens[b], seq) : seq;
    const int ntiles = (limit + BK - 1) / BK;
    const u32 bq = smem_u32(&bars[0]), full = bq + 8, empty = full + 8 * ST;
    if (tid == 0) {
        mbar_init(bq, 1);
        for (int s = 0; s < ST; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, NC * 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    int n = 0;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 0) {
            mbar_expect_tx(bq, NC * QTILE);
            for (int c = 0; c < NC; c++) tma_load(sm + c * QTILE, &map, bq, h * D, q0 + 64 * c, b);
            for (int t = 0; t < ntiles; t++, n++) {
                const int s = n % ST;
                if (n >= ST) mbar_wait(empty + 8 * s, (n / ST - 1) & 1);
                const u32 bar = full + 8 * s;
                unsigned char* k = ring + s * 2 * TILE;
                mbar_expect_tx(bar, 2 * TILE);
                tma_load(k, &map, bar, hidden + h * D, t * BK, b);
                tma_load(k + TILE / 2, &map, bar, hidden + h * D, t * BK + 64, b);
                tma_load(k + TILE, &map, bar, 2 * hidden + h * D, t * BK, b);
                tma_load(k + TILE + TILE / 2, &map, bar, 2 * hidden + h * D, t * BK + 64, b);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
    const int c = wg - 1;
    float o[D / 8][4], m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    mbar_wait(bq, 0);
    if (MODE == 0)
        consume_overlap<ST, EMU8>(o, m0, m1, l0, l1, wgmma_desc(sm + c * QTILE, 1024), ring, full, empty, n, 0,
                                   ntiles, limit, scale_log2, lane);
    else
        consume_packfirst<ST>(o, m0, m1, l0, l1, wgmma_desc(sm + c * QTILE, 1024), ring, full, empty, n, 0, ntiles,
                              limit, scale_log2, lane);
    finish_rows_staged(o, l0, l1, sm + c * QTILE, 1 + c, out, b, h, q0 + 64 * c, seq, heads, tid & 127);
}
extern "C" __global__ void __launch_bounds__(512, 1) att_ovl6(const __grid_constant__ TmaMap map, bf16_t* out,
                                                              const int* lens, int seq, int heads, float sl) {
    att_ovl<6, 0>(map, out, lens, seq, heads, sl);
}
extern "C" __global__ void __launch_bounds__(512, 1) att_ovl4(const __grid_constant__ TmaMap map, bf16_t* out,
                                                              const int* lens, int seq, int heads, float sl) {
    att_ovl<4, 0>(map, out, lens, seq, heads, sl);
}

extern "C" __global__ void __launch_bounds__(512, 1) att_pf6(const __grid_constant__ TmaMap map, bf16_t* out,
                                                             const int* lens, int seq, int heads, float sl) {
    att_ovl<6, 1>(map, out, lens, seq, heads, sl);
}
extern "C" __global__ void __launch_bounds__(512, 1) att_ovl6e1(const __grid_constant__ TmaMap map, bf16_t* out,
                                                                const int* lens, int seq, int heads, float sl) {
    att_ovl<6, 0, 1>(map, out, lens, seq, heads, sl);
}
extern "C" __global__ void __launch_bounds__(512, 1) att_ovl6e2(const __grid_constant__ TmaMap map, bf16_t* out,
                                                                const int* lens, int seq, int heads, float sl) {
    att_ovl<6, 0, 2>(map, out, lens, seq, heads, sl);
}
extern "C" __global__ void __launch_bounds__(512, 1) att_ovl6e3(const __grid_constant__ TmaMap map, bf16_t* out,
                                                                const int* lens, int seq, int heads, float sl) {
    att_ovl<6, 0, 3>(map, out, lens, seq, heads, sl);
}
extern "C" __global__ void __launch_bounds__(512, 1) att_ovl6e4(const __grid_constant__ TmaMap map, bf16_t* out,
                                                                const int* lens, int seq, int heads, float sl) {
    att_ovl<6, 0, 4>(map, out, lens, seq, heads, sl);
}
