"""GPU-vs-CPU logits of a real GGUF file, per environment setting of a CUDA tuning variable.

The forward of tests/test_cuda_real.py::test_forward_logits_close_to_cpu (prefill of a prompt, then
teacher-forced decode steps fed the CPU's argmax), but printing the NMSE of the GPU's logits
against the CPU's at every step instead of asserting a bound, for each value of --env. Used to
see how far a kernel change moves a real model (docs/perf.md).

    python3 bench/real_logits.py -m MODEL.gguf [--steps 25] [--env MI_CUDA_ATTN_MMA=0,1]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from prompts import PROMPTS  # noqa: E402

from pyminfer.engine import Model  # noqa: E402


def nmse_steps(gpu: Model, cpu: Model, ids: list[int], steps: int) -> list[float]:
    """NMSE (mean squared difference / mean square of the CPU's) of the GPU's logits at the
    prefill's last row and at each of ``steps`` decode steps."""
    lg = gpu.prefill(ids, 0, logits=True)
    lc = cpu.prefill(ids, 0, logits=True)
    out = []
    for step in range(steps + 1):
        out.append(float(np.mean((lg - lc) ** 2) / np.mean(lc ** 2)))
        if step == steps:
            break
        tok = int(np.argmax(lc))
        pos = len(ids) + step
        lg = gpu.forward([tok], pos, [0], logits=True)[0]
        lc = cpu.forward([tok], pos, [0], logits=True)[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--env", default="", metavar="VAR=V1,V2", help="values to compare (default: none)")
    args = ap.parse_args()
    if args.env and "=" not in args.env:
        ap.error(f"--env wants VAR=V1,V2,..., got {args.env!r}")
    var, vals = (args.env.split("=", 1)[0], args.env.split("=", 1)[1].split(",")) if args.env else ("", ["(default)"])
    cpu = Model(args.model, device="cpu", n_ctx=2048)
    ids = cpu.tokenizer.encode(PROMPTS[0][1])
    for v in vals:
        if args.env:
            os.environ[var] = v
        gpu = Model(args.model, device="cuda", n_ctx=2048)
        e = nmse_steps(gpu, cpu, ids, args.steps)
        gpu.close()
        label = f"{var}={v}" if args.env else v
        print(f"{Path(args.model).name} {label}: max NMSE {max(e):.3e} at step {int(np.argmax(e))}, "
              f"median {float(np.median(e)):.3e}; per step: " + " ".join(f"{x:.1e}" for x in e), flush=True)


if __name__ == "__main__":
    main()
