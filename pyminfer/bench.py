"""``pyminfer bench``: llama-bench-style throughput, the verify cost curve, and speculative vs
sequential decoding with the cost model's prediction beside the measurement.

pp: one prefill of n_prompt tokens (chunked to max_nt) from an empty cache, tokens/s.
tg: n_gen single-token forwards with on-device argmax after ``--depth`` context tokens, tokens/s.
Both: mean ± stddev over -r repetitions (one warm-up first). Roofline share for tg: weight bytes
read per token (every tensor, one embedding row) / measured copy bandwidth.
Verify curve: C_T(nt) = median time of one nt-token forward after ``--depth`` context tokens (default
256), relative to nt = 1.
Spec cost model (seeds' D5-0, corrected): a round at depth d costs C_T(d+1) + d*C_D(1) and yields
1 + E[accepted] tokens; predicted tok/s = tokens_per_round / round cost.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from .engine import INT_MAX, Model, log
from .ngram import NgramSpec

BENCH_PROMPTS = [
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    ("code", "Implement quicksort and mergesort in C with a main function that tests both."),
    ("prose", "Explain how hash tables work and when to use them."),
    ("prose", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
]


def _sync_time() -> float:
    return time.perf_counter()


def copy_bandwidth(model: Model) -> float:
    """Measured copy bandwidth in bytes/s (read + write) of the model's device."""
    from . import _core

    if model.device == "cuda" and hasattr(_core, "cuda_copy_bandwidth"):
        return float(_core.cuda_copy_bandwidth())
    a = np.ones(64 << 20, np.float32)
    b = np.empty_like(a)
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t)
    return 2 * a.nbytes / min(ts)


def bench_pp(m: Model, n: int, reps: int, depth: int = 0) -> list[float]:
    """Prompt tokens/s of an n-token prefill after ``depth`` context tokens (untimed; llama-bench's
    ``pp512 @ d4096``), one value a repetition (a warm-up run first)."""
    rng = np.random.default_rng(0)
    out = []
    for r in range(reps + 1):
        if depth:
            m.prefill(rng.integers(100, m.n_vocab - 100, depth).tolist(), 0, logits=False)
        ids = rng.integers(100, m.n_vocab - 100, n).tolist()
        t = _sync_time()
        m.prefill(ids, depth, logits=False)
        dt = _sync_time() - t
        if r:
            out.append(n / dt)
    return out


def bench_tg(m: Model, n: int, reps: int, depth: int = 0) -> list[float]:
    """Generated tokens/s of n one-token forwards after ``depth`` context tokens (untimed)."""
    rng = np.random.default_rng(1)
    out = []
    for r in range(reps + 1):
        pos = 0
        if depth:
            m.prefill(rng.integers(100, m.n_vocab - 100, depth).tolist(), 0, logits=False)
            pos = depth
        tok = 1000
        t = _sync_time()
        for i in range(n):
            tok = int(m.forward([tok], pos + i, [0], logits=False)[0])
        dt = _sync_time() - t
        if r:
            out.append(n / dt)
    return out


VERIFY_CURVE_NT = 16  # --verify-curve measures forwards of 1..16 tokens
VERIFY_CURVE_DEPTH = 256  # ... after this many context tokens, unless -d gives another depth


def verify_curve(m: Model, max_nt: int = VERIFY_CURVE_NT, reps: int = 20,
                 depth: int = VERIFY_CURVE_DEPTH) -> dict[int, float]:
    """Median seconds of one nt-token forward (argmax of every row) at context depth ``depth``."""
    rng = np.random.default_rng(2)
    if depth:
        m.prefill(rng.integers(100, m.n_vocab - 100, depth).tolist(), 0, logits=False)
    res: dict[int, list[float]] = {nt: [] for nt in range(1, max_nt + 1)}
    for r in range(reps + 1):
        for nt in range(1, max_nt + 1):  # interleaved across nt, so drift hits every nt alike
            ids = rng.integers(100, m.n_vocab - 100, nt).tolist()
            t = _sync_time()
            m.forward(ids, depth, list(range(nt)), logits=False)
            if r:
                res[nt].append(_sync_time() - t)
    return {nt: statistics.median(v) for nt, v in res.items()}


def _fmt(v: list[float]) -> str:
    return f"{statistics.mean(v):.2f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.2f}"


def bench_spec(target: Model, draft: Model | None, args: argparse.Namespace,
               ngram: NgramSpec | None = None) -> list[dict[str, Any]]:
    """Speculative vs sequential on BENCH_PROMPTS, interleaved, with the cost-model prediction.

    ``ngram``: n-gram drafts (--spec-type ngram-simple), tried before ``draft`` each round;
    ``draft`` None: n-gram drafts only. The prediction charges C_T(d + 1) at the mean depth plus
    one draft step C_D(1) per token the draft model proposed (n-gram drafts cost no forward)."""
    from .generate import generate
    from .sampling import SamplingParams
    from .spec import MAX_DEPTH

    ct = verify_curve(target, max_nt=MAX_DEPTH + 1, reps=5)  # every verify width a round can use
    cd = verify_curve(draft, max_nt=1, reps=5)[1] if draft is not None else 0.0
    rows = []
    params = SamplingParams(temperature=0.0)
    for cat, text in BENCH_PROMPTS:
        ids = target.tokenizer.encode(target.tokenizer.apply_chat_template([{"role": "user", "content": text}]))
        seq, spec, specres = [], [], None
        for _ in range(max(args.repetitions, 1)):  # interleaved A/B
            r = generate(target, ids, params, args.n_gen)
            seq.append(r.timings["decode_tok_s"])
            s = generate(target, ids, params, args.n_gen, draft=draft, spec_draft_n=args.spec_draft_n,
                         spec_adaptive=args.spec_draft_adaptive, spec_ngram=ngram)
            spec.append(s.timings["decode_tok_s"])
            specres = s
            if s.generated_ids != r.generated_ids:
                log(f"pyminfer bench: WARNING speculative output differs from sequential on {cat!r}")
        st = specres.spec
        dm = st["mean_depth"]
        lo, hi = int(np.floor(dm)), int(np.ceil(dm))
        model_drafted = (st["drafted"] - st["ngram_drafted"]) / st["rounds"] if st["rounds"] else 0.0
        c_round = ct[lo + 1] + (ct[hi + 1] - ct[lo + 1]) * (dm - lo) + model_drafted * cd
        pred = st["tokens_per_round"] / c_round if c_round > 0 else 0.0
        seq_med, spec_med = statistics.median(seq), statistics.median(spec)
        rows.append({"prompt": cat, "text": text[:40], "seq_tok_s": seq_med, "spec_tok_s": spec_med,
                     # no decoded token (an immediate end of generation): no speed, no ratio
                     "speedup": spec_med / seq_med if seq_med > 0 else None,
                     # nothing drafted (an n-gram that never matched): no acceptance to speak of
                     "acceptance": st["acceptance_rate"] if st["drafted"] else None,
                     "tokens_per_round": st["tokens_per_round"], "mean_depth": dm,
                     # rounds per depth of the last repetition, "d:rounds" (which depths adaptive ran)
                     "depths": " ".join(f"{d}:{c}" for d, c in enumerate(st["depth_counts"]) if c),
                     **({"ngram_rounds": st["ngram_rounds"], "ngram_accepted": st["ngram_accepted"]} if ngram else {}),
                     "predicted_spec_tok_s": pred, "C_T1_ms": ct[1] * 1e3, "C_D1_ms": cd * 1e3})
    return rows


# Context positions the speculative bench allows a chat-templated BENCH_PROMPTS prompt (the
# longest is ~60 tokens with the Qwen template; a longer one ends its runs at a full context)
SPEC_PROMPT_POSITIONS = 256


def _positions_needed(args: argparse.Namespace, curve_depth: int, spec: bool) -> int:
    """Context positions the tests main_bench runs need (+ 16 spare): only those it runs. The
    speculative bench (``spec``: --spec-draft / --spec-type given): its verify curve at VERIFY_CURVE_DEPTH and
    its prompts plus -n; else --verify-curve: its depth plus VERIFY_CURVE_NT; else pp and tg (-d
    plus -p, -d plus -n). (-p and -n counted for the modes that do not run them: a --verify-curve at
    -c 128 was refused as needing 528 positions.)"""
    from .spec import MAX_DEPTH

    if spec:
        need = max(VERIFY_CURVE_DEPTH + MAX_DEPTH + 1, SPEC_PROMPT_POSITIONS + args.n_gen)
    elif args.verify_curve:
        need = curve_depth + VERIFY_CURVE_NT
    else:
        need = (args.depth or 0) + max(args.n_prompt, args.n_gen)
    return need + 16


def main_bench(args: argparse.Namespace) -> int:
    from .models import resolve_model

    path = resolve_model(args.model)
    # pp: the prompt in forwards of -ub rows, by default one of up to 512 (llama-bench's n_ubatch)
    max_nt = args.ubatch_size or max(64, min(args.n_prompt, 512))
    # -d moves the curve (a verify batch at long context); not given: VERIFY_CURVE_DEPTH
    curve_depth = VERIFY_CURVE_DEPTH if args.depth is None else args.depth
    depth = args.depth or 0
    from .cli import _ngram

    ngram = _ngram(args)
    need = _positions_needed(args, curve_depth, spec=bool(args.spec_draft) or ngram is not None)
    if need > INT_MAX:  # the core's n_ctx is a C int
        raise ValueError(f"-p/-n/-d: these tests need {need} context positions, more than the core's {INT_MAX}")
    if args.ctx_size and args.ctx_size < need:  # (-c 0: the trained context, checked once it is known)
        raise ValueError(f"-c {args.ctx_size} is too small for these tests (they need {need} positions)")
    m = Model(path, device=args.device, n_ctx=max(need, 512) if args.ctx_size is None else args.ctx_size,
              n_threads=args.threads, max_nt=max_nt)
    if m.n_ctx < need:
        m.close()
        raise ValueError(f"-c 0: the trained context ({m.n_ctx}) is too small for these tests (they need {need} "
                         "positions)")
    info = {"model": path.name, "size_GiB": m.gguf.weight_bytes / 2**30, "type": m.gguf.file_type, "device": m.device}
    if args.spec_draft or ngram is not None:
        d = Model(resolve_model(args.spec_draft), device=args.device, n_ctx=m.n_ctx, n_threads=args.threads,
                  max_nt=args.ubatch_size) if args.spec_draft else None
        rows = bench_spec(m, d, args, ngram)
        _emit([{**info, **r} for r in rows], args.output)
        return 0
    if args.verify_curve:
        c = verify_curve(m, VERIFY_CURVE_NT, depth=curve_depth)
        _emit([{**info, "depth": curve_depth, "nt": nt, "ms": v * 1e3, "C_T(nt)/C_T(1)": v / c[1]}
               for nt, v in c.items()], args.output)
        return 0
    rows = []
    bw = None
    for depth in getattr(args, "depths", [depth]):  # llama-bench's order: every test at each depth
        at = f" @ d{depth}" if depth else ""
        for n_prompt in getattr(args, "n_prompts", [args.n_prompt]):
            if n_prompt > 0:
                v = bench_pp(m, n_prompt, args.repetitions, depth)
                rows.append({**info, "test": f"pp{n_prompt}{at}", **_speed_fields(v, n_prompt, 0, depth)})
        for n_gen in getattr(args, "n_gens", [args.n_gen]):
            if n_gen > 0:
                v = bench_tg(m, n_gen, args.repetitions, depth)
                bw = bw or copy_bandwidth(m)
                share = statistics.mean(v) * m.gguf.decode_bytes_per_token() / bw
                rows.append({**info, "test": f"tg{n_gen}{at}", **_speed_fields(v, 0, n_gen, depth),
                             "roofline": f"{100 * share:.0f}% of {bw / 1e9:.0f} GB/s"})
    _emit(rows, args.output)
    return 0


# llama-bench's JSON / CSV names for a test's sizes and speed (numbers: tok_s is the display string),
# added to pp / tg rows for scripts written against llama-bench's output; not in the markdown table
_LLAMA_BENCH_KEYS = ("n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts")


def _speed_fields(v: list[float], n_prompt: int, n_gen: int, depth: int) -> dict[str, Any]:
    """A pp / tg row's speed from its repetitions ``v`` (tokens/s): the display string, mean,
    stddev (0 for one repetition) and count, then the same under llama-bench's names with the test's sizes."""
    mean, sd = statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0
    return {"tok_s": _fmt(v), "mean": mean, "stddev": sd, "reps": len(v),
            "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth, "avg_ts": mean, "stddev_ts": sd}


def _emit(rows: list[dict[str, Any]], fmt: str) -> None:
    if not rows:
        return
    if fmt == "json":
        print(json.dumps(rows, indent=1))
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "md":
        keys = [k for k in keys if k not in _LLAMA_BENCH_KEYS]

    def cell(v: Any) -> str:
        if v is None:
            return "n/a"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(keys)
        for r in rows:
            w.writerow([cell(r.get(k, "")) for k in keys])
        sys.stdout.write(buf.getvalue())
        return
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(cell(r.get(k, "")) for k in keys) + " |")
