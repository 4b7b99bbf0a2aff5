// Decode attention, flash-decoding style (Dao et al., "Flash-Decoding for long-context inference",
// 2023): grid (head block, row, split). A block serves one row t, one KV split and one query head
// (or, MI_CUDA_ATTN_GROUP=1, every query head sharing a KV head: G of them, four warps each, the
// K/V rows shared through L1). Four warps per head take U consecutive slots each per step (all
// their K/V loads in flight together) and run an exact, max-subtracted online softmax in f32;
// warps, then splits, are merged in a fixed order. Before the PDL wait the block prefetches its
// K/V rows into L2 (older slots are constants by then). The last
// block of a (row, head block) to finish (a counter, as the CUDA threadFenceReduction sample)
// merges the splits and quantizes the output: one launch per layer (the tensor-core kernel: two
// where mi_attn_combine_kernel merges).
//
// Identity contract: the split boundaries, the slots each warp takes and every reduction order
// are functions of n_kv = pos[t] + 1 and of the model's shape alone, so a row's output never
// depends on nt, on the other rows, or on graphs.
#include <math.h>
#include <type_traits>
#include "attention.cuh"
#include "mma.cuh"

namespace {
constexpr int MI_ATTN_THREADS = 128;
constexpr int MI_ATTN_WARPS = MI_ATTN_THREADS / 32;

// Slots per warp per step (a compile-time function of head_dim): K and V rows of U slots sit in
// registers at once, 2 * U * DPL floats.
template <int DPL> __host__ __device__ constexpr int mi_attn_unroll() { return DPL <= 2 ? 16 : DPL <= 4 ? 8 : 4; }

// Slots [0, n_kv) are cut into tiles of `tile` slots (one step of the block) and the tiles into
// at most max_splits splits of equal whole tiles: S slots per split, n_used splits.
__device__ __forceinline__ void mi_attn_split_size(int n_kv, int tile, int max_splits, int &S, int &n_used) {
    const int n_tiles = (n_kv + tile - 1) / tile;
    S = tile * ((n_tiles + max_splits - 1) / max_splits);
    n_used = (n_kv + S - 1) / S;
}

// DPL contiguous halves of a K or V row into f32, in the widest aligned loads DPL allows (the row
// offset lane * DPL halves is 2 * DPL-byte aligned): 16, 8, 4 or 2 bytes at a time.
template <int DPL> __device__ __forceinline__ void mi_ld_halves(const __half *p, float *f) {
    constexpr int W = DPL % 8 == 0 ? 8 : DPL % 4 == 0 ? 4 : DPL % 2 == 0 ? 2 : 1; // halves per load
    using V = std::conditional_t<W == 8, uint4, std::conditional_t<W == 4, uint2, std::conditional_t<W == 2, uint32_t, uint16_t>>>;
#pragma unroll
    for (int i = 0; i < DPL; i += W) {
        const V u = *(const V *)(p + i);
        const __half *h = (const __half *)&u;
#pragma unroll
        for (int k = 0; k < W; k++) f[i + k] = __half2float(h[k]);
    }
}

// Score reduction of U = 2^k slots over a warp with U - 1 + 5 - k shuffles instead of 5U (a
// transposed butterfly): at the level of distance o (16, 8, ...) each lane keeps half of its slots
// (the upper half where lane & o) and adds its partner's partial of them; after k levels lane l
// holds one slot, mi_attn_slot<U>(l), and a plain butterfly over the remaining distances finishes
// it (every lane holding a slot gets the same bits: each step adds the same two values). The tree
// is fixed, so the sums are deterministic.
template <int U> __device__ __forceinline__ int mi_attn_slot(int lane) {
    int u = 0;
#pragma unroll
    for (int o = 16, n = U; n > 1; o >>= 1, n >>= 1)
        if (lane & o) u += n / 2;
    return u;
}
template <int U> __device__ __forceinline__ int mi_attn_lane(int u) { // the first lane holding slot u
    int l = 0;
#pragma unroll
    for (int o = 16, n = U; n > 1; o >>= 1, n >>= 1)
        if (u >= n / 2) {
            l |= o;
            u -= n / 2;
        }
    return l;
}
template <int U> __device__ __forceinline__ float mi_attn_reduce(float *v, int lane) {
    int o = 16;
#pragma unroll
    for (int n = U; n > 1; n >>= 1, o >>= 1) {
        const bool up = lane & o;
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            const float keep = up ? v[i + n / 2] : v[i], send = up ? v[i] : v[i + n / 2];
            v[i] = __fadd_rn(keep, __shfl_xor_sync(MI_FULL_MASK, send, o));
        }
    }
    float r = v[0];
#pragma unroll
    for (; o > 0; o >>= 1) r = __fadd_rn(r, __shfl_xor_sync(MI_FULL_MASK, r, o));
    return r;
}
// Max / sum over the U slots (lanes differing in the slot bits 16, 8, ..): same value in every lane.
template <int U> __device__ __forceinline__ float mi_attn_slots_max(float v) {
#pragma unroll
    for (int o = 16, n = U; n > 1; o >>= 1, n >>= 1) v = fmaxf(v, __shfl_xor_sync(MI_FULL_MASK, v, o));
    return v;
}
template <int U> __device__ __forceinline__ float mi_attn_slots_sum(float v) {
#pragma unroll
    for (int o = 16, n = U; n > 1; o >>= 1, n >>= 1) v = __fadd_rn(v, __shfl_xor_sync(MI_FULL_MASK, v, o));
    return v;
}

// One step of a warp's online softmax for one query head over U slots j0 .. j0+U-1 (slots >= k1
// masked): K/V rows in kf/vf (this lane's DPL dims), running max m, denominator l and output acc.
// Lane l ends the score reduction holding slot my_u = mi_attn_slot<U>(l). Per-head and grouped
// blocks both run their slots through this, so a row's bits depend only on which slots a step takes.
template <int DPL, int U>
__device__ __forceinline__ void mi_attn_step(const float (&qr)[DPL], const float (&kf)[U][DPL], const float (&vf)[U][DPL],
                                             int j0, int k1, int my_u, float scale, int lane, float &m, float &l,
                                             float (&acc)[DPL]) {
    float sc[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) d = __fadd_rn(d, __fmul_rn(qr[i], kf[u][i]));
        sc[u] = d;
    }
    const float dot = mi_attn_reduce<U>(sc, lane); // every lane: the shuffles need the full warp
    const float sv = j0 + my_u < k1 ? __fmul_rn(dot, scale) : -INFINITY;
    const float mx = fmaxf(m, mi_attn_slots_max<U>(sv));
    const float corr = expf(m - mx); // 0 on the first step (m = -inf)
    const float p = expf(sv - mx);   // 0 for masked slots
    l = __fadd_rn(__fmul_rn(l, corr), mi_attn_slots_sum<U>(p));
    float pu[U];
#pragma unroll
    for (int u = 0; u < U; u++) pu[u] = __shfl_sync(MI_FULL_MASK, p, mi_attn_lane<U>(u));
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        float a = __fmul_rn(acc[i], corr);
#pragma unroll
        for (int u = 0; u < U; u++) a = __fadd_rn(a, __fmul_rn(pu[u], vf[u][i]));
        acc[i] = a;
    }
    m = mx;
}

// K and V rows j0 .. j0+U-1 (clamped to k1 - 1) of KV head g, this lane's DPL dims, all in flight.
template <int DPL, int U>
__device__ __forceinline__ void mi_attn_load(const __half *__restrict__ kc, const __half *__restrict__ vc, int j0, int k1,
                                             int kvd, int g, int lane, float (&kf)[U][DPL], float (&vf)[U][DPL]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int j = min(j0 + u, k1 - 1);
        mi_ld_halves<DPL>(kc + (int64_t)j * kvd + g * DPL * 32 + lane * DPL, kf[u]);
        mi_ld_halves<DPL>(vc + (int64_t)j * kvd + g * DPL * 32 + lane * DPL, vf[u]);
    }
}

// Hint K/V rows k0 .. k1-1 of KV head g into L2 (nthreads threads of the block share the lines).
template <int HD>
__device__ __forceinline__ void mi_attn_prefetch(const __half *kc, const __half *vc, int k0, int k1, int kvd, int g,
                                                 int nthreads) {
    constexpr int LPR = (2 * HD + 127) / 128; // 128-byte lines per row
    for (int i = threadIdx.x; i < (k1 - k0) * 2 * LPR; i += nthreads) {
        const int j = k0 + i / (2 * LPR), l = i % (2 * LPR);
        const __half *row = (l < LPR ? kc : vc) + (int64_t)j * kvd + g * HD;
        mi_prefetch_l2_line((const char *)row + (l % LPR) * 128);
    }
}

// The decode kernels' common prologue for the block of row t, KV split s and KV head g: the
// split's slots [k0, k1) and the row's split count n_used (mi_attn_split_size over tiles of `tile`
// slots), its K/V rows hinted into L2 before the PDL wait (older slots are constants by then; slot
// pos[t] may still be in flight), then the wait. pos was copied in before the forward's first
// kernel, which every kernel of the chain (transitively) started after: readable before the wait.
// Returns false, after the wait (every block must wait: common.cuh), where the whole block has
// nothing to do: a row left to the other attention call (pos[t] outside [lo, hi)) or a split past
// n_used (the same for all its threads).
// mi_attn_split_range: the split arithmetic alone (no prefetch, no wait), for a kernel that serves
// more than one row a block (mi_attn_mma_kernel's pairs). True where this block has work for row t.
__device__ __forceinline__ bool mi_attn_split_range(const int32_t *pos, int t, int s, int tile, int max_splits, int lo,
                                                    int hi, int &k0, int &k1, int &n_used) {
    const int n_kv = pos[t] + 1;
    int S;
    mi_attn_split_size(n_kv, tile, max_splits, S, n_used);
    k0 = s * S;
    k1 = min(n_kv, k0 + S);
    return pos[t] >= lo && pos[t] < hi && s < n_used;
}
template <int HD>
__device__ __forceinline__ bool mi_attn_split_begin(const __half *kc, const __half *vc, const int32_t *pos, int t,
                                                    int s, int g, int kvd, int tile, int max_splits, int lo, int hi,
                                                    int nthreads, int &k0, int &k1, int &n_used) {
    const bool work = mi_attn_split_range(pos, t, s, tile, max_splits, lo, hi, k0, k1, n_used);
    if (work) mi_attn_prefetch<HD>(kc, vc, k0, k1, kvd, g, nthreads);
    mi_pdl_wait();
    mi_pdl_trigger();
    return work;
}

// Merge the n_used split partials [M, L, acc[HD]] of query head h, row t (one warp) into att and
// its q8a blocks: lane i holds splits i and i + 32 (n_used <= 64) for the max and the denominator;
// the output dims are 32c + lane (c < DPL), one q8a block per c.
template <int DPL, int UNR = 8> // UNR: splits' partial loads in flight per lane
__device__ __forceinline__ void mi_attn_merge(const float *__restrict__ part, int t, int h, int n_head, int n_used,
                                              float *__restrict__ att, mi_block_q8a *__restrict__ xq, int lane) {
    constexpr int HD = DPL * 32;
    const int qd = n_head * HD;
    const float *p = part + ((int64_t)t * n_head + h) * MI_ATTN_MMA_SPLITS * (HD + 2);
    const float m0 = lane < n_used ? __ldcg(p + lane * (HD + 2)) : -INFINITY;
    const float m1 = lane + 32 < n_used ? __ldcg(p + (lane + 32) * (HD + 2)) : -INFINITY;
    const float l0 = lane < n_used ? __ldcg(p + lane * (HD + 2) + 1) : 0.0f;
    const float l1 = lane + 32 < n_used ? __ldcg(p + (lane + 32) * (HD + 2) + 1) : 0.0f;
    const float PM = mi_warp_max(fmaxf(m0, m1));
    const float e0 = lane < n_used ? expf(m0 - PM) : 0.0f, e1 = lane + 32 < n_used ? expf(m1 - PM) : 0.0f;
    const float PL = mi_warp_sum(__fadd_rn(__fmul_rn(l0, e0), __fmul_rn(l1, e1)));
    float A[DPL];
#pragma unroll
    for (int c = 0; c < DPL; c++) A[c] = 0.0f;
#pragma unroll UNR
    for (int i = 0; i < n_used; i++) {
        const float e = __shfl_sync(MI_FULL_MASK, i < 32 ? e0 : e1, i & 31);
#pragma unroll
        for (int c = 0; c < DPL; c++) A[c] = __fadd_rn(A[c], __fmul_rn(__ldcg(p + i * (HD + 2) + 2 + 32 * c + lane), e));
    }
    const float r = __frcp_rn(PL);
#pragma unroll
    for (int c = 0; c < DPL; c++) {
        const float o = __fmul_rn(A[c], r);
        att[(int64_t)t * qd + h * HD + 32 * c + lane] = o;
        mi_quant_chunk_warp(o, xq + (int64_t)t * (qd / 32) + h * (HD / 32) + c, lane);
    }
}

// DPL = head_dim / 32 dims per lane (contiguous, so one K row is one coalesced 2*hd-byte read).
// G == 1: block x is query head x, reading KV head x / (n_head / n_head_kv) (any grouping), four
// warps. G > 1: block x serves KV head x and its query heads x*G .. x*G + G-1 with four warps
// each, warp w of head gg doing exactly what warp w of that head's G == 1 block does (same slots,
// same merge order: the same bits). The G heads' warps read the same K/V rows at about the same
// time, so L1 serves most repeats: per-head blocks read each K/V row from L2 once per query head.
template <int DPL, int G>
__global__ void __launch_bounds__(G * MI_ATTN_THREADS)
    mi_attn_kernel(const float *__restrict__ q, const __half *__restrict__ kc, const __half *__restrict__ vc,
                   const int32_t *__restrict__ pos, int n_head, int n_head_kv, float scale, int max_splits,
                   float *__restrict__ part, int32_t *__restrict__ cnt, float *__restrict__ att,
                   mi_block_q8a *__restrict__ xq, int lo, int hi) {
    constexpr int HD = DPL * 32, U = mi_attn_unroll<DPL>(), TILE = MI_ATTN_WARPS * U, NTH = G * MI_ATTN_THREADS;
    const int x = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    const int g = G > 1 ? x : x / (n_head / n_head_kv), h0 = G > 1 ? x * G : x;
    const int gg = threadIdx.x / MI_ATTN_THREADS, h = h0 + gg; // this thread's query head
    const int kvd = n_head_kv * HD;
    const int warp = threadIdx.x / 32 % MI_ATTN_WARPS, lane = threadIdx.x % 32;
    int k0, k1, n_used;
    if (!mi_attn_split_begin<HD>(kc, vc, pos, t, s, g, kvd, TILE, max_splits, lo, hi, NTH, k0, k1, n_used)) return;
    float qr[DPL], acc[DPL], m = -INFINITY, l = 0.0f;
    const float *qh = q + ((int64_t)t * n_head + h) * HD + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        qr[i] = qh[i];
        acc[i] = 0.0f;
    }
    // Warp w takes slots j0 .. j0 + U-1 with j0 = k0 + w*U, k0 + w*U + TILE, ...; the first is
    // always < k1, so the step's max is finite; slots >= k1 score -inf (weight 0).
    // Lane l ends the score reduction holding slot mi_attn_slot<U>(l) (mi_attn_reduce).
    const int my_u = mi_attn_slot<U>(lane);
    for (int j0 = k0 + warp * U; j0 < k1; j0 += TILE) {
        float kf[U][DPL], vf[U][DPL];
        mi_attn_load<DPL, U>(kc, vc, j0, k1, kvd, g, lane, kf, vf);
        mi_attn_step<DPL, U>(qr, kf, vf, j0, k1, my_u, scale, lane, m, l, acc);
    }
    // Warps -> this split's partial [M, L, acc[HD]] per query head: warp weights e = exp(m_w - M)
    // once per (warp, head), then the warps summed in order.
    __shared__ float sm_m[G][MI_ATTN_WARPS], sm_l[G][MI_ATTN_WARPS], sm_e[G][MI_ATTN_WARPS], sm_M[G];
    __shared__ float sm_acc[G][MI_ATTN_WARPS][HD];
    if (lane == 0) {
        sm_m[gg][warp] = m;
        sm_l[gg][warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; i++) sm_acc[gg][warp][lane * DPL + i] = acc[i];
    __syncthreads();
    if (threadIdx.x < MI_ATTN_WARPS * G) {
        const int hh = threadIdx.x / MI_ATTN_WARPS, w = threadIdx.x % MI_ATTN_WARPS;
        float M = -INFINITY;
#pragma unroll
        for (int v = 0; v < MI_ATTN_WARPS; v++) M = fmaxf(M, sm_m[hh][v]);
        sm_e[hh][w] = sm_m[hh][w] == -INFINITY ? 0.0f : expf(sm_m[hh][w] - M); // a warp with no slot adds 0
        if (w == 0) sm_M[hh] = M;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += NTH) {
        const int hh = idx / HD, dd = idx % HD;
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < MI_ATTN_WARPS; w++) a = __fadd_rn(a, __fmul_rn(sm_acc[hh][w][dd], sm_e[hh][w]));
        float *out = part + (((int64_t)t * n_head + h0 + hh) * MI_ATTN_MMA_SPLITS + s) * (HD + 2);
        out[2 + dd] = a;
        if (dd == 0) {
            float L = 0.0f;
#pragma unroll
            for (int w = 0; w < MI_ATTN_WARPS; w++) L = __fadd_rn(L, __fmul_rn(sm_l[hh][w], sm_e[hh][w]));
            out[0] = sm_M[hh];
            out[1] = L;
        }
    }
    // Publish this split, count it; the last of the n_used splits merges (and re-arms the counter).
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t *c = cnt + (int64_t)t * n_head + x;
        last = atomicAdd(c, 1) == n_used - 1;
        if (last) *c = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int wi = threadIdx.x / 32; // one warp per query head
    if (wi < G) mi_attn_merge<DPL>(part, t, h0 + wi, n_head, n_used, att, xq, lane);
}

// Tensor-core variant (MI_CUDA_ATTN_MMA=1): block = (KV head g, row t, split s), 8 or 4 warps (or, G
// <= 8, a pair of rows: mi_attn_mma_kernel); the G <= 16 query heads of KV head g are the M rows
// of mma.m16n8k16 (rows >= G are zero, or the second row's heads), so each
// K/V row is read once per block instead of once per query head, and q.K and P.V are summed over
// d and over slots by the tensor cores instead of by shuffles and FMA chains. The operands are f16:
// K and V are f16 already; q (f32) and P (f32 in [0, 1], times 2^12) are each split into hi = f16(x)
// and lo = f16(x - hi), two mma per product, so they keep ~22 significant bits for |x| >= 2^-3 (below
// that lo is a subnormal f16: an absolute error of ~3e-8 in x), and the products are summed in f32
// (PTX ISA, "Warp-level matrix multiply-accumulate instructions"). |q| >= 65520 would overflow f16
// (hi = inf: NaN scores) where the CUDA-core kernel stays finite; K must fit f16 anyway. Not bitwise equal
// to the CUDA-core kernels or to the CPU (another summation order: a stated tolerance, tests), but
// rows stay bitwise across nt: a warp takes 16-slot tiles j0 = k0 + 16w, + 64, ... of its split,
// all functions of pos[t] alone.
//
// Fragment maps (lane = 4 gid + tig): S = Q K^T: the B fragment of k-step 2c + e for slot gid of an
// n-tile is the K row's halves d = 32c + 8tig + 4e + {0,1} (b0, b1) and + {2,3} (b2, b3): one
// 16-byte load per lane per row and c feeds two k-steps, and Q's A fragment follows the same map
// (the sum over d does not care which k it sits at). O = P V: n-tile 8m + i has column n = gid at
// d = 64m + 8gid + i, so one 16-byte load of each of the lane's four V rows (slots 2tig, 2tig + 1,
// 8 + 2tig, 9 + 2tig) feeds eight n-tiles; the accumulator's column n = 2tig + e is d = 64m + 8n + i.
constexpr int MI_ATTN_MMA_TILE = 16; // slots per warp step
// Warps a tensor-core block for G query heads a KV head (8 for G <= 8, else 4 with 16 merge rows):
// the launch's choice, and so the slots per block step (x MI_ATTN_MMA_TILE) the combine launch
// recomputes the splits from.
__host__ __device__ constexpr int mi_attn_mma_warps(int G) { return G <= 8 ? 8 : 4; }

// x0, x1 -> f16 pairs hi = f16(x), lo = f16(x - hi) (x0 in the low half, the lower k index).
__device__ __forceinline__ void mi_split_f16x2(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
    const __half l0 = __float2half_rn(__fsub_rn(x0, __half2float(h0))), l1 = __float2half_rn(__fsub_rn(x1, __half2float(h1)));
    hi = (uint32_t)__half_as_ushort(h0) | ((uint32_t)__half_as_ushort(h1) << 16);
    lo = (uint32_t)__half_as_ushort(l0) | ((uint32_t)__half_as_ushort(l1) << 16);
}

// Q's A fragments for the tensor-core kernels, hi and lo: k-step 2c + e, fragment rows gid (row 0)
// and gid + 8 (row 1), halves d = 32c + 8tig + 4e + {0,1} (regs 0, 1) and + {2,3} (regs 2, 3).
// qrow[r]: that row's HD floats, or NULL for a zero row.
template <int HD>
__device__ __forceinline__ void mi_attn_q_frags(const float *const (&qrow)[2], int tig, uint32_t (&qa)[HD / 16][4],
                                                uint32_t (&ql)[HD / 16][4]) {
#pragma unroll
    for (int c = 0; c < HD / 32; c++) {
        float v[2][8];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (qrow[r]) {
                const float4 *p = (const float4 *)(qrow[r] + 32 * c + 8 * tig);
                const float4 a = p[0], b = p[1];
                v[r][0] = a.x; v[r][1] = a.y; v[r][2] = a.z; v[r][3] = a.w;
                v[r][4] = b.x; v[r][5] = b.y; v[r][6] = b.z; v[r][7] = b.w;
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) v[r][i] = 0.0f;
            }
        }
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int kk = 2 * c + e;
            mi_split_f16x2(v[0][4 * e], v[0][4 * e + 1], qa[kk][0], ql[kk][0]);
            mi_split_f16x2(v[1][4 * e], v[1][4 * e + 1], qa[kk][1], ql[kk][1]);
            mi_split_f16x2(v[0][4 * e + 2], v[0][4 * e + 3], qa[kk][2], ql[kk][2]);
            mi_split_f16x2(v[1][4 * e + 2], v[1][4 * e + 3], qa[kk][3], ql[kk][3]);
        }
    }
}

// One 16-slot tile j0 .. j0 + 15 of the tensor-core attention for this lane's fragment rows gid
// (row 0) and gid + 8 (row 1): scores S = Q K^T (hi and lo parts of Q), slots j >= bound[r] of row r
// masked, the online-softmax update of m, l (this lane's columns) and the output accumulators o,
// then o += P V with P split hi / lo after scaling by 2^12 (o is scaled back by the caller). K / V
// rows past k1 - 1 are clamped to it (masked anyway, and a clamped row is a written, finite one).
// kc / vc: this KV head's first element (cache + g * HD), rows kvd halves apart. Shared by the
// decode kernel (rows = query heads of one position: one bound, every tile holds a visible slot)
// and the prefill kernel (rows = 16 positions, a bound each: a row may have seen no slot yet,
// EMPTY_ROWS guards its weights).
template <int HD, bool EMPTY_ROWS>
__device__ __forceinline__ void mi_attn_mma_tile(const uint32_t (&qa)[HD / 16][4], const uint32_t (&ql)[HD / 16][4],
                                                 const __half *kc, const __half *vc, int kvd, int j0, int k1,
                                                 const int (&bound)[2], float scale, int gid, int tig,
                                                 float (&o)[HD / 8][4], float (&m)[2], float (&l)[2]) {
    constexpr int NV = HD / 64;
    // K rows j0 + 8nt + gid (n-tile nt), V rows j0 + {2tig, 2tig+1, 8+2tig, 9+2tig}.
    uint4 kr[2][HD / 32], vr[4][NV];
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        const __half *row = kc + (int64_t)min(j0 + 8 * nt + gid, k1 - 1) * kvd + 8 * tig;
#pragma unroll
        for (int c = 0; c < HD / 32; c++) kr[nt][c] = *(const uint4 *)(row + 32 * c);
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const __half *row = vc + (int64_t)min(j0 + 8 * (r >> 1) + 2 * tig + (r & 1), k1 - 1) * kvd + 8 * gid;
#pragma unroll
        for (int mm = 0; mm < NV; mm++) vr[r][mm] = *(const uint4 *)(row + 64 * mm);
    }
    // Four independent accumulators per n-tile (hi / lo x even / odd k-step: chains of KS / 2
    // mma instead of 2 KS), summed in a fixed order.
    float sc[2][4], sp[2][4][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int a = 0; a < 4; a++) sp[nt][a][0] = sp[nt][a][1] = sp[nt][a][2] = sp[nt][a][3] = 0.0f;
#pragma unroll
    for (int c = 0; c < HD / 32; c++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            mi_mma_f16(sp[nt][0], qa[2 * c], kr[nt][c].x, kr[nt][c].y);
            mi_mma_f16(sp[nt][1], ql[2 * c], kr[nt][c].x, kr[nt][c].y);
            mi_mma_f16(sp[nt][2], qa[2 * c + 1], kr[nt][c].z, kr[nt][c].w);
            mi_mma_f16(sp[nt][3], ql[2 * c + 1], kr[nt][c].z, kr[nt][c].w);
        }
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            sc[nt][i] = __fadd_rn(__fadd_rn(sp[nt][0][i], sp[nt][2][i]), __fadd_rn(sp[nt][1][i], sp[nt][3][i]));
    // sc[nt][2r + e]: row r, slot j0 + 8nt + 2tig + e.
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float v = j0 + 8 * nt + 2 * tig + e < bound[r] ? __fmul_rn(sc[nt][2 * r + e], scale) : -INFINITY;
                sc[nt][2 * r + e] = v;
                mx = fmaxf(mx, v);
            }
        mx = fmaxf(mx, __shfl_xor_sync(MI_FULL_MASK, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(MI_FULL_MASK, mx, 2));
        const float mn = fmaxf(m[r], mx); // finite unless EMPTY_ROWS (then: no slot seen yet)
        corr[r] = EMPTY_ROWS && mn == -INFINITY ? 1.0f : expf(m[r] - mn); // 0 on a row's first slots
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float p = EMPTY_ROWS && mn == -INFINITY ? 0.0f : expf(sc[nt][2 * r + e] - mn);
                sc[nt][2 * r + e] = p;
                sum = __fadd_rn(sum, p);
            }
        l[r] = __fadd_rn(__fmul_rn(l[r], corr[r]), sum);
        m[r] = mn;
    }
    // P's A fragment (k = slot: 2tig + e from n-tile 0, 8 + 2tig + e from n-tile 1), hi and lo.
    // P scaled by 2^12 first (exact): P's lo part then stays a normal f16 for weights down to
    // 2^-15, where unscaled it went subnormal below 2^-3 (an absolute error of ~3e-8); the caller
    // scales O back by 2^-12 (exact). l sums the unscaled f32 weights.
    constexpr float PS = 4096.0f;
    uint32_t pa[4], pl[4];
    mi_split_f16x2(sc[0][0] * PS, sc[0][1] * PS, pa[0], pl[0]);
    mi_split_f16x2(sc[0][2] * PS, sc[0][3] * PS, pa[1], pl[1]);
    mi_split_f16x2(sc[1][0] * PS, sc[1][1] * PS, pa[2], pl[2]);
    mi_split_f16x2(sc[1][2] * PS, sc[1][3] * PS, pa[3], pl[3]);
#pragma unroll
    for (int mm = 0; mm < NV; mm++) {
        const uint32_t *w0 = (const uint32_t *)&vr[0][mm], *w1 = (const uint32_t *)&vr[1][mm];
        const uint32_t *w2 = (const uint32_t *)&vr[2][mm], *w3 = (const uint32_t *)&vr[3][mm];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t sel = i & 1 ? 0x7632u : 0x5410u;
            const uint32_t b0 = __byte_perm(w0[i / 2], w1[i / 2], sel), b1 = __byte_perm(w2[i / 2], w3[i / 2], sel);
            float(&on)[4] = o[8 * mm + i];
            on[0] = __fmul_rn(on[0], corr[0]);
            on[1] = __fmul_rn(on[1], corr[0]);
            on[2] = __fmul_rn(on[2], corr[1]);
            on[3] = __fmul_rn(on[3], corr[1]);
            mi_mma_f16(on, pa, b0, b1);
            mi_mma_f16(on, pl, b0, b1);
        }
    }
}

// NW warps a block; R >= G rows of the shared-memory merge (16, or 8 when G <= 8).
// A warp's running max m, sum l (summed over its quad first: each lane held its columns' share)
// and accumulator o for fragment rows gid and gid + 8 into the block merge's shared arrays; rows >= R
// (no query head there; R is 8 or 16) are skipped, after the full-mask shuffles every lane runs.
// o is stored scaled by 2^-12, as the merge expects. half >= 0: only fragment rows gid + 8 half,
// stored at row gid (the two halves hold two batch rows: mi_attn_mma_kernel's pairs; half 0 is what
// R = 8 stores anyway).
template <int NW, int R, int HD>
__device__ __forceinline__ void mi_attn_mma_stash(const float (&o)[HD / 8][4], const float (&m)[2], const float (&l)[2],
                                                  int warp, int gid, int tig, float (&sm_m)[NW][R], float (&sm_l)[NW][R],
                                                  float (&sm_acc)[NW][R][HD + 4], int half = -1) {
    constexpr int NV = HD / 64;
    float lq[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lq[r] = __fadd_rn(l[r], __shfl_xor_sync(MI_FULL_MASK, l[r], 1));
        lq[r] = __fadd_rn(lq[r], __shfl_xor_sync(MI_FULL_MASK, lq[r], 2));
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = half < 0 ? gid + 8 * r : gid;
        if (half < 0 ? row >= R : r != half) continue;
        if (tig == 0) {
            sm_m[warp][row] = m[r];
            sm_l[warp][row] = lq[r];
        }
#pragma unroll
        for (int mm = 0; mm < NV; mm++)
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    sm_acc[warp][row][64 * mm + 8 * (2 * tig + e) + i] = o[8 * mm + i][2 * r + e] * (1.0f / 4096.0f);
    }
}

// pair (R == 8 only: G <= 8 query heads fill fragment rows 0..7, so rows 8..15 are free): block y
// serves batch rows 2y and 2y + 1, and where both take split s from the same first slot (the same
// split size: the rows of a verify batch, but across a split-size step every max_splits tiles) one
// pass over the split's K / V serves both, row 2y + 1's query heads as fragment rows 8..15: half
// the blocks, each K / V row read once for two batch rows (1.5B shape, nt = 8: 2.467 -> 2.284 ms a
// forward at 4,096, 3.280 -> 2.801 at 16,384; nt = 1 unchanged: docs/perf.md, session 19). A
// row's bits do not change: its fragment rows see the same tiles in the same order (the other
// row's slots past its own end are masked: exp gives exact zeros, the running max, sum and output
// stay bit for bit; a warp that has no slot of a row keeps it empty, as a warp with no tile would:
// EMPTY_ROWS), and an MMA output element depends on its own A row only (tests: row pairs against
// a block per row and against single-row forwards, bitwise). Otherwise (different first slots, a
// row outside [lo, hi) or past its splits) each active row gets a pass of its own.
template <int DPL, int NW, int R>
__global__ void __launch_bounds__(NW * 32)
    mi_attn_mma_kernel(const float *__restrict__ q, const __half *__restrict__ kc, const __half *__restrict__ vc,
                       const int32_t *__restrict__ pos, int nt, int n_head, int n_head_kv, float scale, int max_splits,
                       float *__restrict__ part, int32_t *__restrict__ cnt, float *__restrict__ att,
                       mi_block_q8a *__restrict__ xq, int lo, int hi, int combine_from, int pair, int hint_steps) {
    constexpr int HD = DPL * 32, KS = HD / 16, ND = HD / 8, TILE = NW * MI_ATTN_MMA_TILE, NTH = NW * 32;
    const int g = blockIdx.x, s = blockIdx.z;
    // The block's rows (-1: none).
    const int tr[2] = {pair ? 2 * (int)blockIdx.y : (int)blockIdx.y,
                       pair && 2 * (int)blockIdx.y + 1 < nt ? 2 * (int)blockIdx.y + 1 : -1};
    const int G = n_head / n_head_kv, h0 = g * G, kvd = n_head_kv * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    // Each row's split s: slots [k0, k1) of n_used splits (mi_attn_split_size over its own pos).
    int k0[2] = {0, 0}, k1[2] = {0, 0}, nu[2] = {0, 0};
    bool act[2] = {false, false};
#pragma unroll
    for (int r = 0; r < 2; r++)
        if (tr[r] >= 0) act[r] = mi_attn_split_range(pos, tr[r], s, TILE, max_splits, lo, hi, k0[r], k1[r], nu[r]);
    const bool together = R == 8 && act[0] && act[1] && k0[0] == k0[1];
    // Older slots are constants by now (slot pos[t] may still be in flight): hint them into L2
    // before the PDL wait, then wait (every block must: common.cuh).
    // At most hint_steps block steps of it (MI_CUDA_ATTN_HINT; < 0: all).
    const int hint = hint_steps < 0 ? INT_MAX : hint_steps * TILE;
    if (together) mi_attn_prefetch<HD>(kc, vc, k0[0], k0[0] + min(max(k1[0], k1[1]) - k0[0], hint), kvd, g, NTH);
    else
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (act[r]) mi_attn_prefetch<HD>(kc, vc, k0[r], k0[r] + min(k1[r] - k0[r], hint), kvd, g, NTH);
    mi_pdl_wait();
    mi_pdl_trigger();
    __shared__ float sm_m[NW][R], sm_l[NW][R], sm_e[NW][R], sm_M[R];
    __shared__ float sm_acc[NW][R][HD + 4]; // + 4: the fragment stores hit 16 banks, not 2
    __shared__ int last;
    for (int pass = 0; pass < 2; pass++) { // pass 0: row 0 (+ row 1 together); pass 1: row 1 alone
        if (!(pass == 0 ? act[0] : act[1] && !together)) continue; // the same for the whole block
        const int ta = pass ? tr[1] : tr[0], tb = pass == 0 && together ? tr[1] : -1;
        const int kp0 = pass ? k0[1] : k0[0], kp1 = pass ? k1[1] : k1[0]; // selects: no local-memory arrays
        const int bound[2] = {kp1, tb >= 0 ? k1[1] : kp1};
        const int kmax = max(bound[0], bound[1]);
        // Q's A fragments: rows gid are query heads h0 + gid of row ta; rows gid + 8 are heads
        // h0 + 8 + gid of row ta (R == 16) or h0 + gid of row tb (a pair); zero beyond G.
        uint32_t qa[KS][4], ql[KS][4];
        {
            const float *qrow[2];
            qrow[0] = gid < G ? q + ((int64_t)ta * n_head + h0 + gid) * HD : nullptr;
            qrow[1] = R == 16 ? (gid + 8 < G ? q + ((int64_t)ta * n_head + h0 + gid + 8) * HD : nullptr)
                              : (tb >= 0 && gid < G ? q + ((int64_t)tb * n_head + h0 + gid) * HD : nullptr);
            mi_attn_q_frags<HD>(qrow, tig, qa, ql);
        }
        float o[ND][4];
#pragma unroll
        for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; // rows gid, gid + 8; l: this lane's columns
        for (int j0 = kp0 + warp * MI_ATTN_MMA_TILE; j0 < kmax; j0 += TILE)
            mi_attn_mma_tile<HD, true>(qa, ql, kc + g * HD, vc + g * HD, kvd, j0, kmax, bound, scale, gid, tig, o, m, l);
        // Warps -> this split's partial per query head and row, as mi_attn_kernel: e_w = exp(m_w -
        // M), then the warps summed in order.
        for (int hf = 0; hf < (tb >= 0 ? 2 : 1); hf++) {
            const int t = hf ? tb : ta;
            mi_attn_mma_stash<NW, R, HD>(o, m, l, warp, gid, tig, sm_m, sm_l, sm_acc, R == 16 ? -1 : hf);
            __syncthreads();
            if (threadIdx.x < NW * R) {
                const int hh = threadIdx.x / NW, w = threadIdx.x % NW;
                float M = -INFINITY;
#pragma unroll
                for (int v = 0; v < NW; v++) M = fmaxf(M, sm_m[v][hh]);
                sm_e[w][hh] = sm_m[w][hh] == -INFINITY ? 0.0f : expf(sm_m[w][hh] - M); // a warp with no slot adds 0
                if (w == 0) sm_M[hh] = M;
            }
            __syncthreads();
            for (int idx = threadIdx.x; idx < G * HD; idx += NTH) {
                const int hh = idx / HD, dd = idx % HD;
                float a = 0.0f;
#pragma unroll
                for (int w = 0; w < NW; w++) a = __fadd_rn(a, __fmul_rn(sm_acc[w][hh][dd], sm_e[w][hh]));
                float *out = part + (((int64_t)t * n_head + h0 + hh) * MI_ATTN_MMA_SPLITS + s) * (HD + 2);
                out[2 + dd] = a;
                if (dd == 0) {
                    float L = 0.0f;
#pragma unroll
                    for (int w = 0; w < NW; w++) L = __fadd_rn(L, __fmul_rn(sm_l[w][hh], sm_e[w][hh]));
                    out[0] = sm_M[hh];
                    out[1] = L;
                }
            }
            __syncthreads(); // the shared arrays are refilled by the next half or pass
        }
    }
    // Each row this block wrote a partial of: the last of its splits to finish merges them (rows of
    // >= combine_from splits: mi_attn_combine_kernel, in a launch of its own).
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!act[r] || nu[r] >= combine_from) continue;
        const int t = tr[r];
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            int32_t *c = cnt + (int64_t)t * n_head + g;
            last = atomicAdd(c, 1) == nu[r] - 1;
            if (last) *c = 0;
        }
        __syncthreads();
        if (!last) continue;
        __threadfence();
        for (int hh = warp; hh < G; hh += NW) mi_attn_merge<DPL, 16>(part, t, h0 + hh, n_head, nu[r], att, xq, lane);
        __syncthreads(); // `last` is set again for the next row
    }
}

// Prefill attention on the tensor cores (forwards of nt >= MI_MMQ_MIN_NT rows: prompt chunks, whose
// GEMMs are within a tolerance anyway): block = (16 query rows t0 .. t0 + 15, query head h), NW
// warps. The 16 rows are the M rows of mma.m16n8k16, where the decode tensor-core kernel above has
// the query heads of one row: the same fragment maps, hi / lo f16 splits of q and of P (x 2^12)
// and online softmax, each row masked at its own position (slot j <= pos[t]). Warp w takes the
// 16-slot tiles j0 = 16w, 16w + 16NW, ... below the rows' last position; the warps are merged in
// shared memory as in that kernel and the output normalized there: no splits, no partials in
// global memory. The decode kernels run one block per (row, head, split) and took 37% / 56% of a
// 512-token prefill on the 1.5B / 0.5B shapes (docs/perf.md, session 10). Blocks are issued from
// the last rows (the most slots) first. Not bitwise to the decode kernels: a stated tolerance.
template <int DPL, int NW>
__global__ void __launch_bounds__(NW * 32)
    mi_attn_prefill_kernel(const float *__restrict__ q, const __half *__restrict__ kc, const __half *__restrict__ vc,
                           const int32_t *__restrict__ pos, int nt, int n_head, int n_head_kv, float scale,
                           float *__restrict__ att) {
    constexpr int HD = DPL * 32, KS = HD / 16, ND = HD / 8, TILE = NW * MI_ATTN_MMA_TILE, R = 16;
    const int t0 = (gridDim.x - 1 - blockIdx.x) * R, h = blockIdx.y;
    const int g = h / (n_head / n_head_kv), kvd = n_head_kv * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    // Slots each of this lane's rows (gid, gid + 8) sees; rows past nt see slot 0 (never stored).
    int nkv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) nkv[r] = t0 + gid + 8 * r < nt ? pos[t0 + gid + 8 * r] + 1 : 1;
    int k1 = max(nkv[0], nkv[1]); // the block's slot range: the most any of its rows sees
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) k1 = max(k1, __shfl_xor_sync(MI_FULL_MASK, k1, o));
    mi_pdl_wait();
    mi_pdl_trigger();
    uint32_t qa[KS][4], ql[KS][4];
    {
        const float *qrow[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = t0 + gid + 8 * r;
            qrow[r] = t < nt ? q + ((int64_t)t * n_head + h) * HD : nullptr;
        }
        mi_attn_q_frags<HD>(qrow, tig, qa, ql);
    }
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int j0 = warp * MI_ATTN_MMA_TILE; j0 < k1; j0 += TILE)
        mi_attn_mma_tile<HD, true>(qa, ql, kc + g * HD, vc + g * HD, kvd, j0, k1, nkv, scale, gid, tig, o, m, l);
    // Warps -> rows: e_w = exp(m_w - M) per (warp, row), the warps summed in order, then / L.
    __shared__ float sm_m[NW][R], sm_l[NW][R], sm_e[NW][R];
    __shared__ float sm_acc[NW][R][HD + 4];
    mi_attn_mma_stash<NW, R, HD>(o, m, l, warp, gid, tig, sm_m, sm_l, sm_acc);
    __syncthreads();
    for (int i = threadIdx.x; i < NW * R; i += NW * 32) {
        const int rr = i / NW, w = i % NW;
        float M = -INFINITY;
#pragma unroll
        for (int v = 0; v < NW; v++) M = fmaxf(M, sm_m[v][rr]);
        sm_e[w][rr] = sm_m[w][rr] == -INFINITY ? 0.0f : expf(sm_m[w][rr] - M); // warp 0 always saw slot 0
    }
    __syncthreads();
    const int qd = n_head * HD;
    for (int idx = threadIdx.x; idx < R * HD; idx += NW * 32) {
        const int rr = idx / HD, dd = idx % HD;
        if (t0 + rr >= nt) break; // rows go up with idx
        float a = 0.0f, L = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            a = __fadd_rn(a, __fmul_rn(sm_acc[w][rr][dd], sm_e[w][rr]));
            L = __fadd_rn(L, __fmul_rn(sm_l[w][rr], sm_e[w][rr]));
        }
        att[(int64_t)(t0 + rr) * qd + h * HD + dd] = __fdiv_rn(a, L);
    }
}

// The tensor-core kernel's split merge as a launch of its own, for rows of >= combine_from splits
// (context.cu: every row for models with <= 2 KV heads on the H200, else none; the kernel's last
// block merges the others, as mi_attn_kernel does). Block = (query head h, row t), Q x HD
// threads: thread (q, dd) loads the M, L and acc[dd] of splits q, q + Q, .. (SPQ at most), all in
// flight at once, and merges them; then the Q parts are merged in order and the output
// quantized. So the merge is one round of loads spread over n_head blocks, where the last-block
// merge is a fence, a counter and five dependent rounds in one block (~5-7 us a layer at 4k-16k on
// the 1.5B shape: docs/perf.md, session 8). SPQ splits a thread: Q = 4, SPQ = 16 up to 64 splits;
// Q = 4, SPQ = 18 up to 72 (66 on the H200 for 2 KV heads: the same 512-thread block, since 8 parts
// cost the 1.5B shape 2 us a layer at 4k, session 25); Q = 8, SPQ = 16 up to 128 (32 a thread
// spilled and cost the 1.5B shape ~3 us a layer at 16k, session 23).
// Splits: those of mi_attn_mma_kernel (tile, max_splits, pos[t]), Q by max_splits, merged in a
// fixed order: rows stay bitwise equal across nt.
template <int HD, int Q, int SPQ>
__global__ void __launch_bounds__(Q * HD)
    mi_attn_combine_kernel(const float *__restrict__ part, const int32_t *__restrict__ pos, int n_head, int tile,
                           int max_splits, int combine_from, float *__restrict__ att, mi_block_q8a *__restrict__ xq,
                           int lo, int hi) {
    static_assert(Q * SPQ <= MI_ATTN_MMA_SPLITS, "more splits than the partials' stride");
    const int h = blockIdx.x, t = blockIdx.y, q = threadIdx.x / HD, dd = threadIdx.x % HD;
    const bool mine = pos[t] >= lo && pos[t] < hi;
    int S, n_used;
    mi_attn_split_size(pos[t] + 1, tile, max_splits, S, n_used);
    mi_pdl_wait();
    mi_pdl_trigger();
    if (!mine || n_used < combine_from) return;
    const float *p = part + ((int64_t)t * n_head + h) * MI_ATTN_MMA_SPLITS * (HD + 2);
    float mk[SPQ], lk[SPQ], v[SPQ];
#pragma unroll
    for (int i = 0; i < SPQ; i++) {
        const int sp = i * Q + q;
        const bool ok = sp < n_used;
        mk[i] = ok ? __ldcg(p + sp * (HD + 2)) : -INFINITY;
        lk[i] = ok ? __ldcg(p + sp * (HD + 2) + 1) : 0.0f;
        v[i] = ok ? __ldcg(p + sp * (HD + 2) + 2 + dd) : 0.0f;
    }
    float M = -INFINITY, a = 0.0f, L = 0.0f;
#pragma unroll
    for (int i = 0; i < SPQ; i++) M = fmaxf(M, mk[i]);
#pragma unroll
    for (int i = 0; i < SPQ; i++) {
        const float e = i * Q + q < n_used ? expf(mk[i] - M) : 0.0f; // a used split's max is finite
        a = __fadd_rn(a, __fmul_rn(v[i], e));
        L = __fadd_rn(L, __fmul_rn(lk[i], e));
    }
    __shared__ float sM[Q], sL[Q], sA[Q][HD];
    sA[q][dd] = a;
    if (dd == 0) {
        sM[q] = M;
        sL[q] = L;
    }
    __syncthreads();
    if (q != 0) return; // threads 0 .. HD - 1: whole warps
    float MT = sM[0];
#pragma unroll
    for (int k = 1; k < Q; k++) MT = fmaxf(MT, sM[k]);
    float A = 0.0f, LT = 0.0f;
#pragma unroll
    for (int k = 0; k < Q; k++) {
        const float e = sM[k] == -INFINITY ? 0.0f : expf(sM[k] - MT); // a part without splits adds 0
        A = __fadd_rn(A, __fmul_rn(sA[k][dd], e));
        LT = __fadd_rn(LT, __fmul_rn(sL[k], e));
    }
    const int qd = n_head * HD;
    const float o = __fmul_rn(A, __frcp_rn(LT));
    att[(int64_t)t * qd + h * HD + dd] = o;
    mi_quant_chunk_warp(o, xq + (int64_t)t * (qd / 32) + h * (HD / 32) + dd / 32, dd % 32);
}

struct mi_attn_args {
    const float *q;
    const __half *kc, *vc;
    const int32_t *pos;
    int nt, n_head, n_head_kv;
    float scale;
    int max_splits, group, lo, hi, combine_from, pair, hint_steps;
    float *part;
    int32_t *cnt;
    float *att;
    mi_block_q8a *xq;
};

template <int DPL, int G> cudaError_t mi_attn_launch(const mi_attn_args &a, cudaStream_t s) {
    const dim3 grid(G > 1 ? a.n_head_kv : a.n_head, a.nt, a.max_splits);
    return mi_launch(mi_attn_kernel<DPL, G>, grid, G * MI_ATTN_THREADS, s, a.q, a.kc, a.vc, a.pos, a.n_head, a.n_head_kv,
                     a.scale, a.max_splits, a.part, a.cnt, a.att, a.xq, a.lo, a.hi);
}

static uint64_t mi_attn_pair_count = 0; // launches with row pairs so far (mi_cuda_attn_pair_launches)
extern "C" uint64_t mi_cuda_attn_pair_launches(void) { return __atomic_load_n(&mi_attn_pair_count, __ATOMIC_RELAXED); }

// a.group: one block per KV head's query group (instances for head_dim 64 and 128 and groups up
// to 8, to bound compile time), else one block per query head (the default). Same bits either way
// (tested), so this is a speed choice only: see docs/perf.md (session 5) for where each wins.
template <int DPL> cudaError_t mi_attn_launch_g(const mi_attn_args &a, cudaStream_t s) {
    if constexpr (DPL == 2 || DPL == 4) {
        if (a.group == 2) { // tensor cores: 8 warps a block for G <= 8 (the 1.5B at 16k: 1.335 vs 1.490 ms
                            // with 4; docs/perf.md, session 7), else 4 warps and 16 merge rows
            const int nw = mi_attn_mma_warps(a.n_head / a.n_head_kv);
            const int pair = a.pair && nw == 8 && a.nt > 1; // G <= 8: fragment rows 8..15 take a second row
            const dim3 grid(a.n_head_kv, pair ? (a.nt + 1) / 2 : a.nt, a.max_splits);
            if (pair) __atomic_add_fetch(&mi_attn_pair_count, 1, __ATOMIC_RELAXED);
            const cudaError_t e =
                nw == 8 ? mi_launch(mi_attn_mma_kernel<DPL, 8, 8>, grid, 256, s, a.q, a.kc, a.vc, a.pos, a.nt, a.n_head,
                                 a.n_head_kv, a.scale, a.max_splits, a.part, a.cnt, a.att, a.xq, a.lo, a.hi, a.combine_from,
                                 pair, a.hint_steps)
                        : mi_launch(mi_attn_mma_kernel<DPL, 4, 16>, grid, 128, s, a.q, a.kc, a.vc, a.pos, a.nt, a.n_head,
                                 a.n_head_kv, a.scale, a.max_splits, a.part, a.cnt, a.att, a.xq, a.lo, a.hi, a.combine_from,
                                 0, a.hint_steps);
            if (e != cudaSuccess || a.combine_from > a.max_splits) return e; // no row can reach it
            // The merge's instance by max_splits (Q parts x SPQ splits a thread; the kernel's comment).
            // Its block is Q parts wide, so Q and the instance are set together, in one branch each.
            int cq = 8;
            auto *combine = mi_attn_combine_kernel<DPL * 32, 8, 16>;
            if (a.max_splits <= 4 * 16) {
                cq = 4;
                combine = mi_attn_combine_kernel<DPL * 32, 4, 16>;
            } else if (a.max_splits <= 4 * 18) {
                cq = 4;
                combine = mi_attn_combine_kernel<DPL * 32, 4, 18>;
            }
            return mi_launch(combine, dim3(a.n_head, a.nt), cq * DPL * 32, s, a.part, a.pos, a.n_head,
                             nw * MI_ATTN_MMA_TILE, a.max_splits, a.combine_from, a.att, a.xq, a.lo, a.hi);
        }
        switch (a.group == 1 ? a.n_head / a.n_head_kv : 1) {
        case 2: return mi_attn_launch<DPL, 2>(a, s);
        case 3: return mi_attn_launch<DPL, 3>(a, s);
        case 4: return mi_attn_launch<DPL, 4>(a, s);
        case 5: return mi_attn_launch<DPL, 5>(a, s);
        case 6: return mi_attn_launch<DPL, 6>(a, s);
        case 7: return mi_attn_launch<DPL, 7>(a, s);
        case 8: return mi_attn_launch<DPL, 8>(a, s);
        default: break;
        }
    }
    return mi_attn_launch<DPL, 1>(a, s);
}
} // namespace

bool mi_cuda_attention_prefill_applies(int n_head, int n_head_kv, int hd) {
    return n_head_kv >= 1 && n_head % n_head_kv == 0 && (hd == 64 || hd == 128);
}

int mi_cuda_attention_prefill(const float *q, const __half *k_cache, const __half *v_cache, const int32_t *pos, int nt,
                              int n_head, int n_head_kv, int hd, float scale, float *att, cudaStream_t s) {
    if (!mi_cuda_attention_prefill_applies(n_head, n_head_kv, hd))
        return mi_set_error(MI_ERR_ARG, "CUDA prefill attention: no kernel for head_dim %d, %d / %d heads", hd, n_head,
                            n_head_kv);
    if (nt < 1) return MI_OK;
    const dim3 grid((nt + 15) / 16, n_head);
    const cudaError_t e = hd == 64 ? mi_launch(mi_attn_prefill_kernel<2, 4>, grid, 128, s, q, k_cache, v_cache, pos, nt,
                                               n_head, n_head_kv, scale, att)
                                   : mi_launch(mi_attn_prefill_kernel<4, 4>, grid, 128, s, q, k_cache, v_cache, pos, nt,
                                               n_head, n_head_kv, scale, att);
    if (e != cudaSuccess) return mi_set_error(MI_ERR_CUDA, "launch prefill attention: %s", cudaGetErrorString(e));
    return MI_OK;
}

bool mi_cuda_attention_mma_applies(int n_head, int n_head_kv, int hd) {
    return n_head_kv >= 1 && n_head % n_head_kv == 0 && n_head / n_head_kv <= 16 && (hd == 64 || hd == 128);
}

int mi_cuda_attention(const float *q, const __half *k_cache, const __half *v_cache, const int32_t *pos, int nt,
                      int n_head, int n_head_kv, int hd, float scale, int max_splits, int group, int lo, int hi,
                      int combine_from, int pair, int hint_steps, float *part, int32_t *cnt, float *att,
                      mi_block_q8a *xq, cudaStream_t s) {
    if (n_head_kv < 1 || n_head % n_head_kv)
        return mi_set_error(MI_ERR_ARG, "CUDA attention: n_head %d not a multiple of n_head_kv %d", n_head, n_head_kv);
    if (hd % 32 || hd < 32 || hd > 256)
        return mi_set_error(MI_ERR_ARG, "CUDA attention: head_dim %d not a multiple of 32 up to 256", hd);
    const int cap = group == 2 ? MI_ATTN_MMA_SPLITS : MI_ATTN_SPLITS;
    if (max_splits < 1 || max_splits > cap)
        return mi_set_error(MI_ERR_ARG, "CUDA attention: max_splits %d outside 1..%d", max_splits, cap);
    // The tensor-core kernel's last-block merge (mi_attn_merge) holds 64 splits: rows of more go
    // to the combine launch whatever the caller asked.
    if (combine_from > MI_ATTN_SPLITS + 1) combine_from = MI_ATTN_SPLITS + 1;
    if (group == 2 && !mi_cuda_attention_mma_applies(n_head, n_head_kv, hd))
        return mi_set_error(MI_ERR_ARG, "CUDA attention: no tensor-core kernel for head_dim %d, %d query heads per KV head",
                            hd, n_head / n_head_kv);
    const mi_attn_args a = {q, k_cache, v_cache, pos, nt, n_head, n_head_kv, scale, max_splits, group, lo, hi,
                            combine_from, pair, hint_steps, part, cnt, att, xq};
    cudaError_t e = cudaSuccess;
    switch (hd / 32) {
    case 1: e = mi_attn_launch_g<1>(a, s); break;
    case 2: e = mi_attn_launch_g<2>(a, s); break;
    case 3: e = mi_attn_launch_g<3>(a, s); break;
    case 4: e = mi_attn_launch_g<4>(a, s); break;
    case 5: e = mi_attn_launch_g<5>(a, s); break;
    case 6: e = mi_attn_launch_g<6>(a, s); break;
    case 7: e = mi_attn_launch_g<7>(a, s); break;
    case 8: e = mi_attn_launch_g<8>(a, s); break;
    default: break;
    }
    if (e != cudaSuccess) return mi_set_error(MI_ERR_CUDA, "launch attention: %s", cudaGetErrorString(e));
    return MI_OK;
}

// Test entry (pyminfer.h): host operands in, host out back, on the default stream.
extern "C" int mi_cuda_op_attention_prefill(const float *q, const uint16_t *k, const uint16_t *v, const int32_t *pos,
                                            int32_t nt, int32_t n_kv, int32_t n_head, int32_t n_head_kv,
                                            int32_t head_dim, float scale, float *out) {
    if (!mi_cuda_available()) return mi_set_error(MI_ERR_CUDA, "no CUDA device visible");
    if (nt < 1 || n_kv < 1 || n_head < 1 || n_head_kv < 1)
        return mi_set_error(MI_ERR_ARG, "CUDA prefill attention: bad shape (nt %d, n_kv %d)", nt, n_kv);
    for (int t = 0; t < nt; t++)
        if (pos[t] < 0 || pos[t] >= n_kv)
            return mi_set_error(MI_ERR_ARG, "CUDA prefill attention: pos[%d] = %d outside 0..%d", t, pos[t], n_kv - 1);
    const size_t qb = (size_t)nt * n_head * head_dim * 4, kb = (size_t)n_kv * n_head_kv * head_dim * 2, pb = (size_t)nt * 4;
    auto al = [](size_t n) { return (n + 255) & ~(size_t)255; };
    uint8_t *buf = nullptr;
    if (cudaMalloc(&buf, al(qb) * 2 + al(kb) * 2 + al(pb)) != cudaSuccess) {
        cudaGetLastError();
        return mi_set_error(MI_ERR_OOM, "CUDA out of memory allocating attention operands");
    }
    uint8_t *qd = buf, *od = qd + al(qb), *kd = od + al(qb), *vd = kd + al(kb), *pd = vd + al(kb);
    const int rc = [&]() -> int {
        MI_CUDA_TRY(cudaMemcpy(qd, q, qb, cudaMemcpyHostToDevice));
        MI_CUDA_TRY(cudaMemcpy(kd, k, kb, cudaMemcpyHostToDevice));
        MI_CUDA_TRY(cudaMemcpy(vd, v, kb, cudaMemcpyHostToDevice));
        MI_CUDA_TRY(cudaMemcpy(pd, pos, pb, cudaMemcpyHostToDevice));
        MI_CUDA_TRY(cudaMemset(od, 0xFF, qb)); // NaN: a row or head the kernel misses shows
        const int r = mi_cuda_attention_prefill((const float *)qd, (const __half *)kd, (const __half *)vd,
                                                (const int32_t *)pd, nt, n_head, n_head_kv, head_dim, scale,
                                                (float *)od, 0);
        if (r) return r;
        MI_CUDA_TRY(cudaDeviceSynchronize());
        MI_CUDA_TRY(cudaMemcpy(out, od, qb, cudaMemcpyDeviceToHost));
        return MI_OK;
    }();
    cudaFree(buf);
    return rc;
}
