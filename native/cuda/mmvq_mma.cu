// Verify-batch mat-vec on the int8 tensor cores: q4_K weights times 2..8 q8a activation rows,
// each output row bitwise equal to what the dp4a kernels (mmvq_kernels.cuh) give for that
// activation row alone.
//
// Why the bits can be equal: per 32-wide chunk the dp4a kernel computes an exact integer dot
// product isum, then the f32 term (dw * a.d) * (float)isum + mw * a.s (mi_chunk_dot); a row's sum
// is the per-thread sums of chunks j, j + tpr, ... (tpr threads a row, ascending c), then a warp
// butterfly over each 32 threads (mi_warp_sum) and the warps' results added in order
// (mi_row_reduce). mma.m16n8k32 gives the same isum (integers have no rounding), for 16 weight
// rows x 8 activation rows at once; this kernel then forms the same f32 terms, sums them per
// "thread slot" j in the same order, and replays the same butterfly and warp order from shared
// memory. tpr is the nt = 1 kernel's (a function of the matrix only, never of nt).
//
// Block: 128 threads, 16 weight rows (n_rows a multiple of 16). The tpr slots are taken in groups
// of 32 (one dp4a warp's lanes): each of the 4 warps computes 4 slot pairs (j, j + 1) of a group,
// j even, so chunk c = j + k tpr and c + 1 share their q4_K quant bytes (low / high nibbles: one
// 8-byte load a row feeds two MMAs). Fragments (mi_mma_s8): lane (g, q) = (lane / 4, lane % 4)
// holds rows g and g + 8 of the weights, activation row g, and result columns 2q, 2q + 1. The k
// order inside a chunk is permuted identically in A and B (logical k 4q..4q+3 = bytes 8q..8q+3,
// k 16 + 4q.. = bytes 8q+4..8q+7), so each lane loads 8 contiguous bytes of each.
// Reference layouts: q4_K block (144 bytes: d, dmin f16; 12 bytes of 6-bit scales / mins; qs[128],
// chunk pair 2i / 2i + 1 = low / high nibbles of qs[32i..32i+31]): ggml-common.h block_q4_K;
// the fragment maps: PTX ISA, "Matrix Fragments for mma.m16n8k32".
#include <cooperative_groups.h>
#include "mma.cuh"
#include "mmvq_kernels.cuh"

namespace {

constexpr int MI_MMA_ROWS = 16; // weight rows a block
using mi_q4k = mi_qt<MI_TYPE_Q4_K>;

// One chunk's term, mi_chunk_dot's (q4_K: sc0 = sc1 = 1, so isum is the whole dot); ds = (a.d, a.s).
__device__ __forceinline__ float mi_q4k_term(float dw, float mw, float2 ds, int isum) {
    return mi_chunk_term<MI_TYPE_Q4_K>(dw, mw, ds.x, ds.y, isum);
}

// Everything one slot pair's step reads (chunks c, c + 1 of rows g, g + 8 of each matrix; activation
// row g's quants and the (d, s) of result columns 2q, 2q + 1), loaded before any of it is used.
template <int NM> struct mi_mma_ld {
    int2 xv0, xv1;             // B: activation row g, chunks c / c + 1, this lane's 8 bytes
    float2 h00, h01, h10, h11; // (d, s) of columns 2q / 2q + 1, chunks c / c + 1
    int2 qa[NM], qb[NM];       // A: rows g / g + 8, this lane's 8 quant bytes of the chunk pair
    uint4 hd[NM];              // the q4_K block head this lane decodes (row g + 8 (q / 2))
};

template <int NM>
__device__ __forceinline__ void mi_mma_load(mi_mma_ld<NM> &l, int c, const uint8_t *const (&wr)[NM][2],
                                            const mi_block_q8a *xb, bool xb_ok, const mi_block_q8a *xc0, bool c0_ok,
                                            const mi_block_q8a *xc1, bool c1_ok, int q) {
    const int64_t boff = (int64_t)(c / mi_q4k::CPB) * mi_q4k::BB;
    const int k = c % mi_q4k::CPB;
    l.xv0 = xb_ok ? *(const int2 *)(xb[c].qs + 8 * q) : make_int2(0, 0);
    l.xv1 = xb_ok ? *(const int2 *)(xb[c + 1].qs + 8 * q) : make_int2(0, 0);
    l.h00 = c0_ok ? *(const float2 *)&xc0[c] : make_float2(0.0f, 0.0f);
    l.h01 = c1_ok ? *(const float2 *)&xc1[c] : make_float2(0.0f, 0.0f);
    l.h10 = c0_ok ? *(const float2 *)&xc0[c + 1] : make_float2(0.0f, 0.0f);
    l.h11 = c1_ok ? *(const float2 *)&xc1[c + 1] : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int m = 0; m < NM; m++) {
        const uint8_t *ba = wr[m][0] + boff, *bb = wr[m][1] + boff;
        l.qa[m] = *(const int2 *)(ba + 16 + 16 * k + 8 * q);
        l.qb[m] = *(const int2 *)(bb + 16 + 16 * k + 8 * q);
        l.hd[m] = *(const uint4 *)(q < 2 ? ba : bb);
    }
}

// The MMAs and f32 terms of one loaded step, added to acc[m][h][e] (h: chunk c + h).
template <int NM>
__device__ __forceinline__ void mi_mma_chunks(const mi_mma_ld<NM> &l, int c, float (&acc)[NM][2][4], int lane, int q) {
    const int k = c % mi_q4k::CPB;
#pragma unroll
    for (int m = 0; m < NM; m++) {
        // dw, mw of rows g / g + 8, chunks c / c + 1: the four lanes of row group g decode one each
        // (lane q: row g + 8 (q / 2), chunk c + q % 2) and share them.
        mi_chunk mine;
        mi_kquant_head_of(l.hd[m], k + (q & 1), mine);
        mi_chunk ha0, ha1, hb0, hb1;
        mi_chunk *const hs[4] = {&ha0, &ha1, &hb0, &hb1};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            hs[i]->dw = __shfl_sync(MI_FULL_MASK, mine.dw, (lane & ~3) | i);
            hs[i]->mw = __shfl_sync(MI_FULL_MASK, mine.mw, (lane & ~3) | i);
        }
        const int2 qa = l.qa[m], qb = l.qb[m];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int sh = 4 * h;
            const uint32_t a[4] = {((uint32_t)qa.x >> sh) & 0x0F0F0F0Fu, ((uint32_t)qb.x >> sh) & 0x0F0F0F0Fu,
                                   ((uint32_t)qa.y >> sh) & 0x0F0F0F0Fu, ((uint32_t)qb.y >> sh) & 0x0F0F0F0Fu};
            const int2 xv = h ? l.xv1 : l.xv0;
            int d[4];
            mi_mma_s8(d, a, (uint32_t)xv.x, (uint32_t)xv.y);
            const mi_chunk &ga = h ? ha1 : ha0, &gb = h ? hb1 : hb0;
            const float2 e0 = h ? l.h10 : l.h00, e1 = h ? l.h11 : l.h01;
            acc[m][h][0] = __fadd_rn(acc[m][h][0], mi_q4k_term(ga.dw, ga.mw, e0, d[0]));
            acc[m][h][1] = __fadd_rn(acc[m][h][1], mi_q4k_term(ga.dw, ga.mw, e1, d[1]));
            acc[m][h][2] = __fadd_rn(acc[m][h][2], mi_q4k_term(gb.dw, gb.mw, e0, d[2]));
            acc[m][h][3] = __fadd_rn(acc[m][h][3], mi_q4k_term(gb.dw, gb.mw, e1, d[3]));
        }
    }
}

// SPLIT (sm_90): block (x, y) computes only slot group y of row tile x, and the tpr / 32 blocks of
// a row tile form one thread block cluster whose rank 0 adds the groups' sums in group order from
// its peers' shared memory and finishes the rows: the same additions in the same order, so the
// same bits, with tpr / 32 times the blocks, each doing that fraction of the dependent load -> MMA
// steps. For ffn_down of the 1.5B / 7B shapes (280 / 592 chunks a row, tpr 128, only 96 / 224 row
// tiles): GPU ms a forward at nt = 8, 1.879 -> 1.762 / 5.323 -> 5.155 (docs/perf.md, session 20).
template <int NT, bool GLU, bool SPLIT>
__global__ void __launch_bounds__(MI_MMVQ_THREADS)
    mi_mmvq_mma_q4k_kernel(const uint8_t *__restrict__ w0, const uint8_t *__restrict__ w1, int64_t row_bytes, int n_rows,
                           int nchunks, const mi_block_q8a *__restrict__ xq, int64_t ldxb, const mi_mmvq_out os,
                           int accumulate, int tpr) {
    constexpr int NM = GLU ? 2 : 1; // matrices (gate, up)
    __shared__ float P[NM][32][MI_MMA_ROWS][8]; // [matrix][slot in group][row][activation row]
    __shared__ float R[NM][MI_MMA_ROWS][8];     // finished sums (SPLIT: this block's group's, read by rank 0)
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, q = lane % 4;
    const int r0 = blockIdx.x * MI_MMA_ROWS;
    // The groups this block sums, and whether it finishes the rows (SPLIT: cluster rank 0 = y 0).
    const int grp0 = SPLIT ? (int)blockIdx.y : 0, grp1 = SPLIT ? grp0 + 1 : tpr / 32;
    const bool finisher = !SPLIT || blockIdx.y == 0;
    // (SPLIT: the row tile's blocks prefetch 16 / gridDim.y of its rows each, not all 16 each.)
    mi_mmvq_prologue(w0, GLU ? w1 : nullptr, row_bytes, r0 + grp0 * (int)(MI_MMA_ROWS / gridDim.y),
                     MI_MMA_ROWS / (int)gridDim.y, n_rows, os);
    mi_epi_in<NT> in; // thread k < 16 finishes row r0 + k
    mi_epilogue_load<NT>(r0 + (int)threadIdx.x, finisher && threadIdx.x < MI_MMA_ROWS, os, accumulate, in);

    const uint8_t *wr[NM][2]; // rows g, g + 8 of each matrix
    wr[0][0] = w0 + (int64_t)(r0 + g) * row_bytes;
    wr[0][1] = w0 + (int64_t)(r0 + g + 8) * row_bytes;
    if (GLU) {
        wr[NM - 1][0] = w1 + (int64_t)(r0 + g) * row_bytes;
        wr[NM - 1][1] = w1 + (int64_t)(r0 + g + 8) * row_bytes;
    }
    const bool xb_ok = g < NT;                                       // B column g = activation row g
    const mi_block_q8a *xb = xq + (int64_t)(xb_ok ? g : 0) * ldxb;
    const bool c0_ok = 2 * q < NT, c1_ok = 2 * q + 1 < NT;           // result columns 2q, 2q + 1
    const mi_block_q8a *xc0 = xq + (int64_t)(c0_ok ? 2 * q : 0) * ldxb;
    const mi_block_q8a *xc1 = xq + (int64_t)(c1_ok ? 2 * q + 1 : 0) * ldxb;
    const int rr = threadIdx.x / 8, cc = threadIdx.x % 8; // this thread's (row, column) in the replay
    float res[NM];
#pragma unroll
    for (int m = 0; m < NM; m++) res[m] = 0.0f;

    for (int grp = grp0; grp < grp1; grp++) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int jj = 2 * (warp + 4 * u); // slot pair (jj, jj + 1) of this group
            float acc[NM][2][4];
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[m][h][e] = 0.0f;
            for (int c = 32 * grp + jj; c < nchunks; c += tpr) { // c even: chunks c, c + 1
                mi_mma_ld<NM> ld;
                mi_mma_load<NM>(ld, c, wr, xb, xb_ok, xc0, c0_ok, xc1, c1_ok, q);
                mi_mma_chunks<NM>(ld, c, acc, lane, q);
            }
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    P[m][jj + h][g][2 * q] = acc[m][h][0];
                    P[m][jj + h][g][2 * q + 1] = acc[m][h][1];
                    P[m][jj + h][g + 8][2 * q] = acc[m][h][2];
                    P[m][jj + h][g + 8][2 * q + 1] = acc[m][h][3];
                }
        }
        __syncthreads();
        // Replay mi_warp_sum over this group's 32 slots (lane i adds lane i ^ o, o = 16 .. 1: the
        // value lane 0 ends with), then add it to the previous groups' in order (mi_row_reduce).
#pragma unroll
        for (int m = 0; m < NM; m++) {
            float v[32];
#pragma unroll
            for (int i = 0; i < 32; i++) v[i] = P[m][i][rr][cc];
#pragma unroll
            for (int i = 0; i < 16; i++) v[i] = __fadd_rn(v[i], v[i + 16]);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = __fadd_rn(v[i], v[i + 8]);
#pragma unroll
            for (int i = 0; i < 4; i++) v[i] = __fadd_rn(v[i], v[i + 4]);
            v[0] = __fadd_rn(v[0], v[2]);
            v[1] = __fadd_rn(v[1], v[3]);
            v[0] = __fadd_rn(v[0], v[1]);
            res[m] = grp == grp0 ? v[0] : __fadd_rn(res[m], v[0]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < NM; m++) R[m][rr][cc] = res[m];
    if constexpr (SPLIT) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 // launched only there (mi_mma_go)
        namespace cg = cooperative_groups;
        cg::cluster_group cl = cg::this_cluster();
        cl.sync(); // every group's sums are visible to rank 0 (release / acquire)
        if (finisher) {
            float v[4][NM]; // groups 1.. (<= 4: tpr <= 128), every peer's load in flight at once
#pragma unroll
            for (int k = 1; k < 4; k++)
#pragma unroll
                for (int m = 0; m < NM; m++)
                    v[k][m] = k < (int)gridDim.y ? cl.map_shared_rank(&R[m][rr][cc], k)[0] : 0.0f;
#pragma unroll
            for (int k = 1; k < 4; k++)
#pragma unroll
                for (int m = 0; m < NM; m++)
                    if (k < (int)gridDim.y) res[m] = __fadd_rn(res[m], v[k][m]);
        }
        cl.sync(); // no block leaves while rank 0 may still read its shared memory
        if (!finisher) return;
#pragma unroll
        for (int m = 0; m < NM; m++) R[m][rr][cc] = res[m];
#else
        __trap(); // compiled without clusters: mi_mma_go never launches this (a wrong sum must not pass silently)
#endif
    }
    __syncthreads();
    if (threadIdx.x < MI_MMA_ROWS) {
        float acc[NT], acc1[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            acc[t] = R[0][threadIdx.x][t];
            acc1[t] = R[NM - 1][threadIdx.x][t];
        }
        mi_epilogue<NT>(acc, acc1, GLU, r0 + (int)threadIdx.x, os, accumulate, in);
    }
    if (os.yq) mi_group_quant<NT>(os, r0, MI_MMA_ROWS);
}

uint64_t mi_split_count = 0; // cluster launches so far (mi_cuda_mmvq_mma_split_launches)

template <int NT, bool GLU, bool SPLIT>
cudaError_t mi_mma_go(int groups, const mi_mmvq_args &a, int tpr, cudaStream_t s) {
    const auto k = mi_mmvq_mma_q4k_kernel<NT, GLU, SPLIT>;
    if constexpr (SPLIT) {
        // Only kernel code compiled for sm_90+ has the cluster merge: not a binary whose kernels come
        // from older PTX (JIT-compiled for this GPU: binaryVersion is then this GPU's, ptxVersion the
        // PTX's), nor a GPU below sm_90.
        static int ok = -1;
        if (ok < 0) {
            cudaFuncAttributes fa;
            ok = mi_cc_major() >= 9 && cudaFuncGetAttributes(&fa, k) == cudaSuccess && fa.ptxVersion >= 90 &&
                 fa.binaryVersion >= 90;
            cudaGetLastError();
        }
        if (!ok) return mi_mma_go<NT, GLU, false>(groups, a, tpr, s);
        __atomic_add_fetch(&mi_split_count, 1, __ATOMIC_RELAXED);
        cudaLaunchAttribute attr[2];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 1;
        attr[0].val.clusterDim.y = groups;
        attr[0].val.clusterDim.z = 1;
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(a.n_rows / MI_MMA_ROWS, groups);
        cfg.blockDim = dim3(MI_MMVQ_THREADS);
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = mi_pdl_on(s) ? 2 : 1;
        return cudaLaunchKernelEx(&cfg, k, a.w0, a.w1, a.row_bytes, a.n_rows, a.n_cols / 32, a.xq, a.ldx / 32, a.os,
                                  a.accumulate, tpr);
    } else {
        return mi_launch(k, a.n_rows / MI_MMA_ROWS, MI_MMVQ_THREADS, s, a.w0, a.w1, a.row_bytes, a.n_rows,
                         a.n_cols / 32, a.xq, a.ldx / 32, a.os, a.accumulate, tpr);
    }
}

template <int NT> cudaError_t mi_mma_one(bool glu, const mi_mmvq_args &a, cudaStream_t s) {
    const int tpr = a.warp ? 32 * a.warp : MI_MMVQ_THREADS / a.rpb; // threads a row of the nt = 1 kernel
    const int split = mi_mmvq_mma_split_mode(), groups = tpr / 32;
    if (split < 0) return cudaErrorInvalidValue;
    const bool cluster = groups > 1 && groups <= 4 && (split == 1 || (split == 2 && !glu));
    if (glu)
        return cluster ? mi_mma_go<NT, true, true>(groups, a, tpr, s) : mi_mma_go<NT, true, false>(groups, a, tpr, s);
    return cluster ? mi_mma_go<NT, false, true>(groups, a, tpr, s) : mi_mma_go<NT, false, false>(groups, a, tpr, s);
}

} // namespace

// MI_CUDA_MMVQ_MMA_SPLIT (read at every call; a graph keeps what was set at capture): where the
// nt = 1 kernel has more than 32 threads a row, 2 (default) = a cluster of tpr / 32 blocks a row
// tile for the plain matrices, one block a row tile for gate / up with SwiGLU (whose 2-group split
// lost: 7B shape, nt = 8, the gate / up cost 1.23 -> 1.80 ms a forward); 1 = clusters for both; 0 =
// one block a row tile everywhere. Clusters need sm_90 code (below it: one block a row tile). -1:
// malformed (mi_cuda_mmvq_seg refuses it first).
int mi_mmvq_mma_split_mode() {
    const char *ev = getenv("MI_CUDA_MMVQ_MMA_SPLIT");
    if (!ev) return 2;
    return ev[0] >= '0' && ev[0] <= '2' && ev[1] == 0 ? ev[0] - '0' : -1;
}

static uint64_t mi_mma_count = 0; // launches so far (mi_cuda_mmvq_mma_launches)
extern "C" uint64_t mi_cuda_mmvq_mma_launches(void) { return __atomic_load_n(&mi_mma_count, __ATOMIC_RELAXED); }
extern "C" uint64_t mi_cuda_mmvq_mma_split_launches(void) { return __atomic_load_n(&mi_split_count, __ATOMIC_RELAXED); }

bool mi_mmvq_mma_applies(int type, int64_t n_rows, int64_t n_cols, int any_rope) {
    return type == MI_TYPE_Q4_K && n_rows % MI_MMA_ROWS == 0 && n_cols % 256 == 0 && !any_rope;
}

cudaError_t mi_mmvq_mma_launch(bool glu, int nt, const mi_mmvq_args &a, cudaStream_t s) {
    if (nt < 2 || nt > 8) return cudaErrorInvalidValue;
    __atomic_add_fetch(&mi_mma_count, 1, __ATOMIC_RELAXED);
    switch (nt) {
    case 2: return mi_mma_one<2>(glu, a, s);
    case 3: return mi_mma_one<3>(glu, a, s);
    case 4: return mi_mma_one<4>(glu, a, s);
    case 5: return mi_mma_one<5>(glu, a, s);
    case 6: return mi_mma_one<6>(glu, a, s);
    case 7: return mi_mma_one<7>(glu, a, s);
    default: return mi_mma_one<8>(glu, a, s);
    }
}
