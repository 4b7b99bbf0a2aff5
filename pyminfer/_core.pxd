# Declarations of the C API in native/include/pyminfer.h (the one header the bindings use).
from libc.stdint cimport int32_t, int64_t, uint16_t, uint64_t

cdef extern from "pyminfer.h" nogil:
    ctypedef struct mi_tensor:
        const void *data
        int32_t type
        int64_t n_cols
        int64_t n_rows

    ctypedef struct mi_layer:
        mi_tensor attn_norm, wq, wk, wv, bq, bk, bv, wo, ffn_norm, ffn_gate, ffn_up, ffn_down

    ctypedef struct mi_model_desc:
        int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab
        int32_t rope_type
        float rope_freq_base
        float rms_eps
        mi_tensor tok_embd, output_norm, output
        const mi_layer *layers

    ctypedef struct mi_ctx:
        pass

    const char *mi_last_error()
    int mi_cuda_available()
    const char *mi_cuda_device_name()
    int32_t mi_cuda_compute_capability()
    double mi_cuda_copy_bandwidth()
    int mi_ctx_create(const mi_model_desc *desc, int32_t n_ctx, int32_t max_nt, int32_t n_threads, int32_t device,
                      mi_ctx **out)
    void mi_ctx_free(mi_ctx *ctx)
    int mi_gpu_replay_ms(mi_ctx *ctx, int32_t nt, int32_t reps, float *ms)
    int mi_forward(mi_ctx *ctx, const int32_t *tokens, const int32_t *pos, int32_t nt, const int32_t *out_rows,
                   int32_t n_out, float *logits, int32_t *argmax)
    int mi_forward_submit(mi_ctx *ctx, const int32_t *tokens, const int32_t *pos, int32_t nt,
                          const int32_t *out_rows, int32_t n_out)
    int mi_forward_ready(mi_ctx *ctx)
    int mi_forward_wait(mi_ctx *ctx, int32_t *argmax)
    int mi_dequantize(int32_t type, const void *src, int64_t n_rows, int64_t n_cols, float *dst)
    int mi_op_matmul(int32_t device, int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x,
                     int32_t nt, float *y, int32_t n_threads)
    int mi_cuda_op_mmq(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int32_t nt,
                       const float *bias, int32_t accumulate, float *y)
    uint64_t mi_cuda_mmq_wide_launches()
    uint64_t mi_cuda_mmvq_mma_launches()
    uint64_t mi_cuda_mmvq_pair_launches()
    uint64_t mi_cuda_mmvq_mma_split_launches()
    uint64_t mi_cuda_attn_pair_launches()
    int mi_cuda_op_attention_prefill(const float *q, const uint16_t *k, const uint16_t *v, const int32_t *pos,
                                     int32_t nt, int32_t n_kv, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                     float scale, float *out)
    int mi_op_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps)
    int mi_op_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t pos, float freq_base, int32_t rope_type)
    int mi_op_attention(const float *q, const float *k, const float *v, int32_t n_kv, int32_t head_dim, float scale,
                        float *out)
    int mi_op_swiglu(const float *gate, const float *up, float *y, int64_t n)
