"""A fast reader for the header of a GGUF file: metadata key/values and the tensor table.

Format: the GGUF spec (github.com/ggml-org/ggml, docs/gguf.md), versions 2 and 3, little-endian:
  magic "GGUF", version u32, n_tensors u64, n_kv u64;
  n_kv x (key: string, value type u32, value), a string = u64 length + UTF-8 bytes, an array =
  element type u32 + count u64 + elements;
  n_tensors x (name: string, n_dims u32, dims u64 x n_dims (ne0 = columns first), ggml type u32,
  offset u64 from the start of the data section);
  padding to ``general.alignment`` (default 32), then the data section.

Why not ``gguf.GGUFReader``: it builds one numpy view per metadata element, ~12 s for the 151,936
strings and ~151k merges of a Qwen2.5 vocabulary on a 2-core machine, against ~0.5 s here. The
library stays the reference: tests compare this reader's keys and tensors with it, and metadata
this reader does not handle (nested arrays) is left to it (``parse`` returns None). GGUF v1 and
big-endian files are refused, as by llama.cpp (the kernels read little-endian tensor data).
Every length and count is checked against the file size before it is used, so a truncated or
corrupt file raises ValueError naming the offset, never a huge allocation or a short slice.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
NP_DTYPE = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
            12: "<f8"}
STRING, ARRAY = 8, 9
MAX_DIMS = 4  # GGML_MAX_DIMS


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: ``dims`` in GGUF order (ne0 = columns first), ggml ``type`` id,
    ``offset``: absolute byte offset of its data in the file (data section start + relative offset)."""

    name: str
    dims: tuple[int, ...]
    type: int
    offset: int


@dataclass(frozen=True)
class Header:
    """What ``parse`` read: ``version``; ``kv``: the kept metadata (strings as str, string arrays as
    lists of str, numeric arrays as numpy arrays, scalars as Python scalars; bool arrays as bool);
    ``tensors``: the tensor table in file order; ``data_offset``: start of the data section;
    ``file_size`` in bytes."""

    version: int
    kv: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int


def parse(path: str | os.PathLike[str], keep: tuple[str, ...] | None = None, skip: tuple[str, ...] = (),
          tensors: bool = True) -> Header | None:
    """Read the header of the GGUF file at ``path``.

    ``keep``: key prefixes whose values are materialized (None: every key) unless they start with one
    of ``skip`` (values not kept are stepped over without building them); ``tensors``: also read the
    tensor table. Returns None for a layout this reader leaves to ``gguf.GGUFReader`` (metadata
    with nested arrays). Raises FileNotFoundError, or ValueError for a file that is not GGUF, is of another
    version than 2 or 3 or big-endian, or is truncated / corrupt (the message names the offset and what
    ran past the end).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise ValueError(f"{size} bytes: too short for a GGUF header (24 bytes)")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(mm, size, keep, skip, tensors)
    finally:
        mm.close()


def _parse(mm: mmap.mmap, size: int, keep: tuple[str, ...] | None, skip: tuple[str, ...],
           tensors: bool) -> Header | None:
    unpack_from = struct.unpack_from
    if mm[:4] != b"GGUF":
        raise ValueError(f"GGUF magic invalid ({mm[:4]!r})")
    (version,) = unpack_from("<I", mm, 4)
    if version not in (2, 3):
        # As llama.cpp (gguf.cpp) words it: a huge version is a big-endian file, whose tensor data the
        # little-endian kernels would read as noise; v1 (2023) predates 64-bit counts.
        (swapped,) = unpack_from(">I", mm, 4)
        if 1 <= swapped <= 3:
            raise ValueError(f"a big-endian GGUF file (version {swapped} in big-endian byte order): not "
                             "supported; gguf-py's gguf-convert-endian (pip install gguf) makes a "
                             "little-endian copy")
        if version == 1:
            raise ValueError("GGUF version 1 is no longer supported (nor by llama.cpp); convert the model again")
        raise ValueError(f"unsupported GGUF version {version} (this reader knows versions 2 and 3)")
    n_tensors, n_kv = unpack_from("<QQ", mm, 8)
    off = 24

    def need(o: int, n: int, what: str) -> None:
        if n > size - o:  # a slice or unpack would come back short or fail without saying why
            raise ValueError(f"truncated: {what} at offset {o} needs {n} bytes, the file has {size} bytes")

    def read_str(o: int, what: str) -> tuple[str, int]:
        need(o, 8, what)
        (ln,) = unpack_from("<Q", mm, o)
        need(o + 8, ln, what)
        return mm[o + 8:o + 8 + ln].decode("utf-8", errors="replace"), o + 8 + ln

    if n_kv > size:  # every key takes at least one byte
        raise ValueError(f"corrupt: {n_kv} metadata keys in a file of {size} bytes")
    kv: dict[str, Any] = {}
    align: Any = 32  # general.alignment, read whatever ``keep`` says
    for i in range(n_kv):
        key, off = read_str(off, f"the name of metadata key {i}")
        need(off, 4, f"the type of {key!r}")
        (vtype,) = unpack_from("<I", mm, off)
        off += 4
        want = (keep is None or key.startswith(keep)) and not (skip and key.startswith(skip))
        if vtype == STRING:
            val, off = read_str(off, f"the value of {key!r}")
        elif vtype == ARRAY:
            need(off, 12, f"the array header of {key!r}")
            atype, n = unpack_from("<IQ", mm, off)
            off += 12
            if n > size - off:  # every element takes at least one byte
                raise ValueError(f"truncated: the {n} elements of {key!r} at offset {off} run past the end of the "
                                 f"file ({size} bytes)")
            if atype == STRING:
                items: list[str] | None = [] if want else None
                for j in range(n):
                    need(off, 8, f"element {j} of {key!r}")
                    (ln,) = unpack_from("<Q", mm, off)
                    off += 8
                    need(off, ln, f"element {j} of {key!r}")
                    if items is not None:
                        items.append(mm[off:off + ln].decode("utf-8", errors="replace"))
                    off += ln
                val = items
            elif atype in NP_DTYPE:
                dt = np.dtype(NP_DTYPE[atype])
                need(off, dt.itemsize * n, f"the values of {key!r}")
                val = np.frombuffer(mm, dtype=dt, count=n, offset=off).copy() if want else None
                if want and atype == 7:
                    val = val.astype(bool)
                off += dt.itemsize * n
            elif atype == ARRAY:  # nested arrays: no key this project reads has them
                return None
            else:
                raise ValueError(f"corrupt: unknown array element type {atype} for metadata key {key!r}")
        elif vtype in SCALAR_FMT:
            fmt = SCALAR_FMT[vtype]
            need(off, struct.calcsize(fmt), f"the value of {key!r}")
            (val,) = unpack_from(fmt, mm, off)
            off += struct.calcsize(fmt)
            if key == "general.alignment":
                align = val
        else:
            raise ValueError(f"corrupt: unknown value type {vtype} for metadata key {key!r}")
        if want:
            kv[key] = val
    infos: list[TensorInfo] = []
    if not tensors:
        return Header(version, kv, infos, 0, size)
    if n_tensors > size:
        raise ValueError(f"corrupt: {n_tensors} tensors in a file of {size} bytes")
    rel: list[tuple[str, tuple[int, ...], int, int]] = []
    for i in range(n_tensors):
        name, off = read_str(off, f"the name of tensor {i}")
        need(off, 4, f"the dimension count of tensor {name!r}")
        (nd,) = unpack_from("<I", mm, off)
        off += 4
        if not 1 <= nd <= MAX_DIMS:
            raise ValueError(f"corrupt: tensor {name!r} has {nd} dimensions (1..{MAX_DIMS})")
        need(off, 8 * nd + 12, f"the shape, type and offset of tensor {name!r}")
        dims = unpack_from(f"<{nd}Q", mm, off)
        typ, toff = unpack_from("<IQ", mm, off + 8 * nd)
        off += 8 * nd + 12
        rel.append((name, tuple(int(d) for d in dims), int(typ), int(toff)))
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
        raise ValueError(f"corrupt: general.alignment {align!r} is not a power of two")
    data_offset = -(-off // align) * align
    for name, dims, typ, toff in rel:
        infos.append(TensorInfo(name, dims, typ, data_offset + toff))
    return Header(version, kv, infos, data_offset, size)
