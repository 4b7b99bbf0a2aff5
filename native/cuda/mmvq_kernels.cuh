// MMVQ: one launch streams a quantized weight matrix once for NT (1..8) activation rows.
// Block = 128 threads serving rpb rows (rpb = 4, 2 or 1 by row length, a function of n_cols only,
// so the reduction order never depends on NT): each of the tpr = 128/rpb threads of a row takes
// 32-wide chunks c = j, j + tpr, ... and sums their contributions in f32; then a warp butterfly
// and, for tpr > 32, a fixed-order sum over the row's warps. Per chunk (as cpu/quants.c):
//   (dw * a.d) * (float)(sc0*dot(q[0:16], a[0:16]) + sc1*dot(q[16:32], a[16:32])) + mw * a.s
// The kernel templates, included by one generated translation unit per weight type
// (CMakeLists.txt: mmvq_<type>.cu, so the types compile in parallel) and by mmvq_mixed.cu.
#ifndef MI_CUDA_MMVQ_KERNELS_CUH
#define MI_CUDA_MMVQ_KERNELS_CUH
#include "mmvq.cuh"
#include "qtypes.cuh"

namespace {

constexpr int MI_MMVQ_THREADS = 128;

__device__ __forceinline__ float mi_silu_mul(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// Segment of (virtual) row r and its fused-RoPE mode, first row, output and bias (constant
// indices only, so the parameter struct stays out of local memory).
struct mi_seg_sel {
    int mode, base;
    float *y;
    int64_t ldy;
    const float *bias;
    __half *cache;
};
__device__ __forceinline__ mi_seg_sel mi_seg_of(const mi_mmvq_out &os, int r) {
    mi_seg_sel s = {os.rope[0], 0, os.y[0], os.ldy[0], os.bias[0], os.cache[0]};
#pragma unroll
    for (int i = 1; i < MI_MMVQ_MAX_SEG; i++)
        if (i < os.n_seg && r >= os.end[i - 1]) s = {os.rope[i], os.end[i - 1], os.y[i], os.ldy[i], os.bias[i], os.cache[i]};
    return s;
}

// Matrix row computed as virtual row r: rotated NEOX segments take a head's rows in pair order
// (virtual 2m, 2m + 1 = dims m, m + hd/2); everything else in order.
__device__ __forceinline__ int mi_act_row(const mi_mmvq_out &os, int r) {
    if (!os.any_rope || !os.neox) return r;
    const mi_seg_sel s = mi_seg_of(os, r);
    if (s.mode != 1 && s.mode != 2) return r;
    const int l = r - s.base, n = l % os.hd;
    return s.base + (l - n) + (n & 1) * (os.hd / 2) + n / 2;
}

// Before the PDL wait (common.cuh): pull this block's weight rows (virtual r0 .. r0 + n - 1, matrix
// rows less row_off: see mi_mmvq_block) towards L2 while the previous kernel still runs (weights
// are constants, so this may precede the wait), then wait for the activations.
__device__ __forceinline__ void mi_mmvq_prologue(const uint8_t *w0, const uint8_t *w1, int64_t row_bytes, int r0,
                                                 int n, int n_rows, const mi_mmvq_out &os, int row_off = 0) {
    if (n > n_rows - r0) n = n_rows - r0;
    if (n > 0 && !os.any_rope) {
        mi_prefetch_l2(w0 + (int64_t)(r0 - row_off) * row_bytes, (int64_t)n * row_bytes);
        if (w1) mi_prefetch_l2(w1 + (int64_t)(r0 - row_off) * row_bytes, (int64_t)n * row_bytes);
    } else {
        for (int k = 0; k < n; k++)
            mi_prefetch_l2(w0 + (int64_t)(mi_act_row(os, r0 + k) - row_off) * row_bytes, row_bytes);
    }
    mi_pdl_wait();
    mi_pdl_trigger();
}

// Fused epilogue of a q/k/v launch (os.any_rope), called by every thread of the block: row k of
// the block (virtual row r, matrix row ra) is finished by its thread j == 0 (active). Values
// (+ bias) meet in shared memory; the even row of each rotated pair writes both rotated outputs.
template <int NT>
__device__ __forceinline__ void mi_epilogue_rope(const float *acc, int r, int ra, int k, bool active,
                                                 const mi_mmvq_out &os, int accumulate) {
    __shared__ float pv[4][NT]; // rows per block <= 4
    mi_seg_sel s = {0, 0, nullptr, 0, nullptr, nullptr};
    if (active) {
        s = mi_seg_of(os, r);
#pragma unroll
        for (int t = 0; t < NT; t++) pv[k][t] = s.bias ? __fadd_rn(acc[t], s.bias[ra - s.base]) : acc[t];
    }
    __syncthreads();
    if (!active) return;
    const int l = ra - s.base; // the matrix row within its segment
    // Every load of all NT rows before any store: a load after a store through another pointer
    // waits for it (the compiler cannot rule out aliasing), which made NT dependent round trips.
    if (s.mode == 0) {
        float old[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) old[t] = accumulate ? s.y[t * s.ldy + l] : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) s.y[t * s.ldy + l] = accumulate ? __fadd_rn(old[t], pv[k][t]) : pv[k][t];
    } else if (s.mode == 3) {
        int p[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) p[t] = os.pos[t];
#pragma unroll
        for (int t = 0; t < NT; t++) s.cache[(int64_t)p[t] * os.ld_cache + l] = __float2half_rn(pv[k][t]);
    } else if (((r - s.base) & 1) == 0) {
        const int n = (r - s.base) % os.hd, i = n / 2, half = os.hd / 2, h0 = (r - s.base) - n;
        const int a = os.neox ? i : 2 * i, b = os.neox ? i + half : 2 * i + 1;
        float cs[NT], sn[NT];
        int p[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            cs[t] = os.rope_cs[t * os.hd + i];
            sn[t] = os.rope_cs[t * os.hd + half + i];
            p[t] = s.mode == 2 ? os.pos[t] : 0;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float x0 = pv[k][t], x1 = pv[k + 1][t];
            const float y0 = __fsub_rn(__fmul_rn(x0, cs[t]), __fmul_rn(x1, sn[t]));
            const float y1 = __fadd_rn(__fmul_rn(x0, sn[t]), __fmul_rn(x1, cs[t]));
            if (s.mode == 1) {
                s.y[t * s.ldy + h0 + a] = y0;
                s.y[t * s.ldy + h0 + b] = y1;
            } else {
                __half *d = s.cache + (int64_t)p[t] * os.ld_cache + h0;
                d[a] = __float2half_rn(y0);
                d[b] = __float2half_rn(y1);
            }
        }
    }
}

// One chunk's f32 term from its exact integer dot isum and the activation block's d and s: the
// formula every mat-vec kernel uses (here and mmvq_mma.cu), so their rows are bitwise equal.
template <int T> __device__ __forceinline__ float mi_chunk_term(float dw, float mw, float ad, float as, int isum) {
    float r = __fmul_rn(__fmul_rn(dw, ad), (float)isum);
    if (mi_qt<T>::HAS_MIN) r = __fadd_rn(r, __fmul_rn(mw, as));
    return r;
}

// The dp4a kernels' integer dot of a chunk: sc0 * dot(q[0:16], a[0:16]) + sc1 * dot(q[16:32], a[16:32]),
// exact. q4_K (sc0 = sc1 = 1) takes one chain of 8 dp4a: the same integer, one add fewer. (Taken by every
// type of one scale a chunk, it slowed the 0.5B shape, q5_0 / q8_0 rows of 28 chunks: nt = 1 0.598 ->
// 0.610 ms; a thread's one chunk then waits on the longer chain.) qsh: the chunk's weights are the bytes
// 2^qsh q (mi_load_dp; 0 but for q4_K's high-nibble chunks).
// MI_MMVQ_DP_OLD (compile time, A/B timing): 1 builds the two-chain dot, 2 the shifted loads, 3 both
// (session 32's kernels, but for q4_K's dp4a taking its weight bytes unsigned: the same integers).
// H200, GPU ms a forward, 3 -> 0 (docs/perf.md, session 33): 1.5B shape nt = 1 0.958 -> 0.949, nt = 2
// 1.061 -> 1.042, nt = 4 1.262 -> 1.264; 7B 2.342 -> 2.303, 2.677 -> 2.649, 3.368 -> 3.358; 14B nt = 4
// 6.382 -> 6.188; logits digests unchanged.
#ifndef MI_MMVQ_DP_OLD
#define MI_MMVQ_DP_OLD 0
#endif
__device__ __forceinline__ int mi_dp4a_us(uint32_t a, int b, int c) { // unsigned bytes of a, signed of b
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
template <int T> __device__ __forceinline__ int mi_dp4a_q(int q, int a, int c) { // q4_K's in-place bytes: unsigned
    return T == MI_TYPE_Q4_K ? mi_dp4a_us((uint32_t)q, a, c) : __dp4a(q, a, c);
}
template <int T>
__device__ __forceinline__ int mi_chunk_isum(const mi_chunk &ch, int qsh, int2 a0, int2 a1, int2 a2, int2 a3) {
    if constexpr (T == MI_TYPE_Q4_K && !(MI_MMVQ_DP_OLD & 1)) {
        const int b[8] = {a0.x, a0.y, a1.x, a1.y, a2.x, a2.y, a3.x, a3.y};
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) s = mi_dp4a_q<T>(ch.q[i], b[i], s);
        return s >> qsh; // a multiple of 2^qsh: exact
    } else {
        const int s0 = mi_dp4a_q<T>(ch.q[3], a1.y, mi_dp4a_q<T>(ch.q[2], a1.x, mi_dp4a_q<T>(ch.q[1], a0.y, mi_dp4a_q<T>(ch.q[0], a0.x, 0))));
        const int s1 = mi_dp4a_q<T>(ch.q[7], a3.y, mi_dp4a_q<T>(ch.q[6], a3.x, mi_dp4a_q<T>(ch.q[5], a2.y, mi_dp4a_q<T>(ch.q[4], a2.x, 0))));
        return (ch.sc0 * s0 + ch.sc1 * s1) >> qsh;
    }
}

// Chunk k of the block at b for the dp4a kernels: mi_qt<T>::load, except that q4_K's high-nibble chunks
// keep their nibbles in place (bytes 16 q: one AND a word instead of a shift and an AND; qsh = 4 tells
// mi_chunk_isum to shift the dot back). Same integers, so the same bits.
template <int T> __device__ __forceinline__ void mi_load_dp(const uint8_t *b, int k, mi_chunk &c, int &qsh) {
    if constexpr (T == MI_TYPE_Q4_K && !(MI_MMVQ_DP_OLD & 2)) {
        uint32_t v[8];
        mi_qt<MI_TYPE_Q4_K>::words(b, k, v);
        qsh = 4 * (k & 1);
        const uint32_t m = 0x0F0F0F0Fu << qsh;
#pragma unroll
        for (int j = 0; j < 8; j++) c.q[j] = (int)(v[j] & m);
        mi_kquant_head(b, k, c);
    } else {
        mi_qt<T>::load(b, k, c);
        qsh = 0;
    }
}

template <int T, int NT>
__device__ __forceinline__ void mi_chunk_dot(const mi_chunk &ch, int qsh, int c, const mi_block_q8a *xq, int64_t ldxb,
                                             float *acc) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const mi_block_q8a *a = xq + t * ldxb + c;
        const int2 *aq = (const int2 *)a->qs;
        const int isum = mi_chunk_isum<T>(ch, qsh, aq[0], aq[1], aq[2], aq[3]);
        acc[t] = __fadd_rn(acc[t], mi_chunk_term<T>(ch.dw, ch.mw, a->d, a->s, isum));
    }
}

template <int T, int NT>
__device__ __forceinline__ void mi_row_chunk(const uint8_t *row, int c, const mi_block_q8a *xq, int64_t ldxb,
                                             float *acc) {
    mi_chunk ch;
    int qsh;
    mi_load_dp<T>(row + (int64_t)(c / mi_qt<T>::CPB) * mi_qt<T>::BB, c % mi_qt<T>::CPB, ch, qsh);
    mi_chunk_dot<T, NT>(ch, qsh, c, xq, ldxb, acc);  // one chunk formula for every kernel (bitwise rows)
}

// mi_chunk_dot for two weight rows' chunks c at once: each activation block is loaded once for both
// (the pair kernel); every row's arithmetic is mi_chunk_dot's, so the same bits.
template <int T, int NT>
__device__ __forceinline__ void mi_chunk_dot2(const mi_chunk &ca, const mi_chunk &cb, int qsh, int c,
                                              const mi_block_q8a *xq, int64_t ldxb, float *acca, float *accb) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const mi_block_q8a *a = xq + t * ldxb + c;
        const int2 *aq = (const int2 *)a->qs;
        const int2 a0 = aq[0], a1 = aq[1], a2 = aq[2], a3 = aq[3];
        const float ad = a->d, as = a->s;
        acca[t] = __fadd_rn(acca[t], mi_chunk_term<T>(ca.dw, ca.mw, ad, as, mi_chunk_isum<T>(ca, qsh, a0, a1, a2, a3)));
        accb[t] = __fadd_rn(accb[t], mi_chunk_term<T>(cb.dw, cb.mw, ad, as, mi_chunk_isum<T>(cb, qsh, a0, a1, a2, a3)));
    }
}

// Sum acc[NT] over the tpr threads of each row; the row's thread j == 0 gets the result.
template <int NT>
__device__ __forceinline__ void mi_row_reduce(float *acc, int tpr, float (*sh)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = mi_warp_sum(acc[t]);
    if (tpr > 32) {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) sh[warp][t] = acc[t];
        __syncthreads();
        if (threadIdx.x % tpr == 0) {
            const int w0 = warp, nw = tpr / 32;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = sh[w0][t];
                for (int w = 1; w < nw; w++) v = __fadd_rn(v, sh[w0 + w][t]);
                acc[t] = v;
            }
        }
        __syncthreads();
    }
}

// Segment of output row r for the plain epilogue: its output, stride, bias and row within it
// (constant indices only, so the parameter struct stays out of local memory).
struct mi_out_row {
    float *y;
    int64_t ldy;
    const float *bias;
    int r;
};
__device__ __forceinline__ mi_out_row mi_out_row_of(const mi_mmvq_out &os, int r) {
    mi_out_row o = {os.y[0], os.ldy[0], os.bias[0], r};
#pragma unroll
    for (int i = 1; i < MI_MMVQ_MAX_SEG; i++)
        if (i < os.n_seg && r >= os.end[i - 1]) o = {os.y[i], os.ldy[i], os.bias[i], r - os.end[i - 1]};
    return o;
}

// What the plain epilogue of row r reads besides the sums: its bias and, when accumulating, the NT
// outputs it adds to (the residual stream). Loaded by the finishing thread right after the PDL
// wait, so that these round trips overlap the weight stream instead of following the reduction,
// and all NT at once (loads after the epilogue's stores would each wait for the store before).
// Only this thread writes those outputs, so the early read sees what the epilogue would.
template <int NT> struct mi_epi_in {
    float old[NT];
    float b;
};
template <int NT>
__device__ __forceinline__ void mi_epilogue_load(int r, bool active, const mi_mmvq_out &os, int accumulate,
                                                 mi_epi_in<NT> &in) {
    in.b = 0.0f;
#pragma unroll
    for (int t = 0; t < NT; t++) in.old[t] = 0.0f;
    if (!active) return;
    const mi_out_row o = mi_out_row_of(os, r);
    if (o.bias) in.b = o.bias[o.r];
    if (accumulate)
#pragma unroll
        for (int t = 0; t < NT; t++) in.old[t] = o.y[t * o.ldy + o.r];
}

template <int NT>
__device__ __forceinline__ void mi_epilogue(const float *acc, const float *acc_up, bool glu, int r,
                                            const mi_mmvq_out &os, int accumulate, const mi_epi_in<NT> &in) {
    const mi_out_row o = mi_out_row_of(os, r);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = glu ? mi_silu_mul(acc[t], acc_up[t]) : acc[t];
        if (o.bias) v = __fadd_rn(v, in.b);
        o.y[t * o.ldy + o.r] = accumulate ? __fadd_rn(in.old[t], v) : v;
    }
}

// After the epilogue (os.yq set): this block's rows r0.. lie in one 32-row group (rows per block
// divide 32); the last of the group's blocks to finish quantizes the group's 32 outputs of every
// activation row, exactly as the plain quantize kernel would (same function, same floats).
template <int NT>
__device__ __forceinline__ void mi_group_quant(const mi_mmvq_out &os, int r0, int rows_per_block) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    const int g = r0 / 32;
    if (threadIdx.x == 0) {
        last = atomicAdd(os.cnt + g, 1) == 32 / rows_per_block - 1;
        if (last) os.cnt[g] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    constexpr int W = MI_MMVQ_THREADS / 32, K = (NT + W - 1) / W; // both kernels' blocks (static_assert below)
    float v[K];                                                   // loads before the stores, as above
#pragma unroll
    for (int k = 0; k < K; k++) v[k] = warp + k * W < NT ? __ldcg(os.y[0] + (warp + k * W) * os.ldy[0] + 32 * g + lane) : 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (warp + k * W < NT) mi_quant_chunk_warp(v[k], os.yq + (warp + k * W) * os.ldq + g, lane);
}

// The block kernel's body for the block's virtual rows blockIdx.x * rpb + [0, rpb) below n_rows:
// virtual row r is matrix row mi_act_row(os, r) - row_off of w0 (w1). row_off != 0: the second,
// differently typed part of a mixed q/k/v launch (mi_mmvq_mixed_kernel), whose rows follow the
// first part's in the output segments.
template <int T, int NT, bool GLU>
__device__ __forceinline__ void mi_mmvq_block(const uint8_t *__restrict__ w0, const uint8_t *__restrict__ w1,
                                              int64_t row_bytes, int row_off, int n_rows, int nchunks,
                                              const mi_block_q8a *__restrict__ xq, int64_t ldxb, const mi_mmvq_out &os,
                                              int accumulate, int rpb) {
    __shared__ float sh[GLU ? 2 : 1][MI_MMVQ_THREADS / 32][NT];
    const int tpr = MI_MMVQ_THREADS / rpb;
    const int j = threadIdx.x % tpr;
    const int r = blockIdx.x * rpb + threadIdx.x / tpr;
    const int ra = r < n_rows ? mi_act_row(os, r) : r;
    mi_mmvq_prologue(w0, GLU ? w1 : nullptr, row_bytes, blockIdx.x * rpb, rpb, n_rows, os, row_off);
    mi_epi_in<NT> in;
    mi_epilogue_load<NT>(r, GLU || !os.any_rope ? j == 0 && r < n_rows : false, os, accumulate, in);
    float acc[NT], acc1[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = acc1[t] = 0.0f;
    if (r < n_rows) {
        const uint8_t *row0 = w0 + (int64_t)(ra - row_off) * row_bytes;
        const uint8_t *row1 = GLU ? w1 + (int64_t)(ra - row_off) * row_bytes : nullptr;
        // Two chunks per step so their loads are in flight together (order of the sum unchanged).
#pragma unroll 2
        for (int c = j; c < nchunks; c += tpr) {
            mi_row_chunk<T, NT>(row0, c, xq, ldxb, acc);
            if (GLU) mi_row_chunk<T, NT>(row1, c, xq, ldxb, acc1);
        }
    }
    mi_row_reduce<NT>(acc, tpr, sh[0]);
    if (GLU) mi_row_reduce<NT>(acc1, tpr, sh[GLU ? 1 : 0]);
    if (!GLU && os.any_rope)
        mi_epilogue_rope<NT>(acc, r, ra, threadIdx.x / tpr, j == 0 && r < n_rows, os, accumulate);
    else if (j == 0 && r < n_rows)
        mi_epilogue<NT>(acc, acc1, GLU, r, os, accumulate, in);
    if (os.yq) mi_group_quant<NT>(os, blockIdx.x * rpb, rpb);
}

template <int T, int NT, bool GLU>
__global__ void __launch_bounds__(MI_MMVQ_THREADS)
    mi_mmvq_kernel(const uint8_t *__restrict__ w0, const uint8_t *__restrict__ w1, int64_t row_bytes, int n_rows,
                   int nchunks, const mi_block_q8a *__restrict__ xq, int64_t ldxb, const mi_mmvq_out os, int accumulate, int rpb) {
    mi_mmvq_block<T, NT, GLU>(w0, w1, row_bytes, 0, n_rows, nchunks, xq, ldxb, os, accumulate, rpb);
}

// Pair kernel (by default for plain block-kernel launches of nt >= 2: no GLU, fused RoPE or
// quantized output; MI_CUDA_MMVQ_PAIR=0: the block kernel): the block kernel with each thread
// serving its slot j of two rows, k and rpb + k of the block's 2 rpb rows, so every activation
// block it loads serves two weight rows (a q4_K chunk is 18 weight bytes against 40 activation
// bytes a row: at nt = 4, 160). Each row keeps the block kernel's slots, chunk order, reduction and
// epilogue: the same bits. The gate / up launch already serves two rows a thread (GLU). H200,
// GPU ms a forward (docs/perf.md, session 31): 1.5B shape nt = 4 1.411 -> 1.267, nt = 8 1.752 ->
// 1.719; 7B nt = 4 3.670 -> 3.362, nt = 8 5.149 -> 4.823; 0.5B within +-1.3%. (The warp kernel's
// matrices, the 14B shape's, take mi_mmvq_warp_pair_kernel: nt = 4 7.087 -> 6.389.)
template <int T, int NT>
__global__ void __launch_bounds__(MI_MMVQ_THREADS)
    mi_mmvq_pair_kernel(const uint8_t *__restrict__ w0, int64_t row_bytes, int n_rows, int nchunks,
                        const mi_block_q8a *__restrict__ xq, int64_t ldxb, const mi_mmvq_out os, int accumulate,
                        int rpb) {
    __shared__ float sh[2][MI_MMVQ_THREADS / 32][NT];
    const int tpr = MI_MMVQ_THREADS / rpb, j = threadIdx.x % tpr, k = threadIdx.x / tpr;
    const int r0 = blockIdx.x * 2 * rpb, ra = r0 + k, rb = r0 + rpb + k;
    mi_mmvq_prologue(w0, nullptr, row_bytes, r0, 2 * rpb, n_rows, os);
    mi_epi_in<NT> ia, ib;
    mi_epilogue_load<NT>(ra, j == 0 && ra < n_rows, os, accumulate, ia);
    mi_epilogue_load<NT>(rb, j == 0 && rb < n_rows, os, accumulate, ib);
    float acca[NT], accb[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acca[t] = accb[t] = 0.0f;
    if (ra < n_rows) {
        constexpr int CPB = mi_qt<T>::CPB, BB = mi_qt<T>::BB;
        const uint8_t *rowa = w0 + (int64_t)ra * row_bytes;
        const uint8_t *rowb = w0 + (int64_t)(rb < n_rows ? rb : ra) * row_bytes; // no row b: a again, dropped
#pragma unroll 2
        for (int c = j; c < nchunks; c += tpr) {
            mi_chunk cha, chb;
            int qsh; // the same for both rows (a function of c)
            mi_load_dp<T>(rowa + (int64_t)(c / CPB) * BB, c % CPB, cha, qsh);
            mi_load_dp<T>(rowb + (int64_t)(c / CPB) * BB, c % CPB, chb, qsh);
            mi_chunk_dot2<T, NT>(cha, chb, qsh, c, xq, ldxb, acca, accb);
        }
    }
    mi_row_reduce<NT>(acca, tpr, sh[0]);
    mi_row_reduce<NT>(accb, tpr, sh[1]);
    if (j == 0 && ra < n_rows) mi_epilogue<NT>(acca, acca, false, ra, os, accumulate, ia);
    if (j == 0 && rb < n_rows) mi_epilogue<NT>(accb, accb, false, rb, os, accumulate, ib);
}

// Mixed q/k/v launch: virtual rows [0, n_rows0) are rows of w0 (type T0: q and k stacked), rows
// [n_rows0, n_rows) rows of w1 (type T1: v), in one launch instead of two. n_rows0 is a multiple
// of rpb, so each block serves one part and runs that part's block-kernel body unchanged: the
// same bits as the two launches (mi_cuda_mmvq_mixed).
template <int T0, int T1, int NT>
__global__ void __launch_bounds__(MI_MMVQ_THREADS)
    mi_mmvq_mixed_kernel(const uint8_t *__restrict__ w0, int64_t row_bytes0, int n_rows0, const uint8_t *__restrict__ w1,
                         int64_t row_bytes1, int n_rows, int nchunks, const mi_block_q8a *__restrict__ xq, int64_t ldxb,
                         const mi_mmvq_out os, int accumulate, int rpb) {
    if ((int)blockIdx.x * rpb < n_rows0)
        mi_mmvq_block<T0, NT, false>(w0, nullptr, row_bytes0, 0, n_rows0, nchunks, xq, ldxb, os, accumulate, rpb);
    else
        mi_mmvq_block<T1, NT, false>(w1, nullptr, row_bytes1, n_rows0, n_rows, nchunks, xq, ldxb, os, accumulate, rpb);
}

// Warp-per-row kernel (MI_CUDA_MMVQ=1 or 2; by default for rows of > 128 chunks in matrices of >= 4096 rows,
// mmvq.cu's mi_mmvq_warps; the block kernel above otherwise): each of the row's wpr warps, lane l, takes
// chunks l, l + 32, l + 64, ... in order and accumulates them in f32, then a warp butterfly; no
// shared memory or block barrier. U chunks per lane are loaded before any is used so that U
// independent weight loads per lane are in flight; U only changes scheduling, never the order of
// any sum, so U may depend on NT (fewer registers for wide NT) and rows stay bitwise equal.
constexpr int MI_MMVQ_WARPS = 4;
static_assert(MI_MMVQ_WARPS * 32 == MI_MMVQ_THREADS, "mi_group_quant: one block size for both kernels");


template <int T, int NT, bool GLU, int U>
__global__ void __launch_bounds__(MI_MMVQ_WARPS * 32)
    mi_mmvq_warp_kernel(const uint8_t *__restrict__ w0, const uint8_t *__restrict__ w1, int64_t row_bytes,
                        int n_rows, int nchunks, const mi_block_q8a *__restrict__ xq, int64_t ldxb,
                        const mi_mmvq_out os, int accumulate, int wpr) {
    // wpr (1, 2 or 4) warps per row, a function of the row length only.
    __shared__ float sh[GLU ? 2 : 1][MI_MMVQ_WARPS][NT];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int tpr = 32 * wpr, j = (warp % wpr) * 32 + lane;
    const int r = blockIdx.x * (MI_MMVQ_WARPS / wpr) + warp / wpr;
    mi_mmvq_prologue(w0, GLU ? w1 : nullptr, row_bytes, blockIdx.x * (MI_MMVQ_WARPS / wpr), MI_MMVQ_WARPS / wpr, n_rows,
                     os); // (never fused RoPE: mi_cuda_mmvq_can_rope)
    mi_epi_in<NT> in;
    mi_epilogue_load<NT>(r, j == 0 && r < n_rows, os, accumulate, in);
    float acc[NT], acc1[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = acc1[t] = 0.0f;
    if (r < n_rows) {
        const uint8_t *row0 = w0 + (int64_t)r * row_bytes;
        const uint8_t *row1 = GLU ? w1 + (int64_t)r * row_bytes : nullptr;
        constexpr int CPB = mi_qt<T>::CPB, BB = mi_qt<T>::BB;
        for (int c0 = j; c0 < nchunks; c0 += tpr * U) {
            mi_chunk ch[U], ch1[GLU ? U : 1];
            int qsh[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + tpr * u;
                if (c < nchunks) {
                    mi_load_dp<T>(row0 + (int64_t)(c / CPB) * BB, c % CPB, ch[u], qsh[u]);
                    if (GLU) mi_load_dp<T>(row1 + (int64_t)(c / CPB) * BB, c % CPB, ch1[GLU ? u : 0], qsh[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + tpr * u;
                if (c < nchunks) {
                    mi_chunk_dot<T, NT>(ch[u], qsh[u], c, xq, ldxb, acc);
                    if (GLU) mi_chunk_dot<T, NT>(ch1[GLU ? u : 0], qsh[u], c, xq, ldxb, acc1);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        acc[t] = mi_warp_sum(acc[t]);
        if (GLU) acc1[t] = mi_warp_sum(acc1[t]);
    }
    if (wpr > 1) { // fixed-order sum over the row's warps
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                sh[0][warp][t] = acc[t];
                if (GLU) sh[GLU ? 1 : 0][warp][t] = acc1[t];
            }
        __syncthreads();
        if (j == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = sh[0][warp][t], v1 = GLU ? sh[GLU ? 1 : 0][warp][t] : 0.0f;
                for (int w = 1; w < wpr; w++) {
                    v = __fadd_rn(v, sh[0][warp + w][t]);
                    if (GLU) v1 = __fadd_rn(v1, sh[GLU ? 1 : 0][warp + w][t]);
                }
                acc[t] = v;
                acc1[t] = v1;
            }
    }
    if (j == 0 && r < n_rows) mi_epilogue<NT>(acc, acc1, GLU, r, os, accumulate, in);
    if (os.yq) mi_group_quant<NT>(os, blockIdx.x * (MI_MMVQ_WARPS / wpr), MI_MMVQ_WARPS / wpr);
}

// Chunks in flight per lane: more for few activation rows, fewer where NT (and GLU) cost registers.
template <int NT, bool GLU> constexpr int mi_mmvq_unroll() {
    return NT <= 2 ? (GLU ? 2 : 4) : NT <= 4 ? (GLU ? 1 : 2) : 1;
}

// The warp kernel's pair variant (as mi_mmvq_pair_kernel for the block kernel; plain launches of
// nt >= 2, MI_CUDA_MMVQ_PAIR): the row's wpr warps, lane l, take chunks l, l + 32, ... of two rows,
// k and rpb + k of the block's 2 rpb rows (rpb = MI_MMVQ_WARPS / wpr), each activation block loaded
// once for both; each row keeps the warp kernel's chunks, butterfly and fixed-order sum over its
// warps: the same bits. U chunks a lane in flight as for a GLU launch (two rows a lane).
template <int T, int NT, int U>
__global__ void __launch_bounds__(MI_MMVQ_WARPS * 32)
    mi_mmvq_warp_pair_kernel(const uint8_t *__restrict__ w0, int64_t row_bytes, int n_rows, int nchunks,
                             const mi_block_q8a *__restrict__ xq, int64_t ldxb, const mi_mmvq_out os, int accumulate,
                             int wpr) {
    __shared__ float sh[2][MI_MMVQ_WARPS][NT];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, rpb = MI_MMVQ_WARPS / wpr;
    const int tpr = 32 * wpr, j = (warp % wpr) * 32 + lane;
    const int r0 = blockIdx.x * 2 * rpb, ra = r0 + warp / wpr, rb = ra + rpb;
    mi_mmvq_prologue(w0, nullptr, row_bytes, r0, 2 * rpb, n_rows, os); // (never fused RoPE)
    mi_epi_in<NT> ia, ib;
    mi_epilogue_load<NT>(ra, j == 0 && ra < n_rows, os, accumulate, ia);
    mi_epilogue_load<NT>(rb, j == 0 && rb < n_rows, os, accumulate, ib);
    float acca[NT], accb[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acca[t] = accb[t] = 0.0f;
    if (ra < n_rows) {
        const uint8_t *rowa = w0 + (int64_t)ra * row_bytes;
        const uint8_t *rowb = w0 + (int64_t)(rb < n_rows ? rb : ra) * row_bytes; // no row b: a again, dropped
        constexpr int CPB = mi_qt<T>::CPB, BB = mi_qt<T>::BB;
        for (int c0 = j; c0 < nchunks; c0 += tpr * U) {
            mi_chunk cha[U], chb[U];
            int qsh[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + tpr * u;
                if (c < nchunks) {
                    mi_load_dp<T>(rowa + (int64_t)(c / CPB) * BB, c % CPB, cha[u], qsh[u]);
                    mi_load_dp<T>(rowb + (int64_t)(c / CPB) * BB, c % CPB, chb[u], qsh[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + tpr * u;
                if (c < nchunks) mi_chunk_dot2<T, NT>(cha[u], chb[u], qsh[u], c, xq, ldxb, acca, accb);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        acca[t] = mi_warp_sum(acca[t]);
        accb[t] = mi_warp_sum(accb[t]);
    }
    if (wpr > 1) { // fixed-order sum over the row's warps, as the warp kernel's
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                sh[0][warp][t] = acca[t];
                sh[1][warp][t] = accb[t];
            }
        __syncthreads();
        if (j == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float va = sh[0][warp][t], vb = sh[1][warp][t];
                for (int w = 1; w < wpr; w++) {
                    va = __fadd_rn(va, sh[0][warp + w][t]);
                    vb = __fadd_rn(vb, sh[1][warp + w][t]);
                }
                acca[t] = va;
                accb[t] = vb;
            }
    }
    if (j == 0 && ra < n_rows) mi_epilogue<NT>(acca, acca, false, ra, os, accumulate, ia);
    if (j == 0 && rb < n_rows) mi_epilogue<NT>(accb, accb, false, rb, os, accumulate, ib);
}

// F32 / F16 weights times f32 activations (tied f16 embeddings as the LM head, tiny models).
template <int T, int NT, bool GLU>
__global__ void __launch_bounds__(MI_MMVQ_THREADS)
    mi_mmv_f_kernel(const uint8_t *__restrict__ w0, const uint8_t *__restrict__ w1, int64_t row_bytes, int n_rows,
                    int n_cols, const float *__restrict__ xf, int64_t ldx, const mi_mmvq_out os, int accumulate, int rpb) {
    __shared__ float sh[GLU ? 2 : 1][MI_MMVQ_THREADS / 32][NT];
    const int tpr = MI_MMVQ_THREADS / rpb;
    const int j = threadIdx.x % tpr;
    const int r = blockIdx.x * rpb + threadIdx.x / tpr;
    const int ra = r < n_rows ? mi_act_row(os, r) : r;
    mi_mmvq_prologue(w0, GLU ? w1 : nullptr, row_bytes, blockIdx.x * rpb, rpb, n_rows, os);
    mi_epi_in<NT> in;
    mi_epilogue_load<NT>(r, GLU || !os.any_rope ? j == 0 && r < n_rows : false, os, accumulate, in);
    float acc[NT], acc1[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = acc1[t] = 0.0f;
    if (r < n_rows) {
        for (int c = j; c < n_cols; c += tpr) {
#pragma unroll
            for (int g = 0; g < (GLU ? 2 : 1); g++) {
                const uint8_t *row = (g ? w1 : w0) + (int64_t)ra * row_bytes;
                const float wv = T == MI_TYPE_F32 ? ((const float *)row)[c] : __half2float(((const __half *)row)[c]);
                float *a = g ? acc1 : acc;
#pragma unroll
                for (int t = 0; t < NT; t++) a[t] = __fadd_rn(a[t], __fmul_rn(wv, xf[t * ldx + c]));
            }
        }
    }
    mi_row_reduce<NT>(acc, tpr, sh[0]);
    if (GLU) mi_row_reduce<NT>(acc1, tpr, sh[GLU ? 1 : 0]);
    if (!GLU && os.any_rope)
        mi_epilogue_rope<NT>(acc, r, ra, threadIdx.x / tpr, j == 0 && r < n_rows, os, accumulate);
    else if (j == 0 && r < n_rows)
        mi_epilogue<NT>(acc, acc1, GLU, r, os, accumulate, in);
    if (os.yq) mi_group_quant<NT>(os, blockIdx.x * rpb, rpb);
}


template <int T, int NT, bool GLU> cudaError_t mi_launch_one(const mi_mmvq_args &a, cudaStream_t s) {
    const int grid = (a.n_rows + a.rpb - 1) / a.rpb;
    if constexpr (T == MI_TYPE_F32 || T == MI_TYPE_F16)
        return mi_launch(mi_mmv_f_kernel<T, NT, GLU>, grid, MI_MMVQ_THREADS, s, a.w0, a.w1, a.row_bytes, a.n_rows,
                         a.n_cols, a.xf, a.ldx, a.os, a.accumulate, a.rpb);
    else if (a.warp && NT >= 2 && !GLU && a.pair && !a.os.yq) {
        __atomic_add_fetch(&mi_mmvq_pair_count, 1, __ATOMIC_RELAXED);
        const int rpb = MI_MMVQ_WARPS / a.warp;
        return mi_launch(mi_mmvq_warp_pair_kernel<T, NT, mi_mmvq_unroll<NT, true>()>, (a.n_rows + 2 * rpb - 1) / (2 * rpb),
                         MI_MMVQ_WARPS * 32, s, a.w0, a.row_bytes, a.n_rows, a.n_cols / 32, a.xq, a.ldx / 32, a.os,
                         a.accumulate, a.warp);
    } else if (a.warp)
        return mi_launch(mi_mmvq_warp_kernel<T, NT, GLU, mi_mmvq_unroll<NT, GLU>()>,
                         (a.n_rows + MI_MMVQ_WARPS / a.warp - 1) / (MI_MMVQ_WARPS / a.warp), MI_MMVQ_WARPS * 32, s, a.w0,
                         a.w1, a.row_bytes, a.n_rows, a.n_cols / 32, a.xq, a.ldx / 32, a.os, a.accumulate, a.warp);
    else if (NT >= 2 && !GLU && a.pair && !a.os.any_rope && !a.os.yq) {
        __atomic_add_fetch(&mi_mmvq_pair_count, 1, __ATOMIC_RELAXED);
        return mi_launch(mi_mmvq_pair_kernel<T, NT>, (a.n_rows + 2 * a.rpb - 1) / (2 * a.rpb), MI_MMVQ_THREADS, s,
                         a.w0, a.row_bytes, a.n_rows, a.n_cols / 32, a.xq, a.ldx / 32, a.os, a.accumulate, a.rpb);
    } else
        return mi_launch(mi_mmvq_kernel<T, NT, GLU>, grid, MI_MMVQ_THREADS, s, a.w0, a.w1, a.row_bytes, a.n_rows,
                         a.n_cols / 32, a.xq, a.ldx / 32, a.os, a.accumulate, a.rpb);
}

template <int T, bool GLU> cudaError_t mi_launch_nt(int nt, const mi_mmvq_args &a, cudaStream_t s) {
    switch (nt) {
    case 1: return mi_launch_one<T, 1, GLU>(a, s);
    case 2: return mi_launch_one<T, 2, GLU>(a, s);
    case 3: return mi_launch_one<T, 3, GLU>(a, s);
    case 4: return mi_launch_one<T, 4, GLU>(a, s);
    case 5: return mi_launch_one<T, 5, GLU>(a, s);
    case 6: return mi_launch_one<T, 6, GLU>(a, s);
    case 7: return mi_launch_one<T, 7, GLU>(a, s);
    default: return mi_launch_one<T, 8, GLU>(a, s);
    }
}

} // namespace

// Launch the mat-vec for weight type T over one group of nt <= 8 rows (GLU: w1 is the up matrix).
template <int T> cudaError_t mi_mmvq_launch_type(bool glu, int nt, const mi_mmvq_args &a, cudaStream_t s) {
    return glu ? mi_launch_nt<T, true>(nt, a, s) : mi_launch_nt<T, false>(nt, a, s);
}
#endif
