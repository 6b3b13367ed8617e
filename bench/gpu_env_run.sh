#!/usr/bin/env bash
# Issue 11's device run: every figure on the GPU host's own venv beside its anchor (see bench/gpu_env_run.py).
# Run from the repository root on the device machine, with envvault and its dependencies as cp312 wheels in
# .whl/ (envvault's own wheel built fresh: `pip wheel --no-deps -w .whl .`) and, for the compile-cache rows,
# the H200 cache archive at bench/out/inductor-cache.tar.zst. Arguments go to gpu_env_run.py
# (--repeat N, --profile, --skip snap,fast,restore,into,cache).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
export OUT
mkdir -p "$OUT"
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1 \
  || { echo "pip install of the carried wheels failed"; cat "$OUT/pip.log"; exit 1; }
CACHE=bench/out/inductor-cache.tar.zst
extra=()
[ -f "$CACHE" ] && extra=(--cache-tar "$PWD/$CACHE")
export WHEELS=$PWD/.whl
cd /tmp && exec python3 "$OLDPWD/bench/gpu_env_run.py" "${extra[@]}" "$@"
