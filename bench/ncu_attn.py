"""Nsight Compute target: synthetic 1.5b, KV cache filled to DEPTH, one decode forward profiled
(graphs off). python3 bench/ncu_attn.py [DEPTH], under e.g.
    ncu --profile-from-start off -k regex:mi_attn --launch-count 2 --section SpeedOfLight ..."""
import ctypes
import os
import sys

os.environ["MI_CUDA_GRAPHS"] = "0"  # one launch per op, so ncu sees each kernel (read at context creation)
import numpy as np  # noqa: E402
from bench_gpu import SHAPES, prefill, synthetic_model, types_for  # noqa: E402
from pyminfer import _core  # noqa: E402
depth = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
cfg, tensors, keep, _ = synthetic_model(np.random.default_rng(0), types=types_for("1.5b"), **SHAPES["1.5b"])
ctx = _core.Context(cfg, tensors, depth + 64, 64, 0, 1, keep)
prefill(ctx, depth)
row0 = np.zeros(1, np.int32); am = np.zeros(1, np.int32)
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuProfilerStart()
ctx.forward(np.array([7], np.int32), np.array([depth], np.int32), row0, argmax=am)
cuda.cuProfilerStop()
