// MMQ: tensor-core GEMM for nt >= 10 activation rows (design, tiles, tolerance: mmq.cuh).
#include <mma.h>
#include <stdlib.h>
#include <string.h>
#include "mma.cuh"
#include "mmq.cuh"
#include "qtypes.cuh"

namespace {

constexpr int BM = MI_MMQ_BM, BN = MI_MMQ_BN, BK = MI_MMQ_BK;
constexpr int MI_MMQ_THREADS = 256;       // 8 warps: a 4 (rows of W) x 2 (rows of x) grid
constexpr int LDS = BK + 8;               // halves per row of Ws / Xs: 144 bytes, rows 4 banks apart
constexpr int LDC = BM + 4;               // floats per row of Cs (wmma ldm: a multiple of 4)
constexpr int MI_MMQ_MIN_KSTEPS = 2;      // fewest K steps a split gets
constexpr size_t MI_MMQ_SMEM_AB = (size_t)(BM + BN) * LDS * sizeof(__half);
constexpr size_t MI_MMQ_SMEM_C = (size_t)BN * LDC * sizeof(float);
static_assert(MI_MMQ_THREADS == 2 * BM && MI_MMQ_THREADS == 4 * BN && BK == 64,
              "loader roles: one thread per (W row, 32-wide chunk) and per (x row, 16 columns)");
// wmma: ldm a multiple of 8 halves / 4 floats, tile pointers 32-byte aligned (fragment offsets are
// multiples of 16 rows and 16 columns, so only the Xs base needs checking).
static_assert(LDS % 8 == 0 && LDC % 4 == 0 && (BM * LDS * sizeof(__half)) % 32 == 0, "wmma alignment");

union mi_h2u {
    __half2 h;
    uint32_t u;
};
__device__ __forceinline__ uint32_t mi_h2_bits(__half2 h) {
    mi_h2u c;
    c.h = h;
    return c.u;
}
__device__ __forceinline__ __half2 mi_bits_h2(uint32_t u) {
    mi_h2u c;
    c.u = u;
    return c.h;
}
// 8 floats -> 8 f16 (round to nearest) in one 16-byte word.
__device__ __forceinline__ uint4 mi_f8_to_h8(float4 a, float4 b) {
    return make_uint4(mi_h2_bits(__floats2half2_rn(a.x, a.y)), mi_h2_bits(__floats2half2_rn(a.z, a.w)),
                      mi_h2_bits(__floats2half2_rn(b.x, b.y)), mi_h2_bits(__floats2half2_rn(b.z, b.w)));
}

// Dequantized weights of one chunk (32 columns of one row) -> 32 f16 at dst (16-byte aligned).
// Quantized types: q (int8 x4 per word) becomes f16 exactly by the 0x6400 trick (the byte
// q + 128 as the mantissa of 1024, minus 1152), then one f16 FMA w = q * (dw*sc) + mw: no
// int-to-float conversions, which run at quarter rate and would bound the kernel.
template <int T> struct mi_mmq_wchunk {
    mi_chunk ch;
    __device__ __forceinline__ void load(const uint8_t *row, int c) {
        mi_qt<T>::load(row + (int64_t)(c / mi_qt<T>::CPB) * mi_qt<T>::BB, c % mi_qt<T>::CPB, ch);
    }
    __device__ __forceinline__ void store(__half *dst) const {
        const __half2 d0 = __float2half2_rn(__fmul_rn(ch.dw, (float)ch.sc0));
        const __half2 d1 = __float2half2_rn(__fmul_rn(ch.dw, (float)ch.sc1));
        const __half2 m = __float2half2_rn(ch.mw);
        const __half2 off = __float2half2_rn(1152.0f);
        uint32_t u[16];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t b = (uint32_t)ch.q[j] ^ 0x80808080u; // int8 -> uint8 + 128
            const __half2 lo = __hsub2(mi_bits_h2(__byte_perm(b, 0x64646464u, 0x4140)), off); // elements 4j, 4j+1
            const __half2 hi = __hsub2(mi_bits_h2(__byte_perm(b, 0x64646464u, 0x4342)), off); // 4j+2, 4j+3
            const __half2 d = j < 4 ? d0 : d1;
            u[2 * j] = mi_h2_bits(__hfma2(lo, d, m));
            u[2 * j + 1] = mi_h2_bits(__hfma2(hi, d, m));
        }
        uint4 *o = (uint4 *)dst;
#pragma unroll
        for (int i = 0; i < 4; i++) o[i] = make_uint4(u[4 * i], u[4 * i + 1], u[4 * i + 2], u[4 * i + 3]);
    }
};
template <> struct mi_mmq_wchunk<MI_TYPE_F16> {
    uint4 v[4];
    __device__ __forceinline__ void load(const uint8_t *row, int c) {
        const uint4 *p = (const uint4 *)(row + (int64_t)c * 64);
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = p[i];
    }
    __device__ __forceinline__ void store(__half *dst) const {
#pragma unroll
        for (int i = 0; i < 4; i++) ((uint4 *)dst)[i] = v[i];
    }
};
template <> struct mi_mmq_wchunk<MI_TYPE_F32> {
    float4 v[8];
    __device__ __forceinline__ void load(const uint8_t *row, int c) {
        const float4 *p = (const float4 *)(row + (int64_t)c * 128);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = p[i];
    }
    __device__ __forceinline__ void store(__half *dst) const {
#pragma unroll
        for (int i = 0; i < 4; i++) ((uint4 *)dst)[i] = mi_f8_to_h8(v[2 * i], v[2 * i + 1]);
    }
};

__device__ __forceinline__ void mi_mmq_out(float v, int t, int r, float *y, int64_t ldy, const float *bias,
                                           int accumulate) {
    if (bias) v = __fadd_rn(v, bias[r]);
    float *o = y + (int64_t)t * ldy + r;
    *o = accumulate ? __fadd_rn(*o, v) : v;
}

// A block's finished tile out of shared memory, cs [TN][LDC] (activation row t, weight row r at
// cs[t * LDC + r]): rows t0 + t < nt, r0 + r < n_rows into y through the epilogue, or raw into
// part [gridDim.z][nt][n_rows] (K-split). Consecutive threads take consecutive weight rows r:
// coalesced stores along y's rows.
template <int TN>
__device__ __forceinline__ void mi_mmq_tile_out(const float *cs, int t0, int r0, int nt, int n_rows, float *y, int64_t ldy,
                                                const float *bias, int accumulate, float *part) {
    for (int e = threadIdx.x; e < BM * TN; e += MI_MMQ_THREADS) {
        const int t = e / BM, r = e % BM;
        if (t0 + t >= nt || r0 + r >= n_rows) continue;
        const float v = cs[t * LDC + r];
        if (part)
            part[((int64_t)blockIdx.z * nt + t0 + t) * n_rows + r0 + r] = v;
        else
            mi_mmq_out(v, t0 + t, r0 + r, y, ldy, bias, accumulate);
    }
}

// Block (bx, by, z): activation rows t0 = bx*BN.., weight rows r0 = by*BM.., K steps
// [z*kps, min(ksteps, (z+1)*kps)). part == NULL: epilogue into y; else the raw tile goes to
// part [gridDim.z][nt][n_rows] for mi_mmq_reduce_kernel.
// STAGES = 1: one Ws/Xs buffer, two barriers a K step (the MMAs read it, then it is restaged);
// 2: two buffers, the MMAs of step k read one while the same warps stage step k + 1 into the
// other, one barrier a step (a warp's dequantization overlaps the other warps' MMAs). Same
// arithmetic, same bits. Dynamic shared memory: STAGES * (BM + BN) * LDS halves (>= the Cs tile).
template <int T, int STAGES>
__global__ void __launch_bounds__(MI_MMQ_THREADS, 2)
    mi_mmq_kernel(const uint8_t *__restrict__ w, int64_t row_bytes, int n_rows, int nchunks,
                  const float *__restrict__ x, int64_t ldx, int nt, int kps, float *y, int64_t ldy,
                  const float *__restrict__ bias, int accumulate, float *__restrict__ part) {
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char smem[];
    __half *ws = (__half *)smem;  // [BM][LDS] weight tile, row-major (wmma matrix_a), per stage
    __half *xs = ws + BM * LDS;   // [BN][LDS] activation tile: x^T col-major (wmma matrix_b), per stage
    constexpr int STAGE = (BM + BN) * LDS; // halves from one stage's tiles to the next's
    float *cs = (float *)smem;    // [BN][LDC] accumulators, after the K loop
    const int tid = threadIdx.x, warp = tid / 32;
    const int t0 = blockIdx.x * BN, r0 = blockIdx.y * BM;
    const int ksteps = (nchunks + 1) / 2;
    const int ks0 = blockIdx.z * kps, ks1 = min(ksteps, ks0 + kps);

    // Loader roles. W: thread -> (row lr, chunk lc of the step); rows past n_rows re-read the
    // last row (in bounds; their outputs are never stored). x: thread -> (row xt, columns
    // 16*xseg..+16 of the step); rows past nt and columns past n_cols are zero-filled.
    const int lr = tid >> 1, lc = tid & 1;
    const uint8_t *wrow = w + (int64_t)min(r0 + lr, n_rows - 1) * row_bytes;
    const int xt = tid >> 2, xseg = tid & 3;
    const bool xrow_ok = t0 + xt < nt;
    const float *xrow = x + (int64_t)(xrow_ok ? t0 + xt : 0) * ldx + 16 * xseg;
    __half *wdst = ws + lr * LDS + 32 * lc;
    __half *xdst = xs + xt * LDS + 16 * xseg;

    mi_mmq_wchunk<T> wreg;
    float4 xreg[4];
    bool w_ok = false, x_ok = false;
    auto fetch = [&](int ks) {
        const int c = 2 * ks + lc;
        w_ok = c < nchunks;
        if (w_ok) wreg.load(wrow, c);
        x_ok = xrow_ok && BK * ks + 16 * xseg < 32 * nchunks;
        if (x_ok) {
            const float4 *p = (const float4 *)(xrow + (int64_t)BK * ks);
#pragma unroll
            for (int i = 0; i < 4; i++) xreg[i] = p[i];
        }
    };
    auto stage = [&](int buf) {
        __half *wd = wdst + buf * STAGE;
        if (w_ok)
            wreg.store(wd);
        else
#pragma unroll
            for (int i = 0; i < 4; i++) ((uint4 *)wd)[i] = make_uint4(0, 0, 0, 0);
        uint4 *o = (uint4 *)(xdst + buf * STAGE);
        if (x_ok) {
#pragma unroll
            for (int i = 0; i < 2; i++) o[i] = mi_f8_to_h8(xreg[2 * i], xreg[2 * i + 1]);
        } else {
            o[0] = o[1] = make_uint4(0, 0, 0, 0);
        }
    };

    // Warp (wm, wn) computes rows r0 + 32*wm + 16*i, activation rows t0 + 32*wn + 16*j; nj of
    // its two activation fragments hold any row < nt (warp-uniform: the others stay zero).
    const int wm = warp & 3, wn = warp >> 2;
    const int nj = min(2, max(0, (nt - t0 - 32 * wn + 15) / 16));
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    if (ks0 < ks1) {
        fetch(ks0);
        stage(0);
    }
    __syncthreads();
    for (int ks = ks0; ks < ks1; ks++) {
        const bool more = ks + 1 < ks1;
        const int cur = STAGES == 2 ? (ks - ks0) & 1 : 0;
        if (more) fetch(ks + 1); // in flight during the MMAs below
        if (nj > 0) {
            const __half *wsb = ws + cur * STAGE, *xsb = xs + cur * STAGE;
#pragma unroll
            for (int kk = 0; kk < BK; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[2];
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
#pragma unroll
                for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], wsb + (32 * wm + 16 * i) * LDS + kk, LDS);
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    if (j < nj) {
                        wmma::load_matrix_sync(b, xsb + (32 * wn + 16 * j) * LDS + kk, LDS);
#pragma unroll
                        for (int i = 0; i < 2; i++) wmma::mma_sync(acc[i][j], a[i], b, acc[i][j]);
                    }
                }
            }
        }
        // One buffer: every warp must be done with this step's tiles before they are restaged.
        // Two: the other buffer was last read in step ks - 1, which the barrier below (of that
        // step) closed for every warp.
        if (STAGES == 1) __syncthreads();
        if (more) stage(STAGES == 2 ? cur ^ 1 : 0);
        __syncthreads();
    }

    // Cs overlays Ws/Xs: the loop's last barrier (or the one before it) ordered every read.
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(cs + (32 * wn + 16 * j) * LDC + 32 * wm + 16 * i, acc[i][j], LDC,
                                    wmma::mem_col_major);
    __syncthreads();
    mi_mmq_tile_out<BN>(cs, t0, r0, nt, n_rows, y, ldy, bias, accumulate, part);
}

// ---- Wide tiles (MI_CUDA_MMQ_BN=128, the default where two blocks fit an SM) ----
// The kernel above is bound by its shared-memory traffic (Nsight Compute, 7B shape at pp512: L1
// 82% busy, issue slots 40%): every m16n16k16 needs one 512-byte fragment load, and each weight
// tile is dequantized for only 64 activation rows. Here a block owns BM = 128 weight rows x
// BNW = 128 activation rows; its 8 warps form a 2 x 4 grid of 64 x 32 sub-tiles (4 x 4 m16n8
// accumulators, 64 f32 registers), fed by ldmatrix: 6 fragment loads for 16 MMAs instead of 8,
// and half the dequantization per product. The activations arrive already in f16
// (mi_mmq_x_f16_kernel, [nt][ldh] with ldh = n_cols rounded up to 64, zero past n_cols) and go to
// shared memory by cp.async, so they hold no registers. Same W loader and dequantization as
// mi_mmq_kernel, two stages, the same epilogue through Cs; the products are the same f16 x f16
// products, summed in f32 in another order (a tolerance, not bits, like every MMQ result).
constexpr int BNW = 128;
constexpr int STAGE_W = (BM + BNW) * LDS; // halves per stage: Ws [BM][LDS] then Xs [BNW][LDS]
constexpr size_t MI_MMQW_SMEM = 2 * (size_t)STAGE_W * sizeof(__half); // 73,728 bytes
static_assert(MI_MMQW_SMEM >= (size_t)BNW * LDC * sizeof(float), "Cs overlays the two stages");
static_assert(MI_MMQ_THREADS * 4 * 8 == BNW * BK, "X loader: four 16-byte copies a thread a step");
static_assert((LDS * sizeof(__half)) % 16 == 0, "ldmatrix / cp.async rows 16-byte aligned");

// x f32 [nt][ldx] -> xh f16 [nt][ldh] (round to nearest), columns n_cols .. ldh - 1 zero: one
// thread per 8 columns. n_cols % 32 == 0, ldh % 64 == 0, x 16-byte aligned with ldx % 4 == 0.
__global__ void mi_mmq_x_f16_kernel(const float *__restrict__ x, int64_t ldx, int n_cols, int nt,
                                    __half *__restrict__ xh, int64_t ldh) {
    const int64_t per_row = ldh / 8, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= per_row * nt) return;
    const int64_t t = i / per_row, c = (i % per_row) * 8;
    uint4 o = make_uint4(0, 0, 0, 0);
    if (c < n_cols) {
        const float4 *p = (const float4 *)(x + t * ldx + c);
        o = mi_f8_to_h8(p[0], p[1]);
    }
    *(uint4 *)(xh + t * ldh + c) = o;
}

template <int T>
__global__ void __launch_bounds__(MI_MMQ_THREADS, 2)
    mi_mmq_wide_kernel(const uint8_t *__restrict__ w, int64_t row_bytes, int n_rows, int nchunks,
                       const __half *__restrict__ xh, int64_t ldh, int nt, int kps, float *y, int64_t ldy,
                       const float *__restrict__ bias, int accumulate, float *__restrict__ part) {
    extern __shared__ __align__(128) unsigned char smem[];
    __half *ws = (__half *)smem; // [BM][LDS] weight tile, row-major (the MMA's A), per stage
    __half *xs = ws + BM * LDS;  // [BNW][LDS] activation rows, k contiguous (the MMA's B), per stage
    float *cs = (float *)smem;   // [BNW][LDC] accumulators, after the K loop
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int t0 = blockIdx.x * BNW, r0 = blockIdx.y * BM;
    const int ksteps = (nchunks + 1) / 2;
    const int ks0 = blockIdx.z * kps, ks1 = min(ksteps, ks0 + kps);

    // W: thread -> (row lr, chunk lc of the step), as mi_mmq_kernel. X: thread -> rows xr + 32 i
    // (i < 4), 16-byte segment xseg of the step's 64 columns; rows past nt re-read row nt - 1 (in
    // bounds; their outputs are never stored).
    const int lr = tid >> 1, lc = tid & 1;
    const uint8_t *wrow = w + (int64_t)min(r0 + lr, n_rows - 1) * row_bytes;
    __half *wdst = ws + lr * LDS + 32 * lc;
    const int xr = tid >> 3, xseg = tid & 7;
    mi_mmq_wchunk<T> wreg;
    bool w_ok = false;
    auto fetch = [&](int ks, int buf) {
        const int c = 2 * ks + lc;
        w_ok = c < nchunks;
        if (w_ok) wreg.load(wrow, c);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int t = min(t0 + xr + 32 * i, nt - 1);
            mi_cp_async16(xs + buf * STAGE_W + (xr + 32 * i) * LDS + 8 * xseg, xh + (int64_t)t * ldh + BK * ks + 8 * xseg);
        }
        mi_cp_async_commit();
    };
    auto stage_w = [&](int buf) {
        __half *wd = wdst + buf * STAGE_W;
        if (w_ok)
            wreg.store(wd);
        else
#pragma unroll
            for (int i = 0; i < 4; i++) ((uint4 *)wd)[i] = make_uint4(0, 0, 0, 0);
    };

    // Warp (wm, wn): weight rows 64 wm + 16 i + {g, g + 8}, activation rows 32 wn + 8 j + 2q + {0, 1}
    // (g = lane / 4, q = lane % 4); nj16 of its two 16-row activation halves hold a row < nt.
    const int wm = warp & 1, wn = warp >> 1;
    const int nj16 = min(2, max(0, (nt - t0 - 32 * wn + 15) / 16));
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    // ldmatrix lane addresses (mma.cuh): A matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) in a[0..3]
    // order; B: (activation rows 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15).
    const int a_off = (64 * wm + (lane & 15)) * LDS + 8 * (lane >> 4);
    const int b_off = (32 * wn + (lane & 7) + 8 * (lane >> 4)) * LDS + 8 * ((lane >> 3) & 1);

    if (ks0 < ks1) {
        fetch(ks0, 0);
        stage_w(0);
        mi_cp_async_wait_all();
    }
    __syncthreads();
    for (int ks = ks0; ks < ks1; ks++) {
        const bool more = ks + 1 < ks1;
        const int cur = (ks - ks0) & 1;
        // The other stage was last read in step ks - 1, whose closing barrier every warp passed.
        if (more) fetch(ks + 1, cur ^ 1);
        if (nj16 > 0) {
            const __half *wsb = ws + cur * STAGE_W + a_off, *xsb = xs + cur * STAGE_W + b_off;
#pragma unroll
            for (int kk = 0; kk < BK; kk += 16) {
                uint32_t a[4][4];
#pragma unroll
                for (int i = 0; i < 4; i++) mi_ldsm_x4(a[i], wsb + 16 * i * LDS + kk);
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    if (jj < nj16) {
                        uint32_t b[4];
                        mi_ldsm_x4(b, xsb + 16 * jj * LDS + kk);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            mi_mma_f16(acc[i][2 * jj], a[i], b[0], b[1]);
                            mi_mma_f16(acc[i][2 * jj + 1], a[i], b[2], b[3]);
                        }
                    }
                }
            }
        }
        if (more) stage_w(cur ^ 1);
        mi_cp_async_wait_all();
        __syncthreads();
    }

    // Cs overlays the stages: the loop's last barrier ordered every read (and every copy).
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                cs[(32 * wn + 8 * j + 2 * q + (e & 1)) * LDC + 64 * wm + 16 * i + g + 8 * (e >> 1)] = acc[i][j][e];
    __syncthreads();
    mi_mmq_tile_out<BNW>(cs, t0, r0, nt, n_rows, y, ldy, bias, accumulate, part);
}

// y from the K-split partials part [splits][nt][n_rows], summed in split order.
__global__ void mi_mmq_reduce_kernel(const float *__restrict__ part, int splits, int nt, int n_rows, float *y,
                                     int64_t ldy, const float *__restrict__ bias, int accumulate) {
    const int64_t n = (int64_t)nt * n_rows;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = part[i];
    for (int z = 1; z < splits; z++) v = __fadd_rn(v, part[z * n + i]);
    mi_mmq_out(v, (int)(i / n_rows), (int)(i % n_rows), y, ldy, bias, accumulate);
}

int mi_mmq_sm_count() {
    static const int n = [] {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) {
            cudaGetLastError();
            v = 132; // H100/H200; only shapes the split choice
        }
        return v;
    }();
    return n;
}

// Automatic K splits for a grid of `tiles` output tiles of `ksteps` K steps (MI_CUDA_MMQ_FILL=1,
// the default): the count s that minimizes an estimate of the time. Blocks of 1 / s of the K
// range, ceil(tiles s / SMs) of them on the busiest SM, two at a time (the launch bound), a pair
// taking MI_MMQ_PAIR_COST times one block alone (latency-bound kernels: Nsight Compute shows 15-23%
// occupancy), and each split past the first 3% more for its partials' round trip and the reduce.
// Why: whole-K grids of 1.2 - 4.5 SM-waves left SMs idle in the last wave (14B shape pp512: q, o
// and down 160 tiles on 132 SMs). MI_CUDA_MMQ_FILL=0: the old rule, splits only below one tile per SM
// (about two blocks an SM). At least MI_MMQ_MIN_KSTEPS steps a split; the caller caps by scratch.
constexpr double MI_MMQ_PAIR_COST = 1.6, MI_MMQ_SPLIT_COST = 0.03;
int mi_mmq_auto_splits(int64_t tiles, int ksteps, int n_sm, bool fill) {
    if (!fill) {
        int s = tiles < n_sm ? (int)((2 * n_sm + tiles - 1) / tiles) : 1;
        if (s > MI_MMQ_MAX_SPLIT) s = MI_MMQ_MAX_SPLIT;
        return s > ksteps / MI_MMQ_MIN_KSTEPS ? ksteps / MI_MMQ_MIN_KSTEPS : s;
    }
    int best = 1;
    double best_cost = 0.0;
    for (int s = 1; s <= MI_MMQ_MAX_SPLIT && (s == 1 || ksteps / s >= MI_MMQ_MIN_KSTEPS); s++) {
        const int64_t b = (tiles * s + n_sm - 1) / n_sm; // blocks on the busiest SM
        const double cost = ((double)(b / 2) * MI_MMQ_PAIR_COST + (double)(b % 2)) / s * (1.0 + MI_MMQ_SPLIT_COST * (s - 1));
        if (s == 1 || cost < best_cost) {
            best = s;
            best_cost = cost;
        }
    }
    return best;
}

// MI_CUDA_MMQ_SPLITS: > 0 forces that many K splits (tests), else 0 (automatic).
// Unset, empty or 0: automatic; N >= 1: N, capped at MI_MMQ_MAX_SPLIT; anything else -1 (refused
// at context creation by mi_cuda_mmq_check_env; automatic where it reaches a launch anyway).
static int mi_mmq_splits_env() {
    const char *e = getenv("MI_CUDA_MMQ_SPLITS");
    if (!e || !e[0]) return 0;
    char *end = nullptr;
    const long v = strtol(e, &end, 10);
    if (*end || v < 0) return -1;
    return v < MI_MMQ_MAX_SPLIT ? (int)v : MI_MMQ_MAX_SPLIT;
}
int mi_mmq_forced_splits() {
    const int v = mi_mmq_splits_env();
    return v > 0 ? v : 0;
}

typedef void (*mi_mmq_fn)(const uint8_t *, int64_t, int, int, const float *, int64_t, int, int, float *, int64_t,
                          const float *, int, float *);
template <int S> mi_mmq_fn mi_mmq_kernel_stages(int type) {
    switch (type) {
    case MI_TYPE_F32: return mi_mmq_kernel<MI_TYPE_F32, S>;
    case MI_TYPE_F16: return mi_mmq_kernel<MI_TYPE_F16, S>;
    case MI_TYPE_Q4_0: return mi_mmq_kernel<MI_TYPE_Q4_0, S>;
    case MI_TYPE_Q4_1: return mi_mmq_kernel<MI_TYPE_Q4_1, S>;
    case MI_TYPE_Q5_0: return mi_mmq_kernel<MI_TYPE_Q5_0, S>;
    case MI_TYPE_Q5_1: return mi_mmq_kernel<MI_TYPE_Q5_1, S>;
    case MI_TYPE_Q8_0: return mi_mmq_kernel<MI_TYPE_Q8_0, S>;
    case MI_TYPE_Q4_K: return mi_mmq_kernel<MI_TYPE_Q4_K, S>;
    case MI_TYPE_Q5_K: return mi_mmq_kernel<MI_TYPE_Q5_K, S>;
    case MI_TYPE_Q6_K: return mi_mmq_kernel<MI_TYPE_Q6_K, S>;
    default: return nullptr;
    }
}

typedef void (*mi_mmq_wide_fn)(const uint8_t *, int64_t, int, int, const __half *, int64_t, int, int, float *, int64_t,
                               const float *, int, float *);
mi_mmq_wide_fn mi_mmq_wide_kernel_of(int type) {
    switch (type) {
    case MI_TYPE_F32: return mi_mmq_wide_kernel<MI_TYPE_F32>;
    case MI_TYPE_F16: return mi_mmq_wide_kernel<MI_TYPE_F16>;
    case MI_TYPE_Q4_0: return mi_mmq_wide_kernel<MI_TYPE_Q4_0>;
    case MI_TYPE_Q4_1: return mi_mmq_wide_kernel<MI_TYPE_Q4_1>;
    case MI_TYPE_Q5_0: return mi_mmq_wide_kernel<MI_TYPE_Q5_0>;
    case MI_TYPE_Q5_1: return mi_mmq_wide_kernel<MI_TYPE_Q5_1>;
    case MI_TYPE_Q8_0: return mi_mmq_wide_kernel<MI_TYPE_Q8_0>;
    case MI_TYPE_Q4_K: return mi_mmq_wide_kernel<MI_TYPE_Q4_K>;
    case MI_TYPE_Q5_K: return mi_mmq_wide_kernel<MI_TYPE_Q5_K>;
    case MI_TYPE_Q6_K: return mi_mmq_wide_kernel<MI_TYPE_Q6_K>;
    default: return nullptr;
    }
}

size_t mi_mmq_smem_bytes(int stages) {
    const size_t ab = (size_t)stages * MI_MMQ_SMEM_AB;
    return ab > MI_MMQ_SMEM_C ? ab : MI_MMQ_SMEM_C;
}

// Whether two blocks of smem bytes of dynamic shared memory (the GEMM kernels' launch bound) fit
// an SM of device 0 (1 KB a block is reserved by the system); false when the query fails.
bool mi_mmq_two_blocks_fit(size_t smem) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return (size_t)v >= 2 * (smem + 1024);
}

// Two stages where two blocks of them fit an SM (the kernel's launch bound; sm_80 / sm_90: 164 /
// 228 KB an SM), else one: on sm_86 / sm_89 (100 KB) two-stage blocks would run one an SM, a case
// not measured.
int mi_mmq_default_stages() {
    static const int n = mi_mmq_two_blocks_fit(mi_mmq_smem_bytes(2)) ? 2 : 1;
    return n;
}

// 128-row tiles where two of their blocks fit an SM (sm_80 / sm_90), else 64 (sm_86 / sm_89).
int mi_mmq_default_bn() {
    static const int n = mi_mmq_two_blocks_fit(MI_MMQW_SMEM) ? BNW : MI_MMQ_BN;
    return n;
}

} // namespace

// *out = environment variable `name` as an integer where it is one of the decimal strings a or b,
// dflt where it is unset or empty; anything else is refused (MI_ERR_ARG, naming the variable).
// The GEMM's tuning switches below are read at every call (the GEMM path is never graphed) and
// checked at context creation too, so a forward does not fail half-way.
static int mi_mmq_env_choice(const char *name, const char *a, const char *b, int dflt, int *out) {
    const char *e = getenv(name);
    if (!e || !*e) {
        *out = dflt;
        return MI_OK;
    }
    if (strcmp(e, a) && strcmp(e, b)) return mi_set_error(MI_ERR_ARG, "%s must be %s or %s, got '%s'", name, a, b, e);
    *out = atoi(e);
    return MI_OK;
}

// MI_CUDA_MMQ_BN: 64 (mi_mmq_kernel) or 128 (mi_mmq_wide_kernel, for calls of more than 64 rows
// given f16 scratch); unset or empty: by the device (mi_mmq_default_bn).
int mi_cuda_mmq_bn(int *out) { return mi_mmq_env_choice("MI_CUDA_MMQ_BN", "64", "128", mi_mmq_default_bn(), out); }

// MI_CUDA_MMQ_FILL: 0 = the old split rule (A/B timing), 1 = the time estimate (mi_mmq_auto_splits);
// unset or empty: 1.
int mi_cuda_mmq_fill(int *out) { return mi_mmq_env_choice("MI_CUDA_MMQ_FILL", "0", "1", 1, out); }

// MI_CUDA_MMQ_STAGES: 1 or 2 shared-memory buffers (mi_mmq_kernel); unset or empty: by the device
// (mi_mmq_default_stages).
int mi_cuda_mmq_stages(int *out) {
    return mi_mmq_env_choice("MI_CUDA_MMQ_STAGES", "1", "2", mi_mmq_default_stages(), out);
}

int mi_cuda_mmq_check_env(void) {
    int v = 0, rc;
    if ((rc = mi_cuda_mmq_stages(&v)) || (rc = mi_cuda_mmq_bn(&v)) || (rc = mi_cuda_mmq_fill(&v))) return rc;
    if (mi_mmq_splits_env() < 0)
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_MMQ_SPLITS=%s: want 0 (automatic) or a split count >= 1",
                            getenv("MI_CUDA_MMQ_SPLITS"));
    return MI_OK;
}

static uint64_t mi_mmq_wide_count = 0; // wide launches so far (mi_cuda_mmq_wide_launches)
extern "C" uint64_t mi_cuda_mmq_wide_launches(void) { return __atomic_load_n(&mi_mmq_wide_count, __ATOMIC_RELAXED); }

size_t mi_cuda_mmq_xh_halves(int64_t n_cols, int max_nt) {
    return max_nt > MI_MMQ_BN ? (size_t)max_nt * (size_t)((n_cols + BK - 1) / BK * BK) : 0;
}

size_t mi_cuda_mmq_scratch_floats(int64_t n_rows, int max_nt) {
    // The largest split count x nt x n_rows over every nt <= max_nt, both tile widths and both split
    // rules (the K range is not known here: taken as unlimited), capped at MI_MMQ_SCRATCH_CAP.
    const int n_sm = mi_mmq_sm_count();
    const int64_t tiles_m = (n_rows + BM - 1) / BM;
    size_t need = 0;
    for (int nt = 1; nt <= max_nt; nt++)
        for (const int bn : {BN, BNW})
            for (const bool fill : {false, true}) {
                const int s = mi_mmq_auto_splits((nt + bn - 1) / bn * tiles_m, 1 << 20, n_sm, fill);
                const size_t f = s > 1 ? (size_t)s * nt * n_rows : 0;
                if (f > need) need = f;
            }
    return need < MI_MMQ_SCRATCH_CAP ? need : MI_MMQ_SCRATCH_CAP;
}

int mi_cuda_mmq(const mi_dtensor *w, const float *x, int64_t ldx, int nt, float *y, int64_t ldy, const float *bias,
                int accumulate, float *scratch, size_t scratch_floats, __half *xh, size_t xh_halves, int x_ready,
                int *xh_holds_x, cudaStream_t s) {
    if (xh_holds_x) *xh_holds_x = 0;
    int stages = 0, bn = 0, fill = 0;
    if (const int rc = mi_cuda_mmq_stages(&stages)) return rc;
    if (const int rc = mi_cuda_mmq_bn(&bn)) return rc;
    if (const int rc = mi_cuda_mmq_fill(&fill)) return rc;
    const mi_mmq_fn kernel = stages == 2 ? mi_mmq_kernel_stages<2>(w->type) : mi_mmq_kernel_stages<1>(w->type);
    if (!kernel) return mi_set_error(MI_ERR_TYPE, "CUDA mmq: unsupported type %d", w->type);
    if (w->n_cols % 32 || w->n_cols <= 0 || w->n_rows <= 0 || (w->n_rows + BM - 1) / BM > 65535 || nt < 1 ||
        ldx < w->n_cols)
        return mi_set_error(MI_ERR_ARG, "CUDA mmq: bad shape (n_rows %lld, n_cols %lld, nt %d, ldx %lld)",
                            (long long)w->n_rows, (long long)w->n_cols, nt, (long long)ldx);
    if (ldx % 4 || (uintptr_t)x % 16)
        return mi_set_error(MI_ERR_ARG, "CUDA mmq: x must be 16-byte aligned with ldx a multiple of 4");
    const int nchunks = (int)(w->n_cols / 32), ksteps = (nchunks + 1) / 2;
    const int n_rows = (int)w->n_rows;
    const int64_t ldh = (w->n_cols + BK - 1) / BK * BK;
    const bool wide = bn == BNW && nt > BN && xh && (size_t)nt * ldh <= xh_halves;
    const int tile_n = wide ? BNW : BN;
    const int tiles_n = (nt + tile_n - 1) / tile_n, tiles_m = (n_rows + BM - 1) / BM;
    const int64_t tiles = (int64_t)tiles_n * tiles_m;
    // K splits (mi_mmq_auto_splits), each at least MI_MMQ_MIN_KSTEPS steps; never more than the
    // scratch holds.
    const int n_sm = mi_mmq_sm_count(), forced = mi_mmq_forced_splits();
    const int splits_auto = mi_mmq_auto_splits(tiles, ksteps, n_sm, fill != 0);
    int splits = forced ? forced : splits_auto;
    if (splits > MI_MMQ_MAX_SPLIT) splits = MI_MMQ_MAX_SPLIT;
    if (splits > ksteps) splits = ksteps;
    const size_t out_floats = (size_t)nt * n_rows;
    if (!scratch) scratch_floats = 0;
    if (splits > 1 && (size_t)splits * out_floats > scratch_floats) splits = (int)(scratch_floats / out_floats);
    if (splits < 1) splits = 1;
    const int kps = (ksteps + splits - 1) / splits; // no empty split: recount with this step range
    splits = (ksteps + kps - 1) / kps;
    float *part = splits > 1 ? scratch : nullptr;

    const dim3 grid(tiles_n, tiles_m, splits);
    if (wide) {
        const mi_mmq_wide_fn wk = mi_mmq_wide_kernel_of(w->type);
        if (!x_ready) {
            const int64_t n8 = (int64_t)nt * (ldh / 8);
            mi_mmq_x_f16_kernel<<<(unsigned)((n8 + 255) / 256), 256, 0, s>>>(x, ldx, (int)w->n_cols, nt, xh, ldh);
            MI_LAUNCH_TRY("mmq x to f16");
        }
        MI_CUDA_TRY(cudaFuncSetAttribute((const void *)wk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)MI_MMQW_SMEM));
        wk<<<grid, MI_MMQ_THREADS, MI_MMQW_SMEM, s>>>(w->data, w->row_bytes, n_rows, nchunks, xh, ldh, nt, kps, y, ldy,
                                                      bias, accumulate, part);
        MI_LAUNCH_TRY("mmq (wide)");
        if (xh_holds_x) *xh_holds_x = 1;
        __atomic_fetch_add(&mi_mmq_wide_count, 1, __ATOMIC_RELAXED);
    } else {
        const size_t smem = mi_mmq_smem_bytes(stages);
        if (smem > 48 * 1024) // above the default limit of dynamic shared memory: opt in (cheap, idempotent)
            MI_CUDA_TRY(cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kernel<<<grid, MI_MMQ_THREADS, smem, s>>>(w->data, w->row_bytes, n_rows, nchunks, x, ldx, nt, kps, y, ldy, bias,
                                                  accumulate, part);
        MI_LAUNCH_TRY("mmq");
    }
    if (part) {
        const int64_t n = (int64_t)out_floats;
        mi_mmq_reduce_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(part, splits, nt, n_rows, y, ldy, bias,
                                                                       accumulate);
        MI_LAUNCH_TRY("mmq reduce");
    }
    return MI_OK;
}

// Test entry (pyminfer.h): host operands in, host y out, on the default stream.
extern "C" int mi_cuda_op_mmq(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int32_t nt,
                              const float *bias, int32_t accumulate, float *y) {
    if (!mi_cuda_available()) return mi_set_error(MI_ERR_CUDA, "no CUDA device visible");
    const int be = mi_type_block_elems(type), bb = mi_type_block_bytes(type);
    if (!bb) return mi_set_error(MI_ERR_TYPE, "CUDA mmq: unsupported type %d", type);
    if (n_rows < 1 || n_cols < 32 || n_cols % 32 || n_cols % be || nt < 1)
        return mi_set_error(MI_ERR_ARG, "CUDA mmq: bad shape (n_rows %lld, n_cols %lld, nt %d)", (long long)n_rows,
                            (long long)n_cols, nt);
    mi_dtensor t;
    t.type = type;
    t.n_cols = n_cols;
    t.n_rows = n_rows;
    t.row_bytes = n_cols / be * bb;
    auto al = [](size_t n) { return (n + 255) & ~(size_t)255; };
    const size_t wb = (size_t)t.row_bytes * n_rows, xb = (size_t)nt * n_cols * 4, yb = (size_t)nt * n_rows * 4;
    const size_t bias_b = bias ? (size_t)n_rows * 4 : 0;
    // Scratch for the automatic splits, or for MI_CUDA_MMQ_SPLITS when that asks for more.
    const size_t sf_auto = mi_cuda_mmq_scratch_floats(n_rows, nt);
    const size_t sf_forced = (size_t)mi_mmq_forced_splits() * nt * n_rows;
    const size_t sf = sf_forced > sf_auto ? sf_forced : sf_auto, sb = sf * 4;
    const size_t xhn = mi_cuda_mmq_xh_halves(n_cols, nt), xhb = xhn * sizeof(__half);
    const size_t total = al(wb) + al(xb) + al(yb) + al(bias_b) + al(sb) + al(xhb);
    uint8_t *buf = nullptr;
    if (cudaMalloc(&buf, total) != cudaSuccess) {
        cudaGetLastError();
        return mi_set_error(MI_ERR_OOM, "CUDA out of memory allocating mmq operands (%zu MiB)", total >> 20);
    }
    uint8_t *wd = buf, *xd = wd + al(wb), *yd = xd + al(xb), *bd = yd + al(yb), *sd = bd + al(bias_b), *hd = sd + al(sb);
    t.data = wd;
    int rc = [&]() -> int {
        MI_CUDA_TRY(cudaMemcpy(wd, w, wb, cudaMemcpyHostToDevice));
        MI_CUDA_TRY(cudaMemcpy(xd, x, xb, cudaMemcpyHostToDevice));
        if (bias) MI_CUDA_TRY(cudaMemcpy(bd, bias, bias_b, cudaMemcpyHostToDevice));
        // y: the caller's values when accumulating, else all-NaN bytes so a missed element shows.
        if (accumulate)
            MI_CUDA_TRY(cudaMemcpy(yd, y, yb, cudaMemcpyHostToDevice));
        else
            MI_CUDA_TRY(cudaMemset(yd, 0xFF, yb));
        if (sb) MI_CUDA_TRY(cudaMemset(sd, 0xFF, sb)); // NaN partials: a split that skips a tile shows
        const int r = mi_cuda_mmq(&t, (const float *)xd, n_cols, nt, (float *)yd, n_rows,
                                  bias ? (const float *)bd : nullptr, accumulate, sb ? (float *)sd : nullptr, sf,
                                  xhb ? (__half *)hd : nullptr, xhn, 0, nullptr, 0);
        if (r) return r;
        MI_CUDA_TRY(cudaDeviceSynchronize());
        MI_CUDA_TRY(cudaMemcpy(y, yd, yb, cudaMemcpyDeviceToHost));
        return MI_OK;
    }();
    cudaFree(buf);
    return rc;
}
