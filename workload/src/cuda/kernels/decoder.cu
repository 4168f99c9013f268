// The decoder's kernels (`workload::decoder`'s Llama-style block): bf16 weights, an f32
// residual stream, bf16 activations between products and a bf16 KV cache.
//
// `state` is the decoder's device-side state: state[0] = positions already in the KV
// cache when the pass starts, state[1] = the token the last pass chose, state[2] = set
// when logits were not numbers. Reading the position and the token from the device lets
// one decode step be captured as a CUDA graph and replayed unchanged for every token.
//
// Layouts, row-major: the fused query/key/value projection's output row is
// [q (heads·d) | k (kv_heads·d) | v (kv_heads·d)]; the fused gate/up weight interleaves
// gate row j and up row j (rows 2j, 2j+1), so a product's output pairs sit side by side;
// the KV cache of a layer is [max_len, kv_heads·d].

#define DEC_GEMV_WARPS 8
#define DEC_GEMV_UNROLL 8
#define DEC_ATTN_THREADS 256

// One 16-byte load of weights that are read once per pass: not kept in L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

__device__ __forceinline__ void unpack8(uint4 w, float (&v)[8]) {
    v[0] = __uint_as_float(w.x << 16);
    v[1] = __uint_as_float(w.x & 0xFFFF0000u);
    v[2] = __uint_as_float(w.y << 16);
    v[3] = __uint_as_float(w.y & 0xFFFF0000u);
    v[4] = __uint_as_float(w.z << 16);
    v[5] = __uint_as_float(w.z & 0xFFFF0000u);
    v[6] = __uint_as_float(w.w << 16);
    v[7] = __uint_as_float(w.w & 0xFFFF0000u);
}

// Eight bf16 weights times eight f32 values (16-byte aligned, shared memory).
__device__ __forceinline__ float dot8(uint4 w, const float* x) {
    float v[8];
    unpack8(w, v);
    const float4 a = *(const float4*)x;
    const float4 b = *(const float4*)(x + 4);
    return v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y + v[6] * b.z + v[7] * b.w;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// A block-wide sum (max when `take_max`): every thread gets the result. `red` holds one
// float per warp and may be reused once this returns.
__device__ __forceinline__ float block_reduce(float v, float* red, bool take_max) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = take_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = red[0];
    for (int i = 1; i < warps; ++i) t = take_max ? fmaxf(t, red[i]) : t + red[i];
    return t;
}

__device__ __forceinline__ float dec_silu(float x) { return x / (1.0f + expf(-x)); }

// x[r, :] = table[tokens[r], :], for `rows` tokens.
extern "C" __global__ void dec_embed(const bf16_t* __restrict__ table, const int* __restrict__ tokens,
                                     float* __restrict__ x, int rows, int hidden) {
    wait_prior_grid();
    launch_dependents();
    GRID_STRIDE(i, (long)rows * hidden) {
        const long r = i / hidden, c = i % hidden;
        x[i] = bf16_to_f32(table[(long)tokens[r] * hidden + c]);
    }
}

// out[r, :] = RMSNorm(x[r, :]) · gain, one block per row.
extern "C" __global__ void dec_rms_norm(const float* __restrict__ x, const bf16_t* __restrict__ gain,
                                        bf16_t* __restrict__ out, int hidden, float eps) {
    wait_prior_grid();
    launch_dependents();
    __shared__ float red[32];
    const float* row = x + (long)blockIdx.x * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += row[i] * row[i];
    const float inv = rsqrtf(block_reduce(ss, red, false) / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[(long)blockIdx.x * hidden + i] = f32_to_bf16(row[i] * inv * bf16_to_f32(gain[i]));
}

// This warp's first unit: the first DEC_GEMV_UNROLL 16-byte loads of each of its PER
// rows (lane `lane` of every 512-byte chunk), zeros past the row's whole chunks.
template <int PER> struct Ahead {
    uint4 w[PER][DEC_GEMV_UNROLL];
    // This thread's first eight norm gains (stage_input's first eight columns).
    uint4 gain;
};

// The weight rows of a product's units: unit u is rows per·u … per·u + per − 1.
struct Consecutive {
    int per;
    __device__ __forceinline__ long operator()(int u, int i) const { return (long)u * per + i; }
};

template <int PER, class Rows>
__device__ __forceinline__ Ahead<PER> load_unit(const bf16_t* __restrict__ w, int k, int u, Rows rows) {
    Ahead<PER> a;
    const int lane = threadIdx.x & 31, chunks = k >> 8;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const uint4* r4 = (const uint4*)(w + rows(u, i) * k);
#pragma unroll
        for (int c = 0; c < DEC_GEMV_UNROLL; ++c)
            a.w[i][c] = c < chunks ? ld_stream(r4 + c * 32 + lane) : make_uint4(0, 0, 0, 0);
    }
    return a;
}

// The first unit's loads and the thread's first norm gains (when there is a gain),
// issued before the kernel waits for the prior grid: weights are never written by a
// kernel, so they may arrive while the prior grid finishes.
template <int PER, class Rows>
__device__ __forceinline__ Ahead<PER> weights_ahead(const bf16_t* __restrict__ w, const bf16_t* __restrict__ gain,
                                                    int k, int units, Rows rows) {
    const int u = blockIdx.x * DEC_GEMV_WARPS + (threadIdx.x >> 5);
    Ahead<PER> a;
    if (u < units) {
        a = load_unit<PER>(w, k, u, rows);
    } else {
#pragma unroll
        for (int i = 0; i < PER; ++i)
#pragma unroll
            for (int c = 0; c < DEC_GEMV_UNROLL; ++c) a.w[i][c] = make_uint4(0, 0, 0, 0);
    }
    const int g = threadIdx.x * 8;
    a.gain = gain && g < k ? ld_stream((const uint4*)(gain + g)) : make_uint4(0, 0, 0, 0);
    return a;
}

// A unit's dot products with the input in shared memory, summed over the warp, given
// its rows' first chunks: each lane reads 16 bytes of every 512-byte chunk of each row,
// DEC_GEMV_UNROLL chunks of every row in flight at once, then the columns past the
// last whole chunk one by one.
template <int PER, class Rows>
__device__ __forceinline__ void unit_dot(const bf16_t* __restrict__ w, int u, Rows rows, const Ahead<PER>& first,
                                         const float* sx, int k, int lane, float (&y)[PER]) {
    const bf16_t* row[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) row[i] = w + rows(u, i) * k;
    const int chunks = k >> 8;
    float acc[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        acc[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < DEC_GEMV_UNROLL; ++c)
            if (c < chunks) acc[i] += dot8(first.w[i][c], sx + (c << 8) + lane * 8);
    }
    int c = DEC_GEMV_UNROLL;
    for (; c + DEC_GEMV_UNROLL <= chunks; c += DEC_GEMV_UNROLL) {
        uint4 b[PER][DEC_GEMV_UNROLL];
#pragma unroll
        for (int i = 0; i < PER; ++i)
#pragma unroll
            for (int v = 0; v < DEC_GEMV_UNROLL; ++v) b[i][v] = ld_stream((const uint4*)row[i] + (long)(c + v) * 32 + lane);
#pragma unroll
        for (int i = 0; i < PER; ++i)
#pragma unroll
            for (int v = 0; v < DEC_GEMV_UNROLL; ++v) acc[i] += dot8(b[i][v], sx + ((c + v) << 8) + lane * 8);
    }
    for (; c < chunks; ++c)
#pragma unroll
        for (int i = 0; i < PER; ++i)
            acc[i] += dot8(ld_stream((const uint4*)row[i] + (long)c * 32 + lane), sx + (c << 8) + lane * 8);
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        for (int j = (chunks << 8) + lane; j < k; j += 32) acc[i] += bf16_to_f32(row[i][j]) * sx[j];
        y[i] = warp_sum(acc[i]);
    }
}

// The block's copy of a product's input in shared memory (k floats, k a multiple of 8):
// xf (f32) or, when xf is null, xb (bf16), RMS-normalised with `gain` when there is one
// (`gain0`: the thread's first eight gains, loaded ahead). Each thread takes eight
// columns at a time and scales the ones it staged.
__device__ __forceinline__ void stage_input(float* sx, float* red, const float* __restrict__ xf,
                                            const bf16_t* __restrict__ xb, const bf16_t* __restrict__ gain,
                                            uint4 gain0, float eps, int k) {
    float ss = 0.0f;
#pragma unroll 4
    for (int i = threadIdx.x * 8; i < k; i += blockDim.x * 8) {
        float v[8];
        if (xf) {
            const float4 a = *(const float4*)(xf + i), b = *(const float4*)(xf + i + 4);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        } else {
            unpack8(*(const uint4*)(xb + i), v);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
        *(float4*)(sx + i) = make_float4(v[0], v[1], v[2], v[3]);
        *(float4*)(sx + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
    }
    if (gain) {
        const float inv = rsqrtf(block_reduce(ss, red, false) / k + eps);
        for (int i = threadIdx.x * 8; i < k; i += blockDim.x * 8) {
            float g[8];
            unpack8(i == threadIdx.x * 8 ? gain0 : ld_stream((const uint4*)(gain + i)), g);
#pragma unroll
            for (int j = 0; j < 8; ++j) sx[i + j] = sx[i + j] * inv * g[j];
        }
    }
    __syncthreads();
}

// A product for one token, bound by reading the weights: one warp per unit of PER rows
// (`rows`), the first unit's loads already in `ahead`; `out(u, y, lane)` gets each
// unit's dot products on every lane.
template <int PER, class Rows, class Out>
__device__ __forceinline__ void gemv_units(const Ahead<PER>& ahead, const bf16_t* __restrict__ w, const float* sx,
                                           int k, int units, Rows rows, Out out) {
    const int lane = threadIdx.x & 31, step = gridDim.x * DEC_GEMV_WARPS;
    int u = blockIdx.x * DEC_GEMV_WARPS + (threadIdx.x >> 5);
    if (u >= units) return;
    float y[PER];
    unit_dot<PER>(w, u, rows, ahead, sx, k, lane, y);
    out(u, y, lane);
    for (u += step; u < units; u += step) {
        unit_dot<PER>(w, u, rows, load_unit<PER>(w, k, u, rows), sx, k, lane, y);
        out(u, y, lane);
    }
}

struct GemvOut {
    void* out;
    int mode;
    __device__ __forceinline__ void operator()(int u, const float (&y)[1], int lane) const {
        if (lane != 0) return;
        if (mode == 0) ((bf16_t*)out)[u] = f32_to_bf16(y[0]);
        else if (mode == 1) ((float*)out)[u] += y[0];
        else ((float*)out)[u] = y[0];
    }
};

// A matrix-vector product for one token: w is [n_rows, k] bf16; the input is xf (f32)
// or, when xf is null, xb (bf16); with a gain, the input is RMS-normalised first (each
// block normalises its own copy in shared memory, k floats). One warp per output row.
// mode:
//   0: out (bf16)[r] = y[r]
//   1: out (f32)[r] += y[r]          (a residual add)
//   3: out (f32)[r] = y[r]           (logits)
extern "C" __global__ void __launch_bounds__(DEC_GEMV_WARPS * 32, 2)
    dec_gemv(const bf16_t* __restrict__ w, const float* __restrict__ xf, const bf16_t* __restrict__ xb,
             const bf16_t* __restrict__ gain, float eps, void* __restrict__ out, int n_rows, int k, int mode) {
    const Ahead<1> ahead = weights_ahead<1>(w, gain, k, n_rows, Consecutive{1});
    wait_prior_grid();
    launch_dependents();
    extern __shared__ float sx[];
    __shared__ float red[32];
    stage_input(sx, red, xf, xb, gain, ahead.gain, eps, k);
    gemv_units<1>(ahead, w, sx, k, n_rows, Consecutive{1}, GemvOut{out, mode});
}

struct SwigluOut {
    bf16_t* out;
    __device__ __forceinline__ void operator()(int u, const float (&y)[2], int lane) const {
        if (lane == 0) out[u] = f32_to_bf16(dec_silu(y[0]) * y[1]);
    }
};

// The fused gate/up product with SwiGLU: out (bf16)[j] = silu(y[2j]) · y[2j + 1] of the
// RMS-normalised input xf (f32), one warp per pair of rows.
extern "C" __global__ void __launch_bounds__(DEC_GEMV_WARPS * 32, 2)
    dec_gemv_swiglu(const bf16_t* __restrict__ w, const float* __restrict__ xf, const bf16_t* __restrict__ gain,
                    float eps, bf16_t* __restrict__ out, int ffn, int k) {
    const Ahead<2> ahead = weights_ahead<2>(w, gain, k, ffn, Consecutive{2});
    wait_prior_grid();
    launch_dependents();
    extern __shared__ float sx[];
    __shared__ float red[32];
    stage_input(sx, red, xf, nullptr, gain, ahead.gain, eps, k);
    gemv_units<2>(ahead, w, sx, k, ffn, Consecutive{2}, SwigluOut{out});
}

// The rows of the query/key/value product that turn together: unit u < turning is rows
// (j, j + d/2) of query or key head u / (d/2), j = u mod d/2; then pairs of value rows.
struct TurningRows {
    int half, d, turning, values;
    __device__ __forceinline__ long operator()(int u, int i) const {
        return u < turning ? (long)(u / half) * d + u % half + i * half : values + 2L * (u - turning) + i;
    }
};

// Rotary embeddings turn element j of a head with element j + d/2 by the angle
// pos · θ^(−2j/d); the same expression as dec_rope_cache's, so both give the same bits.
__device__ __forceinline__ void turn(float a, float b, int pos, int j, int d, float theta, bf16_t* lo, bf16_t* hi) {
    const float freq = powf(theta, -2.0f * j / d);
    float s, c;
    sincosf(pos * freq, &s, &c);
    *lo = f32_to_bf16(a * c - b * s);
    *hi = f32_to_bf16(b * c + a * s);
}

struct QkvOut {
    bf16_t *qkv, *kc, *vc;
    int pos, heads, half, d, kvd, turning;
    float theta;
    __device__ __forceinline__ void operator()(int u, const float (&y)[2], int lane) const {
        if (lane != 0) return;
        // Rounded to bf16 first, as the product's output is when rotated by dec_rope_cache.
        const float a = bf16_to_f32(f32_to_bf16(y[0])), b = bf16_to_f32(f32_to_bf16(y[1]));
        if (u < turning) {
            const int hd = u / half, j = u % half;
            bf16_t* dst = hd < heads ? qkv + hd * d : kc + (long)pos * kvd + (hd - heads) * d;
            turn(a, b, pos, j, d, theta, dst + j, dst + j + half);
        } else {
            bf16_t* dst = vc + (long)pos * kvd + 2 * (u - turning);
            dst[0] = f32_to_bf16(a);
            dst[1] = f32_to_bf16(b);
        }
    }
};

// A decode step's query/key/value product with RMSNorm first and, in the same kernel,
// what dec_rope_cache does for a prefill: one warp per pair of rows that turn together
// (then pairs of value rows); the turned query goes to qkv's query columns, the turned
// key and the value to the layer's cache at position state[0]. xf is one f32 row.
extern "C" __global__ void __launch_bounds__(DEC_GEMV_WARPS * 32, 2)
    dec_qkv_rope(const bf16_t* __restrict__ w, const float* __restrict__ xf, const bf16_t* __restrict__ gain,
                 float eps, bf16_t* __restrict__ qkv, bf16_t* __restrict__ kc, bf16_t* __restrict__ vc,
                 const int* __restrict__ state, int heads, int kv_heads, int d, float theta, int k) {
    const int half = d / 2, kvd = kv_heads * d, turning = heads * half + kv_heads * half;
    const int units = turning + kvd / 2;
    const TurningRows rows{half, d, turning, heads * d + kvd};
    const Ahead<2> ahead = weights_ahead<2>(w, gain, k, units, rows);
    wait_prior_grid();
    launch_dependents();
    const int pos = state[0];
    extern __shared__ float sx[];
    __shared__ float red[32];
    stage_input(sx, red, xf, nullptr, gain, ahead.gain, eps, k);
    const QkvOut out{qkv, kc, vc, pos, heads, half, d, kvd, turning, theta};
    gemv_units<2>(ahead, w, sx, k, units, rows, out);
}

// Rotary embeddings of the queries (in place) and keys of `rows` new positions
// (state[0] onward), and their keys and values into the layer's cache: element j of a
// head turns with element j + d/2 by the angle pos · θ^(−2j/d).
extern "C" __global__ void dec_rope_cache(bf16_t* __restrict__ qkv, bf16_t* __restrict__ kc, bf16_t* __restrict__ vc,
                                          const int* __restrict__ state, int rows, int heads, int kv_heads, int d,
                                          float theta) {
    wait_prior_grid();
    launch_dependents();
    const int pos0 = state[0];
    const int half = d / 2, hid = heads * d, kvd = kv_heads * d, stride = hid + 2 * kvd;
    const long pairs = (long)rows * (heads + kv_heads) * half;
    GRID_STRIDE(t, pairs + (long)rows * kvd) {
        if (t < pairs) {
            const int j = t % half;
            const long rest = t / half;
            const int hd = rest % (heads + kv_heads);
            const int r = rest / (heads + kv_heads);
            const int pos = pos0 + r;
            bf16_t* src = qkv + (long)r * stride + hd * d;
            const float a = bf16_to_f32(src[j]), b = bf16_to_f32(src[j + half]);
            bf16_t* dst = hd < heads ? src : kc + (long)pos * kvd + (hd - heads) * d;
            turn(a, b, pos, j, d, theta, dst + j, dst + j + half);
        } else {
            const long e = t - pairs;
            const int r = e / kvd, col = e % kvd;
            vc[(long)(pos0 + r) * kvd + col] = qkv[(long)r * stride + hid + kvd + col];
        }
    }
}

// Causal grouped-query attention of `gridDim.y` new positions (state[0] onward) against
// the layer's cache, one block per (query head, position); d a multiple of 8. Shared
// memory: the scaled query (d), reductions (32), the scores (max_len rounded up to a
// multiple of 4, so what follows is 16-byte aligned) and partial outputs
// (DEC_ATTN_THREADS · 8).
extern "C" __global__ void __launch_bounds__(DEC_ATTN_THREADS)
    dec_attention(const bf16_t* __restrict__ qkv, const bf16_t* __restrict__ kc, const bf16_t* __restrict__ vc,
                  bf16_t* __restrict__ out, const int* __restrict__ state, int heads, int kv_heads, int d,
                  int max_len) {
    wait_prior_grid();
    launch_dependents();
    extern __shared__ float sm[];
    float* sq = sm;
    float* red = sq + d;
    float* sc = red + 32;
    float* part = sc + ((max_len + 3) & ~3);
    const int head = blockIdx.x, r = blockIdx.y, tid = threadIdx.x;
    const int seen = state[0] + r + 1;
    const int g = head / (heads / kv_heads);
    const int hid = heads * d, kvd = kv_heads * d, stride = hid + 2 * kvd;
    const float scale = rsqrtf((float)d);
    for (int j = tid; j < d; j += blockDim.x) sq[j] = bf16_to_f32(qkv[(long)r * stride + head * d + j]) * scale;
    __syncthreads();
    // Scores: one thread per cached position, its key read 16 bytes at a time.
    float m = NEG_INF;
    for (int p = tid; p < seen; p += blockDim.x) {
        const uint4* key = (const uint4*)(kc + (long)p * kvd + g * d);
        float s = 0.0f;
#pragma unroll 4
        for (int c = 0; c < d / 8; c += 2) {
            const uint4 k0 = key[c], k1 = key[c + 1];
            s += dot8(k0, sq + c * 8) + dot8(k1, sq + c * 8 + 8);
        }
        sc[p] = s;
        m = fmaxf(m, s);
    }
    m = block_reduce(m, red, true);
    float sum = 0.0f;
    for (int p = tid; p < seen; p += blockDim.x) {
        const float e = expf(sc[p] - m);
        sc[p] = e;
        sum += e;
    }
    sum = block_reduce(sum, red, false);
    // Values: d/8 threads per position, each with 8 columns; the block's groups of
    // threads take every groups-th position, four positions' loads in flight at once,
    // then add up.
    const int lanes = d / 8, groups = blockDim.x / lanes, grp = tid / lanes, c8 = (tid % lanes) * 8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int p0 = grp < groups ? grp : seen; p0 < seen; p0 += 4 * groups) {
        uint4 w[4];
        float e[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            // Past the last position: the last one's values again, weighed 0.
            const int p = min(p0 + i * groups, seen - 1);
            w[i] = *(const uint4*)(vc + (long)p * kvd + g * d + c8);
            e[i] = p0 + i * groups < seen ? sc[p] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc[0] += e[i] * __uint_as_float(w[i].x << 16);
            acc[1] += e[i] * __uint_as_float(w[i].x & 0xFFFF0000u);
            acc[2] += e[i] * __uint_as_float(w[i].y << 16);
            acc[3] += e[i] * __uint_as_float(w[i].y & 0xFFFF0000u);
            acc[4] += e[i] * __uint_as_float(w[i].z << 16);
            acc[5] += e[i] * __uint_as_float(w[i].z & 0xFFFF0000u);
            acc[6] += e[i] * __uint_as_float(w[i].w << 16);
            acc[7] += e[i] * __uint_as_float(w[i].w & 0xFFFF0000u);
        }
    }
    if (grp < groups) {
        float4* dst = (float4*)(part + grp * d + c8);
        dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
    __syncthreads();
    for (int j = tid; j < d; j += blockDim.x) {
        float t = 0.0f;
        for (int q = 0; q < groups; ++q) t += part[q * d + j];
        out[(long)r * hid + head * d + j] = f32_to_bf16(t / sum);
    }
}

// x += y (f32 += bf16), n values.
extern "C" __global__ void dec_add(float* __restrict__ x, const bf16_t* __restrict__ y, long n) {
    wait_prior_grid();
    launch_dependents();
    GRID_STRIDE(i, n) x[i] += bf16_to_f32(y[i]);
}

// act[r, j] = silu(gu[r, 2j]) · gu[r, 2j + 1], for `rows` rows of `ffn`.
extern "C" __global__ void dec_swiglu(const bf16_t* __restrict__ gu, bf16_t* __restrict__ act, int rows, int ffn) {
    wait_prior_grid();
    launch_dependents();
    GRID_STRIDE(i, (long)rows * ffn) {
        const long r = i / ffn, j = i % ffn;
        const bf16_t* p = gu + r * 2 * ffn + 2 * j;
        act[i] = f32_to_bf16(dec_silu(bf16_to_f32(p[0])) * bf16_to_f32(p[1]));
    }
}

// Greedy sampling, one block: state[1] = the index of the largest logit (the first of
// equals), state[0] += advance; state[2] = 1 when no logit is a number (state[1] = 0).
extern "C" __global__ void dec_argmax(const float* __restrict__ logits, int vocab, int* __restrict__ state,
                                      int advance) {
    wait_prior_grid();
    launch_dependents();
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    // Four logits at a time (the buffer is 16-byte aligned), then the last few; each
    // thread meets its indices in order, so `>` keeps the first of equals.
    const int fours = vocab / 4;
    for (int i4 = threadIdx.x; i4 < fours; i4 += blockDim.x) {
        const float4 v = ((const float4*)logits)[i4];
        const float l[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (l[j] > bv) {
                bv = l[j];
                bi = 4 * i4 + j;
            }
        }
    }
    for (int i = 4 * fours + threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = logits[i];
        if (v > bv) {
            bv = v;
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < warps; ++w) {
            if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) {
                bv = best_v[w];
                bi = best_i[w];
            }
        }
        const bool ok = bi < vocab;
        state[1] = ok ? bi : 0;
        state[2] = ok ? state[2] : 1;
        state[0] += advance;
    }
}
