/* Inference context and the transformer forward (qwen2 / llama) on the CPU, plus the dispatch
 * to the CUDA backend. Data path per layer, for a batch of nt token rows:
 *   x -> RMSNorm -> q,k,v (+bias) -> RoPE(q,k) -> K/V written at slot pos -> attention
 *     -> wo -> +x -> RMSNorm -> gate,up -> SwiGLU -> down -> +x
 * KV cache: f32, kv_k/kv_v [n_layer][n_ctx][n_head_kv*head_dim]; slot = position, so rolling
 * back is re-using positions (no copies). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "internal.h"
#include "ops.h"
#ifdef MI_HAS_CUDA
#include "../cuda/backend.h"
#endif

struct mi_ctx {
    int32_t device;
    mi_model_desc d;
    mi_layer *layers;
    int32_t n_ctx, max_nt, n_threads;
    int64_t kv_dim;       /* n_head_kv * head_dim */
    float *kv_k, *kv_v;   /* [n_layer][n_ctx][kv_dim] */
    float *x, *xn;        /* [max_nt][n_embd] residual stream, normed input */
    float *q, *k, *v;     /* [max_nt][n_head*head_dim], [max_nt][kv_dim] x2 */
    float *att;           /* [max_nt][n_head*head_dim] attention output */
    float *tmp;           /* [max_nt][n_embd] projection output */
    float *gate, *up;     /* [max_nt][n_ff] */
    float *rope_cs;       /* [max_nt][head_dim] : cos[head_dim/2] then sin[head_dim/2] */
    float *scores;        /* [n_threads][n_ctx] attention scratch */
    float *logits_tmp;    /* [logits_cap][n_vocab] when the caller wants argmax only; grown on demand */
    int32_t logits_cap;
    mi_block_q8a *xq;     /* [max_nt][max(n_embd, n_ff, q_dim)/32] quantized activations */
    int32_t pending;      /* a submitted forward not yet waited for (mi_forward_submit) */
    int32_t pend_n_out;   /* its out rows: the argmax ids mi_forward_wait copies */
    int32_t *pend_argmax; /* [max_nt] the CPU's submitted forward's argmax ids */
#ifdef MI_HAS_CUDA
    mi_cuda_ctx *cuda;
#endif
};

static int check_tensor(const mi_tensor *t, const char *name, int64_t cols, int64_t rows, int need) {
    if (!t->data) return need ? mi_set_error(MI_ERR_ARG, "tensor %s missing", name) : MI_OK;
    if (!mi_type_supported(t->type)) return mi_set_error(MI_ERR_TYPE, "tensor %s: unsupported type %d", name, t->type);
    if (t->n_cols != cols || t->n_rows != rows)
        return mi_set_error(MI_ERR_ARG, "tensor %s: shape [%lld, %lld], expected [%lld, %lld]", name, (long long)t->n_rows,
                            (long long)t->n_cols, (long long)rows, (long long)cols);
    if (cols % mi_type_block_elems(t->type))
        return mi_set_error(MI_ERR_ARG, "tensor %s: %lld columns is not a multiple of the %s block", name, (long long)cols,
                            mi_type_name(t->type));
    return MI_OK;
}

static int validate(const mi_model_desc *d) {
    if (d->n_layer <= 0 || d->n_embd <= 0 || d->n_ff <= 0 || d->n_head <= 0 || d->n_head_kv <= 0 || d->head_dim <= 0 ||
        d->n_vocab <= 0 || d->n_head % d->n_head_kv || d->head_dim % 2 || d->n_embd % 32 || d->n_ff % 32)
        return mi_set_error(MI_ERR_ARG,
                            "invalid model dimensions (n_layer %d, n_embd %d, n_ff %d, n_head %d, n_head_kv %d, "
                            "head_dim %d, n_vocab %d): all must be > 0, n_embd and n_ff multiples of 32, head_dim "
                            "even, n_head a multiple of n_head_kv",
                            d->n_layer, d->n_embd, d->n_ff, d->n_head, d->n_head_kv, d->head_dim, d->n_vocab);
    if (d->rope_type != MI_ROPE_NORM && d->rope_type != MI_ROPE_NEOX)
        return mi_set_error(MI_ERR_ARG, "unknown rope type %d", d->rope_type);
    if (!(d->rope_freq_base > 0.0f))
        return mi_set_error(MI_ERR_ARG, "rope freq_base %g must be > 0", (double)d->rope_freq_base);
    if (!(d->rms_eps >= 0.0f))
        return mi_set_error(MI_ERR_ARG, "RMSNorm epsilon %g must be >= 0", (double)d->rms_eps);
    const int64_t E = d->n_embd, F = d->n_ff, QD = (int64_t)d->n_head * d->head_dim, KD = (int64_t)d->n_head_kv * d->head_dim;
    int rc;
    if ((rc = check_tensor(&d->tok_embd, "token_embd", E, d->n_vocab, 1))) return rc;
    if ((rc = check_tensor(&d->output_norm, "output_norm", E, 1, 1))) return rc;
    if ((rc = check_tensor(&d->output, "output", E, d->n_vocab, 1))) return rc;
    if (d->output_norm.type != MI_TYPE_F32) return mi_set_error(MI_ERR_TYPE, "output_norm must be F32");
    for (int l = 0; l < d->n_layer; l++) {
        const mi_layer *L = &d->layers[l];
        if ((rc = check_tensor(&L->attn_norm, "attn_norm", E, 1, 1)) || (rc = check_tensor(&L->wq, "attn_q", E, QD, 1)) ||
            (rc = check_tensor(&L->wk, "attn_k", E, KD, 1)) || (rc = check_tensor(&L->wv, "attn_v", E, KD, 1)) ||
            (rc = check_tensor(&L->bq, "attn_q.bias", QD, 1, 0)) || (rc = check_tensor(&L->bk, "attn_k.bias", KD, 1, 0)) ||
            (rc = check_tensor(&L->bv, "attn_v.bias", KD, 1, 0)) || (rc = check_tensor(&L->wo, "attn_output", QD, E, 1)) ||
            (rc = check_tensor(&L->ffn_norm, "ffn_norm", E, 1, 1)) || (rc = check_tensor(&L->ffn_gate, "ffn_gate", E, F, 1)) ||
            (rc = check_tensor(&L->ffn_up, "ffn_up", E, F, 1)) || (rc = check_tensor(&L->ffn_down, "ffn_down", F, E, 1)))
            return mi_set_error(rc, "layer %d: %s", l, mi_last_error());
        const mi_tensor *f32s[] = {&L->attn_norm, &L->ffn_norm, &L->bq, &L->bk, &L->bv};
        for (int i = 0; i < 5; i++)
            if (f32s[i]->data && f32s[i]->type != MI_TYPE_F32)
                return mi_set_error(MI_ERR_TYPE, "layer %d: %s is %s: norms and biases must be F32", l,
                                    (const char *[]){"attn_norm", "ffn_norm", "attn_q.bias", "attn_k.bias", "attn_v.bias"}[i],
                                    mi_type_name(f32s[i]->type));
    }
    return MI_OK;
}

static void *xalloc(size_t n, int *fail) {
    void *p = calloc(1, n ? n : 1);
    if (!p) *fail = 1;
    return p;
}

int mi_ctx_create(const mi_model_desc *desc, int32_t n_ctx, int32_t max_nt, int32_t n_threads, int32_t device,
                  mi_ctx **out) {
    *out = NULL;
    if (!desc || !desc->layers) return mi_set_error(MI_ERR_ARG, "null model description");
    if (n_ctx <= 0 || max_nt <= 0) return mi_set_error(MI_ERR_ARG, "n_ctx and max_nt must be positive");
    int rc = validate(desc);
    if (rc) return rc;
    mi_ctx *c = calloc(1, sizeof *c);
    if (!c) return mi_set_error(MI_ERR_OOM, "out of memory");
    c->device = device;
    c->d = *desc;
    c->layers = malloc(sizeof(mi_layer) * desc->n_layer);
    if (!c->layers) { free(c); return mi_set_error(MI_ERR_OOM, "out of memory"); }
    memcpy(c->layers, desc->layers, sizeof(mi_layer) * desc->n_layer);
    c->d.layers = c->layers;
    c->n_ctx = n_ctx;
    c->max_nt = max_nt;
#ifdef _OPENMP
    c->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
#else
    c->n_threads = 1;
#endif
    if (device == MI_DEVICE_CUDA) {
#ifdef MI_HAS_CUDA
        rc = mi_cuda_ctx_create(&c->d, n_ctx, max_nt, &c->cuda);
        if (rc) { free(c->layers); free(c); return rc; }
        *out = c;
        return MI_OK;
#else
        free(c->layers); free(c);
        return mi_set_error(MI_ERR_CUDA, "this build of pyminfer has no CUDA backend");
#endif
    } else if (device != MI_DEVICE_CPU) {
        free(c->layers); free(c);
        return mi_set_error(MI_ERR_ARG, "unknown device %d", device);
    }
    const mi_model_desc *d = &c->d;
    const int64_t E = d->n_embd, F = d->n_ff, QD = (int64_t)d->n_head * d->head_dim;
    c->kv_dim = (int64_t)d->n_head_kv * d->head_dim;
    int64_t widest = E > F ? E : F;
    if (QD > widest) widest = QD;
    int fail = 0;
    const size_t kv_bytes = (size_t)d->n_layer * n_ctx * c->kv_dim * sizeof(float);
    c->kv_k = xalloc(kv_bytes, &fail);
    c->kv_v = xalloc(kv_bytes, &fail);
    c->x = xalloc((size_t)max_nt * E * 4, &fail);
    c->xn = xalloc((size_t)max_nt * E * 4, &fail);
    c->tmp = xalloc((size_t)max_nt * E * 4, &fail);
    c->q = xalloc((size_t)max_nt * QD * 4, &fail);
    c->att = xalloc((size_t)max_nt * QD * 4, &fail);
    c->k = xalloc((size_t)max_nt * c->kv_dim * 4, &fail);
    c->v = xalloc((size_t)max_nt * c->kv_dim * 4, &fail);
    c->gate = xalloc((size_t)max_nt * F * 4, &fail);
    c->up = xalloc((size_t)max_nt * F * 4, &fail);
    c->rope_cs = xalloc((size_t)max_nt * d->head_dim * 4, &fail);
    c->scores = xalloc((size_t)c->n_threads * n_ctx * 4, &fail);
    c->xq = xalloc((size_t)max_nt * (widest / 32) * sizeof(mi_block_q8a), &fail);
    c->pend_argmax = xalloc((size_t)max_nt * sizeof(int32_t), &fail);
    if (fail) {
        mi_ctx_free(c);
        return mi_set_error(MI_ERR_OOM, "out of memory allocating the context (KV cache %zu MiB for n_ctx %d)",
                            kv_bytes * 2 >> 20, n_ctx);
    }
    *out = c;
    return MI_OK;
}

void mi_ctx_free(mi_ctx *c) {
    if (!c) return;
#ifdef MI_HAS_CUDA
    if (c->cuda) mi_cuda_ctx_free(c->cuda);
#endif
    free(c->kv_k); free(c->kv_v); free(c->x); free(c->xn); free(c->tmp); free(c->q); free(c->att); free(c->k);
    free(c->v); free(c->gate); free(c->up); free(c->rope_cs); free(c->scores); free(c->logits_tmp); free(c->xq);
    free(c->pend_argmax);
    free(c->layers);
    free(c);
}

int32_t mi_ctx_device(const mi_ctx *c) { return c->device; }

static void add_bias(float *y, const mi_tensor *b, int32_t nt, int64_t n) {
    if (!b->data) return;
    const float *bb = (const float *)b->data;
    for (int t = 0; t < nt; t++)
        for (int64_t i = 0; i < n; i++) y[t * n + i] += bb[i];
}

/* First maximum of each row, or -1 for a row holding a NaN (it has no maximum: corrupt weights or
 * an overflow; the caller reports it, as the CUDA argmax does). */
static void argmax_rows(const float *logits, int32_t n_out, int32_t n_vocab, int32_t *argmax) {
    for (int j = 0; j < n_out; j++) {
        const float *l = logits + (int64_t)j * n_vocab;
        int32_t best = 0;
        int nan = isnan(l[0]);
        for (int32_t i = 1; i < n_vocab && !nan; i++) {
            if (isnan(l[i]))
                nan = 1;
            else if (l[i] > l[best])
                best = i;
        }
        argmax[j] = nan ? -1 : best;
    }
}

int mi_gpu_replay_ms(mi_ctx *c, int32_t nt, int32_t reps, float *ms) {
    if (reps < 1) return mi_set_error(MI_ERR_ARG, "reps must be >= 1");
#ifdef MI_HAS_CUDA
    if (c->device == MI_DEVICE_CUDA) return mi_cuda_replay_ms(c->cuda, nt, reps, ms);
#endif
    (void)nt;
    (void)ms;
    return mi_set_error(MI_ERR_ARG, "GPU replay timing needs a CUDA context");
}

static int check_batch(const mi_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt, const int32_t *out_rows,
                       int32_t n_out);
static int forward_now(mi_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt, const int32_t *out_rows,
                       int32_t n_out, float *logits, int32_t *argmax);

int mi_forward_submit(mi_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt, const int32_t *out_rows,
                      int32_t n_out) {
    if (!c) return mi_set_error(MI_ERR_ARG, "null context");
    int rc = check_batch(c, tokens, pos, nt, out_rows, n_out);
    if (rc) return rc;
#ifdef MI_HAS_CUDA
    if (c->device == MI_DEVICE_CUDA) return mi_cuda_forward_submit(c->cuda, tokens, pos, nt, out_rows, n_out, 1);
#endif
    if (c->pending) return mi_set_error(MI_ERR_ARG, "a submitted forward has not been waited for");
    rc = forward_now(c, tokens, pos, nt, out_rows, n_out, NULL, c->pend_argmax);
    if (rc) return rc;
    c->pending = 1;
    c->pend_n_out = n_out;
    return MI_OK;
}

int mi_forward_ready(mi_ctx *c) {
    if (!c) return -mi_set_error(MI_ERR_ARG, "null context"); /* negated: 1 means finished */
#ifdef MI_HAS_CUDA
    if (c->device == MI_DEVICE_CUDA) return mi_cuda_forward_ready(c->cuda);
#endif
    return 1;
}

int mi_forward_wait(mi_ctx *c, int32_t *argmax) {
    if (!c) return mi_set_error(MI_ERR_ARG, "null context");
#ifdef MI_HAS_CUDA
    if (c->device == MI_DEVICE_CUDA) return mi_cuda_forward_wait(c->cuda, NULL, argmax);
#endif
    if (!c->pending) return mi_set_error(MI_ERR_ARG, "no submitted forward to wait for");
    c->pending = 0;
    if (argmax && c->pend_n_out > 0) memcpy(argmax, c->pend_argmax, (size_t)c->pend_n_out * sizeof(int32_t));
    return MI_OK;
}

/* The checks every forward makes before touching the context. */
static int check_batch(const mi_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt, const int32_t *out_rows,
                       int32_t n_out) {
    const mi_model_desc *d = &c->d;
    if (nt < 1 || nt > c->max_nt) return mi_set_error(MI_ERR_ARG, "nt %d out of range 1..%d", nt, c->max_nt);
    if (n_out < 0 || n_out > nt) return mi_set_error(MI_ERR_ARG, "n_out %d out of range 0..%d", n_out, nt);
    if (!tokens || !pos || (n_out > 0 && !out_rows)) return mi_set_error(MI_ERR_ARG, "null tokens, positions or out rows");
    for (int t = 0; t < nt; t++) {
        /* one batch = consecutive positions: the causal rule (row i sees slots <= pos[i]) and the
         * bitwise row contract are defined for that shape only */
        if (pos[t] != pos[0] + t) return mi_set_error(MI_ERR_ARG, "positions of a batch must be consecutive");
        if (tokens[t] < 0 || tokens[t] >= d->n_vocab)
            return mi_set_error(MI_ERR_ARG, "token id %d out of range 0..%d", tokens[t], d->n_vocab - 1);
        if (pos[t] < 0 || pos[t] >= c->n_ctx)
            return mi_set_error(MI_ERR_CTX, "position %d outside the context (n_ctx %d)", pos[t], c->n_ctx);
    }
    for (int j = 0; j < n_out; j++)
        if (out_rows[j] < 0 || out_rows[j] >= nt) return mi_set_error(MI_ERR_ARG, "out row %d out of range", out_rows[j]);
    return MI_OK;
}

int mi_forward(mi_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt, const int32_t *out_rows, int32_t n_out,
               float *logits, int32_t *argmax) {
    if (!c) return mi_set_error(MI_ERR_ARG, "null context");
    const int rc = check_batch(c, tokens, pos, nt, out_rows, n_out);
    if (rc) return rc;
#ifdef MI_HAS_CUDA
    if (c->device == MI_DEVICE_CUDA) return mi_cuda_forward(c->cuda, tokens, pos, nt, out_rows, n_out, logits, argmax);
#endif
    if (c->pending) return mi_set_error(MI_ERR_ARG, "a submitted forward has not been waited for");
    return forward_now(c, tokens, pos, nt, out_rows, n_out, logits, argmax);
}

/* The CPU forward itself (arguments checked). */
static int forward_now(mi_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt, const int32_t *out_rows,
                       int32_t n_out, float *logits, int32_t *argmax) {
    const mi_model_desc *d = &c->d;
    const int64_t E = d->n_embd, F = d->n_ff, HD = d->head_dim, QD = (int64_t)d->n_head * HD, KD = c->kv_dim;
    const int nth = c->n_threads;
    const float att_scale = 1.0f / sqrtf((float)HD);
    const int group = d->n_head / d->n_head_kv;

    for (int t = 0; t < nt; t++) {
        mi_dequantize_row(d->tok_embd.type, (const uint8_t *)d->tok_embd.data + tokens[t] * mi_row_bytes(d->tok_embd.type, E),
                          c->x + t * E, E);
        mi_rope_table(pos[t], (int32_t)HD, d->rope_freq_base, c->rope_cs + t * HD, c->rope_cs + t * HD + HD / 2);
    }
    for (int l = 0; l < d->n_layer; l++) {
        const mi_layer *L = &c->layers[l];
        float *kc = c->kv_k + (int64_t)l * c->n_ctx * KD, *vc = c->kv_v + (int64_t)l * c->n_ctx * KD;
        for (int t = 0; t < nt; t++) mi_rmsnorm_row(c->x + t * E, L->attn_norm.data, c->xn + t * E, E, d->rms_eps);
        mi_matmul(&L->wq, c->xn, nt, c->q, c->xq, nth);
        mi_matmul(&L->wk, c->xn, nt, c->k, c->xq, nth);
        mi_matmul(&L->wv, c->xn, nt, c->v, c->xq, nth);
        add_bias(c->q, &L->bq, nt, QD);
        add_bias(c->k, &L->bk, nt, KD);
        add_bias(c->v, &L->bv, nt, KD);
        for (int t = 0; t < nt; t++) {
            const float *cs = c->rope_cs + t * HD;
            mi_rope_heads(c->q + t * QD, d->n_head, (int32_t)HD, d->rope_type, cs, cs + HD / 2);
            mi_rope_heads(c->k + t * KD, d->n_head_kv, (int32_t)HD, d->rope_type, cs, cs + HD / 2);
            memcpy(kc + (int64_t)pos[t] * KD, c->k + t * KD, KD * 4);
            memcpy(vc + (int64_t)pos[t] * KD, c->v + t * KD, KD * 4);
        }
        const int n_work = nt * d->n_head;
#pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1 && n_work > 1)
        for (int w = 0; w < n_work; w++) {
            const int t = w / d->n_head, h = w % d->n_head, g = h / group;
#ifdef _OPENMP
            float *sc = c->scores + (int64_t)omp_get_thread_num() * c->n_ctx;
#else
            float *sc = c->scores;
#endif
            mi_attention_head(c->q + t * QD + h * HD, kc + g * HD, vc + g * HD, KD, pos[t] + 1, (int32_t)HD, att_scale, sc,
                              c->att + t * QD + h * HD);
        }
        mi_matmul(&L->wo, c->att, nt, c->tmp, c->xq, nth);
        for (int64_t i = 0; i < nt * E; i++) c->x[i] += c->tmp[i];
        for (int t = 0; t < nt; t++) mi_rmsnorm_row(c->x + t * E, L->ffn_norm.data, c->xn + t * E, E, d->rms_eps);
        mi_matmul(&L->ffn_gate, c->xn, nt, c->gate, c->xq, nth);
        mi_matmul(&L->ffn_up, c->xn, nt, c->up, c->xq, nth);
        for (int t = 0; t < nt; t++) mi_swiglu_row(c->gate + t * F, c->up + t * F, c->gate + t * F, F);
        mi_matmul(&L->ffn_down, c->gate, nt, c->tmp, c->xq, nth);
        for (int64_t i = 0; i < nt * E; i++) c->x[i] += c->tmp[i];
    }
    if (n_out == 0) return MI_OK;
    for (int j = 0; j < n_out; j++) mi_rmsnorm_row(c->x + out_rows[j] * E, d->output_norm.data, c->xn + j * E, E, d->rms_eps);
    if (!logits && n_out > c->logits_cap) {
        float *p = realloc(c->logits_tmp, (size_t)n_out * d->n_vocab * 4);
        if (!p) return mi_set_error(MI_ERR_OOM, "out of memory for %d logits rows", n_out);
        c->logits_tmp = p;
        c->logits_cap = n_out;
    }
    float *lg = logits ? logits : c->logits_tmp;
    mi_matmul(&d->output, c->xn, n_out, lg, c->xq, nth);
    if (argmax) argmax_rows(lg, n_out, d->n_vocab, argmax);
    return MI_OK;
}

int mi_op_matmul(int32_t device, int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int32_t nt,
                 float *y, int32_t n_threads) {
    if (!mi_type_supported(type)) return mi_set_error(MI_ERR_TYPE, "unsupported tensor type %d", type);
    if (n_cols % 32 && !(type == MI_TYPE_F32 || type == MI_TYPE_F16)) return mi_set_error(MI_ERR_ARG, "n_cols must be a multiple of 32");
    if (n_cols % mi_type_block_elems(type)) return mi_set_error(MI_ERR_ARG, "n_cols not a multiple of the block size");
    if (nt < 1) return mi_set_error(MI_ERR_ARG, "nt must be >= 1");
    if (device == MI_DEVICE_CUDA) {
#ifdef MI_HAS_CUDA
        return mi_cuda_op_matmul(type, w, n_rows, n_cols, x, nt, y);
#else
        return mi_set_error(MI_ERR_CUDA, "this build of pyminfer has no CUDA backend");
#endif
    }
    mi_tensor t = {w, type, n_cols, n_rows};
    mi_block_q8a *scratch = malloc(sizeof(mi_block_q8a) * (size_t)nt * (n_cols / 32 + 1));
    if (!scratch) return mi_set_error(MI_ERR_OOM, "out of memory");
#ifdef _OPENMP
    int nth = n_threads > 0 ? n_threads : omp_get_num_procs();
#else
    int nth = 1;
#endif
    mi_matmul(&t, x, nt, y, scratch, nth);
    free(scratch);
    return MI_OK;
}
