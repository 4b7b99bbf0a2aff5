// Device weight layouts: how a GGUF tensor sits in GPU memory (context upload and the test entries).
// Every type keeps its GGUF block bytes except q6_K: its 210-byte blocks are only 2-aligned, so the
// kernels assembled each 32-bit word of ql / qh from two 16-bit loads plus a funnel shift (18 loads a
// chunk where q4_K needs three 16-byte ones). On the GPU each q6_K block is padded to 224 bytes:
//   q6_K device block (224 bytes, 16-aligned; the GGUF block's bytes unchanged, then zeros):
//   ql[128] @0 | qh[64] @128 | scales[16] (int8) @192 | d (f16) @208 | 14 zero bytes @210
// so every field a chunk reads is 16-aligned (ql, qh as 16-byte loads). The values, and so every
// kernel's bits, are the GGUF block's; rows are n_cols / 256 * 224 bytes.
#ifndef MI_CUDA_LAYOUT_CUH
#define MI_CUDA_LAYOUT_CUH
#include <stdint.h>
#include "mi_quants.h"

constexpr int MI_Q6K_DEV_BB = 224; // q6_K block bytes on the device (GGUF: 210)

// Bytes of one block of `type` on the device (0 for an unknown type).
static inline int mi_dev_block_bytes(int type) {
    return type == MI_TYPE_Q6_K ? MI_Q6K_DEV_BB : mi_type_block_bytes(type);
}
// Bytes of one row of n_cols elements of `type` on the device.
static inline int64_t mi_dev_row_bytes(int type, int64_t n_cols) {
    return n_cols / mi_type_block_elems(type) * mi_dev_block_bytes(type);
}

// Copy n_rows x n_cols weights of `type` from host memory in the GGUF layout (src) to device memory
// in the device layout (dst: n_rows * mi_dev_row_bytes bytes), synchronously. Returns MI_OK or
// MI_ERR_CUDA / MI_ERR_OOM (staging buffer) with the error set.
int mi_upload_weights(int type, const void *src, int64_t n_rows, int64_t n_cols, uint8_t *dst);
#endif
