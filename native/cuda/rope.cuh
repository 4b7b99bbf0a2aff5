// Token embedding lookup + RoPE angle table, and RoPE fused with the f16 KV-cache write.
#ifndef MI_CUDA_ROPE_CUH
#define MI_CUDA_ROPE_CUH
#include "common.cuh"

// x[t] = dequant(emb row tokens[t]) (f32 [nt][n_embd]); rope_cs[t] = cos[head_dim/2] then
// sin[head_dim/2] of pos[t] * base^(-2i/head_dim), computed in double as the CPU does.
int mi_cuda_embed_rope(const mi_dtensor *emb, const int32_t *tokens, const int32_t *pos, int nt, int head_dim,
                       float freq_base, float *x, float *rope_cs, cudaStream_t s);
// Rotate q [nt][n_head*hd] in place and k [nt][kvd]; write k and v [nt][kvd] as f16 to slot pos[t]
// of k_cache / v_cache ([n_ctx][kvd] of this layer).
int mi_cuda_rope_kv(float *q, const float *k, const float *v, int nt, int n_head, int n_head_kv, int hd,
                    int rope_type, const float *rope_cs, const int32_t *pos, __half *k_cache, __half *v_cache,
                    cudaStream_t s);
#endif
