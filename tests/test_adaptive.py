"""Adaptive draft depth (pyminfer.spec.AdaptiveDepth) in a simulated speculative loop.

The simulated pair has the costs measured on the H200 with the real pair (docs/perf.md: the
1.5B target's C_T(nt) curve, a 0.77 ms 0.5B draft step) and i.i.d. acceptance p per draft
position, plus a per-round host remainder outside the draft and verify calls (0.16 ms: what the
H200 rounds at d ~ 1 took beyond their draft + verify time). A controller that ignores that
remainder settles on d = 1 at p = 0.95 (96% of the best fixed depth, d = 3) -- the first
controller did, on the H200 -- so the bound here is 98%. It must also fall back to plain
decoding (d = 0) when drafting cannot pay.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from pyminfer.spec import MAX_DEPTH, AdaptiveDepth

C_T1 = 1.183e-3
CURVE = [1.0, 1.108, 1.248, 1.400, 1.552, 1.716, 1.858, 1.999, 2.141]  # C_T(nt) / C_T(1), nt = 1..9 (9: +0.142 extrapolated)
C_D = 0.77e-3
REM_ROUND, REM_TOKEN = 0.16e-3, 0.03e-3


def simulate(p: float, depth: int | None, n_tokens: int = 3000, seed: int = 0,
             slow: float = 1.0, slow_round: int = 0) -> tuple[float, list[int]]:
    """Tokens per second of a run at fixed ``depth`` (None: adaptive), and the depths used.
    ``slow``: round number ``slow_round``'s costs are that many times their usual (a hiccup)."""
    rng = random.Random(seed)
    ctl = AdaptiveDepth() if depth is None else None
    t = 0.0
    tokens = 0
    last = None
    used = []
    while tokens < n_tokens:
        if ctl and last:
            ctl.update(*last)
        d = ctl.choose() if ctl else depth
        used.append(d)
        a = 0
        while a < d and rng.random() < p:
            a += 1
        jitter = (1.0 + 0.03 * (2 * rng.random() - 1)) * (slow if len(used) == slow_round + 1 else 1.0)
        draft_s = d * C_D * jitter
        verify_s = C_T1 * CURVE[d] * jitter
        round_s = draft_s + verify_s + REM_ROUND + (a + 1) * REM_TOKEN
        last = (d, a, draft_s, verify_s, round_s)
        t += round_s
        tokens += a + 1
    return tokens / t, used


@pytest.mark.parametrize("p", [0.95, 0.9, 0.8, 0.65])
def test_adaptive_close_to_best_fixed_depth(p):
    best_d, best = max(((d, simulate(p, d)[0]) for d in range(MAX_DEPTH + 1)), key=lambda x: x[1])
    got, used = simulate(p, None)
    assert got >= 0.98 * best, (p, best_d, best, got, used[-20:])


@pytest.mark.parametrize("p", [0.3, 0.5])
def test_adaptive_falls_back_to_plain_decoding(p):
    plain = simulate(p, 0)[0]
    got, used = simulate(p, None)
    assert got >= 0.97 * plain, (p, plain, got, used[-20:])
    assert used[-100:].count(0) >= 90  # settles on d = 0


def test_first_rounds_measure_plain_then_start():
    ctl = AdaptiveDepth(start=3)
    assert ctl.choose() == 0
    ctl.update(0, 0, 0.0, 1e-3, 1.1e-3)
    assert ctl.choose() == 3
    ctl.update(3, 0, 3e-3, 1.4e-3, 4.5e-3)  # rejected at once and slow: still tried a second time
    assert ctl.choose() == 3


@pytest.mark.parametrize("p,slow_round", [(0.3, 0), (0.95, 0), (0.95, 1), (0.8, 1)])
def test_one_slow_round_does_not_lock_out_a_depth(p, slow_round):
    """One early round taking 20x (the first, at d = 0) or 2x (the second, the first that drafts)
    its usual cost must not price plain decoding, or drafting, out for good."""
    best = max(simulate(p, d)[0] for d in range(MAX_DEPTH + 1))
    got, used = simulate(p, None, slow=20.0 if slow_round == 0 else 2.0, slow_round=slow_round)
    assert got >= 0.97 * best, (p, best, got, used[:30])
    if p < 0.5:
        assert used[-100:].count(0) >= 90


def test_hysteresis_knob(monkeypatch):
    from pyminfer.spec import adaptive_hysteresis

    monkeypatch.delenv("PYMINFER_ADAPTIVE_HYSTERESIS", raising=False)
    assert adaptive_hysteresis() == 0.05
    monkeypatch.setenv("PYMINFER_ADAPTIVE_HYSTERESIS", "0.02")
    assert adaptive_hysteresis() == 0.02
    for bad in ("x", "-0.1", "1.5", "nan"):
        monkeypatch.setenv("PYMINFER_ADAPTIVE_HYSTERESIS", bad)
        with pytest.raises(ValueError, match="PYMINFER_ADAPTIVE_HYSTERESIS"):
            adaptive_hysteresis()


@pytest.mark.parametrize("p", [0.95, 0.9, 0.65])
def test_lower_hysteresis_still_close_to_best(p, monkeypatch):
    """The A/B value planned for the H200 (0.02) keeps the simulated bounds."""
    best = max(simulate(p, d)[0] for d in range(MAX_DEPTH + 1))
    orig = AdaptiveDepth.__init__

    def init(self, *a, **kw):
        kw["hysteresis"] = 0.02
        orig(self, *a, **kw)

    monkeypatch.setattr(AdaptiveDepth, "__init__", init)
    got, used = simulate(p, None)
    assert got >= 0.98 * best, (p, best, got, used[-20:])



def _run_rounds(ctl: AdaptiveDepth | None, depth: int, n_rounds: int, accept: Callable[[int, int, int], float],
                rng: random.Random, c_d: float = C_D, jitter: float = 0.0,
                count_from: int = 0) -> tuple[float, list[int]]:
    """Tokens per second over rounds ``count_from``.. of a run of ``n_rounds`` rounds, adaptive under
    ``ctl`` or at fixed ``depth`` where ctl is None, and the depths used. ``accept(r, i, k)``: the
    conditional acceptance of draft position i + 1 in round r, the k-th round that drafted (0: the
    draft is wrong, and no random number is drawn for it). ``jitter``: +- relative noise on each
    round's draft and verify costs (0: none, and no random number drawn)."""
    t, tokens, last, used, drafted = 0.0, 0, None, [], 0
    for r in range(n_rounds):
        if ctl and last:
            ctl.update(*last)
        d = ctl.choose() if ctl else depth
        used.append(d)
        drafted += d > 0
        a = 0
        while a < d and (q := accept(r, a, drafted)) > 0 and rng.random() < q:
            a += 1
        j = 1.0 + jitter * (2 * rng.random() - 1) if jitter else 1.0
        draft_s, verify_s = d * c_d * j, C_T1 * CURVE[d] * j
        round_s = draft_s + verify_s + REM_ROUND + (a + 1) * REM_TOKEN
        last = (d, a, draft_s, verify_s, round_s)
        if r >= count_from:
            t += round_s
            tokens += a + 1
    return tokens / t, used


def _simulate_shift(probe_min: int | None, depth: int = 0, n_rounds: int = 1500, shift: int = 300,
                    c_d: float = 0.45e-3, seed: int = 1) -> tuple[float, list[int]]:
    """Tokens per second after round ``shift`` of a run (adaptive with ``probe_min``, or at fixed
    ``depth`` where probe_min is None) whose conditional acceptance is 0.9 at draft position 1 and
    0.2 beyond it for the first ``shift`` rounds, then 0.95 everywhere (a reply that turns
    predictable); a draft step of ``c_d`` seconds (cheap enough that depths >= 3 pay clearly)."""
    ctl = AdaptiveDepth(probe_min=probe_min) if probe_min is not None else None
    return _run_rounds(ctl, depth, n_rounds, lambda r, i, k: 0.95 if r >= shift else 0.9 if i == 0 else 0.2,
                       random.Random(seed), c_d=c_d, count_from=shift)


def test_probing_finds_depths_that_became_worth_it():
    """At d = 1 the controller observes only draft position 1; without probes it keeps the low
    acceptance it once saw at position 2 forever (the H200's sort prompt, session 15). A probe
    round at d + 1 every probe_min..probe_max rounds finds the change."""
    best = max(_simulate_shift(None, depth=d)[0] for d in range(MAX_DEPTH + 1))
    stuck, used0 = _simulate_shift(probe_min=0)
    assert used0[-200:].count(1) == 200, used0[-40:]  # the failure mode probing exists for
    got, used = _simulate_shift(probe_min=16)
    assert got >= 0.95 * best and got > 1.1 * stuck, (got, best, stuck, used[-40:])
    assert min(used[-200:]) >= 2, used[-40:]


def test_probe_knob(monkeypatch):
    from pyminfer.spec import adaptive_probe

    monkeypatch.delenv("PYMINFER_ADAPTIVE_PROBE", raising=False)
    assert adaptive_probe() == 16
    monkeypatch.setenv("PYMINFER_ADAPTIVE_PROBE", "0")
    assert adaptive_probe() == 0
    for bad in ("x", "-1", "1.5"):
        monkeypatch.setenv("PYMINFER_ADAPTIVE_PROBE", bad)
        with pytest.raises(ValueError, match="PYMINFER_ADAPTIVE_PROBE"):
            adaptive_probe()


def test_first_draft_step_priced_apart_from_the_rest():
    """A round's first draft step also feeds the draft what the last round committed, so a depth
    not run yet is priced as first + (d - 1) x later steps, not d x the mean step of the rounds seen."""
    ctl = AdaptiveDepth()
    ctl.update(0, 0, 0.0, 1.0e-3, 1.1e-3)
    ctl.update(2, 1, 1.3e-3, 1.2e-3, 2.6e-3, first_s=0.7e-3)  # first step 0.7 ms, the second 0.6 ms
    rem = sorted(ctl.remainder)[len(ctl.remainder) // 2]
    cv = ctl.verify_table()
    assert ctl.round_seconds(5) == pytest.approx(cv[6] + 0.7e-3 + 4 * 0.6e-3 + rem)
    lumped = AdaptiveDepth()
    lumped.update(0, 0, 0.0, 1.0e-3, 1.1e-3)
    lumped.update(2, 1, 1.3e-3, 1.2e-3, 2.6e-3)  # first_s unknown: every step at the mean, 0.65 ms
    assert lumped.round_seconds(5) == pytest.approx(cv[6] + 5 * 0.65e-3 + rem)


def _simulate_unlucky_start(explore_min: int | None, depth: int = 0, n_rounds: int = 400, seed: int = 2,
                            p: float = 0.93) -> tuple[float, list[int]]:
    """Tokens per second of a run (adaptive with ``explore_min``, or at fixed ``depth`` where
    explore_min is None) whose first two drafting rounds are rejected at draft position 1 and
    whose acceptance is ``p`` at every position after that (the real pair's C, Rust, French and
    German replies: an early miss, then 90-95%)."""
    ctl = AdaptiveDepth(explore_min=explore_min) if explore_min is not None else None
    return _run_rounds(ctl, depth, n_rounds, lambda r, i, k: p if k > 2 else 0.0, random.Random(seed), jitter=0.03)


def test_early_rejections_do_not_end_drafting():
    """Plain decoding (d = 0) observes no acceptance, so choosing it is final: on the evidence of
    the first two drafting rounds alone, two early misses ended drafting for a reply the draft
    predicts at 93% (the failure mode, explore_min = 0). With the default exploration the
    controller keeps drafting and gets within 5% of the best fixed depth."""
    best_d, best = max(((d, _simulate_unlucky_start(None, depth=d)[0]) for d in range(MAX_DEPTH + 1)),
                       key=lambda x: x[1])
    assert best_d >= 2
    stuck, used0 = _simulate_unlucky_start(0)
    assert used0[-100:].count(0) == 100, used0[:20]  # the failure mode exploration exists for
    got, used = _simulate_unlucky_start(AdaptiveDepth().explore_min)
    assert got >= 0.95 * best and got > 1.1 * stuck, (got, best, stuck, used[:40])
    assert min(used[3:]) >= 1, used[:40]


def test_explore_knob(monkeypatch):
    from pyminfer.spec import adaptive_explore

    monkeypatch.delenv("PYMINFER_ADAPTIVE_EXPLORE", raising=False)
    assert adaptive_explore() == 12 == AdaptiveDepth().explore_min
    monkeypatch.setenv("PYMINFER_ADAPTIVE_EXPLORE", "0")
    assert adaptive_explore() == 0
    monkeypatch.setenv("PYMINFER_ADAPTIVE_EXPLORE", "")
    assert adaptive_explore() == 12
    for bad in ("x", "-1", "1.5", "\u00b2"):  # (a superscript two passes str.isdigit but not int())
        monkeypatch.setenv("PYMINFER_ADAPTIVE_EXPLORE", bad)
        with pytest.raises(ValueError, match="PYMINFER_ADAPTIVE_EXPLORE"):
            adaptive_explore()


def test_exploration_skipped_where_drafting_cannot_pay():
    """Where a verify row costs about a whole forward (a CPU with few cores), no depth beats plain
    decoding even with every draft accepted: the controller goes to d = 0 as it did before
    exploration existed (explore_min = 0), instead of drafting explore_min rounds at a loss."""
    def run(verify_per_row: float, explore_min: int = AdaptiveDepth().explore_min) -> list[int]:
        ctl = AdaptiveDepth(start=2, explore_min=explore_min)
        used = []
        for _ in range(12):
            d = ctl.choose()
            used.append(d)
            draft_s, verify_s = d * 0.4e-3, 1e-3 * (1 + verify_per_row * d)
            ctl.update(d, d, draft_s, verify_s, draft_s + verify_s + 0.05e-3, first_s=0.4e-3 if d else None)
        return used

    cpu = run(1.0)
    assert cpu == run(1.0, explore_min=0) and cpu[-6:] == [0] * 6, cpu
    gpu = run(0.12)  # every draft accepted and cheap verify rows: drafting pays, no d = 0
    assert min(gpu[1:]) >= 1, gpu


def test_exploration_drafts_at_depth_one():
    """Exploring runs the cheapest drafting round, d = 1 (not the start depth or the best drafting
    depth), exactly until explore_min rounds have drafted (the two start rounds count), then plain
    decoding where the draft is never right."""
    ctl = AdaptiveDepth(start=4)
    used = []
    for _ in range(24):
        d = ctl.choose()
        used.append(d)
        draft_s, verify_s = d * 0.4e-3, 1e-3 * (1 + 0.12 * d)
        ctl.update(d, 0, draft_s, verify_s, draft_s + verify_s + 0.05e-3, first_s=0.4e-3 if d else None)
    n = ctl.explore_min - 2
    assert used == [0, 4, 4] + [1] * n + [0] * (24 - 3 - n), used


def test_drafting_can_pay_prices_unmeasured_widths_on_the_steepest_slope():
    """Unmeasured verify widths are priced on the steepest per-row slope measured from nt = 1, so one
    cheap-looking width cannot make deep rounds look profitable. Here nt = 2 measured 0.2 ms a row
    above nt = 1 and nt = 3 1.0 ms a row; the first draft step costs 0.9 ms, later ones 0.1 ms: on the
    shallow slope d = 8 would pay (9 tokens in 4.2 ms against 1 in 1 ms), on the steep one no depth does."""
    def ctl_with(verify_nt3: float) -> AdaptiveDepth:
        ctl = AdaptiveDepth()
        ctl.update(0, 0, 0.0, 1.0e-3, 1.0e-3)
        ctl.update(1, 1, 0.9e-3, 1.2e-3, 2.1e-3, first_s=0.9e-3)
        ctl.update(2, 2, 1.0e-3, verify_nt3, 1.0e-3 + verify_nt3, first_s=0.9e-3)
        return ctl

    assert not ctl_with(3.0e-3).drafting_can_pay(1000.0)
    assert ctl_with(1.4e-3).drafting_can_pay(1000.0)  # both slopes 0.2 ms: d = 8 pays


@pytest.mark.parametrize("max_depth", [0, 1, 3])
def test_depths_stay_within_max_depth(max_depth):
    """No round, exploration included, runs deeper than max_depth (a batch of -ub 1 allows no draft:
    max_depth 0; exploration's d = 1 once broke that, failing the verify forward)."""
    ctl = AdaptiveDepth(max_depth=max_depth, start=max(min(4, max_depth), 1))
    for r in range(40):
        d = ctl.choose()
        assert 0 <= d <= max_depth, (r, d, ctl.history)
        ctl.update(d, 0, d * 0.6e-3, 1e-3 * (1 + 0.1 * d), 1.1e-3 + d * 0.7e-3, first_s=0.6e-3 if d else None)
