#!/usr/bin/env bash
# The command's bytecode cache on the device (envvault/entry.py): the same commands with
# ENVVAULT_BYTECODE_CACHE=0 and on, alternately, and what a run compiles or writes (python -v), and profiles.
# Needs the carried wheels in .whl/ and the compile cache archive at bench/out/inductor-cache.tar.zst.
set -u
OUT=${OUT:-/tmp}
PY=python3
VENV=$($PY -c 'import sys; print(sys.prefix)')
rm -rf /tmp/site /tmp/bc && mkdir -p /tmp/bc/c
$PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
ls /tmp/site/envvault/__pycache__ 2>/dev/null | wc -l | sed 's/^/pyc beside the sources in \/tmp\/site: /'
echo "HOME=$HOME XDG_CACHE_HOME=${XDG_CACHE_HOME:-} PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-}"
export PYTHONPATH=/tmp/site ENVVAULT_HOME=/tmp/bc/v
EV=/tmp/site/bin/envvault
$PY -c 'import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)' \
  <bench/out/inductor-cache.tar.zst | tar -xf - -C /tmp/bc/c
$EV snap --venv "$VENV" --no-caches -m base >/dev/null
$EV cache snap --no-discover --cache-dir /tmp/bc/c -m c >/dev/null
$EV snap --venv "$VENV" --lock-only -m lo >/dev/null
t() { local name=$1; shift; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; rc=$?; t1=$(date +%s.%N); echo "$name: $($PY -c "print(round($t1 - $t0, 3))") s rc $rc"; }
for i in 1 2 3; do
  for bc in 0 1; do
    t "cache snap bc=$bc" env ENVVAULT_BYTECODE_CACHE=$bc $EV cache snap --no-discover --cache-dir /tmp/bc/c -m c
    t "lock-only bc=$bc" env ENVVAULT_BYTECODE_CACHE=$bc $EV snap --venv "$VENV" --lock-only -m lo
    t "status bc=$bc" env ENVVAULT_BYTECODE_CACHE=$bc $EV status --venv "$VENV"
  done
done
for bc in 0 1; do
  ENVVAULT_BYTECODE_CACHE=$bc $PY -v -m envvault cache snap --no-discover --cache-dir /tmp/bc/c -m c 2>$OUT/v_cache_snap_bc$bc.txt >/dev/null
  echo "bc=$bc: created $(grep -c "^# created\|^# wrote" $OUT/v_cache_snap_bc$bc.txt), code objects $(grep -c '^# code object from' $OUT/v_cache_snap_bc$bc.txt), could not $(grep -c 'could not' $OUT/v_cache_snap_bc$bc.txt)"
  ENVVAULT_BYTECODE_CACHE=$bc $PY -m cProfile -s tottime -m envvault cache snap --no-discover --cache-dir /tmp/bc/c -m c 2>&1 | head -45 >$OUT/profile_cache_snap_bc$bc.txt
  ENVVAULT_BYTECODE_CACHE=$bc $PY -m cProfile -s tottime -m envvault snap --venv "$VENV" --lock-only -m lo 2>&1 | head -45 >$OUT/profile_lock_only_bc$bc.txt
done
ls -ld ~/.cache/envvault/pycache 2>&1; du -sh ~/.cache/envvault/pycache 2>&1
