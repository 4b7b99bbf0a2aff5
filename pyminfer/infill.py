"""Fill-in-the-middle (FIM) prompts for code models, as llama.cpp's server builds them for ``/infill``.

The prompt is token ids, never text, so that code which happens to contain a FIM marker's text
(``<|fim_prefix|>`` ...) stays code: every piece is tokenized with special-token parsing off and the
markers are the vocabulary's own ids (``Tokenizer.fim_ids``, found as llama.cpp finds them: the GGUF's
``tokenizer.ggml.fim_*_token_id`` keys, else the known marker texts). Layout (llama.cpp's server,
``format_infill`` in its ``utils.hpp``; the repo-level form is Qwen2.5-Coder's, arXiv:2409.12186)::

    [extra]<FIM_PRE>[input_prefix][prompt]<FIM_SUF>[input_suffix]<FIM_MID>

``prompt`` (the text before the cursor on its line, as editor plugins such as llama.vim send it) ends
the prefix, where llama.cpp's code puts it (its README says "after the FIM_MID token"; plugins rely
on the code). With the vocabulary's repository and file-separator markers (Qwen2.5-Coder has both)::

    extra = <FIM_REP>myproject\\n<FIM_SEP>{filename 0}\\n{text 0}<FIM_SEP>{filename 1}\\n{text 1}...<FIM_SEP>filename\\n

(``<FIM_REP>myproject\\n`` wherever the repository marker exists, the separators wherever the file
separator does), and without a file separator each chunk's text follows a
``\\n\\n--- snippet ---\\n\\n`` line. Long inputs are cut as llama.cpp cuts them for its batch of
2,048 tokens (here half of n_ctx where that is less, so a small context still has room to answer):
the prefix keeps its last 3/4 of the batch, the suffix its first 1/4 less the prompt and two
markers, and the extra context its last tokens that fit in what n_ctx leaves after the rest and
twice the token limit (half a batch when there is no limit; at least one position). Only a
``prompt`` longer than that can make the whole too long for n_ctx.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .tokenizer import Tokenizer

__all__ = ["InfillChunk", "InfillUnsupportedError", "infill_ids"]

_N_BATCH = 2048  # llama.cpp's default logical batch, which its /infill budget is cut to
_SNIPPET = "\n\n--- snippet ---\n\n"  # llama.cpp's chunk separator where the vocabulary has no FIM_SEP


class InfillUnsupportedError(ValueError):
    """The model's vocabulary has no FIM prefix / suffix / middle markers."""


@dataclass(frozen=True)
class InfillChunk:
    """One piece of extra context (``input_extra``): a file's name and (part of) its text.
    Raises TypeError for a text or filename that is not str."""

    text: str
    filename: str = "tmp"  # llama.cpp's name for a chunk that gives none

    def __post_init__(self) -> None:
        for name in ("text", "filename"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"InfillChunk.{name} must be str, got {type(getattr(self, name)).__name__}")


def infill_ids(tok: Tokenizer, prefix: str, suffix: str, *, extra: Sequence[InfillChunk] = (), prompt: str = "",
               n_ctx: int, n_predict: int | None = None) -> list[int]:
    """The token ids of a FIM prompt (module docstring): the model then writes the middle.

    ``prefix`` / ``suffix``: the text before / after the gap; ``extra``: other files' text, before
    the prefix; ``prompt``: text that ends the prefix (the start of the cursor's line, say);
    ``n_ctx``: the context's size in tokens; ``n_predict``: the token limit (None: none), which the
    extra context leaves room for. Returns a list of int token ids (BOS first where the vocabulary
    adds one). Raises InfillUnsupportedError when the vocabulary lacks the FIM prefix, suffix or
    middle marker, ValueError naming the piece for text with a lone surrogate.
    """
    fim = tok.fim_ids
    missing = [name for name in ("pre", "suf", "mid") if name not in fim]
    if missing:
        raise InfillUnsupportedError("this model cannot fill in the middle: its vocabulary has no FIM "
                                     + ", ".join(f"<FIM_{m.upper()}>" for m in missing) + " token")

    def enc(text: str, what: str) -> list[int]:
        try:
            return tok.encode(text, parse_special=False, add_bos=False, add_eos=False)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None

    rep, sep = fim.get("rep"), fim.get("sep")
    extra_ids: list[int] = []
    if rep is not None:
        extra_ids += [rep] + enc("myproject\n", "repository name")
    snippet = enc(_SNIPPET, "snippet line") if sep is None else []  # the same line before every chunk
    for i, chunk in enumerate(extra):
        extra_ids += [sep] + enc(chunk.filename + "\n", f"extra[{i}].filename") if sep is not None else snippet
        extra_ids += enc(chunk.text, f"extra[{i}].text")
    if sep is not None:
        extra_ids += [sep] + enc("filename\n", "file name")

    pre, suf, tail = enc(prefix, "prefix"), enc(suffix, "suffix"), enc(prompt, "prompt")
    n_batch = min(_N_BATCH, n_ctx // 2)
    n_pre = min(len(pre), 3 * (n_batch // 4))
    n_suf = min(len(suf), max(0, n_batch // 4 - (2 + len(tail))))
    core = [fim["pre"]] + pre[len(pre) - n_pre:] + tail + [fim["suf"]] + suf[:n_suf] + [fim["mid"]]
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    room = max(2 * n_predict, 1) if n_predict is not None and n_predict >= 0 else n_batch // 2
    n_extra = min(len(extra_ids), max(0, n_ctx - len(bos) - len(core) - room))
    return bos + extra_ids[len(extra_ids) - n_extra:] + core
