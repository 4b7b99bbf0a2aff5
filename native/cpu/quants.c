/* CPU quantized products and dequantizers for every supported weight type.
 *
 * Scheme (both backends): activations are quantized once per 32 values to mi_block_q8a (int8
 * with f32 scale d and s = d*sum(q)). Each weight block is unpacked into 32-wide chunks
 *   w_i = dw * sc(i) * q_i + mw      (q_i int8, sc(i) one integer per 16 values, 1 except Q6_K)
 * so that one chunk's contribution to a dot product is exact integer work plus two products:
 *   c = (dw * a.d) * (float)(sc0 * sum_{i<16} q_i a_i + sc1 * sum_{i>=16} q_i a_i) + mw * a.s
 * and a row's result is c summed over chunks in column order, in f32 (scalar path). That order is
 * the same for any number of activation rows, so a batch of nt rows is bitwise equal row by row
 * to nt = 1. Builds with AVX2+FMA+F16C use quants_avx2.h instead for the quantizer and the
 * products (same integer parts, a different but equally fixed float scheme: 8-lane accumulators,
 * tiles of activation rows sharing each unpacked weight chunk; see that file). The dequantizers
 * below are shared by both builds.
 * Layouts: mi_quants.h (ggml's, from ggml/src/ggml-common.h and ggml-quants.c). */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "internal.h"

typedef struct {
    int8_t q[32];
    int32_t sc0, sc1; /* integer sub-scales of elements 0..15 and 16..31 */
    float dw, mw;
} chunk_t;

static inline float f16(mi_f16 h) { return mi_f16_to_f32(h); }

static inline void get_scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Unpack block `blk` of `type` into its chunks (1 for 32-wide types, 8 for K-quants). */
static inline int unpack_block(int32_t type, const uint8_t *blk, chunk_t *c) {
    switch (type) {
    case MI_TYPE_Q4_0: {
        const mi_block_q4_0 *b = (const mi_block_q4_0 *)blk;
        for (int j = 0; j < 16; j++) {
            c->q[j] = (int8_t)((b->qs[j] & 0xF) - 8);
            c->q[j + 16] = (int8_t)((b->qs[j] >> 4) - 8);
        }
        c->sc0 = c->sc1 = 1; c->dw = f16(b->d); c->mw = 0.0f;
        return 1;
    }
    case MI_TYPE_Q4_1: {
        const mi_block_q4_1 *b = (const mi_block_q4_1 *)blk;
        for (int j = 0; j < 16; j++) {
            c->q[j] = (int8_t)(b->qs[j] & 0xF);
            c->q[j + 16] = (int8_t)(b->qs[j] >> 4);
        }
        c->sc0 = c->sc1 = 1; c->dw = f16(b->d); c->mw = f16(b->m);
        return 1;
    }
    case MI_TYPE_Q5_0: {
        const mi_block_q5_0 *b = (const mi_block_q5_0 *)blk;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        for (int j = 0; j < 16; j++) {
            int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            c->q[j] = (int8_t)(((b->qs[j] & 0xF) | h0) - 16);
            c->q[j + 16] = (int8_t)(((b->qs[j] >> 4) | h1) - 16);
        }
        c->sc0 = c->sc1 = 1; c->dw = f16(b->d); c->mw = 0.0f;
        return 1;
    }
    case MI_TYPE_Q5_1: {
        const mi_block_q5_1 *b = (const mi_block_q5_1 *)blk;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        for (int j = 0; j < 16; j++) {
            int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            c->q[j] = (int8_t)((b->qs[j] & 0xF) | h0);
            c->q[j + 16] = (int8_t)((b->qs[j] >> 4) | h1);
        }
        c->sc0 = c->sc1 = 1; c->dw = f16(b->d); c->mw = f16(b->m);
        return 1;
    }
    case MI_TYPE_Q8_0: {
        const mi_block_q8_0 *b = (const mi_block_q8_0 *)blk;
        memcpy(c->q, b->qs, 32);
        c->sc0 = c->sc1 = 1; c->dw = f16(b->d); c->mw = 0.0f;
        return 1;
    }
    case MI_TYPE_Q4_K: {
        const mi_block_q4_K *b = (const mi_block_q4_K *)blk;
        const float d = f16(b->d), dmin = f16(b->dmin);
        for (int i = 0; i < 4; i++) {
            const uint8_t *qs = b->qs + 32 * i;
            chunk_t *lo = &c[2 * i], *hi = &c[2 * i + 1];
            for (int l = 0; l < 32; l++) {
                lo->q[l] = (int8_t)(qs[l] & 0xF);
                hi->q[l] = (int8_t)(qs[l] >> 4);
            }
            int sc, m;
            get_scale_min_k4(2 * i, b->scales, &sc, &m);
            lo->dw = d * (float)sc; lo->mw = -(dmin * (float)m);
            get_scale_min_k4(2 * i + 1, b->scales, &sc, &m);
            hi->dw = d * (float)sc; hi->mw = -(dmin * (float)m);
            lo->sc0 = lo->sc1 = hi->sc0 = hi->sc1 = 1;
        }
        return 8;
    }
    case MI_TYPE_Q5_K: {
        const mi_block_q5_K *b = (const mi_block_q5_K *)blk;
        const float d = f16(b->d), dmin = f16(b->dmin);
        for (int i = 0; i < 4; i++) {
            const uint8_t *qs = b->qs + 32 * i;
            chunk_t *lo = &c[2 * i], *hi = &c[2 * i + 1];
            for (int l = 0; l < 32; l++) {
                lo->q[l] = (int8_t)((qs[l] & 0xF) | (((b->qh[l] >> (2 * i)) & 1) << 4));
                hi->q[l] = (int8_t)((qs[l] >> 4) | (((b->qh[l] >> (2 * i + 1)) & 1) << 4));
            }
            int sc, m;
            get_scale_min_k4(2 * i, b->scales, &sc, &m);
            lo->dw = d * (float)sc; lo->mw = -(dmin * (float)m);
            get_scale_min_k4(2 * i + 1, b->scales, &sc, &m);
            hi->dw = d * (float)sc; hi->mw = -(dmin * (float)m);
            lo->sc0 = lo->sc1 = hi->sc0 = hi->sc1 = 1;
        }
        return 8;
    }
    case MI_TYPE_Q6_K: {
        const mi_block_q6_K *b = (const mi_block_q6_K *)blk;
        const float d = f16(b->d);
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
            const int8_t *sc = b->scales + 8 * n;
            chunk_t *c0 = &c[4 * n];
            for (int l = 0; l < 32; l++) {
                c0[0].q[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                c0[1].q[l] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                c0[2].q[l] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                c0[3].q[l] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
            for (int k = 0; k < 4; k++) {
                c0[k].sc0 = sc[2 * k];
                c0[k].sc1 = sc[2 * k + 1];
                c0[k].dw = d;
                c0[k].mw = 0.0f;
            }
        }
        return 8;
    }
    default:
        return 0;
    }
}

int64_t mi_row_bytes(int32_t type, int64_t n_cols) {
    return n_cols / mi_type_block_elems(type) * mi_type_block_bytes(type);
}

void mi_dequantize_row(int32_t type, const void *row, float *dst, int64_t n_cols) {
    if (type == MI_TYPE_F32) {
        memcpy(dst, row, (size_t)n_cols * 4);
        return;
    }
    if (type == MI_TYPE_F16) {
        const mi_f16 *h = (const mi_f16 *)row;
        for (int64_t i = 0; i < n_cols; i++) dst[i] = f16(h[i]);
        return;
    }
    const int be = mi_type_block_elems(type), bb = mi_type_block_bytes(type);
    const uint8_t *p = (const uint8_t *)row;
    chunk_t ch[8];
    for (int64_t b = 0; b < n_cols / be; b++) {
        int nc = unpack_block(type, p + b * bb, ch);
        for (int k = 0; k < nc; k++) {
            float *o = dst + b * be + 32 * k;
            for (int i = 0; i < 32; i++) {
                int sc = i < 16 ? ch[k].sc0 : ch[k].sc1;
                o[i] = ch[k].dw * (float)(sc * ch[k].q[i]) + ch[k].mw;
            }
        }
    }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MI_SIMD 1
#include "quants_avx2.h"
#else
void mi_quantize_q8a(const float *x, mi_block_q8a *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            int q = (int)roundf(xb[i] * id);
            y[b].qs[i] = (int8_t)q;
            sum += q;
        }
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

static inline int32_t dot16(const int8_t *a, const int8_t *b) {
    int32_t s = 0;
    for (int i = 0; i < 16; i++) s += (int32_t)a[i] * (int32_t)b[i];
    return s;
}

void mi_matmul_rows(const mi_tensor *w, int64_t r0, int64_t r1, const mi_block_q8a *xq, const float *xf, int32_t nt,
                    float *y, int64_t ldy) {
    const int64_t nc = w->n_cols;
    const int64_t rb = mi_row_bytes(w->type, nc);
    const uint8_t *base = (const uint8_t *)w->data;
    if (w->type == MI_TYPE_F32 || w->type == MI_TYPE_F16) {
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = base + r * rb;
            for (int t = 0; t < nt; t++) {
                const float *x = xf + (int64_t)t * nc;
                float acc = 0.0f;
                if (w->type == MI_TYPE_F32) {
                    const float *wr = (const float *)row;
                    for (int64_t c = 0; c < nc; c++) acc += wr[c] * x[c];
                } else {
                    const mi_f16 *wr = (const mi_f16 *)row;
                    for (int64_t c = 0; c < nc; c++) acc += f16(wr[c]) * x[c];
                }
                y[t * ldy + r] = acc;
            }
        }
        return;
    }
    const int be = mi_type_block_elems(w->type), bb = mi_type_block_bytes(w->type);
    const int64_t nb = nc / be, nq = nc / 32;
    chunk_t ch[8];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = base + r * rb;
        for (int t = 0; t < nt; t++) y[t * ldy + r] = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const int n = unpack_block(w->type, row + b * bb, ch);
            for (int t = 0; t < nt; t++) {
                const mi_block_q8a *a = xq + (int64_t)t * nq + b * n;
                float acc = y[t * ldy + r];
                for (int k = 0; k < n; k++) {
                    const int32_t isum = ch[k].sc0 * dot16(ch[k].q, a[k].qs) + ch[k].sc1 * dot16(ch[k].q + 16, a[k].qs + 16);
                    acc += (ch[k].dw * a[k].d) * (float)isum + ch[k].mw * a[k].s;
                }
                y[t * ldy + r] = acc;
            }
        }
    }
}
#endif /* MI_SIMD */

void mi_matmul(const mi_tensor *w, const float *x, int32_t nt, float *y, mi_block_q8a *scratch, int n_threads) {
    const int quant = !(w->type == MI_TYPE_F32 || w->type == MI_TYPE_F16);
    if (quant)
        for (int t = 0; t < nt; t++) mi_quantize_q8a(x + (int64_t)t * w->n_cols, scratch + (int64_t)t * (w->n_cols / 32), w->n_cols);
    const int64_t n_rows = w->n_rows;
    /* Rows are split in contiguous ranges of 16 so each thread streams its own part of W. */
    const int64_t n_chunks = (n_rows + 15) / 16;
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1)
    for (int64_t ci = 0; ci < n_chunks; ci++) {
        int64_t r0 = ci * 16, r1 = r0 + 16 < n_rows ? r0 + 16 : n_rows;
        mi_matmul_rows(w, r0, r1, quant ? scratch : NULL, quant ? NULL : x, nt, y, n_rows);
    }
}

int mi_dequantize(int32_t type, const void *src, int64_t n_rows, int64_t n_cols, float *dst) {
    if (!mi_type_supported(type)) return mi_set_error(MI_ERR_TYPE, "unsupported tensor type %d", type);
    if (n_cols % mi_type_block_elems(type)) return mi_set_error(MI_ERR_ARG, "n_cols %lld not a multiple of the block size", (long long)n_cols);
    const int64_t rb = mi_row_bytes(type, n_cols);
    for (int64_t r = 0; r < n_rows; r++) mi_dequantize_row(type, (const uint8_t *)src + r * rb, dst + r * n_cols, n_cols);
    return MI_OK;
}
