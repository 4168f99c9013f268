// The variants of the warp-specialised TF32 kernel timed by attention.cu here: a template
// over the key tile (64 or 128), the stages of K + Vᵀ and the V buffers, with the
// producer's and consumers' setmaxnreg counts. <128, 2, 1, 56, 152> (ws128_2_1) is the kept
// attention_wgmma_tf32_d64, written out in attention.cu. wgmma_tf32_ss_n128 is attention.cu's.
// d (64×64, f32) = (scale_d ? d : 0) + A·Bᵀ, A and B tf32 K-major in shared memory.
__device__ __forceinline__ void wgmma_tf32_ss_n64(float* d, u64 da, u64 db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
}
template <int N> __device__ __forceinline__ void wgmma_tf32_ss(float* d, u64 da, u64 db, int scale_d) {
    if constexpr (N == 64) wgmma_tf32_ss_n64(d, da, db, scale_d);
    else wgmma_tf32_ss_n128(d, da, db, scale_d);
}

// finish_rows through shared memory for f32 (64 rows of 256 bytes at `tile`): pairs written
// 8 bytes at a time, chunk ch of row r at ch ^ 2·(r % 8), then whole 16-byte chunks stored,
// sixteen threads to a row. Both phases are free of bank conflicts.
__device__ __forceinline__ void finish_rows_staged_f32(const float (&o)[8][4], float l0, float l1, unsigned char* tile,
                                                       int bar, float* __restrict__ out, int b, int h, int q0, int seq,
                                                       int heads, int t) {
    float inv0, inv1;
    row_inverses(l0, l1, inv0, inv1);
    const int warp = t >> 5, lane = t & 31, r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int ch = 2 * i + ((lane & 3) >> 1), off = (lane & 1) * 8;
        *(float2*)(tile + r0 * 256 + ((ch ^ (2 * (r0 & 7))) << 4) + off) = make_float2(o[i][0] * inv0, o[i][1] * inv0);
        *(float2*)(tile + r1 * 256 + ((ch ^ (2 * (r1 & 7))) << 4) + off) = make_float2(o[i][2] * inv1, o[i][3] * inv1);
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
    const int hidden = heads * 64;
    float* ob = out + (long)b * seq * hidden + h * 64;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int u = t + 128 * k, r = u >> 4, ch = u & 15;
        if (q0 + r < seq)
            *(uint4*)(ob + (long)(q0 + r) * hidden + ch * 4) = *(const uint4*)(tile + r * 256 + ((ch ^ (2 * (r & 7))) << 4));
    }
}

// The warp-specialised TF32 kernel over key tiles of BK, ST stages of K + Vᵀ, RV V buffers;
// SO: output staged through the Q tile; RK: the transposing warps also round K in place.
template <int BK, int ST, int RV, int PREG, int CREG, bool SO = false, bool RK = false>
__device__ __forceinline__ void attention_ws_tf32(const TmaMap& map, float* __restrict__ out, const int* __restrict__ lens,
                                                  int seq, int heads, float scale_log2) {
    constexpr int D = 64, NC = 3, BQ = 64 * NC, NT = BK / 8, PH = BK / 32;
    constexpr int QTILE = 64 * D * 4, TILE = BK * D * 4, TW = 3; // bytes; transposing warps
    extern __shared__ unsigned char smem_raw[];
    // Q, full[ST], empty[ST], raw[RV], free[RV]
    __shared__ __align__(8) unsigned long long bars[1 + 3 * ST + 2 * RV]; // + K landed[ST] (RK)
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    auto sK = [&](int s) { return sm + NC * QTILE + s * 2 * TILE; };
    auto sVt = [&](int s) { return sm + NC * QTILE + s * 2 * TILE + TILE; };
    auto sVr = [&](int r) { return sm + NC * QTILE + ST * 2 * TILE + r * TILE; };

    const int tid = threadIdx.x, wg = tid >> 7, warp = tid >> 5, lane = tid & 31;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hidden = heads * D;
    const int limit = lens != nullptr ? min(lens[b], seq) : seq;
    const int ntiles = (limit + BK - 1) / BK;
    const u32 bq = smem_u32(&bars[0]), full = bq + 8, empty = full + 8 * ST, raw = empty + 8 * ST, freed = raw + 8 * RV,
              kin = freed + 8 * RV;
    const u32 kbar = RK ? kin : full; // where the K copy completes
    if (tid == 0) {
        mbar_init(bq, 1);
        for (int s = 0; s < ST; s++) {
            mbar_init(full + 8 * s, RK ? TW : 1 + TW); // (the K copy's expect_tx,) one per transposing warp
            mbar_init(kin + 8 * s, 1);
            mbar_init(empty + 8 * s, NC * 4); // one per consumer warp
        }
        for (int r = 0; r < RV; r++) {
            mbar_init(raw + 8 * r, 1);
            mbar_init(freed + 8 * r, TW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PREG) : "memory");
        if (warp == 0) {
            if (lane == 0) {
                mbar_expect_tx(bq, NC * QTILE);
                for (int c = 0; c < NC; c++)
                    for (int a = 0; a < 2; a++)
                        tma_load(sm + c * QTILE + a * (QTILE / 2), &map, bq, h * D + 32 * a, q0 + 64 * c, b);
                for (int t = 0; t < ntiles; t++) {
                    const int s = t % ST, r = t % RV;
                    if (t >= ST) mbar_wait(empty + 8 * s, (t / ST - 1) & 1);
                    mbar_expect_tx(kbar + 8 * s, TILE);
                    for (int a = 0; a < 2; a++)
                        for (int rh = 0; rh < BK / 64; rh++)
                            tma_load(sK(s) + a * (TILE / 2) + rh * 8192, &map, kbar + 8 * s, hidden + h * D + 32 * a, t * BK + 64 * rh, b);
                    if (t >= RV) mbar_wait(freed + 8 * r, (t / RV - 1) & 1);
                    mbar_expect_tx(raw + 8 * r, TILE);
                    for (int a = 0; a < 2; a++)
                        for (int rh = 0; rh < BK / 64; rh++)
                            tma_load(sVr(r) + a * (TILE / 2) + rh * 8192, &map, raw + 8 * r, 2 * hidden + h * D + 32 * a, t * BK + 64 * rh, b);
                }
            }
        } else {
            for (int t = 0; t < ntiles; t++) {
                const int s = t % ST, r = t % RV;
                mbar_wait(raw + 8 * r, (t / RV) & 1);
                if (t >= ST) mbar_wait(empty + 8 * s, (t / ST - 1) & 1);
                const unsigned char* src = sVr(r);
                unsigned char* dst = sVt(s);
                if (RK) {
                    mbar_wait(kin + 8 * s, (t / ST) & 1);
                    for (int u = tid - 32; u < TILE / 16; u += 32 * TW) {
                        uint4* p = (uint4*)(sK(s) + u * 16);
                        uint4 v = *p;
                        v.x = tf32_bits_smem(__uint_as_float(v.x));
                        v.y = tf32_bits_smem(__uint_as_float(v.y));
                        v.z = tf32_bits_smem(__uint_as_float(v.z));
                        v.w = tf32_bits_smem(__uint_as_float(v.w));
                        *p = v;
                    }
                }
                for (int u = tid - 32; u < 4 * BK; u += 32 * TW) {
                    const int i = u & 7, k = u >> 3, kh = k / PH;
                    const int a = i >> 1, q = i & 1, p = 4 * (k % PH) + a, at = kh & 1;
                    const int c = 2 * ((a + (kh >> 2)) & 3) + ((kh >> 1) & 1), c4 = 8 * at + c;
                    float4 kv[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = 8 * p + q + 2 * e;
                        kv[e] = *(const float4*)(src + at * (TILE / 2) + key * 128 + ((c ^ (key & 7)) << 4));
                    }
                    unsigned char* d0 = dst + (p >> 2) * 8192 + c4 * 4 * 128; // Vᵀ atoms: 32 keys × 64 dims
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        uint4 w;
                        w.x = tf32_bits_smem((&kv[0].x)[x]);
                        w.y = tf32_bits_smem((&kv[1].x)[x]);
                        w.z = tf32_bits_smem((&kv[2].x)[x]);
                        w.w = tf32_bits_smem((&kv[3].x)[x]);
                        *(uint4*)(d0 + x * 128 + ((i ^ (4 * (c4 & 1) + x)) << 4)) = w;
                    }
                }
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                __syncwarp();
                if (lane == 0) {
                    mbar_arrive(freed + 8 * r);
                    mbar_arrive(full + 8 * s);
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CREG) : "memory");
    const int c = wg - 1, t = tid & 127;
    unsigned char* sq = sm + c * QTILE;
    mbar_wait(bq, 0);
    // Round this consumer's Q tile in place once (wgmma would truncate it).
#pragma unroll
    for (int i = 0; i < QTILE / 16 / 128; i++) {
        uint4* p = (uint4*)(sq + (t + 128 * i) * 16);
        uint4 v = *p;
        v.x = tf32_bits(__uint_as_float(v.x));
        v.y = tf32_bits(__uint_as_float(v.y));
        v.z = tf32_bits(__uint_as_float(v.z));
        v.w = tf32_bits(__uint_as_float(v.w));
        *p = v;
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u64 dq = wgmma_desc(sq, 1024);
    for (int j = 0; j < ntiles; j++) {
        const int st = j % ST;
        mbar_wait(full + 8 * st, (j / ST) & 1);
        const u64 dk = wgmma_desc(sK(st), 1024);
        const u64 dvt = wgmma_desc(sVt(st), 1024);
        float s[NT][4];
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < D / 8; kc++) {
            wgmma_tf32_ss<BK>(&s[0][0], dq + (u64)((kc >> 2) * 8192 >> 4) + 2 * (kc & 3),
                              dk + (u64)((kc >> 2) * (TILE / 2) >> 4) + 2 * (kc & 3), kc);
        }
        wgmma_commit();
        wgmma_wait0();

        online_softmax(s, o, m0, m1, l0, l1, scale_log2, j * BK, limit, lane);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 8; kk++) {
            wgmma_tf32_rs(&o[0][0], tf32_bits(s[kk][0]), tf32_bits(s[kk][2]), tf32_bits(s[kk][1]),
                          tf32_bits(s[kk][3]), dvt + (u64)((kk >> 2) * 8192 >> 4) + 2 * (kk & 3), 1);
        }
        wgmma_commit();
        wgmma_wait0();
        if (lane == 0) mbar_arrive(empty + 8 * st);
    }
    if (SO)
        finish_rows_staged_f32(o, l0, l1, sq, 1 + c, out, b, h, q0 + 64 * c, seq, heads, t);
    else
        finish_rows<D>(o, l0, l1, out, b, h, q0 + 64 * c, seq, heads, (tid >> 5) & 3, lane);
}

extern "C" __global__ void __launch_bounds__(512, 1)
ws_4_2(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens, int seq, int heads,
         float scale_log2) {
    attention_ws_tf32<64, 4, 2, 56, 152>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
ws_5_1(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens, int seq, int heads,
         float scale_log2) {
    attention_ws_tf32<64, 5, 1, 56, 152>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
ws_3_2(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens, int seq, int heads,
         float scale_log2) {
    attention_ws_tf32<64, 3, 2, 56, 152>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
ws_4_3(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens, int seq, int heads,
         float scale_log2) {
    attention_ws_tf32<64, 4, 3, 56, 152>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
ws_2_2(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens, int seq, int heads,
         float scale_log2) {
    attention_ws_tf32<64, 2, 2, 56, 152>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
ws_3_1(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens, int seq, int heads,
         float scale_log2) {
    attention_ws_tf32<64, 3, 1, 56, 152>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
ws128_2_1(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens, int seq, int heads,
          float scale_log2) {
    attention_ws_tf32<128, 2, 1, 56, 152>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
ws128_so(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens, int seq, int heads,
         float scale_log2) {
    attention_ws_tf32<128, 2, 1, 56, 152, true, false>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
ws128_rk(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens, int seq, int heads,
         float scale_log2) {
    attention_ws_tf32<128, 2, 1, 56, 152, false, true>(map, out, lens, seq, heads, scale_log2);
}
extern "C" __global__ void __launch_bounds__(512, 1)
ws128_so_rk(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens, int seq,
            int heads, float scale_log2) {
    attention_ws_tf32<128, 2, 1, 56, 152, true, true>(map, out, lens, seq, heads, scale_log2);
}
