/* Internal declarations shared by the CPU backend files (and the CUDA backend's C glue). */
#ifndef MI_INTERNAL_H
#define MI_INTERNAL_H
#include "pyminfer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Record an error message for mi_last_error() and return `code`. */
int mi_set_error(int code, const char *fmt, ...);

float mi_f16_to_f32(mi_f16 h);

/* ---- quants.c ---- */
/* Quantize n (multiple of 32) floats into n/32 activation blocks. */
void mi_quantize_q8a(const float *x, mi_block_q8a *y, int64_t n);
/* Dequantize one row of n_cols elements of `type`. */
void mi_dequantize_row(int32_t type, const void *row, float *dst, int64_t n_cols);
/* Bytes of one row of `type` with n_cols elements. */
int64_t mi_row_bytes(int32_t type, int64_t n_cols);
/* y[t*ldy + r] for r in [r0, r1), t < nt: rows of W times activations. xq is [nt][n_cols/32]
 * q8a blocks (quantized types), xf is [nt][n_cols] f32 (F32/F16 weights). Single-threaded; the
 * caller splits rows over threads. Per (t, r) the reduction order is the same for every nt. */
void mi_matmul_rows(const mi_tensor *w, int64_t r0, int64_t r1, const mi_block_q8a *xq, const float *xf, int32_t nt,
                    float *y, int64_t ldy);
/* Whole matmul with OpenMP over rows. x is [nt][n_cols] f32; scratch must hold nt*n_cols/32 blocks. */
void mi_matmul(const mi_tensor *w, const float *x, int32_t nt, float *y, mi_block_q8a *scratch, int n_threads);
int mi_type_supported(int32_t type);
const char *mi_type_name(int32_t type);

#ifdef __cplusplus
}
#endif
#endif
