"""The batched-verify contract on the CPU backend: row i of an nt-token forward is bitwise equal
to the one-token forward at that position over the same KV contents (issue: batched verify)."""

from __future__ import annotations

import numpy as np
import pytest

from pyminfer.engine import Model

PROMPT = "def merge_sort(arr):\n    if len(arr) <= 1:\n        return arr\n"


def _rows_single(m: Model, prefix: list[int], toks: list[int]) -> np.ndarray:
    m.prefill(prefix, 0)
    out = []
    for i, t in enumerate(toks):
        out.append(m.forward([t], len(prefix) + i, [0])[0])
    return np.stack(out)


def _rows_batched(m: Model, prefix: list[int], toks: list[int]) -> np.ndarray:
    m.prefill(prefix, 0)
    return m.forward(toks, len(prefix), list(range(len(toks))))


@pytest.mark.parametrize("fixture", ["smol", "qwen05"])
def test_row_identity(fixture, request):
    m: Model = request.getfixturevalue(fixture)
    ids = m.tokenizer.encode(PROMPT)
    prefix, rest = ids[:8], ids[8:16]
    ref = _rows_single(m, prefix, rest)
    assert np.isfinite(ref).all()
    for nt in (2, 3, 5, 8):
        got = _rows_batched(m, prefix, rest[:nt])
        # bitwise: compare the f32 bit patterns, not values within a tolerance
        assert np.array_equal(got.view(np.uint32), ref[:nt].view(np.uint32)), f"nt={nt} differs from nt=1"


def test_only_requested_rows(smol):
    ids = smol.tokenizer.encode(PROMPT)[:10]
    full = smol.forward(ids, 0, list(range(10)))
    part = smol.forward(ids, 0, [9, 3])
    assert np.array_equal(part[0], full[9]) and np.array_equal(part[1], full[3])
    am = smol.forward(ids, 0, [9, 3], logits=False)
    assert list(am) == [int(np.argmax(full[9])), int(np.argmax(full[3]))]


def test_prefill_chunking_is_bitwise(smol_path):
    """On the CPU, chunk boundaries of the prefill change nothing at all."""
    ids = list(range(1000, 1100))
    outs = []
    for max_nt in (7, 64):
        with Model(smol_path, device="cpu", n_ctx=256, max_nt=max_nt) as m:
            outs.append(m.prefill(ids, 0))
    assert np.array_equal(outs[0], outs[1])


def test_rollback_is_bookkeeping(smol):
    """Overwriting positions after a 'rejected' branch gives the same logits as never writing them."""
    ids = smol.tokenizer.encode(PROMPT)
    a = smol.forward(ids[:12], 0, [11])[0]
    smol.forward([5, 6, 7], 12, [0])  # a rejected draft branch at positions 12..14
    smol.forward(ids[8:12], 8, [3])  # roll back to n_past = 8, re-evaluate
    b = smol.forward(ids[12:13], 12, [0])[0]
    c = smol.forward(ids[:13], 0, [12])[0]
    assert np.array_equal(b, c)
    assert not np.array_equal(a, b)
