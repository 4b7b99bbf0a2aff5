"""Where a decode step's GPU time goes inside the captured graph, by leaving op kinds out.

For each synthetic model shape and each op kind, a context is made with MI_CUDA_SKIP=<kind>
(context.cu: the kind is not launched; outputs are wrong, timing only) and the graph of each --nts
batch size (default 1 and 8) is replayed back to back at a context depth; the kind's in-graph cost is the difference
from the full forward. Variants are interleaved over two rounds; medians.

    python3 bench/skip_profile.py [--models 0.5b,1.5b] [--depths 300,4096] [--kinds attn,norm,...] [--nts 1,4]
"""
from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

from bench_gpu import SHAPES, prefill, synthetic_model, types_for

KINDS = "none,norm,qkv,attn,o,ffn_in,quant,down,head_norm,head,argmax"


def replay_at(ctx, depth: int, nt: int, reps: int) -> float:
    """GPU-only ms of the nt graph replayed at positions depth..depth+nt-1."""
    pos = np.arange(depth, depth + nt, dtype=np.int32)
    ctx.forward(np.ones(nt, dtype=np.int32), pos, np.arange(nt, dtype=np.int32), argmax=np.zeros(nt, dtype=np.int32))
    return ctx.gpu_replay_ms(nt, reps)


def main() -> None:
    from pyminfer import _core

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="0.5b,1.5b")
    ap.add_argument("--depths", default="300,4096")
    ap.add_argument("--kinds", default=KINDS)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--nts", default="1,8", help="graph batch sizes to replay (default 1,8)")
    ap.add_argument("--variant", action="append", default=[], metavar="'VAR=V VAR2=V2'",
                    help="environment settings measured as a separate table each (repeatable; default: none)")
    args = ap.parse_args()
    variants = args.variant or [""]
    depths = [int(d) for d in args.depths.split(",")]
    kinds = args.kinds.split(",")
    try:
        nts = [int(x) for x in args.nts.split(",")]
    except ValueError:
        ap.error(f"--nts wants comma-separated integers, got {args.nts!r}")
    if any(not 1 <= nt <= 64 for nt in nts):  # the contexts below hold 64-row batches
        ap.error(f"--nts: batch sizes must be in 1..64, got {args.nts!r}")
    for name in args.models.split(","):
        cfg, tensors, keep, _ = synthetic_model(np.random.default_rng(0), types=types_for(name), **SHAPES[name])
        res: dict[tuple[str, str, int, int], list[float]] = {}
        for _ in range(2):
            for var, k in [(v, k) for v in variants for k in kinds]:
                env = dict(kv.split("=", 1) for kv in var.split())
                os.environ.update(env)
                os.environ["MI_CUDA_SKIP"] = "" if k == "none" else k
                ctx = _core.Context(cfg, tensors, max(depths) + 64, 64, 0, 1, keep)
                done = 0
                for d in depths:
                    prefill(ctx, d, start=done)
                    done = d
                    for nt in nts:
                        res.setdefault((var, k, d, nt), []).append(replay_at(ctx, d, nt, args.reps))
                ctx.close()
                for key in env:
                    del os.environ[key]
        os.environ.pop("MI_CUDA_SKIP", None)
        for var in variants:
            print(f"\n{name} {var or '(default)'}: GPU ms per graph replay; 'cost' = full - without the kind")
            print(f"{'kind':10} " + " ".join(f"{'@' + str(d) + ' nt=' + str(nt):>14} {'cost':>7}"
                                             for d in depths for nt in nts))
            for k in kinds:
                cells = []
                for d in depths:
                    for nt in nts:
                        full = statistics.median(res[(var, "none", d, nt)])
                        v = statistics.median(res[(var, k, d, nt)])
                        cells.append(f"{v:14.4f} {full - v:7.4f}")
                print(f"{k:10} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
