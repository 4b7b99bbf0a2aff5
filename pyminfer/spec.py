"""Speculative decoding with a draft model (Leviathan et al. 2023; Chen et al. 2023), greedy-exact.

One round, with last committed token x at position p (x's K/V not yet in the target cache):
  draft:  d sequential one-token forwards of the draft model (argmax on the device), after first
          feeding it every committed token it has not seen yet (never re-running what it saw);
  verify: ONE target forward over [x, y1..yd] at positions p..p+d, every row's choice;
  accept: the longest prefix where the target's choice equals the draft, plus the target's own
          token after it (so a round always emits >= 1 token);
  KV:     nothing is copied or cleared: both caches are position-addressed, rejected slots are
          overwritten by later rounds (bookkeeping only).
Every emitted token is the target's own choice on a row whose context equals the committed text,
and the native forward guarantees row i of an nt-row forward is bitwise equal to the one-row
forward at that position, so at temperature 0 the output is byte-identical to plain decoding.
At temperature > 0 each emitted token is one draw from the target's distribution in order, so
with the same seed the output also equals plain sampling.

N-gram drafts (``ngram=NgramSpec(...)``, pyminfer.ngram; llama.cpp's ``--spec-type ngram-simple``):
each round first looks the last n committed tokens up in the text so far; where they occurred
before, the up to m tokens that followed are the round's draft (no draft-model steps), verified
the same way; otherwise the round uses the draft model (if any) or plain decoding. As in
llama.cpp, the draftless source takes precedence when it has a draft. The draft model catches up
on the tokens such rounds committed when it next drafts (one batched forward).

Adaptive depth (``adaptive=True``) follows the seeds' doc 95 design: per-position acceptance
estimated with decayed Beta counts, per-depth round costs (medians of measured rounds), optimism
for depths not tried yet, 5% hysteresis (PYMINFER_ADAPTIVE_HYSTERESIS), d = 0 (plain decoding)
allowed, with d = 1 run in its place until 12 rounds have drafted where drafting could pay
(PYMINFER_ADAPTIVE_EXPLORE), capped at MAX_DEPTH (the largest d whose verify batch is bitwise on
every backend: nt = d + 1 <= 9).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections import deque
from typing import Any, Iterator, Sequence

import numpy as np

from .engine import ContextFull, Model
from .ngram import NgramIndex, NgramSpec
from .sampling import NaNLogitsError, Sampler
from .tokenizer import Tokenizer

MAX_DEPTH = 8  # verify nt = 9: bitwise on the CPU and, graphed as 8 + 1 mat-vec rows, on CUDA
FIXED_DEPTH = 4  # draft tokens a round where none is asked for (--spec-draft-n's default)
# The adaptive controller's first drafting depth where none is asked for: d = 1, the cheapest round
# that observes draft position 1. Start rounds at d = 4 are paid in full by a reply that ends soon (a
# short chat answer: the H200 ran "What is the capital of Australia..." at 0.75-0.79x of plain
# decoding, 8 tokens) or whose first draft tokens miss. Replayed on the real pair's 24 replies with
# the loop's own depth cap and end-of-generation stop (bench/ngram_replay.py, docs/perf.md session 38):
# code 1.062x from d = 1 vs 1.060x from d = 4, the rest 1.014x vs 0.996x, that short answer 1.09x vs
# 1.02x. Not yet A/B'd on a GPU.
ADAPTIVE_START = 1


def default_draft_n(adaptive: bool, max_nt: int | None = None) -> int:
    """The draft depth where none is given: FIXED_DEPTH (4) draft tokens a round, or with adaptive
    depth its first depth ADAPTIVE_START (1); capped at ``max_nt`` - 1 (a verify forward of d + 1 rows
    must fit the target's max_nt, n_ubatch) when max_nt is given, so 0 for max_nt 1. Raises nothing."""
    d = ADAPTIVE_START if adaptive else FIXED_DEPTH
    return d if max_nt is None else max(0, min(d, max_nt - 1))


class VocabMismatch(ValueError):
    """The draft model's vocabulary cannot propose tokens for the target."""


def check_vocab_compat(target: Tokenizer, draft: Tokenizer) -> None:
    """Refuse a draft whose vocabulary differs from the target's, as llama.cpp's
    common_speculative_are_compatible does: same tokenizer model, same add_bos/add_eos and (where
    added) same BOS/EOS ids, |n_vocab difference| <= 128, and identical token text for every id
    from 5 to min(n_vocab). Raises VocabMismatch naming the first mismatch."""
    if target.model_type != draft.model_type:
        raise VocabMismatch(f"tokenizer model differs: target {target.model_type!r}, draft {draft.model_type!r}")
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos_id != draft.bos_id):
        raise VocabMismatch(f"BOS differs: target add_bos={target.add_bos} id={target.bos_id}, "
                            f"draft add_bos={draft.add_bos} id={draft.bos_id}")
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos_id != draft.eos_id):
        raise VocabMismatch(f"EOS differs: target add_eos={target.add_eos} id={target.eos_id}, "
                            f"draft add_eos={draft.add_eos} id={draft.eos_id}")
    if abs(target.n_vocab - draft.n_vocab) > 128:
        raise VocabMismatch(f"vocabulary sizes differ by more than 128: target {target.n_vocab}, draft {draft.n_vocab}")
    for i in range(5, min(target.n_vocab, draft.n_vocab)):
        a, b = target.token_text(i), draft.token_text(i)
        if a != b:
            raise VocabMismatch(f"token {i} differs: target {a!r}, draft {b!r}")


class DraftLargerWarning(UserWarning):
    """The draft model is larger than the target: speculation will cost more than it saves."""


def check_draft(target: Model, draft: Model) -> None:
    """Load-time gate for a draft model: refuses an incompatible vocabulary (VocabMismatch, see
    check_vocab_compat) and warns (DraftLargerWarning) when the draft's weights outweigh the
    target's."""
    check_vocab_compat(target.tokenizer, draft.tokenizer)
    if draft.weight_bytes > target.weight_bytes:
        warnings.warn(f"the draft model ({draft.weight_bytes / 2**20:.0f} MiB) is larger than the target "
                      f"({target.weight_bytes / 2**20:.0f} MiB); speculation will likely be slower",
                      DraftLargerWarning, stacklevel=2)


def _median(v: Sequence[float]) -> float:
    """Upper median of a non-empty sequence (the middle element after sorting)."""
    return sorted(v)[len(v) // 2]


class AdaptiveDepth:
    """Chooses the draft depth d of each round to maximise expected tokens per second.

    Model: a round at depth d yields 1 + sum_{i<=d} prod_{j<=i} p_j tokens, p_j the smoothed
    conditional acceptance at draft position j, and costs its measured wall time: the median of
    the last rounds run at depth d, start to start, so everything the round costs counts (draft
    steps, the verify forward, the host work of the loop and of whoever consumes the tokens).
    A depth not run yet is priced from its parts: the target's nt = d+1 forward, d draft steps
    and the measured per-round remainder. Seeds' doc 95 design: optimism for untried depths
    (Beta(1.6, 0.4) prior on acceptance), hysteresis against flapping, d = 0 allowed.

    Probing: a depth d only observes draft positions 1..d, so after ``probe_min`` rounds at the
    same depth d >= 1 one round runs at d + 1, the gap doubling up to ``probe_max`` while probes
    neither move the depth nor see their extra position accepted (``probe_min`` = 0: never).
    Without it a controller that once saw a low acceptance at position d + 1 never learns that it
    rose (the H200, session 15: d = 1 for a whole reply where d = 3 was 5% faster). Not from d = 0:
    a probe there would first feed the draft every token since it last drafted, which cost more
    than it found (bench/ngram_replay.py, docs/perf.md session 16).

    Exploration: until ``explore_min`` rounds have drafted, a round that would run plain decoding
    (d = 0) runs d = 1 instead, the cheapest round that observes draft position 1, unless no depth
    could beat plain decoding even with every draft accepted (drafting_can_pay: where a verify row
    costs about a whole forward; on the project's 2-core CPU a row costs ~0.5 of one, so exploration
    runs there too and costs the CPU's speculative runs ~2%, docs/perf.md session 37).
    d = 0 observes no acceptance, so it is final for the reply; chosen on the evidence of the first
    two drafting rounds, one early rejection ended drafting on replies the draft then predicted at
    90-95% (the real pair: the French prompt 0.97x -> 1.10-1.12x on the H200; docs/perf.md session 37).
    """

    def __init__(self, max_depth: int = MAX_DEPTH, start: int = 4, decay: float = 0.97, hysteresis: float = 0.05,
                 probe_min: int = 16, probe_max: int = 128, explore_min: int = 12):
        self.max_depth = max_depth
        self.explore_min = explore_min
        self.drafted_rounds = 0  # rounds observed at d >= 1 (exploration: see the class docstring)
        self.decay = decay
        self.hysteresis = hysteresis
        # Plain Python floats throughout: this runs once per round, next to a ~1 ms GPU forward,
        # and numpy's per-call overhead made it ~50 us.
        self.acc = [1.6] * (max_depth + 1)
        self.rej = [0.4] * (max_depth + 1)
        self.verify_cost: list[deque[float]] = [deque(maxlen=4) for _ in range(max_depth + 2)]  # by nt
        # A round's first draft step also feeds the draft the 1-2 tokens the last round committed (an
        # nt = 2 forward after a fully accepted round), so it costs more than the steps after it;
        # pricing every step at the rounds' mean (from d = 1 rounds: the first step's cost) made
        # deeper rounds look ~4% dearer than they are.
        self.draft_first: deque[float] = deque(maxlen=16)
        self.draft_rest: deque[float] = deque(maxlen=16)  # per step after the first
        self.round_cost: list[deque[float]] = [deque(maxlen=8) for _ in range(max_depth + 1)]  # by d
        self.remainder: deque[float] = deque(maxlen=16)  # round wall time minus draft and verify
        self.cur = 0  # first round plain: measures C_T(1)
        self.hold = 0  # rounds left to stay at d = 0 without re-evaluating
        self.start = min(start, max_depth)
        self.history: list[int] = []
        self.probe_min, self.probe_max = probe_min, probe_max
        self.probe_gap = probe_min  # rounds at one depth before its next probe
        self.steady = 0  # rounds chosen at the current depth since the last move or probe
        self.probe_from: int | None = None  # the depth a probe round left, until the next choice
        self.probe_hit = False  # whether the last probe's extra draft position was accepted

    def verify_table(self) -> list[float | None]:
        """Seconds of one nt-row target forward for nt = 0..max_depth + 1 (index 0 unused): the
        min of the last 4 measured, never above what a wider batch was measured at (a forward
        does not get cheaper with more rows, so one slow sample cannot price a batch size out);
        an unseen nt also extrapolated optimistically from the nearest measured one below (+5%
        per row). None where nothing measured applies."""
        n = len(self.verify_cost)
        own = [min(w) if w else None for w in self.verify_cost]
        out: list[float | None] = [None] * n
        wider = None
        for nt in range(n - 1, 0, -1):  # suffix minimum over measured widths
            if own[nt] is not None:
                wider = own[nt] if wider is None else min(wider, own[nt])
            out[nt] = wider
        below = None  # (nt, seconds) of the nearest measured width below
        for nt in range(1, n):
            if own[nt] is None and below is not None:
                ext = below[1] * (1.0 + 0.05 * (nt - below[0]))
                out[nt] = ext if out[nt] is None else min(out[nt], ext)
            if own[nt] is not None:
                below = (nt, own[nt])
        return out

    def round_seconds(self, d: int, cv: list[float | None] | None = None) -> float | None:
        """Expected wall seconds of a round at depth d: the median of its measured rounds once
        there are 3; before that the lower of that and the estimate from its parts (verify_table,
        d draft steps, the median remainder), so a depth tried once in a slow moment (the first
        round, say) is tried again. ``cv``: verify_table(), when the caller has it."""
        rc = self.round_cost[d]
        if len(rc) >= 3:
            return _median(rc)
        cands = [_median(rc)] if rc else []
        c = (cv if cv is not None else self.verify_table())[d + 1]
        if c is not None:
            est = self._priced(d, c, self._parts())
            if est is not None:
                cands.append(est)
        return min(cands) if cands else None

    def _parts(self) -> tuple[float | None, float | None, float]:
        """Seconds of a round's parts besides its verify forward: the fastest first draft step
        measured, the fastest later step (not above the first's) and the median per-round remainder
        (0 before any); the steps None before any draft step is measured."""
        first = min(self.draft_first) if self.draft_first else None
        rest = min(self.draft_rest) if self.draft_rest else first
        return first, rest, _median(self.remainder) if self.remainder else 0.0

    @staticmethod
    def _priced(d: int, verify_s: float, parts: tuple[float | None, float | None, float]) -> float | None:
        """Seconds of a round at depth d from ``verify_s`` (its nt = d + 1 forward) and ``parts``
        (_parts: d draft steps and the remainder). None where d >= 1 and no draft step is measured."""
        first, rest, rem = parts
        if d == 0:
            return verify_s + rem
        if first is None or rest is None:
            return None
        return verify_s + first + (d - 1) * rest + rem

    def rates(self) -> list[float]:
        """Expected tokens per second of a round at each depth 0..max_depth (inf for ``start``
        before the costs it needs are measured, 0 for other unmeasurable depths)."""
        out = []
        cv = self.verify_table()
        exp_tokens, run = 1.0, 1.0  # 1 + sum_{i<=d} prod_{j<=i} p_j, built up over d
        for d in range(self.max_depth + 1):
            if d:
                run *= self.acc[d] / (self.acc[d] + self.rej[d])
                exp_tokens += run
            c = self.round_seconds(d, cv)
            out.append(exp_tokens / c if c else (float("inf") if d == self.start else 0.0))
        return out

    def drafting_can_pay(self, plain_rate: float) -> bool:
        """Whether some depth d >= 1 would beat ``plain_rate`` (tokens/s of d = 0) if every draft
        were accepted: d + 1 tokens a round for its verify forward, d draft steps and the median
        remainder. Verify widths not measured yet are priced on the steepest per-row slope measured
        from nt = 1 (not verify_table's optimistic +5% a row, which would make deep rounds look
        cheap on any backend). True while nothing beyond nt = 1 or no draft step is measured.
        False where a verify row costs about as much as a forward: exploring drafting there only
        loses. (Not on the project's 2-core CPU, where a row costs ~0.5 of a forward and full
        acceptance would pay.) ``plain_rate`` in tokens per second; costs are the measured seconds
        (verify_cost, then _priced as round_seconds uses it).
        Raises nothing."""
        own = [min(w) if w else None for w in self.verify_cost]
        if own[1] is None or not self.draft_first:
            return True
        wider = [(nt, c) for nt, c in enumerate(own) if nt > 1 and c is not None]
        if not wider:
            return True
        slope = max(max((c - own[1]) / (nt - 1) for nt, c in wider), 0.0)  # (a noisy nt = 1 sample)
        parts = self._parts()  # (once: the same for every depth)
        for d in range(1, self.max_depth + 1):
            ct = own[d + 1] if own[d + 1] is not None else own[1] + slope * d
            est = self._priced(d, ct, parts)  # (not None: a draft step is measured)
            if est is not None and (d + 1) / est > plain_rate:
                return True
        return False

    def choose(self) -> int:
        """Depth of the next round: d = 0 first (measures C_T(1)), then ``start`` twice, then the
        best expected rate, switching only when it beats the current depth's by the hysteresis
        (d = 1 in place of d = 0 for the first ``explore_min`` drafting rounds, the two start
        rounds included). Known limit: once at d = 0 nothing about drafting is observed any more
        (only costs), so a text that turns predictable later stays at d = 0; probing would cost a
        draft catch-up of every token since the last round that drafted (~5% of the target's time
        on the H200)."""
        if not self.history:
            d = 0
        elif len(self.history) <= 2:  # twice, so one slow round cannot price drafting out
            d = self.start
        elif self.cur == 0 and self.hold > 0:
            # At d = 0 no acceptance is observed, only costs move: re-evaluate every 8th round
            # (a round of plain decoding is ~1 ms; the evaluation ~10 us of Python).
            self.hold -= 1
            d = 0
        else:
            rates = self.rates()
            base = self.cur if self.probe_from is None else self.probe_from  # a probe is not a move
            best = max(range(len(rates)), key=rates.__getitem__)  # first of equal maxima
            d = best if rates[best] > rates[base] * (1.0 + self.hysteresis) else base
            if d == 0 and self.max_depth >= 1 and self.drafted_rounds < self.explore_min \
                    and self.drafting_can_pay(rates[0]):
                d = 1  # still exploring: the cheapest drafting round, not plain decoding (class docstring)
            if self.probe_from is not None:  # probe less often after probes that found nothing
                found = d != base or self.probe_hit
                self.probe_gap = self.probe_min if found else min(2 * self.probe_gap, self.probe_max)
                self.probe_from = None
            if d != base:
                self.steady = 0
            self.hold = 7 if d == 0 else 0
        if self.probe_min and len(self.history) > 2 and 0 < d < self.max_depth:
            self.steady += 1
            if self.steady >= self.probe_gap:
                self.probe_from, self.steady = d, 0
                d += 1
        self.cur = d
        self.history.append(d)
        return d

    def update(self, d: int, n_accepted: int, draft_s: float, verify_s: float, round_s: float | None = None,
               costs: bool = True, first_s: float | None = None) -> None:
        """Record a finished round: depth d, accepted drafts, draft and verify seconds and, when
        known, its whole wall time start to start and the seconds of its first draft step
        (``first_s``; None: every step priced alike). Positions 1..min(n_accepted + 1, d) were
        observed (accepted, then the first rejection). ``costs=False``: only the acceptance counts
        (a round whose draft first caught up on many tokens costs more than a usual one)."""
        if self.probe_from is not None:
            self.probe_hit = n_accepted >= d  # (the probe is the last round chosen)
        if d:
            self.drafted_rounds += 1
        if costs:
            self.verify_cost[d + 1].append(verify_s)
        if d and costs:
            if first_s is None or d == 1:
                self.draft_first.append(draft_s / d)
            else:
                self.draft_first.append(first_s)
                self.draft_rest.append(max(draft_s - first_s, 0.0) / (d - 1))
        if round_s is not None and costs:
            self.round_cost[d].append(round_s)
            self.remainder.append(max(round_s - draft_s - verify_s, 0.0))
        for i in range(1, min(n_accepted + 1, d) + 1):
            ok = i <= n_accepted
            self.acc[i] = self.acc[i] * self.decay + (1.0 if ok else 0.0)
            self.rej[i] = self.rej[i] * self.decay + (0.0 if ok else 1.0)


def adaptive_hysteresis() -> float:
    """The adaptive controller's switch margin: PYMINFER_ADAPTIVE_HYSTERESIS (a fraction in [0, 1),
    a tuning knob for A/B runs) or 0.05. Raises ValueError for a malformed value."""
    v = os.environ.get("PYMINFER_ADAPTIVE_HYSTERESIS")
    if v is None or v == "":
        return 0.05
    try:
        h = float(v)
    except ValueError:
        h = -1.0
    if not 0.0 <= h < 1.0:
        raise ValueError(f"PYMINFER_ADAPTIVE_HYSTERESIS={v!r}: want a fraction in [0, 1)")
    return h


def _env_count(name: str, default: int, zero: str) -> int:
    """An integer >= 0 from environment variable ``name`` (unset or empty: ``default``); ``zero``
    says what 0 means, for the error. Raises ValueError for anything else (ASCII digits only)."""
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    if not (v.isascii() and v.isdigit()):
        raise ValueError(f"{name}={v!r}: want an integer >= 0 (0: {zero})")
    return int(v)


def adaptive_probe() -> int:
    """The adaptive controller's rounds between depth probes: PYMINFER_ADAPTIVE_PROBE (an integer
    >= 0, 0 = never probe; a tuning knob for A/B runs) or 16. Raises ValueError for a malformed value."""
    return _env_count("PYMINFER_ADAPTIVE_PROBE", 16, "never probe")


def adaptive_explore() -> int:
    """The adaptive controller's exploration: until this many rounds have drafted, d = 1 runs where
    d = 0 would (AdaptiveDepth). PYMINFER_ADAPTIVE_EXPLORE (an integer >= 0, 0 = no exploration, the
    controller of sessions 5-36; a tuning knob for A/B runs) or 12. Raises ValueError for a
    malformed value."""
    return _env_count("PYMINFER_ADAPTIVE_EXPLORE", 12, "no exploration")


def _through_end(ids: list[int], eog: frozenset[int]) -> list[int]:
    """``ids`` up to and including the first end-of-generation id in ``eog`` (all of them if none):
    a draft past the end of generation could never be output."""
    for k, t in enumerate(ids):
        if t in eog:
            return ids[:k + 1]
    return ids


class SpecDecoder:
    """Token source for generate_stream: target + draft model (fixed or adaptive depth) and/or
    n-gram drafts (``ngram``); at least one of ``draft`` and ``ngram`` must be given. ``draft_n``:
    draft tokens a round, or with ``adaptive`` the controller's first depth; None: default_draft_n
    (4, or 1 with adaptive; capped at the target's max_nt - 1).

    Raises VocabMismatch at construction for an incompatible draft; ValueError for a depth outside
    0..MAX_DEPTH (deeper verify batches are not bitwise on every backend), for adaptive depth
    without a draft model, or for no draft source at all; TypeError for an ``ngram`` that is not
    a NgramSpec.
    """

    def __init__(self, target: Model, draft: Model | None, sampler: Sampler, *, draft_n: int | None = None,
                 adaptive: bool = False, ngram: NgramSpec | None = None):
        if ngram is not None and not isinstance(ngram, NgramSpec):
            raise TypeError(f"ngram must be a pyminfer.NgramSpec or None, got {type(ngram).__name__}")
        if draft is None and ngram is None:
            raise ValueError("speculative decoding needs a draft model or n-gram drafts (--spec-type ngram-simple)")
        if draft is None and adaptive:
            raise ValueError("--spec-draft-adaptive needs a draft model (--spec-draft MODEL)")
        if ngram is not None and ngram.m + 1 > target.max_nt:
            raise ValueError(f"the target's batch size max_nt (-ub/--ubatch-size, n_ubatch) {target.max_nt} is too "
                             f"small for --spec-ngram-size-m {ngram.m}: a verify forward takes {ngram.m + 1} tokens")
        if draft is None:
            draft_n = 0
        elif draft_n is None:  # not asked for: default_draft_n, capped at what a verify forward holds
            draft_n = default_draft_n(adaptive, target.max_nt)
        if not 0 <= draft_n <= MAX_DEPTH:
            raise ValueError(f"--spec-draft-n must be in 0..{MAX_DEPTH}, got {draft_n}")
        if draft_n + 1 > target.max_nt and not adaptive:  # (adaptive: the first depth is capped below)
            raise ValueError(f"the target's batch size max_nt (-ub/--ubatch-size, n_ubatch) {target.max_nt} is too "
                             f"small for {draft_n} draft tokens a round: a verify forward takes {draft_n + 1} tokens")
        if draft is not None:
            check_vocab_compat(target.tokenizer, draft.tokenizer)
        self.target, self.draft, self.sampler = target, draft, sampler
        self.ngram_spec = ngram
        self.ngram_rounds = 0  # rounds whose draft came from the n-gram lookup
        self.ngram_drafted = 0
        self.ngram_accepted = 0
        self.draft_n = draft_n
        max_d = min(MAX_DEPTH, target.max_nt - 1)  # the verify batch (d + 1 rows) must fit one forward
        self.adaptive = AdaptiveDepth(max_depth=max_d, start=max(min(draft_n, max_d), 1),
                                      hysteresis=adaptive_hysteresis(), probe_min=adaptive_probe(),
                                      explore_min=adaptive_explore()) if adaptive else None
        self.stats: dict[str, float] = {}
        self.rounds = 0
        self.drafted_at = np.zeros(MAX_DEPTH + 1, np.int64)  # per draft position (1-based)
        self.accepted_at = np.zeros(MAX_DEPTH + 1, np.int64)
        self.draft_s = 0.0
        self.verify_s = 0.0
        self.emitted = 0
        self.depths: list[int] = []
        self.draft_n_past = 0  # positions of the committed text whose K/V the draft holds
        n = sampler.p.repeat_last_n  # -1: the whole context (hist[-maxsize:] is all of it)
        self.window = sys.maxsize if n < 0 else max(n, 1)
        self.max_tokens: int | None = None  # set by the caller: no drafting past what it will take

    def _choose(self, row: np.ndarray | int, hist: Sequence[int]) -> int:
        if isinstance(row, (int, np.integer)):
            return int(row)
        try:
            return self.sampler.sample(row, hist)
        except NaNLogitsError as e:  # the rows sampled are the target's: name its file
            raise self.target.nan_error() from e

    def draft_prefill(self, prompt_ids: Sequence[int], draft_n_past: int = 0) -> int:
        """Evaluate the prompt into the draft model's cache from ``draft_n_past`` on (its last token
        always), where the prompt fits the draft's n_ctx; returns and records (``draft_n_past``) the
        prompt positions whose draft K/V are now valid. No draft model: nothing (0)."""
        d_valid = min(draft_n_past, len(prompt_ids) - 1)
        if self.draft is not None and len(prompt_ids) < self.draft.n_ctx:
            self.draft.prefill(list(prompt_ids[d_valid:]), d_valid, logits=False)
            d_valid = len(prompt_ids)
        self.draft_n_past = d_valid
        return d_valid

    def tokens(self, prompt_ids: Sequence[int], n_past: int = 0, draft_n_past: int = 0) -> Iterator[int]:
        """Yield generated ids forever (the caller stops); raises ContextFull when the target's
        context is full. ``n_past`` / ``draft_n_past``: leading prompt positions whose K/V the
        target's / draft's cache already holds. Where the draft's context is full, rounds run at
        d = 0 (plain decoding), so the output never depends on the draft's n_ctx."""
        T, D = self.target, self.draft
        need = self.sampler.p.needs_logits
        n_ctx = T.n_ctx  # the draft's context limits only how far it can draft (d = 0 past it)
        eog = T.tokenizer.eog_ids  # generation ends at these: nothing past one is drafted or counted
        n_past = min(n_past, len(prompt_ids) - 1)
        t0 = time.perf_counter()
        out = T.prefill(list(prompt_ids[n_past:]), n_past, logits=need)
        hist = list(prompt_ids)
        # The draft reads the prompt now, not in the first round: a round's draft time must be the
        # per-step cost the adaptive depth model assumes.
        d_valid = self.draft_prefill(prompt_ids, draft_n_past)  # draft K/V valid for hist[:d_valid]
        t1 = time.perf_counter()
        self.stats.update(prefill_s=t1 - t0, prefill_tokens=len(prompt_ids) - n_past)
        tok = self._choose(out if need else out[0], hist)
        hist.append(tok)
        self.emitted += 1
        yield tok
        last_round: tuple[int, int, float, float, float, bool, float] | None = None  # for the adaptive model
        index = NgramIndex(self.ngram_spec) if self.ngram_spec is not None else None
        while True:
            p = len(hist) - 1  # position of the last committed token, not yet in the target cache
            if p >= n_ctx:
                raise ContextFull(f"context full at n_ctx={n_ctx}")
            ta = time.perf_counter()
            if self.adaptive and last_round is not None:  # its wall time includes the consumer's work
                ld, la, ldr, lve, lstart, lcosts, lfirst = last_round
                self.adaptive.update(ld, la, ldr, lve, ta - lstart, costs=lcosts, first_s=lfirst)
            room = n_ctx - 1 - p  # a round yields <= d + 1 tokens: no drafting past the context or
            if self.max_tokens is not None:  # past what the caller will take
                room = min(room, self.max_tokens - self.emitted - 1)
            drafts: list[int] = index.propose(hist, room) if index is not None else []
            drafts = _through_end(drafts, eog)
            from_ngram = bool(drafts)
            td = time.perf_counter()
            catch_up = 0
            if from_ngram:
                d = len(drafts)
            else:
                d = self.adaptive.choose() if self.adaptive else self.draft_n
                d = max(0, min(d, room, D.n_ctx - 1 - p)) if D is not None else 0
                if self.adaptive:
                    self.adaptive.cur = self.adaptive.history[-1] = d  # record what ran, not what was asked
                if d > 0:
                    pending = hist[d_valid:]
                    catch_up = len(pending)
                    y = int(D.prefill(pending, d_valid, logits=False)[0])
                    drafts.append(y)
                    t_first = time.perf_counter()
                    for i in range(1, d):
                        if y in eog:  # past an end of generation nothing is output: stop drafting
                            break
                        y = int(D.forward([y], p + i, [0], logits=False)[0])
                        drafts.append(y)
                    d = len(drafts)
                    if self.adaptive:  # what ran; the depth chosen (cur) stays the one to beat
                        self.adaptive.history[-1] = d
                    d_valid = p + d  # the draft saw hist[-1] at p and drafts[:d-1] at p+1..p+d-1
            tb = time.perf_counter()
            if not d or from_ngram:
                t_first = tb
            rows = T.forward([hist[-1]] + drafts, p, list(range(d + 1)), logits=need)
            tc = time.perf_counter()
            emitted: list[int] = []
            if d:
                self.drafted_at[1:d + 1] += 1
            a = 0  # drafts accepted: emitted[:a]
            for i in range(d + 1):
                # the penalty window (last repeat_last_n tokens) is all a row's choice can look at
                z = self._choose(rows[i], hist[-self.window:] + emitted if need else hist)
                emitted.append(z)
                hit = i < d and z == drafts[i]
                a += hit
                if not hit or z in eog:  # generation ends at an end-of-generation token
                    break
            if d > 0 and not from_ngram:
                d_valid = min(d_valid, p + 1 + a)  # the draft's rows past the accepted prefix are stale
            if from_ngram:
                self.ngram_rounds += 1
                self.ngram_drafted += d
            self.draft_n_past = d_valid
            self.rounds += 1
            self.depths.append(d)
            self.draft_s += tb - td
            self.verify_s += tc - tb
            # The adaptive model learns from draft-model rounds only (an n-gram round costs no draft
            # steps), and its costs only from rounds of the usual shape: one that first caught the
            # draft up on more than the usual 1-2 tokens (after n-gram rounds) has a longer first step.
            last_round = (d, a, tb - td, tc - tb, ta, catch_up <= 2, t_first - td) if not from_ngram else None
            for k, z in enumerate(emitted):
                hist.append(z)
                self.emitted += 1
                if k < a:  # an accepted draft counts once the caller takes it (not past a stop string)
                    self.accepted_at[k + 1] += 1
                    self.ngram_accepted += from_ngram
                yield z

    def spec_stats(self) -> dict[str, Any]:
        """Rounds, drafted/accepted counts (total and per draft position), acceptance, mean
        accepted length, tokens per round, draft and verify seconds, depths used (mean, and rounds
        per depth 0..8), and the n-gram rounds' share of those. Drafted counts every token drafted;
        accepted only the accepted drafts the caller took (none past the end of generation or a stop
        string that ended it, so such a stop lowers the rate a little: llama.cpp's server counts the
        whole round); depths and counts include both draft sources (an n-gram round's depth is the
        number of tokens it proposed)."""
        drafted = int(self.drafted_at.sum())
        accepted = int(self.accepted_at.sum())
        n = max(len(self.depths), 1)
        return {
            "rounds": self.rounds,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "acceptance_per_position": [
                float(self.accepted_at[i] / self.drafted_at[i]) if self.drafted_at[i] else None
                for i in range(1, MAX_DEPTH + 1)],
            "drafted_per_position": [int(x) for x in self.drafted_at[1:]],
            "accepted_per_position": [int(x) for x in self.accepted_at[1:]],
            "mean_accepted": accepted / self.rounds if self.rounds else 0.0,
            "tokens_per_round": (self.emitted - 1) / self.rounds if self.rounds else 0.0,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "mean_depth": float(sum(self.depths) / n) if self.depths else 0.0,
            "depth_counts": [self.depths.count(d) for d in range(MAX_DEPTH + 1)],  # rounds run at d = 0..8
            "adaptive": self.adaptive is not None,
            "draft_n_past": self.draft_n_past,
            # n-gram drafts (counted in the totals above too): rounds that used one, tokens drafted / accepted
            "ngram": self.ngram_spec is not None,
            "ngram_rounds": self.ngram_rounds,
            "ngram_drafted": self.ngram_drafted,
            "ngram_accepted": self.ngram_accepted,
        }
