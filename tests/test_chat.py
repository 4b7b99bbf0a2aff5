"""``pyminfer chat``: the session's KV-cache reuse (in process) and the terminal loop through a
pseudo-terminal (pexpect): two turns, Ctrl-C, /clear, /exit."""

from __future__ import annotations

import re
import signal
import sys

import pytest

from pyminfer.chat import ChatSession, common_prefix
from pyminfer.engine import Model
from pyminfer.generate import generate
from pyminfer.models import ensure_model
from pyminfer.sampling import SamplingParams

MODEL = "smollm2-135m"
STATS = re.compile(r"\[(\d+) tok, [\d.]+ tok/s \| prompt (\d+) tok \((\d+) cached[^\]]*\]")


@pytest.fixture(scope="module")
def model():
    with Model(ensure_model(MODEL, progress=False), device="cpu", n_ctx=512) as m:
        yield m


def _reply(session: ChatSession, text: str):
    for _ in session.send(text):
        pass
    return session.finish_turn()


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_second_turn_reuses_cache_and_matches_fresh(model):
    s = ChatSession(model, params=SamplingParams(temperature=0), max_tokens=6)
    r1 = _reply(s, "What is the capital of France?")
    assert r1 is not None and r1.generated_ids
    seq1 = r1.prompt_ids + r1.generated_ids
    r2 = _reply(s, "And of Germany?")
    # the second prompt continues the first prompt + reply, so only the new message is prefilled
    n_keep = len(r1.prompt_ids) + len(r1.generated_ids) - 1
    assert r2.prompt_ids[:n_keep] == seq1[:n_keep]
    assert r2.timings["prefill_tokens"] == len(r2.prompt_ids) - n_keep
    # ... and the answer equals a generation from an empty cache on the same prompt
    fresh = generate(model, r2.prompt_ids, SamplingParams(temperature=0), 6)
    assert fresh.generated_ids == r2.generated_ids
    assert [m["role"] for m in s.messages] == ["user", "assistant", "user", "assistant"]
    s.clear()
    assert s.messages == [] and s.cache_ids == []
    r3 = _reply(s, "What is the capital of France?")
    assert r3.generated_ids == r1.generated_ids


@pytest.mark.parametrize("n_chunks", [1, 6])
def test_system_message_and_stop_early(model, n_chunks):
    s = ChatSession(model, params=SamplingParams(temperature=0), max_tokens=50, system="Answer briefly.")
    it = s.send("Tell me a story.")
    cut = []
    for _ in range(n_chunks):
        cut += next(it).token_ids
    it.close()  # what Ctrl-C does: the reply stops, the session stays usable
    first_prompt = list(s._turn.prompt)
    assert s.finish_turn() is None
    assert s.messages[0] == {"role": "system", "content": "Answer briefly."}
    assert s.messages[-1]["role"] == "assistant"
    r = _reply(s, "Thanks!")
    assert r is not None and r.timings["prefill_tokens"] < len(r.prompt_ids)
    if n_chunks > 1:  # the cut reply's cached tokens are reused too, not only the first prompt
        assert len(r.prompt_ids) - r.timings["prefill_tokens"] > len(first_prompt)
        assert r.prompt_ids[:len(first_prompt) + 1] == first_prompt + cut[:1]
    # and what was reused is right: the answer equals a generation from an empty cache
    assert generate(model, r.prompt_ids, SamplingParams(temperature=0), 50).generated_ids == r.generated_ids


def test_chat_terminal():
    pexpect = pytest.importorskip("pexpect")
    ensure_model(MODEL, progress=False)
    # SIGINT back to its default in the child: a test run started in the background (`cmd &` in a
    # non-interactive shell, nohup) inherits it ignored, and Python then keeps ignoring Ctrl-C
    c = pexpect.spawn(sys.executable, ["-m", "pyminfer", "chat", "-m", MODEL, "--device", "cpu", "-c", "512",
                                       "--temp", "0", "-n", "300"], encoding="utf-8", timeout=120,
                      dimensions=(40, 200), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        c.expect_exact("> ")
        c.sendline("What is the capital of France? One word.")
        c.expect(STATS)
        assert int(c.match.group(3)) == 0
        c.expect_exact("> ")
        c.sendline("And of Germany? One word.")
        c.expect(STATS)
        n_prompt, n_cached = int(c.match.group(2)), int(c.match.group(3))
        assert 0 < n_cached < n_prompt  # the first turn stayed in the KV cache
        c.expect_exact("> ")
        # Ctrl-C stops a long reply and keeps the session
        c.sendline("Write a very long story about a dragon and a knight.")
        c.expect_exact("knight.\r\n")  # the echo of the input line
        c.expect(r"\w+ \w+ \w+")  # some of the reply is out
        c.sendintr()
        c.expect(r"\[[^\]]*interrupted\]")
        c.expect_exact("> ")
        c.sendline("/clear")
        c.expect_exact("(conversation cleared)")
        c.expect_exact("> ")
        c.sendline("Hi!")
        c.expect(STATS)
        assert int(c.match.group(3)) == 0  # a cleared conversation starts from nothing
        c.expect_exact("> ")
        c.sendline("/exit")
        c.expect(pexpect.EOF)
    finally:
        c.close(force=True)
    assert c.exitstatus == 0


def test_speculative_session(model):
    with Model(ensure_model(MODEL, progress=False), device="cpu", n_ctx=512) as draft:
        s = ChatSession(model, draft, params=SamplingParams(temperature=0), max_tokens=6, spec_draft_n=3)
        r1 = _reply(s, "What is the capital of France?")
        r2 = _reply(s, "And of Germany?")
        assert r1.spec is not None and r2.spec is not None and r2.spec["drafted"] > 0
        fresh = generate(model, r2.prompt_ids, SamplingParams(temperature=0), 6)
        assert fresh.generated_ids == r2.generated_ids


def _cli(*args: str, stdin: str = "") -> "subprocess.CompletedProcess[str]":
    import subprocess

    return subprocess.run([sys.executable, "-m", "pyminfer", *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def test_system_prompt_longer_than_the_context_is_refused_at_start():
    """Every turn carries the system prompt and /clear keeps it: a context too small for it is an
    error before the first line is read (it used to answer every line with the same error)."""
    ensure_model(MODEL, progress=False)
    out = _cli("chat", "-m", MODEL, "--device", "cpu", "-c", "16", "--system", "word " * 200, stdin="hi\n")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert re.search(r"--system needs \d+ tokens in the chat template, the context holds n_ctx=16", out.stderr)


def test_unknown_command_is_not_a_message_and_stats_add_up():
    """A mistyped /command is refused with the help (it went to the model as a user message); a
    line starting with a space and / is a message (" /exit" too: commands start the line); the stats' cached + new tokens are the prompt's
    (an n_past the generation clamps to the prompt length - 1 was printed unclamped)."""
    ensure_model(MODEL, progress=False)
    out = _cli("chat", "-m", MODEL, "--device", "cpu", "-c", "256", "--temp", "0", "-n", "4",
               stdin="/exti\n /usr/bin is a path\n /foo\nHi\n /exit\nHello\n")
    assert out.returncode == 0, out.stderr
    assert "unknown command /exti" in out.stderr and "/help" in out.stderr
    stats = [re.search(r"prompt (\d+) tok \((\d+) cached, (\d+) new", line) for line in out.stderr.splitlines()]
    stats = [tuple(int(g) for g in m.groups()) for m in stats if m]
    # " /usr/bin ...", " /foo", "Hi", " /exit" (a leading space: a message, not the command) and "Hello"
    assert len(stats) == 5, out.stderr
    for n_prompt, cached, new in stats:
        assert cached + new == n_prompt, stats
    assert stats[0][1] == 0 and stats[1][1] > 0


def test_n_predict_minus_one_runs_to_the_end_of_the_context():
    """-n -1 as llama.cpp: no limit but the context (the run stops there with the reason)."""
    ensure_model(MODEL, progress=False)
    out = _cli("run", "-m", MODEL, "--device", "cpu", "-c", "24", "-n", "-1", "--temp", "0",
               "-p", "Once upon a time", "--json")
    assert out.returncode == 0, out.stderr
    import json

    res = json.loads(out.stdout)
    assert res["finish_reason"] == "length" and res["stop_reason"] == "context", res
    # a one-token prompt leaves room for n_ctx tokens (the last needs no position): -1 must not be
    # n_ctx there, or the run ends as 'max_tokens' at the same token
    out = _cli("run", "-m", MODEL, "--device", "cpu", "-c", "16", "-n", "-1", "--temp", "0", "-p", "Hi", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["stop_reason"] == "context" and len(res["generated_ids"]) == 16, res
    out = _cli("run", "-m", MODEL, "--device", "cpu", "-n", "-2", "-p", "hi")
    assert out.returncode == 1 and "must be >= -1" in out.stderr


def test_run_reports_the_seed_it_drew():
    """`run` without --seed at a temperature above 0 names the seed it drew (stats line and --json's
    seed, as llama-cli logs its sampler seed); --seed with that value repeats the text."""
    import json

    ensure_model(MODEL, progress=False)
    base = ("run", "-m", MODEL, "--device", "cpu", "-c", "64", "-n", "8", "--temp", "1.5", "--top-k", "0",
            "-p", "Once upon a time")
    out = _cli(*base)
    assert out.returncode == 0, out.stderr
    seed = int(re.search(r"\| seed (\d+)", out.stderr).group(1))
    again = _cli(*base, "--seed", str(seed), "--json")
    assert again.returncode == 0, again.stderr
    res = json.loads(again.stdout)
    assert res["seed"] == seed and res["text"] + "\n" == out.stdout
    greedy = _cli("run", "-m", MODEL, "--device", "cpu", "-c", "64", "-n", "2", "--temp", "0", "-p", "Hi")
    assert "seed" not in greedy.stderr  # no draw at temperature 0: nothing to repeat


def test_message_too_long_for_the_context_is_skipped_with_status_1():
    """A message that cannot fit even alone is dropped with a message and the loop goes on (the next
    line is answered), and the exit status is then 1, as for a line that is not UTF-8: a script
    piping lines in sees that one was dropped (it exited 0)."""
    ensure_model(MODEL, progress=False)
    out = _cli("chat", "-m", MODEL, "--device", "cpu", "-c", "64", "-n", "2", "--temp", "0",
               stdin="hello " * 80 + "\nhi\n")
    assert out.returncode == 1, out.stderr
    assert re.search(r"the message needs \d+ tokens; the context holds n_ctx=64", out.stderr), out.stderr
    assert len(STATS.findall(out.stderr)) == 1, out.stderr  # "hi" was still answered
    assert "Traceback" not in out.stderr
    # after an exchange, the long message logged "dropped its 1 oldest exchange" though it was
    # refused and the history kept
    out = _cli("chat", "-m", MODEL, "--device", "cpu", "-c", "64", "-n", "2", "--temp", "0",
               stdin="hi\n" + "hello " * 80 + "\nhi\n")
    assert out.returncode == 1 and len(STATS.findall(out.stderr)) == 2, out.stderr
    assert "dropped its" not in out.stderr, out.stderr
