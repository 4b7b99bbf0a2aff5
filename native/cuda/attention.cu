// Decode attention, flash-decoding style: grid (head, row, split); each block runs an online
// (exact, max-subtracted) softmax over its slots in f32, four warps interleaving slots; warps
// and then splits are merged in a fixed order, so the result is deterministic. The last block of
// a (head, row) to finish (a counter, as the CUDA threadFenceReduction sample) merges the splits
// and quantizes the output: one launch per layer, and the merge reads the partials in split order
// whichever block runs it.
#include <math.h>
#include "attention.cuh"

namespace {
constexpr int MI_ATTN_THREADS = 128;
constexpr int MI_ATTN_WARPS = MI_ATTN_THREADS / 32;
constexpr int MI_ATTN_UNROLL = 4;

__device__ __forceinline__ void mi_attn_split_size(int n_kv, int &S, int &n_used) {
    S = (((n_kv + MI_ATTN_SPLITS - 1) / MI_ATTN_SPLITS) + 31) & ~31;
    n_used = (n_kv + S - 1) / S;
}

// DPL contiguous halves of a K or V row into f32, in the widest aligned loads DPL allows (the row
// offset lane * DPL halves is 2 * DPL-byte aligned): 16, 8 or 4 bytes at a time, else 2.
template <int DPL> __device__ __forceinline__ void mi_ld_halves(const __half *p, float *f) {
    if constexpr (DPL % 8 == 0) {
#pragma unroll
        for (int i = 0; i < DPL; i += 8) {
            const uint4 u = *(const uint4 *)(p + i);
            const __half2 *h = (const __half2 *)&u;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 v = __half22float2(h[k]);
                f[i + 2 * k] = v.x;
                f[i + 2 * k + 1] = v.y;
            }
        }
    } else if constexpr (DPL % 4 == 0) {
#pragma unroll
        for (int i = 0; i < DPL; i += 4) {
            const uint2 u = *(const uint2 *)(p + i);
            const __half2 *h = (const __half2 *)&u;
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const float2 v = __half22float2(h[k]);
                f[i + 2 * k] = v.x;
                f[i + 2 * k + 1] = v.y;
            }
        }
    } else if constexpr (DPL % 2 == 0) {
#pragma unroll
        for (int i = 0; i < DPL; i += 2) {
            const float2 v = __half22float2(*(const __half2 *)(p + i));
            f[i] = v.x;
            f[i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i++) f[i] = __half2float(p[i]);
    }
}

// DPL = head_dim / 32 dims per lane (contiguous, so one K row is one coalesced 2*hd-byte read).
template <int DPL>
__global__ void __launch_bounds__(MI_ATTN_THREADS)
    mi_attn_split_kernel(const float *__restrict__ q, const __half *__restrict__ kc, const __half *__restrict__ vc,
                         const int32_t *__restrict__ pos, int n_head, int n_head_kv, float scale,
                         float *__restrict__ part, int32_t *__restrict__ cnt, float *__restrict__ att,
                         mi_block_q8a *__restrict__ xq) {
    constexpr int HD = DPL * 32;
    mi_pdl_wait();
    mi_pdl_trigger();
    const int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    const int n_kv = pos[t] + 1;
    int S, n_used;
    mi_attn_split_size(n_kv, S, n_used);
    if (s >= n_used) return;
    const int k0 = s * S, k1 = min(n_kv, k0 + S);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kvd = n_head_kv * HD, g = h / (n_head / n_head_kv);
    float qr[DPL], acc[DPL];
    const float *qh = q + (int64_t)t * n_head * HD + h * HD + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        qr[i] = qh[i];
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    // MI_ATTN_UNROLL slots per step: their K/V loads are independent and in flight together; the
    // softmax updates then run in slot order (so the result does not depend on the unrolling).
    for (int j0 = k0 + warp * MI_ATTN_UNROLL; j0 < k1; j0 += MI_ATTN_WARPS * MI_ATTN_UNROLL) {
        float kf[MI_ATTN_UNROLL][DPL], vf[MI_ATTN_UNROLL][DPL], sc[MI_ATTN_UNROLL];
#pragma unroll
        for (int u = 0; u < MI_ATTN_UNROLL; u++) {
            const int j = min(j0 + u, k1 - 1); // clamped: out-of-range slots are masked below
            mi_ld_halves<DPL>(kc + (int64_t)j * kvd + g * HD + lane * DPL, kf[u]);
            mi_ld_halves<DPL>(vc + (int64_t)j * kvd + g * HD + lane * DPL, vf[u]);
        }
#pragma unroll
        for (int u = 0; u < MI_ATTN_UNROLL; u++) {
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++) d = __fadd_rn(d, __fmul_rn(qr[i], kf[u][i]));
            sc[u] = d;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < MI_ATTN_UNROLL; u++) sc[u] = __fadd_rn(sc[u], __shfl_xor_sync(MI_FULL_MASK, sc[u], o));
#pragma unroll
        for (int u = 0; u < MI_ATTN_UNROLL; u++) {
            if (j0 + u >= k1) break;
            const float s_u = __fmul_rn(__shfl_sync(MI_FULL_MASK, sc[u], 0), scale); // lane 0's sum for all lanes
            const float mn = fmaxf(m, s_u);
            const float corr = expf(m - mn), p = expf(s_u - mn);
            l = __fadd_rn(__fmul_rn(l, corr), p);
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] = __fadd_rn(__fmul_rn(acc[i], corr), __fmul_rn(p, vf[u][i]));
            m = mn;
        }
    }
    __shared__ float sm_m[MI_ATTN_WARPS], sm_l[MI_ATTN_WARPS];
    __shared__ float sm_acc[MI_ATTN_WARPS][HD];
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; i++) sm_acc[warp][lane * DPL + i] = acc[i];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < MI_ATTN_WARPS; w++) M = fmaxf(M, sm_m[w]);
    float *out = part + (((int64_t)t * n_head + h) * MI_ATTN_SPLITS + s) * (HD + 2);
    for (int dd = threadIdx.x; dd < HD; dd += MI_ATTN_THREADS) {
        float a = 0.0f;
        for (int w = 0; w < MI_ATTN_WARPS; w++)
            if (sm_m[w] != -INFINITY) a = __fadd_rn(a, __fmul_rn(sm_acc[w][dd], expf(sm_m[w] - M)));
        out[2 + dd] = a;
    }
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int w = 0; w < MI_ATTN_WARPS; w++)
            if (sm_m[w] != -INFINITY) L = __fadd_rn(L, __fmul_rn(sm_l[w], expf(sm_m[w] - M)));
        out[0] = M;
        out[1] = L;
    }
    // Publish this split, count it; the last of the n_used splits merges (and re-arms the counter).
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t *c = cnt + (int64_t)t * n_head + h;
        last = atomicAdd(c, 1) == n_used - 1;
        if (last) *c = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float *p = part + ((int64_t)t * n_head + h) * MI_ATTN_SPLITS * (HD + 2);
    float PM = -INFINITY;
    for (int i = 0; i < n_used; i++) PM = fmaxf(PM, __ldcg(p + i * (HD + 2)));
    const int qd = n_head * HD;
    for (int c = warp; c < HD / 32; c += MI_ATTN_WARPS) { // one warp per 32 dims: its q8a block
        const int dd = 32 * c + lane;
        float PL = 0.0f, A = 0.0f;
        for (int i = 0; i < n_used; i++) {
            const float e = expf(__ldcg(p + i * (HD + 2)) - PM);
            PL = __fadd_rn(PL, __fmul_rn(__ldcg(p + i * (HD + 2) + 1), e));
            A = __fadd_rn(A, __fmul_rn(__ldcg(p + i * (HD + 2) + 2 + dd), e));
        }
        const float o = __fmul_rn(A, __frcp_rn(PL));
        att[(int64_t)t * qd + h * HD + dd] = o;
        mi_quant_chunk_warp(o, xq + (int64_t)t * (qd / 32) + h * (HD / 32) + c, lane);
    }
}

template <int DPL>
cudaError_t mi_attn_launch(const float *q, const __half *kc, const __half *vc, const int32_t *pos, int nt, int n_head,
                           int n_head_kv, float scale, float *part, int32_t *cnt, float *att, mi_block_q8a *xq,
                           cudaStream_t s) {
    return mi_launch(mi_attn_split_kernel<DPL>, dim3(n_head, nt, MI_ATTN_SPLITS), MI_ATTN_THREADS, s, q, kc, vc, pos,
                     n_head, n_head_kv, scale, part, cnt, att, xq);
}
} // namespace

int mi_cuda_attention(const float *q, const __half *k_cache, const __half *v_cache, const int32_t *pos, int nt,
                      int n_head, int n_head_kv, int hd, float scale, float *part, int32_t *cnt, float *att,
                      mi_block_q8a *xq, cudaStream_t s) {
    cudaError_t e = cudaSuccess;
    switch (hd / 32) {
    case 1: e = mi_attn_launch<1>(q, k_cache, v_cache, pos, nt, n_head, n_head_kv, scale, part, cnt, att, xq, s); break;
    case 2: e = mi_attn_launch<2>(q, k_cache, v_cache, pos, nt, n_head, n_head_kv, scale, part, cnt, att, xq, s); break;
    case 3: e = mi_attn_launch<3>(q, k_cache, v_cache, pos, nt, n_head, n_head_kv, scale, part, cnt, att, xq, s); break;
    case 4: e = mi_attn_launch<4>(q, k_cache, v_cache, pos, nt, n_head, n_head_kv, scale, part, cnt, att, xq, s); break;
    case 5: e = mi_attn_launch<5>(q, k_cache, v_cache, pos, nt, n_head, n_head_kv, scale, part, cnt, att, xq, s); break;
    case 6: e = mi_attn_launch<6>(q, k_cache, v_cache, pos, nt, n_head, n_head_kv, scale, part, cnt, att, xq, s); break;
    case 7: e = mi_attn_launch<7>(q, k_cache, v_cache, pos, nt, n_head, n_head_kv, scale, part, cnt, att, xq, s); break;
    case 8: e = mi_attn_launch<8>(q, k_cache, v_cache, pos, nt, n_head, n_head_kv, scale, part, cnt, att, xq, s); break;
    default: return mi_set_error(MI_ERR_ARG, "CUDA attention: head_dim %d not a multiple of 32 up to 256", hd);
    }
    if (e != cudaSuccess) return mi_set_error(MI_ERR_CUDA, "launch attention: %s", cudaGetErrorString(e));
    return MI_OK;
}
