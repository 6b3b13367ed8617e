#!/usr/bin/env bash
# Is --into's gap to uv the tool or the moment? Both write the same folder (/tmp/fair), each right after the
# other's tree was removed (rm -rf + sync, timed), first one then the other, order swapped round by round; then
# the same again after a pause of SETTLE seconds once the removal returned (the filesystem's background work
# done). Also prints /tmp's filesystem, its mount options and the disk's discard setting.
# Usage: OUT=$OUT bash bench/gpu_into_fair.sh [ROUNDS] [SETTLE]
set -u
ROUNDS=${1:-3}; SETTLE=${2:-20}
. bench/gpu_two_trees_setup.sh
{
findmnt -no FSTYPE,SOURCE,OPTIONS -T /tmp; uname -r
for q in discard_max_bytes rotational scheduler; do echo "vda $q: $(cat /sys/block/vda/queue/$q 2>/dev/null)"; done
T=/tmp/fair
clear_t() { t0=$(now); rm -rf $T; sync; t1=$(now); echo "  removal of the last tree: $(secs $t0 $t1) s"; }
uv_run() { $UVB venv -q --python $BASE $T; t0=$(now); $UVB pip install -q --offline --no-deps --python $T/bin/python /tmp/exp/pylock.wheels/*.whl; t1=$(now); echo "round $1 $2 uv install: $(secs $t0 $t1) s"; }
ev_run() { t0=$(now); PYTHONPATH=/tmp/site $PY -m envvault restore latest --into $T >/dev/null 2>/tmp/err || tail -2 /tmp/err; t1=$(now); echo "round $1 $2 --into: $(secs $t0 $t1) s"; }
for i in $(seq "$ROUNDS"); do
  for gap in 0 "$SETTLE"; do
    if [ $((i % 2)) = 1 ]; then first=uv_run; second=ev_run; else first=ev_run; second=uv_run; fi
    clear_t; sleep "$gap"; $first $i "pause ${gap}s"
    clear_t; sleep "$gap"; $second $i "pause ${gap}s"
  done
done
rm -rf $T
} 2>&1 | tee "${OUT:-/tmp}/gpu_into_fair.txt"
