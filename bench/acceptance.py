"""Measure the real pair's greedy acceptance per draft position (target 1.5B, draft 0.5B).

Acceptance is a property of the model pair along the target's greedy path, so the CPU backend
measures it as well as the GPU (seeds, D5-0 §3). Writes {category: [p_1..p_7]} where p_i is the
conditional acceptance of draft position i given positions < i were accepted, plus raw counts.

    python3 bench/acceptance.py OUT.json [-n 128]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from pyminfer.bench import BENCH_PROMPTS
from pyminfer.engine import Model
from pyminfer.generate import generate
from pyminfer.models import ensure_model
from pyminfer.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("-n", type=int, default=128)
    args = ap.parse_args()
    t = Model(ensure_model("qwen2.5-coder-1.5b"), device="auto", n_ctx=1024)
    d = Model(ensure_model("qwen2.5-coder-0.5b"), device="auto", n_ctx=1024)
    counts: dict[str, np.ndarray] = {}
    for cat, text in BENCH_PROMPTS:
        ids = t.tokenizer.encode(t.tokenizer.apply_chat_template([{"role": "user", "content": text}]))
        s = generate(t, ids, SamplingParams(temperature=0.0), args.n, draft=d, spec_draft_n=7).spec
        c = np.array([s["rounds"]] + s["accepted_per_position"], dtype=np.int64)
        counts[cat] = counts.get(cat, 0) + c
        print(cat, text[:40], "acceptance", round(s["acceptance_rate"], 3), "tokens/round", round(s["tokens_per_round"], 2))
    out = {cat: [float(c[i] / c[i - 1]) if c[i - 1] else 0.0 for i in range(1, 8)] for cat, c in counts.items()}
    json.dump({**out, "_counts": {k: v.tolist() for k, v in counts.items()}}, open(args.out, "w"), indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
