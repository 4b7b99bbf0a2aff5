"""Host (Python) work per generated token of the decode loops, with stub models.

The stubs spin for a fixed time per forward (target 200 us, draft 132 us: the H200's 1.5B / 0.5B
ratio) and return a fixed token; the draft never agrees with the target, so the adaptive loop
should settle on d = 0 (plain decoding through the speculative loop). Printed: microseconds per
token beyond the target forward, best of 3 runs of 4,000 tokens.

    python3 bench/host_overhead.py [--tokens 4000]
"""
from __future__ import annotations

import argparse
import itertools
import time
import types

import numpy as np

import pyminfer.spec as spec
from pyminfer.generate import PlainDecoder
from pyminfer.sampling import Sampler, SamplingParams

N_TOKENS = 4000
C_T, C_D = 200e-6, 132e-6


class Stub:
    """Stands in for engine.Model: forward/prefill spin ``delay`` seconds, return ``tok``."""

    n_ctx = 1 << 20
    max_nt = 16
    tokenizer = types.SimpleNamespace(eog_ids=frozenset())  # the loop reads only its end-of-generation ids

    def __init__(self, delay: float, tok: int = 7):
        self.delay, self.tok = delay, tok

    def _spin(self) -> None:
        end = time.perf_counter() + self.delay
        while time.perf_counter() < end:
            pass

    def forward(self, tokens, start, out_rows, *, logits=True):
        self._spin()
        return np.full(len(out_rows), self.tok, np.int32)

    def prefill(self, tokens, start, *, logits=True):
        self._spin()
        return np.full(1, self.tok, np.int32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=N_TOKENS, help="tokens a run (best of 3 runs)")
    n_tokens = ap.parse_args().tokens
    if n_tokens < 1:
        ap.error("--tokens wants at least 1")
    spec.check_vocab_compat = lambda a, b: None  # stubs have no tokenizer
    smp = Sampler(SamplingParams(temperature=0.0))
    makers = [("plain", lambda: PlainDecoder(Stub(C_T), smp)),
              ("speculative, adaptive (draft never agrees)",
               lambda: spec.SpecDecoder(Stub(C_T), Stub(C_D, tok=5), smp, draft_n=4, adaptive=True))]
    for name, make in makers:
        best, dec = float("inf"), None
        for _ in range(3):
            dec = make()
            it = dec.tokens([1, 2, 3])
            t0 = time.perf_counter()
            for _ in itertools.islice(it, n_tokens):
                pass
            best = min(best, (time.perf_counter() - t0) / n_tokens)
        extra = f", mean depth {np.mean(dec.depths):.3f}" if hasattr(dec, "depths") else ""
        print(f"{name:44s} {(best - C_T) * 1e6:6.2f} us/token of host work{extra}")


if __name__ == "__main__":
    main()
