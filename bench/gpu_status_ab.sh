#!/usr/bin/env bash
# Same-session A/B of two envvault builds on the device's venv for the start-up-bound rows that share a forked
# stat check (`status`, a second snap) and `--lock-only`, the builds alternately round by round beside
# `pip freeze`; `status again` right after `status` (no snapshot between: from the second on, a build with the
# quick status answers from the first one's verdict). Usage: OUT=$OUT bash bench/gpu_status_ab.sh OLD_WHEEL_DIR NEW_WHEEL_DIR [ROUNDS]
# (dependencies' wheels in NEW). Writes $OUT/gpu_status_ab.txt.
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=${3:-7}
W=/tmp/sab
rm -rf $W
source bench/gpu_two_builds.sh
log=${OUT:-/tmp}/gpu_status_ab.txt
: >"$log"
ev() { local b=$1; shift; PYTHONPATH=$W/$b ENVVAULT_HOME=$W/v-$b $W/$b/bin/envvault "$@"; }
tar -cf - -C "$VENV" . | cat >/dev/null
for b in old new; do ev $b snap --venv "$VENV" --no-caches -m full >/dev/null; done
t() { local name=$1; shift; local t0 t1; t0=$(now); "$@" >/dev/null 2>&1; t1=$(now); echo "$name: $(secs $t0 $t1) s" | tee -a "$log"; }
for i in $(seq "$ROUNDS"); do
  t "round $i pip freeze" $PY -m pip freeze
  for b in old new; do
    t "round $i $b status" ev $b status --venv "$VENV" --exit-code
    t "round $i $b status again" ev $b status --venv "$VENV" --exit-code
    t "round $i $b second snap" ev $b snap --venv "$VENV" --no-caches -m again
    t "round $i $b lock-only" ev $b snap --venv "$VENV" --lock-only -m lo
  done
done
medians "$log"

