"""Synthetic GGUF models: random, finite weights in the exact shapes and Q4_K_M quant mix of
Qwen2.5 1.5B / 7B / 14B, with a real tokenizer, so 7B/14B timings can be taken where those files
cannot be carried (``pyminfer synth``; the GPU machine has no network and takes 64 MiB a call).

Weights are random *valid* quantized bytes: every field random except the f16 scales, drawn so a
row's rms is near gain / sqrt(n_cols), which keeps activations finite through every layer (the
gains are those of the synthetic benchmark, bench/bench_gpu.py). Block layouts: GGML's
(ggml-common.h; sizes in gguf_model.BLOCK); where the f16 scale sits in each block is in ``TYPES``.

Quant mix (llama.cpp's Q4_K_M, llama-quant.cpp): Q4_K everywhere (token_embd included), Q6_K for
output.weight and, on half of the layers, attn_v and ffn_down. At 28 layers (1.5B, 7B) the Q6_K
layers are the real 1.5B file's; at other depths (14B; fewer layers for tests) the classic rule
"more bits" (first and last eighth of the layers, every third one between), also half of them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .gguf_model import BLOCK

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14

# Quantized type -> (byte offsets of its f16 scale fields in a block, rms of the integer factor
# multiplying d when every other field is random bytes); block sizes come from gguf_model.BLOCK.
TYPES = {
    Q4_0: ((0,), 4.6),
    Q4_1: ((0, 2), 8.8),
    Q5_0: ((0,), 9.2),
    Q5_1: ((0, 2), 18.0),
    Q8_0: ((0,), 74.0),
    Q4_K: ((0, 2), 300.0),
    Q5_K: ((0, 2), 600.0),
    Q6_K: ((208,), 1300.0),
}

# Qwen2.5 shapes (config.json of each model; 7B/14B pad the vocabulary to 152,064 rows).
SHAPES = {
    "0.5b": dict(n_layer=24, n_embd=896, n_ff=4864, n_head=14, n_head_kv=2, head_dim=64, n_vocab=151936),
    "1.5b": dict(n_layer=28, n_embd=1536, n_ff=8960, n_head=12, n_head_kv=2, head_dim=128, n_vocab=151936),
    "7b": dict(n_layer=28, n_embd=3584, n_ff=18944, n_head=28, n_head_kv=4, head_dim=128, n_vocab=152064),
    "14b": dict(n_layer=48, n_embd=5120, n_ff=13824, n_head=40, n_head_kv=8, head_dim=128, n_vocab=152064),
}
# Layers whose attn_v and ffn_down are Q6_K in the real Qwen2.5-Coder-1.5B-Instruct Q4_K_M file.
_Q6K_LAYERS_1_5B = (0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27)
# Shapes `pyminfer synth` writes (the 0.5B's real file is carried, and its mix is not Q4_K_M's).
GGUF_SHAPES = ("1.5b", "7b", "14b")


def row_bytes(typ: int, n_cols: int) -> int:
    """Bytes of one row of n_cols elements of ``typ`` (n_cols a multiple of its block; GGML block
    sizes, gguf_model.BLOCK). KeyError for a type the core does not support."""
    be, bb = BLOCK[typ]
    return n_cols // be * bb


def random_weights(rng: np.random.Generator, typ: int, n_rows: int, n_cols: int, gain: float = 1.0) -> np.ndarray:
    """Random valid bytes of a [n_rows, n_cols] tensor of ``typ`` (uint8 [n_rows * row_bytes], C order),
    each row's rms near gain / sqrt(n_cols)."""
    target = gain / np.sqrt(n_cols)
    if typ in (F32, F16):
        w = (rng.standard_normal(n_rows * n_cols) * target).astype(np.float32 if typ == F32 else np.float16)
        return w.view(np.uint8)
    be, bb = BLOCK[typ]
    f16_offs, mag = TYPES[typ]
    nb = n_rows * n_cols // be
    raw = np.frombuffer(rng.bytes(nb * bb), dtype=np.uint8).reshape(nb, bb).copy()
    for off in f16_offs:
        d = (rng.uniform(0.5, 1.5, nb) * target / mag).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def q4_k_m_more_bits(n_layer: int) -> list[bool]:
    """Per layer: whether attn_v and ffn_down get Q6_K in the Q4_K_M mix (see the module docstring)."""
    if n_layer == SHAPES["1.5b"]["n_layer"]:
        return [i in _Q6K_LAYERS_1_5B for i in range(n_layer)]
    e = n_layer // 8
    return [i < e or i >= 7 * n_layer // 8 or (i - e) % 3 == 2 for i in range(n_layer)]


def tensor_plan(shape: dict[str, int]) -> list[tuple[str, int, int, int, float]]:
    """The tensors of a qwen2 model of ``shape`` in file order: (name, ggml type, n_rows, n_cols,
    gain); norms and biases are F32 vectors (n_rows 1)."""
    E, F, V = shape["n_embd"], shape["n_ff"], shape["n_vocab"]
    QD, KD = shape["n_head"] * shape["head_dim"], shape["n_head_kv"] * shape["head_dim"]
    plan = [("token_embd.weight", Q4_K, V, E, float(np.sqrt(E)))]
    for i, more in enumerate(q4_k_m_more_bits(shape["n_layer"])):
        b, hi = f"blk.{i}.", Q6_K if more else Q4_K
        plan += [
            (b + "attn_norm.weight", F32, 1, E, 0.0),
            (b + "attn_q.weight", Q4_K, QD, E, 4.0), (b + "attn_q.bias", F32, 1, QD, 0.5),
            (b + "attn_k.weight", Q4_K, KD, E, 4.0), (b + "attn_k.bias", F32, 1, KD, 0.5),
            (b + "attn_v.weight", hi, KD, E, 1.0), (b + "attn_v.bias", F32, 1, KD, 0.1),
            (b + "attn_output.weight", Q4_K, E, QD, 0.5),
            (b + "ffn_norm.weight", F32, 1, E, 0.0),
            (b + "ffn_gate.weight", Q4_K, F, E, 2.0), (b + "ffn_up.weight", Q4_K, F, E, 1.0),
            (b + "ffn_down.weight", hi, E, F, 0.5),
        ]
    plan += [("output_norm.weight", F32, 1, E, 0.0), ("output.weight", Q6_K, V, E, 2.0)]
    return plan


def _data(rng: np.random.Generator, name: str, typ: int, n_rows: int, n_cols: int, gain: float) -> np.ndarray:
    if typ != F32 or n_rows != 1:
        return random_weights(rng, typ, n_rows, n_cols, gain)
    if name.endswith("norm.weight"):  # RMSNorm weights near 1
        return (1.0 + 0.1 * rng.standard_normal(n_cols)).astype(np.float32)
    return (gain * rng.standard_normal(n_cols)).astype(np.float32)  # biases


def write_synthetic_gguf(path: str | os.PathLike[str], shape: str | dict[str, int], tokenizer_from: str | os.PathLike[str],
                         *, seed: int = 0, n_layer: int | None = None,
                         progress: Callable[[int, int], None] | None = None) -> int:
    """Write a qwen2 GGUF with random weights: ``shape`` a name of GGUF_SHAPES ("1.5b", "7b", "14b")
    or a dict with the keys of SHAPES' entries (tests: small dims; n_embd and n_ff multiples of 256).

    The tokenizer metadata (``tokenizer.*``) is copied from the GGUF ``tokenizer_from``, a Qwen2
    vocabulary (``tokenizer.ggml.pre`` "qwen2": all Qwen2.5 sizes share it); its token list is
    padded with ``[PAD<i>]`` tokens (type UNUSED, as llama.cpp's converter pads Qwen2.5-7B/14B) up
    to the shape's n_vocab. ``n_layer``: fewer layers than the shape's (tests).
    ``progress(done_bytes, total_bytes)`` is called after each tensor. The file is written under a
    temporary name beside ``path`` and renamed into place when complete, so an interrupted run
    leaves no truncated model (and an existing ``path`` intact). Returns the bytes of tensor data
    written; tensors are generated and written one at a time, so memory peaks near twice the
    largest tensor, the LM head (measured: 0.97 GB for the 7B, whose 4.68 GB file takes ~20 s on
    the project's 2-core machine).
    Raises ValueError for an unknown shape, a bad n_layer, a negative seed, ``path`` naming the
    tokenizer source, or a tokenizer_from that is not a Qwen2 byte-level BPE vocabulary or has more
    tokens than the shape's n_vocab; FileNotFoundError for a missing tokenizer_from or output
    directory; OSError when the file cannot be written.
    """
    import gguf

    from .tokenizer import read_gguf_tokenizer_metadata

    if isinstance(shape, str):
        if shape not in GGUF_SHAPES:
            raise ValueError(f"unknown shape {shape!r} (known: {', '.join(GGUF_SHAPES)})")
        label, shape = f"qwen2.5-{shape}", dict(SHAPES[shape])
    else:
        missing = set(SHAPES["1.5b"]) - set(shape)
        if missing or shape["n_embd"] % 256 or shape["n_ff"] % 256:
            raise ValueError(f"shape needs the keys {sorted(SHAPES['1.5b'])} with n_embd and n_ff multiples of 256")
        label, shape = "custom", dict(shape)
    if n_layer is not None:
        if not 1 <= n_layer <= shape["n_layer"]:
            raise ValueError(f"n_layer must be in 1..{shape['n_layer']}")
        shape["n_layer"] = n_layer
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    src, out = Path(tokenizer_from), Path(path)
    if not src.is_file():
        raise FileNotFoundError(f"tokenizer source not found (or not a file): {src}")
    if out.exists() and not out.is_file():  # a directory, a device: never replaced by the rename below
        raise ValueError(f"{out} exists and is not a regular file")
    if not out.parent.is_dir():  # said here, not as the missing staging file <out>.partial
        raise FileNotFoundError(f"output directory not found: {out.parent}")
    if out.is_symlink():
        out = out.resolve()  # replace the file it points to, not the link
    if out.exists() and out.resolve() == src.resolve():
        raise ValueError(f"{out}: the output would overwrite the tokenizer source")
    meta = read_gguf_tokenizer_metadata(src)
    if meta.get("tokenizer.ggml.model") != "gpt2" or meta.get("tokenizer.ggml.pre") != "qwen2" \
            or "tokenizer.ggml.tokens" not in meta:
        raise ValueError(f"{src}: not a Qwen2 vocabulary (tokenizer.ggml.model 'gpt2' and pre 'qwen2' with a "
                         f"token list are needed; found {meta.get('tokenizer.ggml.model')!r} / "
                         f"{meta.get('tokenizer.ggml.pre')!r})")
    tokens = list(meta["tokenizer.ggml.tokens"])
    V = shape["n_vocab"]
    if len(tokens) > V:
        raise ValueError(f"{tokenizer_from}: {len(tokens)} tokens, more than the shape's n_vocab {V}")
    types = [int(x) for x in meta.get("tokenizer.ggml.token_type", [1] * len(tokens))]
    pad = V - len(tokens)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), V)]
    types += [int(gguf.TokenType.UNUSED)] * pad

    tmp = out.with_name(out.name + ".partial")
    try:
        n = _write(tmp, gguf, shape, label, seed, tokens, types, meta, progress)
        os.replace(tmp, out)
    except BaseException:  # KeyboardInterrupt too: never leave a truncated model behind
        tmp.unlink(missing_ok=True)
        raise
    return n


def _write(path: Path, gguf: Any, shape: dict[str, int], label: str, seed: int, tokens: list[str], types: list[int],
           meta: dict[str, Any], progress: Callable[[int, int], None] | None) -> int:
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_name(f"pyminfer synthetic {label} Q4_K_M (random weights, seed {seed})")
    w.add_block_count(shape["n_layer"])
    w.add_context_length(32768)
    w.add_embedding_length(shape["n_embd"])
    w.add_feed_forward_length(shape["n_ff"])
    w.add_head_count(shape["n_head"])
    w.add_head_count_kv(shape["n_head_kv"])
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if "tokenizer.ggml.merges" in meta:
        w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    for key, add in (("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
                     ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
                     ("tokenizer.ggml.padding_token_id", w.add_pad_token_id)):
        if key in meta:
            add(int(meta[key]))
    if "tokenizer.ggml.add_bos_token" in meta:
        w.add_add_bos_token(bool(meta["tokenizer.ggml.add_bos_token"]))
    if meta.get("tokenizer.chat_template"):
        w.add_chat_template(str(meta["tokenizer.chat_template"]))

    plan = tensor_plan(shape)
    for name, typ, n_rows, n_cols, _ in plan:
        nbytes = n_rows * row_bytes(typ, n_cols)
        if typ == F32:
            w.add_tensor_info(name, (n_cols,), np.dtype(np.float32), nbytes)
        else:
            w.add_tensor_info(name, (n_rows, row_bytes(typ, n_cols)), np.dtype(np.uint8), nbytes,
                              raw_dtype=gguf.GGMLQuantizationType(typ))
    total = sum(n_rows * row_bytes(typ, n_cols) for _, typ, n_rows, n_cols, _ in plan)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    done = 0
    for name, typ, n_rows, n_cols, gain in plan:
        a = _data(rng, name, typ, n_rows, n_cols, gain)
        w.write_tensor_data(a)
        done += a.nbytes
        if progress:
            progress(done, total)
    w.close()
    return done
