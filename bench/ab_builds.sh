#!/usr/bin/env bash
# Interleaved A/B of two builds on the GPU machine, for changes no environment switch can select
# (a data layout, a kernel's structure): build an older tree and this working tree side by side
# (non-editable, sm_90, into /tmp/ab/old and /tmp/ab/new), then run one bench script under each in
# turn, old, new, old, new, ... (each run a fresh process on the same weights and seed).
#
#   git archive -o .carry/old.tar.gz <commit> CMakeLists.txt pyproject.toml native pyminfer README.md
#   bash bench/ab_builds.sh .carry/old.tar.gz ROUNDS SCRIPT [ARGS...]    (SCRIPT relative to bench/)
#
# Carry .whl (gguf, cython-cmake) and the tarball. Output: each run's stdout, headed "== old k" / "== new k".
set -eo pipefail
export PYTHONUNBUFFERED=1
old_tar=$1 rounds=$2 script=$3
shift 3
root=$(pwd)
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
rm -rf /tmp/ab  # pip --target does not replace an existing package: never bench an earlier call's builds
# An editable install (bench/gpu_run.sh) puts its finder at the head of sys.meta_path, ahead of
# PYTHONPATH: both sides would import it. Remove it; each run below checks where pyminfer came from.
python3 -m pip uninstall -y -q pyminfer >/dev/null 2>&1 || true
mkdir -p /tmp/ab/src_old
tar -xzf "$old_tar" -C /tmp/ab/src_old
for side in old new; do
  src=$([ $side = old ] && echo /tmp/ab/src_old || echo "$root")
  t0=$(date +%s)
  CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 PYTHONPATH=/tmp/site python3 -m pip install -q --no-build-isolation \
    --no-deps --no-compile --target /tmp/ab/$side "$src" >/tmp/ab/build_$side.log 2>&1 \
    || { tail -30 /tmp/ab/build_$side.log; exit 1; }
  echo "built $side in $(( $(date +%s) - t0 )) s"
done
cd "$root/bench"  # no pyminfer package in this directory: the PYTHONPATH one is imported
for k in $(seq 1 "$rounds"); do
  for side in old new; do
    echo "== $side $k"
    PYTHONPATH=/tmp/ab/$side:/tmp/site python3 -c "import pyminfer, sys; f = pyminfer.__file__
sys.exit(0 if f.startswith('/tmp/ab/$side/') else 'pyminfer imported from ' + f)"
    PYTHONPATH=/tmp/ab/$side:/tmp/site python3 "$script" "$@"
  done
done
