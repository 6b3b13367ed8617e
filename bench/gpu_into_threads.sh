#!/usr/bin/env bash
# `restore --into` and `export` of the device's venv with the materializer's thread count changed
# (ENVVAULT_RESTORERS, vault/threads.py), beside uv's install of the exported wheels, in rotating order within
# each round (a write of 7.3 GB right after another runs slower, whichever goes first). Carry .whl/ as for
# bench/gpu_env_run.sh. Usage: OUT=$OUT bash bench/gpu_into_threads.sh [ROUNDS] [COUNTS...]  (default 3; 8 12 16)
set -u
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; shift || true
COUNTS=("$@"); [ ${#COUNTS[@]} -eq 0 ] && COUNTS=(8 12 16)
source bench/gpu_site.sh
W=/tmp/ith
rm -rf $W && mkdir -p $W
log=${OUT:-/tmp}/gpu_into_threads.txt
BASE=$($PY -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
ev() { PATH=/tmp/site/bin:$PATH ENVVAULT_HOME=$W/v $PY -m envvault "$@"; }
{
echo "# $(date -u +'%Y-%m-%d %H:%M UTC') $(nproc) cores, venv $VENV, rounds $ROUNDS, counts ${COUNTS[*]}"
ev snap --venv "$VENV" --no-caches -m full >/dev/null || { echo "snap failed"; exit 1; }
for n in "${COUNTS[@]}"; do
  rm -rf $W/exp && sync
  t0=$(now); ENVVAULT_RESTORERS=$n ev export latest -o $W/exp/pylock.toml >/dev/null || echo "export failed"; t1=$(now)
  echo "export restorers=$n: $(secs $t0 $t1) s"
done
specs=(uv "${COUNTS[@]}")
for i in $(seq "$ROUNDS"); do
  k=${#specs[@]}
  for j in $(seq 0 $((k - 1))); do
    s=${specs[$(( (j + i) % k ))]}
    rm -rf $W/into && sync
    if [ "$s" = uv ]; then
      /tmp/site/bin/uv venv -q --python "$BASE" $W/into && sync
      t0=$(now); /tmp/site/bin/uv pip install -q --offline --no-deps --python $W/into/bin/python $W/exp/pylock.wheels/*.whl; t1=$(now)
      echo "round $i uv install: $(secs $t0 $t1) s"
    else
      t0=$(now); ENVVAULT_STAGES=1 ENVVAULT_RESTORERS=$s ev restore latest --into $W/into >/dev/null 2>$W/err \
        || tail -3 $W/err; t1=$(now)
      echo "round $i --into restorers=$s: $(secs $t0 $t1) s; $(grep -E 'into:|restore:' $W/err | sed 's/envvault-stage //' | tr '\n' ' ' | cut -c1-400)"
    fi
  done
done
rm -rf $W
} 2>&1 | tee "$log"
