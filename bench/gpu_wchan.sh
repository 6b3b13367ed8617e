#!/usr/bin/env bash
# Where the threads of uv's install and of restore --into wait in the kernel (bench/wchan_sample.py), each run
# in /tmp/fair right after the last tree was removed, as gpu_into_fair.sh runs them; --into once per SETTING
# (NAME=VALUE, e.g. ENVVAULT_RESTORERS=16; `-`: none). Usage: OUT=$OUT bash bench/gpu_wchan.sh [ROUNDS] [SETTING...]
set -u
ROUNDS=${1:-2}; shift || true
SETTINGS=${*:-"-"}
. bench/gpu_two_trees_setup.sh
T=/tmp/fair
{
for i in $(seq "$ROUNDS"); do
  rm -rf $T; sync; $UVB venv -q --python $BASE $T
  $PY bench/wchan_sample.py "round $i uv install" "$UVB pip install -q --offline --no-deps --python $T/bin/python /tmp/exp/pylock.wheels/*.whl"
  for e in $SETTINGS; do
    rm -rf $T; sync; env=$e; case $env in *=*) ;; *) env=ENVVAULT_NONE=1;; esac
    env "$env" PYTHONPATH=/tmp/site $PY bench/wchan_sample.py "round $i --into $e" "$PY -m envvault restore latest --into $T"
  done
done
rm -rf $T
} 2>&1 | tee "${OUT:-/tmp}/gpu_wchan.txt"
