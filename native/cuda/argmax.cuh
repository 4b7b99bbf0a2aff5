// Greedy sampling on the GPU: first maximum of each logits row.
#ifndef MI_CUDA_ARGMAX_CUH
#define MI_CUDA_ARGMAX_CUH
#include "common.cuh"

#define MI_ARGMAX_BLOCKS 32 // blocks per row (each scans n_vocab / 32 logits)

// out[j] = argmax(logits[j][0..n_vocab)) (first max, NaN ignored; 0 for a row of NaN) for
// j < *n_rows_d (<= n_rows; n_rows_d NULL: all n_rows). Scratch: part_v f32 and part_i int32
// [n_rows][MI_ARGMAX_BLOCKS]; cnt int32 [n_rows], zero before the first call (left zero).
int mi_cuda_argmax(const float *logits, int n_vocab, int n_rows, const int32_t *n_rows_d, float *part_v,
                   int32_t *part_i, int32_t *cnt, int32_t *out, cudaStream_t s);
#endif
