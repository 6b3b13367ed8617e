#!/usr/bin/env bash
# restore --into against uv's install of the exported wheels, each writing a new folder, order rotating round by
# round. How a finished tree is put away matters on the device: its ext4 has no journal, and there the kernel
# skips every inode freed in the last minutes when it picks one for a new file (ialloc.c find_inode_bit,
# recently_deleted), scanning the whole group past them on every create: a tree removed just before the clock
# starts slows whichever tool comes next (bench/results/gpu_wchan_*.txt: recently_deleted in the stacks).
# RETIRE=truncate (default): a finished tree's files are emptied (their blocks freed, their inodes kept) outside
# the clock and the trees are removed once at the end; RETIRE=rm: each run removes the last tree first
# (rm -rf + sync, timed), then pauses SETTLE seconds and runs again (the 2026-12-06 runs named
# gpu_into_fair_937070a.txt). Variants: uv; `-` (the carried wheel's envvault); NAME=VALUE (the wheel's
# envvault under that setting); old or old:NAME=VALUE (the carried old tree, .whl/old-tree).
# Also prints /tmp's filesystem, its mount options and the disk's settings.
# STAGES=1: each envvault run's phases (ENVVAULT_STAGES) under its time.
# Usage: OUT=$OUT [RETIRE=truncate|rm] [SETTLE=s] [STAGES=1] bash bench/gpu_into_fair.sh [ROUNDS] [VARIANT...]
set -u
ROUNDS=${1:-3}; shift || true
VARIANTS=${*:-"uv -"}
RETIRE=${RETIRE:-truncate}; SETTLE=${SETTLE:-15}; STAGES=${STAGES:-0}
. bench/gpu_two_trees_setup.sh
{
findmnt -no FSTYPE,SOURCE,OPTIONS -T /tmp; uname -r; df -h /tmp | tail -1; df -i /tmp | tail -1
for q in discard_max_bytes rotational scheduler; do echo "vda $q: $(cat /sys/block/vda/queue/$q 2>/dev/null)"; done
echo "retire: $RETIRE; variants: $VARIANTS"
F=/tmp/fair; rm -rf $F; mkdir -p $F; sync; n=0
run_one() {  # $1 round, $2 variant, $3 folder
  local t0 t1 site=/tmp/site env=ENVVAULT_NONE=1 v=$2
  case $v in old*) site=/tmp/oldsite; v=${v#old}; v=${v#:};; esac
  case $v in *=*) env=$v;; esac
  if [ "$2" = uv ]; then
    $UVB venv -q --python $BASE $3; t0=$(now)
    $UVB pip install -q --offline --no-deps --python $3/bin/python /tmp/exp/pylock.wheels/*.whl; t1=$(now)
  else
    t0=$(now); env "$env" ENVVAULT_STAGES=$STAGES PYTHONPATH=$site $PY -m envvault restore latest --into $3 >/dev/null 2>/tmp/err || tail -2 /tmp/err; t1=$(now)
  fi
  echo "round $1 $2: $(secs $t0 $t1) s"
  [ "$STAGES" = 1 ] && [ "$2" != uv ] && grep "envvault-stage" /tmp/err | sed "s/^/  /"
  return 0
}
for i in $(seq "$ROUNDS"); do
  set -- $VARIANTS; k=$#; order=""
  for j in $(seq 0 $((k - 1))); do m=$(( (j + i - 1) % k + 1 )); order="$order ${!m}"; done
  for v in $order; do
    n=$((n + 1))
    if [ "$RETIRE" = rm ]; then
      t0=$(now); rm -rf $F/t; sync; t1=$(now); echo "  removal of the last tree: $(secs $t0 $t1) s"; sleep "$SETTLE"
      run_one $i "$v" $F/t
    else
      run_one $i "$v" $F/t$n
      empty_tree $F/t$n
    fi
  done
done
rm -rf $F
} 2>&1 | tee "${OUT:-/tmp}/gpu_into_fair.txt"
