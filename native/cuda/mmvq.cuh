// Quantized matrix times a few activation rows (decode / speculative batches).
#ifndef MI_CUDA_MMVQ_CUH
#define MI_CUDA_MMVQ_CUH
#include "common.cuh"

// y[t*ldy + r] = epilogue(sum_c W[r,c] x[t,c]) for t < nt, r < w->n_rows.
//   Quantized W: xq is [nt][ldx/32] q8a blocks; F32/F16 W: xf is [nt][ldx] f32.
//   w_up != NULL (same type and shape as w): SwiGLU, y = silu(W x) * (W_up x).
//   bias (f32 [n_rows] or NULL) is added; accumulate != 0 adds into y (residual).
// Rows are processed in groups of <= 8 activation rows, each group streaming W once; every
// (t, r) uses the same reduction order whatever nt, so rows are bitwise equal to nt = 1.
// Outputs of a launch over the stacked rows of several matrices of one type (q, k, v uploaded
// back to back): rows [end[i-1], end[i]) go to y[i] (+ bias[i]), row index restarting at 0.
#define MI_MMVQ_MAX_SEG 3
struct mi_mmvq_out {
    int n_seg;
    int end[MI_MMVQ_MAX_SEG];
    float *y[MI_MMVQ_MAX_SEG];
    int64_t ldy[MI_MMVQ_MAX_SEG];
    const float *bias[MI_MMVQ_MAX_SEG];
};
int mi_cuda_mmvq_seg(const mi_dtensor *w, const mi_dtensor *w_up, const mi_block_q8a *xq, const float *xf, int64_t ldx,
                     int nt, const mi_mmvq_out *out, int accumulate, cudaStream_t s);
int mi_cuda_mmvq(const mi_dtensor *w, const mi_dtensor *w_up, const mi_block_q8a *xq, const float *xf, int64_t ldx,
                 int nt, float *y, int64_t ldy, const float *bias, int accumulate, cudaStream_t s);
#endif
