"""``pyminfer serve``: a real uvicorn server in a subprocess, driven with the official openai client
and httpx; plus the loading state through an in-process app."""

from __future__ import annotations

import concurrent.futures
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
    # the server stops that generation and serves the next request
    deadline = time.time() + 60
    while _metric(server, "pyminfer_requests_cancelled_total") <= before:
        assert time.time() < deadline, "the generation was not cancelled"
        time.sleep(0.2)
    r = httpx.post(server + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0}, timeout=60)
    assert r.status_code == 200
    assert _metric(server, "pyminfer_requests_processing") == 0


def test_metrics(server):
    httpx.post(server + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0}, timeout=60)
    text = httpx.get(server + "/metrics").text
    assert "# TYPE pyminfer_prompt_tokens_total counter" in text
    assert _metric(server, "pyminfer_prompt_tokens_total") > 0
    assert _metric(server, "pyminfer_tokens_predicted_total") > 0
    assert _metric(server, "pyminfer_predicted_tokens_per_second") > 0
    assert 'pyminfer_spec_accepted_tokens_at_position_total{position="1"}' in text
    assert "pyminfer_spec_rounds_total 0" in text


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
    from starlette.testclient import TestClient

    from pyminfer import LLM
    from pyminfer.server import ServerState, create_app

    path = str(ensure_model(MODEL, progress=False))
    state = ServerState(lambda: LLM(path, draft_model=path, device="cpu", n_ctx=256, spec_draft_n=3), aliases=[MODEL])
    with TestClient(create_app(state)) as c:
        deadline = time.time() + 60
        while c.get("/health").status_code != 200:
            assert time.time() < deadline and state.load_error is None
            time.sleep(0.1)
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5,
                                            "temperature": 0})
        assert r.status_code == 200 and r.json()["timings"]["draft_n"] > 0
        text = c.get("/metrics").text
        vals = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln and not ln.startswith("#")}
        assert vals["pyminfer_spec_rounds_total"] > 0
        assert vals["pyminfer_spec_draft_tokens_total"] >= vals["pyminfer_spec_accepted_tokens_total"] > 0
        assert vals['pyminfer_spec_draft_tokens_at_position_total{position="1"}'] > 0
    state.llm.close()


def test_unhandled_error_is_a_500_and_the_connection_survives(monkeypatch):
    """An exception no handler maps becomes a 500 JSON body (type server_error), and it is not
    re-raised (Starlette's outermost middleware re-raises after answering; uvicorn then dropped the
    keep-alive connection, so the client's next request failed). In process: TestClient re-raises
    server exceptions by default, so this test fails without the catch-all middleware."""
    from starlette.testclient import TestClient

    from pyminfer import LLM
    from pyminfer.server import ServerState, create_app

    path = str(ensure_model(MODEL, progress=False))
    state = ServerState(lambda: LLM(path, device="cpu", n_ctx=128), aliases=[MODEL])
    with TestClient(create_app(state)) as c:
        deadline = time.time() + 60
        while c.get("/health").status_code != 200:
            assert time.time() < deadline and state.load_error is None
            time.sleep(0.1)

        def boom(*a, **k):
            raise RuntimeError("injected failure")

        monkeypatch.setattr(state.llm, "tokenize", boom)
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
    """logprobs, echo, penalties other than repeat_penalty, tools, ...: a 400 naming the field when
    a request asks for them (a silently ignored field is a wrong answer); neutral values pass."""
    from starlette.testclient import TestClient

    from pyminfer import LLM
    from pyminfer.server import ServerState, create_app

    path = str(ensure_model(MODEL, progress=False))
    state = ServerState(lambda: LLM(path, device="cpu", n_ctx=128), aliases=[MODEL])
    base = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    with TestClient(create_app(state)) as c:
        deadline = time.time() + 60
        while c.get("/health").status_code != 200:
            assert time.time() < deadline and state.load_error is None
            time.sleep(0.1)
        for extra in ({"logprobs": 2}, {"echo": True}, {"frequency_penalty": 0.5}, {"presence_penalty": -1},
                      {"best_of": 3}, {"logit_bias": {"10": 5}}):
            r = c.post("/v1/completions", json={**base, **extra})
            assert r.status_code == 400 and next(iter(extra)) in r.json()["error"]["message"], (extra, r.text)
        r = c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
                                                 "tools": [{"type": "function", "function": {"name": "f"}}]})
        assert r.status_code == 400 and "tools" in r.json()["error"]["message"]
        neutral = {"logprobs": None, "echo": False, "frequency_penalty": 0, "presence_penalty": 0.0, "best_of": 1,
                   "logit_bias": {}, "response_format": {"type": "text"}}
        assert c.post("/v1/completions", json={**base, **neutral}).status_code == 200
    state.llm.close()
