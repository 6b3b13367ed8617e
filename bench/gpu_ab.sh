#!/usr/bin/env bash
# Same-session A/B of two envvault builds on the device's venv: first full snaps alternately (old, new, ...),
# then restores after `rm -rf torch` with the default backup on the new build (ENVVAULT_STAGES=1 phases).
# Usage: OUT=$OUT bash bench/gpu_ab.sh OLD_WHEEL_DIR NEW_WHEEL_DIR [ROUNDS]   (dependencies' wheels in NEW)
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=${3:-2}
PY=python3
VENV=$($PY -c 'import sys; print(sys.prefix)')
SP=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf /tmp/ab && mkdir -p /tmp/ab
$PY -m pip install -q --no-index --no-deps --target /tmp/ab/new "$NEW"/*.whl
mkdir -p /tmp/ab/oldw && cp "$NEW"/*.whl /tmp/ab/oldw/ && rm /tmp/ab/oldw/envvault-*.whl && cp "$OLD"/envvault-*.whl /tmp/ab/oldw/
$PY -m pip install -q --no-index --no-deps --target /tmp/ab/old /tmp/ab/oldw/*.whl
tar -cf - -C "$VENV" . | cat >/dev/null
log=${OUT:-/tmp}/gpu_ab.txt
: >"$log"
for i in $(seq "$ROUNDS"); do
  for b in old new; do
    rm -rf /tmp/ab/v && sync
    t0=$(date +%s.%N)
    PYTHONPATH=/tmp/ab/$b ENVVAULT_HOME=/tmp/ab/v /tmp/ab/$b/bin/envvault snap --venv "$VENV" --no-caches -m ab >/dev/null
    t1=$(date +%s.%N)
    echo "first snap $b round $i: $($PY -c "print(round($t1 - $t0, 2))") s" | tee -a "$log"
  done
done
for i in $(seq "$ROUNDS"); do
  rm -rf "$SP/torch" && sync
  t0=$(date +%s.%N)
  PYTHONPATH=/tmp/ab/new ENVVAULT_HOME=/tmp/ab/v ENVVAULT_STAGES=1 /tmp/ab/new/bin/envvault restore latest --venv "$VENV" \
    >/dev/null 2>/tmp/ab/restore.err
  t1=$(date +%s.%N)
  echo "restore (backup) new round $i: $($PY -c "print(round($t1 - $t0, 2))") s; $(grep 'restore:' /tmp/ab/restore.err | sed 's/envvault-stage //' | tr '\n' ' ')" | tee -a "$log"
done
