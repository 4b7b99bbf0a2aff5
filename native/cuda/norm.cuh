// RMSNorm fused with activation quantization, plain quantization, and elementwise SwiGLU.
#ifndef MI_CUDA_NORM_CUH
#define MI_CUDA_NORM_CUH
#include "common.cuh"

// KV cache rows a layer's first norm launch pulls towards L2 for the attention two launches later
// (a hint: changes no result). The attention reads every cached slot of the layer once a token, at
// whatever rate its few blocks reach; issued here, the DRAM reads overlap the norm and the q/k/v
// mat-vec, which read little. Slots [0, pos[0]) only: the constants of this forward.
struct mi_kv_hint {
    const void *k, *v;  // the layer's K / V cache, f16 [n_ctx][kv_dim]; k == NULL: no hint
    int64_t row_bytes;  // bytes a slot (kv_dim * 2), a multiple of 16
    const int32_t *pos; // device: the forward's positions (pos[0] the first)
    int64_t cap;        // most bytes (K + V) hinted a layer: above it every 32-slot piece is cut to the
                        // same share, so that all the attention's splits gain alike
};

// For j < n_rows (n_rows_d: device count read at run time, or NULL = all): src row
// rows ? rows[j] : j of x [*][n] -> xn[j] = rmsnorm(x) * w (f32 [n_rows][n]) and xq[j] (q8a
// [n_rows][n/32]). One block per row. kv (NULL: none): the KV rows block 0 hints into L2.
int mi_cuda_rmsnorm_quant(const float *x, const int32_t *rows, const int32_t *n_rows_d, int n_rows, const float *w,
                          float eps, int n, float *xn, mi_block_q8a *xq, cudaStream_t s,
                          const mi_kv_hint *kv = nullptr);
// xq [nt][n/32] = q8a(x [nt][n]).
int mi_cuda_quantize(const float *x, int nt, int n, mi_block_q8a *xq, cudaStream_t s);
// y[i] = silu(g[i]) * u[i] over n values (fallback when ffn_gate and ffn_up differ in type).
int mi_cuda_swiglu(const float *g, const float *u, float *y, int64_t n, cudaStream_t s);
#endif
