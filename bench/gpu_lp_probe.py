"""How far GPU logprobs are from the CPU's (the oracle), by path: token-by-token decoding (MMVQ,
int8 activations) and LLM.prompt_logprobs over the same ids (rows > 8: the tensor-core GEMM, f16
activations), on a real model file. usage: python3 bench/gpu_lp_probe.py MODEL.gguf"""
import sys, numpy as np
from pyminfer import LLM
path = sys.argv[1]
kw = dict(max_tokens=32, temperature=0, cache_prompt=False)
with LLM(path, device="cpu", n_ctx=512) as c:
    cpu = c.generate("The capital of France is", logprobs=3, **kw)
    ids = cpu.prompt_ids + cpu.generated_ids
    cpu_p = c.prompt_logprobs(ids, 0)
with LLM(path, device="cuda", n_ctx=512) as g:
    gp = g.prompt_logprobs(ids, 0)
    # token-by-token on the GPU over the same ids (forced: score each next id from decode rows)
    m = g.model
    rows = [m.prefill(ids[:1], 0, logits=True)]
    for i in range(1, len(ids) - 1):
        rows.append(m.forward([ids[i]], i, [0], logits=True)[0])
def ls(r):
    x = r.astype(np.float64); mx = x.max(); return x - (mx + np.log(np.exp(x - mx).sum()))
gd = [None] + [ls(rows[j - 1])[ids[j]] for j in range(1, len(ids))]
cp = [None] + [e.logprob for e in cpu_p[1:]]
gpp = [None] + [e.logprob for e in gp[1:]]
d1 = np.array([abs(a - b) for a, b in zip(gd[1:], cp[1:])]); d2 = np.array([abs(a - b) for a, b in zip(gpp[1:], cp[1:])]); d3 = np.array([abs(a - b) for a, b in zip(gpp[1:], gd[1:])])
for name, d in (("gpu decode vs cpu", d1), ("gpu prompt(MMQ) vs cpu", d2), ("gpu prompt vs gpu decode", d3)):
    print(f"{name}: max {d.max():.3e} median {np.median(d):.3e} mean {d.mean():.3e} n {d.size}")
