"""Shared fixtures: real models from the cache (fetched when missing) and loaded engines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# ../shared/golden beside the repo, or $PYMINFER_GOLDEN_DIR (the GPU machine gets a carried copy).
GOLDEN = Path(os.environ.get("PYMINFER_GOLDEN_DIR") or Path(__file__).resolve().parents[1].parent / "shared" / "golden")


def golden(name: str) -> dict:
    """A file of ../shared/golden (skips the test when shared/ is not beside the repo)."""
    p = GOLDEN / name
    if not p.exists():
        pytest.skip(f"golden file {p} not available")
    return json.loads(p.read_text())


@pytest.fixture(scope="session")
def smol_path() -> Path:
    from pyminfer.models import ensure_model

    return ensure_model("smollm2-135m", progress=False)


@pytest.fixture(scope="session")
def qwen05_path() -> Path:
    from pyminfer.models import ensure_model

    return ensure_model("qwen2.5-coder-0.5b", progress=False)


@pytest.fixture(scope="session")
def qwen15_path() -> Path:
    from pyminfer.models import ensure_model

    return ensure_model("qwen2.5-coder-1.5b", progress=False)


@pytest.fixture(scope="session")
def smol(smol_path):
    from pyminfer.engine import Model

    m = Model(smol_path, device="cpu", n_ctx=2048)
    yield m
    m.close()


@pytest.fixture(scope="session")
def qwen05(qwen05_path):
    from pyminfer.engine import Model

    m = Model(qwen05_path, device="cpu", n_ctx=2048)
    yield m
    m.close()
