// Row sums on the tensor core: P·V runs on wgmma.m64n72k16, whose B operand is V (one
// 128-byte swizzle atom of 64 columns) followed, LBO bytes further on, by a 2 KiB region of
// bf16 ones (16 keys × 128 bytes; every k16 step's descriptor points its second atom there).
// O's ninth n-block then holds every row's sum of the bf16 P, rescaled with O, so the
// softmax drops its 64 additions per thread and tile. (CUTLASS's canonical MN-major SW128
// layout, cute/atom/mma_traits_sm90_gmma.hpp: atoms along MN at stride LBO, 8-row groups
// along K at stride SBO.)
__device__ __forceinline__ void drv_wgmma_rs_t72(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, {%36, %37, %38, %39}, %40, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}
// The softmax of one tile without row sums: scores → P, m updated, the rescale factors out.
template <int NT>
__device__ __forceinline__ void softmax_nosum(float (&s)[NT][4], float& m0, float& m1, float& alpha0, float& alpha1,
                                              float scale_log2, int key0, int limit, int lane) {
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
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        s[nt][0] = fast_exp2(s[nt][0] * scale_log2 - mx0);
        s[nt][1] = fast_exp2(s[nt][1] * scale_log2 - mx0);
        s[nt][2] = fast_exp2(s[nt][2] * scale_log2 - mx1);
        s[nt][3] = fast_exp2(s[nt][3] * scale_log2 - mx1);
    }
}
__device__ __forceinline__ void rescale9(float (&o)[9][4], float a0, float a1) {
#pragma unroll
    for (int i = 0; i < 9; i++) {
        o[i][0] *= a0; o[i][1] *= a0; o[i][2] *= a1; o[i][3] *= a1;
    }
}
// A 128B-swizzled descriptor from a shared address, SBO 1024.
__device__ __forceinline__ u64 wgmma_desc_at(u32 a) { return (u64)((a & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62); }
// LBO of a descriptor whose start is `start` and whose second atom is `ones` (bytes).
__device__ __forceinline__ u64 with_lbo(u64 d, u32 start, u32 ones) { return (d & ~((u64)0x3FFF << 16)) | ((u64)(((ones - start) >> 4) & 0x3FFF) << 16); }

template <int ST, bool OVL>
__device__ __forceinline__ void att_rs(const TmaMap& map, bf16_t* __restrict__ out, const int* __restrict__ lens,
                                       int seq, int heads, float scale_log2) {
    constexpr int D = 64, NC = 3, BQ = 64 * NC, BK = 128, NT = BK / 8;
    constexpr int QTILE = 64 * D * 2, TILE = BK * D * 2;
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[1 + 2 * ST];
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* ring = sm + NC * QTILE;
    unsigned char* ones = ring + ST * 2 * TILE; // 2 KiB of bf16 1.0
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
    ((u32*)ones)[tid] = 0x3F803F80u; // 512 threads × 4 bytes = 2 KiB
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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
    float o[9][4], m0 = NEG_INF, m1 = NEG_INF, a0, a1;
#pragma unroll
    for (int i = 0; i < 9; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    const u64 dq = wgmma_desc(sm + c * QTILE, 1024);
    const u32 ones_a = smem_u32(ones);
    mbar_wait(bq, 0);
    float s[NT][4];
    auto pv = [&](int st, const u32 (&p)[BK / 16][4]) {
        const u32 v0 = smem_u32(ring + st * 2 * TILE + TILE);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            const u32 a = v0 + kk * 16 * 128;
            drv_wgmma_rs_t72(&o[0][0], p[kk][0], p[kk][1], p[kk][2], p[kk][3], with_lbo(wgmma_desc_at(a), a, ones_a));
        }
    };
    auto pack = [&](u32 (&p)[BK / 16][4]) {
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
            p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
            p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
    };
    if (!OVL) {
        for (int t = 0; t < ntiles; t++, n++) {
            const int st = n % ST;
            mbar_wait(full + 8 * st, (n / ST) & 1);
            const u64 dk = wgmma_desc(ring + st * 2 * TILE, 1024);
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < 4; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
            wgmma_commit();
            wgmma_wait0();
            softmax_nosum(s, m0, m1, a0, a1, scale_log2, t * BK, limit, lane);
            rescale9(o, a0, a1);
            u32 p[BK / 16][4];
            pack(p);
            wgmma_fence();
            pv(st, p);
            wgmma_commit();
            wgmma_wait0();
            if (lane == 0) mbar_arrive(empty + 8 * st);
        }
    } else if (ntiles > 0) {
        u32 p[BK / 16][4];
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
        softmax_nosum(s, m0, m1, a0, a1, scale_log2, 0, limit, lane);
        rescale9(o, a0, a1);
        pack(p);
        for (int t = 1; t < ntiles; t++) {
            const int prev = st;
            n++;
            st = n % ST;
            mbar_wait(full + 8 * st, (n / ST) & 1);
            const u64 dk = wgmma_desc(ring + st * 2 * TILE, 1024);
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < 4; kc++) wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
            wgmma_commit();
            pv(prev, p);
            wgmma_commit();
            wgmma_wait1();
            softmax_nosum(s, m0, m1, a0, a1, scale_log2, t * BK, limit, lane);
            wgmma_wait0();
            if (lane == 0) mbar_arrive(empty + 8 * prev);
            rescale9(o, a0, a1);
            pack(p);
        }
        wgmma_fence();
        pv(st, p);
        wgmma_commit();
        wgmma_wait0();
        if (lane == 0) mbar_arrive(empty + 8 * st);
        n++;
    }
    // Every thread of a quad holds the whole row sum in o[8]; finish_rows_staged adds the
    // quad's four parts, so hand it a quarter (exact: a power of two).
    finish_rows_staged(*(float(*)[8][4])o, o[8][0] * 0.25f, o[8][2] * 0.25f, sm + c * QTILE, 1 + c, out, b, h,
                       q0 + 64 * c, seq, heads, tid & 127);
}
extern "C" __global__ void __launch_bounds__(512, 1) att_rs6(const __grid_constant__ TmaMap map, bf16_t* out,
                                                             const int* lens, int seq, int heads, float sl) {
    att_rs<6, false>(map, out, lens, seq, heads, sl);
}
extern "C" __global__ void __launch_bounds__(512, 1) att_rs6o(const __grid_constant__ TmaMap map, bf16_t* out,
                                                              const int* lens, int seq, int heads, float sl) {
    att_rs<6, true>(map, out, lens, seq, heads, sl);
}
