// MMQ: quantized weight matrix times many activation rows on the tensor cores (prefill, wide
// verify batches). Where MMVQ streams W once per 8 rows with dp4a, MMQ dequantizes each weight
// tile once to f16 in shared memory and reuses it for 64 activation rows through nvcuda::wmma
// (m16n16k16, f16 inputs, f32 accumulators); calls of more than 64 rows take 128-row tiles with
// ldmatrix + mma.sync instead (mmq.cu, "Wide tiles"). What follows describes the 64-row kernel.
//
// Tiles: a block of 256 threads (8 warps) owns BM = 128 weight rows x BN = 64 activation rows
// and walks K in steps of BK = 64 columns (two 32-wide chunks per row, so every thread unpacks
// exactly one chunk with mi_qt<T>::load per step and each weight is dequantized once per block).
// Warps form a 4 x 2 grid of 32 x 32 output sub-tiles, 2 x 2 accumulators each. The next step's
// weight chunk and activations are loaded into registers while the current step multiplies.
// Shared memory: Ws [BM][BK+8] f16 + Xs [BN][BK+8] f16 (the +8 halves shift rows across banks),
// twice (two stages: the MMAs read one pair while the next step is staged into the other), reused
// after the K loop as the f32 staging tile Cs [BN][BM+4] of the epilogue: 55,296 bytes, two blocks
// per SM on sm_80 / sm_90; one pair (33,792 bytes) where two such blocks would not fit an SM
// (sm_86 / sm_89) or with MI_CUDA_MMQ_STAGES=1. Why these sizes: 2 x 2 accumulators of 16 x 16 are 32 f32 registers per
// thread, which keeps the kernel under 128 registers (two blocks of 8 warps per SM); BK = 64 is
// exactly one chunk per thread per step; 128 x 64 still gives a 1536-row matrix 96 tiles at
// nt = 512. The f16 conversion bounds the inputs: |W| and |x| must stay below 65504.
// Not fused (unlike MMVQ): SwiGLU pairs and stacked q/k/v outputs; call once per matrix.
// Launched plainly (no PDL attribute): the kernels do not call griddepcontrol.wait.
//
// Launch: grid (ceil(nt/BN), ceil(n_rows/BM), splits). splits > 1 ("K-split") where a time
// estimate says the whole-K grid would leave SMs idle (mmq.cu: mi_mmq_auto_splits; few tiles, or
// a last wave mostly empty): then split z takes a contiguous range of K steps and writes its partial tile to scratch, and a
// second kernel sums the partials in z order (0, 1, ..) and applies the epilogue. No atomics:
// the same call on the same GPU gives the same bits every run. The number of splits is a function
// of (n_rows, nt, n_cols, SM count, scratch_floats), so unlike MMVQ a row's result may change
// with nt (no nt-bitwise contract for nt > 8). MI_CUDA_MMQ_SPLITS=n in the environment forces n
// splits (testing; read at every call), still capped by the scratch given (which
// mi_cuda_mmq_scratch_floats sizes for the automatic choice only; the test entry allocates more).
//
// Tolerance (not bitwise to MMVQ or the CPU): x is rounded to f16 (2^-11 relative); a quantized
// weight is q * f16(dw*sc) + f16(mw) rounded to f16, off by ~2^-11 of |dw*sc*q| + |mw|; the tensor
// cores sum exact products in f32. So |y - y_exact| <~ 2^-10 * sum_c (|dw*sc*q| + |mw|) |x| plus
// the f32 summation error; on random operands NMSE vs a float64 reference is ~1e-7 and the worst
// element ~2e-3 of the rms output (MMVQ's q8a activations: NMSE ~1e-5).
#ifndef MI_CUDA_MMQ_CUH
#define MI_CUDA_MMQ_CUH
#include "common.cuh"

#define MI_MMQ_BM 128       // weight rows per block
#define MI_MMQ_BN 64        // activation rows per block
#define MI_MMQ_BK 64        // columns per K step
#define MI_MMQ_MAX_SPLIT 16 // most K splits
#define MI_MMQ_SCRATCH_CAP ((size_t)32 << 20) // most floats of K-split partials a context keeps (128 MiB)
// Below this the forward uses MMVQ (bitwise nt contract, weight-bandwidth bound): up to 8 rows in
// one launch, and nt = 9 as 8 + 1 (graphed like nt <= 8, and bitwise): on the H200's synthetic
// 1.5B 2.97 ms against 4.26 ms for the GEMM at nt = 10 (docs/perf.md, session 6).
#define MI_MMQ_MIN_NT 10

// When MMQ applies: a type mi_qt (or F32/F16) handles, whole 32-wide chunks, nt >= MI_MMQ_MIN_NT.
static inline bool mi_cuda_mmq_applies(int type, int64_t n_cols, int nt) {
    switch (type) {
    case MI_TYPE_F32: case MI_TYPE_F16: case MI_TYPE_Q4_0: case MI_TYPE_Q4_1: case MI_TYPE_Q5_0:
    case MI_TYPE_Q5_1: case MI_TYPE_Q8_0: case MI_TYPE_Q4_K: case MI_TYPE_Q5_K: case MI_TYPE_Q6_K:
        return n_cols % 32 == 0 && nt >= MI_MMQ_MIN_NT;
    default: return false;
    }
}

// Floats of scratch that cover the K-split partials of every call with this n_rows and any
// nt <= max_nt on the current device (partials are [splits][nt][n_rows] f32), at most
// MI_MMQ_SCRATCH_CAP: a call whose automatic split count would need more takes fewer splits.
size_t mi_cuda_mmq_scratch_floats(int64_t n_rows, int max_nt);

// Shared-memory stages the GEMM takes now (MI_CUDA_MMQ_STAGES, else by the device): *out = 1 or 2;
// MI_ERR_ARG for another value of the variable (context creation checks it, so a forward does not
// fail half-way).
int mi_cuda_mmq_stages(int *out);

// y[t*ldy + r] (= or +=) bias[r] + sum_c W[r,c] * x[t*ldx + c], t < nt, r < w->n_rows:
//   w: [n_rows][row_bytes] in its GGUF layout (any type of mi_cuda_mmq_applies; n_cols % 32 == 0);
//   x: f32 [nt][ldx], 16-byte aligned, ldx % 4 == 0, reads columns < n_cols only;
//   y: f32 [nt][ldy], must not overlap x; accumulate != 0 adds into it (residual);
//   bias: f32 [n_rows] or NULL; scratch: f32 [scratch_floats] (or NULL / 0: no K-split), size
//   from mi_cuda_mmq_scratch_floats; less than that only lowers the number of splits.
//   xh: f16 [xh_halves] (or NULL / 0) for the wide kernel's activations, size from
//   mi_cuda_mmq_xh_halves; x_ready != 0: xh already holds this x (the same x, nt and n_cols as the
//   call before on this stream, e.g. k and v after q), so it is not converted again; *xh_holds_x
//   (if not NULL) is set to whether xh holds this x after the call (0 where the call did not take
//   the wide kernel), which is what the next call's x_ready may rest on.
// Calls of more than 64 rows take 128-row tiles (mmq.cu: mi_mmq_wide_kernel) where MI_CUDA_MMQ_BN
// allows and xh is large enough, else the 64-row kernel. Any nt >= 1 works.
// Errors: MI_ERR_TYPE (type), MI_ERR_ARG (shape/alignment, MI_CUDA_MMQ_*), MI_ERR_CUDA.
int mi_cuda_mmq(const mi_dtensor *w, const float *x, int64_t ldx, int nt, float *y, int64_t ldy, const float *bias,
                int accumulate, float *scratch, size_t scratch_floats, __half *xh, size_t xh_halves, int x_ready,
                int *xh_holds_x, cudaStream_t s);

// Halves of f16 activation scratch the wide kernel needs for rows of n_cols columns and any
// nt <= max_nt: max_nt x n_cols rounded up to 64; 0 when max_nt <= 64 (the 64-row kernel).
size_t mi_cuda_mmq_xh_halves(int64_t n_cols, int max_nt);

// Activation rows per tile the GEMM takes for calls of more than 64 rows now (MI_CUDA_MMQ_BN,
// else by the device: 128 where two 72 KB blocks fit an SM): *out = 64 or 128; MI_ERR_ARG for
// another value of the variable.
int mi_cuda_mmq_bn(int *out);

// K-split rule the GEMM takes now (MI_CUDA_MMQ_FILL): *out = 1 (the time estimate, default) or 0
// (the old rule); MI_ERR_ARG for another value of the variable (checked at context creation too).
int mi_cuda_mmq_fill(int *out);

// The GEMM's tuning variables (MI_CUDA_MMQ_STAGES, _BN, _FILL) as mi_cuda_mmq will read them:
// MI_OK, or MI_ERR_ARG naming the first malformed one. Context creation calls it, so that a
// forward does not fail half-way.
int mi_cuda_mmq_check_env(void);
#endif
