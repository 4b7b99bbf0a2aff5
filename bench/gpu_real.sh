#!/usr/bin/env bash
# Real models on the GPU machine, which has no network: the GGUF files travel in 60 MiB chunks,
# one per device call, into /tmp/models (kept while the machine stays warm), then one call
# assembles and sha256-checks them, builds, runs tests/test_cuda_real.py and the speculative bench.
#   here:   bash ../shared/device/chunk_model.sh MODEL.gguf /tmp/chunks    (per model)
#   device: for each chunk, copy it alone into .carry/ and call `bash bench/gpu_real.sh add`
#           (carry [".carry"]; golden JSON files may ride along in .carry/golden/)
#           then `bash bench/gpu_real.sh run [pytest args]`
#   The speculative bench: adaptive, d = 3, d = 5, adaptive with n-gram drafts first, n-gram drafts alone.
#   HYST=0.02: the adaptive bench again under PYMINFER_ADAPTIVE_HYSTERESIS=0.02 (an A/B of the
#   controller's switch margin, default 0.05). PROBE=0: again under PYMINFER_ADAPTIVE_PROBE=0 (no
#   depth probes). MODES="--spec-draft-adaptive;...": the speculative modes to bench (default: the
#   five above); BASE=0 skips tg / pp and the verify curve; NGRAM=0 skips the n-gram-alone bench.
#   SYNTH=7b,14b: also write those synthetic shapes there (`pyminfer synth`, 20-40 s each, the
#   tokenizer from the carried 0.5B; a file already there from an earlier call is reused: writes
#   are atomic, so it is complete) and bench them as files: tg128 / pp512 and the verify curve.
set -o pipefail
export PYTHONUNBUFFERED=1
M=/tmp/models
mkdir -p "$M"
case "${1:-run}" in
add)
  cp -r .carry/. "$M"/ && ls "$M" | tail -3 && du -sh "$M"
  exit 0 ;;
run)
  shift ;;
*) echo "usage: $0 add|run" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for sum in "$M"/*.sha256; do
  name=$(basename "$sum" .sha256)
  if ls "$M/$name".part* >/dev/null 2>&1; then
    cat "$M/$name".part* > "$M/$name" && rm -f "$M/$name".part*
  fi
  (cd "$M" && sha256sum -c "$name.sha256") || exit 1
done
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
t0=$(date +%s)
CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 python3 -m pip install -q --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export PYMINFER_CACHE=$M PYMINFER_GOLDEN_DIR=$M/golden
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -q -rs tests/test_cuda_real.py "$@" 2>&1 | tee "$OUT/pytest_real.log" | tail -15
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  T=$M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf D=$M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  if [ "${BASE:-1}" != 0 ]; then
    for m in "$T" "$D"; do
      python3 -m pyminfer bench -m "$m" -p 512 -n 128 -r 3 --device cuda 2>&1 | tee -a "$OUT/bench_real.log"
    done
    python3 -m pyminfer bench -m "$T" --verify-curve --device cuda 2>&1 | tee -a "$OUT/bench_real.log"
  fi
  IFS=';' read -r -a modes <<< "${MODES:---spec-draft-adaptive;--spec-draft-n 3;--spec-draft-n 5;--spec-draft-adaptive --spec-type ngram-simple}"
  for mode in "${modes[@]}"; do
    echo "== spec $mode"
    python3 -m pyminfer bench -m "$T" --spec-draft "$D" $mode -n 256 -r 3 --device cuda 2>&1 | tee -a "$OUT/bench_real.log"
  done
  if [ "${NGRAM:-1}" != 0 ]; then
    echo "== spec --spec-type ngram-simple (no draft model)"
    python3 -m pyminfer bench -m "$T" --spec-type ngram-simple -n 256 -r 3 --device cuda 2>&1 | tee -a "$OUT/bench_real.log"
  fi
  for h in ${HYST//,/ }; do  # HYST=0.02,...: adaptive again under PYMINFER_ADAPTIVE_HYSTERESIS=h
    echo "== spec --spec-draft-adaptive, PYMINFER_ADAPTIVE_HYSTERESIS=$h"
    PYMINFER_ADAPTIVE_HYSTERESIS=$h python3 -m pyminfer bench -m "$T" --spec-draft "$D" --spec-draft-adaptive -n 256 -r 3 \
      --device cuda 2>&1 | tee -a "$OUT/bench_real.log"
  done
  for p in ${PROBE//,/ }; do  # PROBE=0,...: adaptive again under PYMINFER_ADAPTIVE_PROBE=p
    echo "== spec --spec-draft-adaptive, PYMINFER_ADAPTIVE_PROBE=$p"
    PYMINFER_ADAPTIVE_PROBE=$p python3 -m pyminfer bench -m "$T" --spec-draft "$D" --spec-draft-adaptive -n 256 -r 3 \
      --device cuda 2>&1 | tee -a "$OUT/bench_real.log"
  done
fi
for shape in ${SYNTH//,/ }; do
  S=/tmp/synth-$shape.gguf
  [ -f "$S" ] || python3 -m pyminfer synth --shape "$shape" -o "$S" -q --tokenizer-from "$M/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" || exit 1
  python3 -m pyminfer bench -m "$S" -p 512 -n 128 -r 3 --device cuda 2>&1 | tee -a "$OUT/bench_synth.log"
  python3 -m pyminfer bench -m "$S" --verify-curve --device cuda 2>&1 | tee -a "$OUT/bench_synth.log"
done
