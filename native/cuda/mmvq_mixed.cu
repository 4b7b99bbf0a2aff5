// Mixed-type q/k/v mat-vec launches (mmvq_kernels.cuh, mi_mmvq_mixed_kernel) for the type pairs
// that occur in llama.cpp's K-quant mixes: Q4_K_M / Q5_K_M files keep q and k in the file's base
// type and give v more bits in about half the layers (q4_K + q6_K, q5_0 + q8_0 in the Qwen2.5
// Q4_K_M files, q5_K + q6_K). Other pairs run as two launches (mi_cuda_mmvq_mixed_applies).
#include "mmvq_kernels.cuh"

namespace {
template <int T0, int T1, int NT>
cudaError_t mi_mixed_one(const mi_mmvq_args &a, const uint8_t *w1, int64_t row_bytes1, int n_rows1, cudaStream_t s) {
    const int n_rows = a.n_rows + n_rows1;
    return mi_launch(mi_mmvq_mixed_kernel<T0, T1, NT>, (n_rows + a.rpb - 1) / a.rpb, MI_MMVQ_THREADS, s, a.w0,
                     a.row_bytes, a.n_rows, w1, row_bytes1, n_rows, a.n_cols / 32, a.xq, a.ldx / 32, a.os, a.accumulate,
                     a.rpb);
}

template <int T0, int T1>
cudaError_t mi_mixed_nt(int nt, const mi_mmvq_args &a, const uint8_t *w1, int64_t row_bytes1, int n_rows1, cudaStream_t s) {
    switch (nt) {
    case 1: return mi_mixed_one<T0, T1, 1>(a, w1, row_bytes1, n_rows1, s);
    case 2: return mi_mixed_one<T0, T1, 2>(a, w1, row_bytes1, n_rows1, s);
    case 3: return mi_mixed_one<T0, T1, 3>(a, w1, row_bytes1, n_rows1, s);
    case 4: return mi_mixed_one<T0, T1, 4>(a, w1, row_bytes1, n_rows1, s);
    case 5: return mi_mixed_one<T0, T1, 5>(a, w1, row_bytes1, n_rows1, s);
    case 6: return mi_mixed_one<T0, T1, 6>(a, w1, row_bytes1, n_rows1, s);
    case 7: return mi_mixed_one<T0, T1, 7>(a, w1, row_bytes1, n_rows1, s);
    default: return mi_mixed_one<T0, T1, 8>(a, w1, row_bytes1, n_rows1, s);
    }
}
} // namespace

bool mi_mmvq_mixed_pair(int t0, int t1) {
    return (t0 == MI_TYPE_Q4_K && t1 == MI_TYPE_Q6_K) || (t0 == MI_TYPE_Q5_0 && t1 == MI_TYPE_Q8_0) ||
           (t0 == MI_TYPE_Q5_K && t1 == MI_TYPE_Q6_K);
}

cudaError_t mi_mmvq_mixed_launch(int t0, int t1, int nt, const mi_mmvq_args &a, const uint8_t *w1, int64_t row_bytes1,
                                 int n_rows1, cudaStream_t s) {
    if (t0 == MI_TYPE_Q4_K && t1 == MI_TYPE_Q6_K) return mi_mixed_nt<MI_TYPE_Q4_K, MI_TYPE_Q6_K>(nt, a, w1, row_bytes1, n_rows1, s);
    if (t0 == MI_TYPE_Q5_0 && t1 == MI_TYPE_Q8_0) return mi_mixed_nt<MI_TYPE_Q5_0, MI_TYPE_Q8_0>(nt, a, w1, row_bytes1, n_rows1, s);
    if (t0 == MI_TYPE_Q5_K && t1 == MI_TYPE_Q6_K) return mi_mixed_nt<MI_TYPE_Q5_K, MI_TYPE_Q6_K>(nt, a, w1, row_bytes1, n_rows1, s);
    return cudaErrorInvalidValue; // mi_cuda_mmvq_mixed_applies keeps other pairs away
}
