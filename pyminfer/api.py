"""The Python door: ``pyminfer.LLM``.

    >>> from pyminfer import LLM
    >>> with LLM("smollm2-135m", device="cpu") as llm:
    ...     r = llm.generate("The capital of France is", max_tokens=8, temperature=0)
    ...     print(r.text, r.finish_reason, r.timings["decode_tok_s"])
    ...     for chunk in llm.chat([{"role": "user", "content": "Hi!"}], stream=True):
    ...         print(chunk.text, end="", flush=True)

One LLM owns one model (and optionally a draft model for speculative decoding) and its KV cache.
Generations on one LLM run one at a time: other threads wait for the running one; starting a second
generation in the thread that holds an unfinished stream raises RuntimeError.
"""

from __future__ import annotations

import inspect
import json
import numbers
import os
import threading
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Iterator, Sequence, Union

from .generate import Chunk, GenerationResult, generate_stream, prompt_logprobs
from .infill import InfillChunk, infill_ids
from .ngram import NgramSpec
from .sampling import SamplingParams, TokenLogprob, parse_samplers
from .tokenizer import ChatTemplateError, check_unicode

__all__ = ["LLM", "Chunk", "GenerationResult", "Prompt", "ChatTemplateError", "MessageError", "ROLES"]

Prompt = Union[str, Sequence[int]]

# The roles a chat message may have (OpenAI's). "developer" is OpenAI's newer name for "system" and
# is rendered as "system": GGUF chat templates predate it and would drop or mislabel the turn.
ROLES = ("system", "developer", "user", "assistant", "tool")


class MessageError(ValueError):
    """A malformed chat message; ``param`` is the field's path (``messages.1.tool_calls``)."""

    def __init__(self, message: str, param: str = "messages"):
        super().__init__(message)
        self.param = param


def _draft_depth(spec_draft_n: int | None, max_nt: int, adaptive: bool) -> int:
    """spec_draft_n, or for None the default (4; with adaptive depth its first depth, 1) capped at
    what a verify forward of the target's max_nt (n_ubatch) rows holds, as the CLI's --spec-draft-n
    when not given (pyminfer.spec.default_draft_n)."""
    from .spec import default_draft_n

    return spec_draft_n if spec_draft_n is not None else default_draft_n(adaptive, max_nt)


def _check_spec(spec_draft_n: Any, spec_adaptive: Any, has_draft: bool) -> None:
    """The speculative settings, as the CLI checks them: spec_draft_n an int in 0..MAX_DEPTH (8)
    with or without a draft model (a value no run could use is an error, not ignored), and
    spec_adaptive only with a draft model (its depth is the draft's). Raises TypeError /
    ValueError."""
    from .spec import MAX_DEPTH

    if spec_draft_n is None:  # the default depth (_draft_depth)
        pass
    elif isinstance(spec_draft_n, bool) or not isinstance(spec_draft_n, int):
        raise TypeError(f"spec_draft_n must be an int or None, got {type(spec_draft_n).__name__}")
    elif not 0 <= spec_draft_n <= MAX_DEPTH:
        raise ValueError(f"spec_draft_n must be in 0..{MAX_DEPTH}, got {spec_draft_n}")
    if spec_adaptive and not has_draft:
        raise ValueError("spec_adaptive needs a draft model (draft_model=...)")


class LLM:
    """A GGUF model ready to generate.

    Args:
        model_path: GGUF file path, or a known model name ("smollm2-135m", "qwen2.5-coder-0.5b",
            ...; fetched into the cache on first use), or None for the default model.
        draft_model: optional draft model (path or name) for speculative decoding; its vocabulary
            must match the target's.
        device: "auto" (CUDA when visible), "cuda" or "cpu".
        n_ctx: context size in tokens (default min(4096, the model's trained context); 0: the
            trained context, as llama-cpp-python's n_ctx=0).
        n_threads: CPU threads (0: all cores).
        spec_draft_n: draft tokens per speculative round (0..8; checked with or without a draft,
            a UserWarning without one, as the CLI warns; with a draft at most n_ubatch - 1), or with
            spec_adaptive the first depth tried (capped at n_ubatch - 1); None (default): 4, or 1
            with spec_adaptive (pyminfer.spec.default_draft_n), capped at n_ubatch - 1.
        spec_adaptive: choose the draft depth each round (needs draft_model).
        spec_ngram: n-gram drafts (pyminfer.ngram.NgramSpec(n, m); llama.cpp's
            ``--spec-type ngram-simple``), alone or before the draft model; None: off.
        n_ubatch: most tokens per forward; prompts are evaluated in chunks of it (as
            llama-cpp-python's n_ubatch; default 512 on CUDA, 64 on the CPU; capped at
            max(n_ctx, 16), as llama.cpp caps n_batch at n_ctx).

    Raises:
        FileNotFoundError: no such model file, and not a known model name either.
        TypeError: a model argument that is not a str or path; a setting of the wrong type.
        pyminfer.spec.VocabMismatch: the draft's vocabulary differs from the target's.
        ValueError / RuntimeError / MemoryError: bad file, device or settings.
    """

    def __init__(self, model_path: str | Path | None = None, *, draft_model: str | Path | None = None,
                 device: str = "auto", n_ctx: int | None = None, n_threads: int = 0, spec_draft_n: int | None = None,
                 spec_adaptive: bool = False, n_ubatch: int | None = None, spec_ngram: NgramSpec | None = None):
        from .engine import Model
        from .models import resolve_model

        from .spec import check_draft

        # settings first: a bad one is refused before any (slow) load (n_ctx / n_threads: by Model,
        # before it reads more than the file's header)
        if n_ubatch is not None and (isinstance(n_ubatch, bool) or not isinstance(n_ubatch, int)):
            raise TypeError(f"n_ubatch must be an int or None, got {type(n_ubatch).__name__}")
        if n_ubatch is not None and not 1 <= n_ubatch <= 2**31 - 1:
            raise ValueError(f"n_ubatch must be in 1..{2**31 - 1}, got {n_ubatch}")
        if spec_ngram is not None and not isinstance(spec_ngram, NgramSpec):
            raise TypeError(f"spec_ngram must be a pyminfer.ngram.NgramSpec or None, got {type(spec_ngram).__name__}")
        if spec_ngram is not None and n_ubatch is not None and n_ubatch < spec_ngram.m + 1:
            raise ValueError(f"n_ubatch {n_ubatch} is too small for n-gram drafts of {spec_ngram.m} tokens: a verify "
                             f"forward takes {spec_ngram.m + 1} tokens")
        _check_spec(spec_draft_n, spec_adaptive, draft_model is not None)
        if spec_draft_n is not None and draft_model is None:  # as the CLI's warning for --spec-draft-n
            warnings.warn("spec_draft_n is ignored without draft_model", UserWarning, stacklevel=2)
        if draft_model is not None:
            if spec_draft_n is not None and n_ubatch is not None and n_ubatch < spec_draft_n + 1 \
                    and not spec_adaptive:  # (adaptive, or the default depth: capped)
                raise ValueError(f"n_ubatch {n_ubatch} is too small for spec_draft_n {spec_draft_n}: a verify "
                                 f"forward takes {spec_draft_n + 1} tokens")
        if model_path is not None and not isinstance(model_path, (str, os.PathLike)):
            # LLM(123) was "model file not found: 123"
            raise TypeError(f"model_path must be a str, a path or None, got {type(model_path).__name__}")
        if draft_model is not None and not isinstance(draft_model, (str, os.PathLike)):
            raise TypeError(f"draft_model must be a str, a path or None, got {type(draft_model).__name__}")
        self.model_path = resolve_model(None if model_path is None else str(model_path))
        self._model: Any = Model(self.model_path, device=device, n_ctx=n_ctx, n_threads=n_threads, max_nt=n_ubatch)
        self._draft: Any = None
        try:
            if draft_model is not None:
                self._draft = Model(resolve_model(str(draft_model)), device=device, n_ctx=self._model.n_ctx,
                                    n_threads=n_threads, max_nt=n_ubatch)
                check_draft(self._model, self._draft)
        except BaseException:
            self.close()
            raise
        self.spec_draft_n = _draft_depth(spec_draft_n, self._model.max_nt, bool(spec_adaptive))
        self.spec_adaptive = spec_adaptive
        self.spec_ngram = spec_ngram
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._cache_ids: list[int] = []  # ids whose K/V are valid in the target's cache (positions 0..)
        self._draft_ids: list[int] = []  # the same for the draft's cache
        self._marks: tuple[int, int] = (-1, -1)  # the models' write counters when that was last true

    @classmethod
    def from_models(cls, model: Any, draft: Any = None, *, spec_draft_n: int | None = None,
                    spec_adaptive: bool = False, spec_ngram: NgramSpec | None = None) -> "LLM":
        """Wrap already loaded pyminfer.engine.Model objects (e.g. from the CLI's loader); the LLM
        takes ownership (close() frees them). ``spec_draft_n`` etc. as the constructor's (None: 4,
        or 1 with spec_adaptive, capped at the target's max_nt - 1). Raises VocabMismatch for an incompatible draft."""
        _check_spec(spec_draft_n, spec_adaptive, draft is not None)
        self = cls.__new__(cls)
        self.model_path = Path(model.gguf.path)
        self._model, self._draft = model, draft
        if draft is not None:
            from .spec import check_draft

            check_draft(model, draft)
        self.spec_draft_n = _draft_depth(spec_draft_n, model.max_nt, bool(spec_adaptive))
        self.spec_adaptive = spec_adaptive
        self.spec_ngram = spec_ngram
        self._lock = threading.Lock()
        self._owner = None
        self._cache_ids, self._draft_ids = [], []
        self._marks = (-1, -1)
        return self

    # ------------------------------------------------------------------ properties
    @property
    def model(self) -> Any:
        """The underlying pyminfer.engine.Model (raises RuntimeError after close()). Forwards run on
        it directly (or by another LLM wrapping it) overwrite its KV cache: the next generation here
        sees that (Model.writes) and prefills its whole prompt."""
        if self._model is None:
            raise RuntimeError("this LLM is closed")
        return self._model

    @property
    def draft(self) -> Any:
        """The draft pyminfer.engine.Model, or None."""
        return self._draft

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    @property
    def device(self) -> str:
        return self.model.device

    @property
    def name(self) -> str:
        """The model file name (e.g. 'smollm2-135m-instruct-q4_1.gguf')."""
        return self.model_path.name

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, parse_special: bool = True, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``. ``parse_special``: turn special-token text (``<|im_start|>``) into
        its id; ``add_bos``: default is the model's add_bos_token. Raises TypeError for non-str, and
        ValueError (tokenizer.InvalidUnicodeError) for text with a lone surrogate."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        parse_special = _boolean("parse_special", parse_special)
        add_bos = None if add_bos is None else _boolean("add_bos", add_bos)
        return self.tokenizer.encode(text, parse_special=parse_special, add_bos=add_bos)

    def detokenize(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of token ids. Raises ValueError for an id outside the vocabulary, TypeError for non-ints."""
        ids = _check_ids(ids, self.tokenizer.n_vocab)
        return self.tokenizer.decode(ids, skip_special=_boolean("skip_special", skip_special))

    def apply_chat_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                            continue_final_message: bool = False) -> str:
        """The prompt text of ``messages`` ([{"role": ..., "content": ...}]) under the model's chat
        template; roles are those of ``ROLES`` ("developer" is rendered as "system").

        ``continue_final_message`` (vLLM's and transformers' name; llama.cpp's server calls it the
        assistant prefill): the last message is the assistant's unfinished answer, rendered open so
        that generation continues it (add_generation_prompt is then moot). Done as transformers
        does it, with the template's own rendering of the conversation: the final content is
        replaced by a marker, the text is cut where the marker lands and the content put back as
        given (so an empty or space-ended prefill stays exactly that).

        Raises:
            MessageError (a ValueError): malformed messages (unknown role, bad content or tool_calls);
                with continue_final_message, a last message that is not an assistant's text.
            ChatTemplateError (a ValueError): the model's template does not compile.
            ValueError: the model has no template, or the template refuses these messages (its
                ``raise_exception``, or an error while rendering them), or (continue_final_message)
                does not render the final content as given.
        """
        msgs = _check_messages(messages)
        agp = _boolean("add_generation_prompt", add_generation_prompt)
        if not _boolean("continue_final_message", continue_final_message):
            return self.tokenizer.apply_chat_template(msgs, add_generation_prompt=agp)
        last = len(msgs) - 1
        if msgs[last]["role"] != "assistant" or msgs[last].get("tool_calls"):
            raise MessageError(f"continue_final_message: the last message (messages[{last}]) must be an assistant "
                               "message with text and no tool_calls: the answer to continue", f"messages.{last}")
        if last > 0 and msgs[last - 1]["role"] == "assistant":  # as llama.cpp's server refuses it
            raise MessageError(f"continue_final_message: messages[{last - 1}] and messages[{last}] are both assistant "
                               "messages; only one, the last, can be the answer to continue", f"messages.{last - 1}")
        marker = "PyminferPrefillMarker7c1f"
        text = self.tokenizer.apply_chat_template(msgs[:last] + [{**msgs[last], "content": marker}],
                                                  add_generation_prompt=False)
        at = text.rfind(marker)
        if at < 0:
            raise ValueError("continue_final_message: this model's chat template does not render the assistant's "
                             "text as given, so it cannot be continued")
        return text[:at] + msgs[last]["content"]

    # ------------------------------------------------------------------ generation
    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """A prompt (str, tokenized with special parsing, or a list of ids) as a list of ids."""
        if isinstance(prompt, str):
            return self.tokenize(prompt, parse_special=True)
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Iterable):
            # None or a number read as "token ids must be a list of ints", misleading for text
            raise TypeError(f"prompt must be str or a list of token ids, got {type(prompt).__name__}")
        return _check_ids(prompt, self.tokenizer.n_vocab)

    def generate(self, prompt: Prompt, *, max_tokens: int | None = 128, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 seed: int | None = None, stop: str | Sequence[str] | None = None,
                 stream: bool = False, cache_prompt: bool = True, samplers: str | Sequence[str] | None = None,
                 n_indent: int = 0, t_max_predict_ms: float = 0.0,
                 logprobs: int | None = None, min_keep: int = 0) -> GenerationResult | Iterator[Chunk]:
        """Complete ``prompt``.

        Args:
            prompt: text (special tokens parsed, BOS added when the model wants it) or token ids.
            max_tokens: most tokens to generate (0: none, though with cache_prompt the prompt is
                still evaluated into the KV cache, a warm-up as llama.cpp's server does); None or -1
                (as the CLI's -n -1 and the server's n_predict -1): no limit, generate until an end-of-generation
                token, a stop string or a full context (stop_reason 'context'), as in llama-cpp-python.
            temperature: <= 0 is greedy (deterministic). top_k (<= 0 off), top_p, min_p,
                repeat_penalty (1.0 off) over the last repeat_last_n tokens (-1: all): llama.cpp's samplers.
                Numbers only: temperature, top_p, min_p and repeat_penalty take an int or a float,
                top_k, repeat_last_n, max_tokens and seed an int (a bool or a str is a TypeError);
                stream and cache_prompt a bool (a str such as "no" is a TypeError, not true).
            seed: RNG seed (None or negative: random).  stop: a string or strings that end the text
                (not included).
            samplers: llama.cpp's sampler chain, in order: names ("penalties", "top_k", "top_p",
                "min_p", "temperature", "infill"; "dry", "typ_p", "xtc", "top_n_sigma" do nothing) or
                their one-letter codes ("ekpmti..."); None: penalties, top_k, top_p, min_p,
                temperature. A setting whose sampler is not in the chain has no effect (no
                "temperature": the draw is at temperature 1), as in llama.cpp. "infill" (llama.cpp's
                sampler for fill-in-the-middle editors, pyminfer.sampling) needs top_k 1..1024 before it.
            n_indent: > 0: a line after the first that starts with fewer spaces / tabs ends the
                text before its first character (stop_reason 'indent'), as llama.cpp's n_indent.
            t_max_predict_ms: > 0: past that many ms after the first token, the next token bringing a
                newline ends the text (stop_reason 'time'), as llama.cpp's.
            logprobs: None, or n >= 0: each generated token's log-probability under the model (raw
                logits, before any sampler) and that many most likely alternatives, as
                ``result.logprobs`` / ``chunk.logprobs`` (pyminfer.TokenLogprob); the logits are
                then read back every token (a little slower; the tokens are the same).
            min_keep: the fewest candidates top_p and min_p leave (llama.cpp's; 0: no floor).
            stream: return an iterator of Chunk (``.text``, ``.token_ids``; the last one has ``.text == ""``
                and ``.result``) instead of the GenerationResult.
            cache_prompt: reuse the K/V of the longest prefix this prompt shares with the last
                generation's prompt + output (only the rest is prefilled; ``timings["cached_tokens"]``
                says how many), as llama.cpp's server and llama-cpp-python do. On the CPU the output
                is the same either way; on a GPU a long new part is prefilled on the tensor-core
                path, whose rows match single-token decoding within tolerance, not bitwise
                (docs/perf.md), so near-ties may resolve differently than without the cache.

        Returns:
            GenerationResult: ``text``, ``prompt_ids``, ``generated_ids``, ``finish_reason`` ('stop' or
            'length'), ``stop_reason`` ('eos', 'stop_string', 'max_tokens', 'context', 'indent',
            'time'), ``timings``
            (prefill/decode seconds and tokens/s), ``spec`` (speculative statistics or None),
            ``seed`` (the seed used: ``seed``, or one drawn at random; pass it back to repeat a run).

        Raises:
            ValueError: empty prompt, max_tokens < -1, sampling values out of range.
            pyminfer.engine.ContextFull (a ValueError): the prompt does not fit n_ctx.
            TypeError: a prompt that is neither str nor a list of ints; an argument of the wrong
                type (named in the message).
            RuntimeError: the LLM is closed, or this thread is still iterating another stream (another
                thread's generation is waited for instead: one generation at a time).
            pyminfer.NaNLogitsError (a RuntimeError): the model produced NaN logits (corrupt weights).
        """
        ids = self.prompt_ids(prompt)
        stream, cache_prompt = _boolean("stream", stream), _boolean("cache_prompt", cache_prompt)
        params = self._params(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, stop,
                              samplers, n_indent, t_max_predict_ms, logprobs, min_keep)
        if max_tokens is not None:
            max_tokens = _integer("max_tokens", max_tokens)
            if max_tokens < -1:
                raise ValueError(f"max_tokens must be >= -1 (-1 or None: no limit), got {max_tokens}")
        if max_tokens is None or max_tokens == -1:
            # n_ctx + 1 is more than fits after any prompt (a one-token prompt leaves room for
            # n_ctx: the last token needs no position): the generation ends at the latest when the
            # context is full, with stop_reason 'context'
            max_tokens = self.n_ctx + 1
        if not ids:
            raise ValueError("the prompt is empty (no tokens): give some text")
        if len(ids) >= self.n_ctx:
            from .engine import ContextFull

            raise ContextFull(f"the prompt has {len(ids)} tokens; the context holds n_ctx={self.n_ctx}")
        it = self._stream(ids, params, max_tokens, cache_prompt)
        if stream:
            return it
        res = None
        for ch in it:
            res = ch.result or res
        assert res is not None
        return res

    def prompt_logprobs(self, prompt: Prompt, logprobs: int = 0, *,
                        cancel: threading.Event | None = None) -> list[TokenLogprob | None]:
        """Each prompt token's log-probability under the model given the tokens before it, with
        the ``logprobs`` most likely alternatives (vLLM's prompt_logprobs; what OpenAI's echo with
        logprobs shows; how evaluation harnesses score a continuation): [None] for the first token,
        then a pyminfer.TokenLogprob for each other (``offset``: where its text starts in the
        prompt's text). The whole prompt is evaluated from position 0 (on a GPU in wide chunks, on
        the tensor-core path: within tolerance of token-by-token decoding) and stays in the KV
        cache, so a generation after it with the same prompt prefills nothing. ``cancel``: an
        event another thread may set; the scoring then stops before its next forward (a chunk of
        up to max_nt prompt tokens) with pyminfer.ScoringCancelled.

        Raises ValueError (empty prompt, logprobs < 0), ContextFull (a ValueError: longer than
        n_ctx), TypeError (a prompt neither str nor ids; logprobs not an int), RuntimeError as
        :meth:`generate` does, ScoringCancelled (``cancel`` set).
        """
        ids = self.prompt_ids(prompt)
        n = _integer("logprobs", logprobs)
        self._acquire()
        try:
            self._cache_ids = []  # until it is done the cache holds a mix
            out = prompt_logprobs(self.model, ids, n, cancel.is_set if cancel is not None else None)
            self._cache_ids = list(ids)
            return out
        finally:
            self._marks = (self.model.writes, self._draft.writes if self._draft is not None else -1)
            self._release()

    def infill(self, prefix: str, suffix: str = "", *, extra: Sequence[InfillChunk] = (), prompt: str = "",
               **kw: Any) -> GenerationResult | Iterator[Chunk]:
        """Fill in the middle: the text that goes between ``prefix`` and ``suffix`` (code models with
        FIM tokens, such as Qwen2.5-Coder), as llama.cpp's server's /infill.

        ``extra``: other files' text (``pyminfer.InfillChunk(text, filename)``), placed before the
        prefix; ``prompt``: text that ends the prefix (the start of the cursor's line, as editor
        plugins send it to llama.cpp's server; not in the result). The prompt is built as token
        ids by :func:`pyminfer.infill.infill_ids` (FIM markers in the inputs' text stay text; long
        inputs cut as llama.cpp cuts them); ``kw`` are
        :meth:`generate`'s (``max_tokens`` defaults to 128 as there). Returns what :meth:`generate`
        returns. Raises pyminfer.infill.InfillUnsupportedError (a ValueError) for a model without
        FIM prefix / suffix / middle tokens, TypeError for inputs that are not str, and what
        :meth:`generate` raises.
        """
        for name, v in (("prefix", prefix), ("suffix", suffix), ("prompt", prompt)):
            if not isinstance(v, str):
                raise TypeError(f"{name} must be str, got {type(v).__name__}")
        chunks = list(extra if extra is not None else ())
        for i, c in enumerate(chunks):
            if not isinstance(c, InfillChunk):
                raise TypeError(f"extra[{i}] must be a pyminfer.InfillChunk, got {type(c).__name__}")
        n = kw.get("max_tokens", 128)
        ids = infill_ids(self.tokenizer, prefix, suffix, extra=chunks, prompt=prompt, n_ctx=self.n_ctx,
                         n_predict=n if isinstance(n, int) and not isinstance(n, bool) else None)
        return self.generate(ids, **kw)

    def chat(self, messages: list[dict[str, Any]], *, continue_final_message: bool = False,
             add_generation_prompt: bool | None = None, **kw: Any) -> GenerationResult | Iterator[Chunk]:
        """Answer a conversation: ``messages`` ([{"role": "system"|"developer"|"user"|"assistant"|"tool",
        "content": str}], assistant turns optionally with OpenAI ``tool_calls``) rendered with the
        model's chat template plus the assistant prefix (``add_generation_prompt``, as the server's
        field: None or True adds it, False leaves it out), then ``generate(**kw)`` (same keywords and
        return value). ``continue_final_message``: the last message is the assistant's unfinished
        answer, which the result continues (its text is only the continuation; see
        ``apply_chat_template``). Raises ValueError (see ``apply_chat_template``) without a usable
        chat template or for malformed messages, and, as the server's 400, for
        continue_final_message and add_generation_prompt both True; TypeError for a keyword neither
        this method nor ``generate`` takes (before the template is rendered)."""
        bad = sorted(set(kw) - _GENERATE_KW)
        if bad:
            what = {"tools": "tool definitions", "tool_choice": "tool choice", "response_format": "response formats"}
            note = f" ({what[bad[0]]} are not supported)" if bad[0] in what else ""
            raise TypeError(f"LLM.chat() got an unexpected keyword argument {bad[0]!r}{note}")
        if continue_final_message is True and add_generation_prompt is True:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true (the last "
                             "message is either continued or answered)")
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt is not False,
                                        continue_final_message=continue_final_message)
        return self.generate(text, **kw)

    def _params(self, temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float,
                repeat_last_n: int, seed: int | None, stop: str | Sequence[str] | None,
                samplers: str | Sequence[str] | None = None, n_indent: int = 0,
                t_max_predict_ms: float = 0.0, logprobs: int | None = None, min_keep: int = 0) -> SamplingParams:
        if stop is None:
            stops: list[str] = []
        elif isinstance(stop, str):
            stops = [stop]
        else:
            # an int or other non-iterable failed inside list() with "'int' object is not iterable"
            if not isinstance(stop, Iterable) or isinstance(stop, (bytes, bytearray)):
                raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
            stops = list(stop)
            bad = next((i for i, s in enumerate(stops) if not isinstance(s, str)), None)
            if bad is not None:
                raise TypeError(f"stop must be a string or a list of strings, got {type(stop).__name__} with "
                                f"{type(stops[bad]).__name__} stop[{bad}]")
        for i, s in enumerate(stops):
            check_unicode(s, f"stop[{i}]")
        # no float()/int() on the raw values: they read "0" as 0.0, True as 1.0 and 2.5 as 2
        p = SamplingParams(temperature=_real("temperature", temperature), top_k=_integer("top_k", top_k),
                           top_p=_real("top_p", top_p), min_p=_real("min_p", min_p),
                           repeat_penalty=_real("repeat_penalty", repeat_penalty),
                           repeat_last_n=_integer("repeat_last_n", repeat_last_n),
                           seed=None if seed is None else _integer("seed", seed), stop=stops,
                           samplers=_sampler_chain(samplers), n_indent=_integer("n_indent", n_indent),
                           t_max_predict_ms=_real("t_max_predict_ms", t_max_predict_ms),
                           logprobs=None if logprobs is None else _integer("logprobs", logprobs),
                           min_keep=_integer("min_keep", min_keep))
        p.validate()
        return p

    def _acquire(self) -> None:
        me = threading.get_ident()
        if self._owner == me:
            raise RuntimeError("a generation of this LLM is still running in this thread (finish or close "
                               "the previous stream first)")
        self._lock.acquire()
        self._owner = me

    def _release(self) -> None:
        self._owner = None
        self._lock.release()

    def _stream(self, ids: list[int], params: SamplingParams, max_tokens: int, cache_prompt: bool = True
                ) -> Iterator[Chunk]:
        """generate_stream over this LLM's model(s), reusing the K/V of the longest prefix ``ids``
        shares with what the caches hold from the last generation (``cache_prompt``; llama.cpp's
        server and llama-cpp-python do the same): only the rest of the prompt is prefilled."""
        from .chat import common_prefix

        self._acquire()
        try:
            # a model written since our last generation (directly, or by another LLM wrapping the
            # same Model) holds other K/V than our bookkeeping says: forget it
            if self._marks[0] != self.model.writes:
                self._cache_ids = []
            if self._draft is not None and self._marks[1] != self._draft.writes:
                self._draft_ids = []
            n_past = common_prefix(self._cache_ids, ids) if cache_prompt else 0
            dn = common_prefix(self._draft_ids, ids) if cache_prompt and self._draft is not None else 0
            # until tokens come out only the common prefixes are known to be valid (the prefill
            # overwrites the positions after them)
            self._cache_ids, self._draft_ids = ids[:n_past], ids[:dn]
            generated: list[int] = []
            res = None
            try:
                # max_tokens 0 with the cache on: the prompt is evaluated all the same (warm-up)
                warm = max_tokens == 0 and cache_prompt
                for ch in generate_stream(self.model, ids, params, max_tokens, draft=self._draft,
                                          spec_draft_n=self.spec_draft_n, spec_adaptive=self.spec_adaptive,
                                          spec_ngram=self.spec_ngram, n_past=n_past, draft_n_past=dn, warm=warm):
                    generated.extend(ch.token_ids)
                    res = ch.result or res
                    if ch.result is not None and warm:
                        self._cache_ids = list(ids)  # every prompt position's K/V is in the cache now
                        if (ch.result.spec or {}).get("draft_n_past") == len(ids):  # and in the draft's
                            self._draft_ids = list(ids)
                    yield ch
            finally:
                model, draft = self._model, self._draft  # once: close() may run meanwhile
                if model is None:  # closed while this stream was open: nothing left to track
                    self._cache_ids, self._draft_ids = [], []
                else:
                    if generated:
                        # every generated token but the last has its K/V in the cache: a yielded
                        # token is fed forward by the next step or round, and a native forward is
                        # never cut halfway (pyminfer.chat keeps the same invariant)
                        self._cache_ids = ids + generated[:-1]
                        dnp = (res.spec or {}).get("draft_n_past") if res is not None else None
                        if isinstance(dnp, int):
                            self._draft_ids = (ids + list(res.generated_ids))[:dnp]
                    self._marks = (model.writes, draft.writes if draft is not None else -1)
        finally:
            self._release()

    def reset(self) -> None:
        """Forget what the KV caches hold: the next generation prefills its whole prompt (as
        llama-cpp-python's Llama.reset). Raises RuntimeError while this thread iterates a stream;
        waits for another thread's generation."""
        self._acquire()
        try:
            self._cache_ids, self._draft_ids = [], []
        finally:
            self._release()

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Free the KV caches and device memory of the model (and draft). Idempotent."""
        for attr in ("_draft", "_model"):
            m = getattr(self, attr, None)
            if m is not None:
                m.close()
                setattr(self, attr, None)

    def __enter__(self) -> "LLM":
        self.model  # noqa: B018 - raises RuntimeError when closed, like every other use after close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        if self._model is None:
            return "LLM(closed)"
        d = f", draft={self._draft.gguf.path.name!r}" if self._draft is not None else ""
        return f"LLM({self.name!r}, device={self.device!r}, n_ctx={self.n_ctx}{d})"


# The keywords LLM.chat passes on to LLM.generate (checked before its template is rendered).
_GENERATE_KW = frozenset(inspect.signature(LLM.generate).parameters) - {"self", "prompt"}


def _real(name: str, v: Any) -> float:
    """``v`` as a float when it is a real number (int, float, numpy scalar); TypeError naming the
    argument otherwise, a bool included (True is an int to Python, not a temperature)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(v).__name__}")
    return float(v)


def _integer(name: str, v: Any) -> int:
    """``v`` as an int when it is an integer (numpy's included); TypeError naming the argument
    otherwise: a bool, and a float even when whole (as the server refuses 2.0 for max_tokens)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    return int(v)


def _sampler_chain(v: Any) -> tuple[str, ...] | None:
    """``samplers`` as SamplingParams takes it (ValueError for an unknown name, TypeError for a
    value that is neither a str nor a list of str)."""
    if v is None:
        return None
    if isinstance(v, str):
        return parse_samplers(v)
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return parse_samplers(list(v))
    raise TypeError(f"samplers must be a str or a list of str, got {type(v).__name__}")


def _boolean(name: str, v: Any) -> bool:
    """``v`` when it is a bool (numpy's included); TypeError naming the argument otherwise: a
    string such as "no" is truthy, so taking it would silently flip the flag."""
    import numpy as np

    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    return bool(v)


def _check_ids(ids: Any, n_vocab: int) -> list[int]:
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError("token ids must be a list of ints")
    out: list[int] = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            try:
                import numpy as np

                if isinstance(i, np.integer):
                    i = int(i)
                else:
                    raise TypeError
            except TypeError:
                raise TypeError(f"token ids must be ints, got {type(i).__name__}") from None
        if not 0 <= i < n_vocab:
            raise ValueError(f"token id {i} is outside the vocabulary (0..{n_vocab - 1})")
        out.append(i)
    return out


def _check_tool_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    """OpenAI ``tool_calls`` of assistant message ``i``, each function's ``arguments`` as an object:
    OpenAI sends them as JSON text, but templates (HF convention) expect a mapping and would
    otherwise print a quoted string (the same conversion as vLLM and llama.cpp)."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise MessageError(f"{where} must be a list of tool calls", f"messages.{i}.tool_calls")
    out = []
    for k, tc in enumerate(calls):
        w, param = f"{where}[{k}]", f"messages.{i}.tool_calls.{k}"
        if not isinstance(tc, dict):
            raise MessageError(f"{w} must be an object", param)
        if tc.get("type", "function") != "function":
            raise MessageError(f"{w}.type must be 'function'", param + ".type")
        if "id" in tc and not isinstance(tc["id"], str):
            raise MessageError(f"{w}.id must be a string", param + ".id")
        fn = tc.get("function")
        if not isinstance(fn, dict):
            raise MessageError(f"{w}.function must be an object with 'name' and 'arguments'", param + ".function")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise MessageError(f"{w}.function.name must be a non-empty string", param + ".function.name")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = None
        if not isinstance(args, dict):
            raise MessageError(f"{w}.function.arguments must be a JSON object (as text or as an object)",
                               param + ".function.arguments")
        out.append({**tc, "function": {**fn, "arguments": args}})
    return out


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as the template gets them: content as one string, "developer" as "system",
    tool_calls' arguments as objects. MessageError for anything malformed."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages must be a non-empty list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise MessageError(f"messages[{i}] must be a dict with a string 'role'", f"messages.{i}")
        role = m["role"]
        if role not in ROLES:
            # a role the template does not know is dropped or mislabeled by most templates: refuse it
            raise MessageError(f"messages[{i}].role: unknown role {role!r}; accepted roles: {', '.join(ROLES)}",
                               f"messages.{i}.role")
        c = m.get("content")
        if c is None:
            # OpenAI (and the server): content is required, except in an assistant turn that carries
            # tool calls; a missing user turn would be rendered empty, answering a question nobody asked
            if not (role == "assistant" and m.get("tool_calls") not in (None, [])):
                raise MessageError(f"messages[{i}].content must be a string or a list of content parts (null or "
                                   "missing only in an assistant message with tool_calls)", f"messages.{i}.content")
            c = ""
        if isinstance(c, list):  # OpenAI content parts: keep the text ones
            parts = []
            for j, p in enumerate(c):
                if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                    parts.append(p["text"])
                elif isinstance(p, dict) and p.get("type") == "text":  # the text part, not its type, is at fault
                    raise MessageError(f"messages[{i}].content[{j}].text must be a string (a text part's text), got "
                                       f"{'nothing' if 'text' not in p else type(p['text']).__name__}",
                                       f"messages.{i}.content.{j}.text")
                else:
                    raise MessageError(f"messages[{i}].content: only text parts are supported", f"messages.{i}.content")
            c = "\n".join(parts)  # as vLLM (string content format) and llama.cpp's server join them
        if not isinstance(c, str):
            raise MessageError(f"messages[{i}].content must be a string", f"messages.{i}.content")
        try:
            check_unicode(c, f"messages[{i}].content")
        except ValueError as e:
            raise MessageError(str(e), f"messages.{i}.content") from None
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise MessageError(f"messages[{i}].{key} must be a string", f"messages.{i}.{key}")
        msg = {**m, "role": "system" if role == "developer" else role, "content": c}
        if m.get("tool_calls") is not None:
            msg["tool_calls"] = _check_tool_calls(m["tool_calls"], i)
            if msg["tool_calls"] and role != "assistant":
                raise MessageError(f"messages[{i}].tool_calls: only assistant messages carry tool calls",
                                   f"messages.{i}.tool_calls")
        out.append(msg)
    return out
