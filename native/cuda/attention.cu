// Decode attention, flash-decoding style (Dao et al., "Flash-Decoding for long-context inference",
// 2023): grid (head block, row, split). A block serves one row t, one KV split and one query head
// (or, MI_CUDA_ATTN_GROUP=1, every query head sharing a KV head: G of them, K/V read once per
// group). Four warps take U consecutive slots each per step
// (all their K/V loads in flight together) and run an exact, max-subtracted online softmax in f32
// for each of the block's query heads; warps, then splits, are merged in a fixed order. Before the
// PDL wait the block prefetches its K/V rows into L2 (older slots are constants by then). The last
// block of a (row, head block) to finish (a counter, as the CUDA threadFenceReduction sample)
// merges the splits and quantizes the output: one launch per layer.
//
// Identity contract: the split boundaries, the slots each warp takes and every reduction order
// are functions of n_kv = pos[t] + 1 and of the model's shape alone, so a row's output never
// depends on nt, on the other rows, or on graphs.
#include <math.h>
#include <type_traits>
#include "attention.cuh"

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

// DPL = head_dim / 32 dims per lane (contiguous, so one K row is one coalesced 2*hd-byte read).
// G > 1: block x serves KV head x and query heads x*G .. x*G + G-1 (G = n_head / n_head_kv).
// G == 1: block x is query head x, reading KV head x / (n_head / n_head_kv) (any grouping).
template <int DPL, int G>
__global__ void __launch_bounds__(MI_ATTN_THREADS)
    mi_attn_kernel(const float *__restrict__ q, const __half *__restrict__ kc, const __half *__restrict__ vc,
                   const int32_t *__restrict__ pos, int n_head, int n_head_kv, float scale, int max_splits,
                   float *__restrict__ part, int32_t *__restrict__ cnt, float *__restrict__ att,
                   mi_block_q8a *__restrict__ xq) {
    constexpr int HD = DPL * 32, U = mi_attn_unroll<DPL>(), TILE = MI_ATTN_WARPS * U;
    const int x = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    const int g = G > 1 ? x : x / (n_head / n_head_kv), h0 = G > 1 ? x * G : x;
    const int kvd = n_head_kv * HD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // pos was copied in before the forward's first kernel, which every kernel of the chain
    // (transitively) started after: readable before the wait.
    const int n_kv = pos[t] + 1;
    int S, n_used;
    mi_attn_split_size(n_kv, TILE, max_splits, S, n_used);
    const int k0 = s * S, k1 = min(n_kv, k0 + S);
    if (s < n_used) { // prefetch this split's K/V rows of head g (hints; slot pos[t] may still be in flight)
        constexpr int LPR = (2 * HD + 127) / 128; // 128-byte lines per row
        for (int i = threadIdx.x; i < (k1 - k0) * 2 * LPR; i += MI_ATTN_THREADS) {
            const int j = k0 + i / (2 * LPR), l = i % (2 * LPR);
            const __half *row = (l < LPR ? kc : vc) + (int64_t)j * kvd + g * HD;
            mi_prefetch_l2_line((const char *)row + (l % LPR) * 128);
        }
    }
    mi_pdl_wait();
    mi_pdl_trigger();
    if (s >= n_used) return;
    float qr[G][DPL], acc[G][DPL], m[G], l[G];
#pragma unroll
    for (int gg = 0; gg < G; gg++) {
        const float *qh = q + ((int64_t)t * n_head + h0 + gg) * HD + lane * DPL;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            qr[gg][i] = qh[i];
            acc[gg][i] = 0.0f;
        }
        m[gg] = -INFINITY;
        l[gg] = 0.0f;
    }
    // Warp w takes slots j0 .. j0 + U-1 with j0 = k0 + w*U, k0 + w*U + TILE, ...; the first is
    // always < k1, so the step's max is finite; slots >= k1 score -inf (weight 0).
    // Lane l ends the score reduction holding slot mi_attn_slot<U>(l) (mi_attn_reduce).
    const int my_u = mi_attn_slot<U>(lane);
    for (int j0 = k0 + warp * U; j0 < k1; j0 += TILE) {
        float kf[U][DPL], vf[U][DPL];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = min(j0 + u, k1 - 1);
            mi_ld_halves<DPL>(kc + (int64_t)j * kvd + g * HD + lane * DPL, kf[u]);
            mi_ld_halves<DPL>(vc + (int64_t)j * kvd + g * HD + lane * DPL, vf[u]);
        }
#pragma unroll
        for (int gg = 0; gg < G; gg++) {
            float sc[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < DPL; i++) d = __fadd_rn(d, __fmul_rn(qr[gg][i], kf[u][i]));
                sc[u] = d;
            }
            const float dot = mi_attn_reduce<U>(sc, lane); // every lane: the shuffles need the full warp
            const float sv = j0 + my_u < k1 ? __fmul_rn(dot, scale) : -INFINITY;
            const float mx = fmaxf(m[gg], mi_attn_slots_max<U>(sv));
            const float corr = expf(m[gg] - mx); // 0 on the first step (m = -inf)
            const float p = expf(sv - mx);       // 0 for masked slots
            l[gg] = __fadd_rn(__fmul_rn(l[gg], corr), mi_attn_slots_sum<U>(p));
            float pu[U];
#pragma unroll
            for (int u = 0; u < U; u++) pu[u] = __shfl_sync(MI_FULL_MASK, p, mi_attn_lane<U>(u));
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                float a = __fmul_rn(acc[gg][i], corr);
#pragma unroll
                for (int u = 0; u < U; u++) a = __fadd_rn(a, __fmul_rn(pu[u], vf[u][i]));
                acc[gg][i] = a;
            }
            m[gg] = mx;
        }
    }
    // Warps -> this split's partial [M, L, acc[HD]] per query head: warp weights e = exp(m_w - M)
    // once per (warp, head), then the warps summed in order.
    __shared__ float sm_m[MI_ATTN_WARPS][G], sm_l[MI_ATTN_WARPS][G], sm_e[MI_ATTN_WARPS][G], sm_M[G];
    __shared__ float sm_acc[MI_ATTN_WARPS][G][HD];
#pragma unroll
    for (int gg = 0; gg < G; gg++) {
        if (lane == 0) {
            sm_m[warp][gg] = m[gg];
            sm_l[warp][gg] = l[gg];
        }
#pragma unroll
        for (int i = 0; i < DPL; i++) sm_acc[warp][gg][lane * DPL + i] = acc[gg][i];
    }
    __syncthreads();
    if (threadIdx.x < MI_ATTN_WARPS * G) {
        const int gg = threadIdx.x / MI_ATTN_WARPS, w = threadIdx.x % MI_ATTN_WARPS;
        float M = -INFINITY;
#pragma unroll
        for (int v = 0; v < MI_ATTN_WARPS; v++) M = fmaxf(M, sm_m[v][gg]);
        sm_e[w][gg] = sm_m[w][gg] == -INFINITY ? 0.0f : expf(sm_m[w][gg] - M); // a warp with no slot adds 0
        if (w == 0) sm_M[gg] = M;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += MI_ATTN_THREADS) {
        const int gg = idx / HD, dd = idx % HD;
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < MI_ATTN_WARPS; w++) a = __fadd_rn(a, __fmul_rn(sm_acc[w][gg][dd], sm_e[w][gg]));
        float *out = part + (((int64_t)t * n_head + h0 + gg) * MI_ATTN_SPLITS + s) * (HD + 2);
        out[2 + dd] = a;
        if (dd == 0) {
            float L = 0.0f;
#pragma unroll
            for (int w = 0; w < MI_ATTN_WARPS; w++) L = __fadd_rn(L, __fmul_rn(sm_l[w][gg], sm_e[w][gg]));
            out[0] = sm_M[gg];
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
    // One warp per query head; lane i holds splits i and i + 32 (n_used <= 64) for the max and the
    // denominator; the output dims are 32c + lane (c < DPL), one q8a block per c.
    const int qd = n_head * HD;
    for (int gg = warp; gg < G; gg += MI_ATTN_WARPS) {
        const int h = h0 + gg;
        const float *p = part + ((int64_t)t * n_head + h) * MI_ATTN_SPLITS * (HD + 2);
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
#pragma unroll 8
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
}

struct mi_attn_args {
    const float *q;
    const __half *kc, *vc;
    const int32_t *pos;
    int nt, n_head, n_head_kv;
    float scale;
    int max_splits, group;
    float *part;
    int32_t *cnt;
    float *att;
    mi_block_q8a *xq;
};

template <int DPL, int G> cudaError_t mi_attn_launch(const mi_attn_args &a, cudaStream_t s) {
    const dim3 grid(G > 1 ? a.n_head_kv : a.n_head, a.nt, a.max_splits);
    return mi_launch(mi_attn_kernel<DPL, G>, grid, MI_ATTN_THREADS, s, a.q, a.kc, a.vc, a.pos, a.n_head, a.n_head_kv,
                     a.scale, a.max_splits, a.part, a.cnt, a.att, a.xq);
}

// a.group: one block per KV head's query group (grouped instances exist for head_dim 64 and 128
// and groups up to 8, to bound compile time), else one block per query head (the default). Both
// compute every head with the same operations in the same order (bitwise equal, tested), so this
// is a speed choice only. On the H200 per-head blocks won at nt = 1 (1.5B shape: attention 0.14 vs
// 0.29 ms a token at depth 300, 0.35 vs 0.56 at 4096; bench/skip_profile.py): a grouped warp
// runs its G heads one after another, which costs more than re-reading K/V from L2.
template <int DPL> cudaError_t mi_attn_launch_g(const mi_attn_args &a, cudaStream_t s) {
    if constexpr (DPL == 2 || DPL == 4) {
        switch (a.group ? a.n_head / a.n_head_kv : 1) {
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

int mi_cuda_attention(const float *q, const __half *k_cache, const __half *v_cache, const int32_t *pos, int nt,
                      int n_head, int n_head_kv, int hd, float scale, int max_splits, int group, float *part,
                      int32_t *cnt, float *att, mi_block_q8a *xq, cudaStream_t s) {
    if (n_head_kv < 1 || n_head % n_head_kv)
        return mi_set_error(MI_ERR_ARG, "CUDA attention: n_head %d not a multiple of n_head_kv %d", n_head, n_head_kv);
    if (hd % 32 || hd < 32 || hd > 256)
        return mi_set_error(MI_ERR_ARG, "CUDA attention: head_dim %d not a multiple of 32 up to 256", hd);
    if (max_splits < 1 || max_splits > MI_ATTN_SPLITS)
        return mi_set_error(MI_ERR_ARG, "CUDA attention: max_splits %d outside 1..%d", max_splits, MI_ATTN_SPLITS);
    const mi_attn_args a = {q, k_cache, v_cache, pos, nt, n_head, n_head_kv, scale, max_splits, group, part, cnt, att, xq};
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
