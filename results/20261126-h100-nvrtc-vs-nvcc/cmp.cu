// Standalone driver (not part of the project): the same attention source built two ways,
// timed in one harness on one card. (1) nvcc, as the other drivers build it; (2) NVRTC at
// run time with the options the workload uses (workload/src/cuda/kernels.rs,
// compile_family: --gpu-architecture=sm_90a --std=c++17 --fmad=true, prelude.cuh + "\n" +
// attention.cu), plus variants of those options. Each build's CUBIN is written out for
// cuobjdump.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <cuda.h>
#include <nvrtc.h>
#ifndef __CUDA_ARCH_FEAT_SM90_ALL
#define __CUDA_ARCH_FEAT_SM90_ALL 1
#endif
#include "../../workload/src/cuda/kernels/prelude.cuh"
#include "../../workload/src/cuda/kernels/attention.cu"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
#define CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorString(r_, &s_); printf("CU %s at %d\n", s_, __LINE__); exit(1); } } while (0)
#define NV(x) do { nvrtcResult r_ = (x); if (r_ != NVRTC_SUCCESS) { printf("NVRTC %s at %d\n", nvrtcGetErrorString(r_), __LINE__); exit(1); } } while (0)

static std::string slurp(const char* p) { std::ifstream f(p); std::stringstream s; s << f.rdbuf(); return s.str(); }
static unsigned short to_bf16(float f) { unsigned u; memcpy(&u, &f, 4); u += 0x7FFF + ((u >> 16) & 1); return (unsigned short)(u >> 16); }

static CUfunction nvrtc_build(const std::vector<const char*>& opts, const char* tag) {
    std::string src = slurp("../../workload/src/cuda/kernels/prelude.cuh") + "\n" + slurp("../../workload/src/cuda/kernels/attention.cu");
    nvrtcProgram prog;
    NV(nvrtcCreateProgram(&prog, src.c_str(), "attention.cu", 0, nullptr, nullptr));
    nvrtcResult r = nvrtcCompileProgram(prog, (int)opts.size(), opts.data());
    size_t ls; nvrtcGetProgramLogSize(prog, &ls); std::string log(ls, '\0'); nvrtcGetProgramLog(prog, &log[0]);
    if (r != NVRTC_SUCCESS) { printf("NVRTC %-10s does not compile: %s\n", tag, log.substr(0, 300).c_str()); nvrtcDestroyProgram(&prog); return nullptr; }
    size_t n; NV(nvrtcGetCUBINSize(prog, &n)); std::vector<char> cubin(n); NV(nvrtcGetCUBIN(prog, cubin.data()));
    std::string out = std::string(getenv("OUT") ? getenv("OUT") : "/tmp") + "/nvrtc-" + tag + ".cubin";
    std::ofstream(out, std::ios::binary).write(cubin.data(), n);
    CUmodule mod; CU(cuModuleLoadData(&mod, cubin.data()));
    CUfunction f; CU(cuModuleGetFunction(&f, mod, "attention_wgmma_bf16_d64"));
    CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 217 * 1024));
    int regs; CU(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
    printf("NVRTC %-10s built: %d registers, cubin %zu bytes\n", tag, regs, n);
    nvrtcDestroyProgram(&prog);
    return f;
}

int main() {
    CK(cudaFree(0));
    int seq = 3401, heads = 6; size_t n = (size_t)seq * 3 * 384, no = (size_t)seq * 384;
    std::vector<unsigned short> hb(n); srand(11); for (auto& x : hb) x = to_bf16(((rand() / (float)RAND_MAX) * 2 - 1) * 2.5f);
    bf16_t *d, *o; CK(cudaMalloc(&d, n * 2)); CK(cudaMalloc(&o, no * 2));
    CK(cudaMemcpy(d, hb.data(), n * 2, cudaMemcpyHostToDevice));
    CUtensorMap m;
    cuuint64_t dims[3] = {3ull * 384, (cuuint64_t)seq, 1}, strides[2] = {3ull * 384 * 2, 3ull * 384 * 2 * seq};
    cuuint32_t box[3] = {64, 64, 1}, es[3] = {1, 1, 1};
    CU(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, d, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    TmaMap tm; memcpy(&tm, &m, sizeof tm);
    CK(cudaFuncSetAttribute(attention_wgmma_bf16_d64, cudaFuncAttributeMaxDynamicSharedMemorySize, 217 * 1024));
    const char* base[] = {"--gpu-architecture=sm_90a", "--std=c++17", "--fmad=true"};
    struct V { const char* tag; std::vector<const char*> opts; };
    std::vector<V> vs = {
        {"workload", {base[0], base[1], base[2]}},
        {"O3", {base[0], base[1], base[2], "-O3"}},
        {"dopt", {base[0], base[1], base[2], "--dopt=on"}},
        {"extravec", {base[0], base[1], base[2], "--extra-device-vectorization"}},
        {"defdev", {base[0], base[1], base[2], "-default-device"}},
    };
    std::vector<CUfunction> fs;
    for (auto& v : vs) fs.push_back(nvrtc_build(v.opts, v.tag));
    float sl = 1.4426950408889634f / 8.0f;
    const int* lens = nullptr; int s_ = seq, h_ = heads;
    void* params[] = {&tm, &o, &lens, &s_, &h_, &sl};
    cudaEvent_t ea, eb; cudaEventCreate(&ea); cudaEventCreate(&eb);
    auto launch = [&](int k) {
        if (k < 0) attention_wgmma_bf16_d64<<<dim3(18, heads, 1), 512, 217 * 1024>>>(tm, o, nullptr, seq, heads, sl);
        else CU(cuLaunchKernel(fs[k], 18, heads, 1, 512, 1, 1, 217 * 1024, 0, params, nullptr));
    };
    // Outputs: every build must agree bit for bit with nvcc's.
    std::vector<unsigned short> a(no), b(no);
    launch(-1); CK(cudaDeviceSynchronize()); CK(cudaMemcpy(a.data(), o, no * 2, cudaMemcpyDeviceToHost));
    for (size_t k = 0; k < fs.size(); k++) {
        if (!fs[k]) continue;
        CK(cudaMemset(o, 0xff, no * 2)); launch((int)k); CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(b.data(), o, no * 2, cudaMemcpyDeviceToHost));
        printf("NVRTC %-10s output %s nvcc's\n", vs[k].tag, a == b ? "bit-identical to" : "DIFFERS from");
    }
    auto timeit = [&](int k) {
        for (int i = 0; i < 20; i++) launch(k);
        cudaEventRecord(ea);
        for (int i = 0; i < 300; i++) launch(k);
        cudaEventRecord(eb); cudaEventSynchronize(eb);
        float ms; cudaEventElapsedTime(&ms, ea, eb);
        return ms * 1000 / 300;
    };
    for (int rep = 0; rep < 5; rep++) {
        printf("TIME nvcc       %.2f us\n", timeit(-1));
        for (size_t k = 0; k < fs.size(); k++)
            if (fs[k]) printf("TIME %-10s %.2f us\n", vs[k].tag, timeit((int)k));
    }
    return 0;
}
