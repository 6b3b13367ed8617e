#!/usr/bin/env bash
# SIGTERM (a scheduler's cancel) to `restore --into` of the device's venv while its forked writers work: the
# command must exit 143 with one line, remove the half-built venv and leave no writer running. Sourced setup:
# gpu_two_trees_setup.sh (the venv snapped into /tmp/abv). The signal goes once the new tree holds N files.
# Usage: OUT=$OUT bash bench/gpu_into_term.sh [N] (after gpu_into_fair.sh in the same call, or alone)
set -u
N=${1:-5000}
[ -n "${PY:-}" ] || . bench/gpu_two_trees_setup.sh
T=/tmp/term-into; rm -rf $T
{
PYTHONPATH=/tmp/site $PY -m envvault restore latest --into $T >/tmp/term.out 2>/tmp/term.err &
pid=$!
while kill -0 $pid 2>/dev/null; do
  n=$(find $T -type f 2>/dev/null | wc -l)
  [ "$n" -ge "$N" ] && break
done
kids=$(ps --ppid $pid -o pid= | tr '\n' ' ')
echo "files when signalled: $n; children then: $kids"
kill -TERM $pid; wait $pid; echo "rc=$?"
echo "last line: $(tail -1 /tmp/term.err)"; grep -c Traceback /tmp/term.err | sed 's/^/tracebacks: /'
[ -e $T ] && echo "LEFT: $T ($(find $T | wc -l) entries)" || echo "the half-built venv is gone"
left=""; for k in $kids; do [ -d /proc/$k ] && [ "$(awk '{print $3}' /proc/$k/stat)" != Z ] && left="$left $k"; done
echo "writers still running:${left:- none}"
} 2>&1 | tee "${OUT:-/tmp}/gpu_into_term.txt"
