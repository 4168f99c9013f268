// Shared by every kernel family: compiled by NVRTC with no headers at all, so the types
// and conversions we need are spelled out here (bf16 as raw 16-bit storage).
typedef unsigned short bf16_t;
typedef unsigned int u32;

#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float bf16_to_f32(bf16_t v) { return __uint_as_float(((u32)v) << 16); }

__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    bf16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// Two floats to a bf16 pair, `lo` in the low half (the lower column in mma fragments).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Loads and stores of the activation type, always computing in f32.
template <typename T> struct Act;
template <> struct Act<float> {
    static __device__ __forceinline__ float load(const float* p, long i) { return p[i]; }
    static __device__ __forceinline__ void store(float* p, long i, float v) { p[i] = v; }
};
template <> struct Act<bf16_t> {
    static __device__ __forceinline__ float load(const bf16_t* p, long i) { return bf16_to_f32(p[i]); }
    static __device__ __forceinline__ void store(bf16_t* p, long i, float v) { p[i] = f32_to_bf16(v); }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Programmatic dependent launch (Hopper on): every kernel is launched with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, so its blocks may be scheduled
// once the kernel before it in the stream has let its blocks go, before that kernel has
// finished and flushed its writes. Each kernel therefore waits here, first of all, until
// the prior grid has completed and its memory is visible; nothing is read or written
// before. Without the attribute (older GPUs, or a prior operation that is not a kernel)
// the wait returns at once.
__device__ __forceinline__ void wait_prior_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel in the stream launch now (programmatic dependent launch): its
// blocks are scheduled as this grid's finish, run what comes before their own
// wait_prior_grid() (only loads of weights, which no kernel writes) and then wait for
// this grid to complete. Called right after wait_prior_grid(), so at most one grid
// waits ahead.
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

#define GRID_STRIDE(i, n) for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)
