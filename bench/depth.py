"""Decode cost against context depth, per setting of a tuning environment variable.

For each synthetic shape and each value of --env VAR=V1,V2,..: one context (n_ctx = max depth +
64), the KV cache filled in chunks of 64, and at every depth the GPU milliseconds of the
one-token forward there (its CUDA graph replayed back to back: gpu_replay_ms, no host work).
Contexts of the values are built in turn and measured at the same depths, so compare columns.

    python3 bench/depth.py [--models 1.5b] [--depths 0,1024,4096,16384] [--env MI_CUDA_ATTN_GROUP=0,1]

--digest also prints, at every depth, a sha256 prefix of the f32 logits of a one-row forward and
of a 4-row verify forward there: equal digests from two builds (bench/ab_builds.sh) mean the
builds' forwards are bitwise equal on that model and depth.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import numpy as np

from bench_gpu import SHAPES, prefill, synthetic_model, types_for


def main() -> None:
    from pyminfer import _core

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1.5b")
    ap.add_argument("--depths", default="0,1024,4096,16384")
    ap.add_argument("--env", default="", metavar="VAR=V1,V2", help="values to compare (default: none)")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--digest", action="store_true", help="print a sha256 prefix of the logits at each depth")
    args = ap.parse_args()
    if args.env and ("=" not in args.env or not args.env.split("=", 1)[1]):
        ap.error(f"--env wants VAR=V1,V2,..., got {args.env!r}")
    depths = [int(x) for x in args.depths.split(",")]
    var, vals = (args.env.split("=", 1)[0], args.env.split("=", 1)[1].split(",")) if args.env else ("", [""])
    print("device:", _core.cuda_device_name())
    row0 = np.zeros(1, np.int32)  # out rows: row 0
    am = np.zeros(1, np.int32)
    for name in args.models.split(","):
        cfg, tensors, keep, _ = synthetic_model(np.random.default_rng(0), types=types_for(name), **SHAPES[name])
        res: dict[str, list[float]] = {}
        for v in vals:
            saved = os.environ.get(var) if var else None
            if var:
                os.environ[var] = v
            ctx = _core.Context(cfg, tensors, max(depths) + 64, 64, 0, 1, keep)
            if var:
                if saved is None:
                    del os.environ[var]
                else:
                    os.environ[var] = saved
            ms = []
            filled = 0
            for d in depths:
                if d > filled:
                    prefill(ctx, d, start=filled)
                    filled = d
                ctx.forward(np.array([7], np.int32), np.array([d], np.int32), row0, argmax=am)
                ms.append(ctx.gpu_replay_ms(1, args.reps))
                if args.digest:
                    h = hashlib.sha256()
                    for nt in (1, 4):
                        lg = np.empty((nt, cfg["n_vocab"]), np.float32)
                        toks = np.arange(7, 7 + nt, dtype=np.int32)
                        pos = np.arange(d, d + nt, dtype=np.int32)
                        ctx.forward(toks, pos, np.arange(nt, dtype=np.int32), logits=lg)
                        h.update(lg.tobytes())
                    print(f"digest {name} {var}={v} depth {d}: {h.hexdigest()[:16]}")
            ctx.close()
            res[v] = ms
        head = " | ".join(f"{var}={v}" if var else "ms" for v in vals)
        print(f"\n{name}: GPU ms per decoded token at depth (tok/s in brackets)")
        print(f"| depth | {head} |")
        print("|---|" + "---|" * len(vals))
        for i, d in enumerate(depths):
            cells = " | ".join(f"{res[v][i]:.3f} ({1e3 / res[v][i]:.0f})" for v in vals)
            print(f"| {d} | {cells} |")


if __name__ == "__main__":
    main()
