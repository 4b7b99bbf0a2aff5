"""Replay draft sources on the real pair's greedy replies with measured costs: plain decoding, the
draft model at fixed depth, n-gram drafts (pyminfer.ngram, --spec-type ngram-simple) alone, and
n-gram drafts tried before the draft model. CPU only, seconds; an estimate, not a measurement.

Data (bench/greedy_real_pair.json): per prompt, the 1.5B target's 256 greedy ids and whether the
0.5B draft's greedy choice on each prefix agrees. A draft-model round at depth d from token i accepts
the run of agreements from i (up to d); an n-gram round accepts the proposal's prefix that equals
the target's reply. Replies end at the first end-of-generation token; a round's depth is capped at
the 256 tokens asked for, not at that end (the loop cannot see it coming). With --p-min a draft-model
round also stops where the draft's top-1 probability (draft_p) falls below it. Costs (ms, defaults: the
H200, docs/perf.md session 15): the target's C_T(nt), the draft's C_D(nt) (a first draft step
feeds every committed token the draft has not seen: 1-2 after a drafting round, more after n-gram
rounds), host work a forward.

    python3 bench/ngram_replay.py [--ct ...] [--cd ...] [--n 3] [--m 5] [--d 3] [--explore 12]
        [--jitter 0.03 --seeds 16] [--p-min 0.75]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from pyminfer.ngram import NgramIndex, NgramSpec
from pyminfer.spec import MAX_DEPTH, AdaptiveDepth

DATA = Path(__file__).with_name("greedy_real_pair.json")
EOS = {151643, 151645}
CT_H200 = "1.003,1.131,1.311,1.447,1.568,1.737,1.869,1.931,2.657"  # real 1.5B, nt = 1..9 (session 15)
CD_H200 = "0.605,0.665,0.725,0.785,0.867,0.949,1.030,1.112"  # 0.5B shape, nt = 1..8 (nt 1 / 4 / 8 measured)


def replay(item: dict, mode: str, a: argparse.Namespace, adaptive: bool = False, seed: int = 0) -> float:
    """Milliseconds to produce the reply (after its first token) under ``mode``: 'plain', 'draft',
    'ngram' or 'both'; ``adaptive``: the draft model's depth from pyminfer.spec.AdaptiveDepth
    (fed as the loop feeds it: draft-model rounds that caught up on <= 2 tokens), else a.d.
    ``a.jitter`` > 0: each round's GPU costs scaled by a factor drawn from 1 +- jitter (``seed``)."""
    rng = random.Random(seed)
    ct0 = [0.0] + [float(x) for x in a.ct.split(",")]
    cd0 = [0.0] + [float(x) for x in a.cd.split(",")]
    gen = item["gen"]
    n = next((i + 1 for i, t in enumerate(gen) if t in EOS), len(gen))
    # The loop caps a round's depth at what the caller will take (max_tokens = len(gen)), not at the
    # reply's end, which it cannot know; it stops drafting only after a drafted end-of-generation token
    # (the draft predicted the end), else a round past the end spends its draft steps and verify rows
    # all the same (--oracle-end: capped at the end, as before session 38).
    cap = n if a.oracle_end else len(gen)
    agree = [c == "1" for c in item["agree"]]
    hist = list(item["prompt"]) + gen[:1]
    index = NgramIndex(NgramSpec(n=a.n, m=a.m)) if mode in ("ngram", "both") else None
    j, t, behind = 1, 0.0, 1  # gen[:j] committed; tokens the draft has not seen
    ctl = AdaptiveDepth(max_depth=MAX_DEPTH, start=max(a.d, 1), probe_min=a.probe_min,
                        hysteresis=a.hysteresis, explore_min=a.explore) if adaptive else None
    last = None
    while j < n:
        if ctl and last:
            ctl.update(*last)
        last = None
        jj = 1.0 + a.jitter * (2 * rng.random() - 1)
        ct = [c * jj for c in ct0]
        cd = [c * jj for c in cd0]
        props = index.propose(hist, cap - j - 1) if index else []
        props = next((props[:i + 1] for i, t in enumerate(props) if t in EOS), props)  # (the loop's cut)
        if props:
            acc = 0
            while acc < len(props) and props[acc] == gen[j + acc]:
                acc += 1
            t += ct[len(props) + 1] + a.host
            behind += acc + 1
        elif mode in ("draft", "both") and (a.d > 0 or ctl):
            d = min(ctl.choose() if ctl else a.d, cap - j - 1)
            if ctl:
                ctl.cur = ctl.history[-1] = d
            if d == 0:
                t += ct[1] + a.host
                acc = 0
                behind += 1
                last = (0, 0, 0.0, ct[1] / 1e3, (ct[1] + a.host) / 1e3)
            else:
                # --p-min (llama.cpp's draft p_min): drafting stops at the first step whose token has a
                # top-1 probability below p_min; that step was run, its token is dropped. The draft's
                # probabilities are those on the target's prefix (exact up to the first disagreement).
                k = d
                if a.p_min > 0:
                    k = next((i for i in range(d) if item["draft_p"][j + i] < a.p_min), d)
                steps = min(k + 1, d)
                # the draft proposes the end where it agrees with the target up to it: drafting stops
                # there, that step the last (past a disagreement its tokens are unknown: no end assumed)
                for i in range(k):
                    if not agree[j + i]:
                        break
                    if gen[j + i] in EOS:
                        k = steps = i + 1
                        break
                first = cd[min(behind, 8)] + max(behind - 8, 0) * a.catchup  # feeds the unseen tokens
                dr = first + (steps - 1) * cd[1]
                t += dr + ct[k + 1] + (k + 1) * a.host
                acc = 0
                while acc < k and agree[j + acc]:
                    acc += 1
                last = (d, acc, dr / 1e3, ct[k + 1] / 1e3, (dr + ct[k + 1] + (k + 1) * a.host) / 1e3, behind <= 2,
                        None if a.lump else first / 1e3)
                behind = 2 if acc == k else 1
        else:
            t += ct[1] + a.host
            acc = 0
            behind += 1
        hist += gen[j:j + acc + 1]
        j += acc + 1
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ct", default=CT_H200, help="target C_T(nt) ms, nt = 1..9")
    ap.add_argument("--cd", default=CD_H200, help="draft C_D(nt) ms, nt = 1..8")
    ap.add_argument("--catchup", type=float, default=0.014, help="ms a draft step costs per fed token beyond 8")
    ap.add_argument("--host", type=float, default=0.03, help="host ms a forward")
    ap.add_argument("--n", type=int, default=3, help="--spec-ngram-size-n")
    ap.add_argument("--m", type=int, default=5, help="--spec-ngram-size-m")
    ap.add_argument("--d", type=int, default=3, help="draft-model depth")
    ap.add_argument("--probe-min", type=int, default=16, help="adaptive depth: rounds before a probe (0: none)")
    ap.add_argument("--hysteresis", type=float, default=0.05, help="adaptive depth: switch margin")
    ap.add_argument("--p-min", type=float, default=0.0,
                    help="draft model: stop drafting at a token of top-1 probability below this (0: never)")
    ap.add_argument("--explore", type=int, default=12, help="adaptive depth: drafting rounds before d = 0 may be chosen")
    ap.add_argument("--jitter", type=float, default=0.0, help="+- relative noise on each round's GPU costs")
    ap.add_argument("--seeds", type=int, default=1, help="runs per prompt (with --jitter: each its own noise), averaged")
    ap.add_argument("--oracle-end", action="store_true",
                    help="cap each round at the reply's end (the replay before session 38; the loop cannot)")
    ap.add_argument("--lump", action="store_true",
                    help="adaptive depth: price every draft step at the round's mean (no first-step split)")
    a = ap.parse_args()
    if len(a.ct.split(",")) != 9 or len(a.cd.split(",")) != 8:
        ap.error("--ct wants 9 numbers (nt = 1..9), --cd 8 (nt = 1..8)")
    if a.seeds < 1:
        ap.error(f"--seeds wants at least 1, got {a.seeds}")
    if not 0.0 <= a.jitter < 1.0:  # a factor of 1 - jitter must stay a positive cost
        ap.error(f"--jitter wants 0 <= J < 1, got {a.jitter}")
    if not 0 <= a.d <= 8:
        ap.error(f"--d wants 0..8, got {a.d}")
    NgramSpec(n=a.n, m=a.m)  # range checks
    modes = ["draft", "ngram", "both", "draft+adaptive", "both+adaptive"]
    print(f"speedup over plain decoding (replayed; draft d = {a.d}, n-gram n = {a.n}, m = {a.m})")
    print("| category | prompt | " + " | ".join(modes) + " |")
    print("|---|---|" + "---|" * len(modes))
    tot: dict[str, dict[str, list[float]]] = {}
    for it in json.loads(DATA.read_text())["prompts"]:
        base = sum(replay(it, "plain", a, seed=s) for s in range(a.seeds))
        times = [sum(replay(it, m.split("+")[0], a, m.endswith("+adaptive"), seed=s) for s in range(a.seeds))
                 for m in modes]
        row = [base / v for v in times]
        cat = "code" if it["cat"] == "code" else "other"
        for m, v in zip(modes, times):
            tot.setdefault(cat, {}).setdefault(m, [0.0, 0.0])
            tot[cat][m][0] += base
            tot[cat][m][1] += v
        text = it["text"][:36].replace("\n", " ")
        print(f"| {it['cat']} ({it['src']}) | {text} | " + " | ".join(f"{x:.2f}" for x in row) + " |")
    for cat, d in tot.items():
        print(f"| all {cat} | | " + " | ".join(f"{d[m][0] / d[m][1]:.3f}" for m in modes) + " |")


if __name__ == "__main__":
    main()
