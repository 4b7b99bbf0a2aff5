"""Draft tokens without a draft model: n-gram lookup in the text so far (prompt lookup decoding).

The last ``n`` committed tokens are looked up among the earlier n-grams of the prompt and the
generated text; the ``m`` tokens that followed their most recent earlier occurrence are the draft,
which the target then verifies like a draft model's (pyminfer.spec). Source of the method:
A. Saxena, "Prompt Lookup Decoding" (2023, github.com/apoorvumang/prompt-lookup-decoding); the
option names and the "most recent match, then the m tokens after it" rule follow llama.cpp's
``--spec-type ngram-simple`` (common/speculative.cpp). The draft only decides what is proposed:
the target's verify decides every emitted token, so the output is the same with or without it.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Sequence

MAX_NGRAM = 64  # longest n-gram the index keys on (a key is a tuple of n token ids)


@dataclass(frozen=True)
class NgramSpec:
    """n: tokens matched (1..MAX_NGRAM); m: most tokens drafted a round (1..8: a verify forward of
    m + 1 rows must be bitwise equal to single-token decoding, pyminfer.spec.MAX_DEPTH).

    Raises TypeError for a value that is not an int (a bool or a float included) and ValueError
    for values outside those ranges."""

    n: int = 3
    m: int = 5

    def __post_init__(self) -> None:
        from .spec import MAX_DEPTH

        for name in ("n", "m"):  # checked here: a float failed only later, deep in the draft loop
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"NgramSpec {name} must be an int, got {type(v).__name__}")
            object.__setattr__(self, name, int(v))
        if not 1 <= self.n <= MAX_NGRAM:
            raise ValueError(f"NgramSpec n (--spec-ngram-size-n) must be in 1..{MAX_NGRAM}, got {self.n}")
        if not 1 <= self.m <= MAX_DEPTH:
            raise ValueError(f"NgramSpec m (--spec-ngram-size-m) must be in 1..{MAX_DEPTH}, got {self.m}")


class NgramIndex:
    """Most recent end position of every n-gram of a growing token sequence.

    ``propose(hist, k)`` indexes the n-grams of ``hist`` that end before its last token (only the
    new ones since the previous call: O(new tokens) a call, O(len) memory), then returns up to ``k``
    tokens that followed the latest earlier occurrence of ``hist[-n:]``, or [] when there is none.
    ``hist`` must only grow between calls (its first tokens never change): the speculative loop's
    committed text.
    """

    def __init__(self, spec: NgramSpec):
        self.n = spec.n
        self.m = spec.m
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> index of its last token, latest occurrence
        self._done = 0  # n-grams ending at indices < _done are in _last

    def propose(self, hist: Sequence[int], k: int) -> list[int]:
        n, L = self.n, len(hist)
        if k <= 0 or L <= n:
            return []
        end = L - 1  # the suffix's own n-gram ends here: index only the earlier ones
        for i in range(max(self._done, n - 1), end):
            self._last[tuple(hist[i - n + 1:i + 1])] = i
        self._done = max(self._done, end)
        e = self._last.get(tuple(hist[L - n:]))
        if e is None:
            return []
        return list(hist[e + 1:e + 1 + min(k, self.m)])
