#!/usr/bin/env bash
# The one script the GPU machine runs: install carried wheels, build for sm_90, run the CUDA tests,
# then the synthetic decode benchmark (arguments are passed to bench/bench_gpu.py).
# Logs land in $OUT (when set) so they come back even if the call times out.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
t0=$(date +%s)
CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 python3 -m pip install -q --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-900}" python3 -m pytest -x -q tests/test_cuda.py 2>&1 | tee "$OUT/pytest.log" | tail -25
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 bench/bench_gpu.py "$@" 2>&1 | tee "$OUT/bench.log"
fi
