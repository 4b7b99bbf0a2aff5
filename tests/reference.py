"""Plain f32 numpy forward pass of the ``qwen2`` and ``llama`` GGUF architectures: the test oracle.

Every weight is dequantized to f32 with ``gguf.quants.dequantize`` (lazily, cached per tensor).
Activations and the KV cache are f32, attention is an exact softmax. Rope is NEOX (rotate halves)
for qwen2 and NORM (rotate adjacent pairs) for llama. llama.cpp's converter already permuted the
llama Q/K weights so that NORM rope on adjacent pairs is right as stored: nothing is un-permuted.

    ref = ReferenceModel(path)            # n_layers=k runs only the first k blocks (quick tests)
    logits = ref.forward(ids)             # [len(ids), n_vocab], causal, positions 0..len-1
    out = ref.greedy(prompt_ids, n)       # n new ids, decoded one at a time with a KV cache
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

SUPPORTED_ARCHS = ("qwen2", "llama")


class ReferenceModel:
    def __init__(self, gguf_path: str | Path, n_layers: int | None = None):
        self.reader = GGUFReader(str(gguf_path))
        self.arch = self._field("general.architecture")
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(f"unsupported architecture {self.arch!r} (want one of {SUPPORTED_ARCHS})")
        a = self.arch
        self.n_layers_total = int(self._field(f"{a}.block_count"))
        self.n_layers = self.n_layers_total if n_layers is None else min(int(n_layers), self.n_layers_total)
        self.n_embd = int(self._field(f"{a}.embedding_length"))
        self.n_ff = int(self._field(f"{a}.feed_forward_length"))
        self.n_head = int(self._field(f"{a}.attention.head_count"))
        self.n_head_kv = int(self._field(f"{a}.attention.head_count_kv"))
        self.head_dim = int(self._field(f"{a}.attention.key_length", self.n_embd // self.n_head))
        self.rope_base = float(self._field(f"{a}.rope.freq_base", 10000.0))
        self.eps = float(self._field(f"{a}.attention.layer_norm_rms_epsilon"))
        self.neox = self.arch == "qwen2"
        self.eos_id = int(self._field("tokenizer.ggml.eos_token_id", -1))

        self._tensors = {t.name: t for t in self.reader.tensors}
        self._cache: dict[str, np.ndarray] = {}
        self.lm_head_name = "output.weight" if "output.weight" in self._tensors else "token_embd.weight"
        self.n_vocab = int(self._tensors["token_embd.weight"].shape[1])  # GGUF ne = [n_embd, n_vocab]

        # rope inverse frequencies, one per rotated pair: base^(-2i/d)
        d = self.head_dim
        self._inv_freq = (1.0 / self.rope_base ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float64)

        self._kv: list[tuple[np.ndarray, np.ndarray]] = []  # per layer, [n_kv, T, d] each
        self._pos = 0

    # ---------------------------------------------------------------- GGUF access

    def _field(self, key: str, default=None):
        f = self.reader.get_field(key)
        if f is None:
            if default is None:
                raise KeyError(key)
            return default
        v = f.contents()
        return v

    def has(self, name: str) -> bool:
        return name in self._tensors

    def w(self, name: str) -> np.ndarray:
        """The tensor as f32 numpy, shape reversed from GGUF ne: a matrix is [rows=out, cols=in]."""
        arr = self._cache.get(name)
        if arr is None:
            t = self._tensors[name]
            arr = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            arr = arr.reshape(tuple(int(x) for x in reversed(t.shape)))
            self._cache[name] = arr
        return arr

    # ---------------------------------------------------------------- building blocks

    def _rmsnorm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return (x / np.sqrt(ms + self.eps)) * weight

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        y = x @ self.w(name + ".weight").T
        if self.has(name + ".bias"):
            y = y + self.w(name + ".bias")
        return y

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x: [n_heads, T, d]; rotate by angle pos * inv_freq[i] per pair."""
        ang = positions.astype(np.float64)[:, None] * self._inv_freq[None, :]  # [T, d/2]
        cos = np.cos(ang).astype(np.float32)
        sin = np.sin(ang).astype(np.float32)
        if self.neox:  # pairs (i, i + d/2)
            half = self.head_dim // 2
            x0, x1 = x[..., :half], x[..., half:]
            return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
        # NORM: pairs (2i, 2i+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def _attention(self, layer: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x: [T, n_embd] normed input for new tokens at `positions`; appends to the KV cache."""
        p = f"blk.{layer}.attn_"
        T, d = x.shape[0], self.head_dim
        q = self._linear(x, p + "q").reshape(T, self.n_head, d).transpose(1, 0, 2)
        k = self._linear(x, p + "k").reshape(T, self.n_head_kv, d).transpose(1, 0, 2)
        v = self._linear(x, p + "v").reshape(T, self.n_head_kv, d).transpose(1, 0, 2)
        q = self._rope(q, positions)
        k = self._rope(k, positions)

        k_past, v_past = self._kv[layer]
        k_all = np.concatenate([k_past, k], axis=1)  # [n_kv, S, d]
        v_all = np.concatenate([v_past, v], axis=1)
        self._kv[layer] = (k_all, v_all)
        S = k_all.shape[1]

        group = self.n_head // self.n_head_kv  # GQA: query head h uses kv head h // group
        k_rep = np.repeat(k_all, group, axis=0)  # [n_head, S, d]
        v_rep = np.repeat(v_all, group, axis=0)
        scores = (q @ k_rep.transpose(0, 2, 1)) / np.float32(np.sqrt(d))  # [n_head, T, S]
        key_pos = np.arange(S)
        mask = key_pos[None, :] > positions[:, None]  # causal: key position must be <= query position
        scores = np.where(mask[None], np.float32(-np.inf), scores)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = (probs @ v_rep).transpose(1, 0, 2).reshape(T, self.n_head * d)
        return self._linear(out, p + "output")

    def _ffn(self, layer: int, x: np.ndarray) -> np.ndarray:
        p = f"blk.{layer}.ffn_"
        gate = self._linear(x, p + "gate")
        up = self._linear(x, p + "up")
        silu = gate / (1.0 + np.exp(-gate))
        return self._linear(silu * up, p + "down")

    # ---------------------------------------------------------------- public API

    def reset(self) -> None:
        empty = np.zeros((self.n_head_kv, 0, self.head_dim), dtype=np.float32)
        self._kv = [(empty, empty) for _ in range(self.n_layers)]
        self._pos = 0

    def _step(self, token_ids: list[int]) -> np.ndarray:
        """Run new tokens after whatever is in the KV cache; return their logits [T, n_vocab]."""
        ids = np.asarray(token_ids, dtype=np.int64)
        positions = np.arange(self._pos, self._pos + len(ids))
        x = self.w("token_embd.weight")[ids].astype(np.float32)  # [T, n_embd]
        for i in range(self.n_layers):
            x = x + self._attention(i, self._rmsnorm(x, self.w(f"blk.{i}.attn_norm.weight")), positions)
            x = x + self._ffn(i, self._rmsnorm(x, self.w(f"blk.{i}.ffn_norm.weight")))
        self._pos += len(ids)
        x = self._rmsnorm(x, self.w("output_norm.weight"))
        return (x @ self.w(self.lm_head_name).T).astype(np.float32)

    def forward(self, token_ids: list[int]) -> np.ndarray:
        """Full causal forward from position 0: logits [len(token_ids), n_vocab] (f32)."""
        self.reset()
        return self._step(list(token_ids))

    def greedy(self, prompt_ids: list[int], n: int, stop_at_eos: bool = True) -> list[int]:
        """Greedy decoding: prefill the prompt, then up to n tokens one at a time with the KV cache.

        With stop_at_eos (default), generation ends after the GGUF's eos id, which is kept as the last
        id: the golden files' convention.
        """
        self.reset()
        logits = self._step(list(prompt_ids))[-1]
        out: list[int] = []
        for _ in range(n):
            tok = int(np.argmax(logits))
            out.append(tok)
            if len(out) == n or (stop_at_eos and tok == self.eos_id):
                break
            logits = self._step([tok])[0]
        return out
