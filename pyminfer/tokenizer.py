"""Tokenizer built from a GGUF file's own vocabulary, matching llama.cpp token for token.

Only byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``) are supported. The BPE merge
loop and the pre-tokenizer regex run inside the ``tokenizers`` library; this module adds what
llama.cpp does around them:

* special-token partitioning before BPE (``llama_vocab::impl::tokenizer_st_partition``): control and
  unknown tokens are split out only when ``parse_special`` is on, user-defined tokens always, the
  longest token text first;
* the load-time fix-ups of token attributes (``llama_vocab::impl::load``): tokens whose text looks like
  an end-of-turn / end-of-generation / FIM marker (``<|im_end|>``, ``<|endoftext|>``, ``</s>``,
  ``<|fim_pad|>`` ...) are turned into control tokens and collected into ``eog_ids``;
* ``token_to_piece``: control, unknown and user-defined tokens render as their raw text, normal tokens
  are mapped back from the GPT-2 byte-to-unicode alphabet, unused tokens render as nothing.

GGUF metadata is read with pyminfer.gguf_file's mmap-based parser when a path is given (the full
``gguf.GGUFReader`` builds one numpy view per string and takes several seconds for a 150k vocab);
an existing ``gguf.GGUFReader`` is used as is.
"""

from __future__ import annotations

import codecs
import functools
import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["Tokenizer", "StreamDecoder", "UnsupportedTokenizerError", "read_gguf_tokenizer_metadata", "check_unicode",
           "InvalidUnicodeError"]


class UnsupportedTokenizerError(ValueError, NotImplementedError):
    """The GGUF's tokenizer model or pre-tokenizer is not supported (a ValueError and a NotImplementedError)."""


# ---------------------------------------------------------------------------------------------------------
# GGUF token types (tokenizer.ggml.token_type) and llama.cpp-style attribute flags
# ---------------------------------------------------------------------------------------------------------

# Fragments longer than this (characters) are tokenized by tokenizers' encode_batch, which
# releases the GIL, instead of encode, which holds it (Tokenizer.encode)
_GIL_FREE_CHARS = 1 << 16

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5

_TYPE_TO_ATTR = {
    TOKEN_TYPE_NORMAL: ATTR_NORMAL,
    TOKEN_TYPE_UNKNOWN: ATTR_UNKNOWN,
    TOKEN_TYPE_CONTROL: ATTR_CONTROL,
    TOKEN_TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TOKEN_TYPE_UNUSED: ATTR_UNUSED,
    TOKEN_TYPE_BYTE: ATTR_BYTE,
}

# Token texts llama.cpp recognises at load time (src/llama-vocab.cpp). Each detected token is forced to be
# a control token. The EOT/EOM/FIM ids are only auto-detected when the GGUF does not set them.
_EOT_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
})
_EOM_TEXTS = frozenset({"<|eom_id|>"})
_FIM_PRE_TEXTS = frozenset({"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>",
                            "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"})
_FIM_SUF_TEXTS = frozenset({"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>",
                            "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"})
_FIM_MID_TEXTS = frozenset({"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>",
                            "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>"})
_FIM_PAD_TEXTS = frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"})
_FIM_REP_TEXTS = frozenset({"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"})
_FIM_SEP_TEXTS = frozenset({"<|file_sep|>"})
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})

# ---------------------------------------------------------------------------------------------------------
# Pre-tokenizer regexes, as llama.cpp defines them per tokenizer.ggml.pre (llm_tokenizer_bpe).
# Each entry is a list of regexes applied one after another; matches and the text between them both
# become pieces ("isolated" splitting), exactly like llama.cpp's unicode_regex_split.
# ---------------------------------------------------------------------------------------------------------

_RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_RE_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class _PreSpec:
    regexes: tuple[str, ...]
    ignore_merges: bool = False


_PRE_TOKENIZERS: dict[str, _PreSpec] = {
    # verified against llama.cpp golden outputs
    "qwen2": _PreSpec((_RE_QWEN2,)),
    "smollm": _PreSpec((r"\p{N}", _RE_GPT2)),
    # same regexes in llama.cpp (not covered by the golden files)
    "stablelm2": _PreSpec((_RE_QWEN2,)),
    "starcoder": _PreSpec((r"\p{N}", _RE_GPT2)),
    "refact": _PreSpec((r"\p{N}", _RE_GPT2)),
    "command-r": _PreSpec((r"\p{N}", _RE_GPT2)),
    "codeshell": _PreSpec((r"\p{N}", _RE_GPT2)),
    "exaone": _PreSpec((r"\p{N}", _RE_GPT2)),
    "minerva-7b": _PreSpec((r"\p{N}", _RE_GPT2)),
    "gpt-2": _PreSpec((_RE_GPT2,)),
    "mpt": _PreSpec((_RE_GPT2,)),
    "olmo": _PreSpec((_RE_GPT2,)),
    "jais": _PreSpec((_RE_GPT2,)),
    "llama3": _PreSpec((_RE_LLAMA3,), ignore_merges=True),
    "llama-v3": _PreSpec((_RE_LLAMA3,), ignore_merges=True),
    "llama-bpe": _PreSpec((_RE_LLAMA3,), ignore_merges=True),
    "falcon3": _PreSpec((_RE_LLAMA3,), ignore_merges=True),
    "dbrx": _PreSpec((_RE_LLAMA3,)),
    "smaug-bpe": _PreSpec((_RE_LLAMA3,)),
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table used by byte-level BPE vocabs."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_TO_UNICODE = _bytes_to_unicode()
_UNICODE_TO_BYTE = {c: b for b, c in _BYTE_TO_UNICODE.items()}


def _byte_decode(text: str) -> bytes:
    """Map a byte-level BPE token text back to raw bytes (llama.cpp's llama_decode_text)."""
    try:
        return bytes(_UNICODE_TO_BYTE[c] for c in text)
    except KeyError:
        out = bytearray()
        for c in text:
            b = _UNICODE_TO_BYTE.get(c)
            if b is not None:
                out.append(b)
            else:  # same fallback text as llama.cpp
                out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
        return bytes(out)


# ---------------------------------------------------------------------------------------------------------
# GGUF metadata
# ---------------------------------------------------------------------------------------------------------

def _fields_from_reader(reader: Any, wanted_prefixes: tuple[str, ...]) -> dict[str, Any]:
    """Extract metadata values from an existing ``gguf.GGUFReader``."""
    import numpy as np
    from gguf import GGUFValueType

    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if not key.startswith(wanted_prefixes):
            continue
        types = field.types
        if not types:
            continue
        if types[0] == GGUFValueType.ARRAY:
            sub = types[1] if len(types) > 1 else None
            if sub == GGUFValueType.STRING:
                parts = field.parts
                out[key] = [bytes(parts[i]).decode("utf-8", errors="replace") for i in field.data]
            elif sub is not None and sub != GGUFValueType.ARRAY:
                parts = field.parts
                if len(field.data) == 0:
                    out[key] = np.zeros(0)
                else:
                    # numeric arrays are stored as one part per element; concatenate
                    out[key] = np.concatenate([np.asarray(parts[i]).reshape(-1) for i in field.data])
        elif types[0] == GGUFValueType.STRING:
            out[key] = bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
        else:
            out[key] = field.parts[field.data[0]][0].item()
    return out


def read_gguf_tokenizer_metadata(reader_or_path: Any) -> dict[str, Any]:
    """Return the ``tokenizer.*`` and ``general.*`` metadata of a GGUF file as plain Python values.

    Accepts a path (parsed with a fast mmap reader) or a ``gguf.GGUFReader``. String arrays become lists of
    str, numeric arrays numpy arrays, scalars Python scalars. For a path, raises FileNotFoundError, or
    ``gguf_model.GGUFError`` (a ValueError naming the file) for a file that is not a readable GGUF
    (bad magic, truncated, corrupt), the same error a model load gives.
    """
    prefixes = ("tokenizer.", "general.")
    if isinstance(reader_or_path, (str, os.PathLike)):
        from .gguf_file import parse as parse_gguf
        from .gguf_model import GGUFError

        path = os.fspath(reader_or_path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"model file not found: {path}")
        try:
            h = parse_gguf(path, keep=prefixes, tensors=False)  # None: a layout left to GGUFReader
        except (ValueError, IndexError, OverflowError, struct.error) as e:
            # bad bytes surface as struct/mmap/numpy errors (every length is checked against the
            # file size first, so a corrupt count never becomes a huge allocation: a MemoryError
            # here is a real one and propagates); reported as a model load reports them
            raise GGUFError.unreadable(path, e) from e
        if h is not None:
            return h.kv
        import gguf  # metadata the fast parser leaves to the library (nested arrays)

        try:  # as GGUFModel: the library's reader may also run out of memory on a corrupt count
            return _fields_from_reader(gguf.GGUFReader(path), prefixes)
        except Exception as e:
            raise GGUFError.unreadable(path, e) from e
    if not hasattr(reader_or_path, "fields"):
        raise TypeError(f"expected a path or gguf.GGUFReader, got {type(reader_or_path).__name__}")
    return _fields_from_reader(reader_or_path, prefixes)


class InvalidUnicodeError(ValueError):
    """A string with a lone surrogate. ``index``: its position; ``byte``: the undecodable byte it
    stands for (surrogateescape's U+DC80..U+DCFF), else None."""

    def __init__(self, message: str, index: int, byte: int | None):
        super().__init__(message)
        self.index, self.byte = index, byte


def lone_surrogate(text: str) -> int | None:
    """Index of the first lone UTF-16 surrogate (U+D800..U+DFFF) in ``text``, None when there is none.
    Such a string has no UTF-8 form: it is not text, and cannot be tokenized or even printed."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def check_unicode(text: str, what: str = "text") -> None:
    """Raise ValueError when ``text`` has a lone surrogate (U+D800..U+DFFF), which has no UTF-8 form.

    Such strings come from bytes that were not UTF-8, decoded with ``surrogateescape`` (command-line
    arguments, a POSIX-locale stdin) or from JSON ``\\udXXX`` escapes; the ``tokenizers`` library would
    fail on them with an unhelpful TypeError. Undecodable bytes (U+DC80..U+DCFF) are named as such.
    Raises InvalidUnicodeError (a ValueError).
    """
    i = lone_surrogate(text)
    if i is None:
        return
    c = ord(text[i])
    if 0xDC80 <= c <= 0xDCFF:  # surrogateescape's stand-in for the byte c - 0xDC00
        raise InvalidUnicodeError(f"{what} is not valid Unicode (lone surrogate at index {i}: "
                                  f"undecodable byte 0x{c - 0xDC00:02x}; is the input UTF-8?)", i, c - 0xDC00)
    raise InvalidUnicodeError(f"{what} is not valid Unicode (lone surrogate at index {i}: U+{c:04X})", i, None)


# ---------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------


class Tokenizer:
    """A GGUF vocabulary's tokenizer, giving the same ids and pieces as llama.cpp.

    Build it with :meth:`from_gguf`. Attributes:

    * ``n_vocab``: number of tokens in the vocabulary;
    * ``bos_id`` / ``eos_id``: ids from the GGUF (None when absent);
    * ``eog_ids``: end-of-generation ids, as llama.cpp marks them (eos, eot, eom, ``<|im_end|>``,
      ``<|endoftext|>``, ``</s>``, FIM pad/repo/sep, ...);
    * ``add_bos`` / ``add_eos``: whether :meth:`encode` adds BOS / EOS by default;
    * ``model_type``: ``tokenizer.ggml.model``; ``pre_type``: ``tokenizer.ggml.pre``;
    * ``chat_template``: ``tokenizer.chat_template`` or None.
    """

    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eom_id: int | None
    pad_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    model_type: str
    pre_type: str
    chat_template: str | None

    def __init__(self, meta: Mapping[str, Any]) -> None:
        """Build from metadata as returned by :func:`read_gguf_tokenizer_metadata` (prefer :meth:`from_gguf`)."""
        from tokenizers import Regex
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, pre_tokenizers

        model = meta.get("tokenizer.ggml.model")
        if model is None:
            raise ValueError("GGUF has no tokenizer (tokenizer.ggml.model is missing)")
        self.model_type = str(model)
        if self.model_type != "gpt2":
            raise UnsupportedTokenizerError(
                f"unsupported tokenizer model {self.model_type!r}: only byte-level BPE ('gpt2') is implemented"
            )
        self.pre_type = str(meta.get("tokenizer.ggml.pre", "default"))
        spec = _PRE_TOKENIZERS.get(self.pre_type)
        if spec is None:
            raise UnsupportedTokenizerError(
                f"unsupported pre-tokenizer {self.pre_type!r} (tokenizer.ggml.pre); supported: "
                + ", ".join(sorted(_PRE_TOKENIZERS))
            )

        tokens = meta.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise ValueError("GGUF has no tokenizer.ggml.tokens")
        tokens = list(tokens)
        for i, t in enumerate(tokens):
            if not t:  # llama.cpp renames empty tokens
                tokens[i] = f"[EMPTY_{i}]"
        self._tokens: list[str] = tokens
        n = len(tokens)
        self.n_vocab = n

        ttypes = meta.get("tokenizer.ggml.token_type")
        # attributes: only non-normal ones are stored (a sparse dict keeps loading cheap)
        attr: dict[int, int] = {}
        if ttypes is not None:
            import numpy as np

            tt = np.asarray(ttypes).astype(np.int64)
            for i in np.nonzero(tt != TOKEN_TYPE_NORMAL)[0].tolist():
                attr[i] = _TYPE_TO_ATTR.get(int(tt[i]), ATTR_UNDEFINED)
        self._attr = attr

        def get_id(key: str, strict: bool = False) -> int | None:
            """The id under ``key``; None when absent or (optional ids) out of range. strict: an
            out-of-range bos / eos / eot / eom id is an error (generation could never stop)."""
            v = meta.get(key)
            if v is None:
                return None
            v = int(v)
            if strict and not 0 <= v < n:
                raise ValueError(f"{key} = {v} is outside the vocabulary ({n} tokens): corrupt tokenizer metadata")
            return v if 0 <= v < n else None

        self.bos_id = get_id("tokenizer.ggml.bos_token_id", strict=True)
        self.eos_id = get_id("tokenizer.ggml.eos_token_id", strict=True)
        self.eot_id = get_id("tokenizer.ggml.eot_token_id", strict=True)
        self.eom_id = get_id("tokenizer.ggml.eom_token_id", strict=True)
        self.pad_id = get_id("tokenizer.ggml.padding_token_id")
        self.unk_id = get_id("tokenizer.ggml.unknown_token_id")
        fim = {
            "pre": get_id("tokenizer.ggml.fim_pre_token_id") or get_id("tokenizer.ggml.prefix_token_id"),
            "suf": get_id("tokenizer.ggml.fim_suf_token_id") or get_id("tokenizer.ggml.suffix_token_id"),
            "mid": get_id("tokenizer.ggml.fim_mid_token_id") or get_id("tokenizer.ggml.middle_token_id"),
            "pad": get_id("tokenizer.ggml.fim_pad_token_id"),
            "rep": get_id("tokenizer.ggml.fim_rep_token_id"),
            "sep": get_id("tokenizer.ggml.fim_sep_token_id"),
        }
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        if self.add_bos and self.bos_id is None:
            raise ValueError("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set")
        if self.add_eos and self.eos_id is None:
            raise ValueError("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set")
        tmpl = meta.get("tokenizer.chat_template")
        self.chat_template = str(tmpl) if tmpl else None

        # --- llama.cpp's load-time fix-ups, driven by token text --------------------------------------
        # token_to_id keeps the last id for a duplicated text, like a map insert-or-assign would
        token_to_id: dict[str, int] = {t: i for i, t in enumerate(tokens)}
        self._token_to_id = token_to_id

        def make_control(i: int) -> None:
            attr[i] = attr.get(i, ATTR_NORMAL) | ATTR_CONTROL

        def detect(texts: Iterable[str], current: int | None) -> int | None:
            found = current
            for t in sorted(texts):
                i = token_to_id.get(t)
                if i is None:
                    continue
                if found is None:
                    found = i
                if found == i:
                    make_control(i)
            return found

        self.eot_id = detect(_EOT_TEXTS, self.eot_id)
        self.eom_id = detect(_EOM_TEXTS, self.eom_id)
        fim["pre"] = detect(_FIM_PRE_TEXTS, fim["pre"])
        fim["suf"] = detect(_FIM_SUF_TEXTS, fim["suf"])
        fim["mid"] = detect(_FIM_MID_TEXTS, fim["mid"])
        fim["pad"] = detect(_FIM_PAD_TEXTS, fim["pad"])
        fim["rep"] = detect(_FIM_REP_TEXTS, fim["rep"])
        fim["sep"] = detect(_FIM_SEP_TEXTS, fim["sep"])
        self.fim_ids = {k: v for k, v in fim.items() if v is not None}

        # control tokens whose text contains "unused" are marked unused
        for i, a in list(attr.items()):
            if a & ATTR_CONTROL and "unused" in tokens[i]:
                attr[i] = a | ATTR_UNUSED

        eog: set[int] = {v for k, v in fim.items() if k in ("pad", "rep", "sep") and v is not None}
        for t in _EOG_TEXTS:
            i = token_to_id.get(t)
            if i is not None:
                eog.add(i)
                make_control(i)
        for i in (self.eos_id, self.eot_id, self.eom_id):
            if i is not None:
                eog.add(i)
        # o200k_harmony / solar-open: <|end|> is not EOG when <|return|>+<|call|> (or <|calls|>+<|flush|>) exist
        texts = {tokens[i] for i in eog}
        if "<|end|>" in texts and (({"<|return|>", "<|call|>"} <= texts) or ({"<|calls|>", "<|flush|>"} <= texts)):
            end_id = token_to_id["<|end|>"]
            eog.discard(end_id)
            attr[end_id] = ATTR_USER_DEFINED
        # gemma4 / paddleocr: </s> is not EOG when <|tool_response> is
        if "<|tool_response>" in texts and "</s>" in texts:
            s_id = token_to_id["</s>"]
            eog.discard(s_id)
            attr[s_id] = ATTR_NORMAL
        self.eog_ids = frozenset(eog)

        # special-token cache for partitioning: longest text first (ties: lower id first)
        special = [i for i, a in attr.items() if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        special.sort(key=lambda i: (-len(tokens[i].encode("utf-8")), i))
        self._special_all: list[tuple[str, int]] = [(tokens[i], i) for i in special]
        self._special_always: list[tuple[str, int]] = [
            (tokens[i], i) for i in special if not attr[i] & (ATTR_CONTROL | ATTR_UNKNOWN)
        ]

        # --- BPE via the tokenizers library -------------------------------------------------------------
        merges_raw = meta.get("tokenizer.ggml.merges")
        if merges_raw is None:
            raise ValueError("GGUF has no tokenizer.ggml.merges (required for a BPE vocabulary)")
        merges: list[tuple[str, str]] = []
        for m in merges_raw:
            a, sep, b = m.partition(" ")
            if not sep:
                raise ValueError(f"malformed merge rule {m!r} in tokenizer.ggml.merges")
            merges.append((a, b))
        try:
            bpe = models.BPE(vocab=token_to_id, merges=merges, ignore_merges=spec.ignore_merges)
        except MemoryError:
            raise
        except Exception as e:  # the library raises a bare Exception, e.g. a merge of unknown tokens
            raise ValueError(f"corrupt tokenizer metadata: {e} (tokenizer.ggml.merges must only join "
                             "tokens of tokenizer.ggml.tokens)") from None
        hf = HFTokenizer(bpe)
        steps: list[Any] = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in spec.regexes]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        hf.pre_tokenizer = pre_tokenizers.Sequence(steps)
        self._hf = hf

        self._piece_cache: dict[int, bytes] = {}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_gguf(cls, reader_or_path: Any) -> "Tokenizer":
        """Build the tokenizer from a GGUF file path or an open ``gguf.GGUFReader``.

        Raises :class:`UnsupportedTokenizerError` (a ValueError) for a tokenizer model other than
        ``gpt2`` or an unknown ``tokenizer.ggml.pre``, and ValueError for corrupt tokenizer metadata;
        given a path, the message starts with it (`pyminfer tokenize` and Model both show it).
        """
        try:
            return cls(read_gguf_tokenizer_metadata(reader_or_path))
        except ValueError as e:
            if not isinstance(reader_or_path, (str, os.PathLike)) or str(e).startswith(f"{reader_or_path}:") \
                    or type(e).__init__ is not ValueError.__init__:  # an error type with its own arguments
                raise
            raise type(e)(f"{reader_or_path}: {e}") from None

    # ------------------------------------------------------------------ helpers
    def _check_id(self, token_id: int) -> int:
        try:
            i = int(token_id)
        except (TypeError, ValueError):
            raise TypeError(f"token id must be an int, got {token_id!r}") from None
        if not 0 <= i < self.n_vocab:
            raise IndexError(f"token id {i} out of range for a vocabulary of {self.n_vocab} tokens")
        return i

    def token_attr(self, token_id: int) -> int:
        """llama.cpp-style attribute bit flags of a token after the load-time fix-ups (ATTR_* constants)."""
        return self._attr.get(self._check_id(token_id), ATTR_NORMAL)

    def is_control(self, token_id: int) -> bool:
        """Whether the token is a control token (as llama.cpp sees it after loading)."""
        return bool(self.token_attr(token_id) & ATTR_CONTROL)

    def is_eog(self, token_id: int) -> bool:
        """Whether generating this token ends generation."""
        return token_id in self.eog_ids

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """An upper bound on the bytes of text one token stands for (the longest token string's UTF-8
        length: a byte-level token's characters each stand for one byte, a control token is its own
        text), >= 1."""
        return max([len(t.encode("utf-8")) for t in self._tokens] + [1])

    @functools.cached_property
    def _tokenless_ascii(self) -> str | None:
        """The ASCII characters whose byte has no token, which encode() drops (the BPE model has no
        unknown token and no byte fallback: SmolLM2's vocabulary lacks 0x04, 0x06, ...); None when a
        UTF-8 continuation byte (0x80..0xBF) has none, so that a multi-byte character could vanish whole."""
        missing = [b for b, c in _BYTE_TO_UNICODE.items() if self.token_to_id(c) is None]
        if any(0x80 <= b <= 0xBF for b in missing):
            return None
        return "".join(chr(b) for b in missing if b < 0x80)

    def min_tokens(self, text: str) -> int:
        """A lower bound on ``len(encode(text, add_bos=False, add_eos=False))`` (special parsing or
        not), found without tokenizing: every character but a dropped one (:attr:`_tokenless_ascii`)
        gives one of its bytes to some token, and no token stands for more than
        :attr:`max_token_bytes` bytes. 0 (no bound) for a vocabulary that could drop a multi-byte
        character whole. Byte-level BPE only, the one model this class implements."""
        dropped = self._tokenless_ascii
        if dropped is None:
            return 0
        n = len(text) - sum(text.count(c) for c in dropped)
        return -(-n // self.max_token_bytes)

    def token_to_id(self, text: str) -> int | None:
        """The id whose vocab string is exactly ``text``, or None."""
        return self._token_to_id.get(text)

    # ------------------------------------------------------------------ encode
    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split ``text`` into raw-text fragments (str) and special token ids (int), llama.cpp-style."""
        specials = self._special_all if parse_special else self._special_always
        frags: list[str | int] = [text]
        for tok_text, tok_id in specials:
            if not any(isinstance(f, str) and tok_text in f for f in frags):
                continue
            new: list[str | int] = []
            for f in frags:
                if isinstance(f, str) and tok_text in f:
                    parts = f.split(tok_text)
                    for k, p in enumerate(parts):
                        if k:
                            new.append(tok_id)
                        if p:
                            new.append(p)
                else:
                    new.append(f)
            frags = new
        return frags

    def encode(self, text: str, *, parse_special: bool = True, add_bos: bool | None = None,
               add_eos: bool | None = None) -> list[int]:
        """Tokenize ``text`` like ``llama_tokenize``.

        ``parse_special``: match control tokens (``<|im_start|>`` ...) in the text; user-defined tokens are
        matched either way. ``add_bos`` / ``add_eos``: default to the GGUF's ``add_bos_token`` /
        ``add_eos_token``. Raises ValueError for text with a lone surrogate (no UTF-8 form; see
        :func:`check_unicode`).
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        check_unicode(text)
        out: list[int] = []
        if (self.add_bos if add_bos is None else add_bos):
            if self.bos_id is None:
                raise ValueError("add_bos requested but the vocabulary has no BOS token")
            out.append(self.bos_id)
        if text:
            # one encode per fragment: encode_batch would start tokenizers' thread pool, which then
            # complains (and disables itself) if the process forks later. Except for long
            # fragments: encode holds the GIL throughout (seconds for megabytes, and the server's
            # event loop with it), encode_batch releases it; the same pipeline, the same ids.
            hf = self._hf
            for f in self._partition(text, parse_special):
                if isinstance(f, int):
                    out.append(f)
                elif len(f) > _GIL_FREE_CHARS:
                    out.extend(hf.encode_batch([f], add_special_tokens=False)[0].ids)
                else:
                    out.extend(hf.encode(f, add_special_tokens=False).ids)
        if (self.add_eos if add_eos is None else add_eos):
            if self.eos_id is None:
                raise ValueError("add_eos requested but the vocabulary has no EOS token")
            out.append(self.eos_id)
        return out

    # ------------------------------------------------------------------ decode
    def token_text(self, token_id: int) -> str:
        """The token's string exactly as stored in the GGUF vocabulary (byte-level alphabet for BPE)."""
        return self._tokens[self._check_id(token_id)]

    def token_to_piece(self, token_id: int, *, special: bool = True) -> bytes:
        """Raw bytes of one token, like llama.cpp's ``token_to_piece``.

        Control/unknown/user-defined tokens give their text; normal tokens their decoded bytes (possibly
        part of a UTF-8 character); unused tokens nothing. With ``special=False`` control and unknown
        tokens give ``b""``.
        """
        i = self._check_id(token_id)
        a = self._attr.get(i, ATTR_NORMAL)
        if not special and a & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        piece = self._piece_cache.get(i)
        if piece is None:
            text = self._tokens[i]
            if a & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED):
                piece = text.encode("utf-8")
            elif a & ATTR_NORMAL:
                piece = _byte_decode(text)
            elif a & ATTR_BYTE:
                piece = bytes([int(text[3:5], 16)]) if text.startswith("<0x") else _byte_decode(text)
            else:  # unused / undefined
                piece = b""
            self._piece_cache[i] = piece
        return piece

    def decode_bytes(self, ids: Sequence[int], *, skip_special: bool = False) -> bytes:
        """Concatenated pieces of ``ids`` (control/unknown tokens left out when ``skip_special``)."""
        return b"".join(self.token_to_piece(i, special=not skip_special) for i in ids)

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Detokenize to text; invalid UTF-8 is replaced with U+FFFD. ``skip_special`` drops control tokens."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ chat template
    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            **template_vars: Any) -> str:
        """Render ``messages`` with the GGUF's ``tokenizer.chat_template`` (jinja2, sandboxed).

        Uses ``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` like HF transformers;
        ``bos_token``/``eos_token``, ``raise_exception`` and a ``tojson`` that keeps non-ASCII are provided.
        Extra keyword arguments (e.g. ``tools``) are passed to the template.
        Raises ChatTemplateError (a ValueError) when the template does not compile, ValueError when
        the GGUF has no chat template, the template raises (its ``raise_exception``) or rendering
        these messages fails inside it (a jinja error, or a TypeError / KeyError ... from a field
        the template expects).
        """
        from jinja2 import TemplateError

        if not self.chat_template:
            raise ValueError("this GGUF has no chat template (tokenizer.chat_template is missing)")
        self.check_chat_template()  # ChatTemplateError when it does not compile
        compiled = self._compiled_template
        try:
            ctx: dict[str, Any] = {
                "bos_token": self._tokens[self.bos_id] if self.bos_id is not None else "",
                "eos_token": self._tokens[self.eos_id] if self.eos_id is not None else "",
            }
            ctx.update(template_vars)
            ctx["messages"] = messages
            ctx["add_generation_prompt"] = add_generation_prompt
            return compiled.render(**ctx)
        except ValueError:  # the template's raise_exception: already says what is wrong
            raise
        except (TemplateError, TypeError, AttributeError, KeyError, IndexError) as e:
            # an error inside the render, e.g. a template that needs a field these messages lack
            raise ValueError(f"the chat template could not render these messages: {type(e).__name__}: {e}") from e

    def check_chat_template(self) -> None:
        """Compile the GGUF's chat template (cached for apply_chat_template), so that a broken one
        is found at startup rather than at the first chat turn. No template: nothing to check.
        Raises ChatTemplateError when it does not compile (a jinja syntax error)."""
        from jinja2 import TemplateSyntaxError

        if not self.chat_template or getattr(self, "_compiled_template", None) is not None:
            return
        try:
            self._compiled_template = _compile_template(self.chat_template)
        except TemplateSyntaxError as e:
            raise ChatTemplateError(f"this model's chat template (tokenizer.chat_template in the GGUF) does not "
                                    f"compile: {e.message} (template line {e.lineno}); chat requests cannot be "
                                    "rendered: give a raw prompt instead") from e

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model_type!r}, pre={self.pre_type!r}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, eog={sorted(self.eog_ids)})")


class ChatTemplateError(ValueError):
    """The model's chat template itself is broken (a jinja syntax error): no request can fix it."""


class _TemplateError(ValueError):
    pass


def _compile_template(source: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise _TemplateError(f"chat template error: {message}")

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        import datetime

        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


class StreamDecoder:
    """Incremental detokenizer: feed ids, get text that never contains half a UTF-8 character.

    Bytes of an incomplete UTF-8 sequence are held back until the next token completes them; bytes that
    can never form a valid character are replaced with U+FFFD as soon as that is certain.
    """

    def __init__(self, tok: Tokenizer, *, skip_special: bool = False) -> None:
        self._tok = tok
        self._special = not skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Add one token; return the newly completed text (maybe "")."""
        return self._dec.decode(self._tok.token_to_piece(token_id, special=self._special), final=False)

    def flush(self, *, drop_incomplete: bool = False) -> str:
        """Return whatever is left (an incomplete trailing sequence becomes U+FFFD, or is dropped
        with ``drop_incomplete``, as llama.cpp's server does when generation stops mid-character)
        and reset."""
        if drop_incomplete:
            self._dec.reset()
            return ""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out
