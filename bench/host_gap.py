"""How much of a decode step is host time: wall ms of one-token forwards called in a loop against
the GPU ms of the same forward's CUDA graph replayed back to back (no host work between replays).

For each synthetic shape: one context, the KV cache filled to --depth, then interleaved reps of
(a) gpu_replay_ms(1) (graph replay, CUDA events), (b) _core.Context.forward in a loop (tokens fed
back from the argmax, as plain greedy decoding does), (c) the same loop with Model.forward's per-call
numpy conversions added (pyminfer.engine.Model.forward is what generate and the speculative loop
call; its argument checks are not included).
The gap (b) - (a) is what a device-fed token chain could remove from every decode step.

    python3 bench/host_gap.py [--models 0.5b,1.5b] [--depth 300] [--steps 100] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench_gpu import SHAPES, prefill, synthetic_model, types_for


def loop_core(ctx, depth: int, steps: int) -> float:
    """Median wall ms of one _core.Context.forward (nt = 1, argmax only)."""
    am = np.zeros(1, np.int32)
    row0 = np.zeros(1, np.int32)
    tok = np.array([7], np.int32)
    ts = []
    for i in range(steps):
        t0 = time.perf_counter()
        ctx.forward(tok, np.array([depth + i], np.int32), row0, argmax=am)
        ts.append(time.perf_counter() - t0)
        tok[0] = am[0] % 1000
    return 1e3 * statistics.median(ts)


def loop_model(ctx, depth: int, steps: int) -> float:
    """Median wall ms of the engine's per-step work around the same forward (Model.forward's
    conversions: tokens, positions and out rows as fresh int32 arrays, an output array)."""
    ts = []
    tok = 7
    for i in range(steps):
        t0 = time.perf_counter()
        tk = np.asarray([tok], dtype=np.int32)
        pos = np.arange(depth + i, depth + i + 1, dtype=np.int32)
        rows = np.asarray([0], dtype=np.int32)
        am = np.empty(1, np.int32)
        ctx.forward(tk, pos, rows, None, am)
        tok = int(am[0]) % 1000
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def main() -> None:
    from pyminfer import _core

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="0.5b,1.5b")
    ap.add_argument("--depth", type=int, default=300)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print("device:", _core.cuda_device_name())
    print("| shape | graph replay ms | Context.forward loop ms | Model.forward-like loop ms | host gap ms (share) |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        cfg, tensors, keep, _ = synthetic_model(np.random.default_rng(0), types=types_for(name), **SHAPES[name])
        n_ctx = args.depth + args.steps * (2 * args.reps + 1) + 64
        ctx = _core.Context(cfg, tensors, n_ctx, 64, 0, 1, keep)
        prefill(ctx, args.depth)
        r, c, m = [], [], []
        pos = args.depth
        for _ in range(args.reps):  # interleaved: (a), (b), (c) per rep
            r.append(ctx.gpu_replay_ms(1, args.steps))
            c.append(loop_core(ctx, pos, args.steps))
            pos += args.steps
            m.append(loop_model(ctx, pos, args.steps))
            pos += args.steps
        ctx.close()
        a, b, e = statistics.median(r), statistics.median(c), statistics.median(m)
        print(f"| {name} | {a:.4f} | {b:.4f} | {e:.4f} | {b - a:.4f} ({(b - a) / b:.1%}) |")


if __name__ == "__main__":
    main()
