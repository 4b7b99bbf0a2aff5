#!/usr/bin/env bash
# Interleaved A/B of builds of this working tree that differ only in extra CUDA compile flags (a
# macro a kernel reads at compile time, such as launch bounds, which no environment switch can
# select): each variant built non-editable for sm_90 into /tmp/abf/vK with its own build dir, then
# one bench script run under each in turn, v0, v1, ..., v0, v1, ... (a fresh process each run).
#
#   AB_FLAGS='|-DMI_MMVQ_MINB1=12|-DMI_MMVQ_MINB1=16' bash bench/ab_flags.sh ROUNDS SCRIPT [ARGS...]
#
# Variants are separated by '|'; an empty one is the default build. SCRIPT is relative to bench/.
# Carry .whl (gguf, cython-cmake). Output: each run's stdout, headed "== vK round (flags)".
# (bench/ab_builds.sh compares two source trees instead.)
set -eo pipefail
export PYTHONUNBUFFERED=1
[ $# -ge 2 ] || { echo "usage: AB_FLAGS='|-DX=1' bash bench/ab_flags.sh ROUNDS SCRIPT [ARGS...]" >&2; exit 2; }
rounds=$1 script=$2
shift 2
root=$(pwd)
IFS='|' read -r -a variants <<<"${AB_FLAGS:?set AB_FLAGS, variants separated by |}"
[ "${AB_FLAGS: -1}" = "|" ] && variants+=("")  # read drops a trailing empty field
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
rm -rf /tmp/abf && mkdir -p /tmp/abf
# An editable install (bench/gpu_run.sh) would shadow PYTHONPATH (see bench/ab_builds.sh): remove it.
python3 -m pip uninstall -y -q pyminfer >/dev/null 2>&1 || true
for k in "${!variants[@]}"; do
  t0=$(date +%s)
  CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 PYTHONPATH=/tmp/site python3 -m pip install -q --no-build-isolation \
    --no-deps --no-compile --target /tmp/abf/v$k -C build-dir=/tmp/abf/build_v$k \
    -C "cmake.define.CMAKE_CUDA_FLAGS=${variants[$k]}" "$root" >/tmp/abf/build_v$k.log 2>&1 \
    || { tail -30 /tmp/abf/build_v$k.log; exit 1; }
  echo "built v$k (${variants[$k]:-default}) in $(( $(date +%s) - t0 )) s"
done
cd "$root/bench"  # no pyminfer package in this directory: the PYTHONPATH one is imported
for r in $(seq 1 "$rounds"); do
  for k in "${!variants[@]}"; do
    echo "== v$k $r (${variants[$k]:-default})"
    PYTHONPATH=/tmp/abf/v$k:/tmp/site python3 -c "import pyminfer, sys; f = pyminfer.__file__
sys.exit(0 if f.startswith('/tmp/abf/v$k/') else 'pyminfer imported from ' + f)"
    PYTHONPATH=/tmp/abf/v$k:/tmp/site python3 "$script" "$@"
  done
done
