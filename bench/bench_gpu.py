"""Synthetic-model decode benchmark of the CUDA backend (also the model builder of tests/test_cuda.py).

Models are built straight from numpy arrays of random *valid* quantized bytes in the real shapes
(no GGUF file: the device machine takes at most 64 MiB per call). Scales are drawn so that each
weight row has an rms near 1/sqrt(n_cols), which keeps activations finite through every layer.

    python3 bench/bench_gpu.py [--models 1.5b,7b] [--tokens 200]

Prints one table: decode tok/s (graphs, nt=1, median over the timed tokens), the same at a context
depth, nt=8 batch throughput, and the share of the decode roofline (weight bytes per token over
4.5 TB/s, the H200's measured streaming-read rate; see /work/shared/anchors/ANCHORS.md).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pyminfer.synthetic import (  # noqa: F401  (re-exported: tests/test_cuda.py builds its models here)
    F16, F32, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, SHAPES, TYPES, random_weights, row_bytes)

from pyminfer.gguf_model import SUPPORTED_TYPES as NAMES  # noqa: E402,F401  (type id -> name; tests use it)


def f32(rng: np.random.Generator, n: int, mean: float = 0.0, std: float = 1.0) -> np.ndarray:
    return (mean + std * rng.standard_normal(n)).astype(np.float32)


def synthetic_model(rng, n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, types, rope_type=2,
                    bias=True, tied=False, qk_gain=4.0):
    """(cfg, tensors, keepalive, weight_bytes_per_token) for pyminfer._core.Context.

    types: dict with keys embd, output, q, k, v, o, gate, up, down: either a type or a list of
    per-layer types."""
    keep = []

    def t(typ, n_rows, n_cols, gain=1.0):
        a = random_weights(rng, typ, n_rows, n_cols, gain)
        keep.append(a)
        return (a.ctypes.data, typ, n_cols, n_rows)

    def vec(n, mean=0.0, std=1.0):
        a = f32(rng, n, mean, std)
        keep.append(a)
        return (a.ctypes.data, F32, n, 1)

    def typ(key, layer):
        v = types[key]
        return v[layer] if isinstance(v, (list, tuple)) else v

    qd, kd = n_head * head_dim, n_head_kv * head_dim
    layers = []
    per_token = 0
    for i in range(n_layer):
        L = {
            "attn_norm": vec(n_embd, 1.0, 0.1),
            "wq": t(typ("q", i), qd, n_embd, qk_gain),
            "wk": t(typ("k", i), kd, n_embd, qk_gain),
            "wv": t(typ("v", i), kd, n_embd),
            "bq": vec(qd, 0.0, 0.5) if bias else None,
            "bk": vec(kd, 0.0, 0.5) if bias else None,
            "bv": vec(kd, 0.0, 0.1) if bias else None,
            "wo": t(typ("o", i), n_embd, qd, 0.5),
            "ffn_norm": vec(n_embd, 1.0, 0.1),
            "ffn_gate": t(typ("gate", i), n_ff, n_embd, 2.0),
            "ffn_up": t(typ("up", i), n_ff, n_embd),
            "ffn_down": t(typ("down", i), n_embd, n_ff, 0.5),
        }
        for k in ("wq", "wk", "wv", "wo", "ffn_gate", "ffn_up", "ffn_down"):
            per_token += row_bytes(L[k][1], L[k][2]) * L[k][3]
        layers.append(L)
    embd = t(types["embd"], n_vocab, n_embd, np.sqrt(n_embd))
    output = embd if tied else t(types["output"], n_vocab, n_embd, 2.0)
    per_token += row_bytes(output[1], n_embd) * n_vocab + row_bytes(embd[1], n_embd)
    cfg = dict(n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
               n_vocab=n_vocab, rope_type=rope_type, rope_freq_base=1000000.0, rms_eps=1e-6)
    tensors = dict(tok_embd=embd, output_norm=vec(n_embd, 1.0, 0.1), output=output, layers=layers)
    return cfg, tensors, keep, per_token


def qwen_types(n_layer):
    """Q4_K_M-like mix: Q4_K, with Q6_K for output, attn_v and ffn_down on half the layers (the even
    ones: the same bytes as pyminfer.synthetic's real-file layers; kept so the GPU test models stay
    as verified; the embedding is Q6_K here, Q4_K in the real files: one row is read a token)."""
    half = [Q6_K if i % 2 == 0 else Q4_K for i in range(n_layer)]
    return dict(embd=Q6_K, output=Q6_K, q=Q4_K, k=Q4_K, v=half, o=Q4_K, gate=Q4_K, up=Q4_K, down=half)


def qwen05_types(n_layer):
    """The real 0.5B's mix: 896 is not a multiple of 256, so 32-wide blocks (Q5_0, Q8_0 for v and the
    LM head); ffn_down (4864 columns) is Q6_K / Q4_K."""
    half = [Q6_K if i % 2 == 0 else Q4_K for i in range(n_layer)]
    return dict(embd=Q8_0, output=Q8_0, q=Q5_0, k=Q5_0, v=Q8_0, o=Q5_0, gate=Q5_0, up=Q5_0, down=half)


def types_for(name):
    return qwen05_types(SHAPES[name]["n_layer"]) if name == "0.5b" else qwen_types(SHAPES[name]["n_layer"])


def verify_curve(ctx, max_nt=16, reps=30, depth=256):
    """Median seconds of one nt-token forward (argmax of every row), nt = 1..max_nt, interleaved."""
    prefill(ctx, depth)
    for nt in range(1, max_nt + 1):  # capture graphs / warm every nt first
        decode_times(ctx, 2, start_pos=depth, nt=nt)
    res = {nt: [] for nt in range(1, max_nt + 1)}
    for _ in range(reps):
        for nt in range(1, max_nt + 1):
            res[nt] += decode_times(ctx, 1, start_pos=depth, nt=nt)
    return {nt: statistics.median(v) for nt, v in res.items()}


def spec_prediction(curve, c_draft, p_cond, max_d=7):
    """Predicted speedup over sequential for d = 0..max_d (seeds' cost model): a round costs
    C_T(d+1) + d*C_D(1) and yields 1 + sum_{i<=d} prod_{j<=i} p_j tokens."""
    out = {}
    for d in range(0, max_d + 1):
        exp_tok = 1.0 + float(np.sum(np.cumprod(p_cond[:d]))) if d else 1.0
        out[d] = exp_tok / (curve[d + 1] + d * c_draft) * curve[1]
    return out


def decode_times(ctx, n_tokens, start_pos=0, nt=1):
    """Seconds per forward call of nt tokens (graphs after the first call at this nt)."""
    am = np.zeros(nt, dtype=np.int32)
    rows = np.arange(nt, dtype=np.int32)
    tok = np.full(nt, 1, dtype=np.int32)
    times = []
    for i in range(n_tokens):
        pos = np.arange(start_pos + i * nt, start_pos + (i + 1) * nt, dtype=np.int32)
        t0 = time.perf_counter()
        ctx.forward(tok, pos, rows, argmax=am)
        times.append(time.perf_counter() - t0)
        tok = am.copy() % 1000
    return times


def prefill(ctx, n, nt=64, start=0):
    """Fill positions start..n-1 of the KV cache with token 7 in chunks of nt (no logits)."""
    rows = np.zeros(0, dtype=np.int32)
    for p0 in range(start, n, nt):
        k = min(nt, n - p0)
        ctx.forward(np.full(k, 7, dtype=np.int32), np.arange(p0, p0 + k, dtype=np.int32), rows)


def main():
    from pyminfer import _core

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1.5b,7b")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("--profile", action="store_true", help="per-op GPU time of 1.5b decode (no graphs)")
    ap.add_argument("--ab", action="store_true", help="1.5b tg with q/k/v as separate launches, same machine")
    ap.add_argument("--ab-mmvq", action="store_true",
                    help="per model: tg @0 and nt=8 with MI_CUDA_MMVQ=0 (block kernel), 1 (one warp per row), "
                         "2 (1-4 warps per row), 3 (by matrix shape, the default) interleaved 0,1,2,3,0,1,2,3 "
                         "on the same weights; medians")
    ap.add_argument("--ab-env", action="append", default=[], metavar="VAR=V1,V2",
                    help="per model: tg @0 and nt=8 under each value of the environment variable VAR, "
                         "interleaved V1,V2,..,V1,V2,.. on the same weights; medians (repeatable)")
    ap.add_argument("--ab-ubatch", type=int, default=64, metavar="N",
                    help="--ab-env contexts take up to N rows a forward and prefill 512 tokens in chunks of N "
                         "(512: one GEMM forward, pp512)")
    ap.add_argument("--ab-nt", default="1,2,4,8,9", metavar="N1,N2",
                    help="batch sizes (<= 9) whose captured forward --ab-env times under each value")
    ap.add_argument("--curve", action="store_true", help="verify cost curve C_T(nt)/C_T(1), nt = 1..16")
    ap.add_argument("--accept", default=None,
                    help="JSON file {category: [conditional acceptance p_1..p_7]} measured on the real pair: "
                         "prints the cost-model speedup per d with the 0.5b shape as the draft")
    args = ap.parse_args()
    try:  # batch sizes whose graph replay --ab-env times (graphs exist for nt <= 9)
        ab_nts = [int(x) for x in args.ab_nt.split(",")]
    except ValueError:
        ap.error(f"--ab-nt wants comma-separated integers, got {args.ab_nt!r}")
    if not all(1 <= n <= 9 for n in ab_nts):
        ap.error(f"--ab-nt: batch sizes must be in 1..9, got {args.ab_nt!r}")
    for e in args.ab_env:
        if "=" not in e or not e.split("=", 1)[0] or not e.split("=", 1)[1]:
            ap.error(f"--ab-env wants VAR=V1,V2,..., got {e!r}")
    curves = {}
    print("device:", _core.cuda_device_name())
    rows = []
    for name in args.models.split(","):
        shp = SHAPES[name]
        n_rows0 = len(rows)
        rng = np.random.default_rng(0)
        t0 = time.time()
        cfg, tensors, keep, per_token = synthetic_model(rng, types=types_for(name), **shp)
        t1 = time.time()
        ctx = _core.Context(cfg, tensors, args.depth + 1024, 512, 0, 1, keep)
        t2 = time.time()
        print(f"{name}: built in {t1 - t0:.1f}s, uploaded in {t2 - t1:.1f}s, {per_token / 1e9:.3f} GB/token")
        roof = 4.5e12 / per_token
        decode_times(ctx, 5)  # capture + warm
        tg = decode_times(ctx, args.tokens)
        med = statistics.median(tg)
        rows.append((name, "tg nt=1 @0", 1 / med, 100 / med / roof, min(tg) * 1e3))
        g1 = ctx.gpu_replay_ms(1, 200) / 1e3  # the same forward, graph replays back to back
        rows.append((name, "  GPU-only nt=1 @~200", 1 / g1, 100 / g1 / roof, g1 * 1e3))
        prefill(ctx, args.depth)
        tgd = decode_times(ctx, args.tokens // 2, start_pos=args.depth)
        med = statistics.median(tgd)
        rows.append((name, f"tg nt=1 @{args.depth}", 1 / med, 100 / med / roof, min(tgd) * 1e3))
        b8 = decode_times(ctx, 10, start_pos=0, nt=8)[2:]
        med = statistics.median(b8)
        rows.append((name, "nt=8 batch @0", 8 / med, float("nan"), min(b8) * 1e3))
        g8 = ctx.gpu_replay_ms(8, 100) / 1e3
        rows.append((name, "  GPU-only nt=8", 8 / g8, float("nan"), g8 * 1e3))
        for nt in (64, 512):
            prefill(ctx, 512, nt=nt)  # warm
            pt = []
            for _ in range(3):
                t0 = time.perf_counter()
                prefill(ctx, 512, nt=nt)
                pt.append(time.perf_counter() - t0)
            dt = statistics.median(pt)
            rows.append((name, f"prefill 512 (nt={nt})", 512 / dt, float("nan"), dt * 1e3))
        if args.curve:
            curves[name] = verify_curve(ctx)
        ctx.close()
        ab_specs = ([("MI_CUDA_MMVQ", ["0", "1", "2", "3"])] if args.ab_mmvq else []) + \
            [(e.split("=", 1)[0], e.split("=", 1)[1].split(",")) for e in args.ab_env]
        for var, vals in ab_specs:
            import os
            ab = {v: [] for v in vals}
            ab8 = {v: [] for v in vals}
            abp = {v: [] for v in vals}
            abg = {(v, nt): [] for v in vals for nt in ab_nts}
            old = os.environ.get(var)
            for v in vals * 2:  # interleaved A, B, ..., A, B, ...
                os.environ[var] = v
                c2 = _core.Context(cfg, tensors, 1024, max(args.ab_ubatch, 9), 0, 1, keep)
                decode_times(c2, 5)
                ab[v] += decode_times(c2, args.tokens // 2)
                ab8[v] += decode_times(c2, 10, start_pos=0, nt=8)[2:]
                for nt in ab_nts:  # the captured forward alone (C_T(nt) under this value)
                    abg[v, nt].append(c2.gpu_replay_ms(nt, 100))
                prefill(c2, 512, nt=args.ab_ubatch)
                t0 = time.perf_counter()
                prefill(c2, 512, nt=args.ab_ubatch)
                abp[v].append(time.perf_counter() - t0)
                c2.close()
            if old is None:
                del os.environ[var]
            else:
                os.environ[var] = old
            for v in vals:
                med = statistics.median(ab[v])
                rows.append((name, f"A/B tg @0 {var[8:]}={v}", 1 / med, 100 / med / roof, min(ab[v]) * 1e3))
                med8 = statistics.median(ab8[v])
                rows.append((name, f"A/B nt=8 {var[8:]}={v}", 8 / med8, float("nan"), min(ab8[v]) * 1e3))
                medp = statistics.median(abp[v])
                rows.append((name, f"A/B pp512/{args.ab_ubatch} {var[8:]}={v}", 512 / medp, float("nan"),
                             min(abp[v]) * 1e3))
                for nt in ab_nts:  # tokens/s of the batch, then its GPU ms
                    g = statistics.median(abg[v, nt])
                    rows.append((name, f"A/B GPU nt={nt} {var[8:]}={v}", nt * 1e3 / g, float("nan"), g))
        for r in rows[n_rows0:]:  # as we go, so a run cut short still reports
            print(f"  {r[0]:6} {r[1]:22} {r[2]:10.1f} {r[3]:11.1f} {r[4]:9.3f}", flush=True)
        del keep, tensors
    import os
    if args.ab:
        rng = np.random.default_rng(0)
        shp = SHAPES["1.5b"]
        cfg, tensors, keep, per_token = synthetic_model(rng, types=qwen_types(shp["n_layer"]), **shp)
        for stack in ("1", "0", "1"):
            os.environ["MI_CUDA_QKV_STACK"] = stack
            ctx = _core.Context(cfg, tensors, 1024, 8, 0, 1, keep)
            decode_times(ctx, 5)
            tg = decode_times(ctx, args.tokens)
            med = statistics.median(tg)
            rows.append(("1.5b", f"tg @0 qkv_stack={stack}", 1 / med, 100 / med / (4.5e12 / per_token), min(tg) * 1e3))
            ctx.close()
        del os.environ["MI_CUDA_QKV_STACK"]
    if args.profile:
        rng = np.random.default_rng(0)
        shp = SHAPES["1.5b"]
        cfg, tensors, keep, _ = synthetic_model(rng, types=qwen_types(shp["n_layer"]), **shp)
        os.environ.update(MI_CUDA_GRAPHS="0", MI_CUDA_PROFILE="1")
        ctx = _core.Context(cfg, tensors, 2048, 8, 0, 1, keep)
        del os.environ["MI_CUDA_GRAPHS"], os.environ["MI_CUDA_PROFILE"]
        decode_times(ctx, 50, start_pos=100)
        ctx.close()  # prints the per-op table to stderr
    print()
    print(f"{'model':6} {'what':22} {'tok/s':>10} {'% roofline':>11} {'best ms':>9}")
    for r in rows:
        print(f"{r[0]:6} {r[1]:22} {r[2]:10.1f} {r[3]:11.1f} {r[4]:9.3f}")
    if curves:
        print()
        print("verify cost curve C_T(nt)/C_T(1) at depth 256 (C_T(1) in ms)")
        print("nt    " + " ".join(f"{n:>7}" for n in curves))
        for nt in range(1, 17):
            print(f"{nt:<5} " + " ".join(f"{c[nt] / c[1]:7.3f}" for c in curves.values()))
        print("C_T(1) " + " ".join(f"{c[1] * 1e3:7.3f}" for c in curves.values()))
    if args.accept and "0.5b" in curves:
        import json
        acc = {k: v for k, v in json.load(open(args.accept)).items() if not k.startswith("_")}
        c_draft = curves["0.5b"][1]
        print()
        print(f"cost-model speedup over sequential (draft = 0.5b shape, C_D(1) = {c_draft * 1e3:.3f} ms)")
        for name, c in curves.items():
            if name == "0.5b":
                continue
            for cat, p in acc.items():
                pred = spec_prediction(c, c_draft, np.array(p, dtype=float))
                best = max(pred, key=pred.get)
                print(f"{name:5} {cat:6} " + " ".join(f"d{d}={v:.2f}" for d, v in pred.items()) + f"  best d={best}")


if __name__ == "__main__":
    main()
