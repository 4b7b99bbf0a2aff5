// MMVQ host side: picks the kernel variant and the weight type's launcher (mmvq_kernels.cuh,
// compiled once per type from the generated mmvq_<type>.cu files), in groups of <= 8 rows.
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "mmvq.cuh"

namespace {
int mi_launch_type(int type, bool glu, int nt, const mi_mmvq_args &a, cudaStream_t s) {
    cudaError_t e = cudaSuccess;
    switch (type) {
    case MI_TYPE_F32: e = mi_mmvq_launch_type<MI_TYPE_F32>(glu, nt, a, s); break;
    case MI_TYPE_F16: e = mi_mmvq_launch_type<MI_TYPE_F16>(glu, nt, a, s); break;
    case MI_TYPE_Q4_0: e = mi_mmvq_launch_type<MI_TYPE_Q4_0>(glu, nt, a, s); break;
    case MI_TYPE_Q4_1: e = mi_mmvq_launch_type<MI_TYPE_Q4_1>(glu, nt, a, s); break;
    case MI_TYPE_Q5_0: e = mi_mmvq_launch_type<MI_TYPE_Q5_0>(glu, nt, a, s); break;
    case MI_TYPE_Q5_1: e = mi_mmvq_launch_type<MI_TYPE_Q5_1>(glu, nt, a, s); break;
    case MI_TYPE_Q8_0: e = mi_mmvq_launch_type<MI_TYPE_Q8_0>(glu, nt, a, s); break;
    case MI_TYPE_Q4_K: e = mi_mmvq_launch_type<MI_TYPE_Q4_K>(glu, nt, a, s); break;
    case MI_TYPE_Q5_K: e = mi_mmvq_launch_type<MI_TYPE_Q5_K>(glu, nt, a, s); break;
    case MI_TYPE_Q6_K: e = mi_mmvq_launch_type<MI_TYPE_Q6_K>(glu, nt, a, s); break;
    default: return mi_set_error(MI_ERR_TYPE, "CUDA matmul: unsupported type %d", type);
    }
    if (e != cudaSuccess) return mi_set_error(MI_ERR_CUDA, "launch mmvq: %s", cudaGetErrorString(e));
    return MI_OK;
}
} // namespace

// Rows per 128-thread block from the row length only (never from nt): short rows share a block
// so fewer lanes idle. (Tried: one chunk pair per lane: no faster at nt=1, 20-30% slower at nt=8.)
static int mi_rows_per_block(int64_t nchunks) { return nchunks <= 64 ? 4 : nchunks <= 128 ? 2 : 1; }

// MI_CUDA_MMVQ (read at every call, so a graph keeps what was set at capture): 0..4, unset = 3;
// -1 when malformed (mi_cuda_mmvq_seg refuses it).
static int mi_mmvq_mode() {
    const char *ev = getenv("MI_CUDA_MMVQ");
    if (!ev) return 3;
    return ev[0] >= '0' && ev[0] <= '4' && ev[1] == 0 ? ev[0] - '0' : -1;
}

// Warps per row of the warp kernel for a matrix of n_rows rows of nchunks chunks (0 = the block
// kernel). 0 = the block kernel (fastest at nt = 1 on the H200 in session 2: 7B shape 359 vs
// 350 / 340 tok/s, 1.5B 688 vs 619 / 629), 1 = one warp per row (fastest at nt = 8 then: 7B 1454
// vs 1275 batch tok/s; 14B nt = 1 175 vs 165), 2 = 1, 2 or 4 warps per row by row length (2 for
// rows of 129..256 chunks, 4 above), 3 (default) = by matrix shape: for rows of > 128 chunks in
// matrices of >= 4096 rows mode 2's 2 or 4 warps a row, the block kernel otherwise; 4 = mode 3's
// kernel choice as it was until session 22, one warp a row there (its speed at nt = 5..7 also
// differs from then: warp-kernel matrices now take the tensor-core kernel from 8 rows unless
// MI_CUDA_MMVQ_MMA is set, mi_mmvq_mma_from) (14B shape tg 194.3 -> 199.0, nt = 8 542.8 -> 649.5
// tok/s against the block kernel in session 4; every row of > 128 chunks on the warp kernel lost
// 8% / 4% at nt = 1 on the 1.5B / 7B shapes' ffn_down, 1,536 / 3,584 rows). 2 / 4 warps against 1
// (session 22, 14B shape, the only one with such matrices, GPU ms a forward at nt = 1..6, 8: 4.884 /
// 5.753 / 6.430 / 7.993 / 8.423 / 9.173 / 10.594 -> 4.896 / 5.656 / 6.002 / 7.149 / 8.351 / 8.815 /
// 10.001): the verify rows read each weight block with 2-4x the warps, and the tensor-core verify
// kernel replays tpr 64 / 128, which it splits over clusters. A function of the matrix only,
// never of nt, so rows stay bitwise equal across nt.
// The 4096 is MI_CUDA_MMVQ_WARP_ROWS where set (A/B timing). Rows of > 256 chunks get the same bits
// from the warp kernel's 4 warps as from the block kernel (one row a block, tpr 128: the same slots,
// butterfly and warp order), so for them the bound is a speed choice only; not measured yet for
// the 1.5B / 7B shapes' ffn_down (1,536 / 3,584 rows), which it would move.
#define MI_MMVQ_WARP_ROWS 4096
// A row-count environment variable: dflt when unset or empty, -1 when malformed or below lo.
static int64_t mi_env_rows(const char *name, int64_t dflt, long lo) {
    const char *ev = getenv(name);
    if (!ev || !ev[0]) return dflt;
    char *end = nullptr;
    const long v = strtol(ev, &end, 10);
    return ev[0] < '0' || ev[0] > '9' || *end || v < lo || v > INT_MAX ? -1 : v;
}
int64_t mi_cuda_mmvq_warp_rows(void) { return mi_env_rows("MI_CUDA_MMVQ_WARP_ROWS", MI_MMVQ_WARP_ROWS, 1); }
// MI_CUDA_MMVQ_PAIR (read at every call, like MI_CUDA_MMVQ): 1 / unset = plain launches of nt >= 2
// on the block kernel (matrices of >= MI_CUDA_MMVQ_PAIR_ROWS rows) or the warp kernel take its pair
// variant (two rows a thread, activations loaded once for both: the same bits; mmvq_kernels.cuh);
// 0 = the kernels without pairs (A/B timing, tests); -1 when malformed.
// (Measured and dropped, session 31: pairs only for rows of > 64 or > 128 chunks: 1.5B shape nt =
// 4 1.287 / 1.288 ms against 1.268 for all.)
static int mi_mmvq_pair_mode() {
    const char *ev = getenv("MI_CUDA_MMVQ_PAIR");
    if (!ev || !ev[0]) return 1;
    return (ev[0] == '0' || ev[0] == '1') && ev[1] == 0 ? ev[0] - '0' : -1;
}
// MI_CUDA_MMVQ_PAIR_ROWS (read at every call): the fewest rows a block-kernel matrix needs for the
// pair kernel (unset: MI_MMVQ_PAIR_ROWS; 0 = every matrix). A pair block serves twice a block's rows,
// so a small matrix's launch gets half the blocks, and the 0.5B shape's 896-row o / ffn_down then
// lose (GPU ms a forward, nt = 2 / 4, pairs on all / not on those: 0.676 / 0.663, 0.777 / 0.768),
// while the 1.5B's 1,536-row ones win (ffn_down: 1.038 / 1.074, 1.262 / 1.393) and the 7B's 3,584;
// no block-count bound separates those (docs/perf.md, session 34). The same bits either way. The
// warp kernel's matrices (>= 4096 rows by default) are not affected.
#define MI_MMVQ_PAIR_ROWS 1024
static int64_t mi_mmvq_pair_rows() { return mi_env_rows("MI_CUDA_MMVQ_PAIR_ROWS", MI_MMVQ_PAIR_ROWS, 0); }
uint64_t mi_mmvq_pair_count = 0;
extern "C" uint64_t mi_cuda_mmvq_pair_launches(void) { return __atomic_load_n(&mi_mmvq_pair_count, __ATOMIC_RELAXED); }
static int mi_mmvq_warps(int mode, int64_t nchunks, int64_t n_rows, int64_t warp_rows) {
    const int by_len = nchunks > 256 ? 4 : nchunks > 128 ? 2 : 1;
    switch (mode) {
    case 0: return 0;
    case 1: return 1;
    case 2: return by_len;
    case 4: return nchunks > 128 && n_rows >= warp_rows ? 1 : 0;
    default: return nchunks > 128 && n_rows >= warp_rows ? by_len : 0;
    }
}

// MI_CUDA_MMVQ_MMA (read at every call, like MI_CUDA_MMVQ): the fewest activation rows a group must
// have to take the tensor-core kernel where it applies (mi_mmvq_mma_applies): 2..8, or 0 = never;
// unset = MI_MMVQ_MMA_DEFAULT. -1 when malformed. The kernel forms all 8 columns whatever the group's
// rows, so it pays only for wide groups: 7 won on the 1.5B / 7B / 14B shapes, 6 tied, 5 and 4 lost
// (docs/perf.md, session 14); since ffn_down's cluster split (session 20) 6 wins (nt = 6: 1.5B shape
// 1.680 -> 1.567 ms, 7B 4.760 -> 4.279; the 14B, which does not split, 9.909 -> 9.616 in session 14)
// and 4 still loses; and now 5 wins on all three (session 21, nt = 5: 1.5B shape 1.542 -> 1.483 ms,
// 7B 3.992 -> 3.914, 14B 8.542 -> 8.357; it lost on the 14B in session 14, before the one-phase
// loads of session 15). The bits are the same either way, so the threshold may depend on nt (and on
// the matrix: a lower one for the matrices that split only, tried in session 21, gained less).
// Unset, matrices on the warp kernel (a.warp > 0: the 14B shape's, 2 / 4 warps a row since session
// 22) take it from MI_MMVQ_MMA_WARP_DEFAULT rows: there the dp4a rows won up to 7 (14B shape, GPU ms
// a forward, dp4a / tensor cores: nt = 5 7.736 / 8.315, 6 8.513 / 8.836, 7 9.358 / 9.467, 8 10.700 /
// 10.046; session 22).
#define MI_MMVQ_MMA_DEFAULT 5
#define MI_MMVQ_MMA_WARP_DEFAULT 8
static int mi_mmvq_mma_from(bool warp_kernel) {
    const char *ev = getenv("MI_CUDA_MMVQ_MMA");
    if (!ev) return warp_kernel ? MI_MMVQ_MMA_WARP_DEFAULT : MI_MMVQ_MMA_DEFAULT;
    if (ev[0] == '0' && ev[1] == 0) return 0;
    return ev[0] >= '2' && ev[0] <= '8' && ev[1] == 0 ? ev[0] - '0' : -1;
}
bool mi_cuda_mmvq_can_rope(int64_t n_cols) {
    const int mode = mi_mmvq_mode(); // modes 0, 3 and 4 run rows of <= 128 chunks on the block kernel
    return (mode == 0 || mode == 3 || mode == 4) && mi_rows_per_block(n_cols / 32) % 2 == 0;
}

// Run launch(g, a) for each group of g <= 8 activation rows (t0 = 0, 8, ...), a's activations and
// outputs advanced to the group's first row: a launch streams its weights once for <= 8 rows.
template <typename F>
static int mi_mmvq_groups(mi_mmvq_args &a, const mi_block_q8a *xq, const float *xf, int64_t ldx, int nt,
                          const mi_mmvq_out *out, F launch) {
    for (int t0 = 0; t0 < nt; t0 += 8) {
        const int g = nt - t0 < 8 ? nt - t0 : 8;
        a.xq = xq ? xq + t0 * (ldx / 32) : nullptr;
        a.xf = xf ? xf + t0 * ldx : nullptr;
        a.ldx = ldx;
        a.os = *out;
        for (int i = 0; i < out->n_seg; i++) a.os.y[i] = out->y[i] + t0 * out->ldy[i];
        if (out->yq) a.os.yq = out->yq + t0 * out->ldq;
        if (out->any_rope) {
            a.os.pos = out->pos + t0;
            a.os.rope_cs = out->rope_cs + (int64_t)t0 * out->hd;
        }
        const int rc = launch(g, a);
        if (rc) return rc;
    }
    return MI_OK;
}

int mi_cuda_mmvq_seg(const mi_dtensor *w, const mi_dtensor *w_up, const mi_block_q8a *xq, const float *xf, int64_t ldx,
                     int nt, const mi_mmvq_out *out, int accumulate, cudaStream_t s) {
    if (w_up && (w_up->type != w->type || w_up->n_rows != w->n_rows || w_up->n_cols != w->n_cols))
        return mi_set_error(MI_ERR_ARG, "CUDA matmul: SwiGLU pair differs in type or shape");
    if (out->yq && (out->n_seg != 1 || w->n_rows % 32 || !out->cnt))
        return mi_set_error(MI_ERR_ARG, "CUDA matmul: quantized output needs one segment of 32k rows and counters");
    if (out->any_rope && (w_up || !mi_cuda_mmvq_can_rope(w->n_cols) || out->hd % 2))
        return mi_set_error(MI_ERR_ARG, "CUDA matmul: fused RoPE needs the block kernel with even rows per block");
    const int64_t nchunks = w->n_cols / 32;
    mi_mmvq_args a;
    a.w0 = w->data;
    a.w1 = w_up ? w_up->data : nullptr;
    a.row_bytes = w->row_bytes;
    a.n_rows = (int)w->n_rows;
    a.n_cols = (int)w->n_cols;
    a.accumulate = accumulate;
    a.rpb = mi_rows_per_block(nchunks);
    // Quantized weights: MI_CUDA_MMVQ picks the kernel (mi_mmvq_warps).
    const int mode = mi_mmvq_mode();
    if (mode < 0) return mi_set_error(MI_ERR_ARG, "MI_CUDA_MMVQ=%s: want 0, 1, 2, 3 or 4", getenv("MI_CUDA_MMVQ"));
    const int64_t warp_rows = mi_cuda_mmvq_warp_rows();
    if (warp_rows < 0)
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_MMVQ_WARP_ROWS=%s: want a row count >= 1", getenv("MI_CUDA_MMVQ_WARP_ROWS"));
    a.warp = mi_mmvq_warps(mode, nchunks, w->n_rows, warp_rows);
    a.pair = mi_mmvq_pair_mode();
    if (a.pair < 0) return mi_set_error(MI_ERR_ARG, "MI_CUDA_MMVQ_PAIR=%s: want 0 or 1", getenv("MI_CUDA_MMVQ_PAIR"));
    const int64_t pair_rows = mi_mmvq_pair_rows();
    if (pair_rows < 0)
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_MMVQ_PAIR_ROWS=%s: want a row count >= 0", getenv("MI_CUDA_MMVQ_PAIR_ROWS"));
    if (!a.warp && w->n_rows < pair_rows) a.pair = 0;
    const int mma_from = mi_mmvq_mma_from(a.warp > 0);
    if (mma_from < 0)
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_MMVQ_MMA=%s: want 0 (off) or 2..8 (fewest activation rows)",
                            getenv("MI_CUDA_MMVQ_MMA"));
    if (mi_mmvq_mma_split_mode() < 0) // read by mmvq_mma.cu's launch; refused here, clearly
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_MMVQ_MMA_SPLIT=%s: want 0, 1 or 2", getenv("MI_CUDA_MMVQ_MMA_SPLIT"));
    const bool mma = mma_from && xq && mi_mmvq_mma_applies(w->type, w->n_rows, w->n_cols, out->any_rope);
    return mi_mmvq_groups(a, xq, xf, ldx, nt, out, [&](int g, const mi_mmvq_args &ga) {
        if (!mma || g < mma_from) return mi_launch_type(w->type, w_up != nullptr, g, ga, s);
        const cudaError_t e = mi_mmvq_mma_launch(w_up != nullptr, g, ga, s);
        return e == cudaSuccess ? MI_OK : mi_set_error(MI_ERR_CUDA, "launch mmvq (tensor cores): %s", cudaGetErrorString(e));
    });
}

int mi_cuda_mmvq(const mi_dtensor *w, const mi_dtensor *w_up, const mi_block_q8a *xq, const float *xf, int64_t ldx,
                 int nt, float *y, int64_t ldy, const float *bias, int accumulate, cudaStream_t s) {
    mi_mmvq_out o;
    memset(&o, 0, sizeof o);
    o.n_seg = 1;
    o.end[0] = (int)w->n_rows;
    o.y[0] = y;
    o.ldy[0] = ldy;
    o.bias[0] = bias;
    return mi_cuda_mmvq_seg(w, w_up, xq, xf, ldx, nt, &o, accumulate, s);
}

bool mi_cuda_mmvq_mixed_applies(const mi_dtensor *w0, const mi_dtensor *w1) {
    const int mode = mi_mmvq_mode();
    const int64_t nchunks = w0->n_cols / 32, warp_rows = mi_cuda_mmvq_warp_rows();
    return warp_rows > 0 && mi_mmvq_mixed_pair(w0->type, w1->type) && w0->n_cols == w1->n_cols &&
           (mode == 0 || mode == 3 || mode == 4) && mi_mmvq_warps(mode, nchunks, w0->n_rows, warp_rows) == 0 &&
           mi_mmvq_warps(mode, nchunks, w1->n_rows, warp_rows) == 0 &&
           w0->n_rows % mi_rows_per_block(nchunks) == 0;
}

int mi_cuda_mmvq_mixed(const mi_dtensor *w0, const mi_dtensor *w1, const mi_block_q8a *xq, int64_t ldx, int nt,
                       const mi_mmvq_out *out, int accumulate, cudaStream_t s) {
    if (!mi_cuda_mmvq_mixed_applies(w0, w1))
        return mi_set_error(MI_ERR_ARG, "CUDA matmul: no mixed launch for types %d + %d here", w0->type, w1->type);
    if (out->yq) return mi_set_error(MI_ERR_ARG, "CUDA matmul: a mixed launch has no quantized output");
    if (out->any_rope && (!mi_cuda_mmvq_can_rope(w0->n_cols) || out->hd % 2)) // as mi_cuda_mmvq_seg
        return mi_set_error(MI_ERR_ARG, "CUDA matmul: fused RoPE needs the block kernel with even rows per block");
    mi_mmvq_args a;
    a.w0 = w0->data;
    a.w1 = nullptr;
    a.row_bytes = w0->row_bytes;
    a.n_rows = (int)w0->n_rows;
    a.n_cols = (int)w0->n_cols;
    a.accumulate = accumulate;
    a.rpb = mi_rows_per_block(w0->n_cols / 32);
    a.warp = 0;
    a.pair = 0;
    return mi_mmvq_groups(a, xq, nullptr, ldx, nt, out, [&](int g, const mi_mmvq_args &ga) {
        const cudaError_t e = mi_mmvq_mixed_launch(w0->type, w1->type, g, ga, w1->data, w1->row_bytes, (int)w1->n_rows, s);
        return e == cudaSuccess ? MI_OK : mi_set_error(MI_ERR_CUDA, "launch mmvq (mixed): %s", cudaGetErrorString(e));
    });
}
