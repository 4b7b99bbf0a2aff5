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

// The compiled pairs (q/k type, v type), one list for both functions below.
#define MI_MIXED_PAIRS(X) X(Q4_K, Q6_K) X(Q5_0, Q8_0) X(Q5_K, Q6_K)

bool mi_mmvq_mixed_pair(int t0, int t1) {
#define MI_X(A, B) if (t0 == MI_TYPE_##A && t1 == MI_TYPE_##B) return true;
    MI_MIXED_PAIRS(MI_X)
#undef MI_X
    return false;
}

cudaError_t mi_mmvq_mixed_launch(int t0, int t1, int nt, const mi_mmvq_args &a, const uint8_t *w1, int64_t row_bytes1,
                                 int n_rows1, cudaStream_t s) {
#define MI_X(A, B)                                                                                                     \
    if (t0 == MI_TYPE_##A && t1 == MI_TYPE_##B) return mi_mixed_nt<MI_TYPE_##A, MI_TYPE_##B>(nt, a, w1, row_bytes1, n_rows1, s);
    MI_MIXED_PAIRS(MI_X)
#undef MI_X
    return cudaErrorInvalidValue; // mi_cuda_mmvq_mixed_applies keeps other pairs away
}
