#!/usr/bin/env bash
# Where restore --into's threads spend the device's time: py-spy (carried as .whl/py-spy: the py-spy wheel's
# binary) samples every active thread, then only the one holding the GIL (--gil), each run into a new folder
# (no tree removed before it: gpu_into_fair.sh says why), summarised by bench/pyspy_fold.py; then one run with
# ENVVAULT_STAGES=1. Usage: OUT=$OUT bash bench/gpu_into_pyspy.sh [RATE]
set -u
RATE=${1:-200}
. bench/gpu_two_trees_setup.sh
{
F=/tmp/pyspy; rm -rf $F; mkdir -p $F; sync
for mode in all gil; do
  flag=""; [ $mode = gil ] && flag=--gil
  t0=$(now); .whl/py-spy record -r "$RATE" -f raw -o $F/$mode.raw --threads $flag -- env PYTHONPATH=/tmp/site $PY -m envvault restore latest --into $F/t-$mode >/dev/null 2>$F/err || tail -3 $F/err; t1=$(now)
  echo "py-spy $mode: --into $(secs $t0 $t1) s"; $PY bench/pyspy_fold.py $F/$mode.raw "$RATE"; cp $F/$mode.raw "${OUT:-/tmp}/pyspy_$mode.raw"
  empty_tree $F/t-$mode
done
ENVVAULT_STAGES=1 PYTHONPATH=/tmp/site $PY -m envvault restore latest --into $F/t-stages 2>&1 | grep -E "stage|verified"
rm -rf $F/t-*
} 2>&1 | tee "${OUT:-/tmp}/gpu_into_pyspy.txt"
