#!/usr/bin/env bash
# restore --into and the in-place restore of the device venv, two trees in the same rounds: the carried old
# tree (.whl/old-tree: `git archive REV envvault`) and the wheel's, order alternating round by round, uv's install
# of the exported wheels (into a venv made before the clock starts, as gpu_env_run.py does) as --into's anchor. Usage: OUT=$OUT bash bench/gpu_restore_trees_ab.sh [ROUNDS]
set -u
ROUNDS=${1:-3}
. bench/gpu_two_trees_setup.sh
SP=$($PY -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
for i in $(seq "$ROUNDS"); do
  order="old new"; [ $((i % 2)) -eq 0 ] && order="new old"
  rm -rf /tmp/uvinto && $UVB venv -q --python $BASE /tmp/uvinto && sync; t0=$(now); $UVB pip install -q --offline --no-deps --python /tmp/uvinto/bin/python /tmp/exp/pylock.wheels/*.whl; t1=$(now); echo "round $i anchor uv install: $(secs $t0 $t1) s"
  for t in $order; do
    site=/tmp/site; [ $t = old ] && site=/tmp/oldsite
    rm -rf /tmp/into1 && sync; t0=$(now); PYTHONPATH=$site $PY -m envvault restore latest --into /tmp/into1 >/dev/null 2>/tmp/err || tail -2 /tmp/err; t1=$(now); echo "round $i $t --into: $(secs $t0 $t1) s"
    rm -rf $SP/torch && sync; t0=$(now); PYTHONPATH=$site $PY -m envvault restore latest --venv $V --no-backup >/dev/null 2>/tmp/err || tail -2 /tmp/err; t1=$(now); echo "round $i $t restore torch --no-backup: $(secs $t0 $t1) s"
  done
done 2>&1 | tee "${OUT:-/tmp}/gpu_restore_trees_ab.txt"
