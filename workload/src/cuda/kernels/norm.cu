// Residual add fused with layer norm, one warp per row (cols <= 1024):
//   v = resid + delta (delta may be null);  n = LN(v)·γ + β;
//   resid = post ? n : v;  out = n (activation type).
// Pre-norm layers keep the plain sum as the residual stream; post-norm (BERT) layers
// carry the normalised one. The residual stream is f32 at every precision.
template <typename T>
__device__ void add_layernorm(float* __restrict__ resid, const T* __restrict__ delta, const float* __restrict__ gamma,
                              const float* __restrict__ beta, T* __restrict__ out, int rows, int cols, float eps,
                              int post) {
    constexpr int MAXV = 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= rows) return;
    const long base = (long)row * cols;
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
