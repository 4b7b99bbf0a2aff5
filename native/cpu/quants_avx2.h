/* AVX2 (+FMA, F16C; AVX-512 VNNI/BW where the build has them) kernels of quants.c: the
 * activation quantizer and mi_matmul_rows. Included from quants.c only, inside #ifdef MI_SIMD.
 *
 * Fixed float scheme per (activation row t, weight row r), the same for every nt and thread
 * count (one code path: a tile of T <= MI_TMAX activation rows shares each unpacked weight chunk,
 * and every row of the tile runs exactly the float operations it would run alone):
 *   for each 32-wide chunk k (column order): isum_k = 8 int32 lanes of exact partial dots
 *     (sub-scales of Q6_K folded in as integers), then
 *     acc[k & 1] = fma(bcast(dw_k) * bcast(a_k.d), cvt(isum_k), acc[k & 1])   (k counted per row)
 *   min terms: Q4_1/Q5_1: summ = summ + m_b * a_b.s per block (scalar, in order);
 *              Q4_K/Q5_K: macc = fnma(dmin * m[0..7], s[0..7], macc) per super-block (8 lanes);
 *   y = hsum(acc[0] + acc[1]) + (summ or hsum(macc)), hsum a fixed tree.
 * Integer parts are exact, so their SIMD order is free. */
#include <immintrin.h>

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define MI_VNNI 1
#endif
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define MI_AVX512BW 1
#endif

#ifdef MI_AVX512BW
#define MI_TMAX 8 /* activation rows per tile (32 vector registers) */
#else
#define MI_TMAX 4 /* activation rows per tile */
#endif
#define MI_INL static inline __attribute__((always_inline))

/* ---- activation quantizer (same semantics as the scalar one: d = amax/127, q = roundf(x/d)) ---- */

MI_INL __m256 round_half_away(__m256 v) {
    const __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 frac = _mm256_and_ps(_mm256_sub_ps(v, r), absm); /* exact */
    const __m256 ge = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_andnot_ps(absm, v), _mm256_set1_ps(1.0f)); /* copysign(1, v) */
    return _mm256_add_ps(r, _mm256_and_ps(ge, one));
}

void mi_quantize_q8a(const float *x, mi_block_q8a *y, int64_t n) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absm), _mm256_and_ps(v1, absm)),
                                 _mm256_max_ps(_mm256_and_ps(v2, absm), _mm256_and_ps(v3, absm)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 idv = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v0, idv)));
        __m256i i1 = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v1, idv)));
        __m256i i2 = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v2, idv)));
        __m256i i3 = _mm256_cvttps_epi32(round_half_away(_mm256_mul_ps(v3, idv)));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
        const int sum = _mm_cvtsi128_si32(s4);
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[b].qs, p);
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

/* ---- integer dot helpers ---- */

/* 8 int32 lanes, lane i = sum of u[4i..4i+3] * s[4i..4i+3] (u unsigned, s signed bytes). */
MI_INL __m256i dot_us(__m256i u, __m256i s) {
#ifdef MI_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

MI_INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

MI_INL float f16c(mi_f16 h) { return _cvtsh_ss(h); }

MI_INL __m256i nibbles16(const uint8_t *qs) { /* 16 bytes -> 32 nibbles: low ones first */
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    const __m256i t = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(t, _mm256_set1_epi8(0x0F));
}

#ifndef MI_AVX512BW
MI_INL __m256i bytes_from_bits32(uint32_t x) { /* 0xFF where bit j of x is set */
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}
#endif

/* ---- 32-wide block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 ---- */

/* Unpack one block: x = bytes for the unsigned operand; sg = sign source (signed types), dw, mw. */
MI_INL void unpack32(const int type, const uint8_t *blk, __m256i *x, __m256i *sg, float *dw, float *mw) {
    switch (type) {
    case MI_TYPE_Q4_0: {
        const mi_block_q4_0 *b = (const mi_block_q4_0 *)blk;
        const __m256i q = _mm256_sub_epi8(nibbles16(b->qs), _mm256_set1_epi8(8));
        *x = _mm256_abs_epi8(q); *sg = q; *dw = f16c(b->d); *mw = 0.0f;
        break;
    }
    case MI_TYPE_Q4_1: {
        const mi_block_q4_1 *b = (const mi_block_q4_1 *)blk;
        *x = nibbles16(b->qs); *sg = *x; *dw = f16c(b->d); *mw = f16c(b->m);
        break;
    }
    case MI_TYPE_Q5_0: {
        const mi_block_q5_0 *b = (const mi_block_q5_0 *)blk;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        const __m256i nib = nibbles16(b->qs);
#ifdef MI_AVX512BW
        const __m256i q = _mm256_mask_sub_epi8(nib, (__mmask32)~qh, nib, _mm256_set1_epi8(16));
#else
        const __m256i q = _mm256_or_si256(nib, _mm256_andnot_si256(bytes_from_bits32(qh), _mm256_set1_epi8((char)0xF0)));
#endif
        *x = _mm256_abs_epi8(q); *sg = q; *dw = f16c(b->d); *mw = 0.0f;
        break;
    }
    case MI_TYPE_Q5_1: {
        const mi_block_q5_1 *b = (const mi_block_q5_1 *)blk;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        const __m256i nib = nibbles16(b->qs);
#ifdef MI_AVX512BW
        *x = _mm256_mask_add_epi8(nib, (__mmask32)qh, nib, _mm256_set1_epi8(16));
#else
        *x = _mm256_or_si256(nib, _mm256_and_si256(bytes_from_bits32(qh), _mm256_set1_epi8(0x10)));
#endif
        *sg = *x; *dw = f16c(b->d); *mw = f16c(b->m);
        break;
    }
    default: { /* MI_TYPE_Q8_0 */
        const mi_block_q8_0 *b = (const mi_block_q8_0 *)blk;
        const __m256i q = _mm256_loadu_si256((const __m256i *)b->qs);
        *x = _mm256_abs_epi8(q); *sg = q; *dw = f16c(b->d); *mw = 0.0f;
        break;
    }
    }
}

MI_INL int has_min32(const int type) { return type == MI_TYPE_Q4_1 || type == MI_TYPE_Q5_1; }
MI_INL int is_signed32(const int type) { return type == MI_TYPE_Q4_0 || type == MI_TYPE_Q5_0 || type == MI_TYPE_Q8_0; }

/* One block b of a row against T activation rows (a = xq + b, stride nq). */
MI_INL void block32(const int type, const int T, const uint8_t *blk, const mi_block_q8a *a, int64_t nq, __m256 *acc,
                    float *summ) {
    __m256i x, sg;
    float dw, mw;
    unpack32(type, blk, &x, &sg, &dw, &mw);
    const __m256 dwv = _mm256_set1_ps(dw);
    for (int t = 0; t < T; t++) {
        const mi_block_q8a *at = a + t * nq;
        const __m256i av = _mm256_loadu_si256((const __m256i *)at->qs);
        const __m256i is = is_signed32(type) ? dot_us(x, _mm256_sign_epi8(av, sg)) : dot_us(x, av);
        const __m256 sc = _mm256_mul_ps(dwv, _mm256_broadcast_ss(&at->d));
        acc[t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(is), acc[t]);
        if (has_min32(type)) summ[t] = summ[t] + mw * at->s;
    }
}

MI_INL void row32(const int type, const int T, const uint8_t *row, int64_t nb, const mi_block_q8a *xq, int64_t nq,
                  float *out) {
    const int bb = mi_type_block_bytes(type);
    __m256 acc0[MI_TMAX], acc1[MI_TMAX];
    float summ[MI_TMAX];
    for (int t = 0; t < T; t++) {
        acc0[t] = _mm256_setzero_ps();
        acc1[t] = _mm256_setzero_ps();
        summ[t] = 0.0f;
    }
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        block32(type, T, row + b * bb, xq + b, nq, acc0, summ);
        block32(type, T, row + (b + 1) * bb, xq + b + 1, nq, acc1, summ);
    }
    if (b < nb) block32(type, T, row + b * bb, xq + b, nq, acc0, summ);
    for (int t = 0; t < T; t++) out[t] = hsum8(_mm256_add_ps(acc0[t], acc1[t])) + summ[t];
}

/* ---- K-quants: Q4_K, Q5_K, Q6_K (8 chunks of 32 per super-block) ---- */

/* 6-bit scales and mins of Q4_K/Q5_K -> 8 scale bytes then 8 min bytes (ggml's utmp trick). */
MI_INL void kscales(const uint8_t *scales, uint32_t utmp[4]) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(utmp, scales, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
}

/* Chunk k of a K-quant super-block against T activation rows. */
MI_INL void chunkK(const int T, const int sgn, __m256i x, __m256i sg, __m256i sc16, const int scaled, __m256 dwv,
                   const mi_block_q8a *a, int64_t nq, __m256 *acc) {
    for (int t = 0; t < T; t++) {
        const mi_block_q8a *at = a + t * nq;
        const __m256i av = _mm256_loadu_si256((const __m256i *)at->qs);
        const __m256i sa = sgn ? _mm256_sign_epi8(av, sg) : av;
        const __m256i is = scaled ? _mm256_madd_epi16(_mm256_maddubs_epi16(x, sa), sc16) : dot_us(x, sa);
        const __m256 sc = _mm256_mul_ps(dwv, _mm256_broadcast_ss(&at->d));
        acc[t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(is), acc[t]);
    }
}

MI_INL void blockK(const int type, const int T, const uint8_t *blk, const mi_block_q8a *a, int64_t nq, __m256 *acc0,
                   __m256 *acc1, __m256 *macc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (type == MI_TYPE_Q6_K) {
        const mi_block_q6_K *b = (const mi_block_q6_K *)blk;
        const __m256 dwv = _mm256_set1_ps(f16c(b->d));
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)b->scales);
        for (int n = 0; n < 2; n++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * n));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * n + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * n));
            const __m256i m3 = _mm256_set1_epi8(0x30);
            for (int j = 0; j < 4; j++) {
                __m256i q;
                switch (j) {
                case 0: q = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m3)); break;
                case 1: q = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m3)); break;
                case 2: q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m3)); break;
                default: q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m3)); break;
                }
                q = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
                const int k = 4 * n + j;
                /* int16 scale vector: sc[2k] for elements 0..15, sc[2k+1] for 16..31 */
                const __m128i shuf = _mm_set_epi64x(0x0101010101010101LL * (2 * k + 1), 0x0101010101010101LL * (2 * k));
                const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, shuf));
                chunkK(T, 1, _mm256_abs_epi8(q), q, sc16, 1, dwv, a + k, nq, (k & 1) ? acc1 : acc0);
            }
        }
        return;
    }
    /* Q4_K / Q5_K */
    const mi_block_q4_K *b4 = (const mi_block_q4_K *)blk;
    const mi_block_q5_K *b5 = (const mi_block_q5_K *)blk;
    const float d = f16c(b4->d), dmin = f16c(b4->dmin); /* same offsets in both layouts */
    uint32_t utmp[4];
    kscales(type == MI_TYPE_Q4_K ? b4->scales : b5->scales, utmp);
    const __m128i sm = _mm_loadu_si128((const __m128i *)utmp);
    const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm));
    const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
    float dw[8];
    _mm256_storeu_ps(dw, _mm256_mul_ps(_mm256_set1_ps(d), scf));
    const __m256 mv = _mm256_mul_ps(_mm256_set1_ps(dmin), mnf);
    const uint8_t *qs = type == MI_TYPE_Q4_K ? b4->qs : b5->qs;
    __m256i qh = _mm256_setzero_si256();
    if (type == MI_TYPE_Q5_K) qh = _mm256_loadu_si256((const __m256i *)b5->qh);
    for (int i = 0; i < 4; i++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (type == MI_TYPE_Q5_K) {
#ifdef MI_AVX512BW
            lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * i)))), lo, _mm256_set1_epi8(16));
            hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * i + 1)))), hi, _mm256_set1_epi8(16));
#else
            const __m256i b16 = _mm256_set1_epi8(0x10);
            __m256i hl, hh;
            switch (i) {
            case 0: hl = _mm256_slli_epi16(qh, 4); hh = _mm256_slli_epi16(qh, 3); break;
            case 1: hl = _mm256_slli_epi16(qh, 2); hh = _mm256_slli_epi16(qh, 1); break;
            case 2: hl = qh; hh = _mm256_srli_epi16(qh, 1); break;
            default: hl = _mm256_srli_epi16(qh, 2); hh = _mm256_srli_epi16(qh, 3); break;
            }
            lo = _mm256_or_si256(lo, _mm256_and_si256(hl, b16));
            hi = _mm256_or_si256(hi, _mm256_and_si256(hh, b16));
#endif
        }
        chunkK(T, 0, lo, lo, lo, 0, _mm256_broadcast_ss(&dw[2 * i]), a + 2 * i, nq, acc0);
        chunkK(T, 0, hi, hi, hi, 0, _mm256_broadcast_ss(&dw[2 * i + 1]), a + 2 * i + 1, nq, acc1);
    }
    /* mins: macc -= dmin*m[k] * a[k].s, 8 lanes = 8 chunks. The 8 s values (40-byte blocks apart) are
     * put together from scalar loads: the same lanes as a gather, which is microcoded on AMD Zen (this
     * machine kind: q4_K 8960 x 1536 mat-vec, one thread, nt = 1 0.83 -> 0.78 ms, nt = 4 2.42 -> 2.00 ms,
     * the same bits; docs/perf.md, session 35). */
    for (int t = 0; t < T; t++) {
        const mi_block_q8a *at = a + t * nq;
        const __m256 sv = _mm256_setr_ps(at[0].s, at[1].s, at[2].s, at[3].s, at[4].s, at[5].s, at[6].s, at[7].s);
        macc[t] = _mm256_fnmadd_ps(mv, sv, macc[t]);
    }
}

MI_INL void rowK(const int type, const int T, const uint8_t *row, int64_t nb, const mi_block_q8a *xq, int64_t nq,
                 float *out) {
    const int bb = mi_type_block_bytes(type);
    __m256 acc0[MI_TMAX], acc1[MI_TMAX], macc[MI_TMAX];
    for (int t = 0; t < T; t++) acc0[t] = acc1[t] = macc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) blockK(type, T, row + b * bb, xq + 8 * b, nq, acc0, acc1, macc);
    for (int t = 0; t < T; t++) {
        const float s = hsum8(_mm256_add_ps(acc0[t], acc1[t]));
        out[t] = type == MI_TYPE_Q6_K ? s : s + hsum8(macc[t]);
    }
}

/* ---- F32 / F16: 4 x 8 lane accumulators over 32 columns, scalar tail in column order ---- */

MI_INL __m256 loadw(const int type, const uint8_t *row, int64_t c) {
    if (type == MI_TYPE_F32) return _mm256_loadu_ps((const float *)row + c);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const mi_f16 *)row + c)));
}

MI_INL void rowF(const int type, const int T, const uint8_t *row, int64_t nc, const float *xf, float *out) {
    __m256 acc[MI_TMAX][4];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < 4; j++) acc[t][j] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= nc; c += 32) {
        __m256 wv[4];
        for (int j = 0; j < 4; j++) wv[j] = loadw(type, row, c + 8 * j);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < 4; j++) acc[t][j] = _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(xf + t * nc + c + 8 * j), acc[t][j]);
    }
    for (int t = 0; t < T; t++) {
        float s = hsum8(_mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), _mm256_add_ps(acc[t][2], acc[t][3])));
        for (int64_t cc = c; cc < nc; cc++) {
            const float wf = type == MI_TYPE_F32 ? ((const float *)row)[cc] : f16c(((const mi_f16 *)row)[cc]);
            s = s + wf * xf[t * nc + cc];
        }
        out[t] = s;
    }
}

/* ---- dispatch ---- */

MI_INL void row_any(const int type, const int T, const uint8_t *row, int64_t nc, const mi_block_q8a *xq, const float *xf,
                    float *out) {
    switch (type) {
    case MI_TYPE_F32: case MI_TYPE_F16: rowF(type, T, row, nc, xf, out); break;
    case MI_TYPE_Q4_K: case MI_TYPE_Q5_K: case MI_TYPE_Q6_K: rowK(type, T, row, nc / 256, xq, nc / 32, out); break;
    default: row32(type, T, row, nc / 32, xq, nc / 32, out); break;
    }
}

MI_INL void rows_type(const int type, const mi_tensor *w, int64_t r0, int64_t r1, const mi_block_q8a *xq, const float *xf,
                      int32_t nt, float *y, int64_t ldy) {
    const int64_t nc = w->n_cols, rb = mi_row_bytes(type, nc);
    const uint8_t *base = (const uint8_t *)w->data;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = base + r * rb;
        for (int32_t t0 = 0; t0 < nt; t0 += MI_TMAX) {
            const int T = nt - t0 < MI_TMAX ? nt - t0 : MI_TMAX;
            const mi_block_q8a *xqt = xq ? xq + (int64_t)t0 * (nc / 32) : NULL;
            const float *xft = xf ? xf + (int64_t)t0 * nc : NULL;
            float out[MI_TMAX];
            switch (T) {
            case 1: row_any(type, 1, row, nc, xqt, xft, out); break;
            case 2: row_any(type, 2, row, nc, xqt, xft, out); break;
            case 3: row_any(type, 3, row, nc, xqt, xft, out); break;
            case 4: row_any(type, 4, row, nc, xqt, xft, out); break;
#if MI_TMAX > 4
            case 5: row_any(type, 5, row, nc, xqt, xft, out); break;
            case 6: row_any(type, 6, row, nc, xqt, xft, out); break;
            case 7: row_any(type, 7, row, nc, xqt, xft, out); break;
            case 8: row_any(type, 8, row, nc, xqt, xft, out); break;
#endif
            default: break;
            }
            for (int t = 0; t < T; t++) y[(int64_t)(t0 + t) * ldy + r] = out[t];
        }
    }
}

void mi_matmul_rows(const mi_tensor *w, int64_t r0, int64_t r1, const mi_block_q8a *xq, const float *xf, int32_t nt,
                    float *y, int64_t ldy) {
    switch (w->type) {
    case MI_TYPE_F32: rows_type(MI_TYPE_F32, w, r0, r1, xq, xf, nt, y, ldy); break;
    case MI_TYPE_F16: rows_type(MI_TYPE_F16, w, r0, r1, xq, xf, nt, y, ldy); break;
    case MI_TYPE_Q4_0: rows_type(MI_TYPE_Q4_0, w, r0, r1, xq, xf, nt, y, ldy); break;
    case MI_TYPE_Q4_1: rows_type(MI_TYPE_Q4_1, w, r0, r1, xq, xf, nt, y, ldy); break;
    case MI_TYPE_Q5_0: rows_type(MI_TYPE_Q5_0, w, r0, r1, xq, xf, nt, y, ldy); break;
    case MI_TYPE_Q5_1: rows_type(MI_TYPE_Q5_1, w, r0, r1, xq, xf, nt, y, ldy); break;
    case MI_TYPE_Q8_0: rows_type(MI_TYPE_Q8_0, w, r0, r1, xq, xf, nt, y, ldy); break;
    case MI_TYPE_Q4_K: rows_type(MI_TYPE_Q4_K, w, r0, r1, xq, xf, nt, y, ldy); break;
    case MI_TYPE_Q5_K: rows_type(MI_TYPE_Q5_K, w, r0, r1, xq, xf, nt, y, ldy); break;
    case MI_TYPE_Q6_K: rows_type(MI_TYPE_Q6_K, w, r0, r1, xq, xf, nt, y, ldy); break;
    default: break;
    }
}
