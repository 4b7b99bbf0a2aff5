"""Generation: a token source (plain decoding or speculative) driven until EOS, a stop string,
max_tokens or a full context, with streaming detokenization.

Plain decoding evaluates one token per forward. Where sampling is greedy without a repetition
penalty, only the on-device argmax (one int32) is read back per token.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .engine import ContextFull, Model
from .ngram import NgramSpec
from .sampling import NaNLogitsError, Sampler, SamplingParams, StopChecker, TokenLogprob, token_logprob
from .tokenizer import StreamDecoder


@dataclass
class GenerationResult:
    """What one generation produced.

    finish_reason: 'stop' (end-of-generation token or stop string) or 'length' (max_tokens, the
    context filled up, or one of llama.cpp's limits); stop_reason says which: 'eos', 'stop_string',
    'max_tokens', 'context', 'indent' (SamplingParams.n_indent), 'time' (t_max_predict_ms).
    timings: load/prefill/decode seconds and tokens/s. spec: speculative statistics or None.
    stop_word: the stop string that ended the text when stop_reason is 'stop_string', else "".
    logprobs: with SamplingParams.logprobs, a TokenLogprob for each generated token whose text
    starts inside ``text`` (not an ending end-of-generation token, nor tokens cut off with a stop
    string); else None.
    seed: the seed the sampler's RNG used: SamplingParams.seed, or the one drawn at random when that
    was None or negative; given back as ``seed``, it repeats the run (a greedy run draws no token at
    random, so its seed, drawn all the same, changes nothing).
    """

    text: str
    prompt_ids: list[int]
    generated_ids: list[int]
    finish_reason: str
    stop_reason: str
    timings: dict[str, float]
    spec: dict[str, Any] | None = None
    stop_word: str = ""
    logprobs: list[TokenLogprob] | None = None
    seed: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("text", "prompt_ids", "generated_ids", "finish_reason", "stop_reason",
                                            "timings", "seed")}
        if self.spec is not None:
            d["spec"] = self.spec
        if self.stop_word:
            d["stop_word"] = self.stop_word
        if self.logprobs is not None:
            d["logprobs"] = [{"id": e.id, "logprob": e.logprob, "offset": e.offset, "top": [list(t) for t in e.top]}
                             for e in self.logprobs]
        return d


@dataclass
class Chunk:
    """One streamed piece: new text and the ids that produced it; the last chunk carries result.
    logprobs: with SamplingParams.logprobs, the TokenLogprob of each token whose text starts in
    this chunk's text or before it (a token's entry comes with its first character, so one held
    back as the possible start of a stop string comes later, or never)."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    result: GenerationResult | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)


class IndentChecker:
    """llama.cpp's n_indent for generated text: every line after the first must start with at
    least ``n_indent`` spaces / tabs; the first line that does not (an empty line included: its
    newline comes first) ends the text just before its first other character (server.cpp
    process_token, which keeps that line's indentation as here).

    ``push(text)`` returns (the text to keep, stopped?)."""

    def __init__(self, n_indent: int):
        self.n = n_indent
        self.col: int | None = None  # spaces / tabs so far on the current line; None: not checking

    def push(self, text: str) -> tuple[str, bool]:
        if self.n <= 0:
            return text, False
        for i, ch in enumerate(text):
            if self.col is not None:
                if ch in " \t":
                    self.col += 1
                    continue
                if self.col < self.n:
                    return text[:i], True
                self.col = None
            if ch == "\n":
                self.col = 0
        return text, False


class PlainDecoder:
    """One token per target forward. ``stats`` holds prefill/decode timings after iteration."""

    def __init__(self, model: Model, sampler: Sampler):
        self.model = model
        self.sampler = sampler
        self.stats: dict[str, float] = {}

    def tokens(self, prompt_ids: Sequence[int], n_past: int = 0) -> Iterator[int]:
        """Yield generated ids forever (the caller stops). ``n_past``: leading prompt positions
        whose K/V are already in the cache. Raises ContextFull when the cache is full."""
        m, smp = self.model, self.sampler
        need = smp.p.needs_logits
        n_past = min(n_past, len(prompt_ids) - 1)
        t0 = time.perf_counter()
        out = m.prefill(list(prompt_ids[n_past:]), n_past, logits=need)
        t1 = time.perf_counter()
        self.stats.update(prefill_s=t1 - t0, prefill_tokens=len(prompt_ids) - n_past, decode_s=0.0, decode_tokens=0)
        hist = list(prompt_ids)
        while True:
            try:
                tok = smp.sample(out, hist) if need else int(out[0])
            except NaNLogitsError as e:  # name the file, as the native argmax path does
                raise m.nan_error() from e
            hist.append(tok)
            yield tok
            ts = time.perf_counter()
            out = m.forward([tok], len(hist) - 1, [0], logits=need)
            if need:
                out = out[0]
            self.stats["decode_s"] += time.perf_counter() - ts
            self.stats["decode_tokens"] += 1


def generate_stream(model: Model, prompt_ids: Sequence[int], params: SamplingParams, max_tokens: int, *,
                    draft: Model | None = None, spec_draft_n: int | None = None,
                    spec_adaptive: bool = False, spec_ngram: NgramSpec | None = None, n_past: int = 0,
                    draft_n_past: int = 0,
                    skip_special: bool = True, warm: bool = False) -> Iterator[Chunk]:
    """Generate up to ``max_tokens`` tokens after ``prompt_ids``, yielding text chunks.

    With ``draft`` and/or ``spec_ngram`` (n-gram drafts, pyminfer.ngram) the tokens come from
    speculative decoding (pyminfer.spec), which at temperature 0 gives the same ids as plain
    decoding: ``spec_draft_n`` draft tokens a round, or with ``spec_adaptive`` the first depth tried
    (None: 4, or 1 with spec_adaptive; pyminfer.spec.default_draft_n). Raises ValueError for an
    empty prompt, a prompt that does not fit n_ctx, or max_tokens < 0. ``n_past`` /
    ``draft_n_past``: leading prompt positions whose K/V are already in the target's / draft's
    cache (multi-turn chat).
    Every generated id appears in exactly one chunk's token_ids (text may be "" while a UTF-8
    character or a possible stop string is incomplete).
    ``warm`` with ``max_tokens`` 0: the prompt is still evaluated into the target's KV cache (from
    n_past on) and the draft model's (from draft_n_past on, where it fits the draft's n_ctx; the
    result's spec["draft_n_past"] says how far) and nothing is generated, so that a later generation
    sharing the prompt reuses it (llama.cpp's server does this for n_predict 0: an editor's cache
    warm-up).
    """
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty (no tokens): give some text")
    if max_tokens < 0:
        raise ValueError("max_tokens must be >= 0")
    if len(prompt_ids) >= model.n_ctx:
        raise ContextFull(f"the prompt has {len(prompt_ids)} tokens; the context holds n_ctx={model.n_ctx} "
                          "(need at least one free position to generate)")
    sampler = Sampler(params, model.tokenizer)
    n_past = max(0, min(n_past, len(prompt_ids) - 1))  # the last prompt token is always evaluated
    speculative = draft is not None or spec_ngram is not None
    if speculative:
        from .spec import SpecDecoder

        dec: Any = SpecDecoder(model, draft, sampler, draft_n=spec_draft_n, adaptive=spec_adaptive, ngram=spec_ngram)
        dec.max_tokens = max_tokens
    else:
        dec = PlainDecoder(model, sampler)
    tok = model.tokenizer
    sd = StreamDecoder(tok, skip_special=skip_special)
    stopper = StopChecker(params.stop)
    indent = IndentChecker(params.n_indent)
    t_first: float | None = None  # when the first token came (llama.cpp's t_start_generation)
    # logprobs: each token's entry waits with the text offset where its text starts (the text
    # decoded before it) until the text given out passes that offset
    want_lp = params.logprobs is not None
    waiting: deque[tuple[int, TokenLogprob]] = deque()
    decoded = given = 0  # characters decoded (before stop strings / n_indent), given out
    kept_lp: list[TokenLogprob] = []

    def release(text: str) -> list[TokenLogprob]:
        nonlocal given
        given += len(text)
        out: list[TokenLogprob] = []
        while waiting and waiting[0][0] < given:
            out.append(waiting.popleft()[1])
        kept_lp.extend(out)
        return out
    generated: list[int] = []
    text_parts: list[str] = []
    finish, reason = "length", "max_tokens"
    t_start = time.perf_counter()
    warm_stats: dict[str, Any] = {}
    if max_tokens == 0 and warm:
        model.prefill(list(prompt_ids[n_past:]), n_past, logits=False)
        if speculative:  # the draft's cache too, as its generation would
            dec.draft_prefill(prompt_ids, draft_n_past)
        warm_stats = {"prefill_s": time.perf_counter() - t_start, "prefill_tokens": len(prompt_ids) - n_past}
    if max_tokens == 0:
        src: Any = iter(())
    elif speculative:
        src = dec.tokens(prompt_ids, n_past, draft_n_past)
    else:
        src = dec.tokens(prompt_ids, n_past)
    try:
        while len(generated) < max_tokens:
            try:
                t = next(src)
            except StopIteration:
                break
            except ContextFull:
                finish, reason = "length", "context"
                break
            generated.append(t)
            if t_first is None:
                t_first = time.perf_counter()
            lp = sampler.logprobs.popleft() if want_lp else None
            if t in tok.eog_ids:
                finish, reason = "stop", "eos"
                yield Chunk("", [t])
                break
            piece = sd.feed(t)
            if lp is not None:
                lp.offset = decoded
                waiting.append((decoded, lp))
            decoded += len(piece)
            out, stopped = stopper.push(piece)
            out, cut = indent.push(out)
            text_parts.append(out)
            yield Chunk(out, [t], logprobs=release(out) if want_lp else [])
            if cut:
                finish, reason = "length", "indent"
                break
            if stopped:
                finish, reason = "stop", "stop_string"
                break
            # llama.cpp's t_max_predict_ms: once over time, stop at a token that brings a newline
            if (params.t_max_predict_ms > 0 and "\n" in out
                    and time.perf_counter() - t_first > params.t_max_predict_ms / 1000.0):
                finish, reason = "length", "time"
                break
    finally:
        close = getattr(src, "close", None)
        if close:
            close()
    if reason not in ("stop_string", "indent"):
        # a generation cut mid-character (max_tokens, EOS, full context) leaves incomplete UTF-8
        # bytes: drop them rather than end the text with U+FFFD
        tail, stopped = stopper.push(sd.flush(drop_incomplete=True))
        tail += "" if stopped else stopper.flush()
        tail, cut = indent.push(tail)
        if cut:
            finish, reason = "length", "indent"
        elif stopped:
            finish, reason = "stop", "stop_string"
        if tail:
            text_parts.append(tail)
            yield Chunk(tail, [], logprobs=release(tail) if want_lp else [])
    total = time.perf_counter() - t_start
    st = {**dec.stats, **warm_stats}
    timings = {
        "load_s": model.load_time,
        "prefill_s": st.get("prefill_s", 0.0),
        "prefill_tokens": st.get("prefill_tokens", 0),
        "cached_tokens": n_past if st.get("prefill_s") is not None else 0,  # prompt positions reused
        "prefill_tok_s": st.get("prefill_tokens", 0) / st["prefill_s"] if st.get("prefill_s") else 0.0,
        "decode_s": total - st.get("prefill_s", 0.0),
        "total_s": total,
    }
    n_dec = max(len(generated) - 1, 0)  # the first token comes out of the prefill
    timings["decode_tok_s"] = n_dec / timings["decode_s"] if timings["decode_s"] > 0 and n_dec else 0.0
    spec = dec.spec_stats() if hasattr(dec, "spec_stats") else None
    res = GenerationResult("".join(text_parts), list(prompt_ids), generated, finish, reason, timings, spec,
                           stopper.word if reason == "stop_string" else "", kept_lp if want_lp else None, sampler.seed)
    yield Chunk("", [], res)


_SCORE_BYTES = 64 << 20  # most bytes of logits prompt_logprobs reads back a forward


class ScoringCancelled(Exception):
    """prompt_logprobs gave up because its ``cancelled`` callback said so (between forwards)."""


def prompt_logprobs(model: Model, ids: Sequence[int], n_top: int,
                    cancelled: Callable[[], bool] | None = None) -> list[TokenLogprob | None]:
    """Each prompt token's log-probability given the tokens before it (vLLM's prompt_logprobs,
    OpenAI's echo with logprobs): [None] for the first token (nothing predicts it), then a
    TokenLogprob for ids[1:] with the ``n_top`` most likely alternatives; ``offset``: where the
    token's text starts in the prompt's text (``detokenize(ids)``, special tokens included).

    The prompt is evaluated from position 0 in chunks of the model's max_nt rows (fewer where
    their logits would pass 64 MiB: 110 rows with a 151,936-token vocabulary) with every row's
    logits (on a GPU chunks of more than 8 rows take the tensor-core path, within its tolerance of
    token-by-token decoding; docs/perf.md), so the KV cache then holds it. ``cancelled``: asked
    before each forward; True stops the scoring with ScoringCancelled (the cache then holds part of
    the prompt). Raises ValueError for an empty prompt or n_top < 0, ContextFull when it does not
    fit n_ctx.
    """
    if len(ids) == 0:
        raise ValueError("the prompt is empty (no tokens): give some text")
    if n_top < 0:
        raise ValueError(f"logprobs (the alternatives a token) must be >= 0, got {n_top}")
    if len(ids) > model.n_ctx:
        raise ContextFull(f"the prompt has {len(ids)} tokens; the context holds n_ctx={model.n_ctx}")
    out: list[TokenLogprob | None] = [None]
    # Rows a forward: max_nt, fewer where their f32 logits would pass _SCORE_BYTES (Qwen's 151,936
    # vocabulary x 512 rows is 311 MB a forward to read back and hold).
    step = max(1, min(model.max_nt, _SCORE_BYTES // (4 * model.n_vocab)))
    for i in range(0, len(ids), step):  # the last token too: the cache then holds all of them
        if cancelled is not None and cancelled():
            raise ScoringCancelled(f"scoring stopped after {i} of {len(ids)} prompt tokens")
        chunk = list(ids[i:i + step])
        rows = model.forward(chunk, i, list(range(len(chunk))), logits=True)
        for j, row in enumerate(rows):
            if i + j + 1 < len(ids):
                if np.isnan(row).any():
                    raise model.nan_error()
                out.append(token_logprob(row, int(ids[i + j + 1]), n_top))
    sd = StreamDecoder(model.tokenizer)
    at = 0
    for i, t in enumerate(ids):
        e = out[i]
        if e is not None:
            e.offset = at
        at += len(sd.feed(int(t)))
    return out


def generate(model: Model, prompt_ids: Sequence[int], params: SamplingParams, max_tokens: int,
             **kw: Any) -> GenerationResult:
    """Non-streaming ``generate_stream``: returns the final GenerationResult."""
    res = None
    for ch in generate_stream(model, prompt_ids, params, max_tokens, **kw):
        res = ch.result or res
    assert res is not None
    return res
