/* Error reporting and f16 conversion shared by every backend. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "internal.h"

static _Thread_local char g_err[512];

int mi_set_error(int code, const char *fmt, ...) {
    /* Format into a copy first: a caller may pass mi_last_error() itself as an argument (adding
     * context to an error), and vsnprintf's source and destination must not overlap. */
    char buf[sizeof g_err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(g_err, buf, sizeof g_err);
    return code;
}

const char *mi_last_error(void) { return g_err; }

/* Exact IEEE half -> float (normals, subnormals, inf, nan), no table: the compiler turns this into
 * F16C's vcvtph2ps where -march allows. */
float mi_f16_to_f32(mi_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do { mant <<= 1; e++; } while (!(mant & 0x400));
            mant &= 0x3ff;
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | mant << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

const char *mi_type_name(int32_t t) {
    switch (t) {
    case MI_TYPE_F32: return "F32";
    case MI_TYPE_F16: return "F16";
    case MI_TYPE_Q4_0: return "Q4_0";
    case MI_TYPE_Q4_1: return "Q4_1";
    case MI_TYPE_Q5_0: return "Q5_0";
    case MI_TYPE_Q5_1: return "Q5_1";
    case MI_TYPE_Q8_0: return "Q8_0";
    case MI_TYPE_Q4_K: return "Q4_K";
    case MI_TYPE_Q5_K: return "Q5_K";
    case MI_TYPE_Q6_K: return "Q6_K";
    default: return "unsupported";
    }
}

int mi_type_supported(int32_t t) { return mi_type_block_bytes(t) != 0; }

#ifndef MI_HAS_CUDA
int mi_cuda_available(void) { return 0; }
const char *mi_cuda_device_name(void) { return ""; }
int32_t mi_cuda_compute_capability(void) { return 0; }
double mi_cuda_copy_bandwidth(void) { return -1.0; }
int mi_cuda_op_mmq(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int32_t nt,
                   const float *bias, int32_t accumulate, float *y) {
    return mi_set_error(MI_ERR_CUDA, "this build of pyminfer has no CUDA backend");
}
uint64_t mi_cuda_mmq_wide_launches(void) { return 0; }
uint64_t mi_cuda_mmvq_mma_launches(void) { return 0; }
uint64_t mi_cuda_mmvq_pair_launches(void) { return 0; }
uint64_t mi_cuda_mmvq_mma_split_launches(void) { return 0; }
uint64_t mi_cuda_attn_pair_launches(void) { return 0; }
int mi_cuda_op_attention_prefill(const float *q, const uint16_t *k, const uint16_t *v, const int32_t *pos, int32_t nt,
                                 int32_t n_kv, int32_t n_head, int32_t n_head_kv, int32_t head_dim, float scale,
                                 float *out) {
    return mi_set_error(MI_ERR_CUDA, "this build of pyminfer has no CUDA backend");
}
#endif
