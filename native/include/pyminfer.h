/* pyminfer C API: the whole surface the Python bindings use. Opaque handles, create/free pairs,
 * int error codes (0 = ok) with a thread-local message from mi_last_error(). No Python objects
 * cross it; weights are borrowed pointers into the caller's mmap (CPU) or uploaded (CUDA). */
#ifndef PYMINFER_H
#define PYMINFER_H
#include <stddef.h>
#include <stdint.h>
#include "mi_quants.h"

#ifdef __cplusplus
extern "C" {
#endif

enum mi_status { MI_OK = 0, MI_ERR_ARG = 1, MI_ERR_TYPE = 2, MI_ERR_OOM = 3, MI_ERR_CUDA = 4, MI_ERR_CTX = 5 };
enum mi_device { MI_DEVICE_CPU = 0, MI_DEVICE_CUDA = 1 };
enum mi_rope_type { MI_ROPE_NORM = 0, MI_ROPE_NEOX = 2 }; /* NORM rotates adjacent pairs (llama), NEOX halves (qwen2) */

/* A weight matrix as stored in GGUF: n_rows rows of n_cols elements (GGUF ne0 = n_cols), row-major,
 * each row n_cols / block_elems blocks of `type`. 1-D tensors (norms, biases) have n_rows = 1. */
typedef struct {
    const void *data;
    int32_t type; /* enum mi_type */
    int64_t n_cols;
    int64_t n_rows;
} mi_tensor;

typedef struct {
    mi_tensor attn_norm;           /* F32 [n_embd] */
    mi_tensor wq, wk, wv;          /* [n_head*head_dim, n_embd], [n_head_kv*head_dim, n_embd] x2 */
    mi_tensor bq, bk, bv;          /* F32 biases or data == NULL (llama) */
    mi_tensor wo;                  /* [n_embd, n_head*head_dim] */
    mi_tensor ffn_norm;            /* F32 [n_embd] */
    mi_tensor ffn_gate, ffn_up;    /* [n_ff, n_embd] */
    mi_tensor ffn_down;            /* [n_embd, n_ff] */
} mi_layer;

typedef struct {
    int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab;
    int32_t rope_type;     /* enum mi_rope_type */
    float rope_freq_base;
    float rms_eps;
    mi_tensor tok_embd;    /* [n_vocab, n_embd] */
    mi_tensor output_norm; /* F32 [n_embd] */
    mi_tensor output;      /* [n_vocab, n_embd]; same data as tok_embd when tied */
    const mi_layer *layers; /* n_layer entries; copied by mi_ctx_create */
} mi_model_desc;

typedef struct mi_ctx mi_ctx;

/* Thread-local message of the last failing call on this thread. */
const char *mi_last_error(void);
/* 1 when built with CUDA and a device is visible, else 0. */
int mi_cuda_available(void);
/* Name of the CUDA device 0 (empty string when none). */
const char *mi_cuda_device_name(void);
/* Compute capability of device 0 as 10 * major + minor (90 for sm_90), 0 without a GPU. */
int32_t mi_cuda_compute_capability(void);
/* Device-to-device copy bandwidth of CUDA device 0 in bytes/s (read + write), -1 when unavailable. */
double mi_cuda_copy_bandwidth(void);

/* Create an inference context: KV cache for n_ctx positions, scratch for up to max_nt tokens per
 * forward. CPU: weights are borrowed (the mmap must outlive the ctx). CUDA: weights uploaded once.
 * n_threads: CPU worker threads (<= 0: all cores). */
int mi_ctx_create(const mi_model_desc *desc, int32_t n_ctx, int32_t max_nt, int32_t n_threads, int32_t device,
                  mi_ctx **out);
void mi_ctx_free(mi_ctx *ctx);
int32_t mi_ctx_device(const mi_ctx *ctx);

/* One forward over nt tokens (1 <= nt <= max_nt) at positions pos[i] (0 <= pos < n_ctx). Writes
 * K/V of every token at slot pos[i]; row i attends to slots 0..pos[i] (so a batch of contiguous
 * positions is causal, and rolling back is just reusing positions). For each of the n_out rows
 * out_rows[j] (indices into 0..nt-1), writes logits[j*n_vocab .. +n_vocab] (f32) if logits is not
 * NULL and argmax[j] (first max; -1 where the row holds a NaN: it has no maximum) if argmax is not NULL.
 * Contract: row i's logits are bitwise equal to a nt=1 forward of token i at pos[i] over the same
 * KV contents (CPU always; CUDA for nt <= 9). */
int mi_forward(mi_ctx *ctx, const int32_t *tokens, const int32_t *pos, int32_t nt, const int32_t *out_rows,
               int32_t n_out, float *logits, int32_t *argmax);

/* Asynchronous forward for overlapping two contexts (speculative decoding runs the draft while the
 * target verifies; each CUDA context has its own stream): mi_forward_submit checks and queues the
 * same forward as mi_forward with argmax only (no logits) and returns without waiting;
 * mi_forward_ready says whether it has finished (1), is still running (0) or failed (the error code
 * negated: -MI_ERR_ARG for a null context, -MI_ERR_CUDA); mi_forward_wait waits and writes the
 * n_out argmax ids (may be NULL to discard them).
 * One forward in flight per context: submit with one pending, mi_forward or mi_gpu_replay_ms
 * before the wait is MI_ERR_ARG; a failed submit leaves nothing pending; mi_ctx_free waits for a
 * submitted forward. The CPU computes at submit (ready is then always 1). */
int mi_forward_submit(mi_ctx *ctx, const int32_t *tokens, const int32_t *pos, int32_t nt, const int32_t *out_rows,
                      int32_t n_out);
int mi_forward_ready(mi_ctx *ctx);
int mi_forward_wait(mi_ctx *ctx, int32_t *argmax);

/* Benchmark: replay the captured nt-row forward (the tokens and positions of the last forward)
 * `reps` times back to back on the GPU and store the GPU milliseconds per replay in *ms (CUDA
 * events; no host work between replays). MI_ERR_ARG on a CPU context, without graphs, or nt
 * outside 1..min(9, max_nt). */
int mi_gpu_replay_ms(mi_ctx *ctx, int32_t nt, int32_t reps, float *ms);

/* ---- op-level entry points (tests, benches). Host pointers in and out on every device. ---- */

/* Dequantize n_rows x n_cols of `type` to f32 (CPU). */
int mi_dequantize(int32_t type, const void *src, int64_t n_rows, int64_t n_cols, float *dst);
/* y[t, r] = sum_c W[r, c] * x[t, c] for t < nt: x quantized per 32 to mi_block_q8a first (f32/f16
 * weights use f32 x). y is [nt, n_rows] f32. */
int mi_op_matmul(int32_t device, int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x,
                 int32_t nt, float *y, int32_t n_threads);
/* CUDA tensor-core GEMM (native/cuda/mmq.cuh; the prefill path for nt >= 10), test entry:
 * y[t, r] = (accumulate ? y[t, r] : 0) + bias[r] + sum_c W[r, c] * x[t, c] with W and x rounded to
 * f16 and f32 sums (tolerance in mmq.cuh). x [nt, n_cols] f32, n_cols a multiple of 32; bias f32
 * [n_rows] or NULL; y [nt, n_rows] f32, read when accumulate != 0. MI_ERR_CUDA without a GPU. */
int mi_cuda_op_mmq(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int32_t nt,
                   const float *bias, int32_t accumulate, float *y);
/* GEMM launches that took the 128-row activation tiles (MI_CUDA_MMQ_BN) since the library was
 * loaded, in this process: lets tests prove which kernel ran. 0 without CUDA. */
uint64_t mi_cuda_mmq_wide_launches(void);
/* Mat-vec launches that took the tensor-core verify kernel (MI_CUDA_MMVQ_MMA, native/cuda/mmvq_mma.cu)
 * since the library was loaded, in this process (not counting graph replays). 0 without CUDA. */
uint64_t mi_cuda_mmvq_mma_launches(void);
/* Mat-vec launches that took the pair kernel (two weight rows a thread, MI_CUDA_MMVQ_PAIR,
 * native/cuda/mmvq_kernels.cuh) since the library was loaded, in this process (not counting graph
 * replays). 0 without CUDA. */
uint64_t mi_cuda_mmvq_pair_launches(void);
/* Of those, the launches split over a thread block cluster per 16-row tile (MI_CUDA_MMVQ_MMA_SPLIT,
 * sm_90+). 0 without CUDA. */
uint64_t mi_cuda_mmvq_mma_split_launches(void);
/* Decode-attention launches on the tensor cores whose grid pairs two batch rows a block (MI_CUDA_ATTN_PAIR,
 * native/cuda/attention.cu) since the library was loaded, in this process (not counting graph replays).
 * 0 without CUDA. */
uint64_t mi_cuda_attn_pair_launches(void);
/* CUDA prefill attention (the tensor-core kernel of forwards on the GEMM path; tolerance in
 * native/cuda/attention.cuh): out [nt][n_head*head_dim] f32 = per head softmax(q k^T * scale) v,
 * row t over slots 0..pos[t]. q [nt][n_head*head_dim] f32; k, v [n_kv][n_head_kv*head_dim] f16
 * bits; pos [nt], each < n_kv. head_dim 64 or 128, n_head a multiple of n_head_kv (else
 * MI_ERR_ARG). MI_ERR_CUDA without a GPU. */
int mi_cuda_op_attention_prefill(const float *q, const uint16_t *k, const uint16_t *v, const int32_t *pos, int32_t nt,
                                 int32_t n_kv, int32_t n_head, int32_t n_head_kv, int32_t head_dim, float scale,
                                 float *out);

/* CPU transformer ops, one token row per call (tests against numpy; same code as the forward).
 * RMSNorm: y[n] = x / sqrt(mean(x^2) + eps) * w. */
int mi_op_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);
/* RoPE in place on x[n_heads*head_dim] at position pos (rope_type: enum mi_rope_type). */
int mi_op_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t pos, float freq_base, int32_t rope_type);
/* One query head q[head_dim] over n_kv cached rows k/v [n_kv][head_dim]: softmax(q.k * scale) v -> out[head_dim]. */
int mi_op_attention(const float *q, const float *k, const float *v, int32_t n_kv, int32_t head_dim, float scale,
                    float *out);
/* y[n] = silu(gate) * up (SwiGLU). */
int mi_op_swiglu(const float *gate, const float *up, float *y, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
