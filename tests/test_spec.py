"""Speculative decoding: identity with plain decoding, vocabulary gate, statistics.

The CPU draft here is the target truncated to its first 24 of 30 layers: a self-draft whose
acceptance (~15% per token) is far below 100%, so rejections, rollbacks and draft catch-up are all
exercised many times per run, and whose tokenizer is the target's.
"""

from __future__ import annotations

import os
import types

import numpy as np
import pytest

from pyminfer.engine import Model
from pyminfer.generate import generate
from pyminfer.sampling import SamplingParams
from pyminfer.spec import MAX_DEPTH, VocabMismatch, check_vocab_compat

from prompts import PROMPTS

N_TOKENS = int(os.environ.get("PYMINFER_IDENTITY_TOKENS", "256"))


@pytest.fixture(scope="module")
def smol_draft(smol_path):
    m = Model(smol_path, device="cpu", n_ctx=2048, n_layer=24)
    yield m
    m.close()


def _ids(m: Model, text: str, chat: bool) -> list[int]:
    if chat:
        text = m.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return m.tokenizer.encode(text)


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_identity_greedy(smol, smol_draft, penalty):
    """20 prompts x 256 tokens: every depth 1..8 (spread over the prompts) and adaptive give the
    ids of plain greedy decoding, with and without repetition penalty."""
    params = SamplingParams(temperature=0.0, repeat_penalty=penalty)
    accepted = drafted = 0
    for i, (cat, text, chat) in enumerate(PROMPTS):
        ids = _ids(smol, text, chat)
        ref = generate(smol, ids, params, N_TOKENS).generated_ids
        for d, adaptive in ((1 + i % MAX_DEPTH, False), (4, True)):
            res = generate(smol, ids, params, N_TOKENS, draft=smol_draft, spec_draft_n=d, spec_adaptive=adaptive)
            assert res.generated_ids == ref, f"prompt {i} ({cat}) d={d} adaptive={adaptive} penalty={penalty}"
            accepted += res.spec["accepted"]
            drafted += res.spec["drafted"]
    # the check must exercise both acceptance and rejection, many times
    assert accepted >= 100 and drafted - accepted >= 100, (accepted, drafted)


@pytest.mark.slow
@pytest.mark.parametrize("d", list(range(1, MAX_DEPTH + 1)))
def test_identity_every_depth_every_prompt(smol, smol_draft, d):
    params = SamplingParams(temperature=0.0)
    for i, (cat, text, chat) in enumerate(PROMPTS):
        ids = _ids(smol, text, chat)
        ref = generate(smol, ids, params, N_TOKENS).generated_ids
        assert generate(smol, ids, params, N_TOKENS, draft=smol_draft, spec_draft_n=d).generated_ids == ref


def test_identity_sampling_same_seed(smol, smol_draft):
    """At temperature > 0 each emitted token is one draw in order: same seed, same text."""
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1234)
    ids = _ids(smol, PROMPTS[10][1], False)
    ref = generate(smol, ids, params, 64).generated_ids
    assert generate(smol, ids, params, 64, draft=smol_draft, spec_draft_n=3).generated_ids == ref


def test_penalty_over_the_whole_context_identity(smol, smol_draft):
    """repeat_last_n = -1 (llama.cpp: the whole context): the penalty window is every token so far,
    and speculation gives plain decoding's ids; the window differs from the default 64's."""
    from pyminfer.sampling import Sampler

    hist = list(range(100))
    assert list(Sampler(SamplingParams(repeat_last_n=-1)).penalty_window(hist)) == hist
    assert list(Sampler(SamplingParams(repeat_last_n=64)).penalty_window(hist)) == hist[-64:]
    with pytest.raises(ValueError, match="repeat_last_n"):
        SamplingParams(repeat_last_n=-2).validate()
    ids = _ids(smol, PROMPTS[3][1], True)
    params = SamplingParams(temperature=0.0, repeat_penalty=1.3, repeat_last_n=-1)
    ref = generate(smol, ids, params, 96).generated_ids
    for d, adaptive in ((3, False), (4, True)):
        res = generate(smol, ids, params, 96, draft=smol_draft, spec_draft_n=d, spec_adaptive=adaptive)
        assert res.generated_ids == ref, (d, adaptive)


def test_stop_string_identity(smol, smol_draft):
    ids = _ids(smol, PROMPTS[0][1], False)
    params = SamplingParams(temperature=0.0, stop=["return"])
    a = generate(smol, ids, params, 128)
    b = generate(smol, ids, params, 128, draft=smol_draft, spec_draft_n=5)
    assert (a.text, a.generated_ids, a.finish_reason) == (b.text, b.generated_ids, b.finish_reason)


def test_context_full_mid_round(smol_path):
    with Model(smol_path, device="cpu", n_ctx=40) as t, Model(smol_path, device="cpu", n_ctx=40, n_layer=24) as d:
        ids = t.tokenizer.encode("Once upon a time")
        ref = generate(t, ids, SamplingParams(temperature=0), 100)
        res = generate(t, ids, SamplingParams(temperature=0), 100, draft=d, spec_draft_n=7)
        assert res.stop_reason == "context" and ref.stop_reason == "context"
        assert res.generated_ids == ref.generated_ids


def test_vocab_gate(smol, qwen05):
    check_vocab_compat(smol.tokenizer, smol.tokenizer)
    with pytest.raises(VocabMismatch, match="vocabulary sizes differ"):
        check_vocab_compat(qwen05.tokenizer, smol.tokenizer)


def test_stats(smol, smol_draft):
    ids = _ids(smol, PROMPTS[0][1], False)
    s = generate(smol, ids, SamplingParams(temperature=0), 64, draft=smol_draft, spec_draft_n=3).spec
    # every round drafts 3, except the last few, clamped to the tokens still wanted (once fewer
    # than 4 remain: at most 2 + 1 drafts short per round, and the shortfall shrinks each round)
    assert s["rounds"] > 0 and 3 * s["rounds"] - 6 <= s["drafted"] <= 3 * s["rounds"]
    assert sum(s["drafted_per_position"]) == s["drafted"] and sum(s["accepted_per_position"]) == s["accepted"]
    assert s["drafted_per_position"][0] >= s["rounds"] - 1
    assert 1.0 <= s["tokens_per_round"] <= 4.0
    # rounds per depth: all at d = 3 but the last few, clamped to the tokens still wanted
    assert sum(s["depth_counts"]) == s["rounds"] and s["depth_counts"][3] >= s["rounds"] - 3
    assert s["depth_counts"][4:] == [0] * (MAX_DEPTH - 3)


def test_default_depths(smol, smol_draft):
    """No depth asked for: 4 draft tokens a round, and adaptive depth starts at 1 (spec.ADAPTIVE_START:
    a short reply or early misses pay deep start rounds in full); both capped at max_nt - 1. The
    adaptive controller's first rounds are d = 0 (prices a plain forward), then its start twice."""
    from pyminfer.sampling import Sampler
    from pyminfer.spec import SpecDecoder, default_draft_n

    assert (default_draft_n(False), default_draft_n(True), default_draft_n(False, 3), default_draft_n(True, 1)) \
        == (4, 1, 2, 0)
    sampler = Sampler(SamplingParams(temperature=0), smol.tokenizer)
    assert SpecDecoder(smol, smol_draft, sampler).draft_n == 4
    assert SpecDecoder(smol, smol_draft, sampler, adaptive=True).adaptive.start == 1
    assert SpecDecoder(smol, smol_draft, sampler, draft_n=4, adaptive=True).adaptive.start == 4  # asked for
    dec = SpecDecoder(smol, smol_draft, sampler, adaptive=True)
    dec.max_tokens = 16
    for _ in zip(range(16), dec.tokens(_ids(smol, PROMPTS[0][1], False))):
        pass
    assert dec.depths[:3] == [0, 1, 1], dec.depths


def test_stats_end_at_the_end_of_generation(smol, smol_path):
    """A draft identical to the target agrees on every token. A round that reaches an end-of-generation
    token drafts nothing past it (the draft proposed the end: more drafts could never be output), and
    accepted counts only drafts the caller took: not past the end, nor past a stop string (both once
    counted the whole round: "accepted 8" for a reply of 3 tokens)."""
    same = Model(smol_path, device="cpu", n_ctx=256)
    try:
        ids = _ids(smol, "What is 2+2? Answer with one number.", True)
        r = generate(smol, ids, SamplingParams(temperature=0), 48, draft=same, spec_draft_n=8)
        s = r.spec
        assert r.finish_reason == "stop" and r.generated_ids[-1] in smol.tokenizer.eog_ids
        # one round, its drafts all accepted up to and including the end, which was its own last draft
        assert s["rounds"] == 1 and s["drafted"] == s["accepted"] == len(r.generated_ids) - 1 < 8, (r.text, s)
        ids = _ids(smol, "Reply with the word yes.", True)
        full = generate(smol, ids, SamplingParams(temperature=0), 48, draft=same, spec_draft_n=8)
        stop = full.text.split()[8]  # "here": inside the second round's drafts
        r = generate(smol, ids, SamplingParams(temperature=0, stop=[stop]), 48, draft=same, spec_draft_n=8)
        s = r.spec
        assert r.finish_reason == "stop" and len(r.generated_ids) < len(full.generated_ids)
        # every taken token but each round's own last one is an accepted draft; nothing after the stop
        n = len(r.generated_ids) - 1
        assert n - s["rounds"] <= s["accepted"] <= n and s["accepted"] < s["drafted"], (r.text, s)
    finally:
        same.close()


class _Stub:
    """Stands in for engine.Model in the loop: every forward answers ``tok`` (the draft: ``first`` at
    the first step of a round, ``tok`` after); id 9 ends generation."""

    n_ctx = 1 << 12
    max_nt = 16

    def __init__(self, tok: int, first: int | None = None):
        self.tok, self.first = tok, tok if first is None else first
        self.tokenizer = types.SimpleNamespace(eog_ids=frozenset({9}))

    def forward(self, tokens, start, out_rows, *, logits=True):
        return np.full(len(out_rows), self.tok, np.int32)

    def prefill(self, tokens, start, *, logits=True):
        return np.full(1, self.first, np.int32)


def test_round_cut_at_a_drafted_end_keeps_the_chosen_depth(monkeypatch):
    """A draft that proposes the end of generation stops drafting there, and the round runs shallower
    than chosen; the controller's current depth (the one a new choice must beat) stays the chosen one,
    so a rejected end draft mid-reply does not count as a move to a shallow depth."""
    import pyminfer.spec as spec
    from pyminfer.sampling import Sampler

    monkeypatch.setattr(spec, "check_vocab_compat", lambda a, b: None)
    target, draft = _Stub(7), _Stub(9, first=7)  # drafts 7, then the end: the target takes 7, rejects 9
    dec = spec.SpecDecoder(target, draft, Sampler(SamplingParams(temperature=0)), draft_n=4, adaptive=True)
    it = dec.tokens([1, 2, 3])
    while len(dec.depths) < 2:
        next(it)
    s = dec.spec_stats()
    assert dec.depths == [0, 2] and dec.adaptive.history == [0, 2] and dec.adaptive.cur == 4, \
        (dec.depths, dec.adaptive.history, dec.adaptive.cur)
    assert s["drafted_per_position"][:3] == [1, 1, 0] and s["accepted"] == 1, s


def test_ngram_proposal_cut_at_the_end_of_generation(monkeypatch):
    """An n-gram proposal is cut after its first end-of-generation id (the rest could never be output)."""
    import pyminfer.spec as spec
    from pyminfer.ngram import NgramSpec
    from pyminfer.sampling import Sampler

    assert spec._through_end([5, 9, 6, 9], frozenset({9})) == [5, 9]
    assert spec._through_end([5, 6], frozenset()) == [5, 6]

    class Always:
        def __init__(self, _spec):
            pass

        def propose(self, hist, room):
            return [7, 9, 7, 7][:room]

    monkeypatch.setattr(spec, "NgramIndex", Always)
    dec = spec.SpecDecoder(_Stub(7), None, Sampler(SamplingParams(temperature=0)), ngram=NgramSpec(n=2, m=4))
    it = dec.tokens([1, 2, 3])
    while dec.rounds < 3:
        next(it)
    s = dec.spec_stats()
    assert s["ngram_rounds"] == 3 and s["ngram_drafted"] == 6 and s["drafted_per_position"][2:] == [0] * 6, s


def test_bad_depth(smol, smol_draft):
    with pytest.raises(ValueError, match="0..8"):
        generate(smol, [1, 2, 3], SamplingParams(temperature=0), 4, draft=smol_draft, spec_draft_n=9)


def test_draft_larger_warning_only(smol_path, smol):
    from pyminfer.spec import DraftLargerWarning, check_draft

    with Model(smol_path, device="cpu", n_ctx=64, n_layer=12) as small:
        with pytest.warns(DraftLargerWarning):
            check_draft(small, smol)


def test_small_draft_context_does_not_change_output(smol_path):
    """A draft whose n_ctx is smaller than the target's drafts while it can, then rounds fall back
    to d = 0: same ids as plain decoding, same length."""
    with Model(smol_path, device="cpu", n_ctx=64) as t, Model(smol_path, device="cpu", n_ctx=16, n_layer=24) as d:
        ids = t.tokenizer.encode("Once upon a time, in a land far away,")
        ref = generate(t, ids, SamplingParams(temperature=0), 30)
        res = generate(t, ids, SamplingParams(temperature=0), 30, draft=d, spec_draft_n=4, spec_adaptive=True)
        assert res.generated_ids == ref.generated_ids and len(res.generated_ids) == 30


def test_no_drafting_past_max_tokens(smol, smol_draft):
    ids = _ids(smol, PROMPTS[0][1], False)
    res = generate(smol, ids, SamplingParams(temperature=0), 5, draft=smol_draft, spec_draft_n=7)
    assert res.generated_ids == generate(smol, ids, SamplingParams(temperature=0), 5).generated_ids
    assert res.spec["drafted"] <= 4  # 1 token from the prefill, then at most 4 more to draft


def test_submit_wait_matches_forward(smol_path):
    """Model.submit / wait (the asynchronous forward bench/overlap_probe.py overlaps two models
    with) returns forward's argmax; one forward in flight; a wait needs a submit."""
    from pyminfer._core import NativeError

    with Model(smol_path, device="cpu", n_ctx=32, n_layer=2) as m:
        ids = m.tokenizer.encode("def add(a, b):")
        want = m.forward(ids, 0, [len(ids) - 1, 0], logits=False)
        m.submit(ids, 0, [len(ids) - 1, 0])
        assert m.ready()
        with pytest.raises(NativeError, match="not been waited"):
            m.forward(ids, 0, [0], logits=False)
        with pytest.raises(NativeError, match="not been waited"):
            m.submit(ids, 0, [0])
        assert list(m.wait()) == list(want)
        with pytest.raises(NativeError, match="no submitted forward"):
            m.wait()
        with pytest.raises(ValueError, match="exceed the context"):
            m.submit(ids, 30, [0])
        with pytest.raises(NativeError, match="no submitted forward"):
            m.wait()  # the refused submit left nothing pending
