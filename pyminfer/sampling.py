"""Token sampling on host logits, as llama.cpp's sampler chain (common/sampling.cpp,
src/llama-sampling.cpp): the samplers of ``SamplingParams.samplers`` in order, then a draw from what
is left. The default chain is llama.cpp's default with the samplers this engine does not implement
left out: repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw. Temperature <= 0
keeps only the most likely token (greedy).

The repetition penalty follows llama.cpp's (CTRL, Keskar et al. 2019): for every distinct token in
the last ``repeat_last_n`` generated-or-prompt tokens, a positive logit is divided by the penalty
and a negative one multiplied by it. Any finite penalty > 0 is accepted: a tiny one can push a
penalized logit past float32's range, so results are clamped to +-FLT_MAX (no inf, hence no
inf - inf = nan in the softmax; ties at the clamp go to the lowest id, as argmax does).

The ``infill`` sampler is llama.cpp's (llama_sampler_infill_apply, written for fill-in-the-middle
editors such as llama.vim): where end-of-generation tokens hold enough of the probability only they
are kept; otherwise tokens whose text is a prefix of another candidate's are merged into the more
likely of the two, and candidates under 0.2, then under 1 / (n + 1), of the merged probability are
dropped (end-of-generation tokens always stay); none left but end-of-generation: the end-of-text
token. The draw then weighs what is left by the logits, as llama.cpp's dist sampler does.
"""

from __future__ import annotations

import secrets
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

_F32_MAX = float(np.finfo(np.float32).max)

# llama.cpp's sampler names as its server takes them (common_sampler_types_from_names without the
# alternative spellings) and their one-letter codes (common_sampler_types_from_chars).
SAMPLER_CODES: dict[str, str] = {"penalties": "e", "dry": "d", "top_n_sigma": "s", "top_k": "k", "typ_p": "y",
                                 "top_p": "p", "min_p": "m", "xtc": "x", "temperature": "t", "infill": "i"}
# Samplers this engine does not implement: a chain may name them (llama.cpp's default chain does),
# and they do nothing, which is what llama.cpp's do at their neutral settings, the only settings
# accepted here (dry_multiplier 0, top_n_sigma <= 0, typical_p 1, xtc_probability 0).
NEUTRAL_SAMPLERS = frozenset({"dry", "top_n_sigma", "typ_p", "xtc"})
DEFAULT_SAMPLERS: tuple[str, ...] = ("penalties", "top_k", "top_p", "min_p", "temperature")
# The infill sampler compares every pair of its candidates' texts: it needs a top_k of at most
# this many before it (llama.vim sends 40); over a whole vocabulary it would never finish.
INFILL_MAX_CANDIDATES = 1024
# The most alternatives a token OpenAI's fields may ask for (its top_logprobs limit, vLLM's
# default); llama.cpp's n_probs and the Python API have no such limit.
MAX_LOGPROBS = 20


# The other spellings llama.cpp's CLI takes (common_sampler_types_from_names with allow_alt_names).
ALT_SAMPLER_NAMES: dict[str, str] = {"top-k": "top_k", "top-p": "top_p", "nucleus": "top_p", "typical-p": "typ_p",
                                     "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p", "min-p": "min_p",
                                     "temp": "temperature"}


def parse_samplers(value: str | Sequence[str], *, alt_names: bool = False) -> tuple[str, ...]:
    """A sampler chain from llama.cpp's forms: a list of names (``["top_k", "top_p", "infill"]``),
    a string of one-letter codes (``"kpi"``, SAMPLER_CODES) or of names separated by ';' (its CLI's
    ``--samplers top_k;top_p``); ``alt_names``: also ALT_SAMPLER_NAMES, as its CLI. Raises
    ValueError naming an unknown sampler."""
    alt = ALT_SAMPLER_NAMES if alt_names else {}
    if isinstance(value, str):
        if ";" not in value and value not in SAMPLER_CODES and value not in alt:  # letter codes
            by_code = {c: n for n, c in SAMPLER_CODES.items()}
            bad = [c for c in value if c not in by_code]
            if bad:
                raise ValueError(f"unknown sampler code {bad[0]!r} in {value!r} (codes: "
                                 + ", ".join(f"{c} = {n}" for n, c in SAMPLER_CODES.items()) + ")")
            return tuple(by_code[c] for c in value)
        value = [v for v in value.split(";") if v]
    names = [alt.get(n, n) if isinstance(n, str) else n for n in value]
    for n in names:
        if not isinstance(n, str) or n not in SAMPLER_CODES:
            raise ValueError(f"unknown sampler {n!r} (known: {', '.join(SAMPLER_CODES)})")
    return tuple(names)


@dataclass
class SamplingParams:
    """Sampling settings (llama.cpp's CLI defaults).

    temperature: <= 0 means greedy (argmax). top_k: <= 0 disables. top_p, min_p: 1.0 / 0.0 disable.
    repeat_penalty: 1.0 disables; applied over the last repeat_last_n tokens of the context
    (repeat_last_n 0: none, -1: the whole context, as llama.cpp).
    seed: RNG seed (None or negative: random, as llama.cpp's -1).
    samplers: the chain, in order (names of SAMPLER_CODES); None: DEFAULT_SAMPLERS. As in llama.cpp
    a setting whose sampler is not in the chain has no effect: without "temperature" the draw is
    at temperature 1 whatever ``temperature`` says; [] draws from the whole distribution.
    stop, n_indent, t_max_predict_ms: when generation ends (pyminfer.generate), not sampling:
    stop strings; n_indent > 0: a line after the first that starts less indented than that many
    spaces / tabs ends it (llama.cpp's n_indent); t_max_predict_ms > 0: past that many milliseconds
    after the first token, the next token that brings a newline ends it (llama.cpp's).
    logprobs: None, or each token's log-probability and the ``logprobs`` (>= 0) most likely
    alternatives are recorded (TokenLogprob), from the model's distribution before any sampler
    (OpenAI's and vLLM's logprobs, llama.cpp's n_probs); the logits are then read back for every
    token. min_keep: the fewest candidates top_p and min_p leave (llama.cpp's; 0: no floor).
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    samplers: tuple[str, ...] | None = None
    n_indent: int = 0
    t_max_predict_ms: float = 0.0
    logprobs: int | None = None
    min_keep: int = 0

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
        if self.n_indent < 0:
            raise ValueError(f"n_indent must be >= 0 (0: off), got {self.n_indent}")
        if not np.isfinite(self.t_max_predict_ms):
            raise ValueError("t_max_predict_ms must be finite (<= 0: no time limit)")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs (the alternatives a token) must be >= 0, got {self.logprobs}")
        if self.min_keep < 0:
            raise ValueError(f"min_keep must be >= 0, got {self.min_keep}")
        if self.samplers is not None:
            self.samplers = parse_samplers(self.samplers)
        chain = self.chain
        if "infill" in chain:
            before = chain[:chain.index("infill")]
            if "top_k" not in before or not 0 < self.top_k <= INFILL_MAX_CANDIDATES:
                raise ValueError(f"the infill sampler needs top_k between 1 and {INFILL_MAX_CANDIDATES} before it in "
                                 "the chain (it compares every pair of candidates; llama.vim sends top_k 40 and "
                                 "samplers top_k, top_p, infill)")

    @property
    def chain(self) -> tuple[str, ...]:
        """The samplers applied, in order."""
        return DEFAULT_SAMPLERS if self.samplers is None else tuple(self.samplers)

    @property
    def greedy(self) -> bool:
        """True when the draw is always the most likely token (after any penalty before the
        temperature): temperature <= 0 in the chain, no infill sampler ahead of it."""
        chain = self.chain
        if self.temperature > 0.0 or "temperature" not in chain:
            return False
        return "infill" not in chain[:chain.index("temperature")]

    @property
    def penalized(self) -> bool:
        """True when the repetition penalty changes logits that decide the token."""
        chain = self.chain
        if self.repeat_penalty == 1.0 or "penalties" not in chain:
            return False
        return not self.greedy or chain.index("penalties") < chain.index("temperature")

    @property
    def argmax_after_penalty(self) -> bool:
        """True when a greedy pick is the argmax of the (penalized) logits: no cut (top_k, top_p,
        min_p) ahead of a penalty that could reorder what it kept."""
        chain = self.chain
        if not self.penalized:
            return True
        return all(n in NEUTRAL_SAMPLERS for n in chain[:chain.index("penalties")])

    @property
    def needs_logits(self) -> bool:
        """False when the on-device argmax gives the answer (greedy without penalty, no logprobs)."""
        return not (self.greedy and not self.penalized) or self.logprobs is not None


def apply_repeat_penalty(logits: np.ndarray, window: Sequence[int], penalty: float) -> np.ndarray:
    """Penalize (in place, returns it) logits[n_vocab] of the distinct ids in ``window``."""
    if penalty == 1.0 or not len(window):
        return logits
    ids = np.unique(np.asarray(window, dtype=np.int64))
    # llama.cpp holds the penalty as a float; rounded the same way and applied in float64, the
    # result rounds to exactly the float32 quotient/product (f64 carries > 2*24+2 bits, so the
    # double rounding is innocuous), which keeps every in-range penalty bit-identical to plain f32
    # arithmetic. A penalty outside float32's range (0 or inf as a float32) is used as given.
    logits[ids] = _penalized(logits[ids].astype(np.float64), penalty).astype(np.float32)
    return logits


def _penalized(v: np.ndarray, penalty: float) -> np.ndarray:
    """float64 logits ``v`` under llama.cpp's repetition penalty (apply_repeat_penalty), clamped to
    float32's finite range (a tiny penalty overflows: no +-inf)."""
    with np.errstate(over="ignore", under="ignore"):
        p32 = float(np.float32(penalty))
        p = p32 if 0.0 < p32 < np.inf else float(penalty)
        return np.clip(np.where(v > 0, v / p, v * p), -_F32_MAX, _F32_MAX)


@dataclass
class TokenLogprob:
    """One generated token's natural-log probability under the model (softmax of its raw
    logits, float64) and the ``top`` most likely ids with theirs, most likely first (ties: lower
    id first): [(id, logprob)]. ``offset``: where the token's text starts in the generated text
    (characters; set by pyminfer.generate)."""

    id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    offset: int = 0


def token_logprob(logits: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """TokenLogprob of ``token`` (an id < n_vocab) from f32 logits[n_vocab]: log-softmax in float64
    (natural log, nats), the min(n_top, n_vocab) most likely ids first. IndexError for an id out
    of range; NaN logits give NaN values (the samplers refuse NaN rows before this is called)."""
    x = logits.astype(np.float64)
    m = float(x.max())
    lse = m + float(np.log(np.exp(x - m).sum()))
    top: list[tuple[int, float]] = []
    if n_top > 0:
        n = min(n_top, x.size)
        part = np.argpartition(-x, n - 1)[:n] if n < x.size else np.arange(x.size)
        part = part[np.lexsort((part, -x[part]))]
        top = [(int(i), float(x[i] - lse)) for i in part]
    return TokenLogprob(int(token), float(x[token] - lse), top)


class InfillVocab(Protocol):
    """What the infill sampler reads of a vocabulary (pyminfer.tokenizer.Tokenizer has it)."""

    eog_ids: frozenset[int]
    eot_id: int | None
    eos_id: int | None

    def token_to_piece(self, token_id: int, *, special: bool = True) -> bytes: ...


def _softmax(vals: np.ndarray) -> np.ndarray:
    with np.errstate(under="ignore"):
        w = np.exp(vals - vals.max())
    return w / w.sum()


class Sampler:
    """Draws tokens from logits with one seeded RNG (numpy PCG64).

    ``vocab``: the model's tokenizer, needed (ValueError without it) where the chain has the
    infill sampler."""

    def __init__(self, params: SamplingParams, vocab: InfillVocab | None = None):
        params.validate()
        if "infill" in params.chain and vocab is None:
            raise ValueError("the infill sampler needs the model's vocabulary")
        self.p = params
        self.vocab = vocab
        # the seed used: params.seed, or one drawn at random (None or negative, as llama.cpp's -1), so
        # that a random run can be repeated (GenerationResult.seed; llama.cpp logs "sampler seed")
        seed = params.seed
        self.seed: int = seed if seed is not None and seed >= 0 else secrets.randbits(32)
        self.rng = np.random.default_rng(self.seed)
        # with params.logprobs: one TokenLogprob a sample() call, in call order (the decoders
        # call sample() once per token they emit, in the order they emit them)
        self.logprobs: deque[TokenLogprob] = deque()

    def penalty_window(self, history: Sequence[int]) -> Sequence[int]:
        n = self.p.repeat_last_n
        return history[-n:] if n > 0 else history if n < 0 else ()

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """One token from f32 logits[n_vocab]; ``history`` is the context so far (for the penalty).
        With params.logprobs its TokenLogprob is appended to ``self.logprobs``."""
        tok = self._pick(logits, history)
        if self.p.logprobs is not None:
            self.logprobs.append(token_logprob(logits, tok, self.p.logprobs))
        return tok

    def _pick(self, logits: np.ndarray, history: Sequence[int]) -> int:
        p = self.p
        lg = logits.astype(np.float32, copy=True)
        if p.greedy and p.argmax_after_penalty:
            if p.penalized:
                apply_repeat_penalty(lg, self.penalty_window(history), p.repeat_penalty)
            i = int(np.argmax(lg))  # the first NaN where there is one (numpy propagates NaN)
            if np.isnan(lg[i]):
                raise NaNLogitsError(NaNLogitsError.MESSAGE)
            return i
        if np.isnan(lg.max()):
            raise NaNLogitsError(NaNLogitsError.MESSAGE)
        # The candidates: ids idx with logits vals (float64), sorted by descending logit (stable:
        # ties in id order) where ``ordered``; idx None: the whole vocabulary, in lg.
        idx: np.ndarray | None = None
        vals = np.empty(0)
        ordered = False

        def sort() -> None:
            nonlocal idx, vals, ordered
            if idx is None:
                idx = np.argsort(-lg, kind="stable")
                vals = lg[idx].astype(np.float64)
            elif not ordered:
                o = np.argsort(-vals, kind="stable")
                idx, vals = idx[o], vals[o]
            ordered = True

        for name in p.chain:
            if name == "penalties" and p.repeat_penalty != 1.0:
                window = self.penalty_window(history)
                if idx is None:
                    apply_repeat_penalty(lg, window, p.repeat_penalty)
                elif len(window):  # later in the chain: on the candidates' (float64) logits
                    hit = np.isin(idx, np.asarray(window, dtype=np.int64))
                    vals = vals.copy()
                    vals[hit] = _penalized(vals[hit], p.repeat_penalty)
                    ordered = False
            elif name == "top_k":
                n = lg.size if idx is None else idx.size
                if 0 < p.top_k < n and idx is None:  # sorts only k values
                    part = np.argpartition(-lg, p.top_k - 1)[:p.top_k]
                    idx = part[np.argsort(-lg[part], kind="stable")]
                    vals, ordered = lg[idx].astype(np.float64), True
                else:
                    sort()
                    if 0 < p.top_k < n:
                        idx, vals = idx[:p.top_k], vals[:p.top_k]
            elif name == "top_p" and p.top_p < 1.0:
                sort()
                probs = np.exp(vals - vals[0])
                probs /= probs.sum()
                keep = max(int(np.searchsorted(np.cumsum(probs), p.top_p) + 1), p.min_keep)
                idx, vals = idx[:keep], vals[:keep]
            elif name == "min_p" and p.min_p > 0.0:
                sort()
                probs = np.exp(vals - vals[0])
                probs /= probs.sum()
                keep = probs >= p.min_p * probs[0]
                keep[:p.min_keep] = True  # sorted: the min_keep most likely stay
                idx, vals = idx[keep], vals[keep]
            elif name == "temperature":
                sort()
                if p.temperature <= 0.0:
                    idx, vals = idx[:1], vals[:1]
                else:
                    # a tiny temperature sends the others to -inf: weight 0, as it should
                    with np.errstate(over="ignore"):
                        vals = (vals - vals[0]) / p.temperature
            elif name == "infill":
                sort()
                idx, vals = self._infill(idx, vals)
                ordered = False  # merged-away end-of-generation tokens keep a -inf logit
        if idx is None:
            idx, vals = np.arange(lg.size), lg.astype(np.float64)
        w = _softmax(vals)
        return int(idx[self.rng.choice(len(idx), p=w)])

    def _infill(self, idx: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """llama.cpp's infill sampler (module docstring) over candidates sorted by descending
        logit; returns the kept ones (logits of merged-away ones -inf)."""
        voc = self.vocab
        assert voc is not None
        probs = _softmax(vals)
        eog = np.array([int(i) in voc.eog_ids for i in idx], dtype=bool)
        p_eog, p_txt = float(probs[eog].sum()), float(probs[~eog].sum())
        if 3.0 * p_eog * idx.size > p_txt:  # the gap is probably filled: end it
            return idx[eog], vals[eog]
        pieces = [voc.token_to_piece(int(i), special=False) for i in idx]
        p = probs.tolist()
        vals = vals.copy()
        alive = [True] * idx.size
        for a in range(idx.size):
            pa = pieces[a]
            if not pa:
                continue
            for b in range(idx.size):
                if not alive[a]:
                    break
                if a == b or not alive[b] or not pieces[b].startswith(pa):
                    continue
                dst, src = (b, a) if p[b] > p[a] else (a, b)
                p[dst] += p[src]
                p[src] = 0.0
                vals[src] = -np.inf
                alive[src] = False
        pr = np.asarray(p)
        keep = (pr >= 0.2) | eog
        n_txt = int((keep & ~eog).sum())
        if n_txt == 0:
            eot = voc.eot_id if voc.eot_id is not None else voc.eos_id
            return np.array([eot if eot is not None else int(idx[0])]), np.array([1.0])
        pr = np.where(keep, pr, 0.0)
        pr /= pr.sum()
        keep &= (pr >= 1.0 / (n_txt + 1)) | eog
        return idx[keep], vals[keep]


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
