#!/usr/bin/env bash
# Where the start-up-bound rows of issue 11 spend their time on the device: `cache snap`, `cache restore`,
# `snap --lock-only` and `status` of envvault installed with its bytecode compiled (as `uv tool install
# --compile-bytecode` leaves it), each timed 7 times beside its anchor (and again with ENVVAULT_QUICK_EXIT=0: the interpreter's
# teardown kept), then once under -X importtime and
# once under cProfile. Needs the carried wheels in .whl/ and the compile cache archive at
# bench/out/inductor-cache.tar.zst. Writes the timings to $OUT/startup_times.txt and every import time and
# profile to $OUT/startup_profiles.txt (one file: the device returns only a few).
set -u
OUT=${OUT:-/tmp}
PY=python3
VENV=$($PY -c 'import sys; print(sys.prefix)')
W=/tmp/su
rm -rf /tmp/site $W && mkdir -p $W/c
$PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
$PY -m compileall -q -j 0 /tmp/site >/dev/null
export PYTHONPATH=/tmp/site ENVVAULT_HOME=$W/v
EV=/tmp/site/bin/envvault
cd /tmp
ZD='import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)'
ZC='import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)'
$PY -c "$ZD" <"$OLDPWD/bench/out/inductor-cache.tar.zst" | tar -xf - -C $W/c
$EV snap --venv "$VENV" --no-caches -m base >/dev/null
$EV cache snap --no-discover --cache-dir $W/c -m c >/dev/null
$EV snap --venv "$VENV" --lock-only -m lo >/dev/null
$EV status --venv "$VENV" >/dev/null
t() { local name=$1; shift; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; rc=$?; t1=$(date +%s.%N); echo "$name: $($PY -c "print(round($t1 - $t0, 3))") s rc $rc"; }
exec 3>&1 1>$OUT/startup_times.txt
for i in 1 2 3 4 5 6 7; do
  t "python -c pass" $PY -c pass
  t "python -I -S -c pass" $PY -I -S -c pass
  t "anchor tar|zstd cache" bash -c "tar -cf - -C $W/c . | $PY -c '$ZC' >$W/c.tar.zst"
  t "cache snap" $EV cache snap --no-discover --cache-dir $W/c -m c
  t "cache snap, ENVVAULT_QUICK_EXIT=0" env ENVVAULT_QUICK_EXIT=0 $EV cache snap --no-discover --cache-dir $W/c -m c
  rm -rf $W/r
  t "anchor zstd -dc|tar cache" bash -c "mkdir -p $W/r && $PY -c '$ZD' <$W/c.tar.zst | tar -xf - -C $W/r"
  rm -rf $W/r
  t "cache restore" $EV cache restore --to $W/r
  rm -rf $W/r
  t "cache restore, ENVVAULT_QUICK_EXIT=0" env ENVVAULT_QUICK_EXIT=0 $EV cache restore --to $W/r
  t "anchor uv pip freeze" $PY -m uv pip freeze --python "$VENV/bin/python"
  t "lock-only" $EV snap --venv "$VENV" --lock-only -m lo
  t "lock-only, ENVVAULT_QUICK_EXIT=0" env ENVVAULT_QUICK_EXIT=0 $EV snap --venv "$VENV" --lock-only -m lo
  t "anchor pip freeze" $PY -m pip freeze
  t "status" $EV status --venv "$VENV"
  t "status, ENVVAULT_QUICK_EXIT=0" env ENVVAULT_QUICK_EXIT=0 $EV status --venv "$VENV"
done
prof() {
  local name=$1; shift
  { echo "===== importtime $name (envvault, click and their children above 1 ms)"
    $PY -X importtime -m envvault "$@" 2>&1 >/dev/null | awk -F'|' '$2+0 > 1000'
    rm -rf $W/r
    echo "===== cProfile $name, cumulative"
    $PY -m cProfile -s cumtime -m envvault "$@" 2>&1 | head -70
    rm -rf $W/r
    echo "===== cProfile $name, own time"
    $PY -m cProfile -s tottime -m envvault "$@" 2>&1 | head -40
    rm -rf $W/r; } >>$OUT/startup_profiles.txt
}
prof cache_snap cache snap --no-discover --cache-dir $W/c -m c
prof cache_restore cache restore --to $W/r
prof lock_only snap --venv "$VENV" --lock-only -m lo
prof status status --venv "$VENV"
ls $W/v/index | wc -l | sed 's/^/index files: /'
du -sh $W/v/index
exec 1>&3
