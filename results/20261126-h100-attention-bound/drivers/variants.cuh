// Variants of the kept bf16 kernel (attention_wgmma_bf16_d64) that locate its bound.
//  ROT: each block walks the key tiles starting at tile blockIdx.x·ntiles/gridDim.x (and
//       wrapping), so the 18 blocks of a head read different K/V tiles at any one time
//       rather than the same lines of L2 together. The softmax sums in another order.
//  NOEXP: the softmax replaced by one multiply per score (wrong output; timing only).
//  HEAD0: every block reads head 0's K/V whatever its head (wrong output; timing only):
//       six times fewer distinct lines in L2.
template <bool ROT, bool NOEXP, bool HEAD0>
__device__ __forceinline__ void att_var(const TmaMap& map, bf16_t* __restrict__ out, const int* __restrict__ lens,
                                        int seq, int heads, float scale_log2) {
    constexpr int D = 64, NC = 3, BQ = 64 * NC, BK = 128, NT = BK / 8, ST = 6;
    constexpr int QTILE = 64 * D * 2, TILE = BK * D * 2;
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[1 + 2 * ST];
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    auto sK = [&](int s) { return sm + NC * QTILE + s * 2 * TILE; };
    auto sV = [&](int s) { return sm + NC * QTILE + s * 2 * TILE + TILE; };
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hk = HEAD0 ? 0 : h;
    const int hidden = heads * D;
    const int limit = lens != nullptr ? min(lens[b], seq) : seq;
    const int ntiles = (limit + BK - 1) / BK;
    const int off = ROT ? (int)((long)blockIdx.x * ntiles / gridDim.x) : 0;
    auto tile_of = [&](int j) { int t = j + off; return t >= ntiles ? t - ntiles : t; };
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
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 0) {
            mbar_expect_tx(bq, NC * QTILE);
            for (int c = 0; c < NC; c++) tma_load(sm + c * QTILE, &map, bq, h * D, q0 + 64 * c, b);
            for (int j = 0; j < ntiles; j++) {
                const int s = j % ST, t = tile_of(j);
                if (j >= ST) mbar_wait(empty + 8 * s, (j / ST - 1) & 1);
                const u32 bar = full + 8 * s;
                mbar_expect_tx(bar, 2 * TILE);
                tma_load(sK(s), &map, bar, hidden + hk * D, t * BK, b);
                tma_load(sK(s) + TILE / 2, &map, bar, hidden + hk * D, t * BK + 64, b);
                tma_load(sV(s), &map, bar, 2 * hidden + hk * D, t * BK, b);
                tma_load(sV(s) + TILE / 2, &map, bar, 2 * hidden + hk * D, t * BK + 64, b);
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
        if (NOEXP) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] *= scale_log2;
            l0 += s[0][0];
            l1 += s[0][2];
        } else {
            online_softmax(s, o, m0, m1, l0, l1, scale_log2, tile_of(j) * BK, limit, lane);
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
        if (lane == 0) mbar_arrive(empty + 8 * st);
    }
    finish_rows_staged(o, l0, l1, sm + c * QTILE, 1 + c, out, b, h, q0 + 64 * c, seq, heads, tid & 127);
}
#define VAR(NAME, R, N, H)                                                                                          \
    extern "C" __global__ void __launch_bounds__(512, 1) NAME(const __grid_constant__ TmaMap map, bf16_t* out,     \
                                                              const int* lens, int seq, int heads, float sl) {      \
        att_var<R, N, H>(map, out, lens, seq, heads, sl);                                                            \
    }
VAR(att_copy, false, false, false)
VAR(att_rot, true, false, false)
VAR(att_noexp, false, true, false)
VAR(att_head0, false, false, true)
VAR(att_rot_head0, true, false, true)

