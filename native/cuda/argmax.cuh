// Greedy sampling on the GPU: first maximum of each logits row.
#ifndef MI_CUDA_ARGMAX_CUH
#define MI_CUDA_ARGMAX_CUH
#include "common.cuh"
// out[j] = argmax(logits[j][0..n_vocab)) (first max, NaN ignored) for j < *n_rows_d (<= n_rows).
int mi_cuda_argmax(const float *logits, int n_vocab, int n_rows, const int32_t *n_rows_d, int32_t *out, cudaStream_t s);
#endif
