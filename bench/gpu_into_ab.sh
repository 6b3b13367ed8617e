#!/usr/bin/env bash
# Same-session A/B of two envvault builds on the device's venv for the rows this session's changes touch:
# `restore --into` a new venv (ENVVAULT_STAGES=1: the verification's seconds) and `cache restore` of the H200
# compile cache, the builds alternately (old, new, ...; for --into, the build that goes first changes round by
# round: the second write of 7.3 GB into space just freed runs slower), beside their anchors.
# Usage: OUT=$OUT bash bench/gpu_into_ab.sh OLD_WHEEL_DIR NEW_WHEEL_DIR [ROUNDS]   (dependencies' wheels in NEW;
# the compile cache archive at bench/out/inductor-cache.tar.zst)
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=${3:-3}
W=/tmp/iab
ZD='import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)'
ZC='import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)'
rm -rf $W && mkdir -p $W/c
source bench/gpu_two_builds.sh
BASE=$($PY -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
log=${OUT:-/tmp}/gpu_into_ab.txt
: >"$log"
ev() { local b=$1; shift; PATH=$W/$b/bin:$PATH PYTHONPATH=$W/$b ENVVAULT_HOME=$W/v $W/$b/bin/envvault "$@"; }
tar -cf - -C "$VENV" . | cat >/dev/null
ev new snap --venv "$VENV" --no-caches -m full >/dev/null
ev new tag latest full >/dev/null
ZPY="env PYTHONPATH=$W/new $PY"  # zstandard: carried, not in the measured venv
$ZPY -c "$ZD" <bench/out/inductor-cache.tar.zst | tar -xf - -C $W/c
ev new cache snap --no-discover --cache-dir $W/c -m c >/dev/null
tar -cf - -C $W/c . | $ZPY -c "$ZC" >$W/c.tar.zst
for i in $(seq "${CACHE_ROUNDS:-7}"); do
  rm -rf $W/r && mkdir -p $W/r && sync
  t0=$(now); $ZPY -c "$ZD" <$W/c.tar.zst | tar -xf - -C $W/r; t1=$(now)
  echo "cache restore anchor round $i: $(secs $t0 $t1) s" | tee -a "$log"
  for b in old new; do
    rm -rf $W/r && sync
    t0=$(now); ev $b cache restore --to $W/r >/dev/null 2>&1; t1=$(now)
    echo "cache restore $b round $i: $(secs $t0 $t1) s" | tee -a "$log"
  done
done
# the anchor of --into: uv's install of the exported wheels into a fresh venv
ev new export full -o $W/exp/pylock.toml >/dev/null
for i in $(seq "$ROUNDS"); do
  rm -rf $W/uvv && $W/new/bin/uv venv -q --python "$BASE" $W/uvv && sync
  t0=$(now); $W/new/bin/uv pip install -q --offline --no-deps --python $W/uvv/bin/python $W/exp/pylock.wheels/*.whl; t1=$(now)
  echo "into anchor (uv install) round $i: $(secs $t0 $t1) s" | tee -a "$log"
  order="old new"; [ $((i % 2)) -eq 0 ] && order="new old"  # each build goes first in every other round
  for b in $order; do
    rm -rf $W/into && sync
    t0=$(now); ENVVAULT_STAGES=1 ev $b restore full --into $W/into >/dev/null 2>$W/into.err || tail -3 $W/into.err >>"$log"; t1=$(now)
    echo "restore --into $b round $i: $(secs $t0 $t1) s; $(grep -E 'into:|scan:' $W/into.err | sed 's/envvault-stage //' | tr '\n' ' ')" | tee -a "$log"
  done
done
ev new status --venv $W/into --exit-code >/dev/null && echo "status of the last --into venv: unchanged" | tee -a "$log"
