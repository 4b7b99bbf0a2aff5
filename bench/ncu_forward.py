"""One forward of a synthetic model for Nsight Compute to look at (graphs off, so every kernel is
its own launch): builds the shape, fills the KV cache to --depth with prompt chunks, then runs one
forward of --nt rows. Run it under ncu with a kernel filter, e.g.

    MI_CUDA_GRAPHS=0 ncu --clock-control none --kernel-name regex:mi_mmvq --launch-count 10 \
        --section SpeedOfLight --section WarpStateStats python3 bench/ncu_forward.py --nt 8

(the prompt chunks run the tensor-core GEMM, so the first mat-vec launches are the forward's;
`--nt 512 --depth 0 --model 7b` with `regex:mi_mmq_kernel` looks at a pp512 chunk's GEMMs).
bench/ncu_step.py does the same for a real GGUF file; this one needs no file on the GPU machine.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu import SHAPES, prefill, synthetic_model, types_for  # noqa: E402


def main() -> None:
    """Build the model, fill the cache to --depth, run the one forward Nsight Compute looks at."""
    from pyminfer import _core

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="1.5b")
    ap.add_argument("--nt", type=int, default=1)
    ap.add_argument("--depth", type=int, default=256)
    args = ap.parse_args()
    max_nt = max(64, args.nt)  # --nt 512: a prompt chunk, i.e. the tensor-core GEMM (mi_mmq_kernel)
    cfg, tensors, keep, _ = synthetic_model(np.random.default_rng(0), types=types_for(args.model), **SHAPES[args.model])
    ctx = _core.Context(cfg, tensors, args.depth + max_nt, max_nt, 0, 1, keep)
    prefill(ctx, args.depth)
    nt = args.nt
    am = np.zeros(nt, np.int32)
    ctx.forward(np.full(nt, 5, np.int32), np.arange(args.depth, args.depth + nt, dtype=np.int32),
                np.arange(nt, dtype=np.int32), argmax=am)
    ctx.close()


if __name__ == "__main__":
    main()
