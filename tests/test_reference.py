"""The numpy oracle (tests/reference.py) against the golden numpy reference in /work/shared/golden.

Teacher-forced: one forward over prompt_ids + llama.cpp's greedy_ids must give the golden
`numpy_teacher_forced.argmax_ids` (skipping near-ties, margin < 0.02) and the same top-2 margins.
Greedy: the KV-cache path must reproduce the golden `numpy.greedy_ids` up to the first near-tie.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from pyminfer.models import ensure_model
from reference import ReferenceModel

GOLDEN = Path("/work/shared/golden")
NEAR_TIE = 0.02  # skip argmax checks where the golden top-2 margin is below this
MARGIN_ATOL = 2e-3  # observed agreement with the golden numpy margins is ~4e-5

GOLDEN_FILE = {
    "smollm2-135m": "generate_smollm2-135m.json",
    "qwen2.5-coder-0.5b": "generate_qwen2.5-coder-0.5b.json",
}


@lru_cache(maxsize=None)
def _model(name: str) -> ReferenceModel:
    return ReferenceModel(ensure_model(name))


@lru_cache(maxsize=None)
def _cases(name: str) -> dict:
    cases = json.loads((GOLDEN / GOLDEN_FILE[name]).read_text())["cases"]
    return {c["id"]: c for c in cases if c.get("numpy_teacher_forced")}


def check_teacher_forced(name: str, case_id: str) -> None:
    ref, case = _model(name), _cases(name)[case_id]
    prompt, gen = case["prompt_ids"], case["greedy_ids"]
    tf = case["numpy_teacher_forced"]
    logits = ref.forward(prompt + gen)
    assert logits.shape == (len(prompt) + len(gen), ref.n_vocab)
    assert logits.dtype == np.float32 and np.isfinite(logits).all()

    # position len(prompt)-1+k predicts generated token k
    lg = logits[len(prompt) - 1 : len(prompt) - 1 + len(gen)]
    top2 = np.sort(lg, axis=-1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    argmax = lg.argmax(axis=-1)
    gold_margin = np.asarray(tf["top2_margin"])
    np.testing.assert_allclose(margin, gold_margin, atol=MARGIN_ATOL)
    checked = [k for k in range(len(gen)) if gold_margin[k] >= NEAR_TIE]
    assert len(checked) >= len(gen) // 2
    bad = [(k, int(argmax[k]), tf["argmax_ids"][k]) for k in checked if argmax[k] != tf["argmax_ids"][k]]
    assert not bad, f"{name}/{case_id}: (position, ours, golden) = {bad}"


def check_greedy(name: str, case_id: str, n: int = 48) -> None:
    ref, case = _model(name), _cases(name)[case_id]
    gold = case["numpy"]
    # compare up to and including the first near-tie (the tie decides the next token, not this one)
    cut = next((k for k, m in enumerate(gold["top2_margin"]) if m < NEAR_TIE), len(gold["greedy_ids"]))
    n = min(n, cut + 1, len(gold["greedy_ids"]))
    ours = ref.greedy(case["prompt_ids"], n)
    assert ours == gold["greedy_ids"][:n]


# ---- fast (a few seconds): SmolLM2, one prompt

def test_smollm2_teacher_forced_fast():
    check_teacher_forced("smollm2-135m", "raw-code-fib")


def test_smollm2_greedy_kv_cache_fast():
    check_greedy("smollm2-135m", "raw-code-fib", n=12)


def test_truncated_layers():
    ref = ReferenceModel(ensure_model("smollm2-135m"), n_layers=2)
    logits = ref.forward([1, 2, 3, 4])
    assert ref.n_layers == 2 and logits.shape == (4, ref.n_vocab) and np.isfinite(logits).all()
    # the KV-cache path equals the prefix forward at the last position
    ref.reset()
    ref._step([1, 2, 3])
    np.testing.assert_allclose(ref._step([4])[0], logits[-1], rtol=1e-4, atol=1e-4)


# ---- slow: every golden prompt, both models

ALL_CASES = [(name, cid) for name in GOLDEN_FILE for cid in _cases(name)]


@pytest.mark.slow
@pytest.mark.parametrize("name,case_id", ALL_CASES)
def test_teacher_forced_all(name, case_id):
    check_teacher_forced(name, case_id)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(GOLDEN_FILE))
@pytest.mark.parametrize("case_id", ["raw-code-fib", "chat-prose-ocean"])
def test_greedy_kv_cache(name, case_id):
    check_greedy(name, case_id)
