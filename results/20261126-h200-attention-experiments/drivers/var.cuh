// Variants of attention_wgmma_bf16_d64 (experiment), generated from attention.cu.
__device__ __forceinline__ u32 pack_trunc(float lo, float hi) { u32 r; asm("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(r) : "r"(__float_as_uint(lo)), "r"(__float_as_uint(hi))); return r; }
__device__ __forceinline__ u32 pack_rhu(float lo, float hi) { return pack_trunc(__uint_as_float(__float_as_uint(lo) + 0x8000u), __uint_as_float(__float_as_uint(hi) + 0x8000u)); }

// Variant softmax: max over raw scores (scaled once), optional lazy rescale (FA4: keep a
// stale max while the new one exceeds it by at most 8 in log2 units; exact after l).
template <int NT, bool RAWMAX, bool LAZY>
__device__ __forceinline__ bool online_softmax_v(float (&s)[NT][4], float& m0, float& m1, float& l0, float& l1,
                                               float& alpha0, float& alpha1, float scale_log2, int key0,
                                               int limit, int lane) {
    if (key0 + NT * 8 > limit) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (key0 + nt * 8 + (lane & 3) * 2 + (e & 1) >= limit) s[nt][e] = NEG_INF;
    }
    float mx0, mx1;
    if constexpr (RAWMAX) {
        float a0 = fmaxf(s[0][0], s[0][1]), a1 = fmaxf(s[0][2], s[0][3]);
#pragma unroll
        for (int nt = 1; nt < NT; nt++) {
            a0 = fmaxf(a0, fmaxf(s[nt][0], s[nt][1]));
            a1 = fmaxf(a1, fmaxf(s[nt][2], s[nt][3]));
        }
        a0 = fmaxf(a0, __shfl_xor_sync(0xffffffffu, a0, 1));
        a0 = fmaxf(a0, __shfl_xor_sync(0xffffffffu, a0, 2));
        a1 = fmaxf(a1, __shfl_xor_sync(0xffffffffu, a1, 1));
        a1 = fmaxf(a1, __shfl_xor_sync(0xffffffffu, a1, 2));
        mx0 = fmaxf(m0, a0 * scale_log2);
        mx1 = fmaxf(m1, a1 * scale_log2);
    } else {
        mx0 = m0; mx1 = m1;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]) * scale_log2);
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]) * scale_log2);
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    }
    bool rescale = true;
    if constexpr (LAZY) rescale = __any_sync(0xffffffffu, mx0 - m0 > 8.0f || mx1 - m1 > 8.0f);
    if (rescale) {
        alpha0 = fast_exp2(m0 - mx0);
        alpha1 = fast_exp2(m1 - mx1);
        m0 = mx0;
        m1 = mx1;
    }
    const float n0 = m0, n1 = m1;
    float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        s[nt][0] = fast_exp2(s[nt][0] * scale_log2 - n0);
        s[nt][1] = fast_exp2(s[nt][1] * scale_log2 - n0);
        s[nt][2] = fast_exp2(s[nt][2] * scale_log2 - n1);
        s[nt][3] = fast_exp2(s[nt][3] * scale_log2 - n1);
        r0 += s[nt][0] + s[nt][1];
        r1 += s[nt][2] + s[nt][3];
    }
    if (rescale) {
        l0 = l0 * alpha0 + r0;
        l1 = l1 * alpha1 + r1;
    } else {
        l0 += r0;
        l1 += r1;
    }
    return rescale;
}
extern "C" __global__ void __launch_bounds__(128, 3)
var_oldmax(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ out, const int* __restrict__ lens,
                         int seq, int heads, float scale_log2) {
    constexpr int D = 64, BQ = 64, BK = 128, THREADS = 128, CH = D / 8, NT = BK / 8;
    extern __shared__ unsigned char smem_raw[];
    bf16_t* sQ = (bf16_t*)(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
    bf16_t* sKV = sQ + BQ * D;
    auto sK = [&](int i) { return sKV + (i & 1) * BK * D; };
    auto sV = [&](int i) { return sKV + (2 + (i & 1)) * BK * D; };

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
    kv.load(sK(0), sV(0), 0);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u64 dq = wgmma_desc(sQ, 1024);

    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) kv.load(sK(j + 1), sV(j + 1), j + 1);
        cp_async_commit();
        cp_async_wait<1>();
        // wgmma reads shared memory through the async proxy: make the copies visible to it.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const u64 dk = wgmma_desc(sK(j), 1024);
        const u64 dv = wgmma_desc(sV(j), 1024);

        float s[NT][4];
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            // 16 columns = 32 bytes further along the swizzled 128-byte rows.
            wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        }
        wgmma_commit();
        wgmma_wait0();

        float a0, a1;
        const bool rs = online_softmax_v<NT, false, false>(s, m0, m1, l0, l1, a0, a1, scale_log2, j * BK, limit, lane);
#pragma unroll
        for (int i = 0; i < D / 8 && rs; i++) {
            o[i][0] *= a0;
            o[i][1] *= a0;
            o[i][2] *= a1;
            o[i][3] *= a1;
        }
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
        __syncthreads();
    }

    finish_rows<D>(o, l0, l1, out, b, h, q0, seq, heads, warp, lane);
}
extern "C" __global__ void __launch_bounds__(128, 3)
var_lazy(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ out, const int* __restrict__ lens,
                         int seq, int heads, float scale_log2) {
    constexpr int D = 64, BQ = 64, BK = 128, THREADS = 128, CH = D / 8, NT = BK / 8;
    extern __shared__ unsigned char smem_raw[];
    bf16_t* sQ = (bf16_t*)(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
    bf16_t* sKV = sQ + BQ * D;
    auto sK = [&](int i) { return sKV + (i & 1) * BK * D; };
    auto sV = [&](int i) { return sKV + (2 + (i & 1)) * BK * D; };

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
    kv.load(sK(0), sV(0), 0);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u64 dq = wgmma_desc(sQ, 1024);

    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) kv.load(sK(j + 1), sV(j + 1), j + 1);
        cp_async_commit();
        cp_async_wait<1>();
        // wgmma reads shared memory through the async proxy: make the copies visible to it.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const u64 dk = wgmma_desc(sK(j), 1024);
        const u64 dv = wgmma_desc(sV(j), 1024);

        float s[NT][4];
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            // 16 columns = 32 bytes further along the swizzled 128-byte rows.
            wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        }
        wgmma_commit();
        wgmma_wait0();

        float a0, a1;
        const bool rs = online_softmax_v<NT, true, true>(s, m0, m1, l0, l1, a0, a1, scale_log2, j * BK, limit, lane);
#pragma unroll
        for (int i = 0; i < D / 8 && rs; i++) {
            o[i][0] *= a0;
            o[i][1] *= a0;
            o[i][2] *= a1;
            o[i][3] *= a1;
        }
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
        __syncthreads();
    }

    finish_rows<D>(o, l0, l1, out, b, h, q0, seq, heads, warp, lane);
}
extern "C" __global__ void __launch_bounds__(128, 3)
var_trunc(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ out, const int* __restrict__ lens,
                         int seq, int heads, float scale_log2) {
    constexpr int D = 64, BQ = 64, BK = 128, THREADS = 128, CH = D / 8, NT = BK / 8;
    extern __shared__ unsigned char smem_raw[];
    bf16_t* sQ = (bf16_t*)(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
    bf16_t* sKV = sQ + BQ * D;
    auto sK = [&](int i) { return sKV + (i & 1) * BK * D; };
    auto sV = [&](int i) { return sKV + (2 + (i & 1)) * BK * D; };

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
    kv.load(sK(0), sV(0), 0);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u64 dq = wgmma_desc(sQ, 1024);

    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) kv.load(sK(j + 1), sV(j + 1), j + 1);
        cp_async_commit();
        cp_async_wait<1>();
        // wgmma reads shared memory through the async proxy: make the copies visible to it.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const u64 dk = wgmma_desc(sK(j), 1024);
        const u64 dv = wgmma_desc(sV(j), 1024);

        float s[NT][4];
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            // 16 columns = 32 bytes further along the swizzled 128-byte rows.
            wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        }
        wgmma_commit();
        wgmma_wait0();

        float a0, a1;
        online_softmax<NT>(s, m0, m1, l0, l1, a0, a1, scale_log2, j * BK, limit, lane);
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            o[i][0] *= a0;
            o[i][1] *= a0;
            o[i][2] *= a1;
            o[i][3] *= a1;
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            u32 p0 = pack_trunc(s[2 * kk][0], s[2 * kk][1]);
            u32 p1 = pack_trunc(s[2 * kk][2], s[2 * kk][3]);
            u32 p2 = pack_trunc(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            u32 p3 = pack_trunc(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            // 16 keys = 16 rows of 128 bytes further down the V tile.
            wgmma_rs_t(&o[0][0], p0, p1, p2, p3, dv + (u64)(kk * 16 * 128 >> 4));
        }
        wgmma_commit();
        wgmma_wait0();
        __syncthreads();
    }

    finish_rows<D>(o, l0, l1, out, b, h, q0, seq, heads, warp, lane);
}
extern "C" __global__ void __launch_bounds__(128, 3)
var_rhu(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ out, const int* __restrict__ lens,
                         int seq, int heads, float scale_log2) {
    constexpr int D = 64, BQ = 64, BK = 128, THREADS = 128, CH = D / 8, NT = BK / 8;
    extern __shared__ unsigned char smem_raw[];
    bf16_t* sQ = (bf16_t*)(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
    bf16_t* sKV = sQ + BQ * D;
    auto sK = [&](int i) { return sKV + (i & 1) * BK * D; };
    auto sV = [&](int i) { return sKV + (2 + (i & 1)) * BK * D; };

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
    kv.load(sK(0), sV(0), 0);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u64 dq = wgmma_desc(sQ, 1024);

    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) kv.load(sK(j + 1), sV(j + 1), j + 1);
        cp_async_commit();
        cp_async_wait<1>();
        // wgmma reads shared memory through the async proxy: make the copies visible to it.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const u64 dk = wgmma_desc(sK(j), 1024);
        const u64 dv = wgmma_desc(sV(j), 1024);

        float s[NT][4];
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            // 16 columns = 32 bytes further along the swizzled 128-byte rows.
            wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        }
        wgmma_commit();
        wgmma_wait0();

        float a0, a1;
        online_softmax<NT>(s, m0, m1, l0, l1, a0, a1, scale_log2, j * BK, limit, lane);
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            o[i][0] *= a0;
            o[i][1] *= a0;
            o[i][2] *= a1;
            o[i][3] *= a1;
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            u32 p0 = pack_rhu(s[2 * kk][0], s[2 * kk][1]);
            u32 p1 = pack_rhu(s[2 * kk][2], s[2 * kk][3]);
            u32 p2 = pack_rhu(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            u32 p3 = pack_rhu(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            // 16 keys = 16 rows of 128 bytes further down the V tile.
            wgmma_rs_t(&o[0][0], p0, p1, p2, p3, dv + (u64)(kk * 16 * 128 >> 4));
        }
        wgmma_commit();
        wgmma_wait0();
        __syncthreads();
    }

    finish_rows<D>(o, l0, l1, out, b, h, q0, seq, heads, warp, lane);
}
