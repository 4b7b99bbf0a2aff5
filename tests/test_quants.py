"""CPU quantized kernels (native/cpu/quants.c) against gguf-py and a float64 numpy reference.

- dequantize: `_core.dequantize` == `gguf.quants.dequantize` for every supported type, on real
  tensors of the cached models (Q5_0, Q8_0, Q4_K, Q6_K from Qwen2.5-Coder-0.5B; Q4_1, Q8_0 from
  SmolLM2-135M) and on synthetic blocks for types absent from those files.
- matmul: `_core.matmul` (int8-quantized activations) vs float64 dequantized W @ x, NMSE bound.
- bitwise row identity: an nt-row product equals the nt = 1 products row by row, exactly, for
  1 and 2 threads (the speculative-decoding verify batch relies on it).
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402

from pyminfer import _core  # noqa: E402

CPU = _core.DEVICE_CPU
N_ROWS = 200  # not a multiple of the 16-row thread chunk
# NMSE of the quantized-activation product vs float64. Per-32 int8 activations give ~2e-5 on
# Gaussian data; a wrong block layout / nibble order / scale gives O(1).
NMSE_Q = 3e-4
NMSE_F = 1e-10  # F32 / F16: f32 accumulation only

MODEL_TYPES = {
    "qwen2.5-coder-0.5b": [QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q6_K],
    "smollm2-135m": [QT.Q4_1, QT.Q8_0],
}
F16_OFFSETS = {QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208]}


def _synthetic(qtype: QT, n_rows: int, n_cols: int, rng) -> np.ndarray:
    """Raw bytes [n_rows, row_bytes] of a valid tensor of qtype."""
    if qtype == QT.F32:
        return rng.standard_normal((n_rows, n_cols)).astype(np.float32).view(np.uint8)
    if qtype == QT.F16:
        return rng.standard_normal((n_rows, n_cols)).astype(np.float16).view(np.uint8)
    if qtype in F16_OFFSETS:  # gguf-py cannot quantize K-quants: random blocks with sane scales
        be, bb = gguf.GGML_QUANT_SIZES[qtype]
        nb = n_rows * n_cols // be
        blocks = rng.integers(0, 256, (nb, bb), dtype=np.uint8)
        for off in F16_OFFSETS[qtype]:
            blocks[:, off : off + 2] = (rng.random(nb) * 0.02 + 0.001).astype(np.float16).view(np.uint8).reshape(nb, 2)
        return blocks.reshape(n_rows, -1)
    w = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    return np.ascontiguousarray(gguf.quants.quantize(w, qtype))


def _real(path: str, qtype: QT, n_rows: int):
    reader = _readers()[path]
    for t in reader.tensors:
        if t.tensor_type == qtype and len(t.shape) == 2:
            n_cols = int(t.shape[0])
            data = np.asarray(t.data).reshape(int(t.shape[1]), -1)[:n_rows]
            return np.ascontiguousarray(data).view(np.uint8).reshape(n_rows, -1), n_cols, t.name
    raise LookupError(qtype)


_READERS: dict = {}


def _readers() -> dict:
    if not _READERS:
        from pyminfer.models import ensure_model

        for name in MODEL_TYPES:
            p = str(ensure_model(name))
            _READERS[name] = gguf.GGUFReader(p)
    return _READERS


def _cases():
    cases = []
    for model, types in MODEL_TYPES.items():
        for qt in types:
            cases.append(pytest.param(("real", model, qt), id=f"{model}-{qt.name}"))
    for qt in [QT.F32, QT.F16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K]:
        cases.append(pytest.param(("synth", None, qt), id=f"synth-{qt.name}"))
    return cases


_CACHE: dict = {}


def _tensor(case):
    """(raw bytes [n_rows, row_bytes], n_cols, qtype, f64 dequantized W)."""
    if case not in _CACHE:
        kind, model, qt = case
        if kind == "real":
            raw, n_cols, _ = _real(model, qt, N_ROWS)
        else:
            n_cols = 768  # 3 K-quant super-blocks, 24 32-blocks (an even and an odd count below)
            raw = _synthetic(qt, N_ROWS, n_cols, np.random.default_rng(int(qt)))
        ref = gguf.quants.dequantize(raw, qt).astype(np.float64).reshape(N_ROWS, n_cols)
        _CACHE[case] = (np.ascontiguousarray(raw).reshape(-1), n_cols, qt, ref)
    return _CACHE[case]


def _matmul(raw, qt, n_cols, x, n_threads):
    y = np.empty((x.shape[0], N_ROWS), np.float32)
    _core.matmul(CPU, int(qt), raw, N_ROWS, n_cols, np.ascontiguousarray(x, dtype=np.float32), y, n_threads)
    return y


def _acts(n: int, n_cols: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, n_cols)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero activation block (d = 0)
    x[1 % n, 32:64] *= 1e3  # a block with a large scale
    return x


@pytest.mark.parametrize("case", _cases())
def test_dequantize(case):
    raw, n_cols, qt, ref = _tensor(case)
    out = np.empty((N_ROWS, n_cols), np.float32)
    _core.dequantize(int(qt), raw, N_ROWS, n_cols, out)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("case", _cases())
def test_matmul_vs_reference(case):
    raw, n_cols, qt, ref = _tensor(case)
    x = _acts(5, n_cols)
    want = x.astype(np.float64) @ ref.T
    got = _matmul(raw, qt, n_cols, x, 1).astype(np.float64)
    nmse = np.sum((got - want) ** 2) / np.sum(want**2)
    assert nmse < (NMSE_F if qt in (QT.F32, QT.F16) else NMSE_Q), f"{qt.name}: NMSE {nmse:.3g}"


@pytest.mark.parametrize("case", _cases())
def test_batch_rows_bitwise_equal_single_row(case):
    raw, n_cols, qt, _ = _tensor(case)
    x = _acts(64, n_cols, seed=2)
    single = np.concatenate([_matmul(raw, qt, n_cols, x[t : t + 1], 1) for t in range(64)])
    for n_threads in (1, 2):
        for nt in (1, 2, 3, 5, 8, 17, 64):
            got = _matmul(raw, qt, n_cols, x[:nt], n_threads)
            assert np.array_equal(got.view(np.uint32), single[:nt].view(np.uint32)), f"{qt.name} nt={nt} threads={n_threads}"


def test_q8_0_extreme_values():
    """Q8_0 weights of -128 / 127 and activation blocks at the int8 limits stay exact-ish."""
    rng = np.random.default_rng(5)
    n_cols = 256
    nb = N_ROWS * n_cols // 32
    blocks = np.zeros((nb, 34), np.uint8)
    blocks[:, 0:2] = np.full(nb, 0.01, np.float16).view(np.uint8).reshape(nb, 2)
    blocks[:, 2:] = rng.choice(np.array([-128, 127, -127, 0, 1], np.int8), (nb, 32)).view(np.uint8)
    raw = blocks.reshape(-1)
    ref = gguf.quants.dequantize(blocks.reshape(N_ROWS, -1), QT.Q8_0).astype(np.float64)
    x = np.sign(rng.standard_normal((3, n_cols))).astype(np.float32)  # all |x| = amax -> q = +-127
    got = _matmul(raw, QT.Q8_0, n_cols, x, 1)
    np.testing.assert_allclose(got, x.astype(np.float64) @ ref.T, rtol=1e-5, atol=1e-5)
