"""Per-kernel GPU time of decode steps under Nsight Compute (kernels serialized, no overlap):
   ncu --profile-from-start off --print-summary per-kernel python3 bench/ncu_step.py MODEL [nt]"""
import ctypes
import sys

from pyminfer.engine import Model

m = Model(sys.argv[1], device="cuda", n_ctx=1024)
nt = int(sys.argv[2]) if len(sys.argv) > 2 else 1
m.prefill(list(range(100, 400)), 0)
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuProfilerStart()
for i in range(3):
    m.forward(list(range(7, 7 + nt)), 300 + i * nt, list(range(nt)), logits=False)
cuda.cuProfilerStop()
m.close()
