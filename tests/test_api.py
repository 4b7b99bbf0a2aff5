"""pyminfer.LLM (the Python API) on SmolLM2-135M, CPU, short generations."""

from __future__ import annotations

import pytest

from pyminfer import LLM
from pyminfer.engine import ContextFull
from pyminfer.generate import Chunk, GenerationResult

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llm():
    with LLM("smollm2-135m", device="cpu", n_ctx=256) as m:
        yield m


def test_generate_result(llm):
    r = llm.generate(PROMPT, max_tokens=5, temperature=0, cache_prompt=False)
    assert isinstance(r, GenerationResult)
    assert r.prompt_ids == llm.tokenize(PROMPT)
    assert 1 <= len(r.generated_ids) <= 5
    assert r.finish_reason in ("stop", "length")
    if r.finish_reason == "length":
        assert r.stop_reason == "max_tokens" and len(r.generated_ids) == 5
    assert r.text == llm.detokenize(r.generated_ids, skip_special=True)
    assert "Paris" in r.text
    assert r.timings["prefill_tokens"] == len(r.prompt_ids) and r.timings["cached_tokens"] == 0
    assert r.spec is None


def test_temperature0_deterministic_and_stream_equal(llm):
    a = llm.generate(PROMPT, max_tokens=6, temperature=0)
    b = llm.generate(PROMPT, max_tokens=6, temperature=0, top_k=1, seed=123)
    assert a.generated_ids == b.generated_ids and a.text == b.text
    chunks = list(llm.generate(PROMPT, max_tokens=6, temperature=0, stream=True))
    assert all(isinstance(c, Chunk) for c in chunks)
    assert chunks[-1].result is not None and all(c.result is None for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == a.text
    assert chunks[-1].result.generated_ids == a.generated_ids
    # a prompt given as ids gives the same answer
    c = llm.generate(llm.tokenize(PROMPT), max_tokens=6, temperature=0)
    assert c.generated_ids == a.generated_ids


def test_seeded_sampling_repeats(llm):
    a = llm.generate("Once upon a time", max_tokens=5, temperature=1.0, seed=7)
    b = llm.generate("Once upon a time", max_tokens=5, temperature=1.0, seed=7)
    assert a.generated_ids == b.generated_ids
    assert a.seed == 7 and a.to_json()["seed"] == 7


def test_random_seed_is_reported_and_repeats_the_run(llm):
    """seed None (or negative) draws a seed; the result names it, and given back it repeats the run
    (llama.cpp logs its "sampler seed" for the same reason)."""
    runs = [llm.generate("Once upon a time", max_tokens=12, temperature=1.5, top_k=0, seed=s) for s in (None, -1)]
    for r in runs:
        assert isinstance(r.seed, int) and 0 <= r.seed < 2**32
        again = llm.generate("Once upon a time", max_tokens=12, temperature=1.5, top_k=0, seed=r.seed)
        assert again.generated_ids == r.generated_ids and again.seed == r.seed
    assert runs[0].seed != runs[1].seed  # drawn afresh (equal once in 2^32)


def test_spec_draft_n_without_a_draft_warns():
    """As the CLI's "--spec-draft-n ignored without --spec-draft": a warning, not silence."""
    with pytest.warns(UserWarning, match="spec_draft_n is ignored without draft_model"):
        LLM("smollm2-135m", device="cpu", n_ctx=64, spec_draft_n=3).close()


def test_stop_string(llm):
    full = llm.generate(PROMPT, max_tokens=6, temperature=0)
    assert "." in full.text
    r = llm.generate(PROMPT, max_tokens=6, temperature=0, stop=".")
    assert r.finish_reason == "stop" and r.stop_reason == "stop_string"
    assert r.text == full.text[:full.text.index(".")]


def test_chat_continue_final_message(llm):
    """continue_final_message: the last assistant message is left open (the template's own rendering
    up to where its text goes, then the text as given, trailing space and empty text included) and
    the result is only the continuation."""
    q = {"role": "user", "content": "What is the capital of France?"}
    new_turn = llm.apply_chat_template([q])
    for prefill in ("The capital of France is", "The capital of France is ", ""):
        text = llm.apply_chat_template([q, {"role": "assistant", "content": prefill}], continue_final_message=True)
        assert text == new_turn + prefill
    r = llm.chat([q, {"role": "assistant", "content": "The capital of France is"}], continue_final_message=True,
                 max_tokens=4, temperature=0)
    assert r.prompt_ids == llm.tokenize(new_turn + "The capital of France is")
    assert r.text.startswith(" Paris"), r.text
    # without it, the assistant message is a finished turn and a new one starts
    closed = llm.apply_chat_template([q, {"role": "assistant", "content": "Hi"}])
    assert closed.endswith("Hi<|im_end|>\n<|im_start|>assistant\n")
    from pyminfer.api import MessageError

    with pytest.raises(MessageError, match=r"last message \(messages\[0\]\) must be an assistant message"):
        llm.apply_chat_template([q], continue_final_message=True)
    call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "id": "c1",
                                                                  "function": {"name": "f", "arguments": "{}"}}]}
    with pytest.raises(MessageError, match="no tool_calls"):
        llm.apply_chat_template([q, call], continue_final_message=True)
    with pytest.raises(MessageError, match="both assistant messages"):
        llm.apply_chat_template([q, {"role": "assistant", "content": "A"}, {"role": "assistant", "content": "B"}],
                                continue_final_message=True)
    with pytest.raises(TypeError, match="continue_final_message"):
        llm.chat([q], continue_final_message="yes")


def test_chat(llm):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = llm.chat(msgs, max_tokens=6, temperature=0)
    text = llm.apply_chat_template(msgs)
    assert "<|im_start|>assistant" in text
    assert r.prompt_ids == llm.tokenize(text)
    assert r.text.strip()
    s = "".join(c.text for c in llm.chat(msgs, max_tokens=6, temperature=0, stream=True))
    assert s == r.text
    # OpenAI-style content parts are accepted
    r2 = llm.chat([{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}],
                  max_tokens=6, temperature=0)
    assert r2.generated_ids == r.generated_ids


def test_tokenize_detokenize(llm):
    ids = llm.tokenize("Hello world")
    assert ids == [19556, 905]
    assert llm.detokenize(ids) == "Hello world"
    assert len(llm.tokenize("<|im_start|>")) == 1
    assert len(llm.tokenize("<|im_start|>", parse_special=False)) > 1


def test_negative_max_tokens_is_no_limit():
    """max_tokens=-1 is "no limit" (as None, the CLI's -n -1, the server's n_predict -1 and
    llama-cpp-python): it was a ValueError. The run ends at the full context, as with None."""
    with LLM("smollm2-135m", device="cpu", n_ctx=24) as small:
        a = small.generate("Once upon a time", max_tokens=-1, temperature=0)
        b = small.generate("Once upon a time", max_tokens=None, temperature=0)
        assert a.stop_reason == "context" and a.generated_ids == b.generated_ids
        assert small.generate("Once upon a time", max_tokens=0).generated_ids == []
        with pytest.raises(ValueError, match="max_tokens must be >= -1"):
            small.generate("Once upon a time", max_tokens=-2)


def test_errors(llm):
    with pytest.raises(ValueError):
        llm.generate("", max_tokens=2)
    with pytest.raises(ContextFull):
        llm.generate("hello " * 300, max_tokens=2)
    with pytest.raises(TypeError):
        llm.generate(12345, max_tokens=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        llm.generate([1, 2, 10**9], max_tokens=2)
    with pytest.raises(ValueError):
        llm.generate(PROMPT, max_tokens=2, top_p=2.0)
    with pytest.raises(ValueError):
        llm.detokenize([-1])
    with pytest.raises(ValueError):
        llm.chat([], max_tokens=2)
    for msgs in ([{"role": "user"}], [{"role": "user", "content": None}],
                 [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}]):
        with pytest.raises(ValueError, match=r"content must be a string"):  # as the server: no empty turns
            llm.chat(msgs, max_tokens=2)
    # still usable afterwards
    assert llm.generate(PROMPT, max_tokens=1, temperature=0).generated_ids


def test_stream_in_same_thread_is_refused(llm):
    it = llm.generate(PROMPT, max_tokens=4, temperature=0, stream=True)
    next(it)
    with pytest.raises(RuntimeError):
        llm.generate(PROMPT, max_tokens=1)
    it.close()
    assert llm.generate(PROMPT, max_tokens=1, temperature=0).generated_ids


def test_close_and_context_manager():
    with LLM("smollm2-135m", device="cpu", n_ctx=64) as m:
        assert "smollm2" in repr(m)
        assert m.generate("Hi", max_tokens=1, temperature=0).generated_ids
    assert repr(m) == "LLM(closed)"
    with pytest.raises(RuntimeError):
        m.generate("Hi", max_tokens=1)
    m.close()  # idempotent
    # entering a closed LLM is a use after close too (it used to succeed and fail later)
    with pytest.raises(RuntimeError, match="closed"):
        with m:
            pass


@pytest.mark.parametrize("draft", [None, "smollm2-135m"])
def test_close_with_a_stream_open(draft, monkeypatch):
    """An LLM closed while one of its streams is suspended: the stream's next token is a
    RuntimeError naming the closed model (it was an AttributeError on the freed context, chained
    under the LLM's own error), and closing the abandoned stream afterwards is silent (its cleanup
    read the closed LLM's model and printed 'Exception ignored' at exit); plain and speculative."""
    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    m = LLM("smollm2-135m", draft_model=draft, device="cpu", n_ctx=64, spec_draft_n=2 if draft else None)
    it = m.generate(PROMPT, max_tokens=8, temperature=0, stream=True)
    next(it)
    m.close()
    with pytest.raises(RuntimeError, match="smollm2.* is closed") as e:
        next(it)
    assert e.value.__context__ is None
    m = LLM("smollm2-135m", draft_model=draft, device="cpu", n_ctx=64, spec_draft_n=2 if draft else None)
    it = m.chat([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0, stream=True)
    next(it)
    m.close()
    it.close()  # what the garbage collector does with an abandoned stream
    del it
    assert unraisable == []


@pytest.mark.parametrize("kw,name", [
    ({"temperature": "0"}, "temperature"), ({"temperature": True}, "temperature"), ({"top_p": "0.9"}, "top_p"),
    ({"min_p": None}, "min_p"), ({"repeat_penalty": False}, "repeat_penalty"), ({"top_k": 2.5}, "top_k"),
    ({"top_k": True}, "top_k"), ({"repeat_last_n": "64"}, "repeat_last_n"), ({"seed": 1.0}, "seed"),
    ({"seed": True}, "seed"), ({"max_tokens": 5.0}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
])
def test_argument_types_are_numbers_only(llm, kw, name):
    """float() and int() read "0" as 0.0, True as 1.0 and 2.5 as 2: a mistyped argument became a
    different request; now a TypeError naming the argument."""
    with pytest.raises(TypeError, match=f"^{name} must be"):
        llm.generate(PROMPT, **{"max_tokens": 1, **kw})


def test_flags_are_bools_only(llm):
    """A str flag was read by truthiness: stream="no" returned a stream and parse_special="no"
    parsed special tokens; now a TypeError naming the argument. numpy's bool is a bool."""
    import numpy as np

    for kw in ({"stream": "no"}, {"stream": 0}, {"cache_prompt": "no"}):
        with pytest.raises(TypeError, match=f"^{next(iter(kw))} must be a bool"):
            llm.generate(PROMPT, max_tokens=1, **kw)
    with pytest.raises(TypeError, match="^stream must be a bool"):
        llm.chat([{"role": "user", "content": "Hi"}], max_tokens=1, stream="yes")
    with pytest.raises(TypeError, match="^parse_special must be a bool"):
        llm.tokenize("<|im_start|>", parse_special="no")
    with pytest.raises(TypeError, match="^add_bos must be a bool"):
        llm.tokenize("Hi", add_bos=1)
    with pytest.raises(TypeError, match="^skip_special must be a bool"):
        llm.detokenize([1], skip_special="no")
    with pytest.raises(TypeError, match="^add_generation_prompt must be a bool"):
        llm.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt="no")
    assert llm.tokenize("<|im_start|>", parse_special=np.bool_(False)) == llm.tokenize("<|im_start|>", parse_special=False)
    r = llm.generate(PROMPT, max_tokens=1, stream=np.bool_(False), cache_prompt=np.bool_(True))
    assert len(r.generated_ids) == 1


def test_numbers_of_any_numeric_type_are_accepted(llm):
    import numpy as np

    a = llm.generate(PROMPT, max_tokens=3, temperature=0)
    b = llm.generate(PROMPT, max_tokens=np.int64(3), temperature=np.float32(0), top_p=1, top_k=np.int32(40),
                     repeat_penalty=1, seed=np.int64(5))
    assert b.generated_ids == a.generated_ids


def test_max_tokens_none_runs_to_the_end_of_the_context():
    """None: no limit (llama-cpp-python's meaning); the generation ends at an end-of-generation
    token or when the context is full. repeat_penalty keeps SmolLM2 from stopping early."""
    with LLM("smollm2-135m", device="cpu", n_ctx=48) as m:
        prompt = m.tokenize("Once upon a time")
        r = m.generate(prompt, max_tokens=None, temperature=0, repeat_penalty=1.3)
        assert r.stop_reason in ("eos", "context"), r.stop_reason
        if r.stop_reason == "context":
            assert r.finish_reason == "length" and len(prompt) + len(r.generated_ids) >= 48
        assert len(r.generated_ids) > 16  # more than any small default would give
    with LLM("smollm2-135m", device="cpu", n_ctx=16) as m:
        # one prompt token leaves room for n_ctx = 16 (the last token needs no position): the
        # limit None stands for must not end that generation as 'max_tokens'
        r = m.generate([m.tokenize("Hi")[0]], max_tokens=None, temperature=0)
        assert r.stop_reason == "context" and len(r.generated_ids) == 16, (r.stop_reason, r.generated_ids)


def test_unknown_model():
    with pytest.raises(FileNotFoundError):
        LLM("/nonexistent/model.gguf", device="cpu")


def test_speculative_equals_plain(llm):
    # the model as its own draft: same vocabulary, so the plumbing and statistics can be checked
    plain = llm.generate(PROMPT, max_tokens=6, temperature=0)
    with LLM("smollm2-135m", draft_model="smollm2-135m", device="cpu", n_ctx=256, spec_draft_n=3) as m:
        r = m.generate(PROMPT, max_tokens=6, temperature=0)
        assert r.generated_ids == plain.generated_ids
        assert r.spec is not None and r.spec["drafted"] > 0 and r.spec["accepted"] > 0


def test_prompt_cache_reuses_the_longest_common_prefix():
    """A prompt sharing a prefix with the last prompt + output prefills only the rest (llama.cpp's
    cache_prompt): the same ids as a fresh LLM (CPU: bitwise either way), cached_tokens reported;
    cache_prompt=False and reset() prefill it all; a stream cut early keeps its tokens but the last;
    with a draft model too (its own cache bookkeeping)."""
    with LLM("smollm2-135m", device="cpu", n_ctx=256) as m, LLM("smollm2-135m", device="cpu", n_ctx=256) as fresh:
        n = len(m.tokenize(PROMPT))
        a = m.generate(PROMPT, max_tokens=8, temperature=0)
        assert a.timings["cached_tokens"] == 0 and a.timings["prefill_tokens"] == n
        again = m.generate(PROMPT, max_tokens=8, temperature=0)  # all but the last prompt token reused
        assert again.timings["cached_tokens"] == n - 1 and again.timings["prefill_tokens"] == 1
        assert again.generated_ids == a.generated_ids
        # a follow-up that continues prompt + output: every token the cache holds is reused
        follow = a.prompt_ids + a.generated_ids + m.tokenize(" And the capital of Italy is")
        r = m.generate(follow, max_tokens=8, temperature=0)
        assert r.timings["cached_tokens"] == n + len(a.generated_ids) - 1
        ref = fresh.generate(follow, max_tokens=8, temperature=0, cache_prompt=False)
        assert r.generated_ids == ref.generated_ids and ref.timings["cached_tokens"] == 0
        # a different prompt shares only what it shares
        other = m.generate("The capital of Spain is", max_tokens=4, temperature=0)
        from pyminfer.chat import common_prefix

        shared = common_prefix(m.tokenize("The capital of Spain is"), follow)
        assert 0 < shared < n and other.timings["cached_tokens"] == shared
        assert m.generate("The capital of Spain is", max_tokens=4, temperature=0,
                          cache_prompt=False).timings["cached_tokens"] == 0
        m.reset()
        assert m.generate(PROMPT, max_tokens=2, temperature=0).timings["cached_tokens"] == 0
        # a stream stopped after 3 tokens: prompt + the first 2 are in the cache
        it = m.generate(PROMPT, max_tokens=8, temperature=0, stream=True)
        got = []
        for ch in it:
            got += ch.token_ids
            if len(got) >= 3:
                break
        it.close()
        r = m.generate(a.prompt_ids + a.generated_ids[:5], max_tokens=3, temperature=0)
        assert r.timings["cached_tokens"] == n + 2
        # the Model written by something else (directly, or another LLM over it): no stale reuse
        twin = LLM.from_models(m.model)
        twin.generate("def fib(n):", max_tokens=6, temperature=0)
        r = m.generate(PROMPT, max_tokens=8, temperature=0)
        assert r.timings["cached_tokens"] == 0 and r.generated_ids == a.generated_ids
        m.model.prefill(m.tokenize("Hello there"), 0, logits=False)
        r = m.generate(PROMPT, max_tokens=8, temperature=0)
        assert r.timings["cached_tokens"] == 0 and r.generated_ids == a.generated_ids
        twin._model = None  # (not close(): m owns the Model)
    with LLM("smollm2-135m", draft_model="smollm2-135m", device="cpu", n_ctx=256, spec_draft_n=3) as s:
        b = s.generate(PROMPT, max_tokens=8, temperature=0)
        c = s.generate(follow, max_tokens=8, temperature=0)
        assert b.generated_ids == a.generated_ids and c.generated_ids == ref.generated_ids
        assert c.timings["cached_tokens"] == n + len(a.generated_ids) - 1 and c.spec["accepted"] > 0


def test_warm_up_fills_the_draft_cache_too(monkeypatch):
    """max_tokens 0 (the server's n_predict 0 warm-up) evaluates the prompt into the draft model's
    cache as well as the target's, so the next speculative generation sharing the prompt prefills
    neither again (the draft was left cold before: its next round re-read the whole prompt)."""
    with LLM("smollm2-135m", draft_model="smollm2-135m", device="cpu", n_ctx=256, spec_draft_n=3) as s, \
            LLM("smollm2-135m", device="cpu", n_ctx=256) as plain:
        ids = s.tokenize(" ".join(["The quick brown fox jumps over the lazy dog."] * 3))
        w = s.generate(ids, max_tokens=0)
        assert w.generated_ids == [] and w.spec["draft_n_past"] == len(ids)
        seen: list[tuple[int, int]] = []  # (n_past, tokens) of each draft prefill
        real = s.draft.prefill
        monkeypatch.setattr(s.draft, "prefill", lambda t, start, **kw: seen.append((start, len(t))) or real(t, start, **kw))
        more = ids + s.tokenize(" Then")
        r = s.generate(more, max_tokens=6, temperature=0)
        assert r.timings["cached_tokens"] == len(ids)
        assert seen[0] == (len(ids), len(more) - len(ids)), seen  # only the new tokens
        assert r.generated_ids == plain.generate(more, max_tokens=6, temperature=0).generated_ids
    # a prompt past the draft's own context: the draft is left alone (its rounds run at d = 0)
    from pyminfer.engine import Model
    from pyminfer.models import ensure_model

    path = ensure_model("smollm2-135m")
    with LLM.from_models(Model(path, device="cpu", n_ctx=256), Model(path, device="cpu", n_ctx=16),
                         spec_draft_n=3) as s:
        w = s.generate(ids, max_tokens=0)
        assert w.spec["draft_n_past"] == 0 and s.generate(more, max_tokens=6, temperature=0).generated_ids == \
            r.generated_ids


def test_cut_mid_character_drops_incomplete_bytes(smol_path):
    """A generation stopped inside a multi-byte character ends without U+FFFD (llama.cpp server)."""
    from pyminfer import LLM

    with LLM(str(smol_path), device="cpu") as llm:
        for n in (1, 2, 3):
            r = llm.generate("Emoji list: 🙂😀🎉", max_tokens=n, temperature=0)
            assert "\ufffd" not in r.text, (n, r.text)


def test_chat_keywords(llm, monkeypatch):
    """LLM.chat refuses a keyword that neither it nor generate takes under its own name and before
    rendering the template (it was generate()'s TypeError, after rendering); add_generation_prompt
    (the server's field) reaches the template."""
    msgs = [{"role": "user", "content": "What is the weather?"}]
    rendered: list[dict] = []
    real = llm.apply_chat_template
    monkeypatch.setattr(llm, "apply_chat_template", lambda m, **k: rendered.append(k) or real(m, **k))
    with pytest.raises(TypeError, match=r"^LLM\.chat\(\) got an unexpected keyword argument 'tools' \(tool "
                                        r"definitions are not supported\)$"):
        llm.chat(msgs, tools=[{"type": "function"}], max_tokens=4)
    with pytest.raises(TypeError, match=r"^LLM\.chat\(\) got an unexpected keyword argument 'max_token'$"):
        llm.chat(msgs, max_token=4)
    assert rendered == []
    for agp in (True, False):
        r = llm.chat(msgs, add_generation_prompt=agp, max_tokens=2, temperature=0)
        assert r.prompt_ids == llm.tokenize(real(msgs, add_generation_prompt=agp))
    assert rendered[-1]["add_generation_prompt"] is False
    assert real(msgs, add_generation_prompt=True) != real(msgs, add_generation_prompt=False)
    prefill = msgs + [{"role": "assistant", "content": "It is"}]
    with pytest.raises(ValueError, match="cannot both be true"):  # as the server's 400
        llm.chat(prefill, continue_final_message=True, add_generation_prompt=True)
    r = llm.chat(prefill, continue_final_message=True, max_tokens=2, temperature=0)  # (None: fine)
    assert r.prompt_ids == llm.tokenize(real(prefill, continue_final_message=True))


def test_text_parts_joined_by_newline(llm):
    """Several text parts of one message render as their texts joined by "\\n", as vLLM and
    llama.cpp's server join them (they were concatenated with nothing between)."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}]
    assert llm.apply_chat_template(parts) == llm.apply_chat_template([{"role": "user", "content": "A\nB"}])


def test_broken_text_part_is_named(llm):
    """A text part without a string text was refused as "only text parts are supported", which
    names the wrong fault; an image part still gets that message."""
    from pyminfer.api import MessageError

    for part, got in (({"type": "text"}, "nothing"), ({"type": "text", "text": 5}, "int")):
        msgs = [{"role": "user", "content": [{"type": "text", "text": "A"}, part]}]
        with pytest.raises(MessageError, match=rf"^messages\[0\]\.content\[1\]\.text must be a string .*got {got}$"):
            llm.apply_chat_template(msgs)
    with pytest.raises(MessageError, match="only text parts are supported"):
        llm.apply_chat_template([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_sampler_chain_and_limits_arguments(llm):
    """samplers / n_indent / t_max_predict_ms as LLM.generate takes them: a chain list or letter
    string; wrong types are TypeErrors naming the argument, bad values ValueErrors."""
    base = llm.generate("The capital of France is", max_tokens=4, temperature=0)
    for chain in (["top_k", "temperature"], "kt", ("penalties", "temperature")):
        r = llm.generate("The capital of France is", max_tokens=4, temperature=0, samplers=chain)
        assert r.text == base.text, chain
    for kw, exc, says in (({"samplers": 5}, TypeError, "samplers must be"), ({"samplers": [1]}, TypeError, "samplers"),
                          ({"samplers": ["top_k", "nope"]}, ValueError, "unknown sampler 'nope'"),
                          ({"samplers": ["infill"]}, ValueError, "top_k between"),
                          ({"n_indent": "4"}, TypeError, "n_indent must be an int"),
                          ({"n_indent": -1}, ValueError, "n_indent must be >= 0"),
                          ({"t_max_predict_ms": "1"}, TypeError, "t_max_predict_ms must be a number"),
                          ({"t_max_predict_ms": float("nan")}, ValueError, "t_max_predict_ms must be finite")):
        with pytest.raises(exc, match=says):
            llm.generate("Hi", max_tokens=1, **kw)


def _log_softmax(row) -> "np.ndarray":
    import numpy as np

    x = np.asarray(row, dtype=np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def test_logprobs(llm):
    """logprobs=n: each generated token's log-softmax under the model (checked against the logits
    of a separate forward), its n most likely alternatives in order; the tokens are those of the
    run without logprobs; stop-string tokens are left out and the offsets index the text."""
    import numpy as np

    plain = llm.generate("1\n2\n3\n", max_tokens=6, temperature=0, cache_prompt=False)
    r = llm.generate("1\n2\n3\n", max_tokens=6, temperature=0, cache_prompt=False, logprobs=3)
    assert r.generated_ids == plain.generated_ids and plain.logprobs is None
    assert [e.id for e in r.logprobs] == r.generated_ids
    m = llm.model
    rows = [m.prefill(r.prompt_ids, 0, logits=True)]
    for i, t in enumerate(r.generated_ids[:-1]):
        rows.append(m.forward([t], len(r.prompt_ids) + i, [0], logits=True)[0])
    llm.reset()  # the forwards above wrote the cache behind the LLM's back
    for e, row in zip(r.logprobs, rows):
        ls = _log_softmax(row)
        assert abs(e.logprob - ls[e.id]) < 1e-9
        want = sorted(range(ls.size), key=lambda i: (-ls[i], i))[:3]
        assert [i for i, _ in e.top] == want and np.allclose([lp for _, lp in e.top], ls[want], atol=1e-9)
        assert e.top[0][0] == e.id  # greedy: the most likely
    assert [e.offset for e in r.logprobs] == [len(llm.detokenize(r.generated_ids[:i])) for i in range(6)]
    # a stop string: its tokens are not in the list; the texts of those kept make up the text
    s = llm.generate("1\n2\n3\n", max_tokens=6, temperature=0, stop=["6"], logprobs=0)
    assert s.text == "4\n5\n" and "".join(llm.detokenize([e.id]) for e in s.logprobs) == s.text
    assert all(e.top == [] for e in s.logprobs)
    # streamed: every entry once, with the chunk its text starts in
    chunks = list(llm.generate("1\n2\n3\n", max_tokens=6, temperature=0, logprobs=1, stream=True))
    assert [e.id for ch in chunks for e in ch.logprobs] == r.generated_ids
    assert len(llm.generate("Hi", max_tokens=1, logprobs=50).logprobs[0].top) == 50  # no cap in Python
    for bad, exc in ((-1, ValueError), (True, TypeError), (1.0, TypeError)):
        with pytest.raises(exc, match="logprobs"):
            llm.generate("Hi", max_tokens=1, logprobs=bad)


def test_prompt_logprobs(llm):
    """LLM.prompt_logprobs: None for the first token, then each token's log-softmax given the
    tokens before it (checked against one forward's rows), offsets into the detokenized prompt;
    the prompt stays cached, so a generation after it prefills only its last token."""
    import numpy as np

    ids = llm.tokenize("The capital of France is Paris.")
    out = llm.prompt_logprobs(ids, logprobs=2)
    assert out[0] is None and len(out) == len(ids)
    m = llm.model
    rows = m.forward(ids, 0, list(range(len(ids))), logits=True)
    for j in range(1, len(ids)):
        ls = _log_softmax(rows[j - 1])
        assert out[j].id == ids[j] and abs(out[j].logprob - ls[ids[j]]) < 1e-9
        assert [i for i, _ in out[j].top] == list(np.argsort(-ls, kind="stable")[:2])
        assert out[j].offset == len(llm.detokenize(ids[:j]))
    llm.prompt_logprobs(ids)
    r = llm.generate(ids, max_tokens=1, temperature=0)
    assert r.timings["cached_tokens"] == len(ids) - 1
    with pytest.raises(ValueError, match="empty"):
        llm.prompt_logprobs("")
    with pytest.raises(ValueError, match=">= 0"):
        llm.prompt_logprobs("Hi", logprobs=-1)
    with pytest.raises(TypeError, match="logprobs must be an int"):
        llm.prompt_logprobs("Hi", logprobs=1.5)


def test_prompt_logprobs_bounded_chunks(llm, monkeypatch):
    """prompt_logprobs reads back at most _SCORE_BYTES of logits a forward (Qwen at max_nt 512
    would be 311 MB): with room for 3 rows it runs forwards of <= 3 rows, and on the CPU (rows
    bitwise across batch sizes) gives exactly what one forward gives."""
    from pyminfer import generate as gen

    ids = llm.tokenize("The capital of France is Paris, and of Italy, Rome.")
    want = llm.prompt_logprobs(ids, logprobs=2)
    m = llm.model
    sizes: list[int] = []
    real = m.forward

    def spy(tokens, *a, **kw):
        sizes.append(len(tokens))
        return real(tokens, *a, **kw)

    monkeypatch.setattr(m, "forward", spy)
    monkeypatch.setattr(gen, "_SCORE_BYTES", 4 * m.n_vocab * 3 + 5)
    got = llm.prompt_logprobs(ids, logprobs=2)
    assert sizes and max(sizes) == 3 and sum(sizes) == len(ids) > 6
    assert [(e.id, e.logprob, e.top, e.offset) for e in got[1:]] == \
        [(e.id, e.logprob, e.top, e.offset) for e in want[1:]]


def test_prompt_logprobs_cancel(llm, monkeypatch):
    """LLM.prompt_logprobs(cancel=event): set from elsewhere, the scoring stops before its next
    forward with ScoringCancelled; the LLM then serves the next call (no stale cache claimed)."""
    import threading

    from pyminfer.generate import ScoringCancelled

    ids = llm.tokenize("alpha beta gamma delta " * 40)
    m = llm.model
    assert len(ids) > 2 * m.max_nt
    ev = threading.Event()
    calls: list[int] = []
    real = m.forward

    def spy(tokens, *a, **kw):
        calls.append(len(tokens))
        ev.set()
        return real(tokens, *a, **kw)

    monkeypatch.setattr(m, "forward", spy)
    with pytest.raises(ScoringCancelled):
        llm.prompt_logprobs(ids, 1, cancel=ev)
    assert calls == [m.max_nt]
    monkeypatch.undo()
    with pytest.raises(ScoringCancelled):  # already set: nothing runs
        llm.prompt_logprobs(ids, 1, cancel=ev)
    r = llm.generate(ids[:5], max_tokens=1, temperature=0)
    assert r.timings["cached_tokens"] == 0


def test_logprobs_speculative_equal_plain():
    """With a draft the verify rows are bitwise the single-token rows (CPU), so the logprobs are
    exactly those of plain decoding."""
    with LLM("smollm2-135m", draft_model="smollm2-135m", device="cpu", n_ctx=256, spec_draft_n=3) as s:
        a = s.generate("The capital of France is", max_tokens=12, temperature=0, logprobs=2, cache_prompt=False)
        assert a.spec is not None and a.spec["accepted"] > 0
    with LLM("smollm2-135m", device="cpu", n_ctx=256) as p:
        b = p.generate("The capital of France is", max_tokens=12, temperature=0, logprobs=2, cache_prompt=False)
    assert a.generated_ids == b.generated_ids and a.logprobs == b.logprobs
