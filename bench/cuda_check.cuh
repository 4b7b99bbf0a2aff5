// The standalone probes' shared helpers (bench/barrier_probe.cu, read_probe.cu, sm_stream_probe.cu):
// CK(call), the check of a CUDA runtime call (print file, line, call and the error string to stderr
// and exit(1) when it fails), and fold / publish, which keep every loaded word live.
#ifndef MI_BENCH_CUDA_CHECK_CUH
#define MI_BENCH_CUDA_CHECK_CUH
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e_ = (x);                                                        \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

#ifdef __CUDACC__
__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Block-wide XOR into out[blockIdx.x] (keeps every load live).
__device__ __forceinline__ void publish(uint32_t h, uint32_t *out) {
    __shared__ uint32_t s[32];
    for (int o = 16; o; o >>= 1) h ^= __shfl_xor_sync(0xffffffffu, h, o);
    if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = h;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)blockDim.x / 32; w++) h ^= s[w];
        out[blockIdx.x] = h;
    }
}
#endif
#endif
