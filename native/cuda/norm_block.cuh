// RMSNorm + q8a quantization of a few activation rows by ONE small block, into shared memory,
// with exactly the bits of mi_rmsnorm_quant_kernel (norm.cu). The mat-vec launches that consume
// a norm (q/k/v, gate/up) run this in their prologue, each block for itself, so the norm needs no
// launch of its own: one dependent launch less per norm (two a layer) for a few KB of L2 reads
// per block (docs/perf.md, session 10).
//
// Why the bits match: the norm kernel's sum of squares is fixed by its thread layout, not by the
// data. Its thread T (of MI_NORM_THREADS) sums x[i]^2 over i = T, T + MI_NORM_THREADS, ... in
// that order, each warp is summed by the butterfly mi_warp_sum, and thread 0 adds the warps'
// sums in warp order. A block of NTH threads plays the MI_NORM_THREADS virtual threads: its
// thread t takes virtual threads T = t + NTH m (m < MI_NORM_THREADS / NTH), whose virtual warp
// (T / 32) holds the same lanes as its real warp, so the same butterfly gives each virtual warp's
// sum. The scaled values and their q8a blocks are then per-element / per-chunk functions
// (mi_quant_chunk_warp), whichever warp runs them.
#ifndef MI_CUDA_NORM_BLOCK_CUH
#define MI_CUDA_NORM_BLOCK_CUH
#include "common.cuh"

// Threads of the rmsnorm_quant kernel's block: part of its summation order (see above).
constexpr int MI_NORM_THREADS = 1024;
// Most activation rows one block normalizes (a mat-vec launch serves <= 8).
constexpr int MI_NORM_BLOCK_MAX_ROWS = 8;

// Rows t < nt of x (f32, row stride ldx, n = 32k values each) -> xs[t * (n / 32) + c], the q8a
// blocks of rmsnorm(x[t]) * w (w: f32 [n]) with epsilon eps. Called by all NTH threads of the block
// (NTH divides MI_NORM_THREADS and is a multiple of 32); ends with the block synchronized, xs
// readable by every thread. x must be written by an earlier kernel (read after the PDL wait).
template <int NTH>
__device__ __forceinline__ void mi_norm_q8a_block(const float *__restrict__ x, int64_t ldx, int nt,
                                                  const float *__restrict__ w, float eps, int n,
                                                  mi_block_q8a *__restrict__ xs) {
    static_assert(MI_NORM_THREADS % NTH == 0 && NTH % 32 == 0, "virtual threads must map onto whole warps");
    constexpr int M = MI_NORM_THREADS / NTH; // virtual threads per thread
    __shared__ float part[MI_NORM_BLOCK_MAX_ROWS][MI_NORM_THREADS / 32];
    __shared__ float scale_sh[MI_NORM_BLOCK_MAX_ROWS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int t = 0; t < nt; t++) {
        const float *xr = x + (int64_t)t * ldx;
#pragma unroll
        for (int m = 0; m < M; m++) {
            const int T = threadIdx.x + NTH * m;
            float ss = 0.0f;
            for (int i = T; i < n; i += MI_NORM_THREADS) ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
            ss = mi_warp_sum(ss);
            if (lane == 0) part[t][T / 32] = ss;
        }
    }
    __syncthreads();
    if (threadIdx.x < nt) {
        float s = part[threadIdx.x][0];
        for (int i = 1; i < MI_NORM_THREADS / 32; i++) s = __fadd_rn(s, part[threadIdx.x][i]);
        scale_sh[threadIdx.x] = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(s, (float)n), eps)));
    }
    __syncthreads();
    const int nc = n / 32;
    for (int t = 0; t < nt; t++) {
        const float scale = scale_sh[t];
        const float *xr = x + (int64_t)t * ldx;
        for (int c = warp; c < nc; c += NTH / 32) {
            const int i = 32 * c + lane;
            mi_quant_chunk_warp(__fmul_rn(__fmul_rn(xr[i], scale), w[i]), xs + (int64_t)t * nc + c, lane);
        }
    }
    __syncthreads();
}
#endif
