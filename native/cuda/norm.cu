// RMSNorm (Zhang & Sennrich 2019) + q8a quantization in one pass per row, so each matmul input
// is read once and quantized once per layer (not once per consuming matrix).
#include "norm.cuh"
#include <stdlib.h>
#include <string.h>

namespace {
// One block per row for the norm (its sum of squares is a block reduction): 1024 threads so a
// 1536..8192-wide row takes few passes. Plain quantization has no reduction across chunks: a grid
// of 8-chunk blocks keeps every SM busy even for one row.
constexpr int MI_NORM_THREADS = 1024;
constexpr int MI_QUANT_THREADS = 256;

// PRE: chunks per warp held in registers (rows up to PRE * 32 * 32 wide); the rest of a wider row
// is read again after the reduction (a second dependent round trip). The additions are the same
// for every PRE (element t + 1024 k, k ascending), so PRE changes no bit: mi_norm_pre picks it.
template <int PRE>
__global__ void __launch_bounds__(MI_NORM_THREADS)
    mi_rmsnorm_quant_kernel(const float *__restrict__ x, const int32_t *__restrict__ rows,
                            const int32_t *__restrict__ n_rows_d, const float *__restrict__ w, float eps, int n,
                            float *__restrict__ xn, mi_block_q8a *__restrict__ xq) {
    // The norm weights are constants: load this lane's share before waiting on the previous kernel.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float wr[PRE];
#pragma unroll
    for (int k = 0; k < PRE; k++) {
        const int c = warp + k * (MI_NORM_THREADS / 32);
        wr[k] = c < n / 32 ? w[32 * c + lane] : 0.0f;
    }
    mi_pdl_wait();
    mi_pdl_trigger();
    const int j = blockIdx.x;
    if (n_rows_d && j >= *n_rows_d) return;
    const float *xr = x + (int64_t)(rows ? rows[j] : j) * n;
    __shared__ float part[MI_NORM_THREADS / 32];
    __shared__ float scale_sh;
    // Thread t holds x[t + 1024 k] (k < PRE): exactly the elements its warp's chunks c = warp + 32 k
    // quantize below, so the row is read once.
    float xv[PRE];
#pragma unroll
    for (int k = 0; k < PRE; k++) {
        const int i = threadIdx.x + k * MI_NORM_THREADS;
        xv[k] = i < n ? xr[i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < PRE; k++)
        if (threadIdx.x + k * MI_NORM_THREADS < n) ss = __fadd_rn(ss, __fmul_rn(xv[k], xv[k]));
    for (int i = threadIdx.x + PRE * MI_NORM_THREADS; i < n; i += MI_NORM_THREADS) ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
    ss = mi_warp_sum(ss);
    if (lane == 0) part[warp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = part[0];
        for (int i = 1; i < MI_NORM_THREADS / 32; i++) t = __fadd_rn(t, part[i]);
        scale_sh = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(t, (float)n), eps)));
    }
    __syncthreads();
    const float scale = scale_sh;
#pragma unroll
    for (int k = 0; k < PRE; k++) {
        const int c = warp + k * (MI_NORM_THREADS / 32);
        if (c < n / 32) {
            const int i = 32 * c + lane;
            const float v = __fmul_rn(__fmul_rn(xv[k], scale), wr[k]);
            xn[(int64_t)j * n + i] = v;
            mi_quant_chunk_warp(v, xq + (int64_t)j * (n / 32) + c, lane);
        }
    }
    for (int c = warp + PRE * (MI_NORM_THREADS / 32); c < n / 32; c += MI_NORM_THREADS / 32) {
        const int i = 32 * c + lane;
        const float v = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        xn[(int64_t)j * n + i] = v;
        mi_quant_chunk_warp(v, xq + (int64_t)j * (n / 32) + c, lane);
    }
}

__global__ void __launch_bounds__(MI_QUANT_THREADS)
    mi_quantize_kernel(const float *__restrict__ x, int n, mi_block_q8a *__restrict__ xq) {
    mi_pdl_wait();
    mi_pdl_trigger();
    const int t = blockIdx.y, lane = threadIdx.x % 32;
    const int c = blockIdx.x * (MI_QUANT_THREADS / 32) + threadIdx.x / 32;
    if (c < n / 32) mi_quant_chunk_warp(x[(int64_t)t * n + 32 * c + lane], xq + (int64_t)t * (n / 32) + c, lane);
}

__global__ void mi_swiglu_kernel(const float *__restrict__ g, const float *__restrict__ u, float *y, int64_t n) {
    mi_pdl_wait();
    mi_pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fmul_rn(__fdiv_rn(g[i], __fadd_rn(1.0f, expf(-g[i]))), u[i]);
}
} // namespace

int mi_cuda_norm_pre_env(void) {
    const char *e = getenv("MI_CUDA_NORM_PRE");
    if (!e || !e[0] || strcmp(e, "0") == 0) return 0;
    return strcmp(e, "4") == 0 ? 4 : -1;
}

// Chunks per warp the norm holds in registers for rows of n: the whole row up to 8,192 wide (the
// 14B's 5,120 took a second round trip with the fixed 4 before); MI_CUDA_NORM_PRE=4 forces the old
// choice (A/B timing). Read at each launch, so a captured graph keeps what was set at capture; a
// malformed value is refused at context creation and means "by width" here.
static int mi_norm_pre(int n) {
    if (mi_cuda_norm_pre_env() == 4) return 4;
    return n <= 2048 ? 2 : n <= 4096 ? 4 : 8;
}

int mi_cuda_rmsnorm_quant(const float *x, const int32_t *rows, const int32_t *n_rows_d, int n_rows, const float *w,
                          float eps, int n, float *xn, mi_block_q8a *xq, cudaStream_t s) {
    if (n_rows <= 0) return MI_OK;
    switch (mi_norm_pre(n)) {
    case 2: MI_LAUNCH("rmsnorm_quant", mi_rmsnorm_quant_kernel<2>, n_rows, MI_NORM_THREADS, s, x, rows, n_rows_d, w, eps, n, xn, xq); break;
    case 4: MI_LAUNCH("rmsnorm_quant", mi_rmsnorm_quant_kernel<4>, n_rows, MI_NORM_THREADS, s, x, rows, n_rows_d, w, eps, n, xn, xq); break;
    default: MI_LAUNCH("rmsnorm_quant", mi_rmsnorm_quant_kernel<8>, n_rows, MI_NORM_THREADS, s, x, rows, n_rows_d, w, eps, n, xn, xq); break;
    }
    return MI_OK;
}

int mi_cuda_quantize(const float *x, int nt, int n, mi_block_q8a *xq, cudaStream_t s) {
    const int per_block = MI_QUANT_THREADS / 32;
    MI_LAUNCH("quantize", mi_quantize_kernel, dim3((n / 32 + per_block - 1) / per_block, nt), MI_QUANT_THREADS, s, x, n, xq);
    return MI_OK;
}

int mi_cuda_swiglu(const float *g, const float *u, float *y, int64_t n, cudaStream_t s) {
    MI_LAUNCH("swiglu", mi_swiglu_kernel, (unsigned)((n + 255) / 256), 256, s, g, u, y, n);
    return MI_OK;
}
