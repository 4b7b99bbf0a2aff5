"""Token sampling on host logits, in llama.cpp's order (common/sampling.cpp defaults):
repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw. Temperature <= 0 is greedy.

The repetition penalty follows llama.cpp's (CTRL, Keskar et al. 2019): for every distinct token in
the last ``repeat_last_n`` generated-or-prompt tokens, a positive logit is divided by the penalty
and a negative one multiplied by it. Any finite penalty > 0 is accepted: a tiny one can push a
penalized logit past float32's range, so results are clamped to +-FLT_MAX (no inf, hence no
inf - inf = nan in the softmax; ties at the clamp go to the lowest id, as argmax does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

_F32_MAX = float(np.finfo(np.float32).max)


@dataclass
class SamplingParams:
    """Sampling settings (llama.cpp's CLI defaults).

    temperature: <= 0 means greedy (argmax). top_k: <= 0 disables. top_p, min_p: 1.0 / 0.0 disable.
    repeat_penalty: 1.0 disables; applied over the last repeat_last_n tokens of the context
    (repeat_last_n 0: none, -1: the whole context, as llama.cpp).
    seed: RNG seed (None or negative: random, as llama.cpp's -1).
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    def validate(self) -> None:
        """Raise ValueError for out-of-range settings."""
        if not np.isfinite(self.temperature):
            raise ValueError("temperature must be finite")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (self.repeat_penalty > 0 and np.isfinite(self.repeat_penalty)):
            raise ValueError(f"repeat_penalty must be finite and > 0 (1.0: off), got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise ValueError(f"repeat_last_n must be >= -1 (-1: the whole context, 0: off), got {self.repeat_last_n}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def needs_logits(self) -> bool:
        """False when the on-device argmax gives the answer (greedy without penalty)."""
        return not (self.greedy and self.repeat_penalty == 1.0)


def apply_repeat_penalty(logits: np.ndarray, window: Sequence[int], penalty: float) -> np.ndarray:
    """Penalize (in place, returns it) logits[n_vocab] of the distinct ids in ``window``."""
    if penalty == 1.0 or not len(window):
        return logits
    ids = np.unique(np.asarray(window, dtype=np.int64))
    # llama.cpp holds the penalty as a float; rounded the same way and applied in float64, the
    # result rounds to exactly the float32 quotient/product (f64 carries > 2*24+2 bits, so the
    # double rounding is innocuous), which keeps every in-range penalty bit-identical to plain f32
    # arithmetic. A penalty outside float32's range (0 or inf as a float32) is used as given.
    with np.errstate(over="ignore", under="ignore"):
        p32 = float(np.float32(penalty))
        p = p32 if 0.0 < p32 < np.inf else float(penalty)
        v = logits[ids].astype(np.float64)
        out = np.where(v > 0, v / p, v * p)
    # a tiny penalty overflows: clamp to float32's finite range instead of +-inf
    logits[ids] = np.clip(out, -_F32_MAX, _F32_MAX).astype(np.float32)
    return logits


class Sampler:
    """Draws tokens from logits with one seeded RNG (numpy PCG64)."""

    def __init__(self, params: SamplingParams):
        params.validate()
        self.p = params
        seed = params.seed
        self.rng = np.random.default_rng(None if seed is None or seed < 0 else seed)  # -1: random

    def penalty_window(self, history: Sequence[int]) -> Sequence[int]:
        n = self.p.repeat_last_n
        return history[-n:] if n > 0 else history if n < 0 else ()

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """One token from f32 logits[n_vocab]; ``history`` is the context so far (for the penalty)."""
        p = self.p
        lg = logits.astype(np.float32, copy=True)
        apply_repeat_penalty(lg, self.penalty_window(history), p.repeat_penalty)
        if p.greedy:
            i = int(np.argmax(lg))  # the first NaN where there is one (numpy propagates NaN)
            if np.isnan(lg[i]):
                raise NaNLogitsError(NaNLogitsError.MESSAGE)
            return i
        if np.isnan(lg.max()):
            raise NaNLogitsError(NaNLogitsError.MESSAGE)
        # candidates: top-k first (sorts only k values), then the nucleus and min-p cuts
        k = p.top_k if 0 < p.top_k < lg.size else lg.size
        idx = np.argpartition(-lg, k - 1)[:k] if k < lg.size else np.arange(lg.size)
        idx = idx[np.argsort(-lg[idx], kind="stable")]
        vals = lg[idx].astype(np.float64)
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            idx, vals = idx[:keep], vals[:keep]
            probs = probs[:keep]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            idx, vals = idx[keep], vals[keep]
        with np.errstate(over="ignore"):  # a tiny temperature sends z to -inf: weight 0, as it should
            z = (vals - vals[0]) / p.temperature
        w = np.exp(z)
        w /= w.sum()
        return int(idx[self.rng.choice(len(idx), p=w)])


class NaNLogitsError(RuntimeError):
    """The model produced NaN logits: no token can be chosen (corrupt weights, or an overflow).

    ``advice``: what the local user can do (e.g. delete a cached download), or "": the CLI prints
    it after the message; the server does not send it (it names local paths).
    """

    def __init__(self, message: str, advice: str = ""):
        super().__init__(message)
        self.advice = advice

    MESSAGE = ("the model produced NaN logits: its weights are probably corrupt (a NaN, or values that "
               "overflow, in the GGUF file)")


class StopChecker:
    """Finds stop strings in streamed text and holds back text that may start one.

    ``push(text)`` returns (text safe to emit now, stopped?). On a stop the emitted text ends just
    before the stop string, as OpenAI and llama.cpp do, and ``word`` is the stop string found
    ("" until then).
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.word = ""
        self.hold = max((len(s) for s in self.stops), default=1) - 1

    def push(self, text: str) -> tuple[str, bool]:
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [(self.pending.find(s), s) for s in self.stops]
        hits = [(i, s) for i, s in hits if i >= 0]
        if hits:
            i, self.word = min(hits)
            out, self.pending = self.pending[:i], ""
            return out, True
        # emit all but a tail that could still grow into a stop string
        cut = len(self.pending)
        for j in range(max(0, len(self.pending) - self.hold), len(self.pending)):
            tail = self.pending[j:]
            if any(s.startswith(tail) for s in self.stops):
                cut = j
                break
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
