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
# It removes the editable install first (bench/ab_common.sh says why): before another script on the
# same machine, reinstall it with `SKIP_TESTS=1 SKIP_BENCH=1 bash bench/gpu_run.sh` (seconds, build dir kept).
set -eo pipefail
export PYTHONUNBUFFERED=1
[ $# -ge 2 ] || { echo "usage: AB_FLAGS='|-DX=1' bash bench/ab_flags.sh ROUNDS SCRIPT [ARGS...]" >&2; exit 2; }
rounds=$1 script=$2
shift 2
root=$(pwd)
IFS='|' read -r -a variants <<<"${AB_FLAGS:?set AB_FLAGS, variants separated by |}"
[ "${AB_FLAGS: -1}" = "|" ] && variants+=("")  # read drops a trailing empty field
source "$root/bench/ab_common.sh"
ab_setup
rm -rf /tmp/abf && mkdir -p /tmp/abf  # never bench an earlier call's builds
for k in "${!variants[@]}"; do
  ab_build "v$k (${variants[$k]:-default})" "$root" /tmp/abf/v$k -C build-dir=/tmp/abf/build_v$k \
    -C "cmake.define.CMAKE_CUDA_FLAGS=${variants[$k]}"
done
cd "$root/bench"
for r in $(seq 1 "$rounds"); do
  for k in "${!variants[@]}"; do
    echo "== v$k $r (${variants[$k]:-default})"
    ab_run /tmp/abf/v$k "$script" "$@"
  done
done
