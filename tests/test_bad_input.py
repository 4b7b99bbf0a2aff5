"""Bad input gets a clear error, never a crash or a silent wrong answer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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


def test_negative_threads_refused(smol_path):
    with pytest.raises(ValueError, match="n_threads"):
        Model(smol_path, device="cpu", n_ctx=16, n_threads=-1)
