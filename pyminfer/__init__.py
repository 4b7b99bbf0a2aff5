"""pyminfer: GGUF inference with speculative decoding (CUDA backend, C CPU backend as the oracle)."""

import os

# The CPU backend's OpenMP runtime (libgomp) spins waiting for work between parallel regions; on a loaded 2-core machine pure
# spinning collapses throughput (measured 2026-11-29, SmolLM2 2 threads + one busy process: 1.7
# tok/s at 30000 spins, 25 at 1000; quiet: 202 vs 197), so spin briefly then sleep. Set before
# the OpenMP runtime loads.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

from .api import LLM  # noqa: E402,F401  (imports no server dependency)
from .ngram import NgramSpec  # noqa: E402,F401  (LLM(spec_ngram=NgramSpec(n, m)))
from .sampling import NaNLogitsError  # noqa: E402,F401  (what generation raises for corrupt weights)
