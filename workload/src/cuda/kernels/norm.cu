// Residual add fused with layer norm, one warp per row (cols <= 1024):
//   v = resid + delta (delta may be null);  n = LN(v)·γ + β;
//   resid = post ? n : v;  out = n (activation type).
// Pre-norm layers keep the plain sum as the residual stream; post-norm (BERT) layers
// carry the normalised one. The residual stream is f32 at every precision.

// W consecutive values (W = 1 or 4) of type T, as f32: 4 move as one 16-byte (f32) or
// 8-byte (bf16) access.
template <typename T, int W> struct Pack;
template <typename T> struct Pack<T, 1> {
    static __device__ __forceinline__ void load(const T* p, long i, float (&v)[1]) { v[0] = Act<T>::load(p, i); }
    static __device__ __forceinline__ void store(T* p, long i, const float (&v)[1]) { Act<T>::store(p, i, v[0]); }
};
template <> struct Pack<float, 4> {
    static __device__ __forceinline__ void load(const float* p, long i, float (&v)[4]) {
        const float4 a = *(const float4*)(p + i);
        v[0] = a.x;
        v[1] = a.y;
        v[2] = a.z;
        v[3] = a.w;
    }
    static __device__ __forceinline__ void store(float* p, long i, const float (&v)[4]) {
        *(float4*)(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    }
};
template <> struct Pack<bf16_t, 4> {
    static __device__ __forceinline__ void load(const bf16_t* p, long i, float (&v)[4]) {
        const uint2 u = *(const uint2*)(p + i);
        v[0] = __uint_as_float(u.x << 16);
        v[1] = __uint_as_float(u.x & 0xFFFF0000u);
        v[2] = __uint_as_float(u.y << 16);
        v[3] = __uint_as_float(u.y & 0xFFFF0000u);
    }
    static __device__ __forceinline__ void store(bf16_t* p, long i, const float (&v)[4]) {
        uint2 u;
        u.x = pack_bf16x2(v[0], v[1]);
        u.y = pack_bf16x2(v[2], v[3]);
        *(uint2*)(p + i) = u;
    }
};

// The sum of a pack, in pairs.
__device__ __forceinline__ float pack_sum(const float (&v)[1]) { return v[0]; }
__device__ __forceinline__ float pack_sum(const float (&v)[4]) { return (v[0] + v[1]) + (v[2] + v[3]); }

// One row, each lane moving W consecutive columns per step. Rows whose length is a
// multiple of 4 take W = 4: a quarter of the loads and stores of W = 1, which took 6.8 µs
// per yolos-small layer norm (3401 × 384) on an H100, 0.169 ms for the 25 of a bf16 pass
// (results/20261125-h100-attention-tiles128/bench-workload.log at commit 6358458).
template <typename T, int W>
__device__ __forceinline__ void add_layernorm_row(float* __restrict__ resid, const T* __restrict__ delta,
                                                  const float* __restrict__ gamma, const float* __restrict__ beta,
                                                  T* __restrict__ out, long base, int cols, float eps, int post,
                                                  int lane) {
    constexpr int MAXV = 1024 / (32 * W); // up to 1024 columns
    float v[MAXV][W];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXV; i++) {
        const int c = (i * 32 + lane) * W;
#pragma unroll
        for (int e = 0; e < W; e++) v[i][e] = 0.0f;
        if (c < cols) {
            Pack<float, W>::load(resid, base + c, v[i]);
            if (delta != nullptr) {
                float d[W];
                Pack<T, W>::load(delta, base + c, d);
#pragma unroll
                for (int e = 0; e < W; e++) v[i][e] += d[e];
            }
            sum += pack_sum(v[i]);
        }
    }
    const float mean = warp_sum(sum) / (float)cols;
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXV; i++) {
        const int c = (i * 32 + lane) * W;
        if (c < cols) {
            float d2[W];
#pragma unroll
            for (int e = 0; e < W; e++) d2[e] = (v[i][e] - mean) * (v[i][e] - mean);
            sq += pack_sum(d2);
        }
    }
    const float rstd = rsqrtf(warp_sum(sq) / (float)cols + eps);
#pragma unroll
    for (int i = 0; i < MAXV; i++) {
        const int c = (i * 32 + lane) * W;
        if (c < cols) {
            float g[W], bb[W], n[W];
            Pack<float, W>::load(gamma, c, g);
            Pack<float, W>::load(beta, c, bb);
#pragma unroll
            for (int e = 0; e < W; e++) n[e] = (v[i][e] - mean) * rstd * g[e] + bb[e];
            Pack<T, W>::store(out, base + c, n);
            if (post) {
                Pack<float, W>::store(resid, base + c, n);
            } else if (delta != nullptr) {
                Pack<float, W>::store(resid, base + c, v[i]);
            }
        }
    }
}

template <typename T>
__device__ void add_layernorm(float* __restrict__ resid, const T* __restrict__ delta, const float* __restrict__ gamma,
                              const float* __restrict__ beta, T* __restrict__ out, int rows, int cols, float eps,
                              int post) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= rows) return;
    const long base = (long)row * cols;
    if ((cols & 3) == 0) {
        add_layernorm_row<T, 4>(resid, delta, gamma, beta, out, base, cols, eps, post, lane);
    } else {
        add_layernorm_row<T, 1>(resid, delta, gamma, beta, out, base, cols, eps, post, lane);
    }
}
extern "C" __global__ void add_layernorm_f32(float* resid, const float* delta, const float* gamma, const float* beta,
                                             float* out, int rows, int cols, float eps, int post) {
    wait_prior_grid();
    add_layernorm<float>(resid, delta, gamma, beta, out, rows, cols, eps, post);
}
extern "C" __global__ void add_layernorm_bf16(float* resid, const bf16_t* delta, const float* gamma, const float* beta,
                                              bf16_t* out, int rows, int cols, float eps, int post) {
    wait_prior_grid();
    add_layernorm<bf16_t>(resid, delta, gamma, beta, out, rows, cols, eps, post);
}
