"""``pyminfer bench`` (llama-bench style) on the CPU with SmolLM2: every output format, the depth,
verify-curve and speculative modes, and its argument errors. Timings are only checked for being
positive and finite (speed claims live in docs/perf.md, never in tests)."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys

import pytest


def bench(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "pyminfer", "bench", "--device", "cpu", "-t", "2", *args],
                         capture_output=True, text=True, timeout=600)
    if ok:
        assert out.returncode == 0, out.stderr
    return out


def test_pp_tg_json(smol_path):
    rows = json.loads(bench("-m", str(smol_path), "-p", "16", "-n", "4", "-r", "2", "-o", "json").stdout)
    assert [r["test"] for r in rows] == ["pp16", "tg4"]
    for r in rows:
        assert r["model"] == smol_path.name and r["device"] == "cpu" and r["reps"] == 2
        assert r["mean"] > 0 and math.isfinite(r["mean"]) and r["stddev"] >= 0
        assert r["tok_s"].startswith(f"{r['mean']:.2f} ± ")
        assert r["size_GiB"] > 0.05
    assert rows[1]["roofline"].endswith("GB/s")


def test_csv_and_markdown(smol_path):
    """csv / json rows carry llama-bench's numeric fields (n_prompt, n_gen, n_depth, avg_ts,
    stddev_ts) beside the display string tok_s; the markdown table leaves them out."""
    out = bench("-m", str(smol_path), "-p", "0", "-n", "2", "-r", "1", "-o", "csv").stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 1 and rows[0]["test"] == "tg2" and float(rows[0]["mean"]) > 0
    assert (rows[0]["n_prompt"], rows[0]["n_gen"], rows[0]["n_depth"]) == ("0", "2", "0")
    assert float(rows[0]["avg_ts"]) == pytest.approx(float(rows[0]["mean"]), rel=1e-3)
    js = json.loads(bench("-m", str(smol_path), "-p", "8", "-n", "0", "-r", "2", "-d", "4", "-o", "json").stdout)
    assert len(js) == 1 and (js[0]["n_prompt"], js[0]["n_gen"], js[0]["n_depth"]) == (8, 0, 4)
    assert js[0]["avg_ts"] == js[0]["mean"] > 0 and js[0]["stddev_ts"] == js[0]["stddev"] >= 0
    md = bench("-m", str(smol_path), "-p", "8", "-n", "0", "-r", "1").stdout.splitlines()
    assert md[0].startswith("| model |") and md[1].startswith("|---|") and "pp8" in md[2]
    assert "avg_ts" not in md[0] and "n_prompt" not in md[0]


@pytest.mark.parametrize("flag", ["-d", "--n-depth", "--depth"])
def test_depth(smol_path, flag):
    """-d comes before both tests, as llama-bench's (pp8 @ d40 prefills positions 40..47), and
    counts against -c for both."""
    rows = json.loads(bench("-m", str(smol_path), "-p", "8", "-n", "2", "-r", "1", flag, "40", "-o", "json").stdout)
    assert [r["test"] for r in rows] == ["pp8 @ d40", "tg2 @ d40"] and all(r["mean"] > 0 for r in rows)
    small = bench("-m", str(smol_path), "-p", "30", "-n", "2", "-r", "1", flag, "40", "-c", "64", ok=False)
    assert small.returncode == 1 and "-c 64 is too small for these tests (they need 86 positions)" in small.stderr
    # -c 0: the trained context (8,192 for SmolLM2), checked once it is known
    trained = bench("-m", str(smol_path), "-p", "9000", "-n", "0", "-r", "1", flag, "40", "-c", "0", ok=False)
    assert trained.returncode == 1 and "-c 0: the trained context (8192) is too small" in trained.stderr


def test_comma_lists(smol_path):
    """-p, -n and -d take llama-bench's comma lists: a pp / tg test for each value, every test at
    each depth (in llama-bench's order), one model load; a list where one value is wanted, or a bad
    list, is an error."""
    rows = json.loads(bench("-m", str(smol_path), "-p", "8,16", "-n", "2,3", "-d", "0,20", "-r", "1",
                            "-o", "json").stdout)
    assert [r["test"] for r in rows] == ["pp8", "pp16", "tg2", "tg3", "pp8 @ d20", "pp16 @ d20", "tg2 @ d20",
                                         "tg3 @ d20"]
    assert all(r["mean"] > 0 for r in rows)
    small = bench("-m", str(smol_path), "-p", "8,30", "-n", "2", "-d", "0,40", "-c", "64", "-r", "1", ok=False)
    assert small.returncode == 1 and "-c 64 is too small for these tests (they need 86 positions)" in small.stderr
    bad = bench("-m", str(smol_path), "-p", "8,x", ok=False)
    assert bad.returncode == 2 and "comma-separated list" in bad.stderr
    one = bench("-m", str(smol_path), "--verify-curve", "-d", "0,32", ok=False)
    assert one.returncode == 1 and "-n and -d take one value with --verify-curve" in one.stderr
    for spec in (["--spec-draft", str(smol_path)], ["--spec-type", "ngram-simple"]):  # the curve was dropped silently
        both = bench("-m", str(smol_path), "--verify-curve", *spec, ok=False)
        assert both.returncode == 1 and "are separate bench modes" in both.stderr, both.stderr


def test_verify_curve(smol_path):
    out = bench("-m", str(smol_path), "--verify-curve", "-o", "json")
    assert "warning" not in out.stderr  # -p not given: nothing ignored
    rows = json.loads(out.stdout)
    assert [r["nt"] for r in rows] == list(range(1, 17))
    warned = bench("-m", str(smol_path), "--verify-curve", "-p", "64", "-o", "json")  # no pp row: say so
    assert "warning: -p ignored with --verify-curve" in warned.stderr
    assert rows[0]["C_T(nt)/C_T(1)"] == 1.0
    assert all(r["ms"] > 0 and math.isfinite(r["C_T(nt)/C_T(1)"]) for r in rows)
    assert {r["depth"] for r in rows} == {256}


def test_verify_curve_at_depth(smol_path):
    """-d moves the curve: the forwards follow that many context tokens (a verify batch at long
    context), and -c must hold them."""
    rows = json.loads(bench("-m", str(smol_path), "--verify-curve", "-d", "300", "-o", "json").stdout)
    assert {r["depth"] for r in rows} == {300} and [r["nt"] for r in rows] == list(range(1, 17))
    small = bench("-m", str(smol_path), "--verify-curve", "-d", "300", "-c", "300", ok=False)
    assert small.returncode != 0 and "-c 300 is too small" in small.stderr
    # -p / -n are not run with --verify-curve: their defaults (512 / 128) do not count against -c
    rows = json.loads(bench("-m", str(smol_path), "--verify-curve", "-d", "32", "-c", "64", "-o", "json").stdout)
    assert {r["depth"] for r in rows} == {32}
    # -d 0 is a depth like any other (it used to mean "not given": the curve ran at 256)
    rows = json.loads(bench("-m", str(smol_path), "--verify-curve", "-d", "0", "-c", "64", "-o", "json").stdout)
    assert {r["depth"] for r in rows} == {0}
    # the speculative bench's own verify curve (depth 256, 9 rows) is counted: a clear error, not
    # one from the core about positions past n_ctx
    small = bench("-m", str(smol_path), "--spec-draft", str(smol_path), "-n", "8", "-c", "128", ok=False)
    assert small.returncode == 1 and "-c 128 is too small for these tests (they need 281 positions)" in small.stderr


def test_spec_draft(smol_path):
    """SmolLM2 drafting for itself: every draft is accepted, and the bench's identity check (the
    speculative ids equal the sequential ones) prints no warning."""
    out = bench("-m", str(smol_path), "--spec-draft", str(smol_path), "--spec-draft-n", "3", "-n", "12", "-r", "1",
                "-o", "json", "--n-prompt", "32")
    assert "WARNING" not in out.stderr
    assert "warning: --n-prompt ignored with --spec-draft / --spec-type" in out.stderr  # it has no pp test
    rows = json.loads(out.stdout)
    assert {r["prompt"] for r in rows} == {"code", "prose"} and len(rows) == 4
    for r in rows:
        # d = 3 but the last round drafts no more than the -n budget needs
        assert r["acceptance"] == 1.0 and 2.0 < r["mean_depth"] <= 3.0
        assert r["seq_tok_s"] > 0 and r["spec_tok_s"] > 0 and r["predicted_spec_tok_s"] > 0
        assert set(int(x.split(":")[0]) for x in r["depths"].split()) <= {1, 2, 3}


@pytest.mark.parametrize("args,msg", [(["-r", "0"], "repetitions"), (["-p", "0", "-n", "0"], "nothing to measure"),
                                      (["-d", "-1"], "must be >= 0"), (["--spec-draft-n", "9", "--spec-draft", "x"],
                                                                       "spec-draft-n")])
def test_bad_arguments(smol_path, args, msg):
    out = bench("-m", str(smol_path), *args, ok=False)
    assert out.returncode == 1 and msg in out.stderr and "Traceback" not in out.stderr


def test_replay_adaptive_script_runs():
    """bench/replay_adaptive.py (the CPU replay of the adaptive controller) runs on its defaults: its
    cost curve must cover every verify width MAX_DEPTH allows (it refused to run when MAX_DEPTH grew)."""
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "bench" / "replay_adaptive.py"
    out = subprocess.run([sys.executable, str(script), "--repeat", "1", "--start", "4,2", "--hysteresis", "0.05"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("| code") or ln.startswith("| prose")]
    assert len(lines) == 4 and all(ln.count("adaptive") == 0 and ln.count("(d=") == 2 for ln in lines)


def test_host_overhead_script_runs():
    """bench/host_overhead.py (host work per token of the decode loops, with stub models) runs: its
    stubs must stand in for whatever the loops read of a model (the end-of-generation ids broke it)."""
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "bench" / "host_overhead.py"
    out = subprocess.run([sys.executable, str(script), "--tokens", "100"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "plain" in out.stdout and "mean depth" in out.stdout, out.stdout


def test_ngram_replay_script_runs():
    """bench/ngram_replay.py (the CPU replay of the draft sources, adaptive depth included) runs with
    its noise and exploration options and prints both category totals; without noise, one seed and
    several give the same figures (the noise is the only thing the seeds change)."""
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "bench" / "ngram_replay.py"

    def totals(*args: str) -> list[str]:
        out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return [ln for ln in out.stdout.splitlines() if ln.startswith("| all ")]

    t = totals("--explore", "0", "--jitter", "0.03", "--seeds", "2")
    assert len(t) == 2 and all(ln.count("|") == 8 for ln in t), t
    assert totals("--seeds", "1") == totals("--seeds", "3")
    # --p-min stops draft-model rounds early (the draft columns move; the n-gram-alone column does not)
    base, early = totals(), totals("--p-min", "0.6")
    assert [ln.split("|")[3] for ln in base] != [ln.split("|")[3] for ln in early], (base, early)
    assert [ln.split("|")[4] for ln in base] == [ln.split("|")[4] for ln in early], (base, early)
