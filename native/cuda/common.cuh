// Shared helpers of the CUDA backend: error macros, the device tensor descriptor, warp
// reductions and unaligned loads. Every float operation whose rounding matters is written with
// explicit _rn intrinsics so that no FMA contraction can differ between template instances (the
// nt-row kernels must give rows bitwise equal to the one-row kernel).
#ifndef MI_CUDA_COMMON_CUH
#define MI_CUDA_COMMON_CUH
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
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
// bitwise equal to the CPU's quantization of the same floats. On sm_80+ the max and the sum are
// one warp-reduce instruction each instead of five shuffles: a max of non-negative floats is the
// max of their bit patterns, and an integer sum has no order (exact, so the same bits; only a NaN
// input differs: it then wins the max instead of being skipped, and the block is NaN either way).
__device__ __forceinline__ void mi_quant_chunk_warp(float v, mi_block_q8a *out, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const float amax = __uint_as_float(__reduce_max_sync(MI_FULL_MASK, __float_as_uint(fabsf(v))));
#else
    const float amax = mi_warp_max(fabsf(v));
#endif
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __frcp_rn(d) : 0.0f;
    const int q = (int)roundf(__fmul_rn(v, id));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const int sum = __reduce_add_sync(MI_FULL_MASK, q);
#else
    const int sum = mi_warp_sum_i(q);
#endif
    out->qs[lane] = (int8_t)q;
    if (lane == 0) {
        out->d = d;
        out->s = __fmul_rn(d, (float)sum);
    }
}

// Programmatic dependent launch (PDL, sm_90+; CUDA programming guide, "Programmatic Dependent
// Launch and Synchronization"). Every kernel of the forward is launched with mi_launch, which lets
// it start while the kernel before it drains; the kernel must call mi_pdl_wait() before it reads
// anything an earlier kernel wrote, and before it exits (every block), so that completion stays
// transitive along the chain. Work that reads only constants (weights) may run before the wait:
// the mat-vec kernels prefetch their weight rows into L2 there, overlapping the previous kernel.
// Below sm_90 both are no-ops and launches are plain. MI_CUDA_PDL=0 turns it off (A/B timing; read
// at each launch, so a captured graph keeps what was set at capture).
__device__ __forceinline__ void mi_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Let the next kernel launch now (its blocks then fill SMs as this grid's blocks retire).
__device__ __forceinline__ void mi_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Bring the 128-byte line holding p towards L2 (a hint: changes no result).
__device__ __forceinline__ void mi_prefetch_l2_line(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// Bring bytes [p, p + n) towards L2, the block's threads taking one line each in turn.
__device__ __forceinline__ void mi_prefetch_l2(const uint8_t *p, int64_t n) {
    for (int64_t o = (int64_t)threadIdx.x * 128; o < n; o += (int64_t)blockDim.x * 128) mi_prefetch_l2_line(p + o);
}

// Compute capability major of the current device (0 if it cannot be read), read once: the backend
// uses device 0 only.
static inline int mi_cc_major() {
    static int cc_major = -1;
    if (cc_major < 0) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            cudaGetLastError();
            v = 0;
        }
        cc_major = v;
    }
    return cc_major;
}

// An on / off tuning switch: unset or empty -> dflt, "0" -> 0, "1" -> 1, anything else -> -1
// (context creation refuses it with an error naming the variable).
static inline int mi_env_switch(const char *name, int dflt) {
    const char *e = getenv(name);
    if (!e || !e[0]) return dflt;
    if (e[0] == '0' && !e[1]) return 0;
    if (e[0] == '1' && !e[1]) return 1;
    return -1;
}

static inline bool mi_pdl_on(cudaStream_t s) {
    // Only on created streams: the legacy default stream (op-level tests) keeps plain launches.
    // MI_CUDA_PDL=0 turns it off (a malformed value is refused at context creation).
    return s != 0 && mi_cc_major() >= 9 && mi_env_switch("MI_CUDA_PDL", 1) != 0;
}

// kernel<<<grid, block, 0, s>>>(args...) with the PDL attribute where mi_pdl_on(s).
template <typename... P, typename... A>
cudaError_t mi_launch(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t s, A &&...args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = mi_pdl_on(s) ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}
// Launch as mi_launch and return MI_ERR_CUDA from the enclosing function on failure.
#define MI_LAUNCH(name, kernel, grid, block, s, ...)                                                        \
    do {                                                                                                    \
        cudaError_t mi_e_ = mi_launch(kernel, grid, block, s, __VA_ARGS__);                                 \
        if (mi_e_ != cudaSuccess) return mi_set_error(MI_ERR_CUDA, "launch %s: %s", name, cudaGetErrorString(mi_e_)); \
    } while (0)
#endif
