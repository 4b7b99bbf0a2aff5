"""The sampler chain (pyminfer.sampling): llama.cpp's order and names, the infill sampler on a
made-up vocabulary, and the generation limits n_indent / t_max_predict_ms (pyminfer.generate)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pyminfer.generate import IndentChecker
from pyminfer.sampling import Sampler, SamplingParams, apply_repeat_penalty, parse_samplers


def _fixed_chain(p: SamplingParams, logits: np.ndarray, hist: list[int], rng: np.random.Generator) -> int:
    """The sampler as it was before the chain was configurable (penalty, top-k, top-p, min-p,
    temperature, draw): the default chain must draw exactly what it drew, seed for seed."""
    lg = logits.astype(np.float32, copy=True)
    n = p.repeat_last_n
    apply_repeat_penalty(lg, hist[-n:] if n > 0 else hist if n < 0 else (), p.repeat_penalty)
    if p.temperature <= 0:
        return int(np.argmax(lg))
    k = p.top_k if 0 < p.top_k < lg.size else lg.size
    idx = np.argpartition(-lg, k - 1)[:k] if k < lg.size else np.arange(lg.size)
    idx = idx[np.argsort(-lg[idx], kind="stable")]
    vals = lg[idx].astype(np.float64)
    probs = np.exp(vals - vals[0])
    probs /= probs.sum()
    if p.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        idx, vals, probs = idx[:keep], vals[:keep], probs[:keep]
    if p.min_p > 0.0:
        keep = probs >= p.min_p * probs[0]
        idx, vals = idx[keep], vals[keep]
    w = np.exp((vals - vals[0]) / p.temperature)
    w /= w.sum()
    return int(idx[rng.choice(len(idx), p=w)])


def test_default_chain_draws_what_the_fixed_chain_drew():
    r = np.random.default_rng(0)
    for trial in range(200):
        v = int(r.integers(5, 3000))
        logits = (r.standard_normal(v) * r.uniform(0.1, 5)).astype(np.float32)
        hist = [int(x) for x in r.integers(0, v, 20)]
        kw = dict(temperature=float(r.choice([0, 0.3, 0.8, 1.5])), top_k=int(r.choice([0, 1, 5, 40, v + 3])),
                  top_p=float(r.choice([1.0, 0.9, 0.5])), min_p=float(r.choice([0, 0.05, 0.3])),
                  repeat_penalty=float(r.choice([1.0, 1.3])), seed=trial)
        s, rng = Sampler(SamplingParams(**kw)), np.random.default_rng(trial)
        # the default chain spelt out is the default chain
        s2 = Sampler(SamplingParams(**kw, samplers=("penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                                    "temperature")))
        for _ in range(4):
            want = _fixed_chain(SamplingParams(**kw), logits, hist, rng)
            assert s.sample(logits, hist) == want and s2.sample(logits, hist) == want, (trial, kw)


def test_parse_samplers():
    assert parse_samplers(["top_k", "top_p", "infill"]) == ("top_k", "top_p", "infill")
    assert parse_samplers("kpi") == ("top_k", "top_p", "infill")  # the server's letter string
    assert parse_samplers("top_k;temperature") == ("top_k", "temperature")  # llama.cpp CLI's --samplers
    assert parse_samplers("temperature") == ("temperature",) and parse_samplers([]) == ()
    with pytest.raises(ValueError, match="unknown sampler 'nucleus'"):
        parse_samplers(["top_k", "nucleus"])
    with pytest.raises(ValueError, match="unknown sampler code 'z'"):
        parse_samplers("kz")
    with pytest.raises(ValueError, match="unknown sampler 'top-k'"):
        parse_samplers("top-k;top_p")


def test_a_setting_outside_the_chain_does_nothing():
    """As llama.cpp: temperature 0 without "temperature" in the chain draws at temperature 1;
    with it, the argmax. Penalties after a zero temperature cannot change the pick."""
    logits = np.array([2.0, 1.9, 1.8, -5.0], np.float32)
    p = SamplingParams(temperature=0.0, samplers=("top_k",), seed=1)
    assert not p.greedy and p.needs_logits
    s = Sampler(p)
    draws = Counter(s.sample(logits, []) for _ in range(300))
    assert set(draws) >= {0, 1, 2}, draws
    g = SamplingParams(temperature=0.0, samplers=("top_k", "temperature", "penalties"), repeat_penalty=50.0)
    assert g.greedy and not g.penalized and not g.needs_logits
    assert Sampler(g).sample(logits, [0]) == 0
    pen = SamplingParams(temperature=0.0, samplers=("penalties", "temperature"), repeat_penalty=50.0)
    assert pen.greedy and pen.penalized and Sampler(pen).sample(logits, [0]) == 1
    empty = Sampler(SamplingParams(temperature=0.0, samplers=(), seed=2))  # the whole distribution
    assert set(Counter(empty.sample(logits, []) for _ in range(300))) >= {0, 1, 2}


def test_min_keep_floors_top_p_and_min_p():
    """llama.cpp's min_keep: top_p and min_p leave at least that many candidates."""
    logits = np.array([5.0, 1.0, 0.5, 0.2], np.float32)
    for kw in (dict(top_p=0.01, min_p=0.0), dict(top_p=1.0, min_p=0.5)):
        s = Sampler(SamplingParams(temperature=1.0, top_k=0, seed=1, **kw))
        assert {s.sample(logits, []) for _ in range(500)} == {0}
        s = Sampler(SamplingParams(temperature=1.0, top_k=0, seed=1, min_keep=3, **kw))
        assert {s.sample(logits, []) for _ in range(3000)} == {0, 1, 2}
    with pytest.raises(ValueError, match="min_keep must be >= 0"):
        SamplingParams(min_keep=-1).validate()


def test_penalty_later_in_the_chain_acts_on_the_candidates():
    """penalties after top_k: the top-k is taken on the raw logits, then the penalty reorders it."""
    logits = np.array([3.0, 2.0, 1.0, 0.5], np.float32)
    p = SamplingParams(temperature=0.0, top_k=2, repeat_penalty=10.0, samplers=("top_k", "penalties", "temperature"))
    assert Sampler(p).sample(logits, [0]) == 1  # 3.0 / 10 falls behind 2.0
    p = SamplingParams(temperature=0.0, top_k=2, repeat_penalty=10.0, samplers=("top_k", "penalties", "temperature"))
    assert Sampler(p).sample(logits, [0, 1]) == 0  # both penalized: 0.3 > 0.2; token 2 was cut by top_k


class _Vocab:
    """A made-up vocabulary: ids 0..n-1 with these pieces; 9 is the end-of-generation token."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        self.eog_ids = frozenset({9})
        self.eot_id: int | None = 9
        self.eos_id: int | None = 9

    def token_to_piece(self, token_id: int, *, special: bool = True) -> bytes:
        return b"" if token_id == 9 and not special else self.pieces[token_id]


PIECES = [b"re", b"return", b"ret", b"x", b"y", b"z", b"w", b"q", b"v", b"<eos>"]


def _infill_draws(probs: dict[int, float], n: int = 400, seed: int = 0) -> Counter:
    logits = np.full(len(PIECES), -30.0, np.float32)
    for i, p in probs.items():
        logits[i] = np.log(p)
    s = Sampler(SamplingParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, samplers=("top_k", "infill"),
                               seed=seed), _Vocab(PIECES))
    return Counter(s.sample(logits, []) for _ in range(n))


def test_infill_sampler_merges_prefixes_and_drops_the_unlikely():
    """"re" (0.20) is a prefix of "return" (0.15): merged into "re" (0.35); "y" (0.18 < 0.2) goes;
    "x" 0.47 and "re" 0.35 of 0.82 both clear 1 / 3. The draw weighs what is left by the logits:
    "re" 0.20 against "x" 0.47 (llama.cpp's dist recomputes the weights from the logits)."""
    draws = _infill_draws({0: 0.20, 1: 0.15, 3: 0.47, 4: 0.18})
    assert set(draws) == {0, 3}, draws
    assert 0.2 < draws[0] / 400 < 0.42, draws
    # "return" more likely than "re": "re" merges into it (0.60), then "ret" too (0.75); "x" 0.25
    # clears 0.2 but not 1 / 3 of the 1.0 kept
    draws = _infill_draws({0: 0.20, 1: 0.40, 2: 0.15, 3: 0.25})
    assert set(draws) == {1}, draws
    # without a prefix "x" stays: "re" 0.27, "x" 0.28, "y" 0.45 all clear 0.2 and 1 / 4
    assert set(_infill_draws({0: 0.27, 3: 0.28, 4: 0.45})) == {0, 3, 4}


def test_infill_sampler_ends_the_gap():
    """End-of-generation holding enough probability (3 n p_eog > p_txt): only it is kept; no text
    candidate over 0.2: the end-of-text token."""
    assert set(_infill_draws({9: 0.05, 3: 0.5, 4: 0.45})) == {9}  # 3 x 10 candidates x 0.05 = 1.5 > 0.95
    # 0.3 < 0.99: the text goes on (end-of-generation stays a candidate: the cuts never drop it)
    d = _infill_draws({9: 0.01, 3: 0.5, 4: 0.49})
    assert d[3] + d[4] > 380 and set(d) <= {3, 4, 9}, d
    assert set(_infill_draws({9: 0.001, 3: 0.17, 4: 0.16, 5: 0.16, 6: 0.17, 7: 0.17, 8: 0.169})) == {9}


def test_infill_needs_a_top_k_and_the_vocabulary():
    with pytest.raises(ValueError, match="top_k between 1 and 1024"):
        SamplingParams(samplers=("top_p", "infill")).validate()
    with pytest.raises(ValueError, match="top_k between 1 and 1024"):
        SamplingParams(top_k=0, samplers=("top_k", "infill")).validate()
    with pytest.raises(ValueError, match="needs the model's vocabulary"):
        Sampler(SamplingParams(samplers=("top_k", "infill")))


@pytest.mark.parametrize("chunks,n,want,cut", [
    (["a\n    b\n", "    c"], 4, "a\n    b\n    c", False),
    (["a\n  b"], 4, "a\n  ", True),  # the line's indentation stays, as llama.cpp leaves it
    (["a\n", "\n    b"], 4, "a\n", True),  # an empty line ends it (its newline comes first)
    (["x = 1\ny"], 0, "x = 1\ny", False),  # 0: off
    (["first line unchecked", "\n\t\tb\n\t"], 2, "first line unchecked\n\t\tb\n\t", False),
])
def test_indent_checker(chunks, n, want, cut):
    ic = IndentChecker(n)
    out, stopped = "", False
    for ch in chunks:
        text, stopped = ic.push(ch)
        out += text
        if stopped:
            break
    assert (out, stopped) == (want, cut)


def test_t_max_predict_ms_ends_at_a_newline(smol, monkeypatch):
    """Past t_max_predict_ms after the first token the next token that brings a newline ends the
    text (stop_reason 'time', llama.cpp's stop_type limit); before that, or with <= 0, nothing
    changes. A clock that moves a second a reading makes every check late."""
    import itertools
    import time as _time

    from pyminfer.generate import generate

    ids = smol.tokenizer.encode("1\n2\n3\n4\n")
    plain = generate(smol, ids, SamplingParams(temperature=0), 8)
    assert plain.text == "5\n6\n7\n8\n" and plain.stop_reason == "max_tokens"
    slow = generate(smol, ids, SamplingParams(temperature=0, t_max_predict_ms=1e9), 8)
    assert slow.text == plain.text
    clock = itertools.count(0.0, 1.0)
    monkeypatch.setattr(_time, "perf_counter", lambda: float(next(clock)))
    res = generate(smol, ids, SamplingParams(temperature=0, t_max_predict_ms=500), 8)
    assert (res.text, res.stop_reason, res.finish_reason) == ("5\n", "time", "length")
    assert res.generated_ids == plain.generated_ids[:2]
    off = generate(smol, ids, SamplingParams(temperature=0, t_max_predict_ms=-1), 8)
    assert off.text == plain.text


def test_n_indent_ends_the_text(qwen05):
    """n_indent on a real completion: the body of a method stops where a line comes back to the
    class's indentation (the blank line after it ends it first), cut before that line's text."""
    from pyminfer.generate import generate

    ids = qwen05.tokenizer.encode("class A:\n    def f(self):\n        return 1\n\n    def g(self):\n")
    plain = generate(qwen05, ids, SamplingParams(temperature=0), 40)
    res = generate(qwen05, ids, SamplingParams(temperature=0, n_indent=8), 40)
    assert res.stop_reason == "indent" and res.finish_reason == "length", res.text
    assert plain.text.startswith(res.text) and len(res.text) < len(plain.text)
    lines = res.text.split("\n")
    assert all(line.startswith(" " * 8) for line in lines[:-1]) and lines[-1].strip() == "", res.text


def test_cli_sampler_flags(smol_path):
    """pyminfer run --samplers (';'-separated, llama.cpp's CLI spellings too) and --sampling-seq
    (letters): a chain of top_k and temperature at --temp 0 is greedy, so the text is the default's;
    a bad name, an infill sampler without top_k, or both flags are one-line errors."""
    import subprocess
    import sys

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pyminfer", "run", "-m", str(smol_path), "--device", "cpu",
                               "-p", "The capital of France is", "--temp", "0", "-n", "4", *extra],
                              capture_output=True, text=True, timeout=120)

    plain = run()
    assert plain.returncode == 0 and plain.stdout.strip(), plain.stderr
    for extra in (("--samplers", "top_k;temperature"), ("--samplers", "top-k;temp"), ("--sampling-seq", "kt")):
        out = run(*extra)
        assert out.returncode == 0 and out.stdout == plain.stdout, (extra, out.stderr)
    for extra, says in ((("--samplers", "top_k;nucleus2"), "unknown sampler 'nucleus2'"),
                        (("--sampling-seq", "kq"), "unknown sampler code 'q'"),
                        (("--samplers", "infill"), "needs top_k between 1 and 1024"),
                        (("--samplers", "top_k", "--sampling-seq", "k"), "give one")):
        out = run(*extra)
        assert out.returncode == 1 and says in out.stderr and "Traceback" not in out.stderr, (extra, out.stderr)
