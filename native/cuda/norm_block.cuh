// RMSNorm (Zhang & Sennrich 2019) + q8a quantization of NT activation rows by one block of
// MI_NORM_THREADS threads. One device function for two callers, so both give the same bits:
//   - the rmsnorm_quant kernel (norm.cu), one block per row (NT = 1);
//   - the prologue of the wide mat-vec (mmvq_kernels.cuh), whose 1024-thread block normalizes
//     its NT input rows itself instead of waiting for a separate launch.
// Order of the sum of squares (fixed, whatever the caller): thread i sums x[i + 1024 k] over
// k = 0, 1, ... in f32; a warp butterfly (mi_warp_sum); then one thread per row adds the 32 warp
// partials in order 0..31. scale = 1 / sqrt(ss / n + eps) (correctly rounded steps), v = x * scale
// * w, quantized 32 at a time by mi_quant_chunk_warp (as cpu/quants.c mi_quantize_q8a).
#ifndef MI_CUDA_NORM_BLOCK_CUH
#define MI_CUDA_NORM_BLOCK_CUH
#include "common.cuh"

constexpr int MI_NORM_THREADS = 1024;
// PRE: x and w values per thread held in registers (the rows' first 1024 * PRE elements; the rest
// is re-read from memory, in the same order): 4 for the norm kernel, 2 for the wide mat-vec (rows
// of <= 2048 there), to spare its registers.

// This thread's norm weights w[t + 1024 k] (k < PRE), zero past n. The weights are constants, so
// callers load them before the PDL wait.
template <int PRE>
__device__ __forceinline__ void mi_norm_load_w(const float *__restrict__ w, int n, float (&wr)[PRE]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int k = 0; k < PRE; k++) {
        const int c = warp + k * (MI_NORM_THREADS / 32);
        wr[k] = c < n / 32 ? w[32 * c + lane] : 0.0f;
    }
}

// x: NT rows of n floats, row t at x + t * ldx (n a multiple of 32); w: f32 [n] (wr as loaded by
// mi_norm_load_w); outputs row t: xn + t * ldxn (f32 [n], skipped when xn is NULL) and
// xq + t * ldq (q8a [n / 32], global or shared memory). Must be called by all MI_NORM_THREADS
// threads of the block; the caller syncs before reading xq from another thread.
template <int NT, int PRE>
__device__ __forceinline__ void mi_rmsnorm_quant_block(const float *__restrict__ x, int64_t ldx, const float *__restrict__ w,
                                                       const float (&wr)[PRE], float eps, int n, float *xn,
                                                       int64_t ldxn, mi_block_q8a *xq, int64_t ldq) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __shared__ float part[NT][MI_NORM_THREADS / 32];
    __shared__ float scale_sh[NT];
    // Thread t holds x[t + 1024 k] (k < PRE): exactly the elements its warp's chunks c = warp + 32 k
    // quantize below, so each row is read once (rows wider than 4096 re-read the rest).
    float xv[NT][PRE];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int k = 0; k < PRE; k++) {
            const int i = threadIdx.x + k * MI_NORM_THREADS;
            xv[t][k] = i < n ? x[t * ldx + i] : 0.0f;
        }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float *xr = x + t * ldx;
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < PRE; k++)
            if (threadIdx.x + k * MI_NORM_THREADS < n) ss = __fadd_rn(ss, __fmul_rn(xv[t][k], xv[t][k]));
        for (int i = threadIdx.x + PRE * MI_NORM_THREADS; i < n; i += MI_NORM_THREADS)
            ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
        ss = mi_warp_sum(ss);
        if (lane == 0) part[t][warp] = ss;
    }
    __syncthreads();
    if (threadIdx.x < NT) {
        const int t = threadIdx.x;
        float s = part[t][0];
        for (int i = 1; i < MI_NORM_THREADS / 32; i++) s = __fadd_rn(s, part[t][i]);
        scale_sh[t] = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(s, (float)n), eps)));
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float scale = scale_sh[t];
        const float *xr = x + t * ldx;
#pragma unroll
        for (int k = 0; k < PRE; k++) {
            const int c = warp + k * (MI_NORM_THREADS / 32);
            if (c < n / 32) {
                const float v = __fmul_rn(__fmul_rn(xv[t][k], scale), wr[k]);
                if (xn) xn[t * ldxn + 32 * c + lane] = v;
                mi_quant_chunk_warp(v, xq + t * ldq + c, lane);
            }
        }
        for (int c = warp + PRE * (MI_NORM_THREADS / 32); c < n / 32; c += MI_NORM_THREADS / 32) {
            const int i = 32 * c + lane;
            const float v = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
            if (xn) xn[t * ldxn + i] = v;
            mi_quant_chunk_warp(v, xq + t * ldq + c, lane);
        }
    }
}
#endif
