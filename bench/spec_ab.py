"""Speculative decoding A/B over many prompts: plain greedy decoding against the draft model under
two or more settings of one environment knob (e.g. PYMINFER_ADAPTIVE_EXPLORE=0,12) or of the draft
depth (--depths: with the adaptive mode, its first depth), interleaved,
on the prompts of bench/greedy_real_pair.json (the four bench prompts and the twenty identity-test
prompts, chat-templated ids as stored). Prints each prompt's speedup over plain decoding per
setting (medians of --reps runs; beside it the runs' mean depth) and the means by category, and
checks every speculative output against the plain one (greedy: they must be identical; a difference
is reported and exits 1).

    python3 bench/spec_ab.py -m TARGET.gguf --spec-draft DRAFT.gguf --env PYMINFER_ADAPTIVE_EXPLORE=0,12 \
        [--mode "--spec-draft-adaptive"] [-n 256] [--reps 3] [--device cuda]
    python3 bench/spec_ab.py -m TARGET.gguf --spec-draft DRAFT.gguf --depths 1,4 [--device cuda]
    python3 bench/spec_ab.py -m TARGET.gguf --spec-draft DRAFT.gguf --depths 2,3 --mode "--spec-draft-n"

--mode: "--spec-draft-adaptive" (default) or "--spec-draft-n D". The knob is read when each
speculative run builds its controller, so one process serves every setting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyminfer.engine import Model  # noqa: E402
from pyminfer.generate import generate  # noqa: E402
from pyminfer.sampling import SamplingParams  # noqa: E402

DATA = Path(__file__).with_name("greedy_real_pair.json")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", required=True, help="target GGUF")
    ap.add_argument("--spec-draft", required=True, help="draft GGUF")
    ap.add_argument("--env", help="NAME=v1,v2,...: the settings to compare ('' = unset)")
    ap.add_argument("--depths", help="D1,D2,...: compare --spec-draft-n values instead (with the adaptive "
                    "mode: its first depth, e.g. 1,4)")
    ap.add_argument("--mode", default="--spec-draft-adaptive", help='"--spec-draft-adaptive" or "--spec-draft-n D"')
    ap.add_argument("-n", type=int, default=256, help="tokens to generate a run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
    mode = a.mode.split()
    adaptive = mode == ["--spec-draft-adaptive"]
    fixed = len(mode) == 2 and mode[0] == "--spec-draft-n" and mode[1].isdigit() and int(mode[1]) <= 8
    if a.depths is not None and mode == ["--spec-draft-n"]:  # fixed depths, from --depths
        fixed = True
    elif a.depths is not None and fixed:
        ap.error('give the fixed depths in --depths with --mode "--spec-draft-n" (no D), not both')
    if not adaptive and not fixed:
        ap.error(f'--mode wants "--spec-draft-adaptive" or "--spec-draft-n D" (D in 0..8), got {a.mode!r}')
    depth = int(mode[1]) if len(mode) == 2 else None  # (adaptive: the product's default first depth)
    if a.reps < 1 or a.n < 1:
        ap.error("--reps and -n want at least 1")
    if (a.env is None) == (a.depths is None):
        ap.error("give one of --env NAME=v1,v2,... and --depths D1,D2,...")
    # each setting: (label, environment value or None = not this knob, --spec-draft-n)
    name = ""
    if a.env is not None:
        name, _, vals = a.env.partition("=")
        if not name or not vals:
            ap.error("--env wants NAME=v1,v2,...")
        settings = [(f"{name}={v!r}", v, depth) for v in vals.split(",")]
    else:
        ds = a.depths.split(",")
        lo = 1 if adaptive else 0  # (the adaptive controller starts at 1 at least)
        if not all(d.isdigit() and lo <= int(d) <= 8 for d in ds) or len(set(map(int, ds))) < len(ds):
            ap.error(f"--depths wants distinct numbers in {lo}..8, got {a.depths!r}")
        settings = [(f"d={d}", None, int(d)) for d in ds]
    prompts = json.loads(DATA.read_text())["prompts"]
    n_ctx = max(len(p["prompt"]) for p in prompts) + a.n + 16
    target = Model(a.m, device=a.device, n_ctx=n_ctx)
    draft = Model(a.spec_draft, device=a.device, n_ctx=n_ctx)
    params = SamplingParams(temperature=0.0)
    print("| prompt | plain tok/s | " + " | ".join(f"{lab}: speedup (mean d)" for lab, _, _ in settings) + " |")
    print("|---" * (2 + len(settings)) + "|")
    by_cat: dict[str, list[list[float]]] = {}
    bad = 0
    for p in prompts:
        ids = p["prompt"]
        plain: list[float] = []
        spec: dict[str, list[float]] = {lab: [] for lab, _, _ in settings}
        depth_of: dict[str, list[float]] = {lab: [] for lab, _, _ in settings}
        for _ in range(a.reps):  # interleaved: plain, then each setting, a round at a time
            r = generate(target, ids, params, a.n)
            plain.append(r.timings["decode_tok_s"])
            for lab, v, dn in settings:
                if v:
                    os.environ[name] = v
                elif v is not None:
                    os.environ.pop(name, None)
                s = generate(target, ids, params, a.n, draft=draft, spec_draft_n=dn, spec_adaptive=adaptive)
                spec[lab].append(s.timings["decode_tok_s"])
                depth_of[lab].append(s.spec["mean_depth"])
                if s.generated_ids != r.generated_ids:
                    bad += 1
                    print(f"MISMATCH: {p['text'][:30]!r} under {lab}", file=sys.stderr)
        pm = statistics.median(plain)
        sp = [statistics.median(spec[lab]) / pm for lab, _, _ in settings]
        by_cat.setdefault("code" if p["cat"] == "code" else "other", []).append(sp)
        text = p["text"][:28].replace("\n", " ").replace("|", "/")
        print(f"| {p['cat']}: {text} | {pm:.1f} | "
              + " | ".join(f"{x:.3f} ({statistics.mean(depth_of[lab]):.2f})" for x, (lab, _, _) in zip(sp, settings))
              + " |", flush=True)
    for cat, rows in by_cat.items():
        means = [statistics.mean(r[i] for r in rows) for i in range(len(settings))]
        print(f"| mean {cat} ({len(rows)}) | | " + " | ".join(f"{x:.3f}" for x in means) + " |")
    if name:
        os.environ.pop(name, None)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
