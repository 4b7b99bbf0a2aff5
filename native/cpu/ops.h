/* CPU transformer ops (ops.c). Shapes per call are one token row unless stated. */
#ifndef MI_CPU_OPS_H
#define MI_CPU_OPS_H
#include <stdint.h>

/* y[n] = x[n] / sqrt(mean(x^2) + eps) * w[n]  (RMSNorm, Zhang & Sennrich 2019) */
void mi_rmsnorm_row(const float *x, const float *w, float *y, int64_t n, float eps);
/* cos/sin[head_dim/2] of the RoPE angles pos * base^(-2i/head_dim) (Su et al. 2021). */
void mi_rope_table(int32_t pos, int32_t head_dim, float freq_base, float *cos_out, float *sin_out);
/* Rotate n_heads heads of x[n_heads*head_dim] in place; rope_type as enum mi_rope_type. */
void mi_rope_heads(float *x, int32_t n_heads, int32_t head_dim, int32_t rope_type, const float *cs, const float *sn);
/* One query head over KV slots 0..n_kv-1 (row j of the cache at k_cache + j*kv_stride): exact
 * softmax(q.k * scale) v into out[head_dim]; scores is scratch[n_kv]. */
void mi_attention_head(const float *q, const float *k_cache, const float *v_cache, int64_t kv_stride, int32_t n_kv,
                       int32_t head_dim, float scale, float *scores, float *out);
/* y = silu(gate) * up over n values (SwiGLU, Shazeer 2020). */
void mi_swiglu_row(const float *gate, const float *up, float *y, int64_t n);
#endif
