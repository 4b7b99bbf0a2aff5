// CUDA backend: context (weights uploaded once in their GGUF layouts, f16 KV cache, scratch),
// the transformer forward as a chain of kernels, and one CUDA graph per batch size nt <= 9.
// Data path per layer (as cpu/forward.c, rows independent):
//   x -> rmsnorm+quant -> q,k,v (+bias, rope, f16 KV write) -> split attention (+ merge, quant)
//     -> wo (+= x) -> rmsnorm+quant -> silu(gate)*up (one launch) -> quant -> down (+= x)
// (nt >= 10: tensor-core GEMMs on the f32 inputs, the rope kernel, the prefill attention, separate
// gate/up + swiglu.)
// Kernels are chained with programmatic dependent launch (common.cuh): each starts while the one
// before drains, and the mat-vecs prefetch their weights meanwhile.
// Everything a forward reads that changes between calls (tokens, positions, out rows, n_out) lives
// in device buffers filled by one copy before launch, so a captured graph replays for any position.
// Set MI_CUDA_GRAPHS=0 in the environment to run every forward without graphs.
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "argmax.cuh"
#include "attention.cuh"
#include "backend.h"
#include "common.cuh"
#include "mmq.cuh"
#include "mmvq.cuh"
#include "norm.cuh"
#include "rope.cuh"

#define MI_GRAPH_MAX_NT 9 // graphs for nt = 1..9 (issue 4), all on the bitwise mat-vec path
// Default position from which rows take the tensor-core attention: its fixed cost per layer is higher
// (1.5B shape at depth 0: 1.021 vs 0.952 ms a token) and its cost per cached slot lower (4096:
// 1.123 vs 1.182; 16384: 1.340 vs 1.638); the two cross near 1,700 on the 1.5B shape, ~1,000 on
// the 7B (docs/perf.md, session 7).
#define MI_ATTN_MMA_FROM 2048
// Most KV splits of the CUDA-core attention when the tensor-core kernel takes the rows from
// position 4,096 on (else MI_ATTN_SPLITS; MI_CUDA_ATTN_SPLITS overrides both): 32 rather than 64,
// which differ only past 32 tiles (1,024 slots at head_dim 128): at 2,000 cached positions 1.5B
// shape 1.081 vs 1.136 ms a token, 0.5B 0.709 vs 0.726; the same at 4,096; at 16,384 64 win (1.641
// vs 1.756 ms): docs/perf.md, session 8.
#define MI_ATTN_SPLITS_CC 32
// The tensor-core attention's split merge by a launch of its own (mi_attn_combine_kernel) for
// every row where that kernel may take more than 48 splits (mi_mma_splits > 48: <= 2 KV heads on
// the H200, 66 splits since session 26, 64 when this was measured), else by the kernel's last block. Measured (depth.py, GPU ms a token,
// last-block merge / own launch for every row; docs/perf.md, session 8): 1.5B shape (<= 64 splits)
// 16,384 (43 used) 1.317 / 1.250, 4,096 (33) 1.108 / 1.102, 2,048 (17) 1.066 / 1.086; 7B (<= 33)
// 16,384 (33) 2.697 / 2.735, 4,096 (33) 2.455 / 2.506; 14B (<= 16) 6.166 / 6.176: the launch pays on
// the 2-KV-head shapes only. Choosing per row (rows of >= 33 splits only) costs the launch at every
// depth without its gain below (1.5B at 2,048: 1.135 vs 1.070), so the choice is per model.
#define MI_ATTN_COMBINE_SPLITS 48

struct mi_cuda_layer {
    mi_dtensor wq, wk, wv, wo, gate, up, down;
    int n_qkv;                         // launches for q, k, v: stacked same-typed neighbours
    mi_dtensor qkv_w[3];               // stacked matrices
    int qkv_first[3], qkv_count[3];    // which of q(0), k(1), v(2) each launch covers
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv; // device f32, biases NULL when absent
};

struct mi_cuda_ctx {
    int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, rope_type;
    float rope_base, rms_eps;
    int32_t n_ctx, max_nt;
    mi_dtensor tok_embd, output;
    const float *output_norm;
    mi_cuda_layer *layers; // host array [n_layer] of device pointers
    uint8_t *weights;      // device: every tensor, 256-byte aligned, one allocation
    uint8_t *arena;        // device: KV cache + scratch, one allocation
    __half *kv_k, *kv_v;   // [n_layer][n_ctx][n_head_kv*head_dim] f16
    float *x;              // [max_nt][n_embd] residual stream
    float *xn;             // [max_nt][max(n_embd, q_dim, n_ff)] normed f32 input (F32/F16 weights read it)
    mi_block_q8a *xq;      // [max_nt][max(n_embd, q_dim, n_ff)/32] quantized matmul input
    mi_block_q8a *xq_ff;   // [max_nt][n_ff/32] quantized ffn_down input (written while xq is read)
    int32_t *attn_cnt;     // [max_nt][n_head] attention split counters (kept zero between launches)
    int32_t *ff_cnt;       // [n_ff/32] SwiGLU 32-row group counters (kept zero between launches)
    // MI_CUDA_FUSE=1: the SwiGLU launch also quantizes its output (last block per 32 rows) instead
    // of a separate quantize launch. Off by default: on the H200 with PDL the fence + counter in
    // every block cost more than the launch saved (1.5B 762 vs 779 tok/s, 0.5B 1232 vs 1264).
    int fuse_quant;
    int no_mmq;            // MI_CUDA_MMQ=0: nt >= 10 loops the 8-row mat-vec instead (A/B, tests)
    int rope_fuse;         // RoPE + KV write in the q/k/v mat-vec epilogue (MI_CUDA_ROPE_FUSE=0: kernel)
    // q/k/v of two types (q, k stacked + v: half the layers of Qwen2.5 Q4_K_M files) in one mixed
    // launch (mi_cuda_mmvq_mixed) instead of two where the pair is compiled (1, the default);
    // MI_CUDA_QKV_MIXED=0: never (0, A/B timing); =1: required (2), context creation fails for a
    // layer that cannot take it (tests: proves the mixed launch ran).
    int qkv_mixed;
    // Forwards on the GEMM path (nt >= MI_MMQ_MIN_NT: prompt chunks) take the prefill attention
    // (mi_cuda_attention_prefill) where it applies to the head layout and every wo has a GEMM
    // kernel (1); MI_CUDA_ATTN_PREFILL=0: the decode kernels.
    int attn_prefill;
    // MI_CUDA_SKIP=attn,norm,...: op kinds (mi_skip_names) left out of every forward. Timing only
    // (the outputs are wrong): the GPU time a kind costs inside a graph is the difference.
    unsigned skip;
    // Attention A/B settings, read once here so that every forward of the context (graphed or
    // not) uses the same (rows depend on the split count): MI_CUDA_ATTN_SPLITS (1..128; the CUDA-core
    // kernel takes at most 64 of them; default 64, or MI_ATTN_SPLITS_CC)
    // and MI_CUDA_ATTN_GROUP=1 (one block per KV head's query group, same bits; attention.cu).
    // attn_splits_mma: the tensor-core kernel's most splits, MI_CUDA_ATTN_SPLITS where set, else
    // one wave of blocks at nt = 1 (mi_mma_splits).
    int attn_splits, attn_group, attn_splits_mma;
    // Rows of the tensor-core attention with >= attn_combine_from splits are merged by a launch of
    // their own (default 1 or 65 = never: MI_ATTN_COMBINE_SPLITS; MI_CUDA_ATTN_COMBINE_FROM=N, 1..65;
    // rows of more than 64 splits take that launch whatever it says: mi_cuda_attention).
    int attn_combine_from;
    // Rows at positions >= attn_mma_from run the tensor-core attention, the others the CUDA-core
    // kernel (INT_MAX: never; 0: always): a function of the position alone, so rows stay bitwise
    // across nt. MI_CUDA_ATTN_MMA=0 / 1 forces never / always, MI_CUDA_ATTN_MMA_FROM=N moves the
    // switch (default MI_ATTN_MMA_FROM where the kernel applies, else never).
    int attn_mma_from;
    // The tensor-core attention serves two batch rows a block where it can (mi_cuda_attention's
    // pair: K / V read once for both; the same bits): 1, the default; MI_CUDA_ATTN_PAIR=0: a block
    // per row (A/B timing, tests).
    int attn_pair;
    int attn_hint; // MI_CUDA_ATTN_HINT: block steps the tensor-core attention hints into L2 (< 0: all)
    int last_regime; // regime (mi_regime) of the last forward: the graph mi_cuda_replay_ms replays
    int pending;     // a submitted forward not yet waited for (mi_cuda_forward_submit)
    int pend_n_out;  // its out rows, and whether their argmax is being copied to h_ints
    int pend_argmax;
    float *amax_v;         // [max_nt][MI_ARGMAX_BLOCKS] argmax candidates (value)
    int32_t *amax_i;       // [max_nt][MI_ARGMAX_BLOCKS] argmax candidates (index)
    int32_t *amax_cnt;     // [max_nt] argmax block counters (kept zero between launches)
    float *mmq_scratch;    // [mmq_scratch_floats] K-split partials of the tensor-core GEMM
    size_t mmq_scratch_floats;
    __half *mmq_xh;        // [max_nt][widest rounded up to 64] f16 GEMM input (wide tiles; NULL: max_nt <= 64)
    size_t mmq_xh_halves;
    float *q, *k, *v;      // [max_nt][q_dim], [max_nt][kv_dim] x2
    float *att;            // [max_nt][q_dim] attention output
    float *ff;             // [max_nt][n_ff] SwiGLU output
    float *gate, *up;      // [max_nt][n_ff] each: only when ffn_gate/ffn_up types differ
    float *rope_cs;        // [max_nt][head_dim]: cos[head_dim/2] then sin[head_dim/2]
    float *part;           // [part_rows][n_head][MI_ATTN_MMA_SPLITS][head_dim+2] attention partials
    int part_rows;         // rows the decode attention kernels can get: max_nt, or <= 9 when the
                           // GEMM path's forwards (nt >= MI_MMQ_MIN_NT) take the prefill kernel
                           // (~400 MB less on the 1.5B at max_nt 512, with the 128-split stride)
    float *logits;         // [max_nt][n_vocab]
    int32_t *ints;         // device: tokens[max_nt], pos[max_nt], out_rows[max_nt], n_out[1], argmax[max_nt]
    int32_t *h_ints;       // pinned host staging, same layout
    int split_ffn;         // ffn_gate and ffn_up differ in type: separate launches + swiglu
    cudaStream_t stream;
    // [regime - 1][nt]: regime bit 0 = some row below attn_mma_from, bit 1 = some row at or above
    // it (which attention kernels the forward launches); NULL where not captured.
    cudaGraphExec_t graphs[3][MI_GRAPH_MAX_NT + 1];
    int use_graphs;
    // MI_CUDA_PROFILE=1 (with graphs off): events between the ops of each forward, summed per op
    // kind and printed to stderr when the context is freed. Costs a little launch time.
    int prof, n_ev, cap_ev;
    cudaEvent_t *ev;       // [cap_ev]
    int *ev_kind;          // [cap_ev]: op kind ending at event i
    double prof_ms[16];
    long prof_calls;
};

namespace {

enum { MI_P_EMBED, MI_P_NORM, MI_P_MM_Q, MI_P_MM_K, MI_P_MM_V, MI_P_ROPE, MI_P_ATTN, MI_P_MM_O, MI_P_MM_FFN_IN,
       MI_P_QUANT, MI_P_MM_DOWN, MI_P_HEAD_NORM, MI_P_MM_HEAD, MI_P_ARGMAX, MI_P_N };
const char *const mi_prof_names[MI_P_N] = {"embed+rope table", "rmsnorm+quant", "mm qkv", "-", "-",
                                           "rope+kv write", "attention", "mm o (+res)", "mm gate/up+swiglu",
                                           "quant", "mm down (+res)", "final norm", "mm lm head", "argmax"};

// MI_CUDA_SKIP names, one per op kind (index = MI_P_*).
const char *const mi_skip_names[MI_P_N] = {"embed", "norm", "qkv", "-", "-", "rope", "attn", "o",
                                           "ffn_in", "quant", "down", "head_norm", "head", "argmax"};

// Fills *mask from a comma-separated MI_CUDA_SKIP list; an unknown name is an error (MI_ERR_ARG).
int mi_parse_skip(const char *ev, unsigned *mask) {
    *mask = 0;
    for (const char *p = ev; p && *p;) {
        const char *e = strchr(p, ',');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = n == 0; // empty items (a trailing comma) are fine
        for (int k = 0; k < MI_P_N; k++)
            if (strcmp(mi_skip_names[k], "-") != 0 && strlen(mi_skip_names[k]) == n && strncmp(p, mi_skip_names[k], n) == 0) {
                *mask |= 1u << k;
                found = 1;
            }
        if (!found) {
            char known[256] = "";
            for (int k = 0; k < MI_P_N; k++)
                if (strcmp(mi_skip_names[k], "-") != 0)
                    snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", known[0] ? ", " : "",
                             mi_skip_names[k]);
            return mi_set_error(MI_ERR_ARG, "MI_CUDA_SKIP: unknown op kind '%.*s' (%s)", (int)n, p, known);
        }
        p = e ? e + 1 : nullptr;
    }
    return MI_OK;
}

void mi_prof_mark(mi_cuda_ctx *c, int kind) {
    if (c->n_ev < c->cap_ev) {
        c->ev_kind[c->n_ev] = kind;
        cudaEventRecord(c->ev[c->n_ev++], c->stream);
    }
}

size_t mi_align(size_t n) { return (n + 255) & ~(size_t)255; }

int64_t mi_tensor_bytes(const mi_tensor *t) {
    return t->n_cols / mi_type_block_elems(t->type) * mi_type_block_bytes(t->type) * t->n_rows;
}

// Copy one host tensor to weights + *off; fill its device descriptor.
int mi_upload(const mi_tensor *t, uint8_t *base, size_t *off, mi_dtensor *out, bool pad = true) {
    out->type = t->type;
    out->n_cols = t->n_cols;
    out->n_rows = t->n_rows;
    out->row_bytes = t->n_cols / mi_type_block_elems(t->type) * mi_type_block_bytes(t->type);
    if (!t->data) {
        out->data = nullptr;
        return MI_OK;
    }
    const size_t n = (size_t)mi_tensor_bytes(t);
    MI_CUDA_TRY(cudaMemcpy(base + *off, t->data, n, cudaMemcpyHostToDevice));
    out->data = base + *off;
    *off += pad ? mi_align(n) : n;
    return MI_OK;
}

size_t mi_size(const mi_tensor *t) { return t->data ? mi_align((size_t)mi_tensor_bytes(t)) : 0; }

int mi_oom(const char *what, size_t bytes) {
    cudaGetLastError(); // an allocation failure is not sticky; clear it for the next call
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    return mi_set_error(MI_ERR_OOM, "CUDA out of memory allocating %s (%zu MiB; %zu MiB free of %zu MiB)", what,
                        bytes >> 20, fr >> 20, tot >> 20);
}

// Enqueue one forward of nt rows on c->stream. graph: the final norm/LM head/argmax cover all nt
// rows and read n_out from the device (rows >= n_out are skipped or computed and ignored), so the
// captured work does not depend on n_out; else they cover exactly n_out rows.
int mi_enqueue(mi_cuda_ctx *c, int nt, int graph, int n_out, int regime) {
    cudaStream_t s = c->stream;
    const int E = c->n_embd, F = c->n_ff, HD = c->head_dim, QD = c->n_head * HD, KD = c->n_head_kv * HD;
    const int32_t *tok = c->ints, *pos = c->ints + c->max_nt, *rows = c->ints + 2 * c->max_nt;
    const int32_t *n_out_d = c->ints + 3 * c->max_nt;
    int32_t *amax = c->ints + 3 * c->max_nt + 1;
    const float att_scale = 1.0f / sqrtf((float)HD);
    int rc;
#define MI_RUN(call) \
    if ((rc = (call))) return rc
    const bool prof = c->prof && !graph;
#define MI_RUNK(kind, call)                     \
    do {                                        \
        if (c->skip >> (kind) & 1u) break;      \
        MI_RUN(call);                           \
        if (prof) mi_prof_mark(c, kind);        \
    } while (0)
    // nt >= MI_MMQ_MIN_NT (prefill, wide batches; never graphed: > MI_GRAPH_MAX_NT): tensor-core GEMM on the f32
    // inputs, within a tolerance of the mat-vec path (mmq.cuh); below it the bitwise MMVQ.
    static_assert(MI_MMQ_MIN_NT > MI_GRAPH_MAX_NT, "graphs capture the mat-vec path only");
    const bool gemm = nt >= MI_MMQ_MIN_NT && !c->no_mmq;
    // same_x: this GEMM reads the input the GEMM just before it read (k and v after q, up after
    // gate), so the wide kernel's f16 copy of it (mmq_xh) is reused, not converted again, where
    // the GEMM before reports that mmq_xh holds it.
    const float *xh_of = nullptr; // the f32 input mmq_xh holds in f16 now (this forward), or NULL
    int64_t xh_cols = 0;
    auto mm = [&](const mi_dtensor *w, const mi_block_q8a *xq, const float *xf, int64_t ldx, int rows_in, float *y,
                  int64_t ldy, const float *bias, int acc, bool same_x = false) -> int {
        if (gemm && mi_cuda_mmq_applies(w->type, w->n_cols, rows_in)) {
            const int ready = same_x && xh_of == xf && xh_cols == w->n_cols;
            int holds = 0;
            const int rc = mi_cuda_mmq(w, xf, ldx, rows_in, y, ldy, bias, acc, c->mmq_scratch, c->mmq_scratch_floats,
                                       c->mmq_xh, c->mmq_xh_halves, ready, &holds, s);
            xh_of = holds ? xf : nullptr;
            xh_cols = w->n_cols;
            return rc;
        }
        xh_of = nullptr;
        return mi_cuda_mmvq(w, nullptr, xq, xf, ldx, rows_in, y, ldy, bias, acc, s);
    };
    if (!(gemm && c->attn_prefill) && nt > c->part_rows) // unreachable: part_rows follows the same rule
        return mi_set_error(MI_ERR_ARG, "decode attention over %d rows, scratch for %d", nt, c->part_rows);
    if (prof) mi_prof_mark(c, -1);
    MI_RUNK(MI_P_EMBED, mi_cuda_embed_rope(&c->tok_embd, tok, pos, nt, HD, c->rope_base, c->x, c->rope_cs, s));
    for (int l = 0; l < c->n_layer; l++) {
        const mi_cuda_layer *L = &c->layers[l];
        __half *kc = c->kv_k + (size_t)l * c->n_ctx * KD, *vc = c->kv_v + (size_t)l * c->n_ctx * KD;
        MI_RUNK(MI_P_NORM, mi_cuda_rmsnorm_quant(c->x, nullptr, nullptr, nt, L->attn_norm, c->rms_eps, E, c->xn, c->xq, s));
        if (gemm) {
            MI_RUNK(MI_P_MM_Q, mm(&L->wq, c->xq, c->xn, E, nt, c->q, QD, L->bq, 0));
            MI_RUNK(MI_P_MM_Q, mm(&L->wk, c->xq, c->xn, E, nt, c->k, KD, L->bk, 0, true));
            MI_RUNK(MI_P_MM_Q, mm(&L->wv, c->xq, c->xn, E, nt, c->v, KD, L->bv, 0, true));
        }
        const bool fuse_rope = !gemm && c->rope_fuse;
        // Launch groups of q/k/v: the stacked groups (n_qkv), or one mixed-type launch over both
        // where there are two groups of different types (mi_cuda_mmvq_mixed: same bits, a launch less).
        // (Decided here, at capture or per ungraphed forward: MI_CUDA_MMVQ is read at every call.)
        const bool mixed = !gemm && c->qkv_mixed && L->n_qkv == 2 && mi_cuda_mmvq_mixed_applies(&L->qkv_w[0], &L->qkv_w[1]);
        const int n_launch = gemm ? 0 : mixed ? 1 : L->n_qkv;
        for (int gi = 0; gi < n_launch; gi++) {
            float *const ys[3] = {c->q, c->k, c->v};
            const int64_t lds[3] = {QD, KD, KD};
            const float *const bs[3] = {L->bq, L->bk, L->bv};
            mi_mmvq_out o;
            memset(&o, 0, sizeof o);
            int end = 0;
            const int first = mixed ? 0 : L->qkv_first[gi], count = mixed ? 3 : L->qkv_count[gi];
            for (int i = 0; i < count; i++) {
                const int m = first + i;
                end += (int)lds[m];
                o.end[i] = end;
                o.y[i] = ys[m];
                o.ldy[i] = lds[m];
                o.bias[i] = bs[m];
                if (fuse_rope) { // q rotated in place, k rotated into the cache, v copied there
                    o.rope[i] = m == 0 ? 1 : m == 1 ? 2 : 3;
                    o.cache[i] = m == 1 ? kc : m == 2 ? vc : nullptr;
                }
            }
            o.n_seg = count;
            if (fuse_rope) {
                o.any_rope = 1;
                o.hd = HD;
                o.neox = c->rope_type == MI_ROPE_NEOX;
                o.ld_cache = KD;
                o.pos = pos;
                o.rope_cs = c->rope_cs;
            }
            if (mixed)
                MI_RUNK(MI_P_MM_Q, mi_cuda_mmvq_mixed(&L->qkv_w[0], &L->qkv_w[1], c->xq, E, nt, &o, 0, s));
            else
                MI_RUNK(MI_P_MM_Q, mi_cuda_mmvq_seg(&L->qkv_w[gi], nullptr, c->xq, c->xn, E, nt, &o, 0, s));
        }
        if (!fuse_rope)
            MI_RUNK(MI_P_ROPE, mi_cuda_rope_kv(c->q, c->k, c->v, nt, c->n_head, c->n_head_kv, HD, c->rope_type, c->rope_cs, pos, kc, vc,
                               s));
        if (gemm && c->attn_prefill) {
            // Prompt chunks: one tensor-core block per 16 rows and head (the GEMM path's tolerance);
            // its output is f32 only, which wo's GEMM reads (attn_prefill: every wo has one).
            MI_RUNK(MI_P_ATTN, mi_cuda_attention_prefill(c->q, kc, vc, pos, nt, c->n_head, c->n_head_kv, HD, att_scale,
                                                         c->att, s));
        } else if (regime & 1)
            MI_RUNK(MI_P_ATTN, mi_cuda_attention(c->q, kc, vc, pos, nt, c->n_head, c->n_head_kv, HD, att_scale,
                                                 c->attn_splits, c->attn_group, 0, c->attn_mma_from, INT_MAX, 0,
                                                 -1, c->part, c->attn_cnt, c->att, c->xq, s));
        if (!(gemm && c->attn_prefill) && (regime & 2))
            MI_RUNK(MI_P_ATTN, mi_cuda_attention(c->q, kc, vc, pos, nt, c->n_head, c->n_head_kv, HD, att_scale,
                                                 c->attn_splits_mma, 2, c->attn_mma_from, INT_MAX,
                                                 c->attn_combine_from, c->attn_pair, c->attn_hint, c->part,
                                                 c->attn_cnt, c->att, c->xq, s));
        MI_RUNK(MI_P_MM_O, mm(&L->wo, c->xq, c->att, QD, nt, c->x, E, nullptr, 1));
        MI_RUNK(MI_P_NORM, mi_cuda_rmsnorm_quant(c->x, nullptr, nullptr, nt, L->ffn_norm, c->rms_eps, E, c->xn, c->xq, s));
        const bool q_down = L->down.type != MI_TYPE_F32 && L->down.type != MI_TYPE_F16;
        bool quantized = false; // ffn_down needs no separate quantize launch
        if (gemm) {
            MI_RUNK(MI_P_MM_FFN_IN, mm(&L->gate, c->xq, c->xn, E, nt, c->gate, F, nullptr, 0));
            MI_RUNK(MI_P_MM_FFN_IN, mm(&L->up, c->xq, c->xn, E, nt, c->up, F, nullptr, 0, true));
            MI_RUNK(MI_P_MM_FFN_IN, mi_cuda_swiglu(c->gate, c->up, c->ff, (int64_t)nt * F, s));
            quantized = mi_cuda_mmq_applies(L->down.type, F, nt); // the GEMM reads ff in f32: no q8a
        } else if (!c->split_ffn) {
            mi_mmvq_out o;
            memset(&o, 0, sizeof o);
            o.n_seg = 1;
            o.end[0] = F;
            o.y[0] = c->ff;
            o.ldy[0] = F;
            if (q_down && c->fuse_quant) {
                o.yq = c->xq_ff;
                o.ldq = F / 32;
                o.cnt = c->ff_cnt;
                quantized = true;
            }
            MI_RUNK(MI_P_MM_FFN_IN, mi_cuda_mmvq_seg(&L->gate, &L->up, c->xq, c->xn, E, nt, &o, 0, s));
        } else {
            MI_RUNK(MI_P_MM_FFN_IN, mi_cuda_mmvq(&L->gate, nullptr, c->xq, c->xn, E, nt, c->gate, F, nullptr, 0, s));
            MI_RUNK(MI_P_MM_FFN_IN, mi_cuda_mmvq(&L->up, nullptr, c->xq, c->xn, E, nt, c->up, F, nullptr, 0, s));
            MI_RUNK(MI_P_MM_FFN_IN, mi_cuda_swiglu(c->gate, c->up, c->ff, (int64_t)nt * F, s));
        }
        if (q_down && !quantized) MI_RUNK(MI_P_QUANT, mi_cuda_quantize(c->ff, nt, F, c->xq_ff, s));
        MI_RUNK(MI_P_MM_DOWN, mm(&L->down, c->xq_ff, c->ff, F, nt, c->x, E, nullptr, 1));
    }
    const int n_head_rows = graph ? nt : n_out;
    if (n_head_rows == 0) return MI_OK;
    MI_RUNK(MI_P_HEAD_NORM, mi_cuda_rmsnorm_quant(c->x, rows, n_out_d, n_head_rows, c->output_norm, c->rms_eps, E, c->xn, c->xq, s));
    MI_RUNK(MI_P_MM_HEAD, mm(&c->output, c->xq, c->xn, E, n_head_rows, c->logits, c->n_vocab, nullptr, 0));
    MI_RUNK(MI_P_ARGMAX, mi_cuda_argmax(c->logits, c->n_vocab, n_head_rows, n_out_d, c->amax_v, c->amax_i, c->amax_cnt,
                                        amax, s));
#undef MI_RUNK
#undef MI_RUN
    return MI_OK;
}

// Most KV splits of the tensor-core attention: one block per (KV head, split), as many blocks as
// the device has SMs (capped at MI_ATTN_MMA_SPLITS; 66 for 2 KV heads on the H200, where the cap
// was 64 until session 23: just past 16,384 slots (129 tiles of 128) 64 gave 43 splits of 3 tiles
// a warp on 86 SMs, 66 gives 65 of 2 on 130): a block holds a whole SM's registers, so more
// splits only add waves and merge work. Measured at 16k on the H200 (132 SMs; docs/perf.md,
// session 8), 64 / 32 / 16 splits: 7B shape (4 KV heads) 2.866 / 2.743 / 2.908 ms a token, 14B (8)
// 6.661 / 6.433 / 6.159, 1.5B (2) 1.332 / 1.358 / 1.488: best where n_head_kv x splits ~ 128.
// A function of the model and device only (never of nt or the position), so rows stay bitwise.
int mi_mma_splits(int n_head_kv) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess || sms < 1) {
        cudaGetLastError();
        sms = 128;
    }
    const int s = sms / (n_head_kv > 0 ? n_head_kv : 1);
    return s < 1 ? 1 : s > MI_ATTN_MMA_SPLITS ? MI_ATTN_MMA_SPLITS : s;
}

// Which attention kernels rows at positions pos[0..nt) need (bit 0: CUDA-core, bit 1: tensor-core).
int mi_regime(const mi_cuda_ctx *c, const int32_t *pos, int nt) {
    int r = 0;
    for (int i = 0; i < nt; i++) r |= pos[i] >= c->attn_mma_from ? 2 : 1;
    return r ? r : 1;
}

int mi_capture(mi_cuda_ctx *c, int nt, int regime) {
    MI_CUDA_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    const int rc = mi_enqueue(c, nt, 1, nt, regime);
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(c->stream, &g); // always end the capture, even after a failure
    if (rc) {
        if (g) cudaGraphDestroy(g);
        return rc;
    }
    if (e != cudaSuccess) return mi_set_error(MI_ERR_CUDA, "graph capture: %s", cudaGetErrorString(e));
    cudaGraphExec_t *slot = &c->graphs[regime - 1][nt];
    const cudaError_t e2 = cudaGraphInstantiate(slot, g, 0);
    cudaGraphDestroy(g);
    if (e2 != cudaSuccess) {
        *slot = nullptr;
        return mi_set_error(MI_ERR_CUDA, "graph instantiate: %s", cudaGetErrorString(e2));
    }
    return MI_OK;
}

} // namespace

extern "C" int mi_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

extern "C" const char *mi_cuda_device_name(void) {
    static char name[256];
    cudaDeviceProp p;
    if (!mi_cuda_available() || cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "";
    snprintf(name, sizeof name, "%s", p.name);
    return name;
}

extern "C" int32_t mi_cuda_compute_capability(void) {
    cudaDeviceProp p;
    if (!mi_cuda_available() || cudaGetDeviceProperties(&p, 0) != cudaSuccess) return 0;
    return 10 * p.major + p.minor;
}

extern "C" void mi_cuda_ctx_free(mi_cuda_ctx *c) {
    if (!c) return;
    // A submitted forward still running reads the buffers freed below and copies into h_ints.
    if (c->stream && c->pending) cudaStreamSynchronize(c->stream);
    if (c->prof && c->prof_calls) {
        double tot = 0;
        for (int k = 0; k < MI_P_N; k++) tot += c->prof_ms[k];
        fprintf(stderr, "pyminfer CUDA profile: %ld forwards, %.1f us GPU time each\n", c->prof_calls,
                1e3 * tot / c->prof_calls);
        for (int k = 0; k < MI_P_N; k++)
            if (c->prof_ms[k] > 0)
                fprintf(stderr, "  %-20s %9.1f us/forward %5.1f%%\n", mi_prof_names[k], 1e3 * c->prof_ms[k] / c->prof_calls,
                        100.0 * c->prof_ms[k] / tot);
    }
    for (int i = 0; i < c->cap_ev; i++)
        if (c->ev && c->ev[i]) cudaEventDestroy(c->ev[i]);
    free(c->ev);
    free(c->ev_kind);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i <= MI_GRAPH_MAX_NT; i++)
            if (c->graphs[r][i]) cudaGraphExecDestroy(c->graphs[r][i]);
    if (c->stream) cudaStreamDestroy(c->stream);
    cudaFree(c->weights);
    cudaFree(c->arena);
    cudaFreeHost(c->h_ints);
    free(c->layers);
    free(c);
}

extern "C" int mi_cuda_ctx_create(const mi_model_desc *d, int32_t n_ctx, int32_t max_nt, mi_cuda_ctx **out) {
    *out = nullptr;
    if (!mi_cuda_available()) return mi_set_error(MI_ERR_CUDA, "no CUDA device visible");
    if (d->head_dim % 32 || d->head_dim > 256)
        return mi_set_error(MI_ERR_ARG, "CUDA backend: head_dim %d must be a multiple of 32 up to 256", d->head_dim);
    MI_CUDA_TRY(cudaSetDevice(0));
    mi_cuda_ctx *c = (mi_cuda_ctx *)calloc(1, sizeof *c);
    if (!c) return mi_set_error(MI_ERR_OOM, "out of host memory");
    c->n_layer = d->n_layer; c->n_embd = d->n_embd; c->n_ff = d->n_ff; c->n_head = d->n_head;
    c->n_head_kv = d->n_head_kv; c->head_dim = d->head_dim; c->n_vocab = d->n_vocab; c->rope_type = d->rope_type;
    c->rope_base = d->rope_freq_base; c->rms_eps = d->rms_eps; c->n_ctx = n_ctx; c->max_nt = max_nt;
    // The on / off switches: unset or empty = the default, "0" or "1", anything else refused (a
    // typo such as MI_CUDA_GRAPHS=off must not silently measure the default).
    static const char *const switches[] = {"MI_CUDA_GRAPHS", "MI_CUDA_FUSE", "MI_CUDA_MMQ", "MI_CUDA_ROPE_FUSE",
                                           "MI_CUDA_QKV_STACK", "MI_CUDA_PDL", "MI_CUDA_PROFILE"};
    for (const char *name : switches)
        if (mi_env_switch(name, 0) < 0) {
            free(c);
            return mi_set_error(MI_ERR_ARG, "%s=%s: want 0 or 1", name, getenv(name));
        }
    c->use_graphs = mi_env_switch("MI_CUDA_GRAPHS", 1);
    c->fuse_quant = mi_env_switch("MI_CUDA_FUSE", 0);
    c->no_mmq = !mi_env_switch("MI_CUDA_MMQ", 1);
    if (const int rc = mi_cuda_mmq_check_env()) {
        free(c);
        return rc;
    }
    const char *ae = getenv("MI_CUDA_ATTN_SPLITS");
    char *ae_end = nullptr;
    const long splits = ae ? strtol(ae, &ae_end, 10) : MI_ATTN_SPLITS;
    c->attn_splits = splits > MI_ATTN_SPLITS ? MI_ATTN_SPLITS : (int)splits; // the CUDA-core kernel's cap
    c->attn_splits_mma = ae ? (int)splits : mi_mma_splits(d->n_head_kv);
    if (splits < 1 || splits > MI_ATTN_MMA_SPLITS || (ae && (ae_end == ae || *ae_end))) {
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_ATTN_SPLITS=%s: want 1..%d", ae, MI_ATTN_MMA_SPLITS);
    }
    const char *ge = getenv("MI_CUDA_ATTN_GROUP");
    c->attn_group = ge && strcmp(ge, "1") == 0;
    if (ge && ge[0] && strcmp(ge, "0") != 0 && !c->attn_group) {
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_ATTN_GROUP=%s: want 0 or 1", ge);
    }
    const char *ce = getenv("MI_CUDA_ATTN_COMBINE_FROM");
    if (ce && !ce[0]) ce = nullptr; // empty: unset, as for MI_CUDA_ATTN_MMA
    char *ce_end = nullptr;
    const long comb = ce                                            ? strtol(ce, &ce_end, 10)
                      : c->attn_splits_mma > MI_ATTN_COMBINE_SPLITS ? 1
                                                                    : MI_ATTN_SPLITS + 1; // never
    if (ce && (ce_end == ce || *ce_end || comb < 1 || comb > MI_ATTN_SPLITS + 1)) {
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_ATTN_COMBINE_FROM=%s: want 1..%d", ce, MI_ATTN_SPLITS + 1);
    }
    c->attn_combine_from = (int)comb;
    // MI_CUDA_ATTN_MMA=1: the tensor-core attention (attention.cu; head_dim 64 / 128, G <= 16).
    const char *te = getenv("MI_CUDA_ATTN_MMA");
    if (te && te[0] && strcmp(te, "0") != 0 && strcmp(te, "1") != 0) {
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_ATTN_MMA=%s: want 0 or 1", te);
    }
    const char *fe2 = getenv("MI_CUDA_ATTN_MMA_FROM");
    if (fe2 && !fe2[0]) fe2 = nullptr; // empty: unset, as for MI_CUDA_ATTN_MMA
    char *fe2_end = nullptr;
    const long mma_from = fe2 ? strtol(fe2, &fe2_end, 10) : MI_ATTN_MMA_FROM;
    if (fe2 && (fe2_end == fe2 || *fe2_end || mma_from < 0 || mma_from > INT_MAX)) {
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_ATTN_MMA_FROM=%s: want a position >= 0", fe2);
    }
    c->attn_mma_from = !mi_cuda_attention_mma_applies(d->n_head, d->n_head_kv, d->head_dim) ? INT_MAX
                       : te && strcmp(te, "0") == 0                                       ? INT_MAX
                       : te && strcmp(te, "1") == 0                                       ? 0
                                                                                          : (int)mma_from;
    if (mi_cuda_norm_pre_env() < 0) { // read by norm.cu at each launch; refused here, clearly
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_NORM_PRE=%s: want 0 (by row width) or 4 (the choice before)",
                            getenv("MI_CUDA_NORM_PRE"));
    }
    if (mi_cuda_mmvq_warp_rows() < 0) {
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_MMVQ_WARP_ROWS=%s: want a row count >= 1", getenv("MI_CUDA_MMVQ_WARP_ROWS"));
    }
    const char *pe2 = getenv("MI_CUDA_ATTN_PAIR");
    if (pe2 && pe2[0] && strcmp(pe2, "0") != 0 && strcmp(pe2, "1") != 0) {
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_ATTN_PAIR=%s: want 0 or 1", pe2);
    }
    c->attn_pair = !(pe2 && strcmp(pe2, "0") == 0);
    const char *he = getenv("MI_CUDA_ATTN_HINT");
    if (he && !he[0]) he = nullptr; // empty: unset
    char *he_end = nullptr;
    const long hint = he ? strtol(he, &he_end, 10) : -1;
    if (he && (he_end == he || *he_end || hint < 0 || hint > 1 << 20)) {
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_ATTN_HINT=%s: want a block step count in 0..%d", he, 1 << 20);
    }
    c->attn_hint = (int)hint;
    // MI_ATTN_SPLITS_CC where the CUDA-core kernel only serves rows below 4,096 (the tensor-core
    // one takes the rest); past that 64 splits win (16k: 1.641 vs 1.756 ms with 32, 1.5B shape).
    if (!ae && c->attn_mma_from <= 4096) c->attn_splits = MI_ATTN_SPLITS_CC;
    if (mi_parse_skip(getenv("MI_CUDA_SKIP"), &c->skip)) {
        free(c);
        return MI_ERR_ARG;
    }
    const char *xe = getenv("MI_CUDA_QKV_MIXED");
    if (xe && xe[0] && strcmp(xe, "0") != 0 && strcmp(xe, "1") != 0) {
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_QKV_MIXED=%s: want 0 or 1", xe);
    }
    c->qkv_mixed = xe && strcmp(xe, "0") == 0 ? 0 : xe && strcmp(xe, "1") == 0 ? 2 : 1;
    const char *pe = getenv("MI_CUDA_ATTN_PREFILL");
    if (pe && pe[0] && strcmp(pe, "0") != 0 && strcmp(pe, "1") != 0) {
        free(c);
        return mi_set_error(MI_ERR_ARG, "MI_CUDA_ATTN_PREFILL=%s: want 0 or 1", pe);
    }
    c->attn_prefill = !(pe && strcmp(pe, "0") == 0) && mi_cuda_attention_prefill_applies(d->n_head, d->n_head_kv, d->head_dim);
    c->rope_fuse = mi_env_switch("MI_CUDA_ROPE_FUSE", 1) && mi_cuda_mmvq_can_rope(d->n_embd);
    c->layers = (mi_cuda_layer *)calloc((size_t)d->n_layer, sizeof(mi_cuda_layer));
    if (!c->layers) { free(c); return mi_set_error(MI_ERR_OOM, "out of host memory"); }
    int rc = MI_OK;
#define MI_FAIL(expr)          \
    do {                       \
        if ((rc = (expr))) {   \
            mi_cuda_ctx_free(c); \
            return rc;         \
        }                      \
    } while (0)
    // Weights: one allocation holding every tensor (tied output shares tok_embd's copy).
    const bool tied = d->output.data == d->tok_embd.data && d->output.type == d->tok_embd.type;
    size_t wbytes = mi_size(&d->tok_embd) + (tied ? 0 : mi_size(&d->output)) + mi_size(&d->output_norm);
    for (int l = 0; l < d->n_layer; l++) {
        const mi_layer *L = &d->layers[l];
        const mi_tensor *ts[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->bq, &L->bk, &L->bv,
                                 &L->wo, &L->ffn_norm, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        for (const mi_tensor *t : ts) wbytes += mi_size(t);
        if (L->ffn_gate.type != L->ffn_up.type) c->split_ffn = 1;
    }
    if (cudaMalloc(&c->weights, wbytes) != cudaSuccess) {
        c->weights = nullptr;
        MI_FAIL(mi_oom("the weights", wbytes));
    }
    size_t off = 0;
    MI_FAIL(mi_upload(&d->tok_embd, c->weights, &off, &c->tok_embd));
    if (tied) c->output = c->tok_embd;
    else MI_FAIL(mi_upload(&d->output, c->weights, &off, &c->output));
    mi_dtensor tmp;
    const bool stack_qkv = mi_env_switch("MI_CUDA_QKV_STACK", 1); // 0: one launch per q, k, v (A/B timing)
    if (!stack_qkv) c->qkv_mixed = 0;
    MI_FAIL(mi_upload(&d->output_norm, c->weights, &off, &tmp));
    c->output_norm = (const float *)tmp.data;
    for (int l = 0; l < d->n_layer; l++) {
        const mi_layer *L = &d->layers[l];
        mi_cuda_layer *G = &c->layers[l];
        MI_FAIL(mi_upload(&L->attn_norm, c->weights, &off, &tmp)); G->attn_norm = (const float *)tmp.data;
        // Same-typed q, k, v back to back (no padding: a row of a type is a whole number of its
        // blocks, so the next matrix keeps the alignment the type's loads need), then run as one
        // stacked matrix; a type change gets the usual 256-byte padding.
        MI_FAIL(mi_upload(&L->wq, c->weights, &off, &G->wq, L->wq.type != L->wk.type));
        MI_FAIL(mi_upload(&L->wk, c->weights, &off, &G->wk, L->wk.type != L->wv.type));
        MI_FAIL(mi_upload(&L->wv, c->weights, &off, &G->wv));
        MI_FAIL(mi_upload(&L->bq, c->weights, &off, &tmp)); G->bq = (const float *)tmp.data;
        MI_FAIL(mi_upload(&L->bk, c->weights, &off, &tmp)); G->bk = (const float *)tmp.data;
        MI_FAIL(mi_upload(&L->bv, c->weights, &off, &tmp)); G->bv = (const float *)tmp.data;
        MI_FAIL(mi_upload(&L->wo, c->weights, &off, &G->wo));
        MI_FAIL(mi_upload(&L->ffn_norm, c->weights, &off, &tmp)); G->ffn_norm = (const float *)tmp.data;
        MI_FAIL(mi_upload(&L->ffn_gate, c->weights, &off, &G->gate));
        MI_FAIL(mi_upload(&L->ffn_up, c->weights, &off, &G->up));
        MI_FAIL(mi_upload(&L->ffn_down, c->weights, &off, &G->down));
        const mi_dtensor *qkv[3] = {&G->wq, &G->wk, &G->wv};
        for (int i = 0; i < 3; i++) {
            const mi_dtensor *p = i ? qkv[i - 1] : nullptr;
            if (i && stack_qkv && p->type == qkv[i]->type && p->data + p->n_rows * p->row_bytes == qkv[i]->data) {
                G->qkv_count[G->n_qkv - 1]++;
                G->qkv_w[G->n_qkv - 1].n_rows += qkv[i]->n_rows;
            } else {
                G->qkv_first[G->n_qkv] = i;
                G->qkv_count[G->n_qkv] = 1;
                G->qkv_w[G->n_qkv++] = *qkv[i];
            }
        }
    }
    for (int l = 0; l < d->n_layer; l++) {
        const mi_cuda_layer *G = &c->layers[l];
        if (c->qkv_mixed == 2 && G->n_qkv == 2 && !mi_cuda_mmvq_mixed_applies(&G->qkv_w[0], &G->qkv_w[1]))
            MI_FAIL(mi_set_error(MI_ERR_ARG, "MI_CUDA_QKV_MIXED=1: layer %d's q/k/v (types %d + %d) have no mixed launch", l,
                                 G->qkv_w[0].type, G->qkv_w[1].type));
        // The prefill attention writes f32 only: every wo must take the GEMM (which reads f32).
        if (!mi_cuda_mmq_applies(G->wo.type, G->wo.n_cols, MI_MMQ_MIN_NT)) c->attn_prefill = 0;
    }
    // Arena: KV cache and scratch, sizes as the struct comments state.
    const int64_t E = d->n_embd, F = d->n_ff, HD = d->head_dim, QD = (int64_t)d->n_head * HD,
                  KD = (int64_t)d->n_head_kv * HD;
    int64_t widest = E > F ? E : F;
    if (QD > widest) widest = QD;
    const size_t kv_bytes = (size_t)d->n_layer * n_ctx * KD * sizeof(__half);
    size_t mmq_floats = 0; // the largest need over the GEMM output widths
    for (int64_t nr : {E, F, QD, KD, (int64_t)d->n_vocab}) {
        const size_t f = mi_cuda_mmq_scratch_floats(nr, max_nt);
        if (f > mmq_floats) mmq_floats = f;
    }
    const size_t mmq_xh = c->no_mmq ? 0 : mi_cuda_mmq_xh_halves(widest, max_nt);
    // Forwards of nt >= MI_MMQ_MIN_NT rows run the decode attention only without the GEMM path or
    // the prefill kernel (mi_enqueue's rule); the others have at most MI_MMQ_MIN_NT - 1 rows.
    c->part_rows = c->attn_prefill && !c->no_mmq && max_nt > MI_MMQ_MIN_NT - 1 ? MI_MMQ_MIN_NT - 1 : max_nt;
    const size_t sizes[] = {
        kv_bytes, kv_bytes,
        (size_t)max_nt * E * 4,                                    // x
        (size_t)max_nt * widest * 4,                               // xn
        (size_t)max_nt * (widest / 32) * sizeof(mi_block_q8a),     // xq
        (size_t)max_nt * QD * 4, (size_t)max_nt * KD * 4, (size_t)max_nt * KD * 4, // q k v
        (size_t)max_nt * QD * 4,                                   // att
        (size_t)max_nt * F * 4,                                    // ff
        (size_t)max_nt * F * 4, (size_t)max_nt * F * 4,           // gate up (split types, or the GEMM path)
        (size_t)max_nt * HD * 4,                                   // rope_cs
        mi_attn_part_floats(c->part_rows, d->n_head, d->head_dim) * 4, // part
        (size_t)max_nt * d->n_vocab * 4,                           // logits
        ((size_t)4 * max_nt + 1) * 4,                              // ints
        (size_t)max_nt * (F / 32) * sizeof(mi_block_q8a),          // xq_ff
        (size_t)max_nt * d->n_head * 4,                            // attn_cnt
        (size_t)(F / 32 + 1) * 4,                                  // ff_cnt
        mmq_floats * 4,                                            // mmq_scratch
        mmq_xh * sizeof(__half),                                   // mmq_xh
        (size_t)max_nt * MI_ARGMAX_BLOCKS * 4, (size_t)max_nt * MI_ARGMAX_BLOCKS * 4, (size_t)max_nt * 4, // argmax
    };
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    size_t abytes = 0;
    for (int i = 0; i < n_sizes; i++) abytes += mi_align(sizes[i]);
    if (cudaMalloc(&c->arena, abytes) != cudaSuccess) {
        c->arena = nullptr;
        char what[96];
        snprintf(what, sizeof what, "the KV cache and scratch (n_ctx %d, max_nt %d)", n_ctx, max_nt);
        MI_FAIL(mi_oom(what, abytes));
    }
    // Zeroed like the CPU's calloc'd cache, so never-written slots hold no NaN bit patterns.
    MI_FAIL([&]() -> int { MI_CUDA_TRY(cudaMemset(c->arena, 0, abytes)); return MI_OK; }());
    void *ptrs[n_sizes];
    off = 0;
    for (int i = 0; i < n_sizes; i++) {
        ptrs[i] = sizes[i] ? c->arena + off : nullptr;
        off += mi_align(sizes[i]);
    }
    c->kv_k = (__half *)ptrs[0]; c->kv_v = (__half *)ptrs[1]; c->x = (float *)ptrs[2]; c->xn = (float *)ptrs[3];
    c->xq = (mi_block_q8a *)ptrs[4]; c->q = (float *)ptrs[5]; c->k = (float *)ptrs[6]; c->v = (float *)ptrs[7];
    c->att = (float *)ptrs[8]; c->ff = (float *)ptrs[9]; c->gate = (float *)ptrs[10]; c->up = (float *)ptrs[11];
    c->rope_cs = (float *)ptrs[12]; c->part = (float *)ptrs[13]; c->logits = (float *)ptrs[14];
    c->ints = (int32_t *)ptrs[15];
    c->xq_ff = (mi_block_q8a *)ptrs[16]; c->attn_cnt = (int32_t *)ptrs[17]; c->ff_cnt = (int32_t *)ptrs[18];
    c->mmq_scratch = (float *)ptrs[19]; c->mmq_scratch_floats = mmq_floats;
    c->mmq_xh = (__half *)ptrs[20]; c->mmq_xh_halves = mmq_xh;
    c->amax_v = (float *)ptrs[21]; c->amax_i = (int32_t *)ptrs[22]; c->amax_cnt = (int32_t *)ptrs[23];
    MI_FAIL([&]() -> int {
        MI_CUDA_TRY(cudaMallocHost(&c->h_ints, ((size_t)4 * max_nt + 1) * 4));
        MI_CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
        if (mi_env_switch("MI_CUDA_PROFILE", 0) == 1) {
            c->prof = 1;
            c->cap_ev = 16 * c->n_layer + 16;
            c->ev = (cudaEvent_t *)calloc((size_t)c->cap_ev, sizeof(cudaEvent_t));
            c->ev_kind = (int *)calloc((size_t)c->cap_ev, sizeof(int));
            if (!c->ev || !c->ev_kind) return mi_set_error(MI_ERR_OOM, "out of host memory");
            for (int i = 0; i < c->cap_ev; i++) MI_CUDA_TRY(cudaEventCreate(&c->ev[i]));
        }
        return MI_OK;
    }());
    // Every graph captured now (a few ms), never inside the decode loop: a first use at a new nt
    // would otherwise cost a capture (~10 ms) inside a timed speculative round.
    // One graph per regime a batch can be in: 3 x 9 when the switch position lies inside the context.
    if (c->use_graphs)
        for (int r = 1; r <= 3; r++) {
            if ((r & 1) && c->attn_mma_from == 0) continue;          // no row below the switch
            if ((r & 2) && c->attn_mma_from >= n_ctx) continue;       // no row at or above it
            for (int nt = 1; nt <= MI_GRAPH_MAX_NT && nt <= max_nt; nt++) MI_FAIL(mi_capture(c, nt, r));
        }
#undef MI_FAIL
    *out = c;
    return MI_OK;
}

static int mi_cuda_forward_queue(mi_cuda_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt,
                                 const int32_t *out_rows, int32_t n_out, int32_t want_argmax);

extern "C" int mi_cuda_forward_submit(mi_cuda_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt,
                                      const int32_t *out_rows, int32_t n_out, int32_t want_argmax) {
    if (c->pending) return mi_set_error(MI_ERR_ARG, "a submitted forward has not been waited for");
    const int rc = mi_cuda_forward_queue(c, tokens, pos, nt, out_rows, n_out, want_argmax);
    if (rc) { // part of the forward may be queued: let it drain before h_ints is written again
        cudaStreamSynchronize(c->stream);
        cudaGetLastError();
        c->n_ev = 0;
    }
    return rc;
}

// The body of mi_cuda_forward_submit: the copies in, the graph (or the launches), the argmax copy out.
static int mi_cuda_forward_queue(mi_cuda_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt,
                                 const int32_t *out_rows, int32_t n_out, int32_t want_argmax) {
    const int M = c->max_nt;
    // h_ints is pinned: the copies below are truly asynchronous, and nothing writes h_ints again
    // before the wait (one forward in flight per context).
    memcpy(c->h_ints, tokens, nt * 4);
    memcpy(c->h_ints + M, pos, nt * 4);
    if (n_out) memcpy(c->h_ints + 2 * M, out_rows, n_out * 4);
    c->h_ints[3 * M] = n_out;
    MI_CUDA_TRY(cudaMemcpyAsync(c->ints, c->h_ints, ((size_t)3 * M + 1) * 4, cudaMemcpyHostToDevice, c->stream));
    const int regime = mi_regime(c, pos, nt);
    c->last_regime = regime;
    if (c->use_graphs && nt <= MI_GRAPH_MAX_NT) {
        if (!c->graphs[regime - 1][nt]) return mi_set_error(MI_ERR_ARG, "no captured graph for nt=%d, regime %d", nt, regime);
        MI_CUDA_TRY(cudaGraphLaunch(c->graphs[regime - 1][nt], c->stream)); // captured at creation
    } else {
        const int rc = mi_enqueue(c, nt, 0, n_out, regime);
        if (rc) return rc;
    }
    if (n_out > 0 && want_argmax)
        MI_CUDA_TRY(cudaMemcpyAsync(c->h_ints + 3 * M + 1, c->ints + 3 * M + 1, (size_t)n_out * 4, cudaMemcpyDeviceToHost,
                                    c->stream));
    c->pending = 1;
    c->pend_n_out = n_out;
    c->pend_argmax = n_out > 0 && want_argmax;
    return MI_OK;
}

extern "C" int mi_cuda_forward_ready(mi_cuda_ctx *c) {
    if (!c->pending) return 1;
    const cudaError_t e = cudaStreamQuery(c->stream);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    return -mi_set_error(MI_ERR_CUDA, "CUDA error: %s", cudaGetErrorString(e)); // negated: 1 means finished
}

extern "C" int mi_cuda_forward_wait(mi_cuda_ctx *c, float *logits, int32_t *argmax) {
    if (!c->pending) return mi_set_error(MI_ERR_ARG, "no submitted forward to wait for");
    c->pending = 0;
    const int M = c->max_nt, n_out = c->pend_n_out;
    if (n_out > 0 && logits)
        MI_CUDA_TRY(cudaMemcpyAsync(logits, c->logits, (size_t)n_out * c->n_vocab * 4, cudaMemcpyDeviceToHost, c->stream));
    MI_CUDA_TRY(cudaStreamSynchronize(c->stream));
    if (c->prof && c->n_ev > 1) {
        for (int i = 1; i < c->n_ev; i++) {
            float ms = 0.0f;
            MI_CUDA_TRY(cudaEventElapsedTime(&ms, c->ev[i - 1], c->ev[i]));
            c->prof_ms[c->ev_kind[i]] += ms;
        }
        c->prof_calls++;
    }
    c->n_ev = 0;
    if (c->pend_argmax && argmax) memcpy(argmax, c->h_ints + 3 * M + 1, (size_t)n_out * 4);
    return MI_OK;
}

extern "C" int mi_cuda_forward(mi_cuda_ctx *c, const int32_t *tokens, const int32_t *pos, int32_t nt,
                               const int32_t *out_rows, int32_t n_out, float *logits, int32_t *argmax) {
    const int rc = mi_cuda_forward_submit(c, tokens, pos, nt, out_rows, n_out, argmax != nullptr);
    if (rc) return rc;
    return mi_cuda_forward_wait(c, logits, argmax);
}

extern "C" int mi_cuda_replay_ms(mi_cuda_ctx *c, int32_t nt, int32_t reps, float *ms) {
    // The graph of the last forward's regime (its positions are still in the device buffer).
    if (c->pending) return mi_set_error(MI_ERR_ARG, "a submitted forward has not been waited for");
    const int r = c->last_regime > 0 ? c->last_regime - 1 : 0;
    if (nt < 1 || nt > MI_GRAPH_MAX_NT || nt > c->max_nt || !c->graphs[r][nt])
        return mi_set_error(MI_ERR_ARG, "no captured graph for nt=%d (graphs %s)", nt, c->use_graphs ? "on" : "off");
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    int rc = [&]() -> int {
        MI_CUDA_TRY(cudaEventCreate(&e0));
        MI_CUDA_TRY(cudaEventCreate(&e1));
        MI_CUDA_TRY(cudaGraphLaunch(c->graphs[r][nt], c->stream)); // warm
        MI_CUDA_TRY(cudaEventRecord(e0, c->stream));
        for (int i = 0; i < reps; i++) MI_CUDA_TRY(cudaGraphLaunch(c->graphs[r][nt], c->stream));
        MI_CUDA_TRY(cudaEventRecord(e1, c->stream));
        MI_CUDA_TRY(cudaEventSynchronize(e1));
        float t = 0.0f;
        MI_CUDA_TRY(cudaEventElapsedTime(&t, e0, e1));
        *ms = t / (float)reps;
        return MI_OK;
    }();
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

extern "C" int mi_cuda_op_matmul(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x, int32_t nt,
                                 float *y) {
    if (!mi_cuda_available()) return mi_set_error(MI_ERR_CUDA, "no CUDA device visible");
    const bool quant = !(type == MI_TYPE_F32 || type == MI_TYPE_F16);
    mi_tensor ht = {w, type, n_cols, n_rows};
    mi_dtensor t;
    t.type = type;
    t.n_cols = n_cols;
    t.n_rows = n_rows;
    t.row_bytes = n_cols / mi_type_block_elems(type) * mi_type_block_bytes(type);
    const size_t wb = (size_t)mi_tensor_bytes(&ht), xb = (size_t)nt * n_cols * 4, yb = (size_t)nt * n_rows * 4;
    const size_t qb = quant ? (size_t)nt * (n_cols / 32) * sizeof(mi_block_q8a) : 0;
    uint8_t *buf = nullptr;
    const size_t total = mi_align(wb) + mi_align(xb) + mi_align(yb) + mi_align(qb);
    if (cudaMalloc(&buf, total) != cudaSuccess) return mi_oom("matmul operands", total);
    uint8_t *wd = buf, *xd = wd + mi_align(wb), *yd = xd + mi_align(xb), *qd = yd + mi_align(yb);
    t.data = wd;
    int rc = [&]() -> int {
        MI_CUDA_TRY(cudaMemcpy(wd, w, wb, cudaMemcpyHostToDevice));
        MI_CUDA_TRY(cudaMemcpy(xd, x, xb, cudaMemcpyHostToDevice));
        int r;
        if (quant && (r = mi_cuda_quantize((const float *)xd, nt, (int)n_cols, (mi_block_q8a *)qd, 0))) return r;
        if ((r = mi_cuda_mmvq(&t, nullptr, quant ? (const mi_block_q8a *)qd : nullptr, (const float *)xd, n_cols, nt,
                              (float *)yd, n_rows, nullptr, 0, 0)))
            return r;
        MI_CUDA_TRY(cudaMemcpy(y, yd, yb, cudaMemcpyDeviceToHost));
        return MI_OK;
    }();
    cudaFree(buf);
    return rc;
}
