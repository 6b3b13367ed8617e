#!/usr/bin/env bash
# Same-session A/B of two envvault builds on the device's venv for the in-place restore after
# `rm -rf site-packages/torch`, with the default backup and with --no-backup (ENVVAULT_STAGES=1: each phase's
# seconds), beside `zstd -dc | tar -x` of torch; the build that goes first changes round by round.
# Usage: OUT=$OUT bash bench/gpu_restore_ab.sh OLD_WHEEL_DIR NEW_WHEEL_DIR [ROUNDS]   (dependencies' wheels in
# NEW). Writes $OUT/gpu_restore_ab.txt.
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=${3:-4}
W=/tmp/rab
rm -rf $W
source bench/gpu_two_builds.sh
SP=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
log=${OUT:-/tmp}/gpu_restore_ab.txt
: >"$log"
ev() { local b=$1; shift; PYTHONPATH=$W/$b ENVVAULT_HOME=$W/v-$b $W/$b/bin/envvault "$@"; }
ZPY="env PYTHONPATH=$W/new $PY"  # zstandard: carried, not in the measured venv
ZD='import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)'
ZC='import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)'
tar -cf - -C "$VENV" . | cat >/dev/null
for b in old new; do ev $b snap --venv "$VENV" --no-caches -m full >/dev/null && ev $b tag latest full >/dev/null; done
tar -cf - -C "$SP" torch | $ZPY -c "$ZC" >$W/torch.tar.zst
one() {  # one build, one variant: rm -rf torch, restore, the phases on one line
  local b=$1 label=$2; shift 2
  rm -rf "$SP/torch" && sync
  local t0 t1; t0=$(now); ENVVAULT_STAGES=1 ev $b restore full --venv "$VENV" "$@" >/dev/null 2>$W/r.err || tail -3 $W/r.err >>"$log"; t1=$(now)
  echo "$label $b round $i: $(secs $t0 $t1) s; $(grep -E 'restore:|snap: stat' $W/r.err | sed 's/envvault-stage //; s/ in 1 calls//' | tr '\n' ' ')" | tee -a "$log"
}
for i in $(seq "$ROUNDS"); do
  rm -rf "$SP/torch" && sync
  t0=$(now); $ZPY -c "$ZD" <$W/torch.tar.zst | tar -xf - -C "$SP"; t1=$(now)
  echo "anchor zstd -dc | tar -x of torch round $i: $(secs $t0 $t1) s" | tee -a "$log"
  order="old new"; [ $((i % 2)) -eq 0 ] && order="new old"
  for b in $order; do one $b "restore (backup)"; done
  for b in $order; do one $b "restore --no-backup" --no-backup; done
done
ev new status --venv "$VENV" --exit-code >/dev/null && echo "status after the last restore: unchanged" | tee -a "$log"
medians "$log"
