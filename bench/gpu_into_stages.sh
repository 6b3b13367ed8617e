#!/usr/bin/env bash
# Where a restore --into of the device venv goes: ENVVAULT_STAGES=1 (the materializer's steps, summed over its
# threads) beside a run without. Usage: bash bench/gpu_into_stages.sh (the carried wheels in .whl/).
set -u
rm -rf /tmp/site && python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site ENVVAULT_HOME=/tmp/iv
V=$(python3 -c 'import sys;print(sys.prefix)')
tar -cf - $V 2>/dev/null | cat >/dev/null
rm -rf /tmp/iv; python3 -m envvault snap --venv $V --no-caches | tail -1
for st in 1 0 1; do rm -rf /tmp/into1; sync; s=$(date +%s.%N); ENVVAULT_STAGES=$st python3 -m envvault restore latest --into /tmp/into1 2>&1 | grep -E "stage|verified"; e=$(date +%s.%N); echo "STAGES=$st: $(python3 -c "print(round($e-$s,2))") s"; done
