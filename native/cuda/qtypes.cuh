// Device-side unpacking of the GGUF weight blocks (layouts: include/mi_quants.h) into 32-wide
// chunks, the same decomposition as the CPU's unpack_block in cpu/quants.c:
//   w_i = dw * sc(i) * q_i + mw,  q packed 4 int8 per int (q[j] = elements 4j..4j+3),
//   sc0 for elements 0..15, sc1 for 16..31.
// So a chunk's dot product with a q8a activation block is integer dp4a work plus two products.
#ifndef MI_CUDA_QTYPES_CUH
#define MI_CUDA_QTYPES_CUH
#include "common.cuh"

struct mi_chunk {
    int q[8];
    int sc0, sc1;
    float dw, mw;
};

// 4-bit field h (bits 0..3) spread to bit 4 of each of 4 bytes: the 5th bit of Q5 weights.
__device__ __forceinline__ uint32_t mi_spread4(uint32_t h) {
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

__device__ __forceinline__ void mi_scale_min_k4(int j, const uint8_t *q, int &d, int &m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <int T> struct mi_qt;

// 32 bytes from a 2-aligned address as 8 words: 9 aligned 4-byte loads funnel-shifted by 0 or 16
// bits. Reads at most 2 bytes before and 2 after the range (callers keep both inside the block).
__device__ __forceinline__ void mi_ld32_a2(const uint8_t *p, uint32_t *out) {
    const uint32_t *w = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = ((uint32_t)(uintptr_t)p & 2u) * 8u;
    uint32_t v[9];
#pragma unroll
    for (int i = 0; i < 9; i++) v[i] = w[i];
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = __funnelshift_r(v[i], v[i + 1], sh);
}

// Q4_K / Q5_K: d, dmin and the 12 scale bytes are the block's first 16 bytes (one 16-byte load);
// chunk k's 6-bit scale and min as mi_scale_min_k4, then the chunk's dw and mw.
// mi_kquant_head on the block's first 16 bytes already loaded (callers that issue the load early).
__device__ __forceinline__ void mi_kquant_head_of(const uint4 hd, int k, mi_chunk &c) {
    const int s = 8 * (k & 3);
    const uint32_t y = hd.y >> s, z = hd.z >> s, w = hd.w >> s;
    int sc, m;
    if (k < 4) {
        sc = (int)(y & 63);
        m = (int)(z & 63);
    } else {
        sc = (int)((w & 0xF) | (((y >> 6) & 3) << 4));
        m = (int)(((w >> 4) & 0xF) | (((z >> 6) & 3) << 4));
    }
    c.sc0 = c.sc1 = 1;
    c.dw = __fmul_rn(__half2float(__ushort_as_half((unsigned short)(hd.x & 0xFFFF))), (float)sc);
    c.mw = -__fmul_rn(__half2float(__ushort_as_half((unsigned short)(hd.x >> 16))), (float)m);
}
__device__ __forceinline__ void mi_kquant_head(const uint8_t *b, int k, mi_chunk &c) {
    mi_kquant_head_of(*(const uint4 *)b, k, c);
}

template <> struct mi_qt<MI_TYPE_Q4_0> {
    static constexpr int CPB = 1, BB = 18, HAS_MIN = 0;
    static __device__ __forceinline__ void load(const uint8_t *b, int, mi_chunk &c) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t v = mi_ld_a2(b + 2 + 4 * i);
            c.q[i] = (int)__vsub4(v & 0x0F0F0F0Fu, 0x08080808u);
            c.q[4 + i] = (int)__vsub4((v >> 4) & 0x0F0F0F0Fu, 0x08080808u);
        }
        c.sc0 = c.sc1 = 1;
        c.dw = mi_ld_f16(b);
        c.mw = 0.0f;
    }
};
template <> struct mi_qt<MI_TYPE_Q4_1> {
    static constexpr int CPB = 1, BB = 20, HAS_MIN = 1;
    static __device__ __forceinline__ void load(const uint8_t *b, int, mi_chunk &c) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t v = mi_ld_a4(b + 4 + 4 * i);
            c.q[i] = (int)(v & 0x0F0F0F0Fu);
            c.q[4 + i] = (int)((v >> 4) & 0x0F0F0F0Fu);
        }
        c.sc0 = c.sc1 = 1;
        c.dw = mi_ld_f16(b);
        c.mw = mi_ld_f16(b + 2);
    }
};
template <> struct mi_qt<MI_TYPE_Q5_0> {
    static constexpr int CPB = 1, BB = 22, HAS_MIN = 0;
    static __device__ __forceinline__ void load(const uint8_t *b, int, mi_chunk &c) {
        const uint32_t qh = mi_ld_a2(b + 2);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t v = mi_ld_a2(b + 6 + 4 * i);
            c.q[i] = (int)__vsub4((v & 0x0F0F0F0Fu) | mi_spread4((qh >> (4 * i)) & 0xF), 0x10101010u);
            c.q[4 + i] = (int)__vsub4(((v >> 4) & 0x0F0F0F0Fu) | mi_spread4((qh >> (16 + 4 * i)) & 0xF), 0x10101010u);
        }
        c.sc0 = c.sc1 = 1;
        c.dw = mi_ld_f16(b);
        c.mw = 0.0f;
    }
};
template <> struct mi_qt<MI_TYPE_Q5_1> {
    static constexpr int CPB = 1, BB = 24, HAS_MIN = 1;
    static __device__ __forceinline__ void load(const uint8_t *b, int, mi_chunk &c) {
        const uint32_t qh = mi_ld_a4(b + 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t v = mi_ld_a4(b + 8 + 4 * i);
            c.q[i] = (int)((v & 0x0F0F0F0Fu) | mi_spread4((qh >> (4 * i)) & 0xF));
            c.q[4 + i] = (int)(((v >> 4) & 0x0F0F0F0Fu) | mi_spread4((qh >> (16 + 4 * i)) & 0xF));
        }
        c.sc0 = c.sc1 = 1;
        c.dw = mi_ld_f16(b);
        c.mw = mi_ld_f16(b + 2);
    }
};
template <> struct mi_qt<MI_TYPE_Q8_0> {
    static constexpr int CPB = 1, BB = 34, HAS_MIN = 0;
    static __device__ __forceinline__ void load(const uint8_t *b, int, mi_chunk &c) {
#pragma unroll
        for (int i = 0; i < 8; i++) c.q[i] = (int)mi_ld_a2(b + 2 + 4 * i);
        c.sc0 = c.sc1 = 1;
        c.dw = mi_ld_f16(b);
        c.mw = 0.0f;
    }
};
template <> struct mi_qt<MI_TYPE_Q4_K> {
    static constexpr int CPB = 8, BB = 144, HAS_MIN = 1;
    // The 8 quant words of chunk k of the block at b: chunks 2i and 2i+1 share qs[32i..32i+31], low
    // nibbles, then high nibbles (two 16-byte loads).
    static __device__ __forceinline__ void words(const uint8_t *b, int k, uint32_t (&v)[8]) {
        const uint4 *p = (const uint4 *)(b + 16 + 32 * (k >> 1));
        const uint4 v0 = p[0], v1 = p[1];
        v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
    }
    static __device__ __forceinline__ void load(const uint8_t *b, int k, mi_chunk &c) {
        uint32_t v[8];
        words(b, k, v);
        const int sh = 4 * (k & 1);
#pragma unroll
        for (int j = 0; j < 8; j++) c.q[j] = (int)((v[j] >> sh) & 0x0F0F0F0Fu);
        mi_kquant_head(b, k, c);
    }
};
template <> struct mi_qt<MI_TYPE_Q5_K> {
    static constexpr int CPB = 8, BB = 176, HAS_MIN = 1;
    static __device__ __forceinline__ void load(const uint8_t *b, int k, mi_chunk &c) {
        const uint4 *p = (const uint4 *)(b + 48 + 32 * (k >> 1));
        const uint4 *ph = (const uint4 *)(b + 16);
        const uint4 v0 = p[0], v1 = p[1], h0 = ph[0], h1 = ph[1];
        const int sh = 4 * (k & 1);
        const uint32_t v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        const uint32_t h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
        for (int j = 0; j < 8; j++) c.q[j] = (int)(((v[j] >> sh) & 0x0F0F0F0Fu) | (((h[j] >> k) & 0x01010101u) << 4));
        mi_kquant_head(b, k, c);
    }
};
template <> struct mi_qt<MI_TYPE_Q6_K> {
    static constexpr int CPB = 8, BB = 210, HAS_MIN = 0;
    static __device__ __forceinline__ void load(const uint8_t *b, int k, mi_chunk &c) {
        // Half n = k/4 holds 4 interleaved chunks: kk&1 picks ql[+32], kk>>1 the high nibble,
        // and qh's 2-bit field 2*kk (ggml's dequantize_row_q6_K order). Blocks are 2-aligned.
        const int n = k >> 2, kk = k & 3;
        // ql and qh are only 2-aligned: 9 aligned words each, funnel-shifted into place.
        uint32_t l[8], h[8];
        mi_ld32_a2(b + 64 * n + 32 * (kk & 1), l);
        mi_ld32_a2(b + 128 + 32 * n, h);
        const int shl = 4 * (kk >> 1), shh = 2 * kk;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t lo = (l[j] >> shl) & 0x0F0F0F0Fu;
            const uint32_t hi = ((h[j] >> shh) & 0x03030303u) << 4;
            c.q[j] = (int)__vsub4(lo | hi, 0x20202020u);
        }
        const uint32_t scp = *(const uint16_t *)(b + 192 + 8 * n + 2 * kk);
        c.sc0 = (int)(int8_t)(scp & 0xFF);
        c.sc1 = (int)(int8_t)(scp >> 8);
        c.dw = mi_ld_f16(b + 208);
        c.mw = 0.0f;
    }
};

// Dequantize one chunk to 32 floats as the CPU's mi_dequantize_row does.
template <int T> __device__ __forceinline__ void mi_dequant_chunk(const uint8_t *row, int c, float *out) {
    mi_chunk ch;
    mi_qt<T>::load(row + (c / mi_qt<T>::CPB) * mi_qt<T>::BB, c % mi_qt<T>::CPB, ch);
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = 4 * j + e;
            const int q = (int)(int8_t)(ch.q[j] >> (8 * e));
            const int sc = i < 16 ? ch.sc0 : ch.sc1;
            out[i] = __fadd_rn(__fmul_rn(ch.dw, (float)(sc * q)), ch.mw);
        }
    }
}
#endif
