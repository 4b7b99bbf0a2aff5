/* Quantized block layouts: the one place they are stated. Byte-compatible with GGUF/ggml
 * (ggml/src/ggml-common.h), so weights are used straight from the mmap'd file. Shared by the
 * CPU backend and the CUDA kernels (plain C structs, no host-only types). */
#ifndef MI_QUANTS_H
#define MI_QUANTS_H
#include <stdint.h>

typedef uint16_t mi_f16; /* IEEE half, stored as bits */

/* GGML type ids, as written in GGUF tensor infos. */
enum mi_type {
    MI_TYPE_F32 = 0,
    MI_TYPE_F16 = 1,
    MI_TYPE_Q4_0 = 2,
    MI_TYPE_Q4_1 = 3,
    MI_TYPE_Q5_0 = 6,
    MI_TYPE_Q5_1 = 7,
    MI_TYPE_Q8_0 = 8,
    MI_TYPE_Q4_K = 12,
    MI_TYPE_Q5_K = 13,
    MI_TYPE_Q6_K = 14,
};

#define MI_QK 32   /* elements per 32-wide block (and per activation block) */
#define MI_QK_K 256 /* elements per K-quant super-block */

/* Q4_0: 32 weights per 18-byte block: d f16, qs[16] (low nibbles = elements 0..15, high
 * nibbles = 16..31); w = (q - 8) * d. */
typedef struct { mi_f16 d; uint8_t qs[16]; } mi_block_q4_0;
/* Q4_1: 32 weights per 20-byte block: d f16, m f16, qs[16] as Q4_0; w = q * d + m. */
typedef struct { mi_f16 d; mi_f16 m; uint8_t qs[16]; } mi_block_q4_1;
/* Q5_0: 32 weights per 22-byte block: d f16, qh[4] (bit j = 5th bit of element j, LE u32),
 * qs[16] as Q4_0; w = ((q | h << 4) - 16) * d. */
typedef struct { mi_f16 d; uint8_t qh[4]; uint8_t qs[16]; } mi_block_q5_0;
/* Q5_1: 32 weights per 24-byte block: d f16, m f16, qh[4], qs[16]; w = (q | h << 4) * d + m. */
typedef struct { mi_f16 d; mi_f16 m; uint8_t qh[4]; uint8_t qs[16]; } mi_block_q5_1;
/* Q8_0: 32 weights per 34-byte block: d f16, qs[32] int8; w = q * d. */
typedef struct { mi_f16 d; int8_t qs[32]; } mi_block_q8_0;
/* Q4_K: 256 weights per 144-byte block: d f16, dmin f16, scales[12] (8 sub-blocks of 32, each a
 * 6-bit scale and 6-bit min packed as in ggml's get_scale_min_k4), qs[128] (bytes 32*i..32*i+31
 * hold sub-block 2i in low nibbles and 2i+1 in high nibbles); w = d*sc*q - dmin*mn. */
typedef struct { mi_f16 d; mi_f16 dmin; uint8_t scales[12]; uint8_t qs[128]; } mi_block_q4_K;
/* Q5_K: 256 weights per 176-byte block: d, dmin, scales[12] as Q4_K, qh[32] (bit i of byte l
 * = 5th bit of element 32*i + l), qs[128] as Q4_K; w = d*sc*(q | h << 4) - dmin*mn. */
typedef struct { mi_f16 d; mi_f16 dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } mi_block_q5_K;
/* Q6_K: 256 weights per 210-byte block: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16]
 * int8 (one per 16 weights), d f16; w = d * sc * (q - 32). Element order as ggml's
 * dequantize_row_q6_K (two halves of 128, each 4 interleaved groups of 32). */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; mi_f16 d; } mi_block_q6_K;

/* Activation block (our design, both backends): 32 activations quantized symmetrically to int8
 * with d = max|x| / 127, plus s = d * sum(qs) so types with a min/offset (Q4_1, Q5_1, Q4_K,
 * Q5_K) need no second pass. 40 bytes. As llama.cpp's CUDA q8_1 but with f32 d and s. */
typedef struct { float d; float s; int8_t qs[32]; } mi_block_q8a;

/* Bytes per block and elements per block of a weight type; 0 for an unsupported type. */
static inline int mi_type_block_bytes(int t) {
    switch (t) {
    case MI_TYPE_F32: return 4;
    case MI_TYPE_F16: return 2;
    case MI_TYPE_Q4_0: return 18;
    case MI_TYPE_Q4_1: return 20;
    case MI_TYPE_Q5_0: return 22;
    case MI_TYPE_Q5_1: return 24;
    case MI_TYPE_Q8_0: return 34;
    case MI_TYPE_Q4_K: return 144;
    case MI_TYPE_Q5_K: return 176;
    case MI_TYPE_Q6_K: return 210;
    default: return 0;
    }
}
static inline int mi_type_block_elems(int t) {
    switch (t) {
    case MI_TYPE_F32: case MI_TYPE_F16: return 1;
    case MI_TYPE_Q4_0: case MI_TYPE_Q4_1: case MI_TYPE_Q5_0: case MI_TYPE_Q5_1: case MI_TYPE_Q8_0: return 32;
    case MI_TYPE_Q4_K: case MI_TYPE_Q5_K: case MI_TYPE_Q6_K: return 256;
    default: return 0;
    }
}
#endif
