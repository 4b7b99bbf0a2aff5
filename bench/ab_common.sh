# Shared steps of the interleaved A/B scripts (bench/ab_builds.sh: two source trees;
# bench/ab_flags.sh: one tree, several compile-flag sets). Sourced, not run.
#
# AB_CMAKE_ARGS: the CMAKE_ARGS of every build (default: real sm_90 code, the H200's).

# Installs the carried wheels (gguf, cython-cmake) into /tmp/site, then removes an editable
# install: scikit-build-core's editable finder sits at the head of sys.meta_path, ahead of
# PYTHONPATH, so every arm would import it (session 24 measured one build twice that way).
ab_setup() {
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  python3 -m pip uninstall -y -q pyminfer >/dev/null 2>&1 || true
}

# ab_build LABEL SRC DEST [PIP_ARGS...]: a non-editable build of SRC into DEST (which must not
# exist: pip --target does not replace a package), its log in DEST.log; prints the time taken.
ab_build() {
  local label=$1 src=$2 dest=$3 t0
  shift 3
  t0=$(date +%s)
  CMAKE_ARGS=${AB_CMAKE_ARGS:--DCMAKE_CUDA_ARCHITECTURES=90} PYTHONPATH=/tmp/site python3 -m pip install -q \
    --no-build-isolation --no-deps --no-compile --target "$dest" "$@" "$src" >"$dest.log" 2>&1 \
    || { tail -30 "$dest.log"; return 1; }
  echo "built $label in $(( $(date +%s) - t0 )) s"
}

# ab_run DEST SCRIPT [ARGS...]: SCRIPT (run from bench/, which holds no pyminfer package) under the
# build in DEST, after checking that DEST's pyminfer is the one imported.
ab_run() {
  local dest=$1
  shift
  PYTHONPATH=$dest:/tmp/site python3 -c "import pyminfer, sys; f = pyminfer.__file__
sys.exit(0 if f.startswith('$dest/') else 'pyminfer imported from ' + f)"
  PYTHONPATH=$dest:/tmp/site python3 "$@"
}
