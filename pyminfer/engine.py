"""A loaded model on one device: GGUF weights (mmap), tokenizer, native context (KV cache).

The KV cache is position-addressed: a forward over tokens at positions start..start+n-1 writes
their K/V into those slots, and every row attends to slots 0..its own position. The caller owns
the bookkeeping of which positions hold valid K/V (``n_past``); rolling back is lowering it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Sequence


import numpy as np

from . import _core
from .gguf_model import GGUFModel
from .sampling import NaNLogitsError
from .tokenizer import Tokenizer

INT_MAX = 2**31 - 1  # the native core's int arguments (n_ctx, max_nt, n_threads)
# Default rows per native forward (prompts are prefilled in chunks of it), as llama.cpp's n_ubatch
# on a GPU: one 512-row forward keeps the tensor cores busy (synthetic 1.5B shape on the H200:
# 26.7k tok/s in one 512-row forward, 12.6k in chunks of 64; docs/perf.md, session 10). The CPU
# gains nothing from wide chunks and would hold n_vocab floats of logits scratch a row.
DEFAULT_MAX_NT = {"cuda": 512, "cpu": 64}


def resolve_device(device: str) -> int:
    """'cpu' | 'cuda' | 'auto' -> native device id. Raises ValueError/RuntimeError."""
    if device == "auto":
        return _core.DEVICE_CUDA if _core.cuda_available() else _core.DEVICE_CPU
    if device == "cpu":
        return _core.DEVICE_CPU
    if device == "cuda":
        if not _core.cuda_available():
            raise RuntimeError("device cuda (--device cuda): no CUDA device is visible (or this build has no CUDA "
                               "backend)")
        return _core.DEVICE_CUDA
    raise ValueError(f"unknown device {device!r} (expected cpu, cuda or auto)")


class Model:
    """One GGUF model ready to run.

    Args:
        path: GGUF file.  device: 'auto' (CUDA when visible), 'cuda' or 'cpu'.
        n_ctx: KV cache positions (default min(4096, n_ctx_train); 0: n_ctx_train, the context the
        model was trained on, as llama.cpp's -c 0 and llama-cpp-python's n_ctx=0).  n_threads: CPU threads
        (0: all cores).  max_nt: most tokens per native forward (prefill is chunked to it; default
        DEFAULT_MAX_NT of the device, 512 on CUDA and 64 on the CPU; any value is capped at
        max(n_ctx, 16), as llama.cpp caps n_batch at n_ctx: no forward can be wider; scratch memory
        grows with it).
        n_layer: use only the first n_layer blocks (a truncated self-draft; tests and experiments).
    Raises:
        FileNotFoundError, GGUFError (bad file / arch / type / contradictory metadata), ValueError (n_ctx < 0,
        n_threads < 0, max_nt < 1, tokenizer ids outside the vocabulary), TypeError (n_ctx, n_threads or
        max_nt not an int: a bool or a float is refused too),
        RuntimeError (device), MemoryError.
    """

    def __init__(self, path: str | Path, *, device: str = "auto", n_ctx: int | None = None, n_threads: int = 0,
                 max_nt: int | None = None, n_layer: int | None = None):
        # settings first: a bad type is refused before the (slow) load
        for name, v, none_ok in (("n_ctx", n_ctx, True), ("n_threads", n_threads, False)):
            if (v is not None or not none_ok) and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise TypeError(f"{name} must be an int{' or None' if none_ok else ''}, got {type(v).__name__}")
        t0 = time.perf_counter()
        # forwards run so far (forward, submit, prefill): how a holder of cache bookkeeping (LLM's
        # prompt cache) sees that something else wrote this KV cache since it last did
        self.writes = 0
        self.gguf = GGUFModel(path)
        self.config = self.gguf.config
        if n_layer is not None:  # a truncated model (first n_layer blocks): a cheap self-draft for tests
            if not 1 <= n_layer <= self.config.n_layer:
                raise ValueError(f"n_layer must be in 1..{self.config.n_layer}")
            self.config = dataclasses.replace(self.config, n_layer=n_layer)
        self.tokenizer = Tokenizer.from_gguf(self.gguf.path)  # its errors name the file
        if n_ctx is None:
            n_ctx = min(4096, self.config.n_ctx_train)
        elif n_ctx == 0:  # llama.cpp's "0 = from the model"
            n_ctx = self.config.n_ctx_train
        # the native core takes C ints: past INT_MAX the conversion would raise OverflowError
        if not 1 <= n_ctx <= INT_MAX:
            raise ValueError(f"n_ctx must be in 0..{INT_MAX} (0: the trained context), got {n_ctx}")
        if not 0 <= n_threads <= INT_MAX:
            raise ValueError(f"n_threads must be in 0..{INT_MAX} (0: all cores), got {n_threads}")
        if max_nt is not None and (isinstance(max_nt, bool) or not isinstance(max_nt, (int, np.integer))):
            raise TypeError(f"max_nt must be an int or None, got {type(max_nt).__name__}")
        if max_nt is not None and not 1 <= max_nt <= INT_MAX:
            raise ValueError(f"max_nt must be in 1..{INT_MAX}, got {max_nt}")
        if n_ctx > self.config.n_ctx_train:  # as llama.cpp: allowed, but quality degrades past it
            log(f"pyminfer: warning: n_ctx {n_ctx} is larger than the {self.config.n_ctx_train} positions "
                f"{self.gguf.path.name} was trained on")
        self.n_ctx = n_ctx
        self.device_id = resolve_device(device)
        self.device = "cuda" if self.device_id == _core.DEVICE_CUDA else "cpu"
        # No wider than the context (a larger scratch would only waste memory), but >= 16: a
        # verify batch (<= 9 rows) must fit.
        max_nt = min(DEFAULT_MAX_NT[self.device] if max_nt is None else max_nt, max(n_ctx, 16))
        self.max_nt = int(max_nt)
        try:
            self.ctx = _core.Context(self.config.native(), self.gguf.native_tensors(self.config.n_layer), n_ctx, max_nt,
                                     n_threads, self.device_id, keepalive=self.gguf)
        except _core.NativeError as e:
            # The core's checks of the model (dimensions, tensor shapes and types) name no file;
            # a tuning variable's or the device's error is not the file's.
            msg = str(e)
            if e.code in (1, 2) and not msg.startswith("MI_"):  # MI_ERR_ARG, MI_ERR_TYPE (pyminfer.h)
                raise _core.NativeError(e.code, f"{self.gguf.path}: {msg}") from None
            raise
        self.load_time = time.perf_counter() - t0
        self._pend_rows = 0  # out rows of the submitted forward (submit / wait)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights this model runs (the first n_layer blocks when truncated)."""
        return self.gguf.weight_bytes_used(self.config.n_layer)

    @property
    def n_vocab(self) -> int:
        return self.config.n_vocab

    def close(self) -> None:
        """Free the KV cache and device memory now. Forwards after it raise RuntimeError."""
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()
            self.ctx = None

    def _live(self) -> Any:
        """The native context; RuntimeError naming the file once closed (a stream still open on a
        closed LLM ends there, not on None)."""
        if self.ctx is None:
            raise RuntimeError(f"model {self.gguf.path.name} is closed")
        return self.ctx

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_span(self, n: int, start: int) -> None:
        if start < 0 or start + n > self.n_ctx:
            raise ContextFull(f"positions {start}..{start + n - 1} exceed the context size n_ctx={self.n_ctx}")

    def forward(self, tokens: Sequence[int], start: int, out_rows: Sequence[int], *,
                logits: bool = True) -> np.ndarray:
        """Evaluate ``tokens`` at positions start.. (one batch, len <= max_nt).

        Returns f32 logits [len(out_rows), n_vocab] when ``logits`` else int32 argmax [len(out_rows)].
        Raises ContextFull past n_ctx, ValueError for a batch over max_nt, NaNLogitsError (argmax
        only: logits are the sampler's to check) where a row's logits held a NaN.
        """
        n = len(tokens)
        if n > self.max_nt:
            raise ValueError(f"batch of {n} tokens exceeds max_nt={self.max_nt}")
        self._check_span(n, start)
        tk = np.asarray(tokens, dtype=np.int32)
        pos = np.arange(start, start + n, dtype=np.int32)
        rows = np.asarray(out_rows, dtype=np.int32)
        self.writes += 1
        if logits:
            out = np.empty((len(rows), self.n_vocab), np.float32)
            self._live().forward(tk, pos, rows, out, None)
            return out
        am = np.empty(len(rows), np.int32)
        self._live().forward(tk, pos, rows, None, am)
        return self._checked(am)

    def submit(self, tokens: Sequence[int], start: int, out_rows: Sequence[int]) -> None:
        """Start the forward ``forward(tokens, start, out_rows, logits=False)`` would run and return
        without waiting (CUDA: on this model's own stream, so another model's forwards overlap it;
        CPU: computed now). Collect it with ``wait``; ``ready`` polls. One forward in flight.
        Raises ContextFull past n_ctx, ValueError for a batch over max_nt, NativeError when a
        submitted forward has not been waited for.
        """
        n = len(tokens)
        if n > self.max_nt:
            raise ValueError(f"batch of {n} tokens exceeds max_nt={self.max_nt}")
        self._check_span(n, start)
        self.writes += 1
        self._live().forward_submit(np.asarray(tokens, dtype=np.int32), np.arange(start, start + n, dtype=np.int32),
                                np.asarray(out_rows, dtype=np.int32))
        self._pend_rows = len(out_rows)  # only once submitted: a refused submit leaves the pending one

    def ready(self) -> bool:
        """Whether the submitted forward has finished (never blocks)."""
        return bool(self._live().forward_ready())

    def wait(self) -> np.ndarray:
        """Wait for the submitted forward; its int32 argmax ids [len(out_rows)]. NaNLogitsError as
        ``forward``."""
        am = np.empty(self._pend_rows, np.int32)
        self._live().forward_wait(am)
        return self._checked(am)

    def _checked(self, argmax: np.ndarray) -> np.ndarray:
        """The native argmax ids, or NaNLogitsError naming this model's file where a row's logits held
        a NaN (its id is -1): with a draft model, which of the two files is bad."""
        if min(argmax.tolist(), default=0) < 0:  # a Python min: ~0.3 us for <= 9 rows, not numpy's ~2 us
            raise self.nan_error()
        return argmax

    def nan_error(self) -> NaNLogitsError:
        """The NaNLogitsError naming this model's file; for a file of the model cache its advice says
        how to fetch it again (a cached file is checked by size only when reused, not by hash)."""
        from .models import cache_path

        path = self.gguf.path
        advice = ""
        try:
            if path.resolve().parent == cache_path().resolve():
                advice = f"{path.resolve()} is a cached download: delete it to fetch it again"
        except OSError:  # an unresolvable path: no advice
            pass
        return NaNLogitsError(f"{path.name}: {NaNLogitsError.MESSAGE}", advice)

    def prefill(self, tokens: Sequence[int], start: int, *, logits: bool = True) -> np.ndarray:
        """Evaluate a prompt in chunks of max_nt; returns the last token's logits [n_vocab] (or its
        argmax as a 1-element array)."""
        if not tokens:
            raise ValueError("nothing to evaluate")
        self._check_span(len(tokens), start)
        out = None
        for i in range(0, len(tokens), self.max_nt):
            chunk = tokens[i:i + self.max_nt]
            last = i + self.max_nt >= len(tokens)
            out = self.forward(chunk, start + i, [len(chunk) - 1] if last else [], logits=logits)
        assert out is not None
        return out[0] if logits else out


class ContextFull(ValueError):
    """The tokens would not fit in the KV cache (n_ctx)."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
