"""CUDA backend vs the CPU backend: per-type matmul, nt-row bitwise contracts, full forward, graphs.

Synthetic weights are random valid quantized bytes (bench/bench_gpu.py builds them), so the tests
need no model file. Bounds: the GPU computes each 32-wide chunk with the same integer sums and the
same float products as the CPU (activations quantize bitwise alike), only the f32 summation order
differs, so matmul NMSE is ~1e-13. The forward keeps K/V in f16 (the CPU in f32): with f32
weights (no activation quantization) logits agree to NMSE ~1e-7; with quantized weights a tiny
difference flips int8 roundings of activations and the random model amplifies it (perturbing
the CPU's norm weights by 2e-4 alone moves some rows' logits by NMSE 1e-2 with sharp attention),
so the bound there is 2e-2 and greedy tokens may differ only within the measured logit error.
"""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import pyminfer._core as core

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_gpu as bg  # noqa: E402

pytestmark = pytest.mark.skipif(not core.cuda_available(), reason="no CUDA device")


@pytest.fixture(autouse=True)
def _pairs_on_small_matrices(monkeypatch):
    """The test matrices and models are small: MI_CUDA_MMVQ_PAIR_ROWS=0 lets their launches of nt >= 2
    take the pair kernels as the real shapes' large matrices do (by default only block-kernel
    matrices of >= 1024 rows pair: test_mmvq_pair_rows_bound)."""
    monkeypatch.setenv("MI_CUDA_MMVQ_PAIR_ROWS", "0")

ALL_TYPES = [bg.F32, bg.F16, bg.Q4_0, bg.Q4_1, bg.Q5_0, bg.Q5_1, bg.Q8_0, bg.Q4_K, bg.Q5_K, bg.Q6_K]


def nmse(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b ** 2), 1e-300))


def matmul(device, typ, w, n_rows, n_cols, x):
    y = np.full((x.shape[0], n_rows), np.nan, dtype=np.float32)  # poisoned: every element must be written
    core.matmul(device, typ, w, n_rows, n_cols, x, y)
    return y


@pytest.mark.parametrize("typ", ALL_TYPES, ids=[bg.NAMES[t] for t in ALL_TYPES])
@pytest.mark.parametrize("n_cols", [512, 768, 1536, 4608])
def test_matmul_matches_cpu(typ, n_cols):
    rng = np.random.default_rng(typ * 100 + n_cols)
    n_rows = 67  # not a multiple of the rows per block
    w = bg.random_weights(rng, typ, n_rows, n_cols)
    x = rng.standard_normal((3, n_cols)).astype(np.float32)
    y_cpu = matmul(0, typ, w, n_rows, n_cols, x)
    y_gpu = matmul(1, typ, w, n_rows, n_cols, x)
    assert np.all(np.isfinite(y_gpu))
    assert nmse(y_gpu, y_cpu) < 1e-10, bg.NAMES[typ]


@pytest.mark.parametrize("typ", ALL_TYPES, ids=[bg.NAMES[t] for t in ALL_TYPES])
def test_matmul_rows_bitwise_equal_to_one_row(typ):
    rng = np.random.default_rng(typ)
    n_rows, n_cols = 45, 2560
    w = bg.random_weights(rng, typ, n_rows, n_cols)
    x = rng.standard_normal((11, n_cols)).astype(np.float32)
    ones = np.concatenate([matmul(1, typ, w, n_rows, n_cols, x[i:i + 1]) for i in range(11)])
    for nt in range(2, 12):
        y = matmul(1, typ, w, n_rows, n_cols, x[:nt])
        assert np.array_equal(y, ones[:nt]), (bg.NAMES[typ], nt)


@pytest.mark.parametrize("mmvq", ["0", "1", "2", "3", "4"])
@pytest.mark.parametrize("typ", [bg.Q4_0, bg.Q5_0, bg.Q8_0, bg.Q4_K, bg.Q5_K, bg.Q6_K],
                         ids=lambda t: bg.NAMES[t])
def test_matmul_both_kernels_odd_blocks(typ, mmvq, monkeypatch):
    """Rows of an odd number of 256-wide blocks (Q6_K rows only 2-aligned), more chunks than one
    pass of the warp kernel's unrolled loads (tail), both MMVQ kernels: CPU bound and nt bitwise."""
    monkeypatch.setenv("MI_CUDA_MMVQ", mmvq)
    rng = np.random.default_rng(typ + 7)
    n_rows, n_cols = 37, 256 * 19  # 152 chunks: 2 warps per row by default
    w = bg.random_weights(rng, typ, n_rows, n_cols)
    x = rng.standard_normal((8, n_cols)).astype(np.float32)
    y_cpu = matmul(0, typ, w, n_rows, n_cols, x)
    ones = np.concatenate([matmul(1, typ, w, n_rows, n_cols, x[i:i + 1]) for i in range(8)])
    assert nmse(ones, y_cpu) < 1e-10, bg.NAMES[typ]
    for nt in (2, 3, 5, 8):
        assert np.array_equal(matmul(1, typ, w, n_rows, n_cols, x[:nt]), ones[:nt]), (bg.NAMES[typ], nt)


@pytest.mark.parametrize("mmvq", ["0", "1", "2"])
@pytest.mark.parametrize("n_rows,n_cols", [(37, 512), (45, 2560), (67, 8960), (1, 8960), (45, 256 * 19)])
@pytest.mark.parametrize("typ", [bg.Q4_0, bg.Q5_0, bg.Q8_0, bg.Q4_K, bg.Q5_K, bg.Q6_K],
                         ids=lambda t: bg.NAMES[t])
def test_mmvq_pair_kernel_bitwise(typ, n_rows, n_cols, mmvq, monkeypatch):
    """Plain launches of nt >= 2 rows take the pair kernels by default (two weight rows a thread;
    the block kernel's 4 / 2 / 1 rows a block by row length, MI_CUDA_MMVQ=0; the warp kernel's 1,
    2 or 4 warps a row, =1 / =2; row counts that leave a block's second half short): the same bits
    as nt = 1 and as the kernels without pairs (MI_CUDA_MMVQ_PAIR=0), row by row; the launch counter
    proves which kernel ran (nt = 1 never takes it)."""
    monkeypatch.setenv("MI_CUDA_MMVQ", mmvq)
    monkeypatch.setenv("MI_CUDA_MMVQ_MMA", "0")
    monkeypatch.delenv("MI_CUDA_MMVQ_PAIR", raising=False)
    rng = np.random.default_rng(typ * 7 + n_rows)
    w = bg.random_weights(rng, typ, n_rows, n_cols)
    x = rng.standard_normal((8, n_cols)).astype(np.float32)
    n0 = core.mmvq_pair_launches()
    ones = np.concatenate([matmul(1, typ, w, n_rows, n_cols, x[i:i + 1]) for i in range(8)])
    assert core.mmvq_pair_launches() == n0
    for nt in range(2, 9):
        assert np.array_equal(matmul(1, typ, w, n_rows, n_cols, x[:nt]), ones[:nt]), (bg.NAMES[typ], nt)
    assert core.mmvq_pair_launches() == n0 + 7
    monkeypatch.setenv("MI_CUDA_MMVQ_PAIR", "0")
    for nt in (2, 5, 8):
        assert np.array_equal(matmul(1, typ, w, n_rows, n_cols, x[:nt]), ones[:nt]), (bg.NAMES[typ], nt)
    assert core.mmvq_pair_launches() == n0 + 7
    assert nmse(ones, matmul(0, typ, w, n_rows, n_cols, x)) < 1e-10


@pytest.mark.parametrize("typ", [bg.Q4_K, bg.Q5_0], ids=lambda t: bg.NAMES[t])
def test_mmvq_pair_rows_bound(typ, monkeypatch):
    """MI_CUDA_MMVQ_PAIR_ROWS unset: only block-kernel matrices of >= 1024 rows take the pair kernel
    (the 0.5B shape's 896-row o / ffn_down were faster without, docs/perf.md session 34); a set
    bound moves it; the warp kernel's matrices pair whatever their rows; the same bits throughout,
    the launch counter proving which kernel ran."""
    monkeypatch.delenv("MI_CUDA_MMVQ_PAIR_ROWS")
    monkeypatch.setenv("MI_CUDA_MMVQ_MMA", "0")
    rng = np.random.default_rng(typ)
    x = rng.standard_normal((4, 512)).astype(np.float32)
    for n_rows, mmvq, bound, pairs in ((1023, "3", None, 0), (1024, "3", None, 1), (1023, "3", "1023", 1),
                                       (1024, "3", "1025", 0), (1023, "1", None, 1)):
        monkeypatch.setenv("MI_CUDA_MMVQ", mmvq)  # 3: the default (block kernel for these rows), 1: warp kernel
        if bound is None:
            monkeypatch.delenv("MI_CUDA_MMVQ_PAIR_ROWS", raising=False)
        else:
            monkeypatch.setenv("MI_CUDA_MMVQ_PAIR_ROWS", bound)
        w = bg.random_weights(rng, typ, n_rows, 512)
        ones = np.concatenate([matmul(1, typ, w, n_rows, 512, x[i:i + 1]) for i in range(4)])
        n0 = core.mmvq_pair_launches()
        y = matmul(1, typ, w, n_rows, 512, x)
        assert core.mmvq_pair_launches() - n0 == pairs, (n_rows, mmvq, bound)
        assert np.array_equal(y, ones), (n_rows, mmvq, bound)


@pytest.mark.parametrize("typ", [bg.Q4_K, bg.Q6_K], ids=lambda t: bg.NAMES[t])
def test_matmul_default_kernel_choice_by_shape(typ, monkeypatch):
    """The default MMVQ choice (MI_CUDA_MMVQ=3) takes the warp kernel with 2 warps a row (mode 2's
    choice for 129..256 chunks) for >= 4096 rows of > 128 chunks and the block kernel below: both
    sides of the rule, CPU bound, rows bitwise across nt, and the same bits as forcing that kernel;
    mode 4 (the rule before session 22: one warp a row) gives other bits there."""
    monkeypatch.delenv("MI_CUDA_MMVQ", raising=False)
    rng = np.random.default_rng(typ + 41)
    n_cols = 256 * 19  # 152 chunks
    for n_rows, forced in ((4100, "2"), (4095, "0")):
        w = bg.random_weights(rng, typ, n_rows, n_cols)
        x = rng.standard_normal((8, n_cols)).astype(np.float32)
        y_cpu = matmul(0, typ, w, n_rows, n_cols, x)
        ones = np.concatenate([matmul(1, typ, w, n_rows, n_cols, x[i:i + 1]) for i in range(8)])
        assert nmse(ones, y_cpu) < 1e-10, (bg.NAMES[typ], n_rows)
        for nt in (2, 5, 8):
            assert np.array_equal(matmul(1, typ, w, n_rows, n_cols, x[:nt]), ones[:nt]), (bg.NAMES[typ], n_rows, nt)
        monkeypatch.setenv("MI_CUDA_MMVQ", forced)
        assert np.array_equal(matmul(1, typ, w, n_rows, n_cols, x), ones), (bg.NAMES[typ], n_rows)
        monkeypatch.setenv("MI_CUDA_MMVQ", "4")
        one_warp = matmul(1, typ, w, n_rows, n_cols, x)
        assert np.array_equal(one_warp, ones) == (n_rows < 4096), (bg.NAMES[typ], n_rows)
        monkeypatch.delenv("MI_CUDA_MMVQ")


@pytest.mark.parametrize("typ", [bg.Q4_K, bg.Q6_K], ids=lambda t: bg.NAMES[t])
def test_mmvq_warp_rows_bound(typ, monkeypatch):
    """MI_CUDA_MMVQ_WARP_ROWS=1024 (mmvq.cu: the fewest rows for the warp kernel, default 4,096)
    moves 1,536-row matrices of > 128-chunk rows to it. Rows of 280 chunks (the 1.5B shape's
    ffn_down) then take 4 warps a row, the block kernel's slots, butterfly and warp order: the same
    bits at every nt. Rows of 152 chunks take 2 warps (tpr 64 against the block kernel's 128):
    other bits, which shows the bound moved the kernel."""
    monkeypatch.delenv("MI_CUDA_MMVQ", raising=False)
    monkeypatch.delenv("MI_CUDA_MMVQ_WARP_ROWS", raising=False)
    rng = np.random.default_rng(typ + 77)
    n_rows = 1536
    for n_cols, same in ((8960, True), (256 * 19, False)):
        w = bg.random_weights(rng, typ, n_rows, n_cols)
        x = rng.standard_normal((8, n_cols)).astype(np.float32)
        ref = {nt: matmul(1, typ, w, n_rows, n_cols, x[:nt]) for nt in (1, 2, 4, 5, 8)}
        monkeypatch.setenv("MI_CUDA_MMVQ_WARP_ROWS", "1024")
        for nt, y in ref.items():
            assert np.array_equal(matmul(1, typ, w, n_rows, n_cols, x[:nt]), y) == same, (n_cols, nt)
        assert nmse(matmul(1, typ, w, n_rows, n_cols, x), matmul(0, typ, w, n_rows, n_cols, x)) < 1e-10
        monkeypatch.delenv("MI_CUDA_MMVQ_WARP_ROWS")


# Shapes by the nt = 1 kernel's threads a row (tpr), which the tensor-core verify kernel replays:
# 48 chunks a row: 32 (4 rows a block); 112: 64; 280: 128 (slots of 2 and 3 chunks); 160 chunks x
# >= 4096 rows: the warp kernel, 2 warps (64), or under MI_CUDA_MMVQ=4 one warp (32); 288 chunks x
# >= 4096 rows: 4 warps (128). (Slots with no chunk: the forward test's 8- and 16-chunk rows.)
MMA_SHAPES = [(64, 1536, None), (48, 3584, None), (32, 8960, None), (4096, 5120, None), (4096, 5120, "4"),
              (4096, 9216, None)]


def nt1_tpr(n_rows, n_cols, mmvq):
    """Threads a row of the nt = 1 kernel (mmvq.cu: mi_rows_per_block, mi_mmvq_warps) by default
    (mmvq None) or under MI_CUDA_MMVQ=4."""
    nch = n_cols // 32
    if nch > 128 and n_rows >= 4096:
        return 32 if mmvq == "4" else 128 if nch > 256 else 64
    return 32 if nch <= 64 else 64 if nch <= 128 else 128


@pytest.mark.parametrize("n_rows,n_cols,mmvq", MMA_SHAPES)
def test_mmvq_mma_rows_bitwise_equal_to_one_row(n_rows, n_cols, mmvq, monkeypatch):
    """MI_CUDA_MMVQ_MMA=2: q4_K groups of 2..8 activation rows on the int8 tensor cores
    (native/cuda/mmvq_mma.cu) give, row by row, the bits of the nt = 1 dp4a kernel; the launch
    counter proves which kernel ran (nt = 1 never takes it); the CPU bound as for every mat-vec."""
    monkeypatch.setenv("MI_CUDA_MMVQ_MMA", "2")
    if mmvq:
        monkeypatch.setenv("MI_CUDA_MMVQ", mmvq)
    rng = np.random.default_rng(n_rows + n_cols)
    w = bg.random_weights(rng, bg.Q4_K, n_rows, n_cols)
    x = rng.standard_normal((8, n_cols)).astype(np.float32)
    n0 = core.mmvq_mma_launches()
    ones = np.concatenate([matmul(1, bg.Q4_K, w, n_rows, n_cols, x[i:i + 1]) for i in range(8)])
    assert core.mmvq_mma_launches() == n0
    assert nmse(ones, matmul(0, bg.Q4_K, w, n_rows, n_cols, x)) < 1e-10
    for nt in range(2, 9):
        assert np.array_equal(matmul(1, bg.Q4_K, w, n_rows, n_cols, x[:nt]), ones[:nt]), nt
    assert core.mmvq_mma_launches() == n0 + 7
    monkeypatch.setenv("MI_CUDA_MMVQ_MMA", "6")  # groups of fewer rows keep the dp4a kernel
    assert np.array_equal(matmul(1, bg.Q4_K, w, n_rows, n_cols, x[:5]), ones[:5])
    assert core.mmvq_mma_launches() == n0 + 7


def test_mmvq_mma_default_threshold_by_kernel(monkeypatch):
    """MI_CUDA_MMVQ_MMA unset: the tensor-core kernel serves groups of >= 5 rows of a block-kernel
    matrix and >= 8 of a warp-kernel one (mmvq.cu: MI_MMVQ_MMA_DEFAULT / _WARP_DEFAULT); the
    launch counter shows which ran, and the rows are the nt = 1 bits either way."""
    monkeypatch.delenv("MI_CUDA_MMVQ_MMA", raising=False)
    monkeypatch.delenv("MI_CUDA_MMVQ", raising=False)
    for n_rows, n_cols, first in ((64, 1536, 5), (4096, 5120, 8)):
        rng = np.random.default_rng(n_rows + 3)
        w = bg.random_weights(rng, bg.Q4_K, n_rows, n_cols)
        x = rng.standard_normal((8, n_cols)).astype(np.float32)
        ones = np.concatenate([matmul(1, bg.Q4_K, w, n_rows, n_cols, x[i:i + 1]) for i in range(8)])
        for nt in range(2, 9):
            n0 = core.mmvq_mma_launches()
            assert np.array_equal(matmul(1, bg.Q4_K, w, n_rows, n_cols, x[:nt]), ones[:nt]), (n_rows, nt)
            assert (core.mmvq_mma_launches() - n0) == (1 if nt >= first else 0), (n_rows, nt)


@pytest.mark.parametrize("split", ["0", "1", "2", None])
@pytest.mark.parametrize("n_rows,n_cols,mmvq", MMA_SHAPES)
def test_mmvq_mma_launch_shapes_bitwise(n_rows, n_cols, mmvq, split, monkeypatch):
    """The tensor-core verify kernel's launch shapes (MI_CUDA_MMVQ_MMA_SPLIT 0: a 16-row tile's
    slot groups in one block; 1 / 2 (default, None): one block a group in a thread block cluster
    whose rank 0 adds them in order) give the nt = 1 dp4a rows' bits; the split launch counter
    proves a cluster ran exactly where the nt = 1 kernel has more than 32 threads a row (tpr 64 /
    128: 112 / 280 chunks, block kernel; 160 / 288 chunks x 4,096 rows, warp kernel) on an sm_90+ GPU."""
    monkeypatch.setenv("MI_CUDA_MMVQ_MMA", "2")
    if mmvq:
        monkeypatch.setenv("MI_CUDA_MMVQ", mmvq)
    else:
        monkeypatch.delenv("MI_CUDA_MMVQ", raising=False)  # the default kernel choice (mmvq.cu, mode 3)
    rng = np.random.default_rng(n_rows + n_cols + 7)
    w = bg.random_weights(rng, bg.Q4_K, n_rows, n_cols)
    x = rng.standard_normal((8, n_cols)).astype(np.float32)
    ones = np.concatenate([matmul(1, bg.Q4_K, w, n_rows, n_cols, x[i:i + 1]) for i in range(8)])
    if split is not None:
        monkeypatch.setenv("MI_CUDA_MMVQ_MMA_SPLIT", split)
    n0, s0 = core.mmvq_mma_launches(), core.mmvq_mma_split_launches()
    for nt in (2, 7, 8):
        assert np.array_equal(matmul(1, bg.Q4_K, w, n_rows, n_cols, x[:nt]), ones[:nt]), nt
    assert core.mmvq_mma_launches() == n0 + 3
    clusters = split != "0" and nt1_tpr(n_rows, n_cols, mmvq) > 32 and core.cuda_compute_capability() >= 90
    assert core.mmvq_mma_split_launches() == s0 + (3 if clusters else 0)


@pytest.mark.parametrize("split", ["0", "1", "2"])
def test_mmvq_mma_split_forward_rows_bitwise(split, monkeypatch):
    """Whole forwards of a model wide enough for the cluster launches (n_embd 2,304: o and gate / up
    at 72 chunks a row, tpr 64; n_ff 4,352: down at 136, tpr 128): nt = 7 and 8 rows give the
    single-token forward's bits under each MI_CUDA_MMVQ_MMA_SPLIT (1 also splits gate / up with
    SwiGLU); capturing the graphs launched clusters where the mode asks for them (sm_90+)."""
    monkeypatch.setenv("MI_CUDA_MMVQ_MMA", "7")
    monkeypatch.setenv("MI_CUDA_MMVQ_MMA_SPLIT", split)
    shape = dict(n_layer=2, n_embd=2304, n_ff=4352, n_head=36, n_head_kv=4, head_dim=64, n_vocab=1000)
    model = small_model(6, types=bg.qwen_types(2), **shape)
    V = shape["n_vocab"]
    rng = np.random.default_rng(int(split) + 60)
    prefix, batch = list(rng.integers(0, V, 5)), list(rng.integers(0, V, 8))
    n0, s0 = core.mmvq_mma_launches(), core.mmvq_mma_split_launches()
    a = make_ctx(model, 1)
    # Each captured forward of >= 7 rows takes the tensor-core kernel 5 times (o and gate / up in
    # both layers, down in layer 1; layer 0's down is q6_K): o and down split under 1 and 2, gate /
    # up under 1 only.
    n_fwd, rem = divmod(core.mmvq_mma_launches() - n0, 5)
    assert n_fwd >= 3 and rem == 0  # nt = 7, 8 and 9 (groups of 8 + 1), in each attention regime
    clusters = {"0": 0, "1": 5, "2": 3}[split] if core.cuda_compute_capability() >= 90 else 0
    assert core.mmvq_mma_split_launches() - s0 == n_fwd * clusters
    run(a, prefix, range(5), V, out_rows=[])
    b = make_ctx(model, 1)
    run(b, prefix, range(5), V, out_rows=[])
    rows = [run(b, [t], [5 + i], V) for i, t in enumerate(batch)]
    for nt in (7, 8):
        la, aa = run(a, batch[:nt], range(5, 5 + nt), V)
        assert np.std(la) > 0.1
        assert np.array_equal(la, np.concatenate([r[0] for r in rows[:nt]])), nt
        assert np.array_equal(aa, np.concatenate([r[1] for r in rows[:nt]])), nt


@pytest.mark.parametrize("nt", [2, 5, 8, 9])
def test_mmvq_mma_forward_rows_bitwise(nt, monkeypatch):
    """Whole forwards with the tensor-core verify kernel (q4_K o with the residual, gate/up with
    SwiGLU and the fused quantize of its output, down): every row's logits and argmax are the
    single-token forward's bits; the graphs of nt >= 2 captured it."""
    monkeypatch.setenv("MI_CUDA_MMVQ_MMA", "2")
    model = small_model(5, types=bg.qwen_types(SMALL["n_layer"]))
    V = SMALL["n_vocab"]
    rng = np.random.default_rng(nt + 50)
    prefix = list(rng.integers(0, V, 9))
    batch = list(rng.integers(0, V, nt))
    n0 = core.mmvq_mma_launches()
    a = make_ctx(model, 1)
    assert core.mmvq_mma_launches() > n0
    run(a, prefix, range(9), V, out_rows=[])
    la, aa = run(a, batch, range(9, 9 + nt), V)
    b = make_ctx(model, 1)
    run(b, prefix, range(9), V, out_rows=[])
    rows = [run(b, [t], [9 + i], V) for i, t in enumerate(batch)]
    assert np.std(la) > 0.1
    assert np.array_equal(la, np.concatenate([r[0] for r in rows]))
    assert np.array_equal(aa, np.concatenate([r[1] for r in rows]))


# ---- MMQ, the tensor-core GEMM for nt >= 10 (native/cuda/mmq.cuh) ----
# Reference: the float64 product of the CPU-dequantized weights (dequantizers tested vs gguf-py).
# MMQ rounds W and x to f16 (2^-11 relative each) and sums in f32: on these operands NMSE ~1e-7 and
# the largest error over all elements ~2e-3 of the rms output (measured on a CPU emulation of the
# kernel source). Bounds, with margin: NMSE < 2e-6 and max |error| < 1e-2 * rms(reference). What
# they catch: a missed or repeated 32-wide chunk moves a row by sqrt(32/n_cols) >= 8% of rms; a
# wrong tile/row/column or scale, O(rms); an unwritten element stays NaN (the op poisons y and
# the K-split partials).

def dequant(typ, w, n_rows, n_cols):
    wd = np.empty((n_rows, n_cols), np.float32)
    core.dequantize(typ, w, n_rows, n_cols, wd)
    return wd.astype(np.float64)


def check_mmq(y, ref, what):
    assert y.shape == ref.shape and y.dtype == np.float32, what
    assert np.all(np.isfinite(y)), what
    rms = float(np.sqrt(np.mean(ref ** 2)))
    assert rms > 0.05, what  # operands are not degenerate
    err = np.abs(y.astype(np.float64) - ref)
    assert nmse(y, ref) < 2e-6, (what, nmse(y, ref))
    assert err.max() < 1e-2 * rms, (what, err.max() / rms, np.unravel_index(err.argmax(), err.shape))


def mmq_case(typ, n_rows, n_cols, nt, seed):
    rng = np.random.default_rng(seed)
    w = bg.random_weights(rng, typ, n_rows, n_cols)
    x = rng.standard_normal((nt, n_cols)).astype(np.float32)
    return w, x, x.astype(np.float64) @ dequant(typ, w, n_rows, n_cols).T


@pytest.mark.parametrize("nt", [9, 16, 37, 64, 200])
@pytest.mark.parametrize("n_cols", [256, 1536, 4608])
@pytest.mark.parametrize("typ", ALL_TYPES, ids=[bg.NAMES[t] for t in ALL_TYPES])
def test_mmq_matches_float64(typ, n_cols, nt):
    """300 weight rows: two full 128-row tiles and a 44-row tail; nt: one partial 64-row tile up to
    four tiles with a tail; few tiles, so the K-split path on any GPU of more than 15 SMs."""
    n_rows = 300
    w, x, ref = mmq_case(typ, n_rows, n_cols, nt, typ * 1000 + n_cols + nt)
    check_mmq(core.mmq(typ, w, n_rows, n_cols, x), ref, (bg.NAMES[typ], n_cols, nt))


MMQ_STAGE_CASES = [(typ, *case) for typ in (bg.Q4_K, bg.Q6_K, bg.F32)
                   for case in ((300, 1536, 37, ""), (1536, 4608, 200, ""), (300, 4608, 16, "3"))]
MMQ_STAGE_CASES += [(typ, 200, 1568, 64, "") for typ in (bg.Q8_0, bg.F32)]  # 49 chunks: a zero-filled half step


@pytest.mark.parametrize("typ,n_rows,n_cols,nt,splits", MMQ_STAGE_CASES,
                         ids=[f"{bg.NAMES[c[0]]}-{c[1]}x{c[2]}-nt{c[3]}-s{c[4] or 'auto'}" for c in MMQ_STAGE_CASES])
def test_mmq_stages_same_bits(typ, n_rows, n_cols, nt, splits, monkeypatch):
    """One or two shared-memory buffers (MI_CUDA_MMQ_STAGES) of the 64-row kernel: the same products
    in the same order, so the same bits, with and without K-split; both within the float64 bound."""
    w, x, ref = mmq_case(typ, n_rows, n_cols, nt, 7 * typ + nt)
    monkeypatch.setenv("MI_CUDA_MMQ_SPLITS", splits)
    monkeypatch.setenv("MI_CUDA_MMQ_BN", "64")  # the stages are the 64-row kernel's
    out = {}
    for stages in ("1", "2"):
        monkeypatch.setenv("MI_CUDA_MMQ_STAGES", stages)
        out[stages] = core.mmq(typ, w, n_rows, n_cols, x)
        check_mmq(out[stages], ref, (bg.NAMES[typ], n_rows, n_cols, nt, stages))
    assert np.array_equal(out["1"], out["2"])
    monkeypatch.setenv("MI_CUDA_MMQ_STAGES", "3")
    with pytest.raises(core.NativeError, match="MI_CUDA_MMQ_STAGES"):
        core.mmq(typ, w, n_rows, n_cols, x)


MMQ_WIDE_CASES = [(bg.Q4_K, 300, 1536, 200, ""), (bg.Q6_K, 1536, 4608, 512, ""), (bg.Q5_0, 130, 800, 70, ""),
                  (bg.F16, 200, 1568, 129, ""), (bg.F32, 64, 96, 65, ""), (bg.Q8_0, 8960, 1536, 256, ""),
                  (bg.Q5_K, 200, 2560, 300, "3"), (bg.Q4_1, 17, 32, 100, "")]


@pytest.mark.parametrize("typ,n_rows,n_cols,nt,splits", MMQ_WIDE_CASES,
                         ids=[f"{bg.NAMES[c[0]]}-{c[1]}x{c[2]}-nt{c[3]}-s{c[4] or 'auto'}" for c in MMQ_WIDE_CASES])
def test_mmq_wide_tiles(typ, n_rows, n_cols, nt, splits, monkeypatch):
    """Calls of > 64 rows: the 128-row tiles (MI_CUDA_MMQ_BN=128: f16 activations by cp.async,
    ldmatrix + mma.sync) and the 64-row kernel both within the float64 bound, with partial tiles in
    both directions, K tails (800, 1568: a half-empty last step; 32: one chunk) and K-split; the
    launch counter proves which kernel ran. Other values of the variable are refused."""
    w, x, ref = mmq_case(typ, n_rows, n_cols, nt, 13 * typ + nt)
    monkeypatch.setenv("MI_CUDA_MMQ_SPLITS", splits)
    for bn in ("64", "128"):
        monkeypatch.setenv("MI_CUDA_MMQ_BN", bn)
        before = core.mmq_wide_launches()
        check_mmq(core.mmq(typ, w, n_rows, n_cols, x), ref, (bg.NAMES[typ], n_rows, n_cols, nt, bn))
        assert core.mmq_wide_launches() - before == (bn == "128"), bn
    monkeypatch.setenv("MI_CUDA_MMQ_BN", "96")
    with pytest.raises(core.NativeError, match="MI_CUDA_MMQ_BN"):
        core.mmq(typ, w, n_rows, n_cols, x)


@pytest.mark.parametrize("fill", ["0", "1"])
def test_mmq_split_rules(fill, monkeypatch):
    """Both automatic K-split rules (MI_CUDA_MMQ_FILL=0: split only grids of fewer tiles than SMs;
    1, the default: the time estimate, mi_mmq_auto_splits) within the float64 bound, on shapes whose
    grids are below, near and above one tile per SM on the H200 (132 SMs: 4 x 34 = 136 tiles of
    128 rows at nt 512, where the estimate splits and the old rule does not)."""
    monkeypatch.setenv("MI_CUDA_MMQ_FILL", fill)
    for typ, n_rows, n_cols, nt in ((bg.Q4_K, 4352, 1024, 512), (bg.Q6_K, 1024, 2048, 300), (bg.Q8_0, 256, 4096, 129)):
        w, x, ref = mmq_case(typ, n_rows, n_cols, nt, n_rows + nt)
        check_mmq(core.mmq(typ, w, n_rows, n_cols, x), ref, (bg.NAMES[typ], n_rows, n_cols, nt, fill))


def test_mmq_wide_tiles_not_below_65_rows(monkeypatch):
    """64 rows or fewer keep the 64-row kernel whatever MI_CUDA_MMQ_BN says (a 128-row tile would
    be at least half empty)."""
    monkeypatch.setenv("MI_CUDA_MMQ_BN", "128")
    w, x, ref = mmq_case(bg.Q4_K, 300, 512, 64, 5)
    before = core.mmq_wide_launches()
    check_mmq(core.mmq(bg.Q4_K, w, 300, 512, x), ref, "nt 64")
    assert core.mmq_wide_launches() == before


@pytest.mark.parametrize("typ", [bg.Q4_K, bg.Q6_K, bg.Q8_0, bg.F16], ids=lambda t: bg.NAMES[t])
@pytest.mark.parametrize("n_rows,n_cols,nt", [(1536, 1536, 200), (8960, 1536, 64), (1536, 8960, 37),
                                              (256, 1536, 512), (8960, 1536, 512)])
def test_mmq_model_shapes(typ, n_rows, n_cols, nt):
    """The 1.5B model's matrices (q/o, gate/up, down, k/v) at verify and prefill widths: grids
    with and without K-split on an H200."""
    w, x, ref = mmq_case(typ, n_rows, n_cols, nt, typ + n_rows + nt)
    check_mmq(core.mmq(typ, w, n_rows, n_cols, x), ref, (bg.NAMES[typ], n_rows, n_cols, nt))


@pytest.mark.parametrize("n_cols", [32, 96, 800])
@pytest.mark.parametrize("typ", [bg.F32, bg.F16, bg.Q4_0, bg.Q4_1, bg.Q5_0, bg.Q5_1, bg.Q8_0],
                         ids=lambda t: bg.NAMES[t])
def test_mmq_k_tail(typ, n_cols):
    """Rows of an odd number of 32-wide chunks: the last 64-column K step is half empty."""
    for nt, n_rows in ((9, 130), (70, 17)):
        w, x, ref = mmq_case(typ, n_rows, n_cols, nt, typ + n_cols + nt)
        check_mmq(core.mmq(typ, w, n_rows, n_cols, x), ref, (bg.NAMES[typ], n_cols, nt))


@pytest.mark.parametrize("nt,n_rows", [(1, 1), (1, 300), (8, 5), (9, 16), (65, 129)])
def test_mmq_edge_sizes(nt, n_rows):
    """Any nt >= 1 works (the forward uses nt >= 10); tiles of one row or column."""
    typ, n_cols = bg.Q4_K, 512
    w, x, ref = mmq_case(typ, n_rows, n_cols, nt, nt * 7 + n_rows)
    check_mmq(core.mmq(typ, w, n_rows, n_cols, x), ref, (nt, n_rows))


@pytest.mark.parametrize("splits", ["1", "2", "3", "16"])
@pytest.mark.parametrize("typ", [bg.Q5_K, bg.Q4_1], ids=lambda t: bg.NAMES[t])
def test_mmq_forced_splits_bias_accumulate(typ, splits, monkeypatch):
    """Every K-split count (MI_CUDA_MMQ_SPLITS), with the bias + accumulate epilogue, which the
    split path applies in its reduce kernel and the unsplit path in the GEMM itself."""
    monkeypatch.setenv("MI_CUDA_MMQ_SPLITS", splits)
    n_rows, n_cols, nt = 200, 2560, 75
    w, x, ref = mmq_case(typ, n_rows, n_cols, nt, typ + int(splits))
    rng = np.random.default_rng(int(splits))
    bias = rng.standard_normal(n_rows).astype(np.float32)
    y0 = rng.standard_normal((nt, n_rows)).astype(np.float32)
    check_mmq(core.mmq(typ, w, n_rows, n_cols, x), ref, ("plain", splits))
    check_mmq(core.mmq(typ, w, n_rows, n_cols, x, bias=bias), ref + bias, ("bias", splits))
    y = core.mmq(typ, w, n_rows, n_cols, x, bias=bias, y0=y0)
    check_mmq(y, ref + bias + y0.astype(np.float64), ("bias+acc", splits))
    check_mmq(core.mmq(typ, w, n_rows, n_cols, x, y0=y0), ref + y0.astype(np.float64), ("acc", splits))


@pytest.mark.parametrize("n_rows,nt", [(300, 37), (8960, 200)])  # K-split on an H200 / not
def test_mmq_deterministic(n_rows, nt):
    typ, n_cols = bg.Q4_K, 1536
    w, x, _ = mmq_case(typ, n_rows, n_cols, nt, 11)
    a = core.mmq(typ, w, n_rows, n_cols, x)
    for _ in range(3):
        assert np.array_equal(core.mmq(typ, w, n_rows, n_cols, x).view(np.uint32), a.view(np.uint32))


def test_mmq_argument_errors():
    w = bg.random_weights(np.random.default_rng(0), bg.Q4_K, 4, 256)
    x = np.zeros((9, 256), np.float32)
    with pytest.raises(ValueError):
        core.mmq(bg.Q4_K, w, 4, 512, x)  # x not [nt, n_cols]
    with pytest.raises(ValueError):
        core.mmq(bg.Q4_K, w[:-1], 4, 256, x)  # w too short
    with pytest.raises(ValueError):
        core.mmq(bg.Q4_K, w, 4, 256, x, bias=np.zeros(3, np.float32))
    with pytest.raises(ValueError):
        core.mmq(bg.Q4_K, w, 4, 256, x, y0=np.zeros((9, 5), np.float32))
    with pytest.raises(ValueError):
        core.mmq(bg.F32, np.zeros(4 * 48 * 4, np.uint8), 4, 48, np.zeros((9, 48), np.float32))  # n_cols % 32
    with pytest.raises(core.NativeError):
        core.mmq(10, w, 4, 256, x)  # Q2_K: not supported


SMALL = dict(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64, n_vocab=1000)
SMALL_TYPES = dict(embd=bg.Q5_0, output=bg.Q8_0, q=bg.Q4_K, k=bg.Q5_K, v=[bg.Q6_K, bg.Q4_0], o=bg.Q4_1,
                   gate=bg.Q4_K, up=bg.Q4_K, down=[bg.Q6_K, bg.Q5_1])


def small_model(seed=0, **over):
    rng = np.random.default_rng(seed)
    kw = dict(SMALL)
    kw.update(over)
    types = kw.pop("types", SMALL_TYPES)
    kw.setdefault("qk_gain", 1.0)  # softer attention: a less chaotic model (see the module doc)
    cfg, tensors, keep, _ = bg.synthetic_model(rng, types=types, **kw)
    return cfg, tensors, keep


def make_ctx(model, device, n_ctx=64, max_nt=16, graphs=True):
    cfg, tensors, keep = model
    old = os.environ.get("MI_CUDA_GRAPHS")
    os.environ["MI_CUDA_GRAPHS"] = "1" if graphs else "0"
    try:
        return core.Context(cfg, tensors, n_ctx, max_nt, 0, device, keep)
    finally:
        if old is None:
            del os.environ["MI_CUDA_GRAPHS"]
        else:
            os.environ["MI_CUDA_GRAPHS"] = old


def run(ctx, tokens, pos, n_vocab, out_rows=None):
    tokens = np.asarray(tokens, np.int32)
    pos = np.asarray(pos, np.int32)
    rows = np.arange(len(tokens), dtype=np.int32) if out_rows is None else np.asarray(out_rows, np.int32)
    logits = np.full((len(rows), n_vocab), np.nan, dtype=np.float32)
    am = np.full(len(rows), -1, dtype=np.int32)
    ctx.forward(tokens, pos, rows, logits, am)
    return logits, am


def test_argmax_of_a_nan_row_is_minus_one():
    """A NaN logit (a NaN in row 7 of an f32 LM head): the CUDA argmax gives -1 for every row, as
    the CPU's does (tests/test_bad_input.py), so the engine reports NaN logits instead of decoding
    token 0; with and without graphs, nt = 1 and 5, with logits read back and argmax only."""
    model = small_model(3, types={**SMALL_TYPES, "output": bg.F32})
    cfg, tensors, keep = model
    out = next(a for a in keep if a.ctypes.data == tensors["output"][0])
    out.view(np.float32).reshape(SMALL["n_vocab"], SMALL["n_embd"])[7, 3] = np.nan
    for graphs in (True, False):
        ctx = make_ctx(model, 1, graphs=graphs)
        for nt in (1, 5):
            logits, am = run(ctx, list(range(1, nt + 1)), list(range(nt)), SMALL["n_vocab"])
            assert np.isnan(logits[:, 7]).all() and (am == -1).all(), (graphs, nt)
            only = np.zeros(nt, np.int32)
            ctx.forward(np.arange(1, nt + 1, dtype=np.int32), np.arange(nt, dtype=np.int32),
                        np.arange(nt, dtype=np.int32), None, only)
            assert (only == -1).all(), (graphs, nt)


def session(ctx, prompt, steps, n_vocab, tokens_from=None):
    """Prefill the prompt, then greedy-decode `steps` tokens (or feed tokens_from). Returns all
    logits rows and the argmax sequence."""
    lg, am = run(ctx, prompt, range(len(prompt)), n_vocab, out_rows=[len(prompt) - 1])
    out_l, out_a = [lg[0]], [int(am[0])]
    for i in range(steps):
        tok = out_a[-1] if tokens_from is None else tokens_from[i]
        lg, am = run(ctx, [tok], [len(prompt) + i], n_vocab)
        out_l.append(lg[0])
        out_a.append(int(am[0]))
    return np.array(out_l), out_a


def prefill_chunks(ctx, prompt, V, chunk=16):
    """Evaluate ``prompt`` at positions 0.. in forwards of ``chunk`` tokens, no logits."""
    for p0 in range(0, len(prompt), chunk):
        run(ctx, prompt[p0:p0 + chunk], range(p0, min(p0 + chunk, len(prompt))), V, out_rows=[])


def batch_under_env(monkeypatch, var, values, model, prompt, batch):
    """For each value of the environment variable ``var``: a fresh GPU context, ``prompt``
    prefilled, then one forward of ``batch`` after it; returns [(logits, argmax)] per value."""
    V, P = model[0]["n_vocab"], len(prompt)
    out = []
    for v in values:
        monkeypatch.setenv(var, v)
        ctx = make_ctx(model, 1, n_ctx=max(64, P + 8, P + len(batch)))
        prefill_chunks(ctx, prompt, V)
        out.append(run(ctx, batch, range(P, P + len(batch)), V))
    return out


@pytest.mark.parametrize("mix", ["mixed", "q4_k_m"])
@pytest.mark.parametrize("prompt_len", [7, 13])  # 7: captured graph path; 13 > 8: plain launches
def test_forward_matches_cpu(prompt_len, mix):
    # q4_k_m: q+k stacked + v of another type on layer 0 (one mixed launch), q+k+v stacked on layer 1;
    # mixed: no stacking
    model = small_model(types=SMALL_TYPES if mix == "mixed" else bg.qwen_types(SMALL["n_layer"]))
    V = SMALL["n_vocab"]
    prompt = list(np.random.default_rng(1).integers(0, V, prompt_len))
    gpu = make_ctx(model, 1)
    lg_gpu, toks = session(gpu, prompt, 6, V)
    cpu = make_ctx(model, 0)
    lg_cpu, am_cpu = session(cpu, prompt, 6, V, tokens_from=toks)
    assert np.all(np.isfinite(lg_gpu))
    rows = [nmse(lg_gpu[i], lg_cpu[i]) for i in range(len(toks))]
    assert nmse(lg_gpu, lg_cpu) < 2e-2, rows
    assert np.std(lg_cpu) > 0.1  # the synthetic model is not degenerate
    for i, (a, b) in enumerate(zip(toks, am_cpu)):
        # greedy tokens equal unless the CPU's own margin between them is within the logit error
        err = np.sqrt(np.mean((lg_gpu[i] - lg_cpu[i]) ** 2))
        assert a == b or lg_cpu[i][b] - lg_cpu[i][a] < 4 * err, (i, rows)
        assert a == int(np.argmax(lg_gpu[i]))


@pytest.mark.parametrize("prompt_len", [5, 11])
def test_forward_f32_weights_close_to_cpu(prompt_len):
    """No activation quantization: only the f16 KV cache differs from the CPU."""
    F = bg.F32
    types = dict(embd=F, output=F, q=F, k=F, v=F, o=F, gate=F, up=F, down=F)
    model = small_model(7, types=types)
    V = SMALL["n_vocab"]
    prompt = list(range(3, 3 + prompt_len))
    lg_gpu, toks = session(make_ctx(model, 1), prompt, 5, V)
    lg_cpu, am_cpu = session(make_ctx(model, 0), prompt, 5, V, tokens_from=toks)
    assert nmse(lg_gpu, lg_cpu) < 1e-5
    assert toks == am_cpu


def test_forward_f16_tied_and_norm_rope():
    types = dict(embd=bg.F16, output=bg.F16, q=bg.Q8_0, k=bg.Q8_0, v=bg.Q8_0, o=bg.Q8_0, gate=bg.Q4_K,
                 up=bg.Q5_K, down=bg.F32)  # gate/up types differ: the split SwiGLU path
    cfg, tensors, keep = small_model(3, types=types, rope_type=0, bias=False, tied=True)
    V = SMALL["n_vocab"]
    prompt = [5, 17, 900, 3, 42]
    lg_gpu, toks = session(make_ctx((cfg, tensors, keep), 1), prompt, 4, V)
    lg_cpu, _ = session(make_ctx((cfg, tensors, keep), 0), prompt, 4, V, tokens_from=toks)
    assert nmse(lg_gpu, lg_cpu) < 2e-2


def test_graph_replay_bitwise_equals_plain_launches():
    model = small_model(2)
    V = SMALL["n_vocab"]
    prompt = [1, 2, 3, 4, 5, 6]
    a_l, a_t = session(make_ctx(model, 1, graphs=True), prompt, 8, V)
    b_l, b_t = session(make_ctx(model, 1, graphs=False), prompt, 8, V)
    assert a_t == b_t
    assert np.array_equal(a_l, b_l)


@pytest.mark.parametrize("nt", [2, 3, 5, 8, 9, 12])
def test_forward_rows_bitwise_equal_to_single_token(nt):
    model = small_model(4)
    V = SMALL["n_vocab"]
    rng = np.random.default_rng(nt)
    prefix = list(rng.integers(0, V, 9))
    batch = list(rng.integers(0, V, nt))
    a = make_ctx(model, 1)
    run(a, prefix, range(9), V, out_rows=[])
    la, aa = run(a, batch, range(9, 9 + nt), V)
    b = make_ctx(model, 1)
    run(b, prefix, range(9), V, out_rows=[])
    rows = [run(b, [t], [9 + i], V) for i, t in enumerate(batch)]
    lb = np.concatenate([r[0] for r in rows])
    ab = np.concatenate([r[1] for r in rows])
    if nt <= 9:  # nt = 9: the 8-row and the 1-row mat-vec, graphed like nt <= 8
        assert np.array_equal(la, lb)
        assert np.array_equal(aa, ab)
        if nt == 9:  # and the same without graphs (the path does not depend on the graph)
            c = make_ctx(model, 1, graphs=False)
            run(c, prefix, range(9), V, out_rows=[])
            assert np.array_equal(run(c, batch, range(9, 9 + nt), V)[0], la)
    else:  # tensor-core GEMM (f16 activations) vs q8a mat-vec rows: a tolerance, not bits
        assert 0 < nmse(la, lb) < 1e-3, nmse(la, lb)


@pytest.mark.parametrize("nt", [1, 5, 12])
def test_fused_swiglu_quant_bitwise(nt, monkeypatch):
    """MI_CUDA_FUSE=1 (SwiGLU launch quantizes its output, last block per 32 rows) gives the bits
    of the separate quantize launch: same function on the same floats."""
    model = small_model(8, types=bg.qwen_types(SMALL["n_layer"]))
    prompt = list(np.random.default_rng(8).integers(0, SMALL["n_vocab"], 10))
    out = batch_under_env(monkeypatch, "MI_CUDA_FUSE", ("0", "1"), model, prompt, list(range(7, 7 + nt)))
    assert np.std(out[0][0]) > 0.1
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])


@pytest.mark.parametrize("nt", [1, 4, 9])
@pytest.mark.parametrize("mix", ["q4_k+q6_k", "q5_0+q8_0", "q4_k+q6_k,rope_kernel", "q5_k+q6_k,k_with_v"])
def test_mixed_qkv_launch_bitwise(nt, mix, monkeypatch):
    """q/k/v in two groups of different types ({q, k} + {v} in layer 0 of these mixes, or {q} +
    {k, v}) in one mixed launch (MI_CUDA_QKV_MIXED=1: required, so context creation fails if it
    cannot run) give the bits of the two launches (=0): each block runs its part's block-kernel
    body. With the fused RoPE epilogue and with the separate rope kernel; nt = 9 as groups of 8 + 1."""
    if mix.startswith("q5_0"):
        types = bg.qwen05_types(SMALL["n_layer"])
    elif mix.startswith("q5_k"):
        types = dict(bg.qwen_types(SMALL["n_layer"]), q=bg.Q5_K, k=bg.Q6_K, v=bg.Q6_K)
    else:
        types = bg.qwen_types(SMALL["n_layer"])
    if mix.endswith("rope_kernel"):
        monkeypatch.setenv("MI_CUDA_ROPE_FUSE", "0")
    model = small_model(13, types=types)
    prompt = list(np.random.default_rng(13).integers(0, SMALL["n_vocab"], 10))
    out = batch_under_env(monkeypatch, "MI_CUDA_QKV_MIXED", ("0", "1"), model, prompt, list(range(7, 7 + nt)))
    assert np.std(out[0][0]) > 0.1
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])
    # and within the usual bound of the CPU (so a wrong mixed launch cannot pass as "equal to itself")
    cpu = make_ctx(model, 0, n_ctx=64)
    prefill_chunks(cpu, prompt, SMALL["n_vocab"])
    lc = run(cpu, list(range(7, 7 + nt)), range(10, 10 + nt), SMALL["n_vocab"])[0]
    assert nmse(out[1][0], lc) < 2e-2, nmse(out[1][0], lc)  # test_forward_matches_cpu's bound


def test_mixed_qkv_required_fails_without_a_compiled_pair(monkeypatch):
    """MI_CUDA_QKV_MIXED=1 refuses a model whose two q/k/v groups have no compiled pair (q4_0 + q8_0),
    which is what makes it a proof, in the test above, that the mixed launch ran."""
    types = dict(bg.qwen_types(SMALL["n_layer"]), q=bg.Q4_0, k=bg.Q4_0, v=bg.Q8_0)
    monkeypatch.setenv("MI_CUDA_QKV_MIXED", "1")
    with pytest.raises(core.NativeError, match="MI_CUDA_QKV_MIXED=1: layer 0"):
        make_ctx(small_model(14, types=types), 1)


@pytest.mark.parametrize("variant", ["mixed", "stacked", "norm_rope_f16", "n_embd_2560"])
def test_fused_rope_bitwise_equals_rope_kernel(variant, monkeypatch):
    """RoPE + KV write in the q/k/v mat-vec epilogue (default) gives the bits of the separate rope
    kernel (MI_CUDA_ROPE_FUSE=0): separate and stacked q/k/v launches, NEOX and NORM, biases, the
    f16 kernel, 4 and 2 rows per block; decode steps after a prompt so the cache is read back."""
    kw = {}
    if variant == "mixed":
        kw = dict(types=SMALL_TYPES)
    elif variant == "stacked":
        kw = dict(types=bg.qwen_types(SMALL["n_layer"]))
    elif variant == "norm_rope_f16":
        kw = dict(types=dict(SMALL_TYPES, q=bg.F16, k=bg.F16, v=bg.F16), rope_type=0)
    else:  # 80 chunks per row: 2 rows per block
        kw = dict(types=bg.qwen_types(SMALL["n_layer"]), n_embd=2560, n_head=40, n_head_kv=8)
    model = small_model(9, **kw)
    V = SMALL["n_vocab"]
    prompt = list(np.random.default_rng(9).integers(0, V, 6))
    out = []
    for fuse in ("0", "1"):
        monkeypatch.setenv("MI_CUDA_ROPE_FUSE", fuse)
        ctx = make_ctx(model, 1)
        lg, toks = session(ctx, prompt, 5, V)
        out.append((lg, toks, run(ctx, [3, 4, 5], [12, 13, 14], V)))
    assert np.std(out[0][0]) > 0.1
    assert out[0][1] == out[1][1]
    assert np.array_equal(out[0][0], out[1][0])
    assert np.array_equal(out[0][2][0], out[1][2][0])


# Query-head grouping and head sizes of the attention kernel (attention.cu): one block per query
# head (MI_CUDA_ATTN_GROUP=0), or one block per KV head with four warps per query head (=1) for
# head_dim 64/128 and G = n_head / n_head_kv in 2..8, per-head blocks otherwise.
ATTN_SHAPES = {
    "g2_hd64": dict(n_head=4, n_head_kv=2, head_dim=64),
    "g4_hd128": dict(n_head=8, n_head_kv=2, head_dim=128),
    "g6_hd128": dict(n_head=12, n_head_kv=2, head_dim=128),
    "g7_hd64": dict(n_head=14, n_head_kv=2, head_dim=64),
    "g8_hd64": dict(n_head=16, n_head_kv=2, head_dim=64),
    "g5_hd128": dict(n_head=10, n_head_kv=2, head_dim=128),  # the 14B's group
    "g7_hd128": dict(n_head=14, n_head_kv=2, head_dim=128),  # the 7B's group
    "g8_hd128": dict(n_head=16, n_head_kv=2, head_dim=128),  # 1024 threads a grouped block
    "per_head_hd96": dict(n_head=6, n_head_kv=2, head_dim=96),
    "per_head_g16": dict(n_head=32, n_head_kv=2, head_dim=64),
    "mha_hd256": dict(n_head=2, n_head_kv=2, head_dim=256),
    "kv8_hd128": dict(n_head=16, n_head_kv=8, head_dim=128),  # the 14B's KV heads
}


def attn_case(shape, model_seed, P, rng_seed, n_batch=5):
    """An f32-weight small model of head layout ``shape`` (only the f16 KV cache differs from the
    CPU), a random prompt of P tokens and a random verify batch: (model, prompt, batch)."""
    F = bg.F32
    model = small_model(model_seed, types=dict(embd=F, output=F, q=F, k=F, v=F, o=F, gate=F, up=F, down=F),
                        **ATTN_SHAPES[shape])
    rng = np.random.default_rng(rng_seed)
    V = SMALL["n_vocab"]
    return model, list(rng.integers(0, V, P)), list(rng.integers(0, V, n_batch))


def check_batch_rows(model, prompt, batch, graphs=True):
    """After ``prompt``: a verify batch of ``batch`` equals its single-token forwards bitwise (logits
    and argmax) and the CPU's within NMSE 1e-5 (f32 weights: only the f16 KV cache differs).
    Returns the batch's logits."""
    V, P = SMALL["n_vocab"], len(prompt)
    ctxs = [make_ctx(model, d, n_ctx=P + 8, graphs=graphs) for d in (1, 1, 0)]
    for c in ctxs:
        prefill_chunks(c, prompt, V)
    lb, ab = run(ctxs[0], batch, range(P, P + len(batch)), V)
    singles = [run(ctxs[1], [t], [P + i], V) for i, t in enumerate(batch)]
    assert np.array_equal(lb, np.concatenate([r[0] for r in singles]))
    assert list(ab) == [int(r[1][0]) for r in singles]
    lc, _ = run(ctxs[2], batch, range(P, P + len(batch)), V)
    assert np.std(lc) > 0.1
    assert nmse(lb, lc) < 1e-5, nmse(lb, lc)
    return lb


@pytest.mark.parametrize("group", ["0", "1", "mma"])  # mma: MI_CUDA_ATTN_MMA=1 (tensor cores)
@pytest.mark.parametrize("splits", ["64", "3"])  # 3: several tiles per split, a partial last tile
@pytest.mark.parametrize("shape", list(ATTN_SHAPES))
def test_attention_long_context(shape, splits, group, monkeypatch):
    """300 cached positions: a 5-row verify batch equals five single-token forwards bitwise, and
    matches the CPU (f32 weights, so only the f16 KV cache differs: NMSE ~1e-7; the tensor-core
    kernel's f16 hi + lo operands keep it there)."""
    shp = ATTN_SHAPES[shape]
    mma = group == "mma"
    if mma and (shp["head_dim"] not in (64, 128) or shp["n_head"] // shp["n_head_kv"] > 16):
        pytest.skip("no tensor-core kernel for this head layout (the CUDA-core one runs: case '0')")
    monkeypatch.setenv("MI_CUDA_ATTN_SPLITS", splits)
    monkeypatch.setenv("MI_CUDA_ATTN_GROUP", "0" if mma else group)
    monkeypatch.setenv("MI_CUDA_ATTN_MMA", "1" if mma else "0")
    P = 300
    model, prompt, batch = attn_case(shape, 8, P, 8)
    lb = check_batch_rows(model, prompt, batch)
    if mma:  # the tensor-core kernel really ran: another summation order than the CUDA-core one
        l0, _ = batch_under_env(monkeypatch, "MI_CUDA_ATTN_MMA", ("0",), model, prompt, batch)[0]
        assert not np.array_equal(lb, l0)


def test_attention_hint_changes_no_bit(monkeypatch):
    """MI_CUDA_ATTN_HINT (block steps of its split a tensor-core attention block hints into L2) is
    a hint only: none, one step and the whole split give the same logits, with splits of three
    128-slot steps (one split over 300 cached positions) and a 5-row verify batch (rows 0-1 and 2-3
    as pairs, the `together` range; row 4 alone). What it guards: that the switch is accepted, its
    launches run, and no hinted range changes a result; the timing effect is docs/perf.md's."""
    monkeypatch.setenv("MI_CUDA_ATTN_MMA", "1")
    monkeypatch.setenv("MI_CUDA_ATTN_SPLITS", "1")
    model, prompt, batch = attn_case("g6_hd128", 8, 300, 8)
    (ref, _), *rest = batch_under_env(monkeypatch, "MI_CUDA_ATTN_HINT", ("", "0", "1"), model, prompt, batch)
    for lg, _ in rest:
        assert np.array_equal(lg, ref)


@pytest.mark.parametrize("kernel", ["cuda_core", "cuda_core_32", "mma"])
@pytest.mark.parametrize("shape,P", [("g6_hd128", 1100), ("g6_hd128", 2040), ("per_head_g16", 1100),
                                     ("per_head_g16", 2040), ("per_head_g16", 2100), ("kv8_hd128", 2100)])
def test_attention_many_splits(shape, P, kernel, monkeypatch):
    """Deeper than test_attention_long_context, so the split merge takes many partials: at these
    depths the splits used are (CUDA-core kernel alone, at most 64 / tensor-core kernel) g6_hd128:
    35 / 9 at 1100, 64 / 16 at 2040; per_head_g16: 18 / 18, 32 / 32, 33 / 33 at 2100; kv8_hd128 at 2100: 33 / 9
    (the tensor-core kernel capped at 132 SMs / 8 KV heads = 16 splits on the H200: 17 tiles in
    splits of 2). A verify batch equals its single forwards bitwise and the CPU within NMSE 1e-5.
    cuda_core_32: the default's CUDA-core kernel below a switch at 4096 (at most 32 splits:
    g6_hd128 18 at 1100 and 32 at 2040, kv8_hd128 22: other bits than with 64). mma: the split merge
    in a launch of its own (the default where the kernel may take > 48 splits: 2 KV heads on the H200)
    and by the kernel's last block (the default for kv8_hd128) each keep the batch / single / CPU
    checks, in other bits."""
    if kernel == "cuda_core_32":
        monkeypatch.setenv("MI_CUDA_ATTN_MMA_FROM", "4096")
    else:
        monkeypatch.setenv("MI_CUDA_ATTN_MMA", "1" if kernel == "mma" else "0")
    model, prompt, batch = attn_case(shape, 13, P, P)
    lb = check_batch_rows(model, prompt, batch)
    if kernel == "cuda_core_32" and ATTN_SHAPES[shape]["head_dim"] == 128:  # > 32 tiles of 32 slots
        (l64, _), = batch_under_env(monkeypatch, "MI_CUDA_ATTN_MMA", ("0",), model, prompt, batch)
        assert not np.array_equal(lb, l64)  # 64 splits (the CUDA-core kernel alone): other bits
    if kernel == "mma":  # every row merged by a launch of its own / by the kernel's last block
        la = check_batch_rows_under(monkeypatch, "MI_CUDA_ATTN_COMBINE_FROM", "1", model, prompt, batch)
        ln = check_batch_rows_under(monkeypatch, "MI_CUDA_ATTN_COMBINE_FROM", "65", model, prompt, batch)
        assert not np.array_equal(la, ln)
        assert np.array_equal(lb, la) or np.array_equal(lb, ln)  # the default is one of the two
        if "H200" in core.cuda_device_name():  # 132 SMs: the launch where the kernel may take 64 splits
            assert np.array_equal(lb, ln if shape == "kv8_hd128" else la)


@pytest.mark.parametrize("shape,P,splits", [("per_head_g16", 4200, "100"), ("g6_hd128", 8450, "100"),
                                            ("g6_hd128", 8450, "70"), ("g6_hd128", 8450, "64")])
def test_attention_mma_more_than_64_splits(shape, P, splits, monkeypatch):
    """The tensor-core kernel may take up to MI_ATTN_MMA_SPLITS (128) splits (the CUDA-core kernel
    64): per_head_g16 (4 warps, 64-slot tiles) at 4200 cached positions takes 66 splits of 64 slots
    under MI_CUDA_ATTN_SPLITS=100, g6_hd128 (8 warps, 128-slot tiles; the 1.5B's layout) at 8450
    takes 67 of 128 (100 or 70: the merge launch's 8-part and 4-part instances) or 34 of 256 (64).
    The batch equals its single forwards bitwise and the
    CPU within NMSE 1e-5; rows of > 64 splits take the combine launch (the last-block merge holds
    64), so MI_CUDA_ATTN_COMBINE_FROM=65 ("never", for rows of <= 64 splits) gives the same bits as 1
    there, and other bits than 64 splits. (mi_cuda_attention also clamps a larger combine_from to
    65, a guard no context reaches: context creation refuses values above 65.)"""
    monkeypatch.setenv("MI_CUDA_ATTN_MMA", "1")
    monkeypatch.setenv("MI_CUDA_ATTN_SPLITS", splits)
    model, prompt, batch = attn_case(shape, 23, P, P, n_batch=3)
    la = check_batch_rows_under(monkeypatch, "MI_CUDA_ATTN_COMBINE_FROM", "1", model, prompt, batch)
    (ln, _), = batch_under_env(monkeypatch, "MI_CUDA_ATTN_COMBINE_FROM", ("65",), model, prompt, batch)
    if splits != "64":
        assert np.array_equal(la, ln)
        (l64, _), = batch_under_env(monkeypatch, "MI_CUDA_ATTN_SPLITS", ("64",), model, prompt, batch)
        assert not np.array_equal(la, l64)
    else:  # 34 splits: the last-block merge, another order than the launch's
        assert not np.array_equal(la, ln)


def check_batch_rows_under(monkeypatch, var, value, model, prompt, batch, graphs=True):
    """check_batch_rows with the environment variable ``var`` set to ``value`` (restored after)."""
    with monkeypatch.context() as m:
        m.setenv(var, value)
        return check_batch_rows(model, prompt, batch, graphs=graphs)


@pytest.mark.parametrize("graphs", ["1", "0"])
def test_attention_combine_threshold_inside_a_batch(graphs, monkeypatch):
    """MI_CUDA_ATTN_COMBINE_FROM=10 with rows at 1150..1154 (9, 9, 10, 10, 10 splits of 128 slots):
    one forward merges the first two rows in the tensor-core kernel's last block and the others by
    the combine launch; each row equals its single-token forward bitwise and the CPU within NMSE
    1e-5, the first two equal a never-combine context's and the others do not."""
    monkeypatch.setenv("MI_CUDA_ATTN_MMA", "1")
    P = 1150
    model, prompt, batch = attn_case("g6_hd128", 14, P, 15)
    lm = check_batch_rows_under(monkeypatch, "MI_CUDA_ATTN_COMBINE_FROM", "10", model, prompt, batch,
                                graphs=graphs == "1")
    (ln, _), = batch_under_env(monkeypatch, "MI_CUDA_ATTN_COMBINE_FROM", ("65",), model, prompt, batch)
    assert np.array_equal(lm[:2], ln[:2])  # the prompt's rows (<= 9 splits) took the same path
    assert not np.array_equal(lm[2:], ln[2:])


@pytest.mark.parametrize("heads,hd", [((12, 2), 128), ((14, 2), 64), ((4, 4), 64), ((16, 8), 128)])
@pytest.mark.parametrize("case", ["prompt", "after_cache", "scattered"])
def test_prefill_attention_kernel(heads, hd, case):
    """The prefill attention kernel alone against a float64 softmax over the same f16 K/V: rows at
    consecutive positions from 0 (a prompt), from 150 (a chunk after cached positions, 33 rows: a
    partial last tile), and at scattered positions (each row's own mask inside a tile). Relative
    error bound 2e-5 per row: q and P are split hi / lo into f16 pairs (~22 bits)."""
    n_head, n_head_kv = heads
    rng = np.random.default_rng(hd + n_head)
    n_kv = 200
    pos = {"prompt": np.arange(40), "after_cache": np.arange(150, 183),
           "scattered": rng.permutation(n_kv)[:29]}[case].astype(np.int32)
    nt = len(pos)
    q = rng.standard_normal((nt, n_head * hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, n_head_kv * hd)).astype(np.float16)
    v = rng.standard_normal((n_kv, n_head_kv * hd)).astype(np.float16)
    scale = 1.0 / np.sqrt(hd)
    out = core.attention_prefill(q, k.view(np.uint16), v.view(np.uint16), pos, n_head, n_head_kv, scale)
    G = n_head // n_head_kv
    for t in range(nt):
        for h in range(n_head):
            g = h // G
            kk = k[:pos[t] + 1, g * hd:(g + 1) * hd].astype(np.float64)
            vv = v[:pos[t] + 1, g * hd:(g + 1) * hd].astype(np.float64)
            sc = kk @ q[t, h * hd:(h + 1) * hd].astype(np.float64) * scale
            p = np.exp(sc - sc.max())
            ref = p @ vv / p.sum()
            got = out[t, h * hd:(h + 1) * hd]
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert err < 2e-5, (t, h, err)


def test_prefill_attention_kernel_refuses_bad_input():
    q = np.zeros((3, 2 * 96), np.float32)
    kv = np.zeros((8, 96), np.uint16)
    with pytest.raises(core.NativeError, match="head_dim 96"):
        core.attention_prefill(q, kv, kv, np.arange(3, dtype=np.int32), 2, 1, 0.1)
    q = np.zeros((3, 128), np.float32)
    kv = np.zeros((8, 64), np.uint16)
    with pytest.raises(core.NativeError, match="pos"):
        core.attention_prefill(q, kv, kv, np.array([0, 8, 1], np.int32), 2, 1, 0.1)


@pytest.mark.parametrize("shape", ["g6_hd128", "g7_hd64", "g2_hd64", "kv8_hd128", "mha_hd256"])
@pytest.mark.parametrize("P,nt", [(0, 40), (21, 12), (37, 64)])
def test_prefill_attention_within_tolerance(shape, P, nt, monkeypatch):
    """Forwards of nt >= 10 rows (prompt chunks) take the prefill attention (MI_CUDA_ATTN_PREFILL,
    one tensor-core block per 16 rows and head, each row masked at its own position): within NMSE
    1e-6 of the decode kernels (=0), 1e-4 of the CPU (the GEMMs), after P cached positions (a
    partial last 16-row tile; 64 rows = 4 tiles whose slot ranges differ). mha_hd256 has no prefill
    kernel and must equal =0 bitwise (the fallback); the others differ from =0 at 40 rows (smaller
    cases may not: the kernel's ~1e-7 differences can vanish in the GEMM's f16). That the kernel is
    right on its own: test_prefill_attention_kernel."""
    model, prompt, _ = attn_case(shape, 31, P + nt, 31)
    V = SMALL["n_vocab"]
    head, batch = prompt[:P], prompt[P:]
    out = []
    for v in ("0", "1"):
        monkeypatch.setenv("MI_CUDA_ATTN_PREFILL", v)
        ctx = make_ctx(model, 1, n_ctx=128, max_nt=64)
        prefill_chunks(ctx, head, V, chunk=8)  # the mat-vec path: the same cache under both
        out.append(run(ctx, batch, range(P, P + nt), V)[0])
    cpu = make_ctx(model, 0, n_ctx=128, max_nt=64)
    prefill_chunks(cpu, head, V, chunk=8)
    lc = run(cpu, batch, range(P, P + nt), V)[0]
    assert np.std(lc) > 0.1
    if shape == "mha_hd256":
        assert np.array_equal(out[0], out[1])
    elif (P, nt) == (0, 40):  # the kernel ran (differed on the H200 for every layout here; fixed seeds)
        assert not np.array_equal(out[0], out[1])
    assert nmse(out[1], out[0]) < 1e-6, nmse(out[1], out[0])
    assert nmse(out[1], lc) < 1e-4, nmse(out[1], lc)  # the GEMMs round x and W to f16


@pytest.mark.parametrize("graphs", ["1", "0"])
@pytest.mark.parametrize("shape", ["g6_hd128", "g7_hd64", "per_head_g16"])
def test_attention_switch_position_splits_a_batch(shape, graphs, monkeypatch):
    """MI_CUDA_ATTN_MMA_FROM=302 with rows at 300..304: one forward runs the CUDA-core kernel for
    rows 300, 301 and the tensor-core kernel for 302..304 (the graph of both regimes); each row
    equals its single-token forward bitwise (those use one kernel each) and the CPU within
    tolerance, and the switch really changes rows (302.. differ from a never-switch context)."""
    monkeypatch.setenv("MI_CUDA_ATTN_MMA_FROM", "302")
    P = 300
    model, prompt, batch = attn_case(shape, 8, P, 12)
    lb = check_batch_rows(model, prompt, batch, graphs=graphs == "1")
    ln, _ = batch_under_env(monkeypatch, "MI_CUDA_ATTN_MMA", ("0",), model, prompt, batch)[0]
    assert np.array_equal(lb[:2], ln[:2])  # rows below the switch: the same kernel
    assert not np.array_equal(lb[2:], ln[2:])  # rows from it on: another summation order


@pytest.mark.parametrize("shape", ["g2_hd64", "g6_hd128", "g7_hd64", "g8_hd128", "kv8_hd128", "per_head_g16"])
@pytest.mark.parametrize("P,splits,n_batch", [(300, None, 6), (511, "4", 6), (2100, None, 5)])
def test_attention_row_pairs_bitwise(shape, P, splits, n_batch, monkeypatch):
    """The tensor-core kernel serves two batch rows a block (MI_CUDA_ATTN_PAIR, default on; <= 8
    query heads a KV head) where their splits start at the same slot: the same bits as a block per
    row (=0), and the batch equals its single forwards and the CPU. 511 with 4 splits: rows 511 and
    512 take splits of 128 and 256 slots (only split 0 is shared); 5 rows: a last row alone;
    per_head_g16 (16 query heads a KV head) never pairs."""
    monkeypatch.setenv("MI_CUDA_ATTN_MMA", "1")
    if splits:
        monkeypatch.setenv("MI_CUDA_ATTN_SPLITS", splits)
    model, prompt, batch = attn_case(shape, 19, P, P, n_batch=n_batch)
    n0 = core.attn_pair_launches()
    lp = check_batch_rows(model, prompt, batch)
    n1 = core.attn_pair_launches()
    # Launches whose grid pairs batch rows (counted as the contexts capture their graphs, which then
    # run the batch): some for every layout of <= 8 query heads a KV head, none for 16.
    assert (n1 > n0) == (shape != "per_head_g16")
    (ln, _), = batch_under_env(monkeypatch, "MI_CUDA_ATTN_PAIR", ("0",), model, prompt, batch)
    assert core.attn_pair_launches() == n1  # =0: a block per row
    assert np.array_equal(lp, ln)


@pytest.mark.parametrize("n_embd", [1536, 5120])
def test_norm_row_in_registers_changes_no_bit(n_embd, monkeypatch):
    """The norm holds a whole row of up to 8,192 in registers (norm.cu, mi_norm_pre: 2 chunks a warp
    for 1,536, 8 for 5,120); MI_CUDA_NORM_PRE=4 (the choice before) holds 4, and reads the rest of a
    5,120-wide row (the 14B's) again after the reduction. The additions are the same, so the logits
    are the same bits."""
    kv = 2 if n_embd == 1536 else 8  # the 1.5B's and the 14B's head layouts
    model = small_model(12, n_layer=1, n_embd=n_embd, n_ff=512, n_head=n_embd // 128, n_head_kv=kv, head_dim=128)
    out = batch_under_env(monkeypatch, "MI_CUDA_NORM_PRE", ("4", "0"), model, [3, 1, 4, 1, 5], [9, 2, 6])
    assert np.std(out[0][0]) > 0.1
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])


@pytest.mark.parametrize("shape", ["g2_hd64", "g4_hd128", "g6_hd128", "g7_hd64", "g8_hd64", "g5_hd128", "g7_hd128",
                                   "g8_hd128"])
def test_attention_grouped_blocks_bitwise_equal_per_head(shape, monkeypatch):
    """MI_CUDA_ATTN_GROUP=1 (one block per KV head's query group) is a speed choice only."""
    P = 150
    model, prompt, batch = attn_case(shape, 9, P, 9)
    out = batch_under_env(monkeypatch, "MI_CUDA_ATTN_GROUP", ("0", "1"), model, prompt, batch)
    assert np.std(out[0][0]) > 0.1
    assert np.array_equal(out[0][0], out[1][0])


@pytest.mark.parametrize("var,val", [("MI_CUDA_SKIP", "attn,bogus"), ("MI_CUDA_ATTN_SPLITS", "129"),
                                     ("MI_CUDA_ATTN_SPLITS", "0"), ("MI_CUDA_MMVQ", "5"), ("MI_CUDA_MMVQ", "x"),
                                     ("MI_CUDA_MMVQ_PAIR", "2"), ("MI_CUDA_MMVQ_PAIR", "on"), ("MI_CUDA_NORM_PRE", "8"),
                                     ("MI_CUDA_MMVQ_PAIR_ROWS", "-1"), ("MI_CUDA_MMVQ_PAIR_ROWS", "1k"),
                                     ("MI_CUDA_MMVQ_WARP_ROWS", "0"), ("MI_CUDA_MMVQ_WARP_ROWS", "4k"),
                                     ("MI_CUDA_MMVQ_WARP_ROWS", "+12"),
                                     ("MI_CUDA_ATTN_GROUP", "2"), ("MI_CUDA_ATTN_GROUP", "1x"),
                                     ("MI_CUDA_ATTN_MMA", "2"), ("MI_CUDA_ATTN_MMA_FROM", "x"),
                                     ("MI_CUDA_ATTN_PAIR", "2"), ("MI_CUDA_ATTN_HINT", "x"),
                                     ("MI_CUDA_ATTN_HINT", "-1"), ("MI_CUDA_ATTN_HINT", "1x"),
                                     ("MI_CUDA_ATTN_HINT", str(2**20 + 1)),
                                     ("MI_CUDA_ATTN_MMA_FROM", "-1"),
                                     ("MI_CUDA_ATTN_COMBINE_FROM", "0"), ("MI_CUDA_ATTN_COMBINE_FROM", "66"),
                                     ("MI_CUDA_QKV_MIXED", "2"), ("MI_CUDA_ATTN_PREFILL", "2"),
                                     ("MI_CUDA_MMQ_STAGES", "3"), ("MI_CUDA_MMQ_BN", "256"),
                                     ("MI_CUDA_MMQ_FILL", "2"), ("MI_CUDA_MMQ_FILL", "on"),
                                     ("MI_CUDA_MMVQ_MMA", "1"), ("MI_CUDA_MMVQ_MMA", "9"), ("MI_CUDA_MMVQ_MMA", "2x"),
                                     ("MI_CUDA_MMVQ_MMA_SPLIT", "3"), ("MI_CUDA_MMVQ_MMA_SPLIT", ""),
                                     ("MI_CUDA_FUSE", "yes"), ("MI_CUDA_MMQ", "2"),
                                     ("MI_CUDA_ROPE_FUSE", "00"), ("MI_CUDA_QKV_STACK", "true"),
                                     ("MI_CUDA_PDL", "0x"), ("MI_CUDA_PROFILE", "on"),
                                     ("MI_CUDA_MMQ_SPLITS", "four"), ("MI_CUDA_MMQ_SPLITS", "-1")])
def test_bad_tuning_environment_is_refused(var, val, monkeypatch):
    monkeypatch.setenv(var, val)
    with pytest.raises(core.NativeError, match=var):
        make_ctx(small_model(11), 1)


@pytest.mark.parametrize("val", ["off", "2", "00"])
def test_bad_graphs_switch_is_refused(val, monkeypatch):
    """MI_CUDA_GRAPHS goes to the context directly: make_ctx sets it itself."""
    cfg, tensors, keep = small_model(11)
    monkeypatch.setenv("MI_CUDA_GRAPHS", val)
    with pytest.raises(core.NativeError, match="MI_CUDA_GRAPHS"):
        core.Context(cfg, tensors, 64, 16, 0, 1, keep)


@pytest.mark.parametrize("var", ["MI_CUDA_ATTN_MMA", "MI_CUDA_ATTN_MMA_FROM", "MI_CUDA_ATTN_COMBINE_FROM",
                                 "MI_CUDA_MMVQ_WARP_ROWS", "MI_CUDA_NORM_PRE", "MI_CUDA_ATTN_HINT", "MI_CUDA_MMVQ_PAIR",
                                 "MI_CUDA_MMVQ_PAIR_ROWS",
                                 "MI_CUDA_FUSE", "MI_CUDA_MMQ", "MI_CUDA_ROPE_FUSE",
                                 "MI_CUDA_QKV_STACK", "MI_CUDA_PDL", "MI_CUDA_PROFILE", "MI_CUDA_MMQ_SPLITS"])
def test_empty_tuning_environment_is_unset(var, monkeypatch):
    """VAR= (empty, as `bench/depth.py --env VAR=,1` sets it) means the default, not an error."""
    model = small_model(11)
    V = SMALL["n_vocab"]
    ref = run(make_ctx(model, 1), [1, 2, 3], [0, 1, 2], V)[0]
    monkeypatch.setenv(var, "")
    assert np.array_equal(run(make_ctx(model, 1), [1, 2, 3], [0, 1, 2], V)[0], ref)


def test_prefill_chunking_within_tolerance():
    """One 40-token prefill (GEMM), chunks 16+16+8 (GEMM, GEMM, mat-vec) and eight 5-token
    chunks (mat-vec): the last row's logits agree within the tolerance of the two paths."""
    model = small_model(6)
    V = SMALL["n_vocab"]
    prompt = list(np.random.default_rng(6).integers(0, V, 40))
    out = []
    for sizes in ([40], [16, 16, 8], [5] * 8):
        ctx = make_ctx(model, 1, max_nt=40)
        p0 = 0
        for k in sizes:
            last = p0 + k == len(prompt)
            lg, _ = run(ctx, prompt[p0:p0 + k], range(p0, p0 + k), V, out_rows=[k - 1] if last else [])
            p0 += k
        out.append(lg[0])
    assert np.std(out[0]) > 0.1
    for o in out[1:]:
        assert nmse(o, out[0]) < 1e-3, nmse(o, out[0])
    # and the mat-vec path alone is the nt-invariant one: MI_CUDA_MMQ=0 makes 40 == 5 x 8 bitwise
    os.environ["MI_CUDA_MMQ"] = "0"
    try:
        ctx = make_ctx(model, 1, max_nt=40)
        lg, _ = run(ctx, prompt, range(40), V, out_rows=[39])
    finally:
        del os.environ["MI_CUDA_MMQ"]
    assert np.array_equal(lg[0], out[2])


@pytest.mark.parametrize("P,nt", [(0, 100), (30, 130)])
def test_wide_gemm_forward_within_tolerance(P, nt, monkeypatch):
    """Forwards of > 64 rows run their GEMMs on the 128-row tiles (the default on the H200; k, v
    and up reuse the f16 input q and gate converted, mmq_xh): within NMSE 1e-6 of the 64-row kernel
    (MI_CUDA_MMQ_BN=64) and as close to the CPU as that kernel (NMSE 1e-3, the GEMM path's bound in
    test_prefill_chunking_within_tolerance: at (30, 130) both kernels are 4e-4 from the CPU on the
    H200), after P cached positions; the launch counter proves that 7 GEMMs a layer (q, k, v, o,
    gate, up, down) took the wide tiles."""
    model = small_model(12)
    V = SMALL["n_vocab"]
    prompt = list(np.random.default_rng(12).integers(0, V, P + nt))
    rows = [0, nt // 2, nt - 1]
    out = []
    for bn in ("64", "128"):
        monkeypatch.setenv("MI_CUDA_MMQ_BN", bn)
        ctx = make_ctx(model, 1, n_ctx=256, max_nt=160)
        prefill_chunks(ctx, prompt[:P], V, chunk=8)
        before = core.mmq_wide_launches()
        out.append(run(ctx, prompt[P:], range(P, P + nt), V, out_rows=rows)[0])
        assert core.mmq_wide_launches() - before == (7 * SMALL["n_layer"] if bn == "128" else 0), bn
    cpu = make_ctx(model, 0, n_ctx=256, max_nt=160)
    prefill_chunks(cpu, prompt[:P], V, chunk=8)
    lc = run(cpu, prompt[P:], range(P, P + nt), V, out_rows=rows)[0]
    assert np.std(lc) > 0.1
    assert nmse(out[1], out[0]) < 1e-6, nmse(out[1], out[0])
    assert nmse(out[1], lc) < min(1e-3, 2 * nmse(out[0], lc) + 1e-6), (nmse(out[1], lc), nmse(out[0], lc))


def test_out_rows_subset_and_argmax_only():
    model = small_model(5)
    V = SMALL["n_vocab"]
    ctx = make_ctx(model, 1)
    lg, am = run(ctx, [3, 4, 5, 6], [0, 1, 2, 3], V, out_rows=[3, 1])
    ref = make_ctx(model, 1)
    lg2, am2 = run(ref, [3, 4, 5, 6], [0, 1, 2, 3], V)
    assert np.array_equal(lg, lg2[[3, 1]])
    assert list(am) == [int(np.argmax(lg[0])), int(np.argmax(lg[1]))]
    am3 = np.zeros(1, np.int32)
    ctx.forward(np.array([9], np.int32), np.array([4], np.int32), np.array([0], np.int32), None, am3)
    assert 0 <= am3[0] < V


@pytest.mark.parametrize("graphs", [True, False])
def test_submitted_forwards_run_alongside_and_match(graphs):
    """Two contexts with forwards queued together (the draft's steps while the target's submitted
    batch may still run: whether they overlap is bench/overlap_probe.py's question) give the argmax
    ids each gives alone; one forward in flight per context."""
    V = SMALL["n_vocab"]
    a_model, b_model = small_model(21), small_model(22, n_layer=1)
    prompt = [5, 9, 2, 7, 11, 3]
    ref_a, ref_b = make_ctx(a_model, 1, graphs=graphs), make_ctx(b_model, 1, graphs=graphs)
    A, B = make_ctx(a_model, 1, graphs=graphs), make_ctx(b_model, 1, graphs=graphs)
    for c in (ref_a, ref_b, A, B):
        prefill_chunks(c, prompt, V)
    batch = [4, 8, 1, 6, 2]
    pos = list(range(len(prompt), len(prompt) + len(batch)))
    _, want_a = run(ref_a, batch, pos, V)
    _, want_b = session(ref_b, prompt, 4, V)
    rows = np.arange(len(batch), dtype=np.int32)
    A.forward_submit(np.array(batch, np.int32), np.array(pos, np.int32), rows)
    with pytest.raises(core.NativeError, match="not been waited"):
        A.forward(np.array([1], np.int32), np.array([0], np.int32), np.zeros(1, np.int32), None, np.zeros(1, np.int32))
    with pytest.raises(core.NativeError, match="not been waited"):
        A.forward_submit(np.array([1], np.int32), np.array([0], np.int32), np.zeros(1, np.int32))
    got_b = [int(want_b[0])]
    for i in range(4):  # B's steps while A's batch may still run
        _, am = run(B, [got_b[-1]], [len(prompt) + i], V)
        got_b.append(int(am[0]))
    A.forward_ready()
    am = np.full(len(batch), -1, np.int32)
    with pytest.raises(ValueError, match="too small"):
        A.forward_wait(np.zeros(2, np.int32))
    A.forward_wait(am)
    assert A.forward_ready()
    assert list(am) == list(want_a) and got_b == list(want_b)
    with pytest.raises(core.NativeError, match="no submitted forward"):
        A.forward_wait(am)


def test_context_full_and_oom_errors():
    model = small_model(6)
    ctx = make_ctx(model, 1, n_ctx=8)
    with pytest.raises(core.ContextFullError):
        run(ctx, [1], [8], SMALL["n_vocab"])
    cfg, tensors, keep = model
    with pytest.raises(MemoryError):
        core.Context(cfg, tensors, 1 << 30, 1, 0, 1, keep)  # KV cache of ~1 TiB
