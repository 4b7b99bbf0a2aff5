"""Replay the adaptive draft-depth controller (pyminfer.spec.AdaptiveDepth) on the real pair's
agreement sequences with measured GPU costs, against every fixed depth. CPU only, seconds.

The sequences (bench/agreement_real_pair.json) hold, per token of the 1.5B target's greedy reply to
each bench prompt, whether the 0.5B draft's greedy choice on the same prefix agrees: a round at
depth d starting at token i accepts the run of agreements from i, up to d. Costs (ms; defaults:
the H200, docs/perf.md session 5): the target's C_T(nt), a draft step, the extra of the round's
first draft step (it feeds 1-2 committed tokens), host work per round and per emitted token.
Speedups are against plain decoding (C_T(1) + per-token work a token).

    python3 bench/replay_adaptive.py [--repeat 4] [--hysteresis 0.05,0.02] [--start 4,2] [--rem 0.03]
    python3 bench/replay_adaptive.py --measure      # recompute the sequences (real models, CPU, ~3 min)
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from pyminfer.spec import MAX_DEPTH, AdaptiveDepth

DATA = Path(__file__).with_name("agreement_real_pair.json")
# real 1.5B, nt = 1..9, ms (H200, docs/perf.md session 7: `pyminfer bench --verify-curve`)
CT_H200 = [1.045, 1.175, 1.373, 1.549, 1.741, 1.973, 2.168, 2.377, 3.062]


def measure(n_gen: int = 256) -> None:
    """Greedy replies of the real 1.5B and the 0.5B's agreement along them, into DATA."""
    from pyminfer.bench import BENCH_PROMPTS
    from pyminfer.engine import Model
    from pyminfer.models import ensure_model

    t = Model(ensure_model("qwen2.5-coder-1.5b"), device="auto", n_ctx=1024)
    d = Model(ensure_model("qwen2.5-coder-0.5b"), device="auto", n_ctx=1024)
    prompts = []
    for cat, text in BENCH_PROMPTS:
        ids = t.tokenizer.encode(t.tokenizer.apply_chat_template([{"role": "user", "content": text}]))
        gen = [int(t.prefill(ids, 0, logits=False)[0])]
        for i in range(n_gen - 1):
            gen.append(int(t.forward([gen[-1]], len(ids) + i, [0], logits=False)[0]))
        seq, am = ids + gen, []
        for s in range(0, len(seq), 64):
            ch = seq[s:s + 64]
            am += [int(x) for x in d.forward(ch, s, list(range(len(ch))), logits=False)]
        agree = "".join("1" if am[len(ids) - 1 + i] == gen[i] else "0" for i in range(n_gen))
        prompts.append({"cat": cat, "agree": agree})
    DATA.write_text(json.dumps({"_about": json.loads(DATA.read_text())["_about"] if DATA.exists() else "",
                                "prompts": prompts}, indent=1))


def replay(agree: list[int], depth: int | None, a: argparse.Namespace, hysteresis: float, seed: int = 0,
           start: int = 4) -> tuple[float, list[int]]:
    """Speedup over plain decoding of one run (depth None: adaptive, first drafting at ``start``)
    and the depths it ran."""
    rng = random.Random(seed)
    ct = [float(x) for x in a.ct.split(",")]
    ctl = AdaptiveDepth(max_depth=MAX_DEPTH, start=start, hysteresis=hysteresis) if depth is None else None
    n, i, t, last, used = len(agree), 1, 0.0, None, []  # token 0 comes from the prefill
    while i < n:
        if ctl and last:
            ctl.update(*last)
        d = ctl.choose() if ctl else depth
        d = max(0, min(d, n - i - 1))  # as the loop: never draft past what is wanted
        if ctl:
            ctl.cur = ctl.history[-1] = d
        acc = 0
        while acc < d and agree[i + acc]:
            acc += 1
        j = 1.0 + a.jitter * (2 * rng.random() - 1)
        draft = (d * a.cd + (a.first if d else 0.0)) * j
        verify = ct[d] * j
        round_ms = draft + verify + a.rem + a.tok * (acc + 1)
        last = (d, acc, draft / 1e3, verify / 1e3, round_ms / 1e3)
        t += round_ms
        i += acc + 1
        used.append(d)
    return (n - 1) * (ct[0] + a.tok) / t, used


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--measure", action="store_true", help="recompute the agreement sequences first")
    ap.add_argument("--repeat", type=int, default=4, help="replay each sequence this many times end to end")
    ap.add_argument("--hysteresis", default="0.05,0.02", help="controller switch margins to compare")
    ap.add_argument("--start", default="4", help="adaptive start depths to compare (--spec-draft-n; default 4)")
    ap.add_argument("--ct", default=",".join(map(str, CT_H200)), help=f"C_T(nt) ms, nt = 1..{MAX_DEPTH + 1}")
    ap.add_argument("--cd", type=float, default=0.668, help="draft step, ms")
    ap.add_argument("--first", type=float, default=0.08, help="extra of a round's first draft step, ms")
    ap.add_argument("--rem", type=float, default=0.03, help="host work a round, ms")
    ap.add_argument("--tok", type=float, default=0.013, help="host work an emitted token, ms")
    ap.add_argument("--jitter", type=float, default=0.03, help="+- relative noise on GPU costs")
    a = ap.parse_args()
    try:
        ok = len([float(x) for x in a.ct.split(",")]) == MAX_DEPTH + 1 and all(0 <= float(h) < 1 for h in a.hysteresis.split(","))
        ok = ok and all(1 <= int(x) <= MAX_DEPTH for x in a.start.split(","))
    except ValueError:
        ok = False
    if not ok:
        ap.error(f"--ct wants {MAX_DEPTH + 1} numbers (ms, nt = 1..{MAX_DEPTH + 1}); --hysteresis fractions in [0, 1); "
                 f"--start depths in 1..{MAX_DEPTH}")
    if a.measure:
        measure()
    hs = [float(h) for h in a.hysteresis.split(",")]
    starts = [int(x) for x in a.start.split(",")]
    cfgs = [(h, st) for st in starts for h in hs]
    print("| prompt | " + " | ".join(f"d={d}" for d in range(MAX_DEPTH + 1)) + " | "
          + " | ".join(f"adaptive h={h} start={st}" for h, st in cfgs) + " |")
    print("|---" * (MAX_DEPTH + 2 + len(cfgs)) + "|")
    for p in json.loads(DATA.read_text())["prompts"]:
        agree = [int(c) for c in p["agree"]] * a.repeat
        fixed = [replay(agree, d, a, 0.0)[0] for d in range(MAX_DEPTH + 1)]
        adap = []
        for h, st in cfgs:
            sp, used = replay(agree, None, a, h, start=st)
            common = max(set(used), key=used.count)
            adap.append(f"{sp:.3f} (d={common} {used.count(common) / len(used):.0%})")
        print(f"| {p['cat']} | " + " | ".join(f"{x:.3f}" for x in fixed) + " | " + " | ".join(adap) + " |")


if __name__ == "__main__":
    main()
