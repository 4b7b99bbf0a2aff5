"""Each native CPU op against a float64 numpy reference, with per-op error bounds (f32 math: the
bounds are a few ulps scaled by the reduction length, far below what a wrong formula gives)."""

from __future__ import annotations

import numpy as np
import pytest

from pyminfer import _core


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_rmsnorm():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(896).astype(np.float32) * 3
    x[7] = 400.0  # an outlier, as real hidden states have
    w = rng.standard_normal(896).astype(np.float32)
    y = np.empty_like(x)
    _core.rmsnorm(x, w, y, 1e-6)
    xd = x.astype(np.float64)
    ref = xd / np.sqrt(np.mean(xd * xd) + 1e-6) * w
    assert _rel(y, ref) < 1e-6


@pytest.mark.parametrize("rope_type", [0, 2])
def test_rope(rope_type):
    rng = np.random.default_rng(1)
    n_heads, hd, pos, base = 3, 64, 1234, 1e6
    x = rng.standard_normal(n_heads * hd).astype(np.float32)
    y = x.copy()
    _core.rope(y, n_heads, hd, pos, base, rope_type)
    theta = pos * base ** (-2.0 * np.arange(hd // 2) / hd)
    ref = x.astype(np.float64).reshape(n_heads, hd).copy()
    if rope_type == 2:  # NEOX: pairs (i, i + hd/2)
        a, b = ref[:, : hd // 2].copy(), ref[:, hd // 2:].copy()
        ref[:, : hd // 2] = a * np.cos(theta) - b * np.sin(theta)
        ref[:, hd // 2:] = a * np.sin(theta) + b * np.cos(theta)
    else:  # NORM: adjacent pairs (2i, 2i + 1)
        a, b = ref[:, 0::2].copy(), ref[:, 1::2].copy()
        ref[:, 0::2] = a * np.cos(theta) - b * np.sin(theta)
        ref[:, 1::2] = a * np.sin(theta) + b * np.cos(theta)
    assert _rel(y, ref.reshape(-1)) < 1e-6
    # a rotation keeps each pair's norm
    assert abs(np.linalg.norm(y) - np.linalg.norm(x)) < 1e-4


def test_attention():
    rng = np.random.default_rng(2)
    n, d = 300, 64
    q = rng.standard_normal(d).astype(np.float32)
    k = rng.standard_normal((n, d)).astype(np.float32)
    v = rng.standard_normal((n, d)).astype(np.float32)
    out = np.empty(d, np.float32)
    _core.attention(q, k, v, 1 / 8, out)
    s = (k.astype(np.float64) @ q) / 8
    p = np.exp(s - s.max())
    ref = (p / p.sum()) @ v
    assert _rel(out, ref) < 1e-5


def test_swiglu():
    rng = np.random.default_rng(3)
    g = rng.standard_normal(4864).astype(np.float32) * 4
    u = rng.standard_normal(4864).astype(np.float32)
    y = np.empty_like(g)
    _core.swiglu(g, u, y)
    gd = g.astype(np.float64)
    assert _rel(y, gd / (1 + np.exp(-gd)) * u) < 1e-6


def test_op_errors():
    with pytest.raises(ValueError):
        _core.rope(np.zeros(10, np.float32), 3, 64, 0, 1e4, 2)
    with pytest.raises(_core.NativeError, match="unknown type"):
        _core.rope(np.zeros(64, np.float32), 1, 64, 0, 1e4, 1)
