"""pyminfer.gguf_file (the fast GGUF header reader) against the `gguf` package's GGUFReader, the
reference, on the real files; truncated copies get an error naming what ran past the end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyminfer import gguf_file
from pyminfer.gguf_model import GGUFError, GGUFModel


def _same_as_gguf_reader(path: Path) -> None:
    from gguf import GGUFReader

    h = gguf_file.parse(path)
    r = GGUFReader(path)
    assert h is not None and h.data_offset == r.data_offset and h.file_size == path.stat().st_size
    assert [t.name for t in h.tensors] == [t.name for t in r.tensors]
    for a, b in zip(h.tensors, r.tensors):
        assert (a.dims, a.type, a.offset) == (tuple(int(x) for x in b.shape), int(b.tensor_type), int(b.data_offset))
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    assert list(h.kv) == keys
    for k in keys:
        want, got = r.fields[k].contents(), h.kv[k]
        if isinstance(got, np.ndarray):
            assert np.array_equal(np.asarray(want), got), k
        else:
            assert want == got, k
    # the model load's selection: everything but the tokenizer's keys, the same tensors
    s = gguf_file.parse(path, skip=("tokenizer.",))
    assert s is not None and list(s.kv) == [k for k in keys if not k.startswith("tokenizer.")]
    assert s.tensors == h.tensors


def test_smollm2_header_equals_gguf_reader(smol_path):
    _same_as_gguf_reader(smol_path)


def test_qwen_header_equals_gguf_reader(qwen05_path):
    _same_as_gguf_reader(qwen05_path)


def test_tensor_views_are_the_file_bytes(smol_path):
    """GGUFModel's tensor addresses point at each tensor's bytes in the mapped file."""
    m = GGUFModel(smol_path)
    raw = smol_path.read_bytes()
    base = int(m.data.ctypes.data)
    for t in gguf_file.parse(smol_path).tensors[:5]:
        addr, _, _, _ = m.tensors[t.name]
        assert addr - base == t.offset
        assert bytes(m.data[t.offset:t.offset + 64]) == raw[t.offset:t.offset + 64]


@pytest.mark.parametrize("cut,match", [
    (0, r"0 bytes: too short"),
    (100, r"truncated: the value of 'general\.\w+' at offset \d+ needs \d+ bytes, the file has 100 bytes"),
    (1 << 20, r"truncated: .* of 'tokenizer\.ggml\.\w+' at offset \d+ needs \d+ bytes"),
    (-100, r"tensor 'output_norm\.weight' is truncated: its \d+ bytes at offset \d+ end past the end of the file"),
])
def test_truncated_copies_name_what_is_missing(tmp_path, smol_path, cut, match):
    data = smol_path.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    with pytest.raises(GGUFError, match=match):
        GGUFModel(p)


@pytest.mark.parametrize("version,match", [
    (b"\x00\x00\x00\x03", r"a big-endian GGUF file \(version 3 in big-endian byte order\): not supported"),
    (b"\x01\x00\x00\x00", r"GGUF version 1 is no longer supported"),
    (b"\x63\x00\x00\x00", r"unsupported GGUF version 99 \(this reader knows versions 2 and 3\)"),
])
def test_other_versions_and_big_endian_are_refused(tmp_path, smol_path, version, match):
    """A big-endian file (its tensor data would be byte-swapped noise to the kernels), GGUF v1 and
    unknown versions: a worded error, not one from the gguf library ("index 0 is out of bounds")."""
    data = bytearray(smol_path.read_bytes()[:1 << 20])
    data[4:8] = version
    p = tmp_path / "v.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=match):
        GGUFModel(p)


def test_unknown_array_element_type_is_corrupt(tmp_path, smol_path):
    """An array of an unknown element type is a corrupt file, not one left to gguf.GGUFReader
    (which said "np.uint32(72) is not a valid GGUFValueType")."""
    import struct

    data = bytearray(smol_path.read_bytes())
    key = b"tokenizer.ggml.tokens"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)  # its value type, then the array header
    assert struct.unpack_from("<II", data, at) == (9, 8)  # ARRAY of STRING
    struct.pack_into("<I", data, at + 4, 72)
    p = tmp_path / "t.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=r"corrupt: unknown array element type 72 for metadata key 'tokenizer\.ggml\.tokens'"):
        GGUFModel(p)


def test_directory_is_refused(tmp_path):
    with pytest.raises(GGUFError, match="is a directory"):
        GGUFModel(tmp_path)


def test_layouts_left_to_gguf_reader_load_alike(smol_path, monkeypatch):
    """Where the fast reader declines a file (nested metadata arrays: parse returns None) the model load
    goes through gguf.GGUFReader: the same config, tensor table and metadata."""
    fast = GGUFModel(smol_path)
    monkeypatch.setattr(gguf_file, "parse", lambda *a, **k: None)
    slow = GGUFModel(smol_path)
    assert slow.config == fast.config and slow.weight_bytes == fast.weight_bytes
    base_f, base_s = int(fast.data.ctypes.data), int(slow.data.ctypes.data)
    assert {k: (a - base_f, *r) for k, (a, *r) in fast.tensors.items()} == \
        {k: (a - base_s, *r) for k, (a, *r) in slow.tensors.items()}
    assert fast.meta.keys() == slow.meta.keys() and fast.file_type == slow.file_type


def test_misaligned_tensor_offset_is_refused_at_load(tmp_path, smol_path):
    """A tensor offset off the file's alignment (32) is a load error naming the tensor; it loaded
    and failed at generation time with "NaN logits"."""
    import struct

    data = bytearray(smol_path.read_bytes())
    name = b"token_embd.weight"
    h = gguf_file.parse(smol_path)
    assert h is not None
    at = data.index(struct.pack("<Q", len(name)) + name, 0, h.data_offset) + 8 + len(name)  # its tensor info
    (nd,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<Q", data, at + 4 + 8 * nd + 4, 3)  # after the dims and the type: the offset
    p = tmp_path / "misaligned.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=rf"tensor 'token_embd\.weight' starts at byte {h.data_offset + 3}, not a "
                                        r"multiple of general\.alignment 32"):
        GGUFModel(p)
