"""Fill-in-the-middle prompts (pyminfer.infill) on the real vocabularies, and LLM.infill on the real
Qwen2.5-Coder-0.5B (CPU)."""

from __future__ import annotations

import pytest

from pyminfer import InfillChunk
from pyminfer.infill import InfillUnsupportedError, infill_ids
from pyminfer.tokenizer import Tokenizer

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def qtok(qwen05_path) -> Tokenizer:
    return Tokenizer.from_gguf(qwen05_path)


def enc(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, parse_special=False, add_bos=False, add_eos=False)


def test_qwen_repo_level_layout(qtok):
    """Qwen2.5-Coder has all six markers: the repository form, every piece where the layout puts it."""
    f = qtok.fim_ids
    assert [qtok.token_text(f[k]) for k in ("pre", "suf", "mid", "rep", "sep")] == [
        "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"]
    extra = [InfillChunk("x = 1\n", "a.py"), InfillChunk("y = 2\n")]
    ids = infill_ids(qtok, PREFIX, SUFFIX, extra=extra, prompt="return", n_ctx=4096, n_predict=16)
    want = ([f["rep"]] + enc(qtok, "myproject\n") + [f["sep"]] + enc(qtok, "a.py\n") + enc(qtok, "x = 1\n")
            + [f["sep"]] + enc(qtok, "tmp\n") + enc(qtok, "y = 2\n") + [f["sep"]] + enc(qtok, "filename\n")
            + [f["pre"]] + enc(qtok, PREFIX) + enc(qtok, "return") + [f["suf"]] + enc(qtok, SUFFIX) + [f["mid"]])
    assert ids == want  # the prompt ends the prefix, where llama.cpp's format_infill puts it
    assert qtok.decode(ids).endswith("<|fim_prefix|>def add(a, b):\n    return<|fim_suffix|>\n\nprint(add(1, 2))\n"
                                     "<|fim_middle|>")


def test_marker_text_in_code_stays_text(qtok):
    """Code that contains a marker's text is tokenized as text: the middle marker occurs once."""
    ids = infill_ids(qtok, "s = '<|fim_middle|>'\n", "<|fim_prefix|>", n_ctx=512)
    f = qtok.fim_ids
    assert ids.count(f["mid"]) == 1 and ids.count(f["pre"]) == 1 and ids[-1] == f["mid"]


def test_long_inputs_are_cut_as_llama_cpp_cuts_them(qtok):
    """n_ctx 256: a batch of 128; the prefix keeps its last 96 tokens, the suffix its first 32 - 2 -
    len(prompt), the extra context (from its end) what the rest and 2 * n_predict leave of n_ctx."""
    f = qtok.fim_ids
    pre, suf = enc(qtok, "a = 1\n" * 200), enc(qtok, "b = 2\n" * 200)
    extra = [InfillChunk("c = 3\n" * 200, "c.py")]
    ids = infill_ids(qtok, "a = 1\n" * 200, "b = 2\n" * 200, extra=extra, prompt="x", n_ctx=256, n_predict=20)
    i_pre, i_suf, i_mid = ids.index(f["pre"]), ids.index(f["suf"]), ids.index(f["mid"])
    assert ids[i_pre + 1:i_suf] == pre[-96:] + enc(qtok, "x")
    assert ids[i_suf + 1:i_mid] == suf[:32 - 2 - 1]
    full_extra = ([f["rep"]] + enc(qtok, "myproject\n") + [f["sep"]] + enc(qtok, "c.py\n") + enc(qtok, "c = 3\n" * 200)
                  + [f["sep"]] + enc(qtok, "filename\n"))
    assert i_pre > 40 and ids[:i_pre] == full_extra[-i_pre:]
    assert len(ids) == 256 - 40
    # no token limit: half a batch (64) is kept free instead; a tiny context still leaves a position
    assert len(infill_ids(qtok, "a = 1\n" * 200, "b\n" * 200, extra=extra, n_ctx=256)) == 256 - 64
    assert len(infill_ids(qtok, "a = 1\n" * 200, "b\n" * 200, extra=extra, n_ctx=8, n_predict=0)) == 7


def test_vocabulary_without_fim_is_refused(smol_path):
    """SmolLM2's vocabulary has <repo_name> and <file_sep> but no prefix / suffix / middle markers."""
    tok = Tokenizer.from_gguf(smol_path)
    with pytest.raises(InfillUnsupportedError, match="FIM <FIM_PRE>, <FIM_SUF>, <FIM_MID>"):
        infill_ids(tok, PREFIX, SUFFIX, n_ctx=512)
    assert issubclass(InfillUnsupportedError, ValueError)


@pytest.fixture(scope="module")
def qllm(qwen05_path):
    from pyminfer import LLM

    with LLM(qwen05_path, device="cpu", n_ctx=512) as llm:
        yield llm


def test_llm_infill_writes_the_middle(qllm):
    """The real 0.5B fills the body between a signature and its use (greedy); the result is what
    generate() gives for the FIM prompt's ids, and a prompt after the middle marker is not repeated."""
    r = qllm.infill(PREFIX, SUFFIX, max_tokens=6, temperature=0)
    assert r.text.startswith("return a + b"), r.text
    ids = infill_ids(qllm.tokenizer, PREFIX, SUFFIX, n_ctx=512, n_predict=6)
    assert r.prompt_ids == ids
    assert qllm.generate(ids, max_tokens=6, temperature=0).text == r.text
    r2 = qllm.infill(PREFIX, SUFFIX, prompt="return", max_tokens=4, temperature=0)
    assert r2.text.startswith(" a + b"), r2.text


def test_llm_infill_bad_arguments(qllm, smol_path):
    from pyminfer import LLM

    with pytest.raises(TypeError, match="prefix must be str"):
        qllm.infill(b"def f():")
    with pytest.raises(TypeError, match=r"extra\[0\] must be a pyminfer.InfillChunk"):
        qllm.infill(PREFIX, SUFFIX, extra=[("a.py", "x = 1")])
    with pytest.raises(TypeError, match="InfillChunk.filename must be str, got NoneType"):
        InfillChunk("x = 1", None)
    with pytest.raises(ValueError, match=r"^extra\[1\]\.text: "):
        qllm.infill(PREFIX, SUFFIX, extra=[InfillChunk("a"), InfillChunk("b \ud800")], max_tokens=1)
    with pytest.raises(ValueError, match="^suffix: "):
        qllm.infill(PREFIX, "\udfff", max_tokens=1)
    assert qllm.infill(PREFIX, SUFFIX, extra=None, max_tokens=0).generated_ids == []
    with LLM(smol_path, device="cpu", n_ctx=128) as smol:
        with pytest.raises(InfillUnsupportedError):
            smol.infill(PREFIX, SUFFIX, max_tokens=1)
