#!/usr/bin/env bash
# bench/startup_ab.py on the device: this checkout against an older envvault tree, on the host's own venv.
# Carry .whl/ (the dependencies as cp312 wheels, as for gpu_env_run.sh) and the old tree as
# .whl/old-tree/envvault (made here by: mkdir -p .whl/old-tree && git archive cec12e9 envvault | tar -x -C
# .whl/old-tree). With bench/out/inductor-cache.tar.zst carried, the cache restore row restores that tree (the
# H200 cache) instead of a synthetic one. Usage: OUT=$OUT bash bench/gpu_startup_ab.sh [ROUNDS]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
mkdir -p "$OUT"
[ -d .whl/old-tree/envvault ] || { echo "no .whl/old-tree/envvault: see the header of this script"; exit 1; }
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1 \
  || { echo "pip install of the carried wheels failed"; cat "$OUT/pip.log"; exit 1; }
rm -rf /tmp/site/envvault /tmp/site/envvault-*.dist-info  # each tree brings its own envvault
python3 -m compileall -q envvault .whl/old-tree/envvault /tmp/site >/dev/null 2>&1
VENV=$(python3 -c 'import sys; print(sys.prefix)')
[ -f bench/out/inductor-cache.tar.zst ] && export CACHE_TAR=$PWD/bench/out/inductor-cache.tar.zst
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
{ echo "# $(date -u +'%Y-%m-%d %H:%M UTC') $(nproc) cores, venv $VENV"; \
  python3 bench/startup_ab.py "$VENV" "$PWD/.whl/old-tree" "$PWD" "${1:-9}"; } 2>&1 | tee "$OUT/startup_ab.txt"
