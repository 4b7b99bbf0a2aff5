"""ncu target: synthetic 1.5b, KV filled to DEPTH, one decode forward profiled (graphs off)."""
import ctypes, os, sys
sys.path.insert(0, "bench")
import numpy as np
from bench_gpu import SHAPES, prefill, synthetic_model, types_for
from pyminfer import _core
depth = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
cfg, tensors, keep, _ = synthetic_model(np.random.default_rng(0), types=types_for("1.5b"), **SHAPES["1.5b"])
ctx = _core.Context(cfg, tensors, depth + 64, 64, 0, 1, keep)
prefill(ctx, depth)
row0 = np.zeros(1, np.int32); am = np.zeros(1, np.int32)
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuProfilerStart()
ctx.forward(np.array([7], np.int32), np.array([depth], np.int32), row0, argmax=am)
cuda.cuProfilerStop()
