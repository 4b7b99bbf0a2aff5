"""Per-kind GPU time of a 512-token prefill (MI_CUDA_PROFILE=1, graphs off)."""
import os, sys
os.environ["MI_CUDA_PROFILE"] = "1"
os.environ["MI_CUDA_GRAPHS"] = "0"
sys.path.insert(0, "bench")
import numpy as np
from bench_gpu import SHAPES, synthetic_model, types_for, prefill
from pyminfer import _core
for name in sys.argv[1].split(","):
    rng = np.random.default_rng(0)
    cfg, tensors, keep, _ = synthetic_model(rng, types=types_for(name), **SHAPES[name])
    ctx = _core.Context(cfg, tensors, 1024, 512, 0, 1, keep)
    for _ in range(4):
        prefill(ctx, 512, nt=512)
    print(name, "4 x prefill 512 (nt=512):", flush=True)
    del ctx
