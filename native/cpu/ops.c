/* CPU elementwise and attention ops of the transformer block. Every op processes one token row
 * independently in a fixed order, so a row's result never depends on how many rows share a call. */
#include <math.h>
#include <stdlib.h>
#include "internal.h"
#include "ops.h"

void mi_rmsnorm_row(const float *x, const float *w, float *y, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

void mi_rope_table(int32_t pos, int32_t head_dim, float freq_base, float *cos_out, float *sin_out) {
    for (int i = 0; i < head_dim / 2; i++) {
        /* theta in double: the angle at position 30k is large, and f32 would lose digits. */
        double theta = (double)pos * pow((double)freq_base, -2.0 * i / (double)head_dim);
        cos_out[i] = (float)cos(theta);
        sin_out[i] = (float)sin(theta);
    }
}

void mi_rope_heads(float *x, int32_t n_heads, int32_t head_dim, int32_t rope_type, const float *cs, const float *sn) {
    const int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            /* NEOX rotates (i, i + half); NORM rotates adjacent (2i, 2i + 1). */
            const int a = rope_type == MI_ROPE_NEOX ? i : 2 * i;
            const int b = rope_type == MI_ROPE_NEOX ? i + half : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * cs[i] - x1 * sn[i];
            v[b] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

void mi_attention_head(const float *q, const float *k_cache, const float *v_cache, int64_t kv_stride, int32_t n_kv,
                       int32_t head_dim, float scale, float *scores, float *out) {
    float mx = -INFINITY;
    for (int32_t j = 0; j < n_kv; j++) {
        const float *k = k_cache + (int64_t)j * kv_stride;
        float s = 0.0f;
        for (int d = 0; d < head_dim; d++) s += q[d] * k[d];
        s *= scale;
        scores[j] = s;
        mx = fmaxf(mx, s);
    }
    float sum = 0.0f;
    for (int32_t j = 0; j < n_kv; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    for (int d = 0; d < head_dim; d++) out[d] = 0.0f;
    for (int32_t j = 0; j < n_kv; j++) {
        const float *v = v_cache + (int64_t)j * kv_stride;
        const float p = scores[j];
        for (int d = 0; d < head_dim; d++) out[d] += p * v[d];
    }
    const float inv = 1.0f / sum;
    for (int d = 0; d < head_dim; d++) out[d] *= inv;
}

void mi_swiglu_row(const float *gate, const float *up, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        y[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

/* ---- C API wrappers (pyminfer.h): the same functions the forward calls ---- */

int mi_op_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    if (n <= 0) return mi_set_error(MI_ERR_ARG, "rmsnorm: n must be positive");
    mi_rmsnorm_row(x, w, y, n, eps);
    return MI_OK;
}

int mi_op_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t pos, float freq_base, int32_t rope_type) {
    if (head_dim <= 0 || head_dim % 2 || n_heads <= 0 || pos < 0)
        return mi_set_error(MI_ERR_ARG, "rope: bad arguments");
    if (rope_type != MI_ROPE_NORM && rope_type != MI_ROPE_NEOX) return mi_set_error(MI_ERR_ARG, "rope: unknown type %d", rope_type);
    float *cs = malloc(sizeof(float) * head_dim);
    if (!cs) return mi_set_error(MI_ERR_OOM, "out of memory");
    mi_rope_table(pos, head_dim, freq_base, cs, cs + head_dim / 2);
    mi_rope_heads(x, n_heads, head_dim, rope_type, cs, cs + head_dim / 2);
    free(cs);
    return MI_OK;
}

int mi_op_attention(const float *q, const float *k, const float *v, int32_t n_kv, int32_t head_dim, float scale,
                    float *out) {
    if (n_kv <= 0 || head_dim <= 0) return mi_set_error(MI_ERR_ARG, "attention: bad arguments");
    float *scores = malloc(sizeof(float) * n_kv);
    if (!scores) return mi_set_error(MI_ERR_OOM, "out of memory");
    mi_attention_head(q, k, v, head_dim, n_kv, head_dim, scale, scores, out);
    free(scores);
    return MI_OK;
}

int mi_op_swiglu(const float *gate, const float *up, float *y, int64_t n) {
    if (n <= 0) return mi_set_error(MI_ERR_ARG, "swiglu: n must be positive");
    mi_swiglu_row(gate, up, y, n);
    return MI_OK;
}
