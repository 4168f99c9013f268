// The kernel the warp-specialised one replaced (attention.cu at 68aed1d, one warpgroup
// per 64 query rows, K/V by cp.async, three blocks per SM), renamed; its O rescale is
// now inside online_softmax, as in every kernel of attention.cu.
extern "C" __global__ void __launch_bounds__(128, 3)
attention_base(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ out, const int* __restrict__ lens,
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
        __syncthreads();
    }

    finish_rows<D>(o, l0, l1, out, b, h, q0, seq, heads, warp, lane);
}
