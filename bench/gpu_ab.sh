#!/usr/bin/env bash
# Same-session A/B of two envvault builds on the device's venv: first full snaps alternately (old, new, ...),
# then restores after `rm -rf torch` with the default backup on the new build (ENVVAULT_STAGES=1 phases), then
# the unchanged fast paths of both builds alternately (and of the new one from a venv of its own).
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
# The unchanged fast paths, alternately (the vault of the last first snap; each build its own stat cache
# state is the same format): second snap, status, and status from envvault in a venv of its own (uv tool
# style: the base interpreter, none of the measured venv's .pth files at start-up); pip freeze beside them.
BASE=$($PY -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
$BASE -m venv --without-pip /tmp/ab/tool
/tmp/ab/new/bin/uv pip install -q --offline --no-index --no-deps --compile-bytecode --python /tmp/ab/tool/bin/python "$NEW"/*.whl
for b in old new; do PYTHONPATH=/tmp/ab/$b ENVVAULT_HOME=/tmp/ab/v /tmp/ab/$b/bin/envvault snap --venv "$VENV" --no-caches -m warm >/dev/null; done
fast() {  # name, command...
  local name=$1; shift
  local rc=0
  t0=$(date +%s.%N); "$@" >/dev/null || rc=$?; t1=$(date +%s.%N)
  echo "$name: $($PY -c "print(round($t1 - $t0, 3))") s (rc $rc)" | tee -a "$log"
}
for i in $(seq 5); do
  fast "pip freeze round $i" $PY -m pip freeze
  for b in old new; do
    fast "second snap $b round $i" env PYTHONPATH=/tmp/ab/$b ENVVAULT_HOME=/tmp/ab/v /tmp/ab/$b/bin/envvault snap --venv "$VENV" --no-caches -m again
    fast "status $b round $i" env PYTHONPATH=/tmp/ab/$b ENVVAULT_HOME=/tmp/ab/v /tmp/ab/$b/bin/envvault status --venv "$VENV" --exit-code
  done
  fast "status new, own venv, round $i" env ENVVAULT_HOME=/tmp/ab/v /tmp/ab/tool/bin/envvault status --venv "$VENV" --exit-code
  fast "second snap new, own venv, round $i" env ENVVAULT_HOME=/tmp/ab/v /tmp/ab/tool/bin/envvault snap --venv "$VENV" --no-caches -m again
done
