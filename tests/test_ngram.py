"""N-gram drafts (``--spec-type ngram-simple``): the lookup itself, identity with plain decoding
alone and beside a draft model, statistics, and bad settings. CPU, SmolLM2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pyminfer.engine import Model
from pyminfer.generate import generate
from pyminfer.ngram import NgramIndex, NgramSpec
from pyminfer.sampling import SamplingParams

from prompts import PROMPTS

# A prompt whose continuation repeats what came before, so n-gram drafts exist and are accepted.
REPETITIVE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"


def test_lookup_latest_earlier_occurrence():
    ix = NgramIndex(NgramSpec(n=2, m=3))
    h = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2]
    # [1, 2] ends at 1 and 5 before the suffix: the latest (5) wins, then 3 tokens after it
    assert ix.propose(h, 8) == [5, 6, 1]
    assert ix.propose(h, 2) == [5, 6]  # k caps the draft below m
    assert ix.propose(h, 0) == []


def test_lookup_never_matches_the_suffix_itself():
    ix = NgramIndex(NgramSpec(n=2, m=4))
    assert ix.propose([7, 8], 4) == []  # too short for an earlier occurrence
    assert ix.propose([7, 8, 9], 4) == []  # [8, 9] only occurs as the suffix
    assert ix.propose([7, 8, 9, 7, 8], 4) == [9, 7, 8]  # grown in place: the earlier [7, 8]


def test_lookup_incremental_equals_fresh():
    """Growing one index token by token gives what a fresh index gives on each prefix."""
    import random

    rnd = random.Random(0)
    h = [rnd.randrange(6) for _ in range(300)]
    grown = NgramIndex(NgramSpec(n=3, m=5))
    for L in range(1, len(h) + 1):
        assert grown.propose(h[:L], 5) == NgramIndex(NgramSpec(n=3, m=5)).propose(h[:L], 5), L


@pytest.mark.parametrize("n,m,msg", [(0, 5, "size-n"), (65, 5, "size-n"), (3, 0, "size-m"), (3, 9, "size-m")])
def test_bad_spec(n, m, msg):
    with pytest.raises(ValueError, match=msg):
        NgramSpec(n=n, m=m)


@pytest.mark.parametrize("kw,name", [({"n": 2.5}, "n"), ({"m": 2.5}, "m"), ({"n": "3"}, "n"), ({"n": True}, "n"),
                                     ({"m": 3.0}, "m")])
def test_spec_sizes_are_ints(kw, name):
    """A float or str size passed the range check (or failed it with a comparison error) and then
    failed deep in the draft loop; True was taken as 1. Now a TypeError at construction."""
    with pytest.raises(TypeError, match=f"^NgramSpec {name} must be an int"):
        NgramSpec(**kw)


def test_spec_sizes_of_numpy_ints_are_ints():
    import numpy as np

    s = NgramSpec(n=np.int64(2), m=np.int32(4))
    assert (s.n, s.m) == (2, 4) and type(s.n) is int and type(s.m) is int


def _ids(m: Model, text: str, chat: bool) -> list[int]:
    if chat:
        text = m.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return m.tokenizer.encode(text)


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_identity_ngram_alone(smol, penalty):
    """Every test prompt plus a repetitive one, 128 tokens: n-gram drafts alone give the ids of
    plain greedy decoding; drafts are both accepted and rejected many times."""
    params = SamplingParams(temperature=0.0, repeat_penalty=penalty)
    acc = drafted = rounds = 0
    for i, (cat, text, chat) in enumerate(PROMPTS + [("code", REPETITIVE, False)]):
        ids = _ids(smol, text, chat)
        ref = generate(smol, ids, params, 128).generated_ids
        res = generate(smol, ids, params, 128, spec_ngram=NgramSpec(n=1 + i % 3, m=1 + i % 8))
        assert res.generated_ids == ref, f"prompt {i} ({cat}) penalty={penalty}"
        s = res.spec
        assert s["ngram"] and s["ngram_drafted"] == s["drafted"] and s["draft_s"] < 0.05 * max(s["verify_s"], 1e-3)
        acc, drafted, rounds = acc + s["ngram_accepted"], drafted + s["ngram_drafted"], rounds + s["ngram_rounds"]
    assert acc >= 100 and drafted - acc >= 100 and rounds >= 100, (acc, drafted, rounds)


def test_identity_ngram_with_draft_model(smol, smol_path):
    """N-gram drafts before a draft model (fixed depth and adaptive): the draft model catches up on
    the tokens n-gram rounds committed, and the ids stay those of plain decoding."""
    params = SamplingParams(temperature=0.0)
    with Model(smol_path, device="cpu", n_ctx=2048, n_layer=24) as draft:
        both = 0
        for i, (cat, text, chat) in enumerate(PROMPTS[:8] + [("code", REPETITIVE, False)]):
            ids = _ids(smol, text, chat)
            ref = generate(smol, ids, params, 96).generated_ids
            for adaptive in (False, True):
                res = generate(smol, ids, params, 96, draft=draft, spec_draft_n=3, spec_adaptive=adaptive,
                               spec_ngram=NgramSpec(n=2, m=6))
                assert res.generated_ids == ref, f"prompt {i} ({cat}) adaptive={adaptive}"
                s = res.spec
                model_rounds = s["rounds"] - s["ngram_rounds"]
                both += s["ngram_rounds"] > 0 and model_rounds > 0 and s["drafted"] > s["ngram_drafted"]
    assert both >= 6  # most runs mixed both sources


def test_identity_ngram_sampling_same_seed(smol):
    params = SamplingParams(temperature=0.9, seed=7)
    ids = _ids(smol, REPETITIVE, False)
    ref = generate(smol, ids, params, 100)
    res = generate(smol, ids, params, 100, spec_ngram=NgramSpec(n=1, m=4))
    assert res.generated_ids == ref.generated_ids and res.spec["ngram_accepted"] > 0


def test_ngram_no_drafting_past_max_tokens_or_context(smol_path):
    with Model(smol_path, device="cpu", n_ctx=48) as t:
        ids = t.tokenizer.encode(REPETITIVE)[:30]
        ref = generate(t, ids, SamplingParams(temperature=0), 100)
        res = generate(t, ids, SamplingParams(temperature=0), 100, spec_ngram=NgramSpec(n=1, m=8))
        assert res.stop_reason == "context" == ref.stop_reason and res.generated_ids == ref.generated_ids
        res = generate(t, ids, SamplingParams(temperature=0), 4, spec_ngram=NgramSpec(n=1, m=8))
        assert res.generated_ids == ref.generated_ids[:4] and res.spec["drafted"] <= 3


def test_adaptive_needs_a_draft_model(smol):
    with pytest.raises(ValueError, match="needs a draft model"):
        generate(smol, [1, 2, 3], SamplingParams(temperature=0), 4, spec_adaptive=True, draft=None,
                 spec_ngram=NgramSpec())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyminfer", *args], capture_output=True, text=True, timeout=600)


def test_cli_run_json_reports_ngram_rounds(smol_path):
    out = _cli("run", "-m", str(smol_path), "--device", "cpu", "-p", REPETITIVE, "-n", "40", "--temp", "0",
               "--spec-type", "ngram-simple", "--spec-ngram-size-n", "2", "--json")
    assert out.returncode == 0, out.stderr
    spec = json.loads(out.stdout)["spec"]
    assert spec["ngram"] and spec["ngram_rounds"] > 0 and spec["ngram_accepted"] > 0
    # nothing drafted (no earlier n-gram in a 1-token prompt): acceptance n/a, not 0%
    out = _cli("run", "-m", str(smol_path), "--device", "cpu", "-p", "x", "-n", "3", "--temp", "0",
               "--spec-type", "ngram-simple")
    assert out.returncode == 0 and "drafted 0, accepted 0 (n/a)" in out.stderr, out.stderr


@pytest.mark.parametrize("args,msg", [(["--spec-ngram-size-m", "9"], "(--spec-ngram-size-m) must be in 1..8"),
                                      (["--spec-ngram-size-n", "0"], "(--spec-ngram-size-n) must be in 1..64"),
                                      (["-ub", "4"], "too small for --spec-ngram-size-m 5")])
def test_cli_bad_ngram_settings(smol_path, args, msg):
    out = _cli("run", "-m", str(smol_path), "--device", "cpu", "-p", "x", "--spec-type", "ngram-simple", *args)
    assert out.returncode == 1 and msg in out.stderr and "Traceback" not in out.stderr


def test_bench_ngram_only(smol_path):
    out = _cli("bench", "-m", str(smol_path), "--device", "cpu", "-t", "2", "--spec-type", "ngram-simple", "-n", "24",
               "-r", "1", "-o", "json")
    assert out.returncode == 0 and "WARNING" not in out.stderr, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == 4 and all(r["seq_tok_s"] > 0 and r["spec_tok_s"] > 0 and "ngram_rounds" in r for r in rows)
