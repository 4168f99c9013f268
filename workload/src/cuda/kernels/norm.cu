// Residual add fused with layer norm, one warp per row (cols <= 1024):
//   v = resid + delta (delta may be null);  n = LN(v)·γ + β;
//   resid = post ? n : v;  out = n (activation type).
// Pre-norm layers keep the plain sum as the residual stream; post-norm (BERT) layers
// carry the normalised one. The residual stream is f32 at every precision.

// Four consecutive values of the activation type, as f32.
template <typename T> struct Act4;
template <> struct Act4<float> {
    static __device__ __forceinline__ float4 load(const float* p, long i) { return *(const float4*)(p + i); }
    static __device__ __forceinline__ void store(float* p, long i, float4 v) { *(float4*)(p + i) = v; }
};
template <> struct Act4<bf16_t> {
    static __device__ __forceinline__ float4 load(const bf16_t* p, long i) {
        const uint2 u = *(const uint2*)(p + i);
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u), __uint_as_float(u.y << 16),
                           __uint_as_float(u.y & 0xFFFF0000u));
    }
    static __device__ __forceinline__ void store(bf16_t* p, long i, float4 v) {
        uint2 u;
        u.x = pack_bf16x2(v.x, v.y);
        u.y = pack_bf16x2(v.z, v.w);
        *(uint2*)(p + i) = u;
    }
};

// Rows whose length is a multiple of 4: each lane moves 4 consecutive columns per step
// (16-byte f32 and 8-byte bf16 accesses), a quarter of the scalar path's loads and stores.
// The scalar path took 6.8 µs per yolos-small layer norm (3401 × 384) on an H100: 0.169 ms
// for the 25 of a bf16 pass (results/20261125-h100-attention-tiles128/bench-workload.log).
template <typename T>
__device__ __forceinline__ void add_layernorm_vec(float* __restrict__ resid, const T* __restrict__ delta,
                                                  const float* __restrict__ gamma, const float* __restrict__ beta,
                                                  T* __restrict__ out, long base, int cols, float eps, int post,
                                                  int lane) {
    constexpr int MAXV = 8; // 8 · 32 lanes · 4 = 1024 columns
    float4 v[MAXV];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXV; i++) {
        const int c = (i * 32 + lane) * 4;
        v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (c < cols) {
            float4 a = *(const float4*)(resid + base + c);
            if (delta != nullptr) {
                const float4 d = Act4<T>::load(delta, base + c);
                a.x += d.x;
                a.y += d.y;
                a.z += d.z;
                a.w += d.w;
            }
            v[i] = a;
            sum += (a.x + a.y) + (a.z + a.w);
        }
    }
    const float mean = warp_sum(sum) / (float)cols;
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXV; i++) {
        const int c = (i * 32 + lane) * 4;
        if (c < cols) {
            const float x = v[i].x - mean, y = v[i].y - mean, z = v[i].z - mean, w = v[i].w - mean;
            sq += (x * x + y * y) + (z * z + w * w);
        }
    }
    const float rstd = rsqrtf(warp_sum(sq) / (float)cols + eps);
#pragma unroll
    for (int i = 0; i < MAXV; i++) {
        const int c = (i * 32 + lane) * 4;
        if (c < cols) {
            const float4 g = *(const float4*)(gamma + c), bb = *(const float4*)(beta + c);
            float4 n;
            n.x = (v[i].x - mean) * rstd * g.x + bb.x;
            n.y = (v[i].y - mean) * rstd * g.y + bb.y;
            n.z = (v[i].z - mean) * rstd * g.z + bb.z;
            n.w = (v[i].w - mean) * rstd * g.w + bb.w;
            Act4<T>::store(out, base + c, n);
            if (post) {
                *(float4*)(resid + base + c) = n;
            } else if (delta != nullptr) {
                *(float4*)(resid + base + c) = v[i];
            }
        }
    }
}

template <typename T>
__device__ void add_layernorm(float* __restrict__ resid, const T* __restrict__ delta, const float* __restrict__ gamma,
                              const float* __restrict__ beta, T* __restrict__ out, int rows, int cols, float eps,
                              int post) {
    constexpr int MAXV = 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= rows) return;
    const long base = (long)row * cols;
    if ((cols & 3) == 0) {
        add_layernorm_vec<T>(resid, delta, gamma, beta, out, base, cols, eps, post, lane);
        return;
    }
    float v[MAXV];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXV; i++) {
        int c = i * 32 + lane;
        v[i] = 0.0f;
        if (c < cols) {
            float a = resid[base + c];
            if (delta != nullptr) a += Act<T>::load(delta, base + c);
            v[i] = a;
            sum += a;
        }
    }
    const float mean = warp_sum(sum) / (float)cols;
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXV; i++) {
        int c = i * 32 + lane;
        if (c < cols) sq += (v[i] - mean) * (v[i] - mean);
    }
    const float rstd = rsqrtf(warp_sum(sq) / (float)cols + eps);
#pragma unroll
    for (int i = 0; i < MAXV; i++) {
        int c = i * 32 + lane;
        if (c < cols) {
            float n = (v[i] - mean) * rstd * gamma[c] + beta[c];
            Act<T>::store(out, base + c, n);
            resid[base + c] = post ? n : v[i];
        }
    }
}
extern "C" __global__ void add_layernorm_f32(float* resid, const float* delta, const float* gamma, const float* beta,
                                             float* out, int rows, int cols, float eps, int post) {
    add_layernorm<float>(resid, delta, gamma, beta, out, rows, cols, eps, post);
}
extern "C" __global__ void add_layernorm_bf16(float* resid, const bf16_t* delta, const float* gamma, const float* beta,
                                              bf16_t* out, int rows, int cols, float eps, int post) {
    add_layernorm<bf16_t>(resid, delta, gamma, beta, out, rows, cols, eps, post);
}
