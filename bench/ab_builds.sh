#!/usr/bin/env bash
# Interleaved A/B of two builds on the GPU machine, for changes no environment switch can select
# (a data layout, a kernel's structure): build an older tree and this working tree side by side
# (non-editable, sm_90, into /tmp/ab/old and /tmp/ab/new), then run one bench script under each in
# turn, old, new, old, new, ... (each run a fresh process on the same weights and seed).
#
#   git archive -o .carry/old.tar.gz <commit> CMakeLists.txt pyproject.toml native pyminfer README.md
#   bash bench/ab_builds.sh .carry/old.tar.gz ROUNDS SCRIPT [ARGS...]    (SCRIPT relative to bench/)
#
# Carry .whl (gguf, cython-cmake) and the tarball. Output: each run's stdout, headed "== old k" /
# "== new k". AB_CMAKE_ARGS overrides the builds' CMAKE_ARGS (bench/ab_common.sh).
# It removes the editable install first (bench/ab_common.sh says why): before another script on the
# same machine, reinstall it with `SKIP_TESTS=1 SKIP_BENCH=1 bash bench/gpu_run.sh` (seconds, build dir kept).
set -eo pipefail
export PYTHONUNBUFFERED=1
[ $# -ge 3 ] || { echo "usage: bash bench/ab_builds.sh OLD.tar.gz ROUNDS SCRIPT [ARGS...]" >&2; exit 2; }
old_tar=$1 rounds=$2 script=$3
shift 3
root=$(pwd)
source "$root/bench/ab_common.sh"
ab_setup
rm -rf /tmp/ab  # never bench an earlier call's builds
mkdir -p /tmp/ab/src_old
tar -xzf "$old_tar" -C /tmp/ab/src_old
ab_build old /tmp/ab/src_old /tmp/ab/old
ab_build new "$root" /tmp/ab/new
cd "$root/bench"
for k in $(seq 1 "$rounds"); do
  for side in old new; do
    echo "== $side $k"
    ab_run /tmp/ab/$side "$script" "$@"
  done
done
