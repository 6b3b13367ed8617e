#!/usr/bin/env bash
# restore --into of the device venv under several variants in the same rounds, order rotating round by round,
# uv's install of the exported wheels (into a venv made before the clock starts) as the anchor of each round.
# Variants: old (the carried tree .whl/old-tree: `git archive REV envvault`), and the wheel's code under each
# setting given (NAME=VALUE, e.g. ENVVAULT_RESTORERS=8; `-`: none). The 2026-12-06 runs
# (bench/results/gpu_into_variants_*.txt) named a knob of a forked writer tried then, ENVVAULT_WRITE_PROCESSES,
# as P<n>. Usage: OUT=$OUT bash bench/gpu_into_variants.sh [ROUNDS] [SETTING...]
set -u
ROUNDS=${1:-3}; shift || true
SETTINGS=${*:-"-"}
. bench/gpu_two_trees_setup.sh
variants="old"; for p in $SETTINGS; do variants="$variants $p"; done
{
for i in $(seq "$ROUNDS"); do
  set -- $variants; n=$#; order=""
  for k in $(seq 0 $((n - 1))); do j=$(( (k + i - 1) % n + 1 )); order="$order ${!j}"; done
  rm -rf /tmp/uvinto && $UVB venv -q --python $BASE /tmp/uvinto && sync; t0=$(now); $UVB pip install -q --offline --no-deps --python /tmp/uvinto/bin/python /tmp/exp/pylock.wheels/*.whl; t1=$(now); echo "round $i anchor uv install: $(secs $t0 $t1) s"
  for t in $order; do
    site=/tmp/site; env=$t; [ $t = old ] && site=/tmp/oldsite; case $env in *=*) ;; *) env=ENVVAULT_NONE=1;; esac
    rm -rf /tmp/into1 && sync; t0=$(now); env "$env" PYTHONPATH=$site $PY -m envvault restore latest --into /tmp/into1 >/dev/null 2>/tmp/err || tail -2 /tmp/err; t1=$(now); echo "round $i $t --into: $(secs $t0 $t1) s"
  done
done
rm -rf /tmp/into1 && sync; ENVVAULT_STAGES=1 PYTHONPATH=/tmp/site $PY -m envvault restore latest --into /tmp/into1 2>&1 | grep -E "stage|verified"
} 2>&1 | tee "${OUT:-/tmp}/gpu_into_variants.txt"
