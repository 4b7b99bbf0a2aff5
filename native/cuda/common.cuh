// Shared helpers of the CUDA backend: error macros, the device tensor descriptor, warp
// reductions and unaligned loads. Every float operation whose rounding matters is written with
// explicit _rn intrinsics so that no FMA contraction can differ between template instances (the
// nt-row kernels must give rows bitwise equal to the one-row kernel).
#ifndef MI_CUDA_COMMON_CUH
#define MI_CUDA_COMMON_CUH
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "pyminfer.h"

extern "C" int mi_set_error(int code, const char *fmt, ...);

// Return MI_ERR_CUDA from the enclosing int function when a runtime call fails.
#define MI_CUDA_TRY(call)                                                                                   \
    do {                                                                                                    \
        cudaError_t mi_e_ = (call);                                                                         \
        if (mi_e_ != cudaSuccess) return mi_set_error(MI_ERR_CUDA, "%s: %s", #call, cudaGetErrorString(mi_e_)); \
    } while (0)
// Check the launch just enqueued (bad configuration, missing kernel image for this GPU).
#define MI_LAUNCH_TRY(name)                                                                                 \
    do {                                                                                                    \
        cudaError_t mi_e_ = cudaGetLastError();                                                             \
        if (mi_e_ != cudaSuccess) return mi_set_error(MI_ERR_CUDA, "launch %s: %s", name, cudaGetErrorString(mi_e_)); \
    } while (0)

// A weight matrix resident on the GPU in its GGUF layout: n_rows rows of row_bytes bytes.
struct mi_dtensor {
    const uint8_t *data; // device pointer, NULL when absent (optional biases)
    int32_t type;        // enum mi_type
    int64_t n_cols, n_rows, row_bytes;
};

#define MI_FULL_MASK 0xffffffffu

__device__ __forceinline__ float mi_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(MI_FULL_MASK, v, o));
    return v;
}
__device__ __forceinline__ int mi_warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(MI_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float mi_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(MI_FULL_MASK, v, o));
    return v;
}

// 4 bytes from an address that is only 2-byte aligned (Q4_0, Q5_0, Q8_0 and Q6_K blocks are).
__device__ __forceinline__ uint32_t mi_ld_a2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}
__device__ __forceinline__ uint32_t mi_ld_a4(const uint8_t *p) { return *(const uint32_t *)p; }
__device__ __forceinline__ float mi_ld_f16(const uint8_t *p) { return __half2float(*(const __half *)p); }

// One warp quantizes 32 activations (one per lane) to a q8a block exactly as mi_quantize_q8a:
// d = amax/127, q = round(x/d), s = d*sum(q). Correctly rounded division/reciprocal keep it
// bitwise equal to the CPU's quantization of the same floats.
__device__ __forceinline__ void mi_quant_chunk_warp(float v, mi_block_q8a *out, int lane) {
    const float amax = mi_warp_max(fabsf(v));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __frcp_rn(d) : 0.0f;
    const int q = (int)roundf(__fmul_rn(v, id));
    const int sum = mi_warp_sum_i(q);
    out->qs[lane] = (int8_t)q;
    if (lane == 0) {
        out->d = d;
        out->s = __fmul_rn(d, (float)sum);
    }
}
#endif
