"""Open a GGUF file (mmap, zero copy), validate it, and map its keys to a model config.

Format: the GGUF spec (github.com/ggml-org/ggml, docs/gguf.md). The header is read by
``pyminfer.gguf_file`` (0.4 s for a Qwen2.5 file where the `gguf` package's ``GGUFReader`` takes
~12 s; metadata it leaves aside, nested arrays, goes to ``GGUFReader``); the file is mapped
with numpy.memmap: tensor data are views into the mapping, never copied or dequantized at load.
Architectures: ``qwen2`` and ``llama``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import gguf_file
from .gguf_file import TensorInfo

# ggml type ids the native core supports (mi_quants.h), with their names
SUPPORTED_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
}
BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
         12: (256, 144), 13: (256, 176), 14: (256, 210)}  # type -> (elements, bytes) per block
SUPPORTED_ARCHS = ("qwen2", "llama")
ROPE_NORM, ROPE_NEOX = 0, 2


class GGUFError(ValueError):
    """The file is not a usable GGUF model: corrupt, truncated, or of an unsupported kind."""

    @classmethod
    def unreadable(cls, path: str | os.PathLike[str], e: BaseException) -> "GGUFError":
        """The error for a file whose bytes a GGUF reader could not parse (``e``: what the reader
        raised: struct.error for a truncated field, ValueError / IndexError / OverflowError for
        corrupt ones), one message for every reader (the model load, the tokenizer's)."""
        if isinstance(e, ValueError) and not isinstance(e, UnicodeError):  # the parsers' own, worded messages
            return cls(f"{os.fspath(path)}: not a valid GGUF file ({e})")
        kind = "truncated or corrupt" if isinstance(e, struct.error) else type(e).__name__
        return cls(f"{os.fspath(path)}: not a valid GGUF file ({kind}: {e})")


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer, from the GGUF's ``{arch}.*`` keys."""

    arch: str
    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    rope_type: int  # ROPE_NORM (llama: adjacent pairs) or ROPE_NEOX (qwen2: halves)
    rope_freq_base: float
    rms_eps: float
    n_ctx_train: int
    tied_embeddings: bool
    qkv_bias: bool

    def native(self) -> dict[str, Any]:
        """The dict ``pyminfer._core.Context`` takes."""
        return {k: getattr(self, k) for k in (
            "n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "head_dim", "n_vocab", "rope_type",
            "rope_freq_base", "rms_eps")}


def _ggml_type_name(typ: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(typ).name
    except ValueError:
        return "unknown"  # "has unsupported type unknown (ggml type 99)"


def _read_header(path: Path) -> tuple[dict[str, Any], list[TensorInfo], np.ndarray]:
    """Metadata (all but ``tokenizer.*``, which the tokenizer reads itself), tensor table and the
    file mapped read-only (uint8) of the GGUF file at ``path``. Raises GGUFError naming the file."""
    try:
        h = gguf_file.parse(path, skip=("tokenizer.",))
        if h is not None:
            return h.kv, h.tensors, np.memmap(path, dtype=np.uint8, mode="r")
    except (ValueError, OverflowError, struct.error) as e:  # bad bytes, as the parser words them
        raise GGUFError.unreadable(path, e) from e
    from gguf import GGUFReader  # nested metadata arrays: the library's reader

    try:
        r = GGUFReader(path, "r")
        meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith(("GGUF.", "tokenizer."))}
        infos = [TensorInfo(t.name, tuple(int(x) for x in t.shape), int(t.tensor_type), int(t.data_offset))
                 for t in r.tensors]
    except Exception as e:  # that reader raises ValueError / IndexError / struct errors on bad bytes
        raise GGUFError.unreadable(path, e) from e
    return meta, infos, r.data


class GGUFModel:
    """A GGUF model file opened for inference.

    Attributes:
        path: the file.  meta: its metadata (key -> value, ``tokenizer.*`` left out).  data: the file
        mapped read-only (numpy uint8 memmap; kept alive here, the tensor addresses point into it).
        config: ModelConfig.  tensors: name -> (address, ggml type, n_cols, n_rows) for the
        native core, addresses pointing into the mmap.  weight_bytes: bytes of all tensors.
    Raises (from ``open``):
        FileNotFoundError; GGUFError naming the file (and tensor/type/key) for a corrupt or truncated
        file, an unsupported architecture or tensor type, or missing or invalid hyper-parameters
        (a context_length < 1 or absent, as llama.cpp requires it; zero dimensions).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"model file not found: {self.path}")
        if self.path.is_dir():
            raise GGUFError(f"{self.path}: is a directory, not a GGUF file")
        self.meta, infos, self.data = _read_header(self.path)
        arch = self.meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise GGUFError(f"{self.path}: unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
        self.tensors: dict[str, tuple[int, int, int, int]] = {}
        self.weight_bytes = 0
        file_size = self.data.size
        base = int(self.data.ctypes.data)
        # the GGUF spec aligns the data section and every tensor in it to general.alignment (the
        # header readers check it is a power of two); a kernel may rely on it
        align = self.meta.get("general.alignment", 32)
        if isinstance(align, bool) or not isinstance(align, (int, np.integer)) or align <= 0 or align & (align - 1):
            raise GGUFError(f"{self.path}: general.alignment {align!r} is not a power of two: the file is corrupt")
        for t in infos:
            if t.offset % align:  # it loaded and failed at generation time as "NaN logits"
                raise GGUFError(f"{self.path}: tensor {t.name!r} starts at byte {t.offset}, not a multiple of "
                                f"general.alignment {align}: the file is corrupt")
            if t.type not in SUPPORTED_TYPES:
                raise GGUFError(f"{self.path}: tensor {t.name!r} has unsupported type {_ggml_type_name(t.type)} "
                                f"(ggml type {t.type}); supported: {', '.join(SUPPORTED_TYPES.values())}")
            n_cols = t.dims[0]  # GGUF ne order: ne0 (columns) first
            n_rows = int(np.prod(t.dims[1:])) if len(t.dims) > 1 else 1
            be, bb = BLOCK[t.type]
            if n_cols <= 0 or n_rows <= 0 or n_cols % be:
                raise GGUFError(f"{self.path}: tensor {t.name!r}: shape {list(t.dims)} is not whole "
                                f"{SUPPORTED_TYPES[t.type]} blocks of {be} columns")
            need = n_rows * (n_cols // be) * bb
            if t.offset + need > file_size:
                raise GGUFError(f"{self.path}: tensor {t.name!r} is truncated: its {need} bytes at offset {t.offset} "
                                f"end past the end of the file ({file_size} bytes): the file is incomplete or corrupt")
            self.tensors[t.name] = (base + t.offset, t.type, n_cols, n_rows)
            self.weight_bytes += need
        self.config = self._config(arch)

    def _config(self, arch: str) -> ModelConfig:
        r = self.meta
        p = f"{arch}."

        def req(key: str) -> Any:
            v = r.get(p + key)
            if v is None:
                raise GGUFError(f"{self.path}: missing metadata key {p + key}")
            return v

        def dim(key: str, default: int | None = None) -> int:
            """An integer hyper-parameter (llama.cpp reads them as uint32): 1..2**31 - 1 here (the
            native core's int32), else a GGUFError naming the key: a corrupt or mis-converted file
            (0xff..ff once reached the core and failed as an OverflowError)."""
            v = req(key) if default is None else r.get(p + key, default)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise GGUFError(f"{self.path}: metadata key {p + key} is {v!r}: an integer was expected "
                                "(corrupt or mis-converted file)")
            if not 1 <= int(v) <= 2**31 - 1:
                raise GGUFError(f"{self.path}: invalid model dimensions ({p}{key} {int(v)}; must be 1..{2**31 - 1}: "
                                "corrupt or mis-converted file)")
            return int(v)

        def real(key: str, default: float | None = None) -> float:
            v = req(key) if default is None else r.get(p + key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v):
                raise GGUFError(f"{self.path}: metadata key {p + key} is {v!r}: a finite number was expected "
                                "(corrupt or mis-converted file)")
            return float(v)

        n_head = dim("attention.head_count")
        n_embd = dim("embedding_length")
        n_layer, n_ff = dim("block_count"), dim("feed_forward_length")
        n_head_kv = dim("attention.head_count_kv", n_head)
        if n_head % n_head_kv:
            raise GGUFError(f"{self.path}: invalid model dimensions ({p}block_count {n_layer}, "
                            f"{p}feed_forward_length {n_ff}, {p}attention.head_count_kv {n_head_kv} for "
                            f"{n_head} heads)")
        # required, as in llama.cpp: the default n_ctx is min(4096, this), and 0 would make it 0
        n_ctx_train = dim("context_length")
        head_dim = dim("attention.key_length", max(1, n_embd // n_head))
        if "token_embd.weight" not in self.tensors:
            raise GGUFError(f"{self.path}: missing tensor token_embd.weight")
        n_vocab = self.tensors["token_embd.weight"][3]
        # Metadata the tensors contradict is a corrupt or mis-converted file, not something to guess past.
        vs = r.get(p + "vocab_size")  # fewer than the rows is padding (allowed); more has no embedding
        if vs is not None and int(vs) > n_vocab:
            raise GGUFError(f"{self.path}: {p}vocab_size {int(vs)} exceeds token_embd.weight's {n_vocab} rows")
        rd = r.get(p + "rope.dimension_count")
        if rd is not None and int(rd) != head_dim:
            raise GGUFError(f"{self.path}: {p}rope.dimension_count {int(rd)} != head_dim {head_dim}: partial "
                            "rotary embeddings are not supported")
        tied = "output.weight" not in self.tensors
        return ModelConfig(
            arch=arch,
            name=str(r.get("general.name", self.path.stem)),
            n_layer=n_layer,
            n_embd=n_embd,
            n_ff=n_ff,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_vocab=n_vocab,
            rope_type=ROPE_NEOX if arch == "qwen2" else ROPE_NORM,
            rope_freq_base=real("rope.freq_base", 10000.0),
            rms_eps=real("attention.layer_norm_rms_epsilon"),
            n_ctx_train=n_ctx_train,
            tied_embeddings=tied,
            qkv_bias="blk.0.attn_q.bias" in self.tensors,
        )

    def native_tensors(self, n_layer: int | None = None) -> dict[str, Any]:
        """The tensor dict ``pyminfer._core.Context`` takes (see its docstring); the first
        ``n_layer`` blocks only when given."""
        t = self.tensors

        def need(name: str) -> tuple[int, int, int, int]:
            if name not in t:
                raise GGUFError(f"{self.path}: missing tensor {name}")
            return t[name]

        layers = []
        for i in range(self.config.n_layer if n_layer is None else n_layer):
            b = f"blk.{i}."
            layers.append({
                "attn_norm": need(b + "attn_norm.weight"), "wq": need(b + "attn_q.weight"),
                "wk": need(b + "attn_k.weight"), "wv": need(b + "attn_v.weight"),
                "bq": t.get(b + "attn_q.bias"), "bk": t.get(b + "attn_k.bias"), "bv": t.get(b + "attn_v.bias"),
                "wo": need(b + "attn_output.weight"), "ffn_norm": need(b + "ffn_norm.weight"),
                "ffn_gate": need(b + "ffn_gate.weight"), "ffn_up": need(b + "ffn_up.weight"),
                "ffn_down": need(b + "ffn_down.weight"),
            })
        return {
            "tok_embd": need("token_embd.weight"),
            "output_norm": need("output_norm.weight"),
            "output": t.get("output.weight") or need("token_embd.weight"),
            "layers": layers,
        }

    def weight_bytes_used(self, n_layer: int | None = None) -> int:
        """Bytes of the tensors a model of the first ``n_layer`` blocks (default: all) uses."""
        if n_layer is None or n_layer >= self.config.n_layer:
            return self.weight_bytes
        total = 0
        for name, (_, typ, c, r) in self.tensors.items():
            if name.startswith("blk.") and int(name.split(".")[1]) >= n_layer:
                continue
            be, bb = BLOCK[typ]
            total += r * (c // be) * bb
        return total

    @property
    def file_type(self) -> str:
        """The file's quantization as llama.cpp names it, e.g. 'Q4_K_M': ``general.file_type``, a
        ``llama_ftype`` (gguf's ``LlamaFileType``), not a ggml tensor type: a Q4_K_M file mixes
        Q4_K/Q6_K (and Q5_0/Q8_0 where rows are not 256-wide), so no tensor type names it. Without
        the key (or with a value gguf does not know), the dominant tensor type by bytes."""
        from gguf import LlamaFileType

        ft = self.meta.get("general.file_type")
        if isinstance(ft, (int, np.integer)):
            try:
                # llama.cpp ORs LLAMA_FTYPE_GUESSED (1024) into a type it inferred from the tensors
                name = LlamaFileType(int(ft) & ~int(LlamaFileType.GUESSED)).name
            except ValueError:
                name = None
            if name:
                return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        return self.dominant_tensor_type

    @property
    def dominant_tensor_type(self) -> str:
        """The weight type with the most bytes over 2-D tensors, e.g. 'Q4_K'."""
        by: dict[str, int] = {}
        for _, (_, typ, c, r) in self.tensors.items():
            if r > 1:
                be, bb = BLOCK[typ]
                by[SUPPORTED_TYPES[typ]] = by.get(SUPPORTED_TYPES[typ], 0) + r * c // be * bb
        return max(by, key=by.get) if by else "?"

    def decode_bytes_per_token(self) -> int:
        """Weight bytes one decoded token reads: every tensor except the embedding table, of which
        one row (the roofline convention of ../shared/anchors/ANCHORS.md)."""
        total = 0
        for name, (_, typ, c, r) in self.tensors.items():
            be, bb = BLOCK[typ]
            n = r * (c // be) * bb
            if name == "token_embd.weight":
                total += n // r
                if self.config.tied_embeddings:
                    total += n
            else:
                total += n
        return total
