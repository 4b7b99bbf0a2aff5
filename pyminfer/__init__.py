"""pyminfer: GGUF inference with speculative decoding (CUDA backend, C CPU backend as the oracle)."""

import os

# The CPU backend's OpenMP runtime (libgomp) spins waiting for work between parallel regions; on a loaded 2-core machine pure
# spinning collapses throughput (measured 2026-11-29, SmolLM2 2 threads + one busy process: 1.7
# tok/s at 30000 spins, 25 at 1000; quiet: 202 vs 197), so spin briefly then sleep. Set before
# the OpenMP runtime loads.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

try:
    from . import _core  # noqa: E402,F401  (the compiled C/CUDA core)
except ImportError as e:  # a source tree never built, or a build for another Python
    # A checkout never built: Python then says "cannot import name '_core' from partially initialized
    # module ... (most likely due to a circular import)", which points the wrong way: not chained.
    unbuilt = e.name == __name__  # the name that failed is the package's own, not a library's
    why = "" if unbuilt else f" ({e})"
    raise ImportError(
        f"pyminfer's native core (pyminfer._core) is not built or does not load{why}; install the package "
        "with `pip install .` (or `pip install -e .` in a checkout)"
    ) from (None if unbuilt else e)


def _installed_version() -> str:
    """The installed distribution's version (importlib.metadata), or 'unknown' in a source checkout
    without metadata; never raises."""
    try:
        from importlib.metadata import version

        return version("pyminfer")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


__version__: str = _installed_version()  # as `pyminfer --version` prints it

from .api import LLM  # noqa: E402,F401  (imports no server dependency)
from .infill import InfillChunk  # noqa: E402,F401  (LLM.infill(..., extra=[InfillChunk(text, filename)]))
from .ngram import NgramSpec  # noqa: E402,F401  (LLM(spec_ngram=NgramSpec(n, m)))
from .sampling import NaNLogitsError, TokenLogprob  # noqa: E402,F401  (corrupt weights; LLM.generate(logprobs=n))
from .generate import ScoringCancelled  # noqa: E402,F401  (LLM.prompt_logprobs(cancel=event))
