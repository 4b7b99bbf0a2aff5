/* The CUDA backend as the C core sees it (implemented in the .cu files beside it, built when CUDA is). */
#ifndef MI_CUDA_BACKEND_H
#define MI_CUDA_BACKEND_H
#include "pyminfer.h"
#ifdef __cplusplus
extern "C" {
#endif
typedef struct mi_cuda_ctx mi_cuda_ctx;
/* Upload weights, allocate the f16 KV cache [n_layer][n_ctx][n_head_kv*head_dim] and scratch for
 * max_nt rows. Errors via mi_set_error (MI_ERR_CUDA, MI_ERR_OOM, MI_ERR_TYPE). */
int mi_cuda_ctx_create(const mi_model_desc *desc, int32_t n_ctx, int32_t max_nt, mi_cuda_ctx **out);
void mi_cuda_ctx_free(mi_cuda_ctx *c);
/* Same contract as mi_forward (host pointers in and out). */
int mi_cuda_forward(mi_cuda_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt, const int32_t *out_rows,
                    int32_t n_out, float *logits, int32_t *argmax);
/* mi_forward split in two (see mi_forward_submit): queue the forward and the argmax copy on the
 * context's stream; then wait for it (logits: the n_out rows, copied by the wait). A failed submit
 * leaves nothing in flight; freeing the context waits for a submitted forward. */
int mi_cuda_forward_submit(mi_cuda_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt,
                           const int32_t *out_rows, int32_t n_out, int32_t want_argmax);
/* 1 finished, 0 running, -MI_ERR_CUDA on an error (mi_set_error). */
int mi_cuda_forward_ready(mi_cuda_ctx *c);
int mi_cuda_forward_wait(mi_cuda_ctx *c, float *logits, int32_t *argmax);
/* See mi_gpu_replay_ms. */
int mi_cuda_replay_ms(mi_cuda_ctx *c, int32_t nt, int32_t reps, float *ms);
/* Same contract as mi_op_matmul with device = CUDA (host pointers; copies in and out). */
int mi_cuda_op_matmul(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int32_t nt, float *y);
#ifdef __cplusplus
}
#endif
#endif
