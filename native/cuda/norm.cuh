// RMSNorm fused with activation quantization, plain quantization, and elementwise SwiGLU.
#ifndef MI_CUDA_NORM_CUH
#define MI_CUDA_NORM_CUH
#include "common.cuh"

// For j < n_rows (n_rows_d: device count read at run time, or NULL = all): src row
// rows ? rows[j] : j of x [*][n] -> xn[j] = rmsnorm(x) * w (f32 [n_rows][n]) and xq[j] (q8a
// [n_rows][n/32]). One block per row.
int mi_cuda_rmsnorm_quant(const float *x, const int32_t *rows, const int32_t *n_rows_d, int n_rows, const float *w,
                          float eps, int n, float *xn, mi_block_q8a *xq, cudaStream_t s);
// MI_CUDA_NORM_PRE (A/B timing: chunks a warp the norm holds in registers): 0 when unset, empty or
// "0" (by row width), 4 for "4" (the fixed choice before session 22), -1 when malformed.
int mi_cuda_norm_pre_env(void);
// xq [nt][n/32] = q8a(x [nt][n]).
int mi_cuda_quantize(const float *x, int nt, int n, mi_block_q8a *xq, cudaStream_t s);
// y[i] = silu(g[i]) * u[i] over n values (fallback when ffn_gate and ffn_up differ in type).
int mi_cuda_swiglu(const float *g, const float *u, float *y, int64_t n, cudaStream_t s);
#endif
