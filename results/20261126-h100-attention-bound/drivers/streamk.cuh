// The stream-K kernel as measured in calls 7-9 (sk2-sk4.log), not kept: attention.cu at
// the time of those calls, its stream-K part and the producer/consumer helpers it shared
// with the kept kernel, plus the kept kernel with a five-stage ring (att_st5).
// The producer's share of a pass: key tiles [t0, te) of one head (K at column kcol, V at
// vcol of sample b), by TMA into a ring of ST stages of 2 × TILE bytes from ring position n
// on, each stage first waited free (its last use, ST positions back).
template <int ST>
__device__ __forceinline__ void produce_kv_bf16(const TmaMap* map, unsigned char* ring, u32 full, u32 empty, int& n,
                                                int t0, int te, int kcol, int vcol, int b) {
    constexpr int BK = 128, TILE = BK * 64 * 2;
    for (int t = t0; t < te; t++, n++) {
        const int s = n % ST;
        if (n >= ST) mbar_wait(empty + 8 * s, (n / ST - 1) & 1);
        const u32 bar = full + 8 * s;
        unsigned char* k = ring + s * 2 * TILE;
        mbar_expect_tx(bar, 2 * TILE);
        tma_load(k, map, bar, kcol, t * BK, b);
        tma_load(k + TILE / 2, map, bar, kcol, t * BK + 64, b);
        tma_load(k + TILE, map, bar, vcol, t * BK, b);
        tma_load(k + TILE + TILE / 2, map, bar, vcol, t * BK + 64, b);
    }
}

// One consumer warpgroup's share of the same pass: for each key tile, S = Q·Kᵀ, the online
// softmax into (o, m, l), O += P·V, then one arrival per warp to free the stage.
template <int ST>
__device__ __forceinline__ void consume_kv_bf16(float (&o)[8][4], float& m0, float& m1, float& l0, float& l1, u64 dq,
                                                unsigned char* ring, u32 full, u32 empty, int& n, int t0, int te,
                                                int limit, float scale_log2, int lane) {
    constexpr int BK = 128, NT = BK / 8, TILE = BK * 64 * 2;
    for (int t = t0; t < te; t++, n++) {
        const int st = n % ST;
        mbar_wait(full + 8 * st, (n / ST) & 1);
        const u64 dk = wgmma_desc(ring + st * 2 * TILE, 1024);
        const u64 dv = wgmma_desc(ring + st * 2 * TILE + TILE, 1024);
        float s[NT][4];
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) {
            // 16 columns = 32 bytes further along the swizzled 128-byte rows.
            wgmma_ss_n128(&s[0][0], dq + 2 * kc, dk + 2 * kc, kc);
        }
        wgmma_commit();
        wgmma_wait0();

        online_softmax(s, o, m0, m1, l0, l1, scale_log2, t * BK, limit, lane);
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
}

__device__ __forceinline__ void zero_acc(float (&o)[8][4], float& m0, float& m1, float& l0, float& l1) {
#pragma unroll
    for (int i = 0; i < 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    m0 = m1 = NEG_INF;
    l0 = l1 = 0.0f;
}

// ---- the same with a stream-K split (sm_90a) -------------------------------------------
// At batch 1 the kernel above runs one block per SM for ceil(seq / 192) × heads blocks:
// 108 of an H100's 132 SMs for yolos-small, each over every key tile of its rows. Here the
// grid is G blocks, U ≤ G ≤ T, where U = batch × heads × ceil(seq / 192) row blocks and
// T = U × NTL (row block, key tile) units (the launcher takes the SM count). Block w does
// units T·w/G to T·(w+1)/G, in order: at most NTL units, so at most two segments, each
// within one row block:
//  - a whole row block: its rows are written as in the kernel above;
//  - a continuation (not from key tile 0): always the block's first segment. Each consumer
//    thread stores its unnormalised O, row maxima and partial row sums (36 floats) to the
//    block's slot 0 in `ws`, and its warp arrives on `pub`; warp 1 of the producer
//    warpgroup then counts the piece in cnt[u] (a gpu-scope fence, then an atomic add),
//    off the consumers' path;
//  - the start of a row block (from key tile 0, not to its end): always the block's last
//    segment, so its block owns the row block. At the end the owner reads cnt[u]: when every
//    other piece is in (the usual case, since they were each their block's first work), it
//    folds them, in block order, into its own O, still in registers, and writes the rows.
//    Otherwise it stores its piece to its slot 1 and counts it too, and whichever block
//    counts last folds every piece from `ws`.
// No block waits for another, so the blocks need not all be resident (MPS, MIG, other
// work); the block that folds a row block resets cnt[u] to 0 for the next launch.
// Pieces past lens[b] (no key tile to do) carry m = -inf and l = 0; the owner's piece holds
// key 0, so the fold's maximum is finite. The ring is five stages (Q takes two buffers of
// 24 KiB, one per segment): 2 × 24 + 5 × 32 = 208 KiB, + 1 KiB to align.
__device__ __forceinline__ int sk_block_of(int i, int G, int T) { return ((i + 1) * G - 1) / T; }

// The fold of row block u's pieces: blocks w_lo (the owner, its slot 1) to w_hi (slot 0
// each), in that order; the owner's piece from (o, m, l) when `own`, else from `ws`. Each
// consumer thread folds its own 36 values (its slot column ct).
__device__ __forceinline__ void sk_fold(float (&o)[8][4], float& l0, float& l1, float m0, float m1, bool own,
                                        const float* __restrict__ ws, int w_lo, int w_hi, int ct) {
    constexpr int CT = 384, SLOT = 36 * CT;
    auto slot = [&](int wk) { return ws + (long)(wk * 2 + (wk == w_lo ? 1 : 0)) * SLOT + ct; };
    float M0 = own ? m0 : NEG_INF, M1 = own ? m1 : NEG_INF;
    for (int wk = own ? w_lo + 1 : w_lo; wk <= w_hi; wk++) {
        M0 = fmaxf(M0, __ldcg(slot(wk) + 32 * CT));
        M1 = fmaxf(M1, __ldcg(slot(wk) + 33 * CT));
    }
    if (own) {
        const float a0 = fast_exp2(m0 - M0), a1 = fast_exp2(m1 - M1);
        l0 *= a0;
        l1 *= a1;
#pragma unroll
        for (int x = 0; x < 8; x++) {
            o[x][0] *= a0;
            o[x][1] *= a0;
            o[x][2] *= a1;
            o[x][3] *= a1;
        }
    } else {
        zero_acc(o, m0, m1, l0, l1);
    }
    for (int wk = own ? w_lo + 1 : w_lo; wk <= w_hi; wk++) {
        const float* q = slot(wk);
        const float a0 = fast_exp2(__ldcg(q + 32 * CT) - M0), a1 = fast_exp2(__ldcg(q + 33 * CT) - M1);
        l0 += __ldcg(q + 34 * CT) * a0;
        l1 += __ldcg(q + 35 * CT) * a1;
#pragma unroll
        for (int x = 0; x < 8; x++) {
            o[x][0] += __ldcg(q + (x * 4 + 0) * CT) * a0;
            o[x][1] += __ldcg(q + (x * 4 + 1) * CT) * a0;
            o[x][2] += __ldcg(q + (x * 4 + 2) * CT) * a1;
            o[x][3] += __ldcg(q + (x * 4 + 3) * CT) * a1;
        }
    }
}

__device__ __forceinline__ void sk_store(float* __restrict__ p, const float (&o)[8][4], float m0, float m1, float l0,
                                         float l1) {
    constexpr int CT = 384;
#pragma unroll
    for (int x = 0; x < 8; x++)
#pragma unroll
        for (int e = 0; e < 4; e++) __stcg(p + (x * 4 + e) * CT, o[x][e]);
    __stcg(p + 32 * CT, m0);
    __stcg(p + 33 * CT, m1);
    __stcg(p + 34 * CT, l0);
    __stcg(p + 35 * CT, l1);
}

extern "C" __global__ void __launch_bounds__(512, 1)
attention_wgmma_bf16_d64_sk(const __grid_constant__ TmaMap map, bf16_t* __restrict__ out, const int* __restrict__ lens,
                            int seq, int heads, float scale_log2, int batch, float* __restrict__ ws,
                            int* __restrict__ cnt) {
    constexpr int D = 64, NC = 3, BQ = 64 * NC, BK = 128, ST = 5, CT = NC * 128, SLOT = 36 * CT;
    constexpr int QTILE = 64 * D * 2;
    extern __shared__ unsigned char smem_raw[];
    // Q[2], full[ST], empty[ST], pub (the continuation stored), pubd (and counted)
    __shared__ __align__(8) unsigned long long bars[4 + 2 * ST];
    __shared__ int s_flag[2]; // [0]: the owner folds without waiting; [1]: the continuation's counter folds
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* ring = sm + 2 * NC * QTILE;
    auto sQ = [&](int k, int c) { return sm + (k * NC + c) * QTILE; };

    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int hidden = heads * D, QG = (seq + BQ - 1) / BQ, NTL = (seq + BK - 1) / BK;
    const int G = gridDim.x, w = blockIdx.x;
    const int T = batch * heads * QG * NTL;
    const int i0 = w * T / G, i1 = (w + 1) * T / G;
    // This block's segments: row block u[k], key tiles [t0[k], t1[k]) (loops over k are
    // unrolled so that these stay in registers).
    int u[2], t0[2], t1[2], nseg = 0;
    int i = i0;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        u[k] = i / NTL;
        t0[k] = i % NTL;
        t1[k] = min(NTL, t0[k] + (i1 - i));
        if (i < i1) nseg++;
        i += t1[k] - t0[k];
    }
    // The segments' kinds: a continuation first, an owned start last.
    const bool cont = nseg > 0 && t0[0] > 0;
    const int kl = nseg - 1; // the last segment, by selects rather than a dynamic index
    const int ul = kl == 1 ? u[1] : u[0];
    const bool owner = nseg > 0 && (kl == 1 ? t0[1] : t0[0]) == 0 && (kl == 1 ? t1[1] : t1[0]) < NTL;
    auto pieces = [&](int uu, int& lo, int& hi) {
        const int ub = uu * NTL;
        lo = sk_block_of(ub, G, T);
        hi = sk_block_of(ub + NTL - 1, G, T);
    };
    // The other pieces of the continuation's row block, worked out before the producer
    // warpgroup gives its registers away.
    int cont_lo = 0, cont_hi = 0;
    if (cont) pieces(u[0], cont_lo, cont_hi);
    const int cont_last = cont_hi - cont_lo; // the count its last piece sees
    const u32 bq = smem_u32(&bars[0]), full = bq + 16, empty = full + 8 * ST, pub = empty + 8 * ST, pubd = pub + 8;
    if (tid == 0) {
        mbar_init(bq, 1);
        mbar_init(bq + 8, 1);
        for (int s = 0; s < ST; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, NC * 4);
        }
        mbar_init(pub, NC * 4);
        mbar_init(pubd, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    int n = 0;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 32;\n" ::: "memory");
        if (tid == 0) {
#pragma unroll
            for (int k = 0; k < 2; k++) {
                if (k == nseg) break;
                const int qg = u[k] % QG, h = (u[k] / QG) % heads, b = u[k] / (QG * heads);
                const int limit = lens != nullptr ? min(lens[b], seq) : seq;
                const int te = min(t1[k], (limit + BK - 1) / BK);
                mbar_expect_tx(bq + 8 * k, NC * QTILE);
                for (int c = 0; c < NC; c++) tma_load(sQ(k, c), &map, bq + 8 * k, h * D, qg * BQ + 64 * c, b);
                produce_kv_bf16<ST>(&map, ring, full, empty, n, t0[k], te, hidden + h * D, 2 * hidden + h * D, b);
            }
        } else if (tid == 32 && cont) {
            // Count the continuation once every consumer warp has stored its part.
            mbar_wait(pub, 0);
            asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
            const int last = atomicAdd(&cnt[u[0]], 1) == cont_last;
            if (last) cnt[u[0]] = 0;
            s_flag[1] = last;
            mbar_arrive(pubd);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
    const int c = wg - 1, ct = tid - 128;
    float o[D / 8][4], m0, m1, l0, l1;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        if (k == nseg) break;
        const int qg = u[k] % QG, h = (u[k] / QG) % heads, b = u[k] / (QG * heads);
        const int limit = lens != nullptr ? min(lens[b], seq) : seq;
        const int te = min(t1[k], (limit + BK - 1) / BK);
        zero_acc(o, m0, m1, l0, l1);
        mbar_wait(bq + 8 * k, 0);
        consume_kv_bf16<ST>(o, m0, m1, l0, l1, wgmma_desc(sQ(k, c), 1024), ring, full, empty, n, t0[k], te, limit,
                            scale_log2, lane);
        if (t0[k] == 0 && t1[k] == NTL) {
            finish_rows_staged(o, l0, l1, sQ(k, c), 1 + c, out, b, h, qg * BQ + 64 * c, seq, heads, tid & 127);
        } else if (t0[k] > 0) {
            sk_store(ws + (long)(w * 2) * SLOT + ct, o, m0, m1, l0, l1);
            __syncwarp();
            if (lane == 0) mbar_arrive(pub);
        }
    }
    if (owner) {
        // The owner's piece is the last segment's (o, m, l), still in registers.
        int lo, hi;
        pieces(ul, lo, hi);
        if (ct == 0) {
            int seen;
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(&cnt[ul]) : "memory");
            s_flag[0] = seen == hi - lo;
        }
        asm volatile("bar.sync 4, %0;\n" ::"n"(CT) : "memory");
        bool fold = s_flag[0], own = true;
        if (fold) {
            if (ct == 0) cnt[ul] = 0; // every other piece is in: nobody else counts u
        } else {
            sk_store(ws + (long)(w * 2 + 1) * SLOT + ct, o, m0, m1, l0, l1);
            asm volatile("bar.sync 4, %0;\n" ::"n"(CT) : "memory");
            if (ct == 0) {
                __threadfence();
                const int last = atomicAdd(&cnt[ul], 1) == hi - lo;
                if (last) cnt[ul] = 0;
                s_flag[0] = last;
            }
            asm volatile("bar.sync 4, %0;\n" ::"n"(CT) : "memory");
            fold = s_flag[0];
            own = false;
        }
        if (fold) {
            __threadfence();
            sk_fold(o, l0, l1, m0, m1, own, ws, lo, hi, ct);
            const int qg = ul % QG, h = (ul / QG) % heads, b = ul / (QG * heads);
            finish_rows_staged(o, l0, l1, sQ(kl, c), 1 + c, out, b, h, qg * BQ + 64 * c, seq, heads, tid & 127);
        }
    }
    if (cont) {
        mbar_wait(pubd, 0);
        if (s_flag[1]) {
            // The owner of u[0] counted before this block's piece: fold here, all from ws.
            int lo, hi;
            pieces(u[0], lo, hi);
            __threadfence();
            sk_fold(o, l0, l1, m0, m1, false, ws, lo, hi, ct);
            const int qg = u[0] % QG, h = (u[0] / QG) % heads, b = u[0] / (QG * heads);
            finish_rows_staged(o, l0, l1, sQ(0, c), 1 + c, out, b, h, qg * BQ + 64 * c, seq, heads, tid & 127);
        }
    }
}

// The kept kernel with a ring of ST stages (the stream-K kernel has five).
template <int ST>
__device__ __forceinline__ void att_st(const TmaMap& map, bf16_t* __restrict__ out, const int* __restrict__ lens,
                                       int seq, int heads, float scale_log2) {
    constexpr int D = 64, NC = 3, BQ = 64 * NC, BK = 128, QTILE = 64 * D * 2;
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bars[1 + 2 * ST];
    unsigned char* sm = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* ring = sm + NC * QTILE;
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int q0 = blockIdx.x * BQ, h = blockIdx.y, b = blockIdx.z, hidden = heads * D;
    const int limit = lens != nullptr ? min(lens[b], seq) : seq, ntiles = (limit + BK - 1) / BK;
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
            produce_kv_bf16<ST>(&map, ring, full, empty, n, 0, ntiles, hidden + h * D, 2 * hidden + h * D, b);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
    const int c = wg - 1;
    float o[D / 8][4], m0, m1, l0, l1;
    zero_acc(o, m0, m1, l0, l1);
    mbar_wait(bq, 0);
    consume_kv_bf16<ST>(o, m0, m1, l0, l1, wgmma_desc(sm + c * QTILE, 1024), ring, full, empty, n, 0, ntiles, limit,
                        scale_log2, lane);
    finish_rows_staged(o, l0, l1, sm + c * QTILE, 1 + c, out, b, h, q0 + 64 * c, seq, heads, tid & 127);
}
extern "C" __global__ void __launch_bounds__(512, 1) att_st5(const __grid_constant__ TmaMap map, bf16_t* out,
                                                             const int* lens, int seq, int heads, float sl) {
    att_st<5>(map, out, lens, seq, heads, sl);
}
