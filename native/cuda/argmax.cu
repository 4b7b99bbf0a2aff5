// Argmax: MI_ARGMAX_BLOCKS blocks per row each scan a strided share of the row; the last block of
// a row to finish (a counter, as the CUDA threadFenceReduction sample) reduces their candidates.
// "Better" = larger, or equal with a smaller index: a total order, so the result is the row's first
// maximum whatever order the blocks finish in, as the CPU's scan gives. A NaN anywhere in a row
// (index MI_ARGMAX_NAN, beating everything) makes its result -1, as the CPU's: the row has no maximum.
// (One 1024-thread block per row took 74 us for a 151,936-token vocabulary on the H200.)
#include "argmax.cuh"

namespace {
constexpr int MI_ARGMAX_THREADS = 256;

constexpr int MI_ARGMAX_NAN = -2; // candidate index of a NaN: beats every value

// (v, i) beats (bv, bi) when larger, or equal with a smaller index; bi == -1 means "none yet".
__device__ __forceinline__ bool mi_better(float v, int i, float bv, int bi) {
    if (bi == MI_ARGMAX_NAN || i == -1) return false;
    if (i == MI_ARGMAX_NAN || bi == -1) return true;
    return v > bv || (v == bv && i < bi);
}

// Best (v, i) of the block into (bv, bi) of thread 0.
__device__ __forceinline__ void mi_block_best(float &bv, int &bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(MI_FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(MI_FULL_MASK, bi, o);
        if (mi_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    __shared__ float sv[MI_ARGMAX_THREADS / 32];
    __shared__ int si[MI_ARGMAX_THREADS / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < MI_ARGMAX_THREADS / 32; w++)
            if (mi_better(sv[w], si[w], bv, bi)) {
                bv = sv[w];
                bi = si[w];
            }
}

// grid (MI_ARGMAX_BLOCKS, n_rows). part_v/part_i: [n_rows][MI_ARGMAX_BLOCKS]; cnt: [n_rows], zero
// before and after.
__global__ void __launch_bounds__(MI_ARGMAX_THREADS)
    mi_argmax_kernel(const float *__restrict__ logits, int n, const int32_t *__restrict__ n_rows_d,
                     float *__restrict__ part_v, int32_t *__restrict__ part_i, int32_t *__restrict__ cnt,
                     int32_t *out) {
    mi_pdl_wait();
    mi_pdl_trigger();
    const int j = blockIdx.y, b = blockIdx.x;
    if (n_rows_d && j >= *n_rows_d) return;
    const float *l = logits + (int64_t)j * n;
    float bv = 0.0f;
    int bi = -1;
    for (int i = b * MI_ARGMAX_THREADS + threadIdx.x; i < n; i += MI_ARGMAX_BLOCKS * MI_ARGMAX_THREADS) {
        const float v = l[i];
        if (isnan(v))
            bi = MI_ARGMAX_NAN;
        else if (mi_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    mi_block_best(bv, bi);
    __shared__ int last;
    if (threadIdx.x == 0) {
        part_v[(int64_t)j * MI_ARGMAX_BLOCKS + b] = bv;
        part_i[(int64_t)j * MI_ARGMAX_BLOCKS + b] = bi;
        __threadfence();
        last = atomicAdd(cnt + j, 1) == MI_ARGMAX_BLOCKS - 1;
        if (last) cnt[j] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    bv = 0.0f;
    bi = -1;
    for (int k = threadIdx.x; k < MI_ARGMAX_BLOCKS; k += MI_ARGMAX_THREADS) {
        const float v = __ldcg(part_v + (int64_t)j * MI_ARGMAX_BLOCKS + k);
        const int i = __ldcg(part_i + (int64_t)j * MI_ARGMAX_BLOCKS + k);
        if (mi_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    mi_block_best(bv, bi);
    if (threadIdx.x == 0) out[j] = bi == MI_ARGMAX_NAN ? -1 : bi < 0 ? 0 : bi;
}
} // namespace

int mi_cuda_argmax(const float *logits, int n_vocab, int n_rows, const int32_t *n_rows_d, float *part_v,
                   int32_t *part_i, int32_t *cnt, int32_t *out, cudaStream_t s) {
    if (n_rows <= 0) return MI_OK;
    MI_LAUNCH("argmax", mi_argmax_kernel, dim3(MI_ARGMAX_BLOCKS, n_rows), MI_ARGMAX_THREADS, s, logits, n_vocab, n_rows_d,
              part_v, part_i, cnt, out);
    return MI_OK;
}
