// Argmax: one 1024-thread block per row; ties go to the smaller index, as the CPU's scan does.
#include "argmax.cuh"

namespace {
constexpr int MI_ARGMAX_THREADS = 1024;

// (v, i) beats (bv, bi) when larger, or equal with a smaller index; bi < 0 means "none yet".
__device__ __forceinline__ bool mi_better(float v, int i, float bv, int bi) {
    if (i < 0) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(MI_ARGMAX_THREADS)
    mi_argmax_kernel(const float *__restrict__ logits, int n, const int32_t *__restrict__ n_rows_d, int32_t *out) {
    mi_pdl_wait();
    mi_pdl_trigger();
    const int j = blockIdx.x;
    if (n_rows_d && j >= *n_rows_d) return;
    const float *l = logits + (int64_t)j * n;
    float bv = 0.0f;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += MI_ARGMAX_THREADS) {
        const float v = l[i];
        if (!isnan(v) && mi_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(MI_FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(MI_FULL_MASK, bi, o);
        if (mi_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    __shared__ float sv[32];
    __shared__ int si[32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < MI_ARGMAX_THREADS / 32; w++)
            if (mi_better(sv[w], si[w], bv, bi)) {
                bv = sv[w];
                bi = si[w];
            }
        out[j] = bi < 0 ? 0 : bi;
    }
}
} // namespace

int mi_cuda_argmax(const float *logits, int n_vocab, int n_rows, const int32_t *n_rows_d, int32_t *out, cudaStream_t s) {
    if (n_rows <= 0) return MI_OK;
    MI_LAUNCH("argmax", mi_argmax_kernel, n_rows, MI_ARGMAX_THREADS, s, logits, n_vocab, n_rows_d, out);
    return MI_OK;
}
