"""Real models on the GPU: logits against the CPU backend, greedy ids against llama.cpp's golden
outputs, and speculative decoding with the real pair byte-identical to plain decoding.

Skipped without a CUDA device, and per model when its file is not in the model cache (this file
never fetches: the GPU machine has no network; bench/gpu_real.sh assembles the files there from
carried chunks, see docs/perf.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pyminfer import _core
from pyminfer.engine import Model
from pyminfer.generate import generate
from pyminfer.models import MODELS, cache_dir
from pyminfer.sampling import SamplingParams
from pyminfer.spec import MAX_DEPTH

from conftest import golden
from prompts import PROMPTS
from test_golden import NEAR_TIE, check_against_golden

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _core.cuda_available(), reason="no CUDA device")]

N_TOKENS = int(os.environ.get("PYMINFER_IDENTITY_TOKENS", "256"))
GOLDEN = {"smollm2-135m": "generate_smollm2-135m.json", "qwen2.5-coder-0.5b": "generate_qwen2.5-coder-0.5b.json",
          "qwen2.5-coder-1.5b": "generate_qwen2.5-coder-1.5b.json"}


def cached(name: str) -> Path:
    p = cache_dir() / MODELS[name].filename
    if not p.exists() or p.stat().st_size != MODELS[name].n_bytes:
        pytest.skip(f"{p} not in the model cache")
    return p


_open: dict[tuple[str, str], Model] = {}


def model(name: str, device: str) -> Model:
    """One loaded model per (name, device) for the whole session (loading costs seconds)."""
    key = (name, device)
    if key not in _open:
        _open[key] = Model(cached(name), device=device, n_ctx=2048)
    return _open[key]


@pytest.fixture(scope="module", autouse=True)
def _close_models():
    yield
    for m in _open.values():
        m.close()
    _open.clear()


def _ids(m: Model, text: str, chat: bool) -> list[int]:
    if chat:
        text = m.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return m.tokenizer.encode(text)


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_forward_logits_close_to_cpu(name):
    """Prefill (tensor-core path for nt >= 10) and 24 teacher-forced decode steps: GPU logits
    within nmse 1e-2 of the CPU's at every step and 2e-3 at the median step (measured on the H200,
    `bench/real_logits.py`: 0.5B max < 1e-3; SmolLM2 median 1.0e-3 with single-step spikes of
    4.6e-3 (session 8) and 6.6e-3 (session 10, with the prefill attention: same median, the spike at
    another step): f16 KV cache and f16 GEMM activations on the GPU, f32 KV and q8 activations on
    the CPU; q8 rounding flips make single steps spike), and the same argmax wherever the CPU's
    top-2 margin is >= 0.35."""
    g, c = model(name, "cuda"), model(name, "cpu")
    ids = _ids(c, PROMPTS[0][1], False)
    lg = g.prefill(ids, 0, logits=True)
    lc = c.prefill(ids, 0, logits=True)
    tok = int(np.argmax(lc))
    checked = 0
    errs = []
    for step in range(25):
        err = float(np.mean((lg - lc) ** 2) / np.mean(lc ** 2))
        errs.append(err)
        assert err < 1e-2, f"{name} step {step}: nmse {err:.2e}"
        top = np.sort(lc)[-2:]
        if top[1] - top[0] >= NEAR_TIE:
            assert int(np.argmax(lg)) == int(np.argmax(lc)), f"{name} step {step}: margin {top[1] - top[0]:.3f}"
            checked += 1
        pos = len(ids) + step
        lg = g.forward([tok], pos, [0], logits=True)[0]
        lc = c.forward([tok], pos, [0], logits=True)[0]
        tok = int(np.argmax(lc))
    assert checked >= 10
    assert float(np.median(errs)) < 2e-3, f"{name}: median nmse {np.median(errs):.2e}"


@pytest.mark.parametrize("name", list(GOLDEN))
def test_greedy_matches_golden(name):
    """GPU greedy ids equal llama.cpp's up to the first near-tie (margin < 0.35) of each case."""
    m = model(name, "cuda")
    compared = 0
    for case in golden(GOLDEN[name])["cases"]:
        res = generate(m, case["prompt_ids"], SamplingParams(temperature=0.0), 48)

        def cpu_gap(k: int, tok: int, case=case, got=res.generated_ids) -> float:
            """How far below the CPU's top logit ``tok`` is at position k (same prefix)."""
            lg = model(name, "cpu").prefill(case["prompt_ids"] + got[:k], 0)
            return float(lg.max() - lg[tok])

        compared += check_against_golden(case, res.generated_ids, cpu_gap)
    assert compared >= 40


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_spec_identity_real_pair(penalty):
    """Target Qwen2.5-Coder-1.5B, draft 0.5B, both on the GPU: 20 prompts x 256 tokens, every depth
    1..8 and adaptive, ids equal to plain greedy decoding on the GPU."""
    t, d = model("qwen2.5-coder-1.5b", "cuda"), model("qwen2.5-coder-0.5b", "cuda")
    params = SamplingParams(temperature=0.0, repeat_penalty=penalty)
    accepted = drafted = 0
    for i, (cat, text, chat) in enumerate(PROMPTS):
        ids = _ids(t, text, chat)
        ref = generate(t, ids, params, N_TOKENS).generated_ids
        for depth, adaptive in [(k, False) for k in range(1, MAX_DEPTH + 1)] + [(4, True)]:
            res = generate(t, ids, params, N_TOKENS, draft=d, spec_draft_n=depth, spec_adaptive=adaptive)
            assert res.generated_ids == ref, f"prompt {i} ({cat}) d={depth} adaptive={adaptive} penalty={penalty}"
            accepted += res.spec["accepted"]
            drafted += res.spec["drafted"]
    assert accepted >= 1000 and drafted - accepted >= 1000, (accepted, drafted)
