// Fused multi-head self-attention (FlashAttention-2 style: online softmax, the T×T
// score matrix never leaves registers). Input is the fused QKV matrix [batch·seq, 3H]
// (per row: all query heads, all key heads, all value heads); output [batch·seq, H].
// Keys at positions >= lens[b] are masked (BERT padding); lens may be null.
// Grid: (ceil(seq / 64), heads, batch). Entry points: attention_{bf16,tf32,f32}_d{32,64};
// on Hopper also attention_wgmma_{bf16,tf32}_d64 (192 rows a block, a tensor map for QKV:
// see there).
// `scale_log2` = log2(e) / sqrt(head_dim): scores are kept in base-2 units for ex2.

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// 16-byte global→shared copy; zero-fills when !valid (the source is then not read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 to_tf32(float f) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

__device__ __forceinline__ void mma_tf32(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Element offset of 16-byte chunk `chunk` of tile row `row`, XOR-swizzled so that the
// eight rows one ldmatrix reads at the same logical chunk land in eight bank groups.
template <int D> __device__ __forceinline__ int swz(int row, int chunk) {
    constexpr int CH = D / 8;             // chunks per row
    constexpr int SH = (D == 64) ? 0 : 1; // D=32: two rows share a 128-byte line
    return row * D + ((chunk ^ ((row >> SH) & (CH - 1))) * 8);
}

// Issues the cp.async copies of one key/value tile (rows >= limit are zero-filled).
template <int D, int BK, int THREADS>
__device__ __forceinline__ void load_kv_bf16(bf16_t* sk, bf16_t* sv, const bf16_t* base, int tile, int seq, int limit,
                                             long stride, int hidden, int tid) {
    constexpr int CH = D / 8;
#pragma unroll
    for (int i = tid; i < BK * CH; i += THREADS) {
        int r = i / CH, c = i % CH, t = tile * BK + r;
        const bf16_t* src = base + (long)min(t, seq - 1) * stride + c * 8;
        cp_async16(&sk[swz<D>(r, c)], src + hidden, t < limit);
        cp_async16(&sv[swz<D>(r, c)], src + 2 * hidden, t < limit);
    }
}

template <int D, int BK, int THREADS>
__device__ __forceinline__ void load_kv_tf32(float* sk, float* sv, const float* base, int tile, int seq, int limit,
                                             long stride, int hidden, int tid) {
    constexpr int CH = D / 4, LD = D + 4;
#pragma unroll
    for (int i = tid; i < BK * CH; i += THREADS) {
        int r = i / CH, c = i % CH, t = tile * BK + r;
        const float* src = base + (long)min(t, seq - 1) * stride + c * 4;
        cp_async16(&sk[r * LD + c * 4], src + hidden, t < limit);
        cp_async16(&sv[r * LD + c * 4], src + 2 * hidden, t < limit);
    }
}

// One thread's share of the copies of every key/value tile, planned once per block: chunk
// tid % CH of rows tid / CH + PASS·i. A full tile (every row below `limit`) then costs one
// address add per copy: the shared offsets are fixed (the bf16 swizzle repeats every PASS
// rows) and the global address moves PASS rows per copy. The last, partial tile takes the
// clamping, zero-filling copies above. Recomputing the indices per tile was ~170 of ~470
// instructions per warp and tile in the wgmma kernel (Nsight Compute, H100).
template <typename T, int D, int BK, int THREADS>
struct KvCopy {
    static constexpr bool BF16 = sizeof(T) == 2;
    static constexpr int CH = D * (int)sizeof(T) / 16, PASS = THREADS / CH, N = BK * CH / THREADS;
    static constexpr int ROW_BYTES = BF16 ? D * 2 : (D + 4) * 4;
    static_assert(THREADS % CH == 0 && (BK * CH) % THREADS == 0, "whole passes of copies");
    static_assert(!BF16 || ((PASS >> (D == 64 ? 0 : 1)) % CH) == 0, "the swizzle repeats every PASS rows");
    const T* base;
    const T* g0; // this thread's chunk of key row tid / CH, tile 0
    long stride;
    int hidden, seq, limit, tid;
    u32 soff; // its byte offset in a tile

    __device__ __forceinline__ KvCopy(const T* base_, long stride_, int hidden_, int seq_, int limit_, int tid_)
        : base(base_), stride(stride_), hidden(hidden_), seq(seq_), limit(limit_), tid(tid_) {
        const int r = tid / CH, c = tid % CH;
        g0 = base + hidden + (long)r * stride + c * (16 / (int)sizeof(T));
        soff = BF16 ? (u32)swz<D>(r, c) * 2 : (u32)(r * (D + 4) + c * 4) * 4;
    }

    __device__ __forceinline__ void load(T* sk, T* sv, int tile) const {
        if ((tile + 1) * BK <= limit) {
            const T* g = g0 + (long)tile * BK * stride;
            const u32 k = smem_u32(sk) + soff, v = smem_u32(sv) + soff;
#pragma unroll
            for (int i = 0; i < N; i++) {
                const T* src = g + (long)i * PASS * stride;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(k + i * PASS * ROW_BYTES), "l"(src));
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(v + i * PASS * ROW_BYTES), "l"(src + hidden));
            }
        } else if constexpr (BF16) {
            load_kv_bf16<D, BK, THREADS>(sk, sv, base, tile, seq, limit, stride, hidden, tid);
        } else {
            load_kv_tf32<D, BK, THREADS>(sk, sv, base, tile, seq, limit, stride, hidden, tid);
        }
    }
};

// Online-softmax update shared by the tensor-core kernels: one thread holds two rows
// (g and g+8) of a warp's 16-row score tile, NT n-tiles of 8 keys, 2 values per row each,
// and the same two rows of the output accumulator O (DT n-tiles), which it rescales to
// the new row maxima. The scores become P = exp2(scaled score - row maximum).
template <int NT, int DT>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&o)[DT][4], float& m0, float& m1, float& l0,
                                               float& l1, float scale_log2, int key0, int limit, int lane) {
    if (key0 + NT * 8 > limit) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (key0 + nt * 8 + (lane & 3) * 2 + (e & 1) >= limit) s[nt][e] = NEG_INF;
    }
    // The row maximum of the raw scores, scaled once: rounding is monotonic and the scale
    // positive, so this equals the maximum of the scaled scores bit for bit, for one FMUL
    // per row instead of one per score pair (the bf16 wgmma kernel on an H200: 54.9-55.1
    // against 55.4-55.6 µs, results/20261126-h200-attention-experiments at commit 6358458).
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
    // The first tile always holds key 0, so mx is finite from then on; exp2(-inf) = 0.
    const float alpha0 = fast_exp2(m0 - mx0), alpha1 = fast_exp2(m1 - mx1);
    m0 = mx0;
    m1 = mx1;
    float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        s[nt][0] = fast_exp2(s[nt][0] * scale_log2 - mx0);
        s[nt][1] = fast_exp2(s[nt][1] * scale_log2 - mx0);
        s[nt][2] = fast_exp2(s[nt][2] * scale_log2 - mx1);
        s[nt][3] = fast_exp2(s[nt][3] * scale_log2 - mx1);
        r0 += s[nt][0] + s[nt][1];
        r1 += s[nt][2] + s[nt][3];
    }
    // Partial row sums per thread; the quad's four parts are added at the end.
    l0 = l0 * alpha0 + r0;
    l1 = l1 * alpha1 + r1;
#pragma unroll
    for (int i = 0; i < DT; i++) {
        o[i][0] *= alpha0;
        o[i][1] *= alpha0;
        o[i][2] *= alpha1;
        o[i][3] *= alpha1;
    }
}

// The end of every tensor-core kernel: the quad's four partial row sums added, O divided
// by them, and each thread's two rows (g and g+8 of its warp's 16) stored, two adjacent
// columns per store, in the activation type.
__device__ __forceinline__ void store_pair(float* p, float lo, float hi) { *(float2*)p = make_float2(lo, hi); }
__device__ __forceinline__ void store_pair(bf16_t* p, float lo, float hi) { *(u32*)p = pack_bf16x2(lo, hi); }

// 1 / (the sum of the quad's four partial row sums), for both of a thread's rows.
__device__ __forceinline__ void row_inverses(float l0, float l1, float& inv0, float& inv1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    inv0 = 1.0f / l0;
    inv1 = 1.0f / l1;
}

template <int D, typename T>
__device__ __forceinline__ void finish_rows(const float (&o)[D / 8][4], float l0, float l1, T* __restrict__ out, int b,
                                            int h, int q0, int seq, int heads, int warp, int lane) {
    float inv0, inv1;
    row_inverses(l0, l1, inv0, inv1);
    const int hidden = heads * D, r0 = q0 + warp * 16 + (lane >> 2), r1 = r0 + 8;
    T* ob = out + (long)b * seq * hidden + h * D + (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
        if (r0 < seq) store_pair(&ob[(long)r0 * hidden + i * 8], o[i][0] * inv0, o[i][1] * inv0);
        if (r1 < seq) store_pair(&ob[(long)r1 * hidden + i * 8], o[i][2] * inv1, o[i][3] * inv1);
    }
}

// finish_rows for a warpgroup's 64 rows of head size 64 in bf16, through `tile` (64 rows
// of 128 bytes in shared memory, 16-byte chunks XOR-swizzled by row so that the pairs land
// without bank conflicts): each thread writes its pairs there, then, after named barrier
// `bar` of the warpgroup (t = its thread 0..127), stores whole 16-byte chunks, eight
// threads to a 128-byte row. The bf16 wgmma kernel took 42.9-44.6 µs this way against
// 44.6-44.7 with finish_rows's 4-byte stores at the yolos-small shape (H100, the driver of
// results/20261126-h100-attention-tma at commit 6358458). The TF32 wgmma kernels keep finish_rows: staged
// the same way (f32 rows of 256 bytes), the one-warpgroup kernel took 108.7 µs against
// 107.8 (criterion, same run), and the warp-specialised one 78.4-78.9 against 77.8-78.6
// (its driver on an H200, results/20261126-h100-tf32-warpspec/driver-2-rerun.log at commit 6358458).
__device__ __forceinline__ void finish_rows_staged(const float (&o)[8][4], float l0, float l1, unsigned char* tile,
                                                   int bar, bf16_t* __restrict__ out, int b, int h, int q0, int seq,
                                                   int heads, int t) {
    float inv0, inv1;
    row_inverses(l0, l1, inv0, inv1);
    const int warp = t >> 5, lane = t & 31, r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        *(u32*)(tile + r0 * 128 + ((i ^ (r0 & 7)) << 4) + (lane & 3) * 4) = pack_bf16x2(o[i][0] * inv0, o[i][1] * inv0);
        *(u32*)(tile + r1 * 128 + ((i ^ (r1 & 7)) << 4) + (lane & 3) * 4) = pack_bf16x2(o[i][2] * inv1, o[i][3] * inv1);
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
    const int hidden = heads * 64;
    bf16_t* ob = out + (long)b * seq * hidden + h * 64;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int u = t + 128 * k, r = u >> 3, ch = u & 7;
        if (q0 + r < seq)
            *(uint4*)(ob + (long)(q0 + r) * hidden + ch * 8) = *(const uint4*)(tile + r * 128 + ((ch ^ (r & 7)) << 4));
    }
}

// TF32 A fragments of this warp's 16 query rows (mma.m16n8k8's layout), rounded to
// nearest, straight from global memory.
template <int D>
__device__ __forceinline__ void load_q_tf32(u32 (&qf)[D / 8][4], const float* __restrict__ base, long stride, int q0,
                                            int seq, int warp, int lane) {
    const int g = lane >> 2, t4 = lane & 3;
    const int ra = q0 + warp * 16 + g, rb = ra + 8;
    const float* qa = base + (long)min(ra, seq - 1) * stride;
    const float* qb = base + (long)min(rb, seq - 1) * stride;
#pragma unroll
    for (int kc = 0; kc < D / 8; kc++) {
        qf[kc][0] = to_tf32(ra < seq ? qa[kc * 8 + t4] : 0.0f);
        qf[kc][1] = to_tf32(rb < seq ? qb[kc * 8 + t4] : 0.0f);
        qf[kc][2] = to_tf32(ra < seq ? qa[kc * 8 + t4 + 4] : 0.0f);
        qf[kc][3] = to_tf32(rb < seq ? qb[kc * 8 + t4 + 4] : 0.0f);
    }
}

// ---- bf16: mma.m16n8k16, ldmatrix, cp.async double buffering -------------------------
template <int D>
__device__ void attention_bf16(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ out, const int* __restrict__ lens,
                               int seq, int heads, float scale_log2) {
    constexpr int BQ = 64, BK = 64, THREADS = 128, CH = D / 8;
    __shared__ __align__(128) bf16_t sQ[BQ * D];
    __shared__ __align__(128) bf16_t sK[2][BK * D];
    __shared__ __align__(128) bf16_t sV[2][BK * D];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hidden = heads * D;
    const long stride = 3L * hidden;
    const bf16_t* base = qkv + (long)b * seq * stride + h * D;
    const int limit = lens != nullptr ? lens[b] : seq;
    const int ntiles = (limit + BK - 1) / BK;

    for (int i = tid; i < BQ * CH; i += THREADS) {
        int r = i / CH, c = i % CH, t = q0 + r;
        cp_async16(&sQ[swz<D>(r, c)], base + (long)min(t, seq - 1) * stride + c * 8, t < seq);
    }
    const KvCopy<bf16_t, D, BK, THREADS> kv(base, stride, hidden, seq, limit, tid);
    kv.load(sK[0], sV[0], 0);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    u32 qf[D / 16][4];

    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles)
            kv.load(sK[(j + 1) & 1], sV[(j + 1) & 1], j + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) {
                int r = warp * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                ldsm_x4(qf[kc][0], qf[kc][1], qf[kc][2], qf[kc][3], &sQ[swz<D>(r, kc * 2 + (lane >> 4))]);
            }
        }
        const bf16_t* ks = sK[j & 1];
        const bf16_t* vs = sV[j & 1];

        float s[BK / 8][4];
#pragma unroll
        for (int i = 0; i < BK / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int np = 0; np < BK / 16; np++) {
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++) {
                int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
                u32 b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, &ks[swz<D>(r, kc * 2 + ((lane >> 3) & 1))]);
                mma_bf16(s[2 * np], qf[kc][0], qf[kc][1], qf[kc][2], qf[kc][3], b0, b1);
                mma_bf16(s[2 * np + 1], qf[kc][0], qf[kc][1], qf[kc][2], qf[kc][3], b2, b3);
            }
        }

        online_softmax(s, o, m0, m1, l0, l1, scale_log2, j * BK, limit, lane);

#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            u32 p0 = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
            u32 p1 = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
            u32 p2 = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            u32 p3 = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                u32 b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, &vs[swz<D>(r, dp * 2 + (lane >> 4))]);
                mma_bf16(o[2 * dp], p0, p1, p2, p3, b0, b1);
                mma_bf16(o[2 * dp + 1], p0, p1, p2, p3, b2, b3);
            }
        }
        __syncthreads();
    }

    finish_rows<D>(o, l0, l1, out, b, h, q0, seq, heads, warp, lane);
}

// ---- tf32: mma.m16n8k8 on f32 data, padded shared tiles ------------------------------
// The P·V product permutes keys inside each 8-key step (k = t ↔ key 2t, k = t+4 ↔ key
// 2t+1) so that the score accumulators serve as A fragments without shuffles; V rows are
// read with the same permutation, which leaves the sum unchanged.
template <int D>
__device__ void attention_tf32(const float* __restrict__ qkv, float* __restrict__ out, const int* __restrict__ lens,
                               int seq, int heads, float scale_log2) {
    constexpr int BQ = 64, BK = 32, THREADS = 128, LD = D + 4;
    __shared__ __align__(16) float sK[2][BK * LD];
    __shared__ __align__(16) float sV[2][BK * LD];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hidden = heads * D;
    const long stride = 3L * hidden;
    const float* base = qkv + (long)b * seq * stride + h * D;
    const int limit = lens != nullptr ? lens[b] : seq;
    const int ntiles = (limit + BK - 1) / BK;

    const KvCopy<float, D, BK, THREADS> kv(base, stride, hidden, seq, limit, tid);
    kv.load(sK[0], sV[0], 0);
    cp_async_commit();

    // Query fragments straight from global memory, once.
    u32 qf[D / 8][4];
    load_q_tf32<D>(qf, base, stride, q0, seq, warp, lane);

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles)
            kv.load(sK[(j + 1) & 1], sV[(j + 1) & 1], j + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const float* ks = sK[j & 1];
        const float* vs = sV[j & 1];

        float s[BK / 8][4];
#pragma unroll
        for (int i = 0; i < BK / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < D / 8; kc++) {
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++) {
                const float* kr = &ks[(nt * 8 + g) * LD + kc * 8 + t4];
                mma_tf32(s[nt], qf[kc][0], qf[kc][1], qf[kc][2], qf[kc][3], to_tf32(kr[0]), to_tf32(kr[4]));
            }
        }

        online_softmax(s, o, m0, m1, l0, l1, scale_log2, j * BK, limit, lane);

#pragma unroll
        for (int kk = 0; kk < BK / 8; kk++) {
            u32 p0 = to_tf32(s[kk][0]), p1 = to_tf32(s[kk][2]), p2 = to_tf32(s[kk][1]), p3 = to_tf32(s[kk][3]);
            const float* v0 = &vs[(kk * 8 + 2 * t4) * LD + g];
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                mma_tf32(o[dt], p0, p1, p2, p3, to_tf32(v0[dt * 8]), to_tf32(v0[LD + dt * 8]));
            }
        }
        __syncthreads();
    }

    finish_rows<D>(o, l0, l1, out, b, h, q0, seq, heads, warp, lane);
}

// ---- f32: FMA, register-tiled (the accuracy reference on the GPU) ---------------------
// 256 threads: thread (rg, cg) = (tid / 16, tid % 16) owns query rows 4rg..4rg+3, keys
// TK·cg.. of each score tile, and output dims TD·cg.. of its rows. Q and K sit
// transposed in shared memory so each step of the S product is one float4 (4 queries,
// broadcast to the row group) and one float2 (2 keys) load for 8 FMAs; P goes through
// shared memory transposed, so the P·V step is one float4 (4 queries) and one
// float4/float2 (dims) load for 16/8 FMAs. The 16 threads of a row group are 16
// consecutive lanes: row max and sum are shuffles within them.
template <int D>
__device__ void attention_f32(const float* __restrict__ qkv, float* __restrict__ out, const int* __restrict__ lens,
                              int seq, int heads, float scale_log2) {
    constexpr int BQ = 64, BK = 32, THREADS = 256, TR = 4, TK = BK / 16, TD = D / 16;
    constexpr int LQ = BQ + 4, LK = BK + 4;
    __shared__ __align__(16) float sQt[D * LQ];
    __shared__ __align__(16) float sKt[D * LK];
    __shared__ __align__(16) float sV[BK * D];
    __shared__ __align__(16) float sPt[BK * LQ];

    const int tid = threadIdx.x, rg = tid >> 4, cg = tid & 15;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hidden = heads * D;
    const long stride = 3L * hidden;
    const float* base = qkv + (long)b * seq * stride + h * D;
    const int limit = lens != nullptr ? lens[b] : seq;

    for (int i = tid; i < BQ * D; i += THREADS) {
        int r = i / D, d = i % D, t = q0 + r;
        sQt[d * LQ + r] = t < seq ? base[(long)t * stride + d] * scale_log2 : 0.0f;
    }
    float o[TR][TD], m[TR], l[TR];
#pragma unroll
    for (int i = 0; i < TR; i++) {
        m[i] = NEG_INF;
        l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < TD; j++) o[i][j] = 0.0f;
    }

    for (int k0 = 0; k0 < limit; k0 += BK) {
        __syncthreads(); // the last tile's readers are done
        for (int i = tid; i < BK * D; i += THREADS) {
            int r = i / D, d = i % D, t = k0 + r;
            bool ok = t < limit;
            sKt[d * LK + r] = ok ? base[(long)t * stride + hidden + d] : 0.0f;
            sV[r * D + d] = ok ? base[(long)t * stride + 2 * hidden + d] : 0.0f;
        }
        __syncthreads();

        float s[TR][TK];
#pragma unroll
        for (int i = 0; i < TR; i++)
#pragma unroll
            for (int j = 0; j < TK; j++) s[i][j] = 0.0f;
#pragma unroll 8
        for (int d = 0; d < D; d++) {
            float4 q = *(const float4*)&sQt[d * LQ + rg * TR];
            float2 k = *(const float2*)&sKt[d * LK + cg * TK];
            float qv[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int i = 0; i < TR; i++) {
                s[i][0] = fmaf(qv[i], k.x, s[i][0]);
                s[i][1] = fmaf(qv[i], k.y, s[i][1]);
            }
        }

#pragma unroll
        for (int j = 0; j < TK; j++)
            if (k0 + cg * TK + j >= limit)
#pragma unroll
                for (int i = 0; i < TR; i++) s[i][j] = NEG_INF;

#pragma unroll
        for (int i = 0; i < TR; i++) {
            float mx = fmaxf(s[i][0], s[i][1]);
#pragma unroll
            for (int off = 1; off < 16; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float mnew = fmaxf(m[i], mx); // finite: the first tile holds key 0
            const float alpha = fast_exp2(m[i] - mnew);
            m[i] = mnew;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < TK; j++) {
                float p = fast_exp2(s[i][j] - mnew);
                sum += p;
                sPt[(cg * TK + j) * LQ + rg * TR + i] = p;
            }
            l[i] = l[i] * alpha + sum; // this thread's part; summed over the group at the end
#pragma unroll
            for (int j = 0; j < TD; j++) o[i][j] *= alpha;
        }
        __syncthreads();

#pragma unroll 4
        for (int k = 0; k < BK; k++) {
            float4 p = *(const float4*)&sPt[k * LQ + rg * TR];
            float pv[4] = {p.x, p.y, p.z, p.w};
            float v[TD];
            if (TD == 4) {
                float4 v4 = *(const float4*)&sV[k * D + cg * 4];
                v[0] = v4.x;
                v[1] = v4.y;
                v[2 % TD] = v4.z;
                v[3 % TD] = v4.w;
            } else {
                float2 v2 = *(const float2*)&sV[k * D + cg * 2];
                v[0] = v2.x;
                v[1 % TD] = v2.y;
            }
#pragma unroll
            for (int i = 0; i < TR; i++)
#pragma unroll
                for (int j = 0; j < TD; j++) o[i][j] = fmaf(pv[i], v[j], o[i][j]);
        }
    }

#pragma unroll
    for (int i = 0; i < TR; i++) {
        float sum = l[i];
#pragma unroll
        for (int off = 1; off < 16; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        const int t = q0 + rg * TR + i;
        if (t < seq) {
            const float inv = 1.0f / sum;
            float* ob = out + ((long)b * seq + t) * hidden + h * D + cg * TD;
#pragma unroll
            for (int j = 0; j < TD; j++) ob[j] = o[i][j] * inv;
        }
    }
}

#define ATTENTION_ENTRY(KIND, T, D, THREADS)                                                                \
    extern "C" __global__ void __launch_bounds__(THREADS, 1) attention_##KIND##_d##D(const T* qkv, T* out, const int* lens, \
                                                                              int seq, int heads, float scale_log2) { \
        wait_prior_grid();                                                                                  \
        attention_##KIND<D>(qkv, out, lens, seq, heads, scale_log2);                                         \
    }
ATTENTION_ENTRY(bf16, bf16_t, 32, 128)
ATTENTION_ENTRY(bf16, bf16_t, 64, 128)
ATTENTION_ENTRY(tf32, float, 32, 128)
ATTENTION_ENTRY(tf32, float, 64, 128)
ATTENTION_ENTRY(f32, float, 32, 256)
ATTENTION_ENTRY(f32, float, 64, 256)

// ---- bf16 on Hopper (sm_90a): wgmma, TMA, warp specialisation -------------------------
// FlashAttention-3's structure, for head size 64. A block is four warpgroups (512 threads)
// over 192 query rows of one head:
//  - warpgroup 0 produces: one thread loads the three Q tiles once, then every K and V tile
//    of 128 keys, by TMA (cp.async.bulk.tensor) into a ring of six stages, each stage
//    announced by an mbarrier that counts the bytes landed and freed by one the consumers
//    arrive on. It gives its registers away (setmaxnreg 24).
//  - warpgroups 1-3 consume, 64 query rows each (setmaxnreg 160), all reading the same K/V
//    stages: S = Q·Kᵀ on wgmma.m64n128k16 with both operands through shared-memory
//    descriptors (K-major), the online softmax above (each warp's accumulator rows are its
//    own 16 in mma.sync's C layout), then O += P·V on wgmma.m64n64k16, P from registers (its
//    layout is mma.sync's A fragment) and V through a transposed (MN-major) descriptor.
// Each consumer ends by writing its rows through its Q tile, which no wgmma reads any more,
// as whole 16-byte chunks (finish_rows_staged).
// TMA writes the 128-byte swizzle wgmma reads (the XOR pattern of swz<64>, on 1024-byte
// aligned tiles) and zero-fills rows past the sequence, so no thread computes an address
// or a mask per copy. Rows past lens[b] but before seq are loaded as they are, and their
// keys masked: their P is 0, so their V rows add nothing while they are finite (the TF32
// wgmma kernel does the same; the mma.sync kernels zero-fill them instead); the tensor map
// (the fused QKV matrix as columns × tokens × batch, boxes of 64 × 64) is encoded by the
// launcher and passed by value.
// Shared memory: Q 3 × 8 KiB + 6 stages × (K + V) 32 KiB = 216 KiB, + 1 KiB to align:
// one block per multiprocessor; a 3401-token, 6-head image is 108 blocks, one wave.
// A standalone driver (nvcc, 300 launches timed by events, three rounds, this shape, an
// H100; results/20261126-h100-attention-tma/driver.log at commit 6358458) against the kernel this replaced,
// one warpgroup per block copying its own K/V tiles with cp.async, three blocks per SM:
// 54.8-55.9 µs. Every variant's output but stream-K's is bit-identical to it:
//  - that kernel with its K/V tiles loaded by TMA, issued by one of its threads: 48.9-50.7;
//  - this structure with 2/3/4/6 stages, each consumer issuing P·V(j) and S(j+1)
//    together (FlashAttention-3's intra-warpgroup overlap): 47.5-48.7 / 47.1-47.7 /
//    46.3-47.9 / 46.3-46.5; with 4 stages and each product waited for at once: 44.7-45.8;
//    with 6 stages that way: 44.6-44.7 with finish_rows, 42.9-44.6 (kept) with its output
//    through shared memory (finish_rows_staged);
//  - K and V on separate barriers, so S can start before V lands: 45.6-47.9, slower;
//  - FlashAttention-3's ping-pong (named barriers passing the turn to issue products round
//    the consumers): 65.3-65.6 with three consumers, 84.0-84.1 with two of 128 rows (162
//    blocks, two waves);
//  - without setmaxnreg (126 registers for all; 4 stages, products issued together): 60.4;
//  - a stream-K split over 132 blocks (wsk3 there): 46.1-48.0, and its partial rows are not
//    folded right when the keys are masked or the blocks outnumber the SMs; not pursued.
// Since (results/20261126-h100-attention-bound at commit 6358458, the driver there, H100s): the kernel is
// bound per SM. 18 blocks take as long as 108, and 24 more blocks of work as long again.
// Nsight Compute: issue slots 35% busy, the special-function pipe 57%, 0.83 eligible warps
// per scheduler; the tensor and special-function pipes add rather than overlap.
//  - FlashAttention-3's intra-warpgroup overlap proper (S(j) and P·V(j-1) in flight, the
//    softmax of S(j) while P·V runs): bit-identical, up to 1.5 µs faster.
//  - Row sums on the tensor core (P·V on m64n72k16 with 8 columns of ones): 0.65-1.7 µs
//    faster in the driver, but no faster built by NVRTC (criterion, the inference), so
//    not kept.
//  - Both together, and exp2 by polynomial on the FMA pipe for 1/8 to 1/2 of the scores:
//    slower.
//  - Stream-K over 132 blocks (correct at every grid, the owner of each row block folding
//    its pieces): its key tiles took ~10% less, but its structure cost ~3 µs even unsplit;
//    43.3-44.2 µs at best against 43.0-44.2.
// Earlier, for the one-warpgroup kernel (results/20261125-h100-attention-tiles128 at commit 6358458,
// results/20261126-h200-attention-experiments at commit 6358458): 128-key tiles beat 64 (54.4 against 61.7
// µs); FlashAttention-4's exp2 on the FMA pipe, lazy rescaling, row sums on the tensor
// cores, byte-permute packing of P, a stream-K split and 64-key tiles at 3-5 blocks per SM
// were each slower.
// PTX ISA 8.x, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate": descriptor
// bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte
// offset >> 4, 62-63 swizzle mode (1 = 128B).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
typedef unsigned long long u64;

// A 128B-swizzled tile whose 8-row groups lie `sbo` bytes apart.
__device__ __forceinline__ u64 wgmma_desc(const void* tile, u32 sbo) {
    return (u64)((smem_u32(tile) & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(sbo >> 4) << 32) | ((u64)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// d (64×128, f32) = (scale_d ? d : 0) + A·Bᵀ, A and B K-major in shared memory.
__device__ __forceinline__ void wgmma_ss_n128(float* d, u64 da, u64 db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}

// d (64×64, f32) += A·B, A (64×16) from registers, B (16×64) MN-major in shared memory.
__device__ __forceinline__ void wgmma_rs_t(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}

// The CUtensorMap the launcher encodes (cuTensorMapEncodeTiled), 128 opaque bytes.
struct __align__(64) TmaMap {
    unsigned long long v[16];
};

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also expects `bytes` more from TMA before the phase completes.
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spins until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile("{\n.reg .pred p;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// One box of the map (128 bytes of columns × 64 tokens) at (column c0, token c1, sample
// c2), completing on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const TmaMap* map, u32 bar, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
                 ::"r"(smem_u32(dst)), "l"((unsigned long long)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

extern "C" __global__ void __launch_bounds__(512, 1)
attention_wgmma_bf16_d64(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens,
                         int seq, int heads, float scale_log2) {
    wait_prior_grid();
    constexpr int D = 64, NC = 3, BQ = 64 * NC, BK = 128, NT = BK / 8, ST = 6;
    constexpr int QTILE = 64 * D * 2, TILE = BK * D * 2; // bytes
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[1 + 2 * ST]; // Q, full[ST], empty[ST]
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    auto sK = [&](int s) { return sm + NC * QTILE + s * 2 * TILE; };
    auto sV = [&](int s) { return sm + NC * QTILE + s * 2 * TILE + TILE; };

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
            mbar_init(empty + 8 * s, NC * 4); // one arrival per consumer warp
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
                if (t >= ST) mbar_wait(empty + 8 * s, (t / ST - 1) & 1); // its last use, tile t - ST
                const u32 bar = full + 8 * s;
                mbar_expect_tx(bar, 2 * TILE);
                tma_load(sK(s), &map, bar, hidden + h * D, t * BK, b);
                tma_load(sK(s) + TILE / 2, &map, bar, hidden + h * D, t * BK + 64, b);
                tma_load(sV(s), &map, bar, 2 * hidden + h * D, t * BK, b);
                tma_load(sV(s) + TILE / 2, &map, bar, 2 * hidden + h * D, t * BK + 64, b);
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
        for (int kc = 0; kc < D / 16; kc++) {
            // 16 columns = 32 bytes further along the swizzled 128-byte rows.
            wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        }
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
            // 16 keys = 16 rows of 128 bytes further down the V tile.
            wgmma_rs_t(&o[0][0], p0, p1, p2, p3, dv + (u64)(kk * 16 * 128 >> 4));
        }
        wgmma_commit();
        wgmma_wait0();
        if (lane == 0) mbar_arrive(empty + 8 * st);
    }

    finish_rows_staged(o, l0, l1, sm + c * QTILE, 1 + c, out, b, h, q0 + 64 * c, seq, heads, tid & 127);
}
// ---- tf32 on Hopper (sm_90a): wgmma, TMA, warp specialisation ------------------------
// The TF32 counterpart of the kernel above, in the same structure: a block is four
// warpgroups (512 threads) over 192 query rows of one head, key tiles of 128.
//  - Warpgroup 0 produces (setmaxnreg 56). Its first thread loads, by TMA (the tensor map
//    in f32, boxes of 32 columns = one 128-byte swizzle atom × 64 tokens), the three Q tiles
//    once, then every K tile into a ring of two stages and every V tile, row-major as it
//    is in memory, into one staging buffer. Its other three warps transpose each V tile
//    from there into the stage beside its K tile (below), then arrive on that stage's
//    `full` barrier, which the K copy's expect_tx and their three arrivals complete.
//  - Warpgroups 1-3 consume, 64 rows each (setmaxnreg 152): S = Q·Kᵀ on
//    wgmma.m64n128k8 with both operands in shared memory, the online softmax, then
//    O += P·V on wgmma.m64n64k8 with P from registers and Vᵀ from shared memory.
// wgmma reads 32-bit operands from shared memory only K-major (tf32 has no transposed B),
// hence the transpose, and reads a shared f32 as tf32 by dropping its low 13 bits:
//  - Q is rounded to nearest in place once by its consumer (bit for bit what cvt.rna gives);
//  - K enters truncated, as it lands: rounding each tile in place took 136 µs against 111
//    in the one-warpgroup kernel this replaced (H100, a standalone driver) for a relative
//    error of 6.6e-4 against 1.3e-3 (tests/gpu.rs allows 2e-3);
//    Rounding K here instead, by the transposing warps before they arrive, gave a relative
//    error of 5.8e-4 against 9.5e-4 (a padded 2 × 1000-token batch, against a double
//    reference) but took 80.7-81.4 µs against 77.8-78.6 (the driver, an H200): not kept;
//  - V is rounded as it is transposed, P as it is handed to the product.
// Rows past lens[b] but before seq are loaded and masked, as in the bf16 kernel above.
// The transposed tile is four swizzle atoms of 32 keys × 64 dims; P's columns t and t+4
// hold the score accumulator's keys 2t and 2t+1, so within each 8 keys it stores key order
// 0 2 4 6 1 3 5 7. A transposing unit reads keys 8p+q, +2, +4, +6 (one 16-byte chunk c of 4
// dims each) and writes 4 chunks (one per dim) of the transposed rows; units are dealt so
// that each quarter-warp's eight 16-byte reads, and its eight writes, fall in eight
// distinct bank groups of the 128-byte swizzle (thread i of the eight: q = i % 2,
// p % 4 = i / 2, c = 2·((i / 2 + s) % 4) + c0, with s, c0, p / 4 and the dims' atom fixed).
// Shared memory: Q 3 × 16 KiB + 2 stages × (K + Vᵀ) 64 KiB + V 32 KiB = 208 KiB, + 1 KiB to
// align: one block per multiprocessor, 108 blocks for a 3401-token, 6-head image.
// The standalone driver (results/20261126-h100-tf32-warpspec at commit 6358458, 300 launches a round, five
// rounds) against the one-warpgroup kernel this replaced (three 128-thread blocks per SM,
// each copying its own K and V by cp.async and transposing V itself, 64-key tiles), on an
// H100: 104.3-107.1 µs for it, 76.2-78.7 for this structure (driver3.log; the kept entry
// point itself 77.2-83.6 beside 105.2-115.4 in driver.log, on another H100). With 64-key
// tiles and 2-5 stages, 1-3 V buffers: 78.4-84.3, bit-identical to the old kernel's
// output, 1.8-2.9% slower on the best of five rounds (H100s and an H200); 128-key tiles sum the softmax in
// another order (largest difference 7.5e-5; against a double reference the error is the
// old kernel's to three digits). That kernel took Q as rounded A fragments in registers, which needed
// redefining each tile (`^= fresh`) against a ptxas miscompilation; Q from shared memory
// has no such register to lose.
__device__ __forceinline__ u32 tf32_bits(float f) { return (__float_as_uint(f) + 0x1000u) & 0xFFFFE000u; }
// The same rounding for an operand wgmma reads from shared memory, which drops the low
// 13 bits itself (see K above), so the mask is left out.
__device__ __forceinline__ u32 tf32_bits_smem(float f) { return __float_as_uint(f) + 0x1000u; }

// d (64×64, f32) = (scale_d ? d : 0) + A·B, A (64×8 tf32) from registers, B K-major in
// shared memory.
__device__ __forceinline__ void wgmma_tf32_rs(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(scale_d));
}

// d (64×128, f32) = (scale_d ? d : 0) + A·Bᵀ, A and B tf32 K-major in shared memory.
__device__ __forceinline__ void wgmma_tf32_ss_n128(float* d, u64 da, u64 db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}

extern "C" __global__ void __launch_bounds__(512, 1)
attention_wgmma_tf32_d64(const __grid_constant__ TmaMap map, float* __restrict__ out, const int* __restrict__ lens,
                         int seq, int heads, float scale_log2) {
    wait_prior_grid();
    constexpr int D = 64, NC = 3, BQ = 64 * NC, BK = 128, NT = BK / 8, ST = 2, TW = 3; // TW: transposing warps
    constexpr int QTILE = 64 * D * 4, TILE = BK * D * 4, ATOM = TILE / 2;               // bytes
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[3 + 2 * ST]; // Q, full[ST], empty[ST], V landed, V free
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    // K: [2 atoms of 32 dims][128 keys][128 B]; Vᵀ: [4 atoms of 32 keys][64 dims][128 B];
    // V as it lands: [2 atoms of 32 dims][128 keys][128 B].
    auto sK = [&](int s) { return sm + NC * QTILE + s * 2 * TILE; };
    auto sVt = [&](int s) { return sm + NC * QTILE + s * 2 * TILE + TILE; };
    unsigned char* sV = sm + NC * QTILE + ST * 2 * TILE;

    const int tid = threadIdx.x, wg = tid >> 7, warp = tid >> 5, lane = tid & 31;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hidden = heads * D;
    const int limit = lens != nullptr ? min(lens[b], seq) : seq;
    const int ntiles = (limit + BK - 1) / BK;
    const u32 bq = smem_u32(&bars[0]), full = bq + 8, empty = full + 8 * ST, vin = empty + 8 * ST, vfree = vin + 8;
    if (tid == 0) {
        mbar_init(bq, 1);
        for (int s = 0; s < ST; s++) {
            mbar_init(full + 8 * s, 1 + TW);  // the K copy's expect_tx, one per transposing warp
            mbar_init(empty + 8 * s, NC * 4); // one per consumer warp
        }
        mbar_init(vin, 1);
        mbar_init(vfree, TW);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
        if (warp == 0) {
            if (lane != 0) return;
            // One 32-column × 64-token box per atom and 64 rows.
            auto load = [&](unsigned char* dst, u32 bar, int col, int row, int rows) {
                for (int a = 0; a < 2; a++)
                    for (int r = 0; r < rows; r += 64) tma_load(dst + a * (rows * 128) + r * 128, &map, bar, col + 32 * a, row + r, b);
            };
            mbar_expect_tx(bq, NC * QTILE);
            for (int c = 0; c < NC; c++) load(sm + c * QTILE, bq, h * D, q0 + 64 * c, 64);
            for (int t = 0; t < ntiles; t++) {
                const int s = t % ST;
                if (t >= ST) mbar_wait(empty + 8 * s, (t / ST - 1) & 1); // its last use, tile t - ST
                mbar_expect_tx(full + 8 * s, TILE);
                load(sK(s), full + 8 * s, hidden + h * D, t * BK, BK);
                if (t >= 1) mbar_wait(vfree, (t - 1) & 1); // tile t - 1 transposed
                mbar_expect_tx(vin, TILE);
                load(sV, vin, 2 * hidden + h * D, t * BK, BK);
            }
            return;
        }
        for (int t = 0; t < ntiles; t++) {
            const int s = t % ST;
            mbar_wait(vin, t & 1);
            if (t >= ST) mbar_wait(empty + 8 * s, (t / ST - 1) & 1);
            unsigned char* dst = sVt(s);
            for (int u = tid - 32; u < 4 * BK; u += 32 * TW) {
                // Unit u: thread i of its quarter-warp, k = which quarter-warp (see above).
                const int i = u & 7, k = u >> 3, kh = k / (BK / 32);
                const int p = 4 * (k % (BK / 32)) + (i >> 1), q = i & 1, at = kh & 1;
                const int c = 2 * (((i >> 1) + (kh >> 2)) & 3) + ((kh >> 1) & 1), c4 = 8 * at + c;
                float4 kv[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = 8 * p + q + 2 * e;
                    kv[e] = *(const float4*)(sV + at * ATOM + key * 128 + ((c ^ (key & 7)) << 4));
                }
                unsigned char* d0 = dst + (p >> 2) * 8192 + c4 * 4 * 128; // dims 4·c4.. of key atom p / 4
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
            // wgmma reads through the async proxy: make the transposed tile visible to it.
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(vfree);
                mbar_arrive(full + 8 * s);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 152;\n" ::: "memory");
    const int c = wg - 1, t = tid & 127;
    unsigned char* sq = sm + c * QTILE;
    mbar_wait(bq, 0);
    // Q rounded to nearest in place, once.
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
            // 8 dims = 32 bytes along a swizzled row; dims 32.. are the second atom.
            wgmma_tf32_ss_n128(&s[0][0], dq + (u64)((kc >> 2) * (QTILE / 2) >> 4) + 2 * (kc & 3),
                               dk + (u64)((kc >> 2) * ATOM >> 4) + 2 * (kc & 3), kc);
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
    finish_rows<D>(o, l0, l1, out, b, h, q0 + 64 * c, seq, heads, warp & 3, lane);
}
#endif
