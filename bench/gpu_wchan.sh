#!/usr/bin/env bash
# Where the threads of uv's install and of restore --into wait in the kernel (bench/wchan_sample.py), each run
# in /tmp/fair right after the other's tree was removed, as gpu_into_fair.sh runs them.
# Usage: OUT=$OUT bash bench/gpu_wchan.sh [ROUNDS]
set -u
ROUNDS=${1:-2}
. bench/gpu_two_trees_setup.sh
T=/tmp/fair
{
for i in $(seq "$ROUNDS"); do
  rm -rf $T; sync; $UVB venv -q --python $BASE $T
  $PY bench/wchan_sample.py "round $i uv install" "$UVB pip install -q --offline --no-deps --python $T/bin/python /tmp/exp/pylock.wheels/*.whl"
  rm -rf $T; sync
  PYTHONPATH=/tmp/site $PY bench/wchan_sample.py "round $i --into" "$PY -m envvault restore latest --into $T"
done
rm -rf $T
} 2>&1 | tee "${OUT:-/tmp}/gpu_wchan.txt"
