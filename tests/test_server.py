"""``pyminfer serve``: a real uvicorn server in a subprocess, driven with the official openai client
and httpx; plus the loading state through an in-process app."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from pyminfer.models import ensure_model  # noqa: E402

MODEL = "smollm2-135m"
N_CTX = 512


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(state, timeout: float):
    """An in-process TestClient over ``create_app(state)``, once /health says the model is loaded
    (at most ``timeout`` seconds; a load error fails at once)."""
    from starlette.testclient import TestClient

    from pyminfer.server import create_app

    with TestClient(create_app(state)) as c:
        deadline = time.time() + timeout
        while c.get("/health").status_code != 200:
            assert time.time() < deadline and state.load_error is None
            time.sleep(0.05)
        yield c


@pytest.fixture(scope="module")
def server():
    ensure_model(MODEL, progress=False)
    port = _free_port()
    log = open(os.devnull, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "pyminfer", "serve", "-m", MODEL, "--device", "cpu", "-c", str(N_CTX),
                             "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    seen = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            assert proc.poll() is None, "the server exited"
            try:
                r = httpx.get(base + "/health", timeout=5)
                seen.append(r.status_code)
                if r.status_code == 200:
                    break
                assert r.status_code == 503
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            raise TimeoutError("the server did not become healthy")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=120)


def _metric(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def test_info_endpoints(server):
    r = httpx.get(server + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    m = httpx.get(server + "/v1/models").json()
    assert m["object"] == "list" and m["data"][0]["id"] == MODEL
    t = httpx.post(server + "/tokenize", json={"content": "Hello world"}).json()
    assert t == {"tokens": [19556, 905]}
    d = httpx.post(server + "/detokenize", json={"tokens": [19556, 905]}).json()
    assert d == {"content": "Hello world"}


def test_completion(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert "Paris" in r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == 5 and 1 <= r.usage.completion_tokens <= 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # a token-id prompt and a stop string
    r2 = client.completions.create(model=MODEL, prompt=[504, 3575, 282, 4649, 314], max_tokens=5, temperature=0,
                                   stop=["."])
    assert r2.choices[0].text == r.choices[0].text.split(".")[0]


def test_chat_and_streams(client):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0)
    text = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant" and text
    assert r.usage.completion_tokens <= 6
    parts, last = [], None
    for ch in client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0, stream=True):
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            last = ch
    assert "".join(parts) == text
    assert last.choices[0].finish_reason == r.choices[0].finish_reason
    assert last.usage.completion_tokens == r.usage.completion_tokens
    c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    s = "".join(ch.choices[0].text for ch in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0, stream=True))
    assert s == c.choices[0].text


def test_concurrent_clients_equal_solo(client):
    prompts = ["The capital of France is", "1, 2, 3, 4,", "def fib(n):", "Water boils at"]
    chats = ["Hi!", "Name a color."]

    def complete(p):
        return client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0).choices[0].text

    def chat(q):
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": q}], max_tokens=6,
                                              temperature=0).choices[0].message.content

    solo = {("c", p): complete(p) for p in prompts} | {("m", q): chat(q) for q in chats}
    jobs = ([("c", p) for p in prompts] * 13 + [("m", q) for q in chats] * 24)[:100]  # 100 requests in all
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(lambda j: complete(j[1]) if j[0] == "c" else chat(j[1]), jobs))
    assert len(outs) == 100
    for j, o in zip(jobs, outs):
        assert o == solo[j], j


BAD = [
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": 123}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 2}, "top_p"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, "stop"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, "model"),
    ("/v1/completions", {"prompt": "hello " * (N_CTX + 10), "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 10**9]}, "prompt"),
    ("/v1/chat/completions", {"max_tokens": 2}, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, "messages"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/tokenize", {"text": "x"}, "content"),
    ("/detokenize", {"tokens": ["a"]}, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, "tokens"),
    # no lax coercion: pydantic read these as stream=true, max_tokens=1, seed=12, top_k=2, ...
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "stream": 1}, "stream"),
    ("/v1/completions", {"prompt": "x", "max_tokens": True}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2.0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "seed": "12"}, "seed"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "top_k": 2.5}, "top_k"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "temperature": "0.5"}, "temperature"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "echo": "false"}, "echo"),
    ("/v1/completions", {"prompt": [True, 5], "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "stream": True, "stream_options": {"include_usage": "no"}},
     "stream_options"),
    # OpenAI's and vLLM's 400 (it was silently ignored)
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "stream": False,
                              "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "stream": "yes"},
     "stream"),
    ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
    ("/detokenize", {"tokens": [True]}, "tokens"),
    ("/detokenize", {"tokens": [5.0]}, "tokens"),
]


@pytest.mark.parametrize("path,body,param", BAD, ids=[f"{p}-{k}" for p, _, k in BAD])
def test_bad_input_then_ok(server, path, body, param):
    r = httpx.post(server + path, json=body, timeout=30)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert (err["param"] or "").split(".")[0] == param
    ok = httpx.post(server + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "temperature": 0}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1


def test_not_json_and_unknown_route(server):
    r = httpx.post(server + "/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.get(server + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def _wait_cancelled(server, before: float) -> None:
    """Until the server has counted a cancelled generation more than ``before`` (60 s at most)."""
    deadline = time.time() + 60
    while _metric(server, "pyminfer_requests_cancelled_total") <= before:
        assert time.time() < deadline, "the generation was not cancelled"
        time.sleep(0.2)


def test_disconnect_mid_stream(server):
    before = _metric(server, "pyminfer_requests_cancelled_total")
    body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as c, c.stream("POST", server + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        n = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                json.loads(line[6:])
                n += 1
                if n == 2:
                    break
    _wait_cancelled(server, before)  # the server stops that generation and serves the next request
    r = httpx.post(server + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0}, timeout=60)
    assert r.status_code == 200
    assert _metric(server, "pyminfer_requests_processing") == 0


def test_disconnect_mid_request_counts_as_cancelled_not_error(server):
    """A non-streaming client that gives up: the generation is cancelled and counted once, as
    cancelled (it also counted as an error before)."""
    cancelled = _metric(server, "pyminfer_requests_cancelled_total")
    errors = _metric(server, "pyminfer_request_errors_total")
    body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server + "/v1/completions", json=body, timeout=1.0)
    _wait_cancelled(server, cancelled)
    r = httpx.post(server + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0}, timeout=60)
    assert r.status_code == 200
    assert _metric(server, "pyminfer_request_errors_total") == errors


def test_disconnect_mid_batch_stops_the_batch(server):
    """A batch of short prompts from a client that gave up: each prompt finished between the
    server's disconnect polls, so the whole batch ran (and held the worker) to its end."""
    import socket

    cancelled = _metric(server, "pyminfer_requests_cancelled_total")
    predicted = _metric(server, "pyminfer_tokens_predicted_total")
    body = json.dumps({"prompt": ["Hi"] * 400, "max_tokens": 1, "temperature": 0}).encode()
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sk:
        sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.time() + 60
        while _metric(server, "pyminfer_tokens_predicted_total") < predicted + 3:  # the batch is running
            assert time.time() < deadline
            time.sleep(0.05)
    _wait_cancelled(server, cancelled)
    deadline = time.time() + 60
    while _metric(server, "pyminfer_requests_processing") != 0:
        assert time.time() < deadline
        time.sleep(0.1)
    assert _metric(server, "pyminfer_tokens_predicted_total") < predicted + 200  # far from all 400


def test_metrics(server):
    httpx.post(server + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0}, timeout=60)
    text = httpx.get(server + "/metrics").text
    assert "# TYPE pyminfer_prompt_tokens_total counter" in text
    assert _metric(server, "pyminfer_prompt_tokens_total") > 0
    assert _metric(server, "pyminfer_tokens_predicted_total") > 0
    assert _metric(server, "pyminfer_predicted_tokens_per_second") > 0
    assert 'pyminfer_spec_accepted_tokens_at_position_total{position="1"}' in text
    assert "pyminfer_spec_rounds_total 0" in text


def test_metrics_report_every_draft_position():
    """Rounds of the deepest draft (MAX_DEPTH = 8 tokens) are counted at every position: the
    per-position counters add up to the totals (position 8 was once dropped)."""
    from pyminfer.generate import GenerationResult
    from pyminfer.server import Metrics
    from pyminfer.spec import MAX_DEPTH

    m = Metrics()
    spec = {"rounds": 2, "drafted": 2 * MAX_DEPTH, "accepted": MAX_DEPTH + 1,
            "drafted_per_position": [2] * MAX_DEPTH, "accepted_per_position": [2] + [1] * (MAX_DEPTH - 1)}
    res = GenerationResult(text="", prompt_ids=[], generated_ids=[], finish_reason="length", stop_reason="max_tokens",
                           timings={}, spec=spec)
    m.add(5, 3, res, False)
    vals = {ln.split()[0]: float(ln.split()[1]) for ln in m.render(True).splitlines() if ln and not ln.startswith("#")}
    at = range(1, MAX_DEPTH + 1)
    drafted = [vals[f'pyminfer_spec_draft_tokens_at_position_total{{position="{i}"}}'] for i in at]
    accepted = [vals[f'pyminfer_spec_accepted_tokens_at_position_total{{position="{i}"}}'] for i in at]
    assert sum(drafted) == vals["pyminfer_spec_draft_tokens_total"] == 2 * MAX_DEPTH
    assert sum(accepted) == vals["pyminfer_spec_accepted_tokens_total"] == MAX_DEPTH + 1


def test_health_503_while_loading():
    from starlette.testclient import TestClient

    from pyminfer.server import ServerState, create_app

    go = threading.Event()

    def loader():
        go.wait(30)
        raise RuntimeError("no model here")

    state = ServerState(loader, aliases=["x"])
    with TestClient(create_app(state)) as c:
        assert c.get("/health").status_code == 503
        r = c.post("/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        assert c.get("/metrics").status_code == 200
        go.set()
        deadline = time.time() + 10
        while state.load_error is None and time.time() < deadline:
            time.sleep(0.05)
        r = c.get("/health")
        assert r.status_code == 503 and "no model here" in r.json()["error"]


def test_speculative_metrics_in_process():
    from pyminfer import LLM
    from pyminfer.server import ServerState

    path = str(ensure_model(MODEL, progress=False))
    state = ServerState(lambda: LLM(path, draft_model=path, device="cpu", n_ctx=256, spec_draft_n=3), aliases=[MODEL])
    with _serving(state, 60) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5,
                                            "temperature": 0})
        assert r.status_code == 200 and r.json()["timings"]["draft_n"] > 0
        text = c.get("/metrics").text
        vals = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln and not ln.startswith("#")}
        assert vals["pyminfer_spec_rounds_total"] > 0
        assert vals["pyminfer_spec_draft_tokens_total"] >= vals["pyminfer_spec_accepted_tokens_total"] > 0
        assert vals['pyminfer_spec_draft_tokens_at_position_total{position="1"}'] > 0
        assert c.get("/props").json()["default_generation_settings"]["speculative"] is True
    state.llm.close()


def test_props_says_speculative_with_ngram_drafts(local):
    """/props' speculative is true for n-gram drafting too (--spec-type ngram-simple): it said false
    without a draft model. The plain server of ``local`` says false."""
    from pyminfer import LLM, NgramSpec
    from pyminfer.server import ServerState

    c, _ = local
    assert c.get("/props").json()["default_generation_settings"]["speculative"] is False
    path = str(ensure_model(MODEL, progress=False))
    state = ServerState(lambda: LLM(path, device="cpu", n_ctx=128, spec_ngram=NgramSpec(3, 4)), aliases=[MODEL])
    with _serving(state, 60) as c2:
        assert c2.get("/props").json()["default_generation_settings"]["speculative"] is True
    state.llm.close()


def test_unhandled_error_is_a_500_and_the_connection_survives(monkeypatch):
    """An exception no handler maps becomes a 500 JSON body (type server_error), and it is not
    re-raised (Starlette's outermost middleware re-raises after answering; uvicorn then dropped the
    keep-alive connection, so the client's next request failed). In process: TestClient re-raises
    server exceptions by default, so this test fails without the catch-all middleware."""
    from pyminfer import LLM
    from pyminfer.server import ServerState

    path = str(ensure_model(MODEL, progress=False))
    state = ServerState(lambda: LLM(path, device="cpu", n_ctx=128), aliases=[MODEL])
    with _serving(state, 60) as c:

        def boom(*a, **k):
            raise RuntimeError("injected failure")

        monkeypatch.setattr(state.llm.tokenizer, "encode", boom)
        r = c.post("/tokenize", json={"content": "hi"})
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "server_error" and "injected failure" in r.json()["error"]["message"]
        monkeypatch.undo()
        assert c.post("/tokenize", json={"content": "hi"}).status_code == 200
        # seed -1 (or any negative): random, as llama.cpp and the CLI; not a 500
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, "seed": -1})
        assert r.status_code == 200, r.text
    state.llm.close()


def test_unsupported_openai_fields_are_refused_not_ignored():
    """penalties other than repeat_penalty, tools, ...: a 400 naming the field when
    a request asks for them (a silently ignored field is a wrong answer); neutral values pass."""
    from pyminfer import LLM
    from pyminfer.server import ServerState

    path = str(ensure_model(MODEL, progress=False))
    state = ServerState(lambda: LLM(path, device="cpu", n_ctx=128), aliases=[MODEL])
    base = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    with _serving(state, 60) as c:
        for extra in ({"frequency_penalty": 0.5},
                      {"presence_penalty": -1}, {"best_of": 3}, {"logit_bias": {"10": 5}}, {"n": 2}):
            r = c.post("/v1/completions", json={**base, **extra})
            assert r.status_code == 400 and next(iter(extra)) in r.json()["error"]["message"], (extra, r.text)
            assert r.json()["error"]["code"] == "unsupported_parameter"  # (n: 2 was an invalid_value)
        r = c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
                                                 "tools": [{"type": "function", "function": {"name": "f"}}]})
        assert r.status_code == 400 and "tools" in r.json()["error"]["message"]
        neutral = {"logprobs": None, "echo": False, "frequency_penalty": 0, "presence_penalty": 0.0, "best_of": 1, "n": 1,
                   "logit_bias": {}, "response_format": {"type": "text"}}
        assert c.post("/v1/completions", json={**base, **neutral}).status_code == 200
        for path in ("/v1/embeddings", "/embeddings", "/embedding"):  # llama.cpp: 501 without --embeddings
            r = c.post(path, json={"model": MODEL, "input": "Hi"})
            assert r.status_code == 501 and "embeddings" in r.json()["error"]["message"], (path, r.text)
        r = c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "logprobs": False,
                                                 "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200, r.text
    state.llm.close()


# ---------------------------------------------------------------------------------------------- bad input, in process
@pytest.fixture(scope="module")
def local():
    """An in-process app over one SmolLM2 (TestClient): (client, state)."""
    from pyminfer import LLM
    from pyminfer.server import ServerState

    llm = LLM(str(ensure_model(MODEL, progress=False)), device="cpu", n_ctx=256)
    state = ServerState(lambda: llm, aliases=[MODEL])
    with _serving(state, 60) as c:
        yield c, state
    llm.close()


def _post_raw(c, path: str, raw: str):
    """POST a JSON text as is (json= would refuse lone surrogates and NaN before sending)."""
    return c.post(path, content=raw.encode(), headers={"Content-Type": "application/json"})


def _error(r, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def _chat(c, messages, **kw):
    return c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1, "temperature": 0, **kw})


def test_tokenize_add_special_follows_the_model(local, monkeypatch):
    """/tokenize's add_special is llama.cpp's: BOS only where the model adds one (SmolLM2 and Qwen:
    add_bos_token = false, so no BOS; it added one before), BOS where it does; never without it."""
    c, state = local
    tok = state.llm.tokenizer
    plain = c.post("/tokenize", json={"content": "hi"}).json()["tokens"]
    assert tok.add_bos is False and plain[:1] != [tok.bos_id]
    assert c.post("/tokenize", json={"content": "hi", "add_special": True}).json()["tokens"] == plain
    monkeypatch.setattr(tok, "add_bos", True)
    assert c.post("/tokenize", json={"content": "hi", "add_special": True}).json()["tokens"] == [tok.bos_id] + plain
    assert c.post("/tokenize", json={"content": "hi"}).json()["tokens"] == plain


def test_null_fields_mean_their_defaults(local):
    """OpenAI's API takes null for every optional field: temperature, top_p, top_k, n, stream,
    presence_penalty, ... given as null answer as if absent (they were 400s), for both endpoints;
    a null required field is still a 400, and repeat_last_n = -1 (the whole context) is taken."""
    c, state = local
    nulls = dict(top_p=None, top_k=None, n=None, stream=None, presence_penalty=None, frequency_penalty=None,
                 min_p=None, repeat_penalty=None, repeat_last_n=None, echo=None, best_of=None, stop=None, seed=None)
    msgs = [{"role": "user", "content": "Hi"}]
    want = _chat(c, msgs).json()["choices"][0]["message"]["content"]
    r = _chat(c, msgs, **nulls)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want
    r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 1, "temperature": None, "seed": 3})
    assert r.status_code == 200, r.text  # the default temperature (0.8), seeded
    r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "temperature": 0, **nulls})
    assert r.status_code == 200, r.text
    _error(c.post("/v1/completions", json={"prompt": None, "max_tokens": 1}), 400)
    r = _chat(c, msgs, repeat_penalty=1.3, repeat_last_n=-1)
    assert r.status_code == 200, r.text
    _error(_chat(c, msgs, repeat_last_n=-2), 400)
    # nested and other endpoints' fields too
    r = _chat(c, msgs, stream=True, stream_options={"include_usage": None})
    assert r.status_code == 200, r.text
    r = c.post("/tokenize", json={"content": "Hello", "add_special": None, "with_pieces": None})
    assert r.status_code == 200 and r.json()["tokens"] == c.post("/tokenize", json={"content": "Hello"}).json()["tokens"]
    # a llama.cpp field that would change the answer is refused, not ignored
    assert _error(c.post("/completion", json={"prompt": "Hi", "n_predict": 1, "return_tokens": True}))["param"] \
        == "return_tokens"


def test_developer_role_is_system_and_unknown_roles_are_refused(local):
    """OpenAI's "developer" is rendered as "system" (templates know only the old name: SmolLM2's
    added its default system prompt and a "developer" turn, Qwen's dropped the turn); any other
    role the templates do not know is a 400, not a turn silently dropped or mislabeled."""
    c, state = local
    dev = [{"role": "developer", "content": "Answer like a pirate."}, {"role": "user", "content": "Hi"}]
    sys_ = [{"role": "system", "content": "Answer like a pirate."}, {"role": "user", "content": "Hi"}]
    a, b = _chat(c, dev), _chat(c, sys_)
    assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
    assert a.json()["usage"]["prompt_tokens"] == b.json()["usage"]["prompt_tokens"]
    assert a.json()["choices"][0]["message"] == b.json()["choices"][0]["message"]
    llm = state.llm
    assert llm.apply_chat_template(dev) == llm.apply_chat_template(sys_)
    for role in ("foo", "User", "function"):
        err = _error(_chat(c, [{"role": "user", "content": "Hi"}, {"role": role, "content": "x"}]))
        assert err["param"] == "messages.1.role" and err["code"] == "invalid_value"  # code was null
        assert repr(role) in err["message"] and "system, developer, user, assistant, tool" in err["message"]
        with pytest.raises(ValueError, match="unknown role"):  # the Python API says the same
            llm.chat([{"role": role, "content": "x"}], max_tokens=1)
    # a chat too long for the context names "messages" (it named "prompt", a field chats do not have)
    err = _error(_chat(c, [{"role": "user", "content": "hello " * 400}]))
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages", err
    assert "tokens; this model's context holds" in err["message"]  # counted: tokenized


def test_huge_prompt_refused_before_tokenizing(local):
    """A prompt whose text gives at least 2 n_ctx tokens by Tokenizer.min_tokens (each token stands for
    at most max_token_bytes bytes) is a context_length_exceeded 400 without being tokenized (megabytes
    took seconds and ~1 GB): as a string, a mixed prompt's text pieces, a chat; a prompt under that
    is tokenized and counted, and characters the vocabulary drops (SmolLM2 has no token for byte 0x04)
    do not count, so a prompt that fits is never refused early."""
    c, state = local
    llm = state.llm
    tok = llm.tokenizer
    assert tok.max_token_bytes >= max(len(tok.token_to_piece(i)) for i in range(tok.n_vocab))
    most = 2 * llm.n_ctx * tok.max_token_bytes
    for path, body, param in (("/v1/completions", lambda t: {"prompt": t}, "prompt"),
                              ("/completion", lambda t: {"prompt": [t]}, "prompt"),
                              ("/completion", lambda t: {"prompt": [1, t[:len(t) // 2], 2, t[len(t) // 2:]]}, "prompt"),
                              ("/v1/chat/completions", lambda t: {"messages": [{"role": "user", "content": t}]},
                               "messages")):
        err = _error(c.post(path, json={"max_tokens": 1, **body("x" * most)}))
        assert err["code"] == "context_length_exceeded" and err["param"] == param, (path, err)
        assert "characters, at least" in err["message"], err  # the early refusal, not a token count
        near = _error(c.post(path, json={"max_tokens": 1, **body("x" * (most // 2))}))
        assert near["code"] == "context_length_exceeded" and "tokens; this model's context holds" in near["message"]
    assert tok.encode("\x04" * 10, add_bos=False) == []  # dropped: the bound must not count them
    assert tok.min_tokens("Hi" + "\x04" * most) <= 1
    ok = c.post("/v1/completions", json={"prompt": "Once upon a time" + "\x04" * most, "max_tokens": 1})
    assert ok.status_code == 200, ok.text


SURROGATES = [
    ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 1}', "prompt"),
    ("/v1/completions", '{"prompt": ["a\\udfffb"], "max_tokens": 1}', "prompt.0"),
    ("/v1/completions", '{"prompt": "ab", "max_tokens": 1, "stop": "\\ud800"}', "stop"),
    ("/v1/completions", '{"prompt": "ab", "max_tokens": 1, "stop": ["x", "\\ud800"]}', "stop.1"),
    ("/v1/completions", '{"prompt": "ab", "max_tokens": 1, "model": "m\\ud800"}', "model"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\ud800"}], "max_tokens": 1}',
     "messages.0.content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc80"}]}], '
     '"max_tokens": 1}', "messages.0.content.0.text"),
    ("/tokenize", '{"content": "a\\ud800"}', "content"),
]


@pytest.mark.parametrize("path,raw,param", SURROGATES, ids=[f"{p}-{k}" for p, _, k in SURROGATES])
def test_lone_surrogates_are_a_400(local, path, raw, param):
    """Python's json reads "\\ud800" into a str that is not text: the tokenizer raised (500), a stop
    string could never match (200, silently), and a 404 quoting the model name failed to encode."""
    c, _ = local
    assert "\\ud" in raw  # the JSON escape itself, not a character
    err = _error(_post_raw(c, path, raw))
    assert err["param"] == param and err["code"] == "invalid_unicode"
    assert "invalid Unicode" in err["message"] and "surrogate" in err["message"]


def test_lone_surrogates_in_the_python_api(local):
    _, state = local
    llm = state.llm
    with pytest.raises(ValueError, match="surrogate"):
        llm.tokenize("a\ud800")
    with pytest.raises(ValueError, match="surrogate"):
        llm.generate("Hi", max_tokens=1, stop=["\ud800"])
    with pytest.raises(ValueError, match=r"messages\[0\]\.content.*surrogate"):
        llm.chat([{"role": "user", "content": "a\udfff"}], max_tokens=1)


def test_chat_template_that_does_not_compile(local, monkeypatch):
    """A GGUF whose template has a syntax error: the server starts and serves completions; chat
    requests get a 500 that names the template (was: a bare "TemplateSyntaxError: ..." 500)."""

    from pyminfer.server import ServerState

    _, shared = local
    llm = shared.llm
    monkeypatch.setattr(llm.tokenizer, "chat_template", "{% for m in messages %}{{ m.content }")
    monkeypatch.setattr(llm.tokenizer, "_compiled_template", None, raising=False)
    state = ServerState(lambda: llm, aliases=[MODEL])
    with _serving(state, 30) as c:
        err = _error(_chat(c, [{"role": "user", "content": "Hi"}]), 500)
        assert err["code"] == "chat_template_error" and err["type"] == "server_error"
        assert "chat template" in err["message"] and "unexpected '}'" in err["message"]
        r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
    with pytest.raises(ValueError, match="does not compile"):
        llm.apply_chat_template([{"role": "user", "content": "Hi"}])


def test_chat_template_refusing_the_messages_is_a_400(local, monkeypatch):
    """The template's raise_exception (e.g. "roles must alternate") and errors while rendering these
    messages are the request's problem: 400 with the template's words."""
    c, state = local
    tok = state.llm.tokenizer
    monkeypatch.setattr(tok, "chat_template", "{% if messages|length > 1 %}{{ raise_exception('one message only') }}"
                        "{% endif %}{{ messages[0].content }}")
    monkeypatch.setattr(tok, "_compiled_template", None, raising=False)
    assert _chat(c, [{"role": "user", "content": "Hi"}]).status_code == 200
    err = _error(_chat(c, [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi"}]))
    assert "one message only" in err["message"] and err["param"] == "messages"
    # a render error (here: a field these messages lack) is a 400 too, not a 500
    monkeypatch.setattr(tok, "chat_template", "{{ messages[0].content + messages[0].name }}")
    monkeypatch.setattr(tok, "_compiled_template", None, raising=False)
    err = _error(_chat(c, [{"role": "user", "content": "Hi"}]))
    assert "chat template could not render" in err["message"]


BAD_TOOL_CALLS = [
    ("nope", "messages.1.tool_calls"),
    ({"function": {"name": "f", "arguments": "{}"}}, "messages.1.tool_calls"),
    ([5], "messages.1.tool_calls.0"),
    ([{"type": "function"}], "messages.1.tool_calls.0.function"),
    ([{"function": "f"}], "messages.1.tool_calls.0.function"),
    ([{"function": {"arguments": "{}"}}], "messages.1.tool_calls.0.function.name"),
    ([{"function": {"name": 3, "arguments": "{}"}}], "messages.1.tool_calls.0.function.name"),
    ([{"function": {"name": "f"}}], "messages.1.tool_calls.0.function.arguments"),
    ([{"function": {"name": "f", "arguments": 5}}], "messages.1.tool_calls.0.function.arguments"),
    ([{"function": {"name": "f", "arguments": "not json"}}], "messages.1.tool_calls.0.function.arguments"),
    ([{"function": {"name": "f", "arguments": "[1]"}}], "messages.1.tool_calls.0.function.arguments"),
    ([{"type": "retrieval", "function": {"name": "f", "arguments": {}}}], "messages.1.tool_calls.0.type"),
    ([{"id": 7, "function": {"name": "f", "arguments": {}}}], "messages.1.tool_calls.0.id"),
]


@pytest.mark.parametrize("calls,param", BAD_TOOL_CALLS, ids=[f"{i}{p.split('tool_calls')[1]}"
                                                               for i, (_, p) in enumerate(BAD_TOOL_CALLS)])
def test_malformed_tool_calls_are_a_400(local, calls, param):
    """Templates that render tool calls crashed on these (500), and those that do not render them
    (SmolLM2's) passed them silently; now a 400 names the field."""
    c, _ = local
    msgs = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    err = _error(_chat(c, msgs))
    assert err["param"] == param, err


def test_tool_calls_reach_the_template_with_object_arguments(local, monkeypatch):
    """OpenAI sends arguments as JSON text; templates (HF convention) expect an object, and printed
    a quoted string (Qwen2.5: "arguments": "{\\"city\\": ...}") before."""
    c, state = local
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    assert _chat(c, msgs).status_code == 200
    tok = state.llm.tokenizer
    monkeypatch.setattr(tok, "chat_template", "{{ messages[1].tool_calls[0].function.arguments | tojson }}")
    monkeypatch.setattr(tok, "_compiled_template", None, raising=False)
    assert state.llm.apply_chat_template(msgs) == '{"city": "Paris"}'


def test_validation_messages_name_the_field_plainly(local):
    """Not pydantic's union-member names ('prompt.str') nor its lax coercions."""
    c, _ = local
    cases = [
        ({"prompt": 123}, "prompt", "prompt: must be a string, a list of token ids, a list of strings and token "
         "ids, or a list of such prompts"),
        ({"prompt": [1, None]}, "prompt", "prompt: must be a string, a list of token ids, a list of strings and "
         "token ids, or a list of such prompts"),
        ({"prompt": "x", "stop": 5}, "stop", "stop: must be a string or a list of strings"),
        ({"prompt": "x", "stream": "yes"}, "stream", 'stream: must be true or false, got "yes"'),
        ({"prompt": "x", "max_tokens": True}, "max_tokens", "max_tokens: must be an integer, got true"),
        ({"prompt": "x", "max_tokens": 1.5}, "max_tokens", "max_tokens: must be an integer, got 1.5"),
        ({"prompt": "x", "temperature": True}, "temperature", "temperature: must be a number, got true"),
        ({"prompt": "x", "max_tokens": -1}, "max_tokens", "max_tokens: must be >= 0"),
    ]
    for body, param, msg in cases:
        err = _error(c.post("/v1/completions", json=body))
        assert (err["param"], err["message"]) == (param, msg), body
    err = _error(_chat(c, []))
    assert (err["param"], err["message"]) == ("messages", "messages: must not be empty")
    err = _error(_chat(c, [{"role": "user", "content": 5}]))
    assert err["message"] == "messages[0].content: must be a string or a list of content parts"
    assert err["param"] == "messages.0.content"


@pytest.mark.parametrize("raw", ["Infinity", "-Infinity", "NaN"])
def test_non_finite_numbers_are_a_400(local, raw):
    """JSON has no NaN/Infinity but Python's json reads them; repeat_penalty=Infinity was served."""
    c, _ = local
    for field in ("repeat_penalty", "temperature", "top_p"):
        err = _error(_post_raw(c, "/v1/completions", f'{{"prompt": "Hi", "max_tokens": 1, "{field}": {raw}}}'))
        assert err["param"] == field and "finite" in err["message"]


def test_tiny_repeat_penalty_is_served(local):
    """Any finite penalty > 0 is legal (llama.cpp does not range-check it); 1e-40 pushed penalized
    logits to inf and sampling failed with an IndexError (500), 1e-45 with numpy overflow warnings.
    Needs the sampling.py clamp (the other half of this fix)."""
    import warnings

    c, _ = local
    for rp in (1e-40, 1e-45):
        with warnings.catch_warnings():  # numpy's overflow warnings (1e-45) become errors, hence 500s
            warnings.simplefilter("error", RuntimeWarning)
            r = c.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 4,
                                                "temperature": 0.7, "seed": 1, "repeat_penalty": rp})
        assert r.status_code == 200, (rp, r.text)
        assert r.json()["usage"]["completion_tokens"] >= 1


def test_body_that_is_not_utf8_says_so(local):
    """A body with a Latin-1 byte is a 400 naming the byte and UTF-8 (it said "not valid JSON");
    a UTF-8 BOM is tolerated."""
    c, _ = local
    r = c.post("/v1/completions", content=b'{"prompt": "caf\xe9", "max_tokens": 1}',
               headers={"Content-Type": "application/json"})
    err = _error(r)
    assert err["code"] == "invalid_json" and "not valid UTF-8 (byte 0xe9 at offset 15)" in err["message"], err
    r = c.post("/v1/completions", content=b'\xef\xbb\xbf{"prompt": "Hi", "max_tokens": 1}',
               headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_deeply_nested_body_is_a_400(local):
    c, _ = local
    err = _error(_post_raw(c, "/v1/completions", '{"prompt": "x", "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"))
    assert err["code"] == "invalid_json"


# ------------------------------------------------------------------------------- llama.cpp fields and endpoints
def _sse_events(r) -> list[str]:
    return [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]


def test_include_usage_reports_usage_once(local):
    """OpenAI's stream_options.include_usage: usage only in the last chunk (choices []), "usage": null
    in every other; it was also on the finish chunk, so a client adding usage over chunks counted it
    twice. Without the option the finish chunk carries usage (llama-server's way) and no usage-only
    chunk follows."""
    import json

    c, _ = local
    msgs = [{"role": "user", "content": "Hi"}]
    for path, body in (("/v1/chat/completions", {"messages": msgs}), ("/v1/completions", {"prompt": "Hi"})):
        body = {**body, "max_tokens": 3, "temperature": 0, "stream": True}
        events = _sse_events(c.post(path, json={**body, "stream_options": {"include_usage": True}}))
        assert events[-1] == "[DONE]", events
        chunks = [json.loads(e) for e in events[:-1]]
        assert all("usage" in ch for ch in chunks), chunks
        with_usage = [ch for ch in chunks if ch["usage"] is not None]
        assert with_usage == [chunks[-1]] and chunks[-1]["choices"] == [], chunks
        assert chunks[-1]["usage"]["completion_tokens"] == 3
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        chunks = [json.loads(e) for e in _sse_events(c.post(path, json=body))[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 3
        assert all("usage" not in ch for ch in chunks[:-1]), chunks


def test_n_predict_is_max_tokens(local):
    """llama.cpp's n_predict was accepted and ignored (16 tokens came back for n_predict 3)."""
    c, _ = local
    body = {"prompt": "Once upon a time", "temperature": 0}
    r = c.post("/v1/completions", json={**body, "n_predict": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    assert c.post("/v1/completions", json={**body, "n_predict": 3, "max_tokens": 3}).status_code == 200
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Tell me a story."}],
                                             "temperature": 0, "n_predict": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    for other in ({"max_tokens": 4}, {"max_completion_tokens": 4}, {"max_tokens": 3, "n_predict": -1}):
        err = _error(c.post("/v1/completions", json={**body, "n_predict": 3, **other}))
        assert err["param"] == "n_predict" and "disagree" in err["message"], err
    err = _error(c.post("/v1/completions", json={**body, "n_predict": -2}))
    assert err["param"] == "n_predict"


# (field, a value that asks for something the server does not do)
UNIMPLEMENTED = [
    ("mirostat", 2), ("typical_p", 0.5), ("tfs_z", 0.9), ("grammar", "root ::= \"yes\""),
    ("json_schema", {"type": "object"}), ("ignore_eos", True),
    ("dry_multiplier", 0.8), ("xtc_probability", 0.5), ("logit_bias", [[15043, 1.0]]),
    ("logit_bias", {"15043": -100}), ("logit_bias", {"15043": 0, "16": 2}), ("logit_bias", [[15043, False]]),
    ("logit_bias", {"--5": 7}),  # token text, not an id: int("--5") was a 500
    ("dynatemp_range", 0.5), ("top_n_sigma", 1.0),
    ("chat_template_kwargs", {"enable_thinking": False}),
    ("tool_choice", "required"), ("tool_choice", {"type": "function", "function": {"name": "f"}}),
    ("functions", [{"name": "f"}]), ("function_call", "auto_x"), ("response_format", {"type": "json_object"}),
    ("best_of", 2),
]


@pytest.mark.parametrize("field,value", UNIMPLEMENTED, ids=[f"{f}-{i}" for i, (f, _) in enumerate(UNIMPLEMENTED)])
def test_unimplemented_fields_are_refused(local, field, value):
    """llama.cpp's and OpenAI's fields that change the output were accepted and ignored: now a 400
    naming the field, without the repeat_penalty hint that only fits the OpenAI penalties."""
    c, _ = local
    for path, body in (("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/completion", {"prompt": "Hi"})):
        err = _error(c.post(path, json={**body, "max_tokens": 1, field: value}))
        assert err["param"] == field and err["code"] == "unsupported_parameter", err
        assert field in err["message"] and "repeat_penalty" not in err["message"], err


def test_penalty_hint_only_for_openai_penalties(local):
    c, _ = local
    for field in ("frequency_penalty", "presence_penalty"):
        err = _error(c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, field: 0.5}))
        assert err["param"] == field and "use repeat_penalty" in err["message"]
    err = _error(c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "best_of": 2}))
    assert "repeat_penalty" not in err["message"] and "one candidate" in err["message"]


def test_neutral_and_harmless_fields_are_accepted(local):
    """The defaults of the refused fields, and fields that do not change the output, still pass,
    and the answer is the plain one."""
    c, _ = local
    base = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    plain = c.post("/v1/completions", json=base).json()["choices"][0]["text"]
    neutral = {"mirostat": 0, "mirostat_tau": 5.0, "typical_p": 1.0, "tfs_z": 1, "grammar": "", "json_schema": {},
               "ignore_eos": False, "suffix": "", "n_probs": 0, "dry_multiplier": 0.0, "xtc_probability": 0,
               "logit_bias": [], "tool_choice": "none", "function_call": None, "samplers": {}, "top_n_sigma": -1,
               "n_indent": 0, "t_max_predict_ms": -1, "t_max_prompt_ms": 500,
               "user": "u1", "metadata": {"a": "b"}, "store": False, "service_tier": "auto",
               "parallel_tool_calls": True, "cache_prompt": True, "id_slot": -1, "n_keep": 0}
    r = c.post("/v1/completions", json={**base, **neutral})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == plain
    # zero biases change nothing: accepted, also by a token's text (llama.cpp's form)
    for bias in ({"15043": 0, "16": 0.0}, [[15043, 0]], {"Hello": 0}, [["Hello", 0.0]]):
        r = c.post("/v1/completions", json={**base, "logit_bias": bias})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == plain, r.text


@pytest.mark.parametrize("bias,says", [
    ({"-1": 0}, "-1 is not a token id (an integer >= 0) or a token's text"),
    ({"5": "0"}, 'the bias of token 5 must be a number in -100..100 or false, got "0"'),
    ({"5": 101}, "must be a number in -100..100"), ({"5": True}, "got true"),
    ({"999999": 0}, "token id 999999 is outside the vocabulary (0..49151)"),
    ([[5]], "[5] is not a [token, bias] pair"), ([[5, "x"]], 'the bias of token 5 must be'),
    ([[-3, 0]], "-3 is not a token id"), ([[None, 0]], "null is not a token id"),
    ([[999999, 0]], "token id 999999 is outside the vocabulary"),
])
def test_malformed_logit_bias_is_refused(local, bias, says):
    """A logit_bias that is not a map of token ids to biases in -100..100 is a 400 saying what is
    wrong with it (OpenAI checks both), zero biases included; it was accepted when every bias was
    0, and a string "0" was reported as an unsupported feature."""
    c, _ = local
    for path, body in (("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/completion", {"prompt": "Hi"})):
        err = _error(c.post(path, json={**body, "max_tokens": 1, "logit_bias": bias}))
        assert err["param"] == "logit_bias" and err["code"] == "invalid_value", err
        assert says in err["message"], err


def test_response_model_names_what_was_asked(local):
    """A response's "model" is the name the request used (any name this server answers to: the
    file's path was shown for a request that said "smollm2-135m"), else the served name; llama.cpp
    echoes the request's model too. `serve --alias NAME` (llama-server's) is the served name."""
    from pyminfer.cli import build_parser
    from pyminfer.server import ServerState

    c, state = local
    path = str(state.llm.model_path)
    for asked in (MODEL, path, state.llm.model_path.name):
        for route, body in (("/v1/completions", {"prompt": "Hi"}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                            ("/completion", {"prompt": "Hi"})):
            r = c.post(route, json={**body, "model": asked, "max_tokens": 1, "temperature": 0})
            assert r.status_code == 200 and r.json()["model"] == asked, (route, r.text)
    r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
    assert r.json()["model"] == state.model_id == MODEL
    args = build_parser().parse_args(["serve", "-m", path, "--alias", "coder"])
    assert args.alias == "coder"
    aliased = ServerState(lambda: state.llm, aliases=[args.alias, args.model])
    assert aliased.model_id == "coder" and {"coder", path} <= aliased.names()


def test_retrieve_model_head_health_and_cors(local):
    c, state = local
    for name in (MODEL, state.llm.name):
        r = c.get(f"/v1/models/{name}")
        assert r.status_code == 200, r.text
        assert r.json()["id"] == name and r.json()["object"] == "model"
    assert c.get(f"/models/{MODEL}").status_code == 200
    err = _error(c.get("/v1/models/gpt-4"), 404)
    assert err["code"] == "model_not_found" and "gpt-4" in err["message"]
    r = c.head("/health")
    assert r.status_code == 200 and r.content == b""
    # a browser's preflight, then its request: both answered for any origin
    r = c.options("/v1/chat/completions", headers={"Origin": "http://localhost:3000",
                                                   "Access-Control-Request-Method": "POST",
                                                   "Access-Control-Request-Headers": "content-type,authorization"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] in ("*", "http://localhost:3000")
    assert "POST" in r.headers["access-control-allow-methods"]
    r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, headers={"Origin": "http://x.test"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    r = c.post("/v1/completions", json={"prompt": 5}, headers={"Origin": "http://x.test"})  # errors too
    assert r.status_code == 400 and r.headers["access-control-allow-origin"] == "*"


def test_props(local):
    c, state = local
    p = c.get("/props").json()
    s = p["default_generation_settings"]
    assert s["n_ctx"] == state.llm.n_ctx == 256
    assert s["params"]["temperature"] == 0.8 and s["params"]["top_k"] == 40 and s["params"]["top_p"] == 0.95
    assert s["params"]["min_p"] == 0.05 and s["params"]["repeat_penalty"] == 1.0 and s["params"]["n_predict"] == -1
    assert p["total_slots"] == 1 and p["model_path"] == str(state.llm.model_path)
    assert p["chat_template"] == state.llm.tokenizer.chat_template and p["build_info"].startswith("pyminfer")


def test_slots(local):
    """llama.cpp's GET /slots: one slot (requests run one at a time), /props'
    default_generation_settings; ?fail_on_no_slot=1 is a 503 while it is busy (it was a 404)."""
    c, state = local
    r = c.get("/slots")
    assert r.status_code == 200
    sl = r.json()
    assert isinstance(sl, list) and len(sl) == 1 and sl[0] == c.get("/props").json()["default_generation_settings"]
    assert sl[0]["id"] == 0 and sl[0]["is_processing"] is False and sl[0]["n_ctx"] == state.llm.n_ctx
    assert c.get("/slots?fail_on_no_slot=1").status_code == 200
    with state.metrics.lock:
        state.metrics.processing += 1  # as while a generation runs
    try:
        assert c.get("/slots").json()[0]["is_processing"] is True
        err = _error(c.get("/slots?fail_on_no_slot=1"), 503)
        assert err["code"] == "no_slot_available"
    finally:
        with state.metrics.lock:
            state.metrics.processing -= 1
    # while a generation runs: its task id and settings (they were -1 and the defaults), as
    # llama-server's slot; /props keeps the defaults; after it, id_task -1 again
    from pyminfer.server import _job, _slot
    from pyminfer.sampling import SamplingParams

    seen: list[dict] = []
    params = SamplingParams(temperature=0.5, seed=7, stop=["zzz"], top_k=10)
    ids = state.llm.tokenize("Once upon a time")
    for n in (3, 4):
        _job(state, state.llm, ids, params, n, threading.Event(), lambda ch: seen.append(_slot(state)), True)
    assert len(seen) >= 5 and all(x["is_processing"] for x in seen)
    first, last = seen[0], seen[-1]
    assert last["id_task"] == first["id_task"] + 1 and first["id_task"] >= 0
    assert first["params"] | {"n_predict": 4} == last["params"] and first["params"]["n_predict"] == 3
    assert {k: first["params"][k] for k in ("seed", "temperature", "top_k", "stop", "stream")} == \
        {"seed": 7, "temperature": 0.5, "top_k": 10, "stop": ["zzz"], "stream": True}
    assert set(first["params"]) == set(sl[0]["params"])  # the same fields as the idle slot's
    assert c.get("/slots").json() == sl and c.get("/props").json()["default_generation_settings"] == sl[0]
    from pyminfer.engine import ContextFull

    with pytest.raises(ContextFull):  # a generation that fails leaves the slot idle too
        _job(state, state.llm, [ids[0]] * state.llm.n_ctx, params, 3, threading.Event(), None, True)
    assert state.task is None and c.get("/slots").json() == sl


def test_completion_prompt_shapes(local):
    """/v1/completions takes OpenAI's prompt shapes: text, token ids, and a batch of either
    ([["text"]] no: a batch holds strings or id lists). A batch of several answers one choice per
    prompt in order, each as that prompt alone, usage summed (it was a 400, "only one prompt");
    streamed it is a 400; a bad prompt in a batch is named by its index."""
    c, state = local
    ids = state.llm.tokenize("The capital of France is")
    body = {"max_tokens": 3, "temperature": 0}
    one = c.post("/v1/completions", json={"prompt": "The capital of France is", **body}).json()
    want = one["choices"][0]["text"]
    for p in (ids, ["The capital of France is"], [ids]):
        r = c.post("/v1/completions", json={"prompt": p, **body})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want, (p, r.text)
    other = c.post("/v1/completions", json={"prompt": "Once upon a time", **body}).json()
    for p in ([ids, state.llm.tokenize("Once upon a time")], ["The capital of France is", "Once upon a time"]):
        r = c.post("/v1/completions", json={"prompt": p, **body})
        assert r.status_code == 200, r.text
        got = r.json()
        assert [(ch["index"], ch["text"]) for ch in got["choices"]] == [(0, want), (1, other["choices"][0]["text"])]
        for k in ("prompt_tokens", "completion_tokens"):
            assert got["usage"][k] == one["usage"][k] + other["usage"][k], got
    err = _error(c.post("/v1/completions", json={"prompt": ["a", "b"], **body, "stream": True}))
    assert "cannot be streamed" in err["message"] and err["param"] == "prompt"
    err = _error(c.post("/v1/completions", json={"prompt": ["a", ""], **body}))
    assert err["message"].startswith("prompt 1: ") and "empty" in err["message"], err
    _error(c.post("/v1/completions", json={"prompt": [[1.5]], "max_tokens": 1}))
    # llama.cpp's /completion: an array of results, one per prompt
    r = c.post("/completion", json={"prompt": ["The capital of France is", "Once upon a time"], "n_predict": 3,
                                    "temperature": 0})
    assert r.status_code == 200, r.text
    assert [(x["index"], x["content"]) for x in r.json()] == [(0, want), (1, other["choices"][0]["text"])]


def test_mixed_prompt(local, monkeypatch):
    """llama.cpp's mixed prompt, text pieces and token ids in one list, is one prompt: each piece
    tokenized (the model's BOS and EOS only with a leading piece), the ids kept; on both endpoints."""
    c, state = local
    tok = state.llm.tokenizer
    monkeypatch.setattr(tok, "add_bos", True)  # SmolLM2 adds neither: make the rule visible
    monkeypatch.setattr(tok, "add_eos", True)
    mixed = c.post("/completion", json={"prompt": ["The capital of", 12, " France is", 13], "n_predict": 0,
                                        "cache_prompt": False}).json()
    want = tok.encode("The capital of") + [12] + tok.encode(" France is", add_bos=False, add_eos=False) + [13]
    assert want[0] == tok.bos_id and want.count(tok.bos_id) == 1 and mixed["tokens_evaluated"] == len(want), mixed
    tail_first = c.post("/completion", json={"prompt": [12, "x"], "n_predict": 0, "cache_prompt": False}).json()
    assert tail_first["tokens_evaluated"] == 1 + len(tok.encode("x", add_bos=False, add_eos=False)), tail_first
    monkeypatch.undo()
    head, tail = state.llm.tokenize("The capital of"), state.llm.tokenize(" France is", add_bos=False)
    for path, key in (("/completion", "content"), ("/v1/completions", None)):
        want = c.post(path, json={"prompt": head + tail, "max_tokens": 3, "temperature": 0}).json()
        got = c.post(path, json={"prompt": ["The capital of", *tail], "max_tokens": 3, "temperature": 0}).json()
        text = (lambda r: r[key]) if key else (lambda r: r["choices"][0]["text"])
        assert text(got) == text(want), (got, want)
        r = c.post(path, json={"prompt": [*head, " France is"], "max_tokens": 3, "temperature": 0}).json()
        assert text(r) == text(want), r
    err = _error(c.post("/completion", json={"prompt": ["x", 10**7], "max_tokens": 1}))
    assert err["param"] == "prompt" and "outside the vocabulary" in err["message"], err
    # llama.cpp's batches mix the three kinds (["string1", [12, 34, 56]], [[12, 34, "string", 56], [12, 34]]):
    # one result per prompt, each as the prompt alone (a batch of one mixed list too; they were a 400)
    kinds = ["The capital of France is", head + tail, ["The capital of", *tail]]
    alone = [c.post("/completion", json={"prompt": k, "max_tokens": 3, "temperature": 0}).json()["content"]
             for k in kinds]
    for batch in ([kinds[0], kinds[1]], [kinds[2], kinds[1], kinds[0]], [kinds[2]]):
        r = c.post("/completion", json={"prompt": batch, "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200, (batch, r.text)
        out = r.json()
        got = [o["content"] for o in out] if isinstance(out, list) else [out["content"]]
        assert got == [alone[kinds.index(k)] for k in batch], (batch, got)
    # a list of strings alone is a batch, not a batch element (llama.cpp's refusal too)
    for batch, i in (([["a"], ["b"]], 0), (["a", ["b"]], 1), ([["a"]], 0)):
        err = _error(c.post("/completion", json={"prompt": batch, "max_tokens": 1}))
        assert err["param"] == "prompt" and err["message"] == (
            f"prompt {i}: must be a string, a list of token ids, or a list of strings and token ids"), (batch, err)


def test_cache_prompt(local):
    """Requests reuse the K/V of the prefix they share with the last request (llama.cpp's
    cache_prompt, default true): reported as timings.cache_n and OpenAI's
    usage.prompt_tokens_details.cached_tokens (tokens_cached is llama.cpp's: what the cache holds
    after the request); cache_prompt false prefills the whole prompt; the text is the same either
    way (CPU)."""
    c, state = local
    body = {"prompt": "Once upon a time, in a land far away, there lived", "temperature": 0, "n_predict": 6}
    first = c.post("/completion", json={**body, "cache_prompt": False}).json()
    assert first["tokens_cached"] == first["tokens_evaluated"] + first["tokens_predicted"] - 1
    assert first["timings"]["prompt_n"] == first["tokens_evaluated"]
    assert first["timings"]["cache_n"] == 0
    again = c.post("/completion", json=body).json()
    assert again["timings"]["cache_n"] == again["tokens_evaluated"] - 1 and again["content"] == first["content"]
    r = c.post("/v1/completions", json={"prompt": body["prompt"], "temperature": 0, "max_tokens": 6}).json()
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == r["usage"]["prompt_tokens"] - 1
    assert r["choices"][0]["text"] == first["content"]
    r = c.post("/v1/completions", json={"prompt": body["prompt"], "temperature": 0, "max_tokens": 6,
                                        "cache_prompt": False}).json()
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    _error(c.post("/completion", json={**body, "cache_prompt": "yes"}), 400)


def test_llama_cpp_completion_endpoint(local):
    c, state = local
    body = {"prompt": "The capital of France is", "temperature": 0}
    ref = c.post("/v1/completions", json={**body, "max_tokens": 4}).json()
    r = c.post("/completion", json={**body, "n_predict": 4})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["content"] == ref["choices"][0]["text"] and d["stop"] is True and d["model"] == MODEL
    assert d["tokens_predicted"] == 4 and d["tokens_evaluated"] == ref["usage"]["prompt_tokens"]
    assert d["stop_type"] == "limit" and d["stopping_word"] == ""
    assert d["timings"]["predicted_n"] == 4
    # the same prompt again: all of it but its last token comes from the cache (llama.cpp's
    # cache_prompt; prompt_n counts the tokens prefilled, tokens_evaluated the whole prompt)
    assert d["timings"]["cache_n"] == d["tokens_evaluated"] - 1 and d["timings"]["prompt_n"] == 1
    assert d["tokens_cached"] == d["tokens_evaluated"] + 3  # llama.cpp's: the cache holds prompt + 4 - 1
    # a token-id prompt gives the same; a stop string is reported as llama.cpp does
    ids = state.llm.tokenize(body["prompt"])
    assert c.post("/completion", json={**body, "prompt": ids, "n_predict": 4}).json()["content"] == d["content"]
    full = c.post("/completion", json={**body, "n_predict": 8}).json()["content"]
    assert " " in full.strip()
    cut = full.strip().split(" ")[1]
    w = c.post("/completion", json={**body, "n_predict": 8, "stop": ["zzz", cut]}).json()
    assert w["stop_type"] == "word" and w["stopping_word"] == cut and w["content"] == full[:full.index(cut)]
    # no limit by default (llama.cpp's n_predict -1): runs to EOS or a full context
    d = c.post("/completion", json={"prompt": "Once upon a time", "temperature": 0, "repeat_penalty": 1.3}).json()
    # (a full context: every position fed, and one token more sampled from the last)
    assert d["stop_type"] == "eos" or (d["stop_type"] == "limit" and
                                       d["tokens_evaluated"] + d["tokens_predicted"] == state.llm.n_ctx + 1), d
    assert d["truncated"] is (d["stop_type"] == "limit"), d  # llama-server's flag for a stop at a full context
    assert w["truncated"] is False
    fill = state.llm.tokenize(" the") * (state.llm.n_ctx - 3)  # 4 positions left: stops at the full context
    f = c.post("/completion", json={"prompt": fill, "n_predict": 100, "temperature": 0}).json()
    assert (f["stop_type"], f["truncated"], f["tokens_predicted"]) == ("limit", True, 4), f
    assert d["tokens_predicted"] > 16  # more than /v1/completions' default
    # streamed: {"content", "stop": false} pieces, then the final object, and no [DONE]
    r = c.post("/completion", json={**body, "n_predict": 4, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(r)
    assert "[DONE]" not in events
    objs = [json.loads(e) for e in events]
    assert all(o["stop"] is False for o in objs[:-1]) and objs[-1]["stop"] is True
    assert "".join(o["content"] for o in objs) == ref["choices"][0]["text"]
    assert objs[-1]["tokens_predicted"] == 4 and objs[-1]["stop_type"] == "limit"
    err = _error(c.post("/completion", json={"n_predict": 2}))
    assert err["param"] == "prompt"


def test_no_limit_runs_to_the_full_context_as_an_explicit_one(local):
    """A prompt 11 positions short of n_ctx: /completion without n_predict (no limit) generates as
    many tokens as with a large explicit limit, and as /v1/completions (it stopped one short); the
    timings' two decode rates agree (llama.cpp: both from predicted_n)."""
    c, state = local
    n_ctx = state.llm.n_ctx
    ids = state.llm.tokenize("hello world " * 200)[:n_ctx - 11]
    body = {"prompt": ids, "temperature": 0, "repeat_penalty": 1.0}
    counts = [c.post("/completion", json=body).json()["tokens_predicted"],
              c.post("/completion", json={**body, "n_predict": 100}).json()["tokens_predicted"],
              c.post("/v1/completions", json={**body, "max_tokens": 100}).json()["usage"]["completion_tokens"]]
    assert counts[0] == counts[1] == counts[2], counts
    t = c.post("/completion", json={**body, "n_predict": 5}).json()["timings"]
    assert t["predicted_n"] == 5 and t["predicted_per_second"] * t["predicted_per_token_ms"] == pytest.approx(1000)


def test_tokenize_pieces_of_split_characters(local):
    """A character split over tokens: each piece's bytes as a list (llama.cpp), not three U+FFFD."""
    c, _ = local
    toks = c.post("/tokenize", json={"content": "🐵", "with_pieces": True}).json()["tokens"]
    assert len(toks) > 1 and all(isinstance(t["piece"], list) for t in toks), toks
    assert bytes(b for t in toks for b in t["piece"]).decode() == "🐵"
    toks = c.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert toks == [{"id": 19556, "piece": "Hello"}, {"id": 905, "piece": " world"}]


def test_null_content_is_a_400_except_with_tool_calls(local):
    c, _ = local
    for role in ("user", "system", "tool"):
        msgs = [{"role": "user", "content": "Hi"}, {"role": role, "content": None}] if role != "user" else \
            [{"role": "user", "content": None}]
        err = _error(_chat(c, msgs))
        assert err["param"] == f"messages.{len(msgs) - 1}.content" and "null" in err["message"], err
    err = _error(_chat(c, [{"role": "user"}]))  # missing is null
    assert err["param"] == "messages.0.content"
    err = _error(_chat(c, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}]))
    assert err["param"] == "messages.1.content"
    ok = [{"role": "user", "content": "Weather?"},
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    assert _chat(c, ok).status_code == 200


def test_request_work_runs_off_the_event_loop(local, monkeypatch):
    """Chat templates and tokenization grow with the request: they run in worker threads, not on
    the event loop (a 60 MB prompt there held every other request, /health too, for a minute
    before it was refused as longer than n_ctx)."""
    import asyncio

    c, state = local
    seen: list[str] = []

    def probe(fn):
        def wrapped(*a, **k):
            try:
                asyncio.get_running_loop()
                seen.append(f"loop:{fn.__name__}")
            except RuntimeError:  # no loop running in this thread
                seen.append("worker")
            return fn(*a, **k)
        return wrapped

    llm = state.llm
    for obj, name in ((llm, "prompt_ids"), (llm, "apply_chat_template"), (llm.tokenizer, "encode")):
        monkeypatch.setattr(obj, name, probe(getattr(obj, name)))
    for path, body in (("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
                       ("/completion", {"prompt": "Hi", "n_predict": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
                       ("/tokenize", {"content": "Hi"})):
        r = c.post(path, json=body)
        assert r.status_code == 200, (path, r.text)
    assert "worker" in seen and all(s == "worker" for s in seen), seen


def test_shutdown_ends_streams_with_an_error_event(local):
    """Ctrl-C (ServerState.begin_shutdown, from uvicorn's exit handler): a running stream stops at
    its next token and ends with a 503 error event and [DONE] (it was cancelled by uvicorn after
    its graceful period: a traceback in the log, and no end for the client); a request arriving
    then is a 503. A state of its own: the shared one must not be left closing."""
    from pyminfer.server import ServerState

    _, shared = local
    state = ServerState(lambda: shared.llm, aliases=[MODEL])
    with _serving(state, 60) as c:
        body = {"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": True}
        events = []
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 1:
                    state.begin_shutdown()
        assert events[-1] == "[DONE]", events
        err = json.loads(events[-2])["error"]
        assert err["code"] == "server_shutting_down" and err["type"] == "server_error", err
        assert len(events) < 100  # stopped early, not run to max_tokens
        for stream in (False, True):  # a request arriving then is a 503, a stream too (not a 200 stream)
            r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "stream": stream})
            assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down", r.text
        metrics = {ln.split()[0]: float(ln.split()[1]) for ln in c.get("/metrics").text.splitlines()
                   if ln and not ln.startswith("#")}
        # the stopped stream and the two 503s are errors; none is a client disconnect
        assert metrics["pyminfer_request_errors_total"] == 3 and metrics["pyminfer_requests_cancelled_total"] == 0, metrics


def test_shutdown_stops_echo_scoring(local, monkeypatch):
    """OpenAI's echo with logprobs scores the prompt (LLM.prompt_logprobs) before generating; that
    scoring is tracked as a generation is: the server shutting down during it stops it before its
    next forward and answers 503 (it ran every chunk of the prompt, untracked, before)."""
    from pyminfer.server import ServerState

    _, shared = local
    llm = shared.llm
    state = ServerState(lambda: llm, aliases=[MODEL])
    ids = llm.tokenize("one two three four five six seven eight nine ten " * 16)[:200]
    assert len(ids) > 2 * llm.model.max_nt
    calls = []
    real = llm.model.forward

    def spy(tokens, *a, **kw):
        calls.append(len(tokens))
        if len(calls) == 1:
            state.begin_shutdown()
        return real(tokens, *a, **kw)

    with _serving(state, 60) as c:
        monkeypatch.setattr(llm.model, "forward", spy)
        r = c.post("/v1/completions", json={"prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 1,
                                            "temperature": 0})
        monkeypatch.undo()
        assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down", r.text
        assert calls == [llm.model.max_nt]  # one chunk, then stopped
        metrics = {ln.split()[0]: float(ln.split()[1]) for ln in c.get("/metrics").text.splitlines()
                   if ln and not ln.startswith("#")}
        assert metrics["pyminfer_requests_processing"] == 0 and metrics["pyminfer_requests_cancelled_total"] == 0


def test_sigterm_mid_stream_ends_it_cleanly(tmp_path):
    """SIGTERM to a real `pyminfer serve` (uvicorn's shutdown, on the event loop): the running
    stream gets the 503 event and [DONE], the process exits, and the log has no traceback."""
    import signal

    ensure_model(MODEL, progress=False)
    port = _free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pyminfer", "serve", "-m", MODEL, "--device", "cpu", "-c", "1024",
                                 "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.time() + 120
            while True:
                assert proc.poll() is None and time.time() < deadline, log_path.read_text()
                try:
                    if httpx.get(base + "/health", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            events = []
            body = {"prompt": "Once upon a time", "max_tokens": 900, "temperature": 0, "stream": True}
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        if len(events) == 1:
                            proc.send_signal(signal.SIGTERM)
            assert events[-1] == "[DONE]", events[-3:]
            assert json.loads(events[-2])["error"]["code"] == "server_shutting_down"
            assert proc.wait(30) is not None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log_path.read_text()
    assert "Traceback" not in text and "timeout graceful shutdown exceeded" not in text, text


def test_port_in_use_is_a_pyminfer_error():
    """A port another process holds: uvicorn logs the bind error and exited 3; `pyminfer serve` now
    ends with its own one-line error and status 1, as for its other startup errors."""
    ensure_model(MODEL, progress=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "pyminfer", "serve", "-m", MODEL, "--device", "cpu",
                              "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert f"pyminfer: error: the server could not start on 127.0.0.1:{port}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


# ------------------------------------------------------------------ fill-in-the-middle
FIM_PREFIX = "def add(a, b):\n    "
FIM_SUFFIX = "\n\nprint(add(1, 2))\n"


def test_fim_refused_for_a_model_without_fim_tokens(local):
    """SmolLM2 has no FIM prefix / suffix / middle tokens: /infill is a 501 (llama.cpp's server), a
    suffix on a completion a 400 naming it; a chat never takes a suffix; bad /infill fields are 400s
    before any of that."""
    c, _ = local
    err = _error(c.post("/infill", json={"input_prefix": FIM_PREFIX, "input_suffix": FIM_SUFFIX}), 501)
    assert err["type"] == "not_supported_error" and "cannot fill in the middle" in err["message"]
    for path in ("/v1/completions", "/completion"):
        err = _error(c.post(path, json={"prompt": FIM_PREFIX, "suffix": FIM_SUFFIX, "max_tokens": 1}))
        assert err["param"] == "suffix" and err["code"] == "unsupported_parameter", err
        assert "cannot fill in the middle" in err["message"]
        err = _error(c.post(path, json={"prompt": [1, 2], "suffix": FIM_SUFFIX, "max_tokens": 1}))
        assert err["param"] == "prompt" and "one text prompt" in err["message"]
    err = _error(c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                      "suffix": "x", "max_tokens": 1}))
    assert err["param"] == "suffix" and err["code"] == "unsupported_parameter"
    for body in ({"input_prefix": 5}, {"input_extra": "x"}, {"input_extra": [{"text": 5}]},
                 {"input_extra": [{"filename": "a.py"}]}, {"input_extra": [{"text": "x", "filename": 3}]},
                 {"prompt": [1, 2]}, {"suffix": "x"}):
        err = _error(c.post("/infill", json={"input_suffix": "", **body}))
        assert err["param"] and err["param"].split(".")[0] in body, (body, err)


@pytest.fixture(scope="module")
def qwen_app(qwen05_path):
    """An in-process app over the real Qwen2.5-Coder-0.5B (FIM tokens), CPU, n_ctx 256."""
    from pyminfer import LLM
    from pyminfer.server import ServerState

    llm = LLM(str(qwen05_path), device="cpu", n_ctx=256)
    with _serving(ServerState(lambda: llm, aliases=["qwen"]), 60) as c:
        yield c, llm
    llm.close()


def test_infill_writes_the_middle(qwen_app):
    """/infill (llama.cpp's shape, also streamed) and a /v1/completions suffix give the same greedy
    middle for the same FIM prompt; a prefix far longer than the context is cut, not refused."""
    from pyminfer import InfillChunk
    from pyminfer.infill import infill_ids

    c, llm = qwen_app
    body = {"input_prefix": FIM_PREFIX, "input_suffix": FIM_SUFFIX, "n_predict": 6, "temperature": 0,
            "cache_prompt": False}
    r = c.post("/infill", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["content"].startswith("return a + b"), out
    assert out["tokens_evaluated"] == len(infill_ids(llm.tokenizer, FIM_PREFIX, FIM_SUFFIX, n_ctx=256, n_predict=6))
    oa = c.post("/v1/completions", json={"prompt": FIM_PREFIX, "suffix": FIM_SUFFIX, "max_tokens": 6,
                                         "temperature": 0}).json()
    assert oa["choices"][0]["text"] == out["content"]
    pieces = []
    with c.stream("POST", "/infill", json={**body, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: "):
                pieces.append(json.loads(line[6:]))
    assert pieces[-1]["stop"] and "".join(p["content"] for p in pieces) == out["content"]
    long = c.post("/infill", json={**body, "input_prefix": "x = 1\n" * 500 + FIM_PREFIX,
                                   "input_extra": [{"filename": "b.py", "text": "y = 2\n" * 500}]})
    assert long.status_code == 200 and long.json()["tokens_evaluated"] < 256, long.text
    err = _error(c.post("/infill", json={**body, "prompt": "q = 1\n" * 300}))  # only the prompt is not cut
    assert err["param"] == "prompt" and err["code"] == "context_length_exceeded"
    huge = _error(c.post("/infill", json={**body, "prompt": "q" * (2 * llm.n_ctx * llm.tokenizer.max_token_bytes)}))
    assert huge["param"] == "prompt" and "characters, at least" in huge["message"], huge
    # llama.vim's chunks carry a "time" key; a null filename is the default; a one-prompt batch takes a suffix
    extra = [{"filename": "a.py", "text": "import os\n", "time": 123}, {"filename": None, "text": "x = 1\n"}]
    r = c.post("/infill", json={**body, "input_extra": extra})
    want = infill_ids(llm.tokenizer, FIM_PREFIX, FIM_SUFFIX, n_ctx=256, n_predict=6,
                      extra=[InfillChunk("import os\n", "a.py"), InfillChunk("x = 1\n")])
    assert r.status_code == 200 and r.json()["tokens_evaluated"] == len(want), r.text
    one = c.post("/v1/completions", json={"prompt": [FIM_PREFIX], "suffix": FIM_SUFFIX, "max_tokens": 6,
                                          "temperature": 0}).json()
    assert one["choices"][0]["text"] == out["content"]


# llama.vim's request (its s:fim_send: fields and values as it sends them; n_indent, the
# cursor line's indentation)
LLAMA_VIM = {"input_prefix": FIM_PREFIX, "input_suffix": FIM_SUFFIX, "input_extra": [], "prompt": "",
             "n_predict": 8, "n_indent": 4, "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"],
             "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
             "response_fields": ["content", "timings/prompt_n", "timings/predicted_n", "timings/predicted_ms",
                                 "truncated", "tokens_cached"]}


def test_llama_vim_default_request(qwen_app):
    """llama.vim's default /infill request is answered (it was a 400 for samplers and
    t_max_predict_ms): the infill sampler, n_indent, and only the response_fields asked for, a
    nested one under its path; the seeded draw is reproducible; its warm-up request (n_predict 0,
    samplers []) generates nothing."""
    c, llm = qwen_app
    r = c.post("/infill", json={**LLAMA_VIM, "seed": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"content", "timings/prompt_n", "timings/predicted_n", "timings/predicted_ms", "truncated",
                        "tokens_cached"}, out
    assert out["content"].startswith("return a"), out  # the infill sampler keeps only likely pieces here
    assert 0 < out["timings/predicted_n"] <= 8 and out["truncated"] is False
    assert c.post("/infill", json={**LLAMA_VIM, "seed": 3}).json()["content"] == out["content"]
    warm = c.post("/infill", json={**LLAMA_VIM, "n_predict": 0, "samplers": [], "temperature": 0.0,
                                   "t_max_predict_ms": 1, "response_fields": [""]})
    assert warm.status_code == 200 and warm.json() == {}, warm.text
    full = c.post("/infill", json={**LLAMA_VIM, "seed": 3, "response_fields": None}).json()
    assert full["content"] == out["content"] and full["stop_type"] in ("eos", "limit"), full
    # the chain and n_indent reach the generation: the same seed through LLM.infill
    res = llm.infill(FIM_PREFIX, FIM_SUFFIX, max_tokens=8, top_k=40, top_p=0.9, samplers=["top_k", "top_p", "infill"],
                     n_indent=4, seed=3, cache_prompt=False)
    assert res.text == out["content"]
    # n_indent cuts a completion that goes on past the function (greedy): stop_type limit
    body = {"input_prefix": "def add(a, b):\n", "input_suffix": "", "n_predict": 40, "temperature": 0,
            "cache_prompt": False}
    free = c.post("/infill", json=body).json()
    cut = c.post("/infill", json={**body, "n_indent": 4}).json()
    assert free["content"].startswith(cut["content"]) and len(cut["content"]) < len(free["content"]), (free, cut)
    assert cut["stop_type"] == "limit"


def test_sampler_chain_fields(local):
    """samplers as llama.cpp's server takes them: names or letter codes, in order; unknown ones, a
    malformed value, and an infill sampler without a top_k before it are 400s naming samplers;
    n_indent < 0 is a 400."""
    c, _ = local
    base = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    plain = c.post("/completion", json=base).json()["content"]
    for chain in (["top_k", "temperature"], "kt", ["penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                                   "temperature"], "edkypmxt"):
        r = c.post("/completion", json={**base, "samplers": chain})
        assert r.status_code == 200 and r.json()["content"] == plain, (chain, r.text)
    for bad, says in ((["top_k", "nucleus"], "unknown sampler 'nucleus'"), ("kq", "unknown sampler code 'q'"),
                      ({"top_k": 1}, "list of sampler names"), (["infill"], "top_k between 1 and 1024"),
                      ([5], None)):
        err = _error(c.post("/completion", json={**base, "samplers": bad}))
        assert err["param"] and err["param"].startswith("samplers"), (bad, err)
        assert says is None or says in err["message"], (bad, err)
    err = _error(c.post("/completion", json={**base, "n_indent": -1}))
    assert err["param"] == "n_indent"
    props = c.get("/props").json()["default_generation_settings"]["params"]
    assert props["samplers"] == ["penalties", "top_k", "top_p", "min_p", "temperature"] and props["n_indent"] == 0


def test_completion_generation_settings_name_the_seed(local):
    """llama-server's /completion answers with generation_settings (/slots' params); here its seed is
    the one the sampler used, drawn when the request gave none, so the run can be repeated."""
    c, _ = local
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.5, "top_k": 0}
    r = c.post("/completion", json=body).json()
    g = r["generation_settings"]
    assert isinstance(g["seed"], int) and 0 <= g["seed"] < 2**32
    assert (g["n_predict"], g["temperature"], g["top_k"], g["stream"]) == (8, 1.5, 0, False)
    again = c.post("/completion", json={**body, "seed": g["seed"]}).json()
    assert again["content"] == r["content"] and again["generation_settings"] == g
    assert c.post("/completion", json={**body, "seed": 3}).json()["generation_settings"]["seed"] == 3


def test_logprobs_in_each_api_shape(local):
    """Token log-probabilities as each API gives them, equal to the Python API's (LLM.generate
    logprobs): OpenAI chat (logprobs true, top_logprobs), completions (logprobs n, text_offset),
    llama.cpp's /completion (n_probs: completion_probabilities); streamed pieces carry their
    tokens' entries and add up to the whole; wrong shapes are 400s."""
    c, state = local
    llm = state.llm
    base = {"max_tokens": 5, "temperature": 0, "cache_prompt": False}
    want = llm.generate("1\n2\n3\n", max_tokens=5, temperature=0, logprobs=2, cache_prompt=False).logprobs
    piece = lambda i: llm.tokenizer.token_to_piece(i).decode("utf-8", errors="replace")  # noqa: E731
    r = c.post("/v1/completions", json={**base, "prompt": "1\n2\n3\n", "logprobs": 2}).json()
    lp = r["choices"][0]["logprobs"]
    assert lp["tokens"] == [piece(e.id) for e in want] and lp["token_logprobs"] == [e.logprob for e in want]
    assert lp["top_logprobs"] == [{piece(i): v for i, v in e.top} for e in want]
    assert lp["text_offset"] == [e.offset for e in want] and "".join(lp["tokens"]) == r["choices"][0]["text"]
    n = c.post("/completion", json={**base, "prompt": "1\n2\n3\n", "n_probs": 2}).json()
    assert [(p["id"], p["logprob"]) for p in n["completion_probabilities"]] == [(e.id, e.logprob) for e in want]
    assert [[t["id"] for t in p["top_logprobs"]] for p in n["completion_probabilities"]] == \
        [[i for i, _ in e.top] for e in want]
    msgs = [{"role": "user", "content": "Hi"}]
    ch = c.post("/v1/chat/completions", json={**base, "messages": msgs, "logprobs": True, "top_logprobs": 1}).json()
    content = ch["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == ch["choices"][0]["message"]["content"]
    assert all(len(e["top_logprobs"]) == 1 and e["top_logprobs"][0]["token"] == e["token"] for e in content)
    assert bytes(sum((e["bytes"] for e in content), [])).decode() == ch["choices"][0]["message"]["content"]
    plain = c.post("/v1/chat/completions", json={**base, "messages": msgs}).json()["choices"][0]
    assert plain["logprobs"] is None and plain["message"] == ch["choices"][0]["message"]
    streamed = []
    with c.stream("POST", "/v1/chat/completions", json={**base, "messages": msgs, "logprobs": True,
                                                         "top_logprobs": 1, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                d = json.loads(line[6:])["choices"][0]
                streamed += (d["logprobs"] or {"content": []})["content"]
    assert streamed == content
    for path, body, param in (("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
                              ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
                              ("/v1/completions", {"prompt": "x", "top_logprobs": 2}, "top_logprobs"),
                              ("/v1/chat/completions", {"messages": msgs, "logprobs": 2}, "logprobs"),
                              ("/v1/chat/completions", {"messages": msgs, "top_logprobs": 2}, "top_logprobs"),
                              ("/v1/chat/completions", {"messages": msgs, "logprobs": True, "top_logprobs": 30},
                               "top_logprobs")):
        err = _error(c.post(path, json={**base, **body}))
        assert err["param"] == param, (path, body, err)
    # top_logprobs 0 asks for nothing: accepted without logprobs (vLLM; clients send it by default),
    # but not out of range
    zero = c.post("/v1/chat/completions", json={**base, "messages": msgs, "top_logprobs": 0})
    assert zero.status_code == 200 and zero.json()["choices"][0] == plain
    assert _error(c.post("/v1/chat/completions", json={**base, "messages": msgs, "top_logprobs": -1}))["param"] == \
        "top_logprobs"
    # llama.cpp's n_probs has no limit of 20, and a chat takes it too (llama.cpp passes it through)
    many = c.post("/completion", json={**base, "prompt": "x", "max_tokens": 1, "n_probs": 25}).json()
    assert len(many["completion_probabilities"][0]["top_logprobs"]) == 25
    ch2 = c.post("/v1/chat/completions", json={**base, "messages": msgs, "n_probs": 1}).json()["choices"][0]
    assert ch2["logprobs"]["content"] == content
    # a sampled token outside the top n is still in its completion entry (OpenAI: up to n + 1)
    hot = c.post("/v1/completions", json={"prompt": "The weather today is", "max_tokens": 12, "seed": 5,
                                          "temperature": 1.5, "samplers": [], "logprobs": 1}).json()
    lp = hot["choices"][0]["logprobs"]
    assert all(t in top and len(top) <= 2 for t, top in zip(lp["tokens"], lp["top_logprobs"]))
    assert any(len(top) == 2 for top in lp["top_logprobs"]), lp  # some token was not the most likely


def test_echo_with_prompt_logprobs(local):
    """OpenAI's echo on /v1/completions, as evaluation harnesses send it (lm-eval's
    local-completions: token-id prompts in a batch, max_tokens 1, echo, logprobs 1): the prompt's
    text first, its tokens' logprobs (the first null) equal to LLM.prompt_logprobs, then the
    generated token's; offsets index the echoed text; streamed, the echo is the first piece. A
    chat or /completion refuses echo."""
    c, state = local
    llm = state.llm
    a, b = llm.tokenize("The capital of France is"), llm.tokenize("1\n2\n3\n")
    r = c.post("/v1/completions", json={"prompt": [a, b], "max_tokens": 1, "temperature": 0, "echo": True,
                                        "logprobs": 1, "cache_prompt": False}).json()
    for ids, ch in zip((a, b), r["choices"]):
        lp = ch["logprobs"]
        want = llm.prompt_logprobs(ids, 1)
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["token_logprobs"][1:len(ids)] == [e.logprob for e in want[1:]]
        assert len(lp["tokens"]) == len(ids) + 1 and ch["text"].startswith(llm.detokenize(ids))
        assert all(ch["text"][o:].startswith(t) for o, t in zip(lp["text_offset"], lp["tokens"]))
        gen = llm.generate(ids, max_tokens=1, temperature=0, logprobs=1)
        assert lp["token_logprobs"][-1] == gen.logprobs[0].logprob and ch["text"] == llm.detokenize(ids) + gen.text
    plain = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0, "echo": True}).json()
    assert plain["choices"][0]["text"].startswith("Hi") and plain["choices"][0]["logprobs"] is None
    pieces = []
    with c.stream("POST", "/v1/completions", json={"prompt": "1\n2\n", "max_tokens": 2, "temperature": 0,
                                                   "echo": True, "logprobs": 0, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                pieces.append(json.loads(line[6:])["choices"][0])
    assert pieces[0]["text"] == "1\n2\n" and pieces[0]["logprobs"]["token_logprobs"][0] is None
    whole = c.post("/v1/completions", json={"prompt": "1\n2\n", "max_tokens": 2, "temperature": 0, "echo": True,
                                            "logprobs": 0}).json()["choices"][0]
    assert "".join(p["text"] for p in pieces) == whole["text"]
    assert sum((p["logprobs"]["token_logprobs"] for p in pieces if p["logprobs"]), []) == \
        whole["logprobs"]["token_logprobs"]
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/completion", {"prompt": "Hi"})):
        err = _error(c.post(path, json={**body, "max_tokens": 1, "echo": True}))
        assert err["param"] == "echo" and err["code"] == "unsupported_parameter", err


def test_every_sampling_setting_reaches_the_generation(monkeypatch):
    """_job hands LLM.generate every SamplingParams field (samplers, n_indent, ... were once parsed
    and checked, then dropped on the way)."""
    import dataclasses
    import threading

    from pyminfer import server as srv
    from pyminfer.sampling import SamplingParams

    seen = {}

    class FakeLLM:
        def generate(self, ids, **kw):
            seen.update(kw)
            yield from ()

    class FakeMetrics:
        lock = threading.Lock()

        def add(self, *a):
            pass

    class FakeState:
        metrics = FakeMetrics()
        closing = threading.Event()
        task, n_tasks = None, 0  # what /slots shows (_job sets them)

    srv._job(FakeState(), FakeLLM(), [1], SamplingParams(), 4, threading.Event(), None)
    missing = {f.name for f in dataclasses.fields(SamplingParams)} - set(seen)
    assert not missing, missing


def test_n_predict_0_warms_the_cache(local):
    """n_predict 0 (llama.cpp's cache warm-up, as editor plugins send it): nothing is generated but
    the prompt is evaluated, so the next request sharing it prefills only the rest."""
    c, _ = local
    p = " ".join(["The quick brown fox jumps over the lazy dog."] * 3)
    c.post("/completion", json={"prompt": "Unrelated.", "n_predict": 1})
    w = c.post("/completion", json={"prompt": p, "n_predict": 0}).json()
    assert w["content"] == "" and w["tokens_predicted"] == 0 and w["timings"]["prompt_n"] == w["tokens_evaluated"]
    r = c.post("/completion", json={"prompt": p + " And then", "n_predict": 1}).json()
    assert w["tokens_cached"] == w["tokens_evaluated"]
    assert r["timings"]["cache_n"] == w["tokens_evaluated"] and r["timings"]["prompt_n"] == r["tokens_evaluated"] \
        - w["tokens_evaluated"], r


def test_apply_template_and_v1_health(local):
    """llama.cpp's /apply-template: the prompt text a chat request renders to (what the chat
    endpoint then tokenizes), message errors as the chat's; /v1/health as /health."""
    c, state = local
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = c.post("/apply-template", json={"messages": msgs})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": state.llm.apply_chat_template(msgs, add_generation_prompt=True)}
    assert r.json()["prompt"].endswith("<|im_start|>assistant\n")
    err = _error(c.post("/apply-template", json={"messages": [{"role": "wizard", "content": "Hi"}]}))
    assert err["param"].startswith("messages")
    assert _error(c.post("/apply-template", json={"messages": []}))["param"] == "messages"
    assert c.get("/v1/health").json() == {"status": "ok"} and c.head("/v1/health").status_code == 200


def test_assistant_prefill(local):
    """A chat ending with an assistant message continues it (llama.cpp's server default; vLLM's
    continue_final_message=true), the answer being only the continuation; continue_final_message
    false answers with a new turn; true without a last assistant message is a 400; a server started
    with --no-prefill-assistant (ServerState(prefill_assistant=False)) starts a new turn by default."""
    from pyminfer.server import ServerState

    c, state = local
    q = {"role": "user", "content": "What is the capital of France?"}
    a = {"role": "assistant", "content": "The capital of France is"}
    body = {"messages": [q, a], "max_tokens": 4, "temperature": 0, "cache_prompt": False}
    want = state.llm.chat([q, a], continue_final_message=True, max_tokens=4, temperature=0, cache_prompt=False)
    for extra in ({}, {"continue_final_message": True}):
        r = c.post("/v1/chat/completions", json={**body, **extra})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == want.text and want.text.startswith(" Paris")
        assert r.json()["usage"]["prompt_tokens"] == len(want.prompt_ids)
    prompt = c.post("/apply-template", json={"messages": [q, a]}).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\nThe capital of France is")
    closed = c.post("/apply-template", json={"messages": [q, a], "continue_final_message": False}).json()["prompt"]
    assert closed.endswith("The capital of France is<|im_end|>\n<|im_start|>assistant\n")
    err = _error(c.post("/v1/chat/completions", json={**body, "messages": [q], "continue_final_message": True}))
    assert err["param"] == "messages.0" and "must be an assistant message" in err["message"]
    assert _error(c.post("/v1/chat/completions", json={**body, "continue_final_message": "yes"}))["param"] \
        == "continue_final_message"
    # vLLM's add_generation_prompt: false renders the closed conversation; with continue true, moot;
    # both true is a 400; two assistant messages at the end cannot be continued (llama.cpp)
    bare = c.post("/apply-template", json={"messages": [q, a], "add_generation_prompt": False}).json()["prompt"]
    assert bare == closed[:-len("<|im_start|>assistant\n")]
    assert c.post("/apply-template", json={"messages": [q, a], "add_generation_prompt": False,
                                           "continue_final_message": True}).json()["prompt"] == prompt
    err = _error(c.post("/apply-template", json={"messages": [q, a], "add_generation_prompt": True,
                                                 "continue_final_message": True}))
    assert err["param"] == "add_generation_prompt"
    assert c.post("/apply-template", json={"messages": [q, a], "add_generation_prompt": True}).json()["prompt"] \
        == closed
    err = _error(c.post("/v1/chat/completions", json={**body, "messages": [q, a, a]}))
    assert err["param"] == "messages.1" and "both assistant messages" in err["message"]
    with _serving(ServerState(lambda: state.llm, aliases=[MODEL], prefill_assistant=False), 60) as c2:
        assert c2.post("/apply-template", json={"messages": [q, a]}).json()["prompt"] == closed
        assert c2.post("/apply-template", json={"messages": [q, a], "continue_final_message": True}).json()[
            "prompt"] == prompt


def test_no_prefill_assistant_flag_parses():
    from pyminfer.cli import build_parser

    ap = build_parser()
    assert ap.parse_args(["serve", "--no-prefill-assistant"]).no_prefill_assistant is True
    assert ap.parse_args(["serve"]).no_prefill_assistant is False


def test_serve_sampling_flags_set_request_defaults(smol_path):
    """`pyminfer serve --temp 0 --top-k 1 --samplers ...`, as llama-server's flags: the defaults
    of requests that leave those fields out (and /props says so); a request's own value wins; a
    bad flag value ends `serve` before it starts."""
    import subprocess

    from pyminfer import LLM
    from pyminfer.cli import _params, build_parser
    from pyminfer.server import ServerState

    args = build_parser().parse_args(["serve", "--temp", "0", "--top-k", "7", "--seed", "5",
                                      "--samplers", "top_k;temperature"])
    defaults = _params(args)
    llm = LLM(str(smol_path), device="cpu", n_ctx=256)
    with _serving(ServerState(lambda: llm, defaults=defaults), 60) as c:
        body = {"prompt": "The capital of France is", "max_tokens": 6, "cache_prompt": False}
        greedy = llm.generate(body["prompt"], max_tokens=6, temperature=0, cache_prompt=False).text
        texts = {c.post("/completion", json=body).json()["content"] for _ in range(3)}
        assert texts == {greedy}, texts  # temperature 0 by default now
        hot = {c.post("/completion", json={**body, "temperature": 2.0, "top_k": 0, "seed": s}).json()["content"]
               for s in range(4)}
        assert len(hot) > 1, hot  # the request's own values win
        p = c.get("/props").json()["default_generation_settings"]["params"]
        assert (p["temperature"], p["top_k"], p["seed"], p["samplers"]) == (0.0, 7, 5, ["top_k", "temperature"])
    llm.close()
    out = subprocess.run([sys.executable, "-m", "pyminfer", "serve", "-m", str(smol_path), "--samplers", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "unknown sampler 'nope'" in out.stderr and "Traceback" not in out.stderr
