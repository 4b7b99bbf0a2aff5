// RoPE (Su et al. 2021). NEOX rotates (i, i + hd/2), NORM rotates (2i, 2i + 1), as cpu/ops.c.
#include "qtypes.cuh"
#include "rope.cuh"

namespace {
constexpr int MI_ROPE_THREADS = 256;

template <int T> __device__ void mi_embed_row(const uint8_t *row, int n, float *x) {
    for (int c = threadIdx.x; c < n / 32; c += MI_ROPE_THREADS) mi_dequant_chunk<T>(row, c, x + 32 * c);
}

__global__ void __launch_bounds__(MI_ROPE_THREADS)
    mi_embed_rope_kernel(const uint8_t *__restrict__ emb, int type, int64_t row_bytes, int n,
                         const int32_t *__restrict__ tokens, const int32_t *__restrict__ pos, int hd, float base,
                         float *__restrict__ x, float *__restrict__ rope_cs) {
    mi_pdl_wait();
    mi_pdl_trigger();
    const int t = blockIdx.x;
    const uint8_t *row = emb + (int64_t)tokens[t] * row_bytes;
    float *xr = x + (int64_t)t * n;
    switch (type) {
    case MI_TYPE_F32:
        for (int i = threadIdx.x; i < n; i += MI_ROPE_THREADS) xr[i] = ((const float *)row)[i];
        break;
    case MI_TYPE_F16:
        for (int i = threadIdx.x; i < n; i += MI_ROPE_THREADS) xr[i] = __half2float(((const __half *)row)[i]);
        break;
    case MI_TYPE_Q4_0: mi_embed_row<MI_TYPE_Q4_0>(row, n, xr); break;
    case MI_TYPE_Q4_1: mi_embed_row<MI_TYPE_Q4_1>(row, n, xr); break;
    case MI_TYPE_Q5_0: mi_embed_row<MI_TYPE_Q5_0>(row, n, xr); break;
    case MI_TYPE_Q5_1: mi_embed_row<MI_TYPE_Q5_1>(row, n, xr); break;
    case MI_TYPE_Q8_0: mi_embed_row<MI_TYPE_Q8_0>(row, n, xr); break;
    case MI_TYPE_Q4_K: mi_embed_row<MI_TYPE_Q4_K>(row, n, xr); break;
    case MI_TYPE_Q5_K: mi_embed_row<MI_TYPE_Q5_K>(row, n, xr); break;
    case MI_TYPE_Q6_K: mi_embed_row<MI_TYPE_Q6_K>(row, n, xr); break;
    default: break;
    }
    const int half = hd / 2;
    for (int i = threadIdx.x; i < half; i += MI_ROPE_THREADS) {
        // theta in double: at position 30k the angle is large and f32 would lose digits.
        const double theta = (double)pos[t] * pow((double)base, -2.0 * i / (double)hd);
        rope_cs[(int64_t)t * hd + i] = (float)cos(theta);
        rope_cs[(int64_t)t * hd + half + i] = (float)sin(theta);
    }
}

__global__ void __launch_bounds__(MI_ROPE_THREADS)
    mi_rope_kv_kernel(float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v, int n_head,
                      int n_head_kv, int hd, int neox, const float *__restrict__ rope_cs,
                      const int32_t *__restrict__ pos, __half *__restrict__ kc, __half *__restrict__ vc) {
    mi_pdl_wait();
    mi_pdl_trigger();
    const int t = blockIdx.x, half = hd / 2;
    const int qd = n_head * hd, kvd = n_head_kv * hd;
    const float *cs = rope_cs + (int64_t)t * hd, *sn = cs + half;
    __half *kslot = kc + (int64_t)pos[t] * kvd, *vslot = vc + (int64_t)pos[t] * kvd;
    const int n_pairs = (n_head + n_head_kv) * half;
    for (int p = threadIdx.x; p < n_pairs; p += MI_ROPE_THREADS) {
        const int h = p / half, i = p % half;
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const bool is_q = h < n_head;
        const float *src = is_q ? q + (int64_t)t * qd + h * hd : k + (int64_t)t * kvd + (h - n_head) * hd;
        const float x0 = src[a], x1 = src[b];
        const float y0 = __fsub_rn(__fmul_rn(x0, cs[i]), __fmul_rn(x1, sn[i]));
        const float y1 = __fadd_rn(__fmul_rn(x0, sn[i]), __fmul_rn(x1, cs[i]));
        if (is_q) {
            float *d = q + (int64_t)t * qd + h * hd;
            d[a] = y0;
            d[b] = y1;
        } else {
            __half *d = kslot + (h - n_head) * hd;
            d[a] = __float2half_rn(y0);
            d[b] = __float2half_rn(y1);
        }
    }
    for (int i = threadIdx.x; i < kvd; i += MI_ROPE_THREADS) vslot[i] = __float2half_rn(v[(int64_t)t * kvd + i]);
}
} // namespace

int mi_cuda_embed_rope(const mi_dtensor *emb, const int32_t *tokens, const int32_t *pos, int nt, int head_dim,
                       float freq_base, float *x, float *rope_cs, cudaStream_t s) {
    MI_LAUNCH("embed_rope", mi_embed_rope_kernel, nt, MI_ROPE_THREADS, s, emb->data, emb->type, emb->row_bytes,
              (int)emb->n_cols, tokens, pos, head_dim, freq_base, x, rope_cs);
    return MI_OK;
}

int mi_cuda_rope_kv(float *q, const float *k, const float *v, int nt, int n_head, int n_head_kv, int hd,
                    int rope_type, const float *rope_cs, const int32_t *pos, __half *k_cache, __half *v_cache,
                    cudaStream_t s) {
    MI_LAUNCH("rope_kv", mi_rope_kv_kernel, nt, MI_ROPE_THREADS, s, q, k, v, n_head, n_head_kv, hd,
              (int)(rope_type == MI_ROPE_NEOX), rope_cs, pos, k_cache, v_cache);
    return MI_OK;
}
