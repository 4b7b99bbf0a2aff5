"""Bad input gets a clear error, never a crash or a silent wrong answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyminfer.api import LLM
from pyminfer.engine import ContextFull, Model
from pyminfer.generate import generate
from pyminfer.gguf_model import GGUFError, GGUFModel
from pyminfer.sampling import SamplingParams


def _write_truncated(src: Path, dst: Path, n: int) -> Path:
    with open(src, "rb") as f:
        dst.write_bytes(f.read(n))
    return dst


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        GGUFModel(tmp_path / "nope.gguf")


def test_wrong_magic(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"NOTAGGUF" + bytes(1024))
    with pytest.raises(GGUFError, match="bad.gguf"):
        GGUFModel(p)


def test_truncated_header(tmp_path, smol_path):
    with pytest.raises(GGUFError, match="cut.gguf"):
        GGUFModel(_write_truncated(smol_path, tmp_path / "cut.gguf", 4096))


def test_truncated_tensor_data(tmp_path, smol_path):
    size = smol_path.stat().st_size
    with pytest.raises(GGUFError, match="(truncated|not a valid)"):
        GGUFModel(_write_truncated(smol_path, tmp_path / "cut.gguf", size - 1_000_000))


def _patch_bytes(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    data = bytearray(src.read_bytes())
    i = data.find(old)
    assert i >= 0
    data[i:i + len(old)] = new
    dst.write_bytes(bytes(data))
    return dst


def test_unknown_architecture(tmp_path, smol_path):
    # general.architecture = "llama" -> "llamb" (same length, so the file stays well-formed)
    p = _patch_bytes(smol_path, tmp_path / "arch.gguf", b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00llama",
                     b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00llamb")
    with pytest.raises(GGUFError, match="unsupported architecture 'llamb'"):
        GGUFModel(p)


def test_unsupported_tensor_type(tmp_path, smol_path):
    import gguf

    r = gguf.GGUFReader(smol_path)
    t = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    # tensor info: name, n_dims u32, dims u64 x n, type u32, offset u64; retype Q4_1 (3) as IQ4_NL (20, also 32-wide blocks)
    name = t.name.encode()
    dims = b"".join(int(x).to_bytes(8, "little") for x in t.shape)
    old = len(name).to_bytes(8, "little") + name + len(t.shape).to_bytes(4, "little") + dims + (3).to_bytes(4, "little")
    new = old[:-4] + (20).to_bytes(4, "little")
    del r
    p = _patch_bytes(smol_path, tmp_path / "type.gguf", old, new)
    with pytest.raises(GGUFError, match=r"blk\.0\.attn_q\.weight.*unsupported type"):
        GGUFModel(p)


def test_empty_prompt(smol):
    with pytest.raises(ValueError, match="empty"):
        generate(smol, [], SamplingParams(temperature=0), 4)


def test_prompt_longer_than_ctx(smol_path):
    with Model(smol_path, device="cpu", n_ctx=16) as m:
        with pytest.raises(ContextFull, match="n_ctx=16"):
            generate(m, list(range(100, 140)), SamplingParams(temperature=0), 4)
        # filling the context mid-generation stops cleanly with the reason
        res = generate(m, list(range(100, 110)), SamplingParams(temperature=0), 100)
        assert res.finish_reason == "length" and res.stop_reason == "context"
        assert len(res.generated_ids) == 16 - 10 + 1  # the last token needs no KV slot


def test_token_out_of_range(smol):
    from pyminfer._core import NativeError

    with pytest.raises(NativeError, match="out of range"):
        smol.forward([smol.n_vocab + 5], 0, [0])


def test_bad_device(smol_path):
    with pytest.raises(ValueError, match="unknown device"):
        Model(smol_path, device="tpu")


def test_bad_sampling_params():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5).validate()


def test_cli_errors_are_one_line(tmp_path, smol_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"garbage" * 100)
    out = subprocess.run([sys.executable, "-m", "pyminfer", "run", "-m", str(p), "-p", "hi", "-n", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and "pyminfer: error:" in out.stderr
    out = subprocess.run([sys.executable, "-m", "pyminfer", "run", "-m", str(smol_path), "-p", "", "-n", "2",
                          "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "empty" in out.stderr


def _broken_template_copy(src: Path, dst: Path) -> Path:
    """A copy of src whose chat template has one "{%" turned into "{{" (same length, patched in
    place): a jinja syntax error in an otherwise valid file."""
    data = bytearray(src.read_bytes())
    key = data.find(b"tokenizer.chat_template")
    at = data.find(b"{%", key)
    assert key > 0 and at > key
    data[at:at + 2] = b"{{"
    dst.write_bytes(bytes(data))
    return dst


def test_broken_chat_template_is_one_line_in_the_cli(tmp_path, smol_path):
    """run --chat and chat with a template that does not compile: the CLI's one-line error naming
    the template, not jinja's traceback (the API and the server already said so)."""
    p = _broken_template_copy(smol_path, tmp_path / "badtmpl.gguf")
    # chat with no message at all: refused at startup, before the first turn
    for args, stdin in ((["run", "--chat", "-p", "hi", "-n", "2"], None), (["chat", "-n", "2"], "hi\n"),
                        (["chat", "-n", "2"], "")):
        out = subprocess.run([sys.executable, "-m", "pyminfer", *args, "-m", str(p), "--device", "cpu"], input=stdin,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 1, (args, out.stderr)
        assert "Traceback" not in out.stderr and "chat template" in out.stderr and "does not compile" in out.stderr, \
            out.stderr
    # the raw prompt still works with the same file
    out = subprocess.run([sys.executable, "-m", "pyminfer", "run", "-p", "hi", "-n", "2", "-m", str(p), "--device",
                          "cpu"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def _nan_output_model(device: int):
    """A small synthetic model whose f32 LM head has a NaN in vocabulary row 7: that logit is NaN at
    every position (bench/bench_gpu.py's synthetic weights); a native context on ``device``."""
    import pyminfer._core as core

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import bench_gpu as bg

    types = dict(bg.qwen_types(2), output=bg.F32)
    cfg, tensors, keep, _ = bg.synthetic_model(np.random.default_rng(3), n_layer=2, n_embd=256, n_ff=512, n_head=4,
                                               n_head_kv=2, head_dim=64, n_vocab=1000, types=types, qk_gain=1.0)
    out = next(a for a in keep if a.ctypes.data == tensors["output"][0])
    out.view(np.float32).reshape(1000, 256)[7, 3] = np.nan
    return core.Context(cfg, tensors, 64, 8, 1, device, keep), keep


def test_layer_tensor_error_names_the_layer_once():
    """A tensor of the wrong shape in a layer: "layer 1: tensor attn_q: shape ..." (the layer
    prefix was formatted from the error buffer into itself: "layer 0: layer 0: tn_q: ...")."""
    import pyminfer._core as core

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import bench_gpu as bg

    cfg, tensors, keep, _ = bg.synthetic_model(np.random.default_rng(4), n_layer=2, n_embd=256, n_ff=512, n_head=4,
                                               n_head_kv=2, head_dim=64, n_vocab=1000, types=bg.qwen_types(2))
    ptr, typ, n_cols, n_rows = tensors["layers"][1]["wq"]
    tensors["layers"][1]["wq"] = (ptr, typ, n_cols, n_rows - 32)
    with pytest.raises(Exception) as e:
        core.Context(cfg, tensors, 64, 8, 1, 0, keep)
    msg = str(e.value)
    assert "layer 1: tensor attn_q: shape [224, 256], expected [256, 256]" in msg and msg.count("layer") == 1, msg


def test_nan_logits_are_an_error_not_token_zero():
    """Corrupt weights that make a logit NaN: the native argmax gives -1 for that row (not the first
    id, which decoded as a silent end of generation), the engine and the sampler raise
    NaNLogitsError; the CLI prints it as one line (RuntimeError)."""
    from types import SimpleNamespace

    from pyminfer import NaNLogitsError
    from pyminfer.sampling import Sampler

    ctx, _keep = _nan_output_model(0)
    toks, pos, rows = (np.array(v, np.int32) for v in ([5, 6, 7], [0, 1, 2], [0, 1, 2]))
    logits = np.zeros((3, 1000), np.float32)
    am = np.zeros(3, np.int32)
    ctx.forward(toks, pos, rows, logits, am)
    assert np.isnan(logits[:, 7]).all() and not np.isnan(np.delete(logits, 7, axis=1)).any()
    assert (am == -1).all()
    fake = SimpleNamespace(gguf=SimpleNamespace(path=Path("/x/draft.gguf")))  # the engine names the file
    fake.nan_error = lambda: Model.nan_error(fake)
    with pytest.raises(NaNLogitsError, match="^draft.gguf: the model produced NaN logits") as ei:
        Model._checked(fake, am)
    assert ei.value.advice == ""  # not a file of the model cache
    assert issubclass(NaNLogitsError, RuntimeError)
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=1),
                   SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=1)):
        with pytest.raises(NaNLogitsError):
            Sampler(params).sample(logits[0], [1])
    clean = np.delete(logits[0], 7)  # the same row without its NaN samples as before
    assert Sampler(SamplingParams(temperature=0.0)).sample(clean, [1]) == int(np.argmax(clean))


def test_nan_logits_in_a_cached_file_say_how_to_fetch_it_again(tmp_path, monkeypatch):
    """A cached download is checked by size only when reused: the NaN error names the file and its
    advice says to delete it (the CLI prints the advice; the server sends only the message, which
    names no local path). The sampler's error, which has no file, is re-raised by the decoder."""
    from types import SimpleNamespace

    from pyminfer import NaNLogitsError
    from pyminfer.generate import PlainDecoder
    from pyminfer.sampling import Sampler

    monkeypatch.setenv("PYMINFER_CACHE", str(tmp_path))
    path = tmp_path / "m.gguf"
    fake = SimpleNamespace(gguf=SimpleNamespace(path=path))
    fake.nan_error = lambda: Model.nan_error(fake)
    row = np.full((1, 8), np.nan, np.float32)
    fake.prefill = lambda toks, start, logits: row
    dec = PlainDecoder(fake, Sampler(SamplingParams(temperature=0.8, seed=1)))
    with pytest.raises(NaNLogitsError, match="^m.gguf: the model produced NaN") as ei:
        next(dec.tokens([1, 2]))
    assert ei.value.advice == f"{path.resolve()} is a cached download: delete it to fetch it again"
    assert str(path) not in str(ei.value)


def test_non_consecutive_positions(smol):
    from pyminfer._core import NativeError

    with pytest.raises(NativeError, match="consecutive"):
        smol.ctx.forward(np.array([1, 2], np.int32), np.array([0, 5], np.int32), np.array([1], np.int32),
                         None, np.zeros(1, np.int32))


def test_short_weight_buffers():
    from pyminfer import _core

    x = np.zeros((1, 64), np.float32)
    y = np.zeros((1, 4), np.float32)
    with pytest.raises(ValueError, match="need"):
        _core.matmul(0, 8, np.zeros(10, np.uint8), 4, 64, x, y)  # Q8_0: 4 rows x 68 bytes
    with pytest.raises(ValueError, match="need"):
        _core.dequantize(8, np.zeros(10, np.uint8), 4, 64, np.zeros((4, 64), np.float32))


def _patch_field(src: Path, dst: Path, key: str, value: int) -> Path:
    """A copy of ``src`` with the scalar metadata ``key`` set to ``value`` (same type, in place)."""
    import shutil

    import gguf

    shutil.copyfile(src, dst)
    r = gguf.GGUFReader(dst, "r+")
    f = r.fields[key]
    f.parts[f.data[0]][0] = value
    r.data.flush()
    del r
    return dst


@pytest.mark.parametrize("key,value,match", [
    ("llama.attention.head_count", 0, "invalid model dimensions"),
    # past int32 (uint32 in the file): it once reached the core and failed as an OverflowError
    ("llama.feed_forward_length", 4278191616, "llama.feed_forward_length 4278191616; must be 1"),
    ("llama.block_count", 2**31, "llama.block_count 2147483648; must be 1"),
    ("llama.vocab_size", 50000, "vocab_size 50000 exceeds"),
    ("llama.rope.dimension_count", 32, "partial rotary"),
])
def test_contradictory_metadata_is_refused(tmp_path, smol_path, key, value, match):
    p = _patch_field(smol_path, tmp_path / "meta.gguf", key, value)
    with pytest.raises(GGUFError, match=match):
        GGUFModel(p)
    out = subprocess.run([sys.executable, "-m", "pyminfer", "run", "-m", str(p), "-p", "hi", "-n", "2", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr and match in out.stderr


def test_model_check_errors_name_the_file_and_values(tmp_path, smol_path):
    """The core's own checks of a model (dimensions, norms' types) come back with the file's path
    and the values it objects to, as the Python-side checks do; one line in the CLI."""
    p = _patch_field(smol_path, tmp_path / "emb.gguf", "llama.embedding_length", 577)
    with pytest.raises(RuntimeError, match=r"emb\.gguf: invalid model dimensions \(.*n_embd 577"):
        Model(p, device="cpu", n_ctx=32)
    out = subprocess.run([sys.executable, "-m", "pyminfer", "run", "-m", str(p), "-p", "hi", "-n", "2", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr and f"{p}: invalid model dimensions" in out.stderr


def test_corrupt_vocabulary_is_a_clear_error(tmp_path, smol_path):
    """A token renamed in tokenizer.ggml.tokens (same length) leaves a merge that builds a token
    the vocabulary lacks: the tokenizers library raises a bare Exception; we name the file."""
    data = bytearray(smol_path.read_bytes())
    old = (5).to_bytes(8, "little") + "\u0120the".encode("utf-8")  # the length-prefixed token "Ġthe"
    i = data.find(old)
    assert i > 0
    data[i + len(old) - 1:i + len(old)] = b"x"
    p = tmp_path / "badtok.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"badtok\.gguf: corrupt tokenizer metadata: .*out of vocabulary"):
        Model(p, device="cpu", n_ctx=32)
    out = subprocess.run([sys.executable, "-m", "pyminfer", "run", "-m", str(p), "-p", "hi", "-n", "2", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "corrupt tokenizer metadata" in out.stderr
    # the tokenizer alone (pyminfer tokenize, Tokenizer.from_gguf) names the file too (it did not)
    from pyminfer.tokenizer import Tokenizer

    with pytest.raises(ValueError, match=r"badtok\.gguf: corrupt tokenizer metadata"):
        Tokenizer.from_gguf(p)
    _one_line_error(_cli("tokenize", "-m", str(p), "hi"), f"{p}: corrupt tokenizer metadata")


def test_eos_id_outside_the_vocabulary_is_refused(tmp_path, smol_path):
    """An eos id no token has would let generation never stop on EOS: an error, not a silent None."""
    p = _patch_field(smol_path, tmp_path / "eos.gguf", "tokenizer.ggml.eos_token_id", 999999)
    with pytest.raises(ValueError, match="eos_token_id = 999999 is outside the vocabulary"):
        Model(p, device="cpu", n_ctx=32)


def test_negative_seed_is_random(smol):
    """seed -1 (any negative) means random, as llama.cpp's and the CLI's -1; not a numpy error."""
    from pyminfer.sampling import Sampler

    s = Sampler(SamplingParams(temperature=1.0, seed=-1))
    assert 0 <= s.sample(np.zeros(smol.n_vocab, np.float32), []) < smol.n_vocab


def test_n_ctx_beyond_training_warns(smol_path, capsys):
    with Model(smol_path, device="cpu", n_ctx=9000):
        pass
    assert "larger than the 8192 positions" in capsys.readouterr().err


@pytest.mark.parametrize("args,match", [
    (["serve", "--spec-draft-n", "12"], "spec-draft-n must be in 0..8"),
    (["serve", "--port", "99999"], "--port must be in 0..65535"),
    (["run", "-p", "hi", "--threads", "100000"], "more than 4x"),
])
def test_cli_flags_refused_before_loading(smol_path, args, match):
    out = subprocess.run([sys.executable, "-m", "pyminfer", args[0], "-m", str(smol_path), "--device", "cpu", *args[1:]],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and match in out.stderr and "Traceback" not in out.stderr


def test_prompt_from_stdin_equals_prompt_flag(smol_path):
    """``-f -`` reads the prompt from standard input (it was opened as a file named '-')."""
    base = [sys.executable, "-m", "pyminfer", "run", "-m", str(smol_path), "-n", "4", "--temp", "0", "--device", "cpu"]
    a = subprocess.run(base + ["-f", "-"], input="The capital of France is", capture_output=True, text=True, timeout=120)
    b = subprocess.run(base + ["-p", "The capital of France is"], capture_output=True, text=True, timeout=120)
    assert a.returncode == 0 and b.returncode == 0 and a.stdout == b.stdout and a.stdout.strip()


def test_prompt_file_keeps_carriage_returns(smol_path, tmp_path):
    """-f (a file, or standard input) keeps CR and CRLF as -p does (llama.cpp reads the file's
    bytes): the prompt ids of --json equal `tokenize`'s for the same text (CRLF became LF before)."""
    import json

    text = "Hello\r\nworld\rand more"
    (tmp_path / "p.txt").write_bytes(text.encode())
    base = [sys.executable, "-m", "pyminfer", "run", "-m", str(smol_path), "-n", "1", "--temp", "0", "--device", "cpu",
            "--json"]
    def tokenize(t: str) -> list[int]:
        return json.loads(subprocess.run([sys.executable, "-m", "pyminfer", "tokenize", "-m", str(smol_path), t],
                                         capture_output=True, text=True, timeout=120).stdout)

    want = tokenize(text)
    assert want != tokenize(text.replace("\r\n", "\n").replace("\r", "\n"))  # the CRs are tokens of their own
    # tokenize reads files and standard input too (llama-tokenize's -f / --stdin), the same way
    tok = [sys.executable, "-m", "pyminfer", "tokenize", "-m", str(smol_path)]
    for src, stdin in ((["-f", str(tmp_path / "p.txt")], None), (["-f", "-"], text.encode()), (["--stdin"], text.encode()),
                       (["-p", text], None)):
        out = subprocess.run(tok + src, input=stdin, capture_output=True, timeout=120)
        assert out.returncode == 0 and json.loads(out.stdout) == want, (src, out.stderr)
    for bad in ([], ["x", "--stdin"], ["-f", str(tmp_path / "p.txt"), "x"]):
        out = subprocess.run(tok + bad, input=b"", capture_output=True, timeout=120)
        assert out.returncode == 1 and b"give the text to tokenize in one way" in out.stderr, (bad, out.stderr)
    for src, stdin in ((["-f", str(tmp_path / "p.txt")], None), (["-f", "-"], text.encode())):
        out = subprocess.run(base + src, input=stdin, capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["prompt_ids"] == want, src


def test_negative_threads_refused(smol_path):
    with pytest.raises(ValueError, match="n_threads"):
        Model(smol_path, device="cpu", n_ctx=16, n_threads=-1)


# --------------------------------------------------------------------------------------------------
# New-user pass: each test below failed before its fix.
# --------------------------------------------------------------------------------------------------

def _cli(*args: str | bytes, input: bytes | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """``python -m pyminfer ARGS`` with bytes in and out (arguments may be raw, non-UTF-8 bytes)."""
    argv = [sys.executable.encode(), b"-m", b"pyminfer"] + [a if isinstance(a, bytes) else a.encode() for a in args]
    return subprocess.run(argv, input=input, capture_output=True, timeout=timeout)


def _one_line_error(out: subprocess.CompletedProcess, match: str) -> str:
    err = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 1, err
    assert "Traceback" not in err and "pyminfer: error: " in err and match in err, err
    return err


@pytest.mark.parametrize("penalty", [1e-40, 1e-45, 1e-46, 1e-300, 5e-324, 1e300, 1.7e308])
@pytest.mark.parametrize("temperature", [0.0, 0.8, 1e-310])
def test_extreme_repeat_penalty_samples_without_errors_or_warnings(penalty, temperature):
    """A tiny penalty once overflowed float32 to inf (inf - inf = nan: IndexError in the sampler,
    a RuntimeWarning at 1e-45); any finite penalty > 0 now gives a valid, reproducible token."""
    import warnings

    from pyminfer.sampling import Sampler, apply_repeat_penalty

    logits = (np.random.default_rng(0).standard_normal(1000) * 5).astype(np.float32)
    window = list(range(0, 100, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pen = apply_repeat_penalty(logits.copy(), window, penalty)
        assert np.isfinite(pen).all() and pen.dtype == np.float32
        draws = [Sampler(SamplingParams(temperature=temperature, repeat_penalty=penalty, seed=7)).sample(logits, window)
                 for _ in range(2)]
    assert draws[0] == draws[1] and 0 <= draws[0] < logits.size
    if temperature == 0.0:
        assert draws[0] == int(np.argmax(pen))  # ties at the clamp: the lowest id, as argmax


def test_repeat_penalty_in_range_is_bit_identical_to_float32_arithmetic():
    """The overflow-safe penalty gives exactly the old float32 results for every in-range penalty
    (identity tests of greedy decoding with a penalty depend on it)."""
    from pyminfer.sampling import apply_repeat_penalty

    rng = np.random.default_rng(1)
    for _ in range(2000):
        logits = (rng.standard_normal(64) * rng.choice([1e-3, 1.0, 30.0, 1e30])).astype(np.float32)
        penalty = float(rng.choice([rng.uniform(0.5, 2.0), 10 ** rng.uniform(-30, 30), 1.1, 1.3]))
        old = logits.copy()
        with np.errstate(all="ignore"):
            old = np.where(old > 0, old / penalty, old * penalty)  # the f32 formula it replaced
        new = apply_repeat_penalty(logits.copy(), range(64), penalty)
        ok = np.isfinite(old)  # where the old one overflowed, the new one clamps
        assert np.array_equal(old[ok].view(np.uint32), new[ok].view(np.uint32))


@pytest.mark.parametrize("value", ["inf", "0", "-1", "nan"])
def test_cli_refuses_bad_repeat_penalty(smol_path, value):
    out = _cli("run", "-m", str(smol_path), "--device", "cpu", "-p", "hi", "--repeat-penalty", value)
    err = _one_line_error(out, "repeat_penalty must be finite and > 0")
    assert "loaded" not in err  # refused before the load


def test_encode_refuses_lone_surrogates(smol):
    with pytest.raises(ValueError, match=r"not valid Unicode \(lone surrogate at index 2: undecodable byte 0xff"):
        smol.tokenizer.encode("ab\udcffc")
    with pytest.raises(ValueError, match=r"not valid Unicode \(lone surrogate at index 0: U\+D800\)"):
        smol.tokenizer.encode("\ud800", parse_special=False)


def test_cli_refuses_text_that_is_not_utf8(tmp_path, smol_path):
    """Not UTF-8 -> an error naming the input (file, stdin, -p, TEXT, --stop, --system, a chat line),
    not a traceback; valid text from -f reads byte for byte (CRLF kept, as llama.cpp)."""
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9 \xff\xfe")
    m = ["-m", str(smol_path), "--device", "cpu"]
    _one_line_error(_cli("run", *m, "-f", str(bad), "-n", "2"), f"{bad} is not valid UTF-8 (byte 0xe9 at offset 3)")
    _one_line_error(_cli("run", *m, "-f", "-", "-n", "2", input=bad.read_bytes()), "standard input is not valid UTF-8")
    # arguments: the byte and its byte offset, as for files (not the index of its stand-in character)
    _one_line_error(_cli("run", *m, "-p", b"h\xc3\xa9llo\xff", "-n", "2"),
                    "-p/--prompt is not valid UTF-8 (byte 0xff at offset 6)")
    _one_line_error(_cli("run", *m, "-p", "hi", "--stop", b"\xfe"), "--stop is not valid UTF-8 (byte 0xfe at offset 0)")
    _one_line_error(_cli("chat", *m, "--system", b"\xfe", input=b""), "--system is not valid UTF-8 (byte 0xfe at offset 0)")
    _one_line_error(_cli("tokenize", "-m", str(smol_path), b"ab\xff"), "TEXT is not valid UTF-8 (byte 0xff at offset 2)")
    # a bad chat line is skipped with a message and the session goes on (exit status 1 at the end)
    out = _cli("chat", *m, "-n", "2", "--temp", "0", input=b"hi\n\xc3\xa9\xff\xfe\nhello\n")
    err = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 1 and "Traceback" not in err, err
    assert "this line is not valid UTF-8 (byte 0xff at offset 2)" in err and "Line skipped" in err, err
    assert err.count("finish: ") == 2, err  # the good lines before and after it were answered
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"The capital of France is\r\n")
    a = _cli("run", *m, "-f", str(crlf), "-n", "3", "--temp", "0")
    b = _cli("run", *m, "-p", "The capital of France is\r\n", "-n", "3", "--temp", "0")
    assert a.returncode == 0 and a.stdout == b.stdout


@pytest.mark.parametrize("n", ["0", "1"])
def test_bench_spec_draft_needs_two_tokens(smol_path, n):
    out = _cli("bench", "-m", str(smol_path), "--device", "cpu", "--spec-draft", str(smol_path), "-n", n, "-r", "1")
    _one_line_error(out, "-n/--n-gen must be >= 2 with --spec-draft")


def _corrupt_ggufs(tmp_path: Path, smol_path: Path) -> list[Path]:
    cut = _write_truncated(smol_path, tmp_path / "cut.gguf", 100_000)
    rnd = tmp_path / "random.gguf"
    rnd.write_bytes(b"GGUF" + np.random.default_rng(0).bytes(5000))
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    return [cut, rnd, empty]


def test_tokenizer_of_a_corrupt_gguf_is_a_gguf_error(tmp_path, smol_path):
    from pyminfer.tokenizer import Tokenizer, read_gguf_tokenizer_metadata

    for p in _corrupt_ggufs(tmp_path, smol_path):
        with pytest.raises(GGUFError, match=f"{p.name}: not a valid GGUF file"):
            read_gguf_tokenizer_metadata(p)
        with pytest.raises(GGUFError, match=f"{p.name}: not a valid GGUF file"):
            Tokenizer.from_gguf(p)


def test_huge_array_count_is_corrupt_not_out_of_memory(tmp_path):
    """A string array whose count exceeds what the file could hold is a corrupt file (named by its
    count), found before any allocation, by the tokenizer's reader and by a model load alike."""
    import struct

    from pyminfer.gguf_model import GGUFModel
    from pyminfer.tokenizer import read_gguf_tokenizer_metadata

    key = b"tokenizer.ggml.tokens"
    body = struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    body += struct.pack("<IIQ", 9, 8, 1 << 40) + struct.pack("<Q", 1) + b"a"  # array of 2^40 strings
    p = tmp_path / "huge.gguf"
    p.write_bytes(body)
    with pytest.raises(GGUFError, match=r"huge.gguf: not a valid GGUF file \(truncated: the 1099511627776 elements"):
        read_gguf_tokenizer_metadata(p)
    with pytest.raises(GGUFError, match="huge.gguf: not a valid GGUF file"):
        GGUFModel(p)


def test_tokenize_and_synth_report_corrupt_ggufs(tmp_path, smol_path):
    for p in _corrupt_ggufs(tmp_path, smol_path):
        _one_line_error(_cli("tokenize", "-m", str(p), "hi"), f"{p}: not a valid GGUF file")
        _one_line_error(_cli("synth", "--shape", "1.5b", "-q", "-o", str(tmp_path / "out.gguf"), "--tokenizer-from",
                             str(p)), f"{p}: not a valid GGUF file")
        assert not (tmp_path / "out.gguf").exists()
    # a refused argument: the error alone, no empty progress bar drawn before it
    err = _one_line_error(_cli("synth", "--shape", "7b", "--n-layer", "0", "-o", str(tmp_path / "out.gguf"),
                               "--tokenizer-from", str(smol_path)), "n_layer must be in 1..")
    assert "synth 7b" not in err, err


@pytest.mark.parametrize("args,match", [
    (["run", "-p", "hi", "-c", "2147483648"], "-c/--ctx-size must be in 0..2147483647"),
    (["run", "-p", "hi", "-c", "-1"], "-c/--ctx-size must be in 0..2147483647"),
    (["bench", "-p", "2147483648", "-n", "0"], "more than the core's 2147483647"),
    (["bench", "-p", "0", "-n", "2147483640"], "more than the core's 2147483647"),
    (["chat", "-n", "-5"], "-n/--n-predict must be >= -1"),
    (["chat", "-c", "99999999999"], "-c/--ctx-size must be in"),
    (["run", "-p", "hi", "-ub", "0"], "-ub/--ubatch-size must be in 1..2147483647"),
    (["bench", "-ub", "2147483648"], "-ub/--ubatch-size must be in 1..2147483647"),
])
def test_int_options_refused_before_loading(smol_path, args, match):
    """Values past the core's C int once ended in OverflowError; chat -n -5 was refused only when
    the first message was sent. All are refused before the model loads."""
    out = _cli(args[0], "-m", str(smol_path), "--device", "cpu", *args[1:], input=b"hi\n")
    err = _one_line_error(out, match)
    assert "loaded" not in err


def test_ubatch_size(smol_path):
    """-ub / n_ubatch / max_nt: the most tokens a forward takes (default 64 on the CPU); the CLI flag
    reaches the model (a batch too small for the draft depth is refused, naming the flag), and a
    prompt prefilled in chunks of 3 gives the same greedy text (CPU rows are bitwise across nt)."""
    with Model(smol_path, device="cpu", n_ctx=64) as m:
        assert m.max_nt == 64
    with Model(smol_path, device="cpu", n_ctx=32, max_nt=10_000_000) as m:  # capped at n_ctx, as llama.cpp's n_batch
        assert m.max_nt == 32
    llm = LLM(smol_path, device="cpu", n_ctx=64, n_ubatch=3)
    try:
        assert llm._model.max_nt == 3
    finally:
        llm.close()
    with pytest.raises(TypeError, match="n_ubatch"):
        LLM(smol_path, device="cpu", n_ubatch=3.0)
    for bad, err in ((True, TypeError), (2.0, TypeError), (0, ValueError)):
        with pytest.raises(err, match="max_nt"):
            Model(smol_path, device="cpu", n_ctx=64, max_nt=bad)
    for bad in (-1, 0, 2**31):  # 2**31 was refused as "max_nt must be in ...", naming another argument
        with pytest.raises(ValueError, match=r"n_ubatch must be in 1\.\.2147483647"):
            LLM(smol_path, device="cpu", n_ubatch=bad)
    # n_ctx / n_threads / spec_draft_n: ints (a str failed deep inside with "'<=' not supported", a
    # float or a bool was taken as a context size, a float depth failed at the first generate)
    for kw in ({"n_ctx": "64"}, {"n_ctx": 64.5}, {"n_ctx": True}, {"n_threads": "2"}, {"n_threads": 1.0},
               {"spec_draft_n": 2.5, "draft_model": smol_path}, {"spec_draft_n": True}):
        name = next(k for k in kw if k != "draft_model")
        with pytest.raises(TypeError, match=f"^{name} must be an int"):
            LLM(smol_path, device="cpu", **kw)
    with pytest.raises(ValueError, match="n_ubatch 3 is too small for spec_draft_n 4"):
        LLM(smol_path, device="cpu", draft_model=smol_path, n_ubatch=3, spec_draft_n=4)
    with LLM(smol_path, device="cpu", n_ctx=64, draft_model=smol_path, n_ubatch=3) as s:  # the default: capped
        assert s.spec_draft_n == 2
    m = ["-m", str(smol_path), "--device", "cpu", "-p", "The capital of France is", "-n", "6", "--temp", "0"]
    a, b = _cli("run", *m), _cli("run", *m, "-ub", "3")
    assert a.returncode == 0 and b.returncode == 0 and a.stdout == b.stdout and a.stdout.strip()
    # refused before loading, naming the flag (serve too: not at every request)
    for cmd in ("run", "serve"):
        err = _one_line_error(_cli(cmd, *m[:4], "-ub", "3", "--spec-draft", str(smol_path), "--spec-draft-n", "4"),
                              "-ub/--ubatch-size 3 is too small for --spec-draft-n 4")
        assert "loaded" not in err
    # the default depth (not asked for) and the adaptive controller's first depth are capped at -ub - 1
    # instead (both were refused, "--spec-draft-n 4" named though never given); the output is plain's.
    # Adaptive depth not asked for starts at 1 (spec.ADAPTIVE_START): lowered only for -ub 1.
    for extra, d0 in (([], 4), (["--spec-draft-adaptive"], 1), (["--spec-draft-adaptive", "--spec-draft-n", "4"], 4)):
        for ub in ("3", "1"):
            r = _cli("run", *m, "-ub", ub, "--spec-draft", str(smol_path), *extra)
            assert r.returncode == 0 and r.stdout == a.stdout, (extra, ub, r.stderr)
            said = f"draft depth lowered from {d0} to {int(ub) - 1} for -ub {ub}".encode() in r.stderr
            assert said == (d0 > int(ub) - 1), (extra, ub, r.stderr)  # said where lowered, not silent
    with LLM(smol_path, device="cpu", n_ctx=64, draft_model=smol_path, n_ubatch=2, spec_adaptive=True) as s, \
            LLM(smol_path, device="cpu", n_ctx=64) as plain:
        args = ("The capital of France is",)
        assert s.generate(*args, max_tokens=6, temperature=0).generated_ids == \
            plain.generate(*args, max_tokens=6, temperature=0).generated_ids
    for extra in (["--verify-curve"], ["--spec-draft", str(smol_path)]):
        err = _one_line_error(_cli("bench", *m[:4], "-ub", "8", "-r", "1", *extra), "-ub/--ubatch-size 8 is too small")
        assert "loaded" not in err


def test_model_n_ctx_past_int_max(smol_path):
    for bad in (2**31, -1):
        with pytest.raises(ValueError, match=r"n_ctx must be in 0..2147483647 \(0: the trained context\)"):
            Model(smol_path, device="cpu", n_ctx=bad)


def test_n_ctx_0_is_the_trained_context(smol_path):
    """-c 0 / n_ctx=0: the context the model was trained on (llama.cpp's "0 = from model",
    llama-cpp-python's n_ctx=0); the CLI takes it."""
    m = Model(smol_path, device="cpu", n_ctx=0)
    try:
        assert m.n_ctx == m.config.n_ctx_train == 8192
    finally:
        m.close()
    r = _cli("run", "-m", str(smol_path), "--device", "cpu", "-c", "0", "-p", "Hi", "-n", "1", "--temp", "0")
    assert r.returncode == 0, r.stderr


def test_file_type_is_general_file_type(tmp_path, smol_path):
    """general.file_type 15 is llama_ftype MOSTLY_Q4_K_M (it was shown as the dominant tensor type,
    Q5_0 for the Qwen2.5-0.5B Q4_K_M file); llama.cpp's GUESSED bit (1024) is ignored."""
    assert GGUFModel(smol_path).file_type == "Q4_1"
    p = _patch_field(smol_path, tmp_path / "ft.gguf", "general.file_type", 15)
    g = GGUFModel(p)
    assert g.file_type == "Q4_K_M" and g.dominant_tensor_type == "Q4_1"
    _patch_field(smol_path, p, "general.file_type", 15 | 1024)
    assert GGUFModel(p).file_type == "Q4_K_M"
    _patch_field(smol_path, p, "general.file_type", 999)  # unknown to gguf: the tensors' type
    assert GGUFModel(p).file_type == "Q4_1"
    _patch_field(smol_path, p, "general.file_type", 15)  # and the run banner shows file_type (one CLI run)
    out = _cli("run", "-m", str(p), "--device", "cpu", "-p", "hi", "-n", "1")
    assert out.returncode == 0 and "(llama, Q4_K_M, cpu)" in out.stderr.decode()


def test_unknown_model_name_lists_known_names(monkeypatch):
    from pyminfer import models

    def no_download(*a, **k):
        raise AssertionError("must not download")

    monkeypatch.setattr(models, "ensure_model", no_download)
    with pytest.raises(FileNotFoundError, match=r"qwen-typo \(nor is it a known model name: .*smollm2-135m"):
        models.resolve_model("qwen-typo")
    if "gemma3-270m" in models.MODELS:
        with pytest.raises(ValueError, match="architecture 'gemma3', which pyminfer does not run"):
            models.resolve_model("gemma3-270m")
    assert "gemma3-270m" not in models.runnable_models()
    assert all(models.MODELS[n].arch in ("qwen2", "llama") for n in models.runnable_models())


@pytest.mark.parametrize("value,match", [
    (0, "llama.context_length 0; must be 1"),
    # not "n_ctx must be in 0..2147483647 (0: the trained context), got 4294967295", blaming -c 0
    (2**32 - 1, "llama.context_length 4294967295; must be 1"),
    (None, "missing metadata key llama.context_length"),
])
def test_bad_context_length(tmp_path, smol_path, value, match):
    """context_length 0 once made the default n_ctx 0 ("n_ctx must be >= 1"); a missing one was
    silently taken as 4096. Both are refused, as llama.cpp does, naming the key."""
    if value is None:  # rename the key (same length, the file stays well-formed)
        p = _patch_bytes(smol_path, tmp_path / "ctx.gguf", b"llama.context_length", b"llama.context_lengtX")
    else:
        p = _patch_field(smol_path, tmp_path / "ctx.gguf", "llama.context_length", value)
    with pytest.raises(GGUFError, match=match):
        GGUFModel(p)
    _one_line_error(_cli("run", "-m", str(p), "--device", "cpu", "-p", "hi", "-n", "1"), match)


def test_broken_pipe_is_quiet(smol_path):
    """``pyminfer run ... | head -c 10``: no error message, status 141 (128 + SIGPIPE), like a tool
    killed by SIGPIPE."""
    proc = subprocess.Popen([sys.executable, "-m", "pyminfer", "run", "-m", str(smol_path), "--device", "cpu",
                             "-p", "Tell me a long story", "-n", "400", "--temp", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(1)  # generation has started
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "error" not in err.lower() and "Traceback" not in err and "Exception ignored" not in err


def test_options_ignored_without_their_switch_are_reported(smol_path):
    """--spec-draft-n without --spec-draft and --spec-ngram-size-* without --spec-type ngram-simple do
    nothing: a warning says so (the run itself goes on); none when they take effect or are not given."""
    base = ["run", "-m", str(smol_path), "-p", "hi", "-n", "2", "--device", "cpu", "--temp", "0"]
    out = _cli(*base, "--spec-draft-n", "3", "--spec-ngram-size-m=4")
    err = out.stderr.decode()
    assert out.returncode == 0, err
    assert "warning: --spec-draft-n ignored without --spec-draft" in err
    assert "warning: --spec-ngram-size-m ignored without --spec-type ngram-simple" in err
    for extra in ([], ["--spec-type", "ngram-simple", "--spec-ngram-size-n", "2"]):
        out = _cli(*base, *extra)
        assert out.returncode == 0 and "ignored without" not in out.stderr.decode(), out.stderr


def test_version_and_missing_command():
    """`pyminfer --version` prints the version; no subcommand is a usage error that names what
    is missing in the user's terms (argparse once said 'cmd', the internal attribute)."""
    out = _cli("--version")
    assert out.returncode == 0 and out.stdout.decode().startswith("pyminfer "), out
    out = _cli()
    err = out.stderr.decode()
    assert out.returncode == 2 and "required: COMMAND" in err and "cmd" not in err, err


def test_spec_settings_checked_without_a_draft(smol_path):
    """spec_draft_n outside 0..8 and spec_adaptive without a draft model are errors in the API as
    in the CLI (the API took both silently without a draft); the CLI refuses --spec-draft-n 9
    without first warning that it ignores it."""
    for kw, err, match in (({"spec_draft_n": 9}, ValueError, "spec_draft_n must be in 0..8, got 9"),
                           ({"spec_draft_n": -1}, ValueError, "spec_draft_n must be in 0..8, got -1"),
                           ({"spec_adaptive": True}, ValueError, "spec_adaptive needs a draft model")):
        with pytest.raises(err, match=match):
            LLM(smol_path, device="cpu", n_ctx=64, **kw)
    with Model(smol_path, device="cpu", n_ctx=64) as m:
        with pytest.raises(ValueError, match="spec_draft_n must be in 0..8"):
            LLM.from_models(m, spec_draft_n=9)
    out = _cli("run", "-m", str(smol_path), "--device", "cpu", "-p", "hi", "-n", "2", "--spec-draft-n", "9")
    err = out.stderr.decode()
    assert out.returncode == 1 and "must be in 0..8, got 9" in err and "warning" not in err, err


def test_api_argument_types_named(smol_path):
    """A wrong type in the Python API gives a TypeError naming the argument: stop=5 was "'int'
    object is not iterable", a None prompt "token ids must be a list of ints" (meant text?),
    LLM(123) "model file not found: 123"."""
    with pytest.raises(TypeError, match="model_path must be a str, a path or None, got int"):
        LLM(123)
    with pytest.raises(TypeError, match="draft_model must be a str, a path or None, got float"):
        LLM(smol_path, device="cpu", draft_model=1.5)
    with LLM(smol_path, device="cpu", n_ctx=64) as llm:
        for stop, got in ((5, "got int"), (b"x", "got bytes$"), ([None], r"got list with NoneType stop\[0\]"),
                          (["a", 3], r"got list with int stop\[1\]")):
            with pytest.raises(TypeError, match="stop must be a string or a list of strings, " + got):
                llm.generate("Hi", max_tokens=2, stop=stop)
        for prompt in (None, 5, 2.5, b"Hi"):
            with pytest.raises(TypeError, match="prompt must be str or a list of token ids"):
                llm.generate(prompt, max_tokens=2)
        a = llm.generate("Hi", max_tokens=2, temperature=0, stop=("zz", "yy"))  # tuples and arrays still work
        b = llm.generate(np.array(llm.tokenize("Hi")), max_tokens=2, temperature=0)
        assert a.generated_ids == b.generated_ids and len(a.generated_ids) == 2


def test_cli_reports_usage_errors_and_missing_files_by_name(tmp_path, smol_path):
    """An unknown flag after the subcommand shows the subcommand's usage (it showed the top level's),
    one before it the top level's; a missing -f file and an uncreatable model cache are one line
    with the path first (the cache's naming PYMINFER_CACHE); a missing model for `serve` is refused
    before uvicorn starts (it announced its address first)."""
    out = _cli("run", "-m", str(smol_path), "-p", "hi", "--bogus")
    err = out.stderr.decode()
    assert out.returncode == 2 and "usage: pyminfer run" in err and "unrecognized arguments: --bogus" in err, err
    out = _cli("--bogus", "run", "-m", str(smol_path), "-p", "hi")
    err = out.stderr.decode()
    assert out.returncode == 2 and "usage: pyminfer [-h]" in err and "pyminfer: error: unrecognized" in err, err
    _one_line_error(_cli("run", "-m", str(smol_path), "-f", str(tmp_path / "nope.txt")),
                    f"pyminfer: error: {tmp_path / 'nope.txt'}: No such file or directory")
    env = {**os.environ, "PYMINFER_CACHE": str(smol_path / "sub")}  # under a file: cannot be created
    out = subprocess.run([sys.executable, "-m", "pyminfer", "run", "-m", "smollm2-135m", "-p", "hi"], env=env,
                         capture_output=True, timeout=120)
    _one_line_error(out, f"{smol_path / 'sub'}: Not a directory (the model cache; PYMINFER_CACHE")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    err = _one_line_error(_cli("serve", "-m", str(tmp_path / "nope.gguf"), "--port", "0"), "model file not found")
    assert "Uvicorn running" not in err
    err = _one_line_error(_cli("serve", "-m", str(tmp_path), "--port", "0"), f"{tmp_path}: is a directory, not a GGUF file")
    assert "Uvicorn running" not in err
    out = subprocess.run([sys.executable, "-m", "pyminfer", "serve", "-m", "smollm2-135m", "--port", "0"], env=env,
                         capture_output=True, timeout=120)
    assert "Uvicorn running" not in _one_line_error(out, "(the model cache; PYMINFER_CACHE")


@pytest.mark.parametrize("flags,why", [(["-fa"], "attention is always fused"),
                                      (["-ngl", "99"], "no partial offload"),
                                      (["--n-gpu-layers", "99"], "no partial offload"),
                                      (["--flash-attn"], "attention is always fused"), (["-cb"], "one generation at a time"),
                                      (["-tb", "2"], "--threads serves"), (["-ctk=q8_0"], "the KV cache is f16"),
                                      (["-cx"], "write -c x"),
                                      # the draft flags: pyminfer's names given ("-md" hinted "write -m d")
                                      (["-md", "x.gguf"], "pyminfer's: --spec-draft MODEL"),
                                      (["--draft-max", "4"], "pyminfer's: --spec-draft-n D"),
                                      (["--draft-p-min=0.5"], "--spec-draft-adaptive picks")])
def test_llama_cpp_multi_letter_flags_are_refused(tmp_path, smol_path, monkeypatch, flags, why):
    """argparse read llama.cpp's -fa as -f a (the prompt silently came from a file named 'a') and
    -ngl 99 as -n gl; now each is a usage error that names the flag and says why pyminfer has no
    such flag (it suggested "write -n gl" for -ngl), before anything is read; an unknown glued
    token gets the hint to write the value apart."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").write_text("Secret prompt")
    out = _cli("run", "-m", str(smol_path), "-p", "hi", "--device", "cpu", *flags)
    err = out.stderr.decode()
    flag = flags[0].split("=")[0]
    assert out.returncode == 2 and f"unrecognized argument: {flag}" in err and why in err, err
    assert "write -n gl" not in err and "write -f a" not in err
    out = _cli("bench", "-m", str(smol_path), *flags)  # bench has no -f / -x: argparse's or our refusal
    assert out.returncode == 2 and "unrecognized argument" in out.stderr.decode() and flag in out.stderr.decode()
    out = _cli("run", "-m", str(smol_path), "-p", "hi", "--device", "cpu", "-n1", "--temp", "0")  # glued digits parse
    assert out.returncode == 0, out.stderr.decode()


def test_glued_flag_check_keeps_what_argparse_parses():
    """Stacked switches (synth -qo FILE: -q -o FILE) and a glued choice (bench -ojson) still parse;
    -hf (llama.cpp's model-from-hub flag) is refused, not read as -h."""
    from pyminfer.cli import _refuse_glued_flags, build_parser

    ap = build_parser()
    for argv in (["synth", "-qo", "x.gguf", "--shape", "7b"], ["bench", "-ojson"], ["run", "-n16"], ["run", "--", "-fa"]):
        _refuse_glued_flags(ap, argv)
    assert ap.parse_args(["synth", "-qo", "x.gguf", "--shape", "7b"]).output == "x.gguf"
    for argv in (["-hf"], ["run", "-hf", "x"], ["run", "-fa"], ["bench", "-ngl", "99"]):
        with pytest.raises(SystemExit) as e:
            _refuse_glued_flags(ap, argv)
        assert e.value.code == 2, argv


def test_missing_server_extra_and_native_core_are_one_line_errors(tmp_path):
    """`pyminfer serve` without fastapi / uvicorn: the install advice as one line (it was a
    traceback); `import pyminfer` without the compiled core: an ImportError that says so (it was
    Python's "partially initialized module ... circular import")."""
    code = ("import sys; sys.modules['fastapi'] = None\n"
            "from pyminfer.cli import main\n"
            "sys.exit(main(['serve', '-m', 'smollm2-135m']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    _one_line_error(out, "pyminfer serve needs fastapi and uvicorn: pip install 'pyminfer[server]'")
    # the package's Python files without the compiled core, imported without site-packages (-S:
    # an editable install's finder would import the built one)
    import shutil

    import pyminfer

    shutil.copytree(Path(pyminfer.__file__).parent, tmp_path / "pyminfer",
                    ignore=lambda d, names: [n for n in names if n.startswith("_core.") and not n.endswith((".pyx", ".pxd"))])
    out = subprocess.run([sys.executable, "-S", "-c", "import pyminfer"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1 and "native core (pyminfer._core) is not built or does not load; install" in out.stderr, \
        out.stderr
    assert "circular import" not in out.stderr and "direct cause" not in out.stderr, out.stderr
