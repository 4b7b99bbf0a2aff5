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
// yq != NULL (one segment, n_rows a multiple of 32): the output is also quantized, yq [nt][ldq]
// q8a blocks, by the last block to finish each 32-row group (cnt: int32 [n_rows/32], zero before
// the launch and left zero), so the next matmul's input needs no launch of its own.
#define MI_MMVQ_MAX_SEG 3
struct mi_mmvq_out {
    int n_seg;
    int end[MI_MMVQ_MAX_SEG];
    float *y[MI_MMVQ_MAX_SEG];
    int64_t ldy[MI_MMVQ_MAX_SEG];
    const float *bias[MI_MMVQ_MAX_SEG];
    mi_block_q8a *yq;
    int64_t ldq;
    int32_t *cnt;
    // RoPE and the KV-cache write fused into the q/k/v launch (any_rope != 0; block kernel with an
    // even number of rows per block): per segment rope[i] = 0 plain; 1 rotate, f32 to y[i];
    // 2 rotate, f16 to cache[i]; 3 f16 copy to cache[i]. Modes 1 and 2 compute a head's rows in
    // pair order (virtual rows 2m, 2m+1 = the two dims one rotation mixes: NEOX m, m + hd/2; NORM
    // 2m, 2m + 1), so both land in one block and are rotated there with the rope kernel's formula:
    // the same bits as matmul + mi_cuda_rope_kv. cache[i]: [n_ctx][ld_cache] f16, row pos[t];
    // rope_cs: [nt][hd] (cos[hd/2] then sin[hd/2]).
    int any_rope, hd, neox;
    int rope[MI_MMVQ_MAX_SEG];
    __half *cache[MI_MMVQ_MAX_SEG];
    int64_t ld_cache;
    const int32_t *pos;
    const float *rope_cs;
};
// Whether a q/k/v launch over rows of n_cols columns can take the fused RoPE epilogue (the block
// kernel with an even number of rows per block: MI_CUDA_MMVQ 0, 3 = the default, or 4, for rows of <= 128 chunks).
bool mi_cuda_mmvq_can_rope(int64_t n_cols);
// MI_CUDA_MMVQ_WARP_ROWS (A/B timing, read at every call; default 4096): the fewest rows a matrix of
// > 128-chunk rows needs for the warp kernel by default; -1 when malformed (context creation refuses it).
int64_t mi_cuda_mmvq_warp_rows(void);
int mi_cuda_mmvq_seg(const mi_dtensor *w, const mi_dtensor *w_up, const mi_block_q8a *xq, const float *xf, int64_t ldx,
                     int nt, const mi_mmvq_out *out, int accumulate, cudaStream_t s);
int mi_cuda_mmvq(const mi_dtensor *w, const mi_dtensor *w_up, const mi_block_q8a *xq, const float *xf, int64_t ldx,
                 int nt, float *y, int64_t ldy, const float *bias, int accumulate, cudaStream_t s);

// q/k/v in ONE launch where they come as two groups of different types (mi_mmvq_mixed_kernel):
// w0 (q and k stacked, say q4_K) then w1 (v, say q6_K), same n_cols; out's segments cover the
// rows of both in that order; xq [nt][ldx/32] q8a. The same bits as mi_cuda_mmvq_seg over each
// part (each block runs that part's block-kernel body). Only where
// mi_cuda_mmvq_mixed_applies: a compiled type pair (mi_mmvq_mixed_pair), and both parts would take
// the block kernel with whole blocks of w0's rows.
bool mi_cuda_mmvq_mixed_applies(const mi_dtensor *w0, const mi_dtensor *w1);
int mi_cuda_mmvq_mixed(const mi_dtensor *w0, const mi_dtensor *w1, const mi_block_q8a *xq, int64_t ldx, int nt,
                       const mi_mmvq_out *out, int accumulate, cudaStream_t s);

// One launch's arguments (host side): w0/w1 [n_rows][row_bytes] device weights (w1: SwiGLU up or
// NULL), xq [nt][ldx/32] q8a or xf [nt][ldx] f32 activations, rpb rows per 128-thread block,
// warp = warps per row for the warp kernel (0: block kernel).
struct mi_mmvq_args {
    const uint8_t *w0, *w1;
    int64_t row_bytes;
    int n_rows, n_cols;
    const mi_block_q8a *xq;
    const float *xf;
    int64_t ldx;
    mi_mmvq_out os;
    int accumulate, rpb, warp;
    int pair; // the pair kernel for plain launches of nt >= 2 on the block kernel (MI_CUDA_MMVQ_PAIR)
};
// Launches of the pair kernel so far (mi_cuda_mmvq_pair_launches; host side, graph replays not counted).
extern uint64_t mi_mmvq_pair_count;
template <int T> cudaError_t mi_mmvq_launch_type(bool glu, int nt, const mi_mmvq_args &a, cudaStream_t s);
// The tensor-core verify kernel (mmvq_mma.cu): whether it serves a matrix (q4_K, rows a multiple of
// 16, no fused RoPE), and the launch of one group of 2 <= nt <= 8 rows: the same bits, row by row,
// as the nt = 1 kernel that a.rpb / a.warp pick (it replays that kernel's reduction).
bool mi_mmvq_mma_applies(int type, int64_t n_rows, int64_t n_cols, int any_rope);
// MI_CUDA_MMVQ_MMA_SPLIT as mmvq_mma.cu reads it: 0, 1 or 2 (default), -1 when malformed.
int mi_mmvq_mma_split_mode();
cudaError_t mi_mmvq_mma_launch(bool glu, int nt, const mi_mmvq_args &a, cudaStream_t s);
// Mixed launches (mmvq_mixed.cu): whether the pair (t0, t1) is compiled, and the launch of one group
// of nt <= 8 rows: a.w0 / a.row_bytes / a.n_rows describe w0, w1 / row_bytes1 / n_rows1 the second part.
bool mi_mmvq_mixed_pair(int t0, int t1);
cudaError_t mi_mmvq_mixed_launch(int t0, int t1, int nt, const mi_mmvq_args &a, const uint8_t *w1, int64_t row_bytes1,
                                 int n_rows1, cudaStream_t s);
#endif
