// The TF32 wgmma kernel this directory's change replaced (attention.cu at 6d1663b), renamed:
// one warpgroup of 64 query rows per block, three blocks per multiprocessor, each block
// copying its own K and V tiles by cp.async and transposing V itself.
extern "C" __global__ void __launch_bounds__(128, 3)
attention_base_tf32(const float* __restrict__ qkv, float* __restrict__ out, const int* __restrict__ lens,
                         int seq, int heads, float scale_log2) {
    constexpr int D = 64, BQ = 64, BK = 64, NT = BK / 8, TILE = BK * D * 4;
    extern __shared__ unsigned char smem_raw[];
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* sK0 = sm;            // [2][2 atoms][64 keys][128 B]
    unsigned char* sVn = sm + 2 * TILE; // [64 keys][256 B], chunks swizzled
    unsigned char* sVt = sm + 3 * TILE; // [2 atoms][64 dims][128 B]

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z;
    const int hidden = heads * D;
    const long stride = 3L * hidden;
    const float* base = qkv + (long)b * seq * stride + h * D;
    const int limit = lens != nullptr ? lens[b] : seq;
    const int ntiles = (limit + BK - 1) / BK;
    // 0 (seq >= 0), but not provably so to the compiler, and different per tile:
    // `qf[] ^= fresh` redefines the fragments each tile, which loop-invariant motion
    // cannot hoist.
    const u32 sign = (u32)(seq >> 31);

    // Copies: chunk c (4 floats) of key rows r0 + 8i; the swizzles depend on r0 only.
    const int c = tid & 15, r0 = tid >> 4;
    const u32 k_off = (u32)((c >> 3) * 8192 + r0 * 128 + (((c & 7) ^ r0) << 4));
    // V row r keeps chunk c at c ^ vswz(r), vswz(r) = (2·(r / 8) + r % 2) mod 8: rows
    // r0 + 8i differ in i only, so this thread's chunks sit at (c ^ r0 % 2) ^ 2i mod 8.
    const u32 v_row = (u32)(r0 * 256), v_chunk = (u32)(c ^ (r0 & 1));
    const float* gk = base + hidden + (long)r0 * stride + c * 4;
    auto load = [&](int tile) {
        const u32 k = smem_u32(sK0 + (tile & 1) * TILE) + k_off, v = smem_u32(sVn) + v_row;
        if ((tile + 1) * BK <= limit) {
            const float* src = gk + (long)tile * BK * stride;
#pragma unroll
            for (int i = 0; i < BK / 8; i++) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(k + i * 1024), "l"(src + (long)i * 8 * stride));
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(v + i * 2048 + ((v_chunk ^ ((2 * i) & 7)) << 4)), "l"(src + (long)i * 8 * stride + hidden));
            }
        } else {
#pragma unroll
            for (int i = 0; i < BK / 8; i++) {
                const int t = tile * BK + r0 + 8 * i;
                const float* src = base + hidden + (long)min(t, seq - 1) * stride + c * 4;
                const u32 n = t < limit ? 16 : 0;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(k + i * 1024), "l"(src), "r"(n));
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(v + i * 2048 + ((v_chunk ^ ((2 * i) & 7)) << 4)), "l"(src + hidden), "r"(n));
            }
        }
        cp_async_commit();
    };
    load(0);

    // Query fragments straight from global memory, once.
    u32 qf[D / 8][4];
    load_q_tf32<D>(qf, base, stride, q0, seq, warp, lane);

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u64 dvt = wgmma_desc(sVt, 1024);

    for (int j = 0; j < ntiles; j++) {
        cp_async_wait<0>();
        __syncthreads(); // tile j has landed; every thread is past P·V of tile j - 1
        // Transpose V: unit u = tid + 128·r takes keys 8p+q, +2, +4, +6 (pq = 2p + q = u % 16,
        // the 16-byte chunk pq of the transposed rows) of dims 4c..4c+3 (c = u / 16): four
        // 16-byte reads, four 16-byte writes, each quarter-warp on eight distinct bank groups.
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int u = tid + 128 * r, pq = u & 15, c4 = u >> 4;
            const unsigned char* src = sVn + (8 * (pq >> 1) + (pq & 1)) * 256 + ((c4 ^ (pq & 7)) << 4);
            float4 kv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) kv[e] = *(const float4*)(src + e * 512);
            unsigned char* dst = sVt + (pq >> 3) * 8192 + c4 * 4 * 128;
#pragma unroll
            for (int x = 0; x < 4; x++) {
                uint4 w;
                w.x = tf32_bits_smem((&kv[0].x)[x]);
                w.y = tf32_bits_smem((&kv[1].x)[x]);
                w.z = tf32_bits_smem((&kv[2].x)[x]);
                w.w = tf32_bits_smem((&kv[3].x)[x]);
                *(uint4*)(dst + x * 128 + (((pq & 7) ^ (4 * (c4 & 1) + x)) << 4)) = w;
            }
        }
        // wgmma reads shared memory through the async proxy: make the copies and the
        // transposed tile visible to it.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads(); // Vᵀ written; the row-major V buffer is free again
        if (j + 1 < ntiles) load(j + 1);

        const u64 dk = wgmma_desc(sK0 + (j & 1) * TILE, 1024);
        const u32 fresh = (u32)j & sign;
#pragma unroll
        for (int kc = 0; kc < D / 8; kc++) {
            qf[kc][0] ^= fresh;
            qf[kc][1] ^= fresh;
            qf[kc][2] ^= fresh;
            qf[kc][3] ^= fresh;
        }
        float s[NT][4];
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < D / 8; kc++) {
            // 8 dims = 32 bytes along a swizzled row; dims 32.. are the second atom.
            wgmma_tf32_rs(&s[0][0], qf[kc][0], qf[kc][1], qf[kc][2], qf[kc][3],
                          dk + (u64)((kc >> 2) * 8192 >> 4) + 2 * (kc & 3), kc);
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
    }

    finish_rows<D>(o, l0, l1, out, b, h, q0, seq, heads, warp, lane);
}
