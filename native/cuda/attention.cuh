// Attention over the f16 KV cache: split-KV partial softmax; the last split of each (row, head)
// merges them and quantizes the output to q8a (the input of attn_output). One launch.
#ifndef MI_CUDA_ATTENTION_CUH
#define MI_CUDA_ATTENTION_CUH
#include "common.cuh"

// Most KV splits per (row, head): slots 0..pos[t] are cut into <= MI_ATTN_SPLITS pieces of whole
// tiles (4 warps x 4..16 slots by head_dim), a function of pos[t] alone (so rows never depend on nt
// or on graphs). Fewer with MI_CUDA_ATTN_SPLITS (read once per context, context.cu). 64 for the
// CUDA-core kernel (its last-block merge holds two splits a lane); the tensor-core kernel may take
// up to MI_ATTN_MMA_SPLITS (one block per SM and KV head: 66 on the H200 for 2 KV heads), its
// rows of more than 64 splits always merged by the combine launch.
#define MI_ATTN_SPLITS 64
#define MI_ATTN_MMA_SPLITS 128

// Floats of the partial-result scratch for max_nt rows: [max_nt][n_head][MI_ATTN_MMA_SPLITS][hd + 2]
// (the stride every kernel indexes partials with). Fixed at 128 on purpose: a stride of each call's
// max_splits (66 for the 1.5B shape on the H200) gave the same bits but cost the 1.5B shape +2.0% at
// 4,096 and +3.2% at 16,384, the 7B +1.0% / +0.9% (docs/perf.md, session 27); padding a partial's
// accumulators to a 128-byte line did not help either.
static inline size_t mi_attn_part_floats(int max_nt, int n_head, int hd) {
    return (size_t)max_nt * n_head * MI_ATTN_MMA_SPLITS * (hd + 2);
}
// att [nt][n_head*hd] f32 and xq [nt][n_head*hd/32] = softmax(q k^T * scale) v per head, row t
// over slots 0..pos[t] of k_cache / v_cache ([n_ctx][n_head_kv*hd] f16 of this layer).
// max_splits (1..MI_ATTN_SPLITS; group 2: 1..MI_ATTN_MMA_SPLITS): most KV splits per row and head; it must stay the same for a
// context's whole life (rows depend on it). group 1: one block per KV head's query group (same
// bits as 0, another speed); group 2: the tensor-core kernel (another summation order, within
// tolerance; mi_cuda_attention_mma_applies). Only rows with lo <= pos[t] < hi are computed (the
// others are left for another call), so two calls can split a batch by position. Group 2 only:
// rows of >= combine_from splits are merged by a second launch instead of the kernel's last block
// (another summation order of the same partials; attention.cu); > max_splits: never; rows of > 64
// splits take the launch whatever combine_from says (the last-block merge holds 64). pair (group
// 2, <= 8 query heads a KV head, nt > 1): one block serves two batch rows where their splits start
// at the same slot, K / V read once for both (the same bits: attention.cu); 0: a block per row.
// hint_steps (group 2): the most block steps of its split a block hints into L2 before the PDL wait
// (a hint: no result depends on it); < 0: the whole split.
// part: mi_attn_part_floats(nt, ...) floats of scratch; cnt: int32 [nt][n_head], zero before the
// first call (each call leaves it zero again).
// Returns MI_OK; MI_ERR_ARG for head_dim not a multiple of 32 up to 256, n_head not a multiple of
// n_head_kv, max_splits outside its range or group 2 where it does not apply; MI_ERR_CUDA
// when the launch fails. Algorithm: flash-decoding (split-KV online softmax, attention.cu).
int mi_cuda_attention(const float *q, const __half *k_cache, const __half *v_cache, const int32_t *pos, int nt,
                      int n_head, int n_head_kv, int hd, float scale, int max_splits, int group, int lo, int hi,
                      int combine_from, int pair, int hint_steps, float *part, int32_t *cnt, float *att,
                      mi_block_q8a *xq, cudaStream_t s);
// Prefill attention (forwards of many rows, usually consecutive positions): att [nt][n_head*hd] f32 =
// softmax(q k^T * scale) v per head, row t over slots 0..pos[t], as mi_cuda_attention computes but
// with one tensor-core block per 16 rows and query head (attention.cu, mi_attn_prefill_kernel):
// within a tolerance of it, not bitwise; no q8a output. q: f32 [nt][n_head*hd]; caches as above.
// MI_ERR_ARG where mi_cuda_attention_prefill_applies is false, MI_ERR_CUDA when the launch fails.
bool mi_cuda_attention_prefill_applies(int n_head, int n_head_kv, int hd);
int mi_cuda_attention_prefill(const float *q, const __half *k_cache, const __half *v_cache, const int32_t *pos, int nt,
                              int n_head, int n_head_kv, int hd, float scale, float *att, cudaStream_t s);
// Whether the tensor-core kernel serves this head layout: head_dim 64 or 128, <= 16 query heads per
// KV head.
bool mi_cuda_attention_mma_applies(int n_head, int n_head_kv, int hd);
#endif
