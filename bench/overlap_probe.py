"""How much of a draft model's work hides under the target's verify forward on one GPU.

Both models run on their own CUDA stream (each context has one): the target's verify forward of
nt rows is submitted without waiting (Context.forward_submit), the draft then runs j single-token
steps on the host as it does in the speculative loop (each a graph launch + argmax readback), then
the target is waited for. Printed per (nt, j), wall milliseconds, medians of interleaved reps:

    T alone | j draft steps alone | T + j steps serial | overlapped | saved | T done before the j steps were

Synthetic models of the real shapes (bench_gpu.synthetic_model), caches filled to --depth.

    python3 bench/overlap_probe.py [--target 1.5b] [--draft 0.5b] [--depth 300] [--reps 30]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench_gpu import SHAPES, prefill, synthetic_model, types_for


def step(ctx, tok: int, pos: int) -> int:
    """One draft step as the speculative loop takes it: token ``tok`` at ``pos``, argmax read back
    (folded below 1000 so the synthetic model's next token stays in a small range)."""
    am = np.zeros(1, np.int32)
    ctx.forward(np.array([tok], np.int32), np.array([pos], np.int32), np.zeros(1, np.int32), argmax=am)
    return int(am[0]) % 1000


def main() -> None:
    """Build both synthetic models, then time verify / draft / both for each (nt, j), interleaved."""
    from pyminfer import _core

    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="1.5b")
    ap.add_argument("--draft", default="0.5b")
    ap.add_argument("--depth", type=int, default=300)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--nts", default="1,4,6,8")
    ap.add_argument("--steps", default="1,2,3,4,6")
    args = ap.parse_args()
    print("device:", _core.cuda_device_name())
    ctxs = {}
    keep = []
    for role, name in (("T", args.target), ("D", args.draft)):
        cfg, tensors, k, _ = synthetic_model(np.random.default_rng(1 if role == "T" else 2), types=types_for(name),
                                             **SHAPES[name])
        keep.append(k)
        ctxs[role] = _core.Context(cfg, tensors, args.depth + 64, 64, 0, 1, k)
        prefill(ctxs[role], args.depth)
    T, D = ctxs["T"], ctxs["D"]
    nts = [int(x) for x in args.nts.split(",")]
    steps = [int(x) for x in args.steps.split(",")]
    p0 = args.depth
    am = np.zeros(16, np.int32)

    def verify_alone(nt: int) -> float:
        """Seconds of one submitted nt-row target forward, waited for."""
        t0 = time.perf_counter()
        T.forward_submit(np.full(nt, 5, np.int32), np.arange(p0, p0 + nt, dtype=np.int32), np.arange(nt, dtype=np.int32))
        T.forward_wait(am)
        return time.perf_counter() - t0

    def draft_alone(j: int) -> float:
        """Seconds of j draft steps."""
        t0 = time.perf_counter()
        y = 3
        for i in range(j):
            y = step(D, y, p0 + i)
        return time.perf_counter() - t0

    def overlapped(nt: int, j: int) -> tuple[float, bool]:
        """Seconds of the target's nt rows submitted, j draft steps, the wait; and whether the
        target had finished by the end of the draft steps."""
        t0 = time.perf_counter()
        T.forward_submit(np.full(nt, 5, np.int32), np.arange(p0, p0 + nt, dtype=np.int32), np.arange(nt, dtype=np.int32))
        y = 3
        for i in range(j):
            y = step(D, y, p0 + i)
        done = T.forward_ready()
        T.forward_wait(am)
        return time.perf_counter() - t0, done

    for nt in nts:  # warm every graph
        verify_alone(nt)
    draft_alone(max(steps))
    res: dict[tuple, list] = {}  # ("T", nt) / ("D", j) / ("O", nt, j): seconds; ("done", nt, j): bools
    for _ in range(args.reps):
        for nt in nts:
            res.setdefault(("T", nt), []).append(verify_alone(nt))
            for j in steps:
                res.setdefault(("D", j), []).append(draft_alone(j))
                w, done = overlapped(nt, j)
                res.setdefault(("O", nt, j), []).append(w)
                res.setdefault(("done", nt, j), []).append(done)
    med = {k: statistics.median(v) * 1e3 for k, v in res.items() if k[0] != "done"}
    print(f"target {args.target}, draft {args.draft}, depth {args.depth}, {args.reps} reps; wall ms, medians")
    print("| nt | j | T alone | j steps alone | serial | overlapped | saved | T done first |")
    print("|---|---|---|---|---|---|---|---|")
    for nt in nts:
        for j in steps:
            t, d, o = med[("T", nt)], med[("D", j)], med[("O", nt, j)]
            frac = sum(res[("done", nt, j)]) / len(res[("done", nt, j)])
            print(f"| {nt} | {j} | {t:.3f} | {d:.3f} | {t + d:.3f} | {o:.3f} | {t + d - o:.3f} | {frac:.0%} |")
    T.close()
    D.close()


if __name__ == "__main__":
    main()
