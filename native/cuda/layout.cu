// Host side of the device weight layouts (layout.cuh): the upload copy that pads q6_K blocks.
#include <string.h>
#include "common.cuh"
#include "layout.cuh"

int mi_upload_weights(int type, const void *src, int64_t n_rows, int64_t n_cols, uint8_t *dst) {
    const int64_t src_row = n_cols / mi_type_block_elems(type) * mi_type_block_bytes(type);
    const int64_t dst_row = mi_dev_row_bytes(type, n_cols);
    if (src_row == dst_row) {
        MI_CUDA_TRY(cudaMemcpy(dst, src, (size_t)(src_row * n_rows), cudaMemcpyHostToDevice));
        return MI_OK;
    }
    // Repack through a host staging buffer of whole rows (<= 16 MiB, at least one row).
    const int sbb = mi_type_block_bytes(type), dbb = mi_dev_block_bytes(type);
    const int64_t nb = n_cols / mi_type_block_elems(type); // blocks a row
    int64_t rows_per = (16 << 20) / dst_row;
    if (rows_per < 1) rows_per = 1;
    if (rows_per > n_rows) rows_per = n_rows;
    uint8_t *stage = (uint8_t *)malloc((size_t)(rows_per * dst_row));
    if (!stage) return mi_set_error(MI_ERR_OOM, "out of host memory staging a %lld-byte row", (long long)dst_row);
    const uint8_t *s = (const uint8_t *)src;
    int rc = MI_OK;
    for (int64_t r0 = 0; r0 < n_rows && rc == MI_OK; r0 += rows_per) {
        const int64_t nr = n_rows - r0 < rows_per ? n_rows - r0 : rows_per;
        for (int64_t b = 0; b < nr * nb; b++) {
            memcpy(stage + b * dbb, s + (r0 * nb + b) * sbb, (size_t)sbb);
            memset(stage + b * dbb + sbb, 0, (size_t)(dbb - sbb));
        }
        const cudaError_t e = cudaMemcpy(dst + r0 * dst_row, stage, (size_t)(nr * dst_row), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = mi_set_error(MI_ERR_CUDA, "weight upload: %s", cudaGetErrorString(e));
    }
    free(stage);
    return rc;
}
