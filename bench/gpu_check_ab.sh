#!/usr/bin/env bash
# The freshness check's sharing out, this checkout against an older tree, on the device's own venv:
# bench/gpu_check_probe.py under each tree (the new one with parts of 3000 and 1000 files), then
# bench/startup_ab.py (the start-up-bound rows of both trees in the same rounds). Carry .whl/ with the old tree
# as .whl/old-tree/envvault (git archive REV envvault | tar -x -C .whl/old-tree).
# Usage: OUT=$OUT bash bench/gpu_check_ab.sh [ROUNDS]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
mkdir -p "$OUT"
[ -d .whl/old-tree/envvault ] || { echo "no .whl/old-tree/envvault: see the header of this script"; exit 1; }
rm -rf /tmp/site /tmp/cp
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "pip install failed"; exit 1; }
rm -rf /tmp/site/envvault /tmp/site/envvault-*.dist-info  # each tree brings its own envvault
python3 -m compileall -q envvault .whl/old-tree/envvault /tmp/site >/dev/null 2>&1
VENV=$(python3 -c 'import sys; print(sys.prefix)')
NEW=$PWD OLD=$PWD/.whl/old-tree BENCH=$PWD/bench
export ENVVAULT_HOME=/tmp/cp/v PATH=/tmp/site/bin:$PATH
cd /tmp
{
echo "# $(date -u +'%Y-%m-%d %H:%M UTC') $(nproc) cores, venv $VENV"
PYTHONPATH=$NEW:/tmp/site python3 -m envvault snap --venv "$VENV" --no-caches -m base | tail -1
PYTHONPATH=$NEW:/tmp/site python3 -m envvault status --venv "$VENV"
echo "## new tree"
PART_FILES=3000,1000 PYTHONPATH=$NEW:/tmp/site python3 "$BENCH/gpu_check_probe.py" /tmp/cp/v "$VENV"
echo "## old tree"
PYTHONPATH=$OLD:/tmp/site python3 "$BENCH/gpu_check_probe.py" /tmp/cp/v "$VENV"
echo "## both trees, same rounds"
PYTHONPATH=/tmp/site python3 "$BENCH/startup_ab.py" "$VENV" "$OLD" "$NEW" "${1:-9}"
} 2>&1 | tee "$OUT/check_ab.txt"
