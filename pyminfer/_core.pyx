# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin bindings of the C core (native/include/pyminfer.h).

Tensors cross as plain tuples ``(address, ggml_type, n_cols, n_rows)`` whose address points into
memory the caller keeps alive (the GGUF mmap); arrays cross as buffers (numpy arrays of the
stated dtype, C-contiguous). Every C error becomes a Python exception carrying the C message.
"""
from libc.stdint cimport int32_t, int64_t, uint16_t, uintptr_t
from libc.stdlib cimport malloc, free

import threading

# (elements, bytes) per block of each ggml type the core supports (mi_quants.h)
_BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          12: (256, 144), 13: (256, 176), 14: (256, 210)}


def _row_bytes(int type, int64_t n_cols) -> int:
    if type not in _BLOCK:
        raise NativeError(2, f"unsupported tensor type {type}")
    be, bb = _BLOCK[type]
    if n_cols <= 0 or n_cols % be:
        raise ValueError(f"n_cols {n_cols} must be a positive multiple of the block size {be}")
    return n_cols // be * bb

DEVICE_CPU = 0
DEVICE_CUDA = 1


class NativeError(RuntimeError):
    """An error reported by the C core; ``code`` is the mi_status value."""

    def __init__(self, int code, str msg):
        super().__init__(msg)
        self.code = code


class ContextFullError(NativeError):
    """A position outside the KV cache (n_ctx) was asked for."""


cdef int _check(int rc) except -1:
    if rc != 0:
        msg = mi_last_error().decode("utf-8", "replace")
        if rc == 3:
            raise MemoryError(msg)
        if rc == 5:
            raise ContextFullError(rc, msg)
        raise NativeError(rc, msg)
    return 0


cdef int _batch_len(const int32_t[::1] tokens, const int32_t[::1] pos) except -1:
    # Tokens of one forward: as many positions as tokens, at least one.
    if pos.shape[0] != tokens.shape[0]:
        raise ValueError("tokens and pos differ in length")
    if tokens.shape[0] == 0:
        raise ValueError("empty token batch")
    return tokens.shape[0]


cdef mi_tensor _tensor(object spec) except *:
    cdef mi_tensor t
    if spec is None:
        t.data = NULL
        t.type = 0
        t.n_cols = 0
        t.n_rows = 0
        return t
    addr, typ, n_cols, n_rows = spec
    t.data = <const void *> <uintptr_t> addr
    t.type = typ
    t.n_cols = n_cols
    t.n_rows = n_rows
    return t


def cuda_available() -> bool:
    """True when this build has the CUDA backend and a CUDA device is visible."""
    return mi_cuda_available() != 0


def cuda_device_name() -> str:
    """Name of CUDA device 0, or "" when there is none."""
    return mi_cuda_device_name().decode()


def cuda_compute_capability() -> int:
    """Compute capability of CUDA device 0 as 10 * major + minor (90 for an H100 / H200), 0 when
    there is no GPU or no CUDA backend."""
    return mi_cuda_compute_capability()


def mmq_wide_launches() -> int:
    """GEMM launches that took the 128-row activation tiles (native/cuda/mmq.cu, MI_CUDA_MMQ_BN)
    in this process so far; 0 without CUDA. For tests: which kernel ran."""
    return mi_cuda_mmq_wide_launches()


def mmvq_mma_launches() -> int:
    """Mat-vec launches that took the tensor-core verify kernel (native/cuda/mmvq_mma.cu,
    MI_CUDA_MMVQ_MMA) in this process so far, graph replays not counted; 0 without CUDA. For tests."""
    return mi_cuda_mmvq_mma_launches()


def mmvq_pair_launches() -> int:
    """Mat-vec launches that took the pair kernel (two weight rows a thread; native/cuda/mmvq_kernels.cuh,
    MI_CUDA_MMVQ_PAIR) in this process so far, graph replays not counted; 0 without CUDA. For tests."""
    return mi_cuda_mmvq_pair_launches()


def mmvq_mma_split_launches() -> int:
    """Of mmvq_mma_launches, those split over a thread block cluster a 16-row tile (sm_90+,
    MI_CUDA_MMVQ_MMA_SPLIT); 0 without CUDA. For tests: which launch shape ran."""
    return mi_cuda_mmvq_mma_split_launches()


def attn_pair_launches() -> int:
    """Tensor-core decode-attention launches whose grid pairs two batch rows a block
    (native/cuda/attention.cu, MI_CUDA_ATTN_PAIR) in this process so far, graph captures included,
    replays not counted; 0 without CUDA. For tests: that the pair path was launched."""
    return mi_cuda_attn_pair_launches()


def cuda_copy_bandwidth() -> float:
    """Device-to-device copy bandwidth of CUDA device 0 in bytes/s (read + write); raises
    RuntimeError when there is no CUDA device."""
    cdef double bw
    with nogil:
        bw = mi_cuda_copy_bandwidth()
    if bw <= 0:
        raise RuntimeError("no CUDA device to measure")
    return bw


cdef class Context:
    """One model instance on one device: KV cache, scratch, (CUDA) uploaded weights and graphs.

    Args:
        cfg: dict with n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, rope_type
            (0 NORM, 2 NEOX), rope_freq_base, rms_eps.
        tensors: dict with tok_embd, output_norm, output (tensor tuples) and layers: a list of
            dicts with attn_norm, wq, wk, wv, bq, bk, bv (may be None), wo, ffn_norm, ffn_gate,
            ffn_up, ffn_down.
        n_ctx: KV cache positions. max_nt: most tokens per forward. n_threads: CPU threads
            (<= 0: all cores). device: DEVICE_CPU or DEVICE_CUDA.
    Raises:
        NativeError (bad shapes, unsupported type, no CUDA), MemoryError (allocation failed).
    """
    cdef mi_ctx *ctx
    cdef readonly int n_vocab
    cdef readonly int n_ctx
    cdef readonly int max_nt
    cdef readonly int device
    cdef object _keepalive
    cdef object _lock  # one forward at a time: the context's scratch and KV cache are shared state
    cdef int _pend_n_out  # out rows of the submitted forward (forward_submit)

    def __cinit__(self, dict cfg, dict tensors, int n_ctx, int max_nt, int n_threads, int device, object keepalive=None):
        cdef mi_model_desc d
        cdef int nl = cfg["n_layer"]
        cdef mi_layer *layers = <mi_layer *> malloc(sizeof(mi_layer) * max(nl, 1))
        if layers == NULL:
            raise MemoryError()
        try:
            d.n_layer = nl
            d.n_embd = cfg["n_embd"]
            d.n_ff = cfg["n_ff"]
            d.n_head = cfg["n_head"]
            d.n_head_kv = cfg["n_head_kv"]
            d.head_dim = cfg["head_dim"]
            d.n_vocab = cfg["n_vocab"]
            d.rope_type = cfg["rope_type"]
            d.rope_freq_base = cfg["rope_freq_base"]
            d.rms_eps = cfg["rms_eps"]
            d.tok_embd = _tensor(tensors["tok_embd"])
            d.output_norm = _tensor(tensors["output_norm"])
            d.output = _tensor(tensors["output"])
            for i, L in enumerate(tensors["layers"]):
                layers[i].attn_norm = _tensor(L["attn_norm"])
                layers[i].wq = _tensor(L["wq"])
                layers[i].wk = _tensor(L["wk"])
                layers[i].wv = _tensor(L["wv"])
                layers[i].bq = _tensor(L.get("bq"))
                layers[i].bk = _tensor(L.get("bk"))
                layers[i].bv = _tensor(L.get("bv"))
                layers[i].wo = _tensor(L["wo"])
                layers[i].ffn_norm = _tensor(L["ffn_norm"])
                layers[i].ffn_gate = _tensor(L["ffn_gate"])
                layers[i].ffn_up = _tensor(L["ffn_up"])
                layers[i].ffn_down = _tensor(L["ffn_down"])
            d.layers = layers
            with nogil:
                rc = mi_ctx_create(&d, n_ctx, max_nt, n_threads, device, &self.ctx)
            _check(rc)
        finally:
            free(layers)
        self.n_vocab = d.n_vocab
        self.n_ctx = n_ctx
        self.max_nt = max_nt
        self.device = device
        self._keepalive = keepalive
        self._lock = threading.Lock()

    def __dealloc__(self):
        if self.ctx != NULL:
            mi_ctx_free(self.ctx)
            self.ctx = NULL

    def close(self) -> None:
        """Free the KV cache, scratch and device memory now (the object is unusable after)."""
        with self._lock:
            if self.ctx != NULL:
                mi_ctx_free(self.ctx)
                self.ctx = NULL

    cdef mi_ctx *_open(self) except NULL:
        # The native context, or ValueError once closed; call with self._lock held.
        if self.ctx == NULL:
            raise ValueError("context is closed")
        return self.ctx

    def forward(self, const int32_t[::1] tokens, const int32_t[::1] pos, const int32_t[::1] out_rows,
                float[:, ::1] logits=None, int32_t[::1] argmax=None) -> None:
        """Run one forward over len(tokens) tokens at positions ``pos`` (int32 arrays).

        Writes f32 logits [len(out_rows), n_vocab] into ``logits`` and/or int32 argmax
        [len(out_rows)] into ``argmax`` for the rows ``out_rows`` (int32 indices into tokens).
        Raises ValueError on mismatched lengths, ContextFullError for a position >= n_ctx,
        NativeError for other C errors. Releases the GIL while it runs; calls on one context are
        serialized by a lock (its scratch buffers and KV cache are shared).
        """
        cdef int nt = _batch_len(tokens, pos)
        cdef int n_out = out_rows.shape[0]
        if logits is not None and (logits.shape[0] < n_out or logits.shape[1] != self.n_vocab):
            raise ValueError("logits buffer must be [n_out, n_vocab]")
        if argmax is not None and argmax.shape[0] < n_out:
            raise ValueError("argmax buffer too small")
        cdef float *lp = &logits[0, 0] if logits is not None and n_out > 0 else NULL
        cdef int32_t *ap = &argmax[0] if argmax is not None and n_out > 0 else NULL
        cdef const int32_t *rp = &out_rows[0] if n_out > 0 else NULL
        cdef int rc
        cdef mi_ctx *c
        with self._lock:
            c = self._open()
            with nogil:
                rc = mi_forward(c, &tokens[0], &pos[0], nt, rp, n_out, lp, ap)
        _check(rc)

    def forward_submit(self, const int32_t[::1] tokens, const int32_t[::1] pos, const int32_t[::1] out_rows) -> None:
        """Queue the forward ``forward`` would run (argmax of ``out_rows`` only) and return without
        waiting: a CUDA context computes on its own stream meanwhile, so another context's forwards
        (the draft's, in speculative decoding) can overlap it. A CPU context computes here. Then
        ``forward_ready`` polls and ``forward_wait`` collects the argmax. One forward in flight per
        context: another call before the wait raises NativeError. Same argument errors as forward.
        """
        cdef int nt = _batch_len(tokens, pos)
        cdef int n_out = out_rows.shape[0]
        cdef const int32_t *rp = &out_rows[0] if n_out > 0 else NULL
        cdef int rc
        cdef mi_ctx *c
        with self._lock:
            c = self._open()
            with nogil:
                rc = mi_forward_submit(c, &tokens[0], &pos[0], nt, rp, n_out)
            _check(rc)
            self._pend_n_out = n_out

    def forward_ready(self) -> bool:
        """Whether the submitted forward has finished (True with none in flight). Does not block."""
        cdef int rc
        with self._lock:
            rc = mi_forward_ready(self._open())
        _check(-rc if rc < 0 else 0)  # < 0: the error code negated
        return rc == 1

    def forward_wait(self, int32_t[::1] argmax=None) -> None:
        """Wait for the submitted forward; write its argmax ids (int32, one per out row) into
        ``argmax`` when given. NativeError when nothing was submitted."""
        cdef int32_t *ap = NULL
        cdef int rc
        cdef mi_ctx *c
        with self._lock:
            c = self._open()
            if argmax is not None and self._pend_n_out > 0:
                if argmax.shape[0] < self._pend_n_out:
                    raise ValueError(f"argmax buffer too small: {argmax.shape[0]} < {self._pend_n_out} out rows")
                ap = &argmax[0]
            with nogil:
                rc = mi_forward_wait(c, ap)
            if rc == 0:
                self._pend_n_out = 0
        _check(rc)

    def gpu_replay_ms(self, int nt, int reps=100) -> float:
        """GPU milliseconds of one nt-row forward: the captured graph (tokens and positions of the
        last forward) replayed ``reps`` times back to back, timed with CUDA events (no host work
        in between). Raises NativeError on a CPU context, without graphs or for nt > 9."""
        cdef float ms = 0.0
        cdef int rc
        cdef mi_ctx *c
        with self._lock:
            c = self._open()
            with nogil:
                rc = mi_gpu_replay_ms(c, nt, reps, &ms)
        _check(rc)
        return ms


def dequantize(int type, const unsigned char[::1] src, int64_t n_rows, int64_t n_cols, float[:, ::1] dst) -> None:
    """Dequantize ``n_rows`` x ``n_cols`` elements of ggml ``type`` from raw bytes into f32 ``dst``."""
    if n_rows <= 0 or dst.shape[0] != n_rows or dst.shape[1] != n_cols:
        raise ValueError("dst must be [n_rows, n_cols] with n_rows > 0")
    if src.shape[0] < n_rows * _row_bytes(type, n_cols):
        raise ValueError(f"src holds {src.shape[0]} bytes, {n_rows} rows need {n_rows * _row_bytes(type, n_cols)}")
    _check(mi_dequantize(type, &src[0], n_rows, n_cols, &dst[0, 0]))


def matmul(int device, int type, const unsigned char[::1] w, int64_t n_rows, int64_t n_cols, const float[:, ::1] x,
           float[:, ::1] y, int n_threads=0) -> None:
    """y[nt, n_rows] = x[nt, n_cols] @ W.T with W given as raw bytes of ggml ``type`` (quantized
    activations as the engine does). ``device``: DEVICE_CPU or DEVICE_CUDA."""
    cdef int nt = x.shape[0]
    if device not in (DEVICE_CPU, DEVICE_CUDA):
        raise ValueError(f"unknown device {device}")
    if nt < 1 or n_rows <= 0 or x.shape[1] != n_cols or y.shape[0] != nt or y.shape[1] != n_rows:
        raise ValueError("shape mismatch: x [nt >= 1, n_cols], y [nt, n_rows], n_rows > 0")
    if w.shape[0] < n_rows * _row_bytes(type, n_cols):
        raise ValueError(f"w holds {w.shape[0]} bytes, {n_rows} rows need {n_rows * _row_bytes(type, n_cols)}")
    cdef int rc
    with nogil:
        rc = mi_op_matmul(device, type, &w[0], n_rows, n_cols, &x[0, 0], nt, &y[0, 0], n_threads)
    _check(rc)


def mmq(int type, const unsigned char[::1] w, int64_t n_rows, int64_t n_cols, const float[:, ::1] x, bias=None,
        y0=None):
    """CUDA tensor-core GEMM (native/cuda/mmq.cuh), the prefill path: returns a new float32
    [nt, n_rows] = y0 + bias + x[nt, n_cols] @ W.T, W raw bytes of ggml ``type``, W and x rounded
    to f16 with f32 sums. ``bias``: float32 [n_rows] or None; ``y0``: float32 [nt, n_rows] to
    accumulate into (not modified), or None. n_cols must be a multiple of 32."""
    import numpy as np
    cdef int nt = x.shape[0]
    if nt < 1 or n_rows <= 0 or x.shape[1] != n_cols:
        raise ValueError("shape mismatch: x [nt >= 1, n_cols], n_rows > 0")
    if n_cols % 32:
        raise ValueError(f"n_cols {n_cols} must be a multiple of 32")
    if w.shape[0] < n_rows * _row_bytes(type, n_cols):
        raise ValueError(f"w holds {w.shape[0]} bytes, {n_rows} rows need {n_rows * _row_bytes(type, n_cols)}")
    out = np.empty((nt, n_rows), np.float32) if y0 is None else np.array(y0, dtype=np.float32, order="C")
    if out.shape != (nt, n_rows):
        raise ValueError(f"y0 must be [nt, n_rows] = [{nt}, {n_rows}], got {list(out.shape)}")
    cdef float[:, ::1] y = out
    cdef const float[::1] b
    cdef const float *bp = NULL
    if bias is not None:
        b = np.ascontiguousarray(bias, dtype=np.float32)
        if b.shape[0] != n_rows:
            raise ValueError(f"bias must hold n_rows = {n_rows} floats, got {b.shape[0]}")
        bp = &b[0]
    cdef int acc = y0 is not None
    cdef int rc
    with nogil:
        rc = mi_cuda_op_mmq(type, &w[0], n_rows, n_cols, &x[0, 0], nt, bp, acc, &y[0, 0])
    _check(rc)
    return out


def attention_prefill(const float[:, ::1] q, const uint16_t[:, ::1] k, const uint16_t[:, ::1] v,
                      const int32_t[::1] pos, int n_head, int n_head_kv, float scale):
    """CUDA prefill attention (native/cuda/attention.cuh, the GEMM path's tensor-core kernel):
    returns a new float32 [nt, n_head*head_dim], per head softmax(q k^T * scale) v of row t over
    cache slots 0..pos[t]. q float32 [nt, n_head*head_dim]; k, v: f16 bits (uint16) [n_kv,
    n_head_kv*head_dim]; pos int32 [nt]. Raises NativeError for head_dim other than 64 / 128, a
    position outside the cache, or no GPU."""
    import numpy as np
    cdef int nt = q.shape[0]
    if nt < 1 or n_head < 1 or n_head_kv < 1 or q.shape[1] % n_head:
        raise ValueError("q must be [nt >= 1, n_head * head_dim]")
    cdef int hd = q.shape[1] // n_head
    if k.shape[1] != n_head_kv * hd or v.shape[0] != k.shape[0] or v.shape[1] != k.shape[1] or k.shape[0] < 1:
        raise ValueError("k, v must be [n_kv >= 1, n_head_kv * head_dim], the same shape")
    if pos.shape[0] != nt:
        raise ValueError("pos must hold nt positions")
    out = np.empty((nt, n_head * hd), np.float32)
    cdef float[:, ::1] o = out
    cdef int rc
    with nogil:
        rc = mi_cuda_op_attention_prefill(&q[0, 0], &k[0, 0], &v[0, 0], &pos[0], nt, k.shape[0], n_head, n_head_kv,
                                          hd, scale, &o[0, 0])
    _check(rc)
    return out


def rmsnorm(const float[::1] x, const float[::1] w, float[::1] y, float eps) -> None:
    """CPU RMSNorm of one f32 row: y = x / sqrt(mean(x^2) + eps) * w (all [n])."""
    if w.shape[0] != x.shape[0] or y.shape[0] != x.shape[0]:
        raise ValueError("x, w, y must have the same length")
    _check(mi_op_rmsnorm(&x[0], &w[0], &y[0], x.shape[0], eps))


def rope(float[::1] x, int n_heads, int head_dim, int pos, float freq_base, int rope_type) -> None:
    """CPU RoPE in place on f32 x[n_heads*head_dim] at position ``pos`` (0 NORM, 2 NEOX)."""
    if x.shape[0] != n_heads * head_dim:
        raise ValueError("x must hold n_heads * head_dim values")
    _check(mi_op_rope(&x[0], n_heads, head_dim, pos, freq_base, rope_type))


def attention(const float[::1] q, const float[:, ::1] k, const float[:, ::1] v, float scale, float[::1] out) -> None:
    """CPU attention of one query head q[head_dim] over k, v [n_kv, head_dim] into out[head_dim]."""
    if k.shape[1] != q.shape[0] or v.shape[1] != q.shape[0] or k.shape[0] != v.shape[0] or out.shape[0] != q.shape[0]:
        raise ValueError("shapes: q [d], k [n, d], v [n, d], out [d]")
    _check(mi_op_attention(&q[0], &k[0, 0], &v[0, 0], k.shape[0], q.shape[0], scale, &out[0]))


def swiglu(const float[::1] gate, const float[::1] up, float[::1] y) -> None:
    """CPU SwiGLU: y = silu(gate) * up (all f32 [n])."""
    if up.shape[0] != gate.shape[0] or y.shape[0] != gate.shape[0]:
        raise ValueError("gate, up, y must have the same length")
    _check(mi_op_swiglu(&gate[0], &up[0], &y[0], gate.shape[0]))
