"""pyminfer.tokenizer against llama.cpp's golden tokenizations (/work/shared/golden).

Every golden string, with and without special parsing, for Qwen2.5-Coder (0.5B file) and SmolLM2:
ids, pieces, detokenization, streaming detokenization; plus the chat template and prompt ids of the
generate_* goldens.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pyminfer.models import ensure_model
from pyminfer.tokenizer import (
    StreamDecoder,
    Tokenizer,
    UnsupportedTokenizerError,
    read_gguf_tokenizer_metadata,
)

GOLDEN = Path("/work/shared/golden")
MODES = ("parse_special", "no_parse_special")

# model name -> (tokenizer golden, generate golden)
MODELS = {
    "qwen2.5-coder-0.5b": ("tokenizer_qwen2.5-coder.json", "generate_qwen2.5-coder-0.5b.json"),
    "smollm2-135m": ("tokenizer_smollm2-135m.json", "generate_smollm2-135m.json"),
}


def _load(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text(encoding="utf-8"))


TOK_CASES = [(m, c) for m, (tf, _) in MODELS.items() for c in _load(tf)["cases"]]
GEN_CASES = [(m, c) for m, (_, gf) in MODELS.items() for c in _load(gf)["cases"]]


@pytest.fixture(scope="module")
def toks() -> dict[str, Tokenizer]:
    """One Tokenizer per model, loaded on first use and cached for the module."""

    class _Lazy(dict):
        def __missing__(self, key: str) -> Tokenizer:
            t = Tokenizer.from_gguf(ensure_model(key))
            self[key] = t
            return t

    return _Lazy()


def _case_id(mc) -> str:
    return f"{mc[0]}:{mc[1]['id']}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_case", TOK_CASES, ids=[_case_id(x) for x in TOK_CASES])
def test_golden_ids_and_pieces(toks, model_case, mode):
    model, case = model_case
    tok = toks[model]
    gold = case[mode]
    assert bytes.fromhex(case["text_utf8_hex"]).decode("utf-8") == case["text"]

    ids = tok.encode(case["text"], parse_special=(mode == "parse_special"))
    assert ids == gold["ids"]

    assert [tok.token_to_piece(i).hex() for i in ids] == gold["pieces_hex"]

    detok = tok.decode(ids)
    assert detok == gold["detok"]
    assert (detok == case["text"]) == gold["roundtrip_equal"]


@pytest.mark.parametrize("model_case", TOK_CASES, ids=[_case_id(x) for x in TOK_CASES])
def test_long_fragment_path_gives_the_golden_ids(toks, model_case, monkeypatch):
    """Fragments over _GIL_FREE_CHARS go through tokenizers' encode_batch (it releases the GIL,
    so a huge server prompt does not stall the event loop): with the threshold at 0 every
    fragment takes that path, and the ids are still llama.cpp's."""
    import pyminfer.tokenizer as tokmod

    model, case = model_case
    tok = toks[model]
    calls = []

    class Spy:  # tokenizers' Tokenizer, counting encode_batch calls
        def __getattr__(self, name):
            return getattr(hf, name)

        def encode_batch(self, *a, **k):
            calls.append(1)
            return hf.encode_batch(*a, **k)

    hf = tok._hf
    monkeypatch.setattr(tok, "_hf", Spy())
    monkeypatch.setattr(tokmod, "_GIL_FREE_CHARS", 0)
    for mode in MODES:
        assert tok.encode(case["text"], parse_special=(mode == "parse_special")) == case[mode]["ids"]
    assert calls or not case["text"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_case", TOK_CASES, ids=[_case_id(x) for x in TOK_CASES])
def test_stream_decoder(toks, model_case, mode):
    model, case = model_case
    tok = toks[model]
    gold = case[mode]
    sd = StreamDecoder(tok)
    chunks = [sd.feed(i) for i in gold["ids"]]
    chunks.append(sd.flush())
    assert "".join(chunks) == gold["detok"]
    if "\ufffd" not in gold["detok"]:
        assert not any("\ufffd" in c for c in chunks), chunks


def test_stream_decoder_partial_and_invalid(toks):
    tok = toks["qwen2.5-coder-0.5b"]
    ids = tok.encode("🫠")
    assert len(ids) == 3  # one 4-byte character over three byte-level tokens
    sd = StreamDecoder(tok)
    out = [sd.feed(i) for i in ids]
    assert out == ["", "", "🫠"]
    # a dangling lead byte is only replaced at flush time
    sd = StreamDecoder(tok)
    assert sd.feed(ids[0]) == ""
    assert sd.flush() == "\ufffd"
    assert sd.feed(tok.encode("a")[0]) == "a"


@pytest.mark.parametrize("model_case", GEN_CASES, ids=[_case_id(x) for x in GEN_CASES])
def test_generate_prompts(toks, model_case):
    model, case = model_case
    tok = toks[model]
    if case["kind"] == "chat":
        assert tok.apply_chat_template(case["messages"], add_generation_prompt=True) == case["prompt"]
    assert tok.encode(case["prompt"]) == case["prompt_ids"]
    # greedy_text leaves out EOS, which is a control token
    assert tok.decode(case["greedy_ids"], skip_special=True) == case["greedy_text"]


def test_metadata_qwen(toks):
    tok = toks["qwen2.5-coder-0.5b"]
    info = _load(MODELS["qwen2.5-coder-0.5b"][0])["tokenizer_info"]
    assert tok.model_type == info["tokenizer.ggml.model"] == "gpt2"
    assert tok.pre_type == info["tokenizer.ggml.pre"]
    assert tok.n_vocab == info["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (info["bos_id"], info["eos_id"], False, False)
    assert {151643, 151645, 128247} <= tok.eog_ids  # <|endoftext|>, <|im_end|>, </s>
    assert 151644 not in tok.eog_ids  # <|im_start|>
    assert tok.is_control(128247)  # </s> overridden to control at load, as in llama.cpp
    assert tok.token_text(151645) == "<|im_end|>"
    assert tok.token_text(220) == "\u0120"  # byte-level alphabet, as stored in the GGUF
    assert tok.token_to_piece(220) == b" "
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    # user-defined tokens are matched regardless of special parsing; control tokens only with it
    assert tok.encode("<tool_call>", parse_special=False) == [151657]
    assert tok.encode("<|im_end|>", parse_special=False) != [151645]
    assert tok.encode(" </s>") == [220, 128247]
    assert tok.encode(" </s>", parse_special=False) == [690, 82, 29]


def test_metadata_smollm(toks):
    tok = toks["smollm2-135m"]
    info = _load(MODELS["smollm2-135m"][0])["tokenizer_info"]
    assert tok.n_vocab == info["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (info["bos_id"], info["eos_id"], False)
    assert {0, 2} <= tok.eog_ids  # <|endoftext|>, <|im_end|>
    assert 1 not in tok.eog_ids


def test_bos_eos_flags(toks):
    tok = toks["smollm2-135m"]
    assert tok.encode("hi", add_bos=True)[0] == tok.bos_id
    assert tok.encode("", add_bos=True) == [tok.bos_id]
    assert tok.encode("") == []
    assert tok.encode("hi", add_eos=True)[-1] == tok.eos_id


def test_decode_skip_special(toks):
    tok = toks["qwen2.5-coder-0.5b"]
    ids = tok.encode("<|im_start|>Hello<|im_end|><tool_call>")
    assert ids[0] == 151644 and ids[-2:] == [151645, 151657]
    assert tok.decode(ids) == "<|im_start|>Hello<|im_end|><tool_call>"
    assert tok.decode(ids, skip_special=True) == "Hello<tool_call>"  # user-defined tokens stay
    sd = StreamDecoder(tok, skip_special=True)
    assert "".join(sd.feed(i) for i in ids) + sd.flush() == "Hello<tool_call>"


def test_out_of_range_ids(toks):
    tok = toks["smollm2-135m"]
    for bad in (-1, tok.n_vocab, 10**9):
        with pytest.raises(IndexError, match="out of range"):
            tok.token_to_piece(bad)
        with pytest.raises(IndexError):
            tok.token_text(bad)
        with pytest.raises(IndexError):
            tok.decode([0, bad])
        with pytest.raises(IndexError):
            StreamDecoder(tok).feed(bad)


def test_unsupported_and_missing_template():
    path = ensure_model("smollm2-135m")
    meta = read_gguf_tokenizer_metadata(path)

    with pytest.raises(ValueError, match="'llama'"):
        Tokenizer({**meta, "tokenizer.ggml.model": "llama"})
    with pytest.raises(NotImplementedError):
        Tokenizer({**meta, "tokenizer.ggml.model": "llama"})
    with pytest.raises(UnsupportedTokenizerError, match="'made-up-pre'"):
        Tokenizer({**meta, "tokenizer.ggml.pre": "made-up-pre"})

    no_tmpl = Tokenizer({k: v for k, v in meta.items() if k != "tokenizer.chat_template"})
    assert no_tmpl.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        no_tmpl.apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_raise_exception():
    path = ensure_model("smollm2-135m")
    meta = read_gguf_tokenizer_metadata(path)
    tok = Tokenizer({**meta, "tokenizer.chat_template": "{{ raise_exception('nope') }}"})
    with pytest.raises(ValueError, match="nope"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_from_gguf_reader_matches_path(toks):
    gguf = pytest.importorskip("gguf")
    path = ensure_model("smollm2-135m")
    a = Tokenizer.from_gguf(gguf.GGUFReader(path))
    b = toks["smollm2-135m"]
    assert a.n_vocab == b.n_vocab
    assert [a.token_text(i) for i in range(a.n_vocab)] == [b.token_text(i) for i in range(b.n_vocab)]
    assert (a.bos_id, a.eos_id, a.eog_ids, a.add_bos, a.chat_template) == (
        b.bos_id, b.eos_id, b.eog_ids, b.add_bos, b.chat_template)
    text = "<|im_start|>user\nIt's 2026-11-29 — 你好 🍕<|im_end|>"
    assert a.encode(text) == b.encode(text)
    assert a.encode(text, parse_special=False) == b.encode(text, parse_special=False)


def test_load_is_fast():
    path = ensure_model("qwen2.5-coder-0.5b")
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf(path)
    dt = time.perf_counter() - t0
    assert tok.n_vocab == 151936
    assert dt < 5.0, f"loading a 152k vocab took {dt:.2f}s"
