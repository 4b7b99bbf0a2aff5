"""Where a 512-token prefill's GPU time goes, per op kind (GPU machine).

Each synthetic model shape gets a context with MI_CUDA_PROFILE=1 and graphs off (context.cu:
events between the ops of every forward, summed per kind); four forwards of 512 rows at positions
0..511 run, and freeing the context prints the per-kind table to stderr. Used to find that the
decode attention kernels took 37% / 56% of the 1.5B / 0.5B shapes' prefill (docs/perf.md,
session 10).

    python3 bench/prefill_profile.py [--models 1.5b,0.5b] [--nt 512] [--reps 4]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import SHAPES, prefill, synthetic_model, types_for  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="1.5b,0.5b", help="synthetic shapes, comma-separated")
    ap.add_argument("--nt", type=int, default=512, help="rows per forward (the prompt length)")
    ap.add_argument("--reps", type=int, default=4, help="forwards profiled")
    args = ap.parse_args()
    os.environ["MI_CUDA_PROFILE"] = "1"  # read at context creation
    os.environ["MI_CUDA_GRAPHS"] = "0"   # the profiler times plain launches
    from pyminfer import _core

    for name in args.models.split(","):
        cfg, tensors, keep, _ = synthetic_model(np.random.default_rng(0), types=types_for(name), **SHAPES[name])
        ctx = _core.Context(cfg, tensors, max(1024, args.nt), args.nt, 0, 1, keep)
        for _ in range(args.reps):
            prefill(ctx, args.nt, nt=args.nt)
        print(f"{name}: {args.reps} x prefill of {args.nt} rows (table below, from the context's release):",
              flush=True)
        del ctx
        gc.collect()  # the table prints when the context is freed
        sys.stderr.flush()


if __name__ == "__main__":
    main()
