#!/usr/bin/env bash
# bench/gpu_check_probe.py on the device's own venv, after a snap and a full status; then 7 rounds of the
# quick status, a second snap and pip freeze, in turn. Carry .whl/ (as bench/gpu_env_run.sh).
# Usage: OUT=$OUT bash bench/gpu_check_probe.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
mkdir -p "$OUT"
rm -rf /tmp/site /tmp/cp
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "pip install failed"; exit 1; }
python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1
VENV=$(python3 -c 'import sys; print(sys.prefix)')
export PYTHONPATH=/tmp/site ENVVAULT_HOME=/tmp/cp/v
BENCH=$PWD/bench
cd /tmp
{
echo "# $(date -u +'%Y-%m-%d %H:%M UTC') $(nproc) cores, venv $VENV"
python3 -m envvault snap --venv "$VENV" --no-caches -m base | tail -1
python3 -m envvault status --venv "$VENV"
python3 "$BENCH/gpu_check_probe.py" /tmp/cp/v "$VENV"
t() { local s=$(date +%s%N); "$@" >/dev/null 2>&1; echo -n "$(( ($(date +%s%N)-s)/1000000 )) "; }
for row in "python3 -c pass" "python3 -m envvault status --venv $VENV" "python3 -m envvault snap --venv $VENV --no-caches" "python3 -m pip freeze"; do
  echo -n "$row (ms):"; for i in 1 2 3 4 5 6 7; do t $row; done; echo
done
} 2>&1 | tee "$OUT/check_probe.txt"
